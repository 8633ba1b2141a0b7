"""What the backend under test supports, asked of the live group: operation x dtype x reduce op.

``probe`` runs on every rank of a group (through ``suite_api.run_on_ranks``) and makes one tiny call of each
operation with each dtype and reduce op. A call the backend refuses with a recognised "not supported"
error (``refusal``) is N/A: the suites never draw it. Anything else it raises is not a refusal: the cell
stays supported, so the suites draw it and the error fails them. Nothing is assumed from the backend's
name: a check that passes on gloo says nothing about NCCL.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from pytest_collectives import devices
from pytest_collectives.algorithms.collectives import all_gather_single, reduce_scatter_single
from pytest_collectives.algorithms.reference import OPS, reduce_op
from pytest_collectives.backend_declarations import declared_refusal, keeps_state_after_a_raise

__all__ = [
    "AS_TORCH",
    "DATA_OPERATIONS",
    "DTYPES",
    "EXCEPTIONAL",
    "NO_OP",
    "REDUCE_OPS",
    "REDUCTIONS",
    "Capabilities",
    "Cell",
    "Semantic",
    "active",
    "dtype_name",
    "exceptional_semantics",
    "kinds",
    "probe",
    "refusal",
    "use",
]

# Every dtype a collective moves; some only where torch has them (uint16/32/64 from 2.3).
_DTYPE_NAMES = [
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "bool", "float8_e4m3fn", "float8_e5m2",
]  # fmt: skip
DTYPES: list[torch.dtype] = [getattr(torch, name) for name in _DTYPE_NAMES if hasattr(torch, name)]
REDUCE_OPS = list(OPS)
NO_OP = "-"  # the reduce op of an operation that reduces nothing

Cell = tuple[str, str, str]  # (operation, dtype name, reduce op or NO_OP)
Semantic = tuple[str, str, str, str]  # (operation, dtype name, reduce op, exceptional value)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# How one tiny call of each operation is made on a probe: (this rank's n elements, n, op) -> None.
def _all_reduce(t: torch.Tensor, n: int, op: Any) -> None:
    dist.all_reduce(t, op=op)


def _reduce(t: torch.Tensor, n: int, op: Any) -> None:
    dist.reduce(t, dst=0, op=op)


def _reduce_scatter_single(t: torch.Tensor, n: int, op: Any) -> None:
    reduce_scatter_single(t[:1].clone(), t, op=op)


def _reduce_scatter(t: torch.Tensor, n: int, op: Any) -> None:
    dist.reduce_scatter(t[:1].clone(), list(t.chunk(n)), op=op)


def _broadcast(t: torch.Tensor, n: int, op: Any) -> None:
    dist.broadcast(t, src=0)


def _all_gather(t: torch.Tensor, n: int, op: Any) -> None:
    dist.all_gather([torch.empty_like(t) for _ in range(n)], t)


def _all_gather_uneven(t: torch.Tensor, n: int, op: Any) -> None:
    _all_gather(t, n, op)  # a dtype the backend refuses is refused here, before any size check
    sizes = [1 + r % 2 for r in range(n)]  # t holds n elements: at least 2 where there are two ranks
    dist.all_gather([t.new_empty(size) for size in sizes], t[: sizes[dist.get_rank()]].clone())


def _all_gather_single(t: torch.Tensor, n: int, op: Any) -> None:
    all_gather_single(t.new_empty(n * t.numel()), t)


def _all_gather_single_stacked(t: torch.Tensor, n: int, op: Any) -> None:
    all_gather_single(t.new_empty(n, t.numel()), t)


def _all_to_all_single(t: torch.Tensor, n: int, op: Any) -> None:
    dist.all_to_all_single(torch.empty_like(t), t)


def _all_to_all(t: torch.Tensor, n: int, op: Any) -> None:
    dist.all_to_all([torch.empty_like(c) for c in t.chunk(n)], list(t.chunk(n)))


def _gather(t: torch.Tensor, n: int, op: Any) -> None:
    dist.gather(t, [torch.empty_like(t) for _ in range(n)] if dist.get_rank() == 0 else None, dst=0)


def _scatter(t: torch.Tensor, n: int, op: Any) -> None:
    dist.scatter(t[:1].clone(), list(t.chunk(n)) if dist.get_rank() == 0 else None, src=0)


def _send_recv(t: torch.Tensor, n: int, op: Any) -> None:
    if n == 1:
        raise _NeedsPeers("send/recv needs two ranks or more")
    me = dist.get_rank()
    ops = [dist.P2POp(dist.isend, t, (me + 1) % n), dist.P2POp(dist.irecv, torch.empty_like(t), (me - 1) % n)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


REDUCTIONS: dict[str, Callable[[torch.Tensor, int, Any], None]] = {
    "all_reduce": _all_reduce,
    "reduce": _reduce,
    "reduce_scatter_single": _reduce_scatter_single,
    "reduce_scatter": _reduce_scatter,
}
DATA_OPERATIONS: dict[str, Callable[[torch.Tensor, int, Any], None]] = {
    "broadcast": _broadcast,
    "all_gather": _all_gather,
    "all_gather_uneven": _all_gather_uneven,  # a list of different sizes, as torch documents: its own row
    "all_gather_single": _all_gather_single,
    "all_gather_single_stacked": _all_gather_single_stacked,  # output (n, numel): a row of its own
    "all_to_all_single": _all_to_all_single,
    "all_to_all": _all_to_all,
    "gather": _gather,
    "scatter": _scatter,
    "send_recv": _send_recv,
}


class _NeedsPeers(Exception):
    """An operation that can't be called at this world size at all (a world of one has no peer)."""


