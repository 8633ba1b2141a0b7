"""Exact references and rounding-error bounds for checking reductions; no process group needed.

Every rank can rebuild every other rank's input from a shared seed (``rank_input``), so each rank can
compute the exact result of a reduction locally (``reduce_reference``) and check what the collective
gave it against a bound derived from the dtype, the group size and the op (``assert_reduced_close``).

Error model, floating dtypes (eps = ``torch.finfo(dtype).eps``, twice the unit roundoff u): whatever
order or tree a backend sums n terms in, the computed sum differs from the exact one by at most
gamma_{n-1} * sum_i |x_i| with gamma_k = k u / (1 - k u) (Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., 4.2). The bounds below use (n - 1) eps, which covers gamma_{n-1} with a margin,
plus u |exact| for a final rounding into the dtype when a backend accumulates in a wider type. They
assume no overflow or underflow, which ``rank_input``'s values stay far from.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ReduceOp

__all__ = [
    "OPS",
    "assert_gemm_sum_close",
    "assert_reduced_close",
    "defined",
    "error_bound",
    "is_exact",
    "rank_input",
    "reduce_op",
    "reduce_reference",
]

# The reduce ops by name; a backend takes reduce_op(name), which builds PREMUL_SUM's factor in.
OPS: dict[str, ReduceOp] = {
    "sum": ReduceOp.SUM,
    "product": ReduceOp.PRODUCT,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "avg": ReduceOp.AVG,
    "premul_sum": ReduceOp.PREMUL_SUM,
    "band": ReduceOp.BAND,
    "bor": ReduceOp.BOR,
    "bxor": ReduceOp.BXOR,
}

_BITWISE = ("band", "bor", "bxor")
_SCALED = ("avg", "premul_sum")
PREMUL_FACTOR = 2.0  # a power of two: scaling by it is exact, so PREMUL_SUM's bound is SUM's


def reduce_op(name: str) -> ReduceOp:
    """What a collective takes for the op named ``name`` (a key of ``OPS``)."""
    if name == "premul_sum":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return OPS[name]


# Each reduces a stack of per-rank inputs along dim 0.
_REDUCE = {
    "sum": lambda wide: wide.sum(0),
    "product": lambda wide: wide.prod(0),
    "min": lambda wide: wide.amin(0),
    "max": lambda wide: wide.amax(0),
    "avg": lambda wide: wide.mean(0),
    "premul_sum": lambda wide: (wide * PREMUL_FACTOR).sum(0),
    "band": lambda wide: functools.reduce(torch.bitwise_and, wide.unbind()),
    "bor": lambda wide: functools.reduce(torch.bitwise_or, wide.unbind()),
    "bxor": lambda wide: functools.reduce(torch.bitwise_xor, wide.unbind()),
}

# Seeds of different ranks must never collide: seed * _RANK_STRIDE + rank is unique for rank < stride.
_RANK_STRIDE = 1 << 20


def rank_input(
    seed: int, rank: int, shape: int | Sequence[int], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> Tensor:
    """Rank ``rank``'s input, the same on every rank and device for the same (seed, rank).

    Floats are +-2**u with u uniform in [-1, 1): magnitudes in [0.5, 2), so a PRODUCT over n ranks stays
    within 2**(+-n) and a SUM cancels without degenerating. Signed integers are +-[1, 8] and unsigned
    ones [1, 15] (never 0, so a PRODUCT stays informative); SUM and PRODUCT may wrap around in small
    dtypes, and ``reduce_reference`` wraps the same way. Bools are uniform in {False, True}.
    """
    size = (shape,) if isinstance(shape, int) else tuple(shape)
    gen = torch.Generator().manual_seed(seed * _RANK_STRIDE + rank)
    if dtype == torch.bool:
        values = torch.randint(0, 2, size, generator=gen).bool()
    elif dtype.is_complex:
        parts = [rank_input(seed, rank, size, torch.float64) for rank in (rank, rank + _RANK_STRIDE // 2)]
        values = torch.complex(*parts).to(dtype)
    elif dtype.is_floating_point:
        magnitude = 2.0 ** (torch.rand(size, generator=gen, dtype=torch.float64) * 2 - 1)
        values = (magnitude * _random_sign(size, gen)).to(dtype)
    elif dtype.is_signed:
        values = (torch.randint(1, 9, size, generator=gen) * _random_sign(size, gen)).to(dtype)
    else:
        values = torch.randint(1, 16, size, generator=gen).to(dtype)
    return values.to(device)


def reduce_reference(inputs: Sequence[Tensor], op: str) -> Tensor:
    """The exact reduction of the per-rank ``inputs`` (all one dtype and shape) by ``op``, on CPU.

    ``op`` is a key of ``OPS``. Floating inputs are combined in float64, which holds every float16,
    bfloat16 and float32 value exactly; float64 inputs are themselves rounded in float64, which
    ``error_bound`` accounts for. Integer inputs are combined in int64 and the result is wrapped into
    the input dtype, then returned as int64: a collective computes in the tensor's dtype and two's
    complement SUM and PRODUCT are exact modulo 2**bits whatever the order, so e.g. an int8 SUM of
    100 + 100 is -56. Bool inputs give a bool result (SUM and MAX are OR, PRODUCT and MIN are AND, BXOR
    is parity). AVG is defined for floating dtypes only, bitwise ops for integer and bool ones.
    """
    if not inputs:
        raise ValueError("reduce_reference needs at least one input")
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {sorted(OPS)}")
    dtype = inputs[0].dtype
    if any(x.dtype != dtype or x.shape != inputs[0].shape for x in inputs):
        raise ValueError("inputs must share one dtype and shape")
    if not defined(dtype, op):
        raise ValueError(f"{op} has no exact reference for {dtype}")
    floating = dtype.is_floating_point or dtype.is_complex
    result = _REDUCE[op](torch.stack([x.detach().cpu().to(_wide(dtype)) for x in inputs]))
    if floating:
        return result
    if dtype == torch.bool:
        return result.bool()
    return result.to(dtype).to(torch.int64)


def defined(dtype: torch.dtype, op: str) -> bool:
    """Whether ``reduce_reference`` defines ``op`` over ``dtype``: bitwise ops for integers and bool, AVG
    and PREMUL_SUM for floating and complex dtypes, MIN and MAX for all but complex. float8 and the wide
    unsigned dtypes (uint16/32/64) are only moved, never reduced, here: torch's CPU kernels lack them."""
    if dtype in _MOVED_ONLY or str(dtype).startswith("torch.float8"):
        return False
    if op in _BITWISE:
        return not (dtype.is_floating_point or dtype.is_complex)
    if op in _SCALED:
        return dtype.is_floating_point or dtype.is_complex
    return not (dtype.is_complex and op in ("min", "max"))


