"""``--node-report DIR``: the session's results gathered into the report data and written as a folder.

Node validation in one command: the suites' outcomes, the all-pairs P2P bandwidth and latency matrices,
each GPU's copies with host memory, the collectives' bus bandwidth and the baseline verdicts go to
nodereport.write.write_report, which judges the node. A run whose tests failed still gets its report, with the
failures in it.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from pytest_collectives.execution.provenance import provenance
from pytest_collectives.gate.baseline_format import BenchmarkEntry
from pytest_collectives.hookspecs import merged_answers
from pytest_collectives.nodereport.judging import nvml
from pytest_collectives.nodereport.judging.links import LOOPBACK_LINK, NETWORK_LINK
from pytest_collectives.verdict import FAIL, NOT_JUDGED, Check

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")


class _PairGrid(NamedTuple):
    matrix: list[list[float | None]]  # [src][dst], None on the diagonal
    node: list[int]  # each rank's node
    kind: str  # "GPU" or "rank"


def _pair_grid(results: dict[str, BenchmarkEntry], matrix: str, figure: str) -> _PairGrid | None:
    """``figure`` of every (src, dst) pair of the benchmarks marked ``matrix: <matrix>``, at the largest
    message size measured; None when the run measured no such pair, or not every pair (some were
    deselected): a partial matrix can't be judged pair against pair."""
    pairs = [e.extra_info for e in results.values() if e.extra_info.get("matrix") == matrix]
    if not pairs:
        return None
    largest = max(p["nbytes"] for p in pairs)
    pairs = [p for p in pairs if p["nbytes"] == largest]
    n = 1 + max(max(p["src"], p["dst"]) for p in pairs)
    grid: list[list[float | None]] = [[None] * n for _ in range(n)]
    node = [0] * n
    for p in pairs:
        grid[p["src"]][p["dst"]] = p[figure]
        node[p["src"]], node[p["dst"]] = p.get("src_node", 0), p.get("dst_node", 0)
    if any(grid[i][j] is None for i in range(n) for j in range(n) if i != j):
        return None
    return _PairGrid(grid, node, "GPU" if pairs[0].get("devices") != "cpu" else "rank")


def _local(node: list[int]) -> list[int]:
    """Each rank's index on its own node: ranks sit on their nodes in blocks."""
    return [i - node.index(node[i]) for i in range(len(node))]


def _labels(node: list[int], kind: str) -> list[str]:
    local = _local(node)
    several = len(set(node)) > 1
    return [f"node{node[i]}:{kind}{local[i]}" if several else f"{kind}{i}" for i in range(len(node))]


def p2p_matrix(results: dict[str, BenchmarkEntry], link: Callable[[int, int], str]) -> dict[str, Any] | None:
    """The all-pairs matrix (unidirectional GB/s) from the benchmarks marked ``matrix: pairs``, at the
    largest message size measured; None when the run measured no pairs.

    ``link(i, j)`` is the class of the link between local devices i and j of one node; a pair on two nodes
    (SPMD mode) crosses the network, and its class is NETWORK_LINK.
    """
    grid = _pair_grid(results, "pairs", "algbw_GBps")
    if grid is None:
        return None
    node, local, n = grid.node, _local(grid.node), len(grid.node)
    return {
        "unit": "GB/s",
        "bidirectional": False,
        "devices": _labels(node, grid.kind),
        "matrix": grid.matrix,
        "classes": [
            [
                "X" if i == j else NETWORK_LINK if node[i] != node[j] else link(local[i], local[j])
                for j in range(n)
            ]
            for i in range(n)
        ],
    }


def p2p_latency(results: dict[str, BenchmarkEntry]) -> dict[str, Any] | None:
    """The all-pairs latency matrix (microseconds per message) from the benchmarks marked ``matrix: latency``;
    None when the run measured no pairs."""
    grid = _pair_grid(results, "latency", "latency_us")
    return None if grid is None else {"devices": _labels(grid.node, grid.kind), "matrix_us": grid.matrix}


# The report's column order: each direction with pinned memory (the link's speed) before pageable.
HOST_SERIES = ("h2d pinned", "h2d pageable", "d2h pinned", "d2h pageable", "bidir pinned", "local device")


