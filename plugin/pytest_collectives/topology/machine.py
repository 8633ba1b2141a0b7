"""The machine's communication topology, as a fingerprint and a short stable id.

Baselines are stored per topology id, so the id must change exactly when measured bandwidth can legitimately
change because of the hardware, and never otherwise. What goes into its hash:

- the backend, the CPU model, usable logical cores, sockets and NUMA nodes;
- per GPU: the model and the *maximum* PCIe generation and width (NVML reports the maximum the GPU and its
  slot can negotiate, so a card in a slower slot is a different topology);
- the link type between every pair of GPUs (NV#, PIX, PXB, PHB, NODE, SYS), as `nvidia-smi topo -m` shows it.

What stays out, although it is recorded:

- the *current* PCIe generation and width: GPUs drop their link to gen 1 when idle, so these change between
  runs on the same machine;
- PCI bus ids: two identical servers with cards in different slot addresses should share baselines;
- software versions (torch, CUDA, NCCL, driver). They do affect performance, and that is the point: an upgrade
  that makes collectives slower is a regression the gate must catch, so it is compared against the baseline
  recorded before the upgrade, and the report lists what changed (`software_changes`). Had they been in the
  hash, every upgrade would silently start from an empty baseline directory and nothing would be compared.

GPU sources, best first: NVML through the optional `pynvml` (package nvidia-ml-py), then the `nvidia-smi`
command, then torch alone (model names, no links). GPU indices are physical (NVML / nvidia-smi order).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SMI_TIMEOUT_S = 30.0
_SMI_QUERY_FIELDS = (
    "index,name,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,"
    "pcie.link.width.current,pcie.link.width.max,driver_version"
)
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
# Fastest first: the order link classes appear in an id's slug.
_PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_NV_LINK = re.compile(r"NV(\d+)")
LINK_SOURCES = ("nvml", "nvidia-smi", "none")
UNKNOWN_LINK = "unknown"


class TopologyError(ValueError):
    """Bad topology input (a malformed `nvidia-smi topo -m` text, impossible device request)."""


class FingerprintError(ValueError):
    """A fingerprint dict that does not have the expected shape; `field` is its path inside the dict."""

    def __init__(self, field: str, expected: str) -> None:
        self.field = field
        self.expected = expected
        super().__init__(f"field '{field}' must be {expected}")


# ---------------------------------------------------------------------------------------------------------
# nvidia-smi topo -m


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


def _is_link_token(token: str) -> bool:
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
            if not _is_link_token(cell):
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


# ---------------------------------------------------------------------------------------------------------
# The fingerprint


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    name: str
    pci_bus_id: str | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    backend: str
    torch_version: str
    cpu_model: str
    logical_cores: int
    sockets: int
    numa_nodes: int
    gpus: tuple[GpuInfo, ...] = ()
    links: tuple[tuple[str, ...], ...] = ()  # links[i][j] between gpus i and j; empty when not known
    link_source: str = "none"  # one of LINK_SOURCES
    driver_version: str | None = None
    cuda_version: str | None = None
    nccl_version: str | None = None

    @property
    def kind(self) -> str:
        return "gpu" if self.gpus else "cpu"

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["gpus"] = [dataclasses.asdict(g) for g in self.gpus]
        data["links"] = [list(row) for row in self.links]
        return data

    @classmethod
    def from_json(cls, data: Any) -> Fingerprint:
        """Rebuild from `to_json()` output, checking every field; raises FingerprintError."""
        fields = {f.name for f in dataclasses.fields(cls)}
        d = _mapping(data, "", fields)
        gpus = tuple(_gpu_from_json(g, f"gpus[{i}]") for i, g in enumerate(_list(d, "gpus")))
        links = tuple(tuple(_str_list(row, f"links[{i}]")) for i, row in enumerate(_list(d, "links")))
        if links and (len(links) != len(gpus) or any(len(row) != len(gpus) for row in links)):
            raise FingerprintError(
                "links", f"an empty list or a {len(gpus)} x {len(gpus)} matrix, one row per GPU"
            )
        for i, row in enumerate(links):
            for j, cell in enumerate(row):
                if not _is_link_token(cell) or (cell == "X") != (i == j):
                    raise FingerprintError(
                        f"links[{i}][{j}]", "X on the diagonal, else NV#, PIX, PXB, PHB, NODE or SYS"
                    )
        link_source = _str(d, "link_source")
        if link_source not in LINK_SOURCES:
            raise FingerprintError("link_source", f"one of {', '.join(LINK_SOURCES)}")
        return cls(
            backend=_str(d, "backend"),
            torch_version=_str(d, "torch_version"),
            cpu_model=_str(d, "cpu_model"),
            logical_cores=_positive_int(d, "logical_cores"),
            sockets=_positive_int(d, "sockets"),
            numa_nodes=_positive_int(d, "numa_nodes"),
            gpus=gpus,
            links=links,
            link_source=link_source,
            driver_version=_optional_str(d, "driver_version"),
            cuda_version=_optional_str(d, "cuda_version"),
            nccl_version=_optional_str(d, "nccl_version"),
        )


def _mapping(data: Any, where: str, fields: set[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise FingerprintError(where or "(top level)", "an object")
    prefix = f"{where}." if where else ""
    missing, unknown = sorted(fields - data.keys()), sorted(data.keys() - fields)
    if missing:
        raise FingerprintError(prefix + missing[0], "present")
    if unknown:
        raise FingerprintError(prefix + unknown[0], "absent (unknown field)")
    return {f"{prefix}{k}": v for k, v in data.items()}


def _gpu_from_json(data: Any, where: str) -> GpuInfo:
    d = _mapping(data, where, {f.name for f in dataclasses.fields(GpuInfo)})
    ints = ("pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max")
    return GpuInfo(
        name=_str(d, f"{where}.name"),
        pci_bus_id=_optional_str(d, f"{where}.pci_bus_id"),
        **{k: _optional_positive_int(d, f"{where}.{k}") for k in ints},
    )


def _str(d: dict[str, Any], key: str) -> str:
    value = d[key]
    if not isinstance(value, str) or not value:
        raise FingerprintError(key, "a non-empty string")
    return value


def _optional_str(d: dict[str, Any], key: str) -> str | None:
    return None if d[key] is None else _str(d, key)


def _positive_int(d: dict[str, Any], key: str) -> int:
    value = d[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise FingerprintError(key, "a positive integer")
    return value


def _optional_positive_int(d: dict[str, Any], key: str) -> int | None:
    return None if d[key] is None else _positive_int(d, key)


def _list(d: dict[str, Any], key: str) -> list[Any]:
    if not isinstance(d[key], list):
        raise FingerprintError(key, "a list")
    return d[key]


def _str_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FingerprintError(where, "a list of strings")
    return value


# ---------------------------------------------------------------------------------------------------------
# The id


def _slug(text: str, limit: int = 40) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if len(slug) > limit:
        slug = slug[:limit].rsplit("-", 1)[0]
    return slug or "unknown"


def _cpu_slug(model: str) -> str:
    # "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz" -> intel-xeon-platinum-8375c; the clock and the
    # marketing words do not tell two CPUs apart.
    text = re.sub(r"\((R|TM|tm|r)\)", " ", model)
    text = re.split(r"@| with ", text)[0]
    words = [w for w in text.split() if not re.fullmatch(r"(?i)\d+-core|processor|cpu", w)]
    return _slug(" ".join(words))


def _gpu_slug(names: Sequence[str]) -> str:
    if len(set(names)) > 1:
        return "mixed"
    words = [w for w in names[0].split() if w.lower() not in ("nvidia", "geforce", "tesla", "quadro")]
    return _slug(" ".join(words), limit=24)


def link_rank(link: str) -> tuple[int, int]:
    """A link's place in speed order, fastest first: NVLink by its link count, then the PCIe paths."""
    nv = _NV_LINK.fullmatch(link)
    if nv:
        return (0, -int(nv.group(1)))
    return (1, _PCIE_LINKS.index(link)) if link in _PCIE_LINKS else (2, 0)


