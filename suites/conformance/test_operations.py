"""The backend's other operations against exact references, each checked on every rank of the group; for
reduce, broadcast and all-to-all, every registered implementation of them (the backend's call among them).

Inputs are distinct per rank and element (rank_input), outputs start as a sentinel no input holds (NaN,
or 0 for integers), so an element the backend never wrote is counted apart from a wrong one. Inputs come
contiguous, strided, at a storage offset or channels_last. Each rank checks what it received, and the
plugin reports any rank's failure: nothing is judged on rank 0 alone.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist
from hypothesis import strategies as st

from pytest_collectives import (
    DENSE,
    FLOATS,
    MAX_RANKS,
    NO_OP,
    REDUCE_OPS,
    Calls,
    FailingCall,
    algorithm_named,
    all_gather_list_matches_reference,
    all_to_all_matches_reference,
    assert_moved,
    assert_reduced_close,
    assert_unchanged,
    backend_modules,
    broadcast_matches_reference,
    cases,
    every_cell,
    examples,
    gather_matches_reference,
    group_call_script,
    laid_out,
    movements,
    of_the_algorithm,
    reduce_matches_reference,
    reduce_op,
    reduce_scatter_list_matches_reference,
    reductions,
    refusal,
    refused_example,
    registered,
    scatter_matches_reference,
    sentinel,
    subgroup_members,
    sweep,
    write_reproduction,
)

pytestmark = pytest.mark.conformance  # drawn from the probe of the live group

# split sizes an all_to_all_single sends from rank i to rank j: drawn for 8 x 8 and folded onto the group
SPLITS = st.lists(st.lists(st.integers(0, 40), min_size=8, max_size=8), min_size=8, max_size=8)


@pytest.mark.world_size()
@pytest.mark.parametrize("algorithm", registered("reduce"))
@examples(case=of_the_algorithm(reductions, layouts=DENSE))
def test_reduce(pg, algorithm, case):
    """The backend's reduce and every registered one: the root holds the reduction."""
    reduce_matches_reference(pg, algorithm_named(algorithm), case)


@pytest.mark.world_size()
@pytest.mark.parametrize("algorithm", registered("broadcast"))
@examples(case=of_the_algorithm(movements))
def test_broadcast(pg, algorithm, case):
    broadcast_matches_reference(pg, algorithm_named(algorithm), case)


@pytest.mark.world_size()
@pytest.mark.needs("all_gather")
@examples(case=movements(["all_gather"]))
def test_all_gather_list(pg, case):
    all_gather_list_matches_reference(pg, dist.all_gather, case)


@pytest.mark.world_size()
@pytest.mark.needs("all_gather_uneven")
@examples(
    case=movements(["all_gather_uneven"], sizes=st.integers(0, 2000)),
    extra=st.lists(st.integers(0, 9), min_size=MAX_RANKS, max_size=MAX_RANKS),
)
def test_all_gather_list_uneven(pg, case, extra):
    """The list all_gather with a size per rank (torch: "uneven sized tensors are supported"): group rank
    i contributes case.size + extra[i] elements."""
    found = subgroup_members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    sizes = [case.size + extra[i] for i in range(n)]
    inputs = [case.input(pg.seed, r, sizes[i], n) for i, r in enumerate(ranks)]
    outputs = [sentinel(size, case.dtype, pg.device) for size in sizes]
    mine = laid_out(inputs[me], case.layout, pg.device)
    dist.all_gather(outputs, mine, group=group)
    for i, (out, want) in enumerate(zip(outputs, inputs, strict=True)):
        assert_moved(out, want, f"all_gather of sizes {sizes}: group rank {i}'s part on group rank {me}")
    assert_unchanged(mine, inputs[me], f"all_gather of sizes {sizes}: its input on group rank {me}")


@pytest.mark.world_size()
@pytest.mark.needs("reduce_scatter")
@examples(case=reductions(["reduce_scatter"], sizes=st.integers(0, 2000), layouts=DENSE))
def test_reduce_scatter_list(pg, case):
    reduce_scatter_list_matches_reference(pg, dist.reduce_scatter, case)


