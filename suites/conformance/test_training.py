"""Will a training stack run correctly on this backend? FSDP2, tensor parallelism and DTensor's
redistribute, each on a 1-D mesh and a 2-D (dp, tp) mesh where the world size allows, against one process
doing the same work (pytest_collectives.conformance.training). ``pytest suites/conformance -m training``
runs just these; the run's closing summary gives each stack's verdict in a line."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import pytest_collectives
from pytest_collectives import (
    FSDP2,
    FULL_SHAPE,
    FUNCTIONAL_CALLS,
    REDISTRIBUTE,
    STACKS,
    TENSOR_PARALLEL,
    TRAINING_BOUNDS,
    FunctionalCall,
    Redistribution,
    active_capabilities,
    distributed_tensor,
    first_difference,
    full_tensor,
    functional_results,
    item_parameter,
    mesh_shape,
    missing_api,
    placements,
    tiny_model,
    train,
    training_mesh,
    training_record,
)

pytestmark = [pytest.mark.conformance, pytest.mark.training]

# The collectives each stack makes, named when its run first leaves the one-process run's.
FSDP2_FORWARD = "all_gather_single into FSDP2's flat buffer (each rank's input a view of its own slice)"
FSDP2_BACKWARD = {
    torch.float32: "reduce_scatter_single with AVG (FSDP2 averages float32 gradients; a SUM there scales "
    "them by the ranks)",
    torch.float64: "reduce_scatter_single with SUM between FSDP2's divisions of float64 gradients",
}
HSDP = ", or the all_reduce across the replicate dimension (HSDP)"
FSDP2_UINT8 = ", as uint8 bytes (a unit whose parameters differ in dtype)"
TP_FORWARD = "all_reduce of RowwiseParallel's partial outputs"
TP_BACKWARD = "all_reduce of ColwiseParallel's input gradients"


@pytest.fixture(autouse=True)
def _na_where_refused(request: pytest.FixtureRequest, world_size: int) -> None:
    params = request.node.callspec.params
    dims = params["stack"].dims if "stack" in params else params.get("dims", 1)
    if mesh_shape(world_size, dims) is None:
        pytest.skip(f"N/A: a {dims}-D (dp, tp) mesh needs an even world size of 4 or more ranks")
    found = active_capabilities().cells
    if "dims" in params:
        reason = missing_api(REDISTRIBUTE)
        every = range(len(placements(dims))) if reason is None else ()
        reasons = [found.get(Redistribution(dims, i, j).cells()[0]) for i in every for j in every]
        reason = reason or (None if "" in reasons else reasons[0])
    else:
        reason = found.get(params.get("stack", params.get("call")).cells()[0])
    if reason:
        pytest.skip(f"N/A: {reason}")


def _sharded(model: torch.nn.Module, device_mesh) -> torch.nn.Module:  # noqa: ANN001
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=device_mesh)
    return fully_shard(model, mesh=device_mesh)


def _tensor_parallel(model: torch.nn.Module, device_mesh) -> torch.nn.Module:  # noqa: ANN001
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(model, device_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


@pytest.mark.world_size()
@pytest.mark.parametrize("stack", [s for s in STACKS if s.name == FSDP2], ids=repr)
def test_fsdp2_trains_like_one_process(pg, stack):
    """fully_shard on each layer and the model, on every rank (1-D) or as HSDP on (replicate, shard); with
    a frozen bfloat16 parameter in the last layer's unit, whose parameters FSDP2 then all-gathers as uint8."""
    device_mesh = training_mesh(pg.device.type, mesh_shape(pg.world_size, stack.dims))
    dtype, frozen = stack.torch_dtype(), stack.frozen_dtype()
    expected = train(tiny_model(pg.device, dtype, frozen=frozen), pg.device, dtype)
    model = _sharded(tiny_model(pg.device, dtype, frozen=frozen), device_mesh)
    forward = FSDP2_FORWARD + (FSDP2_UINT8 if frozen else "")
    backward = FSDP2_BACKWARD[dtype] + (HSDP if stack.dims == 2 else "")
    got = train(model, pg.device, dtype)
    failure = first_difference(expected, got, forward, backward, TRAINING_BOUNDS[dtype])
    said = f"FSDP2 in {stack.dtype} on a {tuple(device_mesh.mesh.shape)} mesh, {failure}"
    assert failure is None, training_record(pg, f"fsdp2 {stack!r} ws{pg.world_size}", said)


