"""The backend's other operations against exact references, each checked on every rank of the group.

Inputs are distinct per rank and element (rank_input), outputs start as a sentinel no input holds (NaN,
or 0 for integers), so an element the backend never wrote is counted apart from a wrong one. Inputs come
contiguous, strided or at a storage offset. Each rank checks what it received, and the plugin reports any
rank's failure: nothing is judged on rank 0 alone.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from cases import DENSE, FLOATS, Calls, assert_moved, group_of, laid_out, movements, reductions, sentinel
from hypothesis import given
from hypothesis import strategies as st

from pytest_collectives.algorithms.reference import assert_reduced_close, rank_input, reduce_op

# split sizes an all_to_all_single sends from rank i to rank j: drawn for 8 x 8 and folded onto the group
SPLITS = st.lists(st.lists(st.integers(0, 40), min_size=8, max_size=8), min_size=8, max_size=8)


def _members(pg, case):
    group, ranks = group_of(pg, case.members)
    if group is None:
        return None
    return group, ranks, len(ranks), ranks.index(pg.rank)


@pytest.mark.world_size()
@pytest.mark.needs("reduce", reduces=True)
@given(case=reductions(["reduce"], layouts=DENSE))
def test_reduce(pg, case):
    """The root holds the reduction; other ranks' buffers are unspecified (torch documents only dst's)."""
    found = _members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    inputs = [rank_input(pg.seed, r, case.size, case.dtype) for r in ranks]
    tensor = laid_out(inputs[me], case.layout, pg.device)
    root = case.root % n
    dist.reduce(tensor, dst=ranks[root], op=reduce_op(case.op), group=group)
    if me == root:
        assert_reduced_close(tensor, inputs, case.op)


@pytest.mark.world_size()
@pytest.mark.needs("broadcast")
@given(case=movements(["broadcast"]))
def test_broadcast(pg, case):
    found = _members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    root = case.root % n
    sent = rank_input(pg.seed, ranks[root], case.size, case.dtype)
    tensor = laid_out(sent if me == root else sentinel(case.size, case.dtype, "cpu"), case.layout, pg.device)
    dist.broadcast(tensor, src=ranks[root], group=group)
    assert_moved(tensor, sent, f"broadcast from group rank {root} seen on group rank {me}")


@pytest.mark.world_size()
@pytest.mark.needs("all_gather")
@given(case=movements(["all_gather"]))
def test_all_gather_list(pg, case):
    found = _members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    inputs = [rank_input(pg.seed, r, case.size, case.dtype) for r in ranks]
    outputs = [sentinel(case.size, case.dtype, pg.device) for _ in range(n)]
    dist.all_gather(outputs, laid_out(inputs[me], case.layout, pg.device), group=group)
    for i, (out, want) in enumerate(zip(outputs, inputs, strict=True)):
        assert_moved(out, want, f"all_gather: group rank {i}'s part on group rank {me}")


@pytest.mark.world_size()
@pytest.mark.needs("reduce_scatter", reduces=True)
@given(case=reductions(["reduce_scatter"], sizes=st.integers(0, 2000), layouts=DENSE))
def test_reduce_scatter_list(pg, case):
    found = _members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    inputs = [[rank_input(pg.seed, r * 64 + j, case.size, case.dtype) for j in range(n)] for r in ranks]
    output = sentinel(case.size, case.dtype, pg.device)
    mine = [laid_out(x, case.layout, pg.device) for x in inputs[me]]
    dist.reduce_scatter(output, mine, op=reduce_op(case.op), group=group)
    assert_reduced_close(output, [inputs[i][me] for i in range(n)], case.op)


@pytest.mark.world_size()
@pytest.mark.needs("all_to_all_single")
@given(case=movements(["all_to_all_single"], members=st.none()), splits=SPLITS, even=st.booleans())
def test_all_to_all_single(pg, case, splits, even):
    """Even splits (none given) or any split matrix, zeros included: rank i sends splits[i][j] to j."""
    n, me = pg.world_size, pg.rank
    sizes = [[case.size % 41] * n for _ in range(n)] if even else [row[:n] for row in splits[:n]]
    chunks = [[rank_input(pg.seed, i * 64 + j, sizes[i][j], case.dtype) for j in range(n)] for i in range(n)]
    source = laid_out(torch.cat(chunks[me]), case.layout, pg.device)
    received = [chunks[i][me] for i in range(n)]
    output = sentinel(sum(x.numel() for x in received), case.dtype, pg.device)
    if even:
        dist.all_to_all_single(output, source)
    else:
        column = [sizes[i][me] for i in range(n)]
        dist.all_to_all_single(output, source, output_split_sizes=column, input_split_sizes=sizes[me])
    assert_moved(output, torch.cat(received), f"all_to_all_single on rank {me}, splits {sizes}")


@pytest.mark.world_size()
@pytest.mark.needs("all_to_all")
@given(case=movements(["all_to_all"], members=st.none()))
def test_all_to_all_list(pg, case):
    n, me = pg.world_size, pg.rank
    sizes = [[case.size % 41] * n for _ in range(n)]
    chunks = [[rank_input(pg.seed, i * 64 + j, sizes[i][j], case.dtype) for j in range(n)] for i in range(n)]
    outputs = [sentinel(sizes[i][me], case.dtype, pg.device) for i in range(n)]
    dist.all_to_all(outputs, [laid_out(x, case.layout, pg.device) for x in chunks[me]])
    for i in range(n):
        assert_moved(outputs[i], chunks[i][me], f"all_to_all: from rank {i} on rank {me}")


@pytest.mark.world_size()
@pytest.mark.needs("gather")
@given(case=movements(["gather"]))
def test_gather(pg, case):
    """The root's list holds every member's input in group-rank order (a permutation is caught)."""
    found = _members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    root = case.root % n
    inputs = [rank_input(pg.seed, r, case.size, case.dtype) for r in ranks]
    outputs = [sentinel(case.size, case.dtype, pg.device) for _ in range(n)] if me == root else None
    dist.gather(laid_out(inputs[me], case.layout, pg.device), outputs, dst=ranks[root], group=group)
    for i, out in enumerate(outputs or []):
        assert_moved(out, inputs[i], f"gather at group rank {root}: group rank {i}'s part")


@pytest.mark.world_size()
@pytest.mark.needs("scatter")
@given(case=movements(["scatter"]))
def test_scatter(pg, case):
    found = _members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    root = case.root % n
    parts = [rank_input(pg.seed, ranks[root] * 64 + i, case.size, case.dtype) for i in range(n)]
    sources = [laid_out(p, case.layout, pg.device) for p in parts] if me == root else None
    output = sentinel(case.size, case.dtype, pg.device)
    dist.scatter(output, sources, src=ranks[root], group=group)
    assert_moved(output, parts[me], f"scatter from group rank {root} on group rank {me}")


@pytest.mark.world_size()
@pytest.mark.needs("all_gather_object", "broadcast_object_list")
@given(
    calls=st.just(Calls(("all_gather_object", "broadcast_object_list"))),
    payload=st.recursive(st.none() | st.integers() | st.text(max_size=20), st.lists, max_leaves=8),
)
def test_object_collectives(pg, calls, payload):
    """Objects of every rank arrive whole and in rank order; the root's list replaces every other one."""
    n, me = pg.world_size, pg.rank
    mine = [me, payload]
    gathered = [None] * n
    dist.all_gather_object(gathered, mine)
    assert gathered == [[r, payload] for r in range(n)]
    objects = [mine, f"from {me}"]
    dist.broadcast_object_list(objects, src=n - 1)
    assert objects == [[n - 1, payload], f"from {n - 1}"]


