"""A failing layout call is written as a standalone reproduction (conformance.standalone): run alone, on
torch and the backend with nothing of this project's, it shows the bug and exits 1; on a backend without
the bug it exits 0."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import SUITES, SUPPORT, run_on_backend, torch_below

from pytest_collectives import FailingCall, layout_script, rank_input
from pytest_collectives.conformance.known_bugs import load

GLOO_LAYOUT_BUGS = [
    bug for bug in load(SUITES / "known_bugs.json")
    if "gloo" in bug.backends and "test_backend_call_in_a_layout" in bug.test
]  # fmt: skip


def _run_alone(script: Path, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    """``script`` as a vendor runs it: a Python of its own, from another folder, no plugin on its path but
    the backend's module."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COLLECTIVES"))}
    env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, str(script)], cwd=script.parent, env=env, capture_output=True, text=True, timeout=300
    )


def _layout_failures(pytester: pytest.Pytester, backend: str, select: str, sizes: str) -> Path:
    """Run the layout test's ``select`` on ``backend``: its reproductions folder, each of them named by
    the --capability-json entry of a failing or known-bug test."""
    result = run_on_backend(
        pytester, backend, "-rfx", "-k", select, "--reproductions", "repro",
        "--capability-json", "cells.json", files=("test_layouts.py",), world_sizes=sizes,
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) + outcomes.get("xfailed", 0) > 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([f"*standalone reproduction: {pytester.path / 'repro'}/*.py"])
    folder = pytester.path / "repro"
    written = json.loads((pytester.path / "cells.json").read_text())
    assert "--capability-json cells.json" in written["run"]["command"]  # what ran, to run it again
    tests = written["failing_tests"]
    named = {path for test in tests for path in test["reproductions"]}
    assert named and named <= {str(path) for path in folder.iterdir()}, tests
    return folder


@pytest.mark.skipif(torch_below(2, 13), reason="the manifest's layout entries are gloo's of torch 2.13")
def test_each_gloo_layout_bug_s_reproduction_shows_it_alone_on_gloo(pytester: pytest.Pytester) -> None:
    """Every known gloo layout bug of the manifest, its reproduction written from the suite's own failure,
    at 2 ranks for half of them and 3 for the others: run alone on torch's gloo, each exits 1 naming the
    wrong elements."""
    calls = [re.search(r"-(\w+)-([\w*]+)\?$", bug.test).groups() for bug in GLOO_LAYOUT_BUGS]
    select = " or ".join(f"({name}- and {layouts.replace('*', '')})" for name, layouts in calls)
    folder = _layout_failures(pytester, "gloo", select, "2,3")
    scripts = []
    for i, (bug, (name, layouts)) in enumerate(zip(GLOO_LAYOUT_BUGS, calls, strict=True)):
        n = 2 + i % 2
        found = sorted(folder.glob(f"gloo-{name}-{layouts.replace('*', '?*')}-ws{n}-float32.py"))
        assert found, (bug.test, n, sorted(p.name for p in folder.iterdir()))
        scripts.append(found[0])
    for script in scripts:
        run = _run_alone(script)
        assert run.returncode == 1 and "elements WRONG" in run.stdout, (script.name, run.stdout, run.stderr)
        assert "pytest" not in script.read_text().split('"""')[2], script.name  # the code imports torch alone


@pytest.mark.skipif(torch_below(2, 13), reason="Python ProcessGroup backends crash before torch 2.13")
def test_a_mutant_s_reproduction_fails_on_it_and_passes_on_the_reference(pytester: pytest.Pytester) -> None:
    """A planted layout bug (all_gather writes a channels_last output in contiguous order): the script
    written from the suite's failure exits 1 on the mutant and, its backend named refgloo, 0."""
    mutant = "mutant_channels_last_written_contiguous"
    folder = _layout_failures(pytester, mutant, "all_gather-channels_last and not into", "2")
    script = folder / f"{mutant}-all_gather-channels_last-ws2-float32.py"
    text = script.read_text()
    assert "import mutant_backends" in text and f"BACKEND, WORLD_SIZE, DEVICE = {mutant!r}, 2" in text
    on_mutant = _run_alone(script, str(SUPPORT))
    assert on_mutant.returncode == 1, on_mutant.stdout + on_mutant.stderr
    assert "elements WRONG" in on_mutant.stdout, on_mutant.stdout
    script.write_text(text.replace(repr(mutant), repr("refgloo")))
    on_reference = _run_alone(script, str(SUPPORT))
    assert on_reference.returncode == 0, on_reference.stdout + on_reference.stderr
    assert "every result as expected" in on_reference.stdout


