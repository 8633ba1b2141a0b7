"""What a call's Work returns, beside what the call wrote: every operation made with async_op=True hands
back a Work whose wait() is True and which is completed once waited, and leaves what the blocking call
leaves; an all_reduce's future and result() hold its output; exception() is None once it succeeded.

Training stacks post their collectives async and read these: DDP's communication hooks take the reduced
bucket from the future's value, FSDP waits on the Works it kept. A backend that writes right and returns
the wrong thing here passes every test of the values.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import strategies as st

from pytest_collectives import (
    FLOATS,
    FailingCall,
    assert_moved,
    assert_reduced_close,
    backend_modules,
    examples,
    rank_input,
    reduce_op,
    reductions,
    refusal,
    work_script,
    write_reproduction,
)

pytestmark = pytest.mark.conformance  # drawn from the probe of the live group


@pytest.mark.world_size()
@pytest.mark.needs("all_reduce", "broadcast")
@examples(case=reductions(["all_reduce"], dtypes=FLOATS + [torch.int32], members=st.none()))
def test_async_op_with_wait(pg, case):
    """async_op=True returns a Work whose wait() returns True and leaves the same result the blocking call
    gives, and whose get_future()'s value and result() are the list of that output, as torch documents:
    DDP's communication hooks read the reduced bucket from the future's value."""
    inputs = [case.input(pg.seed, r, case.size, pg.world_size) for r in range(pg.world_size)]
    tensor = inputs[pg.rank].to(pg.device, copy=True)
    work = dist.all_reduce(tensor, op=reduce_op(case.op), async_op=True)
    waited = work.wait()
    value = work.get_future().wait()
    root = case.root % pg.world_size
    copy = inputs[pg.rank].to(pg.device, copy=True)
    broadcast = dist.broadcast(copy, src=root, async_op=True)
    broadcast_waited = broadcast.wait()
    try:
        result = work.result()
    except RuntimeError as exc:  # a Work need not keep its output: torch's own default raises
        if "not implemented" not in str(exc):
            raise
        result = None
    # judged once every rank made both calls (a rank that failed the first would skip the second), and in
    # one assertion: ranks that fail different checks must fail alike, or hypothesis, replaying the
    # example, sees another failure whenever another rank is the first to report
    me = f"on rank {pg.rank}"
    failures = [
        _failure(assert_reduced_close, tensor, inputs, case.op, case.values),
        _failure(assert_moved, copy, inputs[root], f"broadcast from rank {root} {me}"),
        _failure(_returned_true, waited, f"all_reduce's Work.wait() {me}"),
        _failure(_returned_true, broadcast_waited, f"broadcast's Work.wait() {me}"),
        _failure(_is_the_output, value, tensor, f"all_reduce's Work.get_future() value {me}"),
        result is not None and _failure(_is_the_output, result, tensor, f"all_reduce's Work.result() {me}"),
    ]
    assert not any(failures), "\n".join(filter(None, failures))


def _failure(check, *args):
    """What ``check(*args)`` asserted, or None where it held."""
    try:
        check(*args)
    except AssertionError as exc:
        return str(exc)
    return None


def _returned_true(returned, what):
    assert returned is True, f"{what} returned {returned!r}, not True"


def _is_the_output(value, output, what):
    """``value`` is what torch documents a Work's future and result hold: the list of the call's output."""
    assert isinstance(value, list) and len(value) == 1, f"{what} is {value!r}, not [the output tensor]"
    assert_moved(value[0], output, f"{what}, against the output")


def _call(name: str, x: torch.Tensor, m: int, root: int, op, async_op: bool):
    """``name`` (a row of the capability matrix) made on this rank's input ``x`` of n * m elements, as
    (what the call returned, the tensors it writes here): the Work, or a list of them, where async."""
    n, me = dist.get_world_size(), dist.get_rank()
    out, whole, got = x.new_zeros(m), x.new_zeros(n * m), torch.zeros_like(x)
    outs, chunks, part = [x.new_zeros(m) for _ in range(n)], list(x.chunk(n)), x[:m]
    at_root = me == root
    calls = {
        "all_reduce": (lambda: dist.all_reduce(x, op=op, async_op=async_op), [x]),
        # the other ranks' buffers hold what torch does not document
        "reduce": (lambda: dist.reduce(x, dst=root, op=op, async_op=async_op), [x] if at_root else []),
        "reduce_scatter_single": (
            lambda: dist.reduce_scatter_tensor(out, x, op=op, async_op=async_op),
            [out],
        ),
        "reduce_scatter": (lambda: dist.reduce_scatter(out, chunks, op=op, async_op=async_op), [out]),
        "broadcast": (lambda: dist.broadcast(x, src=root, async_op=async_op), [x]),
        "all_gather": (lambda: dist.all_gather(outs, part, async_op=async_op), outs),
        "all_gather_single": (lambda: dist.all_gather_into_tensor(whole, part, async_op=async_op), [whole]),
        "all_to_all_single": (lambda: dist.all_to_all_single(whole, x, async_op=async_op), [whole]),
        "all_to_all": (lambda: dist.all_to_all(outs, chunks, async_op=async_op), outs),
        "gather": (
            lambda: dist.gather(part, outs if at_root else None, dst=root, async_op=async_op),
            outs if at_root else [],
        ),
        "scatter": (
            lambda: dist.scatter(out, chunks if at_root else None, src=root, async_op=async_op),
            [out],
        ),
        "send_recv": (lambda: _ring_shift(x, got, async_op), [got]),
    }
    call, outputs = calls[name]
    return call(), outputs


def _ring_shift(x: torch.Tensor, got: torch.Tensor, async_op: bool):
    """Send ``x`` to the next rank and receive the previous one's into ``got``: isend and irecv's Works
    where async, else one batch_isend_irecv waited (a blocking send around a ring can wait forever)."""
    n, me = dist.get_world_size(), dist.get_rank()
    if async_op:
        return [dist.isend(x, (me + 1) % n), dist.irecv(got, (me - 1) % n)]
    ops = [dist.P2POp(dist.isend, x, (me + 1) % n), dist.P2POp(dist.irecv, got, (me - 1) % n)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return None


ASYNC = (
    "all_reduce", "reduce", "reduce_scatter_single", "reduce_scatter", "broadcast", "all_gather",
    "all_gather_single", "all_to_all_single", "all_to_all", "gather", "scatter", "send_recv",
)  # fmt: skip


# One fixed example per operation, not drawn: a backend whose Work never completes leaves the group unfit
# (the harness counts the Work as still in flight), and each example hypothesis replayed to shrink one
# cost a new group. int32 and SUM: exact, so the async call must leave the blocking call's bits.
@pytest.mark.world_size()
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.needs(name)) for name in ASYNC])
def test_async_work_completes(pg, name):
    """The operation made with async_op=True returns a Work (a receive and a send each their own) whose
    wait() returns True, which is_completed() once wait() returned, and which leaves what the same call
    made blocking leaves."""
    n, me, m = pg.world_size, pg.rank, 5

    def given(r: int, _: int = 0) -> torch.Tensor:  # rank r's whole input, here and in a reproduction
        return rank_input(pg.seed, r, (n * m,), torch.int32, op="sum", members=n)

    x = given(me).to(pg.device)
    made = {}
    for async_op in (False, True):
        try:
            made[async_op] = _call(name, x.clone(), m, n - 1, dist.ReduceOp.SUM, async_op)
        except Exception as exc:
            if not (reason := refusal(exc, pg.backend)):
                raise
            pytest.skip(f"N/A: {pg.backend} makes no {name} of int32{' async' * async_op}: {reason}")
    (_, blocking), (made_async, outputs) = made[False], made[True]
    works = made_async if isinstance(made_async, list) else [made_async]
    failures = []
    waited = [work.wait() for work in works]
    if pg.device.type == "cuda":  # wait() only orders the stream: is_completed() reads the GPU's progress
        torch.cuda.synchronize(pg.device)
    for k, (work, returned) in enumerate(zip(works, waited, strict=True)):
        what = f"{name}'s Work{f' {k + 1} of {len(works)}' * (len(works) > 1)} on rank {me}"
        failures.append(_failure(_returned_true, returned, f"{what}: wait()"))
        if not work.is_completed():
            failures.append(f"{what}: is_completed() is False once wait() returned")
    for k, (got, want) in enumerate(zip(outputs, blocking, strict=True)):
        failures.append(_failure(assert_moved, got, want, f"{name} async, output {k}, against it blocking"))
    said = "\n".join(filter(None, failures))
    if said:
        call = FailingCall(
            pg.backend, n, f"{name} async", "contiguous", "contiguous", torch.int32, (-1,),
            given=given,
            device=pg.device.type, modules=backend_modules(pg.backend), root=n - 1,
        )  # fmt: skip
        written_from = f"test_works.py::test_async_work_completes[ws{n}-{name}]"
        text = work_script(call, name, _call, m, said.splitlines()[0], written_from)
        said += "\n" + write_reproduction(pg, f"{pg.backend}-{name}-async_work-ws{n}", text)
        # raised, not asserted: pytest would print the message again as a shortened repr, its path mangled
        raise AssertionError(said)


@pytest.mark.world_size()
def test_work_exception_is_none_once_waited(pg):
    """Work.exception() of a collective that succeeded is None, as torch documents, async or not."""
    tensor = torch.ones(8, device=pg.device)
    work = dist.all_reduce(tensor, async_op=True)
    work.wait()
    assert work.exception() is None, f"all_reduce succeeded, yet Work.exception() is {work.exception()!r}"
    assert torch.equal(tensor, torch.full_like(tensor, pg.world_size))