def _hashed_fields(fp: Fingerprint) -> dict[str, Any]:
    return {
        "backend": fp.backend,
        "cpu_model": fp.cpu_model,
        "logical_cores": fp.logical_cores,
        "sockets": fp.sockets,
        "numa_nodes": fp.numa_nodes,
        "gpus": [[g.name, g.pcie_gen_max, g.pcie_width_max] for g in fp.gpus],
        "links": [list(row) for row in fp.links],
    }


def topology_id(fp: Fingerprint) -> str:
    """A readable id, safe as a directory name, e.g. `gpu-8x-rtx-3090-nv4-sys-1a2b3c4d`.

    The slug is for people; the 8-hex hash over the topology fields (see the module docstring) is what makes
    two ids differ.
    """
    canonical = json.dumps(_hashed_fields(fp), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:8]
    if not fp.gpus:
        return f"cpu-{fp.logical_cores}c-{_cpu_slug(fp.cpu_model)}-{digest}"
    classes = sorted(
        {c for i, row in enumerate(fp.links) for j, c in enumerate(row) if i != j}, key=link_rank
    )
    parts = ["gpu", f"{len(fp.gpus)}x", _gpu_slug([g.name for g in fp.gpus]), *(c.lower() for c in classes)]
    return "-".join([*parts, digest])


