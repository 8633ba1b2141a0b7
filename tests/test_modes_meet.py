"""Session-level modes that meet: every pair of them in one session on CPU, each mode's verdict checked.

Each mode decides part of a session's verdict (the soak its passes, the gate what it saves, the node report
what it writes, the capability JSON, xdist, a selection or a pytest-benchmark flag that leaves tests out),
and the run's order decides how they meet (``run.Run``). Two of them once met badly: ``--benchmark-only``
failed a healthy run for a conformance check it had left out, and ``--baseline-save`` under ``-n`` or
``--benchmark-skip`` saved nothing and passed. Pairwise, not every combination: the sessions below hold
every pair that can meet at least once, a few modes each, and the pairs that must not meet are usage
errors of their own. Every session runs on clean gloo, whose verdicts are known; the SPMD mode is
tests/test_spmd.py's.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SUITES, copy_conformance
from verdict_views import assert_one_verdict

pytestmark = pytest.mark.slow

SELECTED = "(exact_reference and -all_reduce]) or (send_bandwidth and send_recv-unidir)"
MODES: dict[str, list[str]] = {
    "soak": ["--soak", "2s"],
    "save": ["--baseline-save"],
    "report": ["--node-report", "report"],
    "settings": ["--backend-env", "TORCH_GLOO_LAZY_INIT=0,1"],
    "xdist": ["-n", "2"],
    "capability-json": ["--capability-json", "matrix.json"],
    "collect-only": ["--collect-only"],
    "benchmark-only": ["--benchmark-only"],
    "benchmark-skip": ["--benchmark-skip"],
    "perf-only": [],  # a selection of the benchmark alone (-k)
}
# pairs that must not meet: (modes, the one-line usage error)
REFUSED = [
    (("soak", "xdist"), "*--soak runs the tests pass after pass in this pytest: drop -n*"),
    (("xdist", "benchmark-only"), "*Can't have both --benchmark-only and --benchmark-disable*"),
]


def sessions(modes: list[str], refused: list[tuple[str, str]], size: int = 3) -> list[tuple[str, ...]]:
    """Sets of at most ``size`` modes, none holding a refused pair, that together hold every other pair."""
    left = [pair for pair in itertools.combinations(modes, 2) if pair not in refused]
    found = []
    while left:
        chosen = list(left.pop(0))
        for mode in modes:
            if len(chosen) == size:
                break
            if mode in chosen or any((a, mode) in refused or (mode, a) in refused for a in chosen):
                continue
            if any((a, mode) in left or (mode, a) in left for a in chosen):
                chosen.append(mode)
        found.append(tuple(chosen))
        left = [p for p in left if not set(p) <= set(chosen)]
    return found


SESSIONS = sessions(list(MODES), [pair for pair, _ in REFUSED], size=4)


def test_the_sessions_hold_every_pair_that_can_meet() -> None:
    held = {frozenset(p) for s in SESSIONS for p in itertools.combinations(s, 2)}
    meeting = {frozenset(p) for p in itertools.combinations(MODES, 2)} - {frozenset(p) for p, _ in REFUSED}
    assert held == meeting and len(SESSIONS) < len(meeting) / 2


@pytest.fixture
def project(tmp_path: Path) -> Path:
    copy_conformance(tmp_path, ("test_all_reduce.py",))
    for name in ("test_p2p.py", "copycheck.py"):
        (tmp_path / name).write_text((SUITES / "perf" / name).read_text())
    (tmp_path / "pytest.ini").write_text("[pytest]\nbaseline_dir = baselines\n")
    return tmp_path


def run(project: Path, modes: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    selected = "send_bandwidth and send_recv-unidir" if "perf-only" in modes else SELECTED
    args = [arg for mode in modes for arg in MODES[mode]]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "test_all_reduce.py", "test_p2p.py", "-k", selected, "-v",
         "--world-sizes", "2", "--max-bytes", "4K", "--hypothesis-seed", "1", "-p", "no:cacheprovider",
         *args],
        cwd=project, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize("modes", SESSIONS, ids=["+".join(s) for s in SESSIONS])
def test_modes_that_meet_each_keep_their_verdict(project: Path, modes: tuple[str, ...]) -> None:
    done = run(project, modes)
    out = done.stdout + done.stderr
    collected_only = "collect-only" in modes
    conformance_ran = not collected_only and not {"benchmark-only", "perf-only"} & set(modes)
    timed = not collected_only and not {"xdist", "benchmark-skip"} & set(modes)
    saves_nothing = "save" in modes and not collected_only and not timed
    assert done.returncode == (1 if saves_nothing else 0), out[-4000:]
    # no mode trips a rule about tests it left out
    assert "every conformance test was skipped" not in out, out[-4000:]
    saved = list(project.glob("baselines/**/*.json"))
    if "save" in modes:
        assert bool(saved) == (timed and not saves_nothing), out[-3000:]
        if saves_nothing:
            assert "gate error: no benchmark results to save (--baseline-save)" in out, out[-3000:]
    report = project / "report" / "report.json"
    if "report" in modes:
        assert report.exists() != collected_only, out[-3000:]
        if collected_only:
            assert "node report not written: --collect-only ran no test" in out
        else:  # never PASS for a run that failed, nor FAIL for one that passed
            assert (json.loads(report.read_text())["verdict"] == "FAIL") == bool(done.returncode), out[-3000:]
    if "capability-json" in modes:
        assert (project / "matrix.json").exists() == conformance_ran, out[-3000:]
    if "settings" in modes:
        assert "TORCH_GLOO_LAZY_INIT=0" in out and "TORCH_GLOO_LAZY_INIT=1" in out, out[-3000:]
    if "soak" in modes and not collected_only:
        assert "no test failed in any pass" in out, out[-3000:]
    if "xdist" in modes and conformance_ran:  # the workers' groups, counted by the controller
        assert "xdist workers" in out, out[-3000:]
    if conformance_ran:
        assert passed(out, "test_all_reduce.py::"), out[-3000:]
    if timed:
        assert passed(out, "test_p2p.py::"), out[-3000:]
    if not collected_only:
        closing_verdicts(
            done.stdout, modes, failed=bool(done.returncode), timed=timed, conformance=conformance_ran
        )
        assert_one_verdict(done.stdout, done.returncode, project / "report")


def closing_verdicts(out: str, modes: tuple[str, ...], failed: bool, timed: bool, conformance: bool) -> None:
    """The plugin's output ends with its verdicts, after pytest-benchmark's wide table, each in 80 columns,
    one for each part that judged, FAIL exactly where the run failed."""
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if "collectives: verdicts" in line), None)
    if start is None:  # nothing judged: benchmarks untimed under -n, no conformance test, nothing saved
        assert "xdist" in modes and not conformance and not failed and not {"soak", "report"} & set(modes)
        return
    block = list(itertools.takewhile(lambda line: not line.startswith(("=", "-")), lines[start + 1 :]))
    verdicts = [line for line in block if not line.startswith(" ")]  # a wrapped verdict's later lines
    assert block and all(len(line) <= 80 for line in block), block
    assert not any(line.startswith(("benchmark", "Legend", "----")) for line in lines[start:]), out[-3000:]
    assert any(": FAIL" in line for line in verdicts) == failed, block
    starts = {line.split(":")[0] for line in verdicts}
    assert ("conformance" in starts) == conformance, block
    assert ("soak" in starts) == ("soak" in modes), block
    assert ("node report" in starts) == ("report" in modes), block
    if "save" in modes and timed and not failed:
        saved = "performance gate: NOT JUDGED, saved as run 1 of the baseline"
        assert any(line.startswith(saved) for line in verdicts), block


def passed(out: str, prefix: str) -> bool:
    """Whether -v printed a test of ``prefix`` as passed (``id PASSED``; ``[gw0] PASSED id`` under xdist)."""
    return any(prefix in line and "PASSED" in line for line in out.splitlines())


@pytest.mark.parametrize("modes, message", REFUSED, ids=["+".join(m) for m, _ in REFUSED])
def test_modes_that_must_not_meet_are_a_usage_error(
    project: Path, modes: tuple[str, ...], message: str
) -> None:
    done = run(project, modes)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout[-3000:]
    assert fnmatch.filter(done.stderr.splitlines(), message), done.stderr[-2000:]
