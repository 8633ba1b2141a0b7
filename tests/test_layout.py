"""The package's layout: one concern per subpackage; no module or subpackage imports one that imports it
back (directly or around a loop, at call time too), so each can be read, tested and changed from the bottom
up; and every private name of pytest, pytest-benchmark, hypothesis or torch in use is listed, with why, on
docs/private-apis.md."""

from __future__ import annotations

import ast
import graphlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

from docblocks import ALL

import pytest_collectives

ADDS = re.compile(r"\.add(option|ini)\(")
ROOT = Path(pytest_collectives.__file__).parent
PROJECT = Path(__file__).parent.parent


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("pytest_collectives", *path.relative_to(ROOT).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_by(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules ``name`` imports anywhere in its file (in functions too, and by
    ``importlib.import_module`` of a literal name): an import put off to call time is still a dependency."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            found.update(m for m in submodules if m in known)
            if any(m not in known for m in submodules):
                found.add(base)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(node.args[0].value)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imported_by(name, path, set(found)) for name, path in found.items()}


def subpackage(name: str) -> str:
    return ".".join(name.split(".")[:2])


def test_no_module_imports_one_that_imports_it_back() -> None:
    try:
        tuple(graphlib.TopologicalSorter(graph()).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle between modules: {' -> '.join(exc.args[1])}") from None


def test_no_subpackage_imports_one_that_imports_it_back() -> None:
    between: dict[str, set[str]] = {}
    for name, imports in graph().items():
        between.setdefault(subpackage(name), set()).update(
            subpackage(m) for m in imports if subpackage(m) != subpackage(name)
        )
    try:
        tuple(graphlib.TopologicalSorter(between).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle between subpackages: {' -> '.join(exc.args[1])}") from None


def test_the_check_sees_a_cycle_put_off_to_call_time(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import importlib\ndef f():\n    importlib.import_module('p.b')\n")
    b.write_text("from p import a\n")
    known = {"p", "p.a", "p.b"}
    assert imported_by("p.a", a, known) == {"p.b"} and imported_by("p.b", b, known) == {"p.a"}


# Private names of the libraries, as the code reaches them (a module alias or an object of theirs).
PRIVATE = re.compile(
    r"\b(_pytest(?:\.[a-z_]+)+|_hypothesis_internal_\w+|control\._\w+|(?:distributed_)?c10d\._\w+|Backend\._\w+"
    r"|torch\._C(?:\.\w+)*|dist\._\w+|fixture\._\w+|item\._\w+|reporter\._\w+|config\._benchmark\w*"
    r"|_share_cuda_|hypothesis\.internal(?:\.\w+)*)"
)


def test_every_private_api_in_use_is_listed_with_why() -> None:
    """Each private name, on the page with the module that uses it: on the name's row, or in its section's
    text where one module holds them all (pytest-benchmark's, in bench/shim.py)."""
    sections = (PROJECT / "docs" / "private-apis.md").read_text().split("\n## ")
    used = {
        (match.group(1), path.relative_to(ROOT if ROOT in path.parents else PROJECT).as_posix())
        for folder in ("plugin", "suites")
        for path in (PROJECT / folder).rglob("*.py")
        for match in PRIVATE.finditer(path.read_text())
    }
    assert used, "the scan found nothing: the pattern is broken"

    def listed(name: str, path: str) -> bool:
        for section in sections:
            lines = section.splitlines()
            prose = [line for line in lines if not line.startswith("|")]
            if any(name in line and path in line for line in lines) or (
                any(name in line for line in lines) and any(path in line for line in prose)
            ):
                return True
        return False

    missing = sorted(f"{name} ({path})" for name, path in used if not listed(name, path))
    assert not missing, f"private APIs in use but not on docs/private-apis.md with their module: {missing}"


def test_one_concern_per_subpackage():
    top = {p.name for p in ROOT.iterdir() if p.suffix == ".py"}
    # The entry point, its hook specs and the session's one owner (run.py), what several concerns share (the
    # one verdict type every part returns among them), and the reference backends under the stable name
    # users give --backend-module.
    shared = {"atomic.py", "errors.py", "option.py", "devices.py", "backend_declarations.py", "verdict.py"}
    assert top == {"__init__.py", "hooks.py", "hookspecs.py", "run.py", "refbackend.py", *shared}, top
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    concerns = {
        "execution",
        "bench",
        "gate",
        "topology",
        "nodereport",
        "algorithms",
        "conformance",
        "schemas",
    }
    assert packages == concerns


def test_the_node_report_is_in_its_families():
    """nodereport/ holds the session's part and three families (judging, outputs, fleet), and the fleet,
    which reads many nodes' reports, is imported by nothing that makes one."""
    folder = ROOT / "nodereport"
    assert {p.name for p in folder.glob("*.py")} == {"__init__.py", "collect.py", "settings.py"}
    families = {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    assert families == {"judging", "outputs", "fleet"}
    importing = [
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*.py")
        if "nodereport.fleet" in p.read_text() and p.parent != folder / "fleet"
    ]
    assert not importing, importing


def test_execution_is_in_its_families():
    """execution/ holds the session and what both of its modes share; the launchers, the ranks' side and the
    session-level modes are folders of their own, and the ranks' side imports nothing of the controller's
    (a rank never decides what runs, nor reports but through its pipe)."""
    folder = ROOT / "execution"
    families = {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    assert families == {"launchers", "ranks", "modes"}
    assert {p.name for p in (folder / "launchers").glob("*.py")} >= {"pooled.py", "spmd.py"}
    controller = ("execution.session", "execution.launchers", "execution.modes", "execution.suite_api")
    found = graph()
    leaks = sorted(
        f"{name} imports {m}"
        for name, imports in found.items()
        if name.startswith("pytest_collectives.execution.ranks.")
        for m in imports
        if m.removeprefix("pytest_collectives.").startswith(controller)
    )
    assert not leaks, leaks


BANNER = re.compile(r"^# -{20,}$", re.MULTILINE)


def test_no_module_is_a_folder_in_disguise() -> None:
    """A module divided by banner comments is parts that want modules of their own: each was split along
    its banners, and none grows them back."""
    divided = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if BANNER.search(p.read_text()))
    assert not divided, f"split these along their banners: {divided}"


def test_the_plugin_runs_without_hypothesis_or_xdist(pytester):
    # Both are extras: with neither importable (and their pytest plugins off), a distributed test runs.
    pytester.makepyfile(
        test_layout_inner="""
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_sum(pg):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == 2
        """
    )
    for name in ("hypothesis", "xdist"):  # found first on the path, and failing as a missing one would
        (pytester.path / "blocked" / name).mkdir(parents=True)
        (pytester.path / "blocked" / name / "__init__.py").write_text(f"raise ImportError('no {name}')\n")
    plugins_off = [
        f"-pno:{name}" for name in ("hypothesispytest", "xdist", "xdist.looponfail", "cacheprovider")
    ]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *plugins_off, "-q", "test_layout_inner.py"],
        cwd=pytester.path,
        env={**os.environ, "PYTHONPATH": str(pytester.path / "blocked")},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout + result.stderr


def _imports_of_the_package(source: str) -> list[str]:
    """Each import of the package in ``source``, as ``module:name`` (``module`` for a plain import)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pytest_collectives":
            found += [f"{node.module}:{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "pytest_collectives"]
    return found


def _public_names() -> set[str]:
    return {f"pytest_collectives:{name}" for name in pytest_collectives.__all__}


def _not_public(imports: list[str]) -> list[str]:
    return [i for i in imports if i not in _public_names() | {"pytest_collectives"}]


def test_the_suites_and_the_docs_use_only_the_public_api() -> None:
    """suites/ and the docs' Python blocks import the package only from its top level, names of its
    ``__all__``: a test of theirs that reaches into a subpackage is a private import a user would copy."""
    sources = {str(p.relative_to(PROJECT)): p.read_text() for p in sorted((PROJECT / "suites").rglob("*.py"))}
    sources |= {b.where: b.text for b in ALL if b.lang == "python"}
    imports = {where: _imports_of_the_package(text) for where, text in sources.items()}
    private = {where: bad for where, found in imports.items() if (bad := _not_public(found))}
    assert not private, f"private imports of pytest_collectives: {private}"
    assert _not_public(_imports_of_the_package("from pytest_collectives.conformance import cases")) == [
        "pytest_collectives.conformance:cases"
    ]


def test_every_public_name_resolves_and_the_package_never_imports_itself_through_it() -> None:
    """Each name of ``__all__`` is what its module holds, a function, class or constant: never a module, whose
    every name would be public in practice. Inside the package, parts import each other directly, never
    through the top level (whose names load on first use)."""
    public = {name: getattr(pytest_collectives, name) for name in pytest_collectives.__all__}
    modules = [name for name, value in public.items() if inspect.ismodule(value)]
    assert not modules, f"whole modules in the public API: {modules}"
    through = {
        str(path.relative_to(ROOT)): names
        for path in ROOT.rglob("*.py")
        if path.name != "__init__.py" or path.parent != ROOT
        if (names := [i for i in _imports_of_the_package(path.read_text()) if i in _public_names()])
    }
    assert not through, f"the package's own modules import through its top level: {through}"


def test_no_part_of_the_package_looks_another_up_by_name() -> None:
    """The parts are made in one place (hooks.pytest_configure) and handed the parts they use: a lookup by
    name (``get_plugin("collectives-...")``) is wiring no reader can follow, and how a conformance rule
    once reached perf-only runs. pytest's own plugins (the terminal reporter) are looked up as pytest
    documents."""
    lookup = re.compile(r"get_plugin\(\s*[\"']collectives-")
    sources = [*ROOT.rglob("*.py"), *(PROJECT / "suites").rglob("*.py")]
    found = [
        f"{path.relative_to(PROJECT)}:{number}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if lookup.search(line)
    ]
    assert not found, f"looked up by name: {found}"


SESSION_HOOKS = (
    "pytest_collection_finish",
    "pytest_runtestloop",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
)


def test_the_run_alone_implements_the_session_level_hooks():
    """One owner of a session's life (run.Run), in one written order: no part implements a session-level
    hook of its own, where tryfirst, trylast and registration order once decided verdicts. The modes'
    plugins (the SPMD launcher, the xdist controller) keep theirs."""
    execution = ROOT / "execution"
    modes = {execution / "launchers" / "spmd.py", execution / "modes" / "xdist.py", ROOT / "run.py"}
    found = [
        f"{path.relative_to(ROOT)}: {hook}"
        for path in ROOT.rglob("*.py")
        if path not in modes
        for hook in SESSION_HOOKS
        if f"def {hook}(" in path.read_text()
    ]
    assert not found, found


def test_options_are_declared_in_one_shape_and_a_bad_value_takes_one_path():
    """Every option and ini setting is an ``option.Option`` of a concern's settings module (only option.py
    calls pytest's addoption and addini), and a bad value is an OptionError there: pytest's usage error is
    raised by the entry point alone, which converts it, and by the two checks that are not options (the
    forkserver's start method, the topology the gate detects)."""
    declaring = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py") if ADDS.search(p.read_text())}
    assert declaring == {"option.py"}, declaring
    raising = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py") if "UsageError" in p.read_text()}
    assert raising == {"hooks.py", "execution/launchers/forkserver.py", "gate/baseline_gate.py"}, raising
