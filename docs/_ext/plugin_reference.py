"""The reference sections of the docs, written from the plugin itself into the pages, so that a page reads
the same in the repository as in the built site, and can't drift from the plugin: ``tests/test_docs.py``
fails when a section differs from what this script writes. After changing an option, a hook spec, a public
name or an algorithm contract, run ``python docs/_ext/plugin_reference.py``.

A section sits between ``<!-- generated: NAME -->`` and ``<!-- end of generated -->``:

- ``options``: the plugin's ``pytest_addoption``, called with a recorder in place of pytest's parser (flags,
  ini names, help texts);
- ``hooks``: the hook specs of ``hookspecs.py``, each with its signature and docstring;
- ``api``: ``pytest_collectives.__all__``, each public name with what it is and its docstring's first line;
- ``contracts``: ``registry.CONTRACTS``, how each algorithm operation is called.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1]
START = "<!-- generated: {} -->"
END = "<!-- end of generated -->"


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


def _text(rst: str) -> str:
    """A help text or docstring as Markdown: argparse's ``%%``, RST's double backquotes, and a ``<name>``
    outside code escaped (Markdown would take it for an HTML tag and drop it)."""
    parts = re.sub(r"``(.+?)``", r"`\1`", rst.replace("%%", "%")).split("`")
    parts[::2] = [re.sub(r"<([\w-]+)>", r"\\<\1\\>", part) for part in parts[::2]]  # outside code spans
    return "`".join(parts)


def options() -> list[str]:
    from pytest_collectives import hooks

    recorder = _Recorder()
    hooks.pytest_addoption(recorder)  # type: ignore[arg-type]
    lines, flagged = [], set()
    for flags, kwargs in recorder.options:
        help_text = kwargs.get("help", "")
        ini = next((name for name in recorder.ini if help_text.endswith(f"; ini: {name}")), "")
        flagged.add(ini)
        metavar = kwargs.get("metavar") or ("" if kwargs.get("action") not in (None, "store") else "VALUE")
        where = f" (ini `{ini}`)" if ini else ""
        said = _text(help_text.removesuffix(f"; ini: {ini}"))
        lines.append(f"- `{flags} {metavar}`{where}: {said}" if metavar else f"- `{flags}`{where}: {said}")
    lines += ["", "Ini names with no command-line flag:", ""]
    lines += [f"- `{name}`: {_text(text)}" for name, text in recorder.ini.items() if name not in flagged]
    return lines


def hooks() -> list[str]:
    from pytest_collectives import hookspecs

    lines: list[str] = []
    for name, spec in vars(hookspecs).items():
        if name.startswith("pytest_collectives_"):
            arguments = ", ".join(inspect.signature(spec).parameters)
            said = _text(" ".join((inspect.getdoc(spec) or "").split()))
            lines += [f"## `{name}({arguments})`", "", said, ""]
    return lines[:-1]


def _kind(value: Any) -> str:
    if inspect.ismodule(value):
        return "module"
    if inspect.isclass(value):
        return "class"
    return "function" if callable(value) else "constant"


def api() -> list[str]:
    import pytest_collectives

    lines = []
    for name in pytest_collectives.__all__:
        value = getattr(pytest_collectives, name)
        module, _ = pytest_collectives._PUBLIC[name]
        said = inspect.getdoc(value) if _kind(value) != "constant" else None  # a tuple's is tuple's
        first = " ".join(_text(said or "").split("\n\n")[0].split())
        lines.append(f"- `{name}` ({_kind(value)}, from `{module}`)" + (f": {first}" if first else ""))
    return lines


def contracts() -> list[str]:
    from pytest_collectives.algorithms.registry import CONTRACTS

    return [f"- `{operation}`: called as `{c.call}`; it must {c.must}" for operation, c in CONTRACTS.items()]


SECTIONS: dict[str, Callable[[], list[str]]] = {
    "options": options,
    "hooks": hooks,
    "api": api,
    "contracts": contracts,
}


def rewritten(page: str) -> str:
    """``page`` with each generated section it holds written afresh."""
    for name, write in SECTIONS.items():
        start = START.format(name)
        if start in page:
            before, rest = page.split(start, 1)
            _, after = rest.split(END, 1)
            page = "\n".join([before + start, *write(), END]) + after
    return page


def main() -> int:
    changed = []
    for path in sorted(DOCS.glob("*.md")):
        page = path.read_text(encoding="utf-8")
        new = rewritten(page)
        if new != page:
            path.write_text(new, encoding="utf-8")
            changed.append(path.name)
    print("rewrote " + ", ".join(changed) if changed else "every generated section is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