def host_device(results: dict[str, BenchmarkEntry]) -> dict[str, Any] | None:
    """GB/s (algbw) of each GPU's copies with host memory and inside its own memory, from the benchmarks
    marked ``matrix: host``, at the largest buffer size measured; None when the run measured none (a CPU
    run). ``series[name][i]`` is GPU i's figure, None where it was not measured."""
    copies = [e.extra_info for e in results.values() if e.extra_info.get("matrix") == "host"]
    if not copies:
        return None
    # A bidirectional copy moves two buffers: the size that compares with the others is one buffer's.
    largest = max(c["message_bytes"] for c in copies)
    copies = [c for c in copies if c["message_bytes"] == largest]
    n = 1 + max(c["device"] for c in copies)
    node = [0] * n
    series: dict[str, list[float | None]] = {name: [None] * n for name in HOST_SERIES}
    for c in copies:
        series.setdefault(f"{c['direction']} {c['memory']}", [None] * n)[c["device"]] = c["algbw_GBps"]
        node[c["device"]] = c.get("node", 0)
    return {
        "bytes": largest,
        "devices": _labels(node, "GPU"),
        "series": {name: values for name, values in series.items() if any(v is not None for v in values)},
    }


def collective_rows(results: dict[str, BenchmarkEntry]) -> list[dict[str, Any]]:
    """busbw per collective and size: one line per (algorithm, world size) in the plot."""
    rows = []
    for entry in results.values():
        info = entry.extra_info
        if info.get("collective") in COLLECTIVES and info.get("nbytes") and "busbw_GBps" in info:
            name = f"{info.get('algorithm', info['collective'])} n={info['world_size']}"
            if "steps" in info:
                name += f" S={info['steps']}"
            if info.get("backend_env"):  # --backend-env: a line per configuration, side by side
                name += f" {info['backend_env']}"
            rows.append(
                {"name": name, "bytes": info["nbytes"], "busbw_GBps": info["busbw_GBps"],
                 "algbw_GBps": info["algbw_GBps"]}
            )  # fmt: skip
    return sorted(rows, key=lambda r: (r["name"], r["bytes"]))


def extension_checks(answers: list[Mapping[str, Sequence[Mapping[str, Any]]] | None]) -> dict[str, Any]:
    """The ``pytest_collectives_node_checks`` answers as the report's ``extensions``: one namespace each."""
    merged = merged_answers("pytest_collectives_node_checks", answers)
    return {
        namespace: {"checks": [{"details": {}, **c} for c in checks]} for namespace, checks in merged.items()
    }


