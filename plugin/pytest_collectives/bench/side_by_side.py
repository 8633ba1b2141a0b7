"""Benchmarks compared where the same one ran more than once: per configuration of --backend-env side by
side (which protocol is fastest at which size), and over the passes of a soak (bandwidth drifting down:
thermal or link trouble)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from pytest_collectives.bench import shim as benchmark_shim


def figure(extra: dict[str, Any]) -> tuple[float, str]:
    """What a benchmark's record is read by: its busbw (GB/s, higher is better) where it moved bytes, else
    its latency (us, lower is better)."""
    if extra.get("busbw_GBps"):
        return extra["busbw_GBps"], "busbw GB/s"
    return extra.get("latency_us", 0.0), "latency us"


def by_configuration(records: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """A table of each benchmark that ran in several configurations (``records``: (name as a plain run
    names it, extra_info), the configuration in ``backend_env``), each configuration's figure and the best;
    empty where none did."""
    table: dict[str, dict[str, float]] = {}
    units: dict[str, str] = {}
    configurations: list[str] = []
    for name, extra in records:
        configuration = extra.get("backend_env", "")
        if not configuration:
            continue
        value, units[name] = figure(extra)
        table.setdefault(name, {})[configuration] = value
        configurations += [configuration] * (configuration not in configurations)
    if len(configurations) < 2:
        return []
    width, column = max(len(name) for name in table) + 2, max(len(c) for c in configurations) + 2
    head = [f"{'benchmark':<{width}}{'':<12}", *(f"{c:>{column}}" for c in configurations), "  best"]
    lines = ["".join(head)]
    for name, values in table.items():
        unit = units[name]
        best = (max if unit.startswith("busbw") else min)(values, key=values.__getitem__)
        cells = [f"{values[c]:>{column}.3f}" if c in values else f"{'-':>{column}}" for c in configurations]
        lines.append("".join([f"{name:<{width}}{unit:<12}", *cells, f"  {best}"]))
    return lines


def figures(records: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, tuple[str, list[float]]]:
    """Each benchmark's unit and its figures in the order they ran (a soak's passes)."""
    series: dict[str, tuple[str, list[float]]] = {}
    for name, extra in records:
        value, unit = figure(extra)
        series.setdefault(name, (unit, []))[1].append(value)
    return series


class Drift(NamedTuple):
    """A benchmark that got worse over a soak: its median figure over the first and the last third of
    the passes."""

    name: str
    unit: str
    first: float
    last: float
    third: int  # samples a third
    worse: float  # a fraction

    def line(self, tolerance: float) -> str:
        return (
            f"WARN {self.name}: {self.unit} {self.first:.3f} in the first {self.third} passes, "
            f"{self.last:.3f} in the last {self.third}: {self.worse:.0%} worse, beyond the tolerance of "
            f"{tolerance:.0%} (thermal or link trouble?)"
        )


def drifted(series: Mapping[str, tuple[str, Sequence[float]]], tolerance: float) -> list[Drift]:
    """Each benchmark whose figure got worse by more than ``tolerance`` (a fraction) from the first third
    of its samples (``series`` as figures() gives them) to the last third, with at least 3 samples a
    third."""
    found = []
    for name, (unit, values) in series.items():
        third = len(values) // 3
        if third < 3:
            continue
        first, last = statistics.median(values[:third]), statistics.median(values[-third:])
        if first <= 0:
            continue
        worse = (first - last) / first if unit.startswith("busbw") else (last - first) / first
        if worse > tolerance:
            found.append(Drift(name, unit, first, last, third, worse))
    return found


def records(config: Any) -> list[tuple[str, dict[str, Any]]]:
    """The session's benchmarks as (full name, extra_info), in the order they ran."""
    return [(bench.fullname, dict(bench.extra_info)) for bench in benchmark_shim.session_results(config)]
