"""The CI gate end to end: record three runs, pass against them, fail on a planted slowdown seen twice,
never pass silently, never lose data."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

# The benchmarked op is dominated by a fixed sleep, and the gate is asked for a 50% effect, so that a busy CI
# machine can't fake a regression (a rerun's median moves by 5-10% there); PLANTED_DELAY_S, read by the
# ranks, is the planted slowdown: 3x. The rule itself is measured on synthetic samples in test_regression.py.
BENCH = """
import os, time
import pytest, torch, torch.distributed as dist

@pytest.mark.world_size(2)
def test_op(pg, benchmark):
    t = torch.ones(16)
    delay = 0.01 + float(os.environ.get("PLANTED_DELAY_S", "0"))

    def op():
        dist.all_reduce(t)
        time.sleep(delay)

    benchmark(op, nbytes=64, collective="all_reduce")
"""


@pytest.fixture
def bench_dir(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(test_bench=textwrap.dedent(BENCH))
    pytester.makeini("[pytest]\nbaseline_dir = baselines\n")
    return pytester.path / "baselines"


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(
        "--benchmark-min-rounds", "15", "--benchmark-max-time", "0.05", "--regression-threshold", "0.5", *args
    )


def only_baseline(directory: Path) -> Path:
    (path,) = directory.glob("*/baseline.json")
    return path


def test_three_runs_arm_the_gate_which_catches_a_planted_slowdown(pytester, bench_dir, monkeypatch) -> None:
    for still in ("record 2 more", "record 1 more"):
        saved = run(pytester, "--baseline-save")
        saved.assert_outcomes(passed=1)
        saved.stdout.fnmatch_lines([f"*saved 1 benchmark(s) as a run of the baseline of cpu-*{still})"])
        unarmed = run(pytester, "--fail-on-regression")
        assert unarmed.ret == pytest.ExitCode.TESTS_FAILED
        unarmed.stdout.fnmatch_lines(
            ["baseline error: the baseline * holds fewer than 3 runs of this run's benchmarks*"]
        )
    run(pytester, "--baseline-save").stdout.fnmatch_lines(["*(3 run(s) kept of 5)"])
    path = only_baseline(bench_dir)

    same = run(pytester, "--fail-on-regression")
    assert same.ret == 0, same.stdout.str()
    same.stdout.fnmatch_lines(["*test_bench.py::test_op?ws2?*", f"compared with {path}: 3 run(s)*"])
    same.stdout.no_fnmatch_line("*test_bench.py::test_op?ws2?*regression*")

    monkeypatch.setenv("PLANTED_DELAY_S", "0.02")
    slow = run(pytester, "--fail-on-regression", "--gate-report", "gate")
    assert slow.ret == pytest.ExitCode.TESTS_FAILED
    slow.stdout.fnmatch_lines(
        [
            "*benchmark*baseline*now*ratio*vs machine*spread*detects*verdict*again*",
            "*test_bench.py::test_op?ws2?*regression*x",  # the second measurement is shown
            "REGRESSION test_bench.py::test_op?ws2?: *x, again *x (between-run spread *, machine factor 1.0*",
            "*FAILED: 1 confirmed regression(s) (--fail-on-regression)*",
        ]
    )
    slow.assert_outcomes(passed=1)  # measured again, but reported once
    report = json.loads((pytester.path / "gate" / "gate.json").read_text())
    assert report["verdict"] == "fail"
    (bench,) = report["benchmarks"]
    assert bench["verdict"] == "regression" and bench["ratio"] > 2 and bench["remeasured"] > 2
    assert "**regression**" in (pytester.path / "gate" / "gate.md").read_text()

    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    report_only = run(pytester)
    assert report_only.ret == 0
    report_only.stdout.fnmatch_lines(["*1 confirmed regression(s); report mode: add --fail-on-regression*"])
    assert (pytester.path / "summary.md").read_text().startswith("## collectives gate: passed")


def test_no_baseline_fails_the_gate_unless_a_first_run_is_allowed(pytester, bench_dir) -> None:
    result = run(pytester, "--fail-on-regression")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "baseline error: no baseline for this topology (cpu-*) under *, so nothing can be judged; "
            "record one with `pytest <same arguments> --baseline-save` (3 times*), "
            "or pass --allow-missing-baseline for a first run"
        ]
    )
    allowed = run(pytester, "--fail-on-regression", "--allow-missing-baseline")
    assert allowed.ret == 0
    allowed.stdout.fnmatch_lines(
        ["no baseline for this topology (cpu-*) under *: nothing judged; record one*"]
    )


def test_an_unreadable_baseline_is_never_replaced_without_the_flag(pytester, bench_dir) -> None:
    run(pytester, "--baseline-save").assert_outcomes(passed=1)
    path = only_baseline(bench_dir)
    path.write_text("{")
    again = run(pytester, "--baseline-save")
    assert again.ret == pytest.ExitCode.TESTS_FAILED
    again.stdout.fnmatch_lines([f"baseline error: {path}: invalid JSON*--baseline-overwrite*"])
    assert path.read_text() == "{"
    run(pytester, "--baseline-save", "--baseline-overwrite").assert_outcomes(passed=1)
    assert json.loads(path.read_text())["schema_version"] == 2


@pytest.mark.parametrize(
    "content, field",
    [("", "*empty*"), ('{"schema_version": 1', "*JSON*"), ('{"schema_version": 99}', "*schema_version*")],
    ids=["empty", "truncated", "wrong-schema"],
)
def test_corrupt_baseline_is_a_one_line_error(pytester, bench_dir, content, field) -> None:
    run(pytester, "--baseline-save").assert_outcomes(passed=1)
    path = only_baseline(bench_dir)
    path.write_text(content)
    result = run(pytester, "--fail-on-regression")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    (line,) = [line for line in result.stdout.lines if line.startswith("baseline error:")]
    assert str(path) in line
    result.stdout.fnmatch_lines([f"baseline error: {field}"])
    assert path.read_text() == content
