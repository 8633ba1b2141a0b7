"""@pytest_collectives.examples: several hypothesis examples per dispatch, each checked and counted, a
failure shrunk to the one example that fails, and worker groups stopped once their tests are done."""

from __future__ import annotations

import hashlib
import re
import types
from types import SimpleNamespace

import pytest
from hypothesis import assume
from hypothesis.errors import UnsatisfiedAssumption

from pytest_collectives.conformance.cases import tiers_at
from pytest_collectives.execution.collection import last_of_each_size, world_sizes_run
from pytest_collectives.execution.examples import (
    Sweep,
    Tally,
    each_example,
    refused_example,
    run_batch,
    tallied,
)
from pytest_collectives.execution.messages import FAILED, PASSED, _stable_repr, stable_seed_of
from pytest_collectives.execution.outcome import GroupOutcome, RankReport
from pytest_collectives.execution.ranks.calling import _hypothesis_calls

BATCHED = """
import pytest
import torch
import torch.distributed as dist
from hypothesis import settings, strategies as st

import pytest_collectives


@pytest.mark.world_size(3)
@settings(max_examples=30, database=None, deadline=None)
@pytest_collectives.examples(n=st.integers(0, 1000), m=st.integers(0, 50))
def test_rank_one_is_wrong_past_twenty(pg, n, m):
    t = torch.full((m,), float(pg.rank))
    dist.all_reduce(t)
    wrong = pg.rank == 1 and m > 20
    assert not wrong, f"rank 1 at m={m}"


@pytest.mark.world_size(2)
@settings(max_examples=10, database=None, deadline=None)
@pytest_collectives.examples(n=st.integers(0, 1000))
def test_passes(pg, n):
    t = torch.ones(n % 7)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full_like(t, 2.0))


def test_no_group_outlives_its_tests(request):
    pool = request.config.pluginmanager.get_plugin("collectives-session").launcher.pool
    assert not pool.groups, f"still running: {sorted(pool.groups)}"
"""


def test_a_batch_fails_at_its_first_failing_example_and_shrinks_to_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_batched=BATCHED)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    # shrunk to one example, the smallest m that fails, reported on the rank that failed
    # ("Falsifying example:" became "Failing test case:" in hypothesis 6.16x)
    start = re.search("Falsifying example|Failing test case", out)
    assert start is not None, out
    falsifying = out[start.start() : out.index("ranks did not pass")]
    assert falsifying.count("'m':") == 1 and re.search(r"'m': 21\b", falsifying), falsifying
    result.stdout.fnmatch_lines(
        [
            "*failed on rank 1; passed on ranks 0,2*",
            "the failing example: n=0, m=21",  # named alone, whatever examples hypothesis left before it
            "*AssertionError: rank 1 at m=21*",
        ]
    )
    # the explain phase (a dispatch per part of the batch it varies) is not run for a batch
    assert "or any other generated value" not in out, out
    # the closing line counts examples, not dispatches: 10 calls of test_passes drew more than 10
    found = re.search(r"(\d+) distributed examples \(2 ranks: (\d+), 3 ranks: (\d+)\)", out)
    assert found is not None, out
    assert int(found.group(2)) > 10


def _report(rank: int, failed_at: int | None) -> RankReport:
    status = PASSED if failed_at is None else FAILED
    return RankReport(rank, status, "boom" * (failed_at is not None), examples=8, failed_example=failed_at)


SLOW = """
import time

import pytest
from hypothesis import given, settings, strategies as st


@pytest.mark.world_size(2)
@settings(max_examples=2, database=None)
@given(n=st.integers(0, 3))
def test_slower_than_hypothesis_default_deadline(pg, n):
    time.sleep(0.3)


@pytest.mark.world_size(2)
@settings(max_examples=2, database=None, deadline=100)
@given(n=st.integers(0, 3))
def test_slower_than_its_own_deadline(pg, n):
    time.sleep(0.3)
"""


