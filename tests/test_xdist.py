"""pytest-xdist: disjoint GPU subsets per worker, and a CPU `-n 2` run that matches a plain one."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PLUGIN, copy_conformance, outcomes

from pytest_collectives.execution.modes.xdist import gpu_subset, visible_devices, worker
from pytest_collectives.execution.options import OptionError


def test_worker_position() -> None:
    assert worker({}) is None
    assert worker({"PYTEST_XDIST_WORKER": "gw3", "PYTEST_XDIST_WORKER_COUNT": "4"}) == (3, 4)


@pytest.mark.parametrize("gpus, workers", [(8, 2), (8, 3), (4, 4), (7, 2)])
def test_gpu_subsets_are_disjoint_and_cover_every_gpu(gpus: int, workers: int) -> None:
    subsets = [gpu_subset(i, workers, gpus) for i in range(workers)]
    assert sorted(g for s in subsets for g in s) == list(range(gpus))
    assert all(len(s) >= 1 for s in subsets)


def test_gpu_subset_of_worker_one_of_two() -> None:
    assert gpu_subset(1, 2, 8) == range(4, 8)
    assert visible_devices(range(2, 4), "4,5,6,7") == "6,7"
    assert visible_devices(range(4, 8), None) == "4,5,6,7"


def test_fewer_gpus_than_workers_is_an_error() -> None:
    with pytest.raises(OptionError, match="--gpus 2 with 4 xdist workers: .* use -n 2 or fewer"):
        gpu_subset(0, 4, 2)


INNER = """
import pytest, torch
import torch.distributed as dist

@pytest.mark.world_size(2, 3, 4)
@pytest.mark.parametrize("k", range(3))
def test_sum(pg, k):
    t = torch.full((4,), float(pg.rank + k))
    dist.all_reduce(t)
    n = pg.world_size
    assert t.eq(n * (n - 1) / 2 + n * k).all()

@pytest.mark.world_size(3)
def test_rank_one_fails(pg):
    assert pg.rank != 1

@pytest.mark.world_size(2)
def test_benchmarked(pg, benchmark):
    benchmark(dist.barrier)
"""


def run(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest", *PLUGIN, "test_inner.py", "-rs", *args]
    return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)


WHO_REPORTS = """
import os

def pytest_sessionfinish(session):
    where = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    plugins = [n for n in ("collectives-gate", "collectives-node-report")
               if session.config.pluginmanager.get_plugin(n) is not None]
    with open("who_reports.txt", "a") as f:
        f.write(f"{where}: {','.join(plugins) or '-'}\\n")
"""


@pytest.mark.slow
def test_two_workers_on_cpu_give_the_outcomes_of_a_plain_run_and_only_the_controller_reports(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    plain = run(tmp_path, "--junitxml", "plain.xml", "--benchmark-disable")
    # Each worker sees only its share of the tests: a report per worker would race for the folder and
    # say the node was judged on a part of the run.
    (tmp_path / "conftest.py").write_text(WHO_REPORTS)
    parallel = run(
        tmp_path, "-n", "2", "--junitxml", "xdist.xml", "--benchmark-disable", "--node-report", "report"
    )
    assert plain.returncode == parallel.returncode == 1, plain.stdout + parallel.stdout
    expected = outcomes(tmp_path / "plain.xml")
    assert expected["test_rank_one_fails[ws3]"] == "failure" and len(expected) == 11
    assert outcomes(tmp_path / "xdist.xml") == expected
    lines = sorted((tmp_path / "who_reports.txt").read_text().splitlines())
    assert lines == ["controller: collectives-gate,collectives-node-report", "gw0: -", "gw1: -"], lines
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["tests"]["passed"] + report["tests"]["failed"] == 11


@pytest.mark.slow
def test_benchmarks_refuse_to_run_under_xdist(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    result = run(tmp_path, "-n", "2", "-k", "benchmarked")
    assert result.returncode == 0, result.stdout
    assert "benchmark not run under pytest-xdist" in result.stdout
    assert "it needs the whole node; run benchmarks without -n" in result.stdout


@pytest.mark.slow
def test_two_workers_give_the_capability_matrix_and_counts_of_a_plain_run(tmp_path: Path) -> None:
    """The workers' probes, tallies and example counts reach the controller (xdist's workeroutput): the
    matrix, its JSON and the closing line are the serial run's. The sweep lists the same cases every run."""
    copy_conformance(tmp_path, ("test_every_cell.py",))
    # the tier one budget leaves everywhere: each worker times its own groups, busier than the serial run's
    args = ["test_every_cell.py", "-k", "broadcast", "--world-sizes", "2,3", "--tier-budget", "0"]
    args += ["-p", "no:cacheprovider"]
    serial = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--capability-json", "serial.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    parallel = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-n", "2", "--capability-json", "xdist.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert serial.returncode == parallel.returncode == 0, serial.stdout[-2000:] + parallel.stdout[-2000:]

    def statuses(name: str) -> dict[tuple[str, str, str], str]:
        doc = json.loads((tmp_path / name).read_text())
        assert doc["world_sizes"] == [2, 3]
        return {(c["operation"], c["dtype"], c["reduce_op"]): c["status"] for c in doc["cells"]}

    assert statuses("xdist.json") == statuses("serial.json")
    assert statuses("serial.json")["broadcast", "float32", "-"] == "PASS"
    semantics = [json.loads((tmp_path / n).read_text())["semantics"] for n in ("serial.json", "xdist.json")]
    assert semantics[0] == semantics[1] and len(semantics[0]) >= 30  # NaN and +-inf: the probe's rows

    def examples(out: str) -> str:
        return next(line for line in out.splitlines() if "distributed examples" in line).split("; ")[-1]

    assert examples(parallel.stdout) == examples(serial.stdout)
    assert "capability matrix" in parallel.stdout and "2 xdist workers (gw0: " in parallel.stdout
    # one turn of the rotating tiers for the run, the controller's, printed once: the workers drew the
    # largest size of each cell a serial run at that seed draws
    (turn,) = re.findall(r"turned at (\d+)", parallel.stdout)
    seeded = subprocess.run(
        [sys.executable, "-m", "pytest", *args, f"--hypothesis-seed={turn}", "--capability-json",
         "seeded.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert seeded.returncode == 0, seeded.stdout[-2000:]

    def largest(name: str) -> dict[tuple[str, str, str], int]:
        doc = json.loads((tmp_path / name).read_text())
        return {(c["operation"], c["dtype"], c["reduce_op"]): c.get("largest", 0) for c in doc["cells"]}

    assert largest("xdist.json") == largest("seeded.json")
