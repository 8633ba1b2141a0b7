"""The fleet's files: fleet.json, byte-identical for the same reports, and fleet.html, which names the nodes
slower than the fleet and shows each one's outlier figures.

fleet.html is the Jinja template templates/fleet.html.j2, rendered by pages.py with autoescape, self-contained
(no script, nothing fetched): a node's name, path and figure names come from its report, so they are data,
never markup.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pytest_collectives.atomic import write_atomic
from pytest_collectives.nodereport.fleet.stats import MIN_NODES, FleetResult
from pytest_collectives.nodereport.judging.checks import MODIFIED_Z
from pytest_collectives.nodereport.outputs import pages

SCHEMA_VERSION = 1
JSON_NAME, HTML_NAME = "fleet.json", "fleet.html"


def to_json(result: FleetResult) -> dict[str, Any]:
    """fleet.json's document; dump it with sort_keys (write_fleet does) for byte-identical files."""
    return {
        "schema_version": SCHEMA_VERSION,
        "topology_id": result.topology_id,
        "fail_below": result.fail_below,
        "warn_below": result.warn_below,
        "modified_z": MODIFIED_Z,
        "verdict": result.verdict,
        "counts": result.counts(),
        "nodes": [
            {
                "name": n.name,
                "path": n.path,
                "verdict": n.verdict,
                "figures_judged": n.judged,
                "outliers": [{"figure": c.name, "status": c.status, **c.details} for c in n.outliers],
            }
            for n in result.nodes
        ],
        "medians": {name: s.to_json() for name, s in sorted(result.stats.items())},
        "unjudged": list(result.unjudged),
    }


def dumps(result: FleetResult) -> str:
    """fleet.json's text: indent 2, sorted keys, so the same reports give the same bytes."""
    return json.dumps(to_json(result), indent=2, sort_keys=True, allow_nan=False) + "\n"


def render_html(result: FleetResult) -> str:
    """fleet.html (templates/fleet.html.j2): self-contained, no script, nothing fetched; the template escapes
    every datum."""
    node_rows = [
        ({"name": n.name, "anchor": _anchor(i) if n.outliers else None}, n.verdict, len(n.outliers), n.judged)
        for i, n in enumerate(result.nodes)
    ]
    flagged = [
        {
            "anchor": _anchor(i),
            "name": n.name,
            "verdict": n.verdict,
            "path": n.path,
            "outliers": [
                (
                    c.name,
                    c.status,
                    f"{c.details['value']:.4g} {c.details['unit']}",
                    f"{c.details['fleet_median']:.4g} {c.details['unit']}",
                    f"{c.details['ratio']:.3f}",
                    "-" if c.details["z"] is None else f"{c.details['z']:.1f}",
                )
                for c in n.outliers
            ],
        }
        for i, n in enumerate(result.nodes)
        if n.outliers
    ]
    return pages.render(
        "fleet.html.j2",
        topology_id=result.topology_id,
        verdict=result.verdict,
        counts=result.counts(),
        judged=len(result.stats),
        warn_below=f"{result.warn_below:.0%}",
        fail_below=f"{result.fail_below:.0%}",
        modified_z=MODIFIED_Z,
        node_rows=node_rows,
        flagged=flagged,
        unjudged=[(name,) for name in result.unjudged],
        min_nodes=MIN_NODES,
    )


def _anchor(index: int) -> str:
    # By position, not by name: a node's name is data and may hold anything.
    return f"node-{index}"


def write_fleet(directory: str | os.PathLike[str], result: FleetResult) -> dict[str, Path]:
    """Write fleet.json and fleet.html into `directory` (created if needed), each atomically."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, text in ((JSON_NAME, dumps(result)), (HTML_NAME, render_html(result))):
        write_atomic(folder / name, text)
        written[name] = folder / name
    return written
