"""A failing call written as a standalone reproduction: a Python file that imports only torch (and the
backend's own module where it is third-party), starts the world size's ranks on the backend by name, makes
the call exactly as the test did, with the failing example's inputs written inline, and prints on each rank
what came back against what was expected, exiting 1 while the bug is there and 0 once fixed. What a vendor
attaches to a bug report: it needs neither this plugin nor pytest nor hypothesis.
"""

from __future__ import annotations

import base64
import ctypes
import dataclasses
import math
import textwrap
import zlib
from collections.abc import Callable
from typing import Any

import torch

from pytest_collectives.algorithms.reference import PREMUL_FACTOR
from pytest_collectives.conformance.inlining import Inlined, inlined

# Each call of the layout test as torch documents it, in the script's words: ``given(r, p)`` is what rank r
# sends rank p, ``laid`` puts a tensor in the inputs' layout and ``unwritten`` makes an output in the
# outputs' layout; each returns what to check on this rank: (what, the tensor that came back, what it must
# hold: ``exactly`` a tensor moved, or the ``total`` of a reduction with its rounding slack).
CALL_LINES = {
    "all_reduce": """
    tensor = laid(given(me))
    dist.all_reduce(tensor)
    return [("all_reduce", tensor, total([given(r) for r in range(WORLD_SIZE)]))]""",
    "reduce": """
    tensor = laid(given(me))
    dist.reduce(tensor, dst=ROOT)
    return [("reduce", tensor, total([given(r) for r in range(WORLD_SIZE)]))] if me == ROOT else []""",
    "broadcast": """
    tensor = laid(given(ROOT)) if me == ROOT else unwritten(SHAPE)
    dist.broadcast(tensor, src=ROOT)
    return [(f"broadcast from rank {ROOT}", tensor, exactly(given(ROOT)))] if me != ROOT else []""",
    "all_gather": """
    outputs = [unwritten(SHAPE) for _ in range(WORLD_SIZE)]
    dist.all_gather(outputs, laid(given(me)))
    return [(f"all_gather: rank {r}'s part", outputs[r], exactly(given(r))) for r in range(WORLD_SIZE)]""",
    "gather": """
    outputs = [unwritten(SHAPE) for _ in range(WORLD_SIZE)] if me == ROOT else None
    dist.gather(laid(given(me)), outputs, dst=ROOT)
    if me != ROOT:
        return []
    return [(f"gather: rank {r}'s part", outputs[r], exactly(given(r))) for r in range(WORLD_SIZE)]""",
    "scatter": """
    output = unwritten(SHAPE)
    parts = [laid(given(ROOT, p)) for p in range(WORLD_SIZE)] if me == ROOT else None
    dist.scatter(output, parts, src=ROOT)
    return [(f"scatter from rank {ROOT}", output, exactly(given(ROOT, me)))]""",
    "reduce_scatter": """
    output = unwritten(SHAPE)
    dist.reduce_scatter(output, [laid(given(me, p)) for p in range(WORLD_SIZE)])
    return [("reduce_scatter", output, total([given(r, me) for r in range(WORLD_SIZE)]))]""",
    "all_to_all": """
    outputs = [unwritten(SHAPE) for _ in range(WORLD_SIZE)]
    dist.all_to_all(outputs, [laid(given(me, p)) for p in range(WORLD_SIZE)])
    return [(f"all_to_all: from rank {r}", outputs[r], exactly(given(r, me))) for r in range(WORLD_SIZE)]""",
    "all_gather_into_tensor": """
    output = unwritten((WORLD_SIZE * SHAPE[0], *SHAPE[1:]))
    dist.all_gather_into_tensor(output, laid(given(me)))
    return [("all_gather_into_tensor", output, exactly(torch.cat([given(r) for r in range(WORLD_SIZE)])))]""",
    "reduce_scatter_tensor": """
    output = unwritten(SHAPE)
    dist.reduce_scatter_tensor(output, laid(torch.cat([given(me, p) for p in range(WORLD_SIZE)])))
    return [("reduce_scatter_tensor", output, total([given(r, me) for r in range(WORLD_SIZE)]))]""",
    "all_to_all_single": """
    output = unwritten((WORLD_SIZE * SHAPE[0], *SHAPE[1:]))
    dist.all_to_all_single(output, laid(torch.cat([given(me, p) for p in range(WORLD_SIZE)])))
    return [("all_to_all_single", output, exactly(torch.cat([given(r, me) for r in range(WORLD_SIZE)])))]""",
    "send_recv": """
    source = (me - 1) % WORLD_SIZE
    output = unwritten(SHAPE)
    sending = dist.isend(laid(given(me)), (me + 1) % WORLD_SIZE)  # a ring: every rank sends, then receives
    dist.irecv(output, source).wait()
    sending.wait()
    return [(f"recv from rank {source}", output, exactly(given(source)))]""",
}
INLINE_LIMIT = 8192  # the most input elements, over every rank, a reproduction writes inline
# the most it writes at all: more are packed (compressed, in base64) into the file, so that it still runs
# alone, up to this many; past it, the file draws values of the same dtype, counts and kind from a seeded
# generator (a failure at 1 Mi elements would otherwise give a file of tens of MB)
PACKED_LIMIT = 1 << 15


