"""The link classes of `nvidia-smi topo -m` as the node checks use them: what each one is, the least a
healthy one carries, and what to look at when one is slow.

The checks judge a pair of GPUs against others of its class, so everything they say about a class lives
here: the legend's words (`link_meaning`), the sanity floors (`EXPECTED_GBPS`, `expected_gbps`), and the
advice a Check ends with. Two classes are the project's own, not nvidia-smi's: LOOPBACK between CPU ranks
and NET between nodes.
"""

from __future__ import annotations

import re

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
LINK_GLOSS: dict[str, str] = {
    "NV#": "a direct GPU-to-GPU path that touches neither PCIe nor the CPU",
    "PIX": "the shortest PCIe path",
    "PXB": "PCIe switches only, the CPU stays out of the way",
    "PHB": "the copy passes through the CPU's PCIe root",
    "NODE": "the copy passes between the PCIe roots of one CPU",
    "SYS": "the longest path inside a node, over the link between NUMA nodes or CPU sockets",
}
NV_LINK = re.compile(r"NV(\d+)")
PCIE_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")  # fastest first


def link_meaning(link: str) -> str:
    """The legend's words for a link class, then what they mean for a copy."""
    if link == LOOPBACK_LINK:
        return "loopback sockets between processes of one host (CPU ranks, no GPU link)"
    if link == NETWORK_LINK:
        return "the network between two nodes (inter-node: NICs, cables and switches)"
    nv = NV_LINK.fullmatch(link)
    key = "NV#" if nv else link
    if key not in LINK_LEGEND:
        return "a link of unknown type (no topology was detected: install nvidia-ml-py or nvidia-smi)"
    legend = LINK_LEGEND[key].replace("#", nv.group(1)) if nv else LINK_LEGEND[key]
    return f"a connection traversing {legend}: {LINK_GLOSS[key]}"


def expected_gbps(link: str, bidirectional: bool) -> float | None:
    """The sanity floor for one link class (see EXPECTED_GBPS); None for an unknown link."""
    key = "bidirectional" if bidirectional else "unidirectional"
    nv = NV_LINK.fullmatch(link)
    if nv:
        return EXPECTED_GBPS["NV#"][key] * int(nv.group(1))
    return EXPECTED_GBPS[link][key] if link in EXPECTED_GBPS else None


def link_advice(link: str) -> str:
    if link == LOOPBACK_LINK:
        return HOST_ADVICE
    if NV_LINK.fullmatch(link):
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

HOST_ADVICE = (
    "CPU ranks talk over loopback sockets, so this is the host's load, not a link: rerun on an idle machine "
    "with at most one rank per core (`nproc`, and `top` for other load)"
)


def floor_advice(link: str) -> str:
    if NV_LINK.fullmatch(link):
        return (
            "check that the NVLinks are up (`nvidia-smi nvlink --status`) and that peer-to-peer access is "
            "enabled"
        )
    return (
        "check the BIOS (PCIe generation, ACS, IOMMU), the inter-socket link, and `nvidia-smi -q -d PCI` for "
        "links trained below their maximum"
    )
