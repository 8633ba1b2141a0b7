"""SPMD mode: the launcher's variables, and pytest under torchrun on two loopback "nodes"."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import PLUGIN, outcomes

from pytest_collectives.execution import options
from pytest_collectives.execution.collection import world_sizes_of
from pytest_collectives.execution.launchers.spmd import (
    EXIT_HUNG,
    SpmdEnv,
    SpmdError,
    Watchdog,
    detect,
    first_difference,
    first_host,
    group_sizes_needed,
    lockstep_settings,
    settings_for,
    tasks_per_node,
)

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29400",
}
SLURM = {
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "2",
    "SLURM_NODEID": "0",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_JOB_ID": "123456",
}


def test_every_rank_s_engine_decides_without_a_clock() -> None:
    from hypothesis import Phase, settings

    locked = lockstep_settings(settings(deadline=1000, report_multiple_bugs=True))
    assert locked.derandomize and locked.database is None and locked.deadline is None
    # hunting for a second bug stops ten seconds after the first by each rank's own clock
    assert not locked.report_multiple_bugs
    assert Phase.explain not in locked.phases and Phase.shrink in locked.phases


def test_torchrun_variables() -> None:
    assert detect(TORCHRUN) == SpmdEnv("torchrun", 3, 4, 1, 2, "10.0.0.1", 29400)


def test_slurm_variables_and_the_default_master() -> None:
    env = detect(SLURM)
    assert env == SpmdEnv("slurm", 2, 8, 2, 4, "gpu07", 29500 + 456)
    assert detect({**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "1234"}).master_addr == "head"


def test_no_launcher_one_rank_or_switched_off_is_not_spmd() -> None:
    assert detect({}) is None
    assert detect({**TORCHRUN, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "GROUP_RANK": "0"}) is None  # fmt: skip
    assert detect({**TORCHRUN, "COLLECTIVES_SPMD": "0"}) is None


@pytest.mark.parametrize(
    "env, message",
    [
        ({**TORCHRUN, "RANK": "x"}, "RANK='x': expected a whole number"),
        ({k: v for k, v in TORCHRUN.items() if k != "LOCAL_WORLD_SIZE"}, "LOCAL_WORLD_SIZE is not set"),
        ({**TORCHRUN, "MASTER_ADDR": ""}, "MASTER_ADDR is not set"),
        ({**TORCHRUN, "RANK": "4"}, "rank 4 is outside a world of 4 ranks"),
        ({**TORCHRUN, "GROUP_RANK": "0"}, "not in per-node blocks of 2 ranks"),
        ({**SLURM, "SLURM_TASKS_PER_NODE": "4,3"}, "every node must run the same number of ranks"),
        ({**SLURM, "SLURM_NODEID": "1"}, "srun --distribution=block"),
        ({k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"}, "no master address: set MASTER_ADDR"),
    ],
    ids=["not-a-number", "missing", "no-master", "rank-range", "not-blocks", "uneven", "cyclic", "no-host"],
)
def test_bad_variables_are_one_line_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(SpmdError, match=message) as info:
        detect(env)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "nodelist, host",
    [("gpu[07-09,12]", "gpu07"), ("a1,b2", "a1"), ("n[3-4]-ib,m1", "n3-ib"), ("solo", "solo")],
)
def test_first_host_of_a_slurm_node_list(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


def test_tasks_per_node() -> None:
    assert tasks_per_node("4(x2)") == tasks_per_node("4,4") == tasks_per_node("4") == 4
    with pytest.raises(SpmdError, match="expected counts"):
        tasks_per_node("four")


def test_node_of_places_ranks_in_per_node_blocks() -> None:
    env = detect(TORCHRUN)
    assert [env.node_of(r) for r in range(4)] == [0, 0, 1, 1]


def test_world_sizes_reach_the_whole_world() -> None:
    env = SpmdEnv("slurm", 0, 16, 0, 8, "h", 1)
    values = {"gpus": "0", "backend": "", "backend_module": "", "world_sizes": "", "dist_timeout": "120"}
    assert settings_for(values, env, lambda: 0).world_sizes == (2, 3, 4, 8, 16)
    assert settings_for({**values, "world_sizes": "2,16"}, env, lambda: 0).world_sizes == (2, 16)
    with pytest.raises(options.OptionError, match="8 ranks per node need a GPU each"):
        settings_for({**values, "gpus": "4"}, env, lambda: 4)


def test_max_is_the_whole_spmd_world_whatever_the_world_sizes() -> None:
    # The all-pairs matrix sizes itself with world_sizes_of: on 2 nodes of 2 ranks with --world-sizes 2 it
    # must still span all 4 ranks, across the nodes, as the session's own parametrization does.
    env = SpmdEnv("torchrun", 0, 4, 0, 2, "h", 1)
    values = {"gpus": "0", "backend": "", "backend_module": "", "world_sizes": "2", "dist_timeout": "120"}
    assert world_sizes_of(("max",), settings_for(values, env, lambda: 0)) == (4,)
    assert world_sizes_of(("max",), options.Settings(world_sizes=(2, 3))) == (3,)
    assert world_sizes_of(("max",), options.Settings(gpus=8, world_sizes=(2,))) == (8,)


class _Item:
    def __init__(self, n: int | None) -> None:
        self.callspec = None if n is None else type("CallSpec", (), {"params": {"world_size": n}})()

    def get_closest_marker(self, name: str) -> object | None:
        return self.callspec and name == "world_size"


def test_the_groups_below_the_world_are_known_before_any_test_runs() -> None:
    items = [_Item(n) for n in (4, 2, None, 3, 2, 8)]
    assert group_sizes_needed(items, world=4) == [2, 3]


def test_first_difference_names_the_test_and_the_ranks() -> None:
    same = ["t.py::a", "t.py::b"]
    assert first_difference([same, same]) is None
    message = first_difference([same, same, ["t.py::a", "t.py::c"], ["t.py::a"]])
    assert "ranks 2,3 differ from rank 0" in message
    assert "test #2 is t.py::b on rank 0 but t.py::c on rank 2" in message


def test_watchdog_dumps_every_thread_and_exits() -> None:
    exits: list[int] = []
    with tempfile.TemporaryFile("w+") as stream:
        dog = Watchdog(rank=5, stream=stream, exit=exits.append)
        dog.arm("t.py::test_x (2 ranks)", 0.2)
        deadline = time.monotonic() + 5
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
        dog.disarm()
        stream.seek(0)
        text = stream.read()
    assert exits == [EXIT_HUNG]
    assert "rank 5: t.py::test_x (2 ranks) still running 0.2 s" in text
    assert "test_watchdog_dumps_every_thread_and_exits" in text  # the main thread's stack


def test_disarmed_watchdog_stays_quiet() -> None:
    exits: list[int] = []
    with tempfile.TemporaryFile("w+") as stream:
        dog = Watchdog(rank=0, stream=stream, exit=exits.append)
        dog.arm("quick", 0.2)
        dog.disarm()
        time.sleep(0.4)
    assert exits == []


# --- end to end: pytest under torchrun, two "nodes" of two ranks on loopback ---------------------------

# Records every dist.new_group call on each rank (SPMD mode, where pytest runs on the ranks).
CONFTEST = """
import torch.distributed as dist

