"""The forms of buffer the registered algorithms hand the backend are all among those the backend's own
tests hand it: a backend bug of a form (a receive into a view at a storage offset landing at the storage's
start) then fails the backend's own row first, and an algorithm's row failing alone points at the
algorithm, not at the backend under it.

Both sides are recorded on the ranks, by a reference backend that notes each (call, read or written, form)
it is given (mutant_backends.RecordsBufferForms), over the conformance suites at two world sizes.
"""

from __future__ import annotations

import pytest
from helpers import SUPPORT, copy_conformance, torch_below

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch_below(2, 13), reason="Python ProcessGroup backends crash before torch 2.13"),
]

FILES = ("test_all_reduce.py", "test_reduce_scatter.py", "test_operations.py")
OWN = ("test_point_to_point.py", "test_layouts.py")
# the rows of the registered algorithms and decompositions, by their ids (the backend's own rows are named
# for its calls: all_reduce, reduce_scatter_single, broadcast, ...)
ALGORITHMS = " or ".join(
    (
        "ring_",
        "binomial_tree",
        "pairwise",
        "gemm_reduce_scatter",
        "reduce_broadcast",
        "reduce_scatter_all_gather",
    )
)


def recorded(
    pytester: pytest.Pytester, name: str, files: tuple[str, ...], select: str
) -> set[tuple[str, ...]]:
    result = pytester.runpytest(
        *files, "-k", select, "--backend-module", "mutant_backends", "--backend", "recording_forms",
        "--world-sizes", "2,3", "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()[-3000:]
    return {
        tuple(line.split("\t"))
        for path in pytester.path.glob(f"{name}.*")
        for line in path.read_text().splitlines()
    }


def test_the_algorithms_pass_the_backend_only_forms_its_own_tests_draw(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy_conformance(pytester.path, FILES + OWN)
    monkeypatch.setenv("PYTHONPATH", str(SUPPORT))
    monkeypatch.setenv("ACME_FORMS", str(pytester.path / "algorithms"))
    algorithms = recorded(pytester, "algorithms", FILES, f"({ALGORITHMS}) and not rejects")
    monkeypatch.setenv("ACME_FORMS", str(pytester.path / "own"))
    own = recorded(pytester, "own", FILES + OWN, f"not ({ALGORITHMS})")
    print("\n".join(["the algorithms hand the backend:", *sorted(map(" ".join, algorithms))]))
    # the algorithms do pass slices of flat buffers: the form the issue found untested
    assert {("recv", "out", "dense at an offset"), ("send", "in", "dense at an offset")} <= algorithms
    assert algorithms <= own, (
        f"forms the algorithms pass that no backend test draws: {sorted(algorithms - own)}"
    )
