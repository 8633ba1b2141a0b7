"""How the training stacks reach the backend, as the conformance suite checks it: FSDP2 (``fully_shard``),
tensor parallelism (``parallelize_module``) and DTensor ``redistribute``, on the group under test.

The stacks make calls the plain-operation properties never make (FSDP2's flat all-gather into a buffer its
input is a view of, its averaged reduce-scatter of gradients, DTensor's placement changes on one and two
mesh dimensions), so each is checked end to end against one process doing the same work: a small model
trained a few steps on the same batch on every rank, or a whole tensor placed and read back. A failure
names the step, the parameter and the collective that first differs.

Each stack is a row of the capability matrix (``fsdp2``, ``tensor_parallel``, ``dtensor_redistribute
<from>-><to>``); ``probe``, run on the live group once per world size in a session with training tests
(conformance/probing.py), says which rows this torch has and marks as N/A a redistribution DTensor refuses
in its own words.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import itertools
import re
from collections.abc import Callable
from typing import Any

import torch

DTYPE = torch.float64  # what DTensor's redistributions move: whole numbers, so any sum of shards is exact
STEPS = 3
LEARNING_RATE = 0.1
# How far a sharded run's parameters may drift from one process's, by dtype. Each gradient element is a sum
# of at most batch x width = 8 x 32 products, so summing in another order (a reduce-scatter's, a sharded
# matmul's) moves it by at most 256 eps |terms|: 6e-14 in float64, 3e-5 in float32, and three steps of lr
# 0.1 keep the parameters within that. A wrong collective moves a parameter by about lr x its gradient,
# 1e-3 or more (an AVG run as SUM doubles the step at two ranks): each bound sits between, with room on
# both sides (measured: 1.5e-8 in float32 at 2 to 4 ranks).
BOUNDS = {torch.float32: 1e-4, torch.float64: 1e-10}

FSDP2, TENSOR_PARALLEL, REDISTRIBUTE = "fsdp2", "tensor_parallel", "dtensor_redistribute"
FUNCTIONAL = "functional"  # the functional collectives' rows: "functional all_reduce", ...
# DTensor's own refusal: a placement change it does not offer whatever the backend (its words, 2.5+).
DTENSOR_REFUSALS = (
    r"Can not redistribute from .* to .*, redistributing to Partial is for internal use only!",
)


# What each API needs public, and the torch that has it: what ``missing`` looks for.
_DTENSOR = ("torch.distributed.tensor", "DTensor")
_APIS = {
    FSDP2: ((("torch.distributed.fsdp", "fully_shard"), _DTENSOR), "2.6"),
    TENSOR_PARALLEL: ((("torch.distributed.tensor.parallel", "parallelize_module"), _DTENSOR), "2.5"),
    REDISTRIBUTE: ((_DTENSOR,), "2.5"),
    FUNCTIONAL: ((("torch.distributed._functional_collectives", "wait_tensor"),), "2.1"),
}


def missing(api: str) -> str | None:
    """Why this torch can't run ``api`` (a key of _APIS), or None."""
    needs, since = _APIS[api]
    for module, name in needs:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return f"torch {torch.__version__} has no {module}.{name} ({api}): it needs torch {since}"
    return None


@dataclasses.dataclass(frozen=True)
class Stack:
    """A training stack on a device mesh of ``dims`` dimensions, training in ``dtype``: a row of the
    capability matrix. The dtype picks FSDP2's gradient reduction: AVG in float32, SUM with a division
    before and after in float64 (torch.distributed.fsdp's _get_gradient_divide_factors)."""

    name: str  # FSDP2, TENSOR_PARALLEL
    dims: int  # 1: every rank on one dimension; 2: (dp, tp), where the world size splits so
    dtype: str = "float32"
    # A frozen parameter of this dtype beside the trainable ones of a unit: FSDP2 then all-gathers the
    # unit's parameters as uint8 bytes (the path mixed dtypes take, float8 training's among them).
    frozen: str = ""

    def cells(self) -> tuple[tuple[str, str, str], ...]:
        label = f"{self.dims}-D mesh" + (", uint8 all-gather" if self.frozen else "")
        return ((self.name, self.dtype, label),)

    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def frozen_dtype(self) -> torch.dtype | None:
        return getattr(torch, self.frozen) if self.frozen else None

    def __repr__(self) -> str:
        return f"{self.name}-{self.dims}d-{self.dtype}" + ("-uint8" if self.frozen else "")


