"""The gate's rule: is this run slower than the baseline's runs, beyond the spread between runs and machines?

A run's rounds say how noisy *that run* was, not how much a benchmark moves from one session to the next
(another process layout, another page placement, a neighbour on the host), so the rule never tests rounds
against rounds. It works on each run's median time per iteration, on a log scale, against a baseline of
several runs:

1. Machine factor. Each baseline run, and this run, gets one factor: the median over all benchmarks of its
   log-ratio to the baseline's centre. It is what a faster or slower machine of the same topology, or a
   quieter day, does to everything at once. Every benchmark is then judged relative to its run's factor.
2. Between-run spread. A benchmark's spread is the standard deviation of its factor-adjusted run medians.
   With 3-5 runs that estimate alone is poor, so it is shrunk towards the spread typical of its family (a
   moderated variance, as limma does: PRIOR_DF pseudo-runs at the pooled value), floored at MIN_SPREAD. A
   family is the benchmarks that differ only in message size (`family`): one op on one backend is noisy
   or quiet at every size alike (on a 2-core box gloo's all_gather moves 30-80% between sessions while
   its broadcast moves 5-15%), so pooling across ops would call the noisy ones quiet.
3. Verdict. A benchmark is a REGRESSION when its factor-adjusted log-ratio exceeds the t critical value for
   a one-sided test at ALPHA / N (Bonferroni over the N benchmarks judged: an unchanged session is flagged
   in at most ALPHA of sessions, whatever N) *and* its adjusted ratio is at least 1 + threshold / 2 (a real
   change far below the promise is not worth failing CI on). IMPROVEMENT is the mirror image.
4. Detectable slowdown. For each benchmark, the slowdown the rule catches 95% of the time at its spread:
   a user sees where the gate can keep the promise of `threshold` and where it needs more rounds, more
   baseline runs or a quieter machine.
5. Machine-wide slowdown. A factor above 1 + tolerance (machines of one topology differ by less), and
   beyond the baseline runs' own spread of that factor, is its own verdict: a driver or library upgrade
   that slows everything must not hide in the factor.

A flagged benchmark is measured again in the same session (gate.py); `confirm` judges the second
measurement at ALPHA over the flagged ones, and only a confirmed regression fails the gate.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping, Sequence
from statistics import NormalDist

import numpy as np

REGRESSION = "regression"
IMPROVEMENT = "improvement"
UNCHANGED = "unchanged"
INSUFFICIENT_DATA = "insufficient data"
MACHINE_SLOWDOWN = "machine-wide slowdown"
DEFAULT_THRESHOLD = 0.10
DEFAULT_TOLERANCE = 0.25
ALPHA = 0.05
POWER = 0.95
MIN_RUNS = 3  # baseline runs a benchmark needs before the gate judges it
MIN_FOR_FACTOR = 5  # benchmarks needed to tell a machine factor from one benchmark's change
PRIOR_DF = 4
MIN_SPREAD = 0.005  # timer resolution and rounding: no benchmark is trusted to repeat within 0.5%


@dataclasses.dataclass(frozen=True)
class BenchVerdict:
    name: str
    baseline_median: float  # seconds per iteration: the centre of the baseline runs
    current_median: float
    ratio: float  # current / baseline: > 1 is slower
    relative: float  # ratio / machine factor: what the verdict judges
    spread: float  # between-run spread (standard deviation of the log time, about a fraction)
    detectable: float  # the slowdown caught 95% of the time at this spread (fraction), nan when not judged
    runs: int  # baseline runs that hold this benchmark
    verdict: str
    remeasured: float | None = None  # relative ratio of the second measurement of a flagged benchmark
    critical: float = math.nan  # t critical value of the first judgement
    error: float = math.nan  # standard error of a run's log-ratio


@dataclasses.dataclass(frozen=True)
class MachineVerdict:
    factor: float  # this run's time / the baseline's, across every benchmark judged (> 1: slower)
    spread: float  # between-run spread of that factor in the baseline (fraction)
    compared: int
    tolerance: float
    verdict: str  # MACHINE_SLOWDOWN or UNCHANGED


@dataclasses.dataclass(frozen=True)
class GateResult:
    rows: list[BenchVerdict]
    machine: MachineVerdict | None  # None: too few benchmarks to estimate a factor
    missing: list[str]  # in the baseline, not in this run
    new: list[str]  # in this run, not in the baseline
    threshold: float

    @property
    def factor(self) -> float:
        """This run's machine factor; 1 when too few benchmarks to estimate one."""
        return self.machine.factor if self.machine else 1.0

    @property
    def judged(self) -> list[BenchVerdict]:
        return [r for r in self.rows if r.runs >= MIN_RUNS]

    @property
    def flagged(self) -> list[BenchVerdict]:
        return [r for r in self.rows if r.verdict == REGRESSION]

    @property
    def unpromised(self) -> list[BenchVerdict]:
        """Benchmarks where a slowdown of `threshold` would likely go unseen."""
        return [r for r in self.rows if r.detectable > self.threshold]


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (no scipy in the plugin): bisection on the CDF, itself a Simpson integral."""
    if not (0.5 <= p < 1 and df > 0):
        raise ValueError(f"t_quantile: need 0.5 <= p < 1 and df > 0, got {p} and {df}")
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def upper_tail(t: float) -> float:
        x = np.linspace(0.0, t, 4001)
        pdf = np.exp(log_norm - (df + 1) / 2 * np.log1p(x * x / df))
        h = t / 4000
        integral = h / 3 * (pdf[0] + pdf[-1] + 4 * pdf[1:-1:2].sum() + 2 * pdf[2:-1:2].sum())
        return 0.5 - float(integral)

    low, high = 0.0, 1.0
    while upper_tail(high) > 1 - p:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if upper_tail(mid) > 1 - p else (low, mid)
    return (low + high) / 2


_SIZE = re.compile(r"(?<=[\[-])\d+(?:[KMG]i)?B?(?=[-\]])")


def family(name: str) -> str:
    """The benchmark's name without its message-size parameter (``8B``, ``4KiB``, ``1MiB``, ``65536``)."""
    return _SIZE.sub("*", name)


