"""The all-pairs P2P bandwidth matrix as the link checks read it, and as a person is told about it.

`read_matrix` validates a matrix and its link classes once, into a `LinkMatrix` (NaN on the diagonal, link
classes normalised, both directions of a link of one class); every check on links starts from one, so a bad
cell is reported the same way whichever check meets it first. `explain_pairs` says in prose why copies from
one GPU to its peers take different times: the link class each one crosses.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from pytest_collectives.nodereport.judging.checks import NodeCheckError
from pytest_collectives.nodereport.judging.links import (
    LOOPBACK_LINK,
    NETWORK_LINK,
    NV_LINK,
    PCIE_ORDER,
    link_meaning,
)
from pytest_collectives.topology.links import UNKNOWN_LINK, link_rank, normalize_link


@dataclasses.dataclass(frozen=True)
class LinkMatrix:
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


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_matrix(
    matrix: Sequence[Sequence[Any]], classes: Sequence[Sequence[str]], labels: Sequence[str] | None
) -> LinkMatrix:
    if not isinstance(matrix, Sequence) or isinstance(matrix, str) or not matrix:
        raise NodeCheckError("matrix must be a non-empty list of rows of GB/s figures")
    n = len(matrix)
    for i, row in enumerate(matrix):
        if not isinstance(row, Sequence) or isinstance(row, str) or len(row) != n:
            raise NodeCheckError(f"matrix[{i}] must be a row of {n} figures, one per device (square matrix)")
        for j, value in enumerate(row):
            if i == j and (value is None or is_number(value)):
                continue  # the diagonal is the GPU's own memory, not a link
            if not is_number(value) or value < 0:
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
    return LinkMatrix(bw=bw, classes=tuple(links), labels=tuple(labels))


def _link(i: int, j: int, value: Any) -> str:
    if i == j:
        return "X"
    token = normalize_link(value) if isinstance(value, str) else value
    if not isinstance(token, str) or not (
        token in PCIE_ORDER
        or token in (UNKNOWN_LINK, LOOPBACK_LINK, NETWORK_LINK)
        or NV_LINK.fullmatch(token)
    ):
        raise NodeCheckError(
            f"classes[{i}][{j}] must be a link class of nvidia-smi topo -m (NV#, PIX, PXB, PHB, NODE, SYS), "
            f"{NETWORK_LINK!r} between nodes or {UNKNOWN_LINK!r}, got {value!r}"
        )
    return token


def join_names(labels: Sequence[str]) -> str:
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
    node = read_matrix(matrix, classes, labels)
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
        names = join_names([node.labels[k] for k in peers])
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
