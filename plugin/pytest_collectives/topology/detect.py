"""Detecting this machine's fingerprint: the CPU from /proc and /sys, the GPUs and their links.

GPU sources, best first: NVML through the optional `pynvml` (package nvidia-ml-py), then the `nvidia-smi`
command, then torch alone (model names, no links). GPU indices are physical (NVML / nvidia-smi order).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_collectives.topology.fingerprint import Fingerprint, GpuInfo
from pytest_collectives.topology.links import TopologyError, normalize_link, parse_topo_matrix

SMI_TIMEOUT_S = 30.0
_SMI_QUERY_FIELDS = (
    "index,name,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,"
    "pcie.link.width.current,pcie.link.width.max,driver_version"
)


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
    return CpuInfo(
        model=model, logical_cores=len(usable_cores()), sockets=max(1, len(packages)),
        numa_nodes=max(1, len(nodes)),
    )  # fmt: skip


def usable_cores() -> set[int]:
    """The cores this process may run on, not the host's: a container or taskset limits what ranks get
    (every core the host counts, where the platform has no affinity to ask)."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


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
