"""Verdicts on a node's GPU-to-GPU bandwidth that a hardware vendor can act on.

The input is an all-pairs bandwidth matrix in GB/s (as `p2pBandwidthLatencyTest` prints it; the diagonal is
the GPU's own memory and is ignored) and the link class of every pair from `nvidia-smi topo -m` (NV#, PIX,
PXB, PHB, NODE, SYS). A bandwidth means something only next to what it should be, and a node often has no
stored baseline, so three references are used, strongest first:

1. its own peers: pairs of one link class should run alike, so a pair far below its class median is a bad
   link (`link_outliers`), and a GPU slow on nearly all of its links is one bad device (`device_outliers`);
2. a baseline: the class figures of a known-good node of the same topology (`class_figures` makes one);
3. sanity floors per link class (`EXPECTED_GBPS`), so that a node whose links are all equally slow is caught.

`judge_node` combines them. Every `Check` names the pair or GPU, the measured and the expected figure, and
what to look at.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from pytest_collectives.topology.machine import UNKNOWN_LINK, link_rank, normalize_link

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
STATUSES = (PASS, WARN, FAIL)  # best first
# The lines come from the spread healthy pairs show. In the seed 8 x RTX 3090 matrix the NV4 pairs sit within
# 0.4% of their median and the SYS pairs (staged through host memory) within -7% and +11% (MAD 3%); +-5% noise
# on top of that (a repeat of the measurement) still leaves every healthy pair above 0.88 x its class median.
# So 0.90 is where doubt starts, and 0.75 is far below anything healthy: no vendor ships a node with a quarter
# of a bond's bandwidth gone. A pair must also stand out from its class's own spread (MODIFIED_Z).
DEFAULT_THRESHOLD = 0.75  # a pair or device below this fraction of its reference FAILs
DEFAULT_WARN = 0.9  # ... and below this one WARNs
# A class median stands for "what a healthy pair reaches" only when healthy pairs can outvote a bad one.
MIN_PEER_PAIRS = 3
DEVICE_FRACTION = 0.75  # a GPU with at least this share of its links slow is reported as one device
# Iglewicz and Hoaglin's cut-off for the modified z-score 0.6745 (x - median) / MAD: besides being well below
# the median, an outlier must stand out from the spread the class shows anyway (NUMA distance, slots).
MODIFIED_Z = 3.5
_MAD_SCALE = 0.6745

# Rough sanity floors in GB/s, per direction ("unidirectional") and with both directions at once
# ("bidirectional"), as p2pBandwidthLatencyTest reports them. Floors, not targets: a healthy link of the
# oldest hardware still in service clears them, so falling below one means something is broken, while
# clearing one proves little (peers and baselines judge that).
# - NVLink carries 20 GB/s per link and direction (NVLink 1, P100) or 25 (NVLink 2-4: V100, A100, H100), the
#   GeForce RTX 3090 bridge about 14 (112.5 GB/s over its 4 links, both directions). NV# scales the per-link
#   floor of 8 by #; the 8 x RTX 3090 fixture measures 101.7 GB/s bidirectional over NV4, 12.7 per link and
#   direction.
# - PCIe Gen3 x16 carries 15.75 GB/s per direction (8 GT/s x 16 lanes x 128/130 / 8 bits), Gen4 twice that.
#   Copies between GeForce cards, or across sockets, are staged through host memory and reach a fraction of
#   it: the fixture's SYS pairs measure 7.4-8.7 GB/s bidirectional. The floors step down with each hop further
#   from the GPU, and bidirectional is 1.6 x, not 2 x, because staged copies share host memory both ways. A
#   Gen3 link trained down to x4 (3.9 GB/s) or to Gen1 (4 GB/s) falls below the PIX and PXB floors.
EXPECTED_GBPS: dict[str, dict[str, float]] = {
    "NV#": {"unidirectional": 8.0, "bidirectional": 16.0},  # per NVLink in the bonded set
    "PIX": {"unidirectional": 5.0, "bidirectional": 8.0},
    "PXB": {"unidirectional": 5.0, "bidirectional": 8.0},
    "PHB": {"unidirectional": 4.0, "bidirectional": 6.5},
    "NODE": {"unidirectional": 4.0, "bidirectional": 6.5},
    "SYS": {"unidirectional": 3.0, "bidirectional": 5.0},
}

# The `nvidia-smi topo -m` legend, word for word after "Connection traversing", and what it means for a copy.
LOOPBACK_LINK = "LOOPBACK"  # CPU ranks of one host: every pair is alike, there is no floor to hold them to
NETWORK_LINK = "NET"  # ranks on two nodes: the network's speed is the cluster's, not a GPU's, so no floor
LINK_LEGEND: dict[str, str] = {
    "NV#": "a bonded set of # NVLinks",
    "PIX": "at most a single PCIe bridge",
    "PXB": "multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "PHB": "PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "NODE": "PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "SYS": "PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
}
_LINK_GLOSS: dict[str, str] = {
    "NV#": "a direct GPU-to-GPU path that touches neither PCIe nor the CPU",
    "PIX": "the shortest PCIe path",
    "PXB": "PCIe switches only, the CPU stays out of the way",
    "PHB": "the copy passes through the CPU's PCIe root",
    "NODE": "the copy passes between the PCIe roots of one CPU",
    "SYS": "the longest path inside a node, over the link between NUMA nodes or CPU sockets",
}
_NV_LINK = re.compile(r"NV(\d+)")
_PCIE_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")  # fastest first


class NodeCheckError(ValueError):
    """Bad input to a node check; the message is one line naming what to fix."""


@dataclasses.dataclass(frozen=True)
class Check:
    """One verdict: `reason` is a sentence a person can act on, `details` the figures behind it.

    `details["cells"]`, where present, lists the [row, column] matrix cells the check is about.
    """

    name: str
    status: str  # PASS, WARN or FAIL
    reason: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise NodeCheckError(f"Check {self.name!r}: status must be one of {', '.join(STATUSES)}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def overall(checks: Sequence[Check]) -> str:
    """The worst status among `checks` (PASS when there are none)."""
    return max((c.status for c in checks), key=STATUSES.index, default=PASS)


def link_meaning(link: str) -> str:
    """The legend's words for a link class, then what they mean for a copy."""
    if link == LOOPBACK_LINK:
        return "loopback sockets between processes of one host (CPU ranks, no GPU link)"
    if link == NETWORK_LINK:
        return "the network between two nodes (inter-node: NICs, cables and switches)"
    nv = _NV_LINK.fullmatch(link)
    key = "NV#" if nv else link
    if key not in LINK_LEGEND:
        return "a link of unknown type (no topology was detected: install nvidia-ml-py or nvidia-smi)"
    legend = LINK_LEGEND[key].replace("#", nv.group(1)) if nv else LINK_LEGEND[key]
    return f"a connection traversing {legend}: {_LINK_GLOSS[key]}"


