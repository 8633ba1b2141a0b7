"""The CI gate end to end: record three runs, pass against them, fail on a planted slowdown seen twice,
never pass silently, never lose data."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest

from pytest_collectives.topology.detect import detect
from pytest_collectives.topology.fingerprint import Fingerprint
from pytest_collectives.topology.identity import topology_id

# The gate's verdicts judge real timings, which a test beside it under -n would skew.
pytestmark = pytest.mark.alone

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
    run(pytester, "--baseline-save").stdout.fnmatch_lines(
        ["*(3 run(s) kept of 5)", "warning: the baseline's 3 runs come from one sitting*the 25% default*"]
    )
    path = only_baseline(bench_dir)

    same = run(pytester, "--fail-on-regression")
    assert same.ret == 0, same.stdout.str()
    same.stdout.fnmatch_lines(
        [
            "*test_bench.py::test_op?ws2?*",
            f"compared with {path}: 3 run(s)*; judged on each benchmark's 5th-percentile round",
        ]
    )
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
    assert report["verdict"] == "fail" and report["statistic"] == "p05"
    (bench,) = report["benchmarks"]
    assert bench["verdict"] == "regression" and bench["ratio"] > 2 and bench["remeasured"] > 2
    assert "**regression**" in (pytester.path / "gate" / "gate.md").read_text()

    # Saving under the gate: judged first, and a failing run is not recorded as the machine's norm.
    before = path.read_text()
    guarded = run(pytester, "--baseline-save", "--fail-on-regression")
    assert guarded.ret == pytest.ExitCode.TESTS_FAILED
    guarded.stdout.fnmatch_lines(
        [
            "*FAILED: 1 confirmed regression(s) (--fail-on-regression)*",
            "not saved as a baseline run: the gate failed it (--fail-on-regression); a baseline records a "
            "machine known to be good",
        ]
    )
    assert path.read_text() == before

    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    report_only = run(pytester)
    assert report_only.ret == 0
    report_only.stdout.fnmatch_lines(["*1 confirmed regression(s); report mode: add --fail-on-regression*"])
    assert (pytester.path / "summary.md").read_text().startswith("## collectives gate: WARN")

    # A run recorded before the 5th percentile was kept: the whole baseline is judged on the fastest round;
    # one recorded before that was kept too: on the median. The planted slowdown is caught either way.
    doc = json.loads(path.read_text())
    for summary in doc["runs"][0]["benchmarks"].values():
        del summary["p05"]
    path.write_text(json.dumps(doc))
    old = run(pytester, "--fail-on-regression")
    old.stdout.fnmatch_lines(["compared with *; judged on each benchmark's fastest round (a run of the*"])
    assert old.ret == pytest.ExitCode.TESTS_FAILED
    for summary in doc["runs"][0]["benchmarks"].values():
        del summary["min"]
    path.write_text(json.dumps(doc))
    older = run(pytester, "--fail-on-regression")
    older.stdout.fnmatch_lines(
        ["compared with *; judged on the median round (a run of the baseline was recorded*"]
    )
    assert older.ret == pytest.ExitCode.TESTS_FAILED


def test_no_baseline_fails_the_gate_unless_a_first_run_is_allowed(pytester, bench_dir) -> None:
    """Found before the benchmarks run, and before a soak's passes: a gate with no baseline fails whatever
    they measure, and an 8-hour soak must not say so after 8 hours."""
    for soak in ([], ["--soak", "10m"]):
        result = run(pytester, "--fail-on-regression", *soak)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(
            [
                "baseline error: no baseline for this topology (cpu-*) under *, so nothing can be judged; "
                "record one with `pytest <same arguments> --baseline-save` (3 times*), "
                "or pass --allow-missing-baseline for a first run"
            ]
        )
        assert result.parseoutcomes().get("passed") is None and "soak: pass" not in result.stdout.str()
    allowed = run(pytester, "--fail-on-regression", "--allow-missing-baseline")
    assert allowed.ret == 0
    allowed.stdout.fnmatch_lines(
        ["no baseline for this topology (cpu-*) under *: nothing judged; record one*"]
    )


def recorded_as(baseline: Path, **changes: object) -> str:
    """Move ``baseline`` to where a machine with ``changes`` to this one's fingerprint records it."""
    doc = json.loads(baseline.read_text())
    fp = dataclasses.replace(Fingerprint.from_json(doc["fingerprint"]), **changes)
    doc["fingerprint"], doc["topology_id"] = fp.to_json(), topology_id(fp)
    target = baseline.parent.parent / doc["topology_id"] / baseline.name
    target.parent.mkdir()
    target.write_text(json.dumps(doc))
    baseline.unlink()
    baseline.parent.rmdir()
    return doc["topology_id"]


