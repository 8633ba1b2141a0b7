"""The session's one owner: its parts, and the one order pytest's session-level hooks take over them.

Each part (the distributed session, the capability matrix, the baseline gate, the soak, the node report)
is a plain object keeping only its per-test hooks; what it does once per session is a method this run
calls, in the order written here (docs/how-it-works.md shows it). Before, each part was a plugin of its
own, and their order was set by ``tryfirst``, ``trylast`` and the order they were registered in, written
down nowhere; a soak ran all its passes before the gate said it had no baseline.

The run owns the verdict too: each part judges its own data into Checks (verdict.Check) once, and the run
alone composes them, prints them and sets the exit status from them, so the terminal, the node report's
files and the exit status cannot disagree.

The modes keep their own plugins: the SPMD launcher (its veto comes after the gate's, and it exchanges
with the other ranks at collection) and the xdist controller (it gathers the workers' parts).
"""

from __future__ import annotations

import os
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

from pytest_collectives.verdict import FAIL, WARN, Check, fails

if TYPE_CHECKING:
    from pytest_collectives.conformance.matrix import CapabilityMatrix
    from pytest_collectives.execution.modes.soak import Soak
    from pytest_collectives.execution.session import DistributedSession
    from pytest_collectives.gate.baseline_gate import BaselineGate
    from pytest_collectives.nodereport.collect import NodeReport


VERDICT_COLUMNS = 80


class Run:
    """One pytest session of the plugin. Where a process does not report (an xdist worker, an SPMD rank
    other than 0) it holds the distributed session and, on a worker, the matrix it hands over."""

    def __init__(
        self,
        session: DistributedSession,
        matrix: CapabilityMatrix | None = None,
        gate: BaselineGate | None = None,
        soak: Soak | None = None,
        report: NodeReport | None = None,
    ) -> None:
        self.session, self.matrix, self.gate, self.soak, self.report = session, matrix, gate, soak, report
        self.checks: list[Check] = []  # every part's, composed at the session's end: the run's verdict

    def _parts(self, *names: str) -> list[Any]:
        return [part for part in (getattr(self, name) for name in names) if part is not None]

    # tryfirst: before the SPMD launcher's, which tells the other ranks what the gate found
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # the gate first: a bad or missing baseline is found before minutes of tests, then the topology
        # the node report needs, then what the matrix and the session count of the selection
        for part in self._parts("gate", "report", "matrix", "session"):
            part.collected(session)

    # tryfirst: before pytest's own loop, and before the SPMD launcher's veto
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if self.gate is not None and self.gate.vetoes():
            return True  # True: the tests do not run
        if self.soak is not None:
            return self.soak.loop(session)
        return None  # pytest's own loop (or the SPMD launcher's veto, then pytest's)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # the gate judges and saves, the matrix hands a worker's cells over; then each part's checks, the
        # one verdict: the node report writes them beside its own, and they alone set the exit status
        for part in self._parts("gate", "session", "matrix"):
            part.finish(session)
        self.checks = [
            check for part in self._parts("session", "matrix", "soak", "gate") for check in part.checks()
        ]
        if self.report is not None:
            self.report.finish(session, self.checks)
            self.checks += self.report.checks()
        # a usage error, an interrupt or pytest's own failure keeps its status; a run that passed and a run
        # that selected nothing (a vetoed gate) fail on a FAIL
        quiet = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        if fails(self.checks) and session.exitstatus in quiet:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    # trylast: after pytest-benchmark's table (some 250 columns wide), so that the verdicts close the output
    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for part in self._parts("report", "soak", "gate", "matrix", "session"):
            part.summary(terminalreporter)
        here = f"{terminalreporter.config.invocation_params.dir}{os.sep}"  # paths as typed: shorter
        if self.checks:
            terminalreporter.section("collectives: verdicts")
        for check in self.checks:
            # read in an 80-column terminal: a long verdict wraps, its later lines indented
            text = textwrap.fill(
                check.line().replace(here, ""),
                VERDICT_COLUMNS,
                subsequent_indent="    ",
                break_on_hyphens=False,
                break_long_words=False,
            )
            terminalreporter.write_line(text, red=check.status == FAIL, yellow=check.status == WARN)
