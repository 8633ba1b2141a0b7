"""A dtype or shape that differs between ranks, per operation: the call ends in an error, a crash or a hang
the harness names within its deadline (detected), or returns on every rank (silent). Either is the
backend's capability, reported in rows of the capability matrix (``cross-rank mismatches``), not a failure:
some healthy backends do not check. What fails is a session the mismatch takes down: after each one, the
next call on a group of that size must give the right sum.

Each case runs from pytest's process on a group of the smallest world size of two ranks or more
(pytest_collectives.conformance.mismatches); a group it leaves broken is replaced, as after a test.
"""

from __future__ import annotations

import pytest

from pytest_collectives import (
    MISMATCH_DEADLINE_S,
    MISMATCH_KINDS,
    MISMATCH_OPERATIONS,
    NO_OP,
    REDUCTIONS,
    call_with_a_mismatch,
    healthy_sum,
    mismatch_behaviour,
    mismatch_world_size,
    outcome_on_ranks,
    probed,
    record_mismatch,
    run_on_ranks,
    settings_of,
    survives_a_crash,
)


@pytest.mark.parametrize("kind", MISMATCH_KINDS)
@pytest.mark.parametrize("operation", MISMATCH_OPERATIONS)
def test_a_mismatch_between_ranks_is_detected_or_reported_silent(request, operation, kind):
    config = request.config
    if not survives_a_crash(config):
        pytest.skip("N/A under torchrun: a rank the mismatch crashes ends the job; run it pooled")
    world_size = mismatch_world_size(settings_of(config).world_sizes)
    if world_size is None:
        pytest.skip("N/A: a mismatch between ranks needs two ranks or more (--world-sizes)")
    found = probed(config, world_size)
    op = "sum" if operation in REDUCTIONS else NO_OP
    if not all(found.supports(operation, dtype, op) for dtype in ("float32", "float64")):
        pytest.skip(f"N/A: {found.backend} has no {operation} of float32 and float64 at {world_size} ranks")
    outcome = outcome_on_ranks(
        config, world_size, call_with_a_mismatch, MISMATCH_DEADLINE_S, operation=operation, kind=kind
    )
    behaviour = mismatch_behaviour(outcome)
    record_mismatch(config, operation, kind, world_size, behaviour)
    print(f"{operation}, {kind} differing at {world_size} ranks: {behaviour}")
    sums = run_on_ranks(config, world_size, healthy_sum)
    assert sums == [world_size] * world_size, f"after {operation}'s {kind} mismatch ({behaviour}): {sums}"