def error_bound(inputs: Sequence[Tensor], op: str) -> Tensor:
    """Elementwise bound (float64, on CPU) on |collective result - ``reduce_reference(inputs, op)``|.

    Zero where the result must be exact: integer and bool dtypes, MIN and MAX. For floating dtypes, with
    n = len(inputs), S = sum_i |x_i| and E = |exact result|:

    - SUM: (n - 1) eps S + u E.
    - AVG: eps S / n + (n - 1) eps S / n + u E = eps S + u E: the sum's error divided by n, plus either
      the rounding of each x_i / n (backends that pre-scale) or of the final division.
    - PRODUCT: ((n - 1) eps + u) E: each of the n - 1 multiplications adds a relative error u.

    The float64 reference is itself a float64 reduction, so eps64 = ``finfo(float64).eps`` joins eps
    in the (n - 1) terms; it only matters for float64 inputs, where it doubles the bound.
    """
    expected = reduce_reference(inputs, op)
    dtype, n = inputs[0].dtype, len(inputs)
    if is_exact(dtype, op):
        return torch.zeros(expected.shape, dtype=torch.float64)
    eps, eps64 = torch.finfo(dtype.to_real()).eps, torch.finfo(torch.float64).eps
    exact = expected.abs()
    if op == "product":
        # a complex multiplication rounds up to sqrt(5) u (Higham 3.6): 2 eps covers it with a margin
        per_step = 2 * (eps + eps64) if dtype.is_complex else eps + eps64
        return ((n - 1) * per_step + eps / 2) * exact
    spread = torch.stack([x.detach().cpu().to(_wide(dtype)).abs() for x in inputs]).sum(0)
    if op == "premul_sum":
        spread = spread * PREMUL_FACTOR
    if op == "avg":
        return (eps + (n - 1) * eps64 / n) * spread + eps / 2 * exact
    return (n - 1) * (eps + eps64) * spread + eps / 2 * exact


