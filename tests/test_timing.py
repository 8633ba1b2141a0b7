"""The timing schedule of distributed benchmarks: warm-up, a batch size calibrated on warm rounds, rounds
that honour pytest-benchmark's options, and no CPU benchmark of more ranks than usable cores."""

from __future__ import annotations

import os
import textwrap
import time

import pytest
import torch

from pytest_collectives.bench import timing
from pytest_collectives.bench.stamps import Stamps, position, stamp
from pytest_collectives.bench.timing import (
    ROUND_FLOOR_S,
    WARMUP_ITERATIONS,
    BenchSpec,
    RankBenchmark,
    calibrate,
    warm_up,
)


def test_the_batch_is_sized_on_warm_rounds_not_on_a_cold_first_call():
    calls = []

    def op():  # the first calls are slow (a first connection, a cold cache), then 1 ms
        calls.append(None)
        time.sleep(0.05 if len(calls) <= WARMUP_ITERATIONS else 0.001)

    spec = BenchSpec(enabled=True, min_rounds=3, max_time_s=0.05, min_time_s=0.004)
    bench = RankBenchmark(spec, torch.device("cpu"))
    bench(op)
    # calls take at least 1 ms, so a round shorter than --benchmark-min-time (4 ms) held at most 3 and the
    # next size is at most double that: the batch never exceeds 6 calls
    assert bench.iterations <= 6
    assert len(bench.samples) >= 3
    assert all(0.001 <= s < 0.05 for s in bench.samples)  # per iteration, never a cold one
    assert bench.result()["iterations"] == bench.iterations


class _Clock:
    """A clock that moves only when a call says so: the schedule's decisions, free of this machine's noise."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def perf_counter_ns(self) -> int:
        return round(self.now * 1e9)


def test_the_budget_is_the_whole_benchmarks_warm_up_and_calibration_included(monkeypatch):
    """--benchmark-max-time bounds the benchmark, as pytest-benchmark's "maximum run time per test" says:
    a warm-up that took most of it leaves few rounds. Counting the timed rounds alone made a benchmark take
    about twice its budget."""
    clock = _Clock()
    monkeypatch.setattr(timing, "time", clock)
    calls = []

    def op():  # a slow warm-up (15 ms a call), then 1 ms a call
        calls.append(None)
        clock.now += 0.015 if len(calls) <= WARMUP_ITERATIONS else 0.001

    spec = BenchSpec(enabled=True, min_rounds=3, max_time_s=0.1, min_time_s=0.004)
    bench = RankBenchmark(spec, torch.device("cpu"))
    bench(op)
    assert len(bench.samples) >= spec.min_rounds
    assert clock.now <= spec.max_time_s + bench.iterations * 0.001  # overrun by a round at most


def test_ranks_whose_clocks_disagree_stop_after_the_same_round(pytester):
    """Each rank stops when the slowest rank's clock says the budget is spent: a rank deciding alone would
    leave the others waiting in the next round's barrier."""
    pytester.makepyfile(
        test_it=textwrap.dedent(
            """
            import time

            import pytest
            from pytest_collectives.bench import timing

            @pytest.mark.world_size(2)
            def test_bench(pg, benchmark):
                class Skewed:  # rank 1's clock runs ten times as fast
                    perf_counter_ns = staticmethod(time.perf_counter_ns)

                    @staticmethod
                    def perf_counter():
                        return time.perf_counter() * (10 if pg.rank == 1 else 1)

                timing.time = Skewed
                try:
                    benchmark(lambda: time.sleep(0.0005))
                finally:
                    timing.time = time
            """
        )
    )
    result = pytester.runpytest("--benchmark-max-time", "0.3", "--dist-timeout", "30")
    result.assert_outcomes(passed=1)


def test_calibration_grows_the_batch_until_a_round_is_long_enough(monkeypatch):
    assert calibrate(lambda: time.sleep(0.0002), torch.device("cpu"), 0.01) >= 10
    clock = _Clock()
    monkeypatch.setattr(timing, "time", clock)

    def op():  # 0.2 ms a call, on a clock of its own
        clock.now += 0.0002

    assert calibrate(op, torch.device("cpu"), 0.01) * 0.0002 >= 0.01  # a round of the batch lasts 10 ms


