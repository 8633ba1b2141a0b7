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

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import numpy
import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ReduceOp

__all__ = [
    "OPS",
    "SMALL",
    "Values",
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
UNWRITTEN_BOOL = 0xFF  # the byte of a bool output's sentinel (cases.sentinel): no bool a backend writes
PREMUL_FACTOR = 2.0  # a power of two: scaling by it is exact, so PREMUL_SUM's bound is SUM's


def reduce_op(name: str) -> ReduceOp:
    """What a collective takes for the op named ``name`` (a key of ``OPS``)."""
    if name == "premul_sum":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return OPS[name]


# Each folds one more rank's input (widened) into the running result, written with ``out=``: a stack of n
# inputs of 1 Mi elements in float64 is 8n MiB, which every rank of a large example would build several
# times over. AVG and PREMUL_SUM sum first and scale once at the end (reduce_reference).
_FOLD: dict[str, Callable[..., Tensor]] = {
    "sum": torch.add,
    "avg": torch.add,
    "premul_sum": torch.add,
    "product": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}
# Bools by their logic (SUM and MAX are OR, PRODUCT and MIN AND), the same in any width: torch's add of
# bools takes fifteen times its bitwise_or at 1 Mi.
_BOOL_FOLD = {
    **{op: torch.bitwise_or for op in ("sum", "max", "bor")},
    **{op: torch.bitwise_and for op in ("product", "min", "band")},
    "bxor": torch.bitwise_xor,
}


def _folded(inputs: Sequence[Tensor], fold: Callable[..., Tensor], wide: torch.dtype) -> Tensor:
    first, *rest = (x.detach().cpu() for x in inputs)
    if first.dtype == wide and rest:
        # the first fold makes the result: no copy of the first input to fold into, a pass at 1 Mi
        acc, rest = fold(first, rest[0]), rest[1:]
    else:
        acc = first.to(wide, copy=True)  # copy=True: an input already wide would be the result itself
    for x in rest:
        fold(acc, x, out=acc)  # promoted to acc's dtype element by element: no widened copy
    return acc


# Seeds of different ranks must never collide: seed * _RANK_STRIDE + rank is unique for rank < stride.
_RANK_STRIDE = 1 << 20
SCALE = 64  # Values.scale runs from -SCALE (a dtype's smallest subnormal) to SCALE (the top of its range)


@dataclasses.dataclass(frozen=True)
class Values:
    """What an example's inputs hold, besides the seed that draws each element (hypothesis draws this).

    ``small``: floats of random mantissa with magnitudes in [0.5, 2), signed integers +-[1, 8], unsigned
    ones [1, 15]: rounding is exercised, and checked against ``error_bound``.

    ``full``: each dtype's whole range. Integers of any bit pattern: past 2**31 and 2**53 in int64, the high
    bit of every unsigned type, negative int64 under MIN and MAX. Moved floats of any bit pattern but the
    sentinel's: NaN payloads, infinities, subnormals and -0.0 must arrive bit for bit. Reduced floats are
    exactly reducible, the idea behind nccl-tests' verifiable mode: integers k times a common 2**e with
    members * |k| < 2**mantissa (half that for PREMUL_SUM's factor 2; k a multiple of the group size for
    AVG), so every partial sum in any order and tree is exact, and SUM, PREMUL_SUM, MIN and MAX (and AVG
    over a power-of-two group) must match the reference bit for bit. PRODUCT multiplies powers of two
    whose exponents can't leave the range. ``scale`` places e: 0 gives integers, SCALE the top of the
    dtype's range (past float16's for bfloat16 and float32), -SCALE its smallest subnormal.

    ``spread``: ``full``, with the e of reduced floats running along the elements from the smallest
    subnormal to the top of the range (the same e for an element on every rank, so every sum stays exact):
    one call reaches both ends of the range and every scale between, where ``full`` needs a call per scale.
    """

    kind: str = "small"
    scale: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("small", "full", "spread") or not -SCALE <= self.scale <= SCALE:
            raise ValueError(
                f"Values(kind={self.kind!r}, scale={self.scale}): kind small, full or spread, "
                f"|scale| <= {SCALE}"
            )

    def exact(self, dtype: torch.dtype, op: str, members: int) -> bool:
        """Whether a reduction of ``members`` inputs drawn so must equal ``reduce_reference`` bit for bit."""
        if is_exact(dtype, op):
            return True
        if self.kind == "small" or (dtype.is_complex and op == "product"):
            return False
        # a backend may scale each input by 1/n rounded (NCCL's AVG of floats): exact for powers of two only
        return op != "avg" or members & (members - 1) == 0


SMALL = Values()


def rank_input(
    seed: int,
    rank: int,
    shape: int | Sequence[int],
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    values: Values = SMALL,
    op: str | None = None,
    members: int = 8,
) -> Tensor:
    """Rank ``rank``'s input, the same on every rank and device for the same (seed, rank) and draw.

    ``values`` says what it holds (``Values``); ``full`` floats depend on the reduce ``op`` they are for
    (None: moved, not reduced) and the number of ``members`` whose inputs are combined. ``small`` floats
    keep a PRODUCT over n ranks within 2**(+-n) and a SUM cancelling without degenerating; integers are never
    0 (the sentinel of an unwritten element), so a PRODUCT stays informative; SUM and PRODUCT may wrap
    around in small dtypes, and ``reduce_reference`` wraps the same way. Bools are uniform in {False, True}.
    """
    size = (shape,) if isinstance(shape, int) else tuple(shape)
    # modulo 2**128: a negative seed is a PCG64 seed of its own too
    gen = numpy.random.PCG64((seed * _RANK_STRIDE + rank) % 2**128)
    if dtype == torch.bool:
        drawn = (_random_bytes(math.prod(size), gen) & 1).bool().view(size)
    elif dtype.is_complex:
        part = {"values": values, "op": op, "members": members}
        if values.kind != "small" and op is None:
            drawn = _any_bits(size, dtype, gen)
        else:
            if op == "product":  # complex products round: the bound applies, to small values
                part = {}
            real = real_dtype(dtype)
            parts = [rank_input(seed, r, size, real, **part) for r in (rank, rank + _RANK_STRIDE // 2)]
            drawn = torch.complex(*parts)
    elif values.kind != "small":
        drawn = _full(size, dtype, gen, values, op, members)
    elif dtype.is_floating_point:
        # the magnitude's exponent uniform in [-1, 1) to the work dtype's mantissa, as torch.rand draws it
        # (24 or 53 random bits), and the word's top bit for the sign, set as a bit (torch.where costs more
        # than the whole draw at 1 Mi)
        work = _work(dtype)
        bits = _digits(work)
        words = _random_words(size, work.itemsize, gen)
        drawn = torch.exp2((words & ((1 << bits) - 1)).to(work).mul_(2.0 ** (1 - bits)).sub_(1))
        drawn = _signed_by(drawn, words).to(dtype)
    elif dtype.is_signed:
        drawn = _nonzero(8, size, gen, dtype)
    else:
        drawn = (_random_bytes(math.prod(size), gen) % 15 + 1).view(size).to(dtype)
    return drawn.to(device)


def _signed_by(magnitude: Tensor, words: Tensor) -> Tensor:
    """``magnitude`` (a float tensor of ``words``' width, every element positive) negated in place where its
    word's top bit is set: the bit set, since torch.where costs more than a whole draw at 1 Mi."""
    magnitude.view(words.dtype).bitwise_or_(words & -(1 << (8 * words.itemsize - 1)))
    return magnitude


def _random_words(size: tuple[int, ...], width: int, gen: numpy.random.PCG64) -> Tensor:
    """A ``size`` tensor of random signed integers ``width`` bytes wide, each of any bit pattern."""
    signed = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    return _random_bytes(width * math.prod(size), gen).view(signed).view(size)


def _random_bytes(count: int, gen: numpy.random.PCG64) -> Tensor:
    """``count`` uniform random bytes (uint8), 8 at a time from numpy's PCG64, viewed as every input's dtype.
    Drawing is most of a large example's time, and PCG64 draws 4 MiB in about a third of the time torch's
    CPU generator takes (2.0 against 5.5 ms on the 2-core machine, docs/measurements/conformance-suite.md);
    seeding it costs 6 us more, a small input's whole draw."""
    return torch.from_numpy(gen.random_raw(-(-count // 8)).view(numpy.uint8)[:count])


def _full(
    size: tuple[int, ...],
    dtype: torch.dtype,
    gen: numpy.random.PCG64,
    values: Values,
    op: str | None,
    members: int,
) -> Tensor:
    """``Values(full)`` or ``Values(spread)`` of a real dtype: see there."""
    if not dtype.is_floating_point:
        # any bit pattern, read as the signed integer of the dtype's width, and 0 (the sentinel) made 1 there:
        # torch before 2.13 has no where() of uint16/32/64
        wide = _random_words(size, dtype.itemsize, gen)
        return wide.bitwise_or_((wide == 0).to(wide.dtype)).view(dtype)
    if op is None or not defined(dtype, op):
        return _any_bits(size, dtype, gen)
    info = torch.finfo(dtype)
    digits = _digits(dtype)
    # the exponents of the largest finite value and of the smallest normal one (log2 of the largest rounds up)
    top, bottom = math.frexp(info.max)[1] - 1, math.frexp(info.tiny)[1] - 1
    # the powers of two come from float64, where exp2 of an integral value is exact, subnormals included
    work = _work(dtype)
    if op == "product":
        # any subset of the members' exponents sums within [bottom, top]: every partial product is exact
        lo, hi = -(-bottom // members), top // members
        # 2**e built from its bits (all normal), signed by the word's top bit: exp2 of float64 costs 9 ms
        # at 1 Mi
        words = _random_words(size, work.itemsize, gen)
        mantissa, bias = _digits(work) - 1, 2 - math.frexp(torch.finfo(work).tiny)[1]  # 23 and 127 in float32
        exponents = (words & 0x7FFF).remainder_(hi + 1 - lo).add_(lo + bias).bitwise_left_shift_(mantissa)
        return _signed_by(exponents.view(work), words).to(dtype)
    # members * |k| < 2**digits (2**(digits-1) under PREMUL_SUM's factor 2): any partial sum is exact
    limit = (2**digits - 1) // members // (2 if op == "premul_sum" else 1)
    step = members if op == "avg" else 1  # x / n is exact too, for a backend that scales first
    k = _nonzero(max(1, limit // step), size, gen, work)
    lo, hi = bottom - digits + 1, top - digits  # from the smallest subnormal to the top of the range
    # step and the power in one product, in place (exact: step * 2**e is a float of the dtype): at 1 Mi, each
    # pass through a new tensor cost a tenth of the draw
    if values.kind == "spread":
        return k.mul_(step).mul_(_spread_powers(lo, hi, math.prod(size), work).view(size)).to(dtype)
    return k.mul_(step * 2.0 ** round(values.scale / SCALE * (hi if values.scale > 0 else -lo))).to(dtype)


def _any_bits(size: tuple[int, ...], dtype: torch.dtype, gen: numpy.random.PCG64) -> Tensor:
    """Elements of any bit pattern but a NaN sentinel's (``cases.sentinel``), whose elements would pass
    for unwritten ones; one in each eight, at a random place among them, is a value random bits almost never
    give: +-0, +-inf, the smallest subnormal, the largest finite value."""
    width, count = dtype.itemsize, math.prod(size)
    raw = _random_bytes(count * width, gen).view(count, width)
    real = real_dtype(dtype)
    info = torch.finfo(real)
    rare = [0.0, -0.0, math.inf, -math.inf, info.tiny * info.eps, -info.tiny * info.eps, info.max, -info.max]
    # built in float64 and converted: older torch has no fill kernel for float8 (inf becomes e4m3fn's NaN)
    specials = torch.tensor(rare, dtype=torch.float64).to(dtype).view(torch.uint8).reshape(len(rare), width)
    # an element as an integer (or 8 bytes of it), put and compared whole
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32}.get(width, torch.int64)
    # the rare ones put by index, one place in each block of eight: a drawn mask and its indexes cost three
    # times as much, and no two land on one element (which of two would stay is the kernel's choice)
    words = _random_bytes(8 * -(-count // 8), gen).view(torch.int64)
    places = (torch.arange(0, count, 8) + (words & 7)).clamp_(max=max(count - 1, 0))
    which = (words >> 61) & (len(rare) - 1)
    if width <= 8:
        raw.view(as_int).view(count)[places] = specials.view(as_int).view(len(rare))[which]
    else:
        raw[places] = specials[which]
    nan = torch.full((1,), float("nan")).to(dtype).view(torch.uint8).view(as_int)
    raw[:, 0] ^= (raw.view(as_int) == nan).all(1).to(torch.uint8)
    return raw.view(dtype).reshape(size)


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
    dtype = _checked(inputs, op)
    result = _reduced(inputs, op, _wide(dtype))
    if dtype.is_floating_point or dtype.is_complex:
        return result
    if dtype == torch.bool:
        return result.bool()
    return result.to(dtype).to(torch.int64)


def exact_reduction(inputs: Sequence[Tensor], op: str) -> Tensor:
    """``reduce_reference`` where the result must be exact (``Values.exact``), folded in the inputs' own
    dtype: two's complement SUM and PRODUCT wrap alike in any width, MIN and MAX never round, and exactly
    reducible floats have nothing to round. No widened copy of each input, which was most of a large
    example's check."""
    return _reduced(inputs, op, _checked(inputs, op))


def _checked(inputs: Sequence[Tensor], op: str) -> torch.dtype:
    """The inputs' one dtype, once they are fit to reduce by ``op``; else a ValueError saying why."""
    if not inputs:
        raise ValueError("reduce_reference needs at least one input")
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {sorted(OPS)}")
    dtype = inputs[0].dtype
    if any(x.dtype != dtype or x.shape != inputs[0].shape for x in inputs):
        raise ValueError("inputs must share one dtype and shape")
    if not defined(dtype, op):
        raise ValueError(f"{op} has no exact reference for {dtype}")
    return dtype


def _reduced(inputs: Sequence[Tensor], op: str, dtype: torch.dtype) -> Tensor:
    """``inputs`` folded by ``op`` in ``dtype``, AVG divided by the group size, PREMUL_SUM scaled."""
    result = _folded(inputs, (_BOOL_FOLD if inputs[0].dtype == torch.bool else _FOLD)[op], dtype)
    if op == "avg" and result.is_complex():  # torch 2.2's complex division rounds even by a power of two
        result = (result.to(torch.complex128) / len(inputs)).to(dtype)
    elif op == "avg":
        result /= len(inputs)
    elif op == "premul_sum":
        result *= PREMUL_FACTOR  # a power of two: the same as scaling each input first
    return result


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
    n = len(inputs), S = sum_i |x_i|, E = |exact result|, u the unit roundoff (eps / 2) and
    g_k = k u / (1 - k u) (Higham's gamma: a sum of n terms in any order or tree, each addition rounded
    to the dtype, is off by at most g_(n-1) S, Higham 4.2):

    - SUM: g_(n-1) S + u E (the u E for a backend that accumulates wider and rounds once at the end).
    - PREMUL_SUM: g_n S f + u E: each x_i f rounds once more before the sum.
    - AVG: (g_(n-1) + 2 u) S / n + 2 u E: the sum's error divided by n, each x_i / n rounded where a
      backend pre-scales, and a division or a multiplication by a rounded 1 / n at the end.
    - PRODUCT: ((n - 1) eps + u) E: each of the n - 1 multiplications adds a relative error u.

    Tight enough that one rank's contribution left out fails on every element at up to 8 ranks, bfloat16
    included (tests/test_values.py). The float64 reference is itself a float64 reduction, so
    (n - 1) eps64 S joins every bound; it only matters for float64 inputs.
    """
    return _bound(inputs, op, reduce_reference(inputs, op))


def _bound(inputs: Sequence[Tensor], op: str, expected: Tensor) -> Tensor:
    """``error_bound`` around the reference ``expected``, which the caller has computed already."""
    dtype, n = inputs[0].dtype, len(inputs)
    if is_exact(dtype, op):
        return torch.zeros(expected.shape, dtype=torch.float64)
    eps, eps64 = torch.finfo(real_dtype(dtype)).eps, torch.finfo(torch.float64).eps
    exact = expected.abs()
    if op == "product":
        # a complex multiplication rounds up to sqrt(5) u (Higham 3.6): 2 eps covers it with a margin
        per_step = 2 * (eps + eps64) if dtype.is_complex else eps + eps64
        return ((n - 1) * per_step + eps / 2) * exact
    # |x| is exact in a real dtype; a complex one's is widened first, as its magnitude rounds
    magnitudes = [(x.to(torch.complex128) if dtype.is_complex else x).abs() for x in inputs]
    spread = _folded(magnitudes, torch.add, torch.float64)
    u, reference = eps / 2, (n - 1) * eps64  # the float64 reference's own error, per unit of spread

    def gamma(k: int) -> float:
        return k * u / (1 - k * u)

    # scalar factors first: each whole-tensor operation costs as much as the reduction itself at 1 Mi
    if op == "premul_sum":
        return spread.mul_((gamma(n) + reference) * PREMUL_FACTOR).add_(exact, alpha=u)
    if op == "avg":
        return spread.mul_((gamma(n - 1) + 2 * u + reference) / n).add_(exact, alpha=2 * u)
    return spread.mul_(gamma(n - 1) + reference).add_(exact, alpha=u)


def assert_reduced_close(actual: Tensor, inputs: Sequence[Tensor], op: str, values: Values = SMALL) -> None:
    """Assert ``actual`` is what reducing the per-rank ``inputs`` (drawn as ``values``) by ``op`` may give in
    their dtype.

    Exact cases (integers, bools, MIN, MAX, exactly reducible floats: ``Values.exact``) must match bit for
    bit after casting the reference to the dtype; other floating SUM, AVG and PRODUCT must lie within
    ``error_bound``. The message names the op, dtype and group size, how many elements fail, and the worst
    one: its index, value, the exact value, the error and the bound. A result that is another op's
    reduction says which (an AVG that is the SUM; a MAX folded as a SUM by code comparing ``op`` to a string).
    """
    dtype, n = inputs[0].dtype, len(inputs)
    exact = values.exact(dtype, op, n)
    expected = exact_reduction(inputs, op) if exact else reduce_reference(inputs, op)
    bound = None if exact else _bound(inputs, op, expected)
    what = f"{op} over {n} ranks of {dtype}"
    try:
        _assert_within(actual, expected, bound, dtype, what)
    except AssertionError as exc:
        other = _reduced_by(actual, inputs, exclude=op) if n > 1 else None
        if other is not None:
            hint = (
                f"AVG not divided by the group size ({n})"
                if (op, other) == ("avg", "sum")
                else f"was op=ReduceOp.{op.upper()} (a torch.distributed.ReduceOp, not a string) taken for "
                f"{other.upper()}?"
            )
            # the same error, raised where it was: hypothesis tells failures apart by that place, and
            # ranks that see the same bug may find a hint on some of them only (an element left as this
            # rank's own is the MAX on one, the MIN on another, neither on a third)
            exc.args = (f"{exc}; it is the {other.upper()}: {hint}",)
        raise
    assert_written_within(actual, what)


def placed(view: Tensor, around: Sequence[Tensor]) -> Tensor:
    """``view``, marked with the parts of its buffer ``around`` it, and what they hold now: every check of
    ``view`` (``assert_written_within``) then checks that they still do, since a call given a view must
    write nothing outside it."""
    # a tensor keeps what is set on it
    view._around = tuple((region, _bytes_of(region).clone()) for region in around)  # type: ignore[attr-defined]
    return view


def assert_written_within(tensor: Tensor, what: str) -> None:
    """Nothing was written around ``tensor`` in the buffer it is a view of (``placed``): a backend that
    writes past a view's end (a kernel's whole vectors), into a strided view's gaps or at the storage's
    start corrupts what the caller keeps there (in-place offsets: Aluminum 21 and 22, nccl-tests 261).
    ``assert_reduced_close`` and ``cases.assert_moved`` check it of every result."""
    for region, held in getattr(tensor, "_around", ()):
        now = _bytes_of(region)
        if torch.equal(now, held):
            continue
        width = region.element_size()
        written = (now.cpu() != held.cpu()).view(-1, width).any(1)
        i = int(written.nonzero()[0])
        was = held.cpu().view(-1, width)[i].view(region.dtype).item()
        raise AssertionError(
            f"{what}: {int(written.sum())} element(s) written outside the tensor, in the buffer it is a view "
            f"of (storage offset {tensor.storage_offset()}, strides {list(tensor.stride())}); first: "
            f"{was!r} became {region.reshape(-1)[i].item()!r}"
        )


def _bytes_of(region: Tensor) -> Tensor:
    """``region``'s bytes, in order (``_raw``)."""
    return _raw(region).view(torch.uint8)


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` flat, its elements' bytes in order: a view of its memory where that holds them so, else a
    copy. A bool as its byte, which a bool copy would make 0 or 1 (the sentinel's 0xFF with it)."""
    tensor = tensor.view(torch.uint8) if tensor.dtype == torch.bool else tensor
    if tensor.numel() > 1 and tensor.is_contiguous() and not (tensor.is_conj() or tensor.is_neg()):
        return tensor.reshape(-1)
    # a copy, not contiguous(): a one-element view with stride 2 counts as contiguous and can't be viewed
    return torch.empty(tensor.numel(), dtype=tensor.dtype).copy_(tensor.reshape(-1))


_CONFUSED = ("sum", "avg", "max", "min", "product", "band", "bor", "bxor")  # what a wrong op is taken for


def _reduced_by(actual: Tensor, inputs: Sequence[Tensor], exclude: str) -> str | None:
    """The reduce op other than ``exclude`` whose reduction of ``inputs`` ``actual`` is, if any."""
    for other in _CONFUSED:
        if other == exclude or not defined(inputs[0].dtype, other):
            continue
        try:
            # exact where the op must be: a bound would subtract bools, which torch refuses
            bound = None if is_exact(actual.dtype, other) else error_bound(inputs, other)
            _assert_within(actual, reduce_reference(inputs, other), bound, actual.dtype, "")
        except AssertionError:
            continue
        return other
    return None


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
        expected = expected.to(dtype)
        if dtype not in _MASK_ONLY and torch.equal(actual, expected):
            return  # one pass where all is well, 1.5 to 2 times quicker than the mask
        bad = actual != expected
        if dtype == torch.bool:
            # the sentinel 0xFF, never written, reads as True: a bool is wrong where it still holds that byte
            # (a uint8 SUM of bools may write 2 or more for True, as gloo's does, which torch reads as True)
            bad |= actual.view(torch.uint8) == UNWRITTEN_BOOL
        if bad.any():
            i = _first(bad)
            raise AssertionError(
                f"{what}: {int(bad.sum())} of {bad.numel()} elements differ from the exact result; first at "
                f"{i}: got {_shown(actual, i)}, expected {expected[i].item()}"
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


def _shown(tensor: Tensor, i: tuple[int, ...]) -> str:
    if tensor.dtype == torch.bool and tensor.view(torch.uint8)[i].item() == UNWRITTEN_BOOL:
        return f"the byte {UNWRITTEN_BOOL:#04x} (never written)"
    return str(tensor[i].item())


def is_exact(dtype: torch.dtype, op: str) -> bool:
    """Whether every backend must give the exact result bit for bit: integers and bool, MIN and MAX."""
    return not (dtype.is_floating_point or dtype.is_complex) or op in ("min", "max")


def real_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a complex dtype's parts, or ``dtype`` itself. Not ``dtype.to_real()``: torch 2.2's drops
    a reference to a real dtype on every call, and a run making enough of them frees torch.float32 and
    crashes (a segmentation fault, seen on the floor's torch)."""
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)


def _wide(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_complex:
        return torch.complex128
    return torch.float64 if dtype.is_floating_point else torch.int64


# Compared by the mask alone: torch.equal is no quicker for bytes and slower for float16 (docs/measurements),
# and a bool output's unwritten byte would read as True
_MASK_ONLY = {torch.bool, torch.int8, torch.uint8, torch.float16}
_MOVED_ONLY = {getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)}


def _first(mask: Tensor) -> tuple[int, ...]:
    return tuple(int(j) for j in mask.nonzero()[0])


def _work(dtype: torch.dtype) -> torch.dtype:
    """The dtype a floating input is computed in: float32 below float64, at half float64's cost. Every value
    drawn, and each of its factors, is exact there, random to the dtype's last mantissa bit."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _digits(dtype: torch.dtype) -> int:
    """A floating dtype's mantissa bits, the implicit one included: 24 in float32."""
    return 1 - int(math.log2(torch.finfo(dtype).eps))


def _nonzero(bound: int, size: tuple[int, ...], gen: numpy.random.PCG64, dtype: torch.dtype) -> Tensor:
    """Numbers of ``dtype`` uniform over the integers +-[1, ``bound``], in one draw: ``bound`` a power of two
    up to 64, or ``dtype`` a floating one."""
    count = math.prod(size)
    if bound <= 64 and bound & (bound - 1) == 0:  # a byte's low bits, at a fraction of a draw's cost
        drawn = (_random_bytes(count, gen) & (2 * bound - 1)).view(size).to(dtype) - bound
        return drawn + (drawn >= 0)
    # the magnitude a uniform fraction to the dtype's last mantissa bit, scaled to [1, bound] and floored,
    # and the word's top bit its sign: one word an element gives both, with no integer tensor to convert
    bits = _digits(dtype)
    words = _random_words(size, dtype.itemsize, gen)
    drawn = (words & ((1 << bits) - 1)).to(dtype).mul_(bound / 2**bits).floor_().add_(1).clamp_(max=bound)
    return _signed_by(drawn, words)


@functools.lru_cache(maxsize=4)
def _spread_powers(lo: int, hi: int, count: int, work: torch.dtype) -> Tensor:
    """2**e for e rounded from lo to hi along ``count`` elements: the same for every input of a size (a
    1 Mi float64 exp2 is a few milliseconds), never written to."""
    return torch.exp2(torch.linspace(lo, hi, count, dtype=torch.float64).round()).to(work)