def test_a_node_that_lost_hardware_fails_and_another_cpu_model_is_told_how_to_compare(
    pytester, bench_dir
) -> None:
    run(pytester, "--baseline-save").assert_outcomes(passed=1)
    cores = detect("gloo").logical_cores
    bigger = recorded_as(only_baseline(bench_dir), logical_cores=cores + 2)
    degraded = run(pytester, "--fail-on-regression", "--allow-missing-baseline")
    assert degraded.ret == pytest.ExitCode.TESTS_FAILED
    degraded.stdout.fnmatch_lines(
        [
            f"baseline error: no baseline for this topology (cpu-*) under *; the nearest recorded topology, "
            f"{bigger}, differs: CPUs {cores + 2} -> {cores}, so this node looks degraded*"
        ]
    )
    other = recorded_as(only_baseline(bench_dir), logical_cores=cores, cpu_model="Another CPU")
    elsewhere = run(pytester, "--fail-on-regression", "--allow-missing-baseline")
    assert elsewhere.ret == 0, elsewhere.stdout.str()
    elsewhere.stdout.fnmatch_lines(
        [f"*differs: CPU model 'Another CPU' -> *, none of which can be a fault: judge against it with "
         f"`--baseline {other}`: nothing judged*"]
    )  # fmt: skip


def test_a_run_with_failed_tests_is_never_saved(pytester, bench_dir) -> None:
    pytester.makepyfile(test_broken="def test_broken():\n    assert False\n")
    result = run(pytester, "--baseline-save")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["not saved as a baseline run: 1 test(s) failed; a baseline records a machine known to be good"]
    )
    assert not list(bench_dir.glob("*/*.json"))


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


def test_a_save_onto_a_full_baseline_refuses_rather_than_drop_a_run(pytester, bench_dir) -> None:
    for _ in range(5):
        run(pytester, "--baseline-save").assert_outcomes(passed=1)
    path = only_baseline(bench_dir)
    before = path.read_text()
    refused = run(pytester, "--baseline-save")
    assert refused.ret == pytest.ExitCode.TESTS_FAILED
    refused.stdout.fnmatch_lines([f"baseline error: {path} holds 5 runs: saving this one would drop*"])
    assert path.read_text() == before
    run(pytester, "--baseline-save", "--baseline-keep", "5").assert_outcomes(passed=1)
    assert path.read_text() != before and len(json.loads(path.read_text())["runs"]) == 5


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


def seed_baseline(root: Path, names: list[str], runs: int = 3) -> None:
    """A baseline of this machine's topology holding ``names``, without timing a run for each."""
    from pytest_collectives.gate.baseline_format import BenchmarkEntry
    from pytest_collectives.gate.store import save_baseline
    from pytest_collectives.topology.detect import detect

    results = {name: BenchmarkEntry.from_samples([0.01 + 0.0001 * k for k in range(15)]) for name in names}
    for _ in range(runs):
        save_baseline(root, detect("gloo", 0), results)


@pytest.mark.parametrize(
    "args, why",
    [
        (["--benchmark-skip"], "--benchmark-skip skipped every benchmark"),
        (["--benchmark-disable"], "--benchmark-disable ran every benchmark once, untimed"),
        (["-k", "no_such_test"], "no selected test takes the benchmark fixture (check -k, -m and the paths)"),
        (["-n", "2"], "pytest-benchmark does not time under pytest-xdist; run the gate without -n"),
    ],
    ids=["benchmark-skip", "benchmark-disable", "selection", "xdist"],
)
def test_a_run_without_benchmark_results_never_passes_the_gate(pytester, bench_dir, args, why) -> None:
    seed_baseline(bench_dir, ["test_bench.py::test_op[ws2]"])
    result = run(pytester, "--fail-on-regression", *args)
    assert result.ret != 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            f"gate error: no benchmark results to judge: {why}, so --fail-on-regression cannot pass; "
            "pass --min-judged 0 to let such a run pass"
        ]
    )
    opted_out = run(pytester, "--fail-on-regression", "--min-judged", "0", *args)
    assert opted_out.ret in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED), opted_out.stdout.str()
    opted_out.stdout.no_fnmatch_line("*gate error*")


