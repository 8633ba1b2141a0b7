"""A self-contained report folder for one node: `report.json`, `report.html` and PNG plots.

`write_report(directory, data)` takes a JSON-compatible dict (schema.DATA_SCHEMA spells it out):

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
        "baseline": null | {"bidirectional": true, "GBps": {"NV4": 101.7}}   # optional, see bandwidth.py
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
      "tests": {"passed": 10, "failed": 1, "skipped": 2, "failures": [{"nodeid": "...", "longrepr": "..."}],
                "configurations": [{"backend_env": "NCCL_PROTO=LL", "passed": 5, ...}]},  # --backend-env
      "soak": null | {                           # --soak only: passes, failures, each benchmark over time
        "passes": 41, "failures": [{"nodeid": "...", "failed_passes": 3, "replay": "pytest ...", ...}],
        "series": [{"benchmark": "...", "unit": "busbw GB/s", "points": [[12.5, 1.9], ...]}], ...
      }
    }

The node's own checks are judged from the data (verdicts.node_checks); the run's come in it as the run
judged them (``run_checks``), so the verdict at the top of a report is the terminal's and the exit
status's. `report.json` is the data plus `schema_version`, `verdict`,
`checks` and `plots` (schema.REPORT_SCHEMA), validated before anything is written; this module builds it and
writes it with the other outputs, each rendered by a module of its own: html.py (report.html), junit.py
(report.xml), markdown.py (report.md) and plots.py (the PNG files). A run whose suites failed still gets a
report: failures are data.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_collectives.atomic import write_atomic
from pytest_collectives.nodereport.judging.verdicts import report_checks
from pytest_collectives.nodereport.outputs.html import render_html
from pytest_collectives.nodereport.outputs.junit import render_junit
from pytest_collectives.nodereport.outputs.markdown import render_markdown
from pytest_collectives.nodereport.outputs.plots import draw_plots
from pytest_collectives.nodereport.outputs.schema import REPORT_SCHEMA, validate, validate_data
from pytest_collectives.verdict import overall

SCHEMA_VERSION = 1
JSON_NAME, HTML_NAME, JUNIT_NAME, MARKDOWN_NAME = "report.json", "report.html", "report.xml", "report.md"


def build_report(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, bytes | str]]:
    """The report.json document and the plots (PNG bytes or why skipped), after validating `data`."""
    validate_data(data)
    checks = report_checks(data)
    plots = draw_plots(data, checks)
    report = {
        "schema_version": SCHEMA_VERSION,
        **data,
        "verdict": overall(checks),
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
    return write_built(directory, *build_report(data))


def write_built(
    directory: str | os.PathLike[str], report: Mapping[str, Any], plots: Mapping[str, bytes | str]
) -> dict[str, Path]:
    """Write what build_report made: ``write_report`` for a caller that reads the report it writes."""
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
