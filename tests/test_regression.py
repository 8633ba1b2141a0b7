import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_collectives.regression import (
    IMPROVEMENT,
    INSUFFICIENT_DATA,
    REGRESSION,
    UNCHANGED,
    Verdict,
    compare,
    format_table,
    mann_whitney_greater,
    median_ratio_ci,
)

TRIALS = 1000


def noisy_rounds(rng: np.random.Generator, factor: float, sigma: float, shape: tuple[int, int]) -> np.ndarray:
    """Timings with lognormal noise; 5% of rounds hit by a 1.5-3x outlier (a page fault, a busy neighbour)."""
    times = 1e-3 * factor * np.exp(rng.normal(0.0, sigma, shape))
    hit = rng.random(shape) < 0.05
    return np.where(hit, times * rng.uniform(1.5, 3.0, shape), times)


def verdict_rates(
    factor: float, trials: int = TRIALS, sigma: float = 0.05, rounds: int = 20
) -> dict[str, float]:
    rng = np.random.default_rng(0)
    baseline = noisy_rounds(rng, 1.0, sigma, (trials, rounds))
    current = noisy_rounds(rng, factor, sigma, (trials, rounds))
    verdicts = [compare(b, c).verdict for b, c in zip(baseline, current, strict=True)]
    rates = {v: verdicts.count(v) / trials for v in (REGRESSION, IMPROVEMENT, UNCHANGED)}
    print(
        f"\n{factor:.2f}x slower, noise {sigma:.0%}, {rounds} rounds a side, {trials} trials: "
        + ", ".join(f"{v} {rate:.1%}" for v, rate in rates.items())
    )
    return rates


# ---------------------------------------------------------------------------------------------------------
# The measured rates the gate promises (pytest -s prints them)


def test_a_10_percent_slowdown_is_caught():
    assert verdict_rates(1.10)[REGRESSION] >= 0.95


def test_the_same_distribution_is_almost_never_flagged():
    rates = verdict_rates(1.00)
    assert rates[REGRESSION] + rates[IMPROVEMENT] < 0.01


def test_a_3_percent_slowdown_is_below_the_minimum_effect():
    assert verdict_rates(1.03)[REGRESSION] < 0.25


def test_a_10_percent_speedup_is_an_improvement():
    rates = verdict_rates(1 / 1.10, trials=300)
    assert rates[IMPROVEMENT] >= 0.95 and rates[REGRESSION] == 0


# ---------------------------------------------------------------------------------------------------------
# The rule's edges


def test_too_few_rounds_is_insufficient_data_never_a_failure():
    for base_n, cur_n in ((4, 30), (30, 4), (0, 0), (1, 10)):
        v = compare([1.0] * base_n, [5.0] * cur_n)
        assert v.verdict == INSUFFICIENT_DATA
        assert v.p_value is None and v.ci_low is None and v.ci_high is None
        assert (v.baseline_rounds, v.current_rounds) == (base_n, cur_n)
    assert compare([1.0] * 4, [2.0] * 5).ratio == 2.0
    assert math.isnan(compare([], [2.0] * 5).ratio)


def test_identical_rounds_are_unchanged():
    v = compare([1e-3] * 10, [1e-3] * 10)
    assert (v.verdict, v.ratio, v.p_value, v.ci_low, v.ci_high) == (UNCHANGED, 1.0, 1.0, 1.0, 1.0)


def test_a_clear_regression_and_its_numbers():
    base = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00, 1.01]
    cur = [1.30, 1.31, 1.29, 1.32, 1.28, 1.30]
    v = compare(base, cur)
    assert v.verdict == REGRESSION
    assert (v.baseline_median, v.current_median) == (1.00, 1.30)
    assert v.ratio == pytest.approx(1.30)
    assert v.p_value < 0.01
    assert v.ci_low <= v.ratio <= v.ci_high


def test_a_significant_but_small_change_is_unchanged():
    base = np.linspace(0.99, 1.01, 30)
    v = compare(base, base * 1.03)
    assert v.p_value < 1e-6 and v.verdict == UNCHANGED


def test_a_large_but_noisy_change_is_unchanged():
    v = compare([1.0, 0.5, 2.0, 1.0, 0.7, 1.5], [1.2, 0.6, 2.2, 1.1, 0.8, 1.6])
    assert v.ratio > 1.05 and v.p_value >= 0.01 and v.verdict == UNCHANGED


