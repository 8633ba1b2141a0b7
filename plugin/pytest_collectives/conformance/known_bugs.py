"""Known defects of backends, kept outside test code: a JSON manifest, as MPICH's test lists carry
``xfail=`` beside a test, so a vendor marks a known driver bug without editing the suites.

    {"known_bugs": [
        {"backends": ["gloo"], "test": "test_backend_all_reduce_on_a_strided_view",
         "raises": "AssertionError", "match": "elements exceed the rounding-error bound",
         "reason": "all_reduce on a non-contiguous tensor reduces the wrong elements (torch 2.13)"}
    ]}

``test`` is a test function's name, or a pattern (fnmatch) over node ids when it holds ``::``. A matching
test run on one of ``backends`` is a strict xfail: it must fail with the bug, an exception named ``raises``
whose message ``match`` (a regular expression) finds, on every rank that failed (each in its own words);
any other failure fails the test, so a new bug in the same test is not swallowed. A test of batched
examples (``@examples``, ``@sweep``) goes on past an example that fails with the bug: every other example
runs and is judged, and the test then fails with the bug's first example. A fix shows up as XPASS, which
fails the run until the entry is removed.

A bug of one cell of the capability matrix (one operation, dtype and reduce op: PREMUL_SUM of bfloat16)
would fail every property test that draws the cell, and a strict xfail of all of them would swallow
every other finding of theirs. Such an entry names the cells, ``"cells": ["all_reduce bfloat16
premul_sum"]`` (each part a pattern: ``"* * premul_sum"``), and a test that tries the cells on purpose:
that test is the strict xfail, the cells are withheld from every other test's draws, and the matrix shows
them as known bugs. ``"world_sizes": [1]`` limits an entry, its test and its cells, to those world sizes.

One bug shows more than one symptom as the examples change: a layout bug leaves values wrong at one seed,
elements never written at another, bytes written into a view's gaps at a third. An entry whose ``match``
names the cell (``strided reduce_scatter on rank \\d+: sum over \\d+ ranks of torch\\.\\w+: ``) lists the
kinds of wrongness it shows, ``"kinds": ["wrong values", "never written", "written outside"]``
(``wrongness.KINDS``): a failure of that cell of any of those kinds is the bug, at every seed, and a
failure of another kind (an exception, a shape torch did not ask for) is not.

A backend built on another (``declare(backend, built_on="gloo")``) holds that backend's entries too. An
entry ``{"backends": ["acme"], "test": "test_x", "drops": "gloo", "reason": "..."}`` drops gloo's entry
for ``test_x`` (``test`` spelled as that entry spells it) from acme's: acme's wrapper avoids the bug, and
the test is judged as any other. A failure that an entry of another backend explains says so, naming the
entry (a vendor who forgot ``built_on`` is told where to look).

The suites' own findings are ``suites/known_bugs.json``; a user's manifests come from ``--known-bugs
PATH`` (or the ini key ``known_bugs``). A manifest that can't be read is a one-line usage error naming
the file and the entry.
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

from pytest_collectives.backend_declarations import lineage
from pytest_collectives.errors import OneLineError
from pytest_collectives.execution import examples
from pytest_collectives.execution.configurations import of_item, plain_id
from pytest_collectives.execution.messages import FAILED
from pytest_collectives.execution.reproductions import naming, reproductions_in
from pytest_collectives.execution.session import EXPECTED_FAILURES
from pytest_collectives.execution.suite_api import settings_of
from pytest_collectives.execution.wrongness import KINDS

__all__ = [
    "KnownBug",
    "ManifestError",
    "expected",
    "load",
    "mark",
    "pytest_runtest_makereport",
    "withheld",
]

_KEYS = ("backends", "test", "raises", "match", "reason")
_OPTIONAL = ("cells", "world_sizes", "kinds", "upstream")
_DROP_KEYS = ("backends", "test", "drops", "reason")
Cell = tuple[str, str, str]  # operation, dtype, reduce op: capabilities.Cell


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
    cells: tuple[Cell, ...] = ()  # patterns of cells withheld from every other test's draws
    world_sizes: tuple[int, ...] = ()  # where the entry holds; all when empty
    kinds: tuple[str, ...] = ()  # the kinds of wrongness the bug shows (wrongness.KINDS); any when empty
    # where it stands upstream: the report's address, or "not reported upstream: " and the standalone
    # reproduction committed beside the manifest, ready to file
    upstream: str = ""
    drops: str = ""  # an entry that drops this backend's inherited entry for ``test`` (and is no bug)
    index: int = 0  # its place in the manifest's list, which a failure it explains elsewhere names

    @property
    def where(self) -> str:
        return f"{self.source} known_bugs[{self.index}]"

    def owner(self, backend: str) -> str | None:
        """The backend of ``backend``'s lineage (itself, then what it is built on) the entry is listed for."""
        return next((name for name in lineage(backend) if name in self.backends), None)

    def holds_for(self, backend: str) -> bool:
        """Whether the entry holds on ``backend``: listed for it, or for a backend it is built on."""
        return not self.drops and self.owner(backend) is not None

    def holds_at(self, world_size: int | None) -> bool:
        return not self.world_sizes or world_size in self.world_sizes

    def explains(self, failure: str) -> bool:
        """Whether a failure's text (the exception, or a failing rank's traceback) holds this bug: a line
        ``<raises>: <message>`` whose message ``match`` finds, of one of its ``kinds``
        (``examples.explains``)."""
        return examples.explains(self.raises, self.match, failure, self.kinds)

    def matches(self, item: pytest.Item, backend: str) -> bool:
        return self.holds_for(backend) and self.names(item)

    def names(self, item: pytest.Item) -> bool:
        """Whether the entry names ``item``, its test and world size, whatever the backend."""
        callspec = getattr(item, "callspec", None)
        if not self.holds_at(callspec and callspec.params.get("world_size")):
            return False
        if "::" in self.test:
            # an entry holds in every configuration of --backend-env: it names the test as a plain run does
            return fnmatch.fnmatchcase(plain_id(item.nodeid, of_item(item).id), self.test)
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
        if isinstance(entry, dict) and "drops" in entry:
            bugs.append(_drop(entry, where, path.name, i))
            continue
        if not isinstance(entry, dict) or not set(_KEYS) <= set(entry) <= {*_KEYS, *_OPTIONAL}:
            raise ManifestError(
                f"{where} must have the keys {', '.join(_KEYS)} (and may have {', '.join(_OPTIONAL)})"
            )
        backends = _named(entry, where, _KEYS[1:])
        if not entry["raises"].isidentifier():
            raise ManifestError(f"{where}.raises must name an exception, such as AssertionError")
        try:
            re.compile(entry["match"])
        except re.error as exc:
            raise ManifestError(f"{where}.match is not a regular expression ({exc})") from None
        cells = entry.get("cells", [])
        if not (isinstance(cells, list) and all(isinstance(c, str) and len(c.split()) == 3 for c in cells)):
            raise ManifestError(f'{where}.cells must be a list of "operation dtype reduce_op" strings')
        cells = tuple(tuple(c.split()) for c in cells)
        sizes = entry.get("world_sizes", [])
        if not (isinstance(sizes, list) and all(isinstance(n, int) and n > 0 for n in sizes)):
            raise ManifestError(f"{where}.world_sizes must be a list of world sizes, such as [1]")
        kinds = entry.get("kinds", [])
        if not (isinstance(kinds, list) and set(kinds) <= set(KINDS)):
            raise ManifestError(f"{where}.kinds must be a list of kinds of wrongness: {', '.join(KINDS)}")
        upstream = entry.get("upstream", "")
        if not isinstance(upstream, str):
            raise ManifestError(f"{where}.upstream must be the upstream report's address, or why none")
        bugs.append(
            KnownBug(
                tuple(backends), *(entry[key] for key in _KEYS[1:]), path.name, cells, tuple(sizes),
                tuple(kinds), upstream, index=i,
            )  # fmt: skip
        )
    return bugs


