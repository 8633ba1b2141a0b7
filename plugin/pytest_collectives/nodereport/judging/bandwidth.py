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
what to look at. The peer checks live in peers.py and the classes' floors in links.py; this module holds
the baseline, each class's verdict against it and its floor, and `judge_node`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pytest_collectives.nodereport.judging.checks import (
    DEFAULT_THRESHOLD,
    DEFAULT_WARN,
    NodeCheckError,
    check_levels,
    status_for,
)
from pytest_collectives.nodereport.judging.link_matrix import LinkMatrix, is_number, join_names, read_matrix
from pytest_collectives.nodereport.judging.links import NV_LINK, PCIE_ORDER, expected_gbps, floor_advice
from pytest_collectives.nodereport.judging.peers import MIN_PEER_PAIRS, device_outliers, link_outliers
from pytest_collectives.topology.links import UNKNOWN_LINK
from pytest_collectives.verdict import FAIL, PASS, WARN, Check, overall


def class_figures(
    matrix: Sequence[Sequence[float]], classes: Sequence[Sequence[str]], bidirectional: bool
) -> dict[str, Any]:
    """The median GB/s of each link class, in the shape `judge_node` takes as a baseline.

    Run it on a known-good node and store the result (JSON) with the topology id; nodes of that topology are
    then also judged against it, which catches links that are all equally slow but above the floors.
    """
    node = read_matrix(matrix, classes, None)
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
        if not (isinstance(link, str) and (link in PCIE_ORDER or NV_LINK.fullmatch(link))):
            raise NodeCheckError(
                f"baseline.GBps: {link!r} is not a link class (NV#, PIX, PXB, PHB, NODE, SYS)"
            )
        if not is_number(value) or value <= 0:
            raise NodeCheckError(f"baseline.GBps.{link} must be a positive bandwidth in GB/s, got {value!r}")
    return {link: float(value) for link, value in figures.items()}


def _class_check(
    node: LinkMatrix,
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
        reason = f"{head}, below the {floor:.1f} GB/s sanity floor for {link}: {floor_advice(link)}."
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
    check_levels(threshold, warn)
    node = read_matrix(matrix, classes, labels)
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
        return [*checks, Check("links", WARN, "There is only one GPU, so no link was judged.")]
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
                join_names([node.labels[d] for d in sorted(exclude)])
                if len(node.pairs(link)) > len(pairs)
                else ""
            )
            checks.append(_class_check(node, link, pairs, bidirectional, base, threshold, warn, left_out))
    return checks
