"""The verdicts at the top of a node report, computed from its data rather than passed in, so the verdict
always follows from the data beside it.

`report_checks` gathers them: the NVML preflight (GPU runs), the node's links (bandwidth.judge_node on the P2P
matrix), each GPU's host-device copies against the other GPUs' (peers.peer_outliers), one check for the test
run, one for the benchmark baseline, one for the capability matrix, one for the configurations of
--backend-env, two for a soak (its failures, its benchmarks over time), and the extensions' own checks. A
Check whose subject is a list carries it as a table (checks.TABLE), which every output of the report shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_collectives.gate.statistics import INSUFFICIENT_DATA, REGRESSION
from pytest_collectives.nodereport.judging import preflight
from pytest_collectives.nodereport.judging.bandwidth import judge_node
from pytest_collectives.nodereport.judging.checks import (
    FAIL,
    NOT_JUDGED,
    PASS,
    STATUSES,
    TABLE,
    WARN,
    Check,
    NodeCheckError,
)
from pytest_collectives.nodereport.judging.link_matrix import join_names
from pytest_collectives.nodereport.judging.links import PCIE_ADVICE
from pytest_collectives.nodereport.judging.peers import Outlier, peer_outliers
from pytest_collectives.nodereport.outputs.schema import ReportError, has_pairs


def report_checks(data: Mapping[str, Any]) -> list[Check]:
    """The verdicts shown at the top of the report: the GPUs' health as NVML reports it (GPU runs), the node's
    links, the test run, the benchmark baseline, the configurations, the capability matrix, the soak, and the
    extensions' own checks."""
    health = preflight.preflight_checks(data["preflight"]) if data.get("preflight") else []
    run = [_test_check(data["tests"]), _benchmark_check(data["baseline"])]
    if data["tests"].get("configurations"):
        run.append(_configuration_check(data["tests"]["configurations"]))
    if data.get("capabilities"):
        run.append(_capability_check(data["capabilities"]))
    if data.get("soak"):
        run += _soak_checks(data["soak"])
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


def _link_checks(p2p: Mapping[str, Any] | None) -> list[Check]:
    if not has_pairs(p2p):
        return [
            Check(
                "links",
                WARN,
                "No GPU-to-GPU bandwidth was measured (CPU run or one GPU): no link was judged, so none is "
                "known to be healthy.",
            )
        ]
    try:
        return judge_node(
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
                NOT_JUDGED,
                f"{len(measured)} GPU(s) measured: too few for the others to say what a healthy one reaches "
                f"(needs 3), so their figures (below) were not judged.",
                {"devices": len(measured)},
            )
        ]
    slow: dict[int, list[tuple[str, Outlier]]] = {}
    for name, values in series.items():
        for outlier in peer_outliers(values):
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