def expected_gbps(link: str, bidirectional: bool) -> float | None:
    """The sanity floor for one link class (see EXPECTED_GBPS); None for an unknown link."""
    key = "bidirectional" if bidirectional else "unidirectional"
    nv = _NV_LINK.fullmatch(link)
    if nv:
        return EXPECTED_GBPS["NV#"][key] * int(nv.group(1))
    return EXPECTED_GBPS[link][key] if link in EXPECTED_GBPS else None


# ---------------------------------------------------------------------------------------------------------
# Input


@dataclasses.dataclass(frozen=True)
class _Node:
    bw: np.ndarray  # n x n GB/s, NaN on the diagonal
    classes: tuple[tuple[str, ...], ...]  # normalised link classes, "X" on the diagonal
    labels: tuple[str, ...]

    @property
    def n(self) -> int:
        return len(self.labels)

    def link_classes(self) -> list[str]:
        """The classes present between distinct GPUs, fastest first; "unknown" is last if present."""
        found = {c for i, row in enumerate(self.classes) for j, c in enumerate(row) if i != j}
        return sorted(found, key=link_rank)

    def pairs(self, link: str, exclude: Collection[int] = ()) -> list[tuple[int, int]]:
        """Unordered pairs (i < j) of class `link`, leaving out those touching a device in `exclude`."""
        return [
            (i, j)
            for i in range(self.n)
            for j in range(i + 1, self.n)
            if self.classes[i][j] == link and i not in exclude and j not in exclude
        ]

    def values(self, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
        """Both directions of every pair: a bidirectional matrix just measures each pair twice."""
        return np.array([self.bw[a, b] for i, j in pairs for a, b in ((i, j), (j, i))], dtype=float)

    def pair_name(self, i: int, j: int, directions: Sequence[tuple[int, int]]) -> str:
        if len(directions) == 1:
            a, b = directions[0]
            return f"{self.labels[a]}->{self.labels[b]}"
        return f"{self.labels[i]}<->{self.labels[j]}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _node(
    matrix: Sequence[Sequence[Any]], classes: Sequence[Sequence[str]], labels: Sequence[str] | None
) -> _Node:
    if not isinstance(matrix, Sequence) or isinstance(matrix, str) or not matrix:
        raise NodeCheckError("matrix must be a non-empty list of rows of GB/s figures")
    n = len(matrix)
    for i, row in enumerate(matrix):
        if not isinstance(row, Sequence) or isinstance(row, str) or len(row) != n:
            raise NodeCheckError(f"matrix[{i}] must be a row of {n} figures, one per device (square matrix)")
        for j, value in enumerate(row):
            if i == j and (value is None or _is_number(value)):
                continue  # the diagonal is the GPU's own memory, not a link
            if not _is_number(value) or value < 0:
                raise NodeCheckError(
                    f"matrix[{i}][{j}] must be a finite bandwidth >= 0 in GB/s, got {value!r}"
                )
    if not isinstance(classes, Sequence) or len(classes) != n:
        raise NodeCheckError(f"classes must be {n} rows of link classes, one per row of the matrix")
    links: list[tuple[str, ...]] = []
    for i, row in enumerate(classes):
        if not isinstance(row, Sequence) or isinstance(row, str) or len(row) != n:
            raise NodeCheckError(f"classes[{i}] must be a row of {n} link classes, one per device")
        links.append(tuple(_link(i, j, c) for j, c in enumerate(row)))
    for i in range(n):
        for j in range(i + 1, n):
            if links[i][j] != links[j][i]:
                raise NodeCheckError(
                    f"classes[{i}][{j}] is {links[i][j]!r} but classes[{j}][{i}] is {links[j][i]!r}; a link "
                    f"has one class both ways"
                )
    if labels is None:
        labels = [f"GPU{i}" for i in range(n)]
    if len(labels) != n or not all(isinstance(s, str) and s for s in labels):
        raise NodeCheckError(f"labels must be {n} non-empty device names, one per row of the matrix")
    bw = np.array(
        [[math.nan if i == j else float(v) for j, v in enumerate(row)] for i, row in enumerate(matrix)]
    )
    return _Node(bw=bw, classes=tuple(links), labels=tuple(labels))


