"""What several test modules share: how they load the plugin in a subprocess, a process's state from
/proc, a CPU fingerprint, JUnit outcomes, the node report's input data (an 8-GPU RTX 3090 node and a CPU
machine), how they run the suites on a planted backend, and the task the bench scripts hand a warm group
directly."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_collectives.execution.messages import Task
from pytest_collectives.topology.fingerprint import Fingerprint, GpuInfo
from pytest_collectives.topology.identity import topology_id
from pytest_collectives.topology.links import parse_topo_matrix

# Load the plugin by module name, so a checkout's copy on PYTHONPATH wins over an installed one.
PLUGIN = ["-p", "no:collectives", "-p", "pytest_collectives.hooks", "-p", "no:cacheprovider"]


def process_state(pid: int) -> tuple[str, int]:
    """A process's state letter ("Z": a zombie, dead but not yet reaped) and its parent's pid, from
    /proc/PID/stat; OSError where it is gone. The command name before them may hold spaces and ")"."""
    with open(f"/proc/{pid}/stat") as f:
        state, parent = f.read().rsplit(")", 1)[1].split()[:2]
    return state, int(parent)


def is_running(pid: int) -> bool:
    """Whether ``pid`` lives: a zombie is already dead, only its parent has not read its status yet. A
    process reaped between two looks is gone, not an error."""
    try:
        return process_state(pid)[0] != "Z"
    except OSError:
        return False


def cpu_fingerprint(**changes: object) -> Fingerprint:
    """The CI machine's fingerprint (gloo on a 2-core EPYC), with ``changes``."""
    fp = Fingerprint(
        backend="gloo",
        torch_version="2.13.0+cpu",
        cpu_model="AMD EPYC 7B13 64-Core Processor",
        logical_cores=2,
        sockets=1,
        numa_nodes=1,
    )
    return dataclasses.replace(fp, **changes)


def outcomes(junit: Path) -> dict[str, str]:
    """Test name -> passed, failure, error or skipped, from a --junitxml file."""
    result = {}
    for case in ET.parse(junit).iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        result[case.get("name")] = kinds[0] if kinds else "passed"
    return result


# ---------------------------------------------------------------------------------------------------------
# Node report data: what write_report takes

DATA = Path(__file__).resolve().parents[1] / "data"
TOPO = parse_topo_matrix((DATA / "rtx3090x8_topo_m.txt").read_text())


def read_p2p(path: Path) -> list[list[float]]:
    """The matrix printed by p2pBandwidthLatencyTest: a title, a `D\\D 0 1 ...` header, then rows."""
    rows = [line.split() for line in path.read_text().splitlines()[2:] if line.strip()]
    return [[float(v) for v in row[1:]] for row in rows]


def gpu_fingerprint() -> Fingerprint:
    gpu = GpuInfo(name="NVIDIA GeForce RTX 3090", pcie_gen_max=4, pcie_width_max=16)
    return Fingerprint(
        backend="nccl",
        torch_version="2.13.0",
        cpu_model="AMD EPYC 7543 32-Core Processor",
        logical_cores=64,
        sockets=2,
        numa_nodes=2,
        gpus=(gpu,) * 8,
        links=TOPO.links,
        link_source="nvidia-smi",
        driver_version="550.67",
        cuda_version="12.4",
        nccl_version="2.21.5",
    )


def collectives(peak: float) -> list[dict]:
    rows = []
    for name in ("all_reduce", "all_gather"):
        for exponent in range(10, 27, 4):
            size = 2**exponent
            busbw = peak * size / (size + 2**20)
            rows.append({"name": name, "bytes": size, "busbw_GBps": busbw, "algbw_GBps": busbw / 2})
    return rows


def base_data(fp: Fingerprint) -> dict:
    return {
        "topology_id": topology_id(fp),
        "fingerprint": fp.to_json(),
        "created": "2024-06-01T12:00:00+00:00",
        "p2p": None,
        "collectives": collectives(1.5),
        "baseline": {"available": False, "path": None, "rows": []},
        "tests": {"passed": 12, "failed": 0, "skipped": 1, "failures": []},
        # the run's checks, as the run judged them: the report renders them (verdicts.report_checks)
        "run_checks": [{"name": "test run", "status": "PASS", "reason": "12 passed, 0 failed, 1 skipped",
                        "details": {}}],
    }


def cpu_data() -> dict:
    return base_data(cpu_fingerprint())


