"""Turning what every rank did into one test verdict and a readable failure report."""

from __future__ import annotations

import dataclasses
import re

from pytest_collectives.execution.messages import FAILED, PASSED, SKIPPED, RankResult

CRASHED = "crashed"
HUNG = "hung"


@dataclasses.dataclass
class RankReport:
    rank: int
    status: str  # PASSED, FAILED, SKIPPED, CRASHED or HUNG
    detail: str = ""  # traceback, skip reason or exit reason
    stack: str = ""  # Python stacks of a hung rank
    stdout: str = ""
    stderr: str = ""
    benchmark: dict | None = None
    returned: object = None  # what a probe returned on this rank (suite_api.run_on_ranks)
    noted: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)  # note()/event() calls
    dirty: list[str] = dataclasses.field(default_factory=list)  # what the test left unfit on this rank
    examples: int = 1  # hypothesis examples the call ran (several in a batch of @examples)
    failed_example: int | None = None  # the first of them that failed here
    failed: list[int] = dataclasses.field(default_factory=list)  # every one that failed here
    ended_at: int | None = None  # the last that ran here, where an error ended the batch
    turned_down: list[int] = dataclasses.field(default_factory=list)  # those an assumption refused here
    known: list[int] = dataclasses.field(default_factory=list)  # those that failed with a known bug here
    known_failure: str = ""  # the first of them, its traceback
    refused: list[str] = dataclasses.field(default_factory=list)  # the words of each example refused
    resume_at: int | None = None  # the first example a refusal left unrun here
    drafts: dict[str, str] = dataclasses.field(default_factory=dict)  # the reproductions it drafted

    @classmethod
    def of(cls, result: RankResult, **more: object) -> RankReport:
        """What the controller keeps of a rank's result (``more``: what the launcher adds, its output)."""
        return cls(
            result.rank,
            result.outcome,
            result.longrepr,
            benchmark=result.benchmark,
            returned=result.returned,
            noted=result.noted,
            examples=result.examples,
            failed_example=result.failed_example,
            failed=result.failed,
            ended_at=result.ended_at,
            turned_down=result.turned_down,
            known=result.known,
            known_failure=result.known_failure,
            refused=result.refused,
            resume_at=result.resume_at,
            drafts=result.drafts,
            **more,  # type: ignore[arg-type]
        )


