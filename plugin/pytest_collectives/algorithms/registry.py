"""The algorithms the conformance suites check, by name: the project's own and users', through one door.

An implementation of an operation registers itself with its contract::

    from pytest_collectives import algorithm

    @algorithm("all_reduce", uses=("send_recv",), ops=("sum", "max"), grid={"chunks": (1, 4)})
    def my_ring(tensor, op, group, chunks):
        ...
        return tensor

in a ``conftest.py`` or in a module an installed package names in the ``pytest_collectives.algorithms``
entry-point group. Each combination of the grid is its own variant (``my_ring(chunks=4)``): its row of the
capability matrix, its test id, and what a failure names. ``uses`` are the backend calls it is made of (a
dtype is drawn only where the probe found each of them supported); ``ops`` and ``dtypes`` (torch's names:
"float32") are the reduce ops and dtypes it claims (default: those its backend calls support).
``CONTRACTS`` says how each operation is called.

The file that registered an algorithm is imported on every rank before its group starts, so a rank finds
the algorithm by name; registering again from the same place (that import) changes nothing. What a
conftest registers is forgotten when its session ends.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import itertools
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "CONTRACTS",
    "ENTRY_POINTS",
    "Algorithm",
    "Contract",
    "algorithm",
    "algorithms",
    "forget_session",
    "get",
    "load",
    "sources",
]

ENTRY_POINTS = "pytest_collectives.algorithms"

@dataclasses.dataclass(frozen=True)
class Contract:
    """How the suites call an implementation of one operation, and what it must do."""

    call: str  # the signature, with each argument's type
    must: str


# Every call also gets ``group`` (a torch.distributed.ProcessGroup) and the variant's grid parameters by
# name. Tensors are torch.Tensor on the rank's device; ``op`` is a torch.distributed.ReduceOp (compare it
# with ``dist.ReduceOp.MAX``, never a string); a ``root`` is a group rank (int).
CONTRACTS = {
    "all_reduce": Contract(
        "fn(tensor: Tensor, op: ReduceOp, group, **params) -> Tensor",
        "reduce `tensor` over the group in place; return it",
    ),
    "reduce_scatter": Contract(
        "fn(output: Tensor, input: Tensor, op: ReduceOp, group, **params) -> Tensor",
        "put this rank's block of the reduced `input` (viewed as group-size blocks) in `output`, which may "
        "be that block of `input`; return `output`",
    ),
    "gemm_reduce_scatter": Contract(
        "fn(a: Tensor, b: Tensor, group, **params) -> Tensor",
        "return this rank's row block of the sum over ranks of `a @ b`",
    ),
    "all_gather": Contract(
        "fn(output: Tensor, input: Tensor, group, **params) -> Tensor",
        "put group rank i's `input` in block i of `output` (group-size blocks of `input`'s size, read "
        "flat); `input` may be this rank's block of `output`; return `output`",
    ),
    "all_to_all": Contract(
        "fn(output: Tensor, input: Tensor, output_splits: list[int] | None, input_splits: list[int] | None, "
        "group, **params) -> Tensor",
        "send block j of `input` (`input_splits[j]` elements, equal blocks where None) to group rank j, and "
        "put the block from group rank i in block i of `output`; return `output`",
    ),
    "broadcast": Contract(
        "fn(tensor: Tensor, root: int, group, **params) -> Tensor",
        "make every rank's `tensor` `root`'s, in place; return it",
    ),
    "reduce": Contract(
        "fn(tensor: Tensor, root: int, op: ReduceOp, group, **params) -> Tensor",
        "reduce into `root`'s `tensor` in place (other ranks' tensors unspecified); return it",
    ),
}

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Algorithm:
    name: str  # with its parameters: ring_reduce_scatter(steps_per_rank=2)
    operation: str
    function: Callable[..., Any]
    uses: tuple[str, ...]
    ops: tuple[str, ...] | None  # None: every reduce op its backend calls support
    dtypes: tuple[str, ...] | None  # torch dtype names; None: every dtype its backend calls support
    params: Mapping[str, Any]
    source: tuple[str, str]  # (module name, file) of what registered it

    def __call__(self, *args: Any, group: Any) -> Any:
        return self.function(*args, group=group, **self.params)


_REGISTERED: dict[str, Algorithm] = {}


def algorithm(
    operation: str,
    name: str | None = None,
    *,
    uses: Sequence[str],
    ops: Sequence[str] | None = None,
    dtypes: Sequence[str] | None = None,
    grid: Mapping[str, Sequence[Any]] | None = None,
    stacklevel: int = 1,
) -> Callable[[F], F]:
    """Register the decorated function as an implementation of ``operation`` (see the module docstring).

    The ranks import the module that registers it: the caller, or as ``warnings.warn``'s ``stacklevel``
    counts, the module that called a helper which called this.
    """
    caller = sys._getframe(stacklevel).f_globals
    source = (caller["__name__"], str(Path(caller["__file__"]).resolve()))
    if operation not in CONTRACTS:
        raise ValueError(f"@algorithm: no operation {operation!r}; one of {', '.join(CONTRACTS)}")
    if not uses:
        raise ValueError("@algorithm: uses= must name the backend calls the algorithm is made of")

    def register(fn: F) -> F:
        base = name or fn.__name__
        keys = list(grid or {})
        for values in itertools.product(*((grid or {})[k] for k in keys)):
            params = dict(zip(keys, values, strict=True))
            label = f"{base}({', '.join(f'{k}={v!r}' for k, v in params.items())})" if params else base
            found = _REGISTERED.get(label)
            if found is not None and found.source[1] != source[1]:
                raise ValueError(
                    f"@algorithm: {label!r} is registered twice, in {found.source[1]} and {source[1]}"
                )
            _REGISTERED[label] = Algorithm(
                label, operation, fn, tuple(uses), _names(ops), _names(dtypes), params, source
            )
        return fn

    return register


def _names(names: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if names is None else tuple(names)


def algorithms(operation: str) -> list[Algorithm]:
    """The variants registered for ``operation``, in the order they were registered."""
    _load_installed()
    return [a for a in _REGISTERED.values() if a.operation == operation]


def get(name: str) -> Algorithm:
    _load_installed()
    try:
        return _REGISTERED[name]
    except KeyError:
        known = ", ".join(_REGISTERED) or "none"
        raise LookupError(f"no algorithm registered as {name!r} here (registered: {known})") from None


def sources() -> tuple[tuple[str, str], ...]:
    """Where the session's algorithms (those of conftests and test modules) were registered, for the ranks
    to import; installed ones are found there as here."""
    return tuple(sorted({a.source for a in _REGISTERED.values() if a.source[0] not in _INSTALLED}))


def forget_session() -> None:
    """Drop what a session registered: a conftest's algorithms live as long as its session."""
    for name in [name for name, a in _REGISTERED.items() if a.source[0] not in _INSTALLED]:
        del _REGISTERED[name]


_INSTALLED: set[str] = set()  # modules of installed packages that registered algorithms


@functools.cache
def _load_installed() -> None:
    """The algorithms of installed packages (the entry-point group), once: the project's own
    (pytest_collectives.algorithms.builtin) come through the same door as a user's package."""
    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        _INSTALLED.add(entry.module)
        entry.load()


def load(found: Iterable[tuple[str, str]]) -> None:
    """Import each (module, file) that registered algorithms in pytest's process (a conftest is loaded from
    its file, under a name of its own, where importing its name would find another)."""
    for module, path in found:
        if _origin(module) != path:
            spec = importlib.util.spec_from_file_location(f"_collectives_algorithms_{len(sys.modules)}", path)
            assert spec is not None and spec.loader is not None, path
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        elif module not in sys.modules:
            importlib.import_module(module)


def _origin(module: str) -> str | None:
    """The file ``import module`` would load here, if any."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        return str(Path(loaded.__file__).resolve()) if getattr(loaded, "__file__", None) else None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return str(Path(spec.origin).resolve()) if spec is not None and spec.origin else None
