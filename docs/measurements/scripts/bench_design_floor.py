"""The floor of the design: a 2-rank test handed to warm ranks over pipes and nothing else, against a plain
test and the plugin's own 2-rank test.

    python docs/measurements/scripts/bench_design_floor.py [--tests 3000] [--rounds 3] [--kinds ...]

Issue 56 asks a 2-rank test to cost at most 0.5 ms above pytest's own work for a test and the backend
call made back to back. Every design that keeps the ranks in processes of their own pays, beyond the
plugin's work, a message each way per rank and the call made after a gap in which pytest ran. The ``floor``
kinds measure that alone: a conftest (FLOOR_CONFTEST) forks two gloo ranks once, in the plugin's scheduling
(short slices, gloo's loops in the batch class), and for each test writes its name to each rank's pipe and
reads a byte back. No fixtures, pickling, capture, seeding, health checks, crash or hang detection.

Each kind is one pytest session of K tests, the kinds alternating in each round. The figures are read
inside the session, from the 101st test to the one before the last (start-up, collection, the group's
start and its stop drop out): wall time per test, pytest's CPU per test in user space and in the kernel,
and each rank's CPU per test (``/proc``: the descendants of pytest alive at both readings). The kinds:

- ``plain``: a test without ranks (pytest's own work, the plugin installed);
- ``floor_empty``: the floor, the ranks' body empty;
- ``floor``: the floor, the body one all_reduce of one element;
- ``floor_one_core``: the same, both ranks kept to the last usable core and pytest to the others;
- ``plugin``: the plugin's 2-rank test of the same all_reduce;
- ``bare2``: the all_reduce in a bare loop of 2 spawned ranks, back to back (bench_harness_cost.py).

Printed, never asserted (timings on a shared machine are not a test's business).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_harness_cost  # noqa: E402

SKIP = 100
TIMER = f'''
import os, time
import pytest

SKIP = {SKIP}
TICK = os.sysconf("SC_CLK_TCK")
_seen = {{"tests": 0}}


def _descendants_cpu():
    """CPU seconds of each live descendant of this process, by pid."""
    parent, cpu = {{}}, {{}}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{{pid}}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(pid)] = int(fields[1])
        cpu[int(pid)] = (int(fields[11]) + int(fields[12])) / TICK
    mine = {{}}
    for pid, seconds in cpu.items():
        up = parent.get(pid)
        while up not in (None, 0, 1, os.getpid()):
            up = parent.get(up)
        if up == os.getpid():
            mine[pid] = seconds
    return mine


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    _seen["tests"] += 1
    if _seen["tests"] == SKIP + 1:
        _seen["ranks"] = _descendants_cpu()  # before the clocks start: a scan of /proc is not a test's
        _seen.update(wall=time.perf_counter(), cpu=os.times())
    yield
    # the last test's teardown stops the plugin's group: read before it
    if _seen["tests"] == item.session.testscollected - 1:
        wall, cpu = time.perf_counter() - _seen["wall"], os.times()
        user, system = cpu.user - _seen["cpu"].user, cpu.system - _seen["cpu"].system
        ranks = _descendants_cpu()
        spent = sorted((s - _seen["ranks"][p] for p, s in ranks.items() if p in _seen["ranks"]), reverse=True)
        k = _seen["tests"] - SKIP
        with open(os.environ["TIMER_OUT"], "w") as out:
            out.write(" ".join(f"{{s / k * 1e3:.3f}}" for s in [wall, user, system, *spent[:2]]))
'''
FLOOR_CONFTEST = """
import importlib, multiprocessing, os, sys, tempfile
import pytest

_ranks = []  # (process, pipe to it, pipe from it)


def _rank(rank, store, tasks, answers, test_file, core):
    import torch, torch.distributed as dist
    from pytest_collectives.execution.ranks.scheduling import LoopsYield, short_slices

    short_slices()
    if core is not None:
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    sys.path.insert(0, os.path.dirname(test_file))
    module = importlib.import_module(os.path.basename(test_file)[:-3])
    loops = LoopsYield()
    loops.settle()
    os.write(answers, b"r")
    while name := os.read(tasks, 256):
        try:
            getattr(module, name.decode())(0)
            os.write(answers, b"p")
        except BaseException:
            os.write(answers, b"f")
        loops.settle()
    os._exit(0)


