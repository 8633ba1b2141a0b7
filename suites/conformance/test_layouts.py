"""Every backend call torch lets take a non-contiguous tensor, given one: a strided view (every other
element of the last dimension) and a channels_last tensor, as inputs and as outputs, and a channels_last
tensor on one side of a call with a contiguous one on the other.

torch hands these calls the tensor as it is. A backend must read and write the elements in logical order,
or refuse the layout in its own words (NCCL: "Tensors must be contiguous"). One that reads or writes the
storage as if it were dense moves the wrong elements, silently (gloo's all_reduce of a strided view,
pytorch issue 163483 for channels_last). One that copies the storage byte for byte is right whenever
both sides share a layout: only a call from one layout into another shows it (NCCL's
all_gather_into_tensor at one rank). Each call runs in a dtype of every element size the backend takes
for it, so that one packing a layout with a fixed element size in mind is caught too. The algorithms
under test make their tensors dense first (collectives._dense): only here does a layout reach the
backend. Where a backend gets a call wrong, the known-bug manifest (suites/known_bugs.json) says which,
and any other failure of that call still fails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from hypothesis import strategies as st

from pytest_collectives import (
    DTYPES,
    NO_OP,
    REDUCTIONS,
    FailingCall,
    all_gather_single,
    assert_moved,
    assert_reduced_close,
    assert_unchanged,
    backend_modules,
    complement,
    item_parameter,
    item_world_sizes,
    layout_script,
    placed,
    rank_input,
    reduce_scatter_single,
    refusal,
    refused_example,
    rotation_turn,
    sentinel,
    supported_cells,
    sweep,
    tiers_at,
    write_reproduction,
)

pytestmark = pytest.mark.conformance

# (N, C, H, W) with C > 1 and H * W > 1, so that channels_last and contiguous strides differ
SHAPES = ((2, 3, 2, 5), (1, 2, 3, 2), (3, 4, 1, 3), (1, 5, 2, 2), (2, 2, 3, 3))
# each test's name for its layouts -> (the inputs', the outputs')
LAYOUTS = {
    "strided": ("strided", "strided"),
    "channels_last": ("channels_last", "channels_last"),
    "channels_last_to_contiguous": ("channels_last", "contiguous"),
    "contiguous_to_channels_last": ("contiguous", "channels_last"),
}


def arranged(tensor: torch.Tensor, layout: str, device: torch.device) -> torch.Tensor:
    """``tensor``'s values in ``layout`` on ``device``: never contiguous, whatever the shape, unless the
    layout is "contiguous"."""
    if layout == "contiguous":
        return tensor.to(device).contiguous()
    if layout == "channels_last":
        return tensor.to(device).contiguous(memory_format=torch.channels_last)
    buffer = torch.empty(*tensor.shape[:-1], 2 * tensor.shape[-1], dtype=tensor.dtype, device=device)
    view, gaps = buffer[..., ::2], buffer[..., 1::2]
    view.copy_(tensor)
    gaps.copy_(complement(tensor))
    return placed(view, [gaps])  # a check of the view finds the gaps written


@dataclasses.dataclass(frozen=True)
class Tensors:
    """The dtype and shape of every tensor of one call."""

    dtype: torch.dtype
    shape: tuple[int, ...]


def tensors_of_each_size() -> st.SearchStrategy[list[Tensors]]:
    """For the running test's call, as one sweep (``pytest_collectives.sweep``): float32 in the first shape
    (the call as it always ran), then, at the world sizes where the size tiers run (``cases.tiers_at``), a
    dtype of each element size the backend takes for the call, each in another shape; which dtype of a
    size, and which shape, turn with the run (``rotation_turn``). A backend that packs or copies a layout
    with a fixed element size in mind gets one of them wrong."""
    return st.builds(rotation_turn).map(_of_each_size)


def _of_each_size(turn: int) -> list[Tensors]:
    probed = CALLS[item_parameter("name")][1]
    op = "sum" if probed in REDUCTIONS else NO_OP
    dtypes = [dtype for dtype, _ in supported_cells([probed], DTYPES, (op,))]
    if not dtypes:
        return []
    first = torch.float32 if torch.float32 in dtypes else dtypes[0]
    listed = [Tensors(first, SHAPES[0])]  # the first shape is the first example's alone
    if not tiers_at(item_parameter("world_size"), item_world_sizes()):
        return listed  # the other sizes where the size tiers run: packing a layout is a rank's own work
    for i, size in enumerate(sorted({dtype.itemsize for dtype in dtypes})):
        alike = [dtype for dtype in dtypes if dtype.itemsize == size and dtype != first]
        if alike:
            listed.append(Tensors(alike[(turn + i) % len(alike)], SHAPES[1 + (turn + i) % (len(SHAPES) - 1)]))
    return listed


class Call:
    """One backend call on this rank: the layout's tensors in, and what each output must then hold; the
    inputs of a call that is not ``in_place`` must hold what they held."""

    def __init__(self, pg, layout: str, tensors: Tensors, in_place: bool) -> None:
        self.n, self.me, self.root = pg.world_size, pg.rank, pg.world_size - 1
        self.layout, self.device, self.seed = layout, pg.device, pg.seed
        self.input_layout, self.output_layout = LAYOUTS[layout]
        self.dtype, self.shape, self.in_place = tensors.dtype, tensors.shape, in_place
        self.checks: list[Callable[[], None]] = []
        self.handed: list[tuple[torch.Tensor, torch.Tensor]] = []  # each tensor given the call, its values

    def input(self, rank: int, peer: int = 0, blocks: int = 1) -> torch.Tensor:
        """What ``rank`` sends ``peer`` (the same on every rank): ``blocks`` of the shape along dim 0."""
        shape = (blocks * self.shape[0], *self.shape[1:])
        return rank_input(self.seed, rank * 16 + peer, shape, self.dtype)

    def laid(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as the call's inputs are laid out."""
        laid = arranged(tensor, self.input_layout, self.device)
        self.handed.append((laid, tensor))
        if not self.in_place:
            what = f"{self.layout} input on rank {self.me}"
            self.checks.append(lambda: assert_unchanged(laid, tensor, what))
        return laid

    def unwritten(self, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """A sentinel-filled tensor as the call's outputs are laid out."""
        out = arranged(sentinel(shape or self.shape, self.dtype, "cpu"), self.output_layout, self.device)
        # its bytes: a bool's copy reads the sentinel byte 0xFF as True and writes 0x01
        self.handed.append((out, out.view(torch.uint8).clone().view(torch.bool) if out.dtype == torch.bool
                            else out.clone()))  # fmt: skip
        return out

    def assert_untouched(self, name: str) -> None:
        """Every tensor the call was handed holds what it held: a call refused in the backend's words is N/A
        only where it changed nothing (one that wrote the caller's tensor, then refused, read as N/A)."""
        for tensor, before in self.handed:
            assert_unchanged(tensor, before, f"{self.layout} {name}, refused, on rank {self.me}")

    def output(self, expected: torch.Tensor, what: str) -> torch.Tensor:
        """A sentinel-filled output, checked after the call to hold ``expected``'s bits."""
        out = self.unwritten(expected.shape)
        self.checks.append(lambda: assert_moved(out, expected, f"{self.layout} {what} on rank {self.me}"))
        return out

    def reduced(self, tensor: torch.Tensor, inputs: list[torch.Tensor], what: str) -> torch.Tensor:
        self.checks.append(lambda: _assert_summed(tensor, inputs, f"{self.layout} {what} on rank {self.me}"))
        return tensor


def _assert_summed(actual: torch.Tensor, inputs: list[torch.Tensor], what: str) -> None:
    try:
        assert_reduced_close(actual, inputs, "sum")
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


# Each call as torch documents it, with every tensor it takes in the layout; a check registered per output.
def _all_reduce(c: Call) -> None:
    inputs = [c.input(r) for r in range(c.n)]
    dist.all_reduce(c.reduced(c.laid(inputs[c.me]), inputs, "all_reduce"))


def _reduce(c: Call) -> None:
    inputs = [c.input(r) for r in range(c.n)]
    tensor = c.laid(inputs[c.me])
    dist.reduce(c.reduced(tensor, inputs, "reduce") if c.me == c.root else tensor, dst=c.root)


def _broadcast(c: Call) -> None:
    source = c.input(c.root)
    tensor = c.laid(source) if c.me == c.root else c.output(source, f"broadcast from rank {c.root}")
    dist.broadcast(tensor, src=c.root)


def _all_gather(c: Call) -> None:
    outputs = [c.output(c.input(r), f"all_gather: rank {r}'s part") for r in range(c.n)]
    dist.all_gather(outputs, c.laid(c.input(c.me)))


def _gather(c: Call) -> None:
    outputs = None
    if c.me == c.root:
        outputs = [c.output(c.input(r), f"gather: rank {r}'s part") for r in range(c.n)]
    dist.gather(c.laid(c.input(c.me)), outputs, dst=c.root)


def _scatter(c: Call) -> None:
    parts = [c.laid(c.input(c.root, r)) for r in range(c.n)] if c.me == c.root else None
    dist.scatter(c.output(c.input(c.root, c.me), f"scatter from rank {c.root}"), parts, src=c.root)


def _reduce_scatter(c: Call) -> None:
    output = c.unwritten()
    c.reduced(output, [c.input(r, c.me) for r in range(c.n)], "reduce_scatter")
    dist.reduce_scatter(output, [c.laid(c.input(c.me, r)) for r in range(c.n)])


def _all_to_all(c: Call) -> None:
    outputs = [c.output(c.input(r, c.me), f"all_to_all: from rank {r}") for r in range(c.n)]
    dist.all_to_all(outputs, [c.laid(c.input(c.me, r)) for r in range(c.n)])


def _all_gather_into_tensor(c: Call) -> None:
    output = c.output(torch.cat([c.input(r) for r in range(c.n)]), "all_gather_into_tensor")
    all_gather_single(output, c.laid(c.input(c.me)))


def _reduce_scatter_tensor(c: Call) -> None:
    output = c.unwritten()
    c.reduced(output, [c.input(r, c.me) for r in range(c.n)], "reduce_scatter_tensor")
    reduce_scatter_single(output, c.laid(torch.cat([c.input(c.me, r) for r in range(c.n)])))


def _all_to_all_single(c: Call) -> None:
    output = c.output(torch.cat([c.input(r, c.me) for r in range(c.n)]), "all_to_all_single")
    dist.all_to_all_single(output, c.laid(torch.cat([c.input(c.me, r) for r in range(c.n)])))


def _send_recv(c: Call) -> None:
    if c.n == 1:
        pytest.skip("N/A: send/recv needs two ranks or more")
    source = (c.me - 1) % c.n
    received = c.output(c.input(source), f"recv from rank {source}")
    sending = dist.isend(c.laid(c.input(c.me)), (c.me + 1) % c.n)
    try:
        receiving = dist.irecv(received, source)
    except Exception:
        # every rank's send is in flight: take it into a dense tensor, so that the refusal leaves the group
        # with nothing in flight (else it is replaced, 2 s a world size on gloo)
        dist.irecv(torch.empty(c.shape, dtype=c.dtype, device=c.device), source).wait()
        sending.wait()
        raise
    sending.wait()
    receiving.wait()


# torch's name of each call -> (how it is made, the probe's name for it: N/A where that is refused)
CALLS: dict[str, tuple[Callable[[Call], None], str]] = {
    "all_reduce": (_all_reduce, "all_reduce"),
    "reduce": (_reduce, "reduce"),
    "broadcast": (_broadcast, "broadcast"),
    "all_gather": (_all_gather, "all_gather"),
    "gather": (_gather, "gather"),
    "scatter": (_scatter, "scatter"),
    "reduce_scatter": (_reduce_scatter, "reduce_scatter"),
    "all_to_all": (_all_to_all, "all_to_all"),
    "all_gather_into_tensor": (_all_gather_into_tensor, "all_gather_single"),
    "reduce_scatter_tensor": (_reduce_scatter_tensor, "reduce_scatter_single"),
    "all_to_all_single": (_all_to_all_single, "all_to_all_single"),
    "send_recv": (_send_recv, "send_recv"),
}


# these write their input: one tensor, one layout
IN_PLACE = {"all_reduce", "reduce"}


@pytest.mark.world_size()
@pytest.mark.parametrize(
    "name, layout",
    [
        pytest.param(name, layout, marks=pytest.mark.needs(probed), id=f"{name}-{layout}")
        for name, (_, probed) in CALLS.items()
        for layout, (inputs, outputs) in LAYOUTS.items()
        if inputs == outputs or name not in IN_PLACE
    ],
)
@sweep(tensors=tensors_of_each_size())
def test_backend_call_in_a_layout(pg, name, layout, tensors):
    """The call moves and reduces the elements in logical order, or refuses the layout in its own words.
    A refusal ends its example alone (gloo takes some channels_last shapes in all_to_all_single, not
    others; where a raise may leave the backend unfit, the rest runs in a call of its own on a group found
    fit): the test is N/A only where every example was refused."""
    call = Call(pg, layout, tensors, in_place=name in IN_PLACE)
    try:
        CALLS[name][0](call)
    except Exception as exc:
        if reason := refusal(exc, pg.backend):
            call.assert_untouched(name)
            inputs, outputs = LAYOUTS[layout]
            what = f"a {layout} tensor" if inputs == outputs else f"a {inputs} input into a {outputs} output"
            refused_example(f"{pg.backend} refuses {name} of {what}: {reason}")
        raise
    try:
        for check in call.checks:
            check()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_reproduction(pg, name, call, exc)}") from None


def _reproduction(pg, name: str, call: Call, failure: AssertionError) -> str:
    """The failing call written as a file that needs only torch and the backend: the line naming it."""
    written = FailingCall(
        pg.backend, call.n, name, call.input_layout, call.output_layout, call.dtype, call.shape,
        given=call.input, device=pg.device.type, modules=backend_modules(pg.backend),
    )  # fmt: skip
    where = f"test_layouts.py::test_backend_call_in_a_layout[ws{call.n}-{name}-{call.layout}], {call.dtype}"
    text = layout_script(written, str(failure).splitlines()[0], where)
    dtype = str(call.dtype).removeprefix("torch.")
    return write_reproduction(pg, f"{pg.backend}-{name}-{call.layout}-ws{call.n}-{dtype}", text)