def link_class(fp: Fingerprint, i: int, j: int) -> str:
    """The link between GPUs i and j ("NV4", "PIX", ..., "SYS"; "X" when i == j); "unknown" without links."""
    if not fp.links:
        return UNKNOWN_LINK
    n = len(fp.links)
    if not (0 <= i < n and 0 <= j < n):
        raise TopologyError(f"link_class: GPU pair ({i}, {j}) is outside this fingerprint's {n} GPUs")
    return normalize_link(fp.links[i][j])


def software_changes(old: Fingerprint, new: Fingerprint) -> list[str]:
    """What differs in the software the hash leaves out, e.g. ["torch 2.12.0 -> 2.13.0"], for the report."""
    changes = []
    for label, field in (
        ("torch", "torch_version"),
        ("CUDA", "cuda_version"),
        ("NCCL", "nccl_version"),
        ("driver", "driver_version"),
    ):
        before, after = getattr(old, field), getattr(new, field)
        if before != after:
            changes.append(f"{label} {before} -> {after}")
    return changes


# ---------------------------------------------------------------------------------------------------------
# Detection: CPU


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    model: str
    logical_cores: int
    sockets: int
    numa_nodes: int


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def detect_cpu(
    cpuinfo: Path = Path("/proc/cpuinfo"), sys_root: Path = Path("/sys/devices/system")
) -> CpuInfo:
    """The host CPU; every source is optional (containers, non-Linux), falling back to one socket and node."""
    text = _read(cpuinfo)
    models = re.findall(r"^(?:model name|Hardware|Processor)\s*:\s*(.+?)\s*$", text, flags=re.M)
    model = models[0] if models else (platform.processor() or platform.machine() or "unknown")
    packages = {_read(p).strip() for p in sys_root.glob("cpu/cpu[0-9]*/topology/physical_package_id")}
    packages.discard("")
    if not packages:
        packages = set(re.findall(r"^physical id\s*:\s*(\d+)", text, flags=re.M))
    nodes = [p for p in sys_root.glob("node/node*") if re.fullmatch(r"node\d+", p.name)]
    # The cores this process may run on, not the host's: a container or taskset limits what ranks get.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return CpuInfo(
        model=model, logical_cores=cores, sockets=max(1, len(packages)), numa_nodes=max(1, len(nodes))
    )


# ---------------------------------------------------------------------------------------------------------
# Detection: GPUs


@dataclasses.dataclass(frozen=True)
class GpuTopology:
    gpus: tuple[GpuInfo, ...]
    links: tuple[tuple[str, ...], ...]
    link_source: str
    driver_version: str | None