def refusal(exc: BaseException, backend: str) -> str | None:
    """The one-line reason when ``exc`` is ``backend`` (a name, or a spec such as "cpu:gloo,cuda:nccl")
    saying it does not implement a call, else None."""
    text = re.sub(r"[\x00-\x1f]", " ", str(exc).strip().split("\n")[0]).strip() or type(exc).__name__
    return declared_refusal(text, backend, isinstance(exc, (NotImplementedError, _NeedsPeers)))


def probe(pg: Any) -> Capabilities:
    """On every rank: what the group's backend supports on the device the rank runs on, ``{cell: ""}``
    for each supported cell and ``{cell: reason}`` for each refused one. Every rank makes the same calls
    in the same order, so a refusal raised before any data moves leaves the group in step."""
    n, found = pg.world_size, {}
    # First, before any call it may refuse: gloo's barrier waits on, and raises the error of, any earlier
    # call its worker threads still hold, so a barrier after a refusal may raise on one rank while the
    # others wait in it (the probe hung so on torch 2.2; tests/support/mutant_backends.py plants it on every
    # probe).
    for name, call in _WHOLE_GROUP.items():
        found[name, NO_OP, NO_OP] = _attempt(call, None, n, NO_OP, pg)

    def probe_each(operations: dict[str, Callable[[Any, int, Any], object]], ops: list[str]) -> None:
        for operation, call in operations.items():
            for dtype in DTYPES:
                tensor = torch.zeros(n, dtype=dtype, device=pg.device)  # one element per rank
                for op in ops:
                    found[operation, dtype_name(dtype), op] = _attempt(call, tensor, n, op, pg)

    probe_each(REDUCTIONS, REDUCE_OPS)
    # before send_recv: a refused batch_isend_irecv leaves NCCL's group coalescing, every later call on it
    # taken and never run (docs/measurements/scripts/nccl_findings.py)
    semantics = exceptional_semantics(pg, found)
    probe_each(DATA_OPERATIONS, [NO_OP])
    devices.synchronize(pg.device)
    from pytest_collectives.backend_declarations import backend_version

    return Capabilities(
        pg.backend, pg.device.type, n, found, semantics=semantics,
        backend_version=backend_version(pg.backend), torch_version=str(torch.__version__),
    )  # fmt: skip


