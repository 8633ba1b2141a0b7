"""gloo: the Work of an async reduce_scatter never reads completed, 2 ranks, torch.int32

Found by the pytest-collectives conformance suite: reduce_scatter_single's Work on rank 0: is_completed()
is False once wait() returned (test_works.py::test_async_work_completes[ws2-reduce_scatter_single], and
the same of the list reduce_scatter, torch 2.13.0+cpu). Torch documents wait() as blocking until the work
is completed, and is_completed() as whether it is: after wait() returned True, is_completed() must be
True. Here the output is written and is_completed() stays False for good, so code that polls it (or
checks for unfinished work, as a test harness does) waits forever. gloo's other collectives are right.

Standalone: needs only torch. Run it as `python THIS_FILE`: it starts the ranks on this machine, makes the
call, and prints on each rank what came back. It exits 1 while the bug is there, 0 once it is fixed.
"""

import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BACKEND, WORLD_SIZE = "gloo", 2
SETTLE_S = 1.0  # how long after wait() the Work is given to read completed
HANG = 120  # seconds: a rank not done by then is hung in the call


def rank_main(rank, folder):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # the ranks talk over loopback only
    dist.init_process_group(BACKEND, init_method=f"file://{folder}/store", rank=rank, world_size=WORLD_SIZE)
    x = torch.arange(2 * WORLD_SIZE, dtype=torch.int32) + 10 * rank  # two elements for each rank
    expected = sum(torch.arange(2 * WORLD_SIZE, dtype=torch.int32) + 10 * r for r in range(WORLD_SIZE))
    expected = expected[2 * rank : 2 * rank + 2]
    calls = {
        "reduce_scatter_tensor": lambda out: dist.reduce_scatter_tensor(out, x, async_op=True),
        "reduce_scatter": lambda out: dist.reduce_scatter(out, list(x.chunk(WORLD_SIZE)), async_op=True),
    }
    ok = True
    for name, call in calls.items():
        out = torch.zeros(2, dtype=torch.int32)
        work = call(out)
        waited = work.wait()
        completed = work.is_completed()
        time.sleep(SETTLE_S)
        later = work.is_completed()
        wrote = torch.equal(out, expected)
        right = waited is True and completed and later and wrote
        ok = ok and right
        print(
            f"rank {rank}: {name}: wait() returned {waited!r}; is_completed() {completed} right after, "
            f"{later} {SETTLE_S:g} s later (expected True); output {out.tolist()} "
            f"{'as expected' if wrote else f'WRONG, expected {expected.tolist()}'}{'' if right else ': BUG'}",
            flush=True,
        )
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


def main():
    with tempfile.TemporaryDirectory() as folder:
        context = mp.start_processes(
            rank_main, args=(folder,), nprocs=WORLD_SIZE, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + HANG
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                alive = [r for r, p in enumerate(context.processes) if p.is_alive()]
                for p in context.processes:
                    p.kill()
                print(f"rank(s) {alive} still in the call after {HANG} s: it hangs")
                return 1
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except mp.ProcessExitedException as exc:  # a rank exited 1: it printed what it saw
        print(f"the bug is there ({exc})")
        code = 1
    else:
        print("every result as expected" if code == 0 else "")
    sys.exit(code)
