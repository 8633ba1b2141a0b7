"""The plugin core end to end: real process groups driven through pytester."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from helpers import is_running, process_state

from pytest_collectives.execution.outcome import (
    CRASHED,
    DistributedTestFailure,
    GroupOutcome,
    RankReport,
    hang_culprit,
)
from pytest_collectives.execution.reproductions import stopped_at

HEADER = """
import os, signal, time
import pytest
import torch
import torch.distributed as dist
"""


def make(pytester: pytest.Pytester, body: str) -> None:
    pytester.makepyfile(test_it=HEADER + textwrap.dedent(body))


def test_body_runs_on_every_rank_of_a_real_group(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.world_size(2, 3)
        def test_sum(pg):
            t = torch.tensor([float(pg.rank + 1)])
            dist.all_reduce(t)
            assert t.item() == pg.world_size * (pg.world_size + 1) / 2
            assert dist.get_rank() == pg.rank and dist.get_world_size() == pg.world_size
            assert pg.backend == "gloo" and pg.device == torch.device("cpu")

        def test_plain_tests_are_untouched():
            assert "torch.distributed" not in str(type(os))
        """,
    )
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_sum?ws2? PASSED*", "*test_sum?ws3? PASSED*"])


def test_configured_world_sizes_parametrize_unsized_marker(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.world_size()
        def test_sizes(pg):
            assert dist.get_world_size() == pg.world_size
        """,
    )
    result = pytester.runpytest("-v", "--world-sizes", "2,4")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_sizes?ws2?*", "*test_sizes?ws4?*"])


def test_rank_divergent_failure_names_the_rank_and_keeps_every_output(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.world_size(4)
        def test_rank_two(pg):
            print(f"hello from rank {pg.rank}")
            assert pg.rank != 2, "rank two disagrees"
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*1 of 4 ranks did not pass (failed on rank 2; passed on ranks 0,1,3)*",
            "*rank 2: FAILED (first to fail)*",
            "*assert pg.rank != 2*",
            "*AssertionError: rank two disagrees*",
            "*Captured stdout rank 0*",
            "hello from rank 0",
            "*Captured stdout rank 3*",
            "hello from rank 3",
        ]
    )


def test_every_failing_rank_gets_its_traceback(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.world_size(3)
        def test_all_fail(pg):
            raise ValueError(f"bad value on rank {pg.rank}")
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    for rank in range(3):
        result.stdout.fnmatch_lines([f"*rank {rank}: FAILED*", f"ValueError: bad value on rank {rank}"])


def test_capture_off_prints_rank_output_live(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.world_size(2)
        def test_prints(pg):
            print(f"visible from rank {pg.rank}")
        """,
    )
    result = pytester.runpytest("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*[[]stdout rank 0[]] visible from rank 0*", "*[[]stdout rank 1[]] visible from rank 1*"]
    )


def test_hang_is_reported_with_stacks_and_the_session_goes_on(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.world_size(2)
        def test_mismatched_recv(pg):
            if pg.rank == 0:
                dist.recv(torch.zeros(1), src=1)  # nobody sends

        @pytest.mark.world_size(2)
        def test_next(pg):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == 2
        """,
    )
    start = time.monotonic()
    result = pytester.runpytest("--dist-timeout", "3", "-p", "no:randomly")
    elapsed = time.monotonic() - start
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*hung on rank 0*",
            "*rank 0: HUNG, still running 3 s after the test started (--dist-timeout)*",
            "*test_it.py*in test_mismatched_recv",
        ]
    )
    assert elapsed < 3 + 5 + 2, f"hang took {elapsed:.1f}s to report"  # + startup of the group


def test_a_hang_blames_the_rank_outside_the_collective_the_others_wait_in(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        import time

        @pytest.mark.world_size(3)
        def test_one_rank_sleeps(pg):
            if pg.rank == 1:
                time.sleep(600)  # the bug: the others wait for it in the barrier
            dist.barrier()
        """,
    )
    result = pytester.runpytest("--dist-timeout", "3", "--reproductions", "found")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*3 of 3 ranks did not pass (hung on ranks 0,1,2); rank 1 is the likely cause: it is not in "
            "barrier, which ranks 0,2 wait in*",
            "*standalone reproduction: none (a hang cannot be reproduced alone); its closest thing, what "
            "each rank waited in: *",
            "*rank 1: HUNG, still running 3 s after the test started (--dist-timeout) (likely cause)*",
        ]
    )
    # the blamed rank's section comes first
    text = result.stdout.str()
    assert text.index("rank 1: HUNG") < text.index("rank 0: HUNG") < text.index("rank 2: HUNG")
    # the closest thing to a reproduction: the call each rank was in, named under the failure
    record = pytester.path / "found" / "test_it.py_test_one_rank_sleeps_ws3_hang.txt"
    assert f"its closest thing, what each rank waited in: {record}" in text
    lines = record.read_text().splitlines()
    assert "rank 1 is the likely cause: it is not in barrier" in lines[3]
    source = (pytester.path / "test_it.py").read_text().splitlines()
    slept_at = next(i for i, line in enumerate(source, 1) if "time.sleep(600)" in line)
    waited_at = next(i for i, line in enumerate(source, 1) if "dist.barrier()" in line)
    test = "in test_one_rank_sleeps"
    waiting = f"hung inside torch.distributed.barrier, called at test_it.py:{waited_at} {test}"
    assert lines[6:9] == [
        f"  rank 0: {waiting}",
        f"  rank 1: hung in its own code at test_it.py:{slept_at} {test}",
        f"  rank 2: {waiting}",
    ]
    assert "Rank 1's stacks when it was stopped (most recent call first):" in lines


