"""Users' algorithms come through the registry: checked by the suites' properties, wrong ones named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import SUITES, copy_conformance, torch_below

from pytest_collectives.algorithms import registry

# Two all-reduces a user might write: gather everything and reduce locally, and the same with a classic
# bug, the tail beyond the last whole chunk (size not a multiple of the group size) left unreduced.
USERS_ALGORITHMS = """
import torch
import torch.distributed as dist
from pytest_collectives import algorithm

_FOLD = {dist.ReduceOp.SUM: lambda x: x.sum(0), dist.ReduceOp.MAX: lambda x: x.amax(0)}


def _gather_reduce(tensor, op, group, whole_chunks_only):
    n = dist.get_world_size(group)
    flat = tensor.contiguous().view(-1)
    parts = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(parts, flat, group=group)
    reduced = _FOLD[op](torch.stack(parts)).to(tensor.dtype)
    keep = flat.numel() // n * n if whole_chunks_only else flat.numel()
    flat[:keep] = reduced[:keep]
    tensor.copy_(flat.view(tensor.shape))
    return tensor


@algorithm("all_reduce", uses=("all_gather",), ops=("sum", "max"), dtypes=("float32", "int32"))
def users_gather_reduce(tensor, op, group):
    return _gather_reduce(tensor, op, group, whole_chunks_only=False)


@algorithm("all_reduce", "users_chunked", uses=("all_gather",), ops=("sum", "max"), dtypes=("float32",),
           grid={"chunks": (1, 2)})
def users_dropping_tail(tensor, op, group, chunks):
    return _gather_reduce(tensor, op, group, whole_chunks_only=True)
"""


@pytest.mark.skipif(
    torch_below(2, 13),
    reason=f"gloo on torch {torch.__version__} crashed a rank replaying this test's 64 Ki all_gather once in "
    "CI (2.2): checked on 2.13",
)
def test_a_users_all_reduce_from_a_conftest_is_checked_and_a_wrong_one_named(
    pytester: pytest.Pytester,
) -> None:
    copy_conformance(pytester.path, ("test_all_reduce.py",), conftest_extra=USERS_ALGORITHMS)
    result = pytester.runpytest(
        "test_all_reduce.py", "-k", "matches_exact_reference and users_", "--world-sizes", "2",
        "--capability-json", "matrix.json", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "FAILED test_all_reduce.py::test_all_reduce_matches_exact_reference[2-users_chunked(chunks=1)]*",
            "FAILED test_all_reduce.py::test_all_reduce_matches_exact_reference[2-users_chunked(chunks=2)]*",
        ],
        consecutive=False,
    )
    out = result.stdout.str()
    # the minimal example: one element, which two ranks cannot split into whole chunks
    assert "operations=('users_chunked(chunks=1)',)" in out and "size=1," in out
    cells = json.loads((pytester.path / "matrix.json").read_text())["cells"]
    rows = {(c["operation"], c["dtype"], c["reduce_op"]): c["status"] for c in cells}
    assert rows["users_gather_reduce", "float32", "sum"] == "PASS"
    assert rows["users_chunked(chunks=1)", "float32", "sum"] == "FAIL"
    # what the algorithm does not claim is never drawn
    assert not any(
        op == "users_gather_reduce" and r == "min" and s != "N/A" for (op, _, r), s in rows.items()
    )


USERS_FORGETFUL = """
@algorithm("all_reduce", uses=("all_reduce",), ops=("sum",))
def users_forgetful(tensor, op, group):
    return tensor  # reduces nothing: each rank keeps its own input
"""


def test_a_users_algorithms_are_benchmarked_beside_the_backends_and_checked_once(
    pytester: pytest.Pytester,
) -> None:
    """suites/perf measures every registered algorithm the backend's own tests do not, a user's included,
    with nccl-tests' bytes and busbw, then checks its result once: a fast wrong one fails."""
    copy_conformance(pytester.path, conftest_extra=USERS_ALGORITHMS + USERS_FORGETFUL)
    (pytester.path / "test_collectives.py").write_text((SUITES / "perf" / "test_collectives.py").read_text())
    result = pytester.runpytest(
        "test_collectives.py", "-k", "registered and users_", "--world-sizes", "2", "--max-bytes", "4K",
        "--benchmark-min-rounds", "2", "--benchmark-max-time", "0.01", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_registered_algorithm[ws2-4KiB-users_gather_reduce]*",
            "FAILED test_collectives.py::test_registered_algorithm[ws2-4KiB-users_forgetful]*",
        ],
        consecutive=False,
    )


