"""The per-topology baseline store: `<root>/<topology-id>/<name>.json`, one file per recorded session.

A baseline holds the last few recorded runs (``--baseline-save`` adds one, KEEP_RUNS are kept), because the
gate judges a run against the spread *between* runs, which one run cannot show. Files are meant to be
committed and reviewed, so they are plain JSON with sorted keys, one benchmark per line, written atomically
and never over another topology's file without OVERWRITE_FLAG. What a file holds and how it is read back
strictly is baseline_format.py's; which baseline a run is judged against, choosing.py's.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_collectives.atomic import write_atomic
from pytest_collectives.gate.baseline_format import (
    COMMIT_PATTERN,
    OVERWRITE_FLAG,
    SCHEMA_VERSION,
    Baseline,
    BaselineError,
    BenchmarkEntry,
    Run,
    Summary,
    baseline_from_json,
    field_error,
)
from pytest_collectives.topology.fingerprint import Fingerprint
from pytest_collectives.topology.identity import topology_id

DEFAULT_NAME = "baseline"
KEEP_RUNS = 5
SITTING_GAP = datetime.timedelta(hours=1)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")  # + and = join the baseline-key dimensions


def baseline_path(root: str | os.PathLike[str], fingerprint: Fingerprint, name: str = DEFAULT_NAME) -> Path:
    if not _NAME.fullmatch(name):
        raise BaselineError(
            f"--baseline-name {name!r}: use letters, digits, '.', '_' or '-' (it becomes a file name)"
        )
    return Path(root) / topology_id(fingerprint) / f"{name}.json"


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
    return baseline_from_json(path, data)


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
    return commit if done.returncode == 0 and COMMIT_PATTERN.fullmatch(commit) else None


def check_saveable(
    directory: str | os.PathLike[str],
    fingerprint: Fingerprint,
    overwrite: bool,
    name: str = DEFAULT_NAME,
    keep: int | None = None,
) -> Baseline | None:
    """The baseline a new run would be added to (None: a new file, or a fresh start with ``overwrite``).

    Raises when the file is there but can't be extended: unreadable, another format or another topology
    (only ``overwrite`` replaces it), or a directory in its place; and where the run would drop one of
    the file's (it holds KEEP_RUNS) with no ``keep`` asked for: a committed baseline's runs are never lost
    to a user's save unless they said how many to keep.
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
    if keep is None and len(existing.runs) >= KEEP_RUNS:
        oldest = existing.runs[-KEEP_RUNS]
        raise BaselineError(
            f"{path} holds {len(existing.runs)} runs: saving this one would drop its oldest (recorded "
            f"{oldest.created}{f' at commit {oldest.commit}' if oldest.commit else ''}); record a baseline "
            f"of your own with --baseline-name NAME, keep the last {KEEP_RUNS} with --baseline-keep "
            f"{KEEP_RUNS}, or start afresh with {OVERWRITE_FLAG}"
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
    keep: int | None = None,
) -> tuple[Path, int]:
    """Add this run to `<directory>/<topology-id>/<name>.json`, keeping the last ``keep`` runs (with
    ``overwrite``: this run alone; None: KEEP_RUNS, and never one dropped, check_saveable); returns the path
    and the number of runs it now holds.

    The document is validated with the loader's own rules before anything is written, so a saved baseline
    always loads; the file appears complete or not at all (temp file, fsync, rename).
    """
    if keep is not None and keep < 1:
        raise BaselineError(f"keep {keep} run(s): a baseline keeps at least one run")
    existing = check_saveable(directory, fingerprint, overwrite, name, keep)
    path = baseline_path(directory, fingerprint, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BaselineError(f"{path.parent}: cannot create the baseline directory ({e.strerror})") from None
    for bench, entry in results.items():
        values = entry.samples
        if not values or not all(math.isfinite(v) and v > 0 for v in values):
            field = f"benchmarks.{bench}.samples"
            raise field_error(path, field, "a non-empty list of positive finite seconds")
    run = Run(
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=_git_commit(path.parent),
        benchmarks={bench: entry.summary() for bench, entry in sorted(results.items())},
        boot=_boot_id(),
    )
    runs = [*(existing.runs if existing else ()), run][-(keep or KEEP_RUNS) :]
    text = render(topology_id(fingerprint), fingerprint, runs)
    baseline_from_json(path, json.loads(text))
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

def find_baseline(
    root: str | os.PathLike[str], fingerprint: Fingerprint, name: str = DEFAULT_NAME
) -> Path | None:
    path = baseline_path(root, fingerprint, name)
    if path.exists() and not path.is_file():
        raise BaselineError(
            f"{path}: is a directory, not a baseline file; remove it and re-record the baseline"
        )
    return path if path.is_file() else None