def _link(i: int, j: int, value: Any) -> str:
    if i == j:
        return "X"
    token = normalize_link(value) if isinstance(value, str) else value
    if not isinstance(token, str) or not (
        token in _PCIE_ORDER
        or token in (UNKNOWN_LINK, LOOPBACK_LINK, NETWORK_LINK)
        or _NV_LINK.fullmatch(token)
    ):
        raise NodeCheckError(
            f"classes[{i}][{j}] must be a link class of nvidia-smi topo -m (NV#, PIX, PXB, PHB, NODE, SYS), "
            f"{NETWORK_LINK!r} between nodes or {UNKNOWN_LINK!r}, got {value!r}"
        )
    return token


def _check_levels(threshold: float, warn: float) -> None:
    if not 0 < threshold <= warn <= 1:
        raise NodeCheckError(f"need 0 < threshold <= warn <= 1, got threshold={threshold} and warn={warn}")


def status_for(ratio: float, threshold: float, warn: float, link: str = "") -> str:
    """FAIL below ``threshold`` x the reference, WARN below ``warn`` x, else PASS (never FAIL on loopback)."""
    status = FAIL if ratio < threshold else WARN if ratio < warn else PASS
    # Loopback between CPU ranks has no hardware to fail: its speed is the host's load, worth a warning only.
    return WARN if status == FAIL and link == LOOPBACK_LINK else status