@dataclasses.dataclass
class GroupOutcome:
    ranks: list[RankReport]
    # the likely cause in the order the ranks reported (shown as first to fail); blamed() is the rank a
    # failure is told by, the same in every run
    first_failed: int | None = None
    timeout_s: float = 0.0
    replaced: list[str] = dataclasses.field(default_factory=list)  # why the group was thrown away
    restored: list[str] = dataclasses.field(default_factory=list)  # what was put back on a rank kept (SPMD)
    # In a hang: the rank outside the collective every other hung rank waits in, and that collective.
    culprit: tuple[int, str] | None = None
    # In a batch of examples: the values of the one that failed, which the shrunk batch may still follow
    # passing examples with (hypothesis cannot always delete them), so the report names it alone.
    failing_example: str = ""
    # a hang's: the line naming the record of what each rank waited in (its closest thing to a reproduction)
    hang_record: str = ""
    # the group never started (twice tried): the test never ran, and its configuration is named for it
    unstarted: bool = False

    def verdict(self) -> str:
        statuses = {r.status for r in self.ranks}
        if statuses == {PASSED}:
            return PASSED
        if statuses == {SKIPPED}:
            return SKIPPED
        return FAILED

    def examples(self) -> int:
        """Hypothesis examples the call ran on every rank."""
        return min(r.examples for r in self.ranks)

    def failed_example(self) -> int | None:
        """In a batch of examples, the first that failed on any rank."""
        return min((r.failed_example for r in self.ranks if r.failed_example is not None), default=None)

    def failed(self) -> set[int]:
        """In a batch of examples, every one that failed on any rank: the batch went on past a failed
        check, so a sweep's other cells were judged too."""
        return {i for r in self.ranks for i in r.failed}

    def ended_at(self) -> int | None:
        """In a batch an error ended, the last example that ran on every rank."""
        return min((r.ended_at for r in self.ranks if r.ended_at is not None), default=None)

    def turned_down(self) -> set[int]:
        """In a batch of examples, those an assumption refused on any rank: they passed nothing."""
        return {i for r in self.ranks for i in r.turned_down}

    def refused(self) -> list[str]:
        """The backend's words for each example it refused (the same on every rank: rank 0's)."""
        return self.ranks[0].refused if self.ranks else []

    def resume_at(self) -> int | None:
        """In a batch a refusal ended on a backend that may keep state after a raise, the first example
        left to run in a call of its own; None where the batch ran to its end."""
        return max((r.resume_at for r in self.ranks if r.resume_at is not None), default=None)

    def known(self) -> set[int]:
        """In a batch of examples, those that failed with a known bug of the test on any rank."""
        return {i for r in self.ranks for i in r.known}

    def known_failure(self) -> str:
        """The first rank's failure with a known bug, as ``rank N: <traceback>``; empty where none."""
        return next((f"rank {r.rank}: {r.known_failure}" for r in self.ranks if r.known_failure), "")

    def keep_first_failing_example(self) -> None:
        """In a batch of examples only the earliest example that failed on any rank is the call's failure
        (hypothesis shrinks the batch to it); a rank whose first failure came later passed that far."""
        first = self.failed_example()
        if first is None:
            return
        for report in self.ranks:
            if report.failed_example is not None and report.failed_example > first:
                report.status, report.detail, report.failed_example = PASSED, "", None
        if self.first_failed is not None and self.ranks[self.first_failed].status == PASSED:
            self.first_failed = next(r.rank for r in self.ranks if r.status == FAILED)

    def hung(self) -> bool:
        return any(report.status == HUNG for report in self.ranks)

    def blamed(self) -> RankReport | None:
        """The rank a failure is told by, by a rule that holds in every run (which rank reported first
        is the machine's timing, and hypothesis replays an example expecting the same failure): the
        hang's culprit; else the lowest crashed rank; else the lowest whose error is its own rather than
        a lost peer; else the lowest that did not pass. None where every rank passed."""
        if self.culprit is not None:
            return next(r for r in self.ranks if r.rank == self.culprit[0])
        by_rank = {r.rank: r for r in self.ranks if r.status != PASSED}
        rank = likely_cause(by_rank, sorted(by_rank))
        return None if rank is None else by_rank[rank]

    def skip_reason(self) -> str:
        return self.ranks[0].detail

    def benchmark(self) -> dict | None:
        """The samples, identical on every rank (each is already the maximum across ranks)."""
        return self.ranks[0].benchmark

    def render(self) -> str:
        """The failure text: a summary line, then each failing rank in order, the likely cause first."""
        bad = [r for r in self.ranks if r.status != PASSED]
        lines = [self._summary(bad)]
        if self.failing_example:
            lines.append(f"the failing example: {self.failing_example}")
        if self.hang_record:
            lines.append(self.hang_record)
        blamed = self.blamed()
        order = sorted(bad, key=lambda r: (r is not blamed, r.rank))
        for report in order:
            lines.append("")
            lines.append(f"{'=' * 20} rank {report.rank}: {self._describe(report)} {'=' * 20}")
            if report.failed_example is not None and report.examples > 1:
                lines.append(f"(example {report.failed_example + 1} of the {report.examples} in this call)")
            if report.detail:
                lines.append(report.detail.rstrip())
            if report.stack:
                lines.append("Python stacks at the time it was stopped:")
                lines.append(report.stack.rstrip())
        return "\n".join(lines)

    def _summary(self, bad: list[RankReport]) -> str:
        n = len(self.ranks)
        by_status: dict[str, list[int]] = {}
        for report in self.ranks:
            by_status.setdefault(report.status, []).append(report.rank)
        parts = [
            f"{status} on rank{'s' * (len(r) > 1)} {_ranks(r)}" for status, r in sorted(by_status.items())
        ]
        head = f"{len(bad)} of {n} ranks did not pass ({'; '.join(parts)})"
        if self.first_failed is not None and len(bad) > 1:
            head += f"; rank {self.first_failed} failed first"
        if self.culprit is not None:
            rank, collective = self.culprit
            waiting = [r.rank for r in bad if r.rank != rank]
            head += (
                f"; rank {rank} is the likely cause: it is not in {collective}, which rank"
                f"{'s' * (len(waiting) > 1)} {_ranks(waiting)} wait{'s' * (len(waiting) == 1)} in"
            )
        if self.replaced:
            head += f"; the group was replaced: {'; '.join(self.replaced)}"
        return head

    def _describe(self, report: RankReport) -> str:
        first = " (first to fail)" if report.rank == self.first_failed and report.status != PASSED else ""
        if report.status == HUNG:
            why = (
                f"still running {self.timeout_s:g} s after the test started (--dist-timeout)"
                if self.first_failed is None
                else f"still running after rank {self.first_failed} failed"
            )
            cause = " (likely cause)" if self.culprit is not None and self.culprit[0] == report.rank else ""
            return f"HUNG, {why}{first}{cause}"
        return f"{report.status.upper()}{first}"

    def sections(self) -> list[tuple[str, str]]:
        """(title, text) of every rank's captured output, for pytest's report sections."""
        out = []
        for report in self.ranks:
            for name in ("stdout", "stderr"):
                text = getattr(report, name)
                if text:
                    out.append((f"{name} rank {report.rank}", text))
        return out