def _text(value: Any) -> str:
    # pynvml returns bytes or str depending on its version.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _pci_key(info: Any) -> tuple[int, int, int]:
    return (int(info.domain), int(info.bus), int(info.device))


_NVML_ANCESTOR_LINKS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def gpus_from_nvml(nvml: Any, indices: Sequence[int]) -> GpuTopology:
    """Read the GPUs at physical `indices` from an initialised pynvml module (or a fake with its API)."""
    count = nvml.nvmlDeviceGetCount()
    _check_indices(indices, count)
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    gpu_keys = {_pci_key(nvml.nvmlDeviceGetPciInfo(h)): i for i, h in enumerate(handles)}

    def optional(fn_name: str, handle: Any) -> int | None:
        try:
            return int(getattr(nvml, fn_name)(handle))
        except nvml.NVMLError:
            return None

    gpus = []
    for i in indices:
        h = handles[i]
        gpus.append(
            GpuInfo(
                name=_text(nvml.nvmlDeviceGetName(h)),
                pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(h).busId),
                pcie_gen_current=optional("nvmlDeviceGetCurrPcieLinkGeneration", h),
                pcie_gen_max=optional("nvmlDeviceGetMaxPcieLinkGeneration", h),
                pcie_width_current=optional("nvmlDeviceGetCurrPcieLinkWidth", h),
                pcie_width_max=optional("nvmlDeviceGetMaxPcieLinkWidth", h),
            )
        )
    nvlinks = {i: _nvlink_peers(nvml, handles[i], gpu_keys) for i in indices}
    links = []
    for a in indices:
        row = []
        for b in indices:
            if a == b:
                row.append("X")
                continue
            direct, switched = nvlinks[a].get(b, 0), min(nvlinks[a].get(-1, 0), nvlinks[b].get(-1, 0))
            if direct or switched:
                row.append(f"NV{direct or switched}")
            else:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
                row.append(_NVML_ANCESTOR_LINKS.get(int(level), "SYS"))
        links.append(tuple(row))
    return GpuTopology(
        gpus=tuple(gpus),
        links=tuple(links),
        link_source="nvml",
        driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
    )