def test_min_effect_and_alpha_are_honoured():
    base = np.linspace(0.99, 1.01, 30)
    assert compare(base, base * 1.08).verdict == REGRESSION
    assert compare(base, base * 1.08, min_effect=0.20).verdict == UNCHANGED
    assert compare(base, base * 1.03, min_effect=0.05).verdict == REGRESSION


def test_verdict_and_interval_are_deterministic():
    rng = np.random.default_rng(3)
    base, cur = rng.lognormal(0, 0.1, 15), rng.lognormal(0.05, 0.1, 15)
    assert compare(base, cur) == compare(list(base), list(cur))
    low, high = median_ratio_ci(base, cur)
    assert low < np.median(cur) / np.median(base) < high


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (([1.0] * 5, [1.0, math.nan, 1.0, 1.0, 1.0]), "current samples"),
        (([1.0, -1.0, 1.0, 1.0, 1.0], [1.0] * 5), "baseline samples"),
        (([[1.0]] * 5, [1.0] * 5), "baseline samples"),
        (([1.0] * 5, [1.0] * 5, 0.0), "min_effect"),
        (([1.0] * 5, [1.0] * 5, 0.1, 1.5), "alpha"),
    ],
)
def test_bad_input(args, fragment):
    with pytest.raises(ValueError, match=fragment) as info:
        compare(*args)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------------------
# Mann-Whitney U against scipy (the plugin itself does not need scipy)


def test_mann_whitney_by_hand():
    # No overlap: x's ranks are 4, 5, 6, so U = 15 - 6 = 9 = nx * ny.
    u, p = mann_whitney_greater([4, 5, 6], [1, 2, 3])
    assert u == 9.0 and p < 0.05
    assert mann_whitney_greater([1, 2, 3], [4, 5, 6])[0] == 0.0
    assert mann_whitney_greater([2.0] * 5, [2.0] * 5) == (12.5, 1.0)


samples = st.lists(st.integers(1, 12), min_size=2, max_size=25).map(lambda xs: [x / 4 for x in xs])


@settings(max_examples=100, deadline=None)
@given(x=samples, y=samples)
def test_mann_whitney_matches_scipy(x, y):
    scipy_stats = pytest.importorskip("scipy.stats")
    expected = scipy_stats.mannwhitneyu(x, y, alternative="greater", method="asymptotic", use_continuity=True)
    u, p = mann_whitney_greater(x, y)
    assert u == pytest.approx(expected.statistic)
    if math.isnan(expected.pvalue):
        assert p == 1.0  # every value tied: scipy says nan, the gate says "no evidence"
    else:
        assert p == pytest.approx(expected.pvalue, rel=1e-9, abs=1e-12)


# ---------------------------------------------------------------------------------------------------------
# The terminal table


def test_format_table():
    base = np.linspace(0.99e-3, 1.01e-3, 10)
    rows = [
        ("all_reduce[1MiB]", compare(base, base * 1.2)),
        ("broadcast[4KiB]", compare(base * 1e-2, base * 1e-2)),
        ("all_gather[1GiB]", compare([1.5] * 3, [1.5] * 3)),
    ]
    lines = format_table(rows).splitlines()
    assert len(lines) == 4
    assert lines[0].split() == ["benchmark", "baseline", "now", "ratio", "95%", "CI", "p", "verdict"]
    assert lines[1].startswith("all_reduce[1MiB]") and lines[1].endswith("regression")
    assert "1 ms" in lines[1] and "1.2 ms" in lines[1] and "1.200x" in lines[1]
    assert "10 us" in lines[2] and lines[2].endswith("unchanged")
    assert "1.5 s" in lines[3] and lines[3].endswith("insufficient data")
    # Columns line up: every verdict starts at the same offset.
    verdicts = ("regression", "unchanged", "insufficient")
    assert len({line.rindex(word) for line, word in zip(lines[1:], verdicts, strict=True)}) == 1


def test_format_table_with_no_baseline_median():
    v = Verdict(math.nan, 2e-9, math.nan, INSUFFICIENT_DATA, None, None, None, 0, 5)
    assert format_table([("x", v)]).splitlines()[1].split() == [
        "x",
        "-",
        "2",
        "ns",
        "-",
        "-",
        "-",
        "insufficient",
        "data",
    ]
