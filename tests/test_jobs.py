"""The README's jobs as a user types them, on the real suites (copied beside an empty baselines/): a run's
verdicts belong to what it ran, so the CI gate's commands pass on a healthy machine. Each runs as the
command ``pytest`` found on the PATH of the environment the README's set-up made (tox's), as in its
activated shell: not ``python -m pytest``, which hid that the environment had no ``pytest`` of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docblocks import ROOT, block_of, commands, pytest_args, unshown
from helpers import copy_checkout

# The gate's verdicts judge real timings, which a test beside it under -n would skew.
pytestmark = pytest.mark.alone

# The registered algorithms' benchmarks probe their group's capabilities, as a conformance test does: the
# perf run that once failed on a healthy machine ("conformance checked nothing"): two algorithms at 4 and
# 64 KiB (the sweep's option --max-bytes shortens it).
PERF = (
    "suites/perf/test_collectives.py",
    "-k",
    "registered and (ring_all_gather or tree_reduce) or test_broadcast",
)

# A machine gone slow, planted through the README's own option: the module is imported on every rank.
SLOWDOWN = """
import time

import torch.distributed as dist

_broadcast = dist.broadcast


def broadcast(*args, **kwargs):
    time.sleep(0.005)
    return _broadcast(*args, **kwargs)


dist.broadcast = broadcast
"""
CONFORMANCE = ("suites/conformance/test_point_to_point.py", "-k", "ring_exchange")


ENVIRONMENT = Path(sys.executable).parent  # the bin/ of the environment these tests run in


@pytest.fixture
def checkout(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    copy_checkout(pytester.path)
    monkeypatch.setenv("PATH", f"{ENVIRONMENT}{os.pathsep}{os.environ['PATH']}")  # as if activated
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    typed = shutil.which("pytest")
    assert typed, "no pytest on the PATH of this environment"
    return pytester.run(typed, "--world-sizes", "2", "--max-bytes", "64K", "-p", "no:cacheprovider", *args)


def test_the_environment_s_own_pytest_runs_the_plugin(checkout: pytest.Pytester) -> None:
    """After the README's set-up, ``pytest`` in the environment's shell is the environment's own, with the
    plugin: where the system's pytest was seen instead, the suites' conftest could not import it."""
    assert Path(shutil.which("pytest") or "").parent == ENVIRONMENT, (
        f"{ENVIRONMENT} has no pytest script of its own (tox.ini's commands_pre installs one)"
    )
    result = run(checkout, "suites/perf", "--collect-only", "-q")
    assert result.ret == 0, result.stdout.str()[-3000:] + result.stderr.str()[-3000:]


def test_the_ci_gate_commands_pass_a_healthy_perf_run(checkout: pytest.Pytester) -> None:
    """The README's commands: ``--baseline-save`` three times, then ``--fail-on-regression``: exit 0 each,
    and no conformance verdict (no matrix, no "checked nothing") in a run that selected no conformance
    test. A slowdown planted on the ranks fails the gate, which names it in the README's words."""
    save, gate = (pytest_args(c) for c in commands(block_of("README.md", "--baseline-save").text))
    selection = ("-k", PERF[2])
    for _ in range(3):
        saved = run(checkout, *save, *selection)
        assert saved.ret == 0, saved.stdout.str()[-3000:]
        saved.stdout.fnmatch_lines(["*saved 6 benchmark(s) as a run of the baseline of cpu-*"])
    # This VM's speed swings by more than the 25% a baseline from one sitting allows a machine, within a
    # minute, now and then (1.30x seen in CI), and one benchmark's by more than the spread of three runs in
    # one minute (about 6%) lets it: a healthy run was once confirmed 1.27x slow on one (1.15x measured
    # again). The verdicts on real noise are test_gate.py's; this job's slowdown is some 60 times.
    selection += ("--machine-tolerance", "3", "--regression-threshold", "0.9")
    # Even so, one benchmark read 1.99x and 1.57x again in CI, the machine unchanged: a healthy run gets
    # three tries, where a gate failing every healthy run fails all three.
    for _ in range(3):
        gated = run(checkout, *gate, *selection)
        if gated.ret == 0:
            break
    gated.assert_outcomes(passed=6)
    assert gated.ret == 0, gated.stdout.str()[-3000:]
    gated.stdout.fnmatch_lines(["compared with *baseline.json: 3 run(s)*"])
    for result in (saved, gated):
        result.stdout.no_fnmatch_line("*capability matrix*")
        result.stdout.no_fnmatch_line("*every conformance test was skipped*")
    checkout.makepyfile(slowdown=SLOWDOWN)  # found on the PYTHONPATH pytester gives the command
    slowed = run(checkout, *gate, *selection, "--backend-module", "slowdown")
    assert slowed.ret == 1, slowed.stdout.str()[-3000:]
    slowed.stdout.fnmatch_lines(
        ["REGRESSION suites/perf/test_collectives.py::test_broadcast[[]ws2-4KiB[]]: *", "FAILED: *"]
    )
    shown = block_of("README.md", "REGRESSION ").text
    assert not unshown(shown, slowed.stdout.str()), "the README shows lines the gate does not print"


