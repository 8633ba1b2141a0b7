"""The capability matrix a conformance run produces: operation x dtype x reduce op -> PASS, FAIL, N/A.

N/A comes from the probe alone (the backend refused the call at every world size probed). PASS and FAIL
come from the examples that ran: an example whose drawn case names cells (its ``cells()``) counts for each
of them. A cell the backend supports that no example drew is ``untested``, never PASS: a vendor reads a
PASS as "this ran and was right". Written to the terminal, as JSON (``--capability-json``) and as Markdown
appended to ``$GITHUB_STEP_SUMMARY`` when that is set.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_collectives.atomic import write_atomic
from pytest_collectives.backend_declarations import backend_version
from pytest_collectives.conformance import known_bugs, rotation, tiers
from pytest_collectives.conformance.cells import FAIL, KNOWN, NA, PASS, STATUSES, UNTESTED, short_dtype
from pytest_collectives.conformance.judging import judge_conformance
from pytest_collectives.conformance.mismatches import SILENT
from pytest_collectives.conformance.mismatches import WHAT as MISMATCHED
from pytest_collectives.conformance.settings import ConformanceSettings
from pytest_collectives.execution import configurations, left_out
from pytest_collectives.execution.examples import KNOWN as KNOWN_EXAMPLE
from pytest_collectives.execution.provenance import provenance
from pytest_collectives.execution.reproductions import reproductions_in
from pytest_collectives.execution.tally import Tally
from pytest_collectives.verdict import Check

if TYPE_CHECKING:  # the plugin loads with pytest, before the forkserver: torch comes with the first probe
    from pytest_collectives.conformance.capabilities import Capabilities, Cell

AS_TORCH = "as torch"  # capabilities.AS_TORCH: this module loads before torch
_MARK = {PASS: "P", FAIL: "F", KNOWN: "K", NA: ".", UNTESTED: "-"}


@dataclasses.dataclass
class _Tally:
    passed: int = 0
    failed: int = 0
    known: int = 0  # failed examples of a test a known-bug manifest expects to fail
    first_failure: str = ""  # the test (and world size) of the first failing example
    known_bug: str = ""  # the manifest's reason for the first known one
    largest: int = 0  # the most elements an example that passed had (the sweeps' large tiers rotate)
    test: str = ""  # the node id of the first failing or known example: its reproductions are the cell's


class CapabilityMatrix:
    """Collects probes and example verdicts over a session; a pytest plugin for its outputs."""

    def __init__(
        self,
        config: pytest.Config,
        backend: str,
        settings: ConformanceSettings = ConformanceSettings(),  # noqa: B008 - frozen: one is as good as any
        worker: bool = False,
        outcomes: Tally | None = None,
    ) -> None:
        self.config = config
        # the run's one count of outcomes (the session's): whether a conformance test ran is read there
        self.outcomes = outcomes if outcomes is not None else Tally()
        self.settings = settings
        self.backend = backend
        self.worker = worker  # a pytest-xdist worker: hands its tallies to the controller, writes nothing
        # keyed by configuration (--backend-env's id; "" in a plain run) and world size, or cell
        self.probes: dict[tuple[str, int], Capabilities] = {}
        self.tallies: dict[tuple[str, Cell], _Tally] = {}
        self.rejected: dict[str, str] = {}  # configuration -> the backend's words refusing it
        # Conformance tests collected and selected: the matrix and its verdicts belong to runs that have
        # them. A perf-only run probes groups too (the registered algorithms' benchmarks), and must not
        # be judged, or even reported, as a conformance run.
        self.selected = 0
        # conformance tests that failed or errored (in any phase), cells or not: kept where the reports
        # arrive (an xdist controller hears its workers' too), not merged
        self.failed: set[str] = set()
        self.mismatches: dict[tuple[str, str, int], str] = {}  # (operation, kind, world size): behaviour
        # failures in another backend's refusal words, where this backend declares none: (that backend,
        # the first such line) and how many (capabilities.resembles)
        self.resembling: dict[str, tuple[str, int]] = {}
        # the standalone reproductions each failed or known-bug test named, by node id: kept where the
        # reports arrive (an xdist controller hears its workers' too), not merged
        self.reproductions: dict[str, list[str]] = {}
        self.known_fired: set[str] = set()  # conformance tests a known bug failed as expected (xfailed)

    def add_probe(self, capabilities: Capabilities, configuration: str = "") -> None:
        self.probes[configuration, capabilities.world_size] = capabilities

    def pytest_collectives_configuration_rejected(self, configuration: str, words: str) -> None:
        self.rejected[configuration] = words

    def worker_input(self) -> dict[str, int]:
        """What an xdist controller hands each worker: the run's one turn of the sweeps' rotation."""
        return {rotation.WORKER_INPUT: rotation.of_run(self.config)}

    def configurations(self) -> list[str]:
        """The configurations that ran (probed, or rejected), in the order they first did."""
        seen = [c for c, _ in self.probes] + list(self.rejected)
        return list(dict.fromkeys(seen))

    def add_mismatch(self, operation: str, kind: str, world_size: int, behaviour: str) -> None:
        """How ``operation`` ended with a ``kind`` (dtype, shape) differing between ranks (mismatches.py)."""
        self.mismatches[operation, kind, world_size] = behaviour

    def pytest_collectives_call_done(
        self, item: pytest.Item, world_size: int, kwargs: dict[str, Any], verdict: str
    ) -> None:
        if verdict not in ("passed", "failed", KNOWN_EXAMPLE):
            return
        bugs = known_bugs.expected(item)
        configuration = configurations.of_item(item).id
        for value in kwargs.values():
            for cell in getattr(value, "cells", lambda: ())():
                tally = self.tallies.setdefault((configuration, cell), _Tally())
                if verdict == "passed":
                    tally.passed += 1
                    tally.largest = max(tally.largest, getattr(value, "size", 0))
                elif bugs:  # the test fails the run if this is not the bug (known_bugs)
                    tally.known += 1
                    tally.known_bug = tally.known_bug or bugs[0].reason
                    tally.test = tally.test or item.nodeid
                else:
                    tally.failed += 1
                    tally.first_failure = tally.first_failure or f"{item.nodeid} ({world_size} ranks)"
                    tally.test = tally.test or item.nodeid

    def _of(self, configuration: str | None) -> tuple[dict[Cell, _Tally], list[Capabilities]]:
        """The tallies (summed over configurations) and probes of one configuration, or of all (None)."""
        tallies: dict[Cell, _Tally] = {}
        for (where, cell), tally in self.tallies.items():
            if configuration is None or where == configuration:
                tallies[cell] = _added(tallies.get(cell, _Tally()), tally)
        probes = [caps for (where, _), caps in self.probes.items() if configuration in (None, where)]
        return tallies, probes

    def rows(self, configuration: str | None = None) -> list[dict[str, Any]]:
        """One row per cell, probed or exercised, sorted: operation, dtype, reduce op, status, counts; of
        one configuration of --backend-env, or of the run (a cell FAIL in one configuration FAILs)."""
        tallies, probes = self._of(configuration)
        cells = set(tallies)
        for caps in probes:
            cells.update(caps.cells)
        order = {name: i for i, name in enumerate(_dtype_names())}
        rows = []
        for cell in sorted(cells, key=lambda c: (c[0], c[2], order.get(c[1], 99), c[1])):
            tally = tallies.get(cell, _Tally())
            # a cell only some world sizes have (a 2-D mesh) is judged where it exists
            reasons = [caps.cells[cell] for caps in probes if cell in caps.cells]
            refused = [r for r in reasons if r]
            withheld = [caps.withheld[cell] for caps in probes if cell in caps.withheld]
            known_bug = tally.known_bug or next(iter(withheld), "")
            if tally.failed:
                status = FAIL
            elif tally.known or withheld:
                status = KNOWN
            elif tally.passed:
                status = PASS
            elif refused and len(refused) == len(reasons):
                status = NA
            else:
                status = UNTESTED
            row = {"operation": cell[0], "dtype": cell[1], "reduce_op": cell[2], "status": status}
            row.update(passed=tally.passed, failed=tally.failed, known=tally.known)
            if status == NA:
                row["reason"] = refused[0]
            if known_bug:
                row["known_bug"] = known_bug
            if tally.first_failure:
                row["first_failure"] = tally.first_failure
            if tally.largest:
                row["largest"] = tally.largest
            if status in (FAIL, KNOWN) and self.reproductions.get(tally.test):
                row["reproductions"] = self.reproductions[tally.test]
            rows.append(row)
        return rows

    def document(self) -> dict[str, Any]:
        rows = self.rows()
        # as the ranks read them (the probes), each different one named; pytest's own where none did
        ran = [caps for caps in self.probes.values() if caps.backend_version]
        doc = {
            "backend": self.backend,
            "backend_version": "; ".join(sorted({c.backend_version for c in ran}))
            or backend_version(self.backend),
            "torch": "; ".join(sorted({c.torch_version for c in ran})) or _torch().__version__,
            "world_sizes": sorted({n for _, n in self.probes}),
            # what a vendor files: each failed or known-bug test, with the scripts it wrote
            "failing_tests": [
                {"test": test, "status": status, "reproductions": self.reproductions.get(test, [])}
                for status, tests in ((FAIL, self.failed), (KNOWN, self.known_fired - self.failed))
                for test in sorted(tests)
            ],
            "cells": rows,
        }
        decided = {n: caps for (_, n), caps in sorted(self.probes.items()) if caps.tier_decided}
        if decided:  # whether every cell ran at 1 Mi at each world size, and what decided it
            measured = any(caps.large_example_s is not None for caps in decided.values())
            doc["size_tiers"] = {
                "budget_s": self.settings.tier_budget_s,  # None where the topology decided
                **({"draw_ms": tiers.DRAW_S * 1e3} if measured else {}),
                "world_sizes": [_tier_row(n, caps) for n, caps in decided.items()],
            }
        if self.configurations() != [""]:  # --backend-env: each configuration's cells, and what differs
            # rejected at every world size it met; one probed somewhere has its cells there
            probed = {where for where, _ in self.probes}
            rejected = {c: words for c, words in self.rejected.items() if c not in probed}
            each = {c: self.rows(c) for c in self.configurations() if c not in rejected}
            doc["configurations"] = [
                {"backend_env": c, "rejected": rejected[c]} if c in rejected
                else {"backend_env": c, "cells": each[c]}
                for c in self.configurations()
            ]  # fmt: skip
            doc["differences"] = differences(each)
        stacks = training_verdicts(rows)
        doc = {**doc, "training": stacks} if stacks else doc
        semantics = self.semantics()
        doc = {**doc, "semantics": semantics} if semantics else doc
        mismatches = [
            {"operation": o, "kind": k, "world_size": n, "behaviour": b}
            for (o, k, n), b in sorted(self.mismatches.items())
        ]
        return {**doc, "mismatches": mismatches} if mismatches else doc

    def semantics(self) -> list[dict[str, Any]]:
        """What all_reduce made of NaN and +-inf, one row per (reduce op, value, dtype), over the world
        sizes probed (``capabilities.exceptional_semantics``)."""
        seen: dict[tuple[str, str, str, str], dict[int, str]] = {}
        for (_, n), caps in sorted(self.probes.items()):
            for key, behaviour in caps.semantics.items():
                seen.setdefault(key, {})[n] = behaviour
        rows = []
        for (operation, dtype, op, value), by_size in sorted(seen.items()):
            kinds = set(by_size.values())
            each = "; ".join(f"{n} ranks: {b}" for n, b in by_size.items())
            row = {"operation": operation, "dtype": dtype, "reduce_op": op, "value": value}
            rows.append({**row, "behaviour": kinds.pop() if len(kinds) == 1 else each})
        return rows

    def collected(self, session: pytest.Session) -> None:
        # a perf-only run asked for by --benchmark-only selects no conformance test, as one of suites/perf
        self.selected = sum(
            item.get_closest_marker("conformance") is not None and not left_out.why(item)
            for item in session.items
        )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "conformance" not in report.keywords:
            return
        if report.failed:
            self.failed.add(report.nodeid)
        if report.skipped and hasattr(report, "wasxfail"):
            self.known_fired.add(report.nodeid)
        named = reproductions_in(report.longreprtext + getattr(report, "wasxfail", ""))
        if named:
            held = self.reproductions.setdefault(report.nodeid, [])
            held += [path for path in named if path not in held]
        if report.when == "call" and report.failed:
            from pytest_collectives.backend_declarations import resembles

            found = resembles(report.longreprtext, self.backend)
            if found:
                line, count = self.resembling.get(found[0], (found[1], 0))
                self.resembling[found[0]] = (line, count + 1)

    def reports(self) -> bool:
        """Whether this run has a matrix to report: a group was probed for conformance tests selected (or
        for the cross-rank mismatches, which report here)."""
        return bool((self.selected or self.mismatches) and self.probes)

    def checked_nothing(self) -> bool:
        """Whether conformance tests were selected and none ran: every one N/A or skipped, so no cell was
        tried. Such a run proves nothing and must not pass."""
        return (
            self.reports()
            and not self.outcomes.conformance.judged
            and not any(t.passed or t.failed for t in self.tallies.values())
        )

    def finish(self, session: pytest.Session) -> None:
        if self.worker:
            self.config.workeroutput["collectives_matrix"] = self.export()  # type: ignore[attr-defined]

    def export(self) -> dict[str, Any]:
        """The probes and tallies as plain data: what an xdist worker hands its controller (``merge``)."""
        return {
            "probes": [
                {
                    "configuration": configuration,
                    "backend": c.backend,
                    "device_type": c.device_type,
                    "world_size": c.world_size,
                    "cells": [[*cell, reason] for cell, reason in c.cells.items()],
                    "withheld": [[*cell, reason] for cell, reason in c.withheld.items()],
                    "semantics": [[*key, behaviour] for key, behaviour in c.semantics.items()],
                    "tiers": [
                        c.timed, c.ranks_a_core, c.large_example_s, c.draw_s, c.large_cells,
                        c.whole_large_tier,
                    ],  # fmt: skip
                    "versions": [c.backend_version, c.torch_version],
                }
                for (configuration, _), c in self.probes.items()
            ],
            "tallies": [[where, *cell, dataclasses.asdict(t)] for (where, cell), t in self.tallies.items()],
            "rejected": self.rejected,
            "selected": self.selected,
            "mismatches": [[*key, behaviour] for key, behaviour in self.mismatches.items()],
            "resembling": [[like, line, count] for like, (line, count) in self.resembling.items()],
        }

    def merge(self, exported: dict[str, Any]) -> None:
        """Add a worker's ``export()``: the controller's matrix is then the serial run's."""
        from pytest_collectives.conformance.capabilities import Capabilities

        for probe in exported["probes"]:
            cells, withheld = ({(o, d, r): why for o, d, r, why in probe[k]} for k in ("cells", "withheld"))
            semantics = {(o, d, r, v): what for o, d, r, v, what in probe["semantics"]}
            timed, sharing, took, draw, most, whole = probe["tiers"]
            version, torch_version = probe["versions"]
            caps = Capabilities(
                probe["backend"], probe["device_type"], probe["world_size"], cells, withheld, semantics,
                timed=timed, ranks_a_core=sharing, large_example_s=took, draw_s=draw, large_cells=most,
                whole_large_tier=whole, backend_version=version, torch_version=torch_version,
            )  # fmt: skip
            held = self.probes.get((probe["configuration"], caps.world_size))
            self.add_probe(_turned_first(held, caps), probe["configuration"])
        for where, operation, dtype, op, counts in exported["tallies"]:
            key = (where, (operation, dtype, op))
            self.tallies[key] = _added(self.tallies.get(key, _Tally()), _Tally(**counts))
        self.rejected.update(exported["rejected"])
        self.selected = max(self.selected, exported["selected"])  # each worker collects the whole run
        self.mismatches.update(((o, k, n), b) for o, k, n, b in exported["mismatches"])
        for like, line, count in exported["resembling"]:
            line, before = self.resembling.get(like, (line, 0))
            self.resembling[like] = (line, before + count)

    def checks(self) -> list[Check]:
        """The conformance run's check (conformance.judging); none where no conformance test ran."""
        if not self.reports() or self.worker:
            return []
        return [judge_conformance(self.document(), self.checked_nothing())]

    def summary(self, terminalreporter: Any) -> None:
        if not self.reports() or self.worker:
            return
        doc = self.document()
        terminalreporter.section("capability matrix")
        # a sweep's block per configuration (below) replaces the run's
        for line in grid(doc, _MARK, sep=" ")[: 1 if "configurations" in doc else None]:
            terminalreporter.write_line(line)
        for each in doc.get("configurations", []):
            if "rejected" in each:
                said = f"rejected by {self.backend} ({each['rejected']}); its tests N/A"
                terminalreporter.write_line(f"with {each['backend_env']}: {said}")
                continue
            terminalreporter.write_line(f"with {each['backend_env']}:")
            for line in grid({**doc, "cells": each["cells"]}, _MARK, sep=" ")[1:]:
                terminalreporter.write_line("  " + line)
        for row in doc.get("differences", []):
            terminalreporter.write_line(row["line"], red=FAIL in row["statuses"].values())
        turn = rotation.taken(self.config)
        # the tiers' lines where a tensor cell was tried (not an object collective's, nor a barrier's)
        tried = any(r["dtype"] != "-" and r["status"] in (PASS, FAIL, KNOWN) for r in doc["cells"])
        if turn is not None and tried:
            terminalreporter.write_line(rotation_line(turn, doc["world_sizes"], doc.get("size_tiers")))
            terminalreporter.write_line(tiers_line(doc["cells"]))
        for stack, verdict in doc.get("training", {}).items():
            terminalreporter.write_line(f"{stack}: {verdict}", red=verdict.startswith(FAIL))
        for line in semantics_lines(doc.get("semantics", [])) + mismatch_lines(doc.get("mismatches", [])):
            terminalreporter.write_line(line)
        if self.settings.before is not None:
            changed = changes(self.settings.before, doc)
            said = f"compared with {self.settings.compare_with}: {len(changed)} cell(s) changed"
            terminalreporter.write_line(said + ":" * bool(changed))
            for line in changed:
                terminalreporter.write_line(f"  {line}", red="-> FAIL" in line)
        for like, (line, count) in self.resembling.items():
            terminalreporter.write_line(
                f"{count} failure(s) raised {like}'s refusal words ({line!r}), and {self.backend} declares "
                f"no refusal words of its own, so they are failures, not N/A. If {self.backend} refuses "
                f"these calls as {like} does, declare it in its backend module: "
                f'refuses("{self.backend}", like="{like}") (from pytest_collectives import refuses)',
                yellow=True,
            )
        path = self.settings.capability_json
        if path:
            recorded = {**doc, "run": provenance(self.config)}  # what ran, to run it again
            write_atomic(Path(path), json.dumps(recorded, indent=1, sort_keys=True) + "\n")
            terminalreporter.write_line(f"capability matrix written to {path}")
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            with open(summary, "a", encoding="utf-8") as out:
                out.write(markdown(doc))


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per cell whose status changed from ``before`` to ``after`` (each a --capability-json
    document), per configuration where both ran the same ones: "all_reduce float32 sum: PASS -> FAIL". A
    cell untested in either is no change: which cells a run draws differs."""

    def sheets(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        each = {c["backend_env"]: c.get("cells", []) for c in doc.get("configurations", [])}
        return each or {"": doc["cells"]}

    old, new = sheets(before), sheets(after)
    if set(old) != set(new):  # not the same configurations: the runs' whole matrices
        old, new = {"": before["cells"]}, {"": after["cells"]}
    lines = []
    for configuration, rows in new.items():
        was = {_cell(r): r["status"] for r in old[configuration]}
        now = {_cell(r): r["status"] for r in rows}
        for cell in sorted(was.keys() | now.keys()):
            first, then = was.get(cell, "not probed"), now.get(cell, "not probed")
            if first != then and UNTESTED not in (first, then):
                where = f" with {configuration}" if configuration else ""
                lines.append(f"{_named(cell)}{where}: {first} -> {then}")
    return lines


def _cell(row: dict[str, Any]) -> tuple[str, str, str]:
    return row["operation"], row["dtype"], row["reduce_op"]


def _named(cell: tuple[str, str, str]) -> str:
    """"all_reduce float32 sum", "broadcast int8": a cell in a line, its "-" left out."""
    return " ".join(part for part in cell if part != "-")


def _added(first: _Tally, second: _Tally) -> _Tally:
    """Two tallies of a cell as one (two configurations', two xdist workers')."""
    return _Tally(
        passed=first.passed + second.passed,
        failed=first.failed + second.failed,
        known=first.known + second.known,
        first_failure=first.first_failure or second.first_failure,
        known_bug=first.known_bug or second.known_bug,
        largest=max(first.largest, second.largest),
        test=first.test or second.test,
    )


def differences(each: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The cells whose status differs between configurations (untested where drawn elsewhere is no
    difference: the draws differ), each with a line: "all_reduce float32 sum FAILs only with
    ACME_PROTO=LL128 (PASS with ACME_PROTO=LL)"."""
    statuses: dict[tuple[str, str, str], dict[str, str]] = {}
    for configuration, rows in each.items():
        for r in rows:
            if r["status"] != UNTESTED:
                statuses.setdefault(_cell(r), {})[configuration] = r["status"]
    found = []
    for cell, by_configuration in sorted(statuses.items()):
        if len(set(by_configuration.values())) < 2:
            continue
        grouped: dict[str, list[str]] = {}
        for configuration, status in by_configuration.items():
            grouped.setdefault(status, []).append(configuration)
        name = _named(cell)
        if FAIL in grouped:
            others = "; ".join(f"{s} with {', '.join(c)}" for s, c in grouped.items() if s != FAIL)
            line = f"{name} FAILs only with {', '.join(grouped[FAIL])} ({others})"
        else:
            line = f"{name} differs: " + "; ".join(f"{s} with {', '.join(c)}" for s, c in grouped.items())
        row = {"operation": cell[0], "dtype": cell[1], "reduce_op": cell[2]}
        found.append({**row, "statuses": by_configuration, "line": line})
    return found


