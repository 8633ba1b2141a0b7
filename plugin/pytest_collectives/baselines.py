"""The per-topology baseline store: `<root>/<topology-id>/<name>.json`, one file per recorded session.

Files are meant to be committed and reviewed, so they are plain JSON with sorted keys and indentation. Each
keeps the raw per-round samples, because the regression rule tests distributions, not just medians. Loading
is strict: a baseline that silently lost a field would gate CI on garbage, so every defect is a one-line
`BaselineError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .topology import Fingerprint, FingerprintError, topology_id

SCHEMA_VERSION = 1
DEFAULT_NAME = "baseline"
UNIT = "s"
OVERWRITE_FLAG = "--baseline-overwrite"
_TOP_FIELDS = {"schema_version", "topology_id", "fingerprint", "created", "commit", "benchmarks"}
_STAT_FIELDS = ("median", "mean", "stddev", "min", "max")
_ENTRY_FIELDS = {*_STAT_FIELDS, "rounds", "unit", "samples", "extra_info"}
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class BaselineError(Exception):
    """A baseline that cannot be read, written or used; the message is one line naming the file."""

    def __init__(self, message: str) -> None:
        super().__init__(message.replace("\n", "\\n"))


@dataclasses.dataclass(frozen=True)
class BenchmarkEntry:
    """One benchmark's per-round times (seconds), their summary, and free-form details (bytes, busbw...)."""

    samples: tuple[float, ...]
    median: float
    mean: float
    stddev: float
    min: float
    max: float
    rounds: int
    unit: str = UNIT
    extra_info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_samples(
        cls, samples: Sequence[float], extra_info: Mapping[str, Any] | None = None
    ) -> BenchmarkEntry:
        values = tuple(float(s) for s in samples)
        # Bad samples (empty, NaN) still make an entry, so that saving can reject it naming the field.
        mean = math.fsum(values) / len(values) if values else math.nan
        spread = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
        return cls(
            samples=values,
            median=statistics.median(values) if values else math.nan,
            mean=mean,
            stddev=math.sqrt(spread),
            min=min(values, default=math.nan),
            max=max(values, default=math.nan),
            rounds=len(values),
            extra_info=dict(extra_info or {}),
        )

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["samples"] = list(self.samples)
        return data


@dataclasses.dataclass(frozen=True)
class Baseline:
    path: Path
    topology_id: str
    fingerprint: Fingerprint
    created: str  # UTC, ISO 8601
    commit: str | None
    benchmarks: dict[str, BenchmarkEntry]


@dataclasses.dataclass(frozen=True)
class ResolvedBaseline:
    baseline: Baseline
    foreign: bool  # recorded on another topology; used only because the caller named it


def baseline_path(root: str | os.PathLike[str], fingerprint: Fingerprint, name: str = DEFAULT_NAME) -> Path:
    if not _NAME.fullmatch(name):
        raise BaselineError(
            f"baseline name {name!r}: use letters, digits, '.', '_' or '-' (it becomes a file name)"
        )
    return Path(root) / topology_id(fingerprint) / f"{name}.json"


# ---------------------------------------------------------------------------------------------------------
# Validation: one function per level, each naming the field it checks.