def test_warm_up_runs_the_iterations_asked_unless_time_runs_out():
    calls = []
    warm_up(lambda: calls.append(None), torch.device("cpu"), 1000, max_time_s=10.0)
    assert len(calls) == 1000
    calls.clear()
    warm_up(lambda: (calls.append(None), time.sleep(0.01)), torch.device("cpu"), 100_000, max_time_s=0.05)
    assert WARMUP_ITERATIONS <= len(calls) < 100_000


def test_the_spec_follows_pytest_benchmarks_options():
    class Fixture:  # the attributes pytest-benchmark's BenchmarkFixture sets from its options
        disabled, _min_rounds, _max_time, _min_time, _warmup = False, 7, 0.5, 0.02, 1000

    spec = BenchSpec.from_fixture(Fixture())
    assert (spec.min_rounds, spec.max_time_s, spec.round_s, spec.warmup_iterations) == (7, 0.5, 0.02, 1000)
    Fixture._warmup, Fixture._min_time = False, 5e-6
    spec = BenchSpec.from_fixture(Fixture())
    assert spec.warmup_iterations == WARMUP_ITERATIONS and spec.round_s == ROUND_FLOOR_S


def test_cpu_benchmarks_never_run_more_ranks_than_usable_cores(pytester, monkeypatch):
    pytester.makepyfile(
        test_it=textwrap.dedent(
            """
            import pytest

            @pytest.mark.world_size(2, 3)
            def test_bench(pg, benchmark):
                benchmark(lambda: None)

            @pytest.mark.world_size(2, 3)
            def test_plain(pg):
                pass
            """
        )
    )
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    result = pytester.runpytest("-rs", "--benchmark-disable")
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED * benchmark of 3 CPU ranks on 2 usable core(s) would time the scheduler, not the comm*"]
    )


def test_the_shim_reaches_what_it_needs_in_the_installed_pytest_benchmark(pytester):
    # benchmark_shim.py is the one place that uses pytest-benchmark's private attributes: check each against
    # the real fixture, so an upgrade that moves one fails here, not in a user's session.
    pytester.makepyfile(
        """
        from pytest_collectives.bench import shim as benchmark_shim

        def test_shim(benchmark, request):
            assert benchmark_shim.is_fixture(benchmark) and not benchmark_shim.is_fixture(object())
            given = benchmark_shim.settings(benchmark)
            assert given["enabled"] and given["min_rounds"] == 3 and given["max_time_s"] == 0.25
            assert given["min_time_s"] == 0.002 and given["warmup"] == 0
            assert benchmark_shim.session_results(request.config) == []
            benchmark_shim.new_stats(benchmark, 4).update(0.4)  # a round of 4 calls
            benchmark_shim.mark_used(benchmark)
            [result] = benchmark_shim.session_results(request.config)
            assert result.fullname.endswith("test_shim") and result.stats.data == [0.1]
        """
    )
    result = pytester.runpytest(
        "-p", "no:randomly", "--benchmark-min-rounds", "3", "--benchmark-max-time", "0.25",
        "--benchmark-min-time", "0.002",
    )  # fmt: skip
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("dropped", ["after-first", "one-in-a-hundred"])
def test_every_timed_call_is_checked_by_its_stamp(dropped):
    """A copy that lands only on its first call, or drops one in a hundred: each fails the benchmark, named
    by its call. One check at the end proved only that one transfer landed (the bytes never changed
    between calls)."""
    calls = 0
    source, inbox = torch.zeros(64), torch.full((64,), float("nan"))

    def copy():
        nonlocal calls
        calls += 1
        if not (calls > 1 if dropped == "after-first" else calls % 100 == 0):
            inbox.copy_(source)

    spec = BenchSpec(enabled=True, min_rounds=200, max_time_s=0.0, min_time_s=0.0)
    with pytest.raises(AssertionError, match=r"did not land as sent: the first, of call \d+ \(buffer 0\)"):
        RankBenchmark(spec, torch.device("cpu"))(copy, stamps=Stamps(sends=[source], receives=[inbox]))
    source = torch.zeros(64)  # without the failed run's last stamp, which it never put back
    clean = Stamps(sends=[source], receives=[inbox])
    RankBenchmark(spec, torch.device("cpu"))(lambda: inbox.copy_(source), stamps=clean)
    assert torch.equal(inbox, clean.as_landed(torch.zeros(64)))


