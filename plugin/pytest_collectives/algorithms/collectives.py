"""Collective algorithms under test, built from torch.distributed primitives.

Every function takes an optional ``group`` (None means the default group), works for any group size
n >= 1 and on subgroups, and runs on whatever device its tensors live on (gloo on CPU, NCCL on CUDA).
Ranks are group ranks; point-to-point peers are translated to global ranks, which is what P2P ops take
on every torch >= 2.1.

Sources:

- all_reduce_direct, all_reduce_reduce_broadcast, all_reduce_reduce_scatter_all_gather: the three
  equivalent all-reduces of the "Communication is the Key to Success" puzzler (seed 000).
- ring_all_reduce: the bandwidth-optimal ring of P. Patarasuk and X. Yuan, "Bandwidth optimal
  all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009, popularised for deep learning
  by Baidu's ring all-reduce (A. Gibiansky, 2017): a reduce-scatter ring then an all-gather ring.
- naive_ring_all_reduce: the full-buffer ring of the PyTorch "Writing Distributed Applications with
  PyTorch" tutorial (seed 002).
- ring_reduce_scatter, gemm_reduce_scatter: the ring-based reduce-scatter pipelining of nvFuser PR
  #2950 (seed 003), which reproduces TransformerEngine's GEMM + reduce-scatter comm/compute overlap.
- ring_all_gather: the all-gather phase of the bandwidth-optimal ring, on its own.
- binomial_tree_broadcast, binomial_tree_reduce, pairwise_all_to_all: MPICH's short-message broadcast
  and reduce and its pairwise-exchange all-to-all (R. Thakur, R. Rabenseifner and W. Gropp,
  "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ReduceOp

__all__ = [
    "all_reduce_direct",
    "all_reduce_reduce_broadcast",
    "all_reduce_reduce_scatter_all_gather",
    "binomial_tree_broadcast",
    "binomial_tree_reduce",
    "gemm_reduce_scatter",
    "gemm_reduce_scatter_sequential",
    "naive_ring_all_reduce",
    "pairwise_all_to_all",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_reduce_scatter",
]

# torch 2.13 renamed the single-tensor collectives and made the old names emit a FutureWarning (on every
# call of a timed loop too); the suites and the probe call them by these names, on any torch.
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

# How the P2P algorithms fold a received buffer into their own, in place. AVG folds as SUM and divides
# once at the end, which is also what a backend does.
_COMBINE: dict[ReduceOp, Callable[[Tensor, Tensor], object]] = {
    ReduceOp.SUM: Tensor.add_,
    ReduceOp.AVG: Tensor.add_,
    ReduceOp.PRODUCT: Tensor.mul_,
    ReduceOp.MIN: lambda acc, x: torch.minimum(acc, x, out=acc),
    ReduceOp.MAX: lambda acc, x: torch.maximum(acc, x, out=acc),
    ReduceOp.BAND: Tensor.bitwise_and_,
    ReduceOp.BOR: Tensor.bitwise_or_,
    ReduceOp.BXOR: Tensor.bitwise_xor_,
}


def all_reduce_direct(
    tensor: Tensor, op: ReduceOp = ReduceOp.SUM, group: dist.ProcessGroup | None = None
) -> Tensor:
    """The backend's own all-reduce, in place: the baseline every other algorithm is measured against.

    A non-contiguous tensor goes through a dense copy (see _dense).
    """
    with _dense(tensor) as work:
        dist.all_reduce(work, op=op, group=group)
    return tensor


def all_reduce_reduce_broadcast(
    tensor: Tensor, op: ReduceOp = ReduceOp.SUM, group: dist.ProcessGroup | None = None, root: int = 0
) -> Tensor:
    """All-reduce as reduce to group rank ``root`` (negative counts from the last, as an index does) then
    broadcast from it, in place.

    Every byte crosses the root twice, so the root's links bound the time: the textbook example of a
    correct but unbalanced decomposition.
    """
    global_root = dist.get_global_rank(_resolve(group), root % dist.get_world_size(group))
    with _dense(tensor) as work:
        dist.reduce(work, dst=global_root, op=op, group=group)
        dist.broadcast(work, src=global_root, group=group)
    return tensor


def all_reduce_reduce_scatter_all_gather(
    tensor: Tensor, op: ReduceOp = ReduceOp.SUM, group: dist.ProcessGroup | None = None
) -> Tensor:
    """All-reduce as reduce-scatter then all-gather of a flattened copy, written back in place.

    Both collectives need n equal shards, so the copy is padded to a multiple of n with the identity of
    ``op`` (0 for SUM, AVG, BOR and BXOR; 1 for PRODUCT; the dtype's largest value, +inf for floats, for
    MIN; its smallest, -inf for floats, for MAX; all bits set for BAND). Padded lanes only ever meet other
    padded lanes and are trimmed before the write-back; the identity keeps them inert (no overflow, inf
    or NaN) so a dump of the padded buffer reads as the reduction of the real data.
    """
    n = dist.get_world_size(group)
    flat = tensor.reshape(-1)
    pad = -flat.numel() % n
    padded = torch.cat([flat, _identity(op, pad, flat)])
    shard = padded.new_empty(padded.numel() // n)
    reduce_scatter_single(shard, padded, op=op, group=group)
    all_gather_single(padded, shard, group=group)
    tensor.copy_(padded[: flat.numel()].view(tensor.shape))
    return tensor


def ring_all_reduce(
    tensor: Tensor, op: ReduceOp = ReduceOp.SUM, group: dist.ProcessGroup | None = None
) -> Tensor:
    """Bandwidth-optimal ring all-reduce (Patarasuk & Yuan), in place.

    The flat tensor is cut into n chunks (``tensor_split``: any size, zero included). In the reduce-scatter
    phase, at step s rank r sends chunk (r - s) mod n to its right neighbour and folds the chunk
    (r - s - 1) mod n arriving from its left one into its own; after n - 1 steps it holds chunk
    (r + 1) mod n reduced over all ranks. The all-gather phase forwards the finished chunks around the
    ring for another n - 1 steps. Each rank sends 2(n - 1)/n of the tensor, the lower bound for any
    all-reduce. Supports SUM, AVG (floating dtypes), PRODUCT, MIN, MAX, BAND, BOR and BXOR.
    """
    combine = _combiner(op)
    rank, n, left, right = _ring(group, tensor.device)
    with _dense(tensor) as work:
        chunks = work.view(-1).tensor_split(n)
        # tensor_split puts the larger chunks first, so chunk 0 bounds every incoming one.
        scratch = torch.empty_like(chunks[0])
        for step in range(n - 1):
            mine, incoming = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
            received = scratch[: incoming.numel()]
            _wait(_shift(mine, received, left, right, group))
            combine(incoming, received)
        if op == ReduceOp.AVG:
            # Only the owner divides its chunk; the all-gather then spreads the finished average.
            chunks[(rank + 1) % n].div_(n)
        for step in range(n - 1):
            # Chunks are disjoint views, so the incoming finished chunk lands directly in place.
            _wait(_shift(chunks[(rank + 1 - step) % n], chunks[(rank - step) % n], left, right, group))
    return tensor


def naive_ring_all_reduce(
    tensor: Tensor, op: ReduceOp = ReduceOp.SUM, group: dist.ProcessGroup | None = None
) -> Tensor:
    """The PyTorch tutorial's full-buffer ring all-reduce, in place.

    For n - 1 steps every rank sends the payload it holds to its right neighbour, receives a new one
    from its left and folds it in. The payload received at step s is forwarded at step s + 1, so after
    n - 1 steps every rank has seen every other rank's original tensor exactly once. Two buffers
    alternate as in the tutorial: one is in flight while the other receives. Each rank sends n - 1 full
    tensors, (n - 1)/2 times more than the bandwidth-optimal ring. Same ops as ring_all_reduce.
    """
    combine = _combiner(op)
    _, n, left, right = _ring(group, tensor.device)
    with _dense(tensor) as work:
        outgoing, incoming = work.clone(), torch.empty_like(work)
        for _ in range(n - 1):
            _wait(_shift(outgoing, incoming, left, right, group))
            combine(work, incoming)
            outgoing, incoming = incoming, outgoing
        if op == ReduceOp.AVG:
            work.div_(n)
    return tensor


def ring_reduce_scatter(
    output: Tensor, input: Tensor, group: dist.ProcessGroup | None = None, steps: int | None = None
) -> Tensor:
    """SUM reduce-scatter over a ring in ``steps`` steps, like ``dist.reduce_scatter_tensor``.

    ``input`` holds n blocks of ``output.numel()`` elements (any shape, read flat); block r of the sum
    over ranks lands in ``output`` of group rank r. ``steps`` S must be a positive multiple of n and
    defaults to n, the classic ring; with S = k n every block is cut into k sub-chunks and the ring runs
    once per sub-chunk, each step moving 1/k of a block (nvFuser PR #2950).
    """
    n = dist.get_world_size(group)
    rings = _rings(steps, n)
    if input.numel() != n * output.numel():
        raise ValueError(
            f"input has {input.numel()} elements, expected {n} x {output.numel()} (group size x output)"
        )
    blocks = [block.tensor_split(rings) for block in input.contiguous().view(-1).tensor_split(n)]
    _pipelined_ring_reduce_scatter(lambda b, c: blocks[b][c], output.view(-1).tensor_split(rings), group)
    return output


def gemm_reduce_scatter(
    a: Tensor, b: Tensor, group: dist.ProcessGroup | None = None, steps: int | None = None
) -> Tensor:
    """This rank's row block of sum_r A_r @ B_r, with the GEMM overlapped with a ring reduce-scatter.

    Rank r holds A_r (M x K_r) and B_r (K_r x N); the result is the (M/n x N) block of rows owned by
    group rank r. M must be divisible by n, as for ``gemm_reduce_scatter_sequential``. The rows of every
    block are computed only when the ring needs them: each step starts its transfer, computes the
    partial product that the next step will send, then waits (nvFuser PR #2950, TransformerEngine's
    GEMM + reduce-scatter overlap). With ``steps`` S = k n the blocks are cut into k row chunks as in
    ``ring_reduce_scatter``. On CUDA the P2P ops already run on NCCL's internal stream, so issuing the
    GEMM on the current stream between the start and the wait is what overlaps them; on CPU, gloo
    progresses the transfer on its own threads while the GEMM runs.
    """
    n = dist.get_world_size(group)
    rings = _rings(steps, n)
    if a.shape[0] % n:
        raise ValueError(f"M = {a.shape[0]} rows of A must be divisible by the group size {n}")
    out = torch.empty(a.shape[0] // n, b.shape[1], dtype=torch.result_type(a, b), device=a.device)
    rows = [block.tensor_split(rings) for block in a.tensor_split(n)]
    _pipelined_ring_reduce_scatter(lambda blk, c: rows[blk][c] @ b, out.tensor_split(rings), group)
    return out


def gemm_reduce_scatter_sequential(a: Tensor, b: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """Baseline for gemm_reduce_scatter: the whole GEMM, then the backend's reduce-scatter; no overlap."""
    n = dist.get_world_size(group)
    if a.shape[0] % n:
        raise ValueError(f"M = {a.shape[0]} rows of A must be divisible by the group size {n}")
    partial = a @ b
    out = partial.new_empty(a.shape[0] // n, b.shape[1])
    reduce_scatter_single(out, partial, group=group)
    return out


def ring_all_gather(output: Tensor, input: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """Ring all-gather, like ``dist.all_gather_into_tensor``: ``output`` (n blocks of ``input.numel()``
    elements, any shape, read flat) ends with group rank r's input in block r. ``input`` may be this
    rank's own block of ``output``.

    Rank r starts with its own block in place; at step s it sends block (r - s) mod n to its right
    neighbour and receives block (r - s - 1) mod n from its left, the one its left neighbour received
    one step earlier. After n - 1 steps every rank holds every block, each having crossed each link once.
    """
    rank, n, left, right = _ring(group, output.device)
    if output.numel() != n * input.numel():
        raise ValueError(
            f"output has {output.numel()} elements, expected {n} x {input.numel()} (group size x input)"
        )
    with _dense(output) as work:
        blocks = work.view(-1).tensor_split(n)
        blocks[rank].copy_(input.reshape(-1))
        for step in range(n - 1):
            _wait(_shift(blocks[(rank - step) % n], blocks[(rank - step - 1) % n], left, right, group))
    return output


def binomial_tree_broadcast(tensor: Tensor, root: int = 0, group: dist.ProcessGroup | None = None) -> Tensor:
    """Broadcast of group rank ``root``'s tensor over a binomial tree, in place.

    Ranks are numbered relative to the root (v = (r - root) mod n). Rank v > 0 receives once, from v
    with its lowest set bit cleared; then, for each power of two m below that bit, it sends to v + m
    (where that rank exists). The root sends to 2^k, ..., 2, 1: the data reaches every rank in
    ceil(log2 n) rounds, which is why MPICH uses it for short messages.
    """
    rank, n = _place(group, tensor.device)
    me = (rank - root) % n
    with _dense(tensor) as work:
        mask = 1
        while mask < n:
            if me & mask:
                dist.recv(work, src=_global(group, me - mask + root), group=group)
                break
            mask <<= 1
        mask >>= 1
        while mask:
            if me + mask < n:
                dist.send(work, dst=_global(group, me + mask + root), group=group)
            mask >>= 1
    return tensor


def binomial_tree_reduce(
    tensor: Tensor, root: int = 0, op: ReduceOp = ReduceOp.SUM, group: dist.ProcessGroup | None = None
) -> Tensor:
    """Reduction of every rank's tensor into group rank ``root``'s, over a binomial tree, in place.

    The broadcast's tree run backwards: with ranks numbered relative to the root (v = (r - root) mod n),
    in round m = 1, 2, 4, ... a rank with bit m set sends its partial result to v - m and is done; the
    others fold in what v + m sends, where that rank exists. Other ranks' tensors end holding partial
    results (torch documents nothing for them either). Same ops as ring_all_reduce.
    """
    combine = _combiner(op)
    rank, n = _place(group, tensor.device)
    me = (rank - root) % n
    with _dense(tensor) as work:
        received = torch.empty_like(work)
        mask = 1
        while mask < n:
            if me & mask:
                dist.send(work, dst=_global(group, me - mask + root), group=group)
                break
            if me + mask < n:
                dist.recv(received, src=_global(group, me + mask + root), group=group)
                combine(work, received)
            mask <<= 1
        if me == 0 and op == ReduceOp.AVG:
            work.div_(n)
    return tensor


def pairwise_all_to_all(
    output: Tensor,
    input: Tensor,
    output_splits: list[int] | None = None,
    input_splits: list[int] | None = None,
    group: dist.ProcessGroup | None = None,
) -> Tensor:
    """All-to-all by pairwise exchange, like ``dist.all_to_all_single``: block j of ``input`` (read flat,
    ``input_splits[j]`` elements, or equal blocks) goes to group rank j, and block i of ``output`` comes
    from group rank i.

    Rank r keeps its own block, then at step s = 1 .. n - 1 sends to r + s and receives from r - s
    (mod n) at once: every rank sends and receives exactly one block a step, so no link or rank is a
    hot spot. An empty block is neither sent nor received (both ends know its size).
    """
    rank, n = _place(group, output.device)
    sends = _blocks(input.contiguous(), input_splits, n)
    with _dense(output) as work:
        receives = _blocks(work, output_splits, n)
        receives[rank].copy_(sends[rank])
        for step in range(1, n):
            to, source = (rank + step) % n, (rank - step) % n
            ops = []
            if sends[to].numel():
                ops.append(dist.P2POp(dist.isend, sends[to], _global(group, to), group))
            if receives[source].numel():
                ops.append(dist.P2POp(dist.irecv, receives[source], _global(group, source), group))
            if ops:
                _wait(dist.batch_isend_irecv(ops))
    return output


def _blocks(tensor: Tensor, splits: list[int] | None, n: int) -> tuple[Tensor, ...]:
    """Views of the dense ``tensor``, read flat: ``splits[j]`` elements each, or n equal blocks."""
    flat = tensor.view(-1)
    return flat.tensor_split(n) if splits is None else flat.split(splits)


def _pipelined_ring_reduce_scatter(
    contribution: Callable[[int, int], Tensor], outputs: tuple[Tensor, ...], group: dist.ProcessGroup | None
) -> None:
    """The ring schedule shared by ring_reduce_scatter and gemm_reduce_scatter.

    ``contribution(block, c)`` is this rank's share of sub-chunk c of block ``block`` (never written);
    ``outputs[c]`` receives sub-chunk c of this rank's block. Ring c runs in steps t = c n .. c n + n - 1.
    At hop h = t mod n, rank r works on block (r - h - 1) mod n: it adds its contribution to the partial
    sum received from the left and passes it right. The left neighbour worked on the same block one hop
    earlier, and at the last hop (h = n - 1) the block is r itself, complete.
    """
    rank, n, left, right = _ring(group, outputs[0].device)

    def share(t: int) -> Tensor:
        return contribution((rank - t % n - 1) % n, t // n)

    partial = share(0)
    # Two buffers alternate: the partial sum in flight to the right lives in one while the other receives
    # from the left. tensor_split puts the larger sub-chunks first, so sub-chunk 0 bounds every transfer.
    buffers = (torch.empty_like(partial), torch.empty_like(partial))
    for t in range(n * len(outputs)):
        chunk, hop = divmod(t, n)
        if hop == n - 1:
            outputs[chunk].copy_(partial)
            if t + 1 < n * len(outputs):
                partial = share(t + 1)
            continue
        received = buffers[t % 2][: partial.shape[0]]
        works = _shift(partial, received, left, right, group)
        # The overlap: the next share is computed while this step's transfer is in flight.
        upcoming = share(t + 1)
        _wait(works)
        partial = received.add_(upcoming)


def _rings(steps: int | None, n: int) -> int:
    """Number of sub-chunk rings for ``steps`` steps in a group of n."""
    if steps is None:
        return 1
    if steps <= 0 or steps % n:
        raise ValueError(f"steps must be a positive multiple of the group size {n}, got {steps}")
    return steps // n


def _resolve(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    return dist.group.WORLD if group is None else group


def _place(group: dist.ProcessGroup | None, device: torch.device) -> tuple[int, int]:
    """(group rank, group size) for an algorithm made of point-to-point ops.

    gloo's send and recv hand the raw data pointer to a socket, so a CUDA tensor would abort the process:
    refuse it while every rank can still raise.
    """
    group = _resolve(group)
    if device.type != "cpu" and dist.get_backend(group) == "gloo":
        raise NotImplementedError(
            f"gloo point-to-point ops take CPU tensors only, got a {device.type} tensor"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def _global(group: dist.ProcessGroup | None, rank: int) -> int:
    """The global rank of group rank ``rank`` (taken mod the group size): what P2P ops address."""
    group = _resolve(group)
    return dist.get_global_rank(group, rank % dist.get_world_size(group))


def _ring(group: dist.ProcessGroup | None, device: torch.device) -> tuple[int, int, int, int]:
    """This rank's place in the group's ring: (group rank, group size, left peer, right peer); peers are
    global ranks, which is what P2P ops take."""
    rank, n = _place(group, device)
    group = _resolve(group)
    return rank, n, dist.get_global_rank(group, (rank - 1) % n), dist.get_global_rank(group, (rank + 1) % n)


def _shift(
    send: Tensor, recv: Tensor, left: int, right: int, group: dist.ProcessGroup | None
) -> list[dist.Work]:
    """Start sending ``send`` right and receiving ``recv`` from the left as one batch.

    Every rank posts both at once, so no send/recv ordering can deadlock, and NCCL coalesces the pair
    to use both directions of a link.
    """
    return dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, send, right, group), dist.P2POp(dist.irecv, recv, left, group)]
    )


@contextlib.contextmanager
def _dense(tensor: Tensor) -> Iterator[Tensor]:
    """The tensor itself if contiguous, else a dense copy written back on exit: the algorithms take any
    layout, but P2P ops and gloo's collectives read raw memory (gloo silently reduces the wrong elements
    of a strided view)."""
    work = tensor.contiguous()
    yield work
    if work is not tensor:
        tensor.copy_(work)


def _wait(works: list[dist.Work]) -> None:
    for work in works:
        work.wait()


def _combiner(op: ReduceOp) -> Callable[[Tensor, Tensor], object]:
    try:
        return _COMBINE[op]
    except KeyError:
        raise ValueError(f"unsupported reduce op {op}") from None


def _identity(op: ReduceOp, count: int, like: Tensor) -> Tensor:
    """``count`` elements of the identity of ``op`` in the dtype and device of ``like``."""
    if op == ReduceOp.PRODUCT:
        return like.new_ones(count)
    if op == ReduceOp.BAND:
        return ~like.new_zeros(count)
    if op in (ReduceOp.MIN, ReduceOp.MAX):
        if like.dtype == torch.bool:
            return like.new_full((count,), op == ReduceOp.MIN)
        if like.is_floating_point():
            return like.new_full((count,), float("inf") if op == ReduceOp.MIN else float("-inf"))
        info = torch.iinfo(like.dtype)
        return like.new_full((count,), info.max if op == ReduceOp.MIN else info.min)
    return like.new_zeros(count)
