"""DTensor's redistribute: every pair of placements on a 1-D and a 2-D mesh, each a row of the matrix, moving
a tensor of whole numbers so that any sum of shards is exact.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from typing import Any

import torch

DTYPE = torch.float64  # what DTensor's redistributions move: whole numbers, so any sum of shards is exact
REDISTRIBUTE = "dtensor_redistribute"
# DTensor's own refusal: a placement change it does not offer whatever the backend (its words, 2.5+).
DTENSOR_REFUSALS = (
    r"Can not redistribute from .* to .*, redistributing to Partial is for internal use only!",
)


@functools.cache
def placements(dims: int) -> tuple[tuple[Any, ...], ...]:
    """Every placement of ``dims`` mesh dimensions over a 2-D tensor: Shard(0), Shard(1), Replicate,
    Partial on each (made once: every example's matrix cell and name index into them)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    one = [Shard(0), Shard(1), Replicate(), Partial()]
    return tuple(itertools.product(one, repeat=dims))


def short(placement: tuple[Any, ...]) -> str:
    """(Shard(0), Replicate()) -> "S(0)R": DTensor's own short forms."""
    return "".join(str(p) for p in placement)


def pair_cell(source: tuple[Any, ...], target: tuple[Any, ...]) -> tuple[str, str, str]:
    return (REDISTRIBUTE, str(DTYPE).removeprefix("torch."), f"{short(source)}->{short(target)}")


# Uneven on every mesh size up to 8: no world size the suites use divides 7 or 5 rows into equal shards.
FULL_SHAPE = (7, 5)


def full_tensor() -> torch.Tensor:
    """The tensor every redistribution moves: small whole numbers, so any sum of shards is exact."""
    return torch.arange(FULL_SHAPE[0] * FULL_SHAPE[1], dtype=DTYPE).reshape(FULL_SHAPE) - 11


def distributed(device_mesh: Any, source: tuple[Any, ...]) -> Any:
    """``full_tensor()`` placed as ``source``; a Partial dimension holds it whole on its coordinate 0 and
    zeros elsewhere, so its sum is the tensor itself."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

    if not any(isinstance(p, Partial) for p in source):
        return distribute_tensor(full_tensor().to(device_mesh.device_type), device_mesh, list(source))
    laid = [Replicate() if isinstance(p, Partial) else p for p in source]
    local = distribute_tensor(full_tensor().to(device_mesh.device_type), device_mesh, laid).to_local()
    coordinate = device_mesh.get_coordinate()
    if any(isinstance(p, Partial) and coordinate[i] != 0 for i, p in enumerate(source)):
        local = torch.zeros_like(local)
    return DTensor.from_local(local, device_mesh, list(source), run_check=False, shape=FULL_SHAPE,
                              stride=full_tensor().stride())  # fmt: skip


def refusal(call: Callable[[], object]) -> str:
    """DTensor's refusal of ``call`` in its own words, or "": it went through, or failed another way, which
    leaves the pair supported, so the suite runs it and fails on it."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - classified: a refusal or not
        line = str(exc).splitlines()[0] if str(exc) else ""
        return line if any(re.fullmatch(p, line) for p in DTENSOR_REFUSALS) else ""
    return ""
