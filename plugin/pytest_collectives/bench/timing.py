"""Benchmarks timed inside the ranks, as the ``benchmark`` fixture of a distributed test.

The schedule is nccl-tests': a warm-up of back-to-back iterations (``-w``), then rounds that each time a
batch of back-to-back iterations (``-n``), so that the barrier opening a round and the launch of the timer
are spread over the batch instead of dominating a small message. The batch size is calibrated after the
warm-up, on warm rounds: doubled until a round lasts ``--benchmark-min-time`` (and at least ROUND_FLOOR_S),
then confirmed by a second round of the same size within STEADY_TOLERANCE, so the round size never comes
from a cold round. Rounds then run until the benchmark, warm-up, calibration, barriers and checks included,
has taken ``--benchmark-max-time`` (pytest-benchmark's "maximum run time per test"; counting the timed
rounds alone made a benchmark take twice that). Each round starts with a barrier so no rank starts early,
is timed with CUDA events on GPU and ``perf_counter_ns`` on CPU, and counts as long as its slowest rank
took (a collective is as slow as its slowest member). Every decision is taken on values all-reduced across
the ranks, so all ranks run the same schedule. The rounds go back to pytest-benchmark's own
statistics (per iteration), so its flags, table, JSON and comparisons keep working; ``latency_us`` (the
median time of one iteration) and the bandwidths below go to ``extra_info``.

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time, and busbw = algbw * factor,
where the factor makes the figure comparable with the hardware's link bandwidth whatever the world size n:

    all_reduce                          2 (n - 1) / n
    reduce_scatter, all_gather          (n - 1) / n
    broadcast, reduce, send/recv, copy  1

``bytes`` is the size of one rank's buffer (for reduce_scatter, the input; for all_gather, the output).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

from pytest_collectives import devices
from pytest_collectives.bench import shim as benchmark_shim
from pytest_collectives.bench.stamps import Stamps

Check = Callable[[], str | None] | None

BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "p2p": lambda n: 1.0,
    # nccl-tests' alltoall, gather, scatter and hypercube: (n - 1)/n of the bytes cross each rank's link;
    # sendrecv (each rank sends to the next and receives from the previous) moves them all: 1
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "hypercube": lambda n: (n - 1) / n,
    "sendrecv": lambda n: 1.0,
}
MAX_ROUNDS = 1000
MAX_ITERATIONS = 1 << 16
WARMUP_ITERATIONS = 5  # nccl-tests' -w default
ROUND_FLOOR_S = 1e-3  # a barrier's skew (tens of microseconds on CPU) stays a few percent of a round
STEADY_TOLERANCE = 0.25
MAX_CALIBRATION_ROUNDS = 8


def bandwidth(collective: str, nbytes: int, seconds: float, world_size: int) -> dict[str, float]:
    """algbw and busbw in GB/s (1e9 bytes/s, as nccl-tests prints them)."""
    if collective not in BUS_FACTORS:
        raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(BUS_FACTORS)}")
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return {"algbw_GBps": algbw, "busbw_GBps": algbw * BUS_FACTORS[collective](world_size)}


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'4K', '1M', '128' -> bytes, as nccl-tests' -b/-e take them (binary multiples)."""
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (cleaned[:-1], cleaned[-1]) if cleaned[-1:] in _UNITS else (cleaned, "")
    try:
        value = int(number) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"{text!r}: expected a size like 4K, 1M or 128") from None
    if value <= 0:
        raise ValueError(f"{text!r}: a size must be positive")
    return value


def sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min, min*f, min*f^2, ... up to max: nccl-tests' -b -e -f."""
    if factor < 2:
        raise ValueError(f"step factor {factor}: must be at least 2")
    if min_bytes > max_bytes:
        raise ValueError(f"min size {min_bytes} is above max size {max_bytes}")
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes:
        sizes.append(sizes[-1] * factor)
    return sizes


