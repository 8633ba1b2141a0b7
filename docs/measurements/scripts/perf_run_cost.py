"""What a perf run's rounds cost against what the gate can detect with them.

    python docs/measurements/scripts/perf_run_cost.py old=a.json,b.json,c.json new=d.json,e.json,f.json \
        [--first 0.5]

Each argument names a setting and three or more runs of it, each the ``--benchmark-json`` of a ``pytest
suites/perf`` run (which holds every round). For each setting it prints the rounds of each run, then the
gate's "detects" column (``gate.statistics.judge``) with those runs as the baseline: the slowdown the gate
promises to catch, which depends on the runs' spread alone; in all, by file and by size. ``--first F``
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

from pytest_collectives.gate.statistics import judge

SIZE = re.compile(r"\d+[KM]iB")


def rounds_of(path: str) -> dict[str, list[float]]:
    """Each benchmark's rounds (seconds per iteration), in the order they ran."""
    with open(path, encoding="utf-8") as handle:
        return {bench["fullname"]: bench["stats"]["data"] for bench in json.load(handle)["benchmarks"]}


def detects(runs: list[dict[str, list[float]]], fraction: float = 1.0) -> dict[str, float]:
    """The gate's detectable slowdown of each benchmark judged, the runs (fastest rounds) as its baseline."""
    fastest = [
        {name: min(data[: max(1, math.ceil(len(data) * fraction))]) for name, data in run.items()}
        for run in runs
    ]
    result = judge(fastest, fastest[0])
    return {row.name: row.detectable for row in result.rows if not math.isnan(row.detectable)}


def by(found: dict[str, float], key: Callable[[str], str]) -> str:
    groups: dict[str, list[float]] = {}
    for name, value in found.items():
        groups.setdefault(key(name), []).append(value)
    return "; ".join(f"{k} {statistics.median(v):.0%} ({len(v)})" for k, v in sorted(groups.items()))


def summary(found: dict[str, float]) -> str:
    values = sorted(found.values())
    return (
        f"{len(values)} judged, median {statistics.median(values):.0%}, "
        f"range {values[0]:.0%} to {values[-1]:.0%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="+", help="NAME=run1.json,run2.json,run3.json")
    parser.add_argument("--first", type=float, default=None, help="also judge the first fraction of rounds")
    args = parser.parse_args()
    for setting in args.settings:
        name, _, paths = setting.partition("=")
        runs = [rounds_of(path) for path in paths.split(",")]
        for path, run in zip(paths.split(","), runs, strict=True):
            rounds = sum(len(data) for data in run.values())
            print(f"{name} {path}: {len(run)} benchmarks, {rounds} rounds")
        found = detects(runs)
        print(f"{name}: detects {summary(found)}")
        print(f"  by file: {by(found, lambda n: n.split('::')[0].rsplit('/', 1)[-1])}")
        print(f"  by size: {by(found, lambda n: next(iter(SIZE.findall(n)), 'no size'))}")
        if args.first:
            print(
                f"{name}, first {args.first:.0%} of the rounds: detects {summary(detects(runs, args.first))}"
            )


if __name__ == "__main__":
    main()
