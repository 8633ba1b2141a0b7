"""The CI gate end to end: save a baseline, pass against it, fail on a planted slowdown, never lose data."""

from __future__ import annotations

import hashlib
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


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_save_compare_and_catch_a_planted_slowdown(pytester, bench_dir, monkeypatch) -> None:
    saved = run(pytester, "--baseline-save")
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines(["*saved 1 benchmark(s) as the baseline of cpu-*"])
    path = only_baseline(bench_dir)

    same = run(pytester, "--fail-on-regression")
    assert same.ret == 0, same.stdout.str()
    # A baseline recorded while CI was busy can make a quiet rerun an "improvement"; never a regression.
    same.stdout.fnmatch_lines(["*test_bench.py::test_op?ws2?*", f"compared with {path}*"])
    same.stdout.no_fnmatch_line("*test_bench.py::test_op?ws2?*regression*")

    monkeypatch.setenv("PLANTED_DELAY_S", "0.02")
    slow = run(pytester, "--fail-on-regression")
    assert slow.ret == pytest.ExitCode.TESTS_FAILED
    slow.stdout.fnmatch_lines(
        [
            "*benchmark*baseline*now*ratio*verdict*",
            "*test_bench.py::test_op?ws2?*regression*",
            "*FAILED: 1 regression(s) (--fail-on-regression)*",
        ]
    )
    report_only = run(pytester)
    assert report_only.ret == 0
    report_only.stdout.fnmatch_lines(["*1 regression(s); report mode: add --fail-on-regression to gate*"])


def test_no_baseline_is_said_plainly(pytester, bench_dir) -> None:
    result = run(pytester, "--fail-on-regression")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*no baseline for this topology (cpu-*) under *: nothing to compare*"])


def test_existing_baseline_is_never_overwritten_without_the_flag(pytester, bench_dir) -> None:
    run(pytester, "--baseline-save").assert_outcomes(passed=1)
    path = only_baseline(bench_dir)
    before = digest(path)
    again = run(pytester, "--baseline-save")
    assert again.ret == pytest.ExitCode.TESTS_FAILED
    refusal = f"baseline error: {path}: a baseline already exists; pass --baseline-overwrite*"
    again.stdout.fnmatch_lines([refusal])
    assert digest(path) == before
    run(pytester, "--baseline-save", "--baseline-overwrite").assert_outcomes(passed=1)
    assert digest(path) != before


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