@dataclasses.dataclass(frozen=True)
class FailingCall:
    """One failing backend call: torch's ``name`` of it (one of the layout test's), its inputs' and
    outputs' layouts, and every (rank, peer) input it takes (``given``: what rank r sends rank p; p is 0
    where a rank sends everyone the same)."""

    backend: str
    world_size: int
    name: str
    inputs_layout: str
    outputs_layout: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    given: Callable[[int, int], torch.Tensor]
    device: str = "cpu"
    modules: tuple[str, ...] = ()  # the backend's own modules, imported before the group starts
    members: tuple[int, ...] = ()  # the group's global ranks, where the call ran on a subgroup
    root: int = -1  # the call's root, where it has one: a rank of its group (the layout test's: the last)


def backend_modules(backend: str) -> tuple[str, ...]:
    """The module that registered ``backend`` (Backend.register_backend), where it is third-party: what a
    reproduction imports before its group starts."""
    import torch.distributed as dist

    plugin = dist.Backend._plugins.get(backend.upper())
    module = getattr(getattr(plugin, "creator_fn", None), "__module__", None)
    return (module,) if module and module != "__main__" else ()


def layout_script(call: FailingCall, found: str, written_from: str) -> str:
    """The standalone reproduction of ``call``: ``found`` is the failure's first line, ``written_from`` the
    test (and seed) it came from."""
    title = f"{call.backend}: {call.name} of {_layouts(call)}, {call.world_size} ranks, {call.dtype}"
    return _script(call, title, CALL_LINES[call.name], found, written_from)


def _script(
    call: FailingCall, title: str, lines: str, found: str, written_from: str, op: str = "",
    code: Inlined | None = None,
) -> str:
    """The file: ``call``'s inputs, layouts and backend, and ``lines``, the body of its ``call(me)`` under
    reduce op ``op``, after ``code`` (an algorithm's, copied in); the inputs written inline (a failure at
    97 elements gives a file read in a minute), packed where they are many, and drawn by a seeded
    generator where they are too many for that."""
    members = call.members or tuple(range(call.world_size))
    peers = range(len(members)) if _takes_peers(call.name) else range(_PARTS.get(call.name, 1))
    # a scatter sends the root's list alone: the others' would make the file world-size times as long
    senders = (members[call.root % len(members)],) if call.name == "scatter" else members
    given = [[call.given(r, p) for p in peers] if r in senders else None for r in range(call.world_size)]
    count = sum(part.numel() for parts in given if parts for part in parts)
    kind = _kind(call.dtype)
    stdlib = _STDLIB
    if count > PACKED_LIMIT:
        counts = [None if ps is None else [part.numel() for part in ps] for ps in given]
        inputs = _GENERATED.format(limit=PACKED_LIMIT, counts=counts, draw=_DRAW[kind])
    elif count > INLINE_LIMIT:
        written, packed = _packed(given)
        inputs, stdlib = _PACKED.format(written=written, packed=packed), (*stdlib, "base64", "zlib")
    else:
        written = _written_out([None if ps is None else [_literal(part) for part in ps] for ps in given])
        inputs = _INLINE.format(written=written)
    stdlib_lines = "".join(f"import {module}\n" for module in sorted(stdlib))
    imports = "".join(f"import {module}  # registers {call.backend}\n" for module in call.modules)
    definitions = ""
    if code is not None:
        known = {*_TEMPLATE.splitlines(), *stdlib_lines.splitlines()}
        imports += "".join(f"{line}\n" for line in code.imports if line not in known)
        definitions = f"# The code that made the failing call: {code.name} and what it calls.\n\n\n"
        definitions += f"{code.code}\n\n\n"
    return _TEMPLATE.format(
        title=title,
        found=textwrap.fill(
            f"Found by the pytest-collectives conformance suite: {found.replace(chr(92), '/')}. Written from "
            f"{written_from}, on torch {torch.__version__}.", 100, break_long_words=False
        ).replace(chr(34) * 3, chr(39) * 3),
        imports=imports,
        backend=call.backend,
        world_size=call.world_size,
        dtype=str(call.dtype),
        shape=tuple(call.shape),
        device=call.device,
        fill=_FILL[kind],
        wide=_WIDE[kind],
        as_bits=str(call.dtype) == "torch.uint64",
        inputs=inputs,
        stdlib=stdlib_lines,
        inputs_layout=call.inputs_layout,
        outputs_layout=call.outputs_layout,
        call=lines,
        premul_factor=PREMUL_FACTOR,
        root=call.root % len(members),
        op_code=_op_code(op),
        definitions=definitions,
    )


def _op_code(op: str) -> str:
    """Reduce op ``op`` as the script names it ("" where the call takes none: SUM, torch's default)."""
    if op == "premul_sum":
        return "dist._make_nccl_premul_sum(PREMUL_FACTOR)"
    return f"dist.ReduceOp.{(op or 'sum').upper()}"


