"""Burn-in (--soak): the selected tests pass after pass in the same groups until the time is spent or Ctrl-C,
and a report of each failure's rate, first time and replay command. Proved with planted backends that a
single run does not catch (tests/mutant_backends.py): one that turns wrong after a while under load, one
wrong in one call of many."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from docblocks import block_of, unshown
from helpers import copy_checkout, run_on_backend, torch_below

from pytest_collectives.bench import side_by_side
from pytest_collectives.execution import configurations, options
from pytest_collectives.execution.modes.soak import Failures, Replayed, clock, replay, run_replay, typed_from
from pytest_collectives.execution.options import duration

# one distributed conformance test, at 2 ranks: a pass takes about a second on the 2-core machine
TEST = "test_all_reduce.py::test_all_reduce_matches_exact_reference[ws2-all_reduce]"
ONE_TEST = {"files": ("test_all_reduce.py",), "world_sizes": "2", "dist_timeout": None}
python_backends = pytest.mark.skipif(
    torch_below(2, 13), reason="Python ProcessGroup backends crash before torch 2.13 (test_capabilities.py)"
)


@pytest.mark.parametrize(
    "text, seconds", [("240s", 240), ("30m", 1800), ("8h", 28800), ("90", 90), ("1.5m", 90)]
)
def test_a_duration_is_read_as_a_person_writes_it(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "-3s", "0", "m"])
def test_a_bad_duration_names_the_fix(text: str) -> None:
    with pytest.raises(
        options.OptionError, match=rf"^--soak {re.escape(text)}: expected a duration such as 240s"
    ):
        duration(text)


def test_the_times_and_the_replay_command_read_plainly() -> None:
    assert [clock(s) for s in (12.7, 250, 3720)] == ["12s", "4m10s", "1h02m"]
    settings = options.Settings(backend="acme", backend_modules=("acme_backend",))
    configuration = configurations.parse(["ACME_PROTO=LL128"])[0]
    command = replay("t.py::test_x[ws2-ACME_PROTO=LL128]", 7, settings, configuration, 2)
    assert shlex.split(command) == [
        "pytest", "t.py::test_x[ws2-ACME_PROTO=LL128]", "--hypothesis-seed=7", "--backend-module",
        "acme_backend", "--backend", "acme", "--world-sizes", "2,3,4", "--backend-env", "ACME_PROTO=LL128",
    ]  # fmt: skip
    # a value holding a comma (a preset's NCCL_PROTO=LL,LL128) is one setting, and replays as one
    lists = configurations.Configuration((("ACME_PROTO", "LL,LL128"),))
    command = shlex.split(replay(f"t.py::test_x[ws2-{lists.id}]", 7, settings, lists, 2))
    assert command[-1] == "ACME_PROTO=LL\\,LL128" and configurations.parse(command[-1:]) == (lists,)
    # where the session timed the size tiers, the replay runs them as the session did (every cell, or one)
    whole = ["--tier-budget", "inf"]
    pinned = replay("t.py::test_x[ws2]", 7, settings, configurations.Configuration(), 2, whole)
    assert shlex.split(pinned)[-2:] == whole


@pytest.mark.parametrize(
    "tries, exit_status, label",
    [
        ((3, 3), 1, "fails every time its draw comes round, and its replay fails: 3 of 3 tries at seed 5, 3"),
        ((1,), 1, "fails when its groups are new: its replay fails, the soaked groups only sometimes (1 of"),
        ((3,), 0, "fails every time in the soaked groups (3 of 3 tries at seed 5) but its replay, on fresh"),
        ((3, 2), 0, "intermittent, fails sometimes at the same draw: 3 of 3 tries at seed 5, 2 of 3 tries"),
        ((3,), 4, "3 of 3 tries at seed 5; its replay did not run to a verdict: exit status 4, its last"),
        ((3,), None, "3 of 3 tries at seed 5; its replay did not run to a verdict: it ran past"),
    ],
)
def test_a_failure_is_labelled_by_its_tries_and_what_its_replay_did(
    tries: tuple[int, ...], exit_status: int | None, label: str
) -> None:
    said = "it ran past 15m00s" if exit_status is None else f"exit status {exit_status}, its last line: x"
    failures = Failures(draws=dict(zip((5, 6), tries, strict=False)), replayed=Replayed(exit_status, said))
    assert failures.kind().startswith(label), failures.kind()
    assert Failures().kind() == ""  # never tried again: no label


def test_a_replay_names_the_test_as_typed_where_the_soak_was() -> None:
    test = "suites/conformance/t.py::test_x[ws2]"
    assert typed_from(test, "/repo", "/repo") == test
    assert typed_from(test, "/repo", "/repo/suites") == "conformance/t.py::test_x[ws2]"
    assert typed_from(test, "/repo", "/elsewhere") == "../repo/suites/conformance/t.py::test_x[ws2]"


def test_a_replay_runs_as_printed_in_the_folder_it_was_typed_in(tmp_path) -> None:
    (tmp_path / "test_x.py").write_text("def test_passes():\n    pass\n\ndef test_fails():\n    assert 0\n")
    assert run_replay("pytest test_x.py::test_passes -p no:cacheprovider", tmp_path).passed
    assert run_replay("pytest test_x.py::test_fails -p no:cacheprovider", tmp_path).failed
    # a command that cannot run says how it ended, not a pass or a failure
    missing = run_replay("pytest test_x.py::test_absent -p no:cacheprovider", tmp_path)
    assert not missing.passed and not missing.failed and missing.said.startswith("exit status 4, ")


def test_a_benchmark_that_got_worse_over_the_passes_is_a_warning() -> None:
    steady = [("b.py::test_ar[ws2]", {"busbw_GBps": 2.0})] * 9
    falling = [
        ("b.py::test_ar[ws2]", {"busbw_GBps": v}) for v in (2.0, 2.1, 1.9, 2.0, 1.8, 1.9, 1.5, 1.4, 1.5)
    ]
    slower = [("b.py::test_lat[ws2]", {"latency_us": v}) for v in (10, 10, 10, 10, 10, 10, 13, 12, 13)]

    def drifted(records: list, tolerance: float) -> list[str]:
        return [d.line(tolerance) for d in side_by_side.drifted(side_by_side.figures(records), tolerance)]

    assert drifted(steady, 0.1) == [] and drifted(falling[:8], 0.1) == []
    (warned,) = drifted(falling, 0.1)
    assert warned.startswith(
        "WARN b.py::test_ar[ws2]: busbw GB/s 2.000 in the first 3 passes, 1.500 in the last 3: 25%"
    )
    (warned,) = drifted(slower, 0.1)
    assert warned.startswith(
        "WARN b.py::test_lat[ws2]: latency us 10.000 in the first 3 passes, 13.000 in the"
    )
    assert drifted(slower, 0.5) == []


@python_backends
def test_a_node_that_wears_out_passes_one_run_and_fails_the_soak_which_says_when(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 all_reduce turns wrong after 100 calls on a rank: one pass (some 10 to 40 such calls) passes,
    the soak fails from a later pass on, in the same group, and says from which pass and when, and that its
    replay (a fresh process) passes."""
    monkeypatch.setenv("ACME_WEAR_CALLS", "100")
    plain = run_on_backend(pytester, "mutant_wrong_after_wear", TEST, "--hypothesis-seed=1", **ONE_TEST)
    assert plain.ret == 0, plain.stdout.str()[-3000:]
    soak = run_on_backend(pytester, "mutant_wrong_after_wear", TEST, "--soak", "20s", **ONE_TEST)
    out = soak.stdout.str()
    assert soak.ret == 1, out[-3000:]
    found = re.search(
        rf"^  {re.escape(TEST)} failed in (\d+) of (\d+) passes, first at (\S+) \(pass (\d+)\); (.+); "
        "replay: ",
        out,
        re.M,
    )
    assert found, out[-3000:]
    failed, passes, first = int(found[1]), int(found[2]), int(found[4])
    assert 2 <= first <= passes and failed == passes - first + 1, out[-3000:]  # worn out: every pass after
    # tried again at once at its draw, it fails every time: not an intermittent bug; and its replay, a
    # fresh process, passes: the label says so, and that the bug builds up
    assert re.fullmatch(
        r"fails every time in the soaked groups \(3 of 3 tries at seed \d+(, 3 of 3 .*)?\) but its replay, "
        r"on fresh groups, passes: a fault that builds up over the soak .*",
        found[5],
    ), found[5]
    assert re.search(r"^soak: \d+ pass\(es\) in \S+, the time was spent; first seed \d+$", out, re.M)
    assert "collectives: 1 worker group(s) started" in out  # the passes shared their group
    assert not unshown(
        block_of("docs/backend-settings.md", "mutant_wrong_after_wear --world-sizes").text, out
    )
    # a repeated failure is one line, not its whole report again
    assert len(re.findall(r"^_+ test_all_reduce_matches_exact_reference", out, re.M)) == failed
    assert len(re.findall(r"^failed again in pass", out, re.M)) == failed - 1