@pytest.mark.world_size()
@pytest.mark.needs("barrier")
@pytest.mark.parametrize("calls", [Calls(("barrier",))], ids=["barrier"])
def test_barrier_orders_the_ranks(pg, calls):
    """No rank leaves a barrier before every rank entered it: each writes its mark before the barrier
    into a shared file, and each finds every mark after it."""
    import os
    import tempfile

    if pg.node_of(pg.world_size - 1) != pg.node_of(0):
        pytest.skip("the ranks share no file system across nodes")
    path = os.path.join(tempfile.gettempdir(), f"collectives-barrier-{pg.seed}")
    with open(f"{path}.{pg.rank}", "w") as mark:
        mark.write("in")
    dist.barrier()
    missing = [r for r in range(pg.world_size) if not os.path.exists(f"{path}.{r}")]
    dist.barrier()
    os.unlink(f"{path}.{pg.rank}")
    assert not missing, f"rank {pg.rank} left the barrier before ranks {missing} entered it"


@pytest.mark.world_size()
@pytest.mark.needs("all_reduce", reduces=True)
@given(
    case=reductions(["all_reduce"], dtypes=FLOATS + [torch.int32], members=st.none()), count=st.integers(1, 4)
)
def test_coalesced_all_reduce_equals_uncoalesced(pg, case, count):
    """Inside _coalescing_manager, several all_reduces give what each gives alone (pytorch issue 104168)."""
    c10d = dist.distributed_c10d
    if not hasattr(c10d, "_coalescing_manager"):
        pytest.skip("this torch has no _coalescing_manager")
    n, me = pg.world_size, pg.rank
    inputs = [
        [rank_input(pg.seed, r * 64 + j, case.size + j, case.dtype) for r in range(n)] for j in range(count)
    ]
    tensors = [x[me].to(pg.device, copy=True) for x in inputs]
    try:
        with c10d._coalescing_manager(async_ops=True) as manager:
            for t in tensors:
                dist.all_reduce(t, op=reduce_op(case.op))
        manager.wait()
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"N/A: {pg.backend} does not coalesce all_reduce: {str(exc).splitlines()[0][:120]}")
    for t, x in zip(tensors, inputs, strict=True):
        assert_reduced_close(t, x, case.op)