@pytest.mark.parametrize(
    "part", [slice(None, 16), slice(-16, None), slice(None, 480), slice(544, None)],
    ids=["first 16", "last 16", "all but a middle chunk", "all but the first part"],
)  # fmt: skip
def test_a_receive_that_lands_part_of_its_buffer_fails_its_benchmark(part: slice) -> None:
    """A copy whose repeat calls land only part of the buffer (its first 16 of 1024 elements, its last
    16, all but a middle chunk of 64, or all but its first 544): the walking stamp finds a call's stamp
    missing, where one in the first element of every call passed the first of them, and the whole
    payload never changed between calls."""
    calls = 0
    source, inbox = torch.arange(1024.0), torch.full((1024,), float("nan"))

    def copy() -> None:
        nonlocal calls
        calls += 1
        inbox[part if calls > 1 else slice(None)] = source[part if calls > 1 else slice(None)]

    spec = BenchSpec(enabled=True, min_rounds=200, max_time_s=0.0, min_time_s=0.0)
    with pytest.raises(AssertionError, match=r"did not land as sent: the first, of call \d+ \(buffer 0\)"):
        RankBenchmark(spec, torch.device("cpu"))(copy, stamps=Stamps(sends=[source], receives=[inbox]))


def test_the_walking_stamp_covers_the_whole_buffer() -> None:
    """Within n calls the stamps of a buffer of n elements fall in every part of it a sixteenth long, and
    the sender's buffer holds its own values again but where the last call's stamp sits."""
    n = 1024
    hit = {position(call, n) * 16 // n for call in range(1, 64)}
    assert hit == set(range(16))
    source, inbox = torch.arange(float(n)), torch.zeros(n)
    stamps = Stamps(sends=[source], receives=[inbox])
    for _ in range(50):
        stamps.wrap(lambda: inbox.copy_(source))()
    assert stamps.check() is None
    assert torch.equal(inbox, stamps.as_landed(torch.arange(float(n))))
    assert torch.equal(source, inbox)


def test_the_last_timed_call_is_checked_too():
    """Only the last call dropped: its receive still holds the call before's stamp, which a check of the
    final bytes alone took for a landed transfer."""
    source, inbox = torch.zeros(8), torch.zeros(8)
    stamps = Stamps(sends=[source], receives=[inbox])
    copy = stamps.wrap(lambda: inbox.copy_(source))
    for _ in range(9):
        copy()
    assert stamps.check() is None
    stamps.wrap(lambda: None)()  # the tenth, dropped
    assert stamps.check().startswith(
        "1 of 1 timed receives of a round did not land as sent: the first, of call 10"
    )


def test_parts_received_are_told_apart_and_empty_ones_carry_no_stamp():
    """A flat buffer received in parts (all_to_all's, a gather's): each part's stamp is its sender's, a
    part of no elements (the smallest sizes) is left out, and a part that did not land is named by its
    index among all the parts."""
    parts = [torch.zeros(4), torch.zeros(0), torch.zeros(4)]
    spacing = Stamps.SPACING
    stamps = Stamps(receives=parts, landed=lambda s, j: s + j * spacing)

    def exchange(dropped: int | None = None) -> None:
        for j in (0, 2):
            if j != dropped:
                parts[j][position(stamps.calls, 4)] = stamp(stamps.calls) + j * spacing

    stamps.wrap(exchange)()
    assert stamps.check() is None
    assert torch.equal(stamps.all_landed([torch.zeros(4), torch.zeros(0), torch.zeros(4)]), torch.cat(parts))
    stamps.wrap(lambda: exchange(dropped=2))()
    assert "of call 2 (buffer 2)" in stamps.check()
