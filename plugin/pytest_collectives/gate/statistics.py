"""The gate's rule: is this run slower than the baseline's runs, beyond the spread between runs and machines?

A run's rounds say how noisy *that run* was, not how much a benchmark moves from one session to the next
(another process layout, another page placement, a neighbour on the host), so the rule never tests rounds
against rounds. It works on each run's median time per iteration, on a log scale, against a baseline of
several runs:

1. Machine factor. Each baseline run, and this run, gets one factor: the median over all benchmarks of its
   log-ratio to the baseline's centre. It is what a faster or slower machine of the same topology, or a
   quieter day, does to everything at once. Every benchmark is then judged relative to its run's factor.
2. Between-run spread. A benchmark's spread is the standard deviation of its factor-adjusted run medians.
   With 3-5 runs that estimate alone is poor, so it is shrunk towards a prior (a moderated variance, as
   limma does): the spread of its family's benchmarks nearest in message size (`_priors`; a family is the
   benchmarks that differ only in message size, `family`), worth d0 runs, d0 learned from how far the
   benchmarks' spreads scatter about their priors (`prior_df`). One op on one backend is noisy or quiet
   alike at neighbouring sizes (on a 2-core box gloo's all_gather moves 30-80% between sessions while its
   broadcast moves 5-15%; on a GPU node latency-bound small messages 5-10% and large ones 1%), so pooling
   across ops or across the whole size range would call the noisy ones quiet. Where spreads agree the
   prior is worth many runs and the t test has the degrees of freedom to catch 10% among 2000 benchmarks;
   where they do not it is worth few. Floored at MIN_SPREAD.
3. Verdict. A benchmark is a REGRESSION when its factor-adjusted log-ratio exceeds the t critical value for
   a one-sided test at ALPHA / N (Bonferroni over the N benchmarks judged: an unchanged session is flagged
   in at most ALPHA of sessions, whatever N) *and* its adjusted ratio is at least 1 + threshold / 2 (a real
   change far below the promise is not worth failing CI on). IMPROVEMENT is the mirror image.
4. Detectable slowdown. For each benchmark, the slowdown the rule catches 95% of the time at its spread:
   a user sees where the gate can keep the promise of `threshold` and where it needs more rounds, more
   baseline runs or a quieter machine.
5. Machine-wide slowdown. A factor beyond the tolerance is its own verdict: a driver or library upgrade
   that slows everything must not hide in the factor. The tolerance is learned from the baseline: how
   far the factor moves between its sittings (runs of one boot within an hour are one sitting: they
   share a process layout, clocks and neighbours, and a baseline recorded in one sitting has not seen a
   machine's drift), the one-sided t bound at ALPHA for a new sitting, floored at MIN_TOLERANCE. A quiet
   GPU node's sittings agree within 1%, so a uniform 10% slowdown fails there; this 2-core VM's sittings
   differ by tens of percent, so its drift passes. With fewer than 2 sittings it is DEFAULT_TOLERANCE;
   `tolerance` set by the user replaces it.

6. Families. A family (one op over sizes, or one test function over all its parameters: the pair
   matrix, the host copies) is compared with the rest of the machine (`_judge_families`): when most
   benchmarks are P2P pairs, a P2P slowdown becomes the machine factor and every collective reads as
   faster, so a family that moved together beyond its spread between the baseline's sittings is its own
   failing verdict. A baseline of one sitting judges no family (it cannot show how far one drifts).

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
DEFAULT_TOLERANCE = 0.25  # the machine-wide tolerance while the baseline has seen a single sitting
MIN_TOLERANCE = 0.03  # clocks and boosts: machines of one type are never trusted to agree closer
ALPHA = 0.05
POWER = 0.95
MIN_RUNS = 3  # baseline runs a benchmark needs before the gate judges it
MIN_FOR_FACTOR = 5  # benchmarks needed to tell a machine factor from one benchmark's change
MIN_FAMILY = 3  # benchmarks a family needs before it is judged as one
PRIOR_DF = 4  # the prior's worth in runs when too few benchmarks (MIN_FOR_PRIOR) to estimate it
MIN_FOR_PRIOR = 10
WINDOW = 5  # benchmarks of one family, nearest in message size, that share a prior
PRIOR_BINS, MIN_PER_BIN = 4, 50  # d0 is estimated among benchmarks of like priors (_prior_dfs)
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
    df: float = math.nan  # degrees of freedom of that error: the baseline runs' and the prior's


@dataclasses.dataclass(frozen=True)
class MachineVerdict:
    factor: float  # this run's time / the baseline's, across every benchmark judged (> 1: slower)
    spread: float  # between-sitting spread of that factor in the baseline (fraction; nan: one sitting)
    compared: int
    tolerance: float
    sittings: int  # separate sittings among the baseline's runs
    learned: bool  # the tolerance came from the sittings (False: set by the user, or one sitting)
    verdict: str  # MACHINE_SLOWDOWN or UNCHANGED


@dataclasses.dataclass(frozen=True)
class FamilyVerdict:
    name: str  # the family's pattern: `family` (an op over sizes) or a test function (`test_x[*]`)
    members: int
    relative: float  # how much slower its benchmarks ran than the rest of this machine (> 1: slower)
    spread: float  # between-run spread of that figure in the baseline (fraction)
    verdict: str  # REGRESSION or UNCHANGED


@dataclasses.dataclass(frozen=True)
class GateResult:
    rows: list[BenchVerdict]
    machine: MachineVerdict | None  # None: too few benchmarks to estimate a factor
    missing: list[str]  # in the baseline, not in this run
    new: list[str]  # in this run, not in the baseline
    threshold: float
    families: list[FamilyVerdict] = dataclasses.field(default_factory=list)

    @property
    def slow_families(self) -> list[FamilyVerdict]:
        return [f for f in self.families if f.verdict == REGRESSION]

    @property
    def machine_wide(self) -> bool:
        """Whether the whole machine ran slower than its tolerance allows."""
        return self.machine is not None and self.machine.verdict == MACHINE_SLOWDOWN

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


_UNITS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def _size(name: str) -> float:
    """The message size in a benchmark's name, for ordering a family by it (0 without one)."""
    match = _SIZE.search(name)
    if not match:
        return 0.0
    number, unit = re.fullmatch(r"(\d+)(.*)", match.group()).groups()  # type: ignore[union-attr]
    return float(int(number) * _UNITS[unit.rstrip("B")])


