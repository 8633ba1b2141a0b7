"""What the conformance inputs hold (reference.Values), checked without processes: full-range values reach
what small ones cannot, and the floats called exactly reducible are, in any order a backend may take."""

from __future__ import annotations

import functools
import itertools
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_collectives.algorithms.reference import (
    PREMUL_FACTOR,
    SCALE,
    Values,
    assert_reduced_close,
    defined,
    error_bound,
    exact_reduction,
    rank_input,
    real_dtype,
    reduce_reference,
)
from pytest_collectives.conformance.capabilities import DTYPES, REDUCE_OPS
from pytest_collectives.conformance.cases import assert_moved, assert_unchanged, laid_out, sentinel

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
FULL = st.one_of(
    st.builds(Values, kind=st.just("full"), scale=st.integers(-SCALE, SCALE)), st.just(Values("spread"))
)


def in_dtype(inputs: list[torch.Tensor], op: str, order: list[int], scale_first: bool) -> torch.Tensor:
    """The reduction a backend could compute, rounding to the dtype after every step, in ``order``."""
    n = len(inputs)
    xs = [inputs[i] for i in order]
    if op == "premul_sum":
        xs = [x * 2 for x in xs]
    if op == "avg" and scale_first:
        xs = [x / n for x in xs]
    step = {"product": torch.mul, "min": torch.minimum, "max": torch.maximum}.get(op, torch.add)
    result = functools.reduce(step, xs)
    return result / n if op == "avg" and not scale_first else result


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from(FLOATS),
    op=st.sampled_from(["sum", "avg", "premul_sum", "min", "max", "product"]),
    members=st.integers(1, 8),
    values=FULL,
    order=st.randoms(use_true_random=False),
    scale_first=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_exactly_reducible_floats_reduce_exactly_in_any_order(
    dtype, op, members, values, order, scale_first, seed
):
    inputs = [rank_input(seed, r, 64, dtype, values=values, op=op, members=members) for r in range(members)]
    assert all(torch.isfinite(x).all() for x in inputs)
    permutation = list(range(members))
    order.shuffle(permutation)
    result = in_dtype(inputs, op, permutation, scale_first)
    assert torch.isfinite(result).all(), "an exactly reducible input overflowed"
    if values.exact(dtype, op, members):
        assert torch.equal(result, reduce_reference(inputs, op).to(dtype))
    assert_reduced_close(result, inputs, op, values)  # the bound where exactness is not claimed


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_exact_result_folded_in_its_own_dtype_is_the_widened_reference_bit_for_bit(dtype):
    """assert_reduced_close folds an exact reduction in the inputs' dtype (no widened copy): two's
    complement wraps alike in any width, exactly reducible floats have nothing to round, and bools fold
    by their logic."""
    values = (Values("full", 0), Values("full", SCALE), Values("full", -SCALE), Values("spread"))
    checked = 0
    for op, drawn, n in itertools.product(REDUCE_OPS, values, (2, 3, 4, 8)):
        if defined(dtype, op) and drawn.exact(dtype, op, n):
            inputs = [rank_input(5, r, 257, dtype, values=drawn, op=op, members=n) for r in range(n)]
            folded, widened = exact_reduction(inputs, op), reduce_reference(inputs, op).to(dtype)
            assert torch.equal(folded.view(torch.uint8), widened.view(torch.uint8)), (op, drawn, n)
            checked += 1
    assert checked or not any(defined(dtype, op) for op in REDUCE_OPS)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_top_of_the_range_is_past_float16s(dtype):
    x = rank_input(0, 0, 256, dtype, values=Values("full", SCALE), op="sum", members=8)
    assert x.abs().min() > torch.finfo(torch.float16).max


@pytest.mark.parametrize("dtype", FLOATS)
def test_the_bottom_of_the_range_is_subnormal(dtype):
    x = rank_input(0, 0, 256, dtype, values=Values("full", -SCALE), op="sum", members=8)
    assert (x != 0).all() and (x.abs() < torch.finfo(dtype).tiny).all()


@pytest.mark.parametrize("dtype", FLOATS)
def test_spread_runs_from_the_subnormals_to_past_float16s_top_in_one_tensor(dtype):
    x = rank_input(0, 0, 97, dtype, values=Values("spread"), op="sum", members=8).abs()
    assert (x != 0).all() and x[0] < torch.finfo(dtype).tiny, "a subnormal at the start"
    if dtype != torch.float16:
        assert x.max() > torch.finfo(torch.float16).max
    assert x[:24].max() < x[-24:].min(), "the exponent rises along the elements"


