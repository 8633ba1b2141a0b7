"""shared_inputs: a large input drawn once per group, read bit for bit by the other ranks, never stale, never
lost to a full disk, and gone once its example is two behind."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pytest_collectives.algorithms.reference import Values, rank_input
from pytest_collectives.conformance.cases import Case
from pytest_collectives.execution import shared_inputs

LARGE = (shared_inputs.MIN_ELEMENTS + 3,)


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    shared_inputs.share_in(tmp_path / "inputs")
    yield tmp_path / "inputs"
    shared_inputs.share_in(None)
    shared_inputs.next_test()


def refused() -> torch.Tensor:
    raise AssertionError("drawn again where the group's copy should have been read")


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.bfloat16,
        torch.float64,
        torch.complex64,
        torch.bool,
        torch.int8,
        torch.uint8,
        torch.int64,
    ],
)
def test_a_peer_reads_the_drawn_input_bit_for_bit(folder: Path, dtype: torch.dtype) -> None:
    # whole-range values: NaN payloads, -0.0, infinities and subnormals must come back as drawn
    drawn = rank_input(7, 1, LARGE, dtype, values=Values("full"))
    first = shared_inputs.drawn(("x",), LARGE, dtype, lambda: drawn)
    assert first is drawn
    read = shared_inputs.drawn(("x",), LARGE, dtype, refused)
    assert read.dtype == dtype and read.shape == drawn.shape
    assert torch.equal(read.view(-1).view(torch.uint8), drawn.view(-1).view(torch.uint8))


def test_a_small_input_is_drawn_on_every_rank(folder: Path) -> None:
    calls = []

    def draw() -> torch.Tensor:
        calls.append(1)
        return torch.ones(shared_inputs.MIN_ELEMENTS - 1)

    for _ in range(2):
        shared_inputs.drawn(("small",), (shared_inputs.MIN_ELEMENTS - 1,), torch.float32, draw)
    assert len(calls) == 2 and not list(folder.iterdir())


def test_without_a_folder_every_input_is_drawn() -> None:
    shared_inputs.share_in(None)
    with pytest.raises(AssertionError, match="drawn again"):
        shared_inputs.drawn(("x",), LARGE, torch.float32, refused)


def test_copies_go_once_their_example_is_keep_behind(folder: Path) -> None:
    shared_inputs.next_example()
    shared_inputs.drawn(("old",), LARGE, torch.float32, lambda: torch.ones(LARGE))
    for _ in range(shared_inputs.KEEP - 1):
        shared_inputs.next_example()
        assert list(folder.iterdir()), "a peer one example behind may still read it"
    shared_inputs.next_example()
    assert not list(folder.iterdir())
    assert torch.equal(
        shared_inputs.drawn(("old",), LARGE, torch.float32, lambda: torch.zeros(LARGE)), torch.zeros(LARGE)
    )


def test_a_new_test_takes_every_copy_away(folder: Path) -> None:
    shared_inputs.drawn(("mine",), LARGE, torch.float32, lambda: torch.ones(LARGE))
    shared_inputs.next_test()
    assert not list(folder.iterdir())


def test_a_copy_that_cannot_be_written_costs_only_a_draw(folder: Path) -> None:
    folder.rmdir()  # the group's folder gone, as a full or read-only disk would refuse the copy
    drawn = shared_inputs.drawn(("x",), LARGE, torch.float32, lambda: torch.arange(math.prod(LARGE)).float())
    assert torch.equal(drawn, torch.arange(math.prod(LARGE)).float())
    assert not folder.exists()


def test_a_case_names_its_input_by_everything_that_draws_it(folder: Path) -> None:
    """Two inputs that differ in any one thing rank_input takes are two copies: a rank never reads another
    example's, another dtype's or another group size's input."""
    base = Case(("all_reduce",), torch.float32, "sum", LARGE[0], "contiguous", None, 0, Values("full", 3))
    variants = [
        (base, 5, 1, 8),
        (base, 6, 1, 8),  # seed
        (base, 5, 2, 8),  # rank
        (base, 5, 1, 4),  # group size: full floats depend on it
        (Case(**{**base.__dict__, "dtype": torch.float64}), 5, 1, 8),
        (Case(**{**base.__dict__, "op": "max"}), 5, 1, 8),
        (Case(**{**base.__dict__, "values": Values("full", 4)}), 5, 1, 8),
        (Case(**{**base.__dict__, "values": Values("spread", 3)}), 5, 1, 8),
    ]
    for case, seed, key, members in variants:
        case.input(seed, key, case.size, members)
    assert len(list(folder.iterdir())) == len(variants)
    for case, seed, key, members in variants:
        op = None if case.op == "-" else case.op
        expected = rank_input(seed, key, case.size, case.dtype, values=case.values, op=op, members=members)
        read = case.input(seed, key, case.size, members)
        assert torch.equal(read.view(torch.uint8), expected.view(torch.uint8))


SHARED = """
import pytest
import torch
import torch.distributed as dist

from pytest_collectives.algorithms.reference import SMALL
from pytest_collectives.conformance import cases
from pytest_collectives.execution.shared_inputs import MIN_ELEMENTS

SIZE = MIN_ELEMENTS + 5


def refused(*args, **kwargs):
    raise AssertionError("rank 1 drew the input rank 0 had drawn")


@pytest.mark.world_size(2)
def test_rank_one_reads_what_rank_zero_drew(pg, monkeypatch):
    case = cases.Case(("all_reduce",), torch.float32, "sum", SIZE, "contiguous", None, 0, SMALL)
    if pg.rank == 0:
        drawn = case.input(pg.seed, 1, SIZE, 2)
    dist.barrier()
    if pg.rank == 1:
        monkeypatch.setattr(cases, "rank_input", refused)
        drawn = case.input(pg.seed, 1, SIZE, 2)
    assert drawn.numel() == SIZE
"""


def test_the_ranks_of_a_pooled_group_share_their_inputs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_shared=SHARED)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