def _pooled(variance: np.ndarray, df: np.ndarray, names: list[str]) -> np.ndarray:
    """Each benchmark's prior variance: the median over its family (of 3 or more), else over all."""
    scaled = variance / _chi2_median_over_df(df)
    overall = float(np.median(scaled))
    members: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        members.setdefault(family(name), []).append(i)
    prior = np.full(len(names), overall)
    for group in members.values():
        if len(group) >= 3:
            prior[group] = float(np.median(scaled[group]))
    return prior


def _chi2_median_over_df(df: np.ndarray) -> np.ndarray:
    """median(chi2(df)) / df (Wilson-Hilferty), to turn a median of sample variances into a variance."""
    return (1 - 2 / (9 * df)) ** 3


def _run_factors(logs: np.ndarray, centre: np.ndarray) -> np.ndarray:
    return np.nanmedian(logs - centre, axis=1)


def judge(
    baseline_runs: Sequence[Mapping[str, float]],
    current: Mapping[str, float],
    threshold: float = DEFAULT_THRESHOLD,
    tolerance: float = DEFAULT_TOLERANCE,
) -> GateResult:
    """Verdicts for this run's medians (seconds per iteration, by benchmark) against the baseline runs'."""
    if not (0 < threshold < 1 and tolerance > 0):
        raise ValueError(f"judge: need 0 < threshold < 1 and tolerance > 0, got {threshold}, {tolerance}")
    recorded = set().union(*baseline_runs) if baseline_runs else set()
    common = sorted(set(current) & recorded)
    counts = {name: sum(name in run for run in baseline_runs) for name in common}
    judged = [name for name in common if counts[name] >= MIN_RUNS]
    rows = [
        _unjudged(name, baseline_runs, current[name], counts[name]) for name in common if name not in judged
    ]
    machine = None
    if judged:
        judged_rows, machine = _judge_all(judged, baseline_runs, current, threshold, tolerance)
        rows.extend(judged_rows)
    rows.sort(key=lambda r: r.name)
    return GateResult(
        rows, machine, sorted(recorded - set(current)), sorted(set(current) - recorded), threshold
    )


