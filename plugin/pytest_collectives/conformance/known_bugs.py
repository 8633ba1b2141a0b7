"""Known defects of backends, kept outside test code: a JSON manifest, as MPICH's test lists carry
``xfail=`` beside a test, so a vendor marks a known driver bug without editing the suites.

    {"known_bugs": [
        {"backends": ["gloo"], "test": "test_backend_all_reduce_on_a_strided_view",
         "reason": "all_reduce on a non-contiguous tensor reduces the wrong elements (torch 2.13)"}
    ]}

``test`` is a test function's name, or a pattern (fnmatch) over node ids when it holds ``::``. A matching
test run on one of ``backends`` is a strict xfail: it must fail, and a fix shows up as XPASS, which fails
the run until the entry is removed. The suites' own findings are ``suites/known_bugs.json``; a user's
manifests come from ``--known-bugs PATH`` (or the ini key ``known_bugs``). A manifest that can't be read is
a one-line usage error naming the file and the entry.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from pytest_collectives.errors import OneLineError

__all__ = ["KnownBug", "ManifestError", "load", "mark"]


class ManifestError(OneLineError):
    """A known-bugs manifest that can't be used; the message names the file and the entry."""


@dataclasses.dataclass(frozen=True)
class KnownBug:
    backends: tuple[str, ...]
    test: str
    reason: str
    source: str  # the manifest it came from, named in the xfail reason

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
        if not isinstance(entry, dict) or set(entry) != {"backends", "test", "reason"}:
            raise ManifestError(f"{where} must have exactly the keys backends, test and reason")
        backends, test, reason = entry["backends"], entry["test"], entry["reason"]
        if not (isinstance(backends, list) and backends and all(isinstance(b, str) and b for b in backends)):
            raise ManifestError(f"{where}.backends must be a non-empty list of backend names")
        for key, value in (("test", test), ("reason", reason)):
            if not (isinstance(value, str) and value.strip()):
                raise ManifestError(f"{where}.{key} must be non-empty text")
        bugs.append(KnownBug(tuple(backends), test, reason, path.name))
    return bugs


def mark(items: Iterable[pytest.Item], backend: str, bugs: Sequence[KnownBug]) -> None:
    """Make each test a known bug of ``backend`` names a strict xfail, with the manifest's reason."""
    for item in items:
        for bug in bugs:
            if bug.matches(item, backend):
                reason = f"known {backend} bug ({bug.source}): {bug.reason}"
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
