"""The properties an implementation of an operation must have, one function each, called on every rank by
a test body with the drawn case: the suites' tests and a user's own test call the same ones.

Each takes the implementation in its registry contract (pytest_collectives.algorithms.registry.CONTRACTS),
builds every member's input from the test's shared seed, runs it on the drawn subgroup and checks this
rank's result against the exact reference, raising AssertionError with what differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pytest_collectives.algorithms.reference import (
    assert_gemm_sum_close,
    assert_reduced_close,
    rank_input,
    reduce_op,
)
from pytest_collectives.conformance.cases import Case, group_of, laid_out, sentinel


def name_of(implementation: Callable[..., Any]) -> str:
    """A registered algorithm's name (with its parameters), or a function's."""
    return getattr(implementation, "name", None) or getattr(implementation, "__name__", repr(implementation))


def run_all_reduce(
    pg: Any, all_reduce: Callable[..., torch.Tensor], case: Case
) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
    """``all_reduce(tensor, op, group=)`` on the drawn case, in the drawn layout: (this rank's result,
    every member's input), or None on a rank outside the drawn subgroup."""
    group, ranks = group_of(pg, case.members)
    if group is None:
        return None
    inputs = [rank_input(pg.seed, r, case.size, case.dtype) for r in ranks]
    tensor = laid_out(inputs[ranks.index(pg.rank)], case.layout, pg.device)
    result = all_reduce(tensor, reduce_op(case.op), group=group)
    assert result is tensor, f"{name_of(all_reduce)} must work in place and return its tensor"
    return result, inputs


def all_reduce_matches_reference(pg: Any, all_reduce: Callable[..., torch.Tensor], case: Case) -> None:
    """In place, every element the reduction of the members' inputs: exact, or within the stated bound."""
    out = run_all_reduce(pg, all_reduce, case)
    if out is not None:
        assert_reduced_close(*out, case.op)


def reduce_scatter_matches_reference(
    pg: Any, reduce_scatter: Callable[..., torch.Tensor], case: Case, in_place: bool
) -> None:
    """``reduce_scatter(output, input, op, group=)``: this rank's output is its block of the reduction of
    the members' inputs (``case.size`` elements a block). In place, the output is this rank's own block of
    the input, which NCCL and gloo both allow; out of place it starts as a sentinel."""
    group, ranks = group_of(pg, case.members)
    if group is None:
        return
    n, me, chunk = len(ranks), ranks.index(pg.rank), case.size
    inputs = [rank_input(pg.seed, r, n * chunk, case.dtype) for r in ranks]
    source = inputs[me].to(pg.device, copy=True)
    output = source.view(n, -1)[me] if in_place else sentinel(chunk, case.dtype, pg.device)
    result = reduce_scatter(output, source, reduce_op(case.op), group=group)
    assert result is output, f"{name_of(reduce_scatter)} must return its output"
    assert_reduced_close(output, [x.view(n, -1)[me] for x in inputs], case.op)


def gemm_reduce_scatter_matches_reference(
    pg: Any,
    gemm_reduce_scatter: Callable[..., torch.Tensor],
    case: Case,
    rows_per_rank: int,
    inner: int,
    cols: int,
) -> None:
    """``gemm_reduce_scatter(a, b, group=)`` over the world is this rank's row block of sum_r A_r @ B_r,
    each rank with its own inner dimension (``inner + rank``)."""
    n, me, dtype = pg.world_size, pg.rank, case.dtype
    m = rows_per_rank * n
    a = [rank_input(pg.seed, r, (m, inner + r), dtype) for r in range(n)]
    b = [rank_input(pg.seed + 1, r, (inner + r, cols), dtype) for r in range(n)]
    mine_a, mine_b = a[me].to(pg.device, copy=True), b[me].to(pg.device, copy=True)
    result = gemm_reduce_scatter(mine_a, mine_b, group=pg.group)
    rows = slice(me * rows_per_rank, (me + 1) * rows_per_rank)
    assert_gemm_sum_close(result, [x[rows] for x in a], b)
