"""Collectives over a size sweep: the backend's all-reduce against its decompositions and our rings.

Each benchmark reports algbw and busbw as nccl-tests defines them (see pytest_collectives.bench.timing), so
the figures of different algorithms and world sizes compare directly.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pytest_collectives.algorithms import collectives as alg

ALL_REDUCES = {
    "all_reduce": alg.all_reduce_direct,
    "reduce_broadcast": alg.all_reduce_reduce_broadcast,
    "reduce_scatter_all_gather": alg.all_reduce_reduce_scatter_all_gather,
    "ring": alg.ring_all_reduce,
    "naive_ring": alg.naive_ring_all_reduce,
}


@pytest.mark.world_size()
@pytest.mark.parametrize("algorithm", list(ALL_REDUCES))
def test_all_reduce(pg, benchmark, algorithm, nbytes):
    tensor = torch.ones(nbytes // 4, device=pg.device)
    benchmark.extra_info.update(dtype="float32", algorithm=algorithm)
    benchmark(ALL_REDUCES[algorithm], tensor, nbytes=nbytes, collective="all_reduce")


@pytest.mark.world_size()
@pytest.mark.parametrize("steps_per_rank", [1, 2, 4], ids=lambda k: f"S={k}n")
def test_ring_reduce_scatter(pg, benchmark, steps_per_rank, nbytes):
    """S = n is the classic ring; larger S sends S/n smaller chunks per step (seed 003)."""
    n = pg.world_size
    chunk = nbytes // 4 // n
    source = torch.ones(chunk * n, device=pg.device)
    output = torch.empty(chunk, device=pg.device)
    benchmark.extra_info.update(dtype="float32", steps=steps_per_rank * n)
    benchmark(
        alg.ring_reduce_scatter, output, source, steps=steps_per_rank * n, nbytes=chunk * n * 4,
        collective="reduce_scatter",
    )  # fmt: skip


@pytest.mark.world_size()
def test_backend_reduce_scatter(pg, benchmark, nbytes):
    n = pg.world_size
    chunk = nbytes // 4 // n
    source = torch.ones(chunk * n, device=pg.device)
    output = torch.empty(chunk, device=pg.device)
    try:
        dist.reduce_scatter_tensor(output, source)
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"{pg.backend} has no reduce_scatter_tensor: {str(exc).splitlines()[0]}")
    benchmark.extra_info.update(dtype="float32")
    benchmark(dist.reduce_scatter_tensor, output, source, nbytes=chunk * n * 4, collective="reduce_scatter")


@pytest.mark.world_size()
def test_all_gather(pg, benchmark, nbytes):
    n = pg.world_size
    chunk = nbytes // 4 // n
    output = torch.empty(chunk * n, device=pg.device)
    mine = torch.ones(chunk, device=pg.device)
    benchmark.extra_info.update(dtype="float32")
    benchmark(dist.all_gather_into_tensor, output, mine, nbytes=chunk * n * 4, collective="all_gather")


@pytest.mark.world_size()
def test_broadcast(pg, benchmark, nbytes):
    tensor = torch.ones(nbytes // 4, device=pg.device)
    benchmark.extra_info.update(dtype="float32")
    benchmark(dist.broadcast, tensor, 0, nbytes=nbytes, collective="broadcast")
