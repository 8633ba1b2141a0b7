"""The opt-in tier of 2**31 elements (suites/conformance/test_huge.py): off without --huge, and its slice
by slice check names the first wrong element, proved here at a small scale (a run of the tier itself takes
2 to 4 GiB a message a rank, too much for these tests)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers import SUITES, copy_conformance


def huge_module(monkeypatch: pytest.MonkeyPatch, slice_elements: int):  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("huge_tier", SUITES / "conformance" / "test_huge.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "SLICE", slice_elements)
    return module


@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16])
def test_the_check_names_the_first_element_left_unreduced(monkeypatch, dtype) -> None:
    """A sum whose elements from 2000 on are this rank's own (the tail unreduced, as past a 32-bit count)."""
    huge = huge_module(monkeypatch, slice_elements=512)
    n, size = 3, 3001
    tensor = huge.fill(torch.empty(size, dtype=dtype), 0)

    def summed(start: int, stop: int) -> torch.Tensor:
        return sum(huge.pattern(r, start, stop, torch.int64) for r in range(n)).to(dtype)

    assert huge.first_wrong(tensor, summed) is not None  # rank 0's own values are not the sum
    tensor[:2000] = summed(0, 2000)
    message = huge.first_wrong(tensor, summed)
    assert " of elements 1536 to 2048 wrong; first at 2000 (" in message, message
    tensor[2000:] = summed(2000, size)
    assert huge.first_wrong(tensor, summed) is None


def test_the_tiled_pattern_is_its_formula_across_blocks_and_2_31(monkeypatch) -> None:
    """pattern() tiles a period and steps per block, for speed: the same values as the formula, at slice
    edges, block edges and around 2**31."""
    huge = huge_module(monkeypatch, slice_elements=1 << 26)
    edges = [(0, 10), (5, 3_000_001), (huge.BLOCK - 7, 3 * huge.BLOCK + 11), ((1 << 31) - 5, (1 << 31) + 9)]
    for start, stop in edges:
        index = torch.arange(start, stop)
        for rank in range(3):
            formula = (index % 251 + 3 * rank) % 7 - 3 + (index // huge.BLOCK) % 3 - 1
            assert torch.equal(huge.pattern(rank, start, stop, torch.int64), formula), (start, stop, rank)


def test_the_tier_is_off_without_its_option(pytester: pytest.Pytester) -> None:
    copy_conformance(pytester.path, ("test_huge.py",))
    result = pytester.runpytest("test_huge.py", "--world-sizes", "2", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*the 2[*][*]31-element tier runs with --huge*"])
