"""Point-to-point semantics from the torch.distributed tutorial (seed 002): what is sent is received,
bit for bit, by blocking send/recv, by isend/irecv after wait(), and by batch_isend_irecv (one pair, a
ring shift, every pair at once), addressed by global rank or by group rank inside a subgroup; and the
sender's tensor is left as it was."""

from __future__ import annotations

import inspect

import pytest
import torch.distributed as dist
from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_collectives import (
    LARGE_SIZES,
    FailingCall,
    assert_moved,
    assert_unchanged,
    backend_modules,
    examples,
    group_of,
    laid_out,
    large,
    movements,
    point_to_point_script,
    refusal,
    refused_example,
    sentinel,
    write_reproduction,
)

pytestmark = pytest.mark.conformance  # drawn from the probe of the live group

MODES = ["send_recv", "isend_irecv", "batch_isend_irecv"]


SENDS = movements(["send_recv"], members=st.none())
PAIRS = st.tuples(st.integers(0, 7), st.integers(1, 7))


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
@examples(case=SENDS, mode=st.sampled_from(MODES), pair=PAIRS)
def test_receiver_sees_exactly_what_was_sent(pg, case, mode, pair):
    check_sent_and_received(pg, case, mode, pair)


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
@large()
@given(
    case=movements(["send_recv"], sizes=LARGE_SIZES, members=st.none()),
    mode=st.sampled_from(MODES),
    pair=PAIRS,
)
def test_receiver_sees_exactly_what_was_sent_in_a_large_message(pg, case, mode, pair):
    check_sent_and_received(pg, case, mode, pair)


def check_sent_and_received(pg, case, mode: str, pair: tuple[int, int]) -> None:
    """Sent from and received into the drawn layout: a whole tensor, or a view at a storage offset (a slice
    of a flat buffer, as the registered algorithms pass), so a backend's receive that ignores the offset
    fails here, in its own row, before it fails the algorithms built on it. A failure names a standalone
    reproduction of the message."""
    n = pg.world_size
    src = pair[0] % n
    dst = (src + pair[1] % (n - 1) + 1) % n if n > 1 else src  # any rank but src
    try:
        _send_and_receive(pg, case, mode, src, dst)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_reproduction(pg, case, mode, src, dst, exc)}") from None


def _send_and_receive(pg, case, mode: str, src: int, dst: int) -> None:
    dtype, size = case.dtype, case.size
    sent = case.input(pg.seed, src, size, pg.world_size)
    if pg.rank == src:
        payload = laid_out(sent, case.layout, pg.device)
        if mode == "send_recv":
            dist.send(payload, dst)
        elif mode == "isend_irecv":
            dist.isend(payload, dst).wait()
        else:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, payload, dst)]):
                work.wait()
        assert_unchanged(payload, sent, f"rank {src}'s tensor sent {mode} to rank {dst}")
    elif pg.rank == dst:
        inbox = laid_out(sentinel(size, dtype, "cpu"), case.layout, pg.device)
        if mode == "send_recv":
            dist.recv(inbox, src)
        elif mode == "isend_irecv":
            dist.irecv(inbox, src).wait()
        else:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, inbox, src)]):
                work.wait()
        assert_moved(inbox, sent, f"rank {dst} receiving {mode} from rank {src}")


