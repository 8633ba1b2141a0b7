"""SPMD mode: pytest itself runs once per rank, started by torchrun or srun (multi-node).

No worker groups are started. Every rank's pytest collects the same tests, joins one process group, and
runs each distributed test in lockstep in its own process: a test of n ranks runs on the first n ranks (a
subgroup made the default group for the test's duration), the others wait for it. After each test (each
hypothesis example) every rank's outcome is gathered, so all ranks reach the same verdict, keep the same
pace (``-x`` stops them all at the same test) and rank 0 reports a failure on any rank with its traceback.
Only rank 0 prints and writes result files. A hang ends every rank through a watchdog: the stacks of all
its threads go to stderr and the rank exits non-zero, so no job is left stuck.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import hashlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

import pytest

from pytest_collectives import devices
from pytest_collectives.execution import options
from pytest_collectives.execution.configurations import Env
from pytest_collectives.execution.examples import settings_changed
from pytest_collectives.execution.messages import FAILED, Task
from pytest_collectives.execution.outcome import GroupOutcome, RankReport

SWITCH = "COLLECTIVES_SPMD"  # "0": ignore the launcher's variables and run pooled groups as usual
DEFAULT_PORT = 29500  # Slurm without MASTER_PORT: 29500 + SLURM_JOB_ID mod 1000, the same on every task
EXIT_HUNG = 124  # as timeout(1) exits
GATHER_GRACE_S = 5.0  # a rank that finished waits this much longer, so the stuck rank reports first
BACKSTOP_S = 30.0
# Joining, comparing the collections and the final barrier wait for the slowest rank to start or finish:
# launchers start nodes seconds apart, so these get at least this long whatever --dist-timeout says.
START_TIMEOUT_S = 300.0  # faulthandler's own C watchdog, should this rank's Python thread not get to run


class SpmdError(ValueError):
    """The launcher's variables are incomplete or inconsistent; the message names the variable."""


@dataclasses.dataclass(frozen=True)
class SpmdEnv:
    launcher: str  # "torchrun" or "slurm"
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    def node_of(self, rank: int) -> int:
        """The node of a global rank: both launchers place ranks in per-node blocks (checked by detect)."""
        return rank // self.local_world_size


def detect(environ: Mapping[str, str]) -> SpmdEnv | None:
    """The SPMD world this process is a rank of, or None when pytest was not started once per rank."""
    if environ.get(SWITCH) == "0":
        return None
    if "RANK" in environ or "WORLD_SIZE" in environ:
        env = _torchrun(environ)
    elif "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
        env = _slurm(environ)
    else:
        return None
    return env if env.world_size > 1 else None  # one rank: the pooled groups serve it better


def _int(environ: Mapping[str, str], name: str, launcher: str) -> int:
    text = environ.get(name)
    if text is None:
        raise SpmdError(f"{name} is not set: {launcher} sets it for every rank (or set {SWITCH}=0)")
    try:
        return int(text)
    except ValueError:
        raise SpmdError(f"{name}={text!r}: expected a whole number") from None


def _checked(env: SpmdEnv, node: int | None, node_var: str) -> SpmdEnv:
    if env.world_size < 1 or not 0 <= env.rank < env.world_size:
        raise SpmdError(f"rank {env.rank} is outside a world of {env.world_size} ranks")
    if env.local_world_size < 1 or not 0 <= env.local_rank < env.local_world_size:
        raise SpmdError(f"local rank {env.local_rank} is outside a node of {env.local_world_size} ranks")
    if env.world_size % env.local_world_size:
        raise SpmdError(f"{env.world_size} ranks don't fill nodes of {env.local_world_size} ranks each")
    if env.local_rank != env.rank % env.local_world_size or node not in (None, env.node_of(env.rank)):
        raise SpmdError(
            f"rank {env.rank} (local rank {env.local_rank}, {node_var}={node}) is not in per-node blocks of "
            f"{env.local_world_size} ranks; start the ranks in blocks (srun --distribution=block)"
        )
    return env


