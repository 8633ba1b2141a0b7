"""Reduce-scatter in all its forms agrees with the exact reference: the backend's (in and out of place),
the ring with S steps (S a multiple of the group size), and GEMM + ring reduce-scatter pipelined."""

from __future__ import annotations

import pytest
import torch
from cases import EDGE_SIZES, FLOATS, assert_moved, group_of, movements, reductions, sentinel
from hypothesis import given
from hypothesis import strategies as st

from pytest_collectives.algorithms import collectives as alg
from pytest_collectives.algorithms.reference import (
    assert_gemm_sum_close,
    assert_reduced_close,
    rank_input,
    reduce_op,
)
from pytest_collectives.conformance.capabilities import active

CHUNKS = st.one_of(st.sampled_from(EDGE_SIZES), st.integers(0, 3000))


def blocks_of(inputs: list[torch.Tensor], n: int, me: int) -> list[torch.Tensor]:
    """Every rank's contribution to block ``me`` of the reduce-scatter."""
    return [x.view(n, -1)[me] for x in inputs]


@pytest.mark.world_size()
@pytest.mark.needs("reduce_scatter_single")
@given(case=reductions(["reduce_scatter_single"], sizes=CHUNKS), in_place=st.booleans())
def test_backend_reduce_scatter(pg, case, in_place):
    """In place: the output is this rank's own slice of the input, which NCCL and gloo both allow."""
    group, ranks = group_of(pg, case.members)
    if group is None:
        return
    n, me, chunk = len(ranks), ranks.index(pg.rank), case.size
    inputs = [rank_input(pg.seed, r, n * chunk, case.dtype) for r in ranks]
    source = inputs[me].to(pg.device, copy=True)
    output = source.view(n, -1)[me] if in_place else sentinel(chunk, case.dtype, pg.device)
    alg.reduce_scatter_single(output, source, op=reduce_op(case.op), group=group)
    assert_reduced_close(output, blocks_of(inputs, n, me), case.op)


@pytest.mark.world_size()
@pytest.mark.needs("all_gather_single")
@given(case=movements(["all_gather_single"], sizes=CHUNKS), in_place=st.booleans())
def test_backend_all_gather(pg, case, in_place):
    check_all_gather_single(pg, case, in_place, stacked=False)


@pytest.mark.world_size()
@pytest.mark.needs("all_gather_single_stacked")
@given(case=movements(["all_gather_single_stacked"], sizes=CHUNKS), in_place=st.booleans())
def test_backend_all_gather_into_a_stacked_output(pg, case, in_place):
    """The output may also stack the ranks' inputs, (n, chunk), as DTensor asks for."""
    check_all_gather_single(pg, case, in_place, stacked=True)


def check_all_gather_single(pg, case, in_place: bool, stacked: bool) -> None:
    group, ranks = group_of(pg, case.members)
    if group is None:
        return
    n, me, chunk = len(ranks), ranks.index(pg.rank), case.size
    inputs = [rank_input(pg.seed, r, chunk, case.dtype) for r in ranks]
    output = sentinel((n, chunk) if stacked else n * chunk, case.dtype, pg.device)
    mine = output.view(n, -1)[me] if in_place else torch.empty(chunk, dtype=case.dtype, device=pg.device)
    mine.copy_(inputs[me])
    alg.all_gather_single(output, mine, group=group)
    expected = torch.stack(inputs) if stacked else torch.cat(inputs)
    assert_moved(output, expected, f"all_gather_single of {n} x {chunk} {case.dtype}, stacked={stacked}")


@pytest.mark.world_size()
@pytest.mark.needs("ring_reduce_scatter")
@given(
    case=reductions(["ring_reduce_scatter"], dtypes=FLOATS + [torch.int32, torch.int64], ops=["sum"]),
    chunk=CHUNKS,
    steps_per_rank=st.integers(1, 5),
)
def test_ring_reduce_scatter(pg, case, chunk, steps_per_rank):
    """Any S = k n, including sub-chunks smaller than one element per step (chunk < k)."""
    group, ranks = group_of(pg, case.members)
    if group is None:
        return
    n, me = len(ranks), ranks.index(pg.rank)
    inputs = [rank_input(pg.seed, r, n * chunk, case.dtype) for r in ranks]
    output = torch.empty(chunk, dtype=case.dtype, device=pg.device)
    result = alg.ring_reduce_scatter(
        output, inputs[me].to(pg.device, copy=True), group=group, steps=steps_per_rank * n
    )
    assert result is output
    assert_reduced_close(output, blocks_of(inputs, n, me), "sum")


@pytest.mark.world_size()
def test_ring_reduce_scatter_rejects_bad_steps(pg):
    n = pg.world_size
    if n > 1:  # every step count is a multiple of one rank
        with pytest.raises(ValueError, match="multiple of the group size"):
            alg.ring_reduce_scatter(torch.empty(1), torch.empty(n), steps=n + 1)
    with pytest.raises(ValueError, match="expected"):
        alg.ring_reduce_scatter(torch.empty(2), torch.empty(n))


@pytest.mark.world_size()
@given(
    dtype=st.sampled_from([torch.float32, torch.float64]),
    rows_per_rank=st.integers(1, 9),
    inner=st.integers(1, 24),
    cols=st.integers(1, 24),
    steps_per_rank=st.integers(1, 3),
    # the sequential baseline uses the backend's own reduce-scatter: drawn only where it is supported
    pipelined=st.booleans().filter(
        lambda p: p or active().supports("reduce_scatter_single", "float32", "sum")
    ),
)
def test_gemm_reduce_scatter(pg, dtype, rows_per_rank, inner, cols, steps_per_rank, pipelined):
    """Pipelined or not, the result is this rank's row block of sum_r A_r @ B_r (matmul + reduce-scatter)."""
    n, me = pg.world_size, pg.rank
    m = rows_per_rank * n
    # each rank's own K_r: ranks may hold different inner dimensions
    a = [rank_input(pg.seed, r, (m, inner + r), dtype) for r in range(n)]
    b = [rank_input(pg.seed + 1, r, (inner + r, cols), dtype) for r in range(n)]
    mine_a, mine_b = a[me].to(pg.device, copy=True), b[me].to(pg.device, copy=True)
    if pipelined:
        result = alg.gemm_reduce_scatter(mine_a, mine_b, steps=steps_per_rank * n)
    else:
        result = alg.gemm_reduce_scatter_sequential(mine_a, mine_b)
    rows = slice(me * rows_per_rank, (me + 1) * rows_per_rank)
    assert_gemm_sum_close(result, [x[rows] for x in a], b)
