"""The gate's rule on synthetic sessions: the model's own rates (the real-session figures come from
docs/measurements/scripts/bench_gate_sessions.py), the machine factor, family-wise control, detectability,
confirmation."""

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from pytest_collectives.gate.report import format_table, markdown, to_json
from pytest_collectives.gate.statistics import (
    DEFAULT_TOLERANCE,
    IMPROVEMENT,
    INSUFFICIENT_DATA,
    MACHINE_SLOWDOWN,
    MIN_FOR_PRIOR,
    MIN_TOLERANCE,
    PRIOR_DF,
    REGRESSION,
    UNCHANGED,
    BenchVerdict,
    FamilyVerdict,
    GateResult,
    MachineVerdict,
    confirm,
    family,
    judge,
    reconfirmed,
    resting_on,
    t_quantile,
)

N = 200


class Sessions:
    """Benchmarks with their own between-run spread (1-5%), and runs with a machine factor of their own."""

    def __init__(self, seed: int, n: int = N) -> None:
        self.rng = np.random.default_rng(seed)
        self.names = [f"bench[{i}]" for i in range(n)]
        self.true = np.exp(self.rng.uniform(-12, -2, n))
        self.sigma = self.rng.uniform(0.01, 0.05, n)

    def run(self, machine: float = 1.0, slower: dict[int, float] | None = None) -> dict[str, float]:
        times = self.true * machine * np.exp(self.rng.normal(0.0, self.sigma))
        for i, factor in (slower or {}).items():
            times[i] *= factor
        return dict(zip(self.names, times.tolist(), strict=True))

    def baseline(self, runs: int = 3) -> list[dict[str, float]]:
        return [self.run(machine=self.rng.uniform(0.95, 1.05)) for _ in range(runs)]


@pytest.mark.parametrize("p, df", [(0.95, 2), (1 - 0.05 / 30, 6), (1 - 0.05 / 1000, 6), (0.975, 100)])
def test_t_quantile_matches_scipy(p, df):
    assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-6)


def test_unchanged_sessions_are_flagged_in_at_most_5_percent_whatever_n():
    for n in (30, 1000):
        sessions = Sessions(seed=n, n=n)
        base = sessions.baseline()
        flagged = sum(bool(judge(base, sessions.run(machine=1.02)).flagged) for _ in range(200))
        print(f"\n{n} benchmarks: {flagged} of 200 unchanged sessions flagged")
        assert flagged <= 10


def test_a_faster_or_slower_machine_alone_is_not_a_regression():
    sessions = Sessions(seed=1)
    base = sessions.baseline()
    for machine in (0.7, 1.2):
        result = judge(base, sessions.run(machine=machine), tolerance=0.25)
        assert result.machine is not None and result.machine.factor == pytest.approx(machine, rel=0.06)
        assert result.machine.verdict == UNCHANGED
        assert not result.flagged


def test_a_planted_slowdown_is_caught_relative_to_the_machine_factor():
    sessions = Sessions(seed=2)
    base = sessions.baseline(runs=5)
    quiet = int(np.argmin(sessions.sigma))
    caught = 0
    for _ in range(50):
        result = judge(base, sessions.run(machine=1.2, slower={quiet: 1.25}))
        caught += [r.verdict for r in result.flagged] == [REGRESSION] and result.flagged[0].name.endswith(
            f"[{quiet}]"
        )
    assert caught >= 47
    row = next(r for r in result.rows if r.name == f"bench[{quiet}]")
    assert row.relative == pytest.approx(1.25, rel=0.05) and row.ratio == pytest.approx(1.5, rel=0.05)
    assert row.detectable < 0.25


def test_a_uniform_slowdown_is_a_machine_wide_verdict():
    sessions = Sessions(seed=3)
    result = judge(sessions.baseline(), sessions.run(machine=1.4))
    assert result.machine is not None and result.machine.verdict == MACHINE_SLOWDOWN
    assert not result.flagged  # each benchmark is relative to the factor: the verdict is the machine's