def _slow_device_check(label: str, device: int, found: Sequence[tuple[str, Outlier]]) -> Check:
    worst = min(found, key=lambda f: f[1].ratio)
    names = [name for name, _ in found]
    advice = []
    if any(name.split()[0] in _LINK_SERIES for name in names):
        advice += [PCIE_ADVICE, _NUMA_ADVICE]
    if any(name.split()[0] not in _LINK_SERIES for name in names):
        advice.append(_MEMORY_ADVICE)
    return Check(
        f"host-device {label}",
        max((o.status for _, o in found), key=STATUSES.index),
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


def _message(longrepr: str, most: int = 200) -> str:
    """A failure's message: its first ``E`` line, as pytest prints it in the short summary."""
    lines = [line[1:].strip() for line in longrepr.splitlines() if line.startswith("E ")]
    lines = lines or [line.strip() for line in longrepr.splitlines() if line.strip()][-1:] or ["-"]
    return lines[0] if len(lines[0]) <= most else lines[0][: most - 3] + "..."


def _test_check(tests: Mapping[str, Any]) -> Check:
    passed, failed, skipped = tests["passed"], tests["failed"], tests["skipped"]
    counts = {"passed": passed, "failed": failed, "skipped": skipped}
    summary = f"{passed} passed, {failed} failed, {skipped} skipped"
    if failed:
        # the table lands in every output (terminal, md, xml, html): the tracebacks are the HTML's alone
        listed = {
            TABLE: {
                "columns": ["Test", "Failure", "Standalone reproduction"],
                "rows": [
                    [f["nodeid"], _message(f["longrepr"]), " ".join(f.get("reproductions", [])) or "-"]
                    for f in tests["failures"]
                ],
            }
        }
        words = "the failing tests are listed below, each with its message and the reproduction it wrote"
        return Check("test run", FAIL, f"{summary}: {words}.", {**counts, **listed})
    if not passed:
        return Check(
            "test run", WARN, f"{summary}: no test passed, so nothing was verified on this node.", counts
        )
    return Check("test run", PASS, f"{summary}.", counts)


def _configuration_check(each: Sequence[Mapping[str, Any]]) -> Check:
    """Under --backend-env, the tests' outcomes per configuration: whether failures follow a setting."""
    details = {
        TABLE: {
            "columns": ["Backend settings", "Passed", "Failed", "Skipped"],
            "rows": [[c["backend_env"], c["passed"], c["failed"], c["skipped"]] for c in each],
        }
    }
    failing = [c["backend_env"] for c in each if c["failed"]]
    # the run's judgement (configurations.Coverage), where the report has it; an older one's counts
    untested = [
        c["backend_env"] for c in each if c.get("untested", not c["failed"] and not c["passed"])
    ]
    if not failing and untested:
        return Check(
            "backend settings",
            FAIL,
            f"Untested with {join_names(untested)}: none of its tests ran (N/A or skipped), so nothing was "
            f"verified under that setting.",
            details,
        )
    if not failing:
        skipped = sum(c["skipped"] for c in each)
        left = f" ({skipped} skipped or N/A, counted in the table)" if skipped else ""
        return Check(
            "backend settings",
            PASS,
            f"No test failed in any of the {len(each)} configurations, and each ran tests{left}.",
            details,
        )
    if len(failing) == len(each):
        where = f"in every one of the {len(each)} configurations: not a fault of one setting"
    else:
        passing = [c["backend_env"] for c in each if not c["failed"]]
        where = (
            f"only with {join_names(failing)} (none with {join_names(passing)}): the backend is wrong under "
            f"that setting"
        )
    return Check(
        "backend settings",
        FAIL,
        f"Tests failed {where}; the failing tests, whose ids name their settings, are listed below.",
        details,
    )


def _soak_checks(soak: Mapping[str, Any]) -> list[Check]:
    """A burn-in's two verdicts: the tests over its passes, and the benchmarks' figures over its time."""
    from pytest_collectives.bench.side_by_side import drifted
    from pytest_collectives.execution.modes.soak import clock

    passes = soak["passes"]
    ran = (
        f"{passes} passes in {clock(soak['elapsed_s'])} ({soak['ended']}; first hypothesis seed "
        f"{soak['first_seed']})"
    )
    failures = soak["failures"]
    if failures:
        first = min(failures, key=lambda f: f["first_at_s"])
        tests = Check(
            "burn-in",
            FAIL,
            f"{ran}: {len(failures)} test(s) failed, first {first['nodeid']} at {clock(first['first_at_s'])} "
            f"(pass {first['first_pass']}, failing in {first['failed_passes']} of {passes}); the table has "
            f"each one's rate and the command that replays it.",
            {
                TABLE: {
                    "columns": [
                        "Test",
                        "Backend settings",
                        "Failed in",
                        "At the same draw",
                        "First at",
                        "Replay",
                    ],
                    "rows": [
                        [
                            f["nodeid"],
                            f["backend_env"] or "-",
                            f"{f['failed_passes']} of {passes} passes",
                            f["kind"] or "-",
                            f"{clock(f['first_at_s'])} (pass {f['first_pass']})",
                            f["replay"],
                        ]
                        for f in failures
                    ],  # fmt: skip
                }
            },
        )
    else:
        tests = Check("burn-in", PASS, f"{ran}: no test failed in any pass.", {"passes": passes})
    if not soak["series"]:
        return [tests]
    tolerance = soak["tolerance"]
    series = {s["benchmark"]: (s["unit"], [value for _, value in s["points"]]) for s in soak["series"]}
    worse = drifted(series, tolerance)
    longest = max(len(values) for _, values in series.values())
    if longest < 9:
        over = Check(
            "burn-in bandwidth",
            NOT_JUDGED,
            f"{len(series)} benchmarks over {passes} passes: too few to judge a drift over the soak (the "
            f"last third of the passes is compared with the first, 3 passes a third at least).",
        )
    elif not worse:
        over = Check(
            "burn-in bandwidth",
            PASS,
            f"{len(series)} benchmarks over {passes} passes: none got worse from its first passes to its "
            f"last beyond the tolerance of {tolerance:.0%}.",
        )
    else:
        over = Check(
            "burn-in bandwidth",
            WARN,
            f"{len(worse)} of {len(series)} benchmarks got worse over the soak beyond the tolerance of "
            f"{tolerance:.0%} (listed in the table): thermal throttling or a link training down; look at "
            f"the GPUs' clocks and throttle reasons and the links' state.",
            {
                TABLE: {
                    "columns": ["Benchmark", "Figure", "First passes", "Last passes", "Worse"],
                    "rows": [
                        [d.name, d.unit, f"{d.first:.3f}", f"{d.last:.3f}", f"{d.worse:.0%}"] for d in worse
                    ],
                }
            },
        )
    return [tests, over]


def _capability_check(matrix: Mapping[str, Any]) -> Check:
    """The capability matrix as one verdict: FAIL where any cell failed, WARN where no cell passed (all
    untested or known bugs: nothing was verified), PASS where cells passed, saying how many of those
    supported; with the whole matrix as a table (a row per operation and reduce op, the dtypes of each
    status), so every output of the report has it."""
    from pytest_collectives.conformance.matrix import FAIL as CELL_FAIL
    from pytest_collectives.conformance.matrix import NA as CELL_NA
    from pytest_collectives.conformance.matrix import PASS as CELL_PASS
    from pytest_collectives.conformance.matrix import STATUSES as CELL_STATUSES
    from pytest_collectives.conformance.matrix import short_dtype
    from pytest_collectives.execution.reproductions import WORDS

    rows: dict[tuple[str, str], dict[str, list[str]]] = {}
    counts = dict.fromkeys(CELL_STATUSES, 0)
    for cell in matrix["cells"]:
        by_status = rows.setdefault((cell["operation"], cell["reduce_op"]), {s: [] for s in CELL_STATUSES})
        by_status[cell["status"]].append(short_dtype(cell["dtype"]))
        counts[cell["status"]] += 1
    details: dict[str, Any] = {
        "backend": matrix["backend"],
        **counts,
        TABLE: {
            "columns": ["Operation", *CELL_STATUSES],
            "rows": [
                [op if redop == "-" else f"{op} {redop}", *(" ".join(found[s]) for s in CELL_STATUSES)]
                for (op, redop), found in sorted(rows.items())
            ],
        },
    }
    stacks = "".join(f"; {stack}: {verdict}" for stack, verdict in matrix.get("training", {}).items())
    # under --backend-env: what differs between the configurations, and those the backend rejected
    rejected = [c for c in matrix.get("configurations", []) if "rejected" in c]
    settings = [d["line"] for d in matrix.get("differences", [])]
    settings += [f"{c['backend_env']}: rejected ({c['rejected']})" for c in rejected]
    if settings:
        details["backend_settings"] = settings
        stacks += f"; {len(settings)} difference(s) between backend settings, first: {settings[0]}"
    where = (
        f"{matrix['backend']} ({matrix['backend_version']}, torch {matrix['torch']}) at world sizes "
        f"{', '.join(map(str, matrix['world_sizes']))}: "
        + ", ".join(f"{counts[s]} {s}" for s in CELL_STATUSES)
        + stacks
    )
    # a vendor files a red or known-bug cell with the script its test wrote
    scripts = [
        f"{c['operation']} {c['dtype']} {c['reduce_op']} ({c['status']}): {path}"
        for c in matrix["cells"]
        for path in c.get("reproductions", [])
    ]
    if scripts:
        details["reproductions"] = scripts
    failed = [c for c in matrix["cells"] if c["status"] == CELL_FAIL]
    if failed:
        first = failed[0]
        script = "".join(f"; {WORDS}{path}" for path in first.get("reproductions", [])[:1])
        return Check(
            "capability matrix",
            FAIL,
            f"{where}. {first['operation']} {first['dtype']} {first['reduce_op']} gave wrong results "
            f"({first.get('first_failure', '')}{script}): the failing tests are listed below.",
            details,
        )
    supported = len(matrix["cells"]) - counts[CELL_NA]
    tried = f"{counts[CELL_PASS]} of the {supported} supported cells tried and passed"
    if not counts[CELL_PASS]:
        return Check("capability matrix", WARN, f"{where}; {tried}: nothing was verified.", details)
    return Check("capability matrix", PASS, f"{where}; {tried}, none gave a wrong result.", details)


def _gate_check(gate: Mapping[str, Any], rows: list[Mapping[str, Any]]) -> Check:
    """The gate's own verdict, as it gave it: the report never judges the benchmarks again (it read PASS
    beside a machine-wide slowdown the gate failed), and names another topology's baseline."""
    status = gate["status"]  # the gate ranks the statuses as a Check does
    other = gate.get("other_topology")
    words = f"Judged against a baseline of another topology ({other}), as asked: " if other else "The gate: "
    details: dict[str, Any] = {"available": True, "compared": len(rows), "gate": gate["status"]}
    details.update(_slower(rows))
    return Check("benchmark baseline", status, f"{words}{gate['words']}.", details)


def _slower(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The table of the benchmarks the gate found slower, slowest first; empty where none is."""
    slower = sorted(
        (r for r in rows if r["verdict"] == REGRESSION), key=lambda r: (-r["ratio"], r["benchmark"])
    )
    if not slower:
        return {}
    found = [[r["benchmark"], f"{r['ratio']:.2f}x"] for r in slower]
    return {TABLE: {"columns": ["Benchmark", "Time now / baseline"], "rows": found}}


def _benchmark_check(baseline: Mapping[str, Any]) -> Check:
    rows = baseline["rows"]
    if baseline.get("error"):
        return Check("benchmark baseline", FAIL, f"The gate could judge nothing: {baseline['error']}.")
    if not baseline["available"]:
        return Check(
            "benchmark baseline",
            NOT_JUDGED,
            "No benchmark baseline for this topology, so no speed was compared: record one from a known-good "
            "run.",
            {"available": False},
        )
    if gate := baseline.get("gate"):
        return _gate_check(gate, rows)
    table = _slower(rows)
    slower = table[TABLE]["rows"] if table else []
    details: dict[str, Any] = {"available": True, "compared": len(rows), "regressions": len(slower), **table}
    where = f" ({baseline['path']})" if baseline["path"] else ""
    if slower:
        return Check(
            "benchmark baseline",
            FAIL,
            f"{len(slower)} of {len(rows)} benchmarks are slower than the baseline{where} beyond noise "
            f"(listed in the table): re-run them, and if they stay slow look for what changed since it was "
            f"recorded.",
            details,
        )
    judged = [r for r in rows if r["verdict"] != INSUFFICIENT_DATA]
    if not judged:
        return Check(
            "benchmark baseline",
            NOT_JUDGED,
            f"None of the {len(rows)} benchmarks could be judged against the baseline{where} (too few runs "
            f"or rounds): no speed is known to be healthy.",
            details,
        )
    return Check(
        "benchmark baseline",
        PASS,
        f"{len(judged)} of {len(rows)} benchmarks judged against the baseline{where}: none is slower beyond "
        f"noise.",
        details,
    )
