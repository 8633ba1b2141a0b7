"""The gate's options: declared here, read and checked once when pytest configures (a bad value is a
one-line usage error before any benchmark runs), and the gate reads the result, never the raw options."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_collectives.errors import OptionError
from pytest_collectives.gate.baseline_format import BaselineError
from pytest_collectives.gate.statistics import DEFAULT_THRESHOLD, DEFAULT_TOLERANCE, MIN_RUNS
from pytest_collectives.gate.store import DEFAULT_NAME, KEEP_RUNS, load_baseline
from pytest_collectives.option import Option

DEFAULT_MIN_JUDGED = 0.5

OPTIONS = (
    Option("baseline_save", "add this run to the baseline of this machine's topology (keeps the last "
           f"--baseline-keep runs; the gate judges from {MIN_RUNS})", action="store_true"),
    Option("baseline_keep", f"runs a baseline keeps, the oldest dropped (default {KEEP_RUNS}; a save that "
           "would drop one refuses until this is given)", metavar="N"),
    Option("baseline_overwrite", "with --baseline-save: start the baseline afresh with this run (also "
           "replaces an unreadable or old-format file)", action="store_true"),
    Option("baseline_name", "keep configurations of one topology apart: its baseline is "
           f"<topology-id>/NAME.json (default {DEFAULT_NAME}), plus the dimensions the "
           "pytest_collectives_baseline_key hook adds", metavar="NAME", default=DEFAULT_NAME),
    Option("baseline", "compare with this baseline file or topology id instead of the detected topology's",
           metavar="PATH|ID"),
    Option("fail_on_regression", "CI mode: fail the session on a confirmed regression or a machine-wide "
           "slowdown, and when there is no baseline to judge by (unless --allow-missing-baseline)",
           action="store_true"),
    Option("allow_missing_baseline", "with --fail-on-regression: pass when this topology has no baseline "
           f"of {MIN_RUNS} runs yet (a first run)", action="store_true"),
    Option("regression_threshold", "the slowdown of one benchmark the gate promises to catch where its "
           "spread allows (default 0.10 = 10%%)", metavar="FRACTION", default=str(DEFAULT_THRESHOLD)),
    Option("machine_tolerance", "how much slower than the baseline a machine of this topology may run "
           "across all benchmarks before that is a machine-wide slowdown (default: learned from how far the "
           f"baseline's sittings differ, at least 3%%; {DEFAULT_TOLERANCE} while it holds one sitting)",
           metavar="FRACTION"),
    Option("min_judged", "with --fail-on-regression: the share of the baseline's benchmarks a run must "
           "judge, else it fails (default 0.5); 0 lets a run with no benchmark results pass",
           metavar="FRACTION", default=str(DEFAULT_MIN_JUDGED)),
    Option("gate_report", "write the verdict as gate.json and gate.md into DIR", metavar="DIR"),
)  # fmt: skip
BASELINE_DIR = Option(
    "baseline_dir", "where per-topology baselines live (default: baselines/ under the rootdir)", ini="string",
    flag=False,
)
OPTIONS += (BASELINE_DIR,)


@dataclasses.dataclass(frozen=True)
class GateSettings:
    fail_on_regression: bool
    save: bool  # --baseline-save
    overwrite: bool  # --baseline-overwrite
    baseline: str | None  # --baseline: a topology id, a file or a folder
    name: str  # --baseline-name
    allow_missing: bool  # --allow-missing-baseline
    report_dir: str | None  # --gate-report
    min_effect: float  # --regression-threshold
    tolerance: float | None  # --machine-tolerance; None: learnt from the baseline
    min_judged: float  # --min-judged
    keep: int | None  # --baseline-keep; None: not given, and no save drops a run
    root: Path  # the ini's baseline_dir, under the rootdir
    benchmark_skip: bool = False  # pytest-benchmark's own, which leave nothing to judge
    benchmark_disable: bool = False
    under_xdist: bool = False  # -n: pytest-benchmark does not time there

    @property
    def judging_first(self) -> bool:
        """Whether a run is judged: always, but for a --baseline-save without --fail-on-regression
        (recording a machine known to be good); with both, a run is saved only if it passes."""
        return self.fail_on_regression or not self.save

    @property
    def judging(self) -> bool:
        """Whether a run with nothing to judge fails: under --fail-on-regression, unless --min-judged 0."""
        return self.fail_on_regression and self.min_judged > 0


def fraction(flag: str, text: str, upper: float | None, closed: bool = False) -> float:
    """``text`` as a fraction in (0, upper), or in [0, upper] when ``closed``; else a usage error."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    inside = 0 <= value <= upper if closed and upper else 0 < value and (upper is None or value < upper)
    if not inside or value == float("inf"):
        bound = f"between 0 and {upper:g}" if upper else "above 0"
        raise OptionError(f"{flag} {text}: expected a fraction {bound}, e.g. 0.1")
    return value


def read(config: pytest.Config) -> GateSettings:
    opt = config.getoption
    keep = opt("baseline_keep")
    if keep is not None and (not str(keep).isdigit() or int(keep) < 1):
        raise OptionError(f"--baseline-keep {keep}: expected a whole number of runs >= 1, e.g. 5")
    if opt("baseline_overwrite") and not opt("baseline_save"):
        raise OptionError("--baseline-overwrite only makes sense with --baseline-save")
    explicit = opt("baseline")
    if explicit and (explicit.endswith(".json") or Path(explicit).exists()):
        # A named file is checked before the benchmarks run, not after they took their minutes.
        try:
            load_baseline(explicit if not Path(explicit).is_dir() else Path(explicit) / "baseline.json")
        except BaselineError as exc:
            raise OptionError(f"--baseline {explicit}: {exc}") from None
    tolerance = opt("machine_tolerance")
    return GateSettings(
        fail_on_regression=bool(opt("fail_on_regression")),
        save=bool(opt("baseline_save")),
        overwrite=bool(opt("baseline_overwrite")),
        baseline=explicit,
        name=opt("baseline_name"),
        allow_missing=bool(opt("allow_missing_baseline")),
        report_dir=opt("gate_report"),
        min_effect=fraction("--regression-threshold", str(opt("regression_threshold")), 1),
        tolerance=None if tolerance is None else fraction("--machine-tolerance", str(tolerance), None),
        min_judged=fraction("--min-judged", str(opt("min_judged")), 1, closed=True),
        keep=None if keep is None else int(keep),
        root=config.rootpath / (BASELINE_DIR.value(config) or "baselines"),
        benchmark_skip=bool(opt("benchmark_skip", False)),
        benchmark_disable=bool(opt("benchmark_disable", False)),
        under_xdist=bool(opt("numprocesses", None)),
    )