@pytest.mark.world_size()
@pytest.mark.needs("reduce_scatter")
@sweep(case=every_cell("reduce_scatter"))
def test_reduce_scatter_list_every_cell(pg, case):
    """Every supported cell, every run (as test_every_cell.py does for the registry's contracts)."""
    reduce_scatter_list_matches_reference(pg, dist.reduce_scatter, case)


@pytest.mark.world_size()
@pytest.mark.parametrize("algorithm", registered("all_to_all"))
@examples(case=of_the_algorithm(movements), splits=SPLITS, even=st.booleans())
def test_all_to_all_single(pg, algorithm, case, splits, even):
    """The backend's all_to_all_single and every registered all-to-all: even splits (none given) or any
    split matrix, zeros included: group rank i sends splits[i][j] to j."""
    all_to_all_matches_reference(pg, algorithm_named(algorithm), case, None if even else splits)


@pytest.mark.world_size()
@pytest.mark.needs("all_to_all")
@examples(case=movements(["all_to_all"], members=st.none()), splits=SPLITS, even=st.booleans())
def test_all_to_all_list(pg, case, splits, even):
    """The list form: rank i sends sizes[i][j] elements to rank j, the same number to every rank or parts
    of different sizes (torch documents them), so that an offset reckoned for even parts shows in uneven
    ones. Uneven, every rank's parts in and out differ in size (each size is (i + j) modulo n above a
    multiple of n), so a backend that takes only even parts (gloo, a known bug) raises on every rank
    alike, where one whose parts happened to be even would wait for the others forever."""
    n, me = pg.world_size, pg.rank
    if even:
        sizes = [[case.size % 41] * n for _ in range(n)]
    else:
        sizes = [[splits[i][j] * n + (i + j) % n for j in range(n)] for i in range(n)]
    outputs = [sentinel(sizes[i][me], case.dtype, pg.device) for i in range(n)]
    sent = [case.part(pg.seed, me, j, sizes[me][j], n) for j in range(n)]
    sources = [laid_out(x, case.layout, pg.device) for x in sent]
    try:
        dist.all_to_all(outputs, sources)
    except Exception as exc:
        if reason := refusal(exc, pg.backend):
            # a refusal is a refusal only where it left every tensor as it was
            for i in range(n):
                unwritten = sentinel(sizes[i][me], case.dtype, pg.device)
                assert_unchanged(outputs[i], unwritten, f"refused all_to_all: from rank {i} on rank {me}")
                assert_unchanged(sources[i], sent[i], f"refused all_to_all: what rank {me} sends rank {i}")
            refused_example(f"{pg.backend} refuses all_to_all of parts of sizes {sizes}: {reason}")
        exc.args = (f"{exc}\n{_all_to_all_reproduction(pg, case, sizes, exc)}", *exc.args[1:])
        raise
    try:
        for i in range(n):
            expected = case.part(pg.seed, i, me, sizes[i][me], n)
            assert_moved(outputs[i], expected, f"all_to_all: from rank {i} on rank {me}")
            assert_unchanged(sources[i], sent[i], f"all_to_all: what rank {me} sends rank {i}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_all_to_all_reproduction(pg, case, sizes, exc)}") from None


def _all_to_all_reproduction(pg, case, sizes: list[list[int]], failure: Exception) -> str:
    """The failing list all_to_all written as a file that needs only torch and the backend: the line
    naming it."""
    n = pg.world_size
    call = FailingCall(
        pg.backend, n, "all_to_all", case.layout, "contiguous", case.dtype, (-1,),
        given=lambda r, p: case.part(pg.seed, r, p, sizes[r][p], n),
        device=pg.device.type, modules=backend_modules(pg.backend),
    )  # fmt: skip
    found = f"{type(failure).__name__}: {str(failure).splitlines()[0]}"
    written_from = f"test_operations.py::test_all_to_all_list, parts of sizes {sizes}, {case.layout}"
    text = group_call_script(call, "", found, written_from)
    dtype = str(case.dtype).removeprefix("torch.")
    return write_reproduction(pg, f"{pg.backend}-all_to_all-list-{case.layout}-ws{n}-{dtype}", text)