def _advice(link: str) -> str:
    if link == LOOPBACK_LINK:
        return _HOST_ADVICE
    if _NV_LINK.fullmatch(link):
        return (
            "check `nvidia-smi nvlink --status` for NVLinks that are down or slow and reseat or replace the "
            "NVLink bridge"
        )
    if link == NETWORK_LINK:
        return (
            "check the NICs of both nodes (`ibstat`, or `ethtool` for Ethernet) for a port below its rated "
            "speed, and the cable and switch port between them"
        )
    return PCIE_ADVICE


PCIE_ADVICE = (
    "check `nvidia-smi -q -d PCI` (or LnkSta against LnkCap in `lspci -vv`) for a link trained below "
    "its PCIe generation or width, and reseat the card or riser"
)

_HOST_ADVICE = (
    "CPU ranks talk over loopback sockets, so this is the host's load, not a link: rerun on an idle machine "
    "with at most one rank per core (`nproc`, and `top` for other load)"
)


# ---------------------------------------------------------------------------------------------------------
# Peers


def robust(values: np.ndarray) -> tuple[float, float]:
    """The median of ``values`` and their median absolute deviation (MAD) from it."""
    median = float(np.median(values))
    return median, float(np.median(np.abs(values - median)))


def modified_z(value: float, median: float, mad: float) -> float | None:
    """How far ``value`` is below ``median`` in units of the spread (None when there is no spread)."""
    return float(_MAD_SCALE * (median - value) / mad) if mad > 0 else None


def below_peers(value: float, median: float, mad: float, warn: float) -> bool:
    """The outlier rule, for pairs, GPUs and fleet nodes alike: below ``warn`` x the median, and standing out
    from the spread (MODIFIED_Z), or from no spread at all."""
    if median <= 0 or value / median >= warn:
        return False
    z = modified_z(value, median, mad)
    return z is None or z > MODIFIED_Z


@dataclasses.dataclass(frozen=True)
class Outlier:
    """A device's figure far below the same figure of the other devices (peer_outliers)."""

    index: int
    measured: float
    reference: float  # the median of the other devices' figures
    status: str  # WARN or FAIL

    @property
    def ratio(self) -> float:
        return self.measured / self.reference


def peer_outliers(
    values: Sequence[float | None], threshold: float = DEFAULT_THRESHOLD, *, warn: float = DEFAULT_WARN
) -> list[Outlier]:
    """The devices whose figure (``values[i]``; None: not measured) is far below the other devices'.

    Each is compared with the median of the *others*, so a bad device can't drag its own reference down: it
    is an outlier below `warn` x that median when it also stands out from the others' spread (MODIFIED_Z),
    and FAILs below `threshold`. Needs 3 measured devices: with 2, nothing says which one is off.
    """
    _check_levels(threshold, warn)
    measured = [(i, float(v)) for i, v in enumerate(values) if v is not None]
    if len(measured) < 3:
        return []
    outliers = []
    for i, value in measured:
        median, mad = robust(np.array([v for j, v in measured if j != i]))
        if below_peers(value, median, mad, warn):
            outliers.append(Outlier(i, value, median, status_for(value / median, threshold, warn)))
    return outliers


