"""The run's one count of its tests' outcomes, which every part reads, and the checks judged from it: the
test run, and under --backend-env each backend setting.

Counted from the test reports, so an xdist controller counts its workers' as a serial run counts its own,
as pytest counts them. A test a mode of the run left out (left_out: --benchmark-only, --benchmark-skip, a
benchmark on an xdist worker) was not asked to run in its setting, as one -k leaves out: no setting is
untested for it. A known bug that fired (an xfail) was judged, as the capability matrix counts it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pytest_collectives.execution import left_out
from pytest_collectives.execution.reproductions import reproductions_in
from pytest_collectives.verdict import FAIL, PASS, TABLE, WARN, Check

MAX_LONGREPR = 4000  # of a failure's text kept for the node report (its HTML shows it)
UNSTARTED = "group_not_started"  # a report's property where the test's group did not start in its setting


@dataclasses.dataclass
class Counts:
    passed: int = 0
    failed: int = 0  # in any phase
    errors: int = 0  # of those, in set-up or teardown: pytest's "errors"
    skipped: int = 0  # N/A and skipped
    xfailed: int = 0  # known bugs that fired, as pytest counts them
    judged: int = 0  # passed, failed, or a known bug that fired: what a rule about tests that ran reads

    def add(self, report: pytest.TestReport) -> None:
        if _counted(report):
            outcome = "xfailed" if _fired(report) else report.outcome
            setattr(self, outcome, getattr(self, outcome) + 1)
            self.errors += report.failed and report.when != "call"
        # a failure in any phase was judged; a known bug that fired was judged, as a pass is
        self.judged += report.failed or (report.when == "call" and (report.passed or _fired(report)))


def _counted(report: pytest.TestReport) -> bool:
    """Whether ``report`` is its test's outcome: its call, or the phase that failed or skipped it."""
    return report.when == "call" or report.outcome != "passed"


def _fired(report: pytest.TestReport) -> bool:
    return report.skipped and hasattr(report, "wasxfail")


class Tally:
    """Every test's outcome, once: the whole run's counts, the conformance tests', each backend setting's,
    and the failures."""

    def __init__(self) -> None:
        self.counts = Counts()
        self.conformance = Counts()  # the conformance suites' tests: the capability matrix reads it
        self.by_configuration: dict[str, Counts] = {}  # --backend-env: configuration id -> its counts
        self.skipped_why: dict[str, str] = {}  # configuration id -> its first skip's reason
        self.unstarted: list[str] = []  # configuration ids where a test's group did not start, in order
        self.failures: list[dict[str, Any]] = []

    def add(self, report: pytest.TestReport) -> None:
        self.counts.add(report)
        if "conformance" in report.keywords:
            self.conformance.add(report)
        properties = dict(report.user_properties)
        configuration = properties.get("backend_env")
        if configuration is not None and not left_out.of_report(report):
            self.by_configuration.setdefault(configuration, Counts()).add(report)
            if UNSTARTED in properties and configuration not in self.unstarted:
                self.unstarted.append(configuration)
            if report.skipped and isinstance(report.longrepr, tuple):
                reason = str(report.longrepr[2]).removeprefix("Skipped: ")
                self.skipped_why.setdefault(configuration, reason)
        if report.failed:
            text = report.longreprtext
            failure: dict[str, Any] = {"nodeid": report.nodeid, "longrepr": text[-MAX_LONGREPR:]}
            if scripts := reproductions_in(text):
                failure["reproductions"] = scripts
            self.failures.append(failure)

    def untested(self) -> list[str]:
        """The backend settings none of whose tests was judged (each N/A, rejected or skipped)."""
        return [c for c, counts in self.by_configuration.items() if not counts.judged]

    def untested_lines(self) -> list[str]:
        """A line for each untested setting, with why its first test did not run."""
        return [
            f"untested with {c}: none of its tests ran"
            + (f" ({self.skipped_why[c]})" if c in self.skipped_why else "")
            + "; the run fails"
            for c in self.untested()
        ]

    def document(self) -> dict[str, Any]:
        """The counts as the node report holds them (its ``tests``)."""
        untested = self.untested()
        each = [
            {"backend_env": c, **_plain(n), "untested": c in untested, "unstarted": c in self.unstarted}
            for c, n in self.by_configuration.items()
        ]
        settings = {"configurations": each} if each else {}
        return {**_plain(self.counts), "failures": self.failures, **settings}


