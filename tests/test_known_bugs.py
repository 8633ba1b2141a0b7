"""Known backend bugs kept outside test code: a manifest makes a test a strict xfail on the backends it
names, a fix shows up as XPASS, and a manifest that can't be used is a one-line usage error."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_collectives.conformance.known_bugs import KnownBug, ManifestError, load

SUITES = Path(__file__).parent.parent / "suites"

TESTS = """
def test_wrong_on_gloo():
    assert 1 + 1 == 3

def test_right():
    pass
"""


def manifest(path: Path, *entries: dict) -> Path:
    path.write_text(json.dumps({"known_bugs": list(entries)}))
    return path


def bug(
    test: str,
    backends=("gloo",),
    reason: str = "wrong on purpose",
    raises: str = "AssertionError",
    match: str = r"assert \(1 \+ 1\) == 3",
    **more: object,
) -> dict:
    entry = {"backends": list(backends), "test": test, "raises": raises, "match": match, "reason": reason}
    return {**entry, **more}


def test_a_known_bug_is_a_strict_xfail_on_the_backends_it_names(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=TESTS)
    path = manifest(pytester.path / "bugs.json", bug("test_wrong_on_gloo"))
    result = pytester.runpytest("--known-bugs", str(path), "-rx")
    result.assert_outcomes(passed=1, xfailed=1)
    result.stdout.fnmatch_lines(["XFAIL test_user.py::test_wrong_on_gloo - known gloo bug (bugs.json): *"])
    # another backend's bug leaves the test as it is; a fixed bug is an XPASS that fails the run
    manifest(path, bug("test_wrong_on_gloo", backends=["nccl"]), bug("test_user.py::test_right*"))
    result = pytester.runpytest("--known-bugs", str(path))
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["[[]XPASS(strict)[]] known gloo bug*"])


RANKS = """
import pytest

@pytest.mark.world_size(2)
def test_wrong_on_gloo(pg):
    if pg.rank == 0:
        assert 1 + 1 == 3
    assert pg.rank == 0 or OTHER_BUG_ON_RANK_1, "rank 1 has a bug of its own"

OTHER_BUG_ON_RANK_1 = {other}
"""


@pytest.mark.parametrize("other", [False, True], ids=["same-bug", "another-bug-on-rank-1"])
def test_a_known_bug_on_one_rank_hides_no_other_ranks_failure(pytester: pytest.Pytester, other) -> None:
    """Each failing rank's own failure must be the bug: rank 0's known bug once explained the whole
    report, rank 1's other failure in the same call with it."""
    pytester.makepyfile(test_user=RANKS.format(other=not other))
    path = manifest(pytester.path / "bugs.json", bug("test_wrong_on_gloo"))
    result = pytester.runpytest("--known-bugs", str(path), "--world-sizes", "2", "-p", "no:cacheprovider")
    if other:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*not the known bug this test is marked with*"])
    else:
        result.assert_outcomes(xfailed=1)


BATCHED = """
import pytest
from hypothesis import settings, strategies as st
from pytest_collectives import sweep

settings.register_profile("no_deadline", deadline=None)  # the first call starts the group
settings.load_profile("no_deadline")

@pytest.mark.world_size(2)
@sweep(x=st.just(list(range(20))))
def test_wrong_on_gloo(pg, x):
    if x % 10 == 3:
        {known}
    assert x != {other}, "a bug of its own at {other}"
"""


@pytest.mark.parametrize("other", [-1, 17], ids=["known-bug-alone", "another-bug-past-it"])
@pytest.mark.parametrize(
    "known, raises, match",
    [
        ("assert 1 + 1 == 3", "AssertionError", r"assert \(1 \+ 1\) == 3"),
        ("raise RuntimeError('allgather: invalid tensor size')", "RuntimeError", "invalid tensor size"),
    ],
    ids=["wrong-value", "raises"],
)
def test_a_known_bug_hides_only_its_own_examples(
    pytester: pytest.Pytester, other, known, raises, match
) -> None:
    """Examples that fail with the known bug do not end the test, whatever the bug raises (a wrong value,
    or gloo's argument check): the others run and are judged, so a second bug of the test fails it, where
    once the first known example ended the test as XFAIL."""
    pytester.makepyfile(test_user=BATCHED.format(other=other, known=known))
    path = manifest(pytester.path / "bugs.json", bug("test_wrong_on_gloo", raises=raises, match=match))
    result = pytester.runpytest("--known-bugs", str(path), "--world-sizes", "2", "-p", "no:cacheprovider")
    if other < 0:
        result.assert_outcomes(xfailed=1)
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*AssertionError: a bug of its own at 17*"])


