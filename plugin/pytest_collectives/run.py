"""The session's one owner: its parts, and the one order pytest's session-level hooks take over them.

Each part (the distributed session, the capability matrix, the baseline gate, the soak, the node report)
is a plain object keeping only its per-test hooks; what it does once per session is a method this run
calls, in the order written here (docs/how-it-works.md shows it). Before, each part was a plugin of its
own, and their order was set by ``tryfirst``, ``trylast`` and the order they were registered in, written
down nowhere; a soak ran all its passes before the gate said it had no baseline.

The modes keep their own plugins: the SPMD launcher (its veto comes after the gate's, and it exchanges
with the other ranks at collection) and the xdist controller (it gathers the workers' parts).
"""

from __future__ import annotations

import os
import textwrap
from typing import TYPE_CHECKING, Any

import pytest

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
        # the gate judges and saves; the session fails a configuration none of whose tests ran, the matrix
        # a run that checked nothing; the node report then writes what they all decided
        for part in self._parts("gate", "session", "matrix", "report"):
            part.finish(session)

    # trylast: after pytest-benchmark's table (some 250 columns wide), so that the verdicts close the output
    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for part in self._parts("report", "soak", "gate", "matrix", "session"):
            part.summary(terminalreporter)
        said = [part.verdict() for part in self._parts("matrix", "gate", "soak", "session", "report")]
        here = f"{terminalreporter.config.invocation_params.dir}{os.sep}"  # paths as typed: shorter
        verdicts = [line.replace(here, "") for line in said if line]
        if verdicts:
            terminalreporter.section("collectives: verdicts")
        for line in verdicts:
            # read in an 80-column terminal: a long verdict wraps, its later lines indented
            text = textwrap.fill(
                line,
                VERDICT_COLUMNS,
                subsequent_indent="    ",
                break_on_hyphens=False,
                break_long_words=False,
            )
            terminalreporter.write_line(text, red=": FAIL" in line)
