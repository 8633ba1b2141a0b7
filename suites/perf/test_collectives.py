"""Collectives over a size sweep: the backend's all-reduce against its decompositions and our rings.

Each benchmark reports algbw and busbw as nccl-tests defines them (see pytest_collectives.bench.timing), so
the figures of different algorithms and world sizes compare directly.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pytest_collectives import (
    NO_OP,
    REDUCTIONS,
    Case,
    Stamps,
    Values,
    algorithm_named,
    all_gather_single,
    all_reduce_direct,
    all_reduce_reduce_broadcast,
    all_reduce_reduce_scatter_all_gather,
    matches_reference,
    naive_ring_all_reduce,
    reduce_scatter_single,
    registered,
    ring_all_reduce,
    ring_reduce_scatter,
)

ALL_REDUCES = {
    "all_reduce": all_reduce_direct,
    "reduce_broadcast": all_reduce_reduce_broadcast,
    "reduce_scatter_all_gather": all_reduce_reduce_scatter_all_gather,
    "ring": ring_all_reduce,
    "naive_ring": naive_ring_all_reduce,
}
# What each needs of the backend, as conformance declares it: N/A without it (a backend with no reduce has
# no reduce_broadcast to measure, and that is no failure).
NEEDS = {
    "all_reduce": ("all_reduce",),
    "reduce_broadcast": ("reduce", "broadcast"),
    "reduce_scatter_all_gather": ("reduce_scatter_single", "all_gather_single"),
    "ring": ("send_recv",),
    "naive_ring": ("send_recv",),
}


# Checked values per rank at most: the reference is built on the host from every rank's input.
CHECKED = 1 << 24


def check_once(pg, operation: str, implementation, size: int) -> None:  # noqa: ANN001
    """After the timed rounds, one check of the result against the contract's exact reference (nccl-tests'
    -c): a fast wrong backend fails its benchmark. Full-range values, so float32 sums compare bit for bit;
    at most CHECKED elements (a GPU's largest messages would take the host minutes to rebuild)."""
    op = "sum" if operation in REDUCTIONS else NO_OP  # the contracts that reduce share the backend ops' names
    case = Case((operation,), torch.float32, op, min(size, CHECKED), "contiguous", None, 0, Values("full"))
    matches_reference(pg, operation, implementation, case)


@pytest.mark.world_size()
@pytest.mark.parametrize(
    "algorithm",
    [pytest.param(a, marks=pytest.mark.needs(*NEEDS[a], together=True), id=a) for a in ALL_REDUCES],
)
def test_all_reduce(pg, benchmark, algorithm, nbytes):
    n, tensor = pg.world_size, torch.ones(nbytes // 4, device=pg.device)
    benchmark.extra_info.update(dtype="float32", algorithm=algorithm)
    stamps = Stamps.summed([tensor], [tensor], n)  # every timed call checked
    benchmark(ALL_REDUCES[algorithm], tensor, nbytes=nbytes, collective="all_reduce", stamps=stamps)
    check_once(pg, "all_reduce", ALL_REDUCES[algorithm], tensor.numel())


def chunks(whole: torch.Tensor, n: int) -> list[torch.Tensor]:
    """The n chunks of ``whole``: where each rank's part of a reduce_scatter or an all_gather lies, each
    stamped or read on its own (Stamps)."""
    chunk = whole.numel() // n
    return [whole[i * chunk : (i + 1) * chunk] for i in range(n)]


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
@pytest.mark.parametrize("steps_per_rank", [1, 2, 4], ids=lambda k: f"S={k}n")
def test_ring_reduce_scatter(pg, benchmark, steps_per_rank, nbytes):
    """S = n is the classic ring; larger S sends S/n smaller chunks per step (seed 003)."""
    n = pg.world_size
    chunk = nbytes // 4 // n
    source = torch.ones(chunk * n, device=pg.device)
    output = torch.empty(chunk, device=pg.device)
    benchmark.extra_info.update(dtype="float32", steps=steps_per_rank * n)
    benchmark(
        ring_reduce_scatter, output, source, steps=steps_per_rank * n, nbytes=chunk * n * 4,
        collective="reduce_scatter", stamps=Stamps.summed(chunks(source, n), [output], n),
    )  # fmt: skip

    def ring(output, input, op, group):  # noqa: ANN001, ANN202 - the reduce_scatter contract
        return ring_reduce_scatter(output, input, group=group, steps=steps_per_rank * n)

    check_once(pg, "reduce_scatter", ring, chunk)


@pytest.mark.world_size()
@pytest.mark.needs("reduce_scatter_single")
def test_backend_reduce_scatter(pg, benchmark, nbytes):
    n = pg.world_size
    chunk = nbytes // 4 // n
    source = torch.ones(chunk * n, device=pg.device)
    output = torch.empty(chunk, device=pg.device)
    benchmark.extra_info.update(dtype="float32")
    benchmark(
        reduce_scatter_single, output, source, nbytes=chunk * n * 4, collective="reduce_scatter",
        stamps=Stamps.summed(chunks(source, n), [output], n),
    )  # fmt: skip
    check_once(pg, "reduce_scatter", algorithm_named("reduce_scatter_single"), chunk)


@pytest.mark.world_size()
@pytest.mark.needs("all_gather_single")
def test_all_gather(pg, benchmark, nbytes):
    n = pg.world_size
    chunk = nbytes // 4 // n
    output = torch.empty(chunk * n, device=pg.device)
    mine = torch.ones(chunk, device=pg.device)
    benchmark.extra_info.update(dtype="float32")
    # each rank's part, stamped as its own, in its chunk on every rank
    stamps = Stamps.apart([mine], chunks(output, n), pg.rank)
    benchmark(all_gather_single, output, mine, nbytes=chunk * n * 4, collective="all_gather", stamps=stamps)
    check_once(pg, "all_gather", algorithm_named("all_gather_single"), chunk)


@pytest.mark.world_size()
@pytest.mark.needs("broadcast")
def test_broadcast(pg, benchmark, nbytes):
    tensor = torch.ones(nbytes // 4, device=pg.device)
    benchmark.extra_info.update(dtype="float32")
    stamps = Stamps(sends=[tensor] * (pg.rank == 0), receives=[tensor] * (pg.rank != 0))
    benchmark(dist.broadcast, tensor, 0, nbytes=nbytes, collective="broadcast", stamps=stamps)
    check_once(pg, "broadcast", algorithm_named("broadcast"), tensor.numel())


# nccl-tests' other operations. Inputs hold distinct values per rank and element, and after the timed
# rounds each benchmark checks its result once against what its inputs must give (nccl-tests' -c).


def rank_values(pg, rank: int, count: int, salt: int = 0) -> torch.Tensor:
    """Small whole numbers, distinct per rank and element, exact in float32 (sums of a few of them too)."""
    return (torch.arange(count, device=pg.device) % 251 + 1000 * rank + salt).float()


@pytest.mark.world_size()
@pytest.mark.needs("reduce")
def test_reduce(pg, benchmark, nbytes):
    n, count = pg.world_size, nbytes // 4
    tensor = rank_values(pg, pg.rank, count)
    benchmark.extra_info.update(dtype="float32")
    stamps = Stamps.summed([tensor], [tensor] * (pg.rank == 0), n)
    benchmark(dist.reduce, tensor, 0, nbytes=count * 4, collective="reduce", stamps=stamps)
    tensor = rank_values(pg, pg.rank, count)
    dist.reduce(tensor, 0)
    if pg.rank == 0:
        assert torch.equal(tensor, sum(rank_values(pg, r, count) for r in range(n)))


@pytest.mark.world_size()
@pytest.mark.needs("all_to_all_single")
@pytest.mark.parametrize("splits", ["even", "uneven"])
def test_all_to_all(pg, benchmark, nbytes, splits):
    """alltoall, and alltoallv with rank i sending j + 1 parts of n(n+1)/2 to rank j (same total bytes)."""
    n, me = pg.world_size, pg.rank
    count = nbytes // 4 // n * n
    if splits == "even":
        sizes = [[count // n] * n for _ in range(n)]
    else:
        unit = count // (n * (n + 1) // 2)
        sizes = [[unit * (j + 1) for j in range(n)] for _ in range(n)]
    source = rank_values(pg, me, sum(sizes[me]))
    output = torch.empty(sum(sizes[i][me] for i in range(n)), device=pg.device)
    column = [sizes[i][me] for i in range(n)]
    benchmark.extra_info.update(dtype="float32", splits=splits)
    stamps = Stamps.apart(source.split(sizes[me]), output.split(column), me)
    benchmark(
        dist.all_to_all_single, output, source, column, sizes[me], nbytes=source.numel() * 4,
        collective="all_to_all", stamps=stamps,
    )  # fmt: skip
    starts = [sum(sizes[i][:me]) for i in range(n)]
    want = stamps.all_landed(
        [rank_values(pg, i, sum(sizes[i]))[starts[i] : starts[i] + sizes[i][me]] for i in range(n)]
    )
    head = f"got {output[:4].tolist()}..., exact {want[:4].tolist()}..."
    assert torch.equal(output, want), f"all_to_all_single on rank {me}: {head}"


@pytest.mark.world_size()
@pytest.mark.parametrize(
    "operation", [pytest.param(o, marks=pytest.mark.needs(o), id=o) for o in ("gather", "scatter")]
)
def test_gather_scatter(pg, benchmark, nbytes, operation):
    """Bytes as nccl-tests counts them: the root's whole buffer, n parts."""
    n, me = pg.world_size, pg.rank
    count = nbytes // 4 // n
    parts = [torch.empty(count, device=pg.device) for _ in range(n)] if me == 0 else None
    mine = rank_values(pg, me, count)
    if operation == "scatter" and me == 0:
        parts = [rank_values(pg, r, count, salt=7) for r in range(n)]
    if operation == "gather":
        call = lambda: dist.gather(mine, parts, 0)  # noqa: E731
        stamps = Stamps.apart([mine], parts or (), me)
    else:
        call = lambda: dist.scatter(mine, parts, 0)  # noqa: E731
        stamps = Stamps(parts or (), [mine])
    benchmark.extra_info.update(dtype="float32")
    benchmark(call, nbytes=count * n * 4, collective=operation, stamps=stamps)
    if operation == "gather" and me == 0:
        assert all(torch.equal(parts[r], stamps.as_landed(rank_values(pg, r, count), r)) for r in range(n))
    if operation == "scatter":
        assert torch.equal(mine, stamps.as_landed(rank_values(pg, me, count, salt=7)))


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
def test_sendrecv(pg, benchmark, nbytes):
    """nccl-tests' sendrecv: every rank sends to the next and receives from the previous, at once."""
    n, me = pg.world_size, pg.rank
    if n == 1:
        pytest.skip("sendrecv needs two ranks: at one it is a send to itself, which not every backend takes")
    payload = rank_values(pg, me, nbytes // 4)
    inbox = torch.empty_like(payload)

    def shift() -> None:
        ops = [dist.P2POp(dist.isend, payload, (me + 1) % n), dist.P2POp(dist.irecv, inbox, (me - 1) % n)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    benchmark.extra_info.update(dtype="float32")
    stamps = Stamps([payload], [inbox])
    benchmark(shift, nbytes=payload.numel() * 4, collective="sendrecv", stamps=stamps)
    assert torch.equal(inbox, stamps.as_landed(rank_values(pg, (me - 1) % n, payload.numel())))


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
def test_hypercube(pg, benchmark, nbytes):
    """nccl-tests' hypercube: log2(n) steps, at step k each rank swaps all it holds with rank ^ 2**k, an
    all-gather by recursive doubling. Needs a power-of-two group."""
    n, me = pg.world_size, pg.rank
    if n == 1 or n & (n - 1):
        pytest.skip(f"hypercube needs a power-of-two group of two ranks or more, not {n}")
    count = nbytes // 4 // n
    blocks = torch.empty(n, count, device=pg.device)

    def exchange() -> None:
        for k in range(n.bit_length() - 1):
            peer, width = me ^ (1 << k), 1 << k
            mine, theirs = (me // width) * width, (peer // width) * width
            ops = [
                dist.P2POp(dist.isend, blocks[mine : mine + width], peer),
                dist.P2POp(dist.irecv, blocks[theirs : theirs + width], peer),
            ]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    blocks[me] = rank_values(pg, me, count)
    benchmark.extra_info.update(dtype="float32")
    stamps = Stamps.apart([blocks[me]], list(blocks), me)
    benchmark(exchange, nbytes=count * n * 4, collective="hypercube", stamps=stamps)
    assert all(torch.equal(blocks[r], stamps.as_landed(rank_values(pg, r, count), r)) for r in range(n))


# Every registered algorithm of these operations that the tests above do not already measure, under the ids
# the committed baselines know those by: the project's tree broadcast and reduce, ring all-gather and
# pairwise all-to-all, and a user's own (registered from a conftest or a package), beside the backend's op.
OPERATIONS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")
MEASURED_ABOVE = {
    "all_reduce",
    "reduce_broadcast(root=-1)",
    "reduce_scatter_all_gather",
    "ring_all_reduce",
    "naive_ring_all_reduce",
    "reduce_scatter_single",
    "ring_reduce_scatter(steps_per_rank=1)",
    "ring_reduce_scatter(steps_per_rank=3)",
    "all_gather_single",
    "all_to_all_single",
    "broadcast",
    "reduce",
}


@pytest.mark.world_size()
@pytest.mark.parametrize(
    "algorithm", [p for op in OPERATIONS for p in registered(op) if p.id not in MEASURED_ABOVE]
)
def test_registered_algorithm(pg, benchmark, algorithm, nbytes):
    """The bytes and busbw nccl-tests counts for the operation, so the figures sit beside the backend's own;
    then one check of the result against the contract's exact reference."""
    chosen = algorithm_named(algorithm)
    n, operation = pg.world_size, chosen.operation
    count = nbytes // 4 // n * n  # whole blocks: one a rank

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, device=pg.device)

    total, block, source = ones(count), ones(count // n), ones(count)
    args = {
        "all_reduce": (total, dist.ReduceOp.SUM),
        "reduce_scatter": (block, total, dist.ReduceOp.SUM),
        "all_gather": (total, block),
        "all_to_all": (total, source, None, None),
        "broadcast": (total, 0),
        "reduce": (total, 0, dist.ReduceOp.SUM),
    }[operation]
    benchmark.extra_info.update(dtype="float32", algorithm=algorithm)
    stamps = stamped(operation, pg, total, block, source)
    benchmark(chosen, *args, group=pg.group, nbytes=count * 4, collective=operation, stamps=stamps)
    check_once(pg, operation, chosen, count // n if operation in ("reduce_scatter", "all_gather") else count)


def stamped(operation: str, pg, total: torch.Tensor, block: torch.Tensor, source: torch.Tensor) -> Stamps:
    """Each timed call of a registered algorithm checked (bench.stamps), as test_registered_algorithm passes
    its buffers: ``total`` the whole tensor, ``block`` one rank's part, ``source`` all_to_all's input."""
    n, me, root = pg.world_size, pg.rank, pg.rank == 0
    return {
        "all_reduce": lambda: Stamps.summed([total], [total], n),
        "reduce_scatter": lambda: Stamps.summed(total.chunk(n), [block], n),
        "all_gather": lambda: Stamps.apart([block], total.chunk(n), me),
        "all_to_all": lambda: Stamps.apart(source.chunk(n), total.chunk(n), me),
        "broadcast": lambda: Stamps([total] * root, [total] * (not root)),
        "reduce": lambda: Stamps.summed([total], [total] * root, n),
    }[operation]()