# The training stacks' rows (conformance/training/), each read as one verdict.
TRAINING_STACKS = {
    "fsdp2": "FSDP2",
    "tensor_parallel": "tensor parallel",
    "functional": "functional collectives",
    "dtensor_redistribute": "DTensor redistribute",
}
_WORST_FIRST = (FAIL, KNOWN, UNTESTED, PASS)


def training_verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """One line per training stack a run probed: "PASS", "FAIL (1 of 2 N/A)", for DTensor's placement
    pairs "182 of 272 placement pairs PASS, 90 N/A", or "N/A: why" where one reason rules out them all."""
    verdicts = {}
    for operation, label in TRAINING_STACKS.items():
        stack = [r for r in rows if r["operation"].split(" ")[0] == operation]
        if not stack:
            continue
        statuses = [r["status"] for r in stack]
        count = {status: statuses.count(status) for status in STATUSES}
        reasons = {r.get("reason") for r in stack}
        if count[NA] == len(statuses) and len(reasons) == 1:
            verdicts[label] = f"{NA}: {reasons.pop()}"
            continue
        if operation == "dtensor_redistribute":
            others = [f"{count[s]} {s}" for s in (FAIL, KNOWN, NA, UNTESTED) if count[s]]
            verdicts[label] = ", ".join([f"{count[PASS]} of {len(statuses)} placement pairs PASS", *others])
            continue
        worst = next((s for s in _WORST_FIRST if count[s]), NA)
        na = f" ({count[NA]} of {len(statuses)} N/A)" if count[NA] and worst != NA else ""
        verdicts[label] = worst + na
    return verdicts


