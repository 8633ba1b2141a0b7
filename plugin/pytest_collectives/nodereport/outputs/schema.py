"""What a node report must hold: its published JSON Schema, the data that write_report takes (the same less
what write_report adds), and the checks a schema cannot express.

Every reader of report data goes through here: write_report before it judges anything, and the fleet before
it compares nodes. A bad field is a ReportError whose one line names it, so the same mistake reads the same
wherever it is caught. The defaults of optional fields that several outputs read (`regression_threshold`)
live here too, so no two of them can disagree.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_collectives.errors import OneLineError
from pytest_collectives.gate.statistics import DEFAULT_THRESHOLD
from pytest_collectives.schemas import load_schema
from pytest_collectives.schemas.validation import first_error, shown
from pytest_collectives.topology.fingerprint import Fingerprint, FingerprintError

# The schema is published with the package (schemas/node-report.schema.json) for fleet tooling to validate
# report.json with; the input of write_report is the same document less what write_report adds.
REPORT_SCHEMA: dict[str, Any] = load_schema("node-report.schema.json")
_ADDED = ("schema_version", "verdict", "checks", "plots")
DATA_SCHEMA: dict[str, Any] = {
    **REPORT_SCHEMA,
    "title": "pytest-collectives node report data",
    "properties": {k: v for k, v in REPORT_SCHEMA["properties"].items() if k not in _ADDED},
    "required": [k for k in REPORT_SCHEMA["required"] if k not in _ADDED],
}


class ReportError(OneLineError):
    """Bad report data; the message is one line naming the field to fix."""


def validate(value: Any, schema: Mapping[str, Any]) -> None:
    """Raise ReportError naming the first field of `value` that `schema` rejects, in one line."""
    if problem := first_error(value, schema):
        raise ReportError(f"report data: {problem}")


def validate_data(data: Any) -> None:
    """DATA_SCHEMA, then what it cannot say: times, fingerprints, square matrices (cells: read_matrix)."""
    validate(data, DATA_SCHEMA)
    try:
        datetime.datetime.fromisoformat(data["created"])
    except ValueError:
        raise ReportError(
            f"report data: created must be an ISO 8601 time, e.g. 2024-06-01T12:00:00+00:00, got "
            f"{shown(data['created'])}"
        ) from None
    try:
        Fingerprint.from_json(data["fingerprint"])
    except FingerprintError as e:
        raise ReportError(f"report data: fingerprint.{e.field} must be {e.expected}") from None
    p2p, latency, host = data["p2p"], data.get("p2p_latency"), data.get("host_device")
    if p2p is not None:
        for key in ("matrix", "classes"):
            _square(p2p[key], len(p2p["devices"]), f"p2p.{key}")
    if latency is not None:
        _square(latency["matrix_us"], len(latency["devices"]), "p2p_latency.matrix_us")
    if host is not None:
        n = len(host["devices"])
        for name, values in host["series"].items():
            if len(values) != n:
                field = f"host_device.series.{name}"
                raise ReportError(f"report data: {field} must have {n} figures, one per device")


def _square(matrix: Sequence[Sequence[Any]], n: int, field: str) -> None:
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise ReportError(f"report data: {field} must be {n} x {n}, one row and column per device")


def has_pairs(p2p: Mapping[str, Any] | None) -> bool:
    return p2p is not None and len(p2p["devices"]) >= 2


def regression_threshold(baseline: Mapping[str, Any]) -> float:
    return baseline.get("regression_threshold", 1.0 + DEFAULT_THRESHOLD / 2.0)