def test_full_integers_reach_past_32_and_53_bits_and_every_high_bit():
    wide = rank_input(1, 0, 4096, torch.int64, values=Values("full"))
    assert (wide.abs() > 2**53).float().mean() > 0.9 and (wide < 0).any()
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32):
        x = rank_input(1, 0, 4096, dtype, values=Values("full"))
        bits = torch.iinfo(dtype).bits
        assert (x.to(torch.int64) & (1 << (bits - 1))).any() or (x < 0).any()
        assert (x != 0).all(), "0 is the integers' sentinel"
    small = rank_input(1, 0, 4096, torch.int64)
    assert small.abs().max() <= 8


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("values", [Values(), Values("full"), Values("spread")], ids=repr)
def test_every_dtype_draws_any_shape_empty_ones_too_and_the_same_for_a_seed(dtype, values):
    ops = [None] + [op for op in REDUCE_OPS if defined(dtype, op)]
    for op, shape in itertools.product(ops, [0, (0, 3), 1, (5, 3), 1000]):
        x = rank_input(4, 1, shape, dtype, values=values, op=op, members=3)
        again = rank_input(4, 1, shape, dtype, values=values, op=op, members=3)
        assert x.shape == (torch.Size([shape]) if isinstance(shape, int) else torch.Size(shape))
        assert x.dtype == dtype and torch.equal(x.view(torch.uint8), again.view(torch.uint8))
        if x.numel() >= 1000:
            other = rank_input(4, 2, shape, dtype, values=values, op=op, members=3)
            assert not torch.equal(x.view(torch.uint8), other.view(torch.uint8)), "another rank, other values"


@pytest.mark.parametrize("dtype", [*FLOATS, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2])
def test_moved_floats_hold_every_kind_of_value_but_the_sentinel(dtype):
    x = rank_input(2, 0, 1 << 16, dtype, values=Values("full"), op=None)
    flat = (torch.view_as_real(x) if dtype.is_complex else x).reshape(-1).to(torch.float64)
    assert flat.isnan().any() and (flat != flat).sum() < flat.numel() / 2
    zeros = flat[flat == 0]
    assert zeros.signbit().any() and not zeros.signbit().all(), "both +0.0 and -0.0"
    real = real_dtype(dtype)
    assert ((flat != 0) & (flat.abs() < torch.finfo(real).tiny)).any(), "a subnormal"
    if dtype != torch.float8_e4m3fn:  # e4m3fn has no infinities
        assert flat.isinf().any()
    width = x.element_size()
    got = torch.empty(x.numel(), dtype=dtype).copy_(x.reshape(-1)).view(torch.uint8).reshape(-1, width)
    nan = sentinel(1, dtype, "cpu").view(torch.uint8).reshape(1, width)
    assert not (got == nan).all(1).any()


@pytest.mark.parametrize("kind", ["small", "full"])
def test_a_bool_never_written_is_caught_whatever_was_drawn(kind):
    """Both bools are drawn, so the bool sentinel is a byte no drawn bool holds: an unwritten element is
    caught where the input held False (0, once the sentinel) as where it held True."""
    x = rank_input(3, 0, 4096, torch.bool, values=Values(kind), op=None)
    assert not x.all() and x.any()
    for unwritten in (int(x.logical_not().nonzero()[0]), int(x.nonzero()[0])):
        out = sentinel(x.numel(), torch.bool, "cpu")
        out[:unwritten] = x[:unwritten]
        out[unwritten + 1 :] = x[unwritten + 1 :]
        with pytest.raises(AssertionError, match=r"1 of 4096 elements wrong \(1 never written\)"):
            assert_moved(out, x, "bool")
        out[unwritten] = x[unwritten]
        assert_moved(out, x, "bool")


@pytest.mark.parametrize(
    "dtype",
    [torch.bool, torch.float8_e5m2, torch.bfloat16, torch.float32, torch.complex128],
    ids=lambda d: str(d)[6:],
)
@pytest.mark.parametrize("layout", ["contiguous", "strided", "offset", "one element"])
def test_one_byte_changed_is_caught_in_every_layout(dtype, layout):
    """assert_moved compares whole words where it can: one byte changed anywhere in an element (its last
    byte, the high word of a complex128) fails, in a view of every layout the suites draw, and the same
    bytes pass."""
    x = rank_input(5, 0, 9, dtype, values=Values("full"), op=None)
    for byte in range(x.element_size()):
        out = torch.empty(20, dtype=dtype)
        views = {"contiguous": out[:9], "strided": out[::2], "offset": out[1:10], "one element": out[2:3:2]}
        actual = views[layout][:9]
        expected = x[: actual.numel()]
        actual.copy_(expected)
        assert_moved(actual, expected, layout)
        last = actual.storage_offset() + (actual.numel() - 1) * actual.stride(0)  # its element of out
        out.view(torch.uint8)[last * x.element_size() + byte] ^= 0x10
        with pytest.raises(AssertionError, match=rf"1 of {actual.numel()} elements wrong"):
            assert_moved(actual, expected, layout)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("layout", ["strided", "offset"])
