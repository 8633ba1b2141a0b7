"""The sweeps' rotating tiers turn with the run's seed: two seeds draw different cells at 1 Mi, consecutive
seeds walk every cell (and in the layout sweep every dtype of each element size), every cell runs at 64 Ki in
every run, and one run's world sizes each draw another."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from helpers import SUITES, copy_conformance

from pytest_collectives.conformance import capabilities as caps
from pytest_collectives.conformance import rotation, tiers
from pytest_collectives.conformance.capabilities import DTYPES, REDUCE_OPS, Capabilities, dtype_name
from pytest_collectives.conformance.cases import TIERS, _every_cell, supported_cells
from pytest_collectives.conformance.matrix import (
    NAMED_AT_MOST,
    CapabilityMatrix,
    rotation_line,
    short_dtype,
    tiers_line,
)
from pytest_collectives.conformance.settings import ConformanceSettings
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
def running(
    seed: int,
    world_size: int,
    cells: dict = CELLS,
    sizes: tuple[int, ...] = SIZES,
    whole: bool = False,
    **params: object,
) -> Iterator[None]:
    """As while a test at ``world_size`` of a run at ``sizes`` with ``--hypothesis-seed=seed`` draws, on a
    backend probed to support ``cells`` (``whole``: and found to fit every cell at 1 Mi in the budget)."""
    probed = Capabilities("fake", "cpu", world_size, dict(cells))
    caps.use(dataclasses.replace(probed, large_example_s=0.01 if whole else 1.0, whole_large_tier=whole))
    rotation.use(seed)
    tokens = suite_api.PARAMS.set({"world_size": world_size, **params}), suite_api.SIZES.set(sizes)
    try:
        yield
    finally:
        suite_api.PARAMS.reset(tokens[0])
        suite_api.SIZES.reset(tokens[1])
        caps.use(None)


def tier(
    seed: int, world_size: int, size: int, cells: dict = CELLS, **run: object
) -> set[tuple[str, str, str, int]]:
    with running(seed, world_size, cells, **run):
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
        "--hypothesis-seed=5", "--capability-json", "m.json", "--tier-budget", "0", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "m.json").read_text())
    assert "size_tiers" not in doc  # nothing timed where no budget could hold a cell
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


@pytest.mark.parametrize(
    ("example_s", "draw_s", "fits"),
    [
        (0.030, tiers.DRAW_S, True),  # 59 cells cost 1.8 s of the 2 s budget
        (0.060, 2 * tiers.DRAW_S, True),  # a machine half as fast: the run, the budget and the cells slow
        (0.060, tiers.DRAW_S, False),  # as fast a machine, an example twice as dear: ranks sharing cores
        (0.030, tiers.DRAW_S / 2, False),  # as dear an example on a machine twice as fast
        (None, tiers.DRAW_S, False),  # nothing to time
        (0.030, None, False),
    ],
)
def test_the_budget_scales_with_the_machines_draw(example_s: float, draw_s: float, fits: bool) -> None:
    """--tier-budget's seconds are those of a machine that draws a 1 Mi input in DRAW_S: the cells fit where
    their cost, in draws timed on the same group, does."""
    assert tiers.every_cell_fits(59, example_s, draw_s, 2.0) is fits


@pytest.mark.parametrize(
    ("cores", "sharing"),
    [
        ([(0, [0, 1]), (0, [0, 1])], 1),  # 2 ranks on 2 cores, left to the scheduler: a core each
        ([(0, [0]), (0, [1]), (0, [0])], 2),  # 3 pinned round 2 cores: two take turns on core 0
        ([(0, [r % 2]) for r in range(8)], 4),
        ([(0, [0, 1, 2, 3]), (0, [0, 1, 2, 3]), (0, [0, 1, 2, 3])], 1),  # 3 ranks, 4 cores
        ([(0, [0, 1]), (0, [0, 1]), (1, [0, 1]), (1, [0, 1])], 1),  # two nodes, each its own cores 0 and 1
        ([(0, [0]), (0, [0]), (1, [0, 1])], 2),  # the busiest node's
        ([(0, [])], 1),  # no core said: as one
    ],
)
def test_the_draw_is_shared_by_the_ranks_that_take_turns_on_a_core(
    cores: list[tuple[int, list[int]]], sharing: int
) -> None:
    """The ranks all draw at once, as an example's do; those that outnumber their node's cores take turns,
    and the slowest rank's time is that of as many draws as ranks share its core."""
    assert tiers.ranks_a_core(cores) == sharing


def test_where_the_budget_holds_them_every_cell_runs_at_1_mi(pytester: pytest.Pytester) -> None:
    """A budget that holds every cell at 1 Mi, as measured on the live group, runs them all there; the
    summary and the JSON say so, with what a 1 Mi example cost."""
    copy_conformance(pytester.path, ("test_every_cell.py",))
    result = pytester.runpytest(
        "test_every_cell.py", "-k", "every_supported_cell and all_reduce and not ring", "--world-sizes", "2",
        "--hypothesis-seed=5", "--capability-json", "m.json", "--tier-budget", "inf",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "m.json").read_text())
    rows = [r for r in doc["cells"] if r["status"] == "PASS"]
    assert rows and all(r["largest"] >= TIERS[1] for r in rows)
    (timed,) = doc["size_tiers"]["world_sizes"]
    assert timed["world_size"] == 2 and timed["every_cell_at_1mi"] and timed["large_example_ms"] > 0
    assert timed["draw_ms"] > 0 and doc["size_tiers"]["draw_ms"] == tiers.DRAW_S * 1e3
    assert timed["cells"] >= len(rows)  # all_reduce's supported cells, those known bugs hold among them
    result.stdout.fnmatch_lines(
        [
            "the sweeps' size tiers at 2 ranks: every cell at 64 Ki; at 1 Mi every cell where the machine "
            "holds them, else one (every cell at 2 ranks: a 1 Mi example * ms at 2, * cells in inf s where "
            "a 1 Mi input draws in 8 ms, here in * ms); *",
            f"of the {len(rows)} cells that passed, at 1 Mi elements: {len(rows)} cells *",
        ]
    )


