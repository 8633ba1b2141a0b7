"""How a mismatch between ranks ended, read from the group's outcome (conformance.mismatches.behaviour)
without processes; the runs on live groups are in test_capabilities.py."""

from __future__ import annotations

import json

import pytest

from pytest_collectives.conformance.matrix import CapabilityMatrix, mismatch_lines
from pytest_collectives.conformance.mismatches import behaviour, world_size_for
from pytest_collectives.execution.launchers.warm_groups import last_words
from pytest_collectives.execution.outcome import CRASHED, HUNG, GroupOutcome, RankReport

TRACEBACK = """Traceback (most recent call last):
  File "x.py", line 1, in call
    dist.all_reduce(t)
RuntimeError: Check failed: outputShape[0] * worldSize == inputShape[0]
"""
CRASH = """killed by SIGABRT
its last words on stderr:
terminate called after throwing an instance of 'gloo::EnforceNotMet'
  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4. Received data size
Fatal Python error: Aborted
"""


@pytest.mark.parametrize(
    "reports, first, expected",
    [
        ([RankReport(0, "passed"), RankReport(1, "passed")], None, "silent"),
        (
            [RankReport(0, "passed"), RankReport(1, "failed", TRACEBACK)],
            1,
            "detected: rank 1 RuntimeError: Check failed: outputShape[0] * worldSize == inputShape[0]",
        ),
        (
            [RankReport(0, CRASHED, CRASH), RankReport(1, HUNG)],
            0,
            "detected: rank 0 crashed (killed by SIGABRT): what(): [enforce fail at pair.cc:456] "
            "op.preamble.length <= op.nbytes. 8 vs 4. Received data size",
        ),
        ([RankReport(0, HUNG), RankReport(1, HUNG)], None, "detected: rank 0 hung, named after 5 s"),
    ],
    ids=["returned", "raised", "crashed", "hung"],
)
def test_behaviour_is_how_the_blamed_rank_ended(reports, first, expected):
    assert behaviour(GroupOutcome(reports, first, timeout_s=5.0)) == expected


def test_behaviour_reads_the_same_whichever_rank_reported_first():
    both = [RankReport(0, "failed", TRACEBACK), RankReport(1, "failed", TRACEBACK.replace("Check", "Size"))]
    assert behaviour(GroupOutcome(both, 1)) == behaviour(GroupOutcome(both, 0))
    assert behaviour(GroupOutcome(both, 1)).startswith("detected: rank 0 RuntimeError: Check failed")


def test_a_mismatch_is_tried_at_the_smallest_world_size_with_a_peer():
    assert world_size_for((1, 4, 2)) == 2
    assert world_size_for((1,)) is None


def test_an_xdist_workers_mismatch_rows_reach_the_controllers_matrix():
    """What a worker exports (plain JSON) merges into the controller's document as a serial run has it."""
    worker, controller = CapabilityMatrix(None, "gloo", worker=True), CapabilityMatrix(None, "gloo")
    worker.add_mismatch("broadcast", "shape", 2, "silent")
    controller.merge(json.loads(json.dumps(worker.export())))
    rows = controller.document()["mismatches"]
    assert rows == [{"operation": "broadcast", "kind": "shape", "world_size": 2, "behaviour": "silent"}]
    assert mismatch_lines(rows)[1:] == ["  broadcast: shape, returned on every rank"]


def test_a_crash_keeps_the_abort_s_reason_before_deep_stacks() -> None:
    """gloo's enforce message comes before faulthandler's dump of every thread: a dump longer than the
    tail must not push it out of the rank's last words (a planted ring bug was judged on them)."""
    stacks = "".join(f'  File "f{i}.py", line {i} in g\n' for i in range(80))
    noise = "".join(f"noise {i}\n" for i in range(10))
    stderr = f"{noise}{CRASH.split(chr(10), 2)[2]}\nThread 0x1 (most recent call first):\n{stacks}"
    words = last_words(stderr)
    assert "what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes" in words
    assert "noise 0" not in words and len(words.splitlines()) < 40
    assert last_words("a\nb\n") == "a\nb"