def link_outliers(
    matrix: Sequence[Sequence[float]],
    classes: Sequence[Sequence[str]],
    threshold: float = DEFAULT_THRESHOLD,
    *,
    warn: float = DEFAULT_WARN,
    expected: Mapping[str, float] | None = None,
    labels: Sequence[str] | None = None,
    exclude_devices: Collection[int] = (),
) -> list[Check]:
    """Pairs far below the median of their link class: FAIL under `threshold` x median, WARN under `warn`.

    Only non-PASS pair checks are returned, one per unordered pair (named `a<->b`, or `a->b` when one
    direction alone is slow). A class with fewer than MIN_PEER_PAIRS pairs has no majority to define its
    median: its pairs are compared with `expected[class]` (what a healthy pair of that class reaches, e.g. a
    baseline's class figure) when given, else a PASS check says they were not judged. Pairs touching
    `exclude_devices` (known bad GPUs) are neither judged nor counted in the medians.
    """
    _check_levels(threshold, warn)
    node = _node(matrix, classes, labels)
    for link, figure in (expected or {}).items():
        if not _is_number(figure) or figure <= 0:
            raise NodeCheckError(f"expected[{link!r}] must be a positive bandwidth in GB/s, got {figure!r}")
    exclude = set(exclude_devices)
    checks: list[Check] = []
    for link in node.link_classes():
        pairs = node.pairs(link, exclude)
        if not pairs:
            continue
        if link == UNKNOWN_LINK:
            checks.append(
                Check(
                    f"class {UNKNOWN_LINK}",
                    WARN,
                    f"The link class of {len(pairs)} pair{'s' * (len(pairs) > 1)} is unknown, so they were "
                    f"not judged: install nvidia-ml-py or make nvidia-smi available so the topology is read.",
                    {"pairs": len(pairs)},
                )
            )
        elif len(pairs) < MIN_PEER_PAIRS:
            checks.extend(_few_peers(node, link, pairs, (expected or {}).get(link), threshold, warn))
        else:
            median, mad = robust(node.values(pairs))
            for i, j in pairs:
                slow = [(a, b) for a, b in ((i, j), (j, i)) if below_peers(node.bw[a, b], median, mad, warn)]
                if slow:
                    checks.append(_pair_check(node, link, (i, j), slow, median, len(pairs), threshold, warn))
    return checks


def _pair_check(
    node: _Node,
    link: str,
    pair: tuple[int, int],
    slow: Sequence[tuple[int, int]],
    reference: float,
    peers: int,
    threshold: float,
    warn: float,
    against: str = "",
) -> Check:
    measured = min(float(node.bw[a, b]) for a, b in slow)
    ratio = measured / reference
    name = node.pair_name(*pair, slow)
    against = against or f"the {reference:.1f} GB/s median of the {peers} {link} pairs"
    return Check(
        f"link {name}",
        status_for(ratio, threshold, warn, link),
        f"{name} ({link}) measures {measured:.1f} GB/s, {ratio:.0%} of {against}: {_advice(link)}.",
        {
            "class": link,
            "measured_GBps": round(measured, 3),
            "expected_GBps": round(reference, 3),
            "ratio": round(ratio, 4),
            "cells": [list(c) for c in slow],
        },
    )


def _few_peers(
    node: _Node,
    link: str,
    pairs: Sequence[tuple[int, int]],
    figure: float | None,
    threshold: float,
    warn: float,
) -> list[Check]:
    if figure is None:
        names = _names([node.pair_name(i, j, ()) for i, j in pairs])
        if len(pairs) == 1:
            why, them = f"{names} is the only {link} pair, so it has no peers to be compared with", "it"
        else:
            why, them = f"{names} are the only {link} pairs, too few for a majority to define healthy", "them"
        return [
            Check(
                f"class {link} peers",
                PASS,
                f"{why}: only a baseline or the sanity floor can judge {them}.",
                {"class": link, "pairs": len(pairs)},
            )
        ]
    checks = []
    for i, j in pairs:
        slow = [(a, b) for a, b in ((i, j), (j, i)) if node.bw[a, b] < warn * figure]
        if slow:
            against = f"the expected {link} figure of {figure:.1f} GB/s"
            checks.append(_pair_check(node, link, (i, j), slow, figure, len(pairs), threshold, warn, against))
    return checks