def _reproduction(pg, case, mode: str, src: int, dst: int, failure: AssertionError) -> str:
    """The message written as a file that needs only torch and the backend: the line naming it."""
    n, dtype = pg.world_size, str(case.dtype).removeprefix("torch.")
    call = FailingCall(
        pg.backend, n, "send_recv", case.layout, case.layout, case.dtype, (case.size,),
        given=lambda r, _: case.input(pg.seed, r, case.size, n), device=pg.device.type,
        modules=backend_modules(pg.backend),
    )  # fmt: skip
    where = f"test_point_to_point.py, {mode} of {case.size} {dtype} elements from rank {src} to rank {dst}"
    text = point_to_point_script(call, mode, src, dst, str(failure).splitlines()[0], where)
    name = f"{pg.backend}-{mode}-{case.layout}-{dtype}-{case.size}-from{src}to{dst}-ws{n}"
    return write_reproduction(pg, name, text)


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
@examples(case=SENDS)
def test_ring_exchange_both_directions_at_once(pg, case):
    """Every rank sends right and receives from the left in one batch: no ordering can deadlock it."""
    n, me, dtype, size = pg.world_size, pg.rank, case.dtype, case.size
    left, right = (me - 1) % n, (me + 1) % n
    inbox = sentinel(size, dtype, pg.device)
    mine = case.input(pg.seed, me, size, n)
    payload = mine.to(pg.device, copy=True)
    ops = [dist.P2POp(dist.isend, payload, right), dist.P2POp(dist.irecv, inbox, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert_moved(inbox, case.input(pg.seed, left, size, n), f"rank {me} receiving from rank {left}")
    assert_unchanged(payload, mine, f"rank {me}'s tensor sent to rank {right}")


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
@examples(case=SENDS)
def test_a_receive_from_any_source_returns_its_sender(pg, case):
    """recv with no source takes whichever message comes and returns its sender's rank (torch: "Returns:
    Sender rank"): every rank sends right and receives from any source, so each gets its left neighbour's
    message and must be told so. A backend that takes no receive from any source (NCCL) refuses on every
    rank alike, and the message is then taken by its source."""
    n, me = pg.world_size, pg.rank
    if n == 1:
        pytest.skip("a receive from any source needs a second rank to send")
    # gloo raises on an empty one (docs/findings.md) and leaves its message waiting, which the next
    # example's receive would take: a raise that took the message cannot be told from one that did not
    assume(case.size > 0)
    left = (me - 1) % n
    sent = case.input(pg.seed, me, case.size, n)
    inbox = laid_out(sentinel(case.size, case.dtype, "cpu"), case.layout, pg.device)
    sending = dist.isend(laid_out(sent, case.layout, pg.device), (me + 1) % n)
    try:
        sender = dist.recv(inbox)
    except Exception as exc:
        if reason := refusal(exc, pg.backend):
            dist.recv(inbox, left)  # refused, its message still waits: taken by its source
            sending.wait()
            refused_example(f"{pg.backend} takes no receive from any source: {reason}")
        raise
    sending.wait()
    assert sender == left, f"rank {me} received rank {left}'s message from any source; told rank {sender}"
    assert_moved(inbox, case.input(pg.seed, left, case.size, n), f"rank {me} receiving from any source")


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
@examples(case=movements(["send_recv"]))
def test_all_pairs_exchange_in_one_batch(pg, case):
    """Every rank sends its own payload to every other rank and receives from each in one batch: n - 1
    sends and n - 1 receives per rank, posted in an order that differs between the ranks."""
    n, me, dtype, size = pg.world_size, pg.rank, case.dtype, case.size
    peers = [(me + k) % n for k in range(1, n)]
    inboxes = {peer: sentinel(size, dtype, pg.device) for peer in peers}
    mine = {peer: case.part(pg.seed, me, peer, size, n) for peer in peers}
    payloads = {peer: part.to(pg.device, copy=True) for peer, part in mine.items()}
    ops = [dist.P2POp(dist.irecv, inboxes[peer], peer) for peer in reversed(peers)]
    ops += [dist.P2POp(dist.isend, payloads[peer], peer) for peer in peers]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for peer in peers:
        assert_moved(inboxes[peer], case.part(pg.seed, peer, me, size, n), f"rank {me} from {peer}")
        assert_unchanged(payloads[peer], mine[peer], f"rank {me}'s tensor sent to {peer}")


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
@examples(case=movements(["send_recv"]), pair=PAIRS)
def test_send_recv_by_group_rank_in_a_subgroup(pg, case, pair):
    """send(group_dst=)/recv(group_src=) inside a subgroup address group ranks, not global ones."""
    if "group_dst" not in inspect.signature(dist.send).parameters:
        pytest.skip("this torch has no group_dst/group_src (torch 2.6 and later)")
    group, ranks = group_of(pg, case.members)
    assume(len(ranks) >= 2)  # every rank draws the same members, so every rank rejects together
    if group is None:
        return
    n, me = len(ranks), ranks.index(pg.rank)
    src = pair[0] % n
    dst = (src + pair[1] % (n - 1) + 1) % n
    sent = case.input(pg.seed, ranks[src], case.size, n)
    if me == src:
        payload = sent.to(pg.device, copy=True)
        dist.send(payload, group=group, group_dst=dst)
        assert_unchanged(payload, sent, f"group rank {src}'s tensor sent to group rank {dst}")
    elif me == dst:
        inbox = sentinel(case.size, case.dtype, pg.device)
        dist.recv(inbox, group=group, group_src=src)
        assert_moved(inbox, sent, f"group rank {dst} (rank {ranks[dst]}) receiving from group rank {src}")


IN_FLIGHT = ["isend_irecv", "isend_irecv_tagged", "batch_isend_irecv", "batch_isend_irecv_tagged"]


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
@examples(
    case=SENDS,
    mode=st.sampled_from(IN_FLIGHT),
    count=st.integers(2, 4),
    pair=PAIRS,
    order=st.permutations(range(4)),
)
def test_messages_to_one_peer_in_flight_arrive_in_the_order_posted(pg, case, mode, count, pair, order):
    """Several messages from one rank to one peer in flight at once, posted in the same order on both
    sides (isend/irecv or one batch_isend_irecv, with tags or without), land in the receives in that
    order, whatever order they are waited in (MPI's non-overtaking rule; the MPI backend swapped two
    tagged messages to one peer, pytorch 63486). Tags follow the posting order, so a backend that ignores
    them (NCCL, pytorch 94819) passes."""
    n = pg.world_size
    src = pair[0] % n
    dst = (src + pair[1] % (n - 1) + 1) % n if n > 1 else src
    if pg.rank not in (src, dst) or src == dst:
        return
    sent = [case.part(pg.seed, src, k, case.size, n) for k in range(count)]
    tags = list(range(1, count + 1)) if mode.endswith("_tagged") else [0] * count
    if pg.rank == src:
        post, peer, buffers = dist.isend, dst, [x.to(pg.device, copy=True) for x in sent]
    else:
        post, peer, buffers = dist.irecv, src, [sentinel(case.size, case.dtype, pg.device) for _ in sent]
    posted = list(zip(buffers, tags, strict=True))
    if mode.startswith("batch"):
        works = dist.batch_isend_irecv([dist.P2POp(post, b, peer, tag=t) for b, t in posted])
    else:
        works = [post(b, peer, tag=t) for b, t in posted]
    for k in (k for k in order if k < len(works)):  # waited in any order: none completes another's receive
        works[k].wait()
    for k, (box, tag) in enumerate(zip(buffers, tags, strict=True)):
        what = f"message {k + 1} of {count} in flight from rank {src} to rank {dst} ({mode}, tag {tag})"
        if pg.rank == dst:
            assert_moved(box, sent[k], what)
        else:
            assert_unchanged(box, sent[k], f"{what}: the sender's tensor")