class NodeReport:
    def __init__(
        self,
        config: pytest.Config,
        directory: Path,
        gpus: int,
        gate: Any,
        matrix: Any,
        soak: Any,
        tally: Any,
    ) -> None:
        """``gate`` (gate.baseline_gate.BaselineGate) holds the machine and the baseline's figures;
        ``matrix`` (conformance.matrix.CapabilityMatrix) the conformance run's cells; ``soak``
        (execution.modes.soak.Soak), under --soak, the passes; ``tally`` (execution.tally.Tally) the
        tests' outcomes. Their verdicts come judged (`finish`): the report renders them, never a rule of
        its own."""
        self.config, self.gate, self.matrix, self.soak = config, gate, matrix, soak
        self.tally = tally
        self.directory = directory  # nodereport.settings.read checked it
        self.written: dict[str, Path] = {}
        self.checks_of_node: list[Check] = []  # its own checks (links, host-device, preflight, extensions)
        self.verdict = ""  # the report's, as its files say it
        self.error = ""
        self.failed = False  # the report could not be written, which fails the run
        # NVML is read before the first test (idle GPUs) and again at the end (after load), because PCIe
        # link speed and clock throttling both change with load. A CPU run has nothing to read.
        self.preflight = nvml.read_nvml() if gpus else None

    def collected(self, session: pytest.Session) -> None:
        # What cannot be read of the topology is a usage error before the tests, not a crash after them.
        self.gate.machine()

    def finish(self, session: pytest.Session, run_checks: Sequence[Check]) -> None:
        """Write the report: the data, the run's checks as the run judged them, and the node's own."""
        from pytest_collectives.gate import baseline_gate as gate
        from pytest_collectives.nodereport.judging.verdicts import node_checks
        from pytest_collectives.nodereport.outputs.schema import ReportError
        from pytest_collectives.nodereport.outputs.write import build_report, write_built
        from pytest_collectives.topology.identity import link_class, topology_id

        if why_not := _ran_nothing(session):
            self.error = f"node report not written: {why_not}"  # a report says what ran, and nothing did
            return
        gate_plugin = self.gate
        fingerprint = gate_plugin.machine()
        results = gate.collect_results(self.config)
        cpu = fingerprint.kind == "cpu"
        data = {
            "topology_id": topology_id(fingerprint),
            "host": socket.gethostname(),
            "run": provenance(self.config),
            "fingerprint": fingerprint.to_json(),
            "preflight": nvml.sample_throttle(self.preflight) if self.preflight else None,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "p2p": p2p_matrix(
                results, (lambda i, j: LOOPBACK_LINK) if cpu else partial(link_class, fingerprint)
            ),
            "p2p_latency": p2p_latency(results),
            "host_device": host_device(results),
            "collectives": collective_rows(results),
            "baseline": {
                "available": gate_plugin.baseline_path is not None,
                "error": gate_plugin.error or None,
                "path": str(gate_plugin.baseline_path) if gate_plugin.baseline_path else None,
                "regression_threshold": 1 + gate_plugin.settings.min_effect / 2,
                "rows": [
                    {
                        "benchmark": name,
                        "baseline_median_s": v.baseline_median,
                        "now_median_s": v.current_median,
                        "ratio": v.ratio,
                        "verdict": v.verdict,
                    }
                    for name, v in gate_plugin.rows
                ],  # fmt: skip
            },
            "tests": self.tally.document(),
            "capabilities": self._capabilities(),
            "soak": self.soak.document() if self.soak is not None and self.soak.passes else None,
            "run_checks": [check.to_json() for check in run_checks],
        }
        try:
            data["extensions"] = extension_checks(
                self.config.hook.pytest_collectives_node_checks(config=self.config)
            )
        except ValueError as exc:
            self._not_written(exc)
            return
        try:
            report, plots = build_report(data)
            self.written = write_built(self.directory, report, plots)
        except (ReportError, OSError) as exc:
            self._not_written(exc)
            return
        # the node's own checks, judged from the data the report holds (the run's are the run's to print)
        self.checks_of_node, self.verdict = node_checks(report), report["verdict"]

    def _not_written(self, exc: Exception) -> None:
        self.error, self.failed = f"node report not written: {exc}", True

    def _capabilities(self) -> dict[str, Any] | None:
        """The conformance suites' capability matrix, where a conformance test probed a group."""
        return self.matrix.document() if self.matrix.reports() else None

    def checks(self) -> list[Check]:
        """The node's own checks, and the report's: its verdict (the worst of every check it holds) and
        where it is, or why it was not written (FAIL where not writing it failed the run)."""
        if self.error:
            status = FAIL if self.failed else NOT_JUDGED
            return [Check("node report", status, self.error.removeprefix("node report "))]
        if not self.written:
            return []
        from pytest_collectives.nodereport.outputs.write import HTML_NAME  # plotting's imports: lazily

        return [*self.checks_of_node, Check("node report", self.verdict, str(self.written[HTML_NAME]))]

    def summary(self, terminalreporter: Any) -> None:
        if self.written:
            terminalreporter.write_line(f"node report: {self.directory / 'report.html'}")
        if self.error:
            terminalreporter.write_line(self.error)


def _ran_nothing(session: pytest.Session) -> str:
    """Why a session ran no test to report on, or "" where it ran."""
    if session.config.option.collectonly:
        return "--collect-only ran no test"
    if session.exitstatus == pytest.ExitCode.USAGE_ERROR:
        return "the session ended in a usage error before its tests"
    if session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        return "no test was selected"
    return ""
