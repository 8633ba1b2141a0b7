"""Prints what a large example's own work costs on one process, one thread: drawing one rank's input
(``rank_input``), the exact reference of two ranks' inputs, and the check of a result against it.

    python docs/measurements/scripts/bench_large_inputs.py [--elements 1048576] [--repeat 7]

Each figure is the least of ``--repeat`` timed calls after one untimed, in ms. Run it on two checkouts
(``PYTHONPATH=<checkout>/plugin``) to compare them. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from pytest_collectives.algorithms.reference import Values, assert_reduced_close, rank_input, reduce_reference

# (dtype, reduce op, values): what the sweeps' large tiers draw (full), and the random examples (small)
CASES = (
    (torch.float32, "sum", "full"),
    (torch.float32, "sum", "spread"),
    (torch.float32, "product", "full"),
    (torch.float32, "sum", "small"),
    (torch.bfloat16, "sum", "small"),
    (torch.float64, "sum", "full"),
    (torch.int32, "sum", "full"),
    (torch.int8, "sum", "full"),
    (torch.float32, None, "full"),  # moved, not reduced: any bit pattern
    (torch.bool, None, "full"),
)


def least(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def timings(dtype: torch.dtype, op: str | None, values: Values, elements: int, repeat: int) -> list[float]:
    """[draw] for a moved input, [draw, reference, check] for a reduced one."""

    def draw(rank: int) -> torch.Tensor:
        return rank_input(1, rank, elements, dtype, values=values, op=op, members=2)

    found = [least(lambda: draw(0), repeat)]
    if op is not None:
        inputs = [draw(0), draw(1)]
        exact = reduce_reference(inputs, op).to(dtype)
        found.append(least(lambda: reduce_reference(inputs, op), repeat))
        found.append(least(lambda: assert_reduced_close(exact.clone(), inputs, op, values), repeat))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 20)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"dtype      op       values     draw  reference   check  (ms, least of {args.repeat})")
    for dtype, op, kind in CASES:
        found = timings(dtype, op, Values(kind), args.elements, args.repeat)
        figures = " ".join(f"{f:{w}.2f}" for f, w in zip(found, (7, 10, 7)[: len(found)], strict=True))
        print(f"{str(dtype).removeprefix('torch.'):10} {op or '-':8} {kind:7} {figures}")


if __name__ == "__main__":
    main()