# (N, C, H, W) with C > 1 and H * W > 1, so that channels_last and contiguous strides differ
SHAPES = st.tuples(st.integers(1, 3), st.integers(2, 6), st.integers(2, 4), st.integers(1, 4))


@pytest.mark.world_size()
@pytest.mark.needs("all_reduce", "broadcast", "all_gather")
@examples(
    case=cases(["all_reduce", "broadcast", "all_gather"], ops=(*REDUCE_OPS, NO_OP), members=st.none()),
    shape=SHAPES,
)
def test_channels_last_is_read_and_written_as_laid_out(pg, case, shape):
    """channels_last tensors (pytorch issue 163483): the values in logical order, the strides kept; a
    backend that reads or writes the storage as if it were contiguous permutes the elements."""
    n, me, (name,) = pg.world_size, pg.rank, case.operations
    inputs = [case.input(pg.seed, r, shape, n) for r in range(n)]

    def laid(x: torch.Tensor) -> torch.Tensor:
        return x.to(pg.device).contiguous(memory_format=torch.channels_last)

    mine = laid(inputs[me])
    strides, root = mine.stride(), case.root % n
    if name == "broadcast" and me != root:
        mine = laid(sentinel(shape, case.dtype, "cpu"))
    outputs = [laid(sentinel(shape, case.dtype, "cpu")) for _ in range(n)]
    try:
        if name == "all_reduce":
            dist.all_reduce(mine, op=reduce_op(case.op))
        elif name == "broadcast":
            dist.broadcast(mine, src=root)
        else:
            dist.all_gather(outputs, mine)
    except Exception as exc:
        if reason := refusal(exc, pg.backend):
            # refusing the layout in its own words is correct (NCCL: "Tensors must be contiguous"), and
            # checks nothing: the example is turned down, not a pass of its cell
            refused_example(f"{pg.backend} refuses channels_last {name}: {reason}")
        raise
    if name == "all_reduce":
        assert_reduced_close(mine, inputs, case.op, case.values)
    elif name == "broadcast":
        assert_moved(mine, inputs[root], f"channels_last broadcast from rank {root} on rank {me}")
    else:
        for i, out in enumerate(outputs):
            assert out.stride() == strides, f"all_gather: rank {i}'s part lost its channels_last strides"
            assert_moved(out, inputs[i], f"channels_last all_gather: rank {i}'s part on rank {me}")
    assert mine.stride() == strides, f"{name} changed the strides {strides} to {mine.stride()}"


@pytest.mark.world_size()
@pytest.mark.needs("gather")
@examples(case=movements(["gather"]))
def test_gather(pg, case):
    gather_matches_reference(pg, dist.gather, case)


@pytest.mark.world_size()
@pytest.mark.needs("scatter")
@examples(case=movements(["scatter"]))
def test_scatter(pg, case):
    scatter_matches_reference(pg, dist.scatter, case)


def blob(size: int, salt: int) -> bytes:
    """``size`` bytes that differ with ``salt``: a pickle that takes a backend's large-message path."""
    return random.Random(salt).randbytes(size)


# Small nested objects, and blobs from empty to several MiB: a pickle past a backend's small-message
# buffer (1 KiB, 64 KiB) takes another path, which small objects never reached.
BLOB_SIZES = (0, 1, 1023, 1025, 65535, 65537, (1 << 20) + 3, 5 << 20)
PAYLOADS = st.recursive(st.none() | st.integers() | st.text(max_size=20), st.lists, max_leaves=8) | st.builds(
    blob, st.sampled_from(BLOB_SIZES), st.integers(0, 1 << 16)
)