def grid(doc: dict[str, Any], marks: dict[str, str], sep: str) -> list[str]:
    """The matrix as rows of (operation, reduce op) and a column per dtype, in ``marks``' symbols."""
    dtypes = [d for d in _dtype_names() if any(r["dtype"] == d for r in doc["cells"])]
    by_row: dict[tuple[str, str], dict[str, str]] = {}

    def passed(tier: str) -> str:  # P64K in the terminal's narrow columns, PASS 64K in a report
        return marks[PASS] + (tier if len(marks[PASS]) == 1 else f" {tier}") * bool(tier)

    for row in doc["cells"]:
        mark = passed(tier_of(row.get("largest", 0))) if row["status"] == PASS else marks[row["status"]]
        by_row.setdefault((row["operation"], row["reduce_op"]), {})[row["dtype"]] = mark
    width = max([len(f"{o} {r}") for o, r in by_row] + [10])
    head = f"{doc['backend']} ({doc['backend_version']}), torch {doc['torch']}, world sizes "
    legend = ", ".join(f"{mark} {status}" for status, mark in marks.items())
    legend += f"; {passed(tier_of(1 << 20))}, {passed(tier_of(1 << 16))}: passed at 1 Mi, 64 Ki elements too"
    lines = [head + ",".join(map(str, doc["world_sizes"])) + f"; {legend}"]
    lines.append(sep.join([f"{'operation op':<{width}}", *(f"{short_dtype(d):>4}" for d in dtypes)]))
    for (operation, op), cells in sorted(by_row.items()):
        name = operation if op == "-" else f"{operation} {op}"
        lines.append(sep.join([f"{name:<{width}}", *(f"{cells.get(d, ''):>4}" for d in dtypes)]))
    return lines