@python_backends
def test_a_bug_of_new_groups_is_labelled_by_its_replay_which_fails(pytester: pytest.Pytester) -> None:
    """float32 all_reduce wrong in a rank's first call: the soak's first pass fails, its tries in the kept
    group pass, and its replay (a fresh process, as printed) fails. It is a bug of new groups, not an
    intermittent one: the label says what the replay does, and the replay does it."""
    soak = run_on_backend(pytester, "mutant_wrong_while_cold", TEST, "--soak", "3s", **ONE_TEST)
    out = soak.stdout.str()
    assert soak.ret == 1, out[-3000:]
    found = re.search(
        rf"^  {re.escape(TEST)} failed in 1 of (\d+) passes, first at \S+ \(pass 1\); (.+); replay: (.+)$",
        out,
        re.M,
    )
    assert found, out[-3000:]
    assert found[2].startswith(
        "fails when its groups are new: its replay fails, the soaked groups only sometimes (1 of 3 tries at "
        "seed "
    ), found[2]
    replayed = subprocess.run(
        [sys.executable, "-m", *shlex.split(found[3]), "-p", "no:cacheprovider"], cwd=pytester.path,
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert replayed.returncode == 1, replayed.stdout[-3000:]


@python_backends
def test_a_rare_corruption_gets_its_rate_and_a_replay_command(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 all_reduce wrong in 1 call of 40, at random: the soak reports in how many passes of how many
    it failed, and a command that runs that test again with the failing pass's seed."""
    monkeypatch.setenv("ACME_ONE_IN", "40")
    monkeypatch.setenv("ACME_ONE_IN_SEED", "1")  # which calls are hit, and the passes' seeds, run to run
    soak = run_on_backend(
        pytester, "mutant_wrong_once_in_thousands", TEST, "--soak", "12s", "--node-report", "report",
        "--hypothesis-seed=1", **ONE_TEST,
    )  # fmt: skip
    out = soak.stdout.str()
    assert soak.ret == 1, out[-3000:]
    found = re.search(rf"^  {re.escape(TEST)} failed in (\d+) of (\d+) passes, .*; replay: (.+)$", out, re.M)
    assert found and 1 <= int(found[1]) <= int(found[2]) and int(found[2]) >= 2, out[-3000:]
    # the same draw tried again fails only sometimes: an intermittent bug, with its rate per draw (the
    # corruption's draws are seeded, so which tries it hits is the same run to run)
    assert "; intermittent, fails sometimes at the same draw: " in found[0], found[0]
    # the node report has the same: the soak's passes, the failure's rate and its replay command
    report = json.loads((pytester.path / "report" / "report.json").read_text())
    (failure,) = report["soak"]["failures"]
    assert (failure["nodeid"], failure["failed_passes"], report["soak"]["passes"]) == (
        TEST, int(found[1]), int(found[2])
    )  # fmt: skip
    assert failure["replay"] == found[3] and failure["kind"] in found[0]
    assert any(draw["failed"] < draw["tries"] == 3 for draw in failure["draws"]), failure["draws"]
    check = next(c for c in report["checks"] if c["name"] == "soak")
    assert check["status"] == "FAIL" and f"failing in {found[1]} of {found[2]})" in check["reason"]
    command = shlex.split(found[3])
    assert command[:2] == ["pytest", TEST] and re.fullmatch(r"--hypothesis-seed=\d+", command[2]), command
    # the soak ran that command as printed: it collected and ran the test, which passed (the draw's
    # corruption is not met on fresh groups), so the label says intermittent
    assert failure["replay_exit_status"] == 0
    assert found[0].endswith(f"; its replay passed; replay: {found[3]}"), found[0]


def test_a_soak_s_benchmarks_are_sampled_each_pass_into_the_node_report(pytester: pytest.Pytester) -> None:
    """The perf suite's all_reduce at one size, soaked: a figure per pass, stamped with the time into the
    soak, in the node report's soak series, with its plot and the check of its drift."""
    copy_checkout(pytester.path)
    result = pytester.runpytest(
        "suites/perf/test_collectives.py", "-k", "test_all_reduce and ws2 and -4KiB- and -all_reduce]",
        "--soak", "10s", "--node-report", "report", "-p", "no:cacheprovider",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    folder = pytester.path / "report"
    soak = json.loads((folder / "report.json").read_text())["soak"]
    (series,) = soak["series"]
    assert series["benchmark"].endswith("::test_all_reduce[ws2-4KiB-all_reduce]") and soak["passes"] >= 2
    times = [at for at, _ in series["points"]]
    assert len(times) == soak["passes"] and times == sorted(times) and times[-1] <= soak["elapsed_s"]
    assert series["unit"] == "busbw GB/s" and all(value > 0 for _, value in series["points"])
    checks = {c["name"]: c for c in json.loads((folder / "report.json").read_text())["checks"]}
    assert checks["soak"]["status"] == "PASS" and "soak bandwidth" in checks
    assert (folder / "soak_over_time.png").read_bytes().startswith(b"\x89PNG")


@pytest.fixture
def ctrl_c_heard() -> Iterator[None]:
    """A Ctrl-C that reaches the soak this test starts. A shell without job control starts its background
    commands with SIGINT ignored, and a pytest started so (a CI script's `tox ... &`) would hand that to
    the soak, which then never hears one: a handler of this process's own is reset on exec instead."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c_heard")
def test_ctrl_c_ends_the_soak_with_the_report_of_what_ran(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it="""
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_sum(pg):
            t = torch.ones(3)
            dist.all_reduce(t)
            assert t.eq(2).all()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "test_it.py", "--soak", "3m", "-p", "no:cacheprovider"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines = []
    for line in proc.stdout:  # the first pass is said as it ends
        lines.append(line)
        if "soak: pass 1 done at " in line:
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out = "".join(lines) + proc.communicate(timeout=60)[0]
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert re.search(r"^soak: \d+ pass\(es\) in \S+, interrupted \(Ctrl-C\); first seed \d+$", out, re.M), out
    assert "no test failed in any pass" in out


@pytest.mark.usefixtures("ctrl_c_heard")
def test_a_ctrl_c_that_python_drops_in_a_finalizer_still_ends_the_soak(pytester: pytest.Pytester) -> None:
    # The KeyboardInterrupt is raised inside __del__, where Python reports it as ignored and goes on: a run
    # of these tests once saw a soak carry on for a minute past its Ctrl-C.
    pytester.makepyfile(
        test_it="""
        import os, signal

        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10_000):  # the handler runs here, inside __del__
                    pass

        def test_ctrl_c_in_a_finalizer():
            Finalized()

        def test_after():
            pass
        """
    )
    result = pytester.runpytest_subprocess("--soak", "2m", "-p", "no:cacheprovider", timeout=100)
    out = result.stdout.str()
    assert "KeyboardInterrupt" in result.stderr.str() + out  # Python said it dropped it
    assert result.ret == pytest.ExitCode.INTERRUPTED, out
    assert re.search(r"^soak: 1 pass\(es\) in \S+, interrupted \(Ctrl-C\)", out, re.M), out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--soak", "5x"], "ERROR: --soak 5x: expected a duration such as 240s, 30m or 8h"),
        (["--soak", "5s", "-n", "2"], "ERROR: --soak runs the tests pass after pass in this pytest: drop -n"),
    ],
)
def test_a_soak_that_cannot_run_is_a_usage_error(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    pytester.makepyfile(test_it="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any(line.startswith(message) for line in result.stderr.lines), result.stderr.str()
