"""A self-contained report folder for one node: `report.json`, `report.html` and PNG plots.

`write_report(directory, data)` takes a JSON-compatible dict (DATA_SCHEMA spells it out):

    {
      "topology_id": "gpu-8x-rtx-3090-nv4-sys-1a2b3c4d",
      "fingerprint": {...},                      # topology.Fingerprint.to_json()
      "created": "2024-06-01T12:00:00+00:00",    # ISO 8601
      "p2p": null | {                            # null when the all-pairs matrix was not measured
        "unit": "GB/s",
        "bidirectional": true,
        "devices": ["GPU0", ...],                # n labels
        "matrix": [[838.2, 101.8, ...], ...],    # n x n GB/s; the diagonal (local copies) may be null
        "classes": [["X", "NV4", ...], ...],     # n x n link classes of nvidia-smi topo -m, LOOPBACK
                                                 # between CPU ranks, NET between nodes
        "baseline": null | {"bidirectional": true, "GBps": {"NV4": 101.7}}   # optional, see nodecheck
      },
      "p2p_latency": null | {                    # optional; null when the latency matrix was not measured
        "devices": ["GPU0", ...],                # n labels
        "matrix_us": [[null, 2.1, ...], ...]     # n x n microseconds per 4-byte message; null diagonal
      },
      "host_device": null | {                    # optional; null when not measured (CPU runs)
        "bytes": 268435456,                      # the buffer size the figures were measured at
        "devices": ["GPU0", ...],                # n labels
        "series": {"h2d pinned": [25.1, ...],    # n GB/s (algbw), null where not measured; also h2d
                   ...}                          # pageable, d2h pinned/pageable, bidir pinned (both
      },                                         # directions counted), local device (copy_ on one GPU)
      "collectives": [{"name": "all_reduce", "bytes": 1048576, "busbw_GBps": 1.2, "algbw_GBps": 0.6}],
      "baseline": {                              # the benchmark baseline and the regression verdicts
        "available": true, "path": "baselines/<id>/baseline.json" | null,
        "regression_threshold": 1.05,            # optional: the ratio at which a slowdown counts
        "rows": [{"benchmark": "...", "baseline_median_s": 0.01, "now_median_s": 0.011, "ratio": 1.1,
                  "verdict": "regression"}]      # verdicts of pytest_collectives.gate.statistics
      },
      "tests": {"passed": 10, "failed": 1, "skipped": 2, "failures": [{"nodeid": "...", "longrepr": "..."}]}
    }

The checks are computed here, not passed in, so the verdict at the top of a report always follows from the
data in it: nodecheck.judge_node on the P2P matrix, each GPU's host-device copies against the other GPUs'
(nodecheck.peer_outliers), one check for the test run and one for the benchmark baseline. `report.json` is
the data plus `schema_version`, `verdict`, `checks` and `plots` (REPORT_SCHEMA), validated before anything
is written. A run whose suites failed still gets a report: failures are data.

The HTML opens offline: no script, no external style sheet, and the plots inlined as data URIs (the PNG files
are written beside it too). A plot whose data is absent is skipped and the HTML says why.
"""

from __future__ import annotations

import base64
import datetime
import io
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import numpy as np

from pytest_collectives.atomic import write_atomic
from pytest_collectives.errors import OneLineError
from pytest_collectives.gate.statistics import (
    DEFAULT_THRESHOLD,
    IMPROVEMENT,
    INSUFFICIENT_DATA,
    REGRESSION,
    UNCHANGED,
)
from pytest_collectives.nodereport import checks as nodecheck
from pytest_collectives.nodereport import pages, preflight
from pytest_collectives.nodereport.checks import FAIL, PASS, WARN, Check, NodeCheckError
from pytest_collectives.schemas import load_schema
from pytest_collectives.schemas.validation import first_error, shown
from pytest_collectives.topology.machine import Fingerprint, FingerprintError