def markdown(doc: dict[str, Any]) -> str:
    lines = grid(
        doc, {PASS: "PASS", FAIL: "**FAIL**", KNOWN: "known bug", NA: "N/A", UNTESTED: "-"}, sep=" | "
    )
    title, head, rows = lines[0], lines[1], lines[2:]
    rule = " | ".join("---" for _ in head.split(" | "))
    failures = [r for r in doc["cells"] if r["status"] == FAIL]
    text = [f"### Capability matrix: {title}", "", f"| {head} |", f"| {rule} |"]
    text += [*(f"| {r} |" for r in rows), ""]
    for r in failures:
        text.append(f"- FAIL {r['operation']} {r['dtype']} {r['reduce_op']}: {r['first_failure']}")
    for r in (r for r in doc["cells"] if r["status"] == KNOWN):
        text.append(f"- known bug {r['operation']} {r['dtype']} {r['reduce_op']}: {r['known_bug']}")
    text += [f"- {stack}: {verdict}" for stack, verdict in doc.get("training", {}).items()]
    extra = semantics_lines(doc.get("semantics", [])) + mismatch_lines(doc.get("mismatches", []))
    text += [f"- {line.strip()}" for line in extra]
    return "\n".join(text) + "\n"


def semantics_lines(rows: list[dict[str, Any]]) -> list[str]:
    """How many (reduce op, value, dtype) gave what torch gives, and each that did not, its dtypes
    together: the backend's semantics of NaN and +-inf, which a vendor reads, not failures."""
    if not rows:
        return []
    same = sum(r["behaviour"] == AS_TORCH for r in rows)
    lines = [
        f"NaN and +-inf in all_reduce: {same} of {len(rows)} (reduce op, value, dtype) as torch on one "
        "process" + (", not the others (the backend's semantics, not failures):" if same < len(rows) else "")
    ]
    differ: dict[tuple[str, str, str, str], list[str]] = {}
    for r in (r for r in rows if r["behaviour"] != AS_TORCH):
        differ.setdefault((r["operation"], r["reduce_op"], r["value"], r["behaviour"]), []).append(r["dtype"])
    for (operation, op, value, behaviour), dtypes in sorted(differ.items()):
        lines.append(f"  {operation} {op} {value}: {behaviour} ({' '.join(map(short_dtype, dtypes))})")
    return lines