def _written_out(inputs: list[list[list[object]] | None]) -> str:
    """INPUTS as a person reads it: a rank a block, each part's values wrapped within 100 columns."""
    lines = ["["]
    for r, parts in enumerate(inputs):
        if parts is None:
            lines.append(f"    None,  # rank {r}")
            continue
        lines.append(f"    [  # rank {r}")
        for part in parts:
            values = textwrap.wrap(", ".join(map(repr, part)), 100 - 12, break_long_words=False)
            lines += ["        [", *(f"            {line}" for line in values), "        ],"]
        lines.append("    ],")
    return "\n".join([*lines, "]"])


def _layouts(call: FailingCall) -> str:
    article = "an" if call.inputs_layout[0] in "aeiou" else "a"
    if call.inputs_layout == call.outputs_layout:
        return f"{article} {call.inputs_layout} tensor"
    return f"{article} {call.inputs_layout} input into a {call.outputs_layout} output"


def _takes_peers(name: str) -> bool:
    """Whether a rank sends each peer its own part (the inputs are then per (rank, peer))."""
    return name in {"scatter", "reduce_scatter", "all_to_all", "reduce_scatter_tensor", "all_to_all_single"}


_PARTS = {"gemm_reduce_scatter": 2}  # the inputs a rank has where it is not one: a GEMM's A and B


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "float" if dtype.is_floating_point else "int"