def _priors(scaled: np.ndarray, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each benchmark's prior variance and the number of benchmarks it was pooled from.

    The pool is the WINDOW other benchmarks of its family nearest in message size (a family of 4 or more;
    else every other benchmark): small messages are latency-bound and noisier than large ones of the same
    op, so the prior follows the size as limma-trend follows the mean. A benchmark is left out of its own
    pool, so that how far it lies from its prior says how far true spreads scatter (prior_df)."""
    members: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        members.setdefault(family(name), []).append(i)
    everyone = np.arange(len(names))
    prior, pooled = np.empty(len(names)), np.empty(len(names))
    for group in members.values():
        group = sorted(group, key=lambda j: _size(names[j]))
        for k, i in enumerate(group):
            if len(group) > 3:
                near = [*range(max(k - WINDOW, 0), k), *range(k + 1, min(k + 1 + WINDOW, len(group)))]
                pool = [group[p] for p in sorted(near, key=lambda p: abs(p - k))[:WINDOW]]
            else:
                pool = list(everyone[everyone != i]) if len(names) > 1 else [i]
            prior[i], pooled[i] = float(np.median(scaled[pool])), len(pool)
    return prior, pooled


def _same_size_priors(scaled: np.ndarray, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each benchmark's prior from every other benchmark of its message size (nan with fewer than 3)."""
    sizes = np.array([_size(name) for name in names])
    prior, pooled = np.full(len(names), np.nan), np.zeros(len(names))
    for size in set(sizes[sizes > 0].tolist()):
        members = np.flatnonzero(sizes == size)
        if len(members) > 3:
            for i in members:
                others = members[members != i]
                prior[i], pooled[i] = float(np.median(scaled[others])), len(others)
    return prior, pooled


def _prior_dfs(variance: np.ndarray, df: np.ndarray, prior: np.ndarray, pooled: np.ndarray) -> np.ndarray:
    """d0 (prior_df) for each benchmark, estimated among those of a like prior: latency-bound small
    messages scatter about their priors more than bandwidth-bound large ones, and one d0 for both would
    make the quiet benchmarks pay for the noisy ones' scatter (limma-trend's reason, for d0)."""
    d0 = np.empty(len(variance))
    bins = max(1, min(PRIOR_BINS, len(variance) // MIN_PER_BIN))
    edges = np.quantile(prior, np.linspace(0, 1, bins + 1)[1:-1])
    where = np.searchsorted(edges, prior)
    for b in range(bins):
        members = where == b
        d0[members] = prior_df(variance[members], df[members], prior[members], pooled[members])
    return d0


def prior_df(variance: np.ndarray, df: np.ndarray, prior: np.ndarray, pooled: np.ndarray) -> float:
    """How many runs' worth the prior is: limma's d0, from how far the benchmarks' variances scatter about
    their priors. Each log(s^2 / prior) scatters by the sampling of its df runs and by the prior's own
    error (the median of `pooled` such variances): that much, `_null_mad`, even were every benchmark's
    true spread its prior's. What scatter is left over is the true spreads' own, trigamma(d0 / 2) in
    limma's model (true variances a scaled inverse chi-square on d0 about the prior).

    The scatter is the median absolute deviation, not the variance: where the prior does not fit a
    benchmark its residual is an outlier, and a few of those must not make the prior worthless for the
    rest. The observed scatter is taken two standard errors high (`_null_mad`), so that a few benchmarks
    never buy a prior worth many runs: d0 too large would let an unchanged session through as a regression.
    PRIOR_DF when too few benchmarks (MIN_FOR_PRIOR) to tell."""
    if len(variance) < MIN_FOR_PRIOR:
        return float(PRIOR_DF)
    # Beyond 400 the median of the pool is as good as exact beside the benchmark's own few runs.
    nulls = np.array([_null_mad(float(d), int(min(w, 400))) for d, w in zip(df, pooled, strict=True)])
    null = math.sqrt(float(np.mean(nulls[:, 0] ** 2)))
    observed = _mad(np.log(variance / prior)) + 2 * float(np.mean(nulls[:, 1])) / math.sqrt(len(variance))
    if observed <= null:
        return math.inf
    # A MAD is 0.6745 standard deviations; the prior holds the true spreads' scatter too, over its pool.
    truth = (observed**2 - null**2) / 0.6745**2 / (1 + math.pi / (2 * float(np.mean(pooled))))
    return 2 * _inverse_trigamma(truth)


def _mad(x: np.ndarray) -> float:
    return float(np.median(np.abs(x - np.median(x))))


@functools.lru_cache(maxsize=64)
def _null_mad(df: float, pooled: int, draws: int = 20000, chunk: int = 100) -> tuple[float, float]:
    """The scatter (MAD) of log(s^2 / prior) on `df` runs, the prior the median of `pooled` others, when
    every true spread is the same, and the standard deviation of a MAD of n such, times sqrt(n) (from
    chunks of `chunk`; log chi-square is skewed, so the normal's 1.17 would understate it). A fixed seed:
    the same answer every run."""
    rng = np.random.default_rng(0)
    drawn = rng.chisquare(df, size=(draws, pooled + 1)) / df
    ratio = np.log(drawn[:, 0] / np.median(drawn[:, 1:], axis=1))
    chunks = [_mad(part) for part in ratio.reshape(-1, chunk)]
    return _mad(ratio), float(np.std(chunks, ddof=1)) * math.sqrt(chunk)


def _trigamma(x: float) -> float:
    shift = 0.0
    while x < 6:
        shift, x = shift + 1 / (x * x), x + 1
    return shift + 1 / x + 1 / (2 * x * x) + 1 / (6 * x**3) - 1 / (30 * x**5) + 1 / (42 * x**7)


def _inverse_trigamma(y: float) -> float:
    """x with trigamma(x) = y (trigamma falls from infinity to 0 as x grows)."""
    low, high = math.log(1e-4), math.log(1e8)
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _trigamma(math.exp(mid)) > y else (low, mid)
    return math.exp((low + high) / 2)


def _chi2_median_over_df(df: np.ndarray) -> np.ndarray:
    """median(chi2(df)) / df (Wilson-Hilferty), to turn a median of sample variances into a variance."""
    return (1 - 2 / (9 * df)) ** 3


def _run_factors(logs: np.ndarray, centre: np.ndarray) -> np.ndarray:
    return np.nanmedian(logs - centre, axis=1)


def judge(
    baseline_runs: Sequence[Mapping[str, float]],
    current: Mapping[str, float],
    threshold: float = DEFAULT_THRESHOLD,
    tolerance: float | None = None,
    sittings: Sequence[int] | None = None,
) -> GateResult:
    """Verdicts for this run's medians (seconds per iteration, by benchmark) against the baseline runs'.

    ``sittings`` labels each baseline run with its sitting (`store.sittings`; None: each run its own);
    ``tolerance`` None learns the machine-wide tolerance from them."""
    if sittings is not None and len(sittings) != len(baseline_runs):
        raise ValueError(f"judge: {len(sittings)} sitting labels for {len(baseline_runs)} runs")
    if not (0 < threshold < 1 and (tolerance is None or tolerance > 0)):
        raise ValueError(f"judge: need 0 < threshold < 1 and tolerance > 0, got {threshold}, {tolerance}")
    recorded = set().union(*baseline_runs) if baseline_runs else set()
    common = sorted(set(current) & recorded)
    counts = {name: sum(name in run for run in baseline_runs) for name in common}
    judged = [name for name in common if counts[name] >= MIN_RUNS]
    rows = [
        _unjudged(name, baseline_runs, current[name], counts[name]) for name in common if name not in judged
    ]
    machine, families = None, []
    if judged:
        labels = list(range(len(baseline_runs))) if sittings is None else list(sittings)
        judged_rows, machine, families = _judge_all(
            judged, baseline_runs, current, threshold, tolerance, labels
        )
        rows.extend(judged_rows)
    rows.sort(key=lambda r: r.name)
    return GateResult(
        rows, machine, sorted(recorded - set(current)), sorted(set(current) - recorded), threshold, families
    )


def _unjudged(name: str, runs: Sequence[Mapping[str, float]], now: float, count: int) -> BenchVerdict:
    base = math.exp(float(np.mean([math.log(run[name]) for run in runs if name in run])))
    return BenchVerdict(name, base, now, now / base, math.nan, math.nan, math.nan, count, INSUFFICIENT_DATA)


def _judge_all(
    names: list[str],
    runs: Sequence[Mapping[str, float]],
    current: Mapping[str, float],
    threshold: float,
    tolerance: float | None,
    sittings: list[int],
) -> tuple[list[BenchVerdict], MachineVerdict | None, list[FamilyVerdict]]:
    logs = np.array([[math.log(run[n]) if n in run else np.nan for n in names] for run in runs])
    now = np.log([current[n] for n in names])
    with_factor = len(names) >= MIN_FOR_FACTOR
    centre = np.nanmedian(logs, axis=0)
    run_factor = _run_factors(logs, centre) if with_factor else np.zeros(len(runs))
    adjusted = logs - run_factor[:, None]
    centre = np.nanmean(adjusted, axis=0)
    n_runs = np.sum(~np.isnan(adjusted), axis=0)
    df = n_runs - 1.0
    variance = np.maximum(np.nansum((adjusted - centre) ** 2, axis=0) / df, MIN_SPREAD**2 / 100)
    scaled = variance / _chi2_median_over_df(df)
    # Two priors, each worth the d0 its fit earns (at most the runs it was pooled from): the family's
    # neighbours in size, or every other op at this size (on a GPU node the ops' spreads agree at a size,
    # and that pool never straddles the latency/bandwidth step); the one that fits better is used.
    prior, pooled = _priors(scaled, names)
    d0 = np.minimum(_prior_dfs(variance, df, prior, pooled), pooled * df)
    across, across_pooled = _same_size_priors(scaled, names)
    has = ~np.isnan(across)
    if has.sum() >= MIN_FOR_PRIOR:
        d0_across = np.zeros(len(names))
        d0_across[has] = np.minimum(
            _prior_dfs(variance[has], df[has], across[has], across_pooled[has]), across_pooled[has] * df[has]
        )
        # One choice for all: picked benchmark by benchmark, the prior would be chosen by its own luck.
        if np.median(d0_across[has]) > np.median(d0[has]):
            prior, d0 = np.where(has, across, prior), np.where(has, d0_across, d0)
    total_df = np.floor(2 * (d0 + df)) / 2
    spread = np.maximum(np.sqrt((d0 * prior + df * variance) / (d0 + df)), MIN_SPREAD)
    error = spread * np.sqrt(1 + 1 / n_runs)
    factor = float(np.median(now - centre)) if with_factor else 0.0
    effect = now - centre - factor
    size = math.log1p(threshold / 2)
    z_power = NormalDist().inv_cdf(POWER)
    rows = []
    for i, name in enumerate(names):
        critical = t_quantile(1 - ALPHA / len(names), float(total_df[i]))
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
                error=float(error[i]), df=float(total_df[i]),
            )
        )  # fmt: skip
    if not with_factor:
        return rows, None, []
    families = _judge_families(names, logs - centre, now - centre, spread, threshold, sittings)
    return rows, _machine(factor, run_factor, sittings, len(names), tolerance), families


def families_of(name: str) -> tuple[str, str]:
    """The families a benchmark belongs to: its op over sizes (`family`) and its test function over all
    its parameters (the pair matrix, the host copies)."""
    return family(name), name.split("[", 1)[0] + "[*]"


def _groups(names: list[str]) -> dict[str, np.ndarray]:
    """The families a slowdown may move together (families_of), of MIN_FAMILY or more benchmarks each."""
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        for label in families_of(name):
            groups.setdefault(label, []).append(i)
    seen, out = set(), {}
    for label, members in sorted(groups.items()):
        if (
            len(members) >= MIN_FAMILY
            and len(names) - len(members) >= MIN_FOR_FACTOR
            and tuple(members) not in seen
        ):
            seen.add(tuple(members))
            out[label] = np.array(members)
    return out


def _judge_families(
    names: list[str],
    runs: np.ndarray,
    now: np.ndarray,
    spread: np.ndarray,
    threshold: float,
    sittings: list[int],
) -> list[FamilyVerdict]:
    """Each family against the rest of the machine: its benchmarks' mean log-ratio (weighted by their
    precision: the quiet ones say most) less the median of everyone else's, in this run and in each
    baseline sitting. A family that moved together beyond how far that figure moves between the
    baseline's sittings is its own verdict, at ALPHA over the families (a moderated t test, as for one
    benchmark, the families' typical spread worth the d0 their scatter earns): a P2P regression that is
    60% of the benchmarks would otherwise become the machine factor, with every collective an improvement.

    Between sittings, not runs, as for the machine factor: runs of one sitting agree on how one op
    stands against the others far more closely than sessions do (on this VM one op's family moved 38%
    against the rest between unchanged sessions, while three runs of one sitting agreed within a few
    percent). With one sitting there is nothing to learn that from, and no family is judged."""
    groups = _groups(names)
    labels = sorted(set(sittings))
    if not groups or len(labels) < 2:
        return []
    weight = 1 / spread**2

    def against_rest(values: np.ndarray, members: np.ndarray) -> float:
        inside = np.zeros(len(names), bool)
        inside[members] = True
        known = ~np.isnan(values)
        if not (inside & known).any() or not (~inside & known).any():
            return math.nan  # the family was not measured in this run (new since, or deselected)
        mean = np.sum((weight * values)[inside & known]) / np.sum(weight[inside & known])
        return float(mean - np.median(values[~inside & known]))

    def by_sitting(values: list[float]) -> list[float]:
        """The family's figure in each sitting that measured it."""
        pairs = list(zip(values, sittings, strict=True))
        kept = [[v for v, s in pairs if s == x and not math.isnan(v)] for x in labels]
        return [float(np.mean(k)) for k in kept if k]

    figures = {label: by_sitting([against_rest(run, m) for run in runs]) for label, m in groups.items()}
    effects = {label: against_rest(now, m) for label, m in groups.items()}
    # A family seen in one sitting (added since) has no spread between sittings to be judged against; one
    # missing from this run has nothing to judge. Neither may blind the others' prior.
    judged = [label for label in groups if len(figures[label]) >= 2 and not math.isnan(effects[label])]
    if not judged:
        return []
    df = {label: len(figures[label]) - 1.0 for label in judged}
    variance = {label: max(float(np.var(figures[label], ddof=1)), MIN_SPREAD**2 / 100) for label in judged}
    v, dfs = np.array([variance[x] for x in judged]), np.array([df[x] for x in judged])
    prior = float(np.median(v / _chi2_median_over_df(dfs)))
    # The prior's worth learned as for one benchmark; with too few families to tell, none (each family
    # on its own sittings): a fixed worth let one gloo op's 59% swing pass for a regression on this VM.
    d0 = 0.0
    if len(judged) >= MIN_FOR_PRIOR:
        fit = prior_df(v, dfs, np.full(len(v), prior), np.full(len(v), len(v) - 1))
        d0 = min(fit, (len(v) - 1) * float(np.median(dfs)))
    size = math.log1p(threshold / 2)
    verdicts = []
    for label in judged:
        members, k = groups[label], df[label]
        critical = t_quantile(1 - ALPHA / len(judged), d0 + k)
        sd = max(math.sqrt((d0 * prior + k * variance[label]) / (d0 + k)), MIN_SPREAD)
        effect = effects[label] - float(np.mean(figures[label]))
        slower = effect / (sd * math.sqrt(1 + 1 / (k + 1))) > critical and effect >= size
        verdicts.append(
            FamilyVerdict(label, len(members), math.exp(effect), sd, REGRESSION if slower else UNCHANGED)
        )
    return verdicts


def _machine(
    factor: float, run_factors: np.ndarray, sittings: list[int], compared: int, tolerance: float | None
) -> MachineVerdict:
    """The machine-wide verdict on this run's (log) factor, against the baseline sittings' factors."""
    labels = sorted(set(sittings))
    by_sitting = [float(np.mean(run_factors[[s == label for s in sittings]])) for label in labels]
    spread = math.nan
    if len(by_sitting) > 1:
        spread = max(float(np.std(by_sitting, ddof=1)), MIN_SPREAD)
    learned = tolerance is None and len(by_sitting) > 1
    if learned:
        n = len(by_sitting)
        bound = t_quantile(1 - ALPHA, n - 1) * spread * math.sqrt(1 + 1 / n)
        tolerance = max(MIN_TOLERANCE, math.expm1(bound))
    elif tolerance is None:
        tolerance = DEFAULT_TOLERANCE
    verdict = MACHINE_SLOWDOWN if math.exp(factor) > 1 + tolerance else UNCHANGED
    return MachineVerdict(math.exp(factor), spread, compared, tolerance, len(by_sitting), learned, verdict)


def confirm(row: BenchVerdict, median: float, factor: float, flagged: int, threshold: float) -> BenchVerdict:
    """The flagged ``row`` with its second measurement (``median`` seconds): still a REGRESSION only when
    the second measurement is one too, at ALPHA over the ``flagged`` benchmarks measured again."""
    effect = math.log(median / row.baseline_median) - math.log(factor)
    critical = t_quantile(1 - ALPHA / max(flagged, 1), row.df)
    holds = effect / row.error > critical and effect >= math.log1p(threshold / 2)
    return dataclasses.replace(row, remeasured=math.exp(effect), verdict=REGRESSION if holds else UNCHANGED)


def resting_on(result: GateResult) -> list[str]:
    """The benchmarks this result's failing verdicts rest on, to be measured again: the flagged ones, the
    members of each slow family, and for a machine-wide slowdown every benchmark judged."""
    slow = {f.name for f in result.slow_families}
    return [
        r.name
        for r in result.judged
        if r.verdict == REGRESSION or result.machine_wide or slow & set(families_of(r.name))
    ]


def reconfirmed(first: GateResult, again: GateResult) -> GateResult:
    """``first`` with its family and machine-wide verdicts kept only where ``again`` (the same run judged
    with its second measurements) gives them too: as for one benchmark, a slowdown seen once is noise."""
    still = {f.name for f in again.slow_families}
    families = [
        f if f.verdict != REGRESSION or f.name in still else dataclasses.replace(f, verdict=UNCHANGED)
        for f in first.families
    ]
    machine = first.machine
    if first.machine_wide and not again.machine_wide:
        machine = dataclasses.replace(machine, verdict=UNCHANGED)  # type: ignore[arg-type]
    return dataclasses.replace(first, families=families, machine=machine)