def test_hang_culprit_needs_one_rank_apart_from_a_shared_collective() -> None:
    def stack(*functions: str) -> str:
        c10d = '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 4159 in '
        frames = {f: c10d + f for f in ("barrier", "all_reduce")}
        frames["test"] = '  File "/tmp/test_it.py", line 7 in test_it'
        return "Current thread 0x1 (most recent call first):\n" + "\n".join(frames[f] for f in functions)

    waiting, working = stack("barrier", "test"), stack("test")
    assert hang_culprit({0: waiting, 1: working, 2: waiting}) == (1, "barrier")
    assert hang_culprit({0: waiting, 1: waiting}) is None  # all inside: a deadlock of the backend
    assert hang_culprit({0: working, 1: working, 2: waiting}) is None  # two suspects: say nothing
    assert hang_culprit({0: stack("all_reduce", "test"), 1: working, 2: waiting}) is None  # mismatched calls


def test_a_failure_is_told_by_the_same_rank_whichever_reported_first() -> None:
    # Hypothesis replays a failing example and expects the same exception type; which rank's report came
    # first is the machine's timing, so a failure told by it turned into a FlakyFailure on replay.
    def failed(rank: int, kind: str, line: int) -> RankReport:
        detail = f'Traceback (most recent call last):\n  File "/t/test_it.py", line {line}, in t\n{kind}: x\n'
        return RankReport(rank, "failed", detail)

    def cause(reports: list[RankReport], first: int) -> str:
        return type(DistributedTestFailure.of(GroupOutcome(reports, first))).__name__

    two = [failed(0, "AssertionError", 5), failed(1, "ValueError", 9)]
    assert cause(two, 1) == cause(two, 0) == "DistributedTestFailure[AssertionError at test_it.py:5]"
    lost = [RankReport(0, "failed", two[0].detail + "Connection closed by peer\n"), two[1]]
    # rank 1's error is its own, rank 0's a symptom of losing its peer
    assert cause(lost, 0) == "DistributedTestFailure[ValueError at test_it.py:9]"
    crashed = [two[0], RankReport(1, CRASHED, "killed by SIGSEGV")]
    assert cause(crashed, 0) == cause(crashed, 1) == f"DistributedTestFailure[{CRASHED}]"
    text = GroupOutcome(two, 1).render()
    assert text.index("rank 0: FAILED") < text.index("rank 1: FAILED (first to fail)"), text


def test_where_a_rank_stopped_is_its_own_code_in_the_thread_inside_the_call() -> None:
    watcher = (
        "Thread 0x2 (most recent call first):\n"
        '  File "/p/pytest_collectives/execution/ranks/hygiene.py", line 5 in watch'
    )
    main = (
        "Current thread 0x1 (most recent call first):\n"
        '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 4159 in barrier\n'
        '  File "/p/pytest_collectives/execution/ranks/pending.py", line 51 in wrapper\n'
        '  File "/s/suites/test_x.py", line 7 in test_x\n'
        '  File "/p/pytest_collectives/execution/ranks/calling.py", line 159 in call_test'
    )
    assert stopped_at(f"{watcher}\n\n{main}") == "test_x.py:7 in test_x"
    assert stopped_at(watcher) == "an unknown place (no stack)"  # the harness alone: nothing of the test


