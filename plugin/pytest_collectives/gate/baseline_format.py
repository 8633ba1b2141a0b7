"""What a baseline file holds, and the strict reading of it: a baseline that silently lost a field would gate
CI on garbage, so every defect is a one-line `BaselineError` naming the file and the field.

The format is the JSON Schema `schemas/baseline.schema.json` (BASELINE_SCHEMA), shipped with the package;
the loader checks it, then what a schema cannot say (quartile order, UTC times, the id of the fingerprint).
Per run and benchmark a baseline keeps a summary (the fastest round, the 5th percentile, the median and
quartiles of the seconds per iteration, rounds, iterations per round), not the rounds: 1000 benchmarks x 5
runs stay about 1 MB.

The gate judges each benchmark's 5th-percentile round (``p05``): over the hundreds of rounds a benchmark
times, it repeats between runs better than the fastest round, which in turn repeats better than the median
(docs/measurements/performance-gate.md). Runs recorded before it was kept fall back, for the whole
baseline, to the fastest round, and runs older still to the median (`judged_statistic`), so an older file
keeps working, and moves on once its old runs are gone.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_collectives.errors import OneLineError
from pytest_collectives.schemas import load_schema
from pytest_collectives.schemas.validation import first_error
from pytest_collectives.topology.fingerprint import Fingerprint, FingerprintError
from pytest_collectives.topology.identity import topology_id

SCHEMA_VERSION = 2
_DIGITS = 4  # significant digits kept: far below any spread a gate can see, and short lines to review
OVERWRITE_FLAG = "--baseline-overwrite"
_TIME_FIELDS = ("min", "p05", "median", "q1", "q3")
_COUNT_FIELDS = ("rounds", "iterations")
# Published with the package (schemas/baseline.schema.json) for tools that read or write baselines.
BASELINE_SCHEMA: dict[str, Any] = load_schema("baseline.schema.json")
# What git prints is recorded only if the loader will take it back: the schema's own rule.
COMMIT_PATTERN = re.compile(BASELINE_SCHEMA["$defs"]["run"]["properties"]["commit"]["pattern"])


class BaselineError(OneLineError):
    """A baseline that cannot be read, written or used; the message is one line naming the file."""


@dataclasses.dataclass(frozen=True)
class Summary:
    """One benchmark in one run: seconds per iteration (fastest round, 5th percentile, median and quartiles)
    and counts."""

    median: float
    q1: float
    q3: float
    rounds: int
    iterations: int = 1
    min: float | None = None  # None: recorded before the fastest round was kept
    p05: float | None = None  # None: recorded before the 5th percentile was kept

    def to_json(self) -> dict[str, Any]:
        return {
            **{
                f: float(f"{getattr(self, f):.{_DIGITS}g}")
                for f in _TIME_FIELDS
                if getattr(self, f) is not None
            },
            **{f: getattr(self, f) for f in _COUNT_FIELDS},
        }


@dataclasses.dataclass(frozen=True)
class BenchmarkEntry:
    """One benchmark of this run: its per-iteration round times (seconds) and free-form details."""

    samples: tuple[float, ...]
    iterations: int = 1
    extra_info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_samples(
        cls, samples: Sequence[float], extra_info: Mapping[str, Any] | None = None, iterations: int = 1
    ) -> BenchmarkEntry:
        return cls(tuple(float(s) for s in samples), iterations, dict(extra_info or {}))

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.nan

    @property
    def min(self) -> float:
        return min(self.samples) if self.samples else math.nan

    @property
    def p05(self) -> float:
        if len(self.samples) < 2:
            return self.median
        return statistics.quantiles(self.samples, n=20, method="inclusive")[0]

    def summary(self) -> Summary:
        if len(self.samples) < 2:
            q1 = q3 = self.median
        else:
            q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return Summary(self.median, q1, q3, len(self.samples), self.iterations, self.min, self.p05)


@dataclasses.dataclass(frozen=True)
class Run:
    created: str  # UTC, ISO 8601
    commit: str | None
    benchmarks: dict[str, Summary]
    boot: str | None = None  # the kernel's boot id where it was recorded (None: unknown, an older file)


@dataclasses.dataclass(frozen=True)
class Baseline:
    path: Path
    topology_id: str
    fingerprint: Fingerprint
    runs: tuple[Run, ...]  # oldest first


# The schema first (it names the first bad field), then what a schema cannot say.


def field_error(path: Path, field: str, expected: str) -> BaselineError:
    return BaselineError(f"{path}: field '{field}' must be {expected}; fix the file or re-record it")


def _named(field: str) -> str:
    return f"field '{field}'" if field else "the file"


def baseline_from_json(path: Path, data: Any) -> Baseline:
    if not isinstance(data, dict):
        raise BaselineError(
            f"{path}: the file must hold a JSON object, not {type(data).__name__}; re-record it"
        )
    # Before the schema: a file of another version differs in every field, and only re-recording fixes it.
    if "schema_version" in data and data["schema_version"] != SCHEMA_VERSION:
        raise BaselineError(
            f"{path}: field 'schema_version' is {data['schema_version']!r} but this plugin reads version "
            f"{SCHEMA_VERSION} (several runs, each a summary per benchmark); re-record the baseline: "
            f"--baseline-save {OVERWRITE_FLAG} once, then --baseline-save twice more"
        )
    problem = first_error(data, BASELINE_SCHEMA, _named)
    if problem:
        raise BaselineError(f"{path}: {problem}; fix the file or re-record it")
    try:
        fingerprint = Fingerprint.from_json(data["fingerprint"])
    except FingerprintError as e:  # the links matrix: square, X exactly on the diagonal
        raise field_error(path, f"fingerprint.{e.field}", e.expected) from None
    expected_id = topology_id(fingerprint)
    if data["topology_id"] != expected_id:
        raise BaselineError(
            f"{path}: field 'topology_id' is {data['topology_id']!r} but the fingerprint's id is "
            f"{expected_id!r}; "
            f"the fingerprint was edited, or the file is from another plugin version: re-record it"
        )
    return Baseline(
        path=path,
        topology_id=expected_id,
        fingerprint=fingerprint,
        runs=tuple(_run_from_json(path, run, f"runs[{i}]") for i, run in enumerate(data["runs"])),
    )


def _run_from_json(path: Path, data: dict[str, Any], field: str) -> Run:
    if not _is_utc_iso(data["created"]):
        raise field_error(path, f"{field}.created", "a UTC ISO 8601 time such as 2025-01-31T12:00:00+00:00")
    benchmarks = {}
    for name, summary in data["benchmarks"].items():
        if not summary["q1"] <= summary["median"] <= summary["q3"]:
            raise field_error(path, f"{field}.benchmarks.{name}.median", "between q1 and q3")
        if summary.get("min", 0) > summary["q1"]:
            raise field_error(path, f"{field}.benchmarks.{name}.min", "at most q1")
        if not summary.get("min", 0) <= summary.get("p05", summary["q1"]) <= summary["q1"]:
            raise field_error(path, f"{field}.benchmarks.{name}.p05", "between min and q1")
        benchmarks[name] = Summary(**summary)
    return Run(data["created"], data["commit"], benchmarks, data.get("boot"))


def judged_statistic(runs: Sequence[Run]) -> str:
    """What the gate judges of each benchmark: its 5th-percentile round ("p05") where every run kept it,
    else its fastest ("min"), else the median: one statistic for every run of the baseline."""
    for statistic in ("p05", "min"):
        if all(getattr(s, statistic) is not None for run in runs for s in run.benchmarks.values()):
            return statistic
    return "median"


def _is_utc_iso(text: str) -> bool:
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return False
    return when.utcoffset() == datetime.timedelta(0)