@pytest.mark.world_size()
@pytest.mark.needs("all_gather_object", "broadcast_object_list")
@examples(calls=st.just(Calls(("all_gather_object", "broadcast_object_list"))), payload=PAYLOADS)
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
@pytest.mark.needs("gather_object")
@examples(calls=st.just(Calls(("gather_object",))), payload=PAYLOADS, root=st.integers(0, 7))
def test_gather_object(pg, calls, payload, root):
    """The root's list holds every rank's object in rank order."""
    n, me, root = pg.world_size, pg.rank, root % pg.world_size
    gathered = [None] * n if me == root else None
    dist.gather_object([me, payload], gathered, dst=root)
    if me == root:
        assert gathered == [[r, payload] for r in range(n)]


@pytest.mark.world_size()
@pytest.mark.needs("scatter_object_list")
@examples(calls=st.just(Calls(("scatter_object_list",))), payload=PAYLOADS, root=st.integers(0, 7))
def test_scatter_object_list(pg, calls, payload, root):
    """Rank i receives the root's i-th object."""
    n, me, root = pg.world_size, pg.rank, root % pg.world_size
    received = [None]
    dist.scatter_object_list(received, [[i, payload] for i in range(n)] if me == root else None, src=root)
    assert received == [[me, payload]]


def _monitored_barrier() -> None:
    dist.monitored_barrier(wait_all_ranks=True)


BARRIERS = {"barrier": dist.barrier, "monitored_barrier": _monitored_barrier}
LATE_S = 0.2  # the last rank's lateness: far above the others' time from the barrier to their check


@pytest.mark.world_size()
@pytest.mark.parametrize(
    "calls", [pytest.param(Calls((name,)), marks=pytest.mark.needs(name), id=name) for name in BARRIERS]
)
def test_barrier_orders_the_ranks(pg, calls):
    """No rank leaves a barrier before every rank entered it: each writes its mark before the barrier
    into a shared file, and each finds every mark after it. The last rank comes late, so a barrier that
    does not wait fails every time, not only where the ranks happen to arrive apart."""
    import os
    import tempfile
    import time

    if pg.node_of(pg.world_size - 1) != pg.node_of(0):
        pytest.skip("the ranks share no file system across nodes")
    barrier = BARRIERS[calls.operations[0]]
    path = os.path.join(tempfile.gettempdir(), f"collectives-barrier-{pg.seed}")
    if pg.rank == pg.world_size - 1:
        time.sleep(LATE_S)
    with open(f"{path}.{pg.rank}", "w") as mark:
        mark.write("in")
    barrier()
    missing = [r for r in range(pg.world_size) if not os.path.exists(f"{path}.{r}")]
    barrier()
    os.unlink(f"{path}.{pg.rank}")
    assert not missing, f"rank {pg.rank} left the barrier before ranks {missing} entered it"


@pytest.mark.world_size()
@pytest.mark.needs("all_reduce")
@examples(
    case=reductions(["all_reduce"], dtypes=FLOATS + [torch.int32], members=st.none()), count=st.integers(1, 4)
)
def test_coalesced_all_reduce_equals_uncoalesced(pg, case, count):
    """Inside _coalescing_manager, several all_reduces give what each gives alone (pytorch issue 104168)."""
    c10d = dist.distributed_c10d
    if not hasattr(c10d, "_coalescing_manager"):
        pytest.skip("this torch has no _coalescing_manager")
    n, me = pg.world_size, pg.rank
    inputs = [[case.part(pg.seed, r, j, case.size + j, n) for r in range(n)] for j in range(count)]
    tensors = [x[me].to(pg.device, copy=True) for x in inputs]
    try:
        with c10d._coalescing_manager(async_ops=True) as manager:
            for t in tensors:
                dist.all_reduce(t, op=reduce_op(case.op))
        manager.wait()
    except Exception as exc:
        reason = refusal(exc, pg.backend)
        if not reason:
            raise  # only a refusal in the backend's own words is N/A, and of this example alone
        refused_example(f"{pg.backend} does not coalesce all_reduce: {reason}")
    for t, x in zip(tensors, inputs, strict=True):
        assert_reduced_close(t, x, case.op, case.values)
