"""The sweeps' rotating tiers turn with the run's seed: two seeds draw different cells at 1 Mi, consecutive
seeds walk every cell (and in the layout sweep every dtype of each element size), every cell runs at 64 Ki in
every run, and one run's world sizes each draw another."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from collections.abc import Iterator

import pytest
from helpers import SUITES, copy_conformance

from pytest_collectives.conformance import capabilities as caps
from pytest_collectives.conformance import rotation
from pytest_collectives.conformance.capabilities import DTYPES, REDUCE_OPS, Capabilities, dtype_name
from pytest_collectives.conformance.cases import TIERS, _every_cell, supported_cells
from pytest_collectives.conformance.matrix import NAMED_AT_MOST, short_dtype, tiers_line
from pytest_collectives.execution import suite_api

SIZES = (2, 3, 4)
# all_reduce as gloo takes it, near enough: every reduce op of integers, the bitwise ones refused in floats
CELLS = {
    ("all_reduce", dtype_name(d), op): "" if d.is_floating_point is False or op not in ("band", "bor", "bxor")
    else "refused"
    for d in DTYPES
    for op in REDUCE_OPS
}


@contextlib.contextmanager
def running(seed: int, world_size: int, cells: dict = CELLS, **params: object) -> Iterator[None]:
    """As while a test at ``world_size`` of a run at SIZES with ``--hypothesis-seed=seed`` draws, on a
    backend probed to support ``cells``."""
    caps.use(Capabilities("fake", "cpu", world_size, dict(cells)))
    rotation.use(seed)
    tokens = suite_api.PARAMS.set({"world_size": world_size, **params}), suite_api.SIZES.set(SIZES)
    try:
        yield
    finally:
        suite_api.PARAMS.reset(tokens[0])
        suite_api.SIZES.reset(tokens[1])
        caps.use(None)


def tier(seed: int, world_size: int, size: int, cells: dict = CELLS) -> set[tuple[str, str, str, int]]:
    with running(seed, world_size, cells):
        cases = _every_cell("all_reduce", rotation.turn())
    return {(*case.cells()[0], case.values.scale) for case in cases if case.size == size}


def test_two_seeds_draw_different_cells_and_consecutive_seeds_cover_every_cell() -> None:
    with running(0, 2):  # those the probe supports that the reference defines
        cells = supported_cells(["all_reduce"], DTYPES, REDUCE_OPS)
    supported = {("all_reduce", dtype_name(d), op) for d, op in cells}
    assert len(supported) > 30
    assert tier(1, 2, TIERS[1]) != tier(2, 2, TIERS[1])
    # one run's world sizes: three cells at 1 Mi, not one
    assert len({cell for n in SIZES for cell in tier(5, n, TIERS[1])}) == 3
    at_1mi = {cell[:3] for seed in range(len(supported)) for cell in tier(seed, 2, TIERS[1])}
    assert at_1mi == supported
    for seed in (1, 2):  # every cell at 64 Ki in every run, its scale turning
        assert {cell[:3] for cell in tier(seed, 2, TIERS[0])} == supported
    assert tier(1, 2, TIERS[0]) != tier(2, 2, TIERS[0])


def test_the_layout_sweep_turns_every_dtype_of_each_element_size() -> None:
    path = SUITES / "conformance" / "test_layouts.py"
    spec = importlib.util.spec_from_file_location("layouts_under_test", path)
    layouts = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = layouts  # type: ignore[union-attr]  # its dataclasses look themselves up
    try:
        spec.loader.exec_module(layouts)  # type: ignore[union-attr]
    finally:
        del sys.modules[spec.name]  # type: ignore[union-attr]
    cells = {("all_reduce", dtype_name(d), "sum"): "" for d in DTYPES}

    def dtypes(seed: int) -> set[str]:
        with running(seed, 2, cells, name="all_reduce"):
            return {dtype_name(t.dtype) for t in layouts._of_each_size(rotation.turn())}

    with running(0, 2, cells):
        supported = {dtype_name(d) for d, _ in supported_cells(["all_reduce"], DTYPES, ("sum",))}
    assert dtypes(1) != dtypes(2) and len(supported) > 8
    assert set().union(*(dtypes(seed) for seed in range(len(DTYPES)))) == supported


def test_the_run_turns_at_its_hypothesis_seed(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig("--hypothesis-seed=7")
    assert rotation.taken(config) is None and rotation.of_run(config) == 7 == rotation.taken(config)
    assert rotation.of_run(pytester.parseconfig("--hypothesis-seed=abc")) == rotation.of_run(
        pytester.parseconfig("--hypothesis-seed=abc")
    )


def test_the_matrix_says_which_cells_passed_at_which_tier(pytester: pytest.Pytester) -> None:
    """A PASS of a cell the large tiers did not reach this run is a PASS at 97 elements: the JSON holds each
    cell's largest passing example, and the summary names the 1 Mi cell the seed turned to."""
    copy_conformance(pytester.path, ("test_every_cell.py",))
    result = pytester.runpytest(
        "test_every_cell.py", "-k", "every_supported_cell and all_reduce and not ring", "--world-sizes", "2",
        "--hypothesis-seed=5", "--capability-json", "m.json", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "m.json").read_text())
    rows = [r for r in doc["cells"] if r["status"] == "PASS"]
    at_1mi = [(r["operation"], r["dtype"], r["reduce_op"]) for r in rows if r.get("largest", 0) >= TIERS[1]]
    probed = {
        (r["operation"], r["dtype"], r["reduce_op"]): "refused" if r["status"] == "N/A" else ""
        for r in doc["cells"]
        if r["operation"] == "all_reduce"
    }
    assert at_1mi == [cell[:3] for cell in tier(5, 2, TIERS[1], probed)]  # the cell the seed turns to
    at_64ki = [r for r in rows if TIERS[0] <= r.get("largest", 0) < TIERS[1]]
    assert len(at_64ki) == len(rows) - 1  # every cell but the one at 1 Mi
    operation, dtype, op = at_1mi[0]
    result.stdout.fnmatch_lines(
        [
            f"of the {len(rows)} cells that passed, at 1 Mi elements: {operation} {short_dtype(dtype)} {op}; "
            f"at 64 Ki: {len(at_64ki)} more; the other {len(rows) - 1 - len(at_64ki)} at up to 97 "
            "elements only"
        ]
    )


