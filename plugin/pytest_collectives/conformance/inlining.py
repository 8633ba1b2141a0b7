"""An algorithm's own code copied into a standalone reproduction: the function and every definition it
needs from the modules it was written in, so that a script which makes the failing call runs it without
this project (an algorithm is the project's code, or a user's: the backend alone is not what failed).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Inlined:
    """What a script needs to run ``name``: its import lines and its definitions, in the order they run."""

    name: str
    imports: tuple[str, ...]
    code: str


class NotInlinable(Exception):
    """The algorithm's code cannot be copied alone (no source, or a name it uses is not defined at the top
    level of its module): the message says which."""


def inlined(fn: Callable[..., Any]) -> Inlined:
    """``fn`` (a function: at the top level of its module, or nested, like a registered wrapper) with the
    top-level definitions it uses, followed through the modules it reaches by attribute (``alg.ring``)."""
    copy = _Copy()
    try:
        entry = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise NotInlinable(f"no source for {fn.__qualname__}: {exc}") from None
    tree = ast.parse(entry)
    bound = {**fn.__globals__, **inspect.getclosurevars(fn).nonlocals}  # annotations' names too
    local = {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}
    local |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    free = _loaded(tree) - local
    if unknown := sorted(name for name in free if name not in bound and not hasattr(builtins, name)):
        raise NotInlinable(f"{', '.join(unknown)} is not defined at the top level of {fn.__module__}")
    for name in free:
        if name in bound and not isinstance(bound[name], types.ModuleType):
            copy.need(fn.__globals__, name)
    tree = copy.follow_modules(tree, bound)
    if fn.__name__ in copy.names:
        raise NotInlinable(f"{fn.__qualname__} calls a definition of its own name in another module")
    body = "\n\n\n".join(copy.definitions() + [ast.unparse(tree) if copy.rewritten else entry.rstrip()])
    return Inlined(fn.__name__, tuple(sorted(copy.imports)), body)


def _loaded(tree: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


class _Copy:
    """The top-level statements gathered so far, by module, and the import lines they need. A module is
    its namespace (a function's ``__globals__``): a test's pytester may have dropped it from sys.modules."""

    def __init__(self) -> None:
        self.imports: set[str] = set()
        self.taken: dict[str, dict[int, str]] = {}  # module's file -> {first line: statement's source}
        self.rewritten = False
        self.names: set[str] = set()  # every name the copied statements bind

    def follow_modules(self, tree: ast.AST, bound: dict[str, Any]) -> ast.AST:
        """``tree`` with each ``module.name`` of a module that is not a library's made ``name``, whose
        definition is then needed from that module; a library module's name is imported as it is."""
        copy = self

        class Follow(ast.NodeTransformer):
            def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
                value = node.value
                if isinstance(value, ast.Name) and isinstance(bound.get(value.id), types.ModuleType):
                    module = bound[value.id]
                    if not _library(module.__name__, module):
                        copy.need(vars(module), node.attr)
                        copy.rewritten = True
                        return ast.copy_location(ast.Name(node.attr, node.ctx), node)
                return self.generic_visit(node)

        tree = Follow().visit(tree)
        for name in _loaded(tree):
            module = bound.get(name)
            if isinstance(module, types.ModuleType) and _library(module.__name__, module):
                self.imports.add(_import_line(name, module.__name__))
        return tree

    def need(self, namespace: dict[str, Any], name: str) -> None:
        """The top-level statement of the module of ``namespace`` that binds ``name``, and what it needs
        in turn."""
        statements = _top_level(namespace)
        if name not in statements:
            if hasattr(builtins, name):
                return
            raise NotInlinable(f"{name} is not defined at the top level of {namespace['__name__']}")
        line, node, source = statements[name]
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            self._imported(namespace, name, source)
            return
        taken = self.taken.setdefault(namespace["__file__"], {})
        if line in taken:
            return
        taken[line] = source
        self.names.add(name)
        for used in sorted(_loaded(node)):
            if used in statements and used != name:
                self.need(namespace, used)

    def _imported(self, namespace: dict[str, Any], name: str, line: str) -> None:
        """An import of ``name`` (``line``) at the top of the module of ``namespace``: kept where it
        imports a library, else the definition it imports is copied in turn."""
        words = line.split()
        value = namespace.get(name)
        if _library(words[1], sys.modules.get(words[1])):
            self.imports.add(line)
        elif words[0] == "from" and words[-1] == words[3] == name and inspect.isfunction(value):
            self.need(value.__globals__, name)
        else:
            raise NotInlinable(f"{namespace['__name__']} imports {name} as {line!r}: copy it by hand")

    def definitions(self) -> list[str]:
        return [source for taken in self.taken.values() for _, source in sorted(taken.items())]


def _library(name: str, module: types.ModuleType | None) -> bool:
    """Whether module ``name`` is one the script imports rather than copies: torch's, Python's own, or an
    installed package's (a user's algorithm may need its package, as a third-party backend does)."""
    top = name.partition(".")[0]
    if top == __name__.partition(".")[0]:  # this project, wherever it is installed: copied
        return False
    installed = "site-packages" in str(getattr(module, "__file__", "") or "")
    return top == "torch" or top in sys.stdlib_module_names or installed or module is None


def _import_line(name: str, module: str) -> str:
    if name == module:
        return f"import {module}"
    parent, _, last = module.rpartition(".")
    return f"from {parent} import {last}" if last == name and parent else f"import {module} as {name}"


def _top_level(namespace: dict[str, Any]) -> dict[str, tuple[int, ast.stmt, str]]:
    """Each name the module of ``namespace`` binds at its top level: (the statement's first line, the
    statement, its source, decorators included; an import as the one line that binds the name)."""
    path = namespace.get("__file__")
    if not path:
        raise NotInlinable(f"{namespace.get('__name__')} has no source file")
    source = Path(path).read_text()
    lines = source.splitlines()
    bound: dict[str, tuple[int, ast.stmt, str]] = {}
    for node in ast.parse(source).body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        text = "\n".join(lines[first - 1 : node.end_lineno])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = (first, node, text)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in _loaded(target):
                    bound[name] = (first, node, text)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.partition(".")[0]
                written = _import_line(name, alias.name) if alias.asname else f"import {alias.name}"
                bound[name] = (first, node, written)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for alias in node.names:
                name = alias.asname or alias.name
                written = f"from {node.module} import {alias.name}" + (f" as {name}" if alias.asname else "")
                bound[name] = (first, node, written)
    return bound

