"""Every timed iteration's own bytes, and a check that each landed: ``benchmark(..., stamps=Stamps(...))``.

A benchmark whose iterations all send the same bytes proves, by one check at its end, only that one
transfer landed: a backend whose receives land on their first call alone passed with healthy figures. So
before each call every buffer sent carries the call's stamp in its first element, and after it the first
element of every buffer received is logged; after each round (outside its timer) each logged value must be
what that call's stamp gives there (``landed``: the stamp itself for a copy, n times it for a sum over n
ranks). Consecutive stamps differ, so a receive that did not land leaves the previous call's value and is
named with its iteration. The rest of the payload is checked once, at the end, as before (``as_landed``).

What it costs: on the CPU a stamp is a write and a read through NumPy views, 2.7 us a call with one send
and one receive (measured on the 2-core CI machine, docs/measurements/performance-gate.md), where a 4 KiB gloo
send/recv there takes hundreds of microseconds; on a device it is a one-element fill and copy, two kernel
launches a call, read back once a round (not yet measured on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

PERIOD = 1021  # stamps run 1..PERIOD: consecutive ones differ, and a sum of them over 2**14 ranks is exact


def stamp(call: int) -> float:
    """The stamp of the ``call``-th call (counted from 1)."""
    return float(call % PERIOD + 1)


class _Word:
    """The first element of a tensor, read and written without a kernel launch on the CPU."""

    def __init__(self, tensor: Any) -> None:
        self.element = tensor.view(-1)[:1]
        self.array = None
        if tensor.device.type == "cpu":
            try:
                self.array = self.element.numpy()
            except TypeError:  # a dtype NumPy lacks (bfloat16): torch's own calls, on the CPU too
                pass

    def set(self, value: float) -> None:
        if self.array is not None:
            self.array[0] = value
        else:
            self.element.fill_(value)

    def get(self) -> Any:
        if self.array is not None:
            return float(self.array[0])
        return self.element.item() if self.element.device.type == "cpu" else self.element.clone()


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
        self.sends = [_Word(t) for t in sends if t.numel()]
        self.receives = [(j, _Word(t)) for j, t in enumerate(receives) if t.numel()]
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
            for word in self.sends:
                word.set(stamp(self.calls) + self.offset)
            result = fn()
            if self.receives:
                self.seen.append((self.calls, [word.get() for _, word in self.receives]))
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
            f"that did not land keeps the previous call's bytes)"
        )

    def as_landed(self, expected: Any, j: int = 0) -> Any:
        """``expected`` (what receive ``j`` must hold, as it was before any stamp) with the last call's
        stamp where it landed: what the whole payload is checked against once the benchmark is done."""
        landed = expected.clone()
        if self.calls and landed.numel():
            landed.view(-1)[:1].fill_(self.landed(stamp(self.calls), j))
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
