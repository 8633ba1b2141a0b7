"""--node-report end to end on CPU: a real session writes the folder, also when its tests fail."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import socket
import textwrap
from pathlib import Path

import pytest
import torch
from docblocks import block_of, commands, pytest_args, unshown
from helpers import copy_checkout

from pytest_collectives.nodereport.outputs.schema import REPORT_SCHEMA, validate

SUITE = """
import pytest, torch, torch.distributed as dist

@pytest.mark.world_size(3)
@pytest.mark.parametrize("pair", [(s, d) for s in range(3) for d in range(3) if s != d], ids=str)
def test_pair(pg, benchmark, pair):
    src, dst = pair
    buf = torch.ones(1 << 14)

    def transfer():
        if pg.rank == src:
            dist.send(buf, dst)
        elif pg.rank == dst:
            dist.recv(buf, src)

    benchmark.extra_info.update(src=src, dst=dst, matrix="pairs")
    benchmark(transfer, nbytes=buf.numel() * 4, collective="p2p")

@pytest.mark.world_size(2)
def test_all_reduce(pg, benchmark):
    t = torch.ones(1 << 12)
    benchmark.extra_info["algorithm"] = "all_reduce"
    benchmark(dist.all_reduce, t, nbytes=t.numel() * 4, collective="all_reduce")

@pytest.mark.world_size(2)
def test_broken(pg):
    assert pg.rank == 0, "rank 1 is broken"
"""


def test_a_cpu_session_writes_a_valid_report_with_its_failures(pytester, monkeypatch) -> None:
    pytester.makepyfile(test_node=textwrap.dedent(SUITE))
    # A 3-rank matrix on a 2-core machine is skipped as oversubscribed; here the report is under test, not
    # the figures, so the session is told it has 3 cores.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(3)))
    result = pytester.runpytest("--node-report", "report", "--benchmark-max-time", "0.02")
    result.assert_outcomes(passed=7, failed=1)
    result.stdout.fnmatch_lines(["node report: report/report.html"])
    folder = pytester.path / "report"
    report = json.loads((folder / "report.json").read_text())
    validate(report, REPORT_SCHEMA)
    assert report["verdict"] == "FAIL"  # the failing test fails the node
    assert report["host"] == socket.gethostname() and report["preflight"] is None  # a CPU run reads no NVML
    assert (folder / "report.xml").exists() and (folder / "report.md").exists()
    assert report["tests"]["failed"] == 1
    # what ran, to run it again: the command as typed, and the versions
    # (pytester adds --basetemp)
    assert report["run"]["command"].startswith("pytest --node-report report --benchmark-max-time 0.02 ")
    assert report["run"]["plugin"] == importlib.metadata.version("pytest-collectives")
    assert report["run"]["hypothesis_seed"] is None and report["run"]["torch"] == torch.__version__
    assert f"`{report['run']['command']}` in {pytester.path}" in (folder / "report.md").read_text()
    assert "rank 1 is broken" in report["tests"]["failures"][0]["longrepr"]
    p2p = report["p2p"]
    assert p2p["devices"] == ["rank0", "rank1", "rank2"]
    assert all(p2p["matrix"][i][j] > 0 for i in range(3) for j in range(3) if i != j)
    assert {p2p["classes"][0][1], p2p["classes"][2][0]} == {"LOOPBACK"}
    assert [c["name"] for c in report["collectives"]] == ["all_reduce n=2"]
    for png in ("p2p_bandwidth.png", "busbw_vs_size.png"):
        data = (folder / png).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    html = (folder / "report.html").read_text()
    assert "rank 1 is broken" in html and "<script" not in html


def test_the_suites_pair_latency_lands_in_a_cpu_report(pytester, monkeypatch) -> None:
    # The real suite file (and the byte check it imports), run on 2 CPU ranks.
    perf = Path(__file__).resolve().parents[1] / "suites" / "perf"
    for name in ("test_p2p.py", "copycheck.py"):
        shutil.copy(perf / name, pytester.path / name)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)))
    result = pytester.runpytest(
        "test_p2p.py::test_pair_latency", "--world-sizes", "2", "--node-report", "report",
        "--benchmark-max-time", "0.02",
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    report = json.loads((pytester.path / "report" / "report.json").read_text())
    validate(report, REPORT_SCHEMA)
    latency = report["p2p_latency"]
    assert latency["devices"] == ["rank0", "rank1"]
    assert latency["matrix_us"][0][0] is None and latency["matrix_us"][1][1] is None
    assert latency["matrix_us"][0][1] > 0 and latency["matrix_us"][1][0] > 0
    # A CPU run copies nothing between host and GPU: no figures, no check.
    assert report["host_device"] is None and report["p2p"] is None
    assert not [c for c in report["checks"] if c["name"].startswith("host-device")]
    html = (pytester.path / "report" / "report.html").read_text()
    table = html[html.index("<h2>GPU-to-GPU latency</h2>") :]
    assert "<th class=num>rank1</th>" in table[: table.index("</table>")]


def test_the_cpu_walk_through_runs_as_the_page_shows(pytester: pytest.Pytester) -> None:
    """docs/node-validation.md's first report on CPU: its command as typed, in a clone's layout with no
    baseline; the terminal line and the lines of report.md the page shows are what the run printed."""
    page = "docs/node-validation.md"
    copy_checkout(pytester.path)
    (args,) = [pytest_args(c) for c in commands(block_of(page, "test_p2p.py --world-sizes 2").text)]
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    assert not unshown(block_of(page, "node report: NOT JUDGED, report/").text, out), out[-3000:]
    written = (pytester.path / "report" / "report.md").read_text()
    assert not unshown(block_of(page, "### Node report: NOT JUDGED").text, written), written


def test_a_report_path_that_is_a_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    (pytester.path / "taken").write_text("not a folder")
    result = pytester.runpytest("--node-report", "taken")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --node-report taken: is a file; name a folder to write into"])


VENDOR_CHECKS = """
def pytest_collectives_node_checks(config):
    return {"acme.nic": [
        {"name": "mlx5_0 link", "status": "FAIL", "reason": "link up at 100 Gb/s, expected 400 Gb/s",
         "details": {"port": 1}},
        {"name": "firmware", "status": "PASS", "reason": "28.39.1002 is the validated release"},
    ]}
"""


def test_a_vendors_node_checks_land_in_every_output_and_fail_the_node(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    pytester.makeconftest(VENDOR_CHECKS)
    result = pytester.runpytest("--node-report", "report")
    result.assert_outcomes(passed=1)
    folder = pytester.path / "report"
    report = json.loads((folder / "report.json").read_text())
    validate(report, REPORT_SCHEMA)
    assert report["extensions"]["acme.nic"]["checks"][0]["details"] == {"port": 1}
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["acme.nic: mlx5_0 link"]["status"] == "FAIL" and report["verdict"] == "FAIL"
    assert checks["acme.nic: firmware"]["status"] == "PASS"
    for name in ("report.html", "report.md", "report.xml"):
        assert "link up at 100 Gb/s, expected 400 Gb/s" in (folder / name).read_text(), name


def test_a_malformed_node_check_leaves_the_report_unwritten_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    pytester.makeconftest(VENDOR_CHECKS.replace('"status": "FAIL"', '"status": "BROKEN"'))
    result = pytester.runpytest("--node-report", "report")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["node report not written: report data: extensions*acme.nic*status*BROKEN*"])
    assert not (pytester.path / "report" / "report.json").exists()
    result.stdout.fnmatch_lines(["*collectives: verdicts*", "node report: FAIL, not written: report data:*"])