# How the conformance checks make the call of each contract (registry.CONTRACTS) on the drawn group, in each
# form they draw beside the plain one (in place, stacked, uneven splits; the drawn reduce op and root):
# {call} is the call, the backend's own (TORCH_CALLS) or a registered algorithm's (ALGORITHM_CALLS, its code
# copied into the script), {name} what it is called; ``given(r, p)`` is what global rank r sends group
# rank p. Each returns what to check on this rank, as CALL_LINES do.
CONTRACT_LINES = {
    "all_reduce": """
    tensor = laid(given(me))
    {call}
    wanted = reduced({op!r}, [given(r) for r in members])
    return [("{name} {op} in the group of ranks {members}", tensor, wanted)]""",
    "reduce": """
    tensor = laid(given(me))
    {call}
    if at != ROOT:
        return []  # torch documents the root's result alone
    wanted = reduced({op!r}, [given(r) for r in members])
    return [(f"{name} {op} to group rank {{ROOT}} in the group of ranks {members}", tensor, wanted)]""",
    "broadcast": """
    tensor = laid(given(me)) if at == ROOT else unwritten(SHAPE)
    {call}
    wanted = exactly(given(members[ROOT]))
    return [(f"{name} from group rank {{ROOT}} in the group of ranks {members}", tensor, wanted)]""",
    "reduce_scatter": """
    output = unwritten(SHAPE)
    kept = torch.cat([given(me, p) for p in range(len(members))])
    source = laid(kept.clone())  # its own copy: laid hands a dense tensor back as it is
    {call}
    wanted = reduced({op!r}, [given(r, at) for r in members])
    return [("{name} {op} in the group of ranks {members}", output, wanted),
            ("its input, after the call", source, exactly(kept))]""",
    "reduce_scatter in place": """
    source = laid(torch.cat([given(me, p) for p in range(len(members))]))
    output = source.view(len(members), -1)[at]  # in place: this rank's own block of the input
    {call}
    wanted = reduced({op!r}, [given(r, at) for r in members])
    return [("{name} {op} in place in the group of ranks {members}", output, wanted)]""",
    "all_gather": """
    output = unwritten((len(members) * SHAPE[0], *SHAPE[1:]))
    mine = laid(given(me))
    {call}
    return [("{name} in the group of ranks {members}", output,
             exactly(torch.cat([given(r) for r in members]))),
            ("its input, after the call", mine, exactly(given(me)))]""",
    "all_gather in place": """
    output = unwritten((len(members) * SHAPE[0], *SHAPE[1:]))
    mine = output.view(len(members), -1)[at]  # in place: this rank's own block of the output
    mine.copy_(given(me))
    {call}
    return [("{name} in place in the group of ranks {members}", output,
             exactly(torch.cat([given(r) for r in members])))]""",
    "all_gather stacked": """
    output = unwritten((len(members), *SHAPE))  # stacked: a row a rank, which torch documents
    mine = given(me)
    {call}
    return [("{name} stacked in the group of ranks {members}", output,
             exactly(torch.stack([given(r) for r in members]))),
            ("its input, after the call", mine, exactly(given(me)))]""",
    "all_gather in place stacked": """
    output = unwritten((len(members), *SHAPE))  # stacked: a row a rank, which torch documents
    mine = output[at]  # in place: this rank's own row of the output
    mine.copy_(given(me))
    {call}
    return [("{name} in place stacked in the group of ranks {members}", output,
             exactly(torch.stack([given(r) for r in members])))]""",
    "gather": """
    outputs = [unwritten(SHAPE) for _ in members] if at == ROOT else None
    mine = laid(given(me))
    {call}
    held = [("its input, after the call", mine, exactly(given(me)))]
    if at != ROOT:
        return held  # torch documents the root's list alone
    parts = [(f"{name} to group rank {{ROOT}}: group rank {{p}}'s part", out, exactly(given(r)))
             for p, (out, r) in enumerate(zip(outputs, members))]
    return held + parts""",
    "scatter": """
    output = unwritten(SHAPE)
    root = members[ROOT]
    parts = [laid(given(root, p)) for p in range(len(members))] if at == ROOT else None
    {call}
    sent = [(f"its part for group rank {{p}}, after the call", part, exactly(given(root, p)))
            for p, part in enumerate(parts or [])]
    return [(f"{name} from group rank {{ROOT}}", output, exactly(given(root, at)))] + sent""",
    "all_to_all": """
    output = unwritten((len(members) * SHAPE[0], *SHAPE[1:]))
    kept = torch.cat([given(me, p) for p in range(len(members))])
    source = laid(kept.clone())  # its own copy: laid hands a dense tensor back as it is
    {call}  # even splits
    return [("{name} in the group of ranks {members}", output,
             exactly(torch.cat([given(r, at) for r in members]))),
            ("its input, after the call", source, exactly(kept))]""",
    # the list forms: each part its own tensor
    "all_gather_list": """
    outputs = [unwritten(given(r).shape) for r in members]  # each the size its sender sends
    mine = laid(given(me))
    {call}
    parts = [(f"{name} in the group of ranks {members}: group rank {{i}}'s part", outputs[i],
              exactly(given(r))) for i, r in enumerate(members)]
    return parts + [("its input, after the call", mine, exactly(given(me)))]""",
    "reduce_scatter_list": """
    output = unwritten(SHAPE)
    parts = [laid(given(me, p)) for p in range(len(members))]
    {call}
    wanted = reduced({op!r}, [given(r, at) for r in members])
    return [("{name} {op} in the group of ranks {members}", output, wanted)] + [
        (f"its part for group rank {{p}}, after the call", part, exactly(given(me, p)))
        for p, part in enumerate(parts)]""",
    # parts of any size (torch documents parts of different sizes), each output the size its sender sends
    "all_to_all_list": """
    outputs = [unwritten(given(r, at).shape) for r in members]
    parts = [laid(given(me, p)) for p in range(len(members))]
    {call}
    received = [(f"{name} in the group of ranks {members}: from group rank {{i}}", outputs[i],
                 exactly(given(r, at))) for i, r in enumerate(members)]
    return received + [(f"its part for group rank {{p}}, after the call", part, exactly(given(me, p)))
                       for p, part in enumerate(parts)]""",
    "all_to_all uneven": """
    splits = {splits!r}  # splits[i][j]: what group rank i sends group rank j
    column = [row[at] for row in splits]
    output = unwritten((sum(column),))
    kept = torch.cat([given(me, p) for p in range(len(members))])
    source = laid(kept.clone())  # its own copy: laid hands a dense tensor back as it is
    {call}
    return [("{name} uneven in the group of ranks {members}", output,
             exactly(torch.cat([given(r, at) for r in members]))),
            ("its input, after the call", source, exactly(kept))]""",
    "gemm_reduce_scatter": """
    rows = {rows}  # of the result, on each rank: A has rows * WORLD_SIZE, B's columns are the result's
    a = [given(r, 0).reshape(rows * WORLD_SIZE, -1) for r in range(WORLD_SIZE)]  # each rank's own inner size
    b = [given(r, 1).reshape(a[r].shape[1], -1) for r in range(WORLD_SIZE)]
    result = {call}
    mine = slice(at * rows, (at + 1) * rows)
    pairs = [(widen(a[r][mine]), widen(b[r])) for r in range(WORLD_SIZE)]
    exact = sum(x @ y for x, y in pairs)
    # each element sums WORLD_SIZE dot products of up to K terms: any order rounds within (K + n - 1) eps
    terms = max(x.shape[1] for x, _ in pairs) + WORLD_SIZE - 1
    eps = torch.finfo(DTYPE).eps
    slack = 2 * terms * eps * sum(x.abs() @ y.abs() for x, y in pairs) + eps * exact.abs()
    return [("{name}: this rank's rows of the sum over ranks of A @ B", result, (narrow(exact), slack))]""",
}
# The backend's own call of each contract, by its name in torch: its contract and the call. {splits} is an
# all-to-all's split sizes, None for even ones.
TORCH_CALLS = {
    "all_reduce": ("all_reduce", "dist.all_reduce(tensor, op=OP, group=group)"),
    "reduce": ("reduce", "dist.reduce(tensor, dst=members[ROOT], op=OP, group=group)"),
    "broadcast": ("broadcast", "dist.broadcast(tensor, src=members[ROOT], group=group)"),
    "reduce_scatter_tensor": (
        "reduce_scatter", "dist.reduce_scatter_tensor(output, source, op=OP, group=group)"
    ),
    "all_gather_into_tensor": ("all_gather", "dist.all_gather_into_tensor(output, mine, group=group)"),
    "all_to_all_single": ("all_to_all", "dist.all_to_all_single(output, source, {splits}, group=group)"),
    "all_gather": ("all_gather_list", "dist.all_gather(outputs, mine, group=group)"),
    "reduce_scatter": ("reduce_scatter_list", "dist.reduce_scatter(output, parts, op=OP, group=group)"),
    "all_to_all": ("all_to_all_list", "dist.all_to_all(outputs, parts, group=group)"),
    "gather": ("gather", "dist.gather(mine, outputs, dst=members[ROOT], group=group)"),
    "scatter": ("scatter", "dist.scatter(output, parts, src=members[ROOT], group=group)"),
}
# A registered algorithm's call, by its contract, as the checks make it: {fn} is the algorithm, {params}
# its registered parameters.
ALGORITHM_CALLS = {
    "all_reduce": "{fn}(tensor, OP, group=group{params})",
    "reduce": "{fn}(tensor, ROOT, OP, group=group{params})",
    "broadcast": "{fn}(tensor, ROOT, group=group{params})",
    "reduce_scatter": "{fn}(output, source, OP, group=group{params})",
    "all_gather": "{fn}(output, mine, group=group{params})",
    "all_to_all": "{fn}(output, source, {splits}, group=group{params})",
    "gemm_reduce_scatter": "{fn}(a[me].clone(), b[me].clone(), group=group{params})",
}
REDUCING = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_list")  # those that take a reduce op
GROUP_LINES = """
    members = {members!r}  # the drawn group's global ranks: every rank creates it, its members call
    group = dist.new_group(members)
    if me not in members:
        return []
    at = members.index(me)  # this rank's rank in the group{body}"""


