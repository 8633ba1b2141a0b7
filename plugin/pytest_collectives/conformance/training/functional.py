"""The functional collectives (torch.distributed._functional_collectives): what tensor parallelism and
DTensor call, each result an AsyncCollectiveTensor read after wait_tensor.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

FUNCTIONAL = "functional"  # the functional collectives' rows: "functional all_reduce", ...


@dataclasses.dataclass(frozen=True)
class FunctionalCall:
    """One functional collective (a name of ``FUNCTIONAL_CALLS``), on whole-number float32 inputs."""

    name: str

    def cells(self) -> tuple[tuple[str, str, str], ...]:
        reducing = "reduce" in self.name
        return ((f"{FUNCTIONAL} {self.name}", "float32", "sum" if reducing else "-"),)

    def __repr__(self) -> str:
        return self.name


def rank_input(rank: int, n: int, rows: int = 3) -> torch.Tensor:
    """Rank ``rank``'s input: ``rows`` x 2 per rank of whole numbers, distinct on every rank, so any sum of
    them is exact in float32."""
    return torch.arange(n * rows * 2, dtype=torch.float32).reshape(n * rows, 2) + 1000 * rank


def _uneven_splits(sender: int, n: int) -> list[int]:
    """Rows ``sender`` sends each peer in the uneven all_to_all_single: 1 or 2, zero to its right-hand one."""
    return [0 if j == (sender + 1) % n and n > 1 else 1 + (sender + j) % 2 for j in range(n)]


def functional_results(
    name: str, rank: int, n: int, group: Any, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(what ``name`` returned on ``device`` after wait_tensor, what it must be) for each tensor returned."""
    import torch.distributed._functional_collectives as funcol

    mine, every = rank_input(rank, n).to(device), [rank_input(r, n) for r in range(n)]
    total = sum(every, torch.zeros_like(every[0]))
    if name == "all_reduce":
        pairs = [(funcol.all_reduce(mine, "sum", group), total)]
    elif name == "all_gather_tensor":
        pairs = [(funcol.all_gather_tensor(mine[:2], 0, group), torch.cat([x[:2] for x in every]))]
    elif name == "reduce_scatter_tensor":
        pairs = [(funcol.reduce_scatter_tensor(mine, "sum", 0, group), total.chunk(n)[rank])]
    elif name == "all_to_all_single":
        ins = _uneven_splits(rank, n)
        outs = [_uneven_splits(r, n)[rank] for r in range(n)]
        source = mine[: sum(ins)]
        expected = torch.cat([x[: sum(_uneven_splits(r, n))].split(_uneven_splits(r, n))[rank] for r, x in
                              enumerate(every)])  # fmt: skip
        pairs = [(funcol.all_to_all_single(source, outs, ins, group), expected)]
    elif name == "all_reduce_coalesced":
        got = funcol.all_reduce_coalesced([mine, mine[1:] * 2], "sum", group)
        pairs = list(zip(got, [total, total[1:] * 2], strict=True))
    elif name == "all_gather_into_tensor_coalesced":
        got = funcol.all_gather_into_tensor_coalesced([mine[:1], mine[:2]], group)
        pairs = list(zip(got, [torch.cat([x[:k] for x in every]) for k in (1, 2)], strict=True))
    elif name == "reduce_scatter_tensor_coalesced":
        got = funcol.reduce_scatter_tensor_coalesced([mine, mine * 3], "sum", [0, 0], group)
        pairs = list(zip(got, [total.chunk(n)[rank], (total * 3).chunk(n)[rank]], strict=True))
    else:
        raise ValueError(f"no functional collective {name!r}; one of {', '.join(FUNCTIONAL_CALLS)}")
    return [(funcol.wait_tensor(got), want) for got, want in pairs]


FUNCTIONAL_CALLS = (
    "all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "all_to_all_single",
    "all_reduce_coalesced", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced",
)  # fmt: skip
