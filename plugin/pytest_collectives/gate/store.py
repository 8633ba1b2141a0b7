"""The per-topology baseline store: `<root>/<topology-id>/<name>.json`, one file per recorded session.

A baseline holds the last few recorded runs (``--baseline-save`` adds one, KEEP_RUNS are kept), because the
gate judges a run against the spread *between* runs, which one run cannot show. Per run and benchmark it keeps
a summary (the fastest round, the median and quartiles of the seconds per iteration, rounds, iterations per
round), not the rounds: 1000 benchmarks x 5 runs stay well under 1 MB. Files are meant to be committed and
reviewed, so they are plain JSON with sorted keys, one benchmark per line. Loading is strict: a baseline
that silently lost a field would gate CI on garbage, so every defect is a one-line `BaselineError` naming
the file and the field.
The format is the JSON Schema `schemas/baseline.schema.json` (BASELINE_SCHEMA), shipped with the package;
the loader checks it, then what a schema cannot say (quartile order, UTC times, the id of the fingerprint).

The gate judges each benchmark's fastest round (``min``): measured on this machine, it repeats between
launches about twice as well as the median (docs/measurements/scripts/bench_noise_floor.py, README).
Runs recorded before the minimum was kept hold only the median; a baseline with such a run is judged on
the median (`judged_statistic`), so an older file keeps working, and moves to the minimum once its old
runs are gone.
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_collectives.atomic import write_atomic
from pytest_collectives.errors import OneLineError
from pytest_collectives.schemas import load_schema
from pytest_collectives.schemas.validation import first_error
from pytest_collectives.topology.fingerprint import Fingerprint, FingerprintError
from pytest_collectives.topology.identity import topology_id

SCHEMA_VERSION = 2
DEFAULT_NAME = "baseline"
KEEP_RUNS = 5
SITTING_GAP = datetime.timedelta(hours=1)
OVERWRITE_FLAG = "--baseline-overwrite"
_TIME_FIELDS = ("min", "median", "q1", "q3")
_COUNT_FIELDS = ("rounds", "iterations")
_DIGITS = 4  # significant digits kept: far below any spread a gate can see, and short lines to review
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")  # + and = join the baseline-key dimensions
# Published with the package (schemas/baseline.schema.json) for tools that read or write baselines.
BASELINE_SCHEMA: dict[str, Any] = load_schema("baseline.schema.json")
# What git prints is recorded only if the loader will take it back: the schema's own rule.
_COMMIT = re.compile(BASELINE_SCHEMA["$defs"]["run"]["properties"]["commit"]["pattern"])


class BaselineError(OneLineError):
    """A baseline that cannot be read, written or used; the message is one line naming the file."""


@dataclasses.dataclass(frozen=True)
class Summary:
    """One benchmark in one run: seconds per iteration (fastest round, median and quartiles) and counts."""

    median: float
    q1: float
    q3: float
    rounds: int
    iterations: int = 1
    min: float | None = None  # None: recorded before the fastest round was kept

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

    def summary(self) -> Summary:
        if len(self.samples) < 2:
            q1 = q3 = self.median
        else:
            q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return Summary(self.median, q1, q3, len(self.samples), self.iterations, self.min)


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


@dataclasses.dataclass(frozen=True)
class ResolvedBaseline:
    baseline: Baseline
    foreign: bool  # recorded on another topology; used only because the caller named it


def baseline_path(root: str | os.PathLike[str], fingerprint: Fingerprint, name: str = DEFAULT_NAME) -> Path:
    if not _NAME.fullmatch(name):
        raise BaselineError(
            f"--baseline-name {name!r}: use letters, digits, '.', '_' or '-' (it becomes a file name)"
        )
    return Path(root) / topology_id(fingerprint) / f"{name}.json"


# ---------------------------------------------------------------------------------------------------------
# Validation: the schema first (it names the first bad field), then what a schema cannot say.


def _fail(path: Path, field: str, expected: str) -> BaselineError:
    return BaselineError(f"{path}: field '{field}' must be {expected}; fix the file or re-record it")


def _named(field: str) -> str:
    return f"field '{field}'" if field else "the file"


def _baseline_from_json(path: Path, data: Any) -> Baseline:
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
        raise _fail(path, f"fingerprint.{e.field}", e.expected) from None
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
        raise _fail(path, f"{field}.created", "a UTC ISO 8601 time such as 2025-01-31T12:00:00+00:00")
    benchmarks = {}
    for name, summary in data["benchmarks"].items():
        if not summary["q1"] <= summary["median"] <= summary["q3"]:
            raise _fail(path, f"{field}.benchmarks.{name}.median", "between q1 and q3")
        if summary.get("min", 0) > summary["q1"]:
            raise _fail(path, f"{field}.benchmarks.{name}.min", "at most q1")
        benchmarks[name] = Summary(**summary)
    return Run(data["created"], data["commit"], benchmarks, data.get("boot"))


def judged_statistic(runs: Sequence[Run]) -> str:
    """What the gate judges of each benchmark: its fastest round ("min") where every run kept it, else the
    median (a run recorded before the minimum was kept)."""
    kept = all(s.min is not None for run in runs for s in run.benchmarks.values())
    return "min" if kept else "median"


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
) -> Baseline | None:
    """The baseline a new run would be added to (None: a new file, or a fresh start with ``overwrite``).

    Raises when the file is there but can't be extended: unreadable, another format or another topology
    (only ``overwrite`` replaces it), or a directory in its place.
    """
    path = baseline_path(directory, fingerprint, name)
    if find_baseline(directory, fingerprint, name) is None or overwrite:
        return None
    try:
        existing = load_baseline(path)
    except BaselineError as exc:
        raise BaselineError(f"{exc} (or pass {OVERWRITE_FLAG} to start a new baseline there)") from None
    if existing.topology_id != topology_id(fingerprint):
        raise BaselineError(
            f"{path}: recorded on topology {existing.topology_id}, not this machine's; "
            f"pass {OVERWRITE_FLAG} to start a new baseline there"
        )
    return existing


def render(topology: str, fingerprint: Fingerprint, runs: Sequence[Run]) -> str:
    """The file's text: sorted keys, indented, and one benchmark summary per line, so that recording a run
    adds a block of lines and dropping the oldest removes one (a review reads the diff line by line)."""
    lines: dict[str, str] = {}

    def one_line(summary: Summary) -> str:
        key = f"\u0000{len(lines)}"
        lines[json.dumps(key)] = json.dumps(summary.to_json(), sort_keys=True, allow_nan=False)
        return key

    document = {
        "schema_version": SCHEMA_VERSION,
        "topology_id": topology,
        "fingerprint": fingerprint.to_json(),
        "runs": [
            {
                "created": run.created,
                "commit": run.commit,
                **({"boot": run.boot} if run.boot else {}),
                "benchmarks": {n: one_line(s) for n, s in run.benchmarks.items()},
            }
            for run in runs
        ],
    }
    text = json.dumps(document, indent=2, sort_keys=True, allow_nan=False)
    return re.sub(r'"\\u0000\d+"', lambda m: lines[m.group(0)], text) + "\n"


def save_baseline(
    directory: str | os.PathLike[str],
    fingerprint: Fingerprint,
    results: Mapping[str, BenchmarkEntry],
    overwrite: bool = False,
    name: str = DEFAULT_NAME,
    keep: int = KEEP_RUNS,
) -> tuple[Path, int]:
    """Add this run to `<directory>/<topology-id>/<name>.json`, keeping the last ``keep`` runs (with
    ``overwrite``: this run alone); returns the path and the number of runs it now holds.

    The document is validated with the loader's own rules before anything is written, so a saved baseline
    always loads; the file appears complete or not at all (temp file, fsync, rename).
    """
    if keep < 1:
        raise BaselineError(f"keep {keep} run(s): a baseline keeps at least one run")
    existing = check_saveable(directory, fingerprint, overwrite, name)
    path = baseline_path(directory, fingerprint, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BaselineError(f"{path.parent}: cannot create the baseline directory ({e.strerror})") from None
    for bench, entry in results.items():
        values = entry.samples
        if not values or not all(math.isfinite(v) and v > 0 for v in values):
            raise _fail(path, f"benchmarks.{bench}.samples", "a non-empty list of positive finite seconds")
    run = Run(
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=_git_commit(path.parent),
        benchmarks={bench: entry.summary() for bench, entry in sorted(results.items())},
        boot=_boot_id(),
    )
    runs = [*(existing.runs if existing else ()), run][-keep:]
    text = render(topology_id(fingerprint), fingerprint, runs)
    _baseline_from_json(path, json.loads(text))
    _write_atomic(path, text)
    return path, len(runs)


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def sittings(runs: Sequence[Run]) -> list[int]:
    """A sitting label for each run: runs recorded in one boot, each within SITTING_GAP of the one before,
    are one sitting (they share process layout, clocks and neighbours, so they agree more closely than a
    machine agrees with itself another day). Runs without a boot id go by time alone."""
    labels, label = [0] * len(runs), -1
    previous: Run | None = None
    for i in sorted(range(len(runs)), key=lambda i: runs[i].created):
        run = runs[i]
        other_boot = bool(previous and run.boot and previous.boot and run.boot != previous.boot)
        if previous is None or other_boot or _parse(run.created) - _parse(previous.created) > SITTING_GAP:
            label += 1
        labels[i], previous = label, run
    return labels


def _parse(created: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(created)


def _write_atomic(path: Path, text: str) -> None:
    try:
        write_atomic(path, text)
    except OSError as e:
        raise BaselineError(
            f"{path}: cannot write the baseline ({e.strerror}); fix the path or its permissions"
        ) from None


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


def recorded_fingerprints(root: str | os.PathLike[str], name: str = DEFAULT_NAME) -> list[Fingerprint]:
    """The machines recorded under ``root`` with a baseline called ``name``; one that can't be read is
    left out here (it is named when it is this machine's, or asked for)."""
    found = []
    for path in sorted(Path(root).glob(f"*/{name}.json")):
        try:
            found.append(load_baseline(path).fingerprint)
        except BaselineError:
            continue
    return found


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
