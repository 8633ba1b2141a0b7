"""Known defects of backends, kept outside test code: a JSON manifest, as MPICH's test lists carry
``xfail=`` beside a test, so a vendor marks a known driver bug without editing the suites.

    {"known_bugs": [
        {"backends": ["gloo"], "test": "test_backend_all_reduce_on_a_strided_view",
         "raises": "AssertionError", "match": "elements exceed the rounding-error bound",
         "reason": "all_reduce on a non-contiguous tensor reduces the wrong elements (torch 2.13)"}
    ]}

``test`` is a test function's name, or a pattern (fnmatch) over node ids when it holds ``::``. A matching
test run on one of ``backends`` is a strict xfail: it must fail with the bug, an exception named ``raises``
whose message ``match`` (a regular expression) finds, on any rank; any other failure fails the test, so a
new bug in the same test is not swallowed. A fix shows up as XPASS, which fails the run until the entry is
removed. The suites' own findings are ``suites/known_bugs.json``; a user's
manifests come from ``--known-bugs PATH`` (or the ini key ``known_bugs``). A manifest that can't be read is
a one-line usage error naming the file and the entry.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pytest

from pytest_collectives.errors import OneLineError

__all__ = ["KnownBug", "ManifestError", "expected", "load", "mark", "pytest_runtest_makereport"]

_KEYS = ("backends", "test", "raises", "match", "reason")


class ManifestError(OneLineError):
    """A known-bugs manifest that can't be used; the message names the file and the entry."""


@dataclasses.dataclass(frozen=True)
class KnownBug:
    backends: tuple[str, ...]
    test: str
    raises: str  # the exception's name, as a traceback's last line gives it
    match: str  # a regular expression its message must contain
    reason: str
    source: str  # the manifest it came from, named in the xfail reason

    def explains(self, failure: str) -> bool:
        """Whether a failure's text (the exception, or every failing rank's traceback) holds this bug: a
        line ``<raises>: <message>`` whose message ``match`` finds."""
        pattern = re.compile(rf"(?:^|\W){re.escape(self.raises)}: (.*)$", re.MULTILINE)
        return any(re.search(self.match, m.group(1)) for m in pattern.finditer(failure))

    def matches(self, item: pytest.Item, backend: str) -> bool:
        if backend not in self.backends:
            return False
        if "::" in self.test:
            return fnmatch.fnmatchcase(item.nodeid, self.test)
        return getattr(item, "originalname", item.name) == self.test


def load(path: str | os.PathLike[str]) -> list[KnownBug]:
    """The entries of one manifest, each checked: backends a non-empty list of names, test and reason text."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"known bugs {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"known bugs {path}: not readable JSON ({exc})") from None
    entries = data.get("known_bugs") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ManifestError(f'known bugs {path}: expected {{"known_bugs": [...]}} at the top')
    bugs = []
    for i, entry in enumerate(entries):
        where = f"known bugs {path}: known_bugs[{i}]"
        if not isinstance(entry, dict) or set(entry) != set(_KEYS):
            raise ManifestError(f"{where} must have exactly the keys {', '.join(_KEYS)}")
        backends = entry["backends"]
        if not (isinstance(backends, list) and backends and all(isinstance(b, str) and b for b in backends)):
            raise ManifestError(f"{where}.backends must be a non-empty list of backend names")
        for key in _KEYS[1:]:
            if not (isinstance(entry[key], str) and entry[key].strip()):
                raise ManifestError(f"{where}.{key} must be non-empty text")
        if not entry["raises"].isidentifier():
            raise ManifestError(f"{where}.raises must name an exception, such as AssertionError")
        try:
            re.compile(entry["match"])
        except re.error as exc:
            raise ManifestError(f"{where}.match is not a regular expression ({exc})") from None
        bugs.append(KnownBug(tuple(backends), *(entry[key] for key in _KEYS[1:]), path.name))
    return bugs


_BUGS = pytest.StashKey[list[KnownBug]]()


def mark(items: Iterable[pytest.Item], backend: str, bugs: Sequence[KnownBug]) -> None:
    """Make each test a known bug of ``backend`` names a strict xfail, with the manifest's reason."""
    for item in items:
        for bug in bugs:
            if bug.matches(item, backend):
                reason = f"known {backend} bug ({bug.source}): {bug.reason}"
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
                item.stash.setdefault(_BUGS, []).append(bug)


def expected(item: pytest.Item) -> list[KnownBug]:
    """The known bugs ``item`` is expected to fail with on this run's backend."""
    return item.stash.get(_BUGS, [])


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: after pytest made the failure an xfail
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """An expected failure that is not the known bug is a failure, with what was expected."""
    outcome = yield
    report = outcome.get_result()
    bugs = expected(item)
    if not bugs or report.when != "call" or not (report.skipped and hasattr(report, "wasxfail")):
        return
    failure = report.longreprtext
    raised = f"{call.excinfo.typename}: {call.excinfo.value}" if call.excinfo else ""
    if any(bug.explains(raised) or bug.explains(failure) for bug in bugs):
        return
    wanted = "; or ".join(f"{b.raises} matching {b.match!r} ({b.source})" for b in bugs)
    report.outcome = "failed"
    del report.wasxfail
    report.longrepr = f"{failure}\n\nnot the known bug this test is marked with: expected {wanted}"
