"""Every timed iteration's own bytes, and a check that each landed: ``benchmark(..., stamps=Stamps(...))``.

A benchmark whose iterations all send the same bytes proves, by one check at its end, only that one
transfer landed: a backend whose receives land on their first call alone passed with healthy figures. So
before each call every buffer sent carries the call's stamp in one element, and after it that element of
every buffer received is logged; after each round (outside its timer) each logged value must be what that
call's stamp gives there (``landed``: the stamp itself for a copy, n times it for a sum over n ranks).
Consecutive stamps differ, so a receive that did not land keeps an earlier value and is named with its
iteration.

The stamp walks: call c stamps the element at ``position(c, n)``, a low-discrepancy walk over the n
elements of the buffer (multiples of the golden ratio), and the sender puts back what the previous stamp
replaced. So the calls of a benchmark check elements spread over the whole payload, every call a different
one: a receive that lands only part of the buffer (its first elements, its last, a chunk of the middle) on
its repeat calls misses a stamp within a few calls of the first that falls outside the part, where a stamp
fixed in the first element passed it (16 benchmarks of a backend landing only its first 16 elements
passed). A dropped part of a fraction f of the buffer is found within about 1/f calls; the whole payload
is checked once more at the end (``as_landed``).

What it costs: on the CPU a stamp is two writes and a read through NumPy views, and a receive's check a
read, 2.4 us a call with one send and one receive (measured on the 2-core CI machine,
docs/measurements/performance-gate.md), where a 4 KiB gloo send/recv there takes hundreds of
microseconds; on a device it is a fill and two copies of one element, three kernel launches a call, read
back once a round (not yet measured on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

PERIOD = 1021  # stamps run 1..PERIOD: consecutive ones differ, and a sum of them over 2**14 ranks is exact
GOLDEN = (5**0.5 - 1) / 2  # its multiples modulo 1 fill [0, 1) the most evenly of any step


def stamp(call: int) -> float:
    """The stamp of the ``call``-th call (counted from 1)."""
    return float(call % PERIOD + 1)


def position(call: int, length: int) -> int:
    """Where the ``call``-th call's stamp sits in a buffer of ``length`` elements: the same in a sender's
    buffer and in its receiver's, which have the same length."""
    return int((call * GOLDEN) % 1.0 * length)


class _Slots:
    """A buffer's elements one at a time, read and written without a kernel launch on the CPU, and where
    the last stamp sits with the bits it replaced (a NaN's payload included: random bytes seen as floats)."""

    def __init__(self, tensor: Any) -> None:
        self.flat = tensor.view(-1)
        self.array = self.bits = None
        if tensor.device.type == "cpu":
            try:
                self.array = self.flat.numpy()
                self.bits = self.array.view(f"u{self.array.itemsize}")
            except TypeError:  # a dtype NumPy lacks (bfloat16): torch's own calls, on the CPU too
                pass
        self.at: int | None = None
        self.replaced: Any = None

    def read(self, call: int) -> Any:
        """The element the ``call``-th call's stamp sits at."""
        i = position(call, self.flat.numel())
        if self.array is not None:
            return float(self.array[i])
        element = self.flat[i : i + 1]
        return element.item() if element.device.type == "cpu" else element.clone()

    def stamp(self, call: int, value: float) -> None:
        """Put back the bits the previous call's stamp replaced, and stamp this call's element."""
        if self.at is not None:
            if self.bits is not None:
                self.bits[self.at] = self.replaced
            else:
                self.flat[self.at : self.at + 1].copy_(self.replaced)
        self.at = i = position(call, self.flat.numel())
        if self.bits is not None:
            self.replaced = self.bits[i].copy()
            self.array[i] = value
        else:
            self.replaced = self.flat[i : i + 1].clone()
            self.flat[i : i + 1].fill_(value)


