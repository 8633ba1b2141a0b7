"""What a perf run's rounds cost against what the gate can detect with them.

    python docs/measurements/scripts/perf_run_cost.py old=a.json,b.json,c.json new=d.json,e.json,f.json \
        [--statistic p05] [--first 0.5]

Each argument names a setting and three or more runs of it, each the ``--benchmark-json`` of a ``pytest
suites/perf`` run (which holds every round). For each setting it prints the rounds of each run, then the
gate's "detects" column (``gate.statistics.judge``) with those runs as the baseline, judged on
``--statistic`` of each benchmark's rounds: the slowdown the gate promises to catch, which depends on the
runs' spread alone (printed too); in all, by file and by size. ``--first F``
also judges the runs cut to the first fraction F of their rounds: a shorter run of the same schedule.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections.abc import Callable

from pytest_collectives.gate.baseline_format import BenchmarkEntry
from pytest_collectives.gate.statistics import judge

SIZE = re.compile(r"\d+[KM]iB")


def rounds_of(path: str) -> dict[str, list[float]]:
    """Each benchmark's rounds (seconds per iteration), in the order they ran."""
    with open(path, encoding="utf-8") as handle:
        return {bench["fullname"]: bench["stats"]["data"] for bench in json.load(handle)["benchmarks"]}


def detects(
    runs: list[dict[str, list[float]]], statistic: str, fraction: float = 1.0
) -> tuple[dict[str, float], float]:
    """The gate's detectable slowdown of each benchmark judged, the runs as its baseline, and the median of
    the benchmarks' between-run spreads."""

    def figure(data: list[float]) -> float:
        kept = data[: max(1, math.ceil(len(data) * fraction))]
        return getattr(BenchmarkEntry.from_samples(kept), statistic)

    figures = [{name: figure(data) for name, data in run.items()} for run in runs]
    rows = [row for row in judge(figures, figures[0]).rows if not math.isnan(row.detectable)]
    return {row.name: row.detectable for row in rows}, statistics.median(row.spread for row in rows)


def by(found: dict[str, float], key: Callable[[str], str]) -> str:
    groups: dict[str, list[float]] = {}
    for name, value in found.items():
        groups.setdefault(key(name), []).append(value)
    return "; ".join(f"{k} {statistics.median(v):.0%} ({len(v)})" for k, v in sorted(groups.items()))


def summary(found: dict[str, float], spread: float) -> str:
    values = sorted(found.values())
    return (
        f"{len(values)} judged, median {statistics.median(values):.0%}, "
        f"range {values[0]:.0%} to {values[-1]:.0%}; between-run spread {spread:.3f} at the median"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="+", help="NAME=run1.json,run2.json,run3.json")
    parser.add_argument("--statistic", choices=("p05", "min", "median"), default="p05")
    parser.add_argument("--first", type=float, default=None, help="also judge the first fraction of rounds")
    args = parser.parse_args()
    for setting in args.settings:
        name, _, paths = setting.partition("=")
        runs = [rounds_of(path) for path in paths.split(",")]
        for path, run in zip(paths.split(","), runs, strict=True):
            rounds = sum(len(data) for data in run.values())
            print(f"{name} {path}: {len(run)} benchmarks, {rounds} rounds")
        found, spread = detects(runs, args.statistic)
        print(f"{name}, {args.statistic}: detects {summary(found, spread)}")
        print(f"  by file: {by(found, lambda n: n.split('::')[0].rsplit('/', 1)[-1])}")
        print(f"  by size: {by(found, lambda n: next(iter(SIZE.findall(n)), 'no size'))}")
        if args.first:
            cut = summary(*detects(runs, args.statistic, args.first))
            print(f"{name}, {args.statistic}, first {args.first:.0%} of the rounds: detects {cut}")


if __name__ == "__main__":
    main()
