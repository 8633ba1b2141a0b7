"""The project's own algorithms, registered through the same door as a user's (registry.algorithm).

``register(module)`` registers the algorithms of ``collectives`` (or of a copy of it: the planted-bug tests
register a mutant under a prefix); importing this module registers the real ones.
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist

from pytest_collectives.algorithms import collectives
from pytest_collectives.algorithms.registry import algorithm

# The algorithms built from send/recv fold every reduce op themselves but PREMUL_SUM, whose factor is
# opaque to them.
P2P_OPS = ("sum", "product", "min", "max", "avg", "band", "bor", "bxor")


def register(alg: types.ModuleType, prefix: str = "") -> None:
    """Register the algorithms defined in ``alg`` (and the backend's own operations beside them)."""

    def add(operation: str, name: str, fn, **contract) -> None:  # noqa: ANN001
        algorithm(operation, prefix + name, stacklevel=3, **contract)(fn)

    add("all_reduce", "all_reduce", alg.all_reduce_direct, uses=("all_reduce",))
    add(
        "all_reduce", "reduce_broadcast", alg.all_reduce_reduce_broadcast,
        uses=("reduce", "broadcast"), grid={"root": (-1,)},
    )  # fmt: skip
    add(
        "all_reduce", "reduce_scatter_all_gather", alg.all_reduce_reduce_scatter_all_gather,
        uses=("reduce_scatter_single", "all_gather_single"),
    )  # fmt: skip
    add("all_reduce", "ring_all_reduce", alg.ring_all_reduce, uses=("send_recv",), ops=P2P_OPS)
    add("all_reduce", "naive_ring_all_reduce", alg.naive_ring_all_reduce, uses=("send_recv",), ops=P2P_OPS)

    def backend_reduce_scatter(output: torch.Tensor, input: torch.Tensor, op, group) -> torch.Tensor:  # noqa: ANN001
        alg.reduce_scatter_single(output, input, op=op, group=group)
        return output

    # named apart from the algorithm they call: a reproduction copies both into one file
    def ring_reduce_scatter_per_rank(output, input, op, group, steps_per_rank: int) -> torch.Tensor:  # noqa: ANN001
        return alg.ring_reduce_scatter(output, input, group=group, steps=steps_per_rank * _size(group))

    add("reduce_scatter", "reduce_scatter_single", backend_reduce_scatter, uses=("reduce_scatter_single",))
    add(
        "reduce_scatter", "ring_reduce_scatter", ring_reduce_scatter_per_rank,
        uses=("send_recv",), ops=("sum",), grid={"steps_per_rank": (1, 3)},
    )  # fmt: skip

    def gemm_reduce_scatter_per_rank(a, b, group, steps_per_rank: int) -> torch.Tensor:  # noqa: ANN001
        return alg.gemm_reduce_scatter(a, b, group=group, steps=steps_per_rank * _size(group))

    add(
        "gemm_reduce_scatter", "gemm_reduce_scatter", gemm_reduce_scatter_per_rank,
        uses=("send_recv",), ops=("sum",), grid={"steps_per_rank": (1, 3)},
    )  # fmt: skip
    add(
        "gemm_reduce_scatter", "gemm_reduce_scatter_sequential", alg.gemm_reduce_scatter_sequential,
        uses=("reduce_scatter_single",), ops=("sum",),
    )  # fmt: skip

    def backend_all_gather(output: torch.Tensor, input: torch.Tensor, group) -> torch.Tensor:  # noqa: ANN001
        alg.all_gather_single(output, input, group=group)
        return output

    add("all_gather", "all_gather_single", backend_all_gather, uses=("all_gather_single",))
    add("all_gather", "ring_all_gather", alg.ring_all_gather, uses=("send_recv",))

    def backend_all_to_all(output, input, output_splits, input_splits, group) -> torch.Tensor:  # noqa: ANN001
        dist.all_to_all_single(output, input, output_splits, input_splits, group=group)
        return output

    add("all_to_all", "all_to_all_single", backend_all_to_all, uses=("all_to_all_single",))
    add("all_to_all", "pairwise_all_to_all", alg.pairwise_all_to_all, uses=("send_recv",))

    def backend_broadcast(tensor: torch.Tensor, root: int, group) -> torch.Tensor:  # noqa: ANN001
        dist.broadcast(tensor, src=dist.get_global_rank(group, root), group=group)
        return tensor

    add("broadcast", "broadcast", backend_broadcast, uses=("broadcast",))
    add("broadcast", "binomial_tree_broadcast", alg.binomial_tree_broadcast, uses=("send_recv",))

    def backend_reduce(tensor: torch.Tensor, root: int, op, group) -> torch.Tensor:  # noqa: ANN001
        dist.reduce(tensor, dst=dist.get_global_rank(group, root), op=op, group=group)
        return tensor

    add("reduce", "reduce", backend_reduce, uses=("reduce",))
    add("reduce", "binomial_tree_reduce", alg.binomial_tree_reduce, uses=("send_recv",), ops=P2P_OPS)


def _size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group)


register(collectives)
