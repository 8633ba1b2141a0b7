"""Prints what the benchmark harness costs: send/recv bandwidth timed by the harness (barrier per round, max
across ranks) against a bare torch.distributed loop in the same group, and shared-memory copy between
ranks against a memcpy inside one process.

    python docs/measurements/scripts/bench_overhead.py [--mib 16]

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the tests' support modules: helpers and the mutant backends the tests use
TESTS = Path(__file__).resolve().parents[3] / "tests" / "support"
sys.path.insert(0, str(TESTS))
from helpers import module_task  # noqa: E402

from pytest_collectives.execution.launchers.warm_groups import GroupPool  # noqa: E402

RANK_SIDE = """
import os, statistics, time
import torch, torch.distributed as dist
from pytest_collectives.bench.timing import measure

def test_overhead(pg, mib):
    n = mib << 18
    buf = torch.ones(n)
    me, peer = pg.rank, 1 - pg.rank

    def send_recv():
        dist.send(buf, peer) if me == 0 else dist.recv(buf, peer)

    rounds = 30
    harness = statistics.median(measure(send_recv, pg.device, rounds)[0])
    dist.barrier()
    start = time.perf_counter()
    for _ in range(rounds):
        send_recv()
    dist.barrier()
    bare = (time.perf_counter() - start) / rounds
    path = f"/dev/shm/collectives-overhead-{os.getppid()}"
    if me == 0:
        torch.from_file(path, shared=True, size=n, dtype=torch.float32).fill_(1.0)
    dist.barrier()
    shared = torch.from_file(path, shared=True, size=n, dtype=torch.float32)
    dst, private = torch.empty(n), torch.ones(n)
    def copy_from(src):
        return statistics.median(measure(lambda: dst.copy_(src) if me == 1 else None, pg.device, rounds)[0])

    copy_shm, memcpy = copy_from(shared), copy_from(private)
    dist.barrier()
    if me == 0:
        os.unlink(path)
        gb = (n * 4) / 1e9
        print(f"send/recv {mib} MiB: harness {gb / harness:.2f} GB/s, bare loop {gb / bare:.2f} GB/s, "
              f"harness/bare {bare / harness:.3f}")
        print(f"copy {mib} MiB, 1 thread: shared memory between ranks {gb / copy_shm:.2f} GB/s, "
              f"memcpy in one process {gb / memcpy:.2f} GB/s, ratio {memcpy / copy_shm:.3f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=16)
    args = parser.parse_args()
    task = module_task(RANK_SIDE, "test_overhead", mib=args.mib)
    pool = GroupPool("gloo", timeout_s=300)
    try:
        outcome = pool.run(task, 2)
    finally:
        pool.close()
    print(outcome.ranks[0].stdout, end="")
    if outcome.verdict() != "passed":
        print(outcome.render())
        raise SystemExit(1)


if __name__ == "__main__":
    main()
