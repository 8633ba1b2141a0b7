"""Prints what the worker pool saves: dispatch overhead on warm groups, group start, spawn-per-test.

    python docs/measurements/scripts/bench_dispatch.py [--repeat 200]

Timings are printed, never asserted: this machine's noise is not the plugin's regression.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

# the tests' support modules: helpers and the mutant backends the tests use
TESTS = Path(__file__).resolve().parents[3] / "tests" / "support"
sys.path.insert(0, str(TESTS))
from helpers import module_task  # noqa: E402

from pytest_collectives.execution.launchers.warm_groups import GroupPool  # noqa: E402

EMPTY_TEST = "def test_empty(pg):\n    pass\n"


def timed(fn) -> float:  # noqa: ANN001
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="empty tests per warm group")
    parser.add_argument("--spawn-repeat", type=int, default=3, help="spawn-per-test samples")
    args = parser.parse_args()
    task = module_task(EMPTY_TEST, "test_empty")

    pool = GroupPool("gloo", timeout_s=60)
    try:
        cold = timed(lambda: pool.group(4))  # includes the forkserver's one-time torch import
        pool.discard(4)
        restarts = [timed(lambda: (pool.group(4), pool.discard(4))) for _ in range(5)]
        rows = [("cold start, 4 ranks (forkserver + torch import + group)", cold * 1e3)]
        rows.append(("group (re)start, 4 ranks, median of 5", statistics.median(restarts) * 1e3))
        for n in (2, 4):
            pool.run(task, n)  # warm: module imported on every rank
            samples = [timed(lambda n=n: pool.run(task, n)) for _ in range(args.repeat)]
            rows.append((f"empty test on a warm {n}-rank group, median", statistics.median(samples) * 1e3))
            rows.append(
                (f"empty test on a warm {n}-rank group, p90", statistics.quantiles(samples, n=10)[-1] * 1e3)
            )
    finally:
        pool.close()

    spawn = GroupPool("gloo", timeout_s=120, start_method="spawn")
    try:
        per_test = []
        for _ in range(args.spawn_repeat):
            per_test.append(timed(lambda: (spawn.run(task, 4), spawn.discard(4))))
        rows.append(
            ("spawn-per-test (fresh interpreters), 4 ranks, median", statistics.median(per_test) * 1e3)
        )
    finally:
        spawn.close()

    warm4 = next(ms for name, ms in rows if name.startswith("empty test on a warm 4-rank group, median"))
    rows.append(("spawn-per-test / warm dispatch, 4 ranks (x)", rows[-1][1] / warm4))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        unit = "" if name.endswith("(x)") else " ms"
        print(f"{name:<{width}}  {value:10.2f}{unit}")


if __name__ == "__main__":
    main()
