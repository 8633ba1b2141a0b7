"""The CI gate: this run's benchmarks against the stored runs of this machine's topology.

Results come from pytest-benchmark's own session (distributed benchmarks feed it from the ranks, plain
ones time themselves), so every benchmark of the run is gated the same way. The rule lives in
statistics.py, the files in store.py (baseline_format.py, choosing.py), the text in report.py, the
topology in topology/; this module only wires them to the session: save, resolve, judge, measure the
flagged ones again, report, and set the exit status.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_collectives.bench import shim as benchmark_shim
from pytest_collectives.gate import report as gate_report
from pytest_collectives.gate.baseline_format import BaselineError, BenchmarkEntry, judged_statistic
from pytest_collectives.gate.choosing import ResolvedBaseline, recorded_fingerprints, resolve_baseline
from pytest_collectives.gate.settings import GateSettings
from pytest_collectives.gate.statistics import (
    DEFAULT_TOLERANCE,
    MACHINE_SLOWDOWN,
    MIN_RUNS,
    REGRESSION,
    GateResult,
    confirm,
    judge,
    reconfirmed,
    resting_on,
)
from pytest_collectives.gate.store import (
    DEFAULT_NAME,
    KEEP_RUNS,
    check_saveable,
    load_baseline,
    save_baseline,
    sittings,
)
from pytest_collectives.hookspecs import merged_answers
from pytest_collectives.topology.compare import described, looks_degraded, nearest
from pytest_collectives.topology.detect import detect
from pytest_collectives.topology.fingerprint import Fingerprint
from pytest_collectives.topology.identity import topology_id
from pytest_collectives.topology.links import TopologyError
from pytest_collectives.verdict import FAIL, NOT_JUDGED, PASS, STATUSES, TABLE, WARN, Check

SHOWN = 10  # names listed on the terminal; the Markdown and JSON reports list them all
# What the line naming the baseline says of each statistic the gate may judge (judged_statistic)
JUDGED = {
    "p05": "each benchmark's 5th-percentile round",
    "min": "each benchmark's fastest round (a run of the baseline was recorded before the 5th percentile was "
    "kept; the gate judges the 5th percentile once every run it keeps has it)",
    "median": "the median round (a run of the baseline was recorded before the fastest round was kept; the "
    "gate judges the 5th percentile once every run it keeps has it)",
}


def collect_results(config: pytest.Config) -> dict[str, BenchmarkEntry]:
    """Every benchmark pytest-benchmark recorded in this session, by its full test id."""
    results = {}
    for bench in benchmark_shim.session_results(config):
        if bench.stats.data:
            results[bench.fullname] = BenchmarkEntry.from_samples(
                bench.stats.data, bench.extra_info, bench.iterations
            )
    return results


def _names(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def baseline_name(name: str, dimensions: list[Mapping[str, object] | None]) -> str:
    """The baseline's file name: ``name``, then each dimension the pytest_collectives_baseline_key hook
    answered, ``+key=value`` in key order (``baseline+nccl_algo=Ring``); raises BaselineError for one that
    cannot be part of a file name, or a dimension two answers give."""
    try:
        merged = {k: str(v) for k, v in merged_answers("pytest_collectives_baseline_key", dimensions).items()}
    except ValueError as exc:
        raise BaselineError(str(exc)) from None
    for key, value in merged.items():
        if not (_DIMENSION.fullmatch(key) and _DIMENSION.fullmatch(value)):
            raise BaselineError(
                f"pytest_collectives_baseline_key: {key}={value!r}: use letters, digits, '.', '_' or '-' in "
                "keys and values (they become part of a file name)"
            )
    return name + "".join(f"+{key}={merged[key]}" for key in sorted(merged))


_DIMENSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class BaselineGate:
    def __init__(
        self, config: pytest.Config, settings: GateSettings, backend: str, gpus: int, can_remeasure: bool
    ) -> None:
        self.config, self.settings = config, settings
        self.backend, self.gpus = backend, gpus
        self.can_remeasure = can_remeasure  # under torchrun/srun every rank would have to rerun the test
        self.lines: list[str] = []
        self.result: GateResult | None = None
        self.statistic = "p05"  # of each benchmark's rounds: set from the baseline when judged
        self.outcome: list[str] = []  # what the gate decided, in a few words each: its closing verdict
        self.status: str | None = None  # the worst of its judgements (_judged_as), which the report renders
        self.fingerprint: Fingerprint | None = None
        self.resolved: ResolvedBaseline | None = None
        self.looked_up = False  # _resolve ran: `resolved` is the answer, None meaning no baseline
        self.error: str | None = None
        self.baseline_path: Path | None = None  # the baseline this run was compared with
        self.name = DEFAULT_NAME  # the baseline's file name under its topology id (set by _resolve)
        # the ids of the selected benchmarks; None: collection did not run here (xdist controller)
        self.benchmarks_selected: set[str] | None = None

    @property
    def rows(self) -> list[Any]:
        return [(r.name, r) for r in self.result.rows] if self.result else []

    def machine(self) -> Fingerprint:
        """This machine's fingerprint, detected once; what cannot be read is a usage error, not a crash."""
        if self.fingerprint is None:
            try:
                self.fingerprint = detect(self.backend, self.gpus)
            except TopologyError as exc:
                raise pytest.UsageError(f"topology detection: {exc}") from None
        return self.fingerprint

    def _resolve(self) -> None:
        """Detect the topology, find its baseline (to save: check where it goes); raises BaselineError."""
        settings = self.settings
        fingerprint = self.machine()
        self.looked_up = True
        self.name = baseline_name(
            settings.name, self.config.hook.pytest_collectives_baseline_key(config=self.config)
        )
        if settings.save:
            check_saveable(self.settings.root, fingerprint, settings.overwrite, self.name, settings.keep)
        if settings.judging_first:
            self.resolved = resolve_baseline(self.settings.root, fingerprint, settings.baseline, self.name)

    def collected(self, session: pytest.Session) -> None:
        # A bad baseline is found before minutes of benchmarks run, not after them (in SPMD mode, rank 0
        # alone gates and tells the other ranks: SpmdLauncher.pytest_collection_finish).
        self.benchmarks_selected = {
            item.nodeid for item in session.items if "benchmark" in getattr(item, "fixturenames", ())
        }
        if self.settings.benchmark_skip or self.settings.benchmark_disable or not self.benchmarks_selected:
            return
        try:
            self._resolve()
        except BaselineError as exc:
            self.error = f"baseline error: {exc}"
            return
        judging = self.settings.judging_first and self.settings.fail_on_regression
        if self.resolved is None and judging and not self.config.option.collectonly:
            # no baseline of this topology fails the gate whatever runs: say so now, not after a soak
            # (a collection alone judges nothing, and needs none)
            said = len(self.lines)
            self._no_baseline(self._missing())
            del self.lines[said:]  # where it does not fail (--allow-missing-baseline), it is said when judged

    def vetoes(self) -> bool:
        """Whether the tests must not run (nor a soak's passes): the baseline can't be used."""
        return bool(self.error)

    def finish(self, session: pytest.Session) -> None:
        if self.config.option.collectonly and not self.error:
            return  # nothing ran, so nothing is judged (a bad baseline found while collecting still fails)
        results = collect_results(self.config)
        if not self.error and results:
            try:
                self._gate(session, results)
            except BaselineError as exc:
                self.error = f"baseline error: {exc}"
        elif not self.error and self.settings.judging:
            self._no_silent_pass(f"no benchmark results to judge: {self._why_no_results()}")
        elif not self.error and self.settings.save:  # asked to record the machine, it recorded nothing
            why = self._why_no_results()
            self.error = f"gate error: no benchmark results to save (--baseline-save): {why}"
        elif not self.error and self.benchmarks_selected:  # (None on an xdist controller: not known there)
            self._judged_as(NOT_JUDGED, self._why_no_results())
        if self.error:
            self.lines.append(self.error)
        if self.lines and self.settings.judging_first:
            self._write_reports()

    def _why_no_results(self) -> str:
        if self.config.pluginmanager.hasplugin("dsession") or self.settings.under_xdist:
            return "pytest-benchmark does not time under pytest-xdist; run the gate without -n"
        if self.settings.benchmark_skip:
            return "--benchmark-skip skipped every benchmark"
        if self.settings.benchmark_disable:
            return "--benchmark-disable ran every benchmark once, untimed"
        if not self.benchmarks_selected:
            return "no selected test takes the benchmark fixture (check -k, -m and the paths)"
        selected = len(self.benchmarks_selected)
        return f"the {selected} selected benchmark(s) recorded no timing (skipped or failed)"

    def _no_silent_pass(self, why: str) -> None:
        self.error = (
            f"gate error: {why}, so --fail-on-regression cannot pass; pass --min-judged 0 to let such a "
            "run pass"
        )

    def _check_coverage(self, runs: list[dict[str, float]], result: GateResult) -> None:
        """Under --fail-on-regression, a run that judged a sliver of the baseline must not pass as a whole."""
        armed = {name for name in set().union(*runs) if sum(name in run for run in runs) >= MIN_RUNS}
        judged, known = len(result.judged), len(armed)
        if not armed or not self.settings.judging or judged >= self.settings.min_judged * known:
            return
        self._no_silent_pass(
            f"this run judged {judged} of the baseline's {known} benchmarks ({judged / known:.0%}), "
            f"fewer than --min-judged {self.settings.min_judged:g}; the others were not selected (-k, -m, "
            "paths), skipped or failed"
        )

    def _gate(self, session: pytest.Session, results: dict[str, BenchmarkEntry]) -> None:
        if not self.looked_up:
            self._resolve()
        if self.settings.judging_first:
            self._judge(session, results)
        if self.settings.save:
            self._save(session, results)

    def _save(self, session: pytest.Session, results: dict[str, BenchmarkEntry]) -> None:
        """Add this run to the baseline, unless something says the machine was not good while it ran."""
        why_not = (
            f"{session.testsfailed} test(s) failed"
            if session.testsfailed
            else "the gate failed it (--fail-on-regression)"
            if self.status == FAIL or self.error
            else None
        )
        if why_not:
            self.lines.append(
                f"not saved as a baseline run: {why_not}; a baseline records a machine known to be good"
            )
            self.outcome.append(f"not saved as a baseline run: {why_not}")
            return
        path, runs = save_baseline(
            self.settings.root,
            self.fingerprint,
            results,
            self.settings.overwrite,
            self.name,
            self.settings.keep,
        )
        more = MIN_RUNS - runs
        armed = f"; the gate judges from {MIN_RUNS}: record {more} more" if more > 0 else ""
        self.outcome.append(f"saved as run {runs} of the baseline {path}{armed}")
        self.lines.append(
            f"saved {len(results)} benchmark(s) as a run of the baseline of {topology_id(self.machine())}: "
            f"{path} ({runs} run(s) kept of {self.settings.keep or KEEP_RUNS}{armed})"
        )
        if runs > 1 and len(set(sittings(load_baseline(path).runs))) == 1:
            self.lines.append(
                f"warning: the baseline's {runs} runs come from one sitting (one boot, within an hour), "
                "so the gate cannot learn how far this machine drifts between sessions and keeps the "
                f"{DEFAULT_TOLERANCE:.0%} default machine-wide tolerance; add runs from other sessions "
                "or machines of this type"
            )

    def _judge(self, session: pytest.Session, results: dict[str, BenchmarkEntry]) -> None:
        if self.resolved is None:
            self._no_baseline(self._missing())
            return
        base = self.resolved.baseline
        self.baseline_path = base.path
        if self.resolved.foreign:
            self.lines.append(f"comparing with a baseline of another topology ({base.topology_id}), as asked")
        self.statistic = stat = judged_statistic(base.runs)
        runs = [{name: getattr(s, stat) for name, s in run.benchmarks.items()} for run in base.runs]
        now = {name: getattr(entry, stat) for name, entry in results.items()}
        self.result = result = self._judged(runs, now, sittings(base.runs))
        self._check_coverage(runs, result)
        self.lines.append(
            f"compared with {base.path}: {len(base.runs)} run(s), recorded {base.runs[0].created} to "
            f"{base.runs[-1].created}; judged on {JUDGED[stat]}"
        )
        result = self.result = self._measure_again(session, result, runs, now, sittings(base.runs))
        self._say_machine(result)
        unran = self._say_lists(result)
        regressions = result.flagged
        if not result.judged:
            self._unarmed(
                f"the baseline {base.path} holds fewer than {MIN_RUNS} runs of this run's benchmarks "
                f"({len(base.runs)} run(s) in all)"
            )
        for row in regressions:
            again = f", again {row.remeasured:.3f}x" if row.remeasured is not None else ""
            self.lines.append(
                f"REGRESSION {row.name}: {row.relative:.3f}x{again} "
                f"(between-run spread {row.spread:.1%}, machine factor {result.factor:.3f}x)"
            )
        for fam in result.slow_families:
            self.lines.append(
                f"FAMILY SLOWDOWN {fam.name}: its {fam.members} benchmarks ran {fam.relative:.3f}x slower "
                f"than the rest of this machine (between-run spread {fam.spread:.1%})"
            )
        verdicts = [f"{len(regressions)} confirmed regression(s)"] if regressions else []
        verdicts += [f"{len(unran)} benchmark(s) of the baseline that did not run"] if unran else []
        verdicts += [f"{len(result.slow_families)} family slowdown(s)"] if result.slow_families else []
        verdicts += ["a machine-wide slowdown"] if result.machine_wide else []
        if verdicts and self.settings.fail_on_regression:
            self.lines.append(f"FAILED: {' and '.join(verdicts)} (--fail-on-regression)")
            self._judged_as(FAIL, " and ".join(verdicts))
        elif verdicts:
            self.lines.append(f"{' and '.join(verdicts)}; report mode: add --fail-on-regression to gate")
            self._judged_as(WARN, " and ".join(verdicts) + " (report mode)")
        elif result.judged:
            self._judged_as(PASS, f"{len(result.judged)} benchmark(s) judged against {base.path}")

    def _missing(self) -> str:
        named = "" if self.name == DEFAULT_NAME else f", {self.name}.json"
        where = topology_id(self.machine())
        return f"no baseline for this topology ({where}{named}) under {self.settings.root}"

    def _judged(self, runs: list[dict[str, float]], now: dict[str, float], labels: list[int]) -> GateResult:
        """The rule (statistics.judge) at this session's threshold and tolerance."""
        return judge(runs, now, self.settings.min_effect, self.settings.tolerance, labels)

    def _no_baseline(self, why: str) -> None:
        """No baseline of this topology: what the nearest recorded machine says of this one. A node that
        lost hardware gets a new topology id, and must not pass as a machine never seen."""
        near = nearest(recorded_fingerprints(self.settings.root, self.name), self.machine())
        if near is None:
            self._unarmed(why)
            return
        what = f"the nearest recorded topology, {near.topology_id}, differs: {described(near.differences)}"
        if looks_degraded(near.differences):
            degraded = (
                f"{why}; {what}, so this node looks degraded (lost hardware fails whatever "
                "--allow-missing-baseline says); repair it, or, if the change is meant, record its baseline "
                "with --baseline-save"
            )
            if self.settings.fail_on_regression:
                self.error = f"baseline error: {degraded}"
            else:
                self.lines.append(f"DEGRADED? {degraded}")
                self._judged_as(WARN, f"{why}, and this node looks degraded ({near.topology_id} differs)")
            return
        if not any(d.lost for d in near.differences):
            what += f", none of which can be a fault: judge against it with `--baseline {near.topology_id}`"
        self._unarmed(f"{why}; {what}")

    def _unarmed(self, why: str) -> None:
        """No verdict is possible: under --fail-on-regression that is an error, unless opted out."""
        same = "<same arguments>" if not self.settings.save else "<same arguments, no --fail-on-regression>"
        record = f"`pytest {same} --baseline-save` ({MIN_RUNS} times, on a machine known to be good)"
        if self.settings.fail_on_regression and not self.settings.allow_missing:
            self.error = (
                f"baseline error: {why}, so nothing can be judged; record one with {record}, "
                f"or pass --allow-missing-baseline for a first run"
            )
        else:
            self.lines.append(f"{why}: nothing judged; record one with {record}")
            self._judged_as(NOT_JUDGED, f"{why}: nothing judged; record one with {record}")

    def _say_machine(self, result: GateResult) -> None:
        machine = result.machine
        if machine is None:
            self.lines.append(
                "too few benchmarks judged to estimate a machine factor: each is judged against the "
                "baseline directly"
            )
            return
        pace = "slower" if machine.factor >= 1 else "faster"
        times = machine.factor if machine.factor >= 1 else 1 / machine.factor
        self.lines.append(
            f"this machine ran {times:.2f}x {pace} than the baseline across {machine.compared} benchmarks; "
            "each benchmark is judged relative to that"
        )
        if machine.learned:
            source = (
                f"learned from the baseline's {machine.sittings} sittings, whose factors differ by "
                f"{machine.spread:.1%}"
            )
        elif self.settings.tolerance is not None:
            source = "set by --machine-tolerance"
        else:
            source = (
                f"the default: the baseline's runs come from {machine.sittings} sitting, which cannot show "
                "how far this machine drifts between sessions; add a run from another session"
            )
        self.lines.append(f"machine-wide tolerance {machine.tolerance:.0%} ({source})")
        if machine.sittings < 2:
            self.lines.append(
                "no family of benchmarks judged: how far one op drifts against the rest between sessions "
                "cannot be learned from one sitting; add a run from another session"
            )
        if machine.verdict == MACHINE_SLOWDOWN:
            self.lines.append(
                f"MACHINE-WIDE SLOWDOWN: every benchmark ran {machine.factor:.2f}x slower, beyond the "
                f"{machine.tolerance:.0%} tolerance: a driver, library or configuration change?"
            )

    def _say_lists(self, result: GateResult) -> list[str]:
        """Say what was not judged, and return the baseline's benchmarks that this run selected and that
        recorded no timing: failed, skipped, or their configuration never started. Each is a failure of
        the gate, as a regression is (a backend that cannot run a benchmark is not healthy); one that was
        not selected (-k, -m, paths) is a note, weighed by --min-judged."""
        unpromised = sorted(result.unpromised, key=lambda r: -r.detectable)
        if unpromised:
            worst = unpromised[0]
            self.lines.append(
                f"{len(unpromised)} of {len(result.rows)} benchmark(s) can't promise to catch a "
                f"{result.threshold:.0%} slowdown at their between-run spread (worst {worst.name}: "
                f"detects >= {worst.detectable:.0%}); more rounds (--benchmark-max-time), more baseline "
                "runs or a quieter machine narrow it"
            )
        selected = self.benchmarks_selected or set()
        unran = [name for name in result.missing if name in selected]
        unselected = [name for name in result.missing if name not in selected]
        if unran:
            self.lines.append(
                f"DID NOT RUN: {len(unran)} benchmark(s) of the baseline were selected and recorded no "
                f"timing (failed, skipped, or their configuration did not start): {_names(unran)}"
            )
        if unselected:
            self.lines.append(
                f"{len(unselected)} benchmark(s) in the baseline were not selected: {_names(unselected)}"
            )
        if result.new:
            self.lines.append(f"{len(result.new)} benchmark(s) have no baseline yet: {_names(result.new)}")
        return unran

    def _measure_again(
        self,
        session: pytest.Session,
        result: GateResult,
        runs: list[dict[str, float]],
        now: dict[str, float],
        labels: list[int],
    ) -> GateResult:
        """Run what each failing verdict rests on once more; only a verdict seen twice stands (a flagged
        benchmark by confirm, a family or machine-wide slowdown by judging the second measurements)."""
        from _pytest.runner import runtestprotocol

        names = resting_on(result)
        if not names:
            return result
        if not self.can_remeasure:
            self.lines.append(
                f"{len(names)} benchmark(s) behind a failing verdict not measured again: under torchrun/srun "
                "every rank would have to rerun them; the first measurement stands"
            )
            return result
        recorded = benchmark_shim.session_results(self.config)
        items = {item.nodeid: item for item in session.items}
        second: dict[str, float] = {}
        for name in names:
            item, before = items.get(name), len(recorded)
            if item is not None:
                runtestprotocol(item, nextitem=None, log=False)
            again = [b for b in recorded[before:] if b.fullname == name and b.stats.data]
            del recorded[before:]  # pytest-benchmark's table and JSON keep the first measurement
            if again:
                second[name] = getattr(BenchmarkEntry.from_samples(again[-1].stats.data), self.statistic)
        flagged = result.flagged
        rows = list(result.rows)
        for row in flagged:
            if row.name not in second:
                self.lines.append(f"{row.name}: could not be measured again; the first measurement stands")
                continue
            confirmed = confirm(row, second[row.name], result.factor, len(flagged), result.threshold)
            rows[rows.index(row)] = confirmed
        result = dataclasses.replace(result, rows=rows)
        if not (result.slow_families or result.machine_wide):
            return result
        kept = reconfirmed(result, self._judged(runs, {**now, **second}, labels))
        gone = [f"family {f.name}" for f in result.slow_families if f not in kept.slow_families]
        if result.machine_wide and not kept.machine_wide:
            gone.append(f"a machine-wide slowdown ({result.factor:.2f}x)")
        if gone:
            self.lines.append(
                f"not seen again when measured a second time, so not a verdict: {', '.join(gone)}"
            )
        return kept

    def _write_reports(self) -> None:
        status = next((check.status for check in self.checks()), NOT_JUDGED)  # as the closing verdicts say
        text = gate_report.markdown(self.result, self.lines, status)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(text)
        directory = self.settings.report_dir
        if not directory:
            return
        data = gate_report.to_json(
            self.result,
            self.lines,
            status,
            topology_id=topology_id(self.fingerprint) if self.fingerprint else None,
            baseline=str(self.baseline_path) if self.baseline_path else None,
            statistic=self.statistic,  # what the *_median_s figures hold: the judged statistic of the rounds
        )
        try:
            out = Path(directory)
            out.mkdir(parents=True, exist_ok=True)
            (out / "gate.md").write_text(text, encoding="utf-8")
            (out / "gate.json").write_text(
                json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8"
            )
        except OSError as exc:
            self.lines.append(f"gate report not written to {directory}: {exc.strerror}")

    def _judged_as(self, status: str, words: str) -> None:
        """One judgement of the gate's, in its closing line; the worst of them is its status."""
        self.outcome.append(words)
        if self.status is None or STATUSES.index(status) > STATUSES.index(self.status):
            self.status = status

    def checks(self) -> list[Check]:
        """The gate's one check (judge_gate); none where it had nothing to say."""
        foreign = self.resolved.baseline.topology_id if self.resolved and self.resolved.foreign else None
        return judge_gate(self.error, self.status, self.outcome, self.rows, foreign)

    def summary(self, terminalreporter: Any) -> None:
        if not self.lines and not self.rows:
            return
        terminalreporter.section("collectives: baseline comparison")
        if self.result and self.result.rows:
            terminalreporter.write_line(gate_report.format_table(self.result.rows))
        for line in self.lines:
            terminalreporter.write_line(line)


def judge_gate(
    error: str,
    status: str | None,
    outcome: Sequence[str],
    rows: Sequence[tuple[str, Any]],
    foreign: str | None,
) -> list[Check]:
    """The gate's one check: FAIL with its ``error`` (a baseline it could not use), else the worst of its
    judgements (``status``; NOT JUDGED where it only saved, or did not), in the words of each (``outcome``),
    naming another topology's baseline where it judged against one (``foreign``, --baseline); the
    benchmarks it found slower (``rows``: name and comparison) are a table. None where it said nothing."""
    words = error or "; ".join(outcome)
    if not words:
        return []
    if foreign and not error:
        words = f"judged against a baseline of another topology ({foreign}), as asked: {words}"
    slower = sorted((-v.ratio, name) for name, v in rows if v.verdict == REGRESSION)  # slowest first
    details: dict[str, Any] = {"compared": len(rows)}
    if slower:
        listed = [[name, f"{-ratio:.2f}x"] for ratio, name in slower]
        details[TABLE] = {"columns": ["Benchmark", "Time now / baseline"], "rows": listed}
    return [Check("performance gate", FAIL if error else status or NOT_JUDGED, words, details)]