def test_one_byte_written_outside_a_laid_out_view_is_caught(dtype, layout):
    """A view laid out in a larger buffer passes as laid out, whether it holds an input or the sentinel;
    one byte changed in the buffer just before it, in a gap or just after it fails its check, naming the
    write outside the tensor, and so does its input left spoiled."""
    x = rank_input(5, 0, 9, dtype, values=Values("full"), op=None)
    for held in (x, sentinel(9, dtype, "cpu")):
        view = laid_out(held, layout, "cpu")
        assert_moved(view, held, layout)
        storage = torch.empty(0, dtype=torch.uint8).set_(view.untyped_storage())
        first, step = view.storage_offset(), view.stride(0)
        inside = range(first, first + 9 * step, step)
        places = [first - 1, first + 1, first + 8 * step + 1]  # before it, in a gap, after it
        places = [p for p in places if 0 <= p < len(storage) // dtype.itemsize and p not in inside]
        assert len(places) == 2  # strided: a gap and after it; offset: before it and after it
        for outside in places:
            storage[outside * dtype.itemsize] ^= 0x10
            with pytest.raises(AssertionError, match="1 element.s. written outside the tensor"):
                assert_moved(view, held, layout)
            storage[outside * dtype.itemsize] ^= 0x10
        storage[first * dtype.itemsize] ^= 0x01  # the view's first element (a bool stays one)
        with pytest.raises(AssertionError, match=r"\(which the call must only read\): 1 of 9 elements wrong"):
            assert_unchanged(view, held, layout)



@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_a_write_past_an_outputs_end_is_caught(dtype):
    """An output buffer (the sentinel) written whole passes; one byte written past its end, where a kernel
    writing whole 16-byte vectors would, fails its check."""
    x = rank_input(5, 0, (3, 3), dtype, values=Values("full"), op=None)
    out = sentinel((3, 3), dtype, "cpu")
    out.view(torch.uint8).copy_(x.view(torch.uint8))
    assert_moved(out, x, "written whole")
    storage = torch.empty(0, dtype=torch.uint8).set_(out.untyped_storage())
    assert len(storage) >= x.nbytes + 16
    storage[x.nbytes + 15] ^= 0x01
    with pytest.raises(AssertionError, match="1 element.s. written outside the tensor"):
        assert_moved(out, x, "written past its end")


def through_float16(xs: list[torch.Tensor]) -> torch.Tensor:
    return sum(x.to(torch.float16) for x in xs).to(torch.bfloat16)


def in_32_bits(xs: list[torch.Tensor]) -> torch.Tensor:
    return sum(x.to(torch.int32) for x in xs).to(torch.int64)


def first_dropped(xs: list[torch.Tensor]) -> torch.Tensor:
    return sum(xs[1:])


@pytest.mark.parametrize(
    "bug, dtype, small_passes",
    [
        (through_float16, torch.bfloat16, True),  # overflows only past float16's range
        (in_32_bits, torch.int64, True),  # small values fit 32 bits
        (first_dropped, torch.bfloat16, False),  # small values catch it on every element too (the bound)
    ],
    ids=["bf16-through-fp16", "int64-in-32-bits", "one-contribution-dropped"],
)
def test_full_values_catch_what_small_ones_pass(bug, dtype, small_passes):
    full = Values("full", SCALE)
    xs = [rank_input(3, r, 512, dtype, values=full, op="sum", members=8) for r in range(8)]
    with pytest.raises(AssertionError, match="sum over 8 ranks of torch.* 512 of 512 elements"):
        assert_reduced_close(bug(xs), xs, "sum", full)
    small = [rank_input(3, r, 512, dtype) for r in range(8)]
    if small_passes:  # what the suite passed before its inputs reached the bug
        assert_reduced_close(bug(small), small, "sum")
    else:  # random mantissas, held to the rounding bound: tight enough to flag every element
        with pytest.raises(AssertionError, match="sum over 8 ranks of torch.* 512 of 512 elements"):
            assert_reduced_close(bug(small), small, "sum")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_a_result_that_is_another_ops_reduction_says_which(dtype):
    # a registered all_reduce that compared op == "max" (op is a ReduceOp) and so summed every MAX
    xs = [torch.tensor([1, 5, -2], dtype=dtype), torch.tensor([3, 2, 7], dtype=dtype)]
    summed = xs[0] + xs[1]
    hint = r"it is the SUM: was op=ReduceOp.MAX \(a torch.distributed.ReduceOp, not a string\) taken for SUM"
    with pytest.raises(AssertionError, match=hint):
        assert_reduced_close(summed, xs, "max")
    with pytest.raises(AssertionError, match=r"max over 2 ranks") as failed:
        assert_reduced_close(summed + 100, xs, "max")  # no op's result: no hint
    assert "it is the" not in str(failed.value)


def test_a_wrong_bool_reduction_is_reported_as_the_reference_sees_it():
    """The hint's search over other ops compares bools exactly: a bound would subtract them, which torch
    refuses, and that RuntimeError once replaced the failure (a planted tree reduce: test_planted_bugs)."""
    xs = [torch.tensor([True, False, True]), torch.tensor([True, True, False])]
    with pytest.raises(AssertionError, match=r"band over 2 ranks of torch.bool: 2 of 3 elements differ"):
        assert_reduced_close(torch.tensor([True, True, True]), xs, "band")


def _tree_sum(terms: list[torch.Tensor], splits: list[int]) -> torch.Tensor:
    """The terms summed by a binary tree whose shape ``splits`` draws, each addition rounded to the dtype:
    a chain (a ring, recursive summation), a balanced tree (recursive halving) and everything between."""
    if len(terms) == 1:
        return terms[0]
    cut = 1 + splits[len(terms) % len(splits)] % (len(terms) - 1)
    return _tree_sum(terms[:cut], splits[1:] or splits) + _tree_sum(terms[cut:], splits[1:] or splits)


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.complex64]),
    op=st.sampled_from(["sum", "avg", "premul_sum"]),
    n=st.integers(2, 8),
    seed=st.integers(0, 2**16),
    order=st.permutations(range(8)),
    splits=st.lists(st.integers(0, 7), min_size=1, max_size=8),
    avg=st.sampled_from(["divide", "reciprocal", "prescale", "wide"]),
)
def test_every_summation_order_a_backend_may_take_stays_within_the_bound(
    dtype, op, n, seed, order, splits, avg
):
    """The bound is rigorous: a sum in any order and tree, rounded at each addition (or accumulated in
    float64 and rounded once), AVG divided, multiplied by a rounded 1/n or pre-scaled, and PREMUL_SUM's
    factor applied first, all lie within it; tight as it is (one contribution left out fails everywhere)."""
    xs = [rank_input(seed, r, 257, dtype) for r in range(n)]
    terms = [xs[i] for i in order if i < n]
    if op == "premul_sum":
        terms = [t * PREMUL_FACTOR for t in terms]
    if op == "avg" and avg == "prescale":
        terms = [t / n for t in terms]
    if avg == "wide":
        got = sum(t.to(torch.complex128 if dtype.is_complex else torch.float64) for t in terms).to(dtype)
    else:
        got = _tree_sum(terms, splits)
    if op == "avg" and avg != "prescale":
        got = got * torch.tensor(1 / n, dtype=dtype) if avg == "reciprocal" else got / n
    error = (got.to(torch.complex128 if dtype.is_complex else torch.float64) - reduce_reference(xs, op)).abs()
    assert (error <= error_bound(xs, op)).all()