def test_a_run_of_no_sized_example_says_nothing_of_the_tiers(pytester: pytest.Pytester) -> None:
    """A session prints only what ran: a run of object collectives alone (no tensor, no size) took the
    run's turn, but has no tier to speak of, where it printed "of the 0 cells that passed ..."."""
    copy_conformance(pytester.path, ("test_operations.py",))
    result = pytester.runpytest(
        "test_operations.py", "-k", "gather_object", "--world-sizes", "2", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*capability matrix*", "gather_object *P"])
    result.stdout.no_fnmatch_line("*size tiers*")
    result.stdout.no_fnmatch_line("*cells that passed*")


def test_a_whole_runs_1_mi_cells_are_counted_not_named() -> None:
    """A whole run's 1 Mi cells (the registered algorithms' too) are some 70: the line counts them."""
    row = {"operation": "all_reduce", "dtype": "int32", "reduce_op": "sum", "status": "PASS"}
    many = NAMED_AT_MOST + 1
    rows = [{**row, "largest": TIERS[1]}] * many + [{**row, "largest": 97}]
    assert tiers_line(rows) == (
        f"of the {many + 1} cells that passed, at 1 Mi elements: {many} cells ('largest' in "
        "--capability-json); at 64 Ki: 0 more; the other 1 at up to 97 elements only"
    )


def test_a_replay_of_one_world_size_turns_where_the_run_did() -> None:
    """A soak's replay selects one test at one world size; the turn once counted the world size's place
    among those selected, so a failure found at 3 ranks in a run at 2,3 replayed elsewhere (and passed)."""
    with running(11, 3):
        in_the_run = rotation.turn()
        token = suite_api.SIZES.set((3,))  # the replay: this world size alone selected
        try:
            assert rotation.turn() == in_the_run
        finally:
            suite_api.SIZES.reset(token)
    with running(11, 2):  # each world size of a run stands one turn further
        assert rotation.turn() == in_the_run - 1