@pytest.mark.parametrize(
    "crash, reason",
    [
        ("os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL*OOM killer*"),
        ("os._exit(7)", "exited with status 7*"),
        ("import ctypes; ctypes.string_at(0)", "killed by SIGSEGV*"),
    ],
    ids=["sigkill", "exit", "segfault"],
)
def test_crash_fails_the_test_and_the_next_one_passes(
    pytester: pytest.Pytester, crash: str, reason: str
) -> None:
    make(
        pytester,
        f"""
        @pytest.mark.world_size(2)
        def test_crash(pg):
            if pg.rank == 1:
                {crash}
            dist.barrier()

        @pytest.mark.world_size(2)
        def test_next(pg):
            dist.barrier()
        """,
    )
    result = pytester.runpytest("--dist-timeout", "20")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*rank 1: CRASHED (first to fail)*", reason])


def test_memory_error_is_an_ordinary_failure(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.world_size(2)
        def test_oom(pg):
            if pg.rank == 0:
                import resource
                resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))
                hog = []
                while True:
                    hog.append(bytearray(256 << 20))
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*rank 0: FAILED*", "MemoryError*"])


@pytest.mark.parametrize(
    "damage, why",
    [
        ("dist.destroy_process_group()", "the test destroyed the default process group*"),
        (
            "dist.isend(torch.ones(1), dst=(pg.rank + 1) % 2) if pg.rank == 0 else None",
            "the test left 1 async op(s) unfinished",
        ),
        ("torch.set_default_device('meta')", "the test changed the default device to meta*"),
    ],
    ids=["destroyed", "pending-op", "default-device"],
)
def test_bad_group_state_is_detected_and_replaced(pytester: pytest.Pytester, damage: str, why: str) -> None:
    make(
        pytester,
        f"""
        @pytest.mark.world_size(2)
        def test_damage(pg):
            {damage}

        @pytest.mark.world_size(2)
        def test_next(pg):
            assert dist.is_initialized()
            assert torch.empty(()).device == torch.device("cpu")
            t = torch.full((4,), float(pg.rank))
            dist.all_reduce(t)
            assert t.tolist() == [1.0] * 4
        """,
    )
    result = pytester.runpytest("-W", "always")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        ["*test_it.py:*: GroupReplacedWarning: worker group replaced: rank 0: " + why]
    )


