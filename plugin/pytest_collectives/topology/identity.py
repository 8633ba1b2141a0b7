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
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from pytest_collectives.topology.fingerprint import Fingerprint
from pytest_collectives.topology.links import UNKNOWN_LINK, TopologyError, link_rank, normalize_link


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
