"""The verdicts at the top of a node report: the node's own checks, judged here from its data, and the
run's, rendered as the run judged them.

`report_checks` gathers them: the NVML preflight (GPU runs), the node's links (bandwidth.judge_node on the P2P
matrix), each GPU's host-device copies against the other GPUs' (peers.peer_outliers), the run's checks as
they are (``run_checks``: the test run, conformance, backend settings, soak, performance gate; each part
judged its own data once, and the report never judges them again), and the extensions' own checks. A
Check whose subject is a list carries it as a table (verdict.TABLE), which every output of the report shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_collectives.nodereport.judging import preflight
from pytest_collectives.nodereport.judging.bandwidth import judge_node
from pytest_collectives.nodereport.judging.checks import NodeCheckError
from pytest_collectives.nodereport.judging.links import PCIE_ADVICE
from pytest_collectives.nodereport.judging.peers import Outlier, peer_outliers
from pytest_collectives.nodereport.outputs.schema import ReportError, has_pairs
from pytest_collectives.verdict import NOT_JUDGED, PASS, STATUSES, TABLE, WARN, Check


def report_checks(data: Mapping[str, Any]) -> list[Check]:
    """The verdicts shown at the top of the report: the node's own (node_checks), then the run's."""
    return [*node_checks(data), *(Check.from_json(c) for c in data["run_checks"])]


def node_checks(data: Mapping[str, Any]) -> list[Check]:
    """The node's own checks: the GPUs' health as NVML reports it (GPU runs), its links and host-device
    copies, and the extensions' checks."""
    health = preflight.preflight_checks(data["preflight"]) if data.get("preflight") else []
    extensions = [
        Check(f"{namespace}: {c['name']}", c["status"], c["reason"], c.get("details", {}))
        for namespace, extension in (data.get("extensions") or {}).items()
        for c in extension["checks"]
    ]
    return [*health, *_link_checks(data["p2p"]), *_host_device_checks(data.get("host_device")), *extensions]


def _link_checks(p2p: Mapping[str, Any] | None) -> list[Check]:
    if not has_pairs(p2p):
        return [
            Check(
                "links",
                WARN,
                "No GPU-to-GPU bandwidth was measured (CPU run or one GPU): no link was judged, so none is "
                "known to be healthy.",
            )
        ]
    try:
        return judge_node(
            p2p["matrix"], p2p["classes"], p2p["bidirectional"], p2p.get("baseline"), labels=p2p["devices"]
        )
    except NodeCheckError as e:
        # The checks are where a matrix's cells and classes get checked; their messages name the field.
        raise ReportError(f"report data: p2p.{e}") from None


_HOST_DEVICE = "host-device copies"
_LINK_SERIES = ("h2d", "d2h", "bidir")  # copies that cross the GPU's PCIe link; "local" stays in its memory
_NUMA_ADVICE = (
    "if the slow GPUs are all on one CPU socket, the host memory may be on the other one: compare with "
    "the CPU affinity in `nvidia-smi topo -m`"
)
_MEMORY_ADVICE = (
    "a copy inside the GPU's own memory crosses no link, so look at the GPU: its clocks and throttle "
    "reasons (`nvidia-smi -q -d CLOCK,PERFORMANCE`) and its memory errors "
    "(`nvidia-smi -q -d ECC,ROW_REMAPPER`)"
)


def _host_device_checks(host: Mapping[str, Any] | None) -> list[Check]:
    """Each GPU's host-device figures against the other GPUs': a GPU behind a link trained at x8 or a lower
    PCIe generation copies slower than its peers. No check when nothing was measured (a CPU run)."""
    if host is None:
        return []
    labels, series = host["devices"], host["series"]
    measured = [i for i in range(len(labels)) if any(values[i] is not None for values in series.values())]
    if len(measured) < 3:
        return [
            Check(
                _HOST_DEVICE,
                NOT_JUDGED,
                f"{len(measured)} GPU(s) measured: too few for the others to say what a healthy one reaches "
                f"(needs 3), so their figures (below) were not judged.",
                {"devices": len(measured)},
            )
        ]
    slow: dict[int, list[tuple[str, Outlier]]] = {}
    for name, values in series.items():
        for outlier in peer_outliers(values):
            slow.setdefault(outlier.index, []).append((name, outlier))
    if not slow:
        return [
            Check(
                _HOST_DEVICE,
                PASS,
                f"{len(measured)} GPUs compared in {len(series)} kinds of copy: none is far below the "
                f"others.",
                {"devices": len(measured), "series": len(series)},
            )
        ]
    return [_slow_device_check(labels[d], d, found) for d, found in sorted(slow.items())]


def _slow_device_check(label: str, device: int, found: Sequence[tuple[str, Outlier]]) -> Check:
    worst = min(found, key=lambda f: f[1].ratio)
    names = [name for name, _ in found]
    advice = []
    if any(name.split()[0] in _LINK_SERIES for name in names):
        advice += [PCIE_ADVICE, _NUMA_ADVICE]
    if any(name.split()[0] not in _LINK_SERIES for name in names):
        advice.append(_MEMORY_ADVICE)
    return Check(
        f"host-device {label}",
        max((o.status for _, o in found), key=STATUSES.index),
        f"{label}'s {', '.join(names)} copies are below the other GPUs' (down to {worst[1].ratio:.0%} of "
        f"their median, {worst[0]}; listed in the table): {'; '.join(advice)}.",
        {
            "device": device,
            "label": label,
            TABLE: {
                "columns": ["Copy", "GB/s", "Median of the other GPUs (GB/s)", "Ratio"],
                "rows": [
                    [name, f"{o.measured:.1f}", f"{o.reference:.1f}", f"{o.ratio:.0%}"] for name, o in found
                ],
            },
        },
    )
