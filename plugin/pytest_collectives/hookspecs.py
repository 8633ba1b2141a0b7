"""Hook specs of pytest-collectives, added with ``pytest_addhooks`` (as pytest-benchmark's hookspec.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import pytest


def pytest_collectives_call_done(
    item: pytest.Item, world_size: int, kwargs: dict[str, Any], verdict: str
) -> None:
    """A distributed call ended: one call of a plain test, or one hypothesis example, on ``world_size``
    ranks with these arguments (the values hypothesis drew among them); ``verdict`` is "passed", "failed"
    or "skipped". A batch of ``@pytest_collectives.examples`` is reported example by example, up to the
    first that failed. Called in the process that runs the session (each rank's own under torchrun/srun)."""


def pytest_collectives_configuration_rejected(configuration: str, words: str) -> None:
    """The backend would not start a group in a configuration of ``--backend-env``
    (``configuration``: ``NAME=VALUE+...``): its ranks raised, ``words`` the last line. Its tests are N/A.
    Called each time a test meets it, in the process that runs the session."""


def pytest_collectives_node_checks(config: pytest.Config) -> Mapping[str, Sequence[Mapping[str, Any]]] | None:
    """Extra checks for ``--node-report``, from a vendor's plugin or a conftest (a NIC, InfiniBand or
    firmware check): ``{namespace: [check, ...]}``, each check ``{"name", "status": "PASS" | "N/A" | "NOT
    JUDGED" | "WARN" | "FAIL" (N/A: it does not apply to this node; NOT JUDGED: it had nothing to judge),
    "reason", "details": {...} (optional)}``. They land in every output of the report (HTML, Markdown,
    JUnit, and ``report.json`` under ``extensions.<namespace>``, as ``namespace: name`` among the checks)
    and among the closing verdicts, and count toward its verdict; a FAIL fails the run.
    Called once, at the end of the session, in the process that writes the report; a check the schema
    rejects leaves the report unwritten, naming the field."""


def pytest_collectives_baseline_key(config: pytest.Config) -> Mapping[str, str] | None:
    """Dimensions beyond the topology that must not share a baseline (an ``NCCL_ALGO``, a container image, a
    node count): ``{dimension: value}``. They join the baseline's file name, ``<topology-id>/<name>+dim=value
    .json`` in key order, so each combination is recorded and judged apart. Called once per session, after
    collection, in the process that gates."""


def pytest_collectives_known_bugs(config: pytest.Config) -> Sequence[str | os.PathLike[str]] | None:
    """Known-bug manifests a plugin or conftest ships with its tests (the suites' own findings): paths read
    as ``--known-bugs`` ones are, before the ini's and the command line's, so that those can drop an entry
    of theirs. Called once, when pytest configures."""


def merged_answers(hook: str, answers: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
    """The answers of ``hook``, whose implementations each return a mapping (or None), as one mapping; a key
    two of them give is a ValueError naming the hook and the key. (Not a hook spec: no ``pytest_`` prefix.)"""
    merged: dict[str, Any] = {}
    for answer in answers:
        for key, value in (answer or {}).items():
            if key in merged:
                raise ValueError(f"{hook}: two implementations answer {key!r}")
            merged[key] = value
    return merged