dist.made_groups = []
_new_group = dist.new_group

def new_group(ranks=None, *args, **kwargs):
    local = bool(kwargs.get("use_local_synchronization"))
    dist.made_groups.append((sorted(ranks) if ranks is not None else None, local))
    return _new_group(ranks, *args, **kwargs)

dist.new_group = new_group
"""

INNER = """
import os, time
import pytest, torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st

SPMD = "TORCHELASTIC_RUN_ID" in os.environ or "SLURM_PROCID" in os.environ

@pytest.mark.world_size(4)
def test_all_reduce(pg):
    t = torch.tensor([float(pg.rank + 1)])
    dist.all_reduce(t)
    assert t.item() == 10

@pytest.mark.world_size(2)
def test_subgroup(pg):
    assert dist.get_world_size() == 2 == pg.world_size
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.all_reduce(t, group=pg.new_group([0, 1]))
    assert t.item() == 4

@pytest.mark.world_size(4)
def test_rank_two(pg):
    print(f"hello from rank {pg.rank}")
    assert pg.rank != 2, "rank two disagrees"

@pytest.mark.world_size(2, 4)
@settings(max_examples=5)
@given(n=st.integers(0, 40))
def test_sizes(pg, n):
    t = torch.ones(n)
    dist.all_reduce(t)
    assert t.eq(pg.world_size).all()

@pytest.mark.world_size(4)
def test_every_rank_made_the_test_groups(pg, tmp_path):
    print(f"pg.seed={pg.seed}")  # the same under the pool: tmp_path differs, the seed must not
    made = [None] * 4
    dist.all_gather_object(made, getattr(dist, "made_groups", []))
    if SPMD:  # with a bound GPU, a group made by its own ranks alone hangs or is refused
        assert all(([0, 1], False) in groups for groups in made), made

@pytest.mark.world_size(2)
@settings(max_examples=50)
@given(n=st.integers(0, 1000))
def test_shrinks(pg, n):
    assert n < 100 or pg.rank == 0