def tier_of(largest: int) -> str:
    """The size tier a cell's largest passing example reached, as the matrix marks it: 1M, 64K or none."""
    from pytest_collectives.conformance.cases import TIERS  # hypothesis' strategies: not at import

    return "1M" if largest >= TIERS[1] else "64K" if largest >= TIERS[0] else ""


def _tier_row(world_size: int, caps: Capabilities) -> dict[str, Any]:
    """What decided the 1 Mi tier at ``world_size``: the topology (the most ranks a core), or what a 1 Mi
    example cost against the budget."""
    row = {"world_size": world_size, "every_cell_at_1mi": caps.whole_large_tier}
    if caps.large_example_s is None:
        return {**row, "decided_by": "topology", "ranks_a_core": caps.ranks_a_core}
    return {
        **row, "decided_by": "budget", "large_example_ms": round(caps.large_example_s * 1e3, 1),
        "draw_ms": round(caps.draw_s * 1e3, 2), "cells": caps.large_cells,
    }  # fmt: skip


def _turned_first(held: Capabilities | None, caps: Capabilities) -> Capabilities:
    """Of two xdist workers' probes of one world size, each timed on its own group, the one whose sweeps
    turned the 1 Mi tier, if either's did: the summary must not say every cell ran at 1 Mi there when one
    worker's tests ran one (the cells' ``largest`` says which ran where); else the one that timed it."""
    if held is None or not held.timed or (caps.timed and held.whole_large_tier and not caps.whole_large_tier):
        return caps
    return held


