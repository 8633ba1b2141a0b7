"""Hypothesis strategies and rank-side helpers shared by the conformance suites.

Values are drawn once, in pytest's process; every rank receives the same draw and rebuilds every rank's
input from the test's shared seed (reference.rank_input), so the exact reference is computed locally.
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTEGERS = [torch.int8, torch.uint8, torch.int32, torch.int64]
DTYPES = FLOATS + INTEGERS + [torch.bool]
FLOAT_OPS = ["sum", "product", "min", "max", "avg"]
INTEGER_OPS = ["sum", "product", "min", "max", "band", "bor", "bxor"]

# 0, 1, primes, sizes that no world size up to 8 divides, and a few MiB (2**20 + 3 float64 is 8 MiB).
EDGE_SIZES = [0, 1, 2, 3, 5, 7, 13, 31, 97, 101, 419, 1021, 4099]
SIZES = st.one_of(
    st.sampled_from(EDGE_SIZES),
    st.integers(0, 5000),
    st.integers(0, 5000).map(lambda k: (1 << 16) + k),
    st.just((1 << 20) + 3),
)
MAX_RANKS = 8  # members and roots are drawn up to this and folded onto the actual world
MEMBERS = st.none() | st.frozensets(st.integers(0, MAX_RANKS - 1), min_size=1)


def ops_for(dtype: torch.dtype) -> list[str]:
    return FLOAT_OPS if dtype.is_floating_point else INTEGER_OPS


@dataclasses.dataclass(frozen=True)
class Reduction:
    dtype: torch.dtype
    op: str
    size: int
    strided: bool  # a non-contiguous view (every other element of a larger buffer)
    members: frozenset[int] | None  # None: the whole world; else the ranks of a subgroup (folded mod n)
    root: int  # folded onto the group size


@st.composite
def reductions(
    draw: st.DrawFn, dtypes: list[torch.dtype] = DTYPES, sizes: st.SearchStrategy = SIZES
) -> Reduction:
    dtype = draw(st.sampled_from(dtypes))
    return Reduction(
        dtype=dtype,
        op=draw(st.sampled_from(ops_for(dtype))),
        size=draw(sizes),
        strided=draw(st.booleans()),
        members=draw(MEMBERS),
        root=draw(st.integers(0, MAX_RANKS - 1)),
    )


def group_of(pg, members: frozenset[int] | None) -> tuple[object | None, list[int]]:
    """(group, its global ranks) for a drawn subgroup; group is None on ranks outside it.

    Every rank calls this, members or not: creating a group is collective over the world.
    """
    if members is None:
        return pg.group, list(range(pg.world_size))
    ranks = sorted({m % pg.world_size for m in members})
    return pg.new_group(ranks), ranks


def laid_out(tensor: torch.Tensor, strided: bool, device: torch.device) -> torch.Tensor:
    """The same values, contiguous or as every other element of a buffer twice the size."""
    if not strided:
        return tensor.clone().to(device)
    buffer = torch.empty(tensor.numel() * 2, dtype=tensor.dtype, device=device)
    view = buffer[::2]
    view.copy_(tensor)
    return view
