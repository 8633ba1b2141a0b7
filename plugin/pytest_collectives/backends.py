"""What the harness assumes of a backend after one of its calls raised."""

from __future__ import annotations

# gloo refuses a call before any state changes. NCCL does not always: torch raises two of its refusals
# (a list all_to_all, batch_isend_irecv) inside a group call it never closes, so every later call on that
# thread, or on that process group, is taken and never run (tests/nccl_findings.py). A backend the
# harness has not seen is treated as NCCL is.
_CLEAN_AFTER_A_RAISE = frozenset({"gloo"})


def keeps_state_after_a_raise(backend: str) -> bool:
    """Whether a call of ``backend`` that raised may have left it unfit for the calls after it."""
    return backend not in _CLEAN_AFTER_A_RAISE
