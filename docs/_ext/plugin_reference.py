"""Reference tables read from the plugin itself, so the pages can't drift from it:

- ``{collectives-options}``: the plugin's ``pytest_addoption``, called with a recorder in place of pytest's
  parser (flags, ini names, help texts);
- ``{collectives-contracts}``: ``registry.CONTRACTS``, how each algorithm operation is called;
- ``{collectives-api}``: ``pytest_collectives.__all__``, each public name with what it is and the first line
  of its docstring."""

from __future__ import annotations

import inspect
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


class _Recorder:
    """Takes what ``pytest_addoption`` gives a ``pytest.Parser`` and its option group."""

    def __init__(self) -> None:
        self.options: list[tuple[str, dict[str, Any]]] = []
        self.ini: dict[str, str] = {}

    def getgroup(self, name: str, description: str = "") -> _Recorder:
        return self

    def addoption(self, *flags: str, **kwargs: Any) -> None:
        self.options.append((", ".join(flags), kwargs))

    def addini(self, name: str, help: str, **kwargs: Any) -> None:
        self.ini[name] = help


def recorded() -> _Recorder:
    from pytest_collectives import hooks

    recorder = _Recorder()
    hooks.pytest_addoption(recorder)  # type: ignore[arg-type]
    return recorder


def _text(help_text: str) -> str:
    return help_text.replace("%%", "%")  # argparse's escape


class OptionsReference(SphinxDirective):
    """A table of every command-line option and, below it, the ini names that have no flag."""

    def run(self) -> list[nodes.Node]:
        recorder = recorded()
        # a list-table, not a pipe table: a metavar such as PATH|ID holds a pipe
        lines = ["```{list-table}", ":header-rows: 1", "", "* - option", "  - ini", "  - meaning"]
        flagged = set()
        for flags, kwargs in recorder.options:
            help_text = kwargs.get("help", "")
            ini = next((name for name in recorder.ini if help_text.endswith(f"; ini: {name}")), "")
            flagged.add(ini)
            metavar = kwargs.get("metavar") or ("" if kwargs.get("action") else "VALUE")
            lines += [
                f"* - `{flags} {metavar}`" if metavar else f"* - `{flags}`",
                f"  - `{ini}`" if ini else "  -",
                f"  - {_text(help_text.removesuffix(f'; ini: {ini}'))}",
            ]
        lines += ["```", "", "Ini names with no command-line flag:", ""]
        lines += [f"- `{name}`: {_text(text)}" for name, text in recorder.ini.items() if name not in flagged]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="options_reference"), self.content_offset, container)
        return container.children


class ContractsReference(SphinxDirective):
    """A table of the operations a registered algorithm may implement: how it is called, what it must do."""

    def run(self) -> list[nodes.Node]:
        from pytest_collectives.algorithms.registry import CONTRACTS

        lines = ["```{list-table}", ":header-rows: 1", "", "* - operation", "  - called as", "  - must"]
        for operation, contract in CONTRACTS.items():
            lines += [f"* - `{operation}`", f"  - `{contract.call}`", f"  - {contract.must}"]
        lines.append("```")
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="contracts"), self.content_offset, container)
        return container.children


def _kind(value: Any) -> str:
    if inspect.ismodule(value):
        return "module"
    if inspect.isclass(value):
        return "class"
    if callable(value):
        return "function"
    return "constant"


class ApiReference(SphinxDirective):
    """A table of the public names, ``pytest_collectives.__all__``: what each is, where it lives, what for."""

    def run(self) -> list[nodes.Node]:
        import pytest_collectives

        lines = ["```{list-table}", ":header-rows: 1", "", "* - name", "  - kind", "  - from", "  - for"]
        for name in pytest_collectives.__all__:
            value = getattr(pytest_collectives, name)
            module, _ = pytest_collectives._PUBLIC[name]
            said = inspect.getdoc(value) if _kind(value) != "constant" else None  # a tuple's is tuple's
            doc = (said or "").split("\n\n")[0].replace("\n", " ")
            lines += [f"* - `{name}`", f"  - {_kind(value)}", f"  - `{module}`", f"  - {doc}"]
        lines.append("```")
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="api"), self.content_offset, container)
        return container.children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("collectives-options", OptionsReference)
    app.add_directive("collectives-contracts", ContractsReference)
    app.add_directive("collectives-api", ApiReference)
    return {"parallel_read_safe": True}