def _fail(path: Path, field: str, expected: str) -> BaselineError:
    return BaselineError(f"{path}: field '{field}' must be {expected}; fix the file or re-record it")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_finite_json(path: Path, value: Any, field: str) -> None:
    """extra_info is free-form, but NaN/Infinity are not JSON and would poison later arithmetic."""
    if isinstance(value, float) and not math.isfinite(value):
        raise _fail(path, field, "a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _fail(path, field, "an object with string keys")
            _check_finite_json(path, item, f"{field}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_finite_json(path, item, f"{field}[{i}]")
    elif not (value is None or isinstance(value, str | int | float)):
        raise _fail(path, field, "JSON data (object, list, string, number, true/false or null)")


def _entry_from_json(path: Path, data: Any, field: str) -> BenchmarkEntry:
    if not isinstance(data, dict):
        raise _fail(path, field, "an object")
    missing, unknown = sorted(_ENTRY_FIELDS - data.keys()), sorted(data.keys() - _ENTRY_FIELDS)
    if missing:
        raise _fail(path, f"{field}.{missing[0]}", "present")
    if unknown:
        raise _fail(path, f"{field}.{unknown[0]}", "absent (unknown field)")
    samples = data["samples"]
    if not isinstance(samples, list) or not samples or not all(_is_number(s) and s > 0 for s in samples):
        raise _fail(
            path, f"{field}.samples", "a non-empty list of positive finite numbers (seconds per round)"
        )
    for stat in _STAT_FIELDS:
        if not _is_number(data[stat]) or data[stat] < 0:
            raise _fail(path, f"{field}.{stat}", "a non-negative finite number")
    rounds = data["rounds"]
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds != len(samples):
        raise _fail(path, f"{field}.rounds", f"the number of samples ({len(samples)})")
    if data["unit"] != UNIT:
        raise _fail(path, f"{field}.unit", f'"{UNIT}"')
    if not isinstance(data["extra_info"], dict):
        raise _fail(path, f"{field}.extra_info", "an object")
    _check_finite_json(path, data["extra_info"], f"{field}.extra_info")
    return BenchmarkEntry(
        samples=tuple(float(s) for s in samples),
        **{stat: float(data[stat]) for stat in _STAT_FIELDS},
        rounds=rounds,
        unit=UNIT,
        extra_info=data["extra_info"],
    )


def _baseline_from_json(path: Path, data: Any) -> Baseline:
    if not isinstance(data, dict):
        raise BaselineError(
            f"{path}: the file must hold a JSON object, not {type(data).__name__}; re-record it"
        )
    if "schema_version" not in data:
        raise _fail(path, "schema_version", f"present ({SCHEMA_VERSION})")
    if data["schema_version"] != SCHEMA_VERSION or isinstance(data["schema_version"], bool):
        raise BaselineError(
            f"{path}: field 'schema_version' is {data['schema_version']!r} but this plugin reads version "
            f"{SCHEMA_VERSION}; re-record the baseline with {OVERWRITE_FLAG}"
        )
    missing, unknown = sorted(_TOP_FIELDS - data.keys()), sorted(data.keys() - _TOP_FIELDS)
    if missing:
        raise _fail(path, missing[0], "present")
    if unknown:
        raise _fail(path, unknown[0], "absent (unknown field)")
    try:
        fingerprint = Fingerprint.from_json(data["fingerprint"])
    except FingerprintError as e:
        raise _fail(path, f"fingerprint.{e.field}", e.expected) from None
    expected_id = topology_id(fingerprint)
    if data["topology_id"] != expected_id:
        raise BaselineError(
            f"{path}: field 'topology_id' is {data['topology_id']!r} but the fingerprint's id is "
            f"{expected_id!r}; "
            f"the fingerprint was edited, or the file is from another plugin version: re-record it"
        )
    created = data["created"]
    if not isinstance(created, str) or not _is_utc_iso(created):
        raise _fail(path, "created", "a UTC ISO 8601 time such as 2025-01-31T12:00:00+00:00")
    commit = data["commit"]
    if commit is not None and not (isinstance(commit, str) and _COMMIT.fullmatch(commit)):
        raise _fail(path, "commit", "a git commit hash (hex) or null")
    benchmarks = data["benchmarks"]
    if not isinstance(benchmarks, dict) or not benchmarks:
        raise _fail(path, "benchmarks", "a non-empty object keyed by benchmark name")
    return Baseline(
        path=path,
        topology_id=expected_id,
        fingerprint=fingerprint,
        created=created,
        commit=commit,
        benchmarks={
            name: _entry_from_json(path, entry, f"benchmarks.{name}") for name, entry in benchmarks.items()
        },
    )


def _is_utc_iso(text: str) -> bool:
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return False
    return when.utcoffset() == datetime.timedelta(0)


# ---------------------------------------------------------------------------------------------------------
# Reading and writing


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """Read and fully validate one baseline file; every problem is a one-line BaselineError."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BaselineError(f"{path}: no such baseline file; check the path or record a baseline") from None
    except IsADirectoryError:
        raise BaselineError(f"{path}: is a directory; name a baseline .json file inside it") from None
    except PermissionError:
        raise BaselineError(
            f"{path}: permission denied reading the baseline; fix the file's permissions"
        ) from None
    except OSError as e:
        raise BaselineError(f"{path}: cannot read the baseline ({e.strerror}); check the file") from None
    if not raw.strip():
        raise BaselineError(f"{path}: the file is empty; delete it and re-record the baseline")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BaselineError(f"{path}: not UTF-8 text; delete it and re-record the baseline") from None
    except json.JSONDecodeError as e:
        raise BaselineError(
            f"{path}: invalid JSON at line {e.lineno} column {e.colno} ({e.msg}); the file may be truncated: "
            f"fix it or re-record the baseline"
        ) from None
    return _baseline_from_json(path, data)


def _git_commit(directory: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and _COMMIT.fullmatch(commit) else None


def check_saveable(
    directory: str | os.PathLike[str], fingerprint: Fingerprint, overwrite: bool, name: str = DEFAULT_NAME
) -> Path:
    """Where save_baseline would write; raises if it would have to replace a baseline not asked to."""
    path = baseline_path(directory, fingerprint, name)
    if find_baseline(directory, fingerprint, name) is not None and not overwrite:
        raise BaselineError(f"{path}: a baseline already exists; pass {OVERWRITE_FLAG} to replace it")
    return path


def save_baseline(
    directory: str | os.PathLike[str],
    fingerprint: Fingerprint,
    results: Mapping[str, BenchmarkEntry],
    overwrite: bool = False,
    name: str = DEFAULT_NAME,
) -> Path:
    """Write `results` to `<directory>/<topology-id>/<name>.json` atomically and return the path.

    The document is validated with the loader's own rules before anything is written, so a saved baseline
    always loads; the file appears complete or not at all (temp file, fsync, rename).
    """
    path = check_saveable(directory, fingerprint, overwrite, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BaselineError(f"{path.parent}: cannot create the baseline directory ({e.strerror})") from None
    document = {
        "schema_version": SCHEMA_VERSION,
        "topology_id": topology_id(fingerprint),
        "fingerprint": fingerprint.to_json(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _git_commit(path.parent),
        "benchmarks": {bench: entry.to_json() for bench, entry in results.items()},
    }
    _baseline_from_json(path, document)
    text = json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n"
    _write_atomic(path, text)
    return path


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would keep a shared baseline from the rest of the team
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise BaselineError(
            f"{path}: cannot write the baseline ({e.strerror}); fix the path or its permissions"
        ) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # The rename is durable only once the directory entry is on disk too.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# ---------------------------------------------------------------------------------------------------------
# Choosing the baseline to compare against


def find_baseline(
    root: str | os.PathLike[str], fingerprint: Fingerprint, name: str = DEFAULT_NAME
) -> Path | None:
    path = baseline_path(root, fingerprint, name)
    if path.exists() and not path.is_file():
        raise BaselineError(
            f"{path}: is a directory, not a baseline file; remove it and re-record the baseline"
        )
    return path if path.is_file() else None


def _known_ids(root: Path) -> str:
    ids = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return ", ".join(ids) or "none"


def resolve_baseline(
    root: str | os.PathLike[str],
    fingerprint: Fingerprint,
    explicit: str | None,
    name: str = DEFAULT_NAME,
) -> ResolvedBaseline | None:
    """The baseline to compare against, or None when this topology has none yet.

    `explicit` names a file or a topology id under `root`. A baseline from another topology is used only
    when named explicitly, and then flagged `foreign` so the report can say so; one found implicitly must
    match the current topology.
    """
    root = Path(root)
    current = topology_id(fingerprint)
    if explicit is None:
        found = find_baseline(root, fingerprint, name)
        if found is None:
            return None
        baseline = load_baseline(found)
        if baseline.topology_id != current:
            raise BaselineError(
                f"{found}: recorded on topology {baseline.topology_id} but this machine is {current}; "
                f"move the file to {root / baseline.topology_id} or name it explicitly to compare anyway"
            )
        return ResolvedBaseline(baseline=baseline, foreign=False)
    as_path = Path(explicit)
    if as_path.is_dir():
        target = as_path / f"{name}.json"
    elif as_path.suffix == ".json" or as_path.exists():
        target = as_path
    else:
        target = root / explicit / f"{name}.json"
        if not target.is_file():
            raise BaselineError(
                f"baseline {explicit!r}: neither a file nor a topology id with {name}.json under {root} "
                f"(known ids: {_known_ids(root)}); pass a path to a .json file or one of those ids"
            )
    baseline = load_baseline(target)
    return ResolvedBaseline(baseline=baseline, foreign=baseline.topology_id != current)