def test_the_real_dtype_of_a_dtype_keeps_torchs_dtypes_alive():
    """torch 2.2's dtype.to_real() dropped a reference to a real dtype on every call: the bound, computed
    for every example, freed torch.bfloat16 and crashed the floor's run."""
    before = sys.getrefcount(torch.bfloat16)
    assert [real_dtype(torch.bfloat16) for _ in range(1000)][-1] is torch.bfloat16
    assert sys.getrefcount(torch.bfloat16) >= before
    assert (real_dtype(torch.complex64), real_dtype(torch.complex128)) == (torch.float32, torch.float64)


@pytest.mark.parametrize("op", ["band", "bor", "bxor"])
def test_a_bool_reduction_never_written_fails_where_the_exact_result_is_true(op):
    """The bool sentinel is the byte 0xFF, which equals True by value: a reduce_scatter that never wrote
    an element passed wherever the exact result is True, until reductions compared bools by their bytes."""
    xs = [torch.tensor([True, True, False, True]), torch.tensor([True, False, False, True])]
    exact = reduce_reference(xs, op)
    assert exact.any()
    out = exact.clone()
    unwritten = int(exact.nonzero()[0])
    out.view(torch.uint8)[unwritten] = sentinel(1, torch.bool, "cpu").view(torch.uint8)[0]
    assert bool(out[unwritten] == exact[unwritten])  # the trap: by value it looks written
    with pytest.raises(AssertionError, match=r"1 of 4 elements differ.*the byte 0xff \(never written\)"):
        assert_reduced_close(out, xs, op)
    assert_reduced_close(exact.clone(), xs, op)
    if op == "bor":  # a uint8 SUM of bools writes 2 for two Trues (gloo's): torch reads it as True
        twice = torch.tensor([2, 1, 0, 2], dtype=torch.uint8).view(torch.bool)
        assert_reduced_close(twice, xs, "sum")