def _torchrun(environ: Mapping[str, str]) -> SpmdEnv:
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not environ.get(name):
            raise SpmdError(f"{name} is not set: torchrun sets it for every rank (or set {SWITCH}=0)")
    env = SpmdEnv(
        "torchrun",
        rank=_int(environ, "RANK", "torchrun"),
        world_size=_int(environ, "WORLD_SIZE", "torchrun"),
        local_rank=_int(environ, "LOCAL_RANK", "torchrun"),
        local_world_size=_int(environ, "LOCAL_WORLD_SIZE", "torchrun"),
        master_addr=environ["MASTER_ADDR"],
        master_port=_int(environ, "MASTER_PORT", "torchrun"),
    )
    node = _int(environ, "GROUP_RANK", "torchrun") if "GROUP_RANK" in environ else None
    return _checked(env, node, "GROUP_RANK")


def _slurm(environ: Mapping[str, str]) -> SpmdEnv:
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    addr = environ.get("MASTER_ADDR") or (first_host(nodelist) if nodelist else "")
    if not addr:
        raise SpmdError("no master address: set MASTER_ADDR, or run inside a job (SLURM_JOB_NODELIST)")
    if "MASTER_PORT" in environ:
        port = _int(environ, "MASTER_PORT", "you")
    else:
        port = DEFAULT_PORT + (
            _int(environ, "SLURM_JOB_ID", "srun") % 1000 if "SLURM_JOB_ID" in environ else 0
        )
    per_node = environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE", "")
    env = SpmdEnv(
        "slurm",
        rank=_int(environ, "SLURM_PROCID", "srun"),
        world_size=_int(environ, "SLURM_NTASKS", "srun"),
        local_rank=_int(environ, "SLURM_LOCALID", "srun"),
        local_world_size=tasks_per_node(per_node),
        master_addr=addr,
        master_port=port,
    )
    node = _int(environ, "SLURM_NODEID", "srun") if "SLURM_NODEID" in environ else None
    return _checked(env, node, "SLURM_NODEID")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: 'gpu[07-09,12]-ib,cpu1' -> 'gpu07-ib'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?([^,]*)", nodelist.strip())
    if match is None:
        raise SpmdError(f"SLURM_JOB_NODELIST={nodelist!r}: can't read its first host; set MASTER_ADDR")
    prefix, ranges, suffix = match.groups()
    return prefix + (ranges.split(",")[0].split("-")[0] if ranges else "") + suffix


def tasks_per_node(text: str) -> int:
    """Slurm's tasks per node ('4', '4(x2)', '4,4'); the same count on every node, as node_of assumes."""
    counts = set()
    for part in filter(None, text.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x\d+\))?", part.strip())
        if match is None:
            raise SpmdError(f"tasks per node {text!r}: expected counts like 4 or 4(x2)")
        counts.add(int(match.group(1)))
    if len(counts) != 1:
        raise SpmdError(
            f"tasks per node {text!r}: every node must run the same number of ranks (srun --ntasks-per-node)"
        )
    return counts.pop()


def settings_for(values: dict[str, str], env: SpmdEnv, count_gpus: Callable[[], int]) -> options.Settings:
    """The options in SPMD mode: --gpus counts this node's GPUs (rank r drives cuda:LOCAL_RANK), and
    world sizes may go up to the whole SPMD world; by default 2, 3, 4, 8 where they fit, and the world."""
    if values.get("backend_env", ""):
        raise options.OptionError(
            "--backend-env: torchrun or srun started these ranks once, with one environment; run a sweep "
            "without them (pooled groups), or set the variables in the environment they start"
        )
    return options.resolve(values, count_gpus, world=env.world_size, per_node=env.local_world_size)


def first_difference(lists: list[list[str]]) -> str | None:
    """Where the tests collected by each rank differ from rank 0's, in one line; None if they agree."""
    reference = lists[0]
    differing = [rank for rank, ids in enumerate(lists) if ids != reference]
    if not differing:
        return None
    other = lists[differing[0]]
    at = next(i for i in range(max(len(reference), len(other))) if reference[i : i + 1] != other[i : i + 1])
    theirs = other[at] if at < len(other) else "nothing"
    ours = reference[at] if at < len(reference) else "nothing"
    return (
        f"the ranks collected different tests (rank{'s' * (len(differing) > 1)} "
        f"{','.join(map(str, differing))} differ from rank 0): test #{at + 1} is {ours} on rank 0 but "
        f"{theirs} on rank {differing[0]}; every rank must run the same pytest arguments on the same files"
    )


