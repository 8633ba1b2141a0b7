"""Figures judged against their peers: the first and strongest reference a node has, since it needs no
stored baseline.

Pairs of one link class should run alike, so a pair far below its class median is a bad link
(`link_outliers`), and a GPU slow on nearly all of its links is one bad device (`device_outliers`). The same
idea on one figure per GPU (a host-device copy rate, say) is `peer_outliers`. Each suspect is compared with
the median of the *others*, so it cannot drag its own reference down, and must also stand out from their
spread (checks.below_peers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from pytest_collectives.nodereport.judging.checks import (
    DEFAULT_THRESHOLD,
    DEFAULT_WARN,
    NodeCheckError,
    below_peers,
    check_levels,
    robust,
    status_for,
)
from pytest_collectives.nodereport.judging.link_matrix import LinkMatrix, is_number, join_names, read_matrix
from pytest_collectives.nodereport.judging.links import HOST_ADVICE, LOOPBACK_LINK, link_advice
from pytest_collectives.topology.links import UNKNOWN_LINK
from pytest_collectives.verdict import PASS, WARN, Check

# A class median stands for "what a healthy pair reaches" only when healthy pairs can outvote a bad one.
MIN_PEER_PAIRS = 3
DEVICE_FRACTION = 0.75  # a GPU with at least this share of its links slow is reported as one device


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
    check_levels(threshold, warn)
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
    check_levels(threshold, warn)
    node = read_matrix(matrix, classes, labels)
    for link, figure in (expected or {}).items():
        if not is_number(figure) or figure <= 0:
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
    node: LinkMatrix,
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
        f"{name} ({link}) measures {measured:.1f} GB/s, {ratio:.0%} of {against}: {link_advice(link)}.",
        {
            "class": link,
            "measured_GBps": round(measured, 3),
            "expected_GBps": round(reference, 3),
            "ratio": round(ratio, 4),
            "cells": [list(c) for c in slow],
        },
    )


def _few_peers(
    node: LinkMatrix,
    link: str,
    pairs: Sequence[tuple[int, int]],
    figure: float | None,
    threshold: float,
    warn: float,
) -> list[Check]:
    if figure is None:
        names = join_names([node.pair_name(i, j, ()) for i, j in pairs])
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
    check_levels(threshold, warn)
    node = read_matrix(matrix, classes, labels)
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
            f"so its process got less CPU time than its peers': {HOST_ADVICE}."
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
