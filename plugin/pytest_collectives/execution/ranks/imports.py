"""How a rank imports a test module: as pytest did, with pytest's assertion rewriting so that a failure
shows its values, and compiled once a session where the ranks share a machine.

Parsing, rewriting and compiling a suite's module took 5 to 15 ms, on each of the 70 or so ranks a
default conformance run starts, for each module it runs: a twentieth of the ranks' time in a py-spy
profile of that run. pytest's own cache of rewritten modules is not there where PYTHONDONTWRITEBYTECODE
is set, as in CI. So the first rank to import a module leaves its code in the pool's folder, and every
later rank, in any group, loads it from there. A copy is named by the digest of the source and the
versions of Python and pytest, so it is never stale; one that cannot be read is compiled again.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.util
import marshal
import os
import sys
import types
from pathlib import Path

CODE = "code"  # the folder of the pool's that holds them
_folder: Path | None = None


def cache_in(folder: str | os.PathLike[str] | None) -> None:
    """Keep the compiled test modules in ``folder`` (one per session, on this machine); None: compile
    each module on each rank (SPMD mode, ranks on several nodes)."""
    global _folder
    _folder = None if folder is None else Path(folder)


def import_test_module(name: str, path: str) -> types.ModuleType:
    """The test module ``name`` at ``path``, imported once per rank, its asserts rewritten as pytest's."""
    if name in sys.modules:
        return sys.modules[name]
    try:
        code = _rewritten(path)
    except Exception:  # noqa: BLE001 - not a file pytest could rewrite: imported plainly
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _rewritten(path: str) -> types.CodeType:
    import pytest
    from _pytest.assertion.rewrite import rewrite_asserts

    source = Path(path).read_bytes()
    versions = f"{sys.version} {pytest.__version__}".encode()
    copy = None
    if _folder is not None:
        digest = hashlib.blake2b(source + versions, digest_size=12).hexdigest()
        copy = _folder / f"{Path(path).stem}-{digest}.code"
        with contextlib.suppress(OSError, EOFError, ValueError, TypeError):
            return marshal.loads(copy.read_bytes())
    tree = ast.parse(source, filename=path)
    rewrite_asserts(tree, source, Path(path), None)
    code = compile(tree, path, "exec", dont_inherit=True)
    if copy is not None:
        _leave(copy, marshal.dumps(code))
    return code


def _leave(path: Path, data: bytes) -> None:
    """Leave ``data`` at ``path``, whole or not at all: a rank that finds no copy compiles its own."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(exist_ok=True)
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()