def test_every_known_bug_says_where_it_stands_upstream() -> None:
    """A report's address, or "not reported upstream" with the reproduction committed beside the
    manifest."""
    manifest = SUITES / "known_bugs.json"
    for entry in json.loads(manifest.read_text())["known_bugs"]:
        upstream = entry.get("upstream", "")
        assert upstream.startswith(("https://github.com/", "not reported upstream")), entry["test"]
        if upstream.startswith("not reported") and "gloo" in entry["backends"] and "layout" in entry["test"]:
            script = re.search(r"known_bugs/\S+\.py", upstream)
            assert script and (manifest.parent / script.group()).is_file(), (entry["test"], upstream)


def test_a_reproduction_of_a_call_gloo_gets_right_exits_0(tmp_path: Path) -> None:
    """No false alarm: the same writer, on calls gloo gets right (a float16 all_reduce and a bfloat16 reduce
    of channels_last tensors at 3 ranks, where any order of the sum rounds), exits 0."""
    for name, dtype in (("all_reduce", torch.float16), ("reduce", torch.bfloat16)):
        call = FailingCall(
            "gloo", 3, name, "channels_last", "channels_last", dtype, (2, 3, 2, 5),
            given=lambda r, p, d=dtype: rank_input(11, r * 16 + p, (2, 3, 2, 5), d),
        )  # fmt: skip
        script = tmp_path / f"{name}.py"
        script.write_text(layout_script(call, "(none: a healthy call)", "this test"))
        run = _run_alone(script)
        assert run.returncode == 0 and "every result as expected" in run.stdout, run.stdout + run.stderr



@pytest.mark.skipif(torch_below(2, 13), reason="Python ProcessGroup backends crash before torch 2.13")
def test_the_backend_s_own_all_reduce_failing_writes_a_reproduction(pytester: pytest.Pytester) -> None:
    """The backend's own all_reduce with its last element wrong (every dtype and reduce op): the scripts
    written from the every-cell sweep's failures (a float32 sum at 2 ranks, within its rounding slack, and
    a max at 3) exit 1 on the mutant and 0 with their backend named refgloo; --capability-json names
    them on the FAIL cells."""
    mutant = "mutant_last_element_wrong_in_every_dtype"
    run_on_backend(
        pytester, mutant, "-k", "all_reduce]", "--reproductions", "repro", "--capability-json", "cells.json",
        files=("test_every_cell.py",), world_sizes="2,3",
    ).stdout.fnmatch_lines([f"*standalone reproduction: {pytester.path / 'repro'}/{mutant}-all_reduce-*.py"])
    # the FAIL cells of the matrix name the scripts written from their failures
    cells = json.loads((pytester.path / "cells.json").read_text())["cells"]
    named = [path for cell in cells if cell["status"] == "FAIL" for path in cell.get("reproductions", [])]
    assert named and all(Path(path).name.startswith(f"{mutant}-all_reduce-") for path in named), cells
    for n, op, dtype in ((2, "sum", "float32"), (3, "max", "*")):  # each script runs 3 or 4 processes
        script = sorted((pytester.path / "repro").glob(f"{mutant}-all_reduce-{op}-{dtype}-*-ws{n}.py"))[0]
        text = script.read_text()
        on_mutant = _run_alone(script, str(SUPPORT))
        assert on_mutant.returncode == 1 and "elements WRONG" in on_mutant.stdout, script.name
        script.write_text(text.replace(repr(mutant), repr("refgloo")))
        on_reference = _run_alone(script, str(SUPPORT))
        assert on_reference.returncode == 0, (script.name, on_reference.stdout + on_reference.stderr)