def format_size(nbytes: int) -> str:
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}iB"
    return f"{nbytes}B"


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """What the controller's pytest-benchmark settings say, shipped to the ranks."""

    enabled: bool
    min_rounds: int
    max_time_s: float
    min_time_s: float = 0.0
    warmup_iterations: int = WARMUP_ITERATIONS

    @classmethod
    def from_fixture(cls, fixture: Any) -> BenchSpec:
        given = benchmark_shim.settings(fixture)
        return cls(
            enabled=given["enabled"],
            min_rounds=given["min_rounds"],
            max_time_s=given["max_time_s"],
            min_time_s=given["min_time_s"],
            warmup_iterations=max(WARMUP_ITERATIONS, given["warmup"]),
        )

    @property
    def round_s(self) -> float:
        return max(self.min_time_s, ROUND_FLOOR_S)


def record(fixture: Any, data: dict[str, Any] | None, context: dict[str, Any]) -> None:
    """Feed the ranks' rounds (per-iteration maxima) into the controller's pytest-benchmark fixture."""
    if not data or not data["samples"]:
        return
    iterations = data["iterations"]
    stats = benchmark_shim.new_stats(fixture, iterations)
    for seconds in data["samples"]:
        stats.update(seconds * iterations)  # pytest-benchmark divides a round by its iterations
    median = sorted(data["samples"])[len(data["samples"]) // 2]
    extra = {**data["extra_info"], **context, "latency_us": median * 1e6, "iterations_per_round": iterations}
    if extra.get("nbytes"):
        extra.update(bandwidth(extra["collective"], extra["nbytes"], median, context["world_size"]))
    fixture.extra_info.update(extra)


class RankBenchmark:
    """``benchmark(fn, *args, nbytes=..., collective=...)`` on a rank: times ``fn``, returns its result.

    Every rank must make the same calls: the rounds are synchronised by barriers and the batch size and
    round count are agreed through all-reduces. ``samples`` are the per-iteration times of the rounds.
    """

    def __init__(self, spec: BenchSpec, device: Any) -> None:
        self.spec = spec
        self.device = device
        self.extra_info: dict[str, Any] = {}
        self.samples: list[float] | None = None
        self.iterations = 1

    def __call__(
        self,
        fn: Callable[..., Any],
        *args: Any,
        nbytes: int = 0,
        collective: str = "p2p",
        stamps: Stamps | None = None,
        **kwargs: Any,
    ) -> Any:
        """``stamps``: each call's own bytes, every one checked after its round (bench.stamps)."""
        if self.samples is not None:
            raise RuntimeError("benchmark can be used once per test")
        self.extra_info.update(nbytes=nbytes, collective=collective)
        call = functools.partial(fn, *args, **kwargs)
        checked = stamps.check if stamps is not None else None
        if stamps is not None:
            call = stamps.wrap(call)
        if not self.spec.enabled:  # --benchmark-disable: run once, as a smoke test
            self.samples = []
            return measure(call, self.device, 1, 1, checked)[1]
        start = time.perf_counter()
        warm_up(call, self.device, self.spec.warmup_iterations, self.spec.max_time_s, checked)
        self.iterations = calibrate(call, self.device, self.spec.round_s, checked)
        times, result = rounds_until(call, self.device, self.spec, self.iterations, start, checked)
        self.samples = [t / self.iterations for t in times]
        return result

    def result(self) -> dict[str, Any] | None:
        """What goes back to the controller: per-iteration maxima across ranks, the batch size, extra info."""
        if self.samples is None:
            return None
        return {"samples": self.samples, "iterations": self.iterations, "extra_info": self.extra_info}


def warm_up(
    call: Callable[[], Any], device: Any, iterations: int, max_time_s: float, checked: Check = None
) -> None:
    """``iterations`` back-to-back calls in growing batches, or as many as fit in ``max_time_s`` (as
    pytest-benchmark bounds its warm-up by the time of the rounds)."""
    done, spent, batch = 0, 0.0, WARMUP_ITERATIONS
    while done < iterations and spent < max_time_s:
        step = min(batch, iterations - done)
        (elapsed,), _ = measure(call, device, 1, step, checked)
        done, spent, batch = done + step, spent + elapsed, 2 * batch


def calibrate(call: Callable[[], Any], device: Any, round_s: float, checked: Check = None) -> int:
    """The iterations per round that make a warm round last ``round_s``.

    The count grows until a round is long enough; it is kept once a second round of that size agrees with
    the first within STEADY_TOLERANCE (a cold cache, a first connection or a frequency ramp make the first
    rounds slow, and a round count taken from them would be too small).
    """
    iterations, previous = 1, None
    for _ in range(MAX_CALIBRATION_ROUNDS):
        (elapsed,), _ = measure(call, device, 1, iterations, checked)
        if elapsed < round_s and iterations < MAX_ITERATIONS:
            wanted = math.ceil(iterations * round_s / elapsed) if elapsed > 0 else 2 * iterations
            iterations, previous = min(MAX_ITERATIONS, max(2 * iterations, wanted)), None
            continue
        if previous is not None and abs(elapsed - previous) <= STEADY_TOLERANCE * previous:
            break
        previous = elapsed
    return iterations


def rounds_until(
    call: Callable[[], Any],
    device: Any,
    spec: BenchSpec,
    iterations: int,
    start: float,
    checked: Check = None,
) -> tuple[list[float], Any]:
    """Rounds of ``iterations`` calls until ``spec.max_time_s`` has passed since ``start`` on the slowest
    rank, at least ``spec.min_rounds`` and at most MAX_ROUNDS.

    They run in parts: first ``spec.min_rounds`` (one at least), which set the pace, then each half of what
    the time left would hold at the pace so far. The ranks agree on the time after each part, so all of them
    stop after the same round, and the budget is overrun by a round at most, for about log2(rounds)
    all-reduces.
    """
    times: list[float] = []
    result = None
    began = spent = _slowest(time.perf_counter() - start, device)
    while len(times) < MAX_ROUNDS and (spent < spec.max_time_s or len(times) < spec.min_rounds):
        held = (spec.max_time_s - spent) / max((spent - began) / len(times), 1e-9) if times else 0
        part = max(spec.min_rounds - len(times), math.ceil(held / 2), 1)
        more, result = measure(call, device, min(part, MAX_ROUNDS - len(times)), iterations, checked)
        times += more
        spent = _slowest(time.perf_counter() - start, device)
    return times, result


def measure(
    fn: Callable[[], Any], device: Any, rounds: int, iterations: int = 1, checked: Check = None
) -> tuple[list[float], Any]:
    """Per-round times of ``iterations`` back-to-back calls of ``fn`` (maximum across ranks when a group is
    up) and its last result.

    A barrier opens each round so no rank starts early. ``checked`` runs after each round, outside its timer
    (Stamps.check); what it found on any rank ends the benchmark on every rank, agreed in the one all-reduce
    that takes the maxima at the end (a rank that raised alone would leave the others waiting in a barrier).
    """
    import torch
    import torch.distributed as dist

    grouped = dist.is_initialized()
    timer = _CpuTimer() if device.type == "cpu" else _DeviceTimer(device)
    times = []
    result = wrong = None
    for _ in range(rounds):
        if grouped:
            dist.barrier()
        timer.sync()
        timer.start()
        for _ in range(iterations):
            result = fn()
        times.append(timer.stop())
        found = checked() if checked is not None else None
        wrong = wrong or found
    me = dist.get_rank() if grouped else 0
    values = torch.tensor([*times, me + 1 if wrong is not None else 0], dtype=torch.float64, device=device)
    if grouped:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    *times, flag = values.cpu().tolist()
    if wrong is not None:
        raise AssertionError(wrong)
    if flag:
        raise AssertionError(f"rank {int(flag) - 1}'s timed receives did not land (its failure says which)")
    return times, result


def _slowest(seconds: float, device: Any) -> float:
    """The largest of the ranks' ``seconds``: one value every rank decides on."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return seconds
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


class _CpuTimer:
    def sync(self) -> None:
        pass

    def start(self) -> None:
        self._t0 = time.perf_counter_ns()

    def stop(self) -> float:
        return (time.perf_counter_ns() - self._t0) / 1e9


class _DeviceTimer:
    """Device events (CUDA's on a GPU) around the round on the current stream: the device's time, not the
    launch's."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.begin = devices.timing_event(device)
        self.end = devices.timing_event(device)

    def sync(self) -> None:
        devices.synchronize(self.device)

    def start(self) -> None:
        self.begin.record()

    def stop(self) -> float:
        self.end.record()
        self.end.synchronize()
        return self.begin.elapsed_time(self.end) / 1e3