# A backend whose all_gather into a tensor is fast and wrong: no rank sends anything, each fills every block
# with its own input. A Python ProcessGroup can't override this call on this torch, so the call itself is
# replaced, where torch and the project's algorithms look it up.
WRONG_ALL_GATHER = """
import torch.distributed as dist
from pytest_collectives.algorithms import collectives

def all_gather_into_tensor(output, input, group=None, async_op=False):
    output.view(-1).copy_(input.reshape(-1).repeat(output.numel() // max(input.numel(), 1)))

dist.all_gather_into_tensor = collectives.all_gather_single = all_gather_into_tensor
"""


def test_a_fast_wrong_backend_fails_its_benchmark(pytester: pytest.Pytester) -> None:
    """Each of the backend's benchmarks checks every timed call (its stamps) and its result once after
    timing (nccl-tests' -c): an all_gather that moves nothing is the fastest there is, and fails; the
    others pass."""
    copy_conformance(pytester.path)
    (pytester.path / "test_collectives.py").write_text((SUITES / "perf" / "test_collectives.py").read_text())
    pytester.makepyfile(wrong_all_gather=WRONG_ALL_GATHER)
    result = pytester.runpytest(
        "test_collectives.py", "-k", "test_all_gather or test_broadcast or test_all_reduce",
        "--backend-module", "wrong_all_gather", "--world-sizes", "2", "--max-bytes", "4K", "-rf",
        "--benchmark-min-rounds", "2", "--benchmark-max-time", "0.01", "-p", "no:cacheprovider",
    )  # fmt: skip
    # all_gather, and the all-reduce built from reduce_scatter + all_gather; the other four all-reduces
    # and broadcast pass
    result.assert_outcomes(passed=5, failed=2)
    out = result.stdout.str()
    assert "FAILED test_collectives.py::test_all_reduce[ws2-4KiB-reduce_scatter_all_gather]" in out
    assert "FAILED test_collectives.py::test_all_gather[ws2-4KiB]" in out
    # every timed call is checked by its stamps: all_gather's rank 1 part on rank 0 holds rank 0's
    assert "5 of 10 timed receives of a round did not land as sent: the first, of call 1 (buffer 1)" in out
    assert "of call 1 (buffer 0), holds 2.0 where that call's stamp gives 4.0" in out  # the sum: n * 2


# The other contracts: an all-to-all posting every send and receive at once, a broadcast, and the same
# broadcast with a classic bug, the root ignored (every rank receives group rank 0's tensor).
USERS_MOVEMENTS = """
import torch
import torch.distributed as dist
from pytest_collectives import algorithm


@algorithm("all_to_all", uses=("send_recv",))
def users_all_to_all(output, input, output_splits, input_splits, group):
    n, me = dist.get_world_size(group), dist.get_rank(group)

    def blocks(tensor, splits):
        flat = tensor.view(-1)
        return flat.tensor_split(n) if splits is None else flat.split(splits)

    sends, receives = blocks(input.contiguous(), input_splits), blocks(output, output_splits)
    receives[me].copy_(sends[me])
    peers = [p for p in range(n) if p != me]
    ops = [dist.P2POp(dist.isend, sends[p], dist.get_global_rank(group, p), group) for p in peers]
    ops += [dist.P2POp(dist.irecv, receives[p], dist.get_global_rank(group, p), group) for p in peers]
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return output


def _broadcast(tensor, root, group):
    dist.broadcast(tensor, src=dist.get_global_rank(group, root), group=group)
    return tensor


@algorithm("broadcast", uses=("broadcast",))
def users_broadcast(tensor, root, group):
    return _broadcast(tensor, root, group)


@algorithm("broadcast", uses=("broadcast",))
def users_broadcast_from_zero(tensor, root, group):
    return _broadcast(tensor, 0, group)
"""


