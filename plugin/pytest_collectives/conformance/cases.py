"""Hypothesis strategies and rank-side checks of the conformance suites, for any test file to use.

Values are drawn once, in pytest's process; every rank receives the same draw and rebuilds every rank's
input from the test's shared seed (reference.rank_input), so the exact reference is computed locally.
A dtype and reduce op are drawn only where the probe of the live group (probing.py, for tests marked
``conformance``) found every backend call the operation is made of supported: a refused combination is
N/A, never drawn and never a pass.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import assume, settings
from hypothesis import strategies as st

from pytest_collectives.algorithms import registry
from pytest_collectives.algorithms.reference import (
    SCALE,
    SMALL,
    UNWRITTEN_BOOL,
    Values,
    _raw,
    assert_written_within,
    defined,
    placed,
    rank_input,
)
from pytest_collectives.conformance import capabilities as caps
from pytest_collectives.conformance import rotation
from pytest_collectives.conformance.capabilities import DTYPES, NO_OP, REDUCE_OPS, Cell, dtype_name
from pytest_collectives.execution import examples, shared_inputs
from pytest_collectives.execution.suite_api import item_parameter, item_world_sizes

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

# 0, 1, primes and sizes that no world size up to 8 divides.
EDGE_SIZES = [0, 1, 2, 3, 5, 7, 13, 31, 97, 101, 419, 1021, 4099]
SMALL_SIZES = st.one_of(st.sampled_from(EDGE_SIZES), st.integers(0, 5000))
# Large messages (64 Ki or 1 Mi elements plus a small size) take up to a second an example at 4 ranks, as
# long as a hundred small ones: they have their own few-example tests (large()), the rest draw small sizes.
# A failure found at 1 Mi + 3 shrinks to 1 Mi, the offset drawn apart from the small size.
LARGE_SIZES = st.tuples(st.sampled_from([1 << 16, 1 << 20]), SMALL_SIZES).map(sum)
_PART_KEYS = 64  # an input part's key is rank * _PART_KEYS + part
MAX_RANKS = 8  # members and roots are drawn up to this and folded onto the actual world
# Subgroups of a few shapes, folded onto the world: one rank, a pair without rank 0, every other rank, a
# contiguous half, all but rank 0. Any subset of 8 ranks would make up to 255 groups at 8 ranks, each a
# rendezvous of every rank (most of an example's time there) and kept open for the group's life.
SUBGROUPS = [
    frozenset(ranks)
    for ranks in ({0}, {1}, {1, 2}, {0, 2, 4, 6}, {1, 3, 5, 7}, {0, 1, 2, 3}, set(range(1, 8)))
]
MEMBERS = st.none() | st.sampled_from(SUBGROUPS)
# Two examples in three hold each dtype's whole range (full, spread); a failure there shrinks towards small
# values, or integer values (scale 0).
VALUES = st.builds(
    Values, kind=st.sampled_from(["small", "full", "spread"]), scale=st.integers(-SCALE, SCALE)
)
LAYOUTS = ("contiguous", "strided", "offset")
# After every output buffer: as wide as the widest vector a kernel may write whole, and a byte that is no
# float's NaN or integer's 0, so a spill of received data or of a sum over it shows.
GUARD_BYTES, GUARD_BYTE = 16, 0xA5
# Where a test draws values and sizes for the backend's own calls, they come dense (contiguous or at a
# storage offset): gloo gets five of its calls wrong on a strided view, and one such failure would end the
# draw before the values reach anything. Every call takes strided and channels_last tensors in
# test_layouts.py instead, each a row of the known-bug manifest where a backend gets it wrong.
DENSE = ("contiguous", "offset")


def backend_calls(operation: str, dtype: str, op: str) -> list[Cell]:
    """The backend calls ``operation`` is made of, each of which the probe must have found supported: a
    registered algorithm's ``uses`` (with the drawn op where a call reduces), or the backend op itself."""
    try:
        algorithm = registry.get(operation)
    except LookupError:
        return [(operation, dtype, op)]
    if (algorithm.ops is not None and op not in algorithm.ops) or (
        algorithm.dtypes is not None and dtype not in algorithm.dtypes
    ):
        return [("(no such op)", dtype, op)]
    return [(call, dtype, op if call in caps.REDUCTIONS else NO_OP) for call in algorithm.uses]


