"""Which nodes of one topology are slower than the rest of the fleet.

A vendor validating many nodes of one design has, in their `report.json` files (node_report), the best
reference a node can get: the same figure measured on its siblings. A node's own checks (nodecheck) catch a
link that is slow next to the node's other links; they cannot catch a node that is uniformly a little slow,
or one whose collectives or benchmarks lag while its links look fine. The fleet can.

    python -m pytest_collectives.nodereport.fleet nodes/*/report.json --out fleet/

Figures per node, each with the direction that is better:

- `p2p GPU0->GPU1`: every directed pair of the P2P matrix, GB/s (higher is better);
- `p2p class NV4 median`: the median GB/s of each link class of the node;
- `busbw all_reduce n=8 @ 1 MiB`: each collective's bus bandwidth per message size;
- `time <benchmark>`: each benchmark's median time (lower is better), judged as its speed 1/t, so that a
  node twice as slow scores 0.5 just as a link at half the bandwidth does.

For each figure present in at least MIN_NODES nodes, the fleet median and MAD of the scores are taken. A
node's figure is an outlier when its ratio to the median is below `warn_below` (WARN) or `fail_below` (FAIL)
*and* its modified z-score 0.6745 (median - x) / MAD exceeds nodecheck.MODIFIED_Z, as nodecheck judges a
pair against its class: being well below the median is not enough where the fleet itself spreads that much
(a benchmark on a busy host). The MAD used is at least the typical relative MAD of the figure's kind (its
first word: all P2P pairs, all busbw figures, ...), because a MAD over a dozen nodes is itself noisy. With a
MAD of 0 the fraction alone decides. A node's verdict is its worst figure's.

The result depends only on the set of reports, never on their order: nodes are sorted by name, medians are
order-free, and the JSON has sorted keys, so the same reports always give the same verdicts and a
byte-identical fleet.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from pytest_collectives.atomic import write_atomic
from pytest_collectives.errors import OneLineError
from pytest_collectives.nodereport import pages
from pytest_collectives.nodereport.checks import (
    FAIL,
    MODIFIED_Z,
    PASS,
    STATUSES,
    WARN,
    Check,
    below_peers,
    modified_z,
    robust,
    status_for,
)
from pytest_collectives.nodereport.write import REPORT_SCHEMA, ReportError, human_bytes, validate

SCHEMA_VERSION = 1
JSON_NAME, HTML_NAME = "fleet.json", "fleet.html"
DEFAULT_FAIL_BELOW = 0.75
DEFAULT_WARN_BELOW = 0.90
# A median of two cannot say which of them is off; three is the least that outvotes one bad node.
MIN_NODES = 3
HIGHER, LOWER = "higher", "lower"  # which way a figure is better
_DIGITS = 6  # significant digits kept in fleet.json: enough to compare, few enough to read

_WHERE_FROM = "give the report.json that `pytest --node-report DIR` writes"


class FleetError(OneLineError):
    """Bad fleet input; the message is one line naming the file (or option) and what to fix."""


@dataclasses.dataclass(frozen=True)
class Figure:
    """One measured figure of one node: `value` in `unit`, better when `direction` says."""

    value: float
    direction: str  # HIGHER or LOWER
    unit: str

    @property
    def score(self) -> float:
        """Higher is better for every figure, so one rule judges bandwidths and times alike."""
        return self.value if self.direction == HIGHER else 1.0 / self.value


@dataclasses.dataclass(frozen=True)
class Node:
    """One node's report as the fleet sees it: a unique name, where it came from, and its figures."""

    name: str
    path: str
    topology_id: str
    figures: Mapping[str, Figure]


@dataclasses.dataclass(frozen=True)
class FigureStats:
    """The fleet's figures for one figure name: median of the values (in their unit) and relative MAD."""

    name: str
    direction: str
    unit: str
    nodes: int
    median: float  # in the figure's unit; for a time, 1 / the median speed
    mad_ratio: float  # MAD of the scores / their median: the fleet's own spread, as a fraction

    def to_json(self) -> dict[str, Any]:
        return {
            "direction": self.direction,
            "unit": self.unit,
            "nodes": self.nodes,
            "median": _round(self.median),
            "mad_ratio": _round(self.mad_ratio),
        }