def _nvlink_peers(nvml: Any, handle: Any, gpu_keys: dict[tuple[int, int, int], int]) -> dict[int, int]:
    """Active NVLinks of one GPU: peer GPU index -> link count; key -1 counts links to NVSwitches."""
    peers: dict[int, int] = {}
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            remote = _pci_key(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
        except nvml.NVMLError:
            continue  # links past the GPU's own count answer "not supported"
        # Through an NVSwitch, every GPU on the fabric is reachable by all of a GPU's links; nvidia-smi
        # shows that as NV<links>. A remote that is no GPU's PCI address is a switch.
        peer = gpu_keys.get(remote, -1)
        peers[peer] = peers.get(peer, 0) + 1
    return peers


def _smi_int(value: str) -> int | None:
    return int(value) if value.strip().isdigit() else None  # "[N/A]", "[Not Supported]"


def gpus_from_smi(query_csv: str, topo_text: str | None, indices: Sequence[int]) -> GpuTopology:
    """Build the GPU part from `nvidia-smi --query-gpu=...` CSV and, when available, `topo -m` output."""
    rows = [r for r in csv.reader(query_csv.splitlines(), skipinitialspace=True) if r]
    by_index: dict[int, list[str]] = {}
    for row in rows:
        if len(row) != len(_SMI_QUERY_FIELDS.split(",")) or not row[0].strip().isdigit():
            raise TopologyError(
                f"nvidia-smi --query-gpu: unexpected line {','.join(row)!r}; check that nvidia-smi works"
            )
        by_index[int(row[0])] = [v.strip() for v in row]
    _check_indices(indices, len(by_index))
    gpus = tuple(
        GpuInfo(
            name=by_index[i][1],
            pci_bus_id=by_index[i][2],
            pcie_gen_current=_smi_int(by_index[i][3]),
            pcie_gen_max=_smi_int(by_index[i][4]),
            pcie_width_current=_smi_int(by_index[i][5]),
            pcie_width_max=_smi_int(by_index[i][6]),
        )
        for i in indices
    )
    links: tuple[tuple[str, ...], ...] = ()
    if topo_text is not None:
        matrix = parse_topo_matrix(topo_text)
        names = [f"GPU{i}" for i in indices]
        missing = [n for n in names if n not in matrix.devices]
        if missing:
            raise TopologyError(
                f"nvidia-smi topo -m: no row for {', '.join(missing)}; check that nvidia-smi works"
            )
        links = tuple(tuple(normalize_link(matrix.link(a, b)) for b in names) for a in names)
    return GpuTopology(
        gpus=gpus,
        links=links,
        link_source="nvidia-smi" if links else "none",
        driver_version=by_index[indices[0]][7],
    )


def _check_indices(indices: Sequence[int], count: int) -> None:
    bad = [i for i in indices if not 0 <= i < count]
    if bad:
        raise TopologyError(
            f"GPU index {bad[0]} requested but this machine has {count} GPUs; use fewer GPUs or fix "
            f"CUDA_VISIBLE_DEVICES"
        )


def physical_indices(gpus: int, visible: str | None) -> list[int]:
    """The first `gpus` physical GPU indices, honouring a CUDA_VISIBLE_DEVICES value of plain indices.

    Assumes CUDA enumerates in PCI order as NVML does (true when the GPUs are one model, or with
    CUDA_DEVICE_ORDER=PCI_BUS_ID).
    """
    if visible is None:
        return list(range(gpus))
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not all(e.isdigit() for e in entries):
        raise TopologyError(
            f"CUDA_VISIBLE_DEVICES={visible!r}: topology detection needs plain GPU indices (e.g. 0,1), "
            f"not UUIDs"
        )
    if len(entries) < gpus:
        raise TopologyError(
            f"CUDA_VISIBLE_DEVICES={visible!r} makes {len(entries)} GPUs visible but {gpus} are needed; "
            f"widen it or use fewer GPUs"
        )
    return [int(e) for e in entries[:gpus]]


def _detect_nvml(indices: Sequence[int]) -> GpuTopology | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError):
        return None  # no driver or library: the nvidia-smi fallback says the same or more
    try:
        return gpus_from_nvml(pynvml, indices)
    finally:
        pynvml.nvmlShutdown()


def _run_smi(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _detect_smi(indices: Sequence[int]) -> GpuTopology | None:
    if shutil.which("nvidia-smi") is None:
        return None
    query = _run_smi(f"--query-gpu={_SMI_QUERY_FIELDS}", "--format=csv,noheader,nounits")
    if query is None:
        return None
    return gpus_from_smi(query, _run_smi("topo", "-m"), indices)


def _detect_torch(gpus: int) -> GpuTopology:
    # Last resort, and the only source that initialises CUDA in this process.
    import torch

    names = tuple(GpuInfo(name=torch.cuda.get_device_name(i)) for i in range(gpus))
    return GpuTopology(gpus=names, links=(), link_source="none", driver_version=None)


def _nccl_version() -> str | None:
    import torch

    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None  # a CPU build of torch has no NCCL
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def detect(backend: str, gpus: int = 0) -> Fingerprint:
    """Fingerprint this machine for `backend`; `gpus` > 0 adds the first that many (visible) GPUs."""
    import torch

    cpu = detect_cpu()
    gpu = GpuTopology(gpus=(), links=(), link_source="none", driver_version=None)
    if gpus > 0:
        indices = physical_indices(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        gpu = _detect_nvml(indices) or _detect_smi(indices) or _detect_torch(gpus)
    return Fingerprint(
        backend=backend,
        torch_version=torch.__version__,
        cpu_model=cpu.model,
        logical_cores=cpu.logical_cores,
        sockets=cpu.sockets,
        numa_nodes=cpu.numa_nodes,
        gpus=gpu.gpus,
        links=gpu.links,
        link_source=gpu.link_source,
        driver_version=gpu.driver_version,
        cuda_version=torch.version.cuda,
        nccl_version=_nccl_version(),
    )