def test_the_machine_tolerance_is_learned_from_the_baselines_sittings():
    sessions = Sessions(seed=12)
    quiet = [sessions.run(machine=m) for m in (1.0, 1.01, 0.995)]  # a GPU node: sittings agree within 1%
    result = judge(quiet, sessions.run(machine=1.10))
    assert result.machine is not None and result.machine.learned and result.machine.sittings == 3
    assert MIN_TOLERANCE <= result.machine.tolerance < 0.10
    assert result.machine.verdict == MACHINE_SLOWDOWN and not result.flagged

    drifting = [sessions.run(machine=m) for m in (1.0, 1.3, 0.8)]  # this VM: sittings tens of percent apart
    assert judge(drifting, sessions.run(machine=1.3)).machine.verdict == UNCHANGED
    assert judge(drifting, sessions.run(machine=4.0)).machine.verdict == MACHINE_SLOWDOWN

    one_sitting = judge(quiet, sessions.run(machine=1.10), sittings=[7, 7, 7]).machine
    assert (one_sitting.sittings, one_sitting.learned) == (1, False)
    assert one_sitting.tolerance == DEFAULT_TOLERANCE and one_sitting.verdict == UNCHANGED
    chosen = judge(quiet, sessions.run(machine=1.10), tolerance=0.5).machine
    assert (chosen.tolerance, chosen.learned, chosen.verdict) == (0.5, False, UNCHANGED)
    with pytest.raises(ValueError, match="2 sitting labels for 3 runs"):
        judge(quiet, sessions.run(), sittings=[0, 1])


def test_a_big_speedup_is_an_improvement_not_a_failure():
    sessions = Sessions(seed=4)
    result = judge(sessions.baseline(), sessions.run(slower={0: 0.5}))
    assert {r.name: r.verdict for r in result.rows}["bench[0]"] == IMPROVEMENT
    assert not result.flagged


def test_a_significant_but_small_change_is_not_flagged():
    sessions = Sessions(seed=5)
    sessions.sigma[:] = 0.001  # so quiet that a 3% change is far beyond the spread
    result = judge(sessions.baseline(), sessions.run(slower={0: 1.03}))
    assert not result.flagged  # below threshold / 2


def test_detectable_slowdown_grows_with_the_spread():
    sessions = Sessions(seed=6)
    rows = judge(sessions.baseline(), sessions.run()).rows
    by_sigma = sorted(rows, key=lambda r: r.spread)
    assert by_sigma[0].detectable < by_sigma[-1].detectable


def test_the_prior_is_worth_more_runs_where_true_spreads_agree():
    """d0 is learned: benchmarks that all repeat within 2% lend each other many runs' worth, a family
    whose spreads range 1-5% lends little, and too few benchmarks to tell get PRIOR_DF."""
    alike, unlike = Sessions(seed=6), Sessions(seed=6)
    alike.sigma[:] = 0.02

    def prior_runs(sessions: Sessions, n: int = N) -> float:
        base = [{k: run[k] for k in sessions.names[:n]} for run in sessions.baseline()]
        return float(np.median([r.df - (r.runs - 1) for r in judge(base, sessions.run()).rows]))

    assert prior_runs(alike) > 2 * prior_runs(unlike)
    assert prior_runs(unlike, n=MIN_FOR_PRIOR - 1) == PRIOR_DF


def test_benchmarks_without_enough_runs_missing_and_new_are_listed():
    sessions = Sessions(seed=7, n=10)
    base = sessions.baseline(runs=3)
    del base[0]["bench[1]"]  # recorded in 2 runs only
    current = sessions.run()
    del current["bench[2]"]
    current["bench[new]"] = 1.0
    result = judge(base, current)
    verdicts = {r.name: r.verdict for r in result.rows}
    assert verdicts["bench[1]"] == INSUFFICIENT_DATA
    assert result.missing == ["bench[2]"] and result.new == ["bench[new]"]
    assert "bench[2]" not in verdicts and "bench[new]" not in verdicts


def test_too_few_benchmarks_for_a_machine_factor_are_judged_directly():
    sessions = Sessions(seed=8, n=2)
    result = judge(sessions.baseline(), sessions.run(slower={0: 2.0}))
    assert result.machine is None
    assert [r.name for r in result.flagged] == ["bench[0]"]


def test_a_regression_stands_only_when_measured_again():
    sessions = Sessions(seed=9)
    base = sessions.baseline(runs=5)
    quiet = int(np.argmin(sessions.sigma))
    result = judge(base, sessions.run(slower={quiet: 1.5}))
    (row,) = result.flagged
    factor = result.machine.factor
    again = confirm(row, row.current_median, factor, 1, result.threshold)
    assert again.verdict == REGRESSION and again.remeasured == pytest.approx(row.relative)
    passing = confirm(row, row.baseline_median * factor, factor, 1, result.threshold)
    assert passing.verdict == UNCHANGED and passing.remeasured == pytest.approx(1.0)


