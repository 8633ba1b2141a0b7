"""What differs between a recorded machine and this one, and whether it looks like lost hardware.

A node that lost a GPU, an NVLink, PCIe lanes or CPU cores gets a new topology id. Taken for a machine never
seen, it would pass a gate that allows a first run. So where no baseline matches, the gate compares this
fingerprint with the nearest recorded one of the same backend: where every difference is a loss on the same
CPU and GPU models (fewer CPUs, sockets, NUMA nodes or GPUs, a slower link, a narrower or older PCIe link),
the node looks degraded; where the models differ too, it is another class of machine, judged against a
recorded one only when asked (``--baseline ID``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from pytest_collectives.topology.fingerprint import Fingerprint
from pytest_collectives.topology.identity import topology_id
from pytest_collectives.topology.links import link_rank, normalize_link

SHOWN = 4  # differences named in a message; the rest are counted


@dataclasses.dataclass(frozen=True)
class Difference:
    text: str  # "CPUs 8 -> 6", "GPU 3 - GPU 5: NV12 -> NV6"
    lost: bool  # this machine has less of the same hardware: a fault, not another machine


def differences(recorded: Fingerprint, now: Fingerprint) -> list[Difference]:
    """What the topology id's fields say differs from ``recorded`` to ``now``, in the id's own terms."""
    found = []
    if recorded.cpu_model != now.cpu_model:
        found.append(Difference(f"CPU model {recorded.cpu_model!r} -> {now.cpu_model!r}", lost=False))
    for label, field in (("CPUs", "logical_cores"), ("sockets", "sockets"), ("NUMA nodes", "numa_nodes")):
        before, after = getattr(recorded, field), getattr(now, field)
        if before != after:
            found.append(Difference(f"{label} {before} -> {after}", lost=after < before))
    models = sorted({g.name for g in recorded.gpus}), sorted({g.name for g in now.gpus})
    if models[0] != models[1] and models[0] and models[1]:
        found.append(Difference(f"GPU model {', '.join(models[0])} -> {', '.join(models[1])}", lost=False))
    if len(recorded.gpus) != len(now.gpus):
        found.append(
            Difference(
                f"GPUs {len(recorded.gpus)} -> {len(now.gpus)}", lost=len(now.gpus) < len(recorded.gpus)
            )
        )
        return found  # which GPU went is not known: pairs of GPUs can't be matched up
    for i, (before, after) in enumerate(zip(recorded.gpus, now.gpus, strict=True)):
        for label, field in (("PCIe gen", "pcie_gen_max"), ("PCIe width x", "pcie_width_max")):
            was, is_ = getattr(before, field), getattr(after, field)
            if was != is_ and was is not None and is_ is not None:
                found.append(Difference(f"GPU {i}: {label}{was} -> {label}{is_}", lost=is_ < was))
    if recorded.links and now.links:
        n = len(now.gpus)
        for i in range(n):
            for j in range(i + 1, n):
                was, is_ = normalize_link(recorded.links[i][j]), normalize_link(now.links[i][j])
                if was != is_:
                    found.append(
                        Difference(f"GPU {i} - GPU {j}: {was} -> {is_}", lost=link_rank(is_) > link_rank(was))
                    )
    return found


def looks_degraded(found: list[Difference]) -> bool:
    """Every difference is a loss of the same hardware: a node that lost something, not another machine."""
    return bool(found) and all(d.lost for d in found)


def described(found: list[Difference]) -> str:
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return ", ".join(d.text for d in found[:SHOWN]) + more


@dataclasses.dataclass(frozen=True)
class Nearest:
    topology_id: str
    differences: list[Difference]


def nearest(recorded: Iterable[Fingerprint], now: Fingerprint) -> Nearest | None:
    """The recorded fingerprint of ``now``'s backend with the fewest differences (ties: the first id)."""
    here = topology_id(now)
    candidates = sorted(
        (len(found), recorded_id, found)
        for fp in recorded
        for recorded_id in [topology_id(fp)]
        if fp.backend == now.backend and recorded_id != here
        for found in [differences(fp, now)]
    )
    return Nearest(candidates[0][1], candidates[0][2]) if candidates else None