@pytest.mark.skipif(
    torch_below(2, 13),
    reason=f"both ranks on torch {torch.__version__} segfaulted in this test once (2.2): checked on 2.13",
)
def test_users_all_to_all_and_broadcast_are_checked_and_a_wrong_one_named(pytester: pytest.Pytester) -> None:
    copy_conformance(pytester.path, ("test_operations.py",), conftest_extra=USERS_MOVEMENTS)
    result = pytester.runpytest(
        "test_operations.py", "-k", "users_", "--world-sizes", "2", "--capability-json", "matrix.json",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_operations.py::test_broadcast[2-users_broadcast_from_zero]*"])
    out = result.stdout.str()
    # the minimal example: the one root it gets wrong, and one element
    assert "operations=('users_broadcast_from_zero',)" in out and "size=1," in out and "root=1" in out
    assert "users_broadcast_from_zero from group rank 1 seen on group rank 1" in out
    cells = json.loads((pytester.path / "matrix.json").read_text())["cells"]
    statuses = {c["operation"]: set() for c in cells}
    for c in cells:
        statuses[c["operation"]].add(c["status"])
    assert "FAIL" in statuses["users_broadcast_from_zero"] and "FAIL" not in statuses["users_broadcast"]
    assert "PASS" in statuses["users_all_to_all"] and "FAIL" not in statuses["users_all_to_all"]


def test_the_grid_names_each_variant_and_bad_registrations_are_errors() -> None:
    try:

        @registry.algorithm(
            "reduce_scatter", "grid_probe", uses=("send_recv",), grid={"k": (1, 2), "s": ("a",)}
        )
        def grid_probe(output, input, op, group, k, s):  # noqa: ANN001, ANN202
            return (k, s)

        names = [a.name for a in registry.algorithms("reduce_scatter") if a.name.startswith("grid_probe")]
        assert names == ["grid_probe(k=1, s='a')", "grid_probe(k=2, s='a')"]
        assert registry.get("grid_probe(k=2, s='a')")(None, None, None, group=None) == (2, "a")
        assert str(Path(__file__).resolve()) in [path for _, path in registry.sources()]
    finally:
        registry.forget_session()
    with pytest.raises(LookupError, match="no algorithm registered as .grid_probe.k=1, s=.a... here"):
        registry.get("grid_probe(k=1, s='a')")
    assert registry.get("ring_all_reduce").uses == ("send_recv",)  # the project's own stay
    with pytest.raises(ValueError, match="no operation 'allreduce'; one of all_reduce, reduce_scatter"):
        registry.algorithm("allreduce", uses=("all_reduce",))
    with pytest.raises(ValueError, match="uses= must name the backend calls"):
        registry.algorithm("all_reduce", uses=())


def test_an_algorithm_registered_twice_from_two_files_is_an_error(pytester: pytest.Pytester) -> None:
    for name in ("one", "two"):
        pytester.makepyfile(
            **{
                name: "from pytest_collectives import algorithm\n"
                "@algorithm('all_reduce', 'twice', uses=('all_reduce',))\n"
                "def twice(tensor, op, group):\n    return tensor\n"
            }
        )
    pytester.syspathinsert()
    try:
        __import__("one")
        with pytest.raises(ValueError, match="'twice' is registered twice, in .*one.py and .*two.py"):
            __import__("two")
    finally:
        registry.forget_session()


@pytest.mark.skipif(
    torch_below(2, 13),
    reason=f"a rank on torch {torch.__version__} segfaulted in this test once in CI (2.2): checked on 2.13",
)
def test_an_installed_packages_algorithm_comes_through_its_entry_point(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package that names a module in the ``pytest_collectives.algorithms`` group: no conftest, checked
    in pytest's process and found on the ranks by the same entry point."""
    pytester.makepyfile(
        acme_algorithms="from pytest_collectives import algorithm\n"
        "from pytest_collectives.algorithms.collectives import all_reduce_direct\n"
        "algorithm('all_reduce', 'acme_all_reduce', uses=('all_reduce',), dtypes=('float32',))"
        "(all_reduce_direct)\n"
    )
    info = pytester.path / "acme_algorithms-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-algorithms\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pytest_collectives.algorithms]\nacme = acme_algorithms\n")
    copy_conformance(pytester.path, ("test_all_reduce.py",))
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    result = pytester.runpytest_subprocess(
        "test_all_reduce.py", "-k", "acme", "--world-sizes", "2", "-p", "no:cacheprovider", "-v"
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*test_all_reduce_matches_exact_reference?ws2-acme_all_reduce? PASSED*",
            "*test_all_reduce_of_a_scalar_and_of_a_matrix?ws2-acme_all_reduce? PASSED*",
            "*test_all_reduce_of_a_large_message?ws2-acme_all_reduce? PASSED*",
        ]
    )