class Watchdog:
    """Ends this rank when a step overruns its deadline: stacks of every thread to ``stream``, then exit.

    A Python thread, so the message can name the step; faulthandler's C-level timer is the backstop for a
    main thread that never lets go of the GIL.
    """

    def __init__(self, rank: int, stream: IO[str], exit: Callable[[int], Any] = os._exit) -> None:
        self.rank, self.stream, self.exit = rank, stream, exit
        self._deadline: float | None = None
        self._what = ""
        self._timeout_s = 0.0
        self._wake = threading.Event()
        threading.Thread(target=self._watch, name="collectives-watchdog", daemon=True).start()

    def arm(self, what: str, timeout_s: float, grace_s: float = 0.0) -> None:
        self._what, self._timeout_s = what, timeout_s
        self._deadline = time.monotonic() + timeout_s + grace_s
        faulthandler.dump_traceback_later(timeout_s + grace_s + BACKSTOP_S, exit=True, file=self.stream)
        self._wake.set()

    def disarm(self) -> None:
        self._deadline = None
        faulthandler.cancel_dump_traceback_later()

    def _watch(self) -> None:
        while True:
            deadline = self._deadline
            if deadline is None:
                self._wake.wait()
                self._wake.clear()
            elif time.monotonic() < deadline:
                self._wake.wait(timeout=max(0.01, deadline - time.monotonic()))
                self._wake.clear()
            else:
                self.stream.write(
                    f"\ncollectives SPMD: rank {self.rank}: {self._what} still running {self._timeout_s:g} s "
                    "after it started (--dist-timeout); stacks of all its threads follow, then it exits\n"
                )
                self.stream.flush()
                faulthandler.dump_traceback(file=self.stream, all_threads=True)
                self.exit(EXIT_HUNG)
                return


def lockstep_settings(current: Any) -> Any:
    """Hypothesis settings under which every rank's engine draws, shrinks and stops the same way: a fixed
    seed (derandomize, which also drops the example database), no timing-dependent decisions, and no
    explain phase, whose extra calls follow the lines each process traced (a rank that passes traces
    others than one that fails: seen once in CI, rank 0 printing n=124 for rank 1's failure at n=100).

    One bug per test: hunting for more goes on until ten seconds after the first, by each rank's clock
    (seen in CI: rank 0 stopped drawing before rank 1 and printed n=76 for rank 1's failure at n=100), and
    tells failures apart by where each rank raised, which differs between the rank that failed and the
    others."""
    from hypothesis import HealthCheck, Phase, settings

    suppressed = [*current.suppress_health_check, HealthCheck.too_slow]
    phases = [phase for phase in current.phases if phase != Phase.explain]
    return settings(
        current,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=suppressed,
        phases=phases,
        report_multiple_bugs=False,
    )


def _rank_context_class() -> type:
    from pytest_collectives.execution.ranks.context import RankContext

    @dataclasses.dataclass(repr=False)
    class SpmdRankContext(RankContext):
        """The ``pg`` of SPMD mode: the pooled ranks' API, with the node each rank runs on."""

        env: SpmdEnv | None = None

        def node_of(self, rank: int) -> int:
            return self.env.node_of(rank)  # type: ignore[union-attr]

    return SpmdRankContext