def _plain(counts: Counts) -> dict[str, int]:
    """The counts the node report holds (``failed`` in any phase; ``judged`` is the rules' own)."""
    return {name: getattr(counts, name) for name in ("passed", "failed", "skipped", "xfailed")}


def _message(longrepr: str, most: int = 200) -> str:
    """A failure's message: its first ``E`` line, as pytest prints it in the short summary."""
    lines = [line[1:].strip() for line in longrepr.splitlines() if line.startswith("E ")]
    lines = lines or [line.strip() for line in longrepr.splitlines() if line.strip()][-1:] or ["-"]
    return lines[0] if len(lines[0]) <= most else lines[0][: most - 3] + "..."


def judge_tests(tally: Tally) -> Check:
    """The tests' outcomes as one check, counted in pytest's words: FAIL where one failed, WARN where none
    passed (nothing was verified), with the failing tests as a table, each with its message and the
    scripts it wrote."""
    counts = _plain(tally.counts)
    # pytest's own counts: a failure in set-up or teardown is an error there, not a failure
    said = {**counts, "failed": tally.counts.failed - tally.counts.errors, "errors": tally.counts.errors}
    order = ("passed", "failed", "errors", "skipped", "xfailed")
    summary = ", ".join(
        f"{said[outcome]} {'error' if outcome == 'errors' and said[outcome] == 1 else outcome}"
        for outcome in order
        if said[outcome]
    )
    if tally.counts.failed:
        # the table lands in every output (terminal, md, xml, html): the tracebacks are the HTML's alone
        listed = {
            TABLE: {
                "columns": ["Test", "Failure", "Standalone reproduction"],
                "rows": [
                    [f["nodeid"], _message(f["longrepr"]), " ".join(f.get("reproductions", [])) or "-"]
                    for f in tally.failures
                ],
            }
        }
        listing = "the failing tests are listed, each with its message and the reproduction it wrote"
        return Check("test run", FAIL, f"{summary}: {listing}", {**counts, **listed})
    if not tally.counts.passed:
        none = f"{summary}: none passed" if summary else "no test ran"
        return Check("test run", WARN, f"{none}, so nothing was verified", counts)
    return Check("test run", PASS, summary, counts)


def judge_settings(tally: Tally) -> Check | None:
    """Under --backend-env, the tests' outcomes per setting: a setting whose groups did not start, one none
    of whose tests was judged, and failures that follow a setting fail. None in a plain run."""
    each = tally.by_configuration
    if not each:
        return None
    details = {
        TABLE: {
            "columns": ["Backend settings", "Passed", "Failed", "Skipped"],
            "rows": [[c, n.passed, n.failed, n.skipped] for c, n in each.items()],
        }
    }
    said = [f"groups did not start with {c}" for c in tally.unstarted]
    said += [f"untested: {', '.join(tally.untested())}, none of whose tests ran"] * bool(tally.untested())
    failing = [c for c, n in each.items() if n.failed and c not in tally.unstarted]
    if failing and len(failing) == len(each):
        said.append(f"tests failed in every one of the {len(each)} settings: not a fault of one setting")
    elif failing:
        passing = [c for c, n in each.items() if not n.failed]
        said.append(
            f"tests failed only with {', '.join(failing)} (none with {', '.join(passing)}): the backend is "
            f"wrong under that setting"
        )
    if said:
        return Check("backend settings", FAIL, "; ".join(said), details)
    skipped = sum(n.skipped for n in each.values())
    left = f" ({skipped} skipped or N/A)" if skipped else ""
    words = f"no test failed in any of the {len(each)} settings, and each ran tests{left}"
    return Check("backend settings", PASS, words, details)