def group_call_script(
    call: FailingCall, op: str, found: str, written_from: str, form: str = "",
    splits: list[list[int]] | None = None,
) -> str:
    """The standalone reproduction of the backend's own ``call.name`` (one of TORCH_CALLS) as the
    conformance checks make it, in ``form`` (FORMS' words, "" for the plain one), on the group of
    ``call.members`` under reduce op ``op`` ("" where the call takes none), rooted at group rank
    ``call.root`` where it has a root; an uneven all-to-all's ``splits[i][j]`` is what group rank i sends
    group rank j."""
    contract, statement = TORCH_CALLS[call.name]
    title = f"{call.backend}: {' '.join(filter(None, (call.name, op, form)))}"
    return _group_script(call, contract, statement, call.name, title, op, found, written_from, form, splits)


def algorithm_script(
    call: FailingCall, algorithm: str, code: Inlined, params: dict[str, object], op: str, found: str,
    written_from: str, form: str = "", rows: int = 0, splits: list[list[int]] | None = None,
) -> str:
    """The standalone reproduction of registered algorithm ``algorithm`` (its name with its parameters) of
    contract ``call.name``, its ``code`` copied in, as the conformance checks call it: as
    group_call_script's; ``rows``: a GEMM reduce-scatter's rows of the result on each rank."""
    arguments = "".join(f", {key}={value!r}" for key, value in params.items())
    statement = ALGORITHM_CALLS[call.name].replace("{fn}", code.name).replace("{params}", arguments)
    title = f"{call.backend}: the {call.name} algorithm {' '.join(filter(None, (algorithm, op, form)))}"
    return _group_script(
        call, call.name, statement, algorithm, title, op, found, written_from, form, splits, rows, code
    )


def _group_script(
    call: FailingCall, contract: str, statement: str, name: str, title: str, op: str, found: str,
    written_from: str, form: str, splits: list[list[int]] | None, rows: int = 0, code: Inlined | None = None,
) -> str:
    """The script of ``statement``, the call of ``contract`` (called ``name``) in ``form``, on the group
    of ``call.members``."""
    members = list(call.members or range(call.world_size))
    statement = statement.replace("{splits}", "column, splits[at]" if splits else "None, None")
    body = CONTRACT_LINES[" ".join(filter(None, (contract, form)))].format(
        call=statement, name=name, op=op, members=members, rows=rows, splits=splits
    )
    lines = GROUP_LINES.format(members=members, body=body)
    title = f"{title} on ranks {members} of {call.world_size}, {call.dtype}"
    return _script(call, title, lines, found, written_from, op, code)


# A message the failing example sent from rank SRC to rank DST, by one of the three ways torch offers;
# the other ranks only join the group.
POINT_TO_POINT_LINES = """
    src, dst = {src}, {dst}
    if me == src:
        payload = laid(given(src))
        {send}
        return [(f"rank {{src}}'s tensor, after it was sent", payload, exactly(given(src)))]
    if me == dst:
        inbox = unwritten(SHAPE)
        {receive}
        return [(f"{mode} from rank {{src}}", inbox, exactly(given(src)))]
    return []"""
SEND_AND_RECEIVE = {
    "send_recv": ("dist.send(payload, dst)", "dist.recv(inbox, src)"),
    "isend_irecv": ("dist.isend(payload, dst).wait()", "dist.irecv(inbox, src).wait()"),
    "batch_isend_irecv": (
        "[work] = dist.batch_isend_irecv([dist.P2POp(dist.isend, payload, dst)])\n        work.wait()",
        "[work] = dist.batch_isend_irecv([dist.P2POp(dist.irecv, inbox, src)])\n        work.wait()",
    ),
}


