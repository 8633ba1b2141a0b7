"""Training: one small model, one batch per step, every rank and the single process alike, and the first
parameter where a sharded run left one process's.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_collectives.execution.reproductions import write_closest

STEPS = 3
LEARNING_RATE = 0.1
# How far a sharded run's parameters may drift from one process's, by dtype. Each gradient element is a sum
# of at most batch x width = 8 x 32 products, so summing in another order (a reduce-scatter's, a sharded
# matmul's) moves it by at most 256 eps |terms|: 6e-14 in float64, 3e-5 in float32, and three steps of lr
# 0.1 keep the parameters within that. A wrong collective moves a parameter by about lr x its gradient,
# 1e-3 or more (an AVG run as SUM doubles the step at two ranks): each bound sits between, with room on
# both sides (measured: 1.5e-8 in float32 at 2 to 4 ranks).
BOUNDS = {torch.float32: 1e-4, torch.float64: 1e-10}


class ScaledLinear(torch.nn.Linear):
    """A linear layer whose output is scaled by a frozen parameter of another dtype (``frozen``)."""

    def __init__(self, fan_in: int, fan_out: int, dtype: torch.dtype, frozen: torch.dtype) -> None:
        super().__init__(fan_in, fan_out, dtype=dtype)
        scale = torch.linspace(0.5, 2.0, fan_out, dtype=frozen)  # exact in bfloat16 and wider
        self.scale = torch.nn.Parameter(scale, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.scale.to(x.dtype)


def tiny_model(
    device: torch.device, dtype: torch.dtype, hidden: int = 32, frozen: torch.dtype | None = None
) -> torch.nn.Sequential:
    """Three linear layers, 16 -> hidden -> hidden -> 4, with the same weights wherever it is built; with
    ``frozen``, the last scaled by a frozen parameter of that dtype (Stack.frozen).
    (Tensor parallelism needs a ``hidden`` its dimension divides: torch 2.13's ColwiseParallel then
    RowwiseParallel fail on uneven shards, "a and b must have same reduction dim".)"""
    generator = torch.Generator().manual_seed(0)
    layers: list[torch.nn.Module] = []
    for i, (fan_in, fan_out) in enumerate([(16, hidden), (hidden, hidden), (hidden, 4)]):
        if i == 2 and frozen is not None:
            linear = ScaledLinear(fan_in, fan_out, dtype, frozen)
        else:
            linear = torch.nn.Linear(fan_in, fan_out, dtype=dtype)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(fan_out, fan_in, generator=generator, dtype=dtype) / fan_in**0.5)
            linear.bias.copy_(torch.randn(fan_out, generator=generator, dtype=dtype) / 10)
        layers += [linear, torch.nn.ReLU()] if i < 2 else [linear]
    return torch.nn.Sequential(*layers).to(device)


def batch(step: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(8, 16, generator=generator, dtype=dtype)
    return x.to(device), torch.randn(8, 4, generator=generator, dtype=dtype).to(device)


@dataclasses.dataclass
class Step:
    loss: float
    parameters: dict[str, torch.Tensor]  # after the optimizer's step, whole (a DTensor's full tensor)
    collectives: list[str] = dataclasses.field(default_factory=list)  # the step's, in the order made


# c10d's ops, which every torch.distributed call reaches (the functional collectives DTensor and tensor
# parallelism call, and the in-place ones FSDP2 calls), whatever layer of the stack made it
_C10D_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
try:
    from torch.distributed.tensor import DTensor as _DTENSOR
except ImportError:  # before torch 2.5, where no training stack here runs
    _DTENSOR = ()


class CollectiveLog(TorchDispatchMode):
    """The collectives made while it is entered, in order, each with its tensors' dtypes and shapes: the
    closest thing to a reproduction a training step has, which a vendor can replay call by call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if any(issubclass(kind, _DTENSOR) for kind in types):
            # DTensor first, as torch's CommDebugMode lets it: it turns into the collectives on plain
            # tensors, which come back here
            return NotImplemented
        if func.namespace in _C10D_NAMESPACES:
            described = [said for said in map(_described, (*args, *(kwargs or {}).values())) if said]
            self.calls.append(f"{func.namespace}.{func._opname}({', '.join(described)})")
        return func(*args, **(kwargs or {}))