def _named(entry: dict, where: str, texts: tuple[str, ...]) -> list[str]:
    """An entry's backends, checked a non-empty list of names, and its ``texts`` checked non-empty text."""
    backends = entry["backends"]
    if not (isinstance(backends, list) and backends and all(isinstance(b, str) and b for b in backends)):
        raise ManifestError(f"{where}.backends must be a non-empty list of backend names")
    for key in texts:
        if not (isinstance(entry[key], str) and entry[key].strip()):
            raise ManifestError(f"{where}.{key} must be non-empty text")
    return backends


def _drop(entry: dict, where: str, source: str, index: int) -> KnownBug:
    """An entry dropping an inherited one: ``backends``, built on ``drops``, do not hold its entry for
    ``test``."""
    if set(entry) != set(_DROP_KEYS):
        raise ManifestError(
            f"{where}: an entry that drops an inherited one has the keys {', '.join(_DROP_KEYS)}"
        )
    backends = _named(entry, where, _DROP_KEYS[1:])
    if entry["drops"] in backends:
        raise ManifestError(f"{where}.drops names a backend of its own backends: it drops what another holds")
    return KnownBug(
        tuple(backends), entry["test"], "", "", entry["reason"], source, drops=entry["drops"], index=index
    )


_BUGS = pytest.StashKey[list[KnownBug]]()
_LOADED = pytest.StashKey[list[KnownBug]]()  # every manifest's entries, for the cells they withhold


def remember(config: pytest.Config, bugs: Iterable[KnownBug]) -> list[KnownBug]:
    """Every manifest's entries this session has read, ``bugs`` among them: what drops an inherited entry
    holds whichever manifest is marked first."""
    loaded = config.stash.setdefault(_LOADED, [])
    loaded.extend(bug for bug in bugs if bug not in loaded)
    return loaded


