"""torch's functional collectives (``torch.distributed._functional_collectives``) in the registry's
contracts: the door tensor parallelism and DTensor reach the backend through. Each call returns a new
tensor, an async one until ``wait_tensor``, which the contract's in-place or output form then receives.
The probe calls these same functions (their own rows of the capability matrix), and builtin.py registers
them: what the functional path refuses (gloo's all_to_all_single of complex tensors, which the eager call
takes through view_as_real) is N/A for them alone.

Not registered: the functional reduce-scatter, whose PRODUCT of complex tensors on gloo multiplies the real
and imaginary parts apart (torch 2.13: (1+2j) * (2+2j) gives 2+4j, not -2+6j) where the eager call refuses
complex PRODUCT; no known-bug entry can yet name one cell of a test whose other cells it draws at random.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from pytest_collectives.algorithms.reference import OPS

__all__ = [
    "AVAILABLE",
    "NAMED_OPS",
    "functional_all_gather",
    "functional_all_reduce",
    "functional_all_to_all",
    "functional_broadcast",
]

# Before 2.3, funcol went through the legacy c10d_functional ops: broadcast took a global source rank, and
# on 2.2.2 the probe of these calls left the ranks out of step (a hang in the next call), so only the native
# ops since are checked.
AVAILABLE = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 3)
# PREMUL_SUM's factor has no name to pass: funcol takes reduce ops by name
NAMED_OPS = ("sum", "product", "min", "max", "avg", "band", "bor", "bxor")


def functional_all_reduce(tensor: torch.Tensor, op: dist.ReduceOp, group: dist.ProcessGroup) -> torch.Tensor:
    reduced = funcol.all_reduce(tensor.contiguous(), op_name(op), group)
    return tensor.copy_(funcol.wait_tensor(reduced))


def functional_all_gather(
    output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup
) -> torch.Tensor:
    gathered = funcol.all_gather_tensor(input.reshape(-1), 0, group)
    output.view(-1).copy_(funcol.wait_tensor(gathered))
    return output


def functional_all_to_all(
    output: torch.Tensor,
    input: torch.Tensor,
    output_splits: list[int] | None,
    input_splits: list[int] | None,
    group: dist.ProcessGroup,
) -> torch.Tensor:
    moved = funcol.all_to_all_single(input.reshape(-1), output_splits, input_splits, group)
    output.view(-1).copy_(funcol.wait_tensor(moved))
    return output


def functional_broadcast(tensor: torch.Tensor, root: int, group: dist.ProcessGroup) -> torch.Tensor:
    return tensor.copy_(funcol.wait_tensor(funcol.broadcast(tensor.contiguous(), root, group)))


def op_name(op: dist.ReduceOp) -> str:
    """The name funcol takes for ``op`` (ReduceOp == RedOpType holds only that way round)."""
    for name, value in OPS.items():
        if name in NAMED_OPS and op == value:
            return name
    raise NotImplementedError(f"functional collectives take reduce ops by name: {', '.join(NAMED_OPS)}")
