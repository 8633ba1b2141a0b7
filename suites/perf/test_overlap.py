"""Overlap: does communication run alongside other communication and alongside compute, or in its way?

Seed 001 saw two NCCL transfers serialise, and a matmul overlapped with NCCL send run three times slower
while one overlapped with a memcpy did not. Each benchmark here times the overlapped case and records the
same work done one piece after the other (``sequential_median_s``) or alone (``alone_median_s``) with the
same synchronised timing, and the ratio, in ``extra_info``.
"""

from __future__ import annotations

import statistics

import pytest
import torch
import torch.distributed as dist

from pytest_collectives.algorithms import collectives as alg
from pytest_collectives.bench.timing import measure

BASELINE_ROUNDS = 10
MATMUL_N = 256


def _median(pg, fn) -> float:
    return statistics.median(measure(fn, pg.device, BASELINE_ROUNDS)[0])


def _note_ratio(benchmark, reference_key: str, reference_s: float, ratio_key: str) -> None:
    benchmark.extra_info[reference_key] = reference_s
    if benchmark.samples:  # empty under --benchmark-disable
        benchmark.extra_info[ratio_key] = statistics.median(benchmark.samples) / reference_s


def _exchange(buf: torch.Tensor, inbox: torch.Tensor, peer: int) -> list[dist.Work]:
    return dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, peer), dist.P2POp(dist.irecv, inbox, peer)])


@pytest.mark.world_size(2)
def test_two_transfers(pg, benchmark, nbytes):
    """comm/comm: two exchanges in flight at once against one after the other."""
    peer = 1 - pg.rank
    bufs = [torch.ones(nbytes // 4, device=pg.device) for _ in range(2)]
    inboxes = [torch.empty_like(b) for b in bufs]

    def sequential():
        for buf, inbox in zip(bufs, inboxes, strict=True):
            for work in _exchange(buf, inbox, peer):
                work.wait()

    def concurrent():
        works = [w for buf, inbox in zip(bufs, inboxes, strict=True) for w in _exchange(buf, inbox, peer)]
        for work in works:
            work.wait()

    sequential_s = _median(pg, sequential)
    benchmark(concurrent, nbytes=4 * nbytes, collective="p2p")
    _note_ratio(benchmark, "sequential_median_s", sequential_s, "concurrent_over_sequential")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("transfer", ["copy", "send"])
def test_matmul_with_transfer(pg, benchmark, transfer, nbytes):
    """comm/compute: a matmul's time while a transfer is in flight, against the matmul alone."""
    a = torch.randn(MATMUL_N, MATMUL_N, device=pg.device)
    peer = 1 - pg.rank
    buf = torch.ones(nbytes // 4, device=pg.device)
    # copy-based on GPU: straight into the peer's device memory (tensor.to), on a stream of its own
    on_gpu = pg.device.type == "cuda"
    target = torch.device("cuda", peer) if on_gpu and transfer == "copy" else pg.device
    inbox = torch.empty_like(buf, device=target)
    copy_stream = torch.cuda.Stream() if on_gpu else None

    def matmul():
        return a @ a

    def overlapped():
        if transfer == "send":
            works = _exchange(buf, inbox, peer)
            result = a @ a
            for work in works:
                work.wait()
        elif on_gpu:
            with torch.cuda.stream(copy_stream):
                inbox.copy_(buf, non_blocking=True)
            result = a @ a
            torch.cuda.current_stream().wait_stream(copy_stream)
        else:
            inbox.copy_(buf)  # one CPU thread per rank: a copy and a matmul share it
            result = a @ a
        return result

    alone_s = _median(pg, matmul)
    benchmark.extra_info["transfer"] = transfer
    benchmark(overlapped, nbytes=nbytes, collective="p2p")
    _note_ratio(benchmark, "alone_median_s", alone_s, "slowdown")


@pytest.mark.world_size()
@pytest.mark.parametrize("schedule", ["pipelined", "sequential"])
def test_gemm_reduce_scatter(pg, benchmark, schedule):
    """GEMM + reduce-scatter (seed 003): the ring that overlaps each chunk's matmul with the previous
    chunk's transfer, against a matmul followed by the reduce-scatter."""
    n = pg.world_size
    m, k, cols = 64 * n, 128, 128
    a = torch.randn(m, k, device=pg.device)
    b = torch.randn(k, cols, device=pg.device)
    fn = alg.gemm_reduce_scatter if schedule == "pipelined" else alg.gemm_reduce_scatter_sequential
    benchmark.extra_info.update(schedule=schedule, m=m, k=k, n=cols)
    benchmark(fn, a, b, nbytes=m * cols * 4, collective="reduce_scatter")
