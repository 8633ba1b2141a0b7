"""Point-to-point semantics from the torch.distributed tutorial (seed 002): what is sent is received,
bit for bit, by blocking send/recv, by isend/irecv after wait(), and by batch_isend_irecv."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from cases import SIZES, assert_moved, movements, sentinel
from hypothesis import given
from hypothesis import strategies as st

from pytest_collectives.algorithms.reference import rank_input

MODES = ["send_recv", "isend_irecv", "batch_isend_irecv"]


SENDS = movements(["send_recv"], sizes=SIZES, members=st.none())


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
@given(case=SENDS, mode=st.sampled_from(MODES), pair=st.tuples(st.integers(0, 7), st.integers(1, 7)))
def test_receiver_sees_exactly_what_was_sent(pg, case, mode, pair):
    n, dtype, size = pg.world_size, case.dtype, case.size
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
        inbox = sentinel(size, dtype, pg.device)
        if mode == "send_recv":
            dist.recv(inbox, src)
        elif mode == "isend_irecv":
            dist.irecv(inbox, src).wait()
        else:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, inbox, src)]):
                work.wait()
        assert_moved(inbox, sent, f"rank {dst} receiving {mode} from rank {src}")


@pytest.mark.world_size()
@pytest.mark.needs("send_recv")
@given(case=SENDS)
def test_ring_exchange_both_directions_at_once(pg, case):
    """Every rank sends right and receives from the left in one batch: no ordering can deadlock it."""
    n, me, dtype, size = pg.world_size, pg.rank, case.dtype, case.size
    left, right = (me - 1) % n, (me + 1) % n
    inbox = sentinel(size, dtype, pg.device)
    payload = rank_input(pg.seed, me, size, dtype).to(pg.device, copy=True)
    ops = [dist.P2POp(dist.isend, payload, right), dist.P2POp(dist.irecv, inbox, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert_moved(inbox, rank_input(pg.seed, left, size, dtype), f"rank {me} receiving from rank {left}")