SCHEMA_VERSION = 1
JSON_NAME, HTML_NAME, JUNIT_NAME, MARKDOWN_NAME = "report.json", "report.html", "report.xml", "report.md"
# A Check whose subject is a list (e.g. the regressed benchmarks) carries it as details[TABLE], {"columns":
# [...], "rows": [[...], ...]}, so every output shows a table rather than a paragraph of names.
TABLE = "table"
P2P_PLOT, BUSBW_PLOT, BASELINE_PLOT = "p2p_bandwidth.png", "busbw_vs_size.png", "baseline_comparison.png"
PLOTS = (P2P_PLOT, BUSBW_PLOT, BASELINE_PLOT)
VERDICTS = (REGRESSION, IMPROVEMENT, UNCHANGED, INSUFFICIENT_DATA)
# The schema is published with the package (schemas/node-report.schema.json) for fleet tooling to validate
# report.json with; the input of write_report is the same document less what write_report adds.
REPORT_SCHEMA: dict[str, Any] = load_schema("node-report.schema.json")
_ADDED = ("schema_version", "verdict", "checks", "plots")
DATA_SCHEMA: dict[str, Any] = {
    **REPORT_SCHEMA,
    "title": "pytest-collectives node report data",
    "properties": {k: v for k, v in REPORT_SCHEMA["properties"].items() if k not in _ADDED},
    "required": [k for k in REPORT_SCHEMA["required"] if k not in _ADDED],
}


class ReportError(OneLineError):
    """Bad report data; the message is one line naming the field to fix."""


# ---------------------------------------------------------------------------------------------------------
# Validation: jsonschema finds the first bad field, the message names it in one line


def validate(value: Any, schema: Mapping[str, Any]) -> None:
    """Raise ReportError naming the first field of `value` that `schema` rejects, in one line."""
    if problem := first_error(value, schema):
        raise ReportError(f"report data: {problem}")


def _validate_data(data: Any) -> None:
    """DATA_SCHEMA, then what it cannot say: times, fingerprints, square matrices (cells: _link_checks)."""
    validate(data, DATA_SCHEMA)
    try:
        datetime.datetime.fromisoformat(data["created"])
    except ValueError:
        raise ReportError(
            f"report data: created must be an ISO 8601 time, e.g. 2024-06-01T12:00:00+00:00, got "
            f"{shown(data['created'])}"
        ) from None
    try:
        Fingerprint.from_json(data["fingerprint"])
    except FingerprintError as e:
        raise ReportError(f"report data: fingerprint.{e.field} must be {e.expected}") from None
    p2p, latency, host = data["p2p"], data.get("p2p_latency"), data.get("host_device")
    if p2p is not None:
        for key in ("matrix", "classes"):
            _square(p2p[key], len(p2p["devices"]), f"p2p.{key}")
    if latency is not None:
        _square(latency["matrix_us"], len(latency["devices"]), "p2p_latency.matrix_us")
    if host is not None:
        n = len(host["devices"])
        for name, values in host["series"].items():
            if len(values) != n:
                field = f"host_device.series.{name}"
                raise ReportError(f"report data: {field} must have {n} figures, one per device")


def _square(matrix: Sequence[Sequence[Any]], n: int, field: str) -> None:
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise ReportError(f"report data: {field} must be {n} x {n}, one row and column per device")


# ---------------------------------------------------------------------------------------------------------
# Checks


def report_checks(data: Mapping[str, Any]) -> list[Check]:
    """The verdicts shown at the top of the report: the GPUs' health as NVML reports it (GPU runs), the node's
    links, the test run, the benchmark baseline, the capability matrix, and the extensions' own checks."""
    health = preflight.preflight_checks(data["preflight"]) if data.get("preflight") else []
    run = [_test_check(data["tests"]), _benchmark_check(data["baseline"])]
    if data.get("capabilities"):
        run.append(_capability_check(data["capabilities"]))
    extensions = [
        Check(f"{namespace}: {c['name']}", c["status"], c["reason"], c.get("details", {}))
        for namespace, extension in (data.get("extensions") or {}).items()
        for c in extension["checks"]
    ]
    return [
        *health,
        *_link_checks(data["p2p"]),
        *_host_device_checks(data.get("host_device")),
        *run,
        *extensions,
    ]