def test_a_run_that_judges_a_sliver_of_the_baseline_fails_the_gate(pytester, bench_dir) -> None:
    others = [f"test_bench.py::test_gone[{i}]" for i in range(3)]
    seed_baseline(bench_dir, ["test_bench.py::test_op[ws2]", *others])
    partial = run(pytester, "--fail-on-regression")
    assert partial.ret == pytest.ExitCode.TESTS_FAILED
    partial.stdout.fnmatch_lines(
        [
            "gate error: this run judged 1 of the baseline's 4 benchmarks (25%), fewer than --min-judged "
            "0.5; the others were not selected (-k, -m, paths), skipped or failed, so --fail-on-regression "
            "cannot pass; pass --min-judged 0 to let such a run pass"
        ]
    )
    # Only the share is asked about here: whatever the one benchmark's verdict, no gate error.
    assert run(pytester, "--fail-on-regression", "--min-judged", "0.25").stdout.str().count("gate error") == 0


def test_a_baseline_benchmark_selected_but_not_run_fails_the_gate(pytester, bench_dir) -> None:
    """A benchmark that ran on the good machine and is skipped now (its configuration refused, its group
    never started) is a failure of the gate, not a note: the skip alone would let the run exit 0."""
    pytester.makepyfile(
        test_refused="""
        import pytest

        def test_refused(benchmark):
            pytest.skip("the backend rejected this configuration")
        """
    )
    seed_baseline(bench_dir, ["test_bench.py::test_op[ws2]", "test_refused.py::test_refused"])
    gated = run(pytester, "--fail-on-regression")
    gated.assert_outcomes(passed=1, skipped=1)
    assert gated.ret == pytest.ExitCode.TESTS_FAILED
    gated.stdout.fnmatch_lines(
        [
            "DID NOT RUN: 1 benchmark(s) of the baseline were selected and recorded no timing (failed, "
            "skipped, or their configuration did not start): test_refused.py::test_refused",
            "FAILED: 1 benchmark(s) of the baseline that did not run (--fail-on-regression)",
        ]
    )
    # Left out by the selection, it is a note, weighed by --min-judged.
    chosen = run(pytester, "--fail-on-regression", "-k", "test_op")
    chosen.stdout.fnmatch_lines(
        ["1 benchmark(s) in the baseline were not selected: test_refused.py::test_refused"]
    )
    # (whatever test_op's own verdict on this noisy machine)
    assert "did not run" not in chosen.stdout.str().lower(), chosen.stdout.str()


def test_min_judged_is_a_fraction(pytester, bench_dir) -> None:
    result = run(pytester, "--min-judged", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--min-judged 2: expected a fraction between 0 and 1, e.g. 0.1"])


@pytest.mark.parametrize("args", [["--fail-on-regression"], ["--node-report", "report", "-k", "nothing"]])
def test_a_topology_that_cannot_be_read_is_a_usage_error_before_the_tests(
    pytester, bench_dir, monkeypatch, args
) -> None:
    from pytest_collectives.gate import baseline_gate as gate_plugin
    from pytest_collectives.topology.detect import physical_indices

    # What detect() meets on a node whose CUDA_VISIBLE_DEVICES names GPUs by UUID.
    monkeypatch.setattr(gate_plugin, "detect", lambda backend, gpus: physical_indices(1, "GPU-5f0c"))
    result = run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: topology detection: CUDA_VISIBLE_DEVICES='GPU-5f0c': topology detection needs plain GPU "
         "indices (e.g. 0,1), not UUIDs"]
    )  # fmt: skip
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stdout.no_fnmatch_line("*passed*")  # nothing ran


def test_baseline_key_dimensions_and_names_keep_configurations_apart(
    pytester, bench_dir, monkeypatch
) -> None:
    pytester.makeconftest(
        "import os\n"
        "def pytest_collectives_baseline_key(config):\n"
        "    return {'nccl_algo': os.environ['ALGO'], 'image': 'ngc-24.10'}\n"
    )
    monkeypatch.setenv("ALGO", "Ring")
    run(pytester, "--baseline-save").assert_outcomes(passed=1)
    monkeypatch.setenv("ALGO", "Tree")
    run(pytester, "--baseline-save", "--baseline-name", "nightly").assert_outcomes(passed=1)
    names = sorted(p.name for p in bench_dir.glob("*/*.json"))
    assert names == [
        "baseline+image=ngc-24.10+nccl_algo=Ring.json",
        "nightly+image=ngc-24.10+nccl_algo=Tree.json",
    ]
    # the other configuration has no baseline of its own yet: not judged against Ring's
    result = run(pytester, "--fail-on-regression")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*no baseline for this topology (cpu-*, baseline+image=ngc-24.10+nccl_algo=Tree.json)*"]
    )
    monkeypatch.setenv("ALGO", "a/b")
    bad = run(pytester, "--baseline-save")
    assert bad.ret == pytest.ExitCode.TESTS_FAILED
    bad.stdout.fnmatch_lines(
        ["baseline error: pytest_collectives_baseline_key: nccl_algo='a/b': use letters*"]
    )
