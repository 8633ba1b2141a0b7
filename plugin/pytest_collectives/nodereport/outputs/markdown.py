"""report.md: the node report's verdicts as GitHub-flavoured Markdown, for a CI job summary.

One table of every check, worst first, then a table for each check that lists its subjects (checks.TABLE),
so a job page shows what failed without opening the HTML report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_collectives.execution.provenance import provenance_line
from pytest_collectives.verdict import TABLE, Check, worst_first


def _md(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Mapping[str, Any]) -> str:
    """The verdicts as GitHub-flavoured Markdown for a CI job summary: a table, then one per listing check."""
    checks = worst_first([Check(**c) for c in report["checks"]])
    lines = [
        f"### Node report: {report['verdict']}",
        "",
        f"`{report['topology_id']}`"
        + (f" on `{report['host']}`" if report.get("host") else "")
        + f", created {report['created']}",
        *(["", provenance_line(report["run"])] if "run" in report else []),
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