def _has_pairs(p2p: Mapping[str, Any] | None) -> bool:
    return p2p is not None and len(p2p["devices"]) >= 2


def _link_checks(p2p: Mapping[str, Any] | None) -> list[Check]:
    if not _has_pairs(p2p):
        return [
            Check(
                "links", PASS, "No GPU-to-GPU bandwidth was measured (CPU run or one GPU): no links to judge."
            )
        ]
    try:
        return nodecheck.judge_node(
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
                PASS,
                f"{len(measured)} GPU(s) measured: too few for the others to say what a healthy one reaches "
                f"(needs 3), so their figures (below) were not judged.",
                {"devices": len(measured)},
            )
        ]
    slow: dict[int, list[tuple[str, nodecheck.Outlier]]] = {}
    for name, values in series.items():
        for outlier in nodecheck.peer_outliers(values):
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


def _slow_device_check(label: str, device: int, found: Sequence[tuple[str, nodecheck.Outlier]]) -> Check:
    worst = min(found, key=lambda f: f[1].ratio)
    names = [name for name, _ in found]
    advice = []
    if any(name.split()[0] in _LINK_SERIES for name in names):
        advice += [nodecheck.PCIE_ADVICE, _NUMA_ADVICE]
    if any(name.split()[0] not in _LINK_SERIES for name in names):
        advice.append(_MEMORY_ADVICE)
    return Check(
        f"host-device {label}",
        max((o.status for _, o in found), key=nodecheck.STATUSES.index),
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


def _test_check(tests: Mapping[str, Any]) -> Check:
    passed, failed, skipped = tests["passed"], tests["failed"], tests["skipped"]
    counts = {"passed": passed, "failed": failed, "skipped": skipped}
    summary = f"{passed} passed, {failed} failed, {skipped} skipped"
    if failed:
        return Check(
            "test run", FAIL, f"{summary}: the failures are listed below with their tracebacks.", counts
        )
    if not passed:
        return Check(
            "test run", WARN, f"{summary}: no test passed, so nothing was verified on this node.", counts
        )
    return Check("test run", PASS, f"{summary}.", counts)


def _capability_check(matrix: Mapping[str, Any]) -> Check:
    """The capability matrix as one verdict: FAIL where any cell failed, with the whole matrix as a table
    (a row per operation and reduce op, the dtypes of each status), so every output of the report has it."""
    from pytest_collectives.conformance.matrix import FAIL as CELL_FAIL
    from pytest_collectives.conformance.matrix import STATUSES, short_dtype

    rows: dict[tuple[str, str], dict[str, list[str]]] = {}
    counts = dict.fromkeys(STATUSES, 0)
    for cell in matrix["cells"]:
        by_status = rows.setdefault((cell["operation"], cell["reduce_op"]), {s: [] for s in STATUSES})
        by_status[cell["status"]].append(short_dtype(cell["dtype"]))
        counts[cell["status"]] += 1
    details: dict[str, Any] = {
        "backend": matrix["backend"],
        **counts,
        TABLE: {
            "columns": ["Operation", *STATUSES],
            "rows": [
                [op if redop == "-" else f"{op} {redop}", *(" ".join(found[s]) for s in STATUSES)]
                for (op, redop), found in sorted(rows.items())
            ],
        },
    }
    where = (
        f"{matrix['backend']} ({matrix['backend_version']}, torch {matrix['torch']}) at world sizes "
        f"{', '.join(map(str, matrix['world_sizes']))}: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES)
    )
    failed = [c for c in matrix["cells"] if c["status"] == CELL_FAIL]
    if failed:
        first = failed[0]
        return Check(
            "capability matrix",
            FAIL,
            f"{where}. {first['operation']} {first['dtype']} {first['reduce_op']} gave wrong results "
            f"({first.get('first_failure', '')}): the failing tests are listed below.",
            details,
        )
    return Check("capability matrix", PASS, f"{where}; nothing supported gave a wrong result.", details)


def _benchmark_check(baseline: Mapping[str, Any]) -> Check:
    rows = baseline["rows"]
    if not baseline["available"]:
        return Check(
            "benchmark baseline",
            PASS,
            "No benchmark baseline for this topology, so no speed was compared: record one from a known-good "
            "run.",
            {"available": False},
        )
    slower = sorted(
        (r for r in rows if r["verdict"] == REGRESSION), key=lambda r: (-r["ratio"], r["benchmark"])
    )
    details: dict[str, Any] = {"available": True, "compared": len(rows), "regressions": len(slower)}
    where = f" ({baseline['path']})" if baseline["path"] else ""
    if slower:
        details[TABLE] = {
            "columns": ["Benchmark", "Time now / baseline"],
            "rows": [[r["benchmark"], f"{r['ratio']:.2f}x"] for r in slower],
        }
        return Check(
            "benchmark baseline",
            FAIL,
            f"{len(slower)} of {len(rows)} benchmarks are slower than the baseline{where} beyond noise "
            f"(listed in the table): re-run them, and if they stay slow look for what changed since it was "
            f"recorded.",
            details,
        )
    return Check(
        "benchmark baseline",
        PASS,
        f"{len(rows)} benchmarks compared with the baseline{where}: none is slower beyond noise.",
        details,
    )


# ---------------------------------------------------------------------------------------------------------
# Plots


_STATUS_COLOURS = {FAIL: "#c62828", WARN: "#ef8f00", PASS: "#2e7d32"}
_VERDICT_COLOURS = {
    REGRESSION: "#c62828",
    IMPROVEMENT: "#2e7d32",
    UNCHANGED: "#78909c",
    INSUFFICIENT_DATA: "#cfd8dc",
}


def _figure(width: float, height: float) -> Any:
    # The Figure API with no pyplot: nothing global (the backend of the user's process) is touched.
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def human_bytes(value: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:g} {unit}"
    return f"{value:g} B"


def p2p_plot(p2p: Mapping[str, Any], checks: Sequence[Check]) -> bytes:
    """The all-pairs heatmap: GB/s and link class in each cell, cells named by a WARN/FAIL check outlined."""
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle

    labels, classes = p2p["devices"], p2p["classes"]
    n = len(labels)
    values = np.array(
        [[np.nan if i == j else v for j, v in enumerate(row)] for i, row in enumerate(p2p["matrix"])]
    )
    side = max(4.5, 0.85 * n + 2.5)
    fig = _figure(side + 1.0, side)
    ax = fig.add_subplot()
    ax.set_facecolor("#e0e0e0")  # the diagonal: a GPU's own memory, not a link
    positive = values[values > 0]
    # A log scale keeps NVLink and PCIe pairs, often 10x apart, both readable.
    norm = (
        LogNorm(vmin=positive.min(), vmax=max(positive.max(), positive.min() * 1.01))
        if positive.size
        else None
    )
    image = ax.imshow(np.ma.masked_invalid(np.where(values > 0, values, np.nan)), cmap="viridis", norm=norm)
    bar = fig.colorbar(image, ax=ax, label="GB/s", shrink=0.8)
    if norm is not None:
        ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000) if norm.vmin <= t <= norm.vmax]
        bar.set_ticks(ticks, labels=[f"{t:g}" for t in ticks])
    size = 9 if n <= 8 else 7 if n <= 12 else 5
    for i in range(n):
        for j in range(n):
            if i == j:
                ax.text(j, i, "X", ha="center", va="center", fontsize=size, color="#616161")
                continue
            colour = "white" if norm is None or norm(values[i, j]) < 0.6 else "black"
            text = f"{values[i, j]:.1f}\n{classes[i][j]}"
            ax.text(j, i, text, ha="center", va="center", fontsize=size, color=colour, linespacing=1.3)
    for check in checks:
        for i, j in check.details.get("cells", []) if check.status != PASS else []:
            ax.add_patch(
                Rectangle(
                    (j - 0.45, i - 0.45), 0.9, 0.9, fill=False, lw=2.5, ec=_STATUS_COLOURS[check.status]
                )
            )
    ax.set_xticks(range(n), labels, rotation=45 if max(map(len, labels)) > 5 else 0)
    ax.set_yticks(range(n), labels)
    direction = "bidirectional" if p2p["bidirectional"] else "unidirectional"
    ax.set_xlabel("to" if not p2p["bidirectional"] else "peer")
    ax.set_ylabel("from" if not p2p["bidirectional"] else "GPU")
    ax.set_title(f"P2P bandwidth, {direction} (GB/s); outlined: flagged by a check")
    return _png(fig)


