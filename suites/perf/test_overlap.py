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
from copycheck import SENTINEL, assert_copied, pattern, sentinel

from pytest_collectives import Stamps, gemm_reduce_scatter, gemm_reduce_scatter_sequential, measure

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
    bufs = [pattern(nbytes, 2 * pg.rank + i, pg.device).view(torch.float32) for i in range(2)]
    inboxes = [sentinel(nbytes, pg.device).view(torch.float32) for _ in bufs]

    def sequential():
        for buf, inbox in zip(bufs, inboxes, strict=True):
            for work in _exchange(buf, inbox, peer):
                work.wait()

    def concurrent():
        works = [w for buf, inbox in zip(bufs, inboxes, strict=True) for w in _exchange(buf, inbox, peer)]
        for work in works:
            work.wait()

    sequential_s = _median(pg, sequential)
    for inbox in inboxes:
        inbox.view(torch.uint8).fill_(SENTINEL)  # what lands from here on is the concurrent exchanges'
    stamps = Stamps(sends=bufs, receives=inboxes)
    benchmark(concurrent, nbytes=4 * nbytes, collective="p2p", stamps=stamps)
    _note_ratio(benchmark, "sequential_median_s", sequential_s, "concurrent_over_sequential")
    for i, inbox in enumerate(inboxes):
        what = f"exchange {i + 1} of 2 in flight on rank {pg.rank}"
        assert_copied(inbox, stamps.as_landed(pattern(nbytes, 2 * peer + i).view(torch.float32)), what)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("transfer", ["copy", "send"])
def test_matmul_with_transfer(pg, benchmark, transfer, nbytes):
    """comm/compute: a matmul's time while a transfer is in flight, against the matmul alone."""
    a = torch.randn(MATMUL_N, MATMUL_N, device=pg.device)
    peer = 1 - pg.rank
    buf = pattern(nbytes, pg.rank, pg.device).view(torch.float32)
    # copy-based on GPU: straight into the peer's device memory (tensor.to), on a stream of its own
    on_gpu = pg.device.type == "cuda"
    target = torch.device("cuda", peer) if on_gpu and transfer == "copy" else pg.device
    inbox = sentinel(nbytes, target).view(torch.float32)
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
    # a copy into the peer's GPU is read there: its stamps are the peer's, checked by the final bytes alone
    stamps = Stamps(sends=[buf], receives=[inbox] * (inbox.device == pg.device))
    benchmark(overlapped, nbytes=nbytes, collective="p2p", stamps=stamps)
    _note_ratio(benchmark, "alone_median_s", alone_s, "slowdown")
    sender = peer if transfer == "send" else pg.rank
    sent = stamps.as_landed(pattern(nbytes, sender).view(torch.float32))
    assert_copied(inbox, sent, f"{transfer} overlapped with a matmul on rank {pg.rank}")


@pytest.mark.world_size()
@pytest.mark.parametrize(
    "schedule",
    [
        # the ring sends each chunk itself; the sequential schedule calls the backend's reduce_scatter
        pytest.param("pipelined", marks=pytest.mark.needs("send_recv"), id="pipelined"),
        pytest.param("sequential", marks=pytest.mark.needs("reduce_scatter_single"), id="sequential"),
    ],
)
def test_gemm_reduce_scatter(pg, benchmark, schedule):
    """GEMM + reduce-scatter (seed 003): the ring that overlaps each chunk's matmul with the previous
    chunk's transfer, against a matmul followed by the reduce-scatter."""
    n = pg.world_size
    m, k, cols = 64 * n, 128, 128
    # every rank's factors, from its own generator: each rank rebuilds the sum to check its block
    factors = [
        (torch.randn(m, k, generator=pg.generator(r)), torch.randn(k, cols, generator=pg.generator(r)))
        for r in range(n)
    ]
    a, b = (x.to(pg.device) for x in factors[pg.rank])
    fn = gemm_reduce_scatter if schedule == "pipelined" else gemm_reduce_scatter_sequential
    benchmark.extra_info.update(schedule=schedule, m=m, k=k, n=cols)
    block = benchmark(fn, a, b, nbytes=m * cols * 4, collective="reduce_scatter")
    whole = sum(x.double() @ y.double() for x, y in factors)
    mine = whole[pg.rank * (m // n) : (pg.rank + 1) * (m // n)]
    # float32 products summed in another order: a wrong block is off by whole values, not by rounding
    torch.testing.assert_close(block.cpu().double(), mine, rtol=1e-4, atol=1e-3)
