"""The report's PNG plots: the P2P bandwidth heatmap, bus bandwidth against message size, the benchmarks
against their baseline, and a soak's benchmarks over time.

matplotlib is an optional extra (`pytest-collectives[report]`), imported only when a plot is drawn and only
through its Figure API, never pyplot, so the backend of the user's process is left alone. `draw_plots` gives
each plot's PNG bytes, or the sentence saying why it was not drawn, which the outputs show in its place.
"""

from __future__ import annotations

import io
import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pytest_collectives.gate.statistics import IMPROVEMENT, INSUFFICIENT_DATA, REGRESSION, UNCHANGED
from pytest_collectives.nodereport.outputs.schema import has_pairs, regression_threshold
from pytest_collectives.nodereport.outputs.sizes import human_bytes
from pytest_collectives.verdict import FAIL, PASS, WARN, Check

P2P_PLOT, BUSBW_PLOT, BASELINE_PLOT = "p2p_bandwidth.png", "busbw_vs_size.png", "baseline_comparison.png"
SOAK_PLOT = "soak_over_time.png"
PLOTS = (P2P_PLOT, BUSBW_PLOT, BASELINE_PLOT, SOAK_PLOT)
SOAK_LINES = 8  # the benchmarks named in the soak plot's legend: the drifted, then the worst of the others
VERDICTS = (REGRESSION, IMPROVEMENT, UNCHANGED, INSUFFICIENT_DATA)

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


def soak_plot(soak: Mapping[str, Any]) -> bytes:
    """Each benchmark's figure over the soak's time, relative to its first third of passes, as the drift is
    judged (so GB/s and microseconds share an axis; a latency is turned over, so below 1 is worse for both),
    with the tolerance's line."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    tolerance = soak["tolerance"]
    lines = []
    for series in soak["series"]:
        times, values = zip(*series["points"], strict=True)
        start = statistics.median(values[: max(1, len(values) // 3)]) or 1.0
        relative = [
            v / start if series["unit"].startswith("busbw") else start / v if v else 0.0 for v in values
        ]
        lines.append((min(relative[len(relative) // 2 :]), series["benchmark"], times, relative))
    lines.sort()  # the worst end first: they are the ones named
    fig = _figure(9, 4.8)
    ax = fig.add_subplot()
    for k, (_, name, times, relative) in enumerate(lines):
        named = k < SOAK_LINES
        ax.plot(
            [t / 60 for t in times], relative, lw=1.5 if named else 0.6, alpha=1.0 if named else 0.35,
            color=None if named else "#90a4ae", label=name if named else None, marker="o" if named else None,
            ms=3,
        )  # fmt: skip
    ax.axhline(1.0, color="black", lw=1)
    ax.axhline(1 - tolerance, color=_VERDICT_COLOURS[REGRESSION], lw=1, ls="--")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.set_xlabel("minutes into the soak")
    ax.set_ylabel("figure / its first passes' (below 1 is worse)")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], color=_VERDICT_COLOURS[REGRESSION], ls="--"))
    labels.append(f"tolerance {tolerance:.0%}")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    ax.set_title(f"Benchmarks over the soak ({soak['passes']} passes)")
    return _png(fig)


def _can_draw() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def draw_plots(data: Mapping[str, Any], checks: Sequence[Check]) -> dict[str, bytes | str]:
    """Each plot's PNG bytes, or the sentence saying why it was skipped."""
    p2p, collectives, baseline, soak = data["p2p"], data["collectives"], data["baseline"], data.get("soak")
    wanted = {
        P2P_PLOT: has_pairs(p2p),
        BUSBW_PLOT: bool(collectives),
        BASELINE_PLOT: baseline["available"] and bool(baseline["rows"]),
        SOAK_PLOT: bool(soak and soak["series"]),
    }
    plots: dict[str, bytes | str] = {
        P2P_PLOT: "No P2P bandwidth matrix in this run (a CPU run, one GPU, or P2P not measured).",
        BUSBW_PLOT: "No collective was benchmarked.",
        BASELINE_PLOT: "No benchmark was compared with a baseline.",
    }
    if soak:  # a plot of a soak's only
        plots[SOAK_PLOT] = "No benchmark ran in the soak (--soak with suites/perf)."
    if any(wanted.values()) and not _can_draw():
        missing = "Not drawn: matplotlib is not installed (pip install 'pytest-collectives[report]')."
        return {name: missing if wanted[name] else note for name, note in plots.items()}
    if wanted[P2P_PLOT]:
        plots[P2P_PLOT] = p2p_plot(p2p, checks)
    if wanted[BUSBW_PLOT]:
        plots[BUSBW_PLOT] = busbw_plot(collectives)
    if wanted[BASELINE_PLOT]:
        plots[BASELINE_PLOT] = baseline_plot(baseline["rows"], regression_threshold(baseline))
    if wanted[SOAK_PLOT]:
        plots[SOAK_PLOT] = soak_plot(soak)
    return plots