EXCEPTIONAL = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}
_SEMANTIC_OPS = ("min", "max", "sum", "avg", "product")
AS_TORCH = "as torch"


def kinds(x: torch.Tensor) -> list[str]:
    """Each element as "nan", "+inf", "-inf" or "finite"."""
    values = x.detach().cpu().double().tolist()
    return ["nan" if v != v else f"{v:+}" if abs(v) == float("inf") else "finite" for v in values]


def exceptional_semantics(pg: Any, found: dict[Cell, str]) -> dict[Semantic, str]:
    """What the backend's all_reduce makes of NaN and +-inf, for each float dtype and reduce op it supports:
    ``AS_TORCH`` where every element is of the kind (NaN, +inf, -inf or finite) that torch's own reduction
    on one process gives, else what it gives instead. Not a verdict: a backend may drop NaN in MAX, and a
    vendor should see that it does (the suites fail only a result that depends on which rank holds it).
    Element j holds the value on rank j % n alone; the other ranks hold ordinary values."""
    n, seen = pg.world_size, {}
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        for op in (o for o in _SEMANTIC_OPS if found.get(("all_reduce", dtype_name(dtype), o)) == ""):
            for value, special in EXCEPTIONAL.items():
                inputs = [torch.full((n,), 1.0 + r, dtype=dtype) for r in range(n)]
                for r, x in enumerate(inputs):
                    x[r] = special
                tensor = inputs[pg.rank].to(pg.device, copy=True)
                try:
                    dist.all_reduce(tensor, op=reduce_op(op))
                except Exception as exc:  # noqa: BLE001 - what it raised is its semantics
                    seen["all_reduce", dtype_name(dtype), op, value] = f"raised {type(exc).__name__}"
                    continue
                got, want = kinds(tensor), kinds(_TORCH_REDUCTIONS[op](torch.stack(inputs)))
                if len(set(got)) > 1:
                    behaviour = "depends on which rank holds it"
                elif got == want:
                    behaviour = AS_TORCH
                else:
                    behaviour = f"{got[0]} where torch gives {want[0]}"
                seen["all_reduce", dtype_name(dtype), op, value] = behaviour
    return seen


_TORCH_REDUCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "min": lambda x: x.amin(0),
    "max": lambda x: x.amax(0),
    "sum": lambda x: x.sum(0),
    "avg": lambda x: x.mean(0),
    "product": lambda x: x.prod(0),
}


def _attempt(call: Callable[[Any, int, Any], object], tensor: Any, n: int, op: str, pg: Any) -> str:
    """The backend's refusal of the call, or an empty string: it went through, or failed another way,
    which leaves it supported, so the suites draw it and fail on it.

    On a backend that may keep state after a raise (backend_declarations.py), made on a thread of its own:
    NCCL refuses some calls inside a group call it never closes, and its group depth is per thread, so every
    later call on that thread would be taken and never run. The thread ends, and the state with it."""
    answer = [""]

    def attempt() -> None:
        devices.select(pg.device)
        try:
            call(tensor, n, reduce_op(op) if op != NO_OP else None)
        except Exception as exc:  # noqa: BLE001 - classified: a refusal or not
            answer[0] = refusal(exc, pg.backend) or ""

    if keeps_state_after_a_raise(pg.backend):
        thread = threading.Thread(target=attempt, name="probe-call")
        thread.start()
        thread.join()
    else:
        attempt()
    return answer[0]


