"""The conformance run as one check, judged once from the capability matrix's document: the closing verdict
prints it and the node report renders it as it is.

FAIL where a conformance test failed (whether or not it tried a cell: a layout, a training step), a cell
gave a wrong result, a training stack failed, or no cell was tried at all (every test N/A or skipped: such
a run proves nothing); PASS otherwise, a known bug that fired being a judged cell. The whole matrix rides in
the details as a table (a row per operation and reduce op, the dtypes of each status), so every output of
the report has it, with the scripts a vendor files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_collectives.conformance.cells import FAIL as CELL_FAIL
from pytest_collectives.conformance.cells import KNOWN, NA, short_dtype
from pytest_collectives.conformance.cells import PASS as CELL_PASS
from pytest_collectives.conformance.cells import STATUSES as CELL_STATUSES
from pytest_collectives.execution.reproductions import naming
from pytest_collectives.verdict import FAIL, PASS, TABLE, Check

NAME = "conformance"
_WORDS = {CELL_FAIL: "cells failed", CELL_PASS: "cells passed", KNOWN: "known bugs", NA: "N/A"}


def judge_conformance(matrix: Mapping[str, Any], checked_nothing: bool) -> Check:
    """``matrix`` is CapabilityMatrix.document(); ``checked_nothing`` whether every conformance test
    selected was N/A or skipped."""
    details = _details(matrix)
    if checked_nothing:
        return Check(NAME, FAIL, "every conformance test was skipped (N/A); no cell was tried", details)
    cells = matrix["cells"]
    statuses = [cell["status"] for cell in cells]
    failed = sum(test["status"] == CELL_FAIL for test in matrix.get("failing_tests", []))
    said = [f"{failed} test{'s' * (failed != 1)} failed"] if failed else []
    said += [f"{statuses.count(s)} {words}" for s, words in _WORDS.items() if statuses.count(s)]
    stacks = [stack for stack, verdict in matrix.get("training", {}).items() if verdict.startswith(CELL_FAIL)]
    said += [f"{', '.join(stacks)} failed"] if stacks else []
    settings = details.get("backend_settings", [])
    if settings:
        said.append(f"{len(settings)} difference(s) between backend settings, first: {settings[0]}")
    red = [cell for cell in cells if cell["status"] == CELL_FAIL]
    if red:  # a vendor files the first red cell with the script its test wrote
        first = red[0]
        script = "".join(f"; {naming(path)}" for path in first.get("reproductions", [])[:1])
        said.append(
            f"first {first['operation']} {first['dtype']} {first['reduce_op']} "
            f"({first.get('first_failure', '')}{script})"
        )
    status = FAIL if failed or red or stacks else PASS
    return Check(NAME, status, ", ".join(said) or "no cell", details)


def _details(matrix: Mapping[str, Any]) -> dict[str, Any]:
    rows: dict[tuple[str, str], dict[str, list[str]]] = {}
    counts = dict.fromkeys(CELL_STATUSES, 0)
    for cell in matrix["cells"]:
        by_status = rows.setdefault((cell["operation"], cell["reduce_op"]), {s: [] for s in CELL_STATUSES})
        by_status[cell["status"]].append(short_dtype(cell["dtype"]))
        counts[cell["status"]] += 1
    details: dict[str, Any] = {
        "backend": matrix["backend"],
        "backend_version": matrix["backend_version"],
        "torch": matrix["torch"],
        "world_sizes": matrix["world_sizes"],
        **counts,
        TABLE: {
            "columns": ["Operation", *CELL_STATUSES],
            "rows": [
                [op if redop == "-" else f"{op} {redop}", *(" ".join(found[s]) for s in CELL_STATUSES)]
                for (op, redop), found in sorted(rows.items())
            ],
        },
    }
    if matrix.get("training"):
        details["training"] = dict(matrix["training"])
    # under --backend-env: what differs between the configurations, and those the backend rejected
    settings = [d["line"] for d in matrix.get("differences", [])]
    settings += [f"{c['backend_env']}: rejected ({c['rejected']})" for c in matrix.get("configurations", [])
                 if "rejected" in c]  # fmt: skip
    if settings:
        details["backend_settings"] = settings
    scripts = [
        f"{c['operation']} {c['dtype']} {c['reduce_op']} ({c['status']}): {path}"
        for c in matrix["cells"]
        for path in c.get("reproductions", [])
    ]
    if scripts:
        details["reproductions"] = scripts
    return details
