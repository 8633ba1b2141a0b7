"""Standalone reproductions: the folder a run writes them to, and the writing. Each rank that finds a
failure drafts the script (each knows every rank's inputs, but quotes its own failure); the controller
writes the draft of the rank the failure is told by, so the same run gives the same file."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_collectives.atomic import write_atomic
from pytest_collectives.execution import options
from pytest_collectives.execution.outcome import HUNG, GroupOutcome, collective_waited_in


def reproductions_folder(config: pytest.Config, settings: options.Settings) -> Path:
    """--reproductions, from where pytest was invoked, or .collectives/reproductions under the rootdir."""
    given = settings.reproductions
    if not given:
        return config.rootpath / ".collectives" / "reproductions"
    return (config.invocation_params.dir / given).resolve()


WORDS = "standalone reproduction: "  # what names one under a failure, for the reports to find
_OUTSIDE = "no reproductions folder outside a pytest session"
CLOSEST = "its closest thing, "  # what names a record where a failure cannot be reproduced alone


def write_reproduction(pg: Any, name: str, text: str) -> str:
    """Draft ``text`` as ``name``.py in the running test's reproductions folder, written once the group's
    outcome is known (write_drafts): the line that names it, for the failure's message (or says why none
    was written)."""
    if not getattr(pg, "reproductions", ""):
        return f"{WORDS}none written ({_OUTSIDE})"
    path = _file_in(pg.reproductions, name + ".py")
    pg.drafts[str(path)] = text
    return f"{WORDS}{path}"


def write_drafts(outcome: GroupOutcome) -> None:
    """Write each script the ranks drafted (a sweep's every failed cell, not only the one its report
    names) as the rank the outcome blames drafted it, else as the lowest rank that did: each rank's draft
    quotes its own failure, and which rank wrote last was the machine's timing. A script that cannot be
    written is said so in place of its path."""
    blamed = outcome.blamed()
    order = sorted(outcome.ranks, key=lambda r: (r is not blamed, r.rank))
    for path in dict.fromkeys(path for report in order for path in report.drafts):
        text = next(r.drafts[path] for r in order if path in r.drafts)
        try:
            _write(Path(path), text)
        except OSError as exc:
            for report in outcome.ranks:
                for field in ("detail", "known_failure"):
                    said = getattr(report, field).replace(f"{WORDS}{path}", f"{WORDS}none written ({exc})")
                    setattr(report, field, said)


def write_closest(folder: str, name: str, text: str, why: str, what: str) -> str:
    """Write ``text``, the closest thing to a reproduction that a failure which cannot be reproduced alone
    has (``why`` says why not; ``what`` what the record holds), as ``name``.txt in ``folder``: the line
    that names it, for the failure's message."""
    if not folder:
        return f"{WORDS}none ({why}), and no record written ({_OUTSIDE})"
    path = _file_in(folder, name + ".txt")
    try:
        _write(path, text)
    except OSError as exc:
        return f"{WORDS}none ({why}), and no record written ({exc})"
    return f"{WORDS}none ({why}); {CLOSEST}{what}: {path}"


def _file_in(folder: str | os.PathLike[str], name: str) -> Path:
    """``name``, made a file name, in ``folder``."""
    stem, dot, suffix = name.rpartition(".")
    return Path(folder) / (re.sub(r"[^\w.-]+", "_", stem).strip("_") + dot + suffix)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def reproductions_in(text: str) -> list[str]:
    """The reproductions a failure's text names (and the records written where none can be: a hang's, a
    training step's), once each, in order."""
    named = re.findall(rf"{re.escape(WORDS)}(\S+\.py)|{re.escape(CLOSEST)}[^:]*: (\S+\.txt)", text)
    return list(dict.fromkeys(script or record for script, record in named))


def naming(path: str) -> str:
    """How a report names a file ``reproductions_in`` found: a script as the standalone reproduction, a
    record as the closest thing to one."""
    return f"{WORDS}{path}" if path.endswith(".py") else f"{WORDS}none; {CLOSEST}a record: {path}"


def drop_drafts(written: set[str], report: str, kept: set[str]) -> None:
    """Remove the reproductions a test's examples wrote (hypothesis' shrinking steps among them) that its
    ``report`` does not name, so that the folder holds the reported failures alone; ``kept`` gathers the
    named ones, which a later test's draft of the same name must not remove."""
    named = set(reproductions_in(report))
    kept |= named
    for path in written - kept:
        Path(path).unlink(missing_ok=True)


_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# torch's frames, and the harness' on a rank (its wrapper around each call, its worker loop)
_NOT_THE_TEST = re.compile(r"[/\\](torch|pytest_collectives[/\\]execution)[/\\]")
ARGUMENT_CHARS = 2000  # a batch's examples can run long: the record keeps each argument's start


def stopped_at(stack: str) -> str:
    """Where a faulthandler dump (every thread's, most recent call first) shows a rank's own code: the
    innermost frame outside torch and the harness, of the thread inside a torch.distributed call, else of
    the current one."""
    threads = re.split(r"\n(?=(?:Current thread|Thread) 0x)", stack)
    inside = [t for t in threads if collective_waited_in(t)]
    current = [t for t in threads if t.lstrip().startswith("Current thread")]
    for thread in inside + current + threads[:1]:
        for frame in _FRAME.finditer(thread):
            if not _NOT_THE_TEST.search(frame["path"]):
                return f"{Path(frame['path']).name}:{frame['line']} in {frame['func']}"
    return "an unknown place (no stack)"


def hang_record(nodeid: str, outcome: GroupOutcome, arguments: dict[str, Any], written_by: str) -> str:
    """The closest thing to a standalone reproduction a hang has: the call each rank was in when it was
    stopped, which rank the others waited for, the arguments of the test's call and every rank's stacks."""
    lines = [
        f"# {nodeid} hung. A hang cannot be reproduced alone: this is what each rank was doing when",
        f"# it was stopped, to file with the backend's report. Written by {written_by}.",
        "",
        outcome.render().splitlines()[0],
        "",
        "Each rank:",
    ]
    for report in outcome.ranks:
        if report.status == HUNG and report.stack:
            collective = collective_waited_in(report.stack)
            where = f"inside torch.distributed.{collective}, called" if collective else "in its own code"
            lines.append(f"  rank {report.rank}: hung {where} at {stopped_at(report.stack)}")
        else:
            lines.append(f"  rank {report.rank}: {report.status}")
    lines += ["", "The test's arguments (on every rank):"]
    for name, value in arguments.items():
        said = repr(value)
        cut = f" ... ({len(said)} characters)" if len(said) > ARGUMENT_CHARS else ""
        lines.append(f"  {name} = {said[:ARGUMENT_CHARS]}{cut}")
    for report in outcome.ranks:
        if report.stack:
            lines += ["", f"Rank {report.rank}'s stacks when it was stopped (most recent call first):"]
            lines.append(report.stack.rstrip())
    return "\n".join(lines) + "\n"