@contextlib.contextmanager
def busy_cores() -> Iterator[None]:
    """A busy loop on every core, as a CI machine running other jobs beside the suites."""
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def test_the_same_command_draws_the_same_cells_however_busy_the_machine(pytester: pytest.Pytester) -> None:
    """The 1 Mi tier is the topology's (every cell where each rank has a core of its own: 2 ranks on 2
    cores; one a sweep where ranks share one), not the moment's: a measured budget shrank it to one cell
    under load, and a bug only at 1 Mi went unseen at some seeds. The same command and seed, once beside a
    busy loop on every core, draws the same examples and passes the same cells at the same sizes."""
    copy_conformance(pytester.path, ("test_every_cell.py",))
    sizes = "2,3" if (os.cpu_count() or 1) == 2 else "2"

    def run(json_path: str) -> tuple[list[str], dict]:
        result = pytester.runpytest_subprocess(
            "test_every_cell.py", "-k", "every_supported_cell and all_reduce and not ring", "--world-sizes",
            sizes, "--hypothesis-seed=4", "--capability-json", json_path, "-p", "no:cacheprovider",
        )  # fmt: skip
        assert result.ret == 0, result.stdout.str()[-3000:]
        drawn = [line for line in result.outlines if "distributed examples" in line]
        return drawn, json.loads((pytester.path / json_path).read_text())

    quiet_drawn, quiet = run("quiet.json")
    with busy_cores():
        busy_drawn, busy = run("busy.json")
    assert quiet_drawn and quiet_drawn == busy_drawn
    assert quiet["cells"] == busy["cells"] and quiet["size_tiers"] == busy["size_tiers"]
    (two, *rest) = quiet["size_tiers"]["world_sizes"]
    assert two == {"world_size": 2, "every_cell_at_1mi": True, "decided_by": "topology", "ranks_a_core": 1}
    assert [(t["world_size"], t["every_cell_at_1mi"]) for t in rest] == [(3, False)] * len(rest)
    passed = [r for r in quiet["cells"] if r["status"] == "PASS" and r["operation"] == "all_reduce"]
    assert len(passed) > 30 and all(r["largest"] >= TIERS[1] for r in passed)  # every cell at 1 Mi at 2


def test_the_budget_puts_the_tiers_at_any_world_size_every_cell_from_the_turn() -> None:
    """At 5 ranks of a run at 2 to 8 the tiers run only where the budget holds every cell: then every cell
    at 64 Ki and at 1 Mi, the first at 1 Mi the cell the seed turns to, each at a scale of its own."""
    sizes = (2, 5, 8)
    assert tier(4, 5, TIERS[0], sizes=sizes) == tier(4, 5, TIERS[1], sizes=sizes) == set()
    every = {cell[:3] for cell in tier(4, 5, TIERS[0], sizes=sizes, whole=True)}
    assert len(every) > 30
    with running(4, 5, sizes=sizes, whole=True):
        large = [case for case in _every_cell("all_reduce", rotation.turn()) if case.size == TIERS[1]]
    assert {case.cells()[0] for case in large} == every
    with running(4, 5, sizes=(2, 5)):  # the largest, where no budget holds them: the cell the seed turns to
        (turned,) = [case for case in _every_cell("all_reduce", rotation.turn()) if case.size == TIERS[1]]
    assert large[0].cells() == turned.cells() and len({case.values.scale for case in large}) > 1


@pytest.mark.parametrize(
    ("workers", "whole"),
    [
        ((True, None), True),  # the worker that ran no sweep at 2 ranks timed nothing there
        ((None, True), True),
        ((True, False), False),  # one worker's sweeps turned the tier: never "every cell"
        ((False, True), False),
    ],
)
def test_xdist_workers_hand_their_tier_timing_over_and_a_turned_tier_stands(
    workers: tuple[bool | None, ...], whole: bool
) -> None:
    """Each xdist worker times the 1 Mi tier on its own groups: the controller's JSON and summary say what
    they measured (they said "one a sweep" where every cell had run), and where one worker's sweeps
    turned the tier and another's ran every cell, that it turned."""

    def export(every_cell: bool | None) -> dict[str, object]:
        matrix = CapabilityMatrix(None, "gloo", worker=True)
        probed = Capabilities("gloo", "cpu", 2, {("all_reduce", "float32", "sum"): ""})
        if every_cell is not None:
            probed = dataclasses.replace(
                probed, timed=True, large_example_s=0.03 if every_cell else 0.09, draw_s=0.008,
                large_cells=59, whole_large_tier=every_cell,
            )  # fmt: skip
        matrix.add_probe(probed)
        return json.loads(json.dumps(matrix.export()))

    controller = CapabilityMatrix(None, "gloo", ConformanceSettings(tier_budget_s=tiers.BUDGET_S))
    for worker in workers:
        controller.merge(export(worker))
    tiers_doc = controller.document()["size_tiers"]
    (timed,) = tiers_doc["world_sizes"]
    assert timed["every_cell_at_1mi"] is whole and timed["large_example_ms"] == (30.0 if whole else 90.0)
    said = "every cell at 2 ranks: a 1 Mi example" if whole else "one a sweep at 2: a 1 Mi example"
    assert said in rotation_line(1, [2], tiers_doc)


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