def test_ranks_share_seed_and_can_rebuild_each_others_inputs(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.world_size(3)
        def test_rebuild(pg):
            mine = torch.randn(5, generator=pg.generator())
            gathered = [torch.empty(5) for _ in range(pg.world_size)]
            dist.all_gather(gathered, mine)
            for r in range(pg.world_size):
                assert torch.equal(gathered[r], torch.randn(5, generator=pg.generator(r)))
            seeds = [None] * pg.world_size
            dist.all_gather_object(seeds, (pg.seed, torch.rand(1).item()))
            assert len(set(seeds)) == 1, seeds
        """,
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_hypothesis_examples_run_on_every_rank_with_the_same_values(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        from hypothesis import given, settings, strategies as st

        @pytest.mark.world_size(2)
        @settings(max_examples=25, deadline=None, database=None)
        @given(n=st.integers(0, 1000), word=st.text(max_size=5))
        def test_same_example(pg, n, word):
            seen = [None] * pg.world_size
            dist.all_gather_object(seen, (n, word, pg.seed))
            assert len(set(seen)) == 1, seen

        @pytest.mark.world_size(2)
        @settings(max_examples=50, deadline=None, database=None)
        @given(n=st.integers(0, 1000))
        def test_shrinks(pg, n):
            assert n < 100 or pg.rank == 0
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    # "Falsifying example:" became "Failing test case:" in hypothesis 6.16x. How far hypothesis shrinks on a
    # busy machine is its business: the printed example must be a real counterexample, shown with its rank.
    result.stdout.fnmatch_lines(["*: test_shrinks(*", "*n=*,*", "*rank 1: FAILED*"])
    shown = re.findall(r"^\s+n=(\d+),$", result.stdout.str(), flags=re.M)
    assert shown and all(int(n) >= 100 for n in shown), shown


def test_hypothesis_tells_two_bugs_on_the_ranks_apart(pytester: pytest.Pytester) -> None:
    # Hypothesis tells bugs apart by exception type and raise line; the failures it sees are raised by the
    # plugin, so without a type per cause the two bugs below are one, and shrinking drifts between them.
    make(
        pytester,
        """
        from hypothesis import given, settings, strategies as st

        @pytest.mark.world_size(2)
        @settings(max_examples=300, deadline=None, derandomize=True, report_multiple_bugs=True)
        @given(n=st.integers(0, 1000))
        def test_two_bugs(pg, n):
            if pg.rank == 1 and n >= 500:
                raise ValueError("large")
            if pg.rank == 0 and n < 500 and n % 2 == 1:  # never with the other: one cause per example
                raise KeyError("odd")
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "DistributedTestFailure[ValueError at test_it.py:" in text, text
    assert "DistributedTestFailure[KeyError at test_it.py:" in text, text


def test_a_failure_replays_first_at_the_world_size_it_was_found(pytester: pytest.Pytester) -> None:
    """Each world size has its own example-database key: a failure found at 3 ranks is replayed at 3 by the
    next run, not at 2 first (where it passes and hypothesis would delete it)."""
    make(
        pytester,
        """
        from hypothesis import Phase, given, settings, strategies as st
        from hypothesis.database import DirectoryBasedExampleDatabase

        PHASES = [Phase.reuse] if os.environ.get("REUSE_ONLY") else list(Phase)

        @pytest.mark.world_size(2, 3)
        @settings(max_examples=30, deadline=None, phases=PHASES,
                  database=DirectoryBasedExampleDatabase(os.environ["EXAMPLES_DB"]))
        @given(n=st.integers(0, 100))
        def test_fails_at_three(pg, n):
            assert not (pg.world_size == 3 and n >= 10)
        """,
    )
    pytester.makepyfile(conftest="")
    test = (pytester.path / "test_it.py").read_text()
    (pytester.path / "test_it.py").write_text("import os\n" + test)
    db = str(pytester.path / "examples")
    pytester._monkeypatch.setenv("EXAMPLES_DB", db)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1, failed=1)
    pytester._monkeypatch.setenv("REUSE_ONLY", "1")  # nothing new is drawn: only the database replays
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.parseoutcomes().get("failed") == 1, result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines(["FAILED test_it.py::test_fails_at_three[[]ws3[]]*"])


def test_assume_on_the_ranks_rejects_the_example(pytester: pytest.Pytester) -> None:
    """assume() inside a distributed body turns the example down, as in any hypothesis test: not a failure."""
    make(
        pytester,
        """
        from hypothesis import assume, given, settings, strategies as st

        @pytest.mark.world_size(2)
        @settings(max_examples=20, deadline=None, database=None)
        @given(n=st.integers(0, 100))
        def test_odd_only(pg, n):
            assume(n % 2 == 1)
            assert n % 2 == 1
        """,
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_note_and_event_on_the_ranks_reach_the_engine(pytester: pytest.Pytester) -> None:
    """note() inside a distributed body shows with the minimal failing example (once if every rank noted
    alike, per rank where they differ), and event() lands in hypothesis' statistics, as in any test."""
    make(
        pytester,
        """
        from hypothesis import event, given, note, settings, strategies as st

        @pytest.mark.world_size(2)
        @settings(max_examples=30, deadline=None, database=None)
        @given(n=st.integers(0, 100))
        def test_small(pg, n):
            note(f"every rank drew {n}")
            note(f"this rank is {pg.rank}")
            event("big" if n > 10 else "small")
            assert n <= 10
        """,
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*rank 0: every rank drew 11", "*rank 0: this rank is 0", "*rank 1: this rank is 1"]
    )
    assert "outside of a test" not in result.stdout.str()
    make(pytester, TEST_EVENTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--hypothesis-show-statistics")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*Events:*", "*%, big", "*%, small"])
    result.stdout.no_fnmatch_line("*rank 0: *")


TEST_EVENTS = """
from hypothesis import event, given, note, settings, strategies as st

@pytest.mark.world_size(2)
@settings(max_examples=30, deadline=None, database=None)
@given(n=st.integers(0, 100))
def test_counted(pg, n):
    note(f"drew {n}")
    event("big" if n > 10 else "small")
"""