@dataclasses.dataclass(frozen=True)
class NodeVerdict:
    """A node's verdict and its outlier figures (one Check each, worst first)."""

    name: str
    path: str
    verdict: str
    judged: int  # how many of its figures were judged
    outliers: tuple[Check, ...]


@dataclasses.dataclass(frozen=True)
class FleetResult:
    topology_id: str
    fail_below: float
    warn_below: float
    nodes: tuple[NodeVerdict, ...]  # sorted by name
    stats: Mapping[str, FigureStats]  # the judged figures
    unjudged: tuple[str, ...]  # figures present in fewer than MIN_NODES nodes

    @property
    def verdict(self) -> str:
        return max((n.verdict for n in self.nodes), key=STATUSES.index, default=PASS)

    def counts(self) -> dict[str, int]:
        return {s: sum(n.verdict == s for n in self.nodes) for s in STATUSES}


def _round(value: float) -> float:
    return float(f"{value:.{_DIGITS}g}")


# ---------------------------------------------------------------------------------------------------------
# Reading


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
        Node(labels[path], path, report["topology_id"], report_figures(report))
        for path, report in reports.items()
    ]
    return sorted(nodes, key=lambda n: (n.name, n.path))


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


# ---------------------------------------------------------------------------------------------------------
# Judging


def _check_levels(fail_below: float, warn_below: float) -> None:
    if not (0 < fail_below <= warn_below <= 1):
        raise FleetError(
            f"--fail-below {fail_below} and --warn-below {warn_below}: need 0 < fail-below <= warn-below <= 1"
        )


def _outlier(
    name: str, figure: Figure, stats: FigureStats, ratio: float, z: float | None, status: str
) -> Check:
    median = f"the fleet median {stats.median:.4g} {figure.unit} of {stats.nodes} nodes"
    if figure.direction == LOWER:
        measured = f"takes {figure.value:.4g} s, {1 / ratio:.2f}x {median}: {ratio:.0%} of its speed"
    else:
        measured = f"measures {figure.value:.4g} {figure.unit}, {ratio:.0%} of {median}"
    spread = (
        f"modified z-score {z:.1f}; the fleet spreads by {stats.mad_ratio:.1%}"
        if z is not None
        else "the other nodes all measure the median"
    )
    return Check(
        name,
        status,
        f"{name} {measured} ({spread}).",
        {
            "value": _round(figure.value),
            "unit": figure.unit,
            "direction": figure.direction,
            "fleet_median": _round(stats.median),
            "ratio": round(ratio, 4),
            "z": None if z is None else round(z, 2),
        },
    )


def _kind(figure_name: str) -> str:
    return figure_name.split(" ", 1)[0]


