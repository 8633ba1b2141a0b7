"""The gate's rule on a stated noise model (a simulation: it describes the rule, not a machine).

    python docs/measurements/scripts/bench_gate_model.py [--sessions 1000] [--baselines 100]

A GPU node's benchmark set, as `pytest --gpus 8 suites/perf` makes it: FAMILIES families (an op on a
backend over SIZES message sizes, 8 B to 256 MiB by 4), about 2000 benchmarks. A session's median of a
benchmark is its true time x the session's machine drift x its own between-session noise (log-normal):

- large messages (>= 64 KiB): 1% between sessions, each benchmark's own spread 0.8-1.25x that;
- small messages: 5-10% (latency-bound, noisier);
- machine drift: 0.75% per session, shared by every benchmark.

For 3 and 5 baseline runs it counts, over `--sessions` sessions (against `--baselines` baselines drawn
afresh, sessions spread evenly over them): unchanged sessions flagged (false alarms: any regression, family
slowdown or machine-wide slowdown), and sessions that caught a 10% and a 25% slowdown of one large-message
benchmark (named as a regression), of every benchmark of one family (a member named, or the family), and
of every benchmark (a machine-wide slowdown). Judged by `statistics.judge` as shipped, with its
default threshold and tolerance; the second measurement of a flagged benchmark is not simulated (it can
only turn a flag into a pass).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pytest_collectives.gate.statistics import MACHINE_SLOWDOWN, family, judge

FAMILIES = 143
SIZES = [8 * 4**k for k in range(14)]
LARGE = 64 * 1024
DRIFT = 0.0075


class Model:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.names = [f"test_op[fam{f}-{size}]" for f in range(FAMILIES) for size in SIZES]
        sizes = np.array([size for _ in range(FAMILIES) for size in SIZES])
        self.large = sizes >= LARGE
        self.true = np.log(1e-5 + sizes / 50e9)
        self.sigma = np.where(
            self.large, 0.01 * rng.uniform(0.8, 1.25, len(sizes)), rng.uniform(0.05, 0.10, len(sizes))
        )
        self.family = np.repeat(np.arange(FAMILIES), len(SIZES))

    def run(self, slower: np.ndarray | None = None) -> dict[str, float]:
        logs = self.true + self.rng.normal(0, DRIFT) + self.rng.normal(0, self.sigma)
        if slower is not None:
            logs = logs + np.log(slower)
        return dict(zip(self.names, np.exp(logs).tolist(), strict=True))


def failed(result) -> bool:
    machine_wide = result.machine is not None and result.machine.verdict == MACHINE_SLOWDOWN
    return bool(result.flagged or result.slow_families) or machine_wide


def scenarios(model: Model, rng: np.random.Generator) -> dict[str, tuple[np.ndarray | None, np.ndarray]]:
    """Each scenario's slowdown per benchmark and the benchmarks a catch must name (empty: any failure)."""
    one = int(rng.choice(np.flatnonzero(model.large)))
    fam = model.family == rng.integers(FAMILIES)
    out: dict[str, tuple[np.ndarray | None, np.ndarray]] = {"unchanged": (None, np.array([], int))}
    for pct in (10, 25):
        factor = 1 + pct / 100
        single = np.ones(len(model.names))
        single[one] = factor
        out[f"one benchmark {pct}%"] = (single, np.array([one]))
        out[f"one family {pct}%"] = (np.where(fam, factor, 1.0), np.flatnonzero(fam))
        out[f"every benchmark {pct}%"] = (np.full(len(model.names), factor), np.array([], int))
    return out


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--baselines", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{FAMILIES * len(SIZES)} benchmarks; {args.sessions} sessions a cell, {args.baselines} baselines")
    for runs in (3, 5):
        rng = np.random.default_rng(args.seed + runs)
        counts: dict[str, int] = {}
        per_baseline = max(args.sessions // args.baselines, 1)
        started = time.perf_counter()
        judged = 0
        for _ in range(args.baselines):
            model = Model(rng)
            base = [model.run() for _ in range(runs)]
            for _ in range(per_baseline):
                for label, (slower, named) in scenarios(model, rng).items():
                    result = judge(base, model.run(slower))
                    judged += 1
                    if label == "unchanged" or not len(named):
                        hit = failed(result)
                    else:
                        flagged = {r.name for r in result.flagged}
                        families = {f.name for f in result.slow_families}
                        hit = any(model.names[i] in flagged for i in named)
                        hit = hit or family(model.names[named[0]]) in families
                    counts[label] = counts.get(label, 0) + hit
        total = args.baselines * per_baseline
        took = (time.perf_counter() - started) / judged
        print(f"\n{runs} baseline runs ({took:.2f} s a judgement):")
        for label, count in counts.items():
            what = "flagged (false alarm)" if label == "unchanged" else "caught"
            print(f"  {label:24s} {what:22s} {count:5d} of {total} ({100 * count / total:.1f}%)")


if __name__ == "__main__":
    main()