def assert_reduced_close(actual: Tensor, inputs: Sequence[Tensor], op: str) -> None:
    """Assert ``actual`` is what reducing the per-rank ``inputs`` by ``op`` may give in their dtype.

    Exact cases (integers, bools, MIN, MAX) must match bit for bit after casting the reference to the
    dtype; floating SUM, AVG and PRODUCT must lie within ``error_bound``. The message names the op,
    dtype and group size, how many elements fail, and the worst one: its index, value, the exact value,
    the error and the bound.
    """
    dtype = inputs[0].dtype
    bound = None if is_exact(dtype, op) else error_bound(inputs, op)
    what = f"{op} over {len(inputs)} ranks of {dtype}"
    _assert_within(actual, reduce_reference(inputs, op), bound, dtype, what)


def assert_gemm_sum_close(actual: Tensor, lhs: Sequence[Tensor], rhs: Sequence[Tensor]) -> None:
    """Assert ``actual`` is sum_r lhs[r] @ rhs[r] as computed in their dtype, e.g. a GEMM reduce-scatter.

    For the block of rows a rank owns, pass every rank's rows of A for that block as ``lhs``. Each
    output element is a sum of n K products (K the largest inner dimension): rounding the K-term dot
    products (gamma_K, Higham 3.5; any blocking or order) and then the n - 1 cross-rank additions gives
    (K + n - 1) eps sum_r (|A_r| @ |B_r|) + u |exact|, plus the same (K + n - 1) term in eps64 for the
    float64 reference. Assumes the GEMM rounds in the dtype or better (no TF32 for float32).
    """
    if len(lhs) != len(rhs) or not lhs:
        raise ValueError("need one (lhs, rhs) pair per rank")
    dtype = actual.dtype
    pairs = [(a.detach().cpu().double(), b.detach().cpu().double()) for a, b in zip(lhs, rhs, strict=True)]
    expected = sum(a @ b for a, b in pairs)
    spread = sum(a.abs() @ b.abs() for a, b in pairs)
    terms = max(a.shape[-1] for a in lhs) + len(lhs) - 1
    eps, eps64 = torch.finfo(dtype).eps, torch.finfo(torch.float64).eps
    bound = terms * (eps + eps64) * spread + eps / 2 * expected.abs()
    _assert_within(actual, expected, bound, dtype, f"sum of {len(lhs)} GEMMs in {dtype}")


def _assert_within(
    actual: Tensor, expected: Tensor, bound: Tensor | None, dtype: torch.dtype, what: str
) -> None:
    """Compare exactly in ``dtype`` when ``bound`` is None, else elementwise within ``bound``."""
    actual = actual.detach().cpu()
    if actual.shape != expected.shape or actual.dtype != dtype:
        raise AssertionError(
            f"{what}: got {actual.dtype}{list(actual.shape)}, expected {dtype}{list(expected.shape)}"
        )
    if bound is None:
        bad = actual != expected.to(dtype)
        if bad.any():
            i = _first(bad)
            raise AssertionError(
                f"{what}: {int(bad.sum())} of {bad.numel()} elements differ from the exact result; first at "
                f"{i}: got {actual[i].item()}, expected {expected.to(dtype)[i].item()}"
            )
        return
    error = (actual.to(expected.dtype) - expected).abs()
    bad = ~(error <= bound)  # NaN errors fail too
    if bad.any():
        excess = torch.where(bad, (error - bound).nan_to_num(float("inf")), -1.0)
        i = _first(excess == excess.max())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements exceed the rounding-error bound; worst at "
            f"{i}: got {actual[i].item()!r}, exact {expected[i].item()!r}, error {error[i].item():.3g} > "
            f"bound {bound[i].item():.3g}"
        )


def is_exact(dtype: torch.dtype, op: str) -> bool:
    """Whether every backend must give the exact result bit for bit: integers and bool, MIN and MAX."""
    return not (dtype.is_floating_point or dtype.is_complex) or op in ("min", "max")


def _wide(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_complex:
        return torch.complex128
    return torch.float64 if dtype.is_floating_point else torch.int64


_MOVED_ONLY = {getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)}


def _first(mask: Tensor) -> tuple[int, ...]:
    return tuple(int(j) for j in mask.nonzero()[0])


def _random_sign(size: tuple[int, ...], gen: torch.Generator) -> Tensor:
    return torch.randint(0, 2, size, generator=gen) * 2 - 1
