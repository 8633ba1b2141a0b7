"""The controller side: warm worker groups, kept per (world size, backend, devices, configuration) and
reused.

Every wait here has a deadline. A group that hangs, crashes or is left unfit is never cleaned up over the
network (a barrier on a broken group deadlocks): its stacks are taken out of band, its processes
killed, and the next test gets a fresh group forked from a server that has torch already imported.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from pytest_collectives.algorithms import registry
from pytest_collectives.backend_declarations import refused_in
from pytest_collectives.execution.configurations import Configuration, Env, Rejected
from pytest_collectives.execution.launchers.forkserver import forkserver_context
from pytest_collectives.execution.messages import FAILED, PASSED, GroupSpec, RankResult, Task, packed
from pytest_collectives.execution.outcome import (
    CRASHED,
    HUNG,
    DistributedTestFailure,
    GroupOutcome,
    RankReport,
    exit_reason,
    hang_culprit,
    likely_cause,
)
from pytest_collectives.execution.ranks.context import STACK_SIGNAL, rank_files, tasks_taken
from pytest_collectives.execution.ranks.pending import probe_group
from pytest_collectives.execution.ranks.worker import worker_main
from pytest_collectives.topology.detect import usable_cores

PROBE_TIMEOUT_S = 5.0  # how long a group gets to answer whether a raise left it unfit (GroupPool._asked)
FAILURE_GRACE_S = 2.0  # how long the other ranks get to finish after one fails before they count as hung
STACK_WAIT_S = 2.0
CRASH_TAIL_LINES = 30
ABORT_REASON_LINES = 4  # what a process printed just before it aborted: "terminate called", "what(): ..."
RECYCLE_RSS_GROWTH = 2 << 30  # a worker that grew this much since it started is replaced
# A rank reads its task before it answers the previous one's, so the pipe is empty when a task is sent, and a
# task smaller than a pipe's buffer (64 KiB on Linux, 4 KiB at the least POSIX allows) is written at once.
INLINE_TASK_BYTES = 4096


class WorkerGroup:
    """N processes, one per rank, joined in one process group."""

    def __init__(self, spec: GroupSpec, ctx: multiprocessing.context.BaseContext) -> None:
        self.spec = spec
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.conns: list[Connection] = []
        self.start_rss: list[int] = []
        self.taken = tasks_taken(spec.workdir, spec.world_size)
        self.sent = 0  # tasks sent: a rank that took as many took the one in flight
        self.lost: list[RankReport] = []  # crashed before receiving it: they died after the test before
        self.files = [rank_files(spec.workdir, rank) for rank in range(spec.world_size)]  # read per test
        for rank in range(spec.world_size):
            parent_conn, child_conn = ctx.Pipe()
            proc = ctx.Process(
                target=worker_main,
                args=(spec, rank, child_conn),
                name=f"collectives-rank{rank}",
                daemon=True,
            )
            proc.start()
            child_conn.close()
            self.procs.append(proc)
            self.conns.append(parent_conn)
        # each rank's pipe, and its process's sentinel (readable once it has exited)
        self._rank_of = {fd: rank for rank in range(spec.world_size) for fd in self._fds(rank)}
        self._watch = _poller(self._rank_of)  # asked before each test: built once

    def dead(self) -> list[RankReport]:
        """The ranks that died since their last answer. Such a rank is seen by its pipe at EOF at once (a
        readable pipe with no task in flight can only be EOF), before the forkserver reaps it."""
        ranks = {self._rank_of[fd] for fd, _ in self._watch.poll(0)}
        return [self._crashed(rank) for rank in sorted(ranks)]

    def _fds(self, rank: int) -> tuple[int, int]:
        return self.conns[rank].fileno(), self.procs[rank].sentinel

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def wait_ready(self, timeout_s: float) -> GroupOutcome | None:
        """None once every rank joined the group; otherwise what went wrong, the group killed."""
        outcome = self._collect(timeout_s)
        return None if outcome.verdict() == "passed" else outcome

    def run(self, task: Task, timeout_s: float) -> tuple[GroupOutcome, list[RankResult]]:
        payload = packed(task)
        self.sent += 1
        self.lost = []
        # A larger task blocks its writer until the rank reads it, and a live rank that stopped reading
        # would block the controller for ever: such tasks are written by one thread per rank, and a rank
        # that never takes its task is reported hung by _collect's deadline like any other.
        senders = []
        if len(payload) <= INLINE_TASK_BYTES:
            for conn in self.conns:
                _send(conn, payload)
        else:
            for rank, conn in enumerate(self.conns):
                sender = threading.Thread(target=_send, args=(conn, payload), name=f"send{rank}", daemon=True)
                sender.start()
                senders.append(sender)
        results: list[RankResult] = []
        outcome = self._collect(timeout_s, results)
        for sender in senders:
            sender.join()  # done: every rank took its task, or _collect killed the group, breaking the pipe
        if not self.start_rss:
            self.start_rss = [r.rss_bytes for r in results]
        return outcome, results

    def fit_for_reuse(self, results: list[RankResult]) -> list[str]:
        """Reasons to replace the group after a test that every rank finished."""
        reasons = sorted({f"rank {r.rank}: {why}" for r in results for why in r.dirty})
        for r in results:
            if self.start_rss and r.rss_bytes - self.start_rss[r.rank] > RECYCLE_RSS_GROWTH:
                reasons.append(f"rank {r.rank} grew by {(r.rss_bytes - self.start_rss[r.rank]) >> 20} MiB")
        return reasons

    def _collect(self, timeout_s: float, results: list[RankResult] | None = None) -> GroupOutcome:
        """Wait for every rank's answer (ready, or a test result) until the deadline; a rank that gave
        none by then is hung, and one that failed starts a short grace period for the others."""
        n = self.spec.world_size
        reports: dict[int, RankReport] = {}
        failures: list[int] = []  # in the order they arrived
        failed_at = 0.0
        deadline = time.monotonic() + timeout_s
        # one poll object for the whole wait: multiprocessing's wait() builds a selector at each call
        poller = _poller(self._rank_of)
        while len(reports) < n and not self.lost:
            limit = min(deadline, failed_at + FAILURE_GRACE_S) if failures else deadline
            ready = poller.poll(max(0, math.ceil((limit - time.monotonic()) * 1e3)))
            if not ready:
                break
            readable = {fd for fd, _ in ready}
            for fd, _ in ready:
                rank = self._rank_of[fd]
                if rank in reports:
                    continue
                reports[rank] = report = self._receive(rank, results, self.conns[rank].fileno() in readable)
                for answered in self._fds(rank):
                    poller.unregister(answered)
                if results is not None and report.status == CRASHED and not self.took_it(rank):
                    self.lost.append(report)  # the test is to be run again: no need to wait for it
                elif report.status in (FAILED, CRASHED):
                    failed_at = failed_at if failures else time.monotonic()
                    failures.append(rank)
        missing = [r for r in range(n) if r not in reports]
        if missing:
            stacks = {} if self.lost else self._dump_stacks(missing)
            for rank in missing:
                idle = results is not None and not self.took_it(rank)
                why = "it never received this test: it stopped reading tasks after the previous one" * idle
                reports[rank] = RankReport(rank, HUNG, why, stack=stacks.get(rank, "(no stack was written)"))
        outcome = GroupOutcome([reports[r] for r in range(n)], likely_cause(reports, failures), timeout_s)
        if missing and not failures:
            outcome.culprit = hang_culprit({r: reports[r].stack for r in missing})
        self._attach_output(outcome, quiet={r.rank for r in results or () if not r.printed})
        if missing or any(r.status == CRASHED for r in outcome.ranks):
            outcome.replaced.append("a rank hung or crashed")
            self.kill()
        return outcome

    def took_it(self, rank: int) -> bool:
        """Whether ``rank`` took the task in flight (a rank that died before did not die in the test)."""
        return self.taken[rank] == self.sent

    def _receive(self, rank: int, results: list[RankResult] | None, said: bool) -> RankReport:
        """What ``rank`` answered, or its crash; ``said``: the poll just found its pipe readable."""
        conn = self.conns[rank]
        try:
            if said or _readable([conn.fileno()]):  # not only the process's exit
                kind, payload = conn.recv()
                if kind == "ready":
                    return RankReport(rank, "passed")
                if kind == "refused":  # its backend raised as the group started
                    return RankReport(rank, FAILED, payload)
                results.append(payload)  # type: ignore[union-attr]
                return RankReport.of(payload)
        except (EOFError, OSError):
            pass
        # The pipe is at EOF or the process is gone: a crash, whether or not the forkserver has
        # reported the exit status yet.
        return self._crashed(rank)

    def _crashed(self, rank: int) -> RankReport:
        proc = self.procs[rank]
        proc.join(timeout=1.0)
        return RankReport(rank, CRASHED, exit_reason(proc.exitcode))

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        files = {r: self.files[r]["stack"] for r in ranks}
        for rank in ranks:
            try:
                os.kill(self.procs[rank].pid, STACK_SIGNAL)  # type: ignore[arg-type]
            except ProcessLookupError:
                pass
        # faulthandler writes from a signal handler: done once every file is non-empty and stops growing
        deadline = time.monotonic() + STACK_WAIT_S
        sizes: dict[int, int] = {}
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = {r: (p.stat().st_size if p.exists() else 0) for r, p in files.items()}
            if all(now.values()) and now == sizes:
                break
            sizes = now
        return {r: _test_frames(text) for r, p in files.items() if (text := _read(p))}

    def _attach_output(self, outcome: GroupOutcome, quiet: set[int]) -> None:
        """Each rank's captured output, read from its files, but for the ``quiet`` ranks (they said they
        wrote none: 16 files at 8 ranks need not be looked at after each call)."""
        for report in outcome.ranks:
            if report.rank in quiet:
                continue
            files = self.files[report.rank]
            report.stdout = _read(files["stdout"])
            report.stderr = _read(files["stderr"])
            if report.status == CRASHED and report.stderr:
                # what a dying process last said (a traceback, faulthandler's dump) belongs with its crash
                report.detail += f"\nits last words on stderr:\n{last_words(report.stderr)}"

    def kill(self) -> None:
        for proc in self.procs:
            if proc.pid is not None and proc.exitcode is None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            proc.join(timeout=5.0)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns, self._rank_of, self._watch = [], [], {}, _poller(())
        shutil.rmtree(self.spec.workdir, ignore_errors=True)

    def stop(self) -> None:
        """Ask the ranks to leave, then kill whatever did not: never block on a group."""
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 1.0
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()


def last_words(stderr: str) -> str:
    """What a dying process last said: from just before faulthandler's "Fatal Python error", where the
    reason of a C++ abort is (gloo's "what(): [enforce fail ...]"), which the threads' stacks after it
    would push out of a plain tail; else its last lines."""
    lines = stderr.rstrip().splitlines()
    fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
    if not fatal:
        return "\n".join(lines[-CRASH_TAIL_LINES:])
    return "\n".join(lines[max(0, fatal[-1] - ABORT_REASON_LINES) : fatal[-1] + CRASH_TAIL_LINES])


def _start_words(failure: GroupOutcome) -> list[str] | None:
    """What each rank that raised as its group started said, where ranks raised and none crashed (the others
    may wait on them), else None: a crash or a hang is never the backend's answer to a setting. Every
    rank's: one rank's refusal must not hide another's fault."""
    statuses = {r.status for r in failure.ranks}
    if FAILED not in statuses or CRASHED in statuses:
        return None
    return [_last_line(r, "") for r in failure.ranks if r.status == FAILED]


def _last_line(report: RankReport | None, otherwise: str) -> str:
    """The last line of what a rank said (its exception, for a traceback), or ``otherwise``."""
    said = report.detail.strip() if report else ""
    return said.splitlines()[-1] if said else otherwise


def _readable(fds: Iterable[int]) -> list[int]:
    """Those of ``fds`` that can be read now (a message, EOF, or an exited process's sentinel)."""
    return [fd for fd, _ in _poller(fds).poll(0)]


def _poller(fds: Iterable[int]) -> select.poll:
    """A poll object watching ``fds`` for reading. By poll: select() can't take a descriptor numbered 1024
    or more, which a long session may hand out."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return poller


def _send(conn: Connection, payload: bytes) -> None:
    try:
        conn.send_bytes(payload)
    except OSError:
        pass  # a rank that died just now: _collect reports it from its pipe and exit status


def _test_frames(stack: str) -> str:
    """A faulthandler dump without the frames of the harness below the test (runner, multiprocessing,
    threading) and without the threads that had nothing else (the rank's watch on pytest)."""
    harness = (
        os.path.dirname(multiprocessing.__file__),
        rank_files.__code__.co_filename,
        threading.__file__,
        '"<string>"',
    )
    threads = []
    for block in stack.strip().split("\n\n"):
        lines = [line for line in block.splitlines() if not any(h in line for h in harness)]
        if any(line.lstrip().startswith("File ") for line in lines):
            threads.append("\n".join(lines))
    return "\n\n".join(threads)


def _read(path: Path) -> str:
    try:
        # most tests print nothing: a stat is a quarter of the cost of opening the file
        return path.read_text(errors="replace") if path.stat().st_size else ""
    except OSError:
        return ""


def rank_cores(cores: Sequence[int], world_size: int) -> tuple[int, ...]:
    """Rank r's core, ``cores[r % len(cores)]``, where a group has more ranks than the session has
    ``cores``; empty where each rank can have a core of its own, to leave the ranks to the scheduler.

    Oversubscribed, a call is a chain of wake-ups, and one that crosses cores costs an interrupt (dear on a
    virtual machine); a rank on one core wakes its own threads (the backend's among them) there. On the
    2-core machine, a gloo all_reduce of 97 elements at 8 ranks takes 19 ms unpinned and 10.7 ms so. With a
    core each it helps nothing (2 ranks on 2 cores: 1.0 ms unpinned, 1.8 pinned).
    """
    if world_size <= len(cores):
        return ()
    return tuple(cores[r % len(cores)] for r in range(world_size))


def group_devices(world_size: int, visible: str | None) -> tuple[str, ...]:
    """The first ``world_size`` GPUs that pytest itself may use, named as CUDA_VISIBLE_DEVICES names them
    (so --gpus 2 under CUDA_VISIBLE_DEVICES=2,3 means GPUs 2 and 3, not 0 and 1)."""
    names = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(world_size)]
    if len(names) < world_size:
        raise ValueError(
            f"{world_size} ranks need {world_size} GPUs; CUDA_VISIBLE_DEVICES={visible} has {len(names)}"
        )
    return tuple(names[:world_size])


class GroupPool:
    """Warm groups keyed by (world size, backend, devices, configuration), started lazily, replaced when
    unfit."""

    def __init__(
        self,
        backend: str,
        timeout_s: float,
        gpus: int = 0,
        device_type: str = "cpu",
        start_method: str = "forkserver",
        root: str | None = None,
        modules: tuple[str, ...] = (),
    ) -> None:
        self.backend = backend
        self.modules = modules
        self.timeout_s = timeout_s
        self.gpus = gpus
        self.device_type = device_type
        self.ctx = forkserver_context(start_method)
        self.root = tempfile.mkdtemp(prefix="collectives-", dir=root)
        self.groups: dict[tuple[int, str, tuple[int, ...], Env], WorkerGroup] = {}
        # (world size, configuration) the backend would not start a group in: a setting a backend turns
        # down at one world size may run at another
        self.rejected: dict[tuple[int, Env], Rejected] = {}
        # (world size, configuration) whose group failed to start twice, hung or faulting: how it failed
        self.unstarted: dict[tuple[int, Env], GroupOutcome] = {}
        self.started = 0

    def spec_for(self, world_size: int, env: Env = ()) -> GroupSpec:
        devices = group_devices(world_size, os.environ.get("CUDA_VISIBLE_DEVICES")) if self.gpus else ()
        cores = sorted(usable_cores())
        workdir = tempfile.mkdtemp(prefix=f"ws{world_size}-", dir=self.root)
        return GroupSpec(
            world_size=world_size,
            backend=self.backend,
            devices=devices,
            device_type=self.device_type,
            store_path=os.path.join(workdir, "store"),
            workdir=workdir,
            timeout_s=self.timeout_s + 60.0,
            threads_per_rank=max(1, len(cores) // world_size),
            cores=rank_cores(cores, world_size),
            env={**os.environ, **dict(env)},
            controller_pid=os.getpid(),
            modules=self.modules,
            sys_path=tuple(sys.path),
            algorithms=registry.sources(),
        )

    def group(self, world_size: int, env: Env = (), lost: list[RankReport] | None = None) -> WorkerGroup:
        """A warm group of ``world_size`` ranks started with ``env`` over pytest's environment; raises
        DistributedTestFailure if one can't be started, or Rejected where its ranks raised in a
        configuration (then at once for every later group in it). The ranks of a warm group that died
        since its last test are added to ``lost``."""
        if (world_size, env) in self.rejected:
            raise self.rejected[world_size, env]
        if (world_size, env) in self.unstarted:  # paid once: its start is not tried again at each test
            raise DistributedTestFailure.of(self.unstarted[world_size, env])
        key = (world_size, self.backend, tuple(range(world_size)) if self.gpus else (), env)
        group = self.groups.get(key)
        if group is not None:
            dead = group.dead()
            if group.procs and not dead:  # a group killed after a test has no processes left
                return group
            if lost is not None:
                lost.extend(dead)
            group.kill()
        group, failures = self._start(world_size, env)
        where = f" with {Configuration(env).id}" if env else ""
        if group is None:
            # N/A only in the backend's declared words, and only where each rank that raised in each start
            # said them (no crash or hang): anything else is a failure of the setting that quotes what the
            # ranks said.
            said = [_start_words(f) for f in failures]
            if env and all(
                lines is not None and all(refused_in(line, self.backend) is not None for line in lines)
                for lines in said
            ):
                self.rejected[world_size, env] = Rejected(Configuration(env), self.backend, said[-1][-1])
                raise self.rejected[world_size, env]
            failures[-1].replaced.append(
                f"the group failed to start {len(failures)} of {len(failures)} times{where}"
            )
            failures[-1].unstarted = True
            if env:  # a setting that keeps a group from starting does so at every test: tried once
                failures[-1].replaced.append("not tried again for the tests after this one")
                self.unstarted[world_size, env] = failures[-1]
            raise DistributedTestFailure.of(failures[-1])
        self.groups[key] = group
        if failures:
            # it started the second time: kept for the tests after, but a node that cannot always start a
            # group is not healthy, and this test says so
            failures[0].replaced.append(
                f"the group failed to start 1 of 2 times{where} (the second start worked: it is kept)"
            )
            raise DistributedTestFailure.of(failures[0])
        return group

    def _start(self, world_size: int, env: Env) -> tuple[WorkerGroup | None, list[GroupOutcome]]:
        """A started group, tried a second time where the first did not start, and each start's failure."""
        failures: list[GroupOutcome] = []
        while len(failures) < 2:
            group = WorkerGroup(self.spec_for(world_size, env), self.ctx)
            self.started += 1
            failure = group.wait_ready(self.timeout_s)
            if failure is None:
                return group, failures
            failures.append(failure)  # the group killed
        return None, failures

    def run(self, task: Task, world_size: int) -> GroupOutcome:
        lost: list[RankReport] = []
        group = self.group(world_size, task.env, lost)
        timeout_s = task.timeout_s or self.timeout_s
        outcome, results = group.run(task, timeout_s)
        if group.lost:
            # The rank died after its previous test, just past the liveness check: this test never reached
            # it, so it is not this test's failure. Run it once more, whole, on a fresh group.
            lost += group.lost
            group = self.group(world_size, task.env)
            outcome, results = group.run(task, timeout_s)
        outcome.replaced.extend(
            f"rank {r.rank} died after the previous test ({r.detail.splitlines()[0]}); "
            "this test ran on a fresh group"
            for r in lost
        )
        if len(results) == world_size:
            reasons = group.fit_for_reuse(results) or self._asked(group, results)
            if reasons:
                outcome.replaced.extend(reasons)
                group.kill()
        return outcome

    def _asked(self, group: WorkerGroup, results: list[RankResult]) -> list[str]:
        """After calls raised on a backend that may keep state after a raise (backend_declarations.py), the
        group is asked rather than replaced: one checked all_reduce with a deadline (pending.probe_group).
        Reasons to replace it where the answer is wrong or late; a failing vendor run then costs about what a
        passing one does, where a fresh group after each raise made it 11x slower."""
        suspect = sorted({f"rank {r.rank}: {why}" for r in results for why in r.suspect})
        if not suspect:
            return []
        outcome, answers = group.run(Task.calling(probe_group, group.spec.world_size), PROBE_TIMEOUT_S)
        if outcome.verdict() == PASSED and len(answers) == group.spec.world_size:
            return group.fit_for_reuse(answers)
        failed = next((r for r in outcome.ranks if r.status != PASSED), None)
        said = _last_line(failed, "no answer")
        return [*suspect, f"and the group then failed a probe all_reduce (rank {failed.rank}: {said})"]

    def discard(self, world_size: int, env: Env = ()) -> None:
        for key in [k for k in self.groups if k[0] == world_size and k[3] == env]:
            self.groups.pop(key).kill()

    def pids(self) -> list[int]:
        return [pid for g in self.groups.values() for pid in g.pids]

    def close(self) -> None:
        for group in self.groups.values():
            group.stop()
        self.groups.clear()
        shutil.rmtree(self.root, ignore_errors=True)
