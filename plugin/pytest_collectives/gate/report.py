"""The gate's verdicts as text: the terminal table, Markdown for a CI summary, and JSON for tools."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from pytest_collectives.gate.statistics import IMPROVEMENT, REGRESSION, BenchVerdict, GateResult

HEADER = ("benchmark", "baseline", "now", "ratio", "vs machine", "spread", "detects", "verdict", "again")
_ORDER = {REGRESSION: 0, IMPROVEMENT: 1}


def format_time(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _ratio(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3f}x"


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1%}"


def cells(row: BenchVerdict) -> tuple[str, ...]:
    return (
        row.name,
        format_time(row.baseline_median),
        format_time(row.current_median),
        _ratio(row.ratio),
        _ratio(row.relative),
        _percent(row.spread),
        "-" if math.isnan(row.detectable) else f">={row.detectable:.0%}",
        row.verdict,
        _ratio(row.remeasured),
    )


def ordered(rows: Sequence[BenchVerdict]) -> list[BenchVerdict]:
    """Regressions first, then improvements, then the rest, each by name."""
    return sorted(rows, key=lambda r: (_ORDER.get(r.verdict, 2), r.name))


def format_table(rows: Sequence[BenchVerdict]) -> str:
    """One aligned line per benchmark: names and verdicts read left to right, numbers line up right."""
    lines = [HEADER, *(cells(r) for r in ordered(rows))]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    left = {0, HEADER.index("verdict")}
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i in left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )


def markdown(result: GateResult | None, lines: Sequence[str], status: str) -> str:
    """The verdict for a CI summary ($GITHUB_STEP_SUMMARY): the gate's status (its check's, as the closing
    verdicts say it), what was said, and the table."""
    out = [f"## collectives gate: {status}", ""]
    out += [f"- {line}" for line in lines]
    if result and result.rows:
        out += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        for row in ordered(result.rows):
            text = [c.replace("|", "\\|") for c in cells(row)]
            text[0] = f"`{text[0]}`"
            if row.verdict == REGRESSION:
                text[HEADER.index("verdict")] = f"**{row.verdict}**"
            out.append("| " + " | ".join(text) + " |")
    return "\n".join(out) + "\n"


def _number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def to_json(result: GateResult | None, lines: Sequence[str], status: str, **context: Any) -> dict[str, Any]:
    """The verdict for tools: the gate's status (its check's), pass or fail (only FAIL fails), every
    benchmark's figures (NaN as null), the machine factor, the lists."""
    machine = result.machine if result else None
    return {
        **context,
        "status": status,
        "verdict": "fail" if status == "FAIL" else "pass",
        "lines": list(lines),
        "threshold": result.threshold if result else None,
        "machine": None
        if machine is None
        else {
            "factor": machine.factor,
            "spread": _number(machine.spread),
            "compared": machine.compared,
            "tolerance": machine.tolerance,
            "sittings": machine.sittings,
            "tolerance_learned": machine.learned,
            "verdict": machine.verdict,
        },
        "families": [dataclasses.asdict(f) for f in result.families] if result else [],
        "benchmarks": [
            {
                "name": r.name,
                "baseline_median_s": r.baseline_median,
                "now_median_s": r.current_median,
                "ratio": r.ratio,
                "relative": _number(r.relative),
                "spread": _number(r.spread),
                "detectable": _number(r.detectable),
                "baseline_runs": r.runs,
                "verdict": r.verdict,
                "remeasured": _number(r.remeasured),
            }
            for r in (result.rows if result else [])
        ],
        "missing": result.missing if result else [],
        "new": result.new if result else [],
    }
