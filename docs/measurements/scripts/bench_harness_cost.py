"""Where a distributed test's time goes, and what it costs beside torch's own pooled base class.

    python docs/measurements/scripts/bench_harness_cost.py [--tests 400] [--rounds 3]

Every figure is a difference of whole pytest sessions, K tests against one, (T(K) - T(1)) / (K - 1), so what
a session pays once (start-up, collection of the module, the first group) drops out. The sessions of each
round alternate between the kinds, so a machine that slows down for a while slows all alike. The kinds:

- ``plain``: a test that takes no ``pg``: pytest's own per-test work;
- ``empty``: a 2-rank test whose body does nothing: plus the dispatch, the ranks' work before and after the
  body, and the result's way back;
- ``all_reduce``: a 2-rank test with one all_reduce of one element: plus the backend call;
- ``torch``: the same all_reduce in torch's MultiProcContinuousTest (needs the ``expecttest`` package);
- ``example2``/``example8``: one hypothesis example of an all_reduce test at 2 and 8 ranks, drawn 16 to a
  dispatch by ``@pytest_collectives.examples``: the body and its check;
- ``bare2``/``bare8``: the same all_reduce in a bare loop of 2000 on 2 and 8 spawned ranks, no pytest: the
  backend call's own cost, which an example cannot go below; ``bare8x97`` and the like: of 97 elements
  (gloo at 8 ranks on 2 cores: 3 ms a call for one element, 13 to 21 ms for 8 and more); ending in ``p``
  (``bare8x97p``), each rank kept to one core as the harness places ranks that outnumber the cores; with
  ``g`` (``bare2g``), each call after 1 ms of sleep, as a test's first call comes after pytest's work
  (only the calls timed); with ``b`` (``bare2gb``), gloo's event loops in the batch class, as the harness
  runs them (``scheduling.LoopsYield``);
- ``phases2``/``phases8``: a warm group of 2 or 8 ranks driven directly (no pytest), an empty test and
  the all_reduce test, split by the clock readings each rank returns (``RankResult.timeline``): from
  pytest's send to the first and the last rank taking the task, the rank's work before the body, the
  body, its work after it, and from the last rank's answer to pytest holding every result.

Printed, never asserted (timings on a shared machine are not a test's business).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# the tests' helpers (module_task)
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "support"))

ALL_REDUCE_BODY = """\
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == pg.world_size
"""
MODULES = {
    "plain": """
import os, pytest
@pytest.mark.parametrize("i", range(int(os.environ["K"])))
def test_plain(i):
    assert i >= 0
""",
    "empty": """
import os, pytest
@pytest.mark.world_size(2)
@pytest.mark.parametrize("i", range(int(os.environ["K"])))
def test_empty(pg, i):
    pass
""",
    "all_reduce": """
import os, pytest, torch, torch.distributed as dist
@pytest.mark.world_size(2)
@pytest.mark.parametrize("i", range(int(os.environ["K"])))
def test_all_reduce(pg, i):
""" + ALL_REDUCE_BODY,
    "torch": """
import os, torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcContinuousTest

class TinyTest(MultiProcContinuousTest):
    world_size = 2

    @classmethod
    def backend_str(cls):
        return "gloo"

    @classmethod
    def device_type(cls):
        return "cpu"

def _test(self):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2

for _i in range(int(os.environ["K"])):
    setattr(TinyTest, f"test_all_reduce_{_i}", _test)
""",
}
EXAMPLES = """
import os, pytest, torch, torch.distributed as dist
from hypothesis import settings, strategies as st
import pytest_collectives

@pytest.mark.world_size({n})
@settings(max_examples=int(os.environ["K"]), database=None, derandomize=True)
@pytest_collectives.examples(i=st.integers(0, 10**6))
def test_example(pg, i):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == pg.world_size
"""


BARE_ITERATIONS = int(os.environ.get("BARE_ITERATIONS", 2000))


def _bare_rank(rank: int, n: int, elements: int, port: int, answer: Any, flags: str) -> None:
    import torch
    import torch.distributed as dist

    from pytest_collectives.execution.launchers.warm_groups import rank_cores
    from pytest_collectives.execution.ranks.scheduling import LoopsYield, keep_to_core
    from pytest_collectives.topology.detect import usable_cores

    keep_to_core(rank_cores(sorted(usable_cores()), n) if "p" in flags else (), rank)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    t = torch.ones(elements)
    for _ in range(50):  # warm-up
        dist.all_reduce(t)
    if "b" in flags:
        LoopsYield().settle()
    gap_s = 1e-3 if "g" in flags else 0.0
    dist.barrier()
    calls = 0.0
    for _ in range(BARE_ITERATIONS):
        if gap_s:
            time.sleep(gap_s)
        start = time.perf_counter()
        dist.all_reduce(t)
        calls += time.perf_counter() - start
    if rank == 0:
        answer.put(calls / BARE_ITERATIONS)
    dist.destroy_process_group()


def bare(n: int, elements: int = 1, flags: str = "") -> float:
    """Seconds per all_reduce of ``elements`` float32 elements in a bare loop of ``n`` spawned gloo ranks;
    ``flags`` as the kinds' suffixes say (p: pinned as the harness pins ranks, g: a gap before each call, b:
    gloo's loops in the batch class)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answer = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_bare_rank, args=(n, elements, port, answer, flags), nprocs=n, start_method="spawn")
    return answer.get()


