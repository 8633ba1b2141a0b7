"""Cross-rank mismatches: one rank calls an operation with a tensor of another dtype, or of another length,
than the others. A backend that checks ends the call in an error (or a crash, or a hang the harness names
within its deadline); one that does not returns on every rank with whatever the bytes made (NCCL reduces
mismatched dtypes silently: pytorch issue 150248). Some healthy backends do not check, so this is a
capability of the backend, reported per operation in the capability matrix (detected or silent), not a
failure.

The calls are the probe's own (``capabilities.REDUCTIONS`` and ``DATA_OPERATIONS``): the same tiny call,
with the last rank's tensor float64 where the others' is float32, or twice as long. ``call`` runs on every
rank; the controller reads the group's outcome with ``behaviour``, a crash or hang included, which the
pool answers by replacing the group.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from pytest_collectives.conformance import probing
from pytest_collectives.execution.messages import FAILED
from pytest_collectives.execution.outcome import CRASHED, HUNG, GroupOutcome, last_words

KINDS = ("dtype", "shape")
OPERATIONS = (
    "all_reduce",
    "reduce",
    "reduce_scatter_single",
    "reduce_scatter",
    "broadcast",
    "all_gather",
    "all_gather_single",
    "all_to_all_single",
    "all_to_all",
    "gather",
    "scatter",
    "send_recv",
)
SILENT = "silent"
DETECTED = "detected"
WHAT = "the last rank's tensor float64 where the others' is float32, or twice as long"
# A tiny call ends in milliseconds: one still running after this is a hang, named, and its group replaced.
DEADLINE_S = 2.0


def call(pg: Any, operation: str, kind: str) -> None:
    """On every rank: ``operation`` as the probe makes it, the last rank's tensor differing by ``kind``."""
    import torch
    import torch.distributed as dist

    from pytest_collectives.conformance import capabilities as caps

    n, odd = pg.world_size, pg.rank == pg.world_size - 1
    dtype = torch.float64 if odd and kind == "dtype" else torch.float32
    numel = 2 * n if odd and kind == "shape" else n
    calls = {**caps.REDUCTIONS, **caps.DATA_OPERATIONS}
    calls[operation](torch.ones(numel, dtype=dtype, device=pg.device), n, dist.ReduceOp.SUM)


def behaviour(outcome: GroupOutcome) -> str:
    """``silent`` when no rank failed; else ``detected: <how>``, how the blamed rank ended (one rule in
    every run, so the matrix reads the same words each time)."""
    first = outcome.blamed()
    if first is None or first.status not in (FAILED, CRASHED, HUNG):
        return SILENT
    if first.status == HUNG:
        return f"{DETECTED}: rank {first.rank} hung, named after {outcome.timeout_s:g} s"
    lines = first.detail.strip().splitlines()
    how = last_words(first.detail) or (lines[0] if lines else first.status)
    if first.status == CRASHED:
        how = f"crashed ({lines[0] if lines else 'no exit reason'}): {how}"
    how = re.sub(r"\s+", " ", how)[:200]
    return f"{DETECTED}: rank {first.rank} {how}"


def record(config: pytest.Config, operation: str, kind: str, world_size: int, behaviour: str) -> None:
    """Hand what ``operation`` did with a mismatch of ``kind`` to the session's capability matrix (none on
    an SPMD rank other than 0), which reports it beside the cells."""
    if (matrix := config.stash.get(probing.MATRIX, None)) is not None:
        matrix.add_mismatch(operation, kind, world_size, behaviour)


def world_size_for(world_sizes: tuple[int, ...]) -> int | None:
    """The smallest of the session's world sizes with two ranks or more: a mismatch needs a peer."""
    return min((n for n in world_sizes if n >= 2), default=None)


def healthy_sum(pg: Any) -> float:
    """On every rank: the sum of ones over the group, which a group left broken would not give."""
    import torch
    import torch.distributed as dist

    ones = torch.ones(1, device=pg.device)
    dist.all_reduce(ones)
    return ones.item()