def device_outliers(
    matrix: Sequence[Sequence[float]],
    classes: Sequence[Sequence[str]],
    threshold: float = DEFAULT_THRESHOLD,
    *,
    warn: float = DEFAULT_WARN,
    fraction: float = DEVICE_FRACTION,
    labels: Sequence[str] | None = None,
) -> list[Check]:
    """GPUs slow on at least `fraction` of their links, one Check each (details["device"] is the index).

    Each of a GPU's links is compared with its class among the *other* GPUs' pairs, so the suspect cannot
    drag its own reference down, whatever share of a class it makes up. A link counts as slow when its slower
    direction is below `warn` x that class median and stands out from the class's spread (MODIFIED_Z); the
    verdict FAILs when the GPU's median ratio is below `threshold`. Needs 3 GPUs: with 2, nothing says which
    end of the link is at fault. CPU ranks (all links loopback) get advice about the host and at most a WARN.
    """
    _check_levels(threshold, warn)
    node = _node(matrix, classes, labels)
    checks = []
    for d in range(node.n):
        ratios, slow = [], 0
        for k in range(node.n):
            link = node.classes[d][k]
            if k == d or link == UNKNOWN_LINK:
                continue
            others = [p for p in node.pairs(link) if d not in p]
            if not others:
                continue
            reference, mad = robust(node.values(others))
            if reference > 0:
                measured = min(node.bw[d, k], node.bw[k, d])
                ratios.append(measured / reference)
                slow += below_peers(measured, reference, mad, warn)
        if len(ratios) < 2 or slow < fraction * len(ratios):
            continue
        median = float(np.median(ratios))
        label = node.labels[d]
        cpu = all(node.classes[d][k] == LOOPBACK_LINK for k in range(node.n) if k != d)
        what = (
            f"so its process got less CPU time than its peers': {_HOST_ADVICE}."
            if cpu
            else "so the GPU or its slot is at fault rather than one link: check its PCIe generation and "
            "width in `nvidia-smi -q -d PCI`, its clocks and power cap, then reseat or swap the card."
        )
        checks.append(
            Check(
                f"device {label}",
                status_for(median, threshold, warn, LOOPBACK_LINK if cpu else ""),
                f"{label} is slow on {slow} of its {len(ratios)} links (median {median:.0%} of what the same "
                f"link classes reach between the other {'ranks' if cpu else 'GPUs'}), {what}",
                {
                    "device": d,
                    "label": label,
                    "slow_links": slow,
                    "links": len(ratios),
                    "median_ratio": round(median, 4),
                    "cells": [[d, k] for k in range(node.n) if k != d]
                    + [[k, d] for k in range(node.n) if k != d],
                },
            )
        )
    return checks


# ---------------------------------------------------------------------------------------------------------
# Baselines, floors and the whole node


def class_figures(
    matrix: Sequence[Sequence[float]], classes: Sequence[Sequence[str]], bidirectional: bool
) -> dict[str, Any]:
    """The median GB/s of each link class, in the shape `judge_node` takes as a baseline.

    Run it on a known-good node and store the result (JSON) with the topology id; nodes of that topology are
    then also judged against it, which catches links that are all equally slow but above the floors.
    """
    node = _node(matrix, classes, None)
    figures = {
        link: round(float(np.median(node.values(node.pairs(link)))), 3)
        for link in node.link_classes()
        if link != UNKNOWN_LINK
    }
    return {"bidirectional": bool(bidirectional), "GBps": figures}


_BASELINE_SHAPE = "{'bidirectional': bool, 'GBps': {link class: GB/s}} as class_figures() returns"


def _baseline_figures(baseline: Mapping[str, Any] | None, bidirectional: bool) -> dict[str, float] | None:
    if baseline is None:
        return None
    if not isinstance(baseline, Mapping) or set(baseline) != {"bidirectional", "GBps"}:
        raise NodeCheckError(f"baseline must be {_BASELINE_SHAPE}")
    if baseline["bidirectional"] is not bool(bidirectional):
        measured = "bidirectional" if bidirectional else "unidirectional"
        raise NodeCheckError(
            f"baseline.bidirectional is {baseline['bidirectional']!r} but the matrix is {measured}; use a "
            f"baseline measured the same way"
        )
    figures = baseline["GBps"]
    if not isinstance(figures, Mapping):
        raise NodeCheckError(f"baseline.GBps must be a mapping; baseline must be {_BASELINE_SHAPE}")
    for link, value in figures.items():
        if not (isinstance(link, str) and (link in _PCIE_ORDER or _NV_LINK.fullmatch(link))):
            raise NodeCheckError(
                f"baseline.GBps: {link!r} is not a link class (NV#, PIX, PXB, PHB, NODE, SYS)"
            )
        if not _is_number(value) or value <= 0:
            raise NodeCheckError(f"baseline.GBps.{link} must be a positive bandwidth in GB/s, got {value!r}")
    return {link: float(value) for link, value in figures.items()}