def point_to_point_script(
    call: FailingCall, mode: str, src: int, dst: int, found: str, written_from: str
) -> str:
    """The standalone reproduction of rank ``src`` sending its ``given(src, 0)`` to rank ``dst`` by
    ``mode`` (send_recv, isend_irecv or batch_isend_irecv), both tensors in ``call.inputs_layout``."""
    send, receive = SEND_AND_RECEIVE[mode]
    lines = POINT_TO_POINT_LINES.format(src=src, dst=dst, mode=mode, send=send, receive=receive)
    title = f"{call.backend}: {mode} of {_layouts(call)} from rank {src} to rank {dst} of {call.world_size}"
    return _script(call, f"{title}, {call.dtype}", lines, found, written_from)


# An operation made async, its Work held to torch's word beside what it wrote: {fn} makes the call, blocking
# or async, and hands back what the call returned (a Work, or a list of them) and the tensors it wrote.
WORK_LINES = """
    x = given(me)
    _, blocking = {fn}({operation!r}, x.clone(), {m}, ROOT, OP, False)
    made, outputs = {fn}({operation!r}, x.clone(), {m}, ROOT, OP, True)
    works = made if isinstance(made, list) else [made]
    waited = [work.wait() for work in works]
    if DEVICE == "cuda":  # wait() only orders the stream: is_completed() reads the GPU's progress
        torch.cuda.synchronize()
    # a row a Work: [its wait() returned True, it is completed once waited], each True by torch's docs
    said = torch.tensor([[w is True, work.is_completed()] for w, work in zip(waited, works)])
    what = "{operation}'s Work: [wait() returned True, is_completed() once waited]"
    return [(what, said, exactly(torch.ones_like(said)))] + [
        (f"{operation} async, output {{k}}, against the same call blocking", got, exactly(want))
        for k, (got, want) in enumerate(zip(outputs, blocking))
    ]"""


def work_script(
    call: FailingCall, operation: str, make: Callable[..., Any], m: int, found: str, written_from: str
) -> str:
    """The standalone reproduction of ``operation`` made async on ``call``'s inputs (``given(r, 0)``, rank
    r's whole input), its Work's ``wait()`` and ``is_completed()`` held to True and its outputs to the
    blocking call's: ``make(operation, x, m, root, op, async_op)``, copied in with what it calls, makes
    the call and hands back what it returned and the tensors it wrote."""
    code = inlined(make)
    lines = WORK_LINES.format(fn=code.name, operation=operation, m=m)
    title = f"{call.backend}: {operation} made async, its Work, {call.world_size} ranks, {call.dtype}"
    return _script(call, title, lines, found, written_from, "sum", code)


# An all_reduce of inputs holding NaN or an infinity, element j on rank j % WORLD_SIZE alone: torch documents
# no rule for either in a reduction, so each element's kind (propagated or dropped) is held to element 0's.
EXCEPTIONAL_LINES = """
    tensor = laid(given(me))  # element j holds the {value} on rank j % WORLD_SIZE alone
    dist.all_reduce(tensor, op=OP)
    print(f"rank {{me}}: {op} gave {{tensor.tolist()}}\\n", end="", flush=True)
    got = tensor.detach().cpu()
    kinds = got.isnan().long() + 2 * got.isinf().long()  # 0 finite, 1 NaN, 2 infinite
    what = "each element's kind (0 finite, 1 NaN, 2 infinite), whichever rank held the {value}"
    return [(what, kinds, exactly(torch.full_like(kinds, int(kinds[0]))))]"""


def exceptional_script(call: FailingCall, op: str, value: str, found: str, written_from: str) -> str:
    """The standalone reproduction of an all_reduce under ``op`` whose result depends on which rank held
    ``value`` (nan, inf or -inf): ``call.given(r, 0)`` holds it at the elements j with j % n == r."""
    lines = EXCEPTIONAL_LINES.format(op=op, value=value)
    title = f"{call.backend}: all_reduce {op} of a {value} one rank holds, {call.world_size} ranks"
    title += f", {call.dtype}"
    return _script(call, title, lines, found, written_from, op)


# how each kind's values are written inline, what an unwritten output holds (rank inputs never hold it),
# and the dtype a sum is exact in
_FILL = {"bool": "False", "complex": "complex('nan')", "float": "float('nan')", "int": "0"}
_WIDE = {"bool": "torch.bool", "complex": "torch.complex128", "float": "torch.float64", "int": "torch.int64"}


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values, flat, in the dtype a script writes them in (uint64 as the int64 of the same
    bits)."""
    flat = tensor.detach().cpu().contiguous().flatten()
    if flat.dtype == getattr(torch, "uint64", None):  # torch 2.3 and later
        return flat.view(torch.int64)
    if flat.dtype.is_floating_point:
        return flat.to(torch.float64)
    if flat.dtype.is_complex:
        return flat.to(torch.complex128)
    return flat if flat.dtype == torch.bool else flat.to(torch.int64)


def _literal(tensor: torch.Tensor) -> list[object]:
    """``tensor``'s values, flat, as Python writes them."""
    return [_written(v) for v in _wide(tensor).tolist()]


