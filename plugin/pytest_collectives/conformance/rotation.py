"""Where the sweeps' rotating tiers stand in this run: a turn taken from the run's seed.

A sweep (``examples.sweep``) is one hypothesis example, and hypothesis' first example is its simplest
draw: a rotation drawn by hypothesis would stand at 0 in every run. So the turn is the run's own: the
``--hypothesis-seed`` where one is given (the same seed turns the sweeps the same way: a failure's replay),
else a random one, said in the run's summary. Each world size of a run stands one turn further, so the
world sizes of one run draw different cells, and consecutive seeds walk every cell.
"""

from __future__ import annotations

import random
import zlib

import pytest

from pytest_collectives.execution.suite_api import item_parameter

_RUN = pytest.StashKey[int]()
WORKER_INPUT = "collectives_turn"  # an xdist worker's turn, handed over by its controller
_current = 0


def of_run(config: pytest.Config) -> int:
    """The run's turn: its ``--hypothesis-seed`` (a soak sets one per pass), else a random one fixed at the
    first conformance test."""
    seed = config.getoption("hypothesis_seed", None)
    handed = getattr(config, "workerinput", {}).get(WORKER_INPUT)
    if handed is not None and seed is None:
        config.stash[_RUN] = handed
    elif seed is not None:  # hypothesis takes any string for a seed; a number stands for itself
        text = str(seed)
        config.stash[_RUN] = int(text) if text.isdigit() else zlib.crc32(text.encode())
    elif _RUN not in config.stash:
        config.stash[_RUN] = random.SystemRandom().randrange(1 << 16)
    return config.stash[_RUN]


def taken(config: pytest.Config) -> int | None:
    """The run's turn, if a conformance test took one."""
    return config.stash.get(_RUN, None)


def use(turn: int) -> None:
    """Set the run's turn for the strategies of the running test (probing sets it before each draw)."""
    global _current
    _current = turn


def turn() -> int:
    """The running test's turn: the run's, plus its world size. Not its place among the sizes selected: a
    replay that selects one test at one world size must turn where the run did."""
    return _current + item_parameter("world_size")
