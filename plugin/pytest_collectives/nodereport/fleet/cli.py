"""Which nodes of one topology are slower than the rest of the fleet.

A vendor validating many nodes of one design has, in their `report.json` files (write.py), the best
reference a node can get: the same figure measured on its siblings. A node's own checks (bandwidth.py) catch a
link that is slow next to the node's other links; they cannot catch a node that is uniformly a little slow,
or one whose collectives or benchmarks lag while its links look fine. The fleet can.

    collectives-fleet nodes/*/report.json --out fleet/

This module is the command line: reading.py reads the reports into figures, stats.py judges the nodes
and write.py writes fleet.json and fleet.html.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from pytest_collectives.nodereport.fleet.reading import load_reports, repeated_hosts
from pytest_collectives.nodereport.fleet.stats import (
    DEFAULT_FAIL_BELOW,
    DEFAULT_WARN_BELOW,
    FleetError,
    FleetResult,
    check_levels,
    judge_fleet,
)
from pytest_collectives.nodereport.fleet.write import write_fleet
from pytest_collectives.verdict import FAIL, PASS, WARN


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, as for every other bad input, rather than argparse's usage block and SystemExit.
        raise FleetError(f"{message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="collectives-fleet",
        description="Compare the node reports (report.json) of one topology and name the nodes slower than "
        "the fleet.",
    )
    parser.add_argument("reports", nargs="*", metavar="REPORT", help="report.json of each node (3 or more)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for fleet.json and fleet.html")
    parser.add_argument(
        "--fail-below",
        type=float,
        default=DEFAULT_FAIL_BELOW,
        help=f"FAIL a figure below this fraction of the fleet median (default {DEFAULT_FAIL_BELOW})",
    )
    parser.add_argument(
        "--warn-below",
        type=float,
        default=DEFAULT_WARN_BELOW,
        help=f"WARN a figure below this fraction of the fleet median (default {DEFAULT_WARN_BELOW})",
    )
    return parser


def _summary(result: FleetResult, written: Mapping[str, Path]) -> str:
    counts = result.counts()
    lines = [
        f"fleet of {len(result.nodes)} nodes ({result.topology_id}): {result.verdict} "
        f"({counts[FAIL]} FAIL, {counts[WARN]} WARN, {counts[PASS]} PASS)"
    ]
    for node in result.nodes:
        if node.outliers:
            worst = node.outliers[0]
            lines.append(
                f"  {node.verdict} {node.name}: {len(node.outliers)} outlier figure(s), worst "
                f"{worst.name} at {worst.details['ratio']:.0%} of the fleet median"
            )
    lines.append("wrote " + " and ".join(str(p) for p in written.values()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """0: no node fails; 1: a node fails; 2: bad input (one line on stderr)."""
    try:
        args = _parser().parse_args(argv)
        check_levels(args.fail_below, args.warn_below)
        nodes = load_reports(args.reports)
        for line in repeated_hosts(nodes):
            print(f"fleet: warning: {line}", file=sys.stderr)
        result = judge_fleet(nodes, args.fail_below, args.warn_below)
        written = write_fleet(args.out, result)
    except FleetError as e:
        print(f"fleet: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"fleet: --out {args.out}: cannot write there ({e.strerror or e}): name a writable folder",
              file=sys.stderr)  # fmt: skip
        return 2
    print(_summary(result, written))
    return 1 if result.verdict == FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
