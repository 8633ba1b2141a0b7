"""How much a bare torch loop moves between launches on this machine: the floor under any gate.

    python docs/measurements/scripts/bench_noise_floor.py [--launches 8]

No plugin code runs here. Each launch starts two fresh gloo ranks (as each pytest session does), times
all_reduce and broadcast at four sizes on nccl-tests' schedule (warm-up, then rounds of back-to-back
calls after a barrier), and exits. Over the launches it prints, for each statistic of a benchmark's
rounds the gate could judge (the minimum, the 10th percentile, the first quartile, the median), each
launch's machine factor (the median over the benchmarks, as the gate computes it) and each benchmark's
spread once that factor is divided out: the between-session noise the gate has to judge a planted slowdown
against. A gate can catch a slowdown of one benchmark only well above that spread (with 3 baseline runs and
30 benchmarks at 5% family-wise, about 7x it for a 95% catch rate), so it should judge the statistic that
repeats best between launches.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import socket
import statistics
import subprocess
import sys

SIZES = (256, 4096, 65536, 131072)
WARMUP, ROUNDS, ITERATIONS = 20, 60, 20
STATISTICS = {
    "min": min,
    "p10": lambda xs: statistics.quantiles(xs, n=10, method="inclusive")[0],
    "q1": lambda xs: statistics.quantiles(xs, n=4, method="inclusive")[0],
    "median": statistics.median,
}


def rank_main(rank: int, port: int) -> None:
    import time

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rounds_of = {}
    for op in ("all_reduce", "broadcast"):
        for nbytes in SIZES:
            t = torch.ones(nbytes // 4)
            call = (
                functools.partial(dist.all_reduce, t)
                if op == "all_reduce"
                else functools.partial(dist.broadcast, t, 0)
            )
            for _ in range(WARMUP):
                call()
            rounds = []
            for _ in range(ROUNDS):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(ITERATIONS):
                    call()
                rounds.append((time.perf_counter() - start) / ITERATIONS)
            rounds_of[f"{op}-{nbytes}"] = rounds
    if rank == 0:
        print(json.dumps(rounds_of), flush=True)
    dist.destroy_process_group()


def launch() -> dict[str, list[float]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, __file__, "--port", str(port), "--rank"]
    procs = [subprocess.Popen([*cmd, str(r)], stdout=subprocess.PIPE) for r in (0, 1)]
    out = [p.communicate(timeout=300)[0] for p in procs]
    return json.loads(out[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=8)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.rank is not None:
        rank_main(opts.rank, opts.port)
        return
    launches = [launch() for _ in range(opts.launches)]
    names = list(launches[0])
    spreads: dict[str, list[float]] = {}
    for stat, fn in STATISTICS.items():
        logs = [{k: math.log(fn(v)) for k, v in run.items()} for run in launches]
        factors = [statistics.median(run.values()) for run in logs]
        print(
            f"{stat:>6}: machine factor per launch:",
            " ".join(f"{math.exp(f - factors[0]):.2f}x" for f in factors),
        )
        spreads[stat] = [
            statistics.stdev([run[name] - f for run, f in zip(logs, factors, strict=True)]) for name in names
        ]
    print(f"{'spread after factor':<20}" + "".join(f"{stat:>9}" for stat in STATISTICS))
    for i, name in enumerate(names):
        print(f"{name:<20}" + "".join(f"{spreads[stat][i]:>9.1%}" for stat in STATISTICS))
    print(f"{'median':<20}" + "".join(f"{statistics.median(spreads[stat]):>9.1%}" for stat in STATISTICS))


if __name__ == "__main__":
    main()
