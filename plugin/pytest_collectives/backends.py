"""What the harness assumes of a backend after one of its calls raised, and how a backend's module says."""

from __future__ import annotations

# gloo refuses a call before any state changes. NCCL does not always: torch raises two of its refusals
# (a list all_to_all, batch_isend_irecv) inside a group call it never closes, so every later call on that
# thread, or on that process group, is taken and never run (docs/measurements/scripts/nccl_findings.py).
# A backend the harness has not seen may do either: after its calls raised, its group is asked
# (pool.GroupPool.run).
_CLEAN_AFTER_A_RAISE = {"gloo"}
_LEFT_INSIDE_A_GROUP_CALL = frozenset({"nccl"})


def clean_after_a_raise(backend: str) -> None:
    """Declare, from a backend's module, that a call of ``backend`` that raised leaves it as it was: its
    group is reused without a question after a test whose calls raised, and the suites try the calls after
    a refusal on the same thread."""
    _CLEAN_AFTER_A_RAISE.add(backend)


def keeps_state_after_a_raise(backend: str) -> bool:
    """Whether a call of ``backend`` that raised may have left it unfit for the calls after it."""
    return backend not in _CLEAN_AFTER_A_RAISE


def left_inside_a_group_call(backend: str) -> bool:
    """Whether a raise is known to leave ``backend`` unfit (its group is replaced, not asked)."""
    return backend in _LEFT_INSIDE_A_GROUP_CALL