@pytest.mark.world_size(2)
def test_bench(pg, benchmark):
    t = torch.ones(256)
    benchmark(dist.all_reduce, t, nbytes=1024, collective="all_reduce")

@pytest.mark.world_size("max")
def test_max(pg):
    assert pg.world_size == 4

@pytest.mark.world_size(2)
def test_leaves_float64_as_default(pg):
    torch.set_default_dtype(torch.float64)

@pytest.mark.world_size(4)
def test_the_next_test_gets_float32(pg):  # ranks 0 and 1 ran the test above in this very process (SPMD)
    assert torch.get_default_dtype() == torch.float32

@pytest.mark.world_size(4)
def test_nodes(pg):
    spmd = "TORCHELASTIC_RUN_ID" in os.environ or "SLURM_PROCID" in os.environ
    assert [pg.node_of(r) for r in range(4)] == ([0, 0, 1, 1] if spmd else [0, 0, 0, 0])
    assert pg.link(0, 1) == "intra-node"
    assert pg.link(1, 2) == ("inter-node" if spmd else "intra-node")
"""

HANG = """
import time, pytest

@pytest.mark.world_size(4)
def test_hang(pg):
    if pg.rank == 1:
        time.sleep(600)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_two_nodes(tmp: Path, args: list[str], timeout_s: float) -> tuple[list[int], str]:
    """Two torchrun agents of 2 ranks each, as two nodes would run them; their exit codes and output."""
    port = free_port()
    launches = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node)]
        cmd += ["--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        launches.append((cmd + ["-m", "pytest", *PLUGIN, *args], {}))
    return run_all(tmp, launches, timeout_s)


def srun_two_nodes(tmp: Path, args: list[str], timeout_s: float) -> tuple[list[int], str]:
    """The four pytest processes `srun -N 2 --ntasks-per-node 2 pytest ...` starts, with srun's variables;
    the master is the first host of the job's node list, as on a cluster."""
    job = {"SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "localhost", "MASTER_PORT": str(free_port())}  # fmt: skip
    launches = []
    for rank in range(4):
        env = {
            **job,
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank % 2),
            "SLURM_NODEID": str(rank // 2),
        }
        launches.append(([sys.executable, "-m", "pytest", *PLUGIN, *args], env))
    return run_all(tmp, launches, timeout_s)


Launch = tuple[list[str], dict[str, str]]


def run_all(
    tmp: Path, launches: list[tuple[list[str], dict[str, str]]], timeout_s: float
) -> tuple[list[int], str]:
    """Start every command at once (each in its own session, killed whole if it overruns); their exit codes
    and output, in launch order."""
    base = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
    procs, logs = [], []
    for i, (cmd, env) in enumerate(launches):
        log = open(tmp / f"launch{i}.log", "w+")  # noqa: SIM115 - closed below
        procs.append(subprocess.Popen(cmd, cwd=tmp, env={**base, **env}, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))  # fmt: skip
        logs.append(log)
    try:
        codes = [p.wait(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    text = ""
    for log in logs:
        log.seek(0)
        text += log.read()
        log.close()
    return codes, text


def write_inner(tmp: Path) -> list[str]:
    """The inner tests and their conftest, written to ``tmp``; the arguments both modes run them with."""
    (tmp / "test_inner.py").write_text(INNER)
    (tmp / "conftest.py").write_text(CONFTEST)
    args = ["test_inner.py", "--rootdir", str(tmp), "--dist-timeout", "60", "-s"]
    return [*args, "--benchmark-max-time", "0.05", "--benchmark-min-rounds", "3"]


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The inner tests in the pool, once for both launchers: its folder (pooled.xml, pooled.json), output."""
    tmp = tmp_path_factory.mktemp("pooled")
    args = [*write_inner(tmp), "--junitxml", "pooled.xml", "--benchmark-json", "pooled.json"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *PLUGIN, *args], cwd=tmp, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 1, run.stdout
    return tmp, run.stdout


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "slurm"])
def test_two_nodes_match_a_pooled_run(tmp_path: Path, launcher: str, pooled: tuple[Path, str]) -> None:
    launch = torchrun_two_nodes if launcher == "torchrun" else srun_two_nodes
    args = [*write_inner(tmp_path), "--junitxml", "spmd.xml", "--benchmark-json", "spmd.json"]
    codes, text = launch(tmp_path, args, 240)
    assert all(code != 0 for code in codes), text  # a test failed: every node reports failure
    assert text.count("test session starts") == 1, text  # only rank 0 prints
    for line in [
        "1 of 4 ranks did not pass (failed on rank 2; passed on ranks 0,1,3)",
        "rank 2: FAILED (first to fail)",
        "AssertionError: rank two disagrees",
        "hello from rank 3",
        f"collectives: SPMD mode ({launcher}), 4 ranks on 2 node(s)",
        "rank state restored: rank 0: the test changed the default dtype to torch.float64; rank 1: "
        "the test changed the default dtype to torch.float64",
        "2 failed, 10 passed",
    ]:
        assert line in text, text
    pooled_dir, pooled_out = pooled
    assert outcomes(tmp_path / "spmd.xml") == outcomes(pooled_dir / "pooled.xml")
    # One seed for a test in both modes, so a failure seen under torchrun replays under the pool.
    seeds = re.findall(r"pg\.seed=(\d+)", text + pooled_out)
    assert len(seeds) == 8 and len(set(seeds)) == 1, seeds  # 4 ranks in each mode
    # The same shrunk counterexample, and benchmarks that carry the same figures.
    for output in (text, pooled_out):
        assert re.search(r"test_shrinks\(\s*pg=.*?,\s*n=100,", output, flags=re.S), output
    keys = [
        {b["name"]: sorted(b["extra_info"]) for b in json.loads(path.read_text())["benchmarks"]}
        for path in (tmp_path / "spmd.json", pooled_dir / "pooled.json")
    ]
    assert keys[0] == keys[1] and "busbw_GBps" in keys[0]["test_bench[ws2]"], keys


@pytest.mark.slow
def test_a_hang_ends_every_rank_with_its_stack(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(HANG)
    start = time.monotonic()
    codes, text = torchrun_two_nodes(tmp_path, ["test_hang.py", "--dist-timeout", "5"], timeout_s=180)
    elapsed = time.monotonic() - start
    assert all(code != 0 for code in codes), text
    assert "rank 1: test_hang.py::test_hang[ws4] (4 ranks) still running 5 s" in text, text
    assert "in test_hang" in text, text  # the hung rank's own stack
    assert elapsed < 5 + 5 + 90, f"took {elapsed:.0f} s"  # timeout, gather grace, start of 4 pytests


# Alone: its four ranks time twelve benchmarks, barrier after barrier; beside another test on two cores
# that took 254 s (11 s alone) and once overran its timeout.
@pytest.mark.slow
@pytest.mark.alone
def test_two_nodes_label_the_pairs_of_the_matrix_inter_and_intra_node(tmp_path: Path) -> None:
    suite = Path(__file__).parents[1] / "suites" / "perf" / "test_p2p.py"
    args = [f"{suite}::test_pair_bandwidth", "--min-bytes", "4K", "--max-bytes", "4K"]
    args += ["--benchmark-min-rounds", "3", "--benchmark-max-time", "0.01"]
    args += ["--benchmark-json", "bench.json", "--node-report", "report"]
    codes, text = torchrun_two_nodes(tmp_path, args, timeout_s=240)
    assert codes == [0, 0], text
    labels = {
        (b["extra_info"]["src"], b["extra_info"]["dst"]): b["extra_info"]["link"]
        for b in json.loads((tmp_path / "bench.json").read_text())["benchmarks"]
    }
    assert len(labels) == 12, labels
    assert labels == {pair: "intra-node" if pair[0] // 2 == pair[1] // 2 else "inter-node" for pair in labels}
    p2p = json.loads((tmp_path / "report" / "report.json").read_text())["p2p"]
    assert p2p["devices"] == ["node0:rank0", "node0:rank1", "node1:rank0", "node1:rank1"]
    assert p2p["classes"][1] == ["LOOPBACK", "X", "NET", "NET"]


@pytest.mark.slow
def test_a_bad_baseline_stops_every_rank_before_the_tests(tmp_path: Path) -> None:
    from pytest_collectives.gate.store import baseline_path
    from pytest_collectives.topology.detect import detect as detect_topology

    (tmp_path / "test_bench.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.world_size(4)\n"
        "def test_bench(pg, benchmark):\n"
        "    open(f'ran{pg.rank}', 'w').close()\n"
        "    benchmark(lambda: None)\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nbaseline_dir = baselines\n")
    bad = baseline_path(tmp_path / "baselines", detect_topology("gloo", 0))
    bad.parent.mkdir(parents=True)
    bad.write_text('{"schema_version": 1, "bench')
    codes, text = torchrun_two_nodes(tmp_path, ["test_bench.py"], timeout_s=240)
    assert codes == [1, 1], text
    assert f"baseline error: {bad}: invalid JSON" in text, text
    assert not list(tmp_path.glob("ran*")), "a rank ran the benchmark before the bad baseline was reported"
