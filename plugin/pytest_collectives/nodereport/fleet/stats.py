"""The fleet's statistics: each figure's median over the nodes of one topology, and the nodes far below it.

The figures are those fleet.py reads from each node's report.json. For each figure present in at least
MIN_NODES nodes, the fleet median and MAD of the scores are taken. A node's figure is an outlier when its
ratio to the median is below `warn_below` (WARN) or `fail_below` (FAIL) *and* its modified z-score 0.6745
(median - x) / MAD exceeds checks.MODIFIED_Z, as peers.py judges a pair against its class: being well below
the median is not enough where the fleet itself spreads that much (a benchmark on a busy host). The MAD used
is at least the typical relative MAD of the figure's kind (its first word: all P2P pairs, all busbw figures,
...), because a MAD over a dozen nodes is itself noisy. With a MAD of 0 the fraction alone decides. A node's
verdict is its worst figure's.

The result depends only on the set of reports, never on their order: nodes are sorted by name, medians are
order-free, and the JSON has sorted keys, so the same reports always give the same verdicts and a
byte-identical fleet.json.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pytest_collectives.errors import OneLineError
from pytest_collectives.nodereport.judging.checks import below_peers, modified_z, robust, status_for
from pytest_collectives.verdict import PASS, STATUSES, Check

DEFAULT_FAIL_BELOW = 0.75
DEFAULT_WARN_BELOW = 0.90
# A median of two cannot say which of them is off; three is the least that outvotes one bad node.
MIN_NODES = 3
HIGHER, LOWER = "higher", "lower"  # which way a figure is better
_DIGITS = 6  # significant digits kept in fleet.json: enough to compare, few enough to read


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
    host: str = ""  # the report's own, where it names one


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


def check_levels(fail_below: float, warn_below: float) -> None:
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
    check_levels(fail_below, warn_below)
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
