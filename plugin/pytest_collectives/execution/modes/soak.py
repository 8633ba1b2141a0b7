"""Burn-in (--soak DURATION): the selected tests again and again until the time is spent.

Backends have shipped corruptions seen only after several runs (NCCL's LL128 broadcast, NVIDIA/nccl#740),
and vendors burn a new node in for hours. A soak runs the session's tests pass after pass, each pass with
a fresh hypothesis seed (the example database kept, so a failure found is tried first in the next pass),
in the same worker groups, as a training job would keep its own (a group is replaced only after a test
left it unfit). It ends, when the time is spent or at Ctrl-C, with what ran: passes made, and per test
that failed, how often, when first, and a command that replays it.

A test that fails in a pass is tried again at once at the same draw (the pass's seed: the same sizes and
examples), for its first failing draws: a bug that fails every time its draw comes round is told from one
that fails sometimes on the same draw, with the rate per draw. A deterministic bug of a rotating tier
fails one pass in five, as an intermittent one might; its tries fail every time. The tries run in the
soaked groups, and its replay command runs as printed, in a pytest of its own on fresh groups: a bug is
labelled by what its replay does, so a bug of a group's first calls (its tries pass, its replay fails) or
of wear (its tries fail, its replay passes) is not called intermittent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from pytest_collectives.bench import side_by_side
from pytest_collectives.execution import configurations, options
from pytest_collectives.verdict import FAIL, NOT_JUDGED, PASS, TABLE, WARN, Check

PROGRESS_EVERY_S = 60.0  # a pass is said when it failed, else at most once a minute
TRIES_AT_A_DRAW = 3  # a failing test's runs at one draw: the pass's and two more
# a test's first failing draws tried again: each replays the example database's failures and shrinks
DRAWS_TRIED = 2
REPLAY_TIMEOUT_S = 900.0  # a replay is one test: one that runs longer has hung


def clock(seconds: float) -> str:
    """``1h02m``, ``4m10s``, ``12s``: a soak's times as a person reads them."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@dataclasses.dataclass
class Failures:
    """One test's failures over a soak."""

    passes: list[int] = dataclasses.field(default_factory=list)  # the passes it failed in
    first_at: float = 0.0  # seconds into the soak
    seed: int = 0  # the first failing pass's hypothesis seed
    draws: dict[int, int] = dataclasses.field(default_factory=dict)  # a seed tried again: its failed tries
    replayed: Replayed | None = None  # its replay command at ``seed``, run as printed

    def kind(self) -> str:
        """What the test's failing draws did when tried again in the soaked groups, with the rate per draw,
        and what its replay did on fresh ones: the label a vendor files the bug under."""
        if not self.draws:
            return ""
        rates = ", ".join(f"{n} of {TRIES_AT_A_DRAW} tries at seed {seed}" for seed, n in self.draws.items())
        every = all(n == TRIES_AT_A_DRAW for n in self.draws.values())
        replayed = self.replayed
        if replayed is None:  # the soak ended (Ctrl-C) before its replay ran
            return f"fails every time its draw comes round: {rates}" if every else (
                f"intermittent, fails sometimes at the same draw: {rates}"
            )
        if replayed.failed and every:
            return f"fails every time its draw comes round, and its replay fails: {rates}"
        if replayed.failed:
            return (
                f"fails when its groups are new: its replay fails, the soaked groups only sometimes "
                f"({rates}): a bug of a group's first calls, or an intermittent one"
            )
        if replayed.passed and every:
            return (
                f"fails every time in the soaked groups ({rates}) but its replay, on fresh groups, passes: a "
                "fault that builds up over the soak (wear, heat, or state earlier calls left); soak again to "
                "meet it"
            )
        if replayed.passed:
            return f"intermittent, fails sometimes at the same draw: {rates}; its replay passed"
        return f"{rates}; its replay did not run to a verdict: {replayed.said}"


