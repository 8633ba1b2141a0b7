"""The kinds of wrongness a conformance check tells apart, read from the words it fails with.

One bug of a backend shows more than one symptom: gloo's reduce_scatter of a strided view reads the
inputs' storage as if dense, and whether the result then holds wrong values, leaves elements never
written or writes into the view's gaps depends on the example drawn. A known bug is matched by its
cell (the ``match`` of its manifest entry, such as ``strided reduce_scatter on rank \\d+: ...``) and the
kinds of wrongness it may show (its ``kinds``), so every symptom of that bug is that bug at every seed,
and a failure of another kind in the same cell (a crash, a refusal, a shape torch did not ask for) is not.

The checks that write these words are ``algorithms.reference`` (a reduction's values, writes outside a
view) and ``conformance.cases`` (moved bytes, elements never written).
"""

from __future__ import annotations

import re

__all__ = ["KINDS", "kind_of"]

# each kind, with the words of the checks that report it; a message shows one kind, the first that matches
_WORDS: dict[str, re.Pattern[str]] = {
    "written outside": re.compile(r"\d+ element\(s\) written outside the tensor"),
    "never written": re.compile(r"\d+ of \d+ elements wrong \([1-9]\d* never written\)"),
    "wrong values": re.compile(
        r"\d+ of \d+ elements (exceed the rounding-error bound|differ from the exact result|wrong \(0 never "
        r"written\))"
    ),
}
KINDS: tuple[str, ...] = tuple(_WORDS)


def kind_of(message: str) -> str | None:
    """The kind of wrongness ``message`` (a check's failure, one line) reports, or None for any other
    failure: an exception of the backend's, a shape or dtype torch did not ask for, a hang."""
    return next((kind for kind, words in _WORDS.items() if words.search(message)), None)