def _packed(given: list[list[torch.Tensor] | None]) -> tuple[str, str]:
    """INPUTS as (first, count) of each part's values in PACKED, and PACKED: every part's values one after
    another, their bytes compressed and in base64, as lines of a string literal."""
    parts = [part for parts in given if parts for part in parts]
    flat = torch.cat([_wide(part) for part in parts]) if parts else torch.empty(0)
    data = ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size())
    text = base64.b64encode(zlib.compress(data, 1)).decode()
    lines = "\n".join(f'    "{text[at:at + 96]}"' for at in range(0, len(text), 96))
    first, inputs = 0, []
    for parts in given:
        places = None
        if parts is not None:
            places = []
            for part in parts:
                places.append((first, part.numel()))
                first += part.numel()
        inputs.append(places)
    return repr(inputs), f"(\n{lines}\n)"


# what a script's INPUTS holds where it holds the example's values, inline or packed
_AS_GIVEN = """\
# INPUTS[r][p]: what rank r sends (group) rank p (INPUTS[r][0]: its one input, where it sends all ranks the
# same), flat, as the failing example had them; None for a rank whose inputs the call does not take (one
# outside the call's group, a scatter's non-root).
"""
_INLINE = _AS_GIVEN + """INPUTS = {written}


def given(r, p=0):
    return narrow(torch.tensor(INPUTS[r][p], dtype=WIDE)).reshape(SHAPE).to(DEVICE)"""
# too many to read: each part is (first, count) of the values in PACKED, their WIDE bytes compressed in base64
_PACKED = _AS_GIVEN + """INPUTS = {written}  # (first, count) of each part's values in VALUES
PACKED = {packed}
VALUES = torch.frombuffer(bytearray(zlib.decompress(base64.b64decode(PACKED))), dtype=WIDE)


def given(r, p=0):
    first, count = INPUTS[r][p]
    return narrow(VALUES[first : first + count]).reshape(SHAPE).to(DEVICE)"""
# too many to write at all: each part's count, its values drawn in the example's dtype and kind of values
_GENERATED = """\
# The failing example's inputs were too many to write (over {limit} elements): these are drawn in its dtype
# and counts, of the same kind of values, by a seeded generator, the same on every rank and run. A bug that
# needs the very values the example had may not show on them: the failure's replay has those.
# INPUTS[r][p]: how many elements rank r sends (group) rank p (INPUTS[r][0]: its one input, where it sends
# all ranks the same); None for a rank whose inputs the call does not take.
INPUTS = {counts!r}


def signed(count, generator):  # magnitudes in [0.5, 2) of either sign: a sum cancels, a product keeps range
    magnitude = torch.rand(count, generator=generator, dtype=torch.float64) * 1.5 + 0.5
    return magnitude * (torch.randint(0, 2, (count,), generator=generator) * 2 - 1)


def given(r, p=0):
    generator, count = torch.Generator().manual_seed(1000 * r + p), INPUTS[r][p]
    {draw}
    return narrow(values).reshape(SHAPE).to(DEVICE)"""
_DRAW = {
    "bool": "values = torch.randint(0, 2, (count,), generator=generator).bool()",
    "int": "values = torch.randint(1, 8, (count,), generator=generator, dtype=WIDE)  # never 0: it is FILL",
    "float": "values = signed(count, generator)",
    "complex": "values = torch.complex(signed(count, generator), signed(count, generator))",
}
_STDLIB = ("os", "sys", "tempfile", "time")  # what every script imports; packed inputs need base64 and zlib


class _Name(str):
    """A value written as code (``inf``, ``nan``), not as a quoted string."""

    def __repr__(self) -> str:
        return str(self)