def _dropped(config: pytest.Config, bug: KnownBug, backend: str) -> bool:
    """Whether an entry of ``backend``'s (or of a backend between it and the bug's owner) drops ``bug``, an
    entry it would otherwise inherit."""
    owner = bug.owner(backend)
    return owner not in (None, backend) and any(
        drop.drops == owner and drop.test == bug.test and drop.owner(backend) is not None
        for drop in config.stash.get(_LOADED, [])
    )


def mark(config: pytest.Config, items: Iterable[pytest.Item], backend: str, bugs: Sequence[KnownBug]) -> None:
    """Make each test a known bug of ``backend`` names a strict xfail, with the manifest's reason."""
    remember(config, bugs)
    for item in items:
        for bug in bugs:
            if bug.matches(item, backend) and not _dropped(config, bug, backend):
                owner = bug.owner(backend)
                inherited = "" if owner == backend else f", which {backend} is built on"
                reason = f"known {owner} bug{inherited} ({bug.source}): {bug.reason}"
                reason += f"; upstream: {bug.upstream}" if bug.upstream else ""
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
                item.stash.setdefault(_BUGS, []).append(bug)
                held = item.stash.get(EXPECTED_FAILURES, ())
                item.stash[EXPECTED_FAILURES] = (*held, (bug.raises, bug.match, bug.kinds))


def withheld(config: pytest.Config, backend: str, world_size: int) -> dict[Cell, str]:
    """Patterns of the cells known bugs of ``backend`` withhold from the suites' draws at ``world_size``,
    each with its bug's reason."""
    found: dict[Cell, str] = {}
    for bug in config.stash.get(_LOADED, []):
        if bug.holds_for(backend) and bug.holds_at(world_size) and not _dropped(config, bug, backend):
            found.update((cell, bug.reason) for cell in bug.cells if cell not in found)
    return found


def expected(item: pytest.Item) -> list[KnownBug]:
    """The known bugs ``item`` is expected to fail with on this run's backend."""
    return item.stash.get(_BUGS, [])


def _own_failures(exc: BaseException) -> list[str]:
    """Each failure ``exc`` holds, in its own words: every failing rank's traceback of a distributed
    failure (not the whole report, where one rank's known bug would hide another rank's other failure),
    each of a group of them (hypothesis' several bugs), or the exception itself."""
    if isinstance(getattr(exc, "exceptions", None), tuple):  # an ExceptionGroup (a backport on 3.10)
        return [text for inner in exc.exceptions for text in _own_failures(inner)]
    outcome = getattr(exc, "outcome", None)
    ranks = getattr(outcome, "ranks", None)
    if ranks is not None:
        failed = [r.detail for r in ranks if r.status == FAILED]
        return failed or [str(exc)]  # a crash or a hang: the report is its own words
    return [f"{type(exc).__name__}: {exc}"]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: after pytest made the failure an xfail
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """An expected failure that is not the known bug is a failure, with what was expected."""
    outcome = yield
    report = outcome.get_result()
    bugs = expected(item)
    if not bugs and report.failed and report.when == "call" and call.excinfo:
        _name_another_backends_bug(item, report, _own_failures(call.excinfo.value))
    if not bugs or report.when != "call" or not (report.skipped and hasattr(report, "wasxfail")):
        return
    failure = report.longreprtext
    own = _own_failures(call.excinfo.value) if call.excinfo else []
    if own and all(any(bug.explains(text) for bug in bugs) for text in own):
        report.wasxfail += "".join(f"; {naming(path)}" for path in reproductions_in(failure))
        return
    wanted = "; or ".join(f"{b.raises} matching {b.match!r} ({b.source})" for b in bugs)
    report.outcome = "failed"
    del report.wasxfail
    report.longrepr = f"{failure}\n\nnot the known bug this test is marked with: expected {wanted}"


def _name_another_backends_bug(item: pytest.Item, report: pytest.TestReport, own: list[str]) -> None:
    """A failure that an entry of another backend explains stands, and says so: the run's backend may
    hand this call to that one without declaring it (``declare(backend, built_on=...)``)."""
    backend = settings_of(item.config).backend
    for bug in item.config.stash.get(_LOADED, []):
        if bug.drops or bug.owner(backend) is not None or not bug.names(item):
            continue
        if own and all(bug.explains(text) for text in own):
            other = bug.backends[0]
            report.sections.append(
                (
                    "another backend's known bug",
                    f"this failure is the known {other} bug of {bug.where} ({bug.reason}); if {backend} "
                    f"hands this call to {other}, declare it in its module: declare({backend!r}, "
                    f"built_on={other!r}) (from pytest_collectives import declare)",
                )
            )
            return