def test_a_conformance_run_has_its_matrix_and_a_run_of_both_both_verdicts(checkout: pytest.Pytester) -> None:
    alone = run(checkout, *CONFORMANCE)
    assert alone.ret == 0, alone.stdout.str()[-3000:]
    alone.stdout.fnmatch_lines(["*capability matrix*", "send_recv *P*"])
    alone.stdout.no_fnmatch_line("*compared with*")
    both = run(checkout, CONFORMANCE[0], PERF[0], "-k", f"ring_exchange or ({PERF[2]})", "--baseline-save")
    assert both.ret == 0, both.stdout.str()[-3000:]
    both.stdout.fnmatch_lines(["*saved 6 benchmark(s) as a run of the baseline*", "*capability matrix*"])


def test_pytest_benchmark_s_own_perf_only_flag_is_a_perf_run(checkout: pytest.Pytester) -> None:
    """``pytest suites --benchmark-only`` (pytest-benchmark's flag) skips every conformance test by the
    user's choice: it selects none, as ``pytest suites/perf`` does, and is no "checked nothing"."""
    result = run(
        checkout, "suites", "-k", "ring_exchange or (registered and ring_all_gather)", "--benchmark-only"
    )
    result.assert_outcomes(passed=2, skipped=1)
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.no_fnmatch_line("*every conformance test was skipped*")


# What a clone holds, not what a session here made beside it.
NOT_CLONED = (".git", ".tox", "build", "*.egg-info", "__pycache__", ".hypothesis", ".*_cache", ".benchmarks")


@pytest.mark.slow
def test_the_pep_668_set_up_makes_an_environment_whose_pytest_runs_the_jobs(tmp_path: Path) -> None:
    """The README's set-up where pip refuses the system Python (PEP 668), as typed, with the system's
    ``python3`` and ``~`` a folder of this test's: tox in a virtual environment of its own, then tox's
    suites environment (a few conformance tests of it: the whole run is .ci/run's). Its activated shell's
    ``pytest`` is its own and runs a job. pip refuses nothing here: what is proven is that the set-up
    needs nothing of the system's pip."""
    clone, home = tmp_path / "clone", tmp_path / "home"
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(*NOT_CLONED))
    # A user's shell: none of this session's environment (tox's, pytest's), so python3 is the system's.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TOX_", "VIRTUAL_ENV"))}
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != ENVIRONMENT)
    set_up = block_of("README.md", "~/.venvs/tox").text
    assert block_of("docs/getting-started.md", "~/.venvs/tox").text == set_up
    for command in commands(set_up):
        typed = [str(home) + word[1:] if word.startswith("~/") else word for word in command]
        if typed[-2:] == ["-e", "suites"]:
            typed += ["--", "-k", CONFORMANCE[2], "--world-sizes", "2", "-p", "no:cacheprovider"]
        done = subprocess.run(typed, cwd=clone, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{' '.join(command)}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    assert "capability matrix" in done.stdout, done.stdout[-3000:]
    activated = clone / ".tox" / "suites" / "bin"
    typed = shutil.which("pytest", path=f"{activated}{os.pathsep}{env['PATH']}")
    assert typed and Path(typed).parent == activated, f"{activated} has no pytest of its own"
    job = subprocess.run(
        [typed, "suites/perf", "--collect-only", "-q"], cwd=clone, env=env, capture_output=True, text=True
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
