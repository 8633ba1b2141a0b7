"""How much of the 1 Mi tier a sweep runs: every cell where the time budget holds them, else one a sweep,
turning with the run (``rotation``).

What a 1 Mi example costs is measured once per world size on the live group, before its first sweep
(``large_example_s``, asked by ``probing.sized``): a few all_reduce examples of 1 Mi elements in different
dtypes, drawn, called and checked as a sweep's are, the slowest rank's mean. all_reduce's cells (the most
a sweep has) at that cost either fit ``--tier-budget`` seconds or they do not. At 2 ranks of a small
machine they do (and on a GPU they should): every cell at every tier. Where a rank shares its core with
others (3 or more ranks on 2 cores), a 1 Mi example costs about three times as much, every cell at 1 Mi
would cost the sweeps several times the rest of the run, and one turns instead. The summary line says
which, per world size, with what was measured.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

# --tier-budget's default, in the timed example's terms (a sweep's cell at 1 Mi costs about twice it): on
# the 2-core machine 59 cells cost 0.7 to 0.9 s at 2 ranks, 1.9 to 2.5 s at 3 (docs/measurements).
BUDGET_S = 1.2
# The cells of the timed examples, those supported: a 4-byte float, a 2-byte one, an integer and a
# complex, whose drawing and checking cost two to three times float32's.
SAMPLE = (("float32", "sum"), ("float16", "sum"), ("int32", "max"), ("complex64", "sum"))


def every_cell_fits(cells: int, example_s: float | None, budget_s: float) -> bool:
    """Whether ``cells`` examples of ``example_s`` seconds each fit ``budget_s``; never where nothing was
    measured (a backend with no all_reduce to time)."""
    return example_s is not None and cells * example_s <= budget_s


def large_example_s(
    pg: Any, cells: Sequence[tuple[str, str]], size: int, most: int, budget_s: float
) -> float:
    """On every rank: the mean seconds of one all_reduce example of ``size`` elements for each of ``cells``
    (dtype name, reduce op) the probe found supported, drawn, called and checked as in a sweep, the
    slowest rank's. Each cell's is the lesser of two tries: a first 1 Mi call of a session, or a moment the
    machine was busy, once took twice what the sweeps then did. The ranks agree on the mean after each
    cell, and stop once ``most`` cells at that mean would not fit ``budget_s``: at 8 ranks on 2 cores an
    example takes 1 to 2 s. A check that fails is timed as one that passes: the sweeps judge the backend,
    not this."""
    import torch
    import torch.distributed as dist

    from pytest_collectives.algorithms import registry
    from pytest_collectives.algorithms.reference import Values
    from pytest_collectives.conformance.cases import Case
    from pytest_collectives.conformance.properties import all_reduce_matches_reference

    all_reduce, took, mean = registry.get("all_reduce"), 0.0, 0.0
    for i, (dtype, op) in enumerate(cells):
        values = Values("full", i)
        case = Case(("all_reduce",), getattr(torch, dtype), op, size, "contiguous", None, 0, values)
        tries = []
        for _ in range(2):
            pg.begin(i)
            start = time.perf_counter()
            try:
                all_reduce_matches_reference(pg, all_reduce, case)
            except AssertionError:
                pass
            tries.append(time.perf_counter() - start)
        took += min(tries)
        slowest = torch.tensor([took / (i + 1)], dtype=torch.float64, device=pg.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        mean = slowest.item()
        if not every_cell_fits(most, mean, budget_s):
            break
    return mean