def _written(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return _Name("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, complex) and not (math.isfinite(value.real) and math.isfinite(value.imag)):
        return _Name(f"complex({_written(value.real)!r}, {_written(value.imag)!r})")
    return value


_TEMPLATE = '''"""{title}

{found}

Standalone: needs only torch and the backend. Run it as `python THIS_FILE`: it starts the ranks on this
machine, makes the call, and prints on each rank what came back against what was expected. It exits 1 while
the bug is there, 0 once it is fixed.
"""

{stdlib}
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
{imports}
BACKEND, WORLD_SIZE, DEVICE = {backend!r}, {world_size}, {device!r}
ROOT = {root}  # the call's root, where it has one: a rank of its group
DTYPE, SHAPE = {dtype}, {shape}
INPUTS_LAYOUT, OUTPUTS_LAYOUT = {inputs_layout!r}, {outputs_layout!r}
FILL = {fill}  # what outputs start as, and no input holds: an element never written shows
WIDE = {wide}  # the dtype the inputs are written in, and a sum is exact in
AS_BITS = {as_bits}  # uint64's inputs are written as the int64 of the same bits
PREMUL_FACTOR = {premul_factor}  # PREMUL_SUM's factor, where the call takes one
HANG = 120  # seconds: a rank not done by then is hung in the call
OP = {op_code}  # the call's reduce op, where it takes one
nan, inf = float("nan"), float("inf")
{inputs}


def narrow(values):  # WIDE values as DTYPE (uint64's bits as they are)
    return values.view(DTYPE) if AS_BITS else values.to(DTYPE)


def widen(values):
    return values.view(WIDE) if AS_BITS else values.to(WIDE)


def arranged(tensor, layout):
    if layout == "channels_last":
        return tensor.contiguous(memory_format=torch.channels_last)
    if layout == "strided":  # every other element of the last dimension of a buffer twice as wide
        buffer = torch.full((*tensor.shape[:-1], 2 * tensor.shape[-1]), FILL, dtype=DTYPE, device=DEVICE)
        buffer[..., ::2].copy_(tensor)
        return buffer[..., ::2]  # a view: torch hands it to the backend as it is
    if layout == "offset":  # a view one element into a buffer one element longer at each end
        buffer = torch.full((tensor.numel() + 2,), FILL, dtype=DTYPE, device=DEVICE)
        buffer[1:-1].copy_(tensor.flatten())
        return buffer[1:-1].view(tensor.shape)
    return tensor.contiguous()


def around(tensor):  # a view's buffer outside it, which a call must leave FILL: None where it has none
    if OUTPUTS_LAYOUT == "strided":
        return tensor._base[..., 1::2]
    return tensor._base[[0, -1]] if OUTPUTS_LAYOUT == "offset" else None


def laid(tensor):  # an input, in the call's input layout
    return arranged(tensor, INPUTS_LAYOUT)


def unwritten(shape):  # an output, in the call's output layout, every element FILL
    return arranged(torch.full(shape, FILL, dtype=DTYPE, device=DEVICE), OUTPUTS_LAYOUT)


def exactly(tensor):  # what a move must deliver, bit for bit
    return tensor, 0


def total(parts):  # the sum of every rank's part as DTYPE holds it, and how far any order of it may round
    return reduced("sum", parts)


def reduced(op, parts):  # the parts reduced by op as DTYPE holds it, and how far any order of it may round
    wide = [widen(p) for p in parts]  # bools stay bools: their sum is "any", their product "all"
    folds = {{"sum": torch.add, "avg": torch.add, "premul_sum": torch.add, "product": torch.mul,
             "min": torch.minimum, "max": torch.maximum, "band": torch.bitwise_and,
             "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}}
    exact = wide[0]
    for part in wide[1:]:
        exact = folds[op](exact, part)
    exact = exact * PREMUL_FACTOR if op == "premul_sum" else exact / len(parts) if op == "avg" else exact
    if not (DTYPE.is_floating_point or DTYPE.is_complex) or op in ("min", "max"):
        return narrow(exact), 0  # exact (whole numbers wrapping around as DTYPE does)
    eps = torch.finfo(DTYPE.to_real() if DTYPE.is_complex else DTYPE).eps
    magnitude = exact.abs() if op == "product" else sum(p.abs() for p in wide)
    return narrow(exact), 2 * len(parts) * eps * magnitude


def wrong(got, want, slack):  # where got differs from want by more than slack (NaN matching NaN)
    if not (DTYPE.is_floating_point or DTYPE.is_complex):
        return got != want
    got, want = widen(got), widen(want)
    return ~(((got - want).abs() <= slack) | (got == want) | (got.isnan() & want.isnan()))


def report(me, what, got, want, slack=0):  # print what came back against what was expected; True if it was
    bad = wrong(got, want, slack).nonzero().tolist()
    verdict = f"{{len(bad)}} of {{want.numel()}} elements WRONG" if bad else "as expected"
    lines = [f"rank {{me}}: {{what}}: {{verdict}}"]
    for at in bad[:8]:
        at = tuple(at)
        lines.append(f"  at {{at}}: got {{got[at].item()}}, expected {{want[at].item()}}")
    print("\\n".join(lines) + "\\n", end="", flush=True)  # one write: the ranks' lines do not interleave
    return not bad


{definitions}def call(me):{call}


def rank(me, store, failed, done):
    if DEVICE == "cuda":
        torch.cuda.set_device(me)
    dist.init_process_group(BACKEND, init_method=f"file://{{store}}", rank=me, world_size=WORLD_SIZE)
    for what, got, (want, slack) in call(me):
        failed[me] += not report(me, what, got, want, slack)
        if (outside := around(got)) is not None:
            unwritten = torch.full_like(outside, FILL)
            failed[me] += not report(me, f"{{what}}: its buffer around it", outside, unwritten)
    done[me] = 1
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's ranks talk over loopback only
    failed, done = (mp.get_context("spawn").Array("i", WORLD_SIZE) for _ in range(2))
    with tempfile.TemporaryDirectory() as folder:  # the ranks meet in a file: no port to race another for
        store = os.path.join(folder, "store")
        ranks = mp.start_processes(rank, (store, failed, done), WORLD_SIZE, join=False, start_method="spawn")
        deadline = time.monotonic() + HANG
        while not ranks.join(timeout=1):  # raises where a rank raised, as mp.spawn does
            if time.monotonic() > deadline:  # a hang is the bug too: say where, rather than wait forever
                for process in ranks.processes:
                    process.kill()
                hung = [r for r in range(WORLD_SIZE) if not done[r]]
                where = f"rank(s) {{hung}} still in the call" if hung else "every call returned; the teardown"
                print(f"{{where}} after {{HANG}} s: it hangs", flush=True)
                sys.exit(1)
    print(f"{{sum(failed)}} result(s) wrong" if sum(failed) else "every result as expected")
    sys.exit(1 if sum(failed) else 0)
'''