def reduces(operation: str) -> bool:
    """Whether ``operation`` (a backend call, or a registered algorithm's name) takes a reduce op: only
    those have a cell per reduce op; one that moves data has one per dtype."""
    try:
        algorithm = registry.get(operation)
    except LookupError:
        return operation in caps.REDUCTIONS
    return algorithm.operation in caps.REDUCTIONS or algorithm.ops is not None  # ops: the ones it takes


def supported_cells(
    operations: Sequence[str],
    dtypes: Sequence[torch.dtype],
    ops: Sequence[str],
    probe: caps.Capabilities | None = None,
) -> list[tuple[torch.dtype, str]]:
    """(dtype, op) pairs with an exact reference where every one of ``operations`` is supported here (by
    ``probe``, else the running test's); the op is NO_OP where none of them reduces (a reduce op drawn for
    a broadcast is no cell)."""
    found = probe or caps.active()
    key = (tuple(operations), tuple(dtypes), tuple(ops))
    if key not in found.answered:
        if not any(reduces(name) for name in operations):
            ops = (NO_OP,)
        found.answered[key] = [
            (dtype, op)
            for dtype in dtypes
            for op in ops
            if (op == NO_OP or defined(dtype, op))
            and found.supports_all(
                c for name in operations for c in backend_calls(name, dtype_name(dtype), op)
            )
        ]
    return list(found.answered[key])


def applicable(operations: Sequence[str], together: bool = False) -> bool:
    """Whether any of ``operations`` (all of them at once, with ``together``) has a supported cell, with
    any reduce op or none: the conftest skips a test as N/A otherwise."""
    ops = [*REDUCE_OPS, NO_OP]
    if together:
        return bool(supported_cells(operations, DTYPES, ops))
    found = caps.active()
    return any(found.supports(name) or supported_cells([name], DTYPES, ops) for name in operations)


@dataclasses.dataclass(frozen=True)
class Case:
    operations: tuple[str, ...]  # what one example exercises: its rows of the capability matrix
    dtype: torch.dtype
    op: str  # a reduce op, or NO_OP for an operation that moves data
    size: int
    layout: str  # contiguous, strided (every other element of a larger buffer) or offset (storage offset 1)
    members: frozenset[int] | None  # None: the whole world; else the ranks of a subgroup (folded mod n)
    root: int  # folded onto the group size
    values: Values = SMALL  # what the inputs hold: small values, or the dtype's whole range

    def cells(self) -> list[Cell]:
        return [
            (name, dtype_name(self.dtype), self.op if reduces(name) else NO_OP) for name in self.operations
        ]

    def input(self, seed: int, key: int, shape: int | Sequence[int], members: int) -> torch.Tensor:
        """The input ``key`` (a rank, or a rank and a peer) of this example for a group of ``members``
        ranks: every rank has the same one (reference.rank_input), drawn once per group where it is large
        (shared_inputs)."""
        op = None if self.op == NO_OP else self.op
        size = (shape,) if isinstance(shape, int) else tuple(shape)
        values = self.values
        return shared_inputs.drawn(
            (seed, key, values.kind, values.scale, op, members),
            size,
            self.dtype,
            lambda: rank_input(seed, key, size, self.dtype, values=values, op=op, members=members),
        )

    def part(self, seed: int, rank: int, part: int, shape: int | Sequence[int], members: int) -> torch.Tensor:
        """Part ``part`` of rank ``rank``'s input (the block for a peer, one of several messages), drawn on
        its own: a rank builds its own parts and the one of each peer's it receives, 2n - 1 parts of a
        reduce_scatter or all_to_all, not the n x n of every member's whole input."""
        return self.input(seed, rank * _PART_KEYS + part, shape, members)


@dataclasses.dataclass(frozen=True)
class Calls:
    """Operations that take no tensor (barrier, object collectives): their rows of the matrix."""

    operations: tuple[str, ...]

    def cells(self) -> list[Cell]:
        return [(name, NO_OP, NO_OP) for name in self.operations]


@st.composite
def cases(
    draw: st.DrawFn,
    operations: Sequence[str],
    together: bool = False,
    dtypes: Sequence[torch.dtype] = tuple(DTYPES),
    ops: Sequence[str] = tuple(REDUCE_OPS),
    sizes: st.SearchStrategy[int] = SMALL_SIZES,
    members: st.SearchStrategy[frozenset[int] | None] = MEMBERS,
    layouts: Sequence[str] = LAYOUTS,
) -> Case:
    """One example of ``operations``: one of them drawn, or all of them at once with ``together`` (the
    decompositions compared with each other), with a dtype and op every drawn operation supports here."""
    if together:
        chosen = tuple(operations)
    else:
        available = [name for name in operations if supported_cells([name], dtypes, ops)]
        if not available:
            assume(False)  # not reached: the conftest skips a test none of whose operations is supported
        chosen = (draw(sampled(tuple(available))),)
    cells = supported_cells(chosen, dtypes, ops)
    assume(cells)
    dtype, op = draw(sampled(tuple(cells)))
    return Case(
        operations=chosen,
        dtype=dtype,
        op=op,
        size=draw(sizes),
        layout=draw(sampled(tuple(layouts))),
        members=draw(members),
        root=draw(st.integers(0, MAX_RANKS - 1)),
        values=draw(VALUES),
    )


@functools.cache
def sampled(choices: tuple[object, ...]) -> st.SearchStrategy[object]:
    """``st.sampled_from(choices)``, one strategy per tuple: a strategy made afresh in every draw is
    validated afresh, which cost pytest's process more than the draw."""
    return st.sampled_from(choices)


SWEEP_SIZE = 97  # a prime: no world size divides it
TIERS = (1 << 16, 1 << 20)


def every_cell(operation: str | None = None) -> st.SearchStrategy[list[Case]]:
    """Every cell of ``operation`` (a backend call; by default the running test's ``algorithm``) the probe
    found supported, as one sweep (``examples.sweep``): each (dtype, reduce op) at SWEEP_SIZE elements
    across the dtype's whole range (``Values("spread")``: from its subnormals to the top, exact, in one
    call: a gloo call at 8 ranks on 2 cores costs 13 to 21 ms, the sweep's cost); each cell again at 64 Ki
    elements, at a scale turning with the run (where ``tiers_at`` says); and at 1 Mi, every cell where the
    machine holds them (``tiers``: each rank a core or device of its own), else one (where ``tiers_at``
    says). Over the whole world, each cell with its own root. What rotates turns with the run
    (``rotation.turn``): another each run and at each world size, the same for a seed
    (``--hypothesis-seed``).

    Why every cell at 64 Ki and, on a small machine, one at 1 Mi: the 64 Ki examples of every cell cost a
    sweep little more than one dtype's did, while a 1 Mi example, mostly drawing and checking its inputs,
    costs several times its call, and where ranks share cores every cell at 1 Mi would cost the run several
    times its sweeps (docs/measurements/conformance-suite.md)."""
    return st.builds(rotation.turn).map(lambda turn: _every_cell(operation, turn))


def _every_cell(operation: str | None, turn: int) -> list[Case]:
    name = registry.get(item_parameter("algorithm")).name if operation is None else operation
    cells = supported_cells([name], DTYPES, REDUCE_OPS)

    def case(i: int, dtype: torch.dtype, op: str, size: int, values: Values) -> Case:
        return Case((name,), dtype, op, size, "contiguous", None, i % MAX_RANKS, values)

    sweep = [case(i, *cell, SWEEP_SIZE, Values("spread")) for i, cell in enumerate(cells)]
    whole = caps.active().whole_large_tier
    if not (whole or tiers_at(item_parameter("world_size"), item_world_sizes())):
        return sweep
    for i, cell in enumerate(cells):  # each at a scale of its own, turning with the run
        scale = (turn + i) % (2 * SCALE + 1) - SCALE
        sweep.append(case(turn + i, *cell, TIERS[0], Values("full", scale)))
    for i in range(len(cells) if whole else min(1, len(cells))):  # from the cell the run turns to
        cell = cells[(turn + i) % len(cells)]
        sweep.append(case(turn + i, *cell, TIERS[1], Values("full", (turn + i) % SCALE)))
    return sweep


def tiers_at(world_size: int, sizes: Sequence[int]) -> bool:
    """Whether the 64 Ki and 1 Mi tiers run at ``world_size`` in a run at ``sizes``: at up to 4 ranks, and at
    the largest, where a message splits into the most chunks. Between them they would cost most of a long
    run on a small machine (at 8 ranks on 2 cores a 1 Mi call takes 1 to 2 s); the sweep of every cell at
    97 elements runs at every world size."""
    return world_size <= 4 or world_size >= max(sizes, default=world_size)


def large() -> settings:
    """The settings of a large-message test: a tenth of the profile's batches, 3 at least."""
    return settings(max_examples=max(3, settings().max_examples // 10))


def registered(operation: str) -> list[object]:
    """Every algorithm registered for ``operation``, as the values of a test's ``algorithm`` parameter: each
    its own test (its own examples, its id), N/A where the backend lacks what it is made of."""
    return [
        pytest.param(a.name, marks=pytest.mark.needs(a.name), id=a.name)
        for a in registry.algorithms(operation)
    ]


@st.composite
def of_the_algorithm(
    draw: st.DrawFn, strategy: Callable[..., st.SearchStrategy[Case]], **kwargs: object
) -> Case:
    """A case of ``strategy`` for the algorithm the running test is parametrized with."""
    settled = tuple((name, tuple(v) if isinstance(v, list) else v) for name, v in sorted(kwargs.items()))
    return draw(_strategy_for(strategy, item_parameter("algorithm"), settled))


@functools.cache
def _strategy_for(
    strategy: Callable[..., st.SearchStrategy[Case]], algorithm: str, kwargs: tuple[tuple[str, object], ...]
) -> st.SearchStrategy[Case]:
    """One strategy per algorithm and arguments, as ``sampled``: one made afresh in every draw was
    validated afresh (in a profile of pytest's process, 3.2 s of a case's draws became 2.7 s)."""
    return strategy([algorithm], **dict(kwargs))


def reductions(operations: Sequence[str] = ("all_reduce",), **kwargs: object) -> st.SearchStrategy[Case]:
    return cases(operations, **kwargs)  # type: ignore[arg-type]


def movements(operations: Sequence[str], **kwargs: object) -> st.SearchStrategy[Case]:
    return cases(operations, ops=(NO_OP,), layouts=kwargs.pop("layouts", DENSE), **kwargs)  # type: ignore[arg-type]


def group_of(pg, members: frozenset[int] | None) -> tuple[object | None, list[int]]:
    """(group, its global ranks) for a drawn subgroup; group is None on ranks outside it.

    Every rank calls this, members or not: creating a group is collective over the world.
    """
    if members is None:
        return pg.group, list(range(pg.world_size))
    ranks = sorted({m % pg.world_size for m in members})
    examples.ran_in(f"the group of global ranks {ranks} of {pg.world_size}")
    return pg.new_group(ranks), ranks


def laid_out(tensor: torch.Tensor, layout: str, device: torch.device) -> torch.Tensor:
    """The same values in the drawn layout: contiguous, every other element of a buffer twice the size
    (strided), or a contiguous view one element into its storage (offset). The rest of the buffer holds
    the values' complement (``complement``), which ``assert_moved`` and ``assert_written_within`` find
    changed where a call writes outside the view."""
    n = tensor.numel()
    if layout == "contiguous":
        view = torch.empty(n, dtype=tensor.dtype, device=device)
    else:
        buffer = torch.empty(n * 2 + 1, dtype=tensor.dtype, device=device)
        view = buffer[1 : 1 + n] if layout == "offset" else buffer[: n * 2 : 2]
        around = (buffer[:1], buffer[1 + n :]) if layout == "offset" else (buffer[1::2], buffer[n * 2 :])
    if tensor.dtype == torch.bool:  # byte for byte: a bool copy would make the sentinel's 0xFF a 1
        view.view(torch.uint8).copy_(tensor.reshape(-1).view(torch.uint8))
    else:
        view.copy_(tensor.reshape(-1))
    if layout == "contiguous":
        return view.view(tensor.shape)
    flipped = complement(tensor.reshape(-1)) if n else sentinel(1, tensor.dtype, "cpu")
    for region in around:
        region.copy_(flipped[: region.numel()])
    return placed(view if layout == "strided" else view.view(tensor.shape), around)


def complement(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bits inverted (a bool negated), contiguous: what fills a buffer around a view. It differs
    between ranks as their inputs do, so a reduction or a receive that spills into it changes it (the
    sentinel would not: NaN and 0 reduce to themselves), and it is no value the view holds, so a read from
    the wrong place gets a wrong value."""
    if tensor.dtype == torch.bool:
        return ~tensor.contiguous()
    flipped = tensor.contiguous().clone()
    flipped.view(torch.uint8).bitwise_not_()
    return flipped


def assert_unchanged(tensor: torch.Tensor, before: torch.Tensor, what: str) -> None:
    """A tensor a call only reads (an out-of-place input, a sent payload) still holds ``before``'s bits,
    and nothing around it was written: a backend that stages its work in its input, or reuses a payload
    once sent, corrupts what the caller still holds (a tensor parallel shard, the parameters FSDP gathers
    from)."""
    assert_moved(tensor, before, f"{what} (which the call must only read)")


def sentinel(shape: int | Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output buffer filled with what no input holds: NaN for floating dtypes, 0 for integers
    (rank_input never draws either), so an element the backend never wrote cannot pass for a received one.
    Every bool is drawn: its sentinel is the byte 0xFF, which no bool a backend writes holds (``_bits``
    compares bytes). Its storage goes on for GUARD_BYTES past its end, which every check of it compares
    (``placed``): a call that writes its output in whole vectors, past the end, fails there."""
    size = (shape,) if isinstance(shape, int) else tuple(shape)
    count = math.prod(size)
    flat = count + -(-GUARD_BYTES // dtype.itemsize)
    if dtype == torch.bool:
        buffer = torch.full((flat,), UNWRITTEN_BOOL, dtype=torch.uint8, device=device).view(torch.bool)
    elif dtype.is_floating_point or dtype.is_complex:
        # filled in float32 and converted: older torch has no fill kernel for float8
        buffer = torch.full((flat,), float("nan"), device=device).to(dtype)
    else:
        buffer = torch.zeros(flat, dtype=dtype, device=device)
    buffer[count:].view(torch.uint8).fill_(GUARD_BYTE)
    return placed(buffer[:count].view(size), [buffer[count:]])


def assert_moved(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """``actual`` holds exactly ``expected``'s bits; the message counts elements never written (still the
    sentinel) apart from wrong ones, and names the first bad element. Nothing may be written around
    ``actual`` either (``assert_written_within``)."""
    _assert_same_bits(actual, expected, what)
    assert_written_within(actual, what)


def _assert_same_bits(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise AssertionError(
            f"{what}: got {actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}"
        )
    if not expected.numel() or torch.equal(_words(actual), _words(expected)):
        return
    got, want = _bits(actual), _bits(expected)
    bad = (got != want).any(1)
    if bad.any():
        never = int(((got == _bits(sentinel(actual.shape, actual.dtype, actual.device))).all(1) & bad).sum())
        i = int(bad.nonzero()[0])
        flat_a, flat_e = actual.reshape(-1), expected.reshape(-1)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements wrong ({never} never written); first at "
            f"{i}: got {flat_a[i].item()!r}, expected {flat_e[i].item()!r}"
        )


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """One row of raw bytes per element: exact for every dtype, float8 and NaN included."""
    return _raw(tensor).view(torch.uint8).reshape(tensor.numel(), -1)


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes as integers of the element's width (two int64 for a complex128), equal exactly where
    the bytes are: compared in one pass, where rows of bytes compared and reduced cost 6 ms at 1 Mi
    float32 elements, most of a moved example's check."""
    words = {1: torch.uint8, 2: torch.int16, 4: torch.int32}.get(tensor.element_size(), torch.int64)
    return _raw(tensor).view(words)