def _described(value: object) -> str:
    """A call's argument as a vendor replays it: a tensor's dtype and shape, the group's size, the reduce
    op (c10d's ops take both boxed; the functional ones name them); "" for the rest (async_op, timeout)."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return "[" + ", ".join(map(_described, value)) + "]"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, torch._C.ScriptObject):
        kind = value._type().name()
        if kind == "ProcessGroup":
            return f"group of {dist.ProcessGroup.unbox(value).size()}"
        if kind == "ReduceOp":
            code = value.op()  # its RedOpType's value
            names = {int(op): name for name, op in dist.ReduceOp.RedOpType.__members__.items()}
            return names.get(code, f"reduce op {code}")
    return ""


def train(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> list[Step]:
    """STEPS steps of SGD on the mean squared error, with every parameter read back whole after each."""
    # foreach=False: torch 2.11's foreach kernels refuse a mix of DTensor and plain parameters (seen at one
    # rank under tensor parallelism on an H200), and the update is the same either way
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, foreach=False)
    steps = []
    for step in range(STEPS):
        x, y = batch(step, device, dtype)
        with CollectiveLog() as log:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        value = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        whole = {name: _whole(p) for name, p in model.named_parameters()}
        steps.append(Step(float(value), whole, log.calls))
    return steps


def _whole(parameter: torch.Tensor) -> torch.Tensor:
    data = parameter.detach()
    return (data.full_tensor() if hasattr(data, "full_tensor") else data).cpu().clone()


def first_difference(
    expected: list[Step], actual: list[Step], forward: str, backward: str, bound: float
) -> str | None:
    """Where ``actual`` first leaves ``expected`` by more than ``bound``: the step, what differs and the
    collective to suspect. A step's loss depends on the parameters going into it (``forward``: what brings
    them together, e.g. FSDP2's all-gather); the parameters after it on its gradients (``backward``). Then,
    a line each, the collectives that step made as c10d received them."""
    for step, (want, got) in enumerate(zip(expected, actual, strict=True)):
        made = f".\nThe collectives of step {step} on this rank, in order:\n  " + _runs(got.collectives)
        if abs(want.loss - got.loss) > bound:
            return (
                f"step {step}: loss {got.loss!r}, one process {want.loss!r} (bound {bound:g}): the forward "
                f"pass differs; suspect {forward}{made}"
            )
        for name, value in want.parameters.items():
            error = float((got.parameters[name] - value).abs().max())
            if not error <= bound:
                ratio = float(got.parameters[name].norm() / value.norm()) if value.norm() else float("nan")
                return (
                    f"step {step}: parameter {name} differs from one process's by {error:.3g} (bound "
                    f"{bound:g}; norm ratio {ratio:.4g}): the gradients differ; suspect {backward}{made}"
                )
    return None


def _runs(calls: list[str]) -> str:
    """``calls`` in order, a line each, a call made several times in a row said once with its count."""
    runs = ((call, len(list(run))) for call, run in itertools.groupby(calls))
    return "\n  ".join(call + f" x{n}" * (n > 1) for call, n in runs) or "none"


def training_record(pg: Any, name: str, said: str) -> str:
    """A training test's failure message: ``said`` (first_difference's, with the collectives of the step
    that diverged), then the line naming the record of it written beside the reproductions, as a training
    step, a whole stack's calls, cannot be reproduced alone."""
    where = f"on rank {pg.rank} of {pg.world_size} ({pg.backend}, torch {torch.__version__})"
    text = f"# {name}, {where}\n{said}\n"
    line = write_closest(
        getattr(pg, "reproductions", ""), f"{name} rank{pg.rank}", text,
        "a training step cannot be reproduced alone", "the collectives of the step that diverged",
    )  # fmt: skip
    return f"{said}\n{line}"