@pytest.mark.world_size()
@pytest.mark.parametrize("stack", [s for s in STACKS if s.name == TENSOR_PARALLEL], ids=repr)
def test_tensor_parallel_trains_like_one_process(pg, stack):
    """Colwise then rowwise linear layers on every rank (1-D), or on the tp dimension with FSDP2 over dp."""
    shape = mesh_shape(pg.world_size, stack.dims)
    device_mesh = training_mesh(pg.device.type, shape)
    hidden, dtype = 8 * shape[-1], stack.torch_dtype()  # a width tp divides (tiny_model says why)
    expected = train(tiny_model(pg.device, dtype, hidden), pg.device, dtype)
    model = tiny_model(pg.device, dtype, hidden)
    if stack.dims == 1:
        model, forward, backward = _tensor_parallel(model, device_mesh), TP_FORWARD, TP_BACKWARD
    else:
        model = _sharded(_tensor_parallel(model, device_mesh["tp"]), device_mesh["dp"])
        forward = f"{TP_FORWARD}, or {FSDP2_FORWARD}"
        backward = f"{TP_BACKWARD}, or {FSDP2_BACKWARD[dtype]}"
    got = train(model, pg.device, dtype)
    failure = first_difference(expected, got, forward, backward, TRAINING_BOUNDS[dtype])
    said = f"tensor parallel on a {shape} mesh, {failure}"
    assert failure is None, training_record(pg, f"tensor_parallel {stack!r} ws{pg.world_size}", said)


@pytest.mark.world_size()
@pytest.mark.parametrize("call", [FunctionalCall(name) for name in FUNCTIONAL_CALLS], ids=repr)
def test_functional_collective_gives_the_reference_after_wait_tensor(pg, call):
    """What tensor parallelism and DTensor call (torch.distributed._functional_collectives), on the default
    group: each result, read after wait_tensor, is the exact reduction or placement of every rank's input
    (all_to_all_single with uneven splits, a zero split among them)."""
    results = functional_results(call.name, pg.rank, pg.world_size, pg.group, pg.device)
    for i, (got, want) in enumerate(results):
        assert torch.equal(got.cpu(), want), (
            f"functional {call.name} on rank {pg.rank} of {pg.world_size}, result {i}: "
            f"{(got.cpu() != want).sum().item()} of {want.numel()} element(s) differ; got {got.tolist()}, "
            f"expected {want.tolist()}"
        )


def _redistributions() -> st.SearchStrategy[list[Redistribution]]:
    """Every placement pair the probe found supported on the test's mesh at this world size."""

    def listed(_: object) -> list[Redistribution]:
        dims, found = item_parameter("dims"), active_capabilities().cells
        every = range(len(placements(dims)))
        pairs = [Redistribution(dims, i, j) for i in every for j in every]
        return [p for p in pairs if found.get(p.cells()[0]) == ""]

    return st.just(None).map(listed)


@pytest.mark.world_size()
@pytest.mark.parametrize("dims", [1, 2], ids=["1d_mesh", "2d_mesh"])
@pytest_collectives.sweep(pair=_redistributions())
def test_dtensor_redistribute_every_placement_pair(pg, dims, pair):
    """Shard(0), Shard(1), Replicate and Partial on each mesh dimension, to each other, of an uneven
    tensor; the whole tensor read back (full_tensor) must be the one placed, element for element."""
    _check_redistribution(pg, pair)


def _check_redistribution(pg, pair: Redistribution) -> None:  # noqa: ANN001
    shape = mesh_shape(pg.world_size, pair.dims)
    device_mesh = training_mesh(pg.device.type, shape)
    source, target = pair.placements()
    moved = distributed_tensor(device_mesh, source).redistribute(device_mesh, list(target))
    where = f"redistribute {pair!r} of a {FULL_SHAPE} tensor on a {shape} mesh"
    assert tuple(moved.placements) == target, f"{where}: placed as {moved.placements}"
    whole, expected = moved.full_tensor().cpu(), full_tensor()
    if not torch.equal(whole, expected):
        wrong = (whole != expected).nonzero().tolist()
        raise AssertionError(
            f"{where}: {len(wrong)} element(s) of {expected.numel()} differ from the tensor placed, first at "
            f"{wrong[0]} (rank {pg.rank} holds {moved.to_local().shape} locally): {whole[tuple(wrong[0])]} "
            f"instead of {expected[tuple(wrong[0])]}"
        )