def rotation_line(turn: int, world_sizes: list[int], size_tiers: dict[str, Any] | None = None) -> str:
    """Where the size tiers ran and what of them rotated: every cell at 64 Ki; at 1 Mi every cell where
    the machine held them (``size_tiers``, the document's: by its topology, or a measured budget), else
    one a sweep."""
    from pytest_collectives.conformance.cases import tiers_at

    decided = {t["world_size"]: t for t in (size_tiers or {}).get("world_sizes", [])}
    whole = [n for n in world_sizes if decided.get(n, {}).get("every_cell_at_1mi")]
    tiered = [n for n in world_sizes if n in whole or tiers_at(n, world_sizes)]
    untiered = [n for n in world_sizes if n not in tiered]
    turning = [n for n in tiered if n not in whole]
    where = "; ".join(
        [*([f"every cell at {_listed(whole)} ranks"] if whole else []),
         *([f"one a sweep at {_listed(turning)}"] if turning else [])]
    )  # fmt: skip
    by_topology = {n: t for n, t in decided.items() if t.get("decided_by") == "topology"}
    timed = {n: t for n, t in decided.items() if n not in by_topology}
    if by_topology:
        sharing = [(t["ranks_a_core"], n) for n, t in by_topology.items()]
        where += ": by the topology, " + ", ".join(
            f"{s} rank{'s' * (s != 1)} a core at {n}" for s, n in sharing
        )
    if timed:
        costs = ", ".join(f"{t['large_example_ms']:g}" for t in timed.values())
        cells = "/".join(map(str, sorted({t["cells"] for t in timed.values()})))
        draws = ", ".join(f"{t['draw_ms']:g}" for t in timed.values())
        budget, scale = size_tiers["budget_s"], size_tiers["draw_ms"]
        where += (
            f": a 1 Mi example {costs} ms at {_listed(timed)}, {cells} cells in {budget:g} s where a 1 Mi "
            f"input draws in {scale:g} ms, here in {draws} ms"
        )
    return (
        f"the sweeps' size tiers at {_listed(tiered)} ranks: every cell at 64 Ki; at 1 Mi every cell where "
        f"the machine holds them, else one ({where})"
        + (f" (97 elements only at {_listed(untiered)}); " if untiered else "; ")
        + f"the 1 Mi cells and the layouts' dtypes turned at {turn}, each world size a turn further; "
        f"--hypothesis-seed={turn} turns them there again"
    )


