"""Benchmarks compared where the same one ran more than once: per configuration of --backend-env side by
side (which protocol is fastest at which size), and over the passes of a soak (bandwidth drifting down:
thermal or link trouble)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

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


def drifted(records: Iterable[tuple[str, dict[str, Any]]], tolerance: float) -> list[str]:
    """Each benchmark whose figure got worse by more than ``tolerance`` (a fraction) from the first third
    of its samples (a soak's passes) to the last third, with at least 3 samples a third."""
    series: dict[str, list[float]] = {}
    units: dict[str, str] = {}
    for name, extra in records:
        value, units[name] = figure(extra)
        series.setdefault(name, []).append(value)
    lines = []
    for name, values in series.items():
        third = len(values) // 3
        if third < 3:
            continue
        first, last = statistics.median(values[:third]), statistics.median(values[-third:])
        higher_is_better = units[name].startswith("busbw")
        worse = (first - last) / first if higher_is_better else (last - first) / first
        if first > 0 and worse > tolerance:
            lines.append(
                f"WARN {name}: {units[name]} {first:.3f} in the first {third} passes, {last:.3f} in the last "
                f"{third}: {worse:.0%} worse, beyond the tolerance of {tolerance:.0%} (thermal or link "
                "trouble?)"
            )
    return lines


def records(config: Any) -> list[tuple[str, dict[str, Any]]]:
    """The session's benchmarks as (full name, extra_info), in the order they ran."""
    return [(bench.fullname, dict(bench.extra_info)) for bench in benchmark_shim.session_results(config)]