def test_a_distributed_example_has_no_built_in_deadline_but_keeps_its_own(pytester: pytest.Pytester) -> None:
    """Its time is the ranks' (dispatch, the group's first call, the load): hypothesis' 200 ms default
    failed the docs' first @given example at random; a deadline the test sets still holds."""
    pytester.makepyfile(test_slow=SLOW)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*DeadlineExceeded*", "FAILED *test_slower_than_its_own_deadline*"])


def test_only_the_earliest_failing_example_over_the_ranks_is_the_failure() -> None:
    outcome = GroupOutcome([_report(0, 5), _report(1, 2), _report(2, None)], first_failed=0)
    outcome.keep_first_failing_example()
    assert [r.status for r in outcome.ranks] == [PASSED, FAILED, PASSED]
    assert outcome.first_failed == 1 and outcome.failed_example() == 2
    assert "(example 3 of the 8 in this call)" in outcome.render()


@pytest.mark.parametrize("later", [pytest.skip, pytest.fail, RuntimeError], ids=["skip", "fail", "error"])
def test_a_failure_stands_whatever_a_later_example_raises(later) -> None:
    """pytest.skip and pytest.fail raise BaseExceptions: after a failed check they are named beside it."""

    def check(x: int) -> None:
        assert x != 1, "wrong at 1"
        if x == 2 and later is RuntimeError:
            raise RuntimeError("refused at 2")
        if x == 2:
            later("refused at 2")

    tally = Tally()
    with tallied(tally), pytest.raises(AssertionError, match="wrong at 1") as failure:
        run_batch(check, [{"x": 0}, {"x": 1}, {"x": 2}, {"x": 3}], (), {})
    assert tally.failed_example == 1 and tally.ran == 3
    name = "RuntimeError" if later is RuntimeError else later.Exception.__name__
    said = "\n".join([str(failure.value), *getattr(failure.value, "__notes__", [])])
    assert f"example 3, after this failure, then ended the batch: {name}: refused at 2" in said


