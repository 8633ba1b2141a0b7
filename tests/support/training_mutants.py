"""Training-stack bugs planted on purpose, one per run: ``--backend-module training_mutants`` with
``TRAINING_MUTANT=<name>`` patches, on every rank, the call the training stacks reach the backend through.
tests/test_training_mutants.py runs suites/conformance/test_training.py under each and expects the bug
caught with its consequence named; without TRAINING_MUTANT nothing is patched."""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def avg_reduce_scatter_run_as_sum() -> None:
    """reduce_scatter with AVG sums (gloo's bug, pytorch 162338): FSDP2's gradients times the world size."""
    original = dist.reduce_scatter_single

    @functools.wraps(original)
    def summed(*args: Any, op: Any = dist.ReduceOp.SUM, **kwargs: Any) -> Any:
        return original(*args, op=dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op, **kwargs)

    dist.reduce_scatter_single = summed


def all_gather_ignores_an_aliased_input() -> None:
    """all_gather into a buffer its input is a view of clears the buffer first, input included (FSDP2's
    in-place flat all-gather then gathers zeros)."""
    original = dist.all_gather_single

    @functools.wraps(original)
    def clobbering(output: torch.Tensor, input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if input.untyped_storage().data_ptr() == output.untyped_storage().data_ptr():
            output.zero_()
        return original(output, input, *args, **kwargs)

    dist.all_gather_single = clobbering


def uint8_all_gather_swaps_two_ranks() -> None:
    """all_gather of bytes (uint8) puts rank 0's part where rank 1's goes and the other way round, a
    backend's byte path computing offsets wrongly: FSDP2's units of mixed dtypes gather the wrong shards."""
    original = dist.all_gather_single

    @functools.wraps(original)
    def swapping(output: torch.Tensor, input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        work = original(output, input, *args, **kwargs)
        if output.dtype == torch.uint8:
            if work is not None:
                work.wait()
            parts = output.view(-1).view(dist.get_world_size(kwargs.get("group")), -1)
            parts[[0, 1]] = parts[[1, 0]].clone()
        return work

    dist.all_gather_single = swapping


def functional_all_reduce_returns_before_the_data() -> None:
    """funcol.all_reduce hands back this rank's own input, as a wait_tensor that returned before the data
    arrived would: tensor parallelism's row-wise outputs are each rank's partial sums."""

    def early(tensor: torch.Tensor, reduceOp: str, group: Any, tag: str = "") -> torch.Tensor:  # noqa: N803
        return tensor.clone()

    funcol.all_reduce = early


def redistribute_drops_an_uneven_last_shard() -> None:
    """Shard -> Replicate leaves the rows of an uneven last shard zero."""
    from torch.distributed.tensor.placement_types import Shard

    original = Shard._to_replicate_tensor

    @functools.wraps(original)
    def dropping(self: Any, local_tensor: torch.Tensor, mesh: Any, mesh_dim: int, shape: Any) -> torch.Tensor:
        result = original(self, local_tensor, mesh, mesh_dim, shape)
        chunks, size = mesh.size(mesh_dim=mesh_dim), int(shape[self.dim])
        if size % chunks:
            last = size - size // chunks * (chunks - 1) if size // chunks else 0
            result = result.clone()
            result.narrow(self.dim, size - last, last).zero_()
        return result

    Shard._to_replicate_tensor = dropping


MUTANTS = {
    f.__name__: f
    for f in (
        avg_reduce_scatter_run_as_sum,
        all_gather_ignores_an_aliased_input,
        uint8_all_gather_swaps_two_ranks,
        functional_all_reduce_returns_before_the_data,
        redistribute_drops_an_uneven_last_shard,
    )
}

if os.environ.get("TRAINING_MUTANT"):
    MUTANTS[os.environ["TRAINING_MUTANT"]]()
