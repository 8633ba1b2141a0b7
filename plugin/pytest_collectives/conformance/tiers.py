"""How much of the 1 Mi tier a sweep runs: every cell, or one a sweep turning with the run (``rotation``).

Which, the machine decides, not the moment: a run's cells are those of its command, its seed and its
machine, so that a rerun of a red run, or CI comparing two runs, draws the same examples. By default the
topology does (``every_cell_by_topology``): every cell where each rank has a core (or a device) of its own,
one a sweep where ranks take turns on a core (3 or more ranks on 2 cores), which is what the budget below
measured on a quiet 2-core machine, without its swing: under load the measured cost of a 1 Mi example
shrank the tier from every cell to one, and a bug planted only at 1 Mi went unseen at some seeds.

``--tier-budget SECONDS`` asks for the measured budget instead, knowing that it follows the machine's load:
what a 1 Mi example costs is measured once per world size on the live group, before its first sweep
(``large_example_s``, asked by ``probing.sized``): a few all_reduce examples of 1 Mi elements in different
dtypes, drawn, called and checked as a sweep's are, the slowest rank's. all_reduce's cells (the most a
sweep has) at that cost either fit the budget or they do not. The budget's seconds are a machine's that
draws a 1 Mi input in DRAW_S; the probe times that draw on the live group and scales the budget by it.
The ranks draw at once, as an example's do, so that the draw meets what the examples meet on a busy
machine (``timed_draw``). The summary line says which decided, per world size, with what was measured.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

# A budget in the timed example's terms (a sweep's cell at 1 Mi costs about twice it), at DRAW_S a draw:
# on the 2-core machine a 1 Mi example costs 3.0 to 4.4 draws at 2 ranks, 7.4 to 9.0 at 3, alone or beside
# one or two busy programs (docs/measurements), so 59 cells 1.4 to 2.1 s at 2 ranks and 3.5 to 4.2 s at 3
# in these terms: 2.7 s sits as far from each (1.3 times). The topology's rule draws the same line.
BUDGET_S = 2.7
DRAW_S = 0.008  # a 1 Mi float32 input, Values("full"): the machine the budget is for
# The cells of the timed examples, those supported: a 4-byte float, a 2-byte one, an integer and a
# complex, whose drawing and checking cost two to three times float32's.
SAMPLE = (("float32", "sum"), ("float16", "sum"), ("int32", "max"), ("complex64", "sum"))
TRIES = 3  # examples timed of each sampled cell


def every_cell_fits(cells: int, example_s: float | None, draw_s: float | None, budget_s: float) -> bool:
    """Whether ``cells`` examples of ``example_s`` seconds each fit ``budget_s`` on a machine that draws a
    1 Mi input in ``draw_s`` (the budget is in DRAW_S terms); never where nothing was measured (a backend
    with no all_reduce to time)."""
    return example_s is not None and draw_s is not None and cells * example_s * DRAW_S <= budget_s * draw_s


def every_cell_by_topology(device_type: str, sharing: int) -> bool:
    """Whether a sweep runs every cell at 1 Mi on this machine: where each rank has a device of its own,
    or a CPU rank a core of its own (``sharing``, ``ranks_a_core``, is 1). Ranks that take turns on a core
    pay several times the rest of the run for every cell at 1 Mi; they turn one a sweep."""
    return device_type != "cpu" or sharing <= 1


def ranks_sharing_a_core(pg: Any) -> int:
    """On every rank: ``ranks_a_core`` of the group, each rank's node and the cores it may run on gathered
    (its affinity, which warm_groups.rank_cores sets: what the machine is, not how busy it is)."""
    import torch.distributed as dist

    from pytest_collectives.topology.detect import usable_cores

    seen: list[Any] = [None] * pg.world_size
    dist.all_gather_object(seen, (pg.node_of(pg.rank), sorted(usable_cores())))
    return ranks_a_core(seen)


def ranks_a_core(cores: Sequence[tuple[int, Sequence[int]]]) -> int:
    """The most ranks that take turns on a core, from each rank's (node, the cores it may run on): on each
    node, its ranks over the cores they have between them, rounded up (warm_groups.rank_cores pins ranks that
    outnumber the cores round them)."""
    nodes: dict[int, tuple[int, set[int]]] = {}
    for node, mine in cores:
        ranks, union = nodes.get(node, (0, set()))
        nodes[node] = (ranks + 1, union | set(mine))
    return max((-(-ranks // max(1, len(union))) for ranks, union in nodes.values()), default=1)


def timed_draw(pg: Any, size: int, seed: int, sharing: int) -> float:
    """On every rank: the seconds a rank took to draw a ``size`` float32 input, every rank drawing its own at
    once as an example's ranks do, the slowest rank's over the ``sharing`` ranks (``ranks_a_core``) that
    drew one after another on its core: the machine's speed at that moment as the group loads it. One rank
    drawing alone, the others waiting, found a core free beside another program where the examples' two
    ranks did not, and read the machine as idle: at 2 ranks the examples cost 1.5 times as many of its
    draws beside other work as alone, and the tier turned (docs/measurements)."""
    import torch
    import torch.distributed as dist

    from pytest_collectives.algorithms.reference import Values, rank_input

    took = torch.zeros(1, dtype=torch.float64, device=pg.device)
    dist.barrier()
    start = time.perf_counter()
    rank_input(seed, pg.rank, size, torch.float32, values=Values("full"), op="sum", members=pg.world_size)
    took += (time.perf_counter() - start) / sharing
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return took.item()


def large_example_s(
    pg: Any, cells: Sequence[tuple[str, str]], size: int, most: int, budget_s: float
) -> tuple[float, float]:
    """On every rank: the mean over ``cells`` (dtype name, reduce op) the probe found supported of the
    median seconds of TRIES all_reduce examples of ``size`` elements, each on its own seed, drawn, called
    and checked as in a sweep, the slowest rank's; and the median of the ``timed_draw`` before each. One
    untimed example comes first: a session's first 1 Mi example took three to six times what later ones
    did. The median of distinct seeds, not the least of repeats: a repeat reads the inputs its first try
    left in the group's folder, which no sweep example does. The ranks agree on the mean after each cell,
    and stop once ``most`` cells at that mean would not fit the budget: at 8 ranks on 2 cores an example
    takes 1 to 2 s. A check that fails is timed as one that passes: the sweeps judge the backend, not
    this."""
    import torch
    import torch.distributed as dist

    from pytest_collectives.algorithms import registry
    from pytest_collectives.algorithms.reference import Values
    from pytest_collectives.conformance.cases import Case
    from pytest_collectives.conformance.properties import all_reduce_matches_reference

    all_reduce = registry.get("all_reduce")

    def example(dtype: str, op: str, seed: int) -> float:
        case = Case(("all_reduce",), getattr(torch, dtype), op, size, "contiguous", None, 0, Values("full"))
        pg.begin(seed)
        start = time.perf_counter()
        try:
            all_reduce_matches_reference(pg, all_reduce, case)
        except AssertionError:
            pass
        return time.perf_counter() - start

    example(*cells[0], seed=len(cells) * TRIES)
    sharing = ranks_sharing_a_core(pg)
    took, mean, draws = 0.0, 0.0, []
    for i, cell in enumerate(cells):
        tries = []
        for seed in range(i * TRIES, (i + 1) * TRIES):
            draws.append(timed_draw(pg, size, seed, sharing))
            tries.append(example(*cell, seed=seed))
        took += statistics.median(tries)
        draw = statistics.median(draws)
        slowest = torch.tensor([took / (i + 1)], dtype=torch.float64, device=pg.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        mean = slowest.item()
        if not every_cell_fits(most, mean, draw, budget_s):
            break
    return mean, draw