# A user's own test file over the installed library: no conftest, no suite file. Two all-reduces of
# theirs: a right one, and one that leaves the last element unreduced.
USERS_TEST_FILE = """
import pytest
import torch.distributed as dist
from hypothesis import settings
from pytest_collectives import examples
from pytest_collectives.conformance.cases import reductions
from pytest_collectives.conformance.properties import all_reduce_matches_reference

pytestmark = pytest.mark.conformance


def my_all_reduce(tensor, op, group):
    dist.all_reduce(tensor, op=op, group=group)
    return tensor


def my_all_reduce_but_the_last(tensor, op, group):
    flat = tensor.view(-1)
    dist.all_reduce(flat[:-1] if flat.numel() > 1 else flat, op=op, group=group)
    return tensor


@pytest.mark.world_size(2, 3)
@pytest.mark.parametrize("mine", [my_all_reduce, my_all_reduce_but_the_last], ids=["right", "wrong"])
@settings(max_examples=10)
@examples(case=reductions(["all_reduce"], layouts=("contiguous",)))
def test_my_all_reduce(pg, mine, case):
    all_reduce_matches_reference(pg, mine, case)
"""


def test_a_users_own_test_file_draws_from_the_probe_and_catches_their_bug(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine=USERS_TEST_FILE)
    result = pytester.runpytest("-p", "no:cacheprovider", "--capability-json", "matrix.json")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["FAILED test_mine.py::test_my_all_reduce?ws2-wrong?*"], consecutive=False)
    assert "size=2," in result.stdout.str()  # the minimal example: the smallest message it gets wrong
    cells = json.loads((pytester.path / "matrix.json").read_text())["cells"]
    statuses = {c["status"] for c in cells if c["operation"] == "all_reduce"}
    assert {"FAIL", "N/A"} <= statuses  # drawn from the probe: gloo's refusals are N/A, not drawn


SPLITS = """
import pytest
import torch
import torch.distributed as dist

from pytest_collectives.conformance.properties import check_splits


@pytest.mark.world_size(3)
@pytest.mark.parametrize("rank_1_expects", [[2, 3, 4], [2, 3, 5], [2, 3]])
def test_splits(pg, rank_1_expects):
    # rank i sends i + j + 1 elements to rank j, so rank j expects i + j + 1 from each i
    sends = [pg.rank + j + 1 for j in range(3)]
    expects = [i + pg.rank + 1 for i in range(3)]
    if pg.rank == 1:
        expects = rank_1_expects  # [2, 3, 4] is right; the others are a user's mistakes
    check_splits(expects, sends, group=pg.group)
    out = torch.empty(sum(expects))
    dist.all_to_all_single(out, torch.ones(sum(sends)), expects, sends, group=pg.group)
"""


def test_all_to_all_splits_that_disagree_are_a_clear_error_on_every_rank(pytester: pytest.Pytester) -> None:
    """Checked before the call (properties.check_splits): not an error on one rank, a hang on the others."""
    pytester.makepyfile(test_splits=SPLITS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--dist-timeout", "60")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*3 of 3 ranks did not pass (failed on ranks 0,1,2)*",
            "*ValueError: all_to_all splits disagree: group rank 2 sends 4 element(s) to group rank 1, "
            "which expects 5; each rank's output_splits must be the column of the peers' input_splits",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(
        ["*ValueError: all_to_all splits of group rank 1: input [[]2, 3, 4], output [[]2, 3]*"]
    )
    assert "HUNG" not in result.stdout.str()
