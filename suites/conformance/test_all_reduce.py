"""Every registered all-reduce agrees with the exact reference, and the three decompositions agree with
each other.

The project's five (pytest_collectives.algorithms.builtin): the backend's all_reduce; reduce then
broadcast; reduce_scatter then all_gather; the bandwidth-optimal ring; the tutorial's full-buffer ring.
A user's, registered with ``@pytest_collectives.algorithm("all_reduce", ...)``, is checked beside them.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from pytest_collectives import (
    EXCEPTIONAL,
    FLOATS,
    LARGE_SIZES,
    FailingCall,
    algorithm_named,
    all_reduce_matches_reference,
    assert_reduced_close,
    backend_modules,
    examples,
    exceptional_script,
    kinds,
    large,
    of_the_algorithm,
    rank_input,
    real_dtype,
    reduce_op,
    reductions,
    refusal,
    registered,
    run_all_reduce,
    write_reproduction,
)

pytestmark = pytest.mark.conformance  # drawn from the probe of the live group

DECOMPOSITIONS = ["all_reduce", "reduce_broadcast(root=-1)", "reduce_scatter_all_gather"]


# Each algorithm is its own test with its own examples: drawn from one pool, the rings got too few of
# them to be sure of meeting each op (a planted MIN-as-MAX in the rings went unseen in 160 examples).
@pytest.mark.world_size()
@pytest.mark.parametrize("algorithm", registered("all_reduce"))
@examples(case=of_the_algorithm(reductions))
def test_all_reduce_matches_exact_reference(pg, algorithm, case):
    """Every reduce op the algorithm claims and the backend calls it is made of support, AVG and
    PREMUL_SUM included."""
    all_reduce_matches_reference(pg, algorithm_named(algorithm), case)


# The shapes a training step hands the backend besides flat buffers: a loss or a counter (0-d), a bias, a
# weight's gradient, an activation.
TRAINING_SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4)]


@pytest.mark.world_size()
@pytest.mark.parametrize("algorithm", registered("all_reduce"))
@examples(
    case=of_the_algorithm(reductions, members=st.none(), layouts=("contiguous",)),
    shape=st.sampled_from(TRAINING_SHAPES),
)
def test_all_reduce_of_a_scalar_and_of_a_matrix(pg, algorithm, case, shape):
    """A 0-d tensor (a loss, a metric) and one of several dimensions (a gradient) are reduced whole and keep
    their shape: a backend that counts the elements by the dimensions, and so passes a 0-d tensor over,
    fails here, where the other examples hand it flat buffers (and torch a complex tensor as (n, 2))."""
    inputs = [case.input(pg.seed, r, shape, pg.world_size) for r in range(pg.world_size)]
    tensor = inputs[pg.rank].to(pg.device, copy=True)
    result = algorithm_named(algorithm)(tensor, reduce_op(case.op), group=None)
    assert result is tensor and tensor.shape == shape, (
        f"{algorithm} of a {list(shape)} tensor gave {list(result.shape)}"
    )
    assert_reduced_close(tensor, inputs, case.op, case.values)


# One large message per call: a batch of them would take seconds.
@pytest.mark.world_size()
@pytest.mark.parametrize("algorithm", registered("all_reduce"))
@large()
@given(case=of_the_algorithm(reductions, sizes=LARGE_SIZES))
def test_all_reduce_of_a_large_message(pg, algorithm, case):
    """64 Ki and 1 Mi elements (plus a small size): where chunked and pipelined schedules split."""
    all_reduce_matches_reference(pg, algorithm_named(algorithm), case)


@pytest.mark.world_size()
@pytest.mark.needs(*DECOMPOSITIONS, together=True)
@examples(case=reductions(DECOMPOSITIONS, together=True))
def test_decompositions_agree_with_each_other(pg, case):
    """Exact dtypes and ops must agree bit for bit; rounding may differ only within the reference bound.
    Each is judged against the exact reference, not against all_reduce: a broken all_reduce once read
    "reduce_broadcast disagrees with all_reduce", blaming the decomposition that was right."""
    results = [run_all_reduce(pg, algorithm_named(name), case) for name in DECOMPOSITIONS]
    if results[0] is None:
        return
    for name, (result, inputs) in zip(DECOMPOSITIONS, results, strict=True):
        try:
            assert_reduced_close(result, inputs, case.op, case.values)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


@pytest.mark.world_size()
@pytest.mark.needs("all_reduce")
@examples(
    case=reductions(["all_reduce"], members=st.none()),
    count=st.integers(2, 5),
    order=st.permutations(range(5)),
    same_shape=st.booleans(),
    groups=st.integers(1, 2),
)
def test_async_all_reduces_in_flight(pg, case, count, order, same_shape, groups):
    """Several async all_reduces in flight at once, on the world alone or alternating with a second group
    of the same ranks (a communicator of its own), all of one shape and dtype (a backend that stages each
    shape in one buffer of its own mixes them up) or each a size of its own, posted in one order and
    waited in another: each gives the reference, and once wait() returned its Work is completed."""
    n = pg.world_size
    on = [pg.group, pg.new_group(list(range(n)))][:groups]
    sizes = [case.size if same_shape else case.size + k for k in range(count)]
    inputs = [[case.part(pg.seed, r, k, sizes[k], n) for r in range(n)] for k in range(count)]
    tensors = [x[pg.rank].to(pg.device, copy=True) for x in inputs]
    op = reduce_op(case.op)
    works = [dist.all_reduce(t, op=op, group=on[k % groups], async_op=True) for k, t in enumerate(tensors)]
    for k in (k for k in order if k < count):
        works[k].wait()
        if pg.device.type == "cuda":  # wait() only orders the stream: is_completed() reads the GPU's progress
            torch.cuda.synchronize(pg.device)
        assert works[k].is_completed(), f"all_reduce {k + 1} of {count}: wait() returned, not completed"
    for k, (tensor, x) in enumerate(zip(tensors, inputs, strict=True)):
        try:
            assert_reduced_close(tensor, x, case.op, case.values)
        except AssertionError as exc:
            what = f"all_reduce {k + 1} of {count} in flight (group {k % groups}, sizes {sizes})"
            raise AssertionError(f"{what}: {exc}") from None


# PREMUL_SUM's factors as FSDP2 makes them: powers of two (1/world size, its divide factors) and others,
# as a Python scalar or a one-element tensor on the device.
PREMUL_FACTORS = [("scalar", 2.0), ("scalar", 0.5), ("scalar", 3.0), ("tensor", 2.0), ("tensor", 0.25)]


def factor_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype torch takes a PREMUL_SUM factor tensor in (torch 2.11 refuses others: "expected scalar
    type Float but found BFloat16"): a complex reduction's real type, float32 for bfloat16."""
    return torch.float32 if dtype == torch.bfloat16 else real_dtype(dtype)


