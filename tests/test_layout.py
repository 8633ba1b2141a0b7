"""The package's layout: one concern per subpackage, and no module imports another that imports it back."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest_collectives

ROOT = Path(pytest_collectives.__file__).parent


def module_imports() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports at its top level."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("pytest_collectives", *path.relative_to(ROOT).with_suffix("").parts))
        modules[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pytest_collectives"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in modules else node.module)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            found = visit(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    return next((c for m in sorted(graph) if (c := visit(m, []))), None)


def test_no_import_cycles():
    graph = module_imports()
    assert len(graph) > 20 and "pytest_collectives.execution.session" in graph
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = module_imports()
    graph["pytest_collectives.bench.timing"].add("pytest_collectives.hooks")  # hooks imports it, indirectly
    assert cycle(graph) is not None


def test_one_concern_per_subpackage():
    top = {p.name for p in ROOT.iterdir() if p.suffix == ".py"}
    # The entry point and its hook specs, and what several concerns share.
    assert top == {"__init__.py", "hooks.py", "newhooks.py", "atomic.py", "errors.py"}, top
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