def _floor_advice(link: str) -> str:
    if _NV_LINK.fullmatch(link):
        return (
            "check that the NVLinks are up (`nvidia-smi nvlink --status`) and that peer-to-peer access is "
            "enabled"
        )
    return (
        "check the BIOS (PCIe generation, ACS, IOMMU), the inter-socket link, and `nvidia-smi -q -d PCI` for "
        "links trained below their maximum"
    )


def _class_check(
    node: _Node,
    link: str,
    pairs: Sequence[tuple[int, int]],
    bidirectional: bool,
    base: float | None,
    threshold: float,
    warn: float,
    left_out: str,
) -> Check:
    median = float(np.median(node.values(pairs)))
    floor = expected_gbps(link, bidirectional)
    counted = f"{len(pairs)} {link} pair{'s' * (len(pairs) > 1)}" + (
        f" not involving {left_out}" if left_out else ""
    )
    head = f"The {counted} run{'s' * (len(pairs) == 1)} at a median {median:.1f} GB/s"
    details = {
        "class": link,
        "pairs": len(pairs),
        "median_GBps": round(median, 3),
        "floor_GBps": floor,
        "baseline_GBps": base,
    }
    if floor is not None and median < floor:
        reason = f"{head}, below the {floor:.1f} GB/s sanity floor for {link}: {_floor_advice(link)}."
        return Check(f"class {link}", FAIL, reason, details)
    if base is None:
        above = (
            f"above the {floor:.1f} GB/s sanity floor for {link}" if floor is not None else "no floor applies"
        )
        reason = f"{head}, {above} (there is no baseline to compare)."
        return Check(f"class {link}", PASS, reason, details)
    ratio = median / base
    status = status_for(ratio, threshold, warn)
    reason = f"{head}, {ratio:.0%} of the baseline's {base:.1f} GB/s"
    if status != PASS:
        reason += (
            f": every {link} link is slower than on the baseline node, so compare BIOS settings, driver and "
            f"firmware versions with it"
        )
    return Check(f"class {link}", status, reason + ".", {**details, "ratio": round(ratio, 4)})


def judge_node(
    matrix: Sequence[Sequence[float]],
    classes: Sequence[Sequence[str]],
    bidirectional: bool,
    baseline: Mapping[str, Any] | None = None,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    warn: float = DEFAULT_WARN,
    labels: Sequence[str] | None = None,
) -> list[Check]:
    """Every verdict on a node's links: baseline availability, bad GPUs, bad pairs, then each link class.

    `baseline` is `class_figures()` of a known-good node of the same topology, or None. Slow GPUs are found
    first and their links left out of everything after, so one bad GPU is one Check rather than a Check for
    each of its links. Each class is compared with the baseline (FAIL under `threshold` x, WARN under `warn`
    x its figure) and always with its sanity floor (FAIL below it).
    """
    _check_levels(threshold, warn)
    node = _node(matrix, classes, labels)
    figures = _baseline_figures(baseline, bidirectional)
    if figures is None:
        checks = [
            Check(
                "link baseline",
                PASS,
                "No link baseline for this topology, so links are judged only against each other and the "
                "sanity floors: store class_figures() of a known-good node as its baseline to catch uniform "
                "slowdowns.",
                {"available": False},
            )
        ]
    else:
        checks = [
            Check(
                "link baseline",
                PASS,
                f"A link baseline with figures for {len(figures)} link classes "
                f"({', '.join(sorted(figures))}) was available and each class is compared with it.",
                {"available": True, "GBps": figures},
            )
        ]
    if node.n < 2:
        return [*checks, Check("links", PASS, "There is only one GPU, so there are no links to judge.")]
    devices = device_outliers(matrix, classes, threshold, warn=warn, labels=node.labels)
    exclude = {c.details["device"] for c in devices}
    links = link_outliers(matrix, classes, threshold, warn=warn, labels=node.labels, exclude_devices=exclude)
    checks += devices + links
    judged = sum(
        len(p) for link in node.link_classes() if len(p := node.pairs(link, exclude)) >= MIN_PEER_PAIRS
    )
    if judged and overall(devices + links) == PASS:
        checks.append(
            Check(
                "link consistency",
                PASS,
                f"No pair is below {warn:.0%} of the median of its link-class peers ({judged} pairs judged) "
                f"and no GPU is slow on most of its links.",
                {"pairs_judged": judged},
            )
        )
    for link in node.link_classes():
        pairs = node.pairs(link, exclude)
        if link != UNKNOWN_LINK and pairs:
            base = figures.get(link) if figures else None
            # Say whose links were left out, so a reader can match the pair count to the topology.
            left_out = (
                _names([node.labels[d] for d in sorted(exclude)])
                if len(node.pairs(link)) > len(pairs)
                else ""
            )
            checks.append(_class_check(node, link, pairs, bidirectional, base, threshold, warn, left_out))
    return checks