def premul_input(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Integers 1 to 4 (and -1 to 1 imaginary parts): with any factor above, every product and partial sum
    of up to 8 ranks is exact in every floating dtype, bfloat16 included, whatever the order."""
    index = torch.arange(count, dtype=torch.float64)
    x = (index + rank) % 4 + 1
    return torch.complex(x, (index + 2 * rank) % 3 - 1).to(dtype) if dtype.is_complex else x.to(dtype)


def premul_call(pg, operation: str, inputs: list[torch.Tensor], op) -> tuple[torch.Tensor, slice | None]:
    """One PREMUL_SUM call of ``operation`` on this rank's input: what it gave, and the part of the
    reduction it must hold (None where this rank receives nothing: reduce's non-roots)."""
    n, me = pg.world_size, pg.rank
    tensor = inputs[me].to(pg.device, copy=True)
    if operation == "all_reduce":
        dist.all_reduce(tensor, op=op)
        return tensor, slice(None)
    if operation == "reduce":
        dist.reduce(tensor, dst=0, op=op)
        return tensor, slice(None) if me == 0 else None
    chunk = len(tensor) // n
    out = torch.empty(chunk, dtype=tensor.dtype, device=pg.device)
    if operation == "reduce_scatter":
        dist.reduce_scatter(out, list(tensor.chunk(n)), op=op)
    else:
        dist.reduce_scatter_tensor(out, tensor, op=op)
    return out, slice(me * chunk, (me + 1) * chunk)


def premul_wrong(got: torch.Tensor, exact: torch.Tensor, plain: torch.Tensor) -> str:
    """How a PREMUL_SUM result is wrong: how many elements, the first, and what every wrong element is
    where they all are one thing (the plain sum: the factor left out; or zeros), which is what tells one
    known bug from another bug of the same call."""
    bad = got != exact
    first, how = int(bad.nonzero()[0, 0]), ""
    if torch.equal(got[bad], plain[bad]):
        how = " (the factor left out)"
    elif not got[bad].any():
        how = " (zeros)"
    return (
        f"{int(bad.sum())} of {len(got)} elements wrong{how}, first at {first}: {got[first].item()}, "
        f"exact {exact[first].item()}"
    )


# Elements per rank: a few, and 64 Ki + 1, where NCCL at one rank left the factor out of the last element.
PREMUL_COUNTS = (16, 65537)


@pytest.mark.world_size()
@pytest.mark.parametrize("dtype", [*FLOATS, torch.complex64, torch.complex128], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("operation", ["all_reduce", "reduce", "reduce_scatter", "reduce_scatter_single"])
def test_premul_sum_factors(pg, operation, dtype):
    """PREMUL_SUM multiplies each rank's input by its factor, then sums: each reduction's cell (operation
    and dtype, a test each, so a known bug of one cell hides no other) with every factor above at both
    counts, compared bit for bit. Every call is made and the failure lists each wrong one (a call that
    raises included), saying where a wrong element is the plain sum: the factor left out. N/A where the
    backend refuses PREMUL_SUM of this dtype in its own words (gloo refuses it whatever the dtype)."""
    n, wide = pg.world_size, torch.complex128 if dtype.is_complex else torch.float64
    wrong, refused, tried = [], set(), 0
    for count in PREMUL_COUNTS:
        inputs = [premul_input(r, count * n, dtype) for r in range(n)]
        for kind, factor in PREMUL_FACTORS:
            scale = (
                factor
                if kind == "scalar"
                else torch.tensor([factor], dtype=factor_dtype(dtype), device=pg.device)
            )
            what = f"by {kind} {factor} of {count * n}"
            try:
                got, part = premul_call(pg, operation, inputs, dist._make_nccl_premul_sum(scale))
            except Exception as exc:  # noqa: BLE001 - a refusal, or listed as wrong
                if reason := refusal(exc, pg.backend):
                    refused.add(reason)
                    continue
                wrong.append(f"{what} raises {type(exc).__name__}: " + str(exc).split("\n")[0])
            else:
                # the sums of this rank's part only, after a call returned: made whole before every call,
                # which gloo refuses, they cost 10 s of the ranks' time in a default run
                if part is not None:
                    mine = [x[part].to(wide) for x in inputs]
                    exact = sum(x * factor for x in mine).to(dtype)
                    if not torch.equal(got := got.cpu(), exact):
                        wrong.append(f"{what}: {premul_wrong(got, exact, sum(mine).to(dtype))}")
            tried += 1
    if not tried:
        pytest.skip(f"N/A: {pg.backend} refuses PREMUL_SUM of {dtype}: {'; '.join(sorted(refused))}")
    name, listed = str(dtype).removeprefix("torch."), "; ".join(wrong)
    calls = f"{len(wrong)} of {tried} calls wrong"
    assert not wrong, f"premul_sum {operation} of {name} over {n} ranks, {calls}: {listed}"


def kind_of(x: torch.Tensor) -> list[str]:
    """Each element as NaN, infinite or finite: what may not depend on which rank held an exceptional value
    (the sign of an infinite product depends on the other ranks' signs)."""
    return [kind.lstrip("+-") for kind in kinds(x)]


def exceptional_cases(ops: tuple[str, ...]) -> st.SearchStrategy:
    return reductions(["all_reduce"], dtypes=FLOATS, ops=ops, members=st.none())


@pytest.mark.world_size()
@pytest.mark.needs("all_reduce")
@examples(
    case=exceptional_cases(("min", "max")), value=st.sampled_from(list(EXCEPTIONAL)), repeat=st.integers(1, 4)
)
def test_nan_and_inf_in_min_max_whichever_rank_holds_them(pg, case, value, repeat):
    check_exceptional_values(pg, case, value, repeat)


@pytest.mark.world_size()
@pytest.mark.needs("all_reduce")
@examples(
    case=exceptional_cases(("sum", "avg", "product")),
    value=st.sampled_from(list(EXCEPTIONAL)),
    repeat=st.integers(1, 4),
)
def test_nan_and_inf_in_sum_avg_product_whichever_rank_holds_them(pg, case, value, repeat):
    check_exceptional_values(pg, case, value, repeat)


def check_exceptional_values(pg, case, value: str, repeat: int) -> None:
    """NaN and +-inf, placed on each rank in turn (element j holds it on rank j % n alone, the others
    ordinary values): whatever the backend makes of it (a NaN in MAX propagated, as torch does, or
    dropped), it must make the same whichever rank holds it (MLX's NaN in MAX did not: mlx 4072)."""
    n = pg.world_size
    inputs = [rank_input(pg.seed, r, n * repeat, case.dtype) for r in range(n)]
    for r, x in enumerate(inputs):
        x[r::n] = EXCEPTIONAL[value]
    tensor = inputs[pg.rank].to(pg.device, copy=True)
    dist.all_reduce(tensor, op=reduce_op(case.op))
    kinds = kind_of(tensor)
    for j, kind in enumerate(kinds):
        if kind != kinds[0]:
            said = (
                f"{case.op} of {case.dtype} over {n} ranks: {value} held by rank 0 at element 0 gives "
                f"{kinds[0]} ({tensor[0].item()!r}), held by rank {j % n} at element {j} gives {kind} "
                f"({tensor[j].item()!r}): the result depends on which rank holds it"
            )
            call = FailingCall(
                pg.backend, n, "all_reduce", "contiguous", "contiguous", case.dtype, (n * repeat,),
                given=lambda r, _=0: inputs[r],
                device=pg.device.type, modules=backend_modules(pg.backend),
            )  # fmt: skip
            written_from = f"test_all_reduce.py's {value} in {case.op} of {n * repeat} {case.dtype} elements"
            text = exceptional_script(call, case.op, value, said, written_from)
            name = f"{pg.backend}-all_reduce-{case.op}-{value}-ws{n}-{str(case.dtype).removeprefix('torch.')}"
            raise AssertionError(f"{said}\n{write_reproduction(pg, name, text)}")