def judge_fleet(
    nodes: Sequence[Node], fail_below: float = DEFAULT_FAIL_BELOW, warn_below: float = DEFAULT_WARN_BELOW
) -> FleetResult:
    """Each node's verdict against the fleet's median of each figure (see the module docstring).

    `ratio` is the node's score over the median score (below 1 is worse, for times too: it is the speed
    ratio); FAIL below `fail_below`, WARN below `warn_below`, and only where the modified z-score exceeds
    MODIFIED_Z or the fleet has no spread (MAD 0).
    """
    _check_levels(fail_below, warn_below)
    if len(nodes) < MIN_NODES:
        raise FleetError(f"{len(nodes)} node(s): a fleet needs at least {MIN_NODES} nodes of one topology")
    ordered = sorted(nodes, key=lambda n: (n.name, n.path))
    names = [n.name for n in ordered]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise FleetError(f"node name(s) {', '.join(twice)} used twice: each node needs its own name")
    topologies = sorted({n.topology_id for n in ordered})
    if len(topologies) > 1:
        raise FleetError(f"nodes of {len(topologies)} topologies ({', '.join(topologies)}): give one")
    outliers: dict[str, list[Check]] = {n.name: [] for n in ordered}
    stats: dict[str, FigureStats] = {}
    unjudged = []
    columns = {}
    for figure_name in sorted({f for n in ordered for f in n.figures}):
        present = [(n, n.figures[figure_name]) for n in ordered if figure_name in n.figures]
        median, mad = robust(np.array([f.score for _, f in present]))
        # Every node measured nothing: no node can be worse than that.
        if len(present) < MIN_NODES or median <= 0:
            unjudged.append(figure_name)
        else:
            columns[figure_name] = (present, median, mad)
    # A MAD over a dozen nodes can come out at a third of the true spread, and then a healthy node 15%
    # below the median looks like an outlier. Figures of one kind (every P2P pair, every busbw) spread
    # alike, so a figure's spread is taken as at least the typical relative spread of its kind.
    relative: dict[str, list[float]] = {}
    for figure_name, (_, median, mad) in columns.items():
        relative.setdefault(_kind(figure_name), []).append(mad / median)
    typical = {kind: float(np.median(values)) for kind, values in relative.items()}
    for figure_name, (present, median, own_mad) in columns.items():
        direction, unit = present[0][1].direction, present[0][1].unit
        mad = max(own_mad, typical[_kind(figure_name)] * median)
        shown = median if direction == HIGHER else 1.0 / median
        stats[figure_name] = one = FigureStats(
            figure_name, direction, unit, len(present), shown, mad / median
        )
        for node, figure in present:
            if below_peers(figure.score, median, mad, warn_below):
                ratio = figure.score / median
                z = modified_z(figure.score, median, mad)
                status = status_for(ratio, fail_below, warn_below)
                outliers[node.name].append(_outlier(figure_name, figure, one, ratio, z, status))
    verdicts = []
    for node in ordered:
        checks = sorted(
            outliers[node.name],
            key=lambda c: (-STATUSES.index(c.status), c.details["ratio"], c.name),
        )
        verdict = max((c.status for c in checks), key=STATUSES.index, default=PASS)
        judged = sum(1 for f in node.figures if f in stats)
        verdicts.append(NodeVerdict(node.name, node.path, verdict, judged, tuple(checks)))
    return FleetResult(
        ordered[0].topology_id, fail_below, warn_below, tuple(verdicts), stats, tuple(unjudged)
    )


# ---------------------------------------------------------------------------------------------------------
# Output


def to_json(result: FleetResult) -> dict[str, Any]:
    """fleet.json's document; dump it with sort_keys (write_fleet does) for byte-identical files."""
    return {
        "schema_version": SCHEMA_VERSION,
        "topology_id": result.topology_id,
        "fail_below": result.fail_below,
        "warn_below": result.warn_below,
        "modified_z": MODIFIED_Z,
        "verdict": result.verdict,
        "counts": result.counts(),
        "nodes": [
            {
                "name": n.name,
                "path": n.path,
                "verdict": n.verdict,
                "figures_judged": n.judged,
                "outliers": [{"figure": c.name, "status": c.status, **c.details} for c in n.outliers],
            }
            for n in result.nodes
        ],
        "medians": {name: s.to_json() for name, s in sorted(result.stats.items())},
        "unjudged": list(result.unjudged),
    }


def dumps(result: FleetResult) -> str:
    """fleet.json's text: indent 2, sorted keys, so the same reports give the same bytes."""
    return json.dumps(to_json(result), indent=2, sort_keys=True, allow_nan=False) + "\n"


