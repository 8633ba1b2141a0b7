"""report.html: the node report as a page that opens offline.

No script, no external style sheet, and the plots inlined as data URIs (write_report puts the PNG files
beside it too); a plot that was not drawn shows the sentence saying why. The markup is the Jinja template
templates/report.html.j2, rendered by pages.py with autoescape: this module only turns the report into the
plain rows and strings the template lays out.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from pytest_collectives.execution.provenance import provenance_line
from pytest_collectives.nodereport.judging.link_matrix import explain_pairs
from pytest_collectives.nodereport.judging.links import link_meaning
from pytest_collectives.nodereport.outputs import pages
from pytest_collectives.nodereport.outputs.plots import BASELINE_PLOT, BUSBW_PLOT, P2P_PLOT, SOAK_PLOT
from pytest_collectives.nodereport.outputs.schema import has_pairs, regression_threshold
from pytest_collectives.nodereport.outputs.sizes import human_bytes
from pytest_collectives.verdict import STATUSES, TABLE, Check, worst_first


def render_html(report: Mapping[str, Any], plots: Mapping[str, bytes | str]) -> str:
    """The report page (templates/report.html.j2); the template escapes every piece of data."""
    checks = worst_first([Check(**c) for c in report["checks"]])
    baseline = report["baseline"]
    return pages.render(
        "report.html.j2",
        topology_id=report["topology_id"],
        created=report["created"],
        run=provenance_line(report["run"]) if "run" in report else "",
        verdict=report["verdict"],
        counts={s: sum(c.status == s for c in checks) for s in STATUSES},
        checks=[
            {"status": c.status, "name": c.name, "reason": c.reason, "table": c.details.get(TABLE)}
            for c in checks
        ],
        tests=report["tests"],
        p2p_plot=_plot(P2P_PLOT, plots[P2P_PLOT]),
        busbw_plot=_plot(BUSBW_PLOT, plots[BUSBW_PLOT]),
        baseline_plot=_plot(BASELINE_PLOT, plots[BASELINE_PLOT]),
        soak=report.get("soak"),
        soak_plot=_plot(SOAK_PLOT, plots.get(SOAK_PLOT, "")),
        explain=_explain(report["p2p"]),
        latency=_latency(report.get("p2p_latency")),
        host=_host_device(report.get("host_device")),
        collectives=[
            (c["name"], human_bytes(c["bytes"]), f"{c['busbw_GBps']:.3g}", f"{c['algbw_GBps']:.3g}")
            for c in sorted(report["collectives"], key=lambda c: (c["name"], c["bytes"]))
        ],
        baseline={
            "available": baseline["available"],
            "path": baseline["path"],
            "threshold": f"{regression_threshold(baseline):.2f}",
            "rows": [
                (
                    r["benchmark"],
                    f"{r['baseline_median_s']:.4g}",
                    f"{r['now_median_s']:.4g}",
                    f"{r['ratio']:.3f}x",
                    r["verdict"],
                )
                for r in baseline["rows"]
            ],
        },
        machine=_machine_rows(report["fingerprint"], report["topology_id"]),
    )


def _plot(name: str, plot: bytes | str) -> dict[str, str | None]:
    """An inlined PNG (`src`), or the note saying why it was not drawn."""
    if isinstance(plot, str):
        return {"file": name, "src": None, "note": plot}
    # Base64 holds no character that HTML escapes, so the data URI reaches the page as it is.
    src = "data:image/png;base64," + base64.b64encode(plot).decode("ascii")
    return {"file": name, "src": src, "note": None}


def _explain(p2p: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """explain_pairs's text as a lead sentence, one item per link class, its closing notes, and the legend of
    the classes present; None without GPU pairs."""
    if not has_pairs(p2p):
        return None
    text = explain_pairs(p2p["classes"], 0, matrix=p2p["matrix"], labels=p2p["devices"])
    lines = text.splitlines()
    present = sorted({c for i, row in enumerate(p2p["classes"]) for j, c in enumerate(row) if i != j})
    return {
        "lead": lines[0],
        "links": [line[2:] for line in lines if line.startswith("- ")],
        "notes": [line for line in lines[1:] if not line.startswith("- ")],
        "legend": [(c, link_meaning(c)) for c in present],
    }


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _latency(latency: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if latency is None:
        return None
    labels = latency["devices"]
    rows = [
        [labels[i], *("X" if i == j else _number(v, 1) for j, v in enumerate(row))]
        for i, row in enumerate(latency["matrix_us"])
    ]
    return {"devices": labels, "rows": rows}


def _host_device(host: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if host is None:
        return None
    series = host["series"]
    rows = [
        [label, *(_number(values[i], 1) for values in series.values())]
        for i, label in enumerate(host["devices"])
    ]
    return {"size": human_bytes(host["bytes"]), "series": list(series), "rows": rows}


def _machine_rows(fingerprint: Mapping[str, Any], topology_id: str) -> list[tuple[str, str]]:
    gpus: dict[str, int] = {}
    for gpu in fingerprint["gpus"]:
        pcie = (
            f" (PCIe gen {gpu['pcie_gen_max']} x{gpu['pcie_width_max']} max)" if gpu["pcie_gen_max"] else ""
        )
        gpus[gpu["name"] + pcie] = gpus.get(gpu["name"] + pcie, 0) + 1
    rows = [
        ("Topology id", topology_id),
        ("Backend", fingerprint["backend"]),
        (
            "CPU",
            f"{fingerprint['cpu_model']}: {fingerprint['logical_cores']} logical cores, "
            f"{fingerprint['sockets']} socket(s), {fingerprint['numa_nodes']} NUMA node(s)",
        ),
        ("GPUs", "; ".join(f"{count} x {name}" for name, count in gpus.items()) or "none"),
        ("Link source", fingerprint["link_source"]),
    ]
    for label, key in (("torch", "torch_version"), ("CUDA", "cuda_version"), ("NCCL", "nccl_version")):
        rows.append((label, fingerprint[key] or "-"))
    rows.append(("Driver", fingerprint["driver_version"] or "-"))
    return rows
