"""The noise-aware regression rule: is the current run slower than the baseline, beyond noise and by enough?

A benchmark is a REGRESSION when both hold:

1. evidence: a one-sided Mann-Whitney U test says the current round times are stochastically larger than the
   baseline's, p < alpha (default 0.01). Rank-based, so an occasional outlier round (a page fault, a noisy
   neighbour) cannot make or break a verdict the way it moves a mean or a t-test.
2. size: the ratio of medians (current / baseline) is at least 1 + min_effect / 2.

`min_effect` (default 0.10) is the slowdown the gate promises to catch. The threshold on the observed ratio
sits halfway between "no change" (1.0) and that effect, the point that splits the two hypotheses evenly: a
true 10% slowdown is flagged whenever noise lets its median ratio land above 1.05, while a true 3% slowdown,
real but below the promise, seldom is. Measured by tests/test_regression.py over 1000 seeded trials of 20
rounds a side, 5% lognormal noise and 5% outlier rounds: a 10% slowdown is flagged in 97% of trials, a 3% one
in 12%, and the same distribution on both sides in 0.2% (0.7% counting improvements). The test alone would
flag any consistent change, however small, given enough rounds; the size condition alone would flag noise.
Requiring a bootstrap interval bound to clear 1 + min_effect instead would miss most true 10% slowdowns (that
bound sits below the true ratio almost always); the interval is still computed (seeded, so repeatable) and
reported so a reader can see the uncertainty. alpha = 0.001 was measured too: it misses about 8% of true 10%
slowdowns at the same noise.

Noise sets what a run can promise: at 10% noise, 20 rounds catch a 10% slowdown only about half the time
(more rounds fix that; a wide interval in the report shows it). And false alarms add up over many
benchmarks, so a gate should re-measure a flagged benchmark before failing on it.

IMPROVEMENT is the mirror image (faster beyond noise, ratio <= 1 / (1 + min_effect / 2)). Fewer than
MIN_ROUNDS rounds on either side gives INSUFFICIENT_DATA, which is never a failure.

The Mann-Whitney test is implemented here (normal approximation with tie and continuity corrections, the
same as scipy's `mannwhitneyu(method="asymptotic")`) so the plugin does not depend on scipy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

REGRESSION = "regression"
IMPROVEMENT = "improvement"
UNCHANGED = "unchanged"
INSUFFICIENT_DATA = "insufficient data"
MIN_ROUNDS = 5
DEFAULT_MIN_EFFECT = 0.10
DEFAULT_ALPHA = 0.01
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 1000
_BOOTSTRAP_SEED = 20240531


@dataclasses.dataclass(frozen=True)
class Verdict:
    baseline_median: float
    current_median: float
    ratio: float  # current / baseline median time: > 1 is slower
    verdict: str  # REGRESSION, IMPROVEMENT, UNCHANGED or INSUFFICIENT_DATA
    p_value: float | None  # one-sided, in the direction of the observed change; None without enough data
    ci_low: float | None  # CONFIDENCE interval of the median ratio (bootstrap)
    ci_high: float | None
    baseline_rounds: int
    current_rounds: int


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """U statistic of x and the one-sided p-value that x tends to be larger than y.

    Normal approximation with tie correction and continuity correction (scipy's "asymptotic" method).
    """
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    nx, ny = a.size, b.size
    n = nx + ny
    _, inverse, counts = np.unique(np.concatenate([a, b]), return_inverse=True, return_counts=True)
    # Average rank of each distinct value: tied values share the mean of the ranks they span.
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]
    u = float(ranks[:nx].sum() - nx * (nx + 1) / 2.0)
    tie_term = float((counts**3 - counts).sum()) / (n * (n - 1))
    sigma = math.sqrt(nx * ny / 12.0 * ((n + 1) - tie_term))
    if sigma == 0.0:
        return u, 1.0  # every value is the same: no evidence either way
    z = (u - nx * ny / 2.0 - 0.5) / sigma
    return u, 0.5 * math.erfc(z / math.sqrt(2.0))


def _bootstrap_medians(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    resampled = np.sort(values[rng.integers(0, values.size, size=(BOOTSTRAP_RESAMPLES, values.size))], axis=1)
    return (resampled[:, (values.size - 1) // 2] + resampled[:, values.size // 2]) / 2.0


def median_ratio_ci(
    baseline: Sequence[float], current: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """Percentile bootstrap interval of median(current) / median(baseline); seeded, so repeatable."""
    rng = np.random.default_rng(_BOOTSTRAP_SEED)
    b, c = np.asarray(baseline, dtype=float), np.asarray(current, dtype=float)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(_bootstrap_medians(c, rng) / _bootstrap_medians(b, rng), [tail, 1.0 - tail])
    return float(low), float(high)


def _check_samples(name: str, samples: Sequence[float]) -> np.ndarray:
    values = np.asarray(samples, dtype=float)
    if values.ndim != 1 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError(f"compare: {name} samples must be a flat list of positive finite times in seconds")
    return values


def compare(
    baseline_samples: Sequence[float],
    current_samples: Sequence[float],
    min_effect: float = DEFAULT_MIN_EFFECT,
    alpha: float = DEFAULT_ALPHA,
) -> Verdict:
    """Judge current round times against the baseline's (see the module docstring for the rule)."""
    if not (min_effect > 0 and 0 < alpha < 1):
        raise ValueError(f"compare: need min_effect > 0 and 0 < alpha < 1, got {min_effect} and {alpha}")
    base = _check_samples("baseline", baseline_samples)
    cur = _check_samples("current", current_samples)
    base_median = float(np.median(base)) if base.size else math.nan
    cur_median = float(np.median(cur)) if cur.size else math.nan
    ratio = cur_median / base_median if base.size and cur.size else math.nan
    if base.size < MIN_ROUNDS or cur.size < MIN_ROUNDS:
        return Verdict(
            base_median, cur_median, ratio, INSUFFICIENT_DATA, None, None, None, base.size, cur.size
        )
    slower = ratio >= 1.0
    _, p_value = mann_whitney_greater(cur, base) if slower else mann_whitney_greater(base, cur)
    threshold = 1.0 + min_effect / 2.0
    verdict = UNCHANGED
    if p_value < alpha and slower and ratio >= threshold:
        verdict = REGRESSION
    elif p_value < alpha and not slower and ratio <= 1.0 / threshold:
        verdict = IMPROVEMENT
    ci_low, ci_high = median_ratio_ci(base, cur)
    return Verdict(base_median, cur_median, ratio, verdict, p_value, ci_low, ci_high, base.size, cur.size)


def _format_time(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_table(rows: Sequence[tuple[str, Verdict]]) -> str:
    """The terminal summary: one aligned line per (benchmark name, verdict)."""
    header = ("benchmark", "baseline", "now", "ratio", f"{CONFIDENCE:.0%} CI", "p", "verdict")
    lines = [header]
    for name, v in rows:
        has_stats = v.p_value is not None
        lines.append(
            (
                name,
                _format_time(v.baseline_median),
                _format_time(v.current_median),
                "-" if math.isnan(v.ratio) else f"{v.ratio:.3f}x",
                f"{v.ci_low:.3f}-{v.ci_high:.3f}" if has_stats else "-",
                f"{v.p_value:.2g}" if has_stats else "-",
                v.verdict,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    # Names and verdicts read left to right; numbers line up on the right.
    left = {0, len(header) - 1}
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i in left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )
