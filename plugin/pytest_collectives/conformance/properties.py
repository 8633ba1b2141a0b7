"""The properties an implementation of an operation must have, one function each, called on every rank by
a test body with the drawn case: the suites' tests and a user's own test call the same ones.

Each takes the implementation in its registry contract (pytest_collectives.algorithms.registry.CONTRACTS),
builds every member's input from the test's shared seed, runs it on the drawn subgroup and checks this
rank's result against the exact reference, raising AssertionError with what differs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from pytest_collectives.algorithms.reference import (
    assert_gemm_sum_close,
    assert_reduced_close,
    assert_written_within,
    rank_input,
    reduce_op,
)
from pytest_collectives.conformance.cases import (
    Case,
    assert_moved,
    assert_unchanged,
    group_of,
    laid_out,
    sentinel,
)
from pytest_collectives.conformance.inlining import NotInlinable, inlined
from pytest_collectives.conformance.standalone import (
    CONTRACT_LINES,
    REDUCING,
    TORCH_CALLS,
    FailingCall,
    algorithm_script,
    backend_modules,
    group_call_script,
)
from pytest_collectives.execution.reproductions import WORDS, write_reproduction


def name_of(implementation: Callable[..., Any]) -> str:
    """A registered algorithm's name (with its parameters), or a function's."""
    return getattr(implementation, "name", None) or getattr(implementation, "__name__", repr(implementation))


def members(pg: Any, case: Case) -> tuple[Any, list[int], int, int] | None:
    """(group, its global ranks, its size, this rank's group rank) of the drawn subgroup, or None on a
    rank outside it. Every rank calls this: creating a group is collective over the world."""
    group, ranks = group_of(pg, case.members)
    if group is None:
        return None
    return group, ranks, len(ranks), ranks.index(pg.rank)


def run_all_reduce(
    pg: Any, all_reduce: Callable[..., torch.Tensor], case: Case
) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
    """``all_reduce(tensor, op, group=)`` on the drawn case, in the drawn layout: (this rank's result,
    every member's input), or None on a rank outside the drawn subgroup."""
    found = members(pg, case)
    if found is None:
        return None
    group, ranks, n, me = found
    mine = case.input(pg.seed, pg.rank, case.size, n)
    tensor = laid_out(mine, case.layout, pg.device)
    result = all_reduce(tensor, reduce_op(case.op), group=group)
    assert result is tensor, f"{name_of(all_reduce)} must work in place and return its tensor"
    return result, everyone(pg, case, ranks, mine)


def everyone(pg: Any, case: Case, ranks: list[int], mine: torch.Tensor) -> list[torch.Tensor]:
    """Every member's input, this rank's ``mine`` among them: taken after the call, which every member
    entered with its own input drawn, so that a large one is read from the group's copy (shared_inputs)."""
    return [mine if r == pg.rank else case.input(pg.seed, r, case.size, len(ranks)) for r in ranks]


# The registered implementations that are the backend's own call, by name: torch's call each makes, which
# a failure's standalone reproduction makes again (the others are algorithms: their code is copied into
# theirs).
BACKEND_OWN = {
    "all_reduce": "all_reduce",
    "reduce": "reduce",
    "broadcast": "broadcast",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "all_gather_single": "all_gather_into_tensor",
    "all_to_all_single": "all_to_all_single",
    "gather": "gather",
    "scatter": "scatter",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
}


# The words of each form a check draws beside the plain one, by the check's argument that draws it: a
# script is written for each form (and combination) its call has lines for.
FORMS = {"in_place": "in place", "stacked": "stacked", "splits": "uneven"}


def _reproducible(check: Callable[..., None]) -> Callable[..., None]:
    """``check(pg, implementation, case, *form)``, whose failure names a standalone reproduction of the
    call: the backend's own, or a registered algorithm's with its code, in the form drawn (each argument
    after ``case`` that is set names one: FORMS); a form no script is written for says so."""
    drawn = list(inspect.signature(check).parameters)[3:]

    @functools.wraps(check)
    def checked(pg: Any, implementation: Callable[..., Any], case: Case, *form: Any, **named: Any) -> None:
        try:
            check(pg, implementation, case, *form, **named)
        except AssertionError as exc:
            name = name_of(implementation)
            if name not in BACKEND_OWN and getattr(implementation, "operation", None) is None:
                raise  # a bare function, as a user's own test may hand one: not this project's to copy
            values = {**dict(zip(drawn, form, strict=False)), **named}
            words = " ".join(FORMS.get(key, key) for key, value in values.items() if value)
            said = _reproduction(pg, implementation, case, str(exc), words, splits=values.get("splits"))
            raise AssertionError(f"{exc}\n{said}") from None

    return checked


@_reproducible
def all_reduce_matches_reference(pg: Any, all_reduce: Callable[..., torch.Tensor], case: Case) -> None:
    """In place, every element the reduction of the members' inputs: exact, or within the stated bound."""
    out = run_all_reduce(pg, all_reduce, case)
    if out is not None:
        assert_reduced_close(*out, case.op, case.values)


# The contracts whose checks hand the implementation a tensor in the drawn layout (the others hand it dense
# tensors), and those that work in place, their output in that layout too.
_LAID = ("all_reduce", "reduce", "broadcast", "all_to_all", "gather", "scatter", "all_gather_list",
         "reduce_scatter_list")
_IN_PLACE = ("all_reduce", "reduce", "broadcast")


def _reproduction(
    pg: Any,
    implementation: Callable[..., Any],
    case: Case,
    failure: str,
    form: str,
    given: Callable[[int, int], torch.Tensor] | None = None,
    rows: int = 0,
    splits: list[list[int]] | None = None,
) -> str:
    """``implementation``'s call of ``case`` in ``form`` (FORMS' words, "" for the plain one) written as
    a file that needs only torch and the backend (an algorithm's code copied in): the line naming it. A
    GEMM reduce-scatter hands its inputs flat (``given(r, 0)``: rank r's A, ``given(r, 1)``: its B) and
    its ``rows``; an uneven all-to-all its drawn ``splits``."""
    _, ranks = group_of(pg, case.members)
    n, size = len(ranks), case.size
    name = name_of(implementation)
    torch_call = BACKEND_OWN.get(name)
    contract = TORCH_CALLS[torch_call][0] if torch_call else implementation.operation
    if " ".join(filter(None, (contract, form))) not in CONTRACT_LINES:
        return f"{WORDS}none written (the {form} form of {torch_call or name} is not written as a script)"
    sizes = None if splits is None else [row[:n] for row in splits[:n]]  # folded onto the group, as drawn
    if given is not None:
        shape = (-1,)  # each read flat, and shaped by the script
    elif sizes is not None:
        shape = (-1,)
        given = lambda r, p: case.part(pg.seed, r, p, sizes[ranks.index(r)][p], n)  # noqa: E731
    elif contract in ("reduce_scatter", "reduce_scatter_list", "all_to_all", "scatter"):  # per (rank, peer)
        shape = (size // n if contract == "all_to_all" else size,)
        given = lambda r, p: case.part(pg.seed, r, p, shape[0], n)  # noqa: E731
    else:
        shape, given = (size,), lambda r, _: case.input(pg.seed, r, size, n)  # noqa: E731
    # the layout the backend saw: all_reduce_direct reduces a dense copy (an algorithm's script copies the
    # code that makes one)
    laid = contract in _LAID and (torch_call != "all_reduce")
    inputs = case.layout if laid else "contiguous"
    outputs = inputs if contract in _IN_PLACE else "contiguous"
    call = FailingCall(
        pg.backend, pg.world_size, torch_call or contract, inputs, outputs, case.dtype, shape, given=given,
        device=pg.device.type, modules=backend_modules(pg.backend), members=tuple(ranks), root=case.root % n,
    )  # fmt: skip
    op = case.op if contract in REDUCING else ""
    dtype = str(case.dtype).removeprefix("torch.")
    layout = "" if inputs == "contiguous" else inputs  # named where it is not the plain one
    named = " ".join(filter(None, (name, op, layout, form)))
    what = f"{rows} rows a rank" if rows else f"{size} {dtype} elements"
    where = f"the {named} of {what} on ranks {ranks}"
    found, written_from = failure.splitlines()[0], f"{where} of {pg.world_size}"
    if torch_call is not None:
        text = group_call_script(call, op, found, written_from, form, sizes)
    else:
        try:
            code = inlined(implementation.function)
        except NotInlinable as exc:
            return f"{WORDS}none written ({exc})"
        params = dict(implementation.params)
        text = algorithm_script(call, name, code, params, op, found, written_from, form, rows, sizes)
    members = "_".join(map(str, ranks))
    label = "-".join(filter(None, (pg.backend, torch_call or name, op, layout, form, dtype)))
    scale = f"{rows}rows" if rows else size
    return write_reproduction(pg, f"{label}-{scale}-ranks{members}-ws{pg.world_size}", text)


@_reproducible
def reduce_scatter_matches_reference(
    pg: Any, reduce_scatter: Callable[..., torch.Tensor], case: Case, in_place: bool
) -> None:
    """``reduce_scatter(output, input, op, group=)``: this rank's output is its block of the reduction of
    the members' inputs (``case.size`` elements a block). In place, the output is this rank's own block of
    the input, which NCCL and gloo both allow; out of place it starts as a sentinel, and the input is
    left as it was."""
    found = members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    chunk = case.size
    source = torch.cat([case.part(pg.seed, pg.rank, j, chunk, n) for j in range(n)]).to(pg.device)
    output = source.view(n, -1)[me] if in_place else sentinel(chunk, case.dtype, pg.device)
    kept = None if in_place else source.clone()
    result = reduce_scatter(output, source, reduce_op(case.op), group=group)
    assert result is output, f"{name_of(reduce_scatter)} must return its output"
    assert_reduced_close(output, [case.part(pg.seed, r, me, chunk, n) for r in ranks], case.op, case.values)
    if kept is not None:
        assert_unchanged(source, kept, f"{name_of(reduce_scatter)}'s input on group rank {me}")


def gemm_reduce_scatter_matches_reference(
    pg: Any,
    gemm_reduce_scatter: Callable[..., torch.Tensor],
    case: Case,
    rows_per_rank: int,
    inner: int,
    cols: int,
) -> None:
    """``gemm_reduce_scatter(a, b, group=)`` over the world is this rank's row block of sum_r A_r @ B_r,
    each rank with its own inner dimension (``inner + rank``); A and B are left as they were."""
    n, me, dtype = pg.world_size, pg.rank, case.dtype
    m = rows_per_rank * n
    a = [rank_input(pg.seed, r, (m, inner + r), dtype) for r in range(n)]
    b = [rank_input(pg.seed + 1, r, (inner + r, cols), dtype) for r in range(n)]
    mine_a, mine_b = a[me].to(pg.device, copy=True), b[me].to(pg.device, copy=True)
    result = gemm_reduce_scatter(mine_a, mine_b, group=pg.group)
    rows = slice(me * rows_per_rank, (me + 1) * rows_per_rank)
    try:
        assert_gemm_sum_close(result, [x[rows] for x in a], b)
    except AssertionError as exc:
        if getattr(gemm_reduce_scatter, "function", None) is None:
            raise  # a bare function, as a user's own test may hand one: not this project's to copy
        given = lambda r, p: (a[r] if p == 0 else b[r]).flatten()  # noqa: E731
        said = _reproduction(pg, gemm_reduce_scatter, case, str(exc), "", given, rows_per_rank)
        raise AssertionError(f"{exc}\n{said}") from None
    assert_unchanged(mine_a, a[me], f"{name_of(gemm_reduce_scatter)}'s A on rank {me}")
    assert_unchanged(mine_b, b[me], f"{name_of(gemm_reduce_scatter)}'s B on rank {me}")


@_reproducible
def all_gather_matches_reference(
    pg: Any, all_gather: Callable[..., torch.Tensor], case: Case, in_place: bool, stacked: bool = False
) -> None:
    """``all_gather(output, input, group=)``: every member's output holds the members' inputs in group-rank
    order, into a flat ``(n * size)`` output or, ``stacked``, an ``(n, size)`` one. In place, the input is
    this rank's own block of the output; out of place the output starts as a sentinel, and the input is
    left as it was."""
    found = members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    drawn = case.input(pg.seed, pg.rank, case.size, n)
    output = sentinel((n, case.size) if stacked else n * case.size, case.dtype, pg.device)
    mine = output.view(n, -1)[me] if in_place else torch.empty(case.size, dtype=case.dtype, device=pg.device)
    mine.copy_(drawn)
    result = all_gather(output, mine, group=group)
    assert result is output, f"{name_of(all_gather)} must return its output"
    inputs = everyone(pg, case, ranks, drawn)
    expected = torch.stack(inputs) if stacked else torch.cat(inputs)
    what = f"{name_of(all_gather)} of {n} x {case.size} {case.dtype} on group rank {me}, stacked={stacked}"
    assert_moved(output, expected, what)
    if not in_place:
        assert_unchanged(mine, drawn, f"{name_of(all_gather)}'s input on group rank {me}")


@_reproducible
def all_to_all_matches_reference(
    pg: Any, all_to_all: Callable[..., torch.Tensor], case: Case, splits: list[list[int]] | None
) -> None:
    """``all_to_all(output, input, output_splits, input_splits, group=)``: group rank i sends
    ``splits[i][j]`` elements to group rank j (the drawn matrix folded onto the group; zeros included),
    or, with no splits, ``case.size // n`` to each rank with None for the split lists. Each rank's output
    is what every member sent it, in group-rank order, and its input is left as it was."""
    found = members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    even = splits is None
    sizes = [[case.size // n] * n for _ in range(n)] if even else [row[:n] for row in splits[:n]]
    sent = torch.cat([case.part(pg.seed, me, j, sizes[me][j], n) for j in range(n)])
    source = laid_out(sent, case.layout, pg.device)
    column = [sizes[i][me] for i in range(n)]
    output = sentinel(sum(column), case.dtype, pg.device)
    result = all_to_all(output, source, None if even else column, None if even else sizes[me], group=group)
    assert result is output, f"{name_of(all_to_all)} must return its output"
    received = [case.part(pg.seed, i, me, sizes[i][me], n) for i in range(n)]  # after: the senders' copies
    assert_moved(output, torch.cat(received), f"{name_of(all_to_all)} on group rank {me}, splits {sizes}")
    assert_unchanged(source, sent, f"{name_of(all_to_all)}'s input on group rank {me}")


def check_splits(output_splits: Sequence[int], input_splits: Sequence[int], group: Any = None) -> None:
    """Before an uneven all_to_all: what each rank sends each peer must be what that peer expects from it
    (every rank's output splits the column of the peers' input splits). Raises ValueError on every rank,
    naming the first pair that disagrees: a mismatch handed to the backend is an error on some ranks and a
    hang on the others (gloo), or corrupt data."""
    n = dist.get_world_size(group)
    everyone: list[Any] = [None] * n  # gathered first: a rank that raised alone would leave the rest waiting
    dist.all_gather_object(everyone, (list(input_splits), list(output_splits)), group=group)
    for i, (sends, expects) in enumerate(everyone):
        if len(sends) != n or len(expects) != n:
            raise ValueError(
                f"all_to_all splits of group rank {i}: input {sends}, output {expects}; each needs one entry "
                f"per rank of the {n}-rank group"
            )
    for i, (sends, _) in enumerate(everyone):
        for j, (_, expects) in enumerate(everyone):
            if sends[j] != expects[i]:
                raise ValueError(
                    f"all_to_all splits disagree: group rank {i} sends {sends[j]} element(s) to group rank "
                    f"{j}, which expects {expects[i]}; each rank's output_splits must be the column of the "
                    "peers' input_splits"
                )


@_reproducible
def broadcast_matches_reference(pg: Any, broadcast: Callable[..., torch.Tensor], case: Case) -> None:
    """``broadcast(tensor, root, group=)``: every member ends with group rank ``case.root % n``'s tensor,
    in place; the others start as a sentinel, so an element never received is counted as such."""
    found = members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    root = case.root % n
    at_root = me == root
    start = case.input(pg.seed, pg.rank, case.size, n) if at_root else sentinel(case.size, case.dtype, "cpu")
    tensor = laid_out(start, case.layout, pg.device)
    result = broadcast(tensor, root, group=group)
    assert result is tensor, f"{name_of(broadcast)} must work in place and return its tensor"
    sent = start if at_root else case.input(pg.seed, ranks[root], case.size, n)  # after: the root's copy
    assert_moved(tensor, sent, f"{name_of(broadcast)} from group rank {root} seen on group rank {me}")


@_reproducible
def reduce_matches_reference(pg: Any, reduce: Callable[..., torch.Tensor], case: Case) -> None:
    """``reduce(tensor, root, op, group=)``: group rank ``case.root % n`` holds the reduction of the
    members' inputs; other ranks' buffers are unspecified (torch documents only the root's), but no rank's
    call writes outside its tensor."""
    found = members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    root = case.root % n
    mine = case.input(pg.seed, pg.rank, case.size, n)
    tensor = laid_out(mine, case.layout, pg.device)
    result = reduce(tensor, root, reduce_op(case.op), group=group)
    assert result is tensor, f"{name_of(reduce)} must work in place and return its tensor"
    if me == root:
        assert_reduced_close(tensor, everyone(pg, case, ranks, mine), case.op, case.values)
    else:
        assert_written_within(tensor, f"{name_of(reduce)} to group rank {root} on group rank {me}")


@_reproducible
def gather_matches_reference(pg: Any, gather: Callable[..., Any], case: Case) -> None:
    """``gather(tensor, gather_list, dst=, group=)``, torch's: group rank ``case.root % n``'s list holds
    every member's input in group-rank order (a permutation is caught), each input left as it was."""
    found = members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    root = case.root % n
    inputs = [case.input(pg.seed, r, case.size, n) for r in ranks]
    outputs = [sentinel(case.size, case.dtype, pg.device) for _ in range(n)] if me == root else None
    mine = laid_out(inputs[me], case.layout, pg.device)
    gather(mine, outputs, dst=ranks[root], group=group)
    for i, out in enumerate(outputs or []):
        assert_moved(out, inputs[i], f"gather at group rank {root}: group rank {i}'s part")
    assert_unchanged(mine, inputs[me], f"gather's input on group rank {me}")


@_reproducible
def scatter_matches_reference(pg: Any, scatter: Callable[..., Any], case: Case) -> None:
    """``scatter(tensor, scatter_list, src=, group=)``, torch's: each member receives its own part of
    group rank ``case.root % n``'s list, and the root's parts are left as they were."""
    found = members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    root = case.root % n
    parts = [case.part(pg.seed, ranks[root], i, case.size, n) for i in range(n)]
    sources = [laid_out(p, case.layout, pg.device) for p in parts] if me == root else None
    output = sentinel(case.size, case.dtype, pg.device)
    scatter(output, sources, src=ranks[root], group=group)
    assert_moved(output, parts[me], f"scatter from group rank {root} on group rank {me}")
    for i, source in enumerate(sources or []):
        assert_unchanged(source, parts[i], f"scatter's part for group rank {i} at group rank {root}")


@_reproducible
def all_gather_list_matches_reference(pg: Any, all_gather: Callable[..., Any], case: Case) -> None:
    """``all_gather(tensor_list, tensor, group=)``, torch's list form: each member's list holds every
    member's input in group-rank order, its own input left as it was."""
    found = members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    inputs = [case.input(pg.seed, r, case.size, n) for r in ranks]
    outputs = [sentinel(case.size, case.dtype, pg.device) for _ in range(n)]
    mine = laid_out(inputs[me], case.layout, pg.device)
    all_gather(outputs, mine, group=group)
    for i, (out, want) in enumerate(zip(outputs, inputs, strict=True)):
        assert_moved(out, want, f"{name_of(all_gather)}: group rank {i}'s part on group rank {me}")
    assert_unchanged(mine, inputs[me], f"{name_of(all_gather)}'s input on group rank {me}")


@_reproducible
def reduce_scatter_list_matches_reference(pg: Any, reduce_scatter: Callable[..., Any], case: Case) -> None:
    """``reduce_scatter(output, input_list, op=, group=)``, torch's list form: each member's output is the
    reduction of every member's part for it, and the parts are left as they were."""
    found = members(pg, case)
    if found is None:
        return
    group, ranks, n, me = found
    output = sentinel(case.size, case.dtype, pg.device)
    parts = [case.part(pg.seed, pg.rank, j, case.size, n) for j in range(n)]
    mine = [laid_out(part, case.layout, pg.device) for part in parts]
    reduce_scatter(output, mine, op=reduce_op(case.op), group=group)
    expected = [case.part(pg.seed, r, me, case.size, n) for r in ranks]
    assert_reduced_close(output, expected, case.op, case.values)
    for j, (kept, part) in enumerate(zip(mine, parts, strict=True)):
        what = f"{name_of(reduce_scatter)}'s input for group rank {j} on group rank {me}"
        assert_unchanged(kept, part, what)


# The check of each contract that takes (pg, implementation, case) alone: out of place where the contract
# allows either, even splits (the suites' tests draw the other variants).
_CHECKS: dict[str, Callable[[Any, Callable[..., torch.Tensor], Case], None]] = {
    "all_reduce": all_reduce_matches_reference,
    "reduce_scatter": lambda pg, fn, case: reduce_scatter_matches_reference(pg, fn, case, in_place=False),
    "all_gather": lambda pg, fn, case: all_gather_matches_reference(pg, fn, case, in_place=False),
    "all_to_all": lambda pg, fn, case: all_to_all_matches_reference(pg, fn, case, None),
    "broadcast": broadcast_matches_reference,
    "reduce": reduce_matches_reference,
}


def matches_reference(
    pg: Any, operation: str, implementation: Callable[..., torch.Tensor], case: Case
) -> None:
    """The check of ``operation``'s contract on ``case``: a benchmark's one check of its result after timing
    (nccl-tests' -c), whatever it measured."""
    if operation not in _CHECKS:
        raise ValueError(f"no one-case check for {operation!r}; there is for {', '.join(_CHECKS)}")
    _CHECKS[operation](pg, implementation, case)
