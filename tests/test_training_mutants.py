"""The training-stack properties (suites/conformance/test_training.py) catch each planted bug of
tests/training_mutants.py with its consequence named, and pass without one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import run_on_backend

from pytest_collectives.conformance.matrix import TRAINING_STACKS
from pytest_collectives.conformance.training import stacks

pytestmark = pytest.mark.skipif(
    bool(stacks.missing(stacks.FSDP2)), reason=str(stacks.missing(stacks.FSDP2))
)

STEP = "*The collectives of step 0 on this rank, in order:"
# a training step cannot be reproduced alone: the record of its collectives, the closest thing, is named
RECORD = (
    "*standalone reproduction: none (a training step cannot be reproduced alone); its closest thing, the "
    "collectives of the step that diverged: *_rank?.txt"
)
MUTANTS = [
    (
        "avg_reduce_scatter_run_as_sum",
        "fsdp2 and 1d and float32",
        [
            "*FSDP2 in float32 on a (3,) mesh, step 0: parameter * differs * the gradients differ; suspect "
            "reduce_scatter_single with AVG (*a SUM there scales them by the ranks).",
            # the mutant ran FSDP2's AVG as SUM: the record shows what c10d was handed
            STEP, "*c10d._allgather_base_(float32*, float32*, group of 3)*",
            "*c10d._reduce_scatter_base_(float32*, float32*, group of 3, SUM)*", RECORD,
        ],
    ),
    (
        "all_gather_ignores_an_aliased_input",
        "fsdp2 and 1d and float64",
        [
            "*FSDP2 in float64 on a (3,) mesh, step 0: loss * the forward pass differs; suspect "
            "all_gather_single into FSDP2's flat buffer (each rank's input a view of its own slice).",
            STEP, "*c10d._allgather_base_(float64*", RECORD,
        ],
    ),
    (
        "uint8_all_gather_swaps_two_ranks",
        "fsdp2 and 1d and uint8",
        [
            "*FSDP2 in float32 on a (3,) mesh, step 0: loss * the forward pass differs; suspect "
            "all_gather_single into FSDP2's flat buffer (*), as uint8 bytes (a unit whose parameters differ*",
            STEP, "*c10d._allgather_base_(uint8*", RECORD,
        ],
    ),
    (
        "functional_all_reduce_returns_before_the_data",
        "tensor_parallel and 1d",
        [
            "*tensor parallel on a (3,) mesh, step 0: loss * suspect all_reduce of RowwiseParallel's partial "
            "outputs.",
            # the all_reduce never reached c10d, and the record says so
            STEP, "    none", RECORD,
        ],
    ),
    (
        "redistribute_drops_an_uneven_last_shard",
        "redistribute and 1d_mesh",
        [
            "*redistribute S(0)->* of a (7, 5) tensor on a (3,) mesh: * element(s) of 35 differ from the "
            "tensor placed*",
        ],
    ),
]


# the training stacks' suite on the default backend, which training_mutants patches as TRAINING_MUTANT says
# (read on every rank when training_mutants is imported)
TRAINING = {"module": "training_mutants", "files": ("test_training.py",), "dist_timeout": 60}


@pytest.mark.parametrize("mutant, select, message", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_a_planted_training_stack_bug_is_caught(pytester, mutant, select, message) -> None:
    result = run_on_backend(pytester, None, "-x", "-k", select, env={"TRAINING_MUTANT": mutant}, **TRAINING)
    assert result.parseoutcomes().get("failed", 0) == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(message)
    records = re.findall(r"the step that diverged: (\S+\.txt)", result.stdout.str())
    assert bool(records) == (RECORD in message)
    for record in records:  # the record holds what the message says, for the vendor's report
        assert "The collectives of step 0 on this rank, in order:\n  " in Path(record).read_text()


def test_the_same_selections_pass_with_nothing_planted(pytester) -> None:
    select = " or ".join(f"({m[1]})" for m in MUTANTS)
    result = run_on_backend(pytester, None, "-x", "-k", select, env={"TRAINING_MUTANT": ""}, **TRAINING)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == len(MUTANTS), result.stdout.str()


def test_a_python_process_group_has_every_training_row_na_for_one_reason(pytester) -> None:
    """torch finds a group for DeviceMesh by the name a C++ c10d Backend keeps, which a ProcessGroup written
    in Python lacks: each training test is N/A for that one reason (none an error at set-up), at two world
    sizes, and the matrix's JSON records each row as not run, with it."""
    result = run_on_backend(
        pytester, "refgloo", "-rs", "--world-sizes", "2,4", "--capability-json", "m.json",
        files=("test_training.py",),
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert not outcomes.get("errors") and not outcomes.get("failed") and outcomes["skipped"] > 20, outcomes
    reason = "refgloo is a ProcessGroup written in Python, and torch finds a group for DeviceMesh*"
    result.stdout.fnmatch_lines([f"FSDP2: N/A: {reason}", f"SKIPPED * N/A: {reason}"])
    doc = json.loads((pytester.path / "m.json").read_text())
    rows = [r for r in doc["cells"] if r["operation"].split(" ")[0] in TRAINING_STACKS]
    assert {r["operation"].split(" ")[0] for r in rows} == set(TRAINING_STACKS), rows
    assert all(r["status"] == "N/A" and "written in Python" in r["reason"] for r in rows), rows
    assert set(doc["training"].values()) == {f"N/A: {rows[0]['reason']}"}, doc["training"]
