"""Reduce-scatter in all its forms agrees with the exact reference: every registered reduce-scatter (the
backend's, the ring with S steps, S a multiple of the group size, users'), in and out of place, the
backend's all-gather beside it, and every registered GEMM + reduce-scatter (the ring pipelined or not)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

from pytest_collectives import (
    EDGE_SIZES,
    algorithm_named,
    all_gather_matches_reference,
    examples,
    gemm_reduce_scatter_matches_reference,
    movements,
    of_the_algorithm,
    reduce_scatter_matches_reference,
    reductions,
    registered,
    ring_reduce_scatter,
)

pytestmark = pytest.mark.conformance  # drawn from the probe of the live group

CHUNKS = st.one_of(st.sampled_from(EDGE_SIZES), st.integers(0, 3000))


@pytest.mark.world_size()
@pytest.mark.parametrize("algorithm", registered("reduce_scatter"))
@examples(case=of_the_algorithm(reductions, sizes=CHUNKS), in_place=st.booleans())
def test_reduce_scatter_matches_exact_reference(pg, algorithm, case, in_place):
    """Every registered reduce-scatter (the backend's, the ring with S = k n steps, users'), in and out of
    place."""
    reduce_scatter_matches_reference(pg, algorithm_named(algorithm), case, in_place)


@pytest.mark.world_size()
@pytest.mark.parametrize("algorithm", registered("all_gather"))
@examples(case=of_the_algorithm(movements, sizes=CHUNKS), in_place=st.booleans())
def test_all_gather_matches_exact_reference(pg, algorithm, case, in_place):
    """The backend's all_gather_single and every registered all-gather, in and out of place."""
    all_gather_matches_reference(pg, algorithm_named(algorithm), case, in_place)


@pytest.mark.world_size()
@pytest.mark.needs("all_gather_single_stacked")
@examples(case=movements(["all_gather_single_stacked"], sizes=CHUNKS), in_place=st.booleans())
def test_backend_all_gather_into_a_stacked_output(pg, case, in_place):
    """The output may also stack the ranks' inputs, (n, chunk), as DTensor asks for."""
    backend = algorithm_named("all_gather_single")
    all_gather_matches_reference(pg, backend, case, in_place, stacked=True)


@pytest.mark.world_size()
def test_ring_reduce_scatter_rejects_bad_steps(pg):
    n = pg.world_size
    if n > 1:  # every step count is a multiple of one rank
        with pytest.raises(ValueError, match="multiple of the group size"):
            ring_reduce_scatter(torch.empty(1), torch.empty(n), steps=n + 1)
    with pytest.raises(ValueError, match="expected"):
        ring_reduce_scatter(torch.empty(2), torch.empty(n))


@pytest.mark.world_size()
@pytest.mark.parametrize("algorithm", registered("gemm_reduce_scatter"))
@examples(
    case=of_the_algorithm(reductions, dtypes=[torch.float32, torch.float64], ops=["sum"], members=st.none()),
    rows_per_rank=st.integers(1, 9),
    inner=st.integers(1, 24),
    cols=st.integers(1, 24),
)
def test_gemm_reduce_scatter(pg, algorithm, case, rows_per_rank, inner, cols):
    """Pipelined or not, the result is this rank's row block of sum_r A_r @ B_r (matmul + reduce-scatter)."""
    gemm_reduce_scatter_matches_reference(pg, algorithm_named(algorithm), case, rows_per_rank, inner, cols)
