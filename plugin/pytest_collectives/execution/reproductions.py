"""Standalone reproductions: the folder a run writes them to, and the writing, on the rank that found the
failure (every rank that did writes the same file: each knows every rank's inputs)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pytest_collectives.atomic import write_atomic
from pytest_collectives.execution import options


def reproductions_folder(config: pytest.Config, settings: options.Settings) -> Path:
    """--reproductions, from where pytest was invoked, or .collectives/reproductions under the rootdir."""
    given = settings.reproductions
    if not given:
        return config.rootpath / ".collectives" / "reproductions"
    return (config.invocation_params.dir / given).resolve()


WORDS = "standalone reproduction: "  # what names one under a failure, for the reports to find


def write_reproduction(pg: Any, name: str, text: str | None) -> str:
    """Write ``text`` as ``name``.py in the running test's reproductions folder: the line that names it,
    for the failure's message (or says why none was written; ``text`` is None where the failing example's
    inputs are too many to write inline)."""
    if text is None:
        return f"{WORDS}none written (the failing example's inputs are too many to write inline)"
    if not getattr(pg, "reproductions", ""):
        return f"{WORDS}none written (no reproductions folder outside a pytest session)"
    path = Path(pg.reproductions) / (re.sub(r"[^\w.-]+", "_", name).strip("_") + ".py")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError as exc:
        return f"{WORDS}none written ({exc})"
    return f"{WORDS}{path}"


def reproductions_in(text: str) -> list[str]:
    """The reproductions a failure's text names, once each, in order."""
    return list(dict.fromkeys(re.findall(re.escape(WORDS) + r"(\S+\.py)", text)))


def drop_drafts(written: set[str], report: str, kept: set[str]) -> None:
    """Remove the reproductions a test's examples wrote (hypothesis' shrinking steps among them) that its
    ``report`` does not name, so that the folder holds the reported failures alone; ``kept`` gathers the
    named ones, which a later test's draft of the same name must not remove."""
    named = set(reproductions_in(report))
    kept |= named
    for path in written - kept:
        Path(path).unlink(missing_ok=True)