# ---------------------------------------------------------------------------------------------------------
# Explaining


def _names(labels: Sequence[str]) -> str:
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"


def _span(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.1f} GB/s" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f} GB/s"


def explain_pairs(
    classes: Sequence[Sequence[str]],
    src: int = 0,
    *,
    matrix: Sequence[Sequence[float]] | None = None,
    labels: Sequence[str] | None = None,
) -> str:
    """Why copies from GPU `src` to different peers take different times: the link class each one crosses.

    With `matrix`, the measured figures are quoted too.
    """
    if not isinstance(classes, Sequence) or isinstance(classes, str) or not classes:
        raise NodeCheckError("classes must be a non-empty list of rows of link classes")
    if matrix is None:
        matrix = [[0.0] * len(classes) for _ in classes]
    node = _node(matrix, classes, labels)
    if not (isinstance(src, int) and 0 <= src < node.n):
        raise NodeCheckError(f"src must be a device index from 0 to {node.n - 1}, got {src!r}")
    source = node.labels[src]
    if node.n == 1:
        return f"{source} is the only GPU: there are no peer-to-peer copies to explain."
    measured = matrix is not None and any(node.bw[src, k] > 0 for k in range(node.n) if k != src)
    by_link: dict[str, list[int]] = {}
    for k in range(node.n):
        if k != src:
            by_link.setdefault(node.classes[src][k], []).append(k)
    order = sorted(by_link, key=link_rank)
    lines = [
        f"Copies from {source} take different times because each peer is reached over a different kind "
        f"of link (its class in `nvidia-smi topo -m`), and a copy runs no faster than the slowest link it "
        f"crosses:"
    ]
    for link in order:
        peers = by_link[link]
        names = _names([node.labels[k] for k in peers])
        verb = "crosses" if len(peers) == 1 else "cross"
        figure = f" (measured {_span([node.bw[src, k] for k in peers])})" if measured else ""
        lines.append(f"- {source}->{names} {verb} {link}: {link_meaning(link)}{figure}.")
    if len(order) == 1:
        lines.append(
            f"All peers share one link class, so copies from {source} should take about the same time to "
            f"each; a clear difference points to a slow link or GPU."
        )
    elif measured:
        fast = max((k for k in range(node.n) if k != src), key=lambda k: node.bw[src, k])
        slow = min((k for k in range(node.n) if k != src), key=lambda k: node.bw[src, k])
        if node.bw[src, slow] > 0:
            lines.append(
                f"So the same copy takes about {node.bw[src, fast] / node.bw[src, slow]:.0f}x as long to "
                f"{node.labels[slow]} ({node.classes[src][slow]}) as to {node.labels[fast]} "
                f"({node.classes[src][fast]})."
            )
    return "\n".join(lines)