def _unjudged(name: str, runs: Sequence[Mapping[str, float]], now: float, count: int) -> BenchVerdict:
    base = math.exp(float(np.mean([math.log(run[name]) for run in runs if name in run])))
    return BenchVerdict(name, base, now, now / base, math.nan, math.nan, math.nan, count, INSUFFICIENT_DATA)


def _judge_all(
    names: list[str],
    runs: Sequence[Mapping[str, float]],
    current: Mapping[str, float],
    threshold: float,
    tolerance: float,
) -> tuple[list[BenchVerdict], MachineVerdict | None]:
    logs = np.array([[math.log(run[n]) if n in run else np.nan for n in names] for run in runs])
    now = np.log([current[n] for n in names])
    with_factor = len(names) >= MIN_FOR_FACTOR
    centre = np.nanmedian(logs, axis=0)
    run_factor = _run_factors(logs, centre) if with_factor else np.zeros(len(runs))
    adjusted = logs - run_factor[:, None]
    centre = np.nanmean(adjusted, axis=0)
    n_runs = np.sum(~np.isnan(adjusted), axis=0)
    df = n_runs - 1.0
    variance = np.nansum((adjusted - centre) ** 2, axis=0) / df
    pooled = _pooled(variance, df, names)
    spread = np.maximum(np.sqrt((PRIOR_DF * pooled + df * variance) / (PRIOR_DF + df)), MIN_SPREAD)
    error = spread * np.sqrt(1 + 1 / n_runs)
    factor = float(np.median(now - centre)) if with_factor else 0.0
    effect = now - centre - factor
    size = math.log1p(threshold / 2)
    z_power = NormalDist().inv_cdf(POWER)
    rows = []
    for i, name in enumerate(names):
        critical = t_quantile(1 - ALPHA / len(names), PRIOR_DF + df[i])
        score = effect[i] / error[i]
        verdict = UNCHANGED
        if score > critical and effect[i] >= size:
            verdict = REGRESSION
        elif score < -critical and effect[i] <= -size:
            verdict = IMPROVEMENT
        detectable = math.expm1(max(critical * error[i], size) + z_power * error[i])
        rows.append(
            BenchVerdict(
                name, math.exp(centre[i]), current[name], math.exp(now[i] - centre[i]), math.exp(effect[i]),
                float(spread[i]), detectable, int(n_runs[i]), verdict, critical=critical,
                error=float(error[i]),
            )
        )  # fmt: skip
    if not with_factor:
        return rows, None
    factor_spread = max(float(np.std(run_factor, ddof=1)), MIN_SPREAD) if len(runs) > 1 else MIN_SPREAD
    beyond_spread = factor > t_quantile(1 - ALPHA, max(len(runs) - 1, 1)) * factor_spread * math.sqrt(
        1 + 1 / len(runs)
    )
    slower = math.exp(factor) > 1 + tolerance and beyond_spread
    machine = MachineVerdict(
        math.exp(factor), factor_spread, len(names), tolerance, MACHINE_SLOWDOWN if slower else UNCHANGED
    )
    return rows, machine


def confirm(row: BenchVerdict, median: float, factor: float, flagged: int, threshold: float) -> BenchVerdict:
    """The flagged ``row`` with its second measurement (``median`` seconds): still a REGRESSION only when
    the second measurement is one too, at ALPHA over the ``flagged`` benchmarks measured again."""
    effect = math.log(median / row.baseline_median) - math.log(factor)
    critical = t_quantile(1 - ALPHA / max(flagged, 1), PRIOR_DF + row.runs - 1)
    holds = effect / row.error > critical and effect >= math.log1p(threshold / 2)
    return dataclasses.replace(row, remeasured=math.exp(effect), verdict=REGRESSION if holds else UNCHANGED)