# Operations that take no tensor, called as the others are: (None, n, None).
_WHOLE_GROUP: dict[str, Callable[[Any, int, Any], object]] = {
    "barrier": lambda _, n, __: dist.barrier(),
    "monitored_barrier": lambda _, n, __: dist.monitored_barrier(),
    "all_gather_object": lambda _, n, __: dist.all_gather_object([None] * n, dist.get_rank()),
    "broadcast_object_list": lambda _, n, __: dist.broadcast_object_list([dist.get_rank()], src=0),
    "gather_object": lambda _, n, __: dist.gather_object(
        dist.get_rank(), [None] * n if dist.get_rank() == 0 else None, dst=0
    ),
    "scatter_object_list": lambda _, n, __: dist.scatter_object_list(
        [None], list(range(n)) if dist.get_rank() == 0 else None, src=0
    ),
}


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What one backend supports on one device type at one world size: cell -> "" or the refusal."""

    backend: str
    device_type: str
    world_size: int
    cells: dict[Cell, str]
    # supported cells a known-bugs manifest withholds from the draws (known_bugs.withheld): cell -> reason
    withheld: dict[Cell, str] = dataclasses.field(default_factory=dict)
    # what all_reduce makes of NaN and +-inf (exceptional_semantics)
    semantics: dict[Semantic, str] = dataclasses.field(default_factory=dict)
    # whether a sweep runs every cell at 1 Mi, and what decided it: the topology (the most ranks that take
    # turns on a core, tiers.ranks_a_core), or --tier-budget against what one all_reduce example of 1 Mi
    # elements costs on the live group, drawn, called and checked (the slowest rank's mean over
    # tiers.SAMPLE), and what drawing a 1 Mi input costs there (tiers.timed_draw, the budget's scale)
    timed: bool = False  # probing.sized has asked
    ranks_a_core: int | None = None  # where the topology decided
    large_example_s: float | None = None  # where a budget was measured against
    draw_s: float | None = None
    large_cells: int = 0  # all_reduce's, the most cells a sweep has, which the budget must hold
    whole_large_tier: bool = False
    # the backend's and torch's versions as the ranks read them: what ran, which under a setting of
    # --backend-env (a library path) may not be what pytest's own process imported
    backend_version: str = ""
    torch_version: str = ""
    # cases.supported_cells' answers, asked at every draw of every example: (operations, dtypes, ops) ->
    # cells. Answered afresh each time, they were a fifth of pytest's own time in a profile of the suites.
    answered: dict[Any, list[Any]] = dataclasses.field(
        init=False, default_factory=dict, compare=False, repr=False
    )

    @property
    def tier_decided(self) -> bool:
        """Whether this run decided the 1 Mi tier here (by the topology or a measured budget), rather than
        the user (--tier-budget 0 or inf) or a backend with no all_reduce to time."""
        return self.ranks_a_core is not None or self.large_example_s is not None

    def supports(self, operation: str, dtype: torch.dtype | str = NO_OP, op: str = NO_OP) -> bool:
        name = dtype if isinstance(dtype, str) else dtype_name(dtype)
        return self.cells.get((operation, name, op)) == "" and (operation, name, op) not in self.withheld

    def withholding(self, known: dict[Cell, str]) -> Capabilities:
        """These capabilities with the supported cells that match a pattern of ``known`` (operation, dtype
        and reduce op, each an fnmatch pattern) withheld, each with its first pattern's reason."""
        cells: dict[Cell, str] = {}
        for cell in (c for c, refused in self.cells.items() if not refused):
            reasons = (why for pattern, why in known.items() if all(map(fnmatch.fnmatchcase, cell, pattern)))
            reason = next(reasons, None)
            if reason is not None:
                cells[cell] = reason
        return dataclasses.replace(self, withheld=cells)

    def supports_all(self, cells: Iterable[Cell]) -> bool:
        return all(self.supports(*cell) for cell in cells)


_active: Capabilities | None = None


def use(capabilities: Capabilities | None) -> None:
    """Make ``capabilities`` what the suites' strategies draw from (set before each test: per world size)."""
    global _active
    _active = capabilities


def active() -> Capabilities:
    if _active is None:
        raise RuntimeError(
            "nothing probed: mark the test `conformance` to draw from the probe of the live group"
        )
    return _active
