"""Benchmarks timed inside the ranks, as the ``benchmark`` fixture of a distributed test.

Each round starts with a barrier so no rank starts early, is timed with CUDA events on GPU and
``perf_counter_ns`` on CPU, and counts as long as its slowest rank took (a collective is as slow as its
slowest member). The per-round maxima go back to pytest-benchmark's own statistics, so its flags, table,
JSON and comparisons keep working.

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time, and busbw = algbw * factor,
where the factor makes the figure comparable with the hardware's link bandwidth whatever the world size n:

    all_reduce                          2 (n - 1) / n
    reduce_scatter, all_gather          (n - 1) / n
    broadcast, reduce, send/recv, copy  1

``bytes`` is the size of one rank's buffer (for reduce_scatter, the input; for all_gather, the output).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "p2p": lambda n: 1.0,
}
MAX_ROUNDS = 1000


def bandwidth(collective: str, nbytes: int, seconds: float, world_size: int) -> dict[str, float]:
    """algbw and busbw in GB/s (1e9 bytes/s, as nccl-tests prints them)."""
    if collective not in BUS_FACTORS:
        raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(BUS_FACTORS)}")
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return {"algbw_GBps": algbw, "busbw_GBps": algbw * BUS_FACTORS[collective](world_size)}


def rounds_for(round_s: float, min_rounds: int, max_time_s: float) -> int:
    """As many rounds as fit in max_time_s, at least min_rounds (pytest-benchmark's rule)."""
    if round_s <= 0:
        return MAX_ROUNDS
    return max(min_rounds, min(MAX_ROUNDS, math.ceil(max_time_s / round_s)))


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """What the controller's pytest-benchmark settings say, shipped to the ranks."""

    enabled: bool
    min_rounds: int
    max_time_s: float
    warmup_rounds: int = 2

    @classmethod
    def from_fixture(cls, fixture: Any) -> BenchSpec:
        return cls(enabled=not fixture.disabled, min_rounds=fixture._min_rounds, max_time_s=fixture._max_time)


def record(fixture: Any, data: dict[str, Any] | None, context: dict[str, Any]) -> None:
    """Feed the ranks' per-round maxima into the controller's pytest-benchmark fixture."""
    fixture._mode = "benchmark(...) on the ranks"  # the fixture was used, though not by its own timer
    if not data or not data["samples"]:
        return
    stats = fixture._make_stats(1)
    for seconds in data["samples"]:
        stats.update(seconds)
    extra = {**data["extra_info"], **context}
    if extra.get("nbytes"):
        median = sorted(data["samples"])[len(data["samples"]) // 2]
        extra.update(bandwidth(extra["collective"], extra["nbytes"], median, context["world_size"]))
    fixture.extra_info.update(extra)


class RankBenchmark:
    """``benchmark(fn, *args, nbytes=..., collective=...)`` on a rank: times ``fn``, returns its result.

    Every rank must make the same calls: the rounds are synchronised by barriers and the round count is
    agreed through an all-reduce.
    """

    def __init__(self, spec: BenchSpec, device: Any) -> None:
        self.spec = spec
        self.device = device
        self.extra_info: dict[str, Any] = {}
        self.samples: list[float] | None = None

    def __call__(
        self, fn: Callable[..., Any], *args: Any, nbytes: int = 0, collective: str = "p2p", **kwargs: Any
    ) -> Any:
        import torch
        import torch.distributed as dist

        if self.samples is not None:
            raise RuntimeError("benchmark can be used once per test")
        self.extra_info.update(nbytes=nbytes, collective=collective)
        if not self.spec.enabled:  # --benchmark-disable: run once, as a smoke test
            self.samples = []
            return fn(*args, **kwargs)
        timer = _CudaTimer(self.device) if self.device.type == "cuda" else _CpuTimer()

        def one_round() -> tuple[float, Any]:
            dist.barrier()
            timer.sync()
            timer.start()
            result = fn(*args, **kwargs)
            return timer.stop(), result

        warmup = [one_round()[0] for _ in range(max(1, self.spec.warmup_rounds))]
        slowest = self._max_across_ranks(torch.tensor([max(warmup)], dtype=torch.float64))
        rounds = rounds_for(slowest[0], self.spec.min_rounds, self.spec.max_time_s)
        times = []
        for _ in range(rounds):
            elapsed, result = one_round()
            times.append(elapsed)
        self.samples = self._max_across_ranks(torch.tensor(times, dtype=torch.float64))
        return result

    def _max_across_ranks(self, values: Any) -> list[float]:
        import torch.distributed as dist

        values = values.to(self.device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return values.cpu().tolist()

    def result(self) -> dict[str, Any] | None:
        """What goes back to the controller: per-round maxima across ranks and the extra info."""
        if self.samples is None:
            return None
        return {"samples": self.samples, "extra_info": self.extra_info}


class _CpuTimer:
    def sync(self) -> None:
        pass

    def start(self) -> None:
        self._t0 = time.perf_counter_ns()

    def stop(self) -> float:
        return (time.perf_counter_ns() - self._t0) / 1e9


class _CudaTimer:
    """CUDA events around the round on the current stream: the GPU's time, not the launch's."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def start(self) -> None:
        self.begin.record()

    def stop(self) -> float:
        self.end.record()
        self.end.synchronize()
        return self.begin.elapsed_time(self.end) / 1e3
