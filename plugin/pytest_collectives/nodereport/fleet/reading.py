"""A fleet's node reports read into figures, each with the direction that is better:

- `p2p GPU0->GPU1`: every directed pair of the P2P matrix, GB/s (higher is better);
- `p2p class NV4 median`: the median GB/s of each link class of the node;
- `busbw all_reduce n=8 @ 1 MiB`: each collective's bus bandwidth per message size;
- `time <benchmark>`: each benchmark's median time (lower is better), judged as its speed 1/t, so that a
  node twice as slow scores 0.5 just as a link at half the bandwidth does.

Every report is checked against REPORT_SCHEMA first, and all of one topology: a bad one is a one-line
FleetError naming the file.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_collectives.nodereport.fleet.stats import (
    HIGHER,
    LOWER,
    MIN_NODES,
    Figure,
    FleetError,
    Node,
)
from pytest_collectives.nodereport.outputs.schema import REPORT_SCHEMA, ReportError, validate
from pytest_collectives.nodereport.outputs.sizes import human_bytes

_WHERE_FROM = "give the report.json that `pytest --node-report DIR` writes"


def report_figures(report: Mapping[str, Any]) -> dict[str, Figure]:
    """Every figure of a node report (REPORT_SCHEMA), by name; see the module docstring for the names."""
    found: dict[str, list[float]] = {}
    kinds: dict[str, tuple[str, str]] = {}

    def add(name: str, value: float, direction: str, unit: str) -> None:
        found.setdefault(name, []).append(float(value))
        kinds[name] = (direction, unit)

    p2p = report["p2p"]
    if p2p is not None:
        labels, matrix, classes = p2p["devices"], p2p["matrix"], p2p["classes"]
        by_class: dict[str, list[float]] = {}
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                if i != j and value is not None:  # the diagonal is local memory; null is unmeasured
                    add(f"p2p {labels[i]}->{labels[j]}", value, HIGHER, "GB/s")
                    by_class.setdefault(classes[i][j], []).append(value)
        for link, values in by_class.items():
            add(f"p2p class {link} median", statistics.median(values), HIGHER, "GB/s")
    for row in report["collectives"]:
        add(f"busbw {row['name']} @ {human_bytes(row['bytes'])}", row["busbw_GBps"], HIGHER, "GB/s")
    for row in report["baseline"]["rows"]:
        add(f"time {row['benchmark']}", row["now_median_s"], LOWER, "s")
    # A name measured twice in one report (two rows alike) counts once, by its median: order-free.
    return {name: Figure(statistics.median(v), *kinds[name]) for name, v in found.items()}


def _read(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_bytes()
    except OSError as e:
        raise FleetError(f"{path}: cannot read it ({e.strerror or e}): {_WHERE_FROM}") from None
    try:
        report = json.loads(text)
    except (ValueError, RecursionError) as e:  # bad JSON, bad UTF-8, absurd nesting
        raise FleetError(f"{path}: not valid JSON ({e}): {_WHERE_FROM}") from None
    try:
        validate(report, REPORT_SCHEMA)
    except ReportError as e:
        what = str(e).removeprefix("report data: ")
        raise FleetError(f"{path}: not a node report ({what}): {_WHERE_FROM}") from None
    p2p = report["p2p"]
    if p2p is not None:
        n = len(p2p["devices"])
        for key in ("matrix", "classes"):
            if len(p2p[key]) != n or any(len(row) != n for row in p2p[key]):
                raise FleetError(f"{path}: p2p.{key} must be {n} x {n}, one row and column per device")
        for i, row in enumerate(p2p["matrix"]):
            for j, value in enumerate(row):
                if i != j and value is not None and value < 0:
                    raise FleetError(f"{path}: p2p.matrix[{i}][{j}] must be a bandwidth >= 0, got {value}")
    return report


def _node_name(path: str, report: Mapping[str, Any]) -> str:
    return report.get("host") or Path(path).resolve().parent.name or path


def load_reports(paths: Sequence[str | os.PathLike[str]]) -> list[Node]:
    """The nodes of `paths` (report.json files of one topology), sorted by name; FleetError on bad input.

    A node is named by its report's "host", else by the folder holding its report.json; nodes that would
    share a name are named by their paths instead.
    """
    names = [os.fspath(p) for p in paths]
    if len(names) < MIN_NODES:
        given = ", ".join(names) or "none"
        raise FleetError(
            f"{len(names)} report(s) given ({given}): a fleet needs at least {MIN_NODES} nodes of one "
            f"topology, so that a median can outvote one bad node"
        )
    seen: dict[str, str] = {}
    for path in names:
        key = os.path.realpath(path)
        if key in seen:
            raise FleetError(f"{path}: given twice (also as {seen[key]}): list each node's report once")
        seen[key] = path
    reports = {path: _read(path) for path in names}
    _one_topology(reports)
    labels = {path: _node_name(path, report) for path, report in reports.items()}
    # Paths are unique, so a few rounds leave every name unique; each round only replaces names by paths.
    while True:
        counts: dict[str, int] = {}
        for label in labels.values():
            counts[label] = counts.get(label, 0) + 1
        shared = [path for path, label in labels.items() if counts[label] > 1 and label != path]
        if not shared:
            break
        for path in shared:
            labels[path] = path
    nodes = [
        Node(labels[path], path, report["topology_id"], report_figures(report), report.get("host") or "")
        for path, report in reports.items()
    ]
    return sorted(nodes, key=lambda n: (n.name, n.path))


def repeated_hosts(nodes: Sequence[Node]) -> list[str]:
    """A line for each host whose reports were given more than once: one node's runs count as several
    nodes in the fleet's medians, which then outvote the others by that node alone."""
    paths: dict[str, list[str]] = {}
    for node in nodes:
        if node.host:
            paths.setdefault(node.host, []).append(node.path)
    return [
        f"{host}: {len(given)} reports of this one host ({', '.join(sorted(given))}); its figures count "
        f"{len(given)} times in the fleet's medians: give one report a node"
        for host, given in sorted(paths.items())
        if len(given) > 1
    ]


def _one_topology(reports: Mapping[str, Mapping[str, Any]]) -> None:
    ids: dict[str, list[str]] = {}
    for path, report in reports.items():
        ids.setdefault(report["topology_id"], []).append(path)
    if len(ids) == 1:
        return
    # The most common id is the fleet's (ties: the smallest), so the message is the same in any order.
    major = min(ids, key=lambda t: (-len(ids[t]), t))
    odd = sorted(path for tid, paths in ids.items() if tid != major for path in paths)
    more = f" (and {len(odd) - 1} more report(s) of other topologies)" if len(odd) > 1 else ""
    theirs = reports[odd[0]]["topology_id"]
    raise FleetError(
        f"{odd[0]}: topology_id {theirs!r} differs from {major!r} of {len(ids[major])} of the "
        f"{len(reports)} reports{more}: a fleet compares nodes of one topology, so run it once per topology"
    )