class SpmdLauncher:
    """The launcher when pytest runs as one process per rank; also a plugin for what only SPMD needs
    (rank 0 alone speaks, every rank collects the same tests, no rank is left behind at the end)."""

    survives_a_crash = False

    def __init__(self, config: pytest.Config, settings: options.Settings, env: SpmdEnv) -> None:
        self.config, self.settings, self.env = config, settings, env
        self.gate: Any = None  # rank 0's gate.baseline_gate.BaselineGate, handed over by hooks once it exists
        # The real stderr, kept now (pytest's capture is suspended during configure): while a test runs,
        # fd 2 goes to pytest's capture file, which a rank that exits on a hang never prints.
        self.stderr = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
        self.watchdog = Watchdog(env.rank, self.stderr)
        self._control: Any = None  # a gloo group for outcomes, whatever the tests' backend
        self._groups: dict[int, Any] = {}
        self._contexts: dict[int, Any] = {}
        self.device: Any = None
        self.stop: str | None = None  # why no test may run (rank 0's baseline error), the same on every rank

    # --- only rank 0 speaks ----------------------------------------------------------------------

    def pytest_configure(self, config: pytest.Config) -> None:
        if self.env.rank == 0:
            return
        # Called as this plugin is registered, before junitxml and pytest-benchmark read their options.
        for name in ("xmlpath", "benchmark_json", "benchmark_save", "resultlog"):
            if getattr(config.option, name, None):
                setattr(config.option, name, None)
        if getattr(config.option, "benchmark_autosave", False):
            config.option.benchmark_autosave = False

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if self.env.rank != 0 and reporter is not None:
            from _pytest.config import create_terminal_writer

            reporter._tw = create_terminal_writer(self.config, open(os.devnull, "w"))  # noqa: SIM115

    # --- one world, the same tests -----------------------------------------------------------------

    def _start(self) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        from pytest_collectives.execution.ranks.compat import bound_device

        env = self.env
        s = self.settings
        self.device = torch.device(s.device_type, env.local_rank) if s.gpus else torch.device("cpu")
        devices.select(self.device)
        joining = f"joining the process group at {env.master_addr}:{env.master_port}"
        self.watchdog.arm(joining, max(self.timeout, START_TIMEOUT_S))
        dist.init_process_group(
            self.settings.backend,
            init_method=f"tcp://{env.master_addr}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            # above every deadline of ours: the watchdog, with its stacks, ends a hang first
            timeout=datetime.timedelta(seconds=max(self.timeout, START_TIMEOUT_S) + 60.0),
            **bound_device(self.settings.backend, self.device),
        )
        self._control = (
            dist.new_group(backend="gloo") if self.settings.backend != "gloo" else dist.group.WORLD
        )
        self.watchdog.disarm()

    @property
    def timeout(self) -> float:
        return self.settings.timeout_s

    def _all_gather(self, obj: Any, what: str, timeout_s: float, grace_s: float = 0.0) -> list[Any]:
        import torch.distributed as dist

        self.watchdog.arm(what, timeout_s, grace_s)
        gathered: list[Any] = [None] * self.env.world_size
        try:
            dist.all_gather_object(gathered, obj, group=self._control)
        except Exception as exc:  # noqa: BLE001 - a peer died: this rank can't go on in lockstep
            self.stderr.write(
                f"\ncollectives SPMD: rank {self.env.rank}: lost the other ranks in {what}: {exc}\n"
            )
            faulthandler.dump_traceback(file=self.stderr, all_threads=True)
            os._exit(EXIT_HUNG)
        self.watchdog.disarm()
        return gathered

    def size_limit(self, metafunc: pytest.Metafunc) -> tuple[int | None, str]:
        world = self.env.world_size
        return world, f"the SPMD world has {world} ranks"

    def collected(self, items: list[pytest.Item]) -> None:
        pass  # the world is joined once the collections are final (pytest_collection_finish)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._start()
        ids = [item.nodeid for item in session.items]
        digest = hashlib.blake2b("\n".join(ids).encode(), digest_size=16).hexdigest()
        # Rank 0's gate has read the baseline by now (its hook runs first): a bad one stops every rank.
        gathered = self._all_gather(
            (digest, getattr(self.gate, "error", None)), "comparing the collected tests", START_TIMEOUT_S
        )
        if len({d for d, _ in gathered}) > 1:
            message = first_difference(
                self._all_gather(ids, "comparing the collected tests", START_TIMEOUT_S)
            )
            pytest.exit(f"collectives SPMD: {message}", returncode=pytest.ExitCode.USAGE_ERROR)
        self.stop = gathered[0][1]
        self._make_groups(session.items)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        return True if self.stop else None  # True: the tests do not run

    @pytest.hookimpl(tryfirst=True)  # before run.Run's: the node report reads the exit status it sets
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.stop:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    # --- running a test in lockstep ----------------------------------------------------------------

    @contextlib.contextmanager
    def hypothesis_settings(self, fn: Any) -> Iterator[None]:
        # Every rank runs its own engine; with the same seed and the same gathered verdicts they agree.
        with settings_changed(fn, lockstep_settings):
            yield

    def run(self, task: Task, test: Callable[..., Any]) -> GroupOutcome:
        """Run one call on the first n ranks and gather every rank's outcome, so all give the same verdict."""
        import torch.distributed.distributed_c10d as c10d

        n = task.world_size
        what = f"{task.nodeid} ({n} ranks)"
        report = None
        if self.env.rank < n:
            self.watchdog.arm(what, self.timeout)
            report = self._run_here(task, test)
        # Groups a test made on its ranks only advance their counter: all continue from the highest.
        gathered = self._all_gather((report, c10d._world.group_count), what, self.timeout, GATHER_GRACE_S)
        c10d._world.group_count = max(count for _, count in gathered)
        reports = [r for (r, _), _ in gathered[:n]]
        failed_at = {r.rank: at for (r, at), _ in gathered[:n] if r.status == FAILED}
        first = min(failed_at, key=failed_at.__getitem__) if failed_at else None
        outcome = GroupOutcome(reports, first, self.timeout)
        # A rank can't be swapped for a fresh one here: what can be put back is, and the test is told.
        outcome.restored = [f"rank {r.rank}: {why}" for r in reports for why in r.dirty]
        return outcome

    def _run_here(self, task: Task, test: Callable[..., Any]) -> tuple[RankReport, float]:
        """This rank's outcome and when it finished (the earliest failure is the likely cause)."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        from pytest_collectives.execution.ranks.calling import call_test, restore_defaults

        world = dist.group.WORLD
        c10d._world.default_pg = self._group(task.world_size)  # the test's collectives see n ranks
        try:
            result = call_test(task, self._context(task.world_size), lambda: test)
        finally:
            c10d._world.default_pg = world
        if result.dirty:
            restore_defaults(self.device)
        stdout, stderr = self._captured()
        report = RankReport.of(result, stdout=stdout, stderr=stderr, dirty=result.dirty)
        return report, time.time()

    def _make_groups(self, items: list[pytest.Item]) -> None:
        """The first n ranks as a group for every size n the tests need, made now by every rank of the
        world, in the same order: with a bound GPU (eager NCCL init) a subgroup is split from the world's
        communicator, which every rank must join; made later by its n ranks alone, it hangs or is refused."""
        import torch.distributed as dist

        for n in group_sizes_needed(items, self.env.world_size):
            self._groups[n] = dist.new_group(list(range(n)))

    def _group(self, n: int) -> Any:
        import torch.distributed as dist

        return dist.group.WORLD if n == self.env.world_size else self._groups[n]

    def _context(self, n: int) -> Any:
        if n not in self._contexts:
            cls = _rank_context_class()
            self._contexts[n] = cls(self.env.rank, n, self.settings.backend, self.device, 0, env=self.env)
        return self._contexts[n]

    def _captured(self) -> tuple[str, str]:
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        if capman is None or not capman.is_globally_capturing():
            return "", ""
        captured = capman.read_global_capture()
        return captured.out, captured.err

    def done_with(self, world_size: int, env: Env = ()) -> None:
        pass  # the ranks are the world's: none of them can stop before the session ends

    def summary(self) -> str:
        env = self.env
        nodes = env.world_size // env.local_world_size
        return f"SPMD mode ({env.launcher}), {env.world_size} ranks on {nodes} node(s)"

    def close(self) -> None:
        if self._control is None:
            return
        import torch.distributed as dist

        # No rank leaves before rank 0 has written its report: a launcher may kill the rest when one exits.
        self._all_gather(None, "the end of the session", START_TIMEOUT_S)
        dist.destroy_process_group()


def group_sizes_needed(items: list[pytest.Item], world: int) -> list[int]:
    """The sizes below the world of the groups the distributed tests among ``items`` run on, ascending."""
    sizes = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and item.get_closest_marker("world_size") is not None:
            sizes.add(callspec.params.get("world_size", world))
    return sorted(n for n in sizes if n < world)
