"""The training stacks as rows of the capability matrix, and the probe that says which this torch has."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from typing import Any

import torch

from pytest_collectives.conformance.training.functional import FUNCTIONAL, FUNCTIONAL_CALLS, FunctionalCall
from pytest_collectives.conformance.training.meshes import mesh, mesh_shape
from pytest_collectives.conformance.training.redistribute import (
    REDISTRIBUTE,
    distributed,
    pair_cell,
    placements,
    refusal,
)

FSDP2 = "fsdp2"
TENSOR_PARALLEL = "tensor_parallel"


# What each API needs public, and the torch that has it: what ``missing`` looks for.
_DTENSOR = ("torch.distributed.tensor", "DTensor")
_APIS = {
    FSDP2: ((("torch.distributed.fsdp", "fully_shard"), _DTENSOR), "2.6"),
    TENSOR_PARALLEL: ((("torch.distributed.tensor.parallel", "parallelize_module"), _DTENSOR), "2.5"),
    REDISTRIBUTE: ((_DTENSOR,), "2.5"),
    FUNCTIONAL: ((("torch.distributed._functional_collectives", "wait_tensor"),), "2.1"),
}


def missing(api: str) -> str | None:
    """Why this torch can't run ``api`` (a key of _APIS), or None."""
    needs, since = _APIS[api]
    for module, name in needs:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return f"torch {torch.__version__} has no {module}.{name} ({api}): it needs torch {since}"
    return None


@dataclasses.dataclass(frozen=True)
class Stack:
    """A training stack on a device mesh of ``dims`` dimensions, training in ``dtype``: a row of the
    capability matrix. The dtype picks FSDP2's gradient reduction: AVG in float32, SUM with a division
    before and after in float64 (torch.distributed.fsdp's _get_gradient_divide_factors)."""

    name: str  # FSDP2, TENSOR_PARALLEL
    dims: int  # 1: every rank on one dimension; 2: (dp, tp), where the world size splits so
    dtype: str = "float32"
    # A frozen parameter of this dtype beside the trainable ones of a unit: FSDP2 then all-gathers the
    # unit's parameters as uint8 bytes (the path mixed dtypes take, float8 training's among them).
    frozen: str = ""

    def cells(self) -> tuple[tuple[str, str, str], ...]:
        label = f"{self.dims}-D mesh" + (", uint8 all-gather" if self.frozen else "")
        return ((self.name, self.dtype, label),)

    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def frozen_dtype(self) -> torch.dtype | None:
        return getattr(torch, self.frozen) if self.frozen else None

    def __repr__(self) -> str:
        return f"{self.name}-{self.dims}d-{self.dtype}" + ("-uint8" if self.frozen else "")


@dataclasses.dataclass(frozen=True)
class Redistribution:
    """One DTensor placement change on a mesh of ``dims`` dimensions (indices into ``placements``)."""

    dims: int
    source: int
    target: int

    def placements(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        every = placements(self.dims)
        return every[self.source], every[self.target]

    def cells(self) -> tuple[tuple[str, str, str], ...]:
        return (pair_cell(*self.placements()),)

    def __repr__(self) -> str:
        return pair_cell(*self.placements())[2]


# FSDP2 in both of its gradient reductions; tensor parallelism in the dtype models train in.
STACKS = (
    *(Stack(FSDP2, dims, dtype) for dims in (1, 2) for dtype in ("float32", "float64")),
    Stack(FSDP2, 1, "float32", frozen="bfloat16"),
    *(Stack(TENSOR_PARALLEL, dims) for dims in (1, 2)),
)


def unnamed_group() -> str | None:
    """Why the default group can't carry a training stack, or None: DeviceMesh and the functional
    collectives find a group by its c10d name, and torch keeps that name on the c10d Backend registered
    for a device, which a ``dist.ProcessGroup`` written in Python has none of (torch 2.13)."""
    import torch.distributed as dist

    try:
        _ = dist.group.WORLD.group_name
    except RuntimeError as error:
        backend = dist.get_backend()
        return (
            f"{backend} is a ProcessGroup written in Python, and torch finds a group for DeviceMesh and the "
            f"functional collectives by the name it keeps on a C++ c10d Backend ({error}); a backend "
            f"registered as a c10d Backend runs them"
        )
    return None


def probe(world_size: int, device_type: str) -> dict[tuple[str, str, str], str]:
    """The training rows at ``world_size``: "" where supported, else why not. A redistribution to a
    Partial placement is tried, and N/A where DTensor refuses it; the others run in the suite."""
    unnamed = unnamed_group()
    found: dict[tuple[str, str, str], str] = {}
    for name in FUNCTIONAL_CALLS:
        found[FunctionalCall(name).cells()[0]] = missing(FUNCTIONAL) or unnamed or ""
    for dims in (1, 2):
        shape = mesh_shape(world_size, dims)
        if shape is None:
            continue
        for stack in STACKS:
            if stack.dims == dims:
                found[stack.cells()[0]] = missing(stack.name) or unnamed or ""
        if missing(REDISTRIBUTE):
            continue
        if unnamed:
            found.update((pair_cell(s, t), unnamed) for s, t in itertools.product(placements(dims), repeat=2))
            continue
        device_mesh = mesh(device_type, shape)
        for source, target in itertools.product(placements(dims), repeat=2):
            cell = pair_cell(source, target)
            found[cell] = ""
            if any(_is_partial(t) and not _is_partial(s) for s, t in zip(source, target, strict=True)):
                found[cell] = refusal(
                    lambda s=source, t=target, m=device_mesh: distributed(m, s).redistribute(m, list(t))
                )
    return found


def _is_partial(placement: Any) -> bool:
    from torch.distributed.tensor import Partial

    return isinstance(placement, Partial)


def probe_rows(pg: Any) -> dict[tuple[str, str, str], str]:
    """``probe`` on the ranks of ``pg`` (run_on_ranks' calling convention)."""
    return probe(pg.world_size, pg.device.type)