def test_another_failure_of_a_known_bugs_test_fails(pytester: pytest.Pytester) -> None:
    """The entry names the bug (its exception and message): a new bug in the same test is not swallowed."""
    pytester.makepyfile(test_user=TESTS)
    path = manifest(pytester.path / "bugs.json", bug("test_wrong_on_gloo", match="== 4"))
    result = pytester.runpytest("--known-bugs", str(path))
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*not the known bug this test is marked with: expected AssertionError matching '== 4' (bugs.json)"]
    )
    manifest(path, bug("test_wrong_on_gloo", raises="RuntimeError"))
    pytester.runpytest("--known-bugs", str(path)).assert_outcomes(passed=1, failed=1)


def test_the_ini_key_names_manifests_too(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=TESTS)
    manifest(pytester.path / "bugs.json", bug("test_wrong_on_gloo"))
    pytester.makeini("[pytest]\nknown_bugs = bugs.json\n")
    pytester.runpytest().assert_outcomes(passed=1, xfailed=1)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        ("{", "not readable JSON"),
        ("[]", 'expected {"known_bugs": [...]} at the top'),
        ({"known_bugs": [{"test": "t", "reason": "r"}]}, "known_bugs[0] must have the keys"),
        ({"known_bugs": [bug("t", raises="not a name")]}, "known_bugs[0].raises must name an exception"),
        ({"known_bugs": [bug("t", match="(")]}, "known_bugs[0].match is not a regular expression"),
        ({"known_bugs": [bug("t", backends=[])]}, "known_bugs[0].backends must be a non-empty list"),
        ({"known_bugs": [bug("t"), bug(" ")]}, "known_bugs[1].test must be non-empty text"),
        ({"known_bugs": [bug("t", reason="")]}, "known_bugs[0].reason must be non-empty text"),
        ({"known_bugs": [bug("t", cells=["all_reduce bfloat16"])]}, "known_bugs[0].cells must be a list of"),
        ({"known_bugs": [bug("t", extra=1)]}, "known_bugs[0] must have the keys"),
        ({"known_bugs": [bug("t", world_sizes=[0])]}, "known_bugs[0].world_sizes must be a list of"),
    ],
)
def test_a_bad_manifest_is_a_one_line_usage_error(pytester: pytest.Pytester, content, message) -> None:
    path = pytester.path / "bugs.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ManifestError, match=message.replace("[", r"\[").replace("{", r"\{")):
        load(path)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--known-bugs", str(path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: known bugs {path}: *"])
    assert "Traceback" not in result.stderr.str()


def test_the_suites_own_manifest_loads_and_names_tests_that_exist():
    names = {
        line.split("def ", 1)[1].split("(", 1)[0]
        for path in (SUITES / "conformance").glob("test_*.py")
        for line in path.read_text().splitlines()
        if line.startswith("def test_")
    }
    bugs = load(SUITES / "known_bugs.json")
    # a pattern over node ids must name a test function that exists
    named = [b.test if "::" not in b.test else re.split(r"[?\[*]", b.test.split("::")[-1])[0] for b in bugs]
    assert bugs and set(named) <= names


class Item:
    """What KnownBug.matches reads of a collected test: its node id, names and world size parameter."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid, self.name = nodeid, nodeid.split("::")[-1]
        self.originalname = self.name.split("[")[0]
        size = re.search(r"\[ws(\d+)", nodeid)
        self.callspec = type("Callspec", (), {"params": {"world_size": size and int(size[1])}})()


def test_each_entry_of_the_suites_manifest_names_collected_tests_at_its_world_sizes():
    """A pattern that names no test (a parameter's id misspelt, an order of ids changed) would leave its
    bug unexpected on the backend it is seen on: every entry must mark a test the suites collect."""
    bugs = load(SUITES / "known_bugs.json")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "suites", "--collect-only", "-q", "--world-sizes", "1,2,3,8",
         "-p", "no:cacheprovider"],
        cwd=SUITES.parent, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert ids, run.stdout[-2000:] + run.stderr[-2000:]
    items = [Item(nodeid) for nodeid in ids]
    unmatched = [b.test for b in bugs if not any(b.matches(item, b.backends[0]) for item in items)]
    assert not unmatched, f"entries that mark no collected test: {unmatched}"


def test_world_sizes_limit_an_entry_to_the_tests_at_those_sizes():
    """An entry with world_sizes marks a test only where its world size is listed: the bug seen at one
    rank is not expected of the same test at eight."""
    bug = KnownBug(("nccl",), "test_p", "AssertionError", "wrong", "one rank only", "bugs.json", (), (1,))
    one, eight = Item("t.py::test_p[ws1-float32]"), Item("t.py::test_p[ws8-float32]")
    assert bug.matches(one, "nccl")
    assert not bug.matches(eight, "nccl") and not bug.matches(one, "gloo")


def test_a_backend_built_on_gloo_inherits_its_known_bugs_and_records_its_own_version():
    """A vendor's backend that hands its calls to gloo failed gloo's own known bugs on its first run, and
    the matrix called it "bundled with torch". One line of its module, declare(built_on=, version=), now
    carries gloo's refusal words and known bugs over, and names the backend's own version."""
    from pytest_collectives.backend_declarations import backend_version, declare, refused_in

    bug = KnownBug(("gloo",), "test_p", "AssertionError", "wrong", "gloo drops it", "bugs.json")
    item = Item("t.py::test_p[ws2-float32]")
    assert not bug.matches(item, "acme_on_gloo")
    assert backend_version("acme_on_gloo") == "version not declared"  # never "bundled with torch"
    declare("acme_on_gloo", built_on="gloo", version="acme 1.4.2")
    assert bug.matches(item, "acme_on_gloo") and not bug.matches(item, "acme_elsewhere")
    assert refused_in("RuntimeError: Invalid scalar type", "acme_on_gloo")  # gloo's words, inherited
    assert backend_version("acme_on_gloo") == "acme 1.4.2"
    assert backend_version("gloo").startswith("bundled with torch")
    declare("acme_plain")
    assert backend_version("acme_plain") == "version not declared"


ACME = """
import os
import torch.distributed as dist
from pytest_collectives import declare

dist.Backend.register_backend("acme", lambda *args: None, devices=["cpu"])
if os.environ.get("ACME_ON_GLOO"):
    declare("acme", built_on="gloo")
"""


def test_an_inherited_entry_can_be_dropped_and_another_backends_bug_is_named(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """acme's failure is gloo's known bug: undeclared, the failure stands and names gloo's entry (a vendor
    who forgot built_on is told where to look); declared, it is the inherited xfail; and acme's own
    manifest can drop that entry (its wrapper avoids the bug), whichever manifest is read first."""
    pytester.makepyfile(test_user=TESTS, acme=ACME)
    gloos = manifest(pytester.path / "bugs.json", bug("test_right"), bug("test_wrong_on_gloo"))
    drops = manifest(
        pytester.path / "acme.json",
        {"backends": ["acme"], "test": "test_wrong_on_gloo", "drops": "gloo", "reason": "acme fixes it"},
    )
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    args = ["-p", "no:cacheprovider", "--backend-module", "acme", "--backend", "acme", "-rx"]
    undeclared = pytester.runpytest_subprocess(*args, "--known-bugs", str(gloos))
    undeclared.assert_outcomes(passed=1, failed=1)
    undeclared.stdout.fnmatch_lines(
        [
            "this failure is the known gloo bug of bugs.json known_bugs[[]1] (wrong on purpose); if acme "
            "hands this call to gloo, declare it in its module: declare('acme', built_on='gloo')*"
        ]
    )
    monkeypatch.setenv("ACME_ON_GLOO", "1")
    inherited = pytester.runpytest_subprocess(*args, "--known-bugs", str(gloos))
    inherited.assert_outcomes(failed=1, xfailed=1)  # test_right: gloo's entry is a strict XPASS on acme too
    inherited.stdout.fnmatch_lines(["XFAIL *test_wrong_on_gloo - known gloo bug, which acme is built on*"])
    for order in ([gloos, drops], [drops, gloos]):
        dropped = pytester.runpytest_subprocess(*args, *(f"--known-bugs={path}" for path in order))
        dropped.assert_outcomes(failed=2)
        assert "another backend's known bug" not in dropped.stdout.str()


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"backends": ["acme"], "test": "t", "drops": "gloo"}, "has the keys backends, test, drops, reason"),
        (
            {"backends": ["gloo"], "test": "t", "drops": "gloo", "reason": "r"},
            "drops names a backend of its own",
        ),
    ],
)
def test_a_bad_drop_is_a_manifest_error(tmp_path: Path, entry: dict, message: str) -> None:
    with pytest.raises(ManifestError, match=re.escape(message)):
        load(manifest(tmp_path / "acme.json", entry))


def _failure(check, *args, what: str = "") -> str:
    """The words ``check(*args)`` fails with, as a failing rank's traceback ends (after ``what``, as the
    layout test words a reduction's)."""
    with pytest.raises(AssertionError) as info:
        check(*args)
    return f"AssertionError: {what}{info.value}"


def _symptoms(what: str, reduces: bool) -> dict[str, str]:
    """A failure of each kind of wrongness, in the words of the checks the layout test runs (cases and
    reference, not copied here): ``what`` is its cell, as the test names it."""
    import torch

    from pytest_collectives.algorithms.reference import assert_reduced_close, placed
    from pytest_collectives.conformance.cases import assert_moved, sentinel

    inputs = [torch.arange(6, dtype=torch.int32) + r for r in range(2)]
    expected = inputs[0] + inputs[1]
    buffer = torch.zeros(12, dtype=torch.int32)
    gapped = placed(buffer[::2], [buffer[1::2]])  # a strided view, the gaps between its elements watched
    gapped.copy_(expected)
    buffer[3] = 7

    if reduces:
        return {
            "wrong values": _failure(assert_reduced_close, expected + 1, inputs, "sum", what=f"{what}: "),
            "written outside": _failure(assert_reduced_close, gapped, inputs, "sum", what=f"{what}: "),
        }
    return {
        "wrong values": _failure(assert_moved, expected + 1, expected, what),
        "never written": _failure(assert_moved, sentinel(6, torch.int32, "cpu"), expected, what),
        "written outside": _failure(assert_moved, gapped, expected, what),
    }


def test_a_layout_bug_is_itself_in_every_kind_of_wrongness_and_nothing_else_is() -> None:
    """Each of gloo's layout bugs explains its cell's failure of every kind it lists (one seed draws wrong
    values, another elements written into the view's gaps: issue 75's seed 6), and nothing else: not
    the same kinds in another cell, nor its own cell's exception or shape."""
    from pytest_collectives.execution.wrongness import KINDS, kind_of

    layout = [b for b in load(SUITES / "known_bugs.json") if "layout" in b.test and "gloo" in b.backends]
    assert len(layout) == 9 and all(set(b.kinds) == set(KINDS) for b in layout)
    cells = {
        "strided all_reduce on rank 1": True,
        "strided reduce on rank 0": True,
        "strided broadcast from rank 0 on rank 1": False,
        "strided scatter from rank 1 on rank 0": False,
        "strided reduce_scatter on rank 1": True,
        "channels_last_to_contiguous broadcast from rank 1 on rank 0": False,
        "contiguous_to_channels_last scatter from rank 0 on rank 1": False,
        "channels_last_to_contiguous reduce_scatter on rank 0": True,
        "contiguous_to_channels_last all_to_all_single on rank 1": False,
    }
    for (cell, reduces), entry in zip(cells.items(), layout, strict=True):
        for kind, failure in _symptoms(cell, reduces).items():
            assert kind_of(failure) == kind, failure
            assert [b for b in layout if b.explains(failure)] == [entry], failure
        others = [
            f"RuntimeError: {cell}: the call failed",
            f"AssertionError: {cell}: got torch.int32[4], expected torch.int32[6]",
            f"AssertionError: {cell} (which the call must only read): 1 of 6 elements wrong (0 never "
            "written)",
        ]
        assert not [failure for failure in others if entry.explains(failure)]


def test_a_kind_limits_an_entry_and_an_unknown_kind_is_a_usage_error(tmp_path: Path) -> None:
    (entry,) = load(manifest(tmp_path / "k.json", bug("t", match="^x: ", kinds=["never written"])))
    assert entry.explains("AssertionError: x: 3 of 8 elements wrong (3 never written); first at 0")
    assert not entry.explains("AssertionError: x: 3 of 8 elements wrong (0 never written); first at 0")
    with pytest.raises(ManifestError, match=r"known_bugs\[0\]\.kinds must be a list of kinds of wrongness"):
        load(manifest(tmp_path / "k.json", bug("t", kinds=["off by one"])))
