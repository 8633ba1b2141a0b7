"""Point-to-point semantics from the torch.distributed tutorial (seed 002): what is sent is received,
bit for bit, by blocking send/recv, by isend/irecv after wait(), and by batch_isend_irecv."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from cases import DTYPES, SIZES
from hypothesis import given
from hypothesis import strategies as st

from pytest_collectives.algorithms.reference import rank_input

MODES = ["send_recv", "isend_irecv", "batch_isend_irecv"]


@pytest.mark.world_size()
@given(
    dtype=st.sampled_from(DTYPES),
    size=SIZES,
    mode=st.sampled_from(MODES),
    pair=st.tuples(st.integers(0, 7), st.integers(1, 7)),
)
def test_receiver_sees_exactly_what_was_sent(pg, dtype, size, mode, pair):
    n = pg.world_size
    src = pair[0] % n
    dst = (src + pair[1] % (n - 1) + 1) % n if n > 1 else src  # any rank but src
    sent = rank_input(pg.seed, src, size, dtype)
    if pg.rank == src:
        payload = sent.to(pg.device, copy=True)
        if mode == "send_recv":
            dist.send(payload, dst)
        elif mode == "isend_irecv":
            dist.isend(payload, dst).wait()
        else:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, payload, dst)]):
                work.wait()
    elif pg.rank == dst:
        # poisoned first: an element the transfer failed to write can't pass for a received one
        inbox = (~sent if dtype == torch.bool else sent + 1).to(pg.device, copy=True)
        if mode == "send_recv":
            dist.recv(inbox, src)
        elif mode == "isend_irecv":
            dist.irecv(inbox, src).wait()
        else:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, inbox, src)]):
                work.wait()
        assert torch.equal(inbox.cpu(), sent), f"rank {dst} received something else than rank {src} sent"


@pytest.mark.world_size()
@given(dtype=st.sampled_from(DTYPES), size=SIZES)
def test_ring_exchange_both_directions_at_once(pg, dtype, size):
    """Every rank sends right and receives from the left in one batch: no ordering can deadlock it."""
    n, me = pg.world_size, pg.rank
    left, right = (me - 1) % n, (me + 1) % n
    inbox = torch.empty(size, dtype=dtype, device=pg.device)
    payload = rank_input(pg.seed, me, size, dtype).to(pg.device, copy=True)
    ops = [dist.P2POp(dist.isend, payload, right), dist.P2POp(dist.irecv, inbox, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert torch.equal(inbox.cpu(), rank_input(pg.seed, left, size, dtype))