@dataclasses.dataclass(frozen=True)
class Replayed:
    """What a replay command did, run as printed."""

    exit_status: int | None  # None: it ran past REPLAY_TIMEOUT_S
    said: str  # its last line

    @property
    def passed(self) -> bool:
        return self.exit_status == pytest.ExitCode.OK

    @property
    def failed(self) -> bool:
        return self.exit_status == pytest.ExitCode.TESTS_FAILED


def run_replay(command: str, folder: str | os.PathLike[str]) -> Replayed:
    """``command`` (a replay line, ``pytest ...``) run as a user types it in ``folder``, with this
    interpreter; the modules this process imports on its path (a backend module a test put there)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", *shlex.split(command)], cwd=folder, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=REPLAY_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return Replayed(None, f"it ran past {clock(REPLAY_TIMEOUT_S)}")
    said = [line.strip() for line in done.stdout.splitlines() if line.strip()][-1:] or [""]
    return Replayed(done.returncode, f"exit status {done.returncode}, its last line: {said[0]}")


def typed_from(nodeid: str, rootdir: str | os.PathLike[str], here: str | os.PathLike[str]) -> str:
    """``nodeid`` (its path relative to the rootdir, as pytest names tests) as typed in the folder ``here``
    pytest was started in: the replay runs where the soak was typed."""
    path, sep, rest = nodeid.partition("::")
    return os.path.relpath(os.path.join(rootdir, path), here) + sep + rest


def replay(
    nodeid: str,
    seed: int,
    settings: options.Settings,
    configuration: configurations.Configuration,
    world_size: int | None,
    pinned: Sequence[str] = (),
) -> str:
    """The command that runs ``nodeid`` again with ``seed``, in the session's backend and configuration, at
    the session's world sizes (where they hold ``world_size``: the node id names its size, and a test drawn
    at one of several sizes draws as it did), then ``pinned``: the options that pin what the session
    measured (the size tiers as they ran, whatever a replay would measure)."""
    args = ["pytest", nodeid, f"--hypothesis-seed={seed}"]
    if settings.gpus:
        args += ["--gpus", str(settings.gpus)]
    if settings.backend_modules:
        args += ["--backend-module", ",".join(settings.backend_modules)]
    args += ["--backend", settings.backend]
    if world_size:
        sizes = sorted({*settings.world_sizes, world_size})
        args += ["--world-sizes", ",".join(map(str, sizes))]
    for name, value in configuration.env:
        args += ["--backend-env", configurations.as_option(name, value)]
    return shlex.join([*args, *pinned])


class Soak:
    """Runs the session's items pass after pass (pytest_runtestloop), and reports what the passes did."""

    def __init__(
        self,
        seconds: float,
        session: Any,
        drift: float,
        pinned: Callable[[pytest.Config, int | None, Any], Sequence[str]],
    ) -> None:
        self.session = session  # the DistributedSession: its config and settings; it keeps the groups
        # what a replay at a world size (in a configuration's env) must pin of what the session measured
        self.pinned = pinned
        self.config = session.config
        self.drift = drift  # how much worse a benchmark may get over the passes before a WARN
        self.seconds = seconds
        seed = self.config.getoption("hypothesis_seed", None)
        self.first_seed = int(seed) if seed is not None and str(seed).isdigit() else random.randrange(1 << 16)
        self.passes = 0  # passes begun
        self.started = 0.0
        self.failures: dict[str, Failures] = {}
        self.items: dict[str, pytest.Item] = {}
        self.ended = "the time was spent"
        self.ctrl_c = False
        # each benchmark of each pass, stamped with the seconds into the soak its pass ended at
        self.samples: list[tuple[float, str, dict[str, Any]]] = []

    def seed_of(self, number: int) -> int:
        """Pass ``number``'s hypothesis seed: consecutive seeds, which also walk the sweeps' rotation."""
        return self.first_seed + number - 1

    def loop(self, session: pytest.Session) -> bool:
        """The passes, in place of pytest's own loop (run.Run.pytest_runtestloop, after the gate's veto)."""
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
        if session.config.option.collectonly:
            return True
        try:
            from hypothesis import core
        except ImportError:  # an extra: without it there are no seeds to turn
            core = None
        items = list(session.items)
        self.items = {item.nodeid: item for item in items}
        self.session.keep_groups()
        self.started = time.monotonic()
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        try:
            with self._ctrl_c_kept():
                self._passes(session, items, core, reporter)
        except KeyboardInterrupt:
            self.ended = "interrupted (Ctrl-C)"
            raise
        return True

    def _passes(self, session: pytest.Session, items: list[pytest.Item], core: Any, reporter: Any) -> None:
        said_at = -PROGRESS_EVERY_S  # the first pass is always said
        more = bool(items)
        while more:
            self.passes += 1
            seed = self.seed_of(self.passes)
            session.config.option.hypothesis_seed = seed  # the sweeps' rotation turns with it
            if core is not None:
                core.global_force_seed = seed
            for i, item in enumerate(items):
                last = i == len(items) - 1
                more = not last or self.elapsed() < self.seconds
                # the next pass's first item keeps the session's fixtures set up; not the item itself,
                # which pytest would then not set up again
                nextitem = items[i + 1] if not last else (items[0] if more and i else None)
                item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
                self._try_again(item, nextitem, seed)
                if self.ctrl_c:
                    raise KeyboardInterrupt
                if session.shouldfail or session.shouldstop:
                    raise session.Failed(session.shouldfail or session.shouldstop)
            ran = side_by_side.records(self.config)
            self.samples += [(self.elapsed(), name, extra) for name, extra in ran[len(self.samples) :]]
            failed = sum(1 for f in self.failures.values() if self.passes in f.passes)
            if reporter is not None and (failed or self.elapsed() - said_at >= PROGRESS_EVERY_S):
                reporter.write_line(self.progress(failed))
                said_at = self.elapsed()

    @contextlib.contextmanager
    def _ctrl_c_kept(self) -> Iterator[None]:
        """Ctrl-C remembered as well as raised: Python drops the KeyboardInterrupt raised while a finalizer
        (a ``__del__``, a weakref callback) runs, and a soak of hours would go on past its Ctrl-C. The
        remembered one ends it after the test running then."""
        previous = signal.getsignal(signal.SIGINT)
        # only the main thread may set a handler; a caller who chose another handler keeps theirs
        if (
            threading.current_thread() is not threading.main_thread()
            or previous is not signal.default_int_handler
        ):
            yield
            return

        def asked(signum: int, frame: Any) -> None:
            self.ctrl_c = True
            signal.default_int_handler(signum, frame)

        signal.signal(signal.SIGINT, asked)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _try_again(self, item: pytest.Item, nextitem: pytest.Item | None, seed: int) -> None:
        """Run a test that just failed again at its draw (TRIES_AT_A_DRAW in all), reporting nothing: only
        how many of the tries failed is kept."""
        from _pytest.runner import runtestprotocol

        found = self.failures.get(item.nodeid)
        if not found or found.passes[-1] != self.passes or len(found.draws) >= DRAWS_TRIED:
            return
        failed = 1
        for _ in range(TRIES_AT_A_DRAW - 1):
            self.session.begin(item)
            failed += any(report.failed for report in runtestprotocol(item, nextitem=nextitem, log=False))
        found.draws[seed] = failed
        if found.replayed is None:
            found.replayed = run_replay(self.replay_of(item.nodeid), self.config.invocation_params.dir)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def progress(self, failed: int) -> str:
        return (
            f"soak: pass {self.passes} done at {clock(self.elapsed())} of {clock(self.seconds)} "
            f"(seed {self.seed_of(self.passes)}): {failed} test(s) failed in it"
        )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):  # noqa: ANN201
        """A test that failed in an earlier pass fails again with one line, not its whole report again:
        an 8-hour soak would print thousands of the same tracebacks."""
        report = (yield).get_result()
        found = self.failures.get(item.nodeid)
        if report.failed and found and found.passes[0] < self.passes:
            said = [line for line in report.longreprtext.splitlines() if line.strip()][-1:] or [""]
            report.longrepr = (
                f"failed again in pass {self.passes} (first in pass {found.passes[0]}, shown above); its "
                f"last line: {said[0].strip()}"
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed and self.passes:
            found = self.failures.setdefault(report.nodeid, Failures())
            if not found.passes:
                found.first_at, found.seed = self.elapsed(), self.seed_of(self.passes)
            if self.passes not in found.passes:
                found.passes.append(self.passes)

    def replay_of(self, nodeid: str) -> str:
        """The command that replays a failed test at its first failing draw."""
        item = self.items.get(nodeid)
        configuration = configurations.of_item(item) if item else configurations.Configuration()
        callspec = getattr(item, "callspec", None)
        world_size = callspec.params.get("world_size") if callspec else None
        here = self.config.invocation_params.dir
        return replay(
            typed_from(nodeid, self.config.rootpath, here), self.failures[nodeid].seed,
            self.session.settings, configuration, world_size,
            self.pinned(self.config, world_size, configuration.env),
        )  # fmt: skip

    def failed(self) -> list[dict[str, Any]]:
        """Each test that failed: its configuration, how often, when first, and the command replaying it."""
        found = []
        for nodeid, failures in self.failures.items():
            item = self.items.get(nodeid)
            configuration = configurations.of_item(item) if item else configurations.Configuration()
            draws, replayed = failures.draws, failures.replayed
            found.append({
                "nodeid": nodeid,
                "backend_env": configuration.id,
                "failed_passes": len(failures.passes),
                "first_pass": failures.passes[0],
                "first_at_s": round(failures.first_at, 3),
                "draws": [{"seed": seed, "tries": TRIES_AT_A_DRAW, "failed": n} for seed, n in draws.items()],
                "kind": failures.kind(),
                "replay": self.replay_of(nodeid),
                "replay_exit_status": replayed.exit_status if replayed else None,
            })  # fmt: skip
        return found

    def series(self) -> dict[str, tuple[str, list[tuple[float, float]]]]:
        """Each benchmark's unit and its (seconds into the soak, figure) of every pass."""
        series: dict[str, tuple[str, list[tuple[float, float]]]] = {}
        for at, name, extra in self.samples:
            value, unit = side_by_side.figure(extra)
            series.setdefault(name, (unit, []))[1].append((at, value))
        return series

    def lines(self) -> list[str]:
        """The soak's report: passes made, then per configuration each test that failed."""
        lines = [f"soak: {self.passes} pass(es) in {clock(self.elapsed())}, {self.ended}; first seed "
                 f"{self.first_seed}"]  # fmt: skip
        if not self.failures:
            lines.append("no test failed in any pass")
        figures = side_by_side.figures((name, extra) for _, name, extra in self.samples)
        lines += [drift.line(self.drift) for drift in side_by_side.drifted(figures, self.drift)]
        by_configuration: dict[str, list[str]] = {}
        for found in self.failed():
            kind = f"; {found['kind']}" if found["kind"] else ""
            by_configuration.setdefault(found["backend_env"], []).append(
                f"  {found['nodeid']} failed in {found['failed_passes']} of {self.passes} passes, first at "
                f"{clock(found['first_at_s'])} (pass {found['first_pass']}){kind}; replay: {found['replay']}"
            )
        for configuration, failed in by_configuration.items():
            named = configuration or configurations.Configuration()
            lines.append(f"with {named}: {len(failed)} test(s) failed")
            lines += failed
        return lines

    def document(self) -> dict[str, Any]:
        """The soak for the node report (its ``soak``): what ran, what failed, each benchmark over time."""
        return {
            "duration_s": self.seconds,
            "elapsed_s": round(self.elapsed(), 3),
            "passes": self.passes,
            "ended": self.ended,
            "first_seed": self.first_seed,
            "tolerance": self.drift,
            "failures": self.failed(),
            "series": [
                {"benchmark": name, "unit": unit, "points": [[round(at, 3), value] for at, value in points]}
                for name, (unit, points) in self.series().items()
            ],
        }

    def checks(self) -> list[Check]:
        """The soak's checks (judge_soak); none where it made no pass."""
        return judge_soak(self.document()) if self.passes else []

    def summary(self, terminalreporter: Any) -> None:
        if not self.passes:
            return
        terminalreporter.section("soak")
        for line in self.lines():
            terminalreporter.write_line(line, red=bool(self.failures))


def judge_soak(soak: Mapping[str, Any]) -> list[Check]:
    """The soak's two checks, from its document: the tests over its passes (FAIL where one failed in any),
    and the benchmarks' figures over its time (WARN where one drifted beyond the tolerance; NOT JUDGED over
    too few passes to see a drift)."""
    passes = soak["passes"]
    ran = (
        f"{passes} passes in {clock(soak['elapsed_s'])} ({soak['ended']}; first hypothesis seed "
        f"{soak['first_seed']})"
    )
    failures = soak["failures"]
    if failures:
        first = min(failures, key=lambda f: f["first_at_s"])
        tests = Check(
            "soak",
            FAIL,
            f"{ran}: {len(failures)} test(s) failed, first {first['nodeid']} at {clock(first['first_at_s'])} "
            f"(pass {first['first_pass']}, failing in {first['failed_passes']} of {passes}); the table has "
            f"each one's rate and the command that replays it.",
            {
                TABLE: {
                    "columns": [
                        "Test",
                        "Backend settings",
                        "Failed in",
                        "At the same draw",
                        "First at",
                        "Replay",
                    ],
                    "rows": [
                        [
                            f["nodeid"],
                            f["backend_env"] or "-",
                            f"{f['failed_passes']} of {passes} passes",
                            f["kind"] or "-",
                            f"{clock(f['first_at_s'])} (pass {f['first_pass']})",
                            f["replay"],
                        ]
                        for f in failures
                    ],  # fmt: skip
                }
            },
        )
    else:
        tests = Check("soak", PASS, f"{ran}: no test failed in any pass.", {"passes": passes})
    if not soak["series"]:
        return [tests]
    tolerance = soak["tolerance"]
    series = {s["benchmark"]: (s["unit"], [value for _, value in s["points"]]) for s in soak["series"]}
    worse = side_by_side.drifted(series, tolerance)
    longest = max(len(values) for _, values in series.values())
    if longest < 9:
        over = Check(
            "soak bandwidth",
            NOT_JUDGED,
            f"{len(series)} benchmarks over {passes} passes: too few to judge a drift over the soak (the "
            f"last third of the passes is compared with the first, 3 passes a third at least).",
        )
    elif not worse:
        over = Check(
            "soak bandwidth",
            PASS,
            f"{len(series)} benchmarks over {passes} passes: none got worse from its first passes to its "
            f"last beyond the tolerance of {tolerance:.0%}.",
        )
    else:
        over = Check(
            "soak bandwidth",
            WARN,
            f"{len(worse)} of {len(series)} benchmarks got worse over the soak beyond the tolerance of "
            f"{tolerance:.0%} (listed in the table): thermal throttling or a link training down; look at "
            f"the GPUs' clocks and throttle reasons and the links' state.",
            {
                TABLE: {
                    "columns": ["Benchmark", "Figure", "First passes", "Last passes", "Worse"],
                    "rows": [
                        [d.name, d.unit, f"{d.first:.3f}", f"{d.last:.3f}", f"{d.worse:.0%}"] for d in worse
                    ],
                }
            },
        )
    return [tests, over]
