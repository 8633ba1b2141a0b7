"""The one verdict type of a run: a `Check` (what was judged, its status, the words a person acts on), the
statuses ranked, and the exit status they give.

Every part of a run judges its own data once, in a plain function that returns Checks: the test count
(execution.tally), the conformance cells (conformance.judging), the backend settings
(execution.configurations), the soak, the performance gate, and the node's own checks (links, host-device
copies, preflight). The run (run.Run) alone composes them, prints them and sets the exit status from them;
the node report renders the same Checks, so the terminal, every report file and the exit status cannot
disagree: each rule is written once, where its data is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

PASS, NA, NOT_JUDGED, WARN, FAIL = "PASS", "N/A", "NOT JUDGED", "WARN", "FAIL"
# best first: N/A (the thing does not apply here: a backend refusing a call it declares) proves nothing
# wrong and nothing right; NOT JUDGED (there was something to judge, and too little of it: too few GPUs to
# compare, too few passes to see a drift, no baseline) is a gap a person should close; only FAIL fails a run
STATUSES = (PASS, NA, NOT_JUDGED, WARN, FAIL)
# A Check whose subject is a list (e.g. the regressed benchmarks) carries it as details[TABLE], {"columns":
# [...], "rows": [[...], ...]}, so every output shows a table rather than a paragraph of names.
TABLE = "table"


class VerdictError(ValueError):
    """A Check built wrong; the message is one line naming what to fix."""


@dataclasses.dataclass(frozen=True)
class Check:
    """One verdict: `reason` is a sentence a person can act on, `details` the figures behind it.

    `details["cells"]`, where present, lists the [row, column] matrix cells the check is about.
    """

    name: str
    status: str  # one of STATUSES
    reason: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise VerdictError(f"Check {self.name!r}: status must be one of {', '.join(STATUSES)}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Check:
        return cls(data["name"], data["status"], data["reason"], data.get("details", {}))

    def line(self) -> str:
        """The check as the closing verdicts print it: ``name: STATUS, reason``."""
        return f"{self.name}: {self.status}, {self.reason}"


def overall(checks: Sequence[Check]) -> str:
    """The worst status among `checks` (PASS when there are none)."""
    return max((c.status for c in checks), key=STATUSES.index, default=PASS)


def worst_first(checks: Sequence[Check]) -> list[Check]:
    return sorted(checks, key=lambda c: -STATUSES.index(c.status))


def fails(checks: Sequence[Check]) -> bool:
    """Whether `checks` fail the run: one FAIL does, and nothing else."""
    return any(c.status == FAIL for c in checks)