def busbw_plot(collectives: Sequence[Mapping[str, Any]]) -> bytes:
    """Bus bandwidth against message size, one line per collective, sizes on a log scale."""
    from matplotlib.ticker import FuncFormatter

    fig = _figure(8, 4.8)
    ax = fig.add_subplot()
    by_name: dict[str, list[tuple[int, float]]] = {}
    for row in collectives:
        by_name.setdefault(row["name"], []).append((row["bytes"], row["busbw_GBps"]))
    # Distinct markers keep a line visible where another runs on top of it.
    for (name, points), marker in zip(sorted(by_name.items()), itertools.cycle("osD^vP*X"), strict=False):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, ms=5, label=name)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: human_bytes(x)))
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_ylim(bottom=0)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title("Bus bandwidth vs message size")
    return _png(fig)


def baseline_plot(rows: Sequence[Mapping[str, Any]], threshold: float) -> bytes:
    """Time now / baseline per benchmark, with the 1.0 line and the regression threshold."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig = _figure(9, max(2.6, 0.32 * len(rows) + 1.6))
    ax = fig.add_subplot()
    ratios = [r["ratio"] for r in rows]
    positions = range(len(rows))[::-1]  # the first row on top, as in the table
    # Bars grow from 1.0, so a few percent either way is as visible as the threshold it is judged by.
    colours = [_VERDICT_COLOURS[r["verdict"]] for r in rows]
    ax.barh(positions, [r - 1.0 for r in ratios], left=1.0, color=colours, height=0.7)
    for y, ratio in zip(positions, ratios, strict=True):
        ax.text(ratio, y, f" {ratio:.2f}x ", va="center", ha="left" if ratio >= 1 else "right", fontsize=8)
    ax.set_yticks(list(positions), [r["benchmark"] for r in rows], fontsize=8)
    ax.axvline(1.0, color="black", lw=1)
    ax.axvline(threshold, color=_VERDICT_COLOURS[REGRESSION], lw=1, ls="--")
    low, high = min([*ratios, 1.0 / threshold]), max([*ratios, threshold])
    margin = (high - low) * 0.15
    ax.set_xlim(low - margin, high + margin)
    ax.set_xlabel("median time now / baseline (above 1 is slower)")
    handles: list[Any] = [
        Patch(color=_VERDICT_COLOURS[v], label=v) for v in VERDICTS if any(r["verdict"] == v for r in rows)
    ]
    handles.append(
        Line2D([], [], color=_VERDICT_COLOURS[REGRESSION], ls="--", label=f"threshold {threshold:.2f}x")
    )
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_title("Compared with the baseline")
    return _png(fig)


def _can_draw() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _plots(data: Mapping[str, Any], checks: Sequence[Check]) -> dict[str, bytes | str]:
    """Each plot's PNG bytes, or the sentence saying why it was skipped."""
    p2p, collectives, baseline = data["p2p"], data["collectives"], data["baseline"]
    wanted = {
        P2P_PLOT: _has_pairs(p2p),
        BUSBW_PLOT: bool(collectives),
        BASELINE_PLOT: baseline["available"] and bool(baseline["rows"]),
    }
    plots: dict[str, bytes | str] = {
        P2P_PLOT: "No P2P bandwidth matrix in this run (a CPU run, one GPU, or P2P not measured).",
        BUSBW_PLOT: "No collective was benchmarked.",
        BASELINE_PLOT: "No benchmark was compared with a baseline.",
    }
    if any(wanted.values()) and not _can_draw():
        missing = "Not drawn: matplotlib is not installed (pip install 'pytest-collectives[report]')."
        return {name: missing if wanted[name] else note for name, note in plots.items()}
    if wanted[P2P_PLOT]:
        plots[P2P_PLOT] = p2p_plot(p2p, checks)
    if wanted[BUSBW_PLOT]:
        plots[BUSBW_PLOT] = busbw_plot(collectives)
    if wanted[BASELINE_PLOT]:
        plots[BASELINE_PLOT] = baseline_plot(baseline["rows"], _threshold(baseline))
    return plots


