"""Which baseline a run is judged against: this topology's, or, only where the caller names it, another's
(a ResolvedBaseline says which); a name that finds none is an error listing the topologies that have one.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from pytest_collectives.gate.baseline_format import Baseline, BaselineError
from pytest_collectives.gate.store import DEFAULT_NAME, find_baseline, load_baseline
from pytest_collectives.topology.fingerprint import Fingerprint
from pytest_collectives.topology.identity import topology_id


@dataclasses.dataclass(frozen=True)
class ResolvedBaseline:
    baseline: Baseline
    foreign: bool  # recorded on another topology; used only because the caller named it


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