def test_a_family_is_one_op_at_every_message_size():
    assert family("t.py::test_all_reduce[ws2-1MiB-ring]") == family("t.py::test_all_reduce[ws2-8B-ring]")
    assert family("t.py::test_c[ws2-16384-all_gather]") == "t.py::test_c[ws2-*-all_gather]"
    assert family("t.py::test_all_reduce[ws2-1MiB-ring]") != family("t.py::test_all_reduce[ws4-1MiB-ring]")
    assert family("t.py::test_send_latency[ws2-send_recv]") == "t.py::test_send_latency[ws2-send_recv]"


def test_a_noisy_family_is_not_called_quiet_by_a_quiet_one():
    """gloo on 2 cores: all_gather moves 30-80% between sessions, broadcast 5-15%; a noisy benchmark whose
    three runs happened to agree must not borrow the quiet family's spread."""
    sessions = Sessions(seed=11, n=40)
    sessions.names = [
        f"t.py::test_c[ws2-{256 << (i % 20)}-{'noisy' if i < 20 else 'quiet'}]" for i in range(40)
    ]
    sessions.sigma = np.where(np.arange(40) < 20, 0.4, 0.02)
    noisy = quiet = 0
    for _ in range(100):
        base = sessions.baseline()
        flagged = judge(base, sessions.run()).flagged
        noisy += any("noisy" in r.name for r in flagged)
        planted = judge(base, sessions.run(slower={30: 1.4})).flagged
        quiet += [r.name for r in planted] == [sessions.names[30]]
    assert noisy <= 5
    assert quiet >= 80


def test_bad_arguments():
    with pytest.raises(ValueError, match="threshold"):
        judge([], {}, threshold=0)
    with pytest.raises(ValueError, match="t_quantile"):
        t_quantile(1.0, 3)


def test_the_reports_show_every_figure():
    sessions = Sessions(seed=10, n=6)
    result = judge(sessions.baseline(), sessions.run(slower={0: 3.0}))
    table = format_table(result.rows).splitlines()
    assert table[0].split() == ["benchmark", "baseline", "now", "ratio", "vs", "machine", "spread", "detects",
                                "verdict", "again"]  # fmt: skip
    assert table[1].startswith("bench[0]") and "regression" in table[1]  # regressions first
    text = markdown(result, ["a line"], "FAIL")
    assert text.startswith("## collectives gate: FAIL\n") and "- a line" in text and "**regression**" in text
    data = to_json(result, ["a line"], "FAIL", topology_id="cpu-x")
    assert (data["status"], data["verdict"], data["topology_id"]) == ("FAIL", "fail", "cpu-x")
    assert to_json(result, [], "WARN")["verdict"] == "pass"  # report mode: only a FAIL fails
    assert {b["name"] for b in data["benchmarks"]} == set(sessions.names)
    assert all(math.isfinite(b["ratio"]) for b in data["benchmarks"])
    assert data["machine"]["compared"] == 6


class Node:
    """A GPU node's benchmark set in miniature: an all-pairs matrix (12 pairs over 10 sizes, 60% of the
    benchmarks) and 8 collectives over the same sizes, each repeating within 1-3% between sessions."""

    SIZES = [f"{4**k}KiB" for k in range(10)]

    def __init__(self, seed: int) -> None:
        pairs = [
            f"test_pair[{s}to{d}-{size}]" for s in range(4) for d in range(4) if s != d for size in self.SIZES
        ]
        ops = [f"test_op{j}[ws8-{size}]" for j in range(8) for size in self.SIZES]
        self.sessions = Sessions(seed, n=len(pairs) + len(ops))
        self.sessions.names = pairs + ops
        self.sessions.sigma = self.sessions.rng.uniform(0.01, 0.03, len(self.sessions.names))
        self.pairs = np.arange(len(pairs))