def _threshold(baseline: Mapping[str, Any]) -> float:
    return baseline.get("regression_threshold", 1.0 + DEFAULT_THRESHOLD / 2.0)


# ---------------------------------------------------------------------------------------------------------
# HTML


def render_html(report: Mapping[str, Any], plots: Mapping[str, bytes | str]) -> str:
    """The report page (templates/report.html.j2); the template escapes every piece of data."""
    checks = _worst_first([Check(**c) for c in report["checks"]])
    baseline = report["baseline"]
    return pages.render(
        "report.html.j2",
        topology_id=report["topology_id"],
        created=report["created"],
        verdict=report["verdict"],
        counts={s: sum(c.status == s for c in checks) for s in nodecheck.STATUSES},
        checks=[
            {"status": c.status, "name": c.name, "reason": c.reason, "table": c.details.get(TABLE)}
            for c in checks
        ],
        tests=report["tests"],
        p2p_plot=_plot(P2P_PLOT, plots[P2P_PLOT]),
        busbw_plot=_plot(BUSBW_PLOT, plots[BUSBW_PLOT]),
        baseline_plot=_plot(BASELINE_PLOT, plots[BASELINE_PLOT]),
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
            "threshold": f"{_threshold(baseline):.2f}",
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


def _worst_first(checks: Sequence[Check]) -> list[Check]:
    return sorted(checks, key=lambda c: -nodecheck.STATUSES.index(c.status))


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
    if not _has_pairs(p2p):
        return None
    text = nodecheck.explain_pairs(p2p["classes"], 0, matrix=p2p["matrix"], labels=p2p["devices"])
    lines = text.splitlines()
    present = sorted({c for i, row in enumerate(p2p["classes"]) for j, c in enumerate(row) if i != j})
    return {
        "lead": lines[0],
        "links": [line[2:] for line in lines if line.startswith("- ")],
        "notes": [line for line in lines[1:] if not line.startswith("- ")],
        "legend": [(c, nodecheck.link_meaning(c)) for c in present],
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


# ---------------------------------------------------------------------------------------------------------
# Writing


def _md(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Mapping[str, Any]) -> str:
    """The verdicts as GitHub-flavoured Markdown for a CI job summary: a table, then one per listing check."""
    checks = _worst_first([Check(**c) for c in report["checks"]])
    lines = [
        f"### Node report: {report['verdict']}",
        "",
        f"`{report['topology_id']}`"
        + (f" on `{report['host']}`" if report.get("host") else "")
        + f", created {report['created']}",
        "",
        "| Status | Check | Reason and what to do |",
        "| --- | --- | --- |",
        *(f"| {c.status} | {_md(c.name)} | {_md(c.reason)} |" for c in checks),
    ]
    for check in checks:
        if table := check.details.get(TABLE):
            lines += ["", f"#### {_md(check.name)}", "", "| " + " | ".join(map(_md, table["columns"])) + " |"]
            lines.append("|" + " --- |" * len(table["columns"]))
            lines += ["| " + " | ".join(map(_md, row)) + " |" for row in table["rows"]]
    return "\n".join(lines) + "\n"


def render_junit(report: Mapping[str, Any]) -> str:
    """The verdicts as JUnit XML, one testcase per check: FAIL is a failure; WARN passes with its reason in
    system-out and a `status` property (JUnit has no warning outcome; a fleet dashboard can filter on it)."""
    checks = [Check(**c) for c in report["checks"]]
    suite = ElementTree.Element(
        "testsuite",
        name="node-report",
        tests=str(len(checks)),
        failures=str(sum(c.status == FAIL for c in checks)),
        errors="0",
        skipped="0",
        timestamp=report["created"],
        hostname=report.get("host", ""),
    )
    properties = ElementTree.SubElement(suite, "properties")
    ElementTree.SubElement(properties, "property", name="topology_id", value=report["topology_id"])
    ElementTree.SubElement(properties, "property", name="verdict", value=report["verdict"])
    for check in checks:
        case = ElementTree.SubElement(
            suite, "testcase", classname=f"node-report.{report['topology_id']}", name=check.name, time="0"
        )
        listing = ""
        if table := check.details.get(TABLE):
            listing = "\n" + "\n".join("  ".join(map(str, row)) for row in table["rows"])
        if check.status == FAIL:
            failure = ElementTree.SubElement(case, "failure", message=check.reason, type=FAIL)
            failure.text = check.reason + listing
        else:
            status = ElementTree.SubElement(ElementTree.SubElement(case, "properties"), "property")
            status.set("name", "status")
            status.set("value", check.status)
            ElementTree.SubElement(case, "system-out").text = f"{check.status}: {check.reason}{listing}"
    root = ElementTree.Element("testsuites", name="pytest-collectives node report")
    root.append(suite)
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"


def build_report(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, bytes | str]]:
    """The report.json document and the plots (PNG bytes or why skipped), after validating `data`."""
    _validate_data(data)
    checks = report_checks(data)
    plots = _plots(data, checks)
    report = {
        "schema_version": SCHEMA_VERSION,
        **data,
        "verdict": nodecheck.overall(checks),
        "checks": [c.to_json() for c in checks],
        "plots": [
            {
                "file": name,
                "written": not isinstance(plot, str),
                "note": plot if isinstance(plot, str) else "",
            }
            for name, plot in plots.items()
        ],
    }
    # A round trip through JSON turns tuples into lists, so what is validated is what gets written.
    report = json.loads(json.dumps(report, allow_nan=False))
    validate(report, REPORT_SCHEMA)
    return report, plots


def write_report(directory: str | os.PathLike[str], data: Mapping[str, Any]) -> dict[str, Path]:
    """Write report.json, report.html, report.xml (JUnit), report.md and the plots into `directory`; return
    {file name: path} written.

    Nothing is written when `data` is invalid (ReportError, one line naming the field). Each file is replaced
    atomically; a plot skipped this time is removed, so a reused folder never shows a stale one.
    """
    report, plots = build_report(data)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for name, plot in plots.items():
        path = folder / name
        if isinstance(plot, str):
            path.unlink(missing_ok=True)
        else:
            write_atomic(path, plot)
            written[name] = path
    for name, content in (
        (HTML_NAME, render_html(report, plots)),
        (JUNIT_NAME, render_junit(report)),
        (MARKDOWN_NAME, render_markdown(report)),
        (JSON_NAME, json.dumps(report, indent=2, sort_keys=True, allow_nan=False) + "\n"),
    ):
        write_atomic(folder / name, content.encode("utf-8"))
        written[name] = folder / name
    return written
