"""What a rank and the controller share about it: its ``pg`` (RankContext), the files its output and stack
land in, the count of tasks it took, and the signal that asks for its stack."""

from __future__ import annotations

import dataclasses
import mmap
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pytest_collectives.execution import shared_inputs
from pytest_collectives.execution.messages import (
    stable_seed_of,
)

STACK_SIGNAL = signal.SIGUSR1


def rank_files(workdir: str | Path, rank: int) -> dict[str, Path]:
    """Where a rank's stdout, stderr and stack dump land: the controller reads them even after a kill."""
    base = Path(workdir)
    return {kind: base / f"rank{rank}.{kind}" for kind in ("stdout", "stderr", "stack")}


def tasks_taken(workdir: str | Path, world_size: int) -> memoryview:
    """How many tasks each rank has taken, in a file that pytest and the ranks map: a rank counts each task
    as it takes it, and pytest reads the count only for a rank that died or hung (did it die in the test?),
    so no rank spends a message on it, nor pytest a wakeup. pytest creates the file, before the ranks."""
    fd = os.open(Path(workdir, "taken"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if not os.fstat(fd).st_size:
            os.ftruncate(fd, 8 * world_size)
        return memoryview(mmap.mmap(fd, 8 * world_size)).cast("q")
    finally:
        os.close(fd)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    # torch.manual_seed visits every device's generator: 160 us a call, most of an empty test's dispatch
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)


@dataclasses.dataclass(repr=False)
class RankContext:
    """What a distributed test receives as its ``pg`` fixture, on every rank."""

    rank: int
    world_size: int
    backend: str
    device: torch.device
    seed: int
    reproductions: str = ""  # where the running test's standalone reproductions go (--reproductions)
    drafts: dict[str, str] = dataclasses.field(default_factory=dict)  # those it drafted (RankResult.drafts)
    _subgroups: dict[tuple[int, ...], Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def group(self) -> dist.ProcessGroup:
        return dist.group.WORLD

    def new_group(self, ranks: list[int] | tuple[int, ...]) -> dist.ProcessGroup | None:
        """A subgroup of ``ranks``; every rank must call this with the same ranks (as with ``new_group``).

        Subgroups are cached for the life of the worker group: creating one is a collective rendezvous,
        far slower than the tests that use it. Ranks outside the subgroup get None.
        """
        key = tuple(sorted(set(ranks)))
        if key not in self._subgroups:
            self._subgroups[key] = dist.new_group(list(key))
        return self._subgroups[key] if self.rank in key else None

    def reseed(self, example: dict[str, Any]) -> None:
        """Seed this rank from one example's values, as a call with that example alone would be."""
        self.begin(stable_seed_of("", example))

    def begin(self, seed: int) -> None:
        """A test or example begins on this rank: seeded by ``seed``, with the inputs of an older one gone."""
        self.seed = seed
        seed_everything(seed)
        shared_inputs.next_example()

    def __repr__(self) -> str:
        return f"<pg rank {self.rank} of {self.world_size}, {self.backend} on {self.device}>"

    def node_of(self, rank: int) -> int:
        """The node that ``rank`` runs on: a pooled group is on this one (SPMD mode spans several)."""
        return 0

    def link(self, a: int, b: int) -> str:
        """How ranks a and b are connected, to label P2P results: "intra-node" or "inter-node"."""
        return "intra-node" if self.node_of(a) == self.node_of(b) else "inter-node"

    def generator(self, rank: int | None = None) -> torch.Generator:
        """A CPU generator seeded from this test's seed and ``rank``: any rank can rebuild another's data."""
        return torch.Generator().manual_seed(self.seed * 1009 + (self.rank if rank is None else rank))