def test_a_family_that_moved_together_is_its_own_verdict_even_when_it_is_most_of_the_machine():
    node = Node(seed=13)
    base = node.sessions.baseline(runs=5)
    slower = {int(i): 1.15 for i in node.pairs}
    result = judge(base, node.sessions.run(slower=slower))
    assert result.machine.factor > 1.07  # the pairs are most of the benchmarks: they pull "the machine"
    assert [f.name for f in result.slow_families] == ["test_pair[*]"]
    (pairs,) = result.slow_families
    assert pairs.members == 120 and pairs.relative == pytest.approx(1.15, rel=0.03)
    assert not result.flagged  # the collectives read as faster than the machine, which is no failure

    one_op = {i: 1.15 for i, name in enumerate(node.sessions.names) if name.startswith("test_op3[")}
    assert [f.name for f in judge(base, node.sessions.run(slower=one_op)).slow_families] == ["test_op3[*]"]


def test_families_are_judged_between_sittings_and_not_at_all_from_one():
    """Runs of one sitting agree on how an op stands against the rest more closely than sessions do, so
    the family verdict learns its spread from the sittings; one sitting cannot show it."""
    node = Node(seed=15)
    base = node.sessions.baseline(runs=6)
    slower = node.sessions.run(slower={int(i): 1.25 for i in node.pairs})
    assert judge(base, slower, sittings=[0] * 6).families == []
    two_sittings = judge(base, slower, sittings=[0, 0, 0, 1, 1, 1])
    assert [f.name for f in two_sittings.slow_families] == ["test_pair[*]"]
    assert len(two_sittings.families) == len(judge(base, slower).families) > 1


def test_unchanged_sessions_have_no_family_verdict():
    node = Node(seed=14)
    base = node.sessions.baseline(runs=3)
    flagged = sum(bool(judge(base, node.sessions.run()).slow_families) for _ in range(100))
    assert flagged <= 5


def test_a_family_the_oldest_run_lacks_leaves_the_others_judged(recwarn):
    """A family added after the oldest baseline run is judged on the sittings that measured it, and must
    not blind the rest: its NaN figure in the oldest made every family's prior NaN, so none could fail."""
    node = Node(seed=15)
    base = node.sessions.baseline(runs=5)
    new = {f"test_new[ws8-{size}]": 1e-3 * (i + 1) for i, size in enumerate(Node.SIZES)}
    for run in base[1:]:
        run.update({name: t * node.sessions.rng.uniform(0.98, 1.02) for name, t in new.items()})
    slower = {**node.sessions.run(slower={int(i): 1.25 for i in node.pairs}), **new}
    result = judge(base, slower)
    assert "test_pair[*]" in [f.name for f in result.slow_families]
    assert "test_new[*]" in [f.name for f in result.families]  # from the 4 runs that have it
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def _verdict(name: str, verdict: str = UNCHANGED) -> BenchVerdict:
    return BenchVerdict(name, 1.0, 1.0, 1.0, 1.0, 0.01, 0.05, 3, verdict)


def test_family_and_machine_verdicts_stand_only_when_measured_again() -> None:
    names = [f"test_p2p.py::test_copy[{size}]" for size in ("4KiB", "1MiB", "64MiB")]
    names += [f"test_c.py::test_all_reduce[{size}]" for size in ("4KiB", "1MiB", "64MiB")]
    rows = [_verdict(n) for n in names] + [_verdict("test_c.py::test_barrier", REGRESSION)]
    slow = FamilyVerdict("test_p2p.py::test_copy[*]", 3, 1.4, 0.02, REGRESSION)
    machine = MachineVerdict(1.5, 0.02, 7, 0.1, 2, True, MACHINE_SLOWDOWN)
    first = GateResult(rows, None, [], [], 0.1, families=[slow])
    # the flagged benchmark and the slow family's members, not the rest
    assert resting_on(first) == [*names[:3], "test_c.py::test_barrier"]
    assert len(resting_on(GateResult(rows, machine, [], [], 0.1))) == len(rows)  # machine-wide: all

    both = GateResult(rows, machine, [], [], 0.1, families=[slow])
    calm = GateResult(rows, dataclasses.replace(machine, factor=1.01, verdict=UNCHANGED), [], [], 0.1,
                      families=[dataclasses.replace(slow, verdict=UNCHANGED)])  # fmt: skip
    kept = reconfirmed(both, calm)
    assert not kept.slow_families and kept.machine.verdict == UNCHANGED
    assert kept.machine.factor == 1.5  # the first measurement is what the report shows
    assert reconfirmed(both, both) == both