def test_each_example_reports_every_failure_and_what_ran_past_it() -> None:
    """A batch goes on past a failed check, so a sweep judges every cell (a bug in every dtype once showed
    in the first alone, the rest reading PASS): each failed example is failed, the others passed; past an
    error that ended the batch nothing ran; with no example named (a crash), each has the call's verdict."""
    kwargs = {"pg": "pg", "batch": [{"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}]}
    assert list(each_example(kwargs, "failed", {1, 3})) == [
        ({"pg": "pg", "x": 1}, "passed"),
        ({"pg": "pg", "x": 2}, "failed"),
        ({"pg": "pg", "x": 3}, "passed"),
        ({"pg": "pg", "x": 4}, "failed"),
    ]
    assert [v for _, v in each_example(kwargs, "failed", {1}, ended_at=1)] == ["passed", "failed"]
    assert [v for _, v in each_example(kwargs, "failed")] == ["failed"] * 4
    assert [v for _, v in each_example(kwargs, "passed")] == ["passed"] * 4
    # an example turned down (a call refused in it) passed nothing: the matrix does not count it
    assert [a["x"] for a, _ in each_example(kwargs, "passed", (), turned_down={1})] == [1, 3, 4]


def test_a_batch_goes_on_past_a_failed_check_and_ends_at_an_error() -> None:
    def check(x: int) -> None:
        assert x % 2, f"{x} is even"
        if x == 3:
            raise RuntimeError("the group broke")

    tally = Tally()
    with tallied(tally), pytest.raises(AssertionError, match="2 is even"):
        run_batch(check, [{"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}], (), {})
    assert (tally.failed, tally.failed_example, tally.ended_at) == ([1, 2], 1, 2)

    def failing(x: int) -> None:
        if x == 2:
            pytest.fail("two")

    tally = Tally()
    with tallied(tally), pytest.raises(pytest.fail.Exception):
        run_batch(failing, [{"x": 1}, {"x": 2}, {"x": 3}], (), {})
    assert (tally.failed, tally.failed_example, tally.ended_at) == ([1], 1, 1)


def test_a_batch_tallies_the_examples_it_turned_down() -> None:
    def check(x: int) -> None:
        assume(x != 2)

    tally = Tally()
    with tallied(tally), _hypothesis_calls([]):  # as on a rank, where assume() is in a test's context
        run_batch(check, [{"x": 1}, {"x": 2}, {"x": 3}], (), {})
    assert tally.turned_down == [1] and tally.ran == 2


@pytest.mark.parametrize("backend, ran, resume_at", [("gloo", 2, None), ("acme", 1, 2)])
def test_a_refused_example_ends_only_itself(backend: str, ran: int, resume_at: int | None) -> None:
    """A refusal in the backend's words turns its example down and the batch goes on; on a backend that
    may keep state after a raise the batch ends there, and says where the rest starts (the controller runs
    it in a call of its own). A refused example once skipped the whole test as N/A."""

    def check(pg: object, x: int) -> None:
        if x == 2:
            refused_example("acme refuses int32: Invalid scalar type")

    tally = Tally()
    with tallied(tally):
        run_batch(check, [{"x": 1}, {"x": 2}, {"x": 3}], (), {"pg": SimpleNamespace(backend=backend)})
    assert (tally.ran, tally.turned_down, tally.resume_at) == (ran, [1], resume_at)
    assert tally.refused == ["acme refuses int32: Invalid scalar type"]
    kwargs = {"batch": [{"x": 1}, {"x": 2}, {"x": 3}]}
    judged = [a["x"] for a, _ in each_example(kwargs, "passed", (), tally.turned_down, (), resume_at)]
    assert judged == ([1, 3] if resume_at is None else [1])


def test_a_sweep_refused_throughout_ends_instead_of_being_drawn_again() -> None:
    """A sweep is drawn the same every time: refused throughout, it ends (the controller calls the test
    N/A), where a batch of drawn examples asks hypothesis for another."""

    def check(pg: object, x: int) -> None:
        refused_example("Tensors must be contiguous")

    tally = Tally()
    with tallied(tally):
        run_batch(check, Sweep([{"x": 1}, {"x": 2}]), (), {"pg": SimpleNamespace(backend="gloo")})
    assert tally.ran == 0 and len(tally.refused) == 2
    with tallied(Tally()), pytest.raises(UnsatisfiedAssumption):
        run_batch(check, [{"x": 1}, {"x": 2}], (), {"pg": SimpleNamespace(backend="gloo")})


def test_the_last_test_of_each_world_size_is_known() -> None:
    def item(nodeid: str, n: int | None) -> object:
        callspec = types.SimpleNamespace(params={"world_size": n}) if n else None
        return types.SimpleNamespace(nodeid=nodeid, callspec=callspec)

    items = [item("a", 2), item("b", 2), item("c", None), item("d", 3), item("e", 2)]
    assert last_of_each_size(items) == {"e": (2, ()), "d": (3, ())}  # type: ignore[arg-type]


def test_each_test_knows_the_world_sizes_it_runs_at() -> None:
    """Selected and not skipped: a test deselected at 3 ranks, or skipped at 8, runs at the others."""

    def item(nodeid: str, n: int, skipped: bool = False) -> object:
        rest = nodeid.split("[")[1].rstrip("]")
        callspec = types.SimpleNamespace(params={"world_size": n}, id=rest)
        marker = {"skip": skipped or None}.get
        return types.SimpleNamespace(nodeid=nodeid, callspec=callspec, get_closest_marker=marker)

    items = [item("t.py::a[ws2-x]", 2), item("t.py::a[ws8-x]", 8, skipped=True), item("t.py::a[ws4-x]", 4),
             item("t.py::a[ws2-y]", 2), item("t.py::b[ws3]", 3)]  # fmt: skip
    assert world_sizes_run(items) == {  # type: ignore[arg-type]
        "t.py::a[ws2-x]": (2, 4), "t.py::a[ws8-x]": (2, 4), "t.py::a[ws4-x]": (2, 4),
        "t.py::a[ws2-y]": (2,), "t.py::b[ws3]": (3,),
    }  # fmt: skip


def test_the_large_tiers_run_up_to_4_ranks_and_at_the_largest_world_size() -> None:
    long_run = (1, 2, 3, 4, 5, 6, 7, 8)
    assert [n for n in long_run if tiers_at(n, long_run)] == [1, 2, 3, 4, 8]
    assert [n for n in (2, 5, 8) if tiers_at(n, (2, 5, 8))] == [2, 8]
    assert tiers_at(6, (6,)) and tiers_at(6, ())


def test_examples_names_a_parameter_the_test_lacks() -> None:
    from hypothesis import strategies as st

    import pytest_collectives

    with pytest.raises(TypeError, match="has no parameter size"):

        @pytest_collectives.examples(size=st.integers())
        def test_x(pg, n):  # pragma: no cover - never run
            pass


SWEPT = """
import pytest
import torch
import torch.distributed as dist
from hypothesis import strategies as st

import pytest_collectives


@pytest.mark.world_size(2)
@pytest_collectives.sweep(n=st.just(list(range(40))), m=st.just([k % 3 for k in range(40)]))
def test_every_listed_example(pg, n, m):
    t = torch.full((m,), float(n))
    dist.all_reduce(t)
    assert not (n == 37 and pg.rank == 1), f"rank 1 at n={n}, m={m}"


@pytest.mark.world_size(2)
@pytest_collectives.sweep(n=st.just([1, 2]), m=st.just([1]))
def test_listings_of_two_lengths(pg, n, m):
    pass
"""


def test_a_sweep_runs_every_listed_example_once_and_names_the_one_that_failed(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_swept=SWEPT)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "the failing example: n=37, m=1",
            "*AssertionError: rank 1 at n=37, m=1",
            "*ValueError: @sweep: the listings differ in length: {'n': 2, 'm': 1}",
        ],
        consecutive=False,
    )
    # all 40 examples a run: rank 1 runs the batch on past its failure, its calls pairing with rank 0's (a
    # rank that stopped there would leave rank 0 hung); hypothesis runs a failing example again, more than
    # once in some versions, to report it
    ran = int(re.search(r"(\d+) distributed examples", out).group(1))
    assert ran and ran % 40 == 0, out[-2000:]


def test_an_example_s_seed_reads_a_long_blob_by_its_checksum() -> None:
    """Every rank derives each example's seed from the drawn values' reprs, again for every example: the
    repr of a 5 MiB blob (a test of object collectives draws them) took a tenth of a second. Long bytes
    stand for their length and checksum, anywhere in a list, tuple or dict; other values keep their repr,
    so their seeds are what they were."""
    plain = {"case": [1, "a", None, (2,), {"k": (3, 4)}], "b": b"x" * 256}
    text = "t" + repr(sorted((k, repr(v)) for k, v in plain.items()))
    before = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") & 0x7FFFFFFF
    assert stable_seed_of("t", plain) == before
    blob = bytes(range(256)) * 4096
    assert len(_stable_repr((0, {"blob": blob}))) < 100
    seed = stable_seed_of("t", {"payload": (0, {"blob": blob})})
    assert seed == stable_seed_of("t", {"payload": (0, {"blob": bytes(blob)})})
    assert seed != stable_seed_of("t", {"payload": (0, {"blob": blob[:-1] + b"\1"})})
    assert seed != stable_seed_of("t", {"payload": (1, {"blob": blob})})


def test_a_failure_names_the_group_its_calls_saw() -> None:
    """A subgroup's members are drawn to fold over any world size: frozenset({0, 2, 4, 6}) at 4 ranks is
    the group [0, 2], and the failure says so, where it named the members drawn."""
    from pytest_collectives.conformance.cases import group_of

    pg = SimpleNamespace(world_size=4, rank=0, group=None, new_group=lambda ranks: object())

    def check(members: frozenset[int] | None) -> None:
        group_of(pg, members)
        assert members is None, "wrong in a subgroup"

    with tallied(Tally()), pytest.raises(AssertionError) as info:
        run_batch(check, [{"members": None}, {"members": frozenset({0, 2, 4, 6})}], (), {})
    said = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert "(ran in the group of global ranks [0, 2] of 4)" in said
