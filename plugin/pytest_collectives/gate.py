"""The CI gate: this run's benchmarks against the stored baseline of this machine's topology.

Results come from pytest-benchmark's own session (distributed benchmarks feed it from the ranks, plain
ones time themselves), so every benchmark of the run is gated the same way. The rule lives in
regression.py, the files in baselines.py, the topology in topology.py; this module only wires them to the
session: save, resolve, compare, report, and set the exit status.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .baselines import (
    BaselineError,
    BenchmarkEntry,
    ResolvedBaseline,
    check_saveable,
    load_baseline,
    resolve_baseline,
    save_baseline,
)
from .regression import DEFAULT_MIN_EFFECT, REGRESSION, Verdict, compare, format_table
from .topology import Fingerprint, detect, topology_id

OPTIONS = (
    ("--baseline-save", {"action": "store_true", "help": "save this run's benchmarks as the baseline of "
                         "this machine's topology (refuses to replace one without --baseline-overwrite)"}),
    ("--baseline-overwrite", {"action": "store_true", "help": "let --baseline-save replace a baseline"}),
    ("--baseline", {"metavar": "PATH|ID", "help": "compare with this baseline file or topology id "
                    "instead of the detected topology's"}),
    ("--fail-on-regression", {"action": "store_true", "help": "CI mode: fail the session when a benchmark "
                              "is slower than its baseline beyond noise and --regression-threshold"}),
    ("--regression-threshold", {"metavar": "FRACTION", "default": str(DEFAULT_MIN_EFFECT),
                                "help": "the slowdown the gate must catch (default 0.10 = 10%%)"}),
)  # fmt: skip


def addoptions(parser: pytest.Parser, group: Any) -> None:
    for flag, kwargs in OPTIONS:
        group.addoption(flag, **kwargs)
    parser.addini("baseline_dir", "where per-topology baselines live (default: baselines/ under the rootdir)")


def collect_results(config: pytest.Config) -> dict[str, BenchmarkEntry]:
    """Every benchmark pytest-benchmark recorded in this session, by its full test id."""
    session = getattr(config, "_benchmarksession", None)
    results = {}
    for bench in getattr(session, "benchmarks", []):
        if bench.stats.data:
            results[bench.fullname] = BenchmarkEntry.from_samples(bench.stats.data, bench.extra_info)
    return results


def compare_all(
    baseline: dict[str, BenchmarkEntry], results: dict[str, BenchmarkEntry], min_effect: float
) -> tuple[list[tuple[str, Verdict]], list[str]]:
    """Verdicts for the benchmarks in both, and the names of those this run has but the baseline lacks."""
    rows = [
        (name, compare(baseline[name].samples, entry.samples, min_effect=min_effect))
        for name, entry in sorted(results.items())
        if name in baseline
    ]
    return rows, sorted(set(results) - set(baseline))


class BaselineGate:
    def __init__(self, config: pytest.Config, backend: str, gpus: int) -> None:
        self.config = config
        self.backend, self.gpus = backend, gpus
        opt = config.getoption
        text = str(opt("regression_threshold"))
        try:
            self.min_effect = float(text)
        except ValueError:
            self.min_effect = float("nan")
        if not 0 < self.min_effect < 1:
            raise pytest.UsageError(
                f"--regression-threshold {text}: expected a fraction between 0 and 1, e.g. 0.1"
            )
        if opt("baseline_overwrite") and not opt("baseline_save"):
            raise pytest.UsageError("--baseline-overwrite only makes sense with --baseline-save")
        self.root = config.rootpath / (config.getini("baseline_dir") or "baselines")
        explicit = opt("baseline")
        if explicit and (explicit.endswith(".json") or Path(explicit).exists()):
            # A named file is checked before the benchmarks run, not after they took their minutes.
            try:
                load_baseline(explicit if not Path(explicit).is_dir() else Path(explicit) / "baseline.json")
            except BaselineError as exc:
                raise pytest.UsageError(f"--baseline {explicit}: {exc}") from None
        self.lines: list[str] = []
        self.rows: list[tuple[str, Verdict]] = []
        self.fingerprint: Fingerprint | None = None
        self.resolved: ResolvedBaseline | None = None
        self.error: str | None = None
        self.baseline_path: Path | None = None  # the baseline this run was compared with

    def _resolve(self) -> None:
        """Detect the topology, find its baseline (to save: check where it goes); raises BaselineError."""
        opt = self.config.getoption
        self.fingerprint = detect(self.backend, self.gpus)
        if opt("baseline_save"):
            check_saveable(self.root, self.fingerprint, opt("baseline_overwrite"))
        else:
            self.resolved = resolve_baseline(self.root, self.fingerprint, opt("baseline"))

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # A bad baseline is found before minutes of benchmarks run, not after them (in SPMD mode, rank 0
        # alone gates and tells the other ranks: SpmdSession.pytest_collection_finish).
        opt = self.config.getoption
        if (
            opt("benchmark_skip", False)
            or opt("benchmark_disable", False)
            or not any("benchmark" in getattr(item, "fixturenames", ()) for item in session.items)
        ):
            return
        try:
            self._resolve()
        except BaselineError as exc:
            self.error = f"baseline error: {exc}"

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        return True if self.error else None  # True: the tests do not run

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        results = collect_results(self.config)
        if not self.error and results:
            try:
                self._gate(session, results)
            except BaselineError as exc:
                self.error = f"baseline error: {exc}"
        if self.error:
            self.lines.append(self.error)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _gate(self, session: pytest.Session, results: dict[str, BenchmarkEntry]) -> None:
        if self.fingerprint is None:
            self._resolve()
        assert self.fingerprint is not None
        current = topology_id(self.fingerprint)
        opt = self.config.getoption
        if opt("baseline_save"):
            path = save_baseline(self.root, self.fingerprint, results, overwrite=opt("baseline_overwrite"))
            self.lines.append(f"saved {len(results)} benchmark(s) as the baseline of {current}: {path}")
            return
        if self.resolved is None:
            self.lines.append(
                f"no baseline for this topology ({current}) under {self.root}: nothing to compare; "
                "record one with --baseline-save"
            )
            return
        base = self.resolved.baseline
        self.baseline_path = base.path
        if self.resolved.foreign:
            self.lines.append(f"comparing with a baseline of another topology ({base.topology_id}), as asked")
        self.rows, missing = compare_all(base.benchmarks, results, self.min_effect)
        self.lines.append(f"compared with {base.path} (recorded {base.created}, commit {base.commit or '?'})")
        if missing:
            self.lines.append(f"{len(missing)} benchmark(s) have no baseline entry yet: {', '.join(missing)}")
        regressions = [name for name, v in self.rows if v.verdict == REGRESSION]
        if regressions and opt("fail_on_regression"):
            self.lines.append(f"FAILED: {len(regressions)} regression(s) (--fail-on-regression)")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        elif regressions:
            self.lines.append(
                f"{len(regressions)} regression(s); report mode: add --fail-on-regression to gate"
            )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.lines and not self.rows:
            return
        terminalreporter.section("collectives: baseline comparison")
        if self.rows:
            terminalreporter.write_line(format_table(self.rows))
        for line in self.lines:
            terminalreporter.write_line(line)
