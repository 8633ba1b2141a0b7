"""Every all-reduce agrees with the exact reference, and the three decompositions agree with each other.

The five algorithms (pytest_collectives.algorithms.collectives): the backend's all_reduce; reduce then
broadcast; reduce_scatter then all_gather; the bandwidth-optimal ring; the tutorial's full-buffer ring.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from cases import FLOATS, Reduction, group_of, laid_out, reductions
from hypothesis import given
from hypothesis import strategies as st

from pytest_collectives.algorithms import collectives as alg
from pytest_collectives.algorithms.reference import OPS, assert_reduced_close, rank_input

ALGORITHMS = {
    "all_reduce": alg.all_reduce_direct,
    "reduce_broadcast": alg.all_reduce_reduce_broadcast,
    "reduce_scatter_all_gather": alg.all_reduce_reduce_scatter_all_gather,
    "ring": alg.ring_all_reduce,
    "naive_ring": alg.naive_ring_all_reduce,
}
DECOMPOSITIONS = ["all_reduce", "reduce_broadcast", "reduce_scatter_all_gather"]


def supports_avg(pg) -> bool:
    """Whether this backend implements ReduceOp.AVG; every rank asks at the same point, so all agree."""
    try:
        dist.all_reduce(torch.ones(1, device=pg.device), op=dist.ReduceOp.AVG)
    except (RuntimeError, ValueError):
        return False
    return True


def run(pg, algorithm: str, case: Reduction) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
    """Run one algorithm on the drawn case: (this rank's result, every member's input), or None off-group."""
    group, ranks = group_of(pg, case.members)
    if group is None:
        return None
    inputs = [rank_input(pg.seed, r, case.size, case.dtype) for r in ranks]
    tensor = laid_out(inputs[ranks.index(pg.rank)], case.strided, pg.device)
    kwargs = {"root": case.root % len(ranks)} if algorithm == "reduce_broadcast" else {}
    result = ALGORITHMS[algorithm](tensor, OPS[case.op], group=group, **kwargs)
    assert result is tensor, "the all-reduce must work in place and return its tensor"
    return result, inputs


@pytest.mark.world_size()
@given(algorithm=st.sampled_from(list(ALGORITHMS)), case=reductions())
def test_all_reduce_matches_exact_reference(pg, algorithm, case):
    if case.op == "avg" and not supports_avg(pg):
        return  # test_avg_support reports the gap as a skip
    out = run(pg, algorithm, case)
    if out is not None:
        result, inputs = out
        assert_reduced_close(result, inputs, case.op)


@pytest.mark.world_size()
@given(case=reductions())
def test_decompositions_agree_with_each_other(pg, case):
    """Exact dtypes and ops must agree bit for bit; rounding may differ only within the reference bound."""
    if case.op == "avg" and not supports_avg(pg):
        return
    results = [run(pg, name, case) for name in DECOMPOSITIONS]
    if results[0] is None:
        return
    exact = not case.dtype.is_floating_point or case.op in ("min", "max")
    first = results[0][0].cpu()
    for name, (result, inputs) in zip(DECOMPOSITIONS[1:], results[1:], strict=True):
        if exact:
            assert torch.equal(result.cpu(), first), f"{name} disagrees with all_reduce"
        else:
            assert_reduced_close(result, inputs, case.op)


@pytest.mark.world_size()
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_avg_support(pg, dtype):
    if not supports_avg(pg):
        pytest.skip(f"the {pg.backend} backend does not implement ReduceOp.AVG")
    inputs = [rank_input(pg.seed, r, 37, dtype) for r in range(pg.world_size)]
    tensor = inputs[pg.rank].to(pg.device, copy=True)
    dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
    assert_reduced_close(tensor, inputs, "avg")


@pytest.mark.world_size()
@given(case=reductions(dtypes=FLOATS + [torch.int32]), op_name=st.sampled_from(["all_reduce", "broadcast"]))
def test_async_op_with_wait(pg, case, op_name):
    """async_op=True returns a Work whose wait() leaves the same result the blocking call gives."""
    inputs = [rank_input(pg.seed, r, case.size, case.dtype) for r in range(pg.world_size)]
    tensor = inputs[pg.rank].to(pg.device, copy=True)
    if op_name == "all_reduce":
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True).wait()
        assert_reduced_close(tensor, inputs, "sum")
    else:
        root = case.root % pg.world_size
        dist.broadcast(tensor, src=root, async_op=True).wait()
        assert torch.equal(tensor.cpu(), inputs[root])


@pytest.mark.world_size(2)
@pytest.mark.backend_bug(
    "gloo", reason="all_reduce on a non-contiguous tensor silently reduces the wrong elements (torch 2.13)"
)
def test_backend_all_reduce_on_a_strided_view(pg):
    """The backend's own all_reduce must reduce a strided view's elements or refuse the view."""
    inputs = [rank_input(pg.seed, r, 64, torch.float32) for r in range(pg.world_size)]
    view = laid_out(inputs[pg.rank], strided=True, device=pg.device)
    try:
        dist.all_reduce(view)
    except (RuntimeError, ValueError):
        return  # refusing a layout it can't handle is correct
    assert_reduced_close(view, inputs, "sum")