def test_subgroups_from_the_pg_fixture(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.world_size(4)
        def test_sub(pg):
            for members in ([0, 2], [1, 2, 3]):
                group = pg.new_group(members)
                t = torch.ones(1)
                if group is not None:
                    dist.all_reduce(t, group=group)
                    assert t.item() == len(members)
                else:
                    assert pg.rank not in members
        """,
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_gpu_marker_skips_with_reason_on_cpu(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.gpu
        @pytest.mark.world_size(2)
        def test_needs_gpu(pg):
            pass
        """,
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs CUDA GPUs: run with --gpus N on a GPU machine*"])


def test_skip_inside_the_ranks_skips_the_test(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.mark.world_size(2)
        def test_skips(pg):
            pytest.skip("gloo has no AVG")
        """,
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*gloo has no AVG*"])


def test_unpicklable_argument_is_a_clear_failure(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        @pytest.fixture
        def handle():
            return lambda: 1

        @pytest.mark.world_size(2)
        def test_uses(pg, handle):
            pass
        """,
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*argument(s) handle can't be sent to the ranks*"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gpus", "-1"], "--gpus -1: the number of GPUs can't be negative*"),
        (["--gpus", "two"], "--gpus two: expected a whole number of GPUs*"),
        (["--gpus", "2"], "--gpus 2: no GPU or other accelerator (torch.accelerator) found on this machine*"),
        (["--backend", "nccl"], "--backend nccl runs on cuda devices, not on CPU ranks: add --gpus N*"),
        (["--backend", "mpi"], "--backend mpi: this torch has no 'mpi' backend*"),
        (["--world-sizes", "0,2"], "--world-sizes 0,2: every world size must be at least 1 rank"),
        (["--world-sizes", "2,2"], "--world-sizes 2,2: a world size is listed twice*"),
        (["--world-sizes", "2,x"], "--world-sizes 2,x: expected comma-separated whole numbers*"),
        (["--dist-timeout", "0"], "--dist-timeout 0: the timeout must be a positive number*"),
    ],
)
def test_usage_errors_are_one_line(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_ini_options_are_validated_too(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nworld_sizes = 0,2\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --world-sizes 0,2: every world size must be at least 1 rank"])


# --- whole sessions in their own processes ---------------------------------------------------------

PID_TEST = """
import os, time
import pytest
import torch.distributed as dist

@pytest.mark.world_size(2)
def test_record(pg):
    with open(os.environ["PIDS_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    dist.barrier()
    time.sleep(float(os.environ.get("SLEEP", "0")))

@pytest.mark.world_size(3)
def test_other_size(pg):
    with open(os.environ["PIDS_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    assert os.environ.get("FAIL") != "1"
"""


def _session(
    pytester: pytest.Pytester, tag: str, *args: str, log: bool = False, **env: str
) -> tuple[subprocess.Popen, str]:
    """pytest on PID_TEST in a subprocess, its output to a pipe or (``log``) to a file as CI jobs often do."""
    pytester.makepyfile(**{f"test_{tag}": PID_TEST})
    pids = str(pytester.path / f"{tag}.pids")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"test_{tag}.py", *args],
        cwd=pytester.path,
        env={**os.environ, "PIDS_FILE": pids, **env},
        stdout=open(pytester.path / f"{tag}.log", "w") if log else subprocess.PIPE,  # noqa: SIM115
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, pids


def _descendants(root: int) -> set[int]:
    """Every process under ``root`` now (the forkserver, the ranks, whatever they started), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                _, ppid = process_state(int(entry))
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pids: Iterable[int], timeout_s: float = 20.0) -> list[int]:
    """Those of ``pids`` still alive, allowing the forkserver's exit a moment to reach them (seconds on a
    loaded 2-core machine: the floor's tests run beside the suites in CI)."""
    pids = list(pids)
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [pid for pid in pids if is_running(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _described(pids: Iterable[int]) -> str:
    """Each process as ps would show it: what it runs, its state and parent, to tell a rank from the
    forkserver or a helper of theirs."""
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            state, ppid = process_state(pid)
        except OSError:
            lines.append(f"{pid}: gone since")
            continue
        lines.append(f"{pid} (state {state}, parent {ppid}): {command[:300]}")
    return "\n".join(lines)


def test_a_tmpdir_too_long_for_the_forkserver_is_a_usage_error(pytester: pytest.Pytester) -> None:
    long = pytester.path / ("t" * 100)
    long.mkdir()
    proc, _ = _session(pytester, "long", TMPDIR=str(long))
    out, _ = proc.communicate(timeout=120)
    errors = [line for line in out.splitlines() if line.startswith("ERROR")]
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert errors == [
        f"ERROR: TMPDIR is too long a path for the forkserver's socket ({len(str(long))} characters): "
        "set TMPDIR to a shorter folder, such as /tmp"
    ], out
    assert "Traceback" not in out and "INTERNALERROR" not in out, out


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A session's TMPDIR, where its pool makes its folders: a short path, as the forkserver's socket goes
    there too and a Unix socket's path cannot pass 107 bytes (pytester's can)."""
    path = Path(tempfile.mkdtemp(prefix="ct-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize(
    "args, env, stop, log",
    [
        ((), {"SLEEP": "2"}, None, False),
        (("-x",), {"FAIL": "1", "SLEEP": "2"}, None, False),
        ((), {"SLEEP": "60"}, signal.SIGINT, False),
        ((), {"SLEEP": "60"}, signal.SIGKILL, False),
        # With its output in a file, nothing breaks a pipe when pytest is killed: only the ranks' own
        # watch on pytest ends them (the forkserver outlives pytest while they live).
        ((), {"SLEEP": "60"}, signal.SIGKILL, True),
    ],
    ids=["normal", "exitfirst", "ctrl-c", "sigkill", "sigkill-output-to-file"],
)
def test_no_worker_outlives_the_session(pytester: pytest.Pytester, short_tmp, args, env, stop, log) -> None:
    proc, pids = _session(pytester, "orphans", *args, log=log, TMPDIR=str(short_tmp), **env)
    deadline = time.monotonic() + 60
    while not (os.path.exists(pids) and len(open(pids).read().split()) >= 2):
        assert time.monotonic() < deadline and proc.poll() is None, "workers never started"
        time.sleep(0.1)
    time.sleep(0.5)
    # Every process the session started by now: the forkserver and its helpers as well as the ranks.
    started = _descendants(proc.pid)
    running = {int(pid) for pid in open(pids).read().split()}
    assert running <= started and started - running, (started, running)  # the ranks, and the forkserver
    if stop is not None:
        proc.send_signal(stop)
    out, _ = proc.communicate(timeout=120)
    out = out or (pytester.path / "orphans.log").read_text()
    ranks = {int(pid) for pid in open(pids).read().split()}  # the 3-rank group's too, started later
    left = _alive(started | ranks)
    assert left == [], f"processes left behind: {_described(left)}\n{out}"
    # nor any of the pool's folders: a killed pytest leaves them to its last rank
    assert list(short_tmp.glob("collectives-*")) == [], out


def test_two_concurrent_sessions_do_not_collide(pytester: pytest.Pytester) -> None:
    sessions = [_session(pytester, f"concurrent{i}") for i in range(2)]
    for proc, _ in sessions:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out
        assert "2 passed" in out, out


def test_groups_take_the_gpus_pytest_may_use() -> None:
    from pytest_collectives.execution.launchers.warm_groups import group_devices

    assert group_devices(2, None) == ("0", "1")
    assert group_devices(2, "2,3,5") == ("2", "3")
    assert group_devices(1, "GPU-1234abcd") == ("GPU-1234abcd",)
    with pytest.raises(ValueError, match="3 ranks need 3 GPUs"):
        group_devices(3, "4,5")


def test_ranks_that_outnumber_the_cores_each_keep_to_one() -> None:
    from pytest_collectives.execution.launchers.warm_groups import rank_cores

    assert rank_cores([0, 1], 5) == (0, 1, 0, 1, 0)
    assert rank_cores([4, 6, 7], 4) == (4, 6, 7, 4)
    assert rank_cores([0, 1], 2) == ()  # a core each: left to the scheduler
    assert rank_cores(range(16), 8) == ()


def test_a_rank_runs_on_the_core_it_was_given(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The session sees one core, so its 2 ranks share it; the ranks, processes of their own, read their
    # real affinity.
    core = max(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {core})
    monkeypatch.setenv("THE_ONE_CORE", str(core))
    make(
        pytester,
        """
        @pytest.mark.world_size(2)
        def test_affinity(pg):
            assert os.sched_getaffinity(0) == {int(os.environ["THE_ONE_CORE"])}
        """,
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_a_rank_and_the_threads_it_starts_run_in_the_shortest_slice(pytester: pytest.Pytester) -> None:
    release = tuple(int(n) for n in re.findall(r"\d+", os.uname().release)[:2])
    if release < (6, 12):
        pytest.skip(f"Linux {os.uname().release} does not honour a task's slice (6.12 and later do)")
    make(
        pytester,
        """
        from pytest_collectives.execution.ranks.scheduling import SLICE_NS

        def slices():
            found = []
            for task in os.listdir("/proc/self/task"):  # the rank's threads: torch's and gloo's too
                for line in open(f"/proc/self/task/{task}/sched"):
                    if line.startswith("se.slice"):
                        found.append(int(line.split(":")[1]))
            return found

        @pytest.mark.world_size(2)
        def test_slices(pg):
            dist.all_reduce(torch.ones(1))
            found = slices()
            assert len(found) > 1 and set(found) == {SLICE_NS}
        """,
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_a_thread_named_as_a_spinning_backend_loop_is_put_in_the_batch_class_and_no_other() -> None:
    import ctypes
    import threading

    from pytest_collectives.execution.ranks.scheduling import SPINNING_LOOPS, LoopsYield

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    go = threading.Event()
    tids: dict[str, int] = {}
    loop_name = next(iter(SPINNING_LOOPS))

    def named(label: str, name: str, policy: int) -> None:
        prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME, as gloo names its loop thread
        os.sched_setscheduler(0, policy, os.sched_param(0))
        tids[label] = threading.get_native_id()
        go.wait(30)

    kinds = {
        "loop": (loop_name, os.SCHED_OTHER),
        "other": ("pt_gloo_runloop", os.SCHED_OTHER),
        "chosen": (loop_name, os.SCHED_IDLE),  # a class someone chose: kept
    }
    threads = [threading.Thread(target=named, args=(label, *kind)) for label, kind in kinds.items()]
    for thread in threads:
        thread.start()
    try:
        while len(tids) < len(kinds):
            time.sleep(0.01)
        LoopsYield().settle()
        assert os.sched_getscheduler(tids["loop"]) == os.SCHED_BATCH
        assert os.sched_getscheduler(tids["other"]) == os.SCHED_OTHER
        assert os.sched_getscheduler(tids["chosen"]) == os.SCHED_IDLE
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    finally:
        go.set()
        for thread in threads:
            thread.join()


def test_the_backend_loops_of_a_rank_and_of_its_subgroups_run_in_the_batch_class(
    pytester: pytest.Pytester,
) -> None:
    # gloo's loop thread spins while another thread holds its pair's lock; batch, it never preempts the holder
    make(
        pytester,
        """
        def policies():
            found = {}
            for task in os.listdir("/proc/self/task"):
                name = open(f"/proc/self/task/{task}/comm").read().strip()
                found.setdefault(name, []).append(os.sched_getscheduler(int(task)))
            return found

        @pytest.mark.world_size(2)
        def test_a_subgroup(pg):
            dist.all_reduce(torch.ones(1), group=pg.new_group([0, 1]))

        @pytest.mark.world_size(2)
        def test_loops(pg):
            found = policies()
            if "gloo_tcp_loop" not in found:
                pytest.skip(f"torch {torch.__version__}'s gloo names no thread: its loops keep their class")
            assert found.pop("gloo_tcp_loop") == [os.SCHED_BATCH] * 2  # the world's and the subgroup's
            assert {policy for policies in found.values() for policy in policies} == {os.SCHED_OTHER}
        """,
    )
    outcomes = pytester.runpytest("-p", "no:randomly").parseoutcomes()
    import torch

    # torch 2.13's gloo names its loop threads and the floor's 2.2 does not; those between may do either
    older = tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 13)
    ran = (outcomes.get("passed"), outcomes.get("skipped"))
    assert ran == (2, None) or (older and ran == (1, 1))


def test_ranks_see_the_environment_pytest_has_when_their_group_starts(pytester: pytest.Pytester) -> None:
    make(
        pytester,
        """
        os.environ["SET_BY_THE_TEST_MODULE"] = "yes"

        @pytest.mark.world_size(2)
        def test_env(pg):
            assert os.environ["SET_BY_THE_TEST_MODULE"] == "yes"
            assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
        """,
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_torch_older_than_the_calls_it_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    # pyproject.toml admits torch 2.2: get_default_device and init_process_group's device_id came in 2.3.
    # Both APIs are faked, so this runs the same on the floor (tox -e floor) and on the newest torch.
    import torch
    import torch.distributed as dist

    from pytest_collectives.execution.ranks import compat as runner

    def init_process_group_2_3(backend, init_method=None, timeout=None, device_id=None):
        pass

    def init_process_group_2_2(backend, init_method=None, timeout=None, store=None):
        pass

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(dist, "init_process_group", init_process_group_2_3)
    assert runner.bound_device("nccl", gpu) == {"device_id": gpu}
    assert runner.bound_device("gloo", torch.device("cpu")) == {}
    monkeypatch.setattr(dist, "init_process_group", init_process_group_2_2)
    assert runner.bound_device("nccl", gpu) == {}

    monkeypatch.setattr(torch, "get_default_device", lambda: torch.device("meta"), raising=False)
    assert runner.default_device() == torch.device("meta")
    monkeypatch.delattr(torch, "get_default_device")
    assert runner.default_device() == torch.device("cpu")


def test_paths_that_name_world_size_are_told_apart(tmp_path: Path) -> None:
    """What starts the forkserver before torch is imported: a file naming world_size among the paths; and
    what has it import the training stacks too: one naming their marker."""
    from pytest_collectives.execution.collection import mentioned

    words = ("world_size", "mark.training")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "test_a.py").write_text("def test_a(): pass\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "test_hidden.py").write_text("world_size pytest.mark.training\n")
    assert mentioned([tmp_path], words) == set()
    (tmp_path / "plain" / "test_b.py").write_text("@pytest.mark.world_size(2)\n")
    assert mentioned([tmp_path], words) == {"world_size"}
    assert mentioned([tmp_path / "plain" / "test_b.py"], words) == {"world_size"}
    (tmp_path / "plain" / "test_c.py").write_text("pytestmark = pytest.mark.training\n")
    assert mentioned([tmp_path], words) == set(words)
    assert mentioned([tmp_path / "missing.py"], words) == set()


def test_the_forkserver_preloads_what_the_training_stacks_need() -> None:
    """The server's training imports are the modules the stacks' APIs live in, and torch._dynamo, which
    DTensor imports at its first call: none is imported per rank."""
    from pytest_collectives.conformance.training import stacks
    from pytest_collectives.execution.launchers.forkserver import TRAINING

    apis = {module for needs, _ in stacks._APIS.values() for module, _ in needs}
    assert set(TRAINING) == apis | {"torch._dynamo"}


def test_a_module_that_fails_to_import_on_the_ranks_fails_its_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_ranks_only=HEADER
        + textwrap.dedent(
            """
            if dist.is_initialized():  # true on the ranks only, where the group exists before the import
                raise ImportError("this module imports in pytest's process only")

            @pytest.mark.world_size(2)
            def test_body(pg):
                pass
            """
        ),
        test_next=HEADER
        + textwrap.dedent(
            """
            @pytest.mark.world_size(2)
            def test_after(pg):
                dist.barrier()
            """
        ),
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*ImportError: this module imports in pytest's process only*"])


class _Work:
    def __init__(self, completed: bool) -> None:
        self.completed = completed

    def is_completed(self) -> bool:
        return self.completed


def test_a_rank_keeps_the_pending_work_a_test_issued_not_the_completed(monkeypatch) -> None:
    """Each Work holds its tensors: a benchmark that issues thousands would keep every message it sent.
    The pending ones are all kept for the check after the test (``pending_ops``)."""
    from pytest_collectives.execution.ranks import pending as runner

    monkeypatch.setattr(runner, "issued_work", [])
    monkeypatch.setattr(runner, "_prune_at", runner._KEPT_AT_LEAST)
    monkeypatch.setattr(runner, "PENDING_GRACE_S", 0.0)
    pending = [_Work(False) for _ in range(300)]
    for i in range(30_000):
        issued = [_Work(True)]
        if i % 100 == 0:
            issued.append(pending[i // 100])
        runner._remember(issued)
    assert len(runner.issued_work) < 2 * len(pending) + runner._KEPT_AT_LEAST
    assert runner.pending_ops() == len(pending)
    assert all(any(w is p for w in runner.issued_work) for p in pending)