class Stamps:
    """Stamps written into ``sends`` before each call (each ``offset`` above the call's stamp, so that
    senders can be told apart) and read from ``receives`` after it; ``landed(s, j)`` is what receive ``j``
    holds after a call whose stamp was ``s`` (by default the stamp itself: a copy from a sender with no
    offset)."""

    SPACING = 1024.0  # between the stamps of senders told apart (``offset``): rank r's, r * SPACING up

    def __init__(
        self,
        sends: Sequence[Any] = (),
        receives: Sequence[Any] = (),
        landed: Callable[[float, int], float] = lambda s, j: s,
        offset: float = 0.0,
    ) -> None:
        # an empty buffer (a part of 0 elements at the smallest sizes) has nowhere to carry a stamp
        self.sends = [_Slots(t) for t in sends if t.numel()]
        self.receives = [(j, _Slots(t)) for j, t in enumerate(receives) if t.numel()]
        self.landed = landed
        self.offset = offset
        self.calls = 0
        self.seen: list[tuple[int, list[Any]]] = []  # (call, each receive's first element) since the check

    @classmethod
    def summed(cls, sends: Sequence[Any], receives: Sequence[Any], ranks: int) -> Stamps:
        """A sum over ``ranks`` ranks that all stamp alike: each receive holds ``ranks`` times the stamp."""
        return cls(sends, receives, landed=lambda s, j: ranks * s)

    @classmethod
    def apart(
        cls, sends: Sequence[Any], receives: Sequence[Any], rank: int, senders: Sequence[int] | None = None
    ) -> Stamps:
        """Senders told apart: this ``rank`` stamps its sends ``rank * SPACING`` above the call's stamp, and
        receive ``j`` holds the stamp of rank ``senders[j]`` (by default rank ``j``: a part per rank)."""
        return cls(
            sends,
            receives,
            landed=lambda s, j: s + (senders[j] if senders is not None else j) * cls.SPACING,
            offset=rank * cls.SPACING,
        )

    def wrap(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` with the stamps written before it and read after it."""

        def stamped() -> Any:
            self.calls += 1
            for slots in self.sends:
                slots.stamp(self.calls, stamp(self.calls) + self.offset)
            result = fn()
            if self.receives:
                self.seen.append((self.calls, [slots.read(self.calls) for _, slots in self.receives]))
            return result

        return stamped

    def check(self) -> str | None:
        """What is wrong where a call's receive does not hold what its stamp gives (that call's transfer
        never landed, or landed late, or from another call), else None. Called after each round, outside
        its timer (timing.measure, which ends the benchmark on every rank where one rank says so)."""
        seen, self.seen = self.seen, []
        if not seen:
            return None
        values = _floats(v for _, got in seen for v in got)
        width = len(self.receives)
        wrong = []
        for i, (call, _) in enumerate(seen):
            for k, (j, _) in enumerate(self.receives):
                want = self.landed(stamp(call), j)
                if values[i * width + k] != want:
                    wrong.append((call, j, values[i * width + k], want))
        if not wrong:
            return None
        call, j, got, want = wrong[0]
        return (
            f"{len(wrong)} of {len(seen) * width} timed receives of a round did not land as sent: the first, "
            f"of call {call} (buffer {j}), holds {got!r} where that call's stamp gives {want!r} (a receive "
            f"that did not land, or landed only part of the buffer, keeps earlier bytes where the stamp was)"
        )

    def as_landed(self, expected: Any, j: int = 0) -> Any:
        """``expected`` (what receive ``j`` must hold, as it was before any stamp) with the last call's
        stamp where it landed: what the whole payload is checked against once the benchmark is done."""
        landed = expected.clone()
        if self.calls and landed.numel():
            at = position(self.calls, landed.numel())
            landed.view(-1)[at : at + 1].fill_(self.landed(stamp(self.calls), j))
        return landed

    def all_landed(self, expected: Sequence[Any]) -> Any:
        """``as_landed`` of each receive's expected contents, joined: a flat buffer received in parts."""
        import torch

        return torch.cat([self.as_landed(part, j) for j, part in enumerate(expected)])


def _floats(values: Any) -> list[float]:
    """Logged values as floats: a device's are stacked and read back at once."""
    values = list(values)
    if values and not isinstance(values[0], float):
        import torch

        return torch.cat(values).double().cpu().tolist()
    return values