@dataclasses.dataclass(frozen=True)
class Redistribution:
    """One DTensor placement change on a mesh of ``dims`` dimensions (indices into ``placements``)."""

    dims: int
    source: int
    target: int

    def placements(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        every = placements(self.dims)
        return every[self.source], every[self.target]

    def cells(self) -> tuple[tuple[str, str, str], ...]:
        return (pair_cell(*self.placements()),)

    def __repr__(self) -> str:
        return pair_cell(*self.placements())[2]


# ---------------------------------------------------------------------------------------------------------
# Meshes: made once per shape in each rank process (each is a group rendezvous of every rank)

_MESHES: dict[tuple[Any, str, tuple[int, ...]], Any] = {}


def mesh(device_type: str, shape: tuple[int, ...]) -> Any:
    """The device mesh of ``shape`` over the default group, cached for the process."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    key = (dist.group.WORLD, device_type, shape)
    if key not in _MESHES:
        names = ("dp", "tp") if len(shape) == 2 else None
        _MESHES[key] = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return _MESHES[key]


def mesh_shape(world_size: int, dims: int) -> tuple[int, ...] | None:
    """Every rank on one dimension, or (dp, tp) with tp = 2 where the world size is even and 4 or more."""
    if dims == 1:
        return (world_size,)
    return (world_size // 2, 2) if world_size >= 4 and world_size % 2 == 0 else None


# ---------------------------------------------------------------------------------------------------------
# Training: one model, one batch per step, every rank and the single process alike


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


def train(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> list[Step]:
    """STEPS steps of SGD on the mean squared error, with every parameter read back whole after each."""
    # foreach=False: torch 2.11's foreach kernels refuse a mix of DTensor and plain parameters (seen at one
    # rank under tensor parallelism on an H200), and the update is the same either way
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, foreach=False)
    steps = []
    for step in range(STEPS):
        x, y = batch(step, device, dtype)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        value = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        steps.append(Step(float(value), {name: _whole(p) for name, p in model.named_parameters()}))
    return steps


def _whole(parameter: torch.Tensor) -> torch.Tensor:
    data = parameter.detach()
    return (data.full_tensor() if hasattr(data, "full_tensor") else data).cpu().clone()


def first_difference(
    expected: list[Step], actual: list[Step], forward: str, backward: str, bound: float
) -> str | None:
    """Where ``actual`` first leaves ``expected`` by more than ``bound``: the step, what differs and the
    collective to suspect. A step's loss depends on the parameters going into it (``forward``: what brings
    them together, e.g. FSDP2's all-gather); the parameters after it on its gradients (``backward``)."""
    for step, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if abs(want.loss - got.loss) > bound:
            return (
                f"step {step}: loss {got.loss!r}, one process {want.loss!r} (bound {bound:g}): the forward "
                f"pass differs; suspect {forward}"
            )
        for name, value in want.parameters.items():
            error = float((got.parameters[name] - value).abs().max())
            if not error <= bound:
                ratio = float(got.parameters[name].norm() / value.norm()) if value.norm() else float("nan")
                return (
                    f"step {step}: parameter {name} differs from one process's by {error:.3g} (bound "
                    f"{bound:g}; norm ratio {ratio:.4g}): the gradients differ; suspect {backward}"
                )
    return None


# ---------------------------------------------------------------------------------------------------------
# DTensor redistribute: every pair of placements on a 1-D and a 2-D mesh


@functools.cache
def placements(dims: int) -> tuple[tuple[Any, ...], ...]:
    """Every placement of ``dims`` mesh dimensions over a 2-D tensor: Shard(0), Shard(1), Replicate,
    Partial on each (made once: every example's matrix cell and name index into them)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    one = [Shard(0), Shard(1), Replicate(), Partial()]
    return tuple(itertools.product(one, repeat=dims))


def short(placement: tuple[Any, ...]) -> str:
    """(Shard(0), Replicate()) -> "S(0)R": DTensor's own short forms."""
    return "".join(str(p) for p in placement)


def pair_cell(source: tuple[Any, ...], target: tuple[Any, ...]) -> tuple[str, str, str]:
    return (REDISTRIBUTE, str(DTYPE).removeprefix("torch."), f"{short(source)}->{short(target)}")


# Uneven on every mesh size up to 8: no world size the suites use divides 7 or 5 rows into equal shards.
FULL_SHAPE = (7, 5)


def full_tensor() -> torch.Tensor:
    """The tensor every redistribution moves: small whole numbers, so any sum of shards is exact."""
    return torch.arange(FULL_SHAPE[0] * FULL_SHAPE[1], dtype=DTYPE).reshape(FULL_SHAPE) - 11


def distributed(device_mesh: Any, source: tuple[Any, ...]) -> Any:
    """``full_tensor()`` placed as ``source``; a Partial dimension holds it whole on its coordinate 0 and
    zeros elsewhere, so its sum is the tensor itself."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

    if not any(isinstance(p, Partial) for p in source):
        return distribute_tensor(full_tensor().to(device_mesh.device_type), device_mesh, list(source))
    laid = [Replicate() if isinstance(p, Partial) else p for p in source]
    local = distribute_tensor(full_tensor().to(device_mesh.device_type), device_mesh, laid).to_local()
    coordinate = device_mesh.get_coordinate()
    if any(isinstance(p, Partial) and coordinate[i] != 0 for i, p in enumerate(source)):
        local = torch.zeros_like(local)
    return DTensor.from_local(local, device_mesh, list(source), run_check=False, shape=FULL_SHAPE,
                              stride=full_tensor().stride())  # fmt: skip


def _refused(call: Callable[[], object]) -> str:
    """DTensor's refusal of ``call`` in its own words, or "": it went through, or failed another way, which
    leaves the pair supported, so the suite runs it and fails on it."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - classified: a refusal or not
        line = str(exc).splitlines()[0] if str(exc) else ""
        return line if any(re.fullmatch(p, line) for p in DTENSOR_REFUSALS) else ""
    return ""


# ---------------------------------------------------------------------------------------------------------
# The functional collectives (torch.distributed._functional_collectives): what tensor parallelism and
# DTensor call, each result an AsyncCollectiveTensor read after wait_tensor


@dataclasses.dataclass(frozen=True)
class FunctionalCall:
    """One functional collective (a name of ``FUNCTIONAL_CALLS``), on whole-number float32 inputs."""

    name: str

    def cells(self) -> tuple[tuple[str, str, str], ...]:
        reducing = "reduce" in self.name
        return ((f"{FUNCTIONAL} {self.name}", "float32", "sum" if reducing else "-"),)

    def __repr__(self) -> str:
        return self.name


def rank_input(rank: int, n: int, rows: int = 3) -> torch.Tensor:
    """Rank ``rank``'s input: ``rows`` x 2 per rank of whole numbers, distinct on every rank, so any sum of
    them is exact in float32."""
    return torch.arange(n * rows * 2, dtype=torch.float32).reshape(n * rows, 2) + 1000 * rank


def _uneven_splits(sender: int, n: int) -> list[int]:
    """Rows ``sender`` sends each peer in the uneven all_to_all_single: 1 or 2, zero to its right-hand one."""
    return [0 if j == (sender + 1) % n and n > 1 else 1 + (sender + j) % 2 for j in range(n)]


def functional_results(
    name: str, rank: int, n: int, group: Any, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(what ``name`` returned on ``device`` after wait_tensor, what it must be) for each tensor returned."""
    import torch.distributed._functional_collectives as funcol

    mine, every = rank_input(rank, n).to(device), [rank_input(r, n) for r in range(n)]
    total = sum(every, torch.zeros_like(every[0]))
    if name == "all_reduce":
        pairs = [(funcol.all_reduce(mine, "sum", group), total)]
    elif name == "all_gather_tensor":
        pairs = [(funcol.all_gather_tensor(mine[:2], 0, group), torch.cat([x[:2] for x in every]))]
    elif name == "reduce_scatter_tensor":
        pairs = [(funcol.reduce_scatter_tensor(mine, "sum", 0, group), total.chunk(n)[rank])]
    elif name == "all_to_all_single":
        ins = _uneven_splits(rank, n)
        outs = [_uneven_splits(r, n)[rank] for r in range(n)]
        source = mine[: sum(ins)]
        expected = torch.cat([x[: sum(_uneven_splits(r, n))].split(_uneven_splits(r, n))[rank] for r, x in
                              enumerate(every)])  # fmt: skip
        pairs = [(funcol.all_to_all_single(source, outs, ins, group), expected)]
    elif name == "all_reduce_coalesced":
        got = funcol.all_reduce_coalesced([mine, mine[1:] * 2], "sum", group)
        pairs = list(zip(got, [total, total[1:] * 2], strict=True))
    elif name == "all_gather_into_tensor_coalesced":
        got = funcol.all_gather_into_tensor_coalesced([mine[:1], mine[:2]], group)
        pairs = list(zip(got, [torch.cat([x[:k] for x in every]) for k in (1, 2)], strict=True))
    elif name == "reduce_scatter_tensor_coalesced":
        got = funcol.reduce_scatter_tensor_coalesced([mine, mine * 3], "sum", [0, 0], group)
        pairs = list(zip(got, [total.chunk(n)[rank], (total * 3).chunk(n)[rank]], strict=True))
    else:
        raise ValueError(f"no functional collective {name!r}; one of {', '.join(FUNCTIONAL_CALLS)}")
    return [(funcol.wait_tensor(got), want) for got, want in pairs]


FUNCTIONAL_CALLS = (
    "all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "all_to_all_single",
    "all_reduce_coalesced", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced",
)  # fmt: skip


# FSDP2 in both of its gradient reductions; tensor parallelism in the dtype models train in.
STACKS = (
    *(Stack(FSDP2, dims, dtype) for dims in (1, 2) for dtype in ("float32", "float64")),
    Stack(FSDP2, 1, "float32", frozen="bfloat16"),
    *(Stack(TENSOR_PARALLEL, dims) for dims in (1, 2)),
)


def probe(world_size: int, device_type: str) -> dict[tuple[str, str, str], str]:
    """The training rows at ``world_size``: "" where supported, else why not. A redistribution to a
    Partial placement is tried, and N/A where DTensor refuses it; the others run in the suite."""
    found: dict[tuple[str, str, str], str] = {}
    for name in FUNCTIONAL_CALLS:
        found[FunctionalCall(name).cells()[0]] = missing(FUNCTIONAL) or ""
    for dims in (1, 2):
        shape = mesh_shape(world_size, dims)
        if shape is None:
            continue
        for stack in STACKS:
            if stack.dims == dims:
                found[stack.cells()[0]] = missing(stack.name) or ""
        if missing(REDISTRIBUTE):
            continue
        device_mesh = mesh(device_type, shape)
        for source, target in itertools.product(placements(dims), repeat=2):
            cell = pair_cell(source, target)
            found[cell] = ""
            if any(_is_partial(t) and not _is_partial(s) for s, t in zip(source, target, strict=True)):
                found[cell] = _refused(
                    lambda s=source, t=target, m=device_mesh: distributed(m, s).redistribute(m, list(t))
                )
    return found


def _is_partial(placement: Any) -> bool:
    from torch.distributed.tensor import Partial

    return isinstance(placement, Partial)


def probe_rows(pg: Any) -> dict[tuple[str, str, str], str]:
    """``probe`` on the ranks of ``pg`` (run_on_ranks' calling convention)."""
    return probe(pg.world_size, pg.device.type)