def render_html(result: FleetResult) -> str:
    """fleet.html (templates/fleet.html.j2): self-contained, no script, nothing fetched; the template escapes
    every datum."""
    node_rows = [
        ({"name": n.name, "anchor": _anchor(i) if n.outliers else None}, n.verdict, len(n.outliers), n.judged)
        for i, n in enumerate(result.nodes)
    ]
    flagged = [
        {
            "anchor": _anchor(i),
            "name": n.name,
            "verdict": n.verdict,
            "path": n.path,
            "outliers": [
                (
                    c.name,
                    c.status,
                    f"{c.details['value']:.4g} {c.details['unit']}",
                    f"{c.details['fleet_median']:.4g} {c.details['unit']}",
                    f"{c.details['ratio']:.3f}",
                    "-" if c.details["z"] is None else f"{c.details['z']:.1f}",
                )
                for c in n.outliers
            ],
        }
        for i, n in enumerate(result.nodes)
        if n.outliers
    ]
    return pages.render(
        "fleet.html.j2",
        topology_id=result.topology_id,
        verdict=result.verdict,
        counts=result.counts(),
        judged=len(result.stats),
        warn_below=f"{result.warn_below:.0%}",
        fail_below=f"{result.fail_below:.0%}",
        modified_z=MODIFIED_Z,
        node_rows=node_rows,
        flagged=flagged,
        unjudged=[(name,) for name in result.unjudged],
        min_nodes=MIN_NODES,
    )


def _anchor(index: int) -> str:
    # By position, not by name: a node's name is data and may hold anything.
    return f"node-{index}"


def write_fleet(directory: str | os.PathLike[str], result: FleetResult) -> dict[str, Path]:
    """Write fleet.json and fleet.html into `directory` (created if needed), each atomically."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, text in ((JSON_NAME, dumps(result)), (HTML_NAME, render_html(result))):
        write_atomic(folder / name, text)
        written[name] = folder / name
    return written


# ---------------------------------------------------------------------------------------------------------
# Command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, as for every other bad input, rather than argparse's usage block and SystemExit.
        raise FleetError(f"{message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m pytest_collectives.nodereport.fleet",
        description="Compare the node reports (report.json) of one topology and name the nodes slower than "
        "the fleet.",
    )
    parser.add_argument("reports", nargs="*", metavar="REPORT", help="report.json of each node (3 or more)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for fleet.json and fleet.html")
    parser.add_argument(
        "--fail-below",
        type=float,
        default=DEFAULT_FAIL_BELOW,
        help=f"FAIL a figure below this fraction of the fleet median (default {DEFAULT_FAIL_BELOW})",
    )
    parser.add_argument(
        "--warn-below",
        type=float,
        default=DEFAULT_WARN_BELOW,
        help=f"WARN a figure below this fraction of the fleet median (default {DEFAULT_WARN_BELOW})",
    )
    return parser


def _summary(result: FleetResult, written: Mapping[str, Path]) -> str:
    counts = result.counts()
    lines = [
        f"fleet of {len(result.nodes)} nodes ({result.topology_id}): {result.verdict} "
        f"({counts[FAIL]} FAIL, {counts[WARN]} WARN, {counts[PASS]} PASS)"
    ]
    for node in result.nodes:
        if node.outliers:
            worst = node.outliers[0]
            lines.append(
                f"  {node.verdict} {node.name}: {len(node.outliers)} outlier figure(s), worst "
                f"{worst.name} at {worst.details['ratio']:.0%} of the fleet median"
            )
    lines.append("wrote " + " and ".join(str(p) for p in written.values()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """0: no node fails; 1: a node fails; 2: bad input (one line on stderr)."""
    try:
        args = _parser().parse_args(argv)
        _check_levels(args.fail_below, args.warn_below)
        result = judge_fleet(load_reports(args.reports), args.fail_below, args.warn_below)
        written = write_fleet(args.out, result)
    except FleetError as e:
        print(f"fleet: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"fleet: --out {args.out}: cannot write there ({e.strerror or e}): name a writable folder",
              file=sys.stderr)  # fmt: skip
        return 2
    print(_summary(result, written))
    return 1 if result.verdict == FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
