"""Links between GPUs as `nvidia-smi topo -m` names them (NV#, PIX, PXB, PHB, NODE, SYS): its matrix parsed,
a link's name normalised, links ordered by speed."""

from __future__ import annotations

import dataclasses
import re

_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
# Fastest first: the order link classes appear in an id's slug.
_PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_NV_LINK = re.compile(r"NV(\d+)")
UNKNOWN_LINK = "unknown"


class TopologyError(ValueError):
    """Bad topology input (a malformed `nvidia-smi topo -m` text, impossible device request)."""


@dataclasses.dataclass(frozen=True)
class TopoMatrix:
    """The parsed `nvidia-smi topo -m` table: GPUs and NICs, and the link between each pair."""

    devices: tuple[str, ...]  # row/column names in order: GPU0.., NIC0.. (or mlx5_0 on older drivers)
    links: tuple[tuple[str, ...], ...]  # links[r][c] as printed, "X" on the diagonal
    affinity: dict[str, dict[str, str]]  # device -> {"CPU Affinity": "0-15", ...}, empty for NICs
    nic_names: dict[str, str]  # "NIC0" -> "mlx5_0", from the NIC Legend

    def gpus(self) -> list[str]:
        return [d for d in self.devices if re.fullmatch(r"GPU\d+", d)]

    def link(self, a: str, b: str) -> str:
        return self.links[self.devices.index(a)][self.devices.index(b)]


def is_link_token(token: str) -> bool:
    return token in ("X", "SOC", *_PCIE_LINKS) or _NV_LINK.fullmatch(token) is not None


def normalize_link(token: str) -> str:
    # Older drivers called the inter-socket path SOC; it is what newer ones call SYS.
    return "SYS" if token == "SOC" else token


_TOPO_FIX = "pass the unmodified output of `nvidia-smi topo -m`"


def _parse_header(header: str, where: str) -> tuple[tuple[str, ...], list[str]]:
    """Device columns, then the affinity columns (whose names contain spaces, so split on known names)."""
    first_affinity = min((header.find(c) for c in _AFFINITY_COLUMNS if c in header), default=len(header))
    devices = tuple(header[:first_affinity].split())
    extra_columns = re.findall("|".join(_AFFINITY_COLUMNS) + r"|\S+", header[first_affinity:])
    if not devices:
        raise TopologyError(f"{where}: the header names no devices (GPU0 ...); {_TOPO_FIX}")
    odd = [d for d in devices if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*", d)]
    if odd:
        raise TopologyError(f"{where}: {odd[0]!r} is not a device name; {_TOPO_FIX}")
    if len(set(devices)) != len(devices):
        raise TopologyError(f"{where}: the header repeats a device name; {_TOPO_FIX}")
    return devices, extra_columns


def parse_topo_matrix(text: str, source: str = "nvidia-smi topo -m") -> TopoMatrix:
    """Parse `nvidia-smi topo -m` output (tabs or spaces); `source` names the input in error messages."""
    fix = _TOPO_FIX
    # nvidia-smi underlines the header with terminal escapes even when writing to a pipe.
    lines = re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise TopologyError(f"{source}: the text is empty; {fix}")
    header_no, header = numbered[0]
    devices, extra_columns = _parse_header(header, f"{source}: line {header_no}")

    links: list[tuple[str, ...]] = []
    affinity: dict[str, dict[str, str]] = {}
    row_no = header_no
    for row_no, line in enumerate(lines[header_no:], header_no + 1):
        if not line.strip():
            if links:
                break
            continue
        tokens = line.split()
        expected = devices[len(links)]
        if tokens[0] != expected:
            raise TopologyError(
                f"{source}: line {row_no}: expected the row of {expected}, found {tokens[0]!r}; {fix}"
            )
        cells = tokens[1 : 1 + len(devices)]
        if len(cells) < len(devices):
            raise TopologyError(
                f"{source}: line {row_no}: row {expected} has {len(cells)} link entries for "
                f"{len(devices)} devices; {fix}"
            )
        for column, cell in zip(devices, cells, strict=True):
            if not is_link_token(cell):
                raise TopologyError(
                    f"{source}: line {row_no}: unknown link type {cell!r} between {expected} and {column} "
                    f"(expected X, NV#, PIX, PXB, PHB, NODE or SYS); {fix}"
                )
            if (cell == "X") != (column == expected):
                raise TopologyError(
                    f"{source}: line {row_no}: {expected} to {column} is {cell!r}; only a device's link to "
                    f"itself is X; {fix}"
                )
        values = tokens[1 + len(devices) :]
        if len(values) > len(extra_columns):
            raise TopologyError(
                f"{source}: line {row_no}: row {expected} has {len(values)} values after the links for "
                f"{len(extra_columns)} columns ({', '.join(extra_columns) or 'none'}); {fix}"
            )
        links.append(tuple(cells))
        # NIC rows have no affinity values, and a GPU row may stop short of the last columns.
        affinity[expected] = dict(zip(extra_columns, values, strict=False))
        if len(links) == len(devices):
            break
    if len(links) < len(devices):
        raise TopologyError(
            f"{source}: line {row_no}: the table ends after {len(links)} of {len(devices)} device rows; {fix}"
        )
    nic_names = dict(re.findall(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", "\n".join(lines[row_no:]), flags=re.M))
    return TopoMatrix(devices=devices, links=tuple(links), affinity=affinity, nic_names=nic_names)


def link_rank(link: str) -> tuple[int, int]:
    """A link's place in speed order, fastest first: NVLink by its link count, then the PCIe paths."""
    nv = _NV_LINK.fullmatch(link)
    if nv:
        return (0, -int(nv.group(1)))
    return (1, _PCIE_LINKS.index(link)) if link in _PCIE_LINKS else (2, 0)