PHASES = (
    "to the first rank", "to the last rank", "rank: before the body", "the body", "rank: after the body",
    "the way back", "in all",
)  # fmt: skip


def phases(n: int, body: str, k: int) -> dict[str, float]:
    """Median seconds of each of PHASES over ``k`` calls of a test whose body is ``body`` (rank 0's)."""
    from helpers import module_task

    from pytest_collectives.execution.launchers.warm_groups import GroupPool

    task = module_task(f"import torch, torch.distributed as dist\ndef test(pg):\n{body}", "test")
    pool = GroupPool("gloo", timeout_s=60)
    rows = []
    try:
        for i in range(k + 50):  # the first 50 warm up
            group = pool.group(n)
            start = time.perf_counter()
            outcome, results = group.run(task, 60.0)
            end = time.perf_counter()
            if outcome.verdict() != "passed":
                raise SystemExit(f"phases: the test did not pass at {n} ranks:\n{outcome}")
            took, began, ended, answered = zip(*(r.timeline for r in results), strict=True)
            if i >= 50:
                rows.append((min(took) - start, max(took) - start, began[0] - took[0], ended[0] - began[0],
                             answered[0] - ended[0], end - max(answered), end - start))  # fmt: skip
    finally:
        pool.close()
    columns = zip(*rows, strict=True)
    return {name: statistics.median(column) for name, column in zip(PHASES, columns, strict=True)}


def session(directory: Path, kind: str, k: int) -> tuple[float, int]:
    """Seconds one pytest session takes, and how many examples or tests it ran."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         f"test_{kind}.py"],
        cwd=directory, env={**os.environ, "K": str(k)}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{kind} (K={k}) failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    # a distributed session's closing line counts what ran on the ranks: "...; 17 distributed examples (...)"
    counted = [line.split(" distributed examples")[0].split()[-1] for line in done.stdout.splitlines()
               if " distributed examples" in line]  # fmt: skip
    return elapsed, int(counted[0]) if counted else k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=400, help="K: tests (or examples) per long session")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default="plain,empty,all_reduce,torch,example2,example8,bare2,bare8")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    directory = Path(tempfile.mkdtemp(prefix="bench-harness-"))
    for kind in kinds:
        if kind.startswith(("bare", "phases")):
            continue
        n = kind.removeprefix("example")
        text = EXAMPLES.format(n=n) if kind.startswith("example") else MODULES[kind]
        (directory / f"test_{kind}.py").write_text(text)
    per_test: dict[str, list[float]] = {kind: [] for kind in kinds if not kind.startswith("phases")}
    split: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for kind in kinds:
            if kind.startswith("phases"):
                n = int(kind.removeprefix("phases"))
                for name, body in (("empty", "    pass\n"), ("all_reduce", ALL_REDUCE_BODY)):
                    split.setdefault(f"{name} test at {n} ranks", []).append(phases(n, body, args.tests))
                continue
            if kind.startswith("bare"):
                shape = kind.removeprefix("bare").rstrip("pgb")
                ranks, _, elements = shape.partition("x")
                per_test[kind].append(bare(int(ranks), int(elements or 1), kind.removeprefix(f"bare{shape}")))
                continue
            one, few = session(directory, kind, 1)
            many, ran = session(directory, kind, args.tests)
            per_test[kind].append((many - one) / max(ran - few, 1))
    for name, rounds in split.items():
        print(f"{name}, us, median of {args.tests} calls, each round:")
        for phase in PHASES:
            print(f"  {phase:<22} " + ", ".join(f"{r[phase] * 1e6:6.0f}" for r in rounds))
    kinds = list(per_test)
    if not kinds:
        return
    print(f"ms per test (examples for exampleN), median of {args.rounds} rounds of K={args.tests} against 1:")
    median = {kind: statistics.median(values) * 1e3 for kind, values in per_test.items()}
    for kind in kinds:
        spread = ", ".join(f"{v * 1e3:.2f}" for v in per_test[kind])
        print(f"  {kind:<11} {median[kind]:6.2f}   ({spread})")
    if {"plain", "empty", "all_reduce"} <= set(median):
        print(f"pytest's own work {median['plain']:.2f} ms; dispatch, the ranks' work around the body and "
              f"the way back {median['empty'] - median['plain']:.2f} ms; the all_reduce "
              f"{median['all_reduce'] - median['empty']:.2f} ms")  # fmt: skip
    if {"all_reduce", "torch"} <= set(median):
        print(f"plugin / MultiProcContinuousTest: {median['all_reduce'] / median['torch']:.2f}")
    if {"example2", "example8"} <= set(median):
        print(f"an example at 8 ranks / at 2 ranks: {median['example8'] / median['example2']:.2f}")
    if {"bare2", "bare8"} <= set(median):
        print(f"the bare all_reduce at 8 ranks / at 2 ranks: {median['bare8'] / median['bare2']:.2f}")
    if {"example2", "example8", "bare2", "bare8"} <= set(median):
        two, eight = (median[f"example{n}"] - median[f"bare{n}"] for n in (2, 8))
        print(f"an example's cost beyond the bare call: {two:.2f} ms at 2 ranks, {eight:.2f} ms at 8 "
              f"({eight / two:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