def pytest_collection_finish(session):
    core = None
    if os.environ.get("FLOOR_ONE_CORE"):
        cores = sorted(os.sched_getaffinity(0))
        core = cores[-1]
        os.sched_setaffinity(0, set(cores[:-1]) or {core})
    store = os.path.join(tempfile.mkdtemp(dir=os.getcwd()), "store")  # a fresh file for each session
    fork = multiprocessing.get_context("fork")
    for rank in range(2):
        tasks_r, tasks_w = os.pipe()
        answers_r, answers_w = os.pipe()
        args = (rank, store, tasks_r, answers_w, str(session.items[0].path), core)
        process = fork.Process(target=_rank, args=args, daemon=True)
        process.start()
        os.close(tasks_r)
        os.close(answers_w)
        _ranks.append((process, tasks_w, answers_r))
    assert all(os.read(answers, 1) == b"r" for _, _, answers in _ranks)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    name = pyfuncitem.originalname.encode()
    for _, tasks, _ in _ranks:
        os.write(tasks, name)
    said = [os.read(answers, 1) for _, _, answers in _ranks]
    assert said == [b"p", b"p"], said
    return True


def pytest_unconfigure(config):
    for process, tasks, _ in _ranks:
        os.close(tasks)
        process.join(5)
"""
FLOOR_TEST = """
import os, pytest, torch, torch.distributed as dist

@pytest.mark.parametrize("i", range(int(os.environ["K"])))
def test_floor(i):
{body}"""
ALL_REDUCE = bench_harness_cost.ALL_REDUCE_BODY.replace("pg.world_size", "2")  # no pg on the floor
KINDS = {
    "plain": (bench_harness_cost.MODULES["plain"], None, {}),
    "floor_empty": (FLOOR_TEST.format(body="    pass\n"), FLOOR_CONFTEST, {}),
    "floor": (FLOOR_TEST.format(body=ALL_REDUCE), FLOOR_CONFTEST, {}),
    "floor_one_core": (FLOOR_TEST.format(body=ALL_REDUCE), FLOOR_CONFTEST, {"FLOOR_ONE_CORE": "1"}),
    "plugin": (bench_harness_cost.MODULES["all_reduce"], None, {}),
}
COLUMNS = ("wall", "pytest's user CPU", "pytest's system CPU", "rank CPU", "rank CPU")


def session(directory: Path, kind: str, k: int) -> list[float]:
    """ms per test: wall, pytest's CPU in user space and in the kernel, and the two busiest ranks' CPU
    (where the kind has ranks)."""
    out = directory / f"{kind}.out"
    path = os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **KINDS[kind][2], "K": str(k), "TIMER_OUT": str(out), "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p",
         "floor_timer", f"test_{kind}.py"],
        cwd=directory / kind, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{kind} (K={k}) failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return [float(x) for x in out.read_text().split()]


def measure(directory: Path, kinds: list[str], k: int, rounds: int) -> dict[str, list[list[float]]]:
    """Each kind's figures (``session``; the bare call's ms) in each round, the kinds alternating."""
    (directory / "floor_timer.py").write_text(TIMER)
    for kind in kinds:
        if kind == "bare2":
            continue
        module, conftest, _ = KINDS[kind]
        (directory / kind).mkdir()
        (directory / kind / f"test_{kind}.py").write_text(module)
        if conftest:
            (directory / kind / "conftest.py").write_text(conftest)
    rows: dict[str, list[list[float]]] = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind in kinds:
            if kind == "bare2":
                rows[kind].append([bench_harness_cost.bare(2) * 1e3])
            else:
                rows[kind].append(session(directory, kind, k))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=3000, help="K: tests per session")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default="plain,floor_empty,floor,floor_one_core,plugin,bare2")
    args = parser.parse_args()
    if args.tests <= SKIP + 1:
        raise SystemExit(f"--tests {args.tests}: needs more than {SKIP + 1} (the first {SKIP} are not timed)")
    kinds = args.kinds.split(",")
    unknown = [k for k in kinds if k not in KINDS and k != "bare2"]
    if unknown:
        raise SystemExit(f"--kinds: unknown {', '.join(unknown)}; choose from {', '.join([*KINDS, 'bare2'])}")
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as directory:
        rows = measure(Path(directory), kinds, args.tests, args.rounds)
    print(f"ms per test, median of {args.rounds} rounds of K={args.tests} (the rounds in brackets):")
    for kind, rounds in rows.items():
        cells = []
        for column, values in zip(COLUMNS, zip(*rounds, strict=True), strict=False):
            spread = ", ".join(f"{v:.2f}" for v in values)
            cells.append(f"{column} {statistics.median(values):.2f} ({spread})")
        print(f"  {kind:<15} " + "; ".join(cells))


if __name__ == "__main__":
    main()