def gpu_data() -> dict:
    data = base_data(gpu_fingerprint())
    data["p2p"] = {
        "unit": "GB/s",
        "bidirectional": True,
        "devices": [f"GPU{i}" for i in range(8)],
        "matrix": read_p2p(DATA / "rtx3090x8_p2p_bidir_GBps.txt"),
        "classes": [list(row) for row in TOPO.links],
    }
    data["collectives"] = collectives(7.0)
    data["baseline"] = {
        "available": True,
        "path": "baselines/gpu-8x/baseline.json",
        "rows": [
            {
                "benchmark": f"test_all_reduce[{size}]",
                "baseline_median_s": 0.01,
                "now_median_s": 0.01 * ratio,
                "ratio": ratio,
                "verdict": verdict,
            }
            for size, ratio, verdict in (("1MiB", 1.01, "unchanged"), ("64MiB", 0.92, "improvement"))
        ],
    }
    return data


SUITES = Path(__file__).resolve().parents[2] / "suites"
SUPPORT = Path(__file__).resolve().parent  # these modules: a PYTHONPATH that finds the planted backends


def torch_below(major: int, minor: int) -> bool:
    """Whether the installed torch is older than ``major.minor`` (the condition of a version skip)."""
    import torch

    return tuple(int(part) for part in torch.__version__.split(".")[:2]) < (major, minor)


def copy_conformance(directory: Path, files: tuple[str, ...] = (), conftest_extra: str = "") -> None:
    """Conformance suite files copied unchanged into ``directory`` beside the suites' conftest.py (their
    hypothesis profiles), followed by ``conftest_extra``, and their manifest of known bugs."""
    (directory / "conftest.py").write_text((SUITES / "conftest.py").read_text() + conftest_extra)
    (directory / "known_bugs.json").write_text((SUITES / "known_bugs.json").read_text())
    for name in files:
        (directory / name).write_text((SUITES / "conformance" / name).read_text())


def copy_checkout(root: Path) -> None:
    """The suites as a user's clone has them, beside an empty baselines/ (pytest.ini names it)."""
    shutil.copytree(SUITES, root / "suites", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "pytest.ini").write_text("[pytest]\nbaseline_dir = baselines\n")


# The files a run on a planted backend copies unless told others: those test_capabilities.py's many runs
# select their tests from.
PLANTED_FILES = (
    "test_all_reduce.py",
    "test_operations.py",
    "test_point_to_point.py",
    "test_every_cell.py",
    "test_layouts.py",
    "test_mismatches.py",
    "test_works.py",
)


def run_on_backend(
    pytester: pytest.Pytester,
    backend: str | None,
    *args: str,
    module: str = "mutant_backends",
    files: tuple[str, ...] = PLANTED_FILES,
    perf: bool = False,
    world_sizes: str = "3",
    dist_timeout: int | None = 30,
    env: dict[str, str] | None = None,
    subprocess_timeout: float | None = None,
) -> pytest.RunResult:
    """pytest ``args`` on ``backend`` of ``module`` (None: no --backend, torch's default as ``module`` patches
    it), over the conformance ``files`` (copy_conformance) and, with ``perf``, the perf suite's, all in
    pytester's folder. A ``--world-sizes`` in ``args`` replaces ``world_sizes``; ``dist_timeout`` None
    leaves the plugin's. ``env`` holds for the run alone. With ``subprocess_timeout`` the run is a process
    of its own, as a user types it, finding the planted backends on PYTHONPATH; else it runs in this one,
    where conftest.py put them on sys.path."""
    copy_conformance(pytester.path, files)
    if perf:
        for path in (SUITES / "perf").glob("*.py"):
            (pytester.path / path.name).write_text(path.read_text())
    flags = ["--backend-module", module, *(["--backend", backend] if backend else [])]
    if not any(arg.startswith("--world-sizes") for arg in args):
        flags += ["--world-sizes", world_sizes]
    if dist_timeout is not None:
        flags += ["--dist-timeout", str(dist_timeout)]
    flags += ["-p", "no:cacheprovider", *args]
    with pytest.MonkeyPatch.context() as monkeypatch:
        if subprocess_timeout is not None:
            monkeypatch.setenv("PYTHONPATH", str(SUPPORT))
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        if subprocess_timeout is None:
            return pytester.runpytest(*flags)
        return pytester.runpytest_subprocess(*flags, timeout=subprocess_timeout)


def module_task(source: str, function: str, **kwargs: object) -> Task:
    """The task of calling ``function`` (taking ``pg`` and ``kwargs``) of a module of ``source`` written to a
    folder of its own: what the bench scripts hand a warm group (``GroupPool``), with no pytest between."""
    directory = Path(tempfile.mkdtemp(prefix="bench-task-"))
    (directory / "bench_task.py").write_text(source)
    return Task(
        nodeid=f"bench_task.py::{function}",
        module="bench_task",
        path=str(directory / "bench_task.py"),
        qualname=function,
        kwargs={"pg": None, **kwargs},
        seed=0,
        sys_path=[str(directory), *sys.path],
    )