def _listed(world_sizes: Iterable[int]) -> str:
    return ",".join(map(str, world_sizes))


NAMED_AT_MOST = 8  # 1 Mi cells named in the summary; a whole run's are some 70 (the registered algorithms')


def tiers_line(rows: list[dict[str, Any]]) -> str:
    """Which cells passed at which size this run: the cells of the 1 Mi tier by name, how many more at
    64 Ki, how many at 97 elements only (the large tiers rotate, so a PASS of those is a PASS at 97)."""
    from pytest_collectives.conformance.cases import TIERS  # hypothesis' strategies: not at import

    passed = [r for r in rows if r["status"] == PASS and r.get("largest")]
    top = [r for r in passed if r["largest"] >= TIERS[1]]
    names = ", ".join(f"{r['operation']} {short_dtype(r['dtype'])} {r['reduce_op']}" for r in top)
    if len(top) > NAMED_AT_MOST:  # each cell's largest example is in --capability-json
        names = f"{len(top)} cells ('largest' in --capability-json)"
    middle = sum(TIERS[0] <= r["largest"] < TIERS[1] for r in passed)
    # the closing verdict counts every cell that passed: name those with no size (an object's, a barrier's,
    # a training step's), so that the two counts read as one
    unsized = sum(r["status"] == PASS for r in rows) - len(passed)
    others = f" ({unsized} more passed with no size recorded)" if unsized else ""
    return (
        f"of the {len(passed)} cells that passed{others}, at 1 Mi elements: {names or 'none'}; at 64 Ki: "
        f"{middle} more; the other {len(passed) - len(top) - middle} at up to 97 elements only"
    )


def mismatch_lines(rows: list[dict[str, Any]]) -> list[str]:
    """How many operations ended in an error when a rank's tensor differed from the others', and each
    that returned silently: a capability of the backend (some healthy ones do not check), not a failure."""
    if not rows:
        return []
    silent = [r for r in rows if r["behaviour"] == SILENT]
    sizes = sorted({r["world_size"] for r in rows})
    lines = [
        f"cross-rank mismatches ({MISMATCHED}), at {'/'.join(map(str, sizes))} ranks: "
        f"{len(rows) - len(silent)} of {len(rows)} (operation, dtype or shape) detected"
        + (", silent in:" if silent else "")
    ]
    by_operation: dict[str, list[str]] = {}
    for r in silent:
        by_operation.setdefault(r["operation"], []).append(r["kind"])
    lines += [f"  {operation}: {' and '.join(kinds)}, returned on every rank"
              for operation, kinds in by_operation.items()]
    return lines


def _torch() -> Any:
    import torch

    return torch


def _dtype_names() -> list[str]:
    from pytest_collectives.conformance.capabilities import DTYPES, dtype_name

    return [*map(dtype_name, DTYPES), "-"]