def last_words(detail: str) -> str:
    """The line a rank's report ends with: its traceback's last exception (``Name: message``), or a crashed
    rank's C++ exception (``what(): ...``); "" when there is neither."""
    said = [line.strip() for line in detail.splitlines() if re.match(r"(\w[\w.]*: |\s*what\(\): )", line)]
    return said[-1] if said else ""


def _ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


# How a rank's error reads when it only lost a peer: a symptom of another rank's failure, not its cause.
PEER_LOSS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote process exited",
    "NCCL communicator was aborted",
)


def likely_cause(reports: dict[int, RankReport], failures: list[int]) -> int | None:
    """The rank to blame among those that failed, given in arrival order: a crashed rank first, then
    one whose error is its own rather than a lost peer, then simply the first to report."""
    crashed = [r for r in failures if reports[r].status == CRASHED]
    own = [r for r in failures if not any(s in reports[r].detail for s in PEER_LOSS)]
    return (crashed or own or failures or [None])[0]


_C10D_FRAME = re.compile(r'File ".*[/\\]torch[/\\]distributed[/\\]distributed_c10d\.py", line \d+ in (\w+)')


def collective_waited_in(stack: str) -> str | None:
    """The torch.distributed call a faulthandler dump (most recent call first) shows the rank inside."""
    found = _C10D_FRAME.search(stack)
    return found.group(1) if found else None


def hang_culprit(stacks: dict[int, str]) -> tuple[int, str] | None:
    """In a hang, the rank to blame: when every hung rank but one is inside the same collective, the one
    that is not (it is still in the test's own code, so the others wait for it), with that collective.
    None when the stacks tell nothing apart (all inside it, all outside, or several outside)."""
    inside = {rank: collective_waited_in(stack) for rank, stack in stacks.items()}
    outside = [rank for rank, collective in inside.items() if collective is None]
    waited = {collective for collective in inside.values() if collective is not None}
    if len(outside) == 1 and len(waited) == 1 and len(stacks) > 1:
        return outside[0], waited.pop()
    return None


def exit_reason(exitcode: int | None) -> str:
    import signal

    if exitcode is None:
        return "exited, exit status unknown"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (by the OOM killer or another process)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    return f"exited with status {exitcode}"


class DistributedTestFailure(Exception):
    """Raised in the controller when a distributed test did not pass on every rank.

    Raise ``DistributedTestFailure.of(outcome)``: hypothesis tells bugs apart by exception type and the
    line it was raised at, and every distributed failure is raised at one line of the plugin, so each
    cause gets a subclass of its own (the likely-cause rank's exception type and where it was raised, or
    how the rank died): shrinking stays on one bug, and report_multiple_bugs separates them.
    """

    def __init__(self, outcome: GroupOutcome) -> None:
        super().__init__(outcome.render())
        self.outcome = outcome

    @classmethod
    def of(cls, outcome: GroupOutcome) -> DistributedTestFailure:
        return _failure_class(_cause(outcome))(outcome)


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def _cause(outcome: GroupOutcome) -> str:
    """What failed, for telling failures apart: 'ValueError at test_x.py:12', 'crashed', 'hung'."""
    report = outcome.blamed()
    if report is None or report.status != FAILED:
        return report.status if report else "failed"
    lines = report.detail.splitlines()
    frames = [i for i, line in enumerate(lines) if _FRAME.match(line)]
    if not frames:
        return "failed"
    file, line = _FRAME.match(lines[frames[-1]]).groups()  # type: ignore[union-attr]
    kind = next((m.group(1) for text in lines[frames[-1] + 1 :] if (m := _EXCEPTION.match(text))), "Error")
    return f"{kind} at {file.rsplit('/', 1)[-1]}:{line}"


_FAILURE_CLASSES: dict[str, type[DistributedTestFailure]] = {}


def _failure_class(cause: str) -> type[DistributedTestFailure]:
    if cause not in _FAILURE_CLASSES:
        _FAILURE_CLASSES[cause] = type(
            f"DistributedTestFailure[{cause}]", (DistributedTestFailure,), {"__module__": __name__}
        )
    return _FAILURE_CLASSES[cause]
