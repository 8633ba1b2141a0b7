"""The rank side: joins a process group once, then runs the tests the controller names, one at a time.

A worker never decides its own fate: it reports each test's outcome and whether its group is still fit
for reuse, and the controller kills and replaces groups. Stacks for hung ranks come out of band
(faulthandler on SIGUSR1) because a rank stuck in a native wait cannot run Python to answer.

``COLLECTIVES_FAULT`` is used only by the plugin's own tests (tests/test_fault_campaign.py): set to
``rank:point:kind``, that rank does the fault at that point of its life. Points: ``init`` (before joining
the group; set it in pytest's environment before the group starts), ``between`` (after a result is sent,
before the next task) and ``teardown`` (when told to stop; set these two in the rank's own os.environ from
a test body). Kinds: ``hang``, ``raise``, ``exit[=N]``, ``sigkill``, ``segfault``, ``memory``.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import dataclasses
import datetime
import faulthandler
import functools
import importlib
import importlib.util
import inspect
import mmap
import os
import random
import resource
import select
import shutil
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from pytest_collectives import devices
from pytest_collectives.algorithms import registry
from pytest_collectives.backends import keeps_state_after_a_raise, left_inside_a_group_call
from pytest_collectives.bench.timing import BenchSpec, RankBenchmark
from pytest_collectives.execution import shared_inputs
from pytest_collectives.execution.examples import Tally, tallied
from pytest_collectives.execution.messages import (
    FAILED,
    PASSED,
    REJECTED,
    SKIPPED,
    GroupSpec,
    RankResult,
    Task,
    stable_seed_of,
)

STACK_SIGNAL = signal.SIGUSR1
PENDING_GRACE_S = 2.0  # NCCL work completes on the GPU a little after the host returns


def rank_files(workdir: str | Path, rank: int) -> dict[str, Path]:
    """Where a rank's stdout, stderr and stack dump land: the controller reads them even after a kill."""
    base = Path(workdir)
    return {kind: base / f"rank{rank}.{kind}" for kind in ("stdout", "stderr", "stack")}


def tasks_taken(workdir: str | Path, world_size: int) -> memoryview:
    """How many tasks each rank has taken, in a file that pytest and the ranks map: a rank counts each task
    as it takes it, and pytest reads the count only for a rank that died or hung (did it die in the test?),
    so no rank spends a message on it, nor pytest a wakeup. pytest creates the file, before the ranks."""
    fd = os.open(Path(workdir, "taken"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if not os.fstat(fd).st_size:
            os.ftruncate(fd, 8 * world_size)
        return memoryview(mmap.mmap(fd, 8 * world_size)).cast("q")
    finally:
        os.close(fd)


@dataclasses.dataclass(repr=False)
class RankContext:
    """What a distributed test receives as its ``pg`` fixture, on every rank."""

    rank: int
    world_size: int
    backend: str
    device: torch.device
    seed: int
    _subgroups: dict[tuple[int, ...], Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def group(self) -> dist.ProcessGroup:
        return dist.group.WORLD

    def new_group(self, ranks: list[int] | tuple[int, ...]) -> dist.ProcessGroup | None:
        """A subgroup of ``ranks``; every rank must call this with the same ranks (as with ``new_group``).

        Subgroups are cached for the life of the worker group: creating one is a collective rendezvous,
        far slower than the tests that use it. Ranks outside the subgroup get None.
        """
        key = tuple(sorted(set(ranks)))
        if key not in self._subgroups:
            self._subgroups[key] = dist.new_group(list(key))
        return self._subgroups[key] if self.rank in key else None

    def reseed(self, example: dict[str, Any]) -> None:
        """Seed this rank from one example's values, as a call with that example alone would be."""
        self.begin(stable_seed_of("", example))

    def begin(self, seed: int) -> None:
        """A test or example begins on this rank: seeded by ``seed``, with the inputs of an older one gone."""
        self.seed = seed
        seed_everything(seed)
        shared_inputs.next_example()

    def __repr__(self) -> str:
        return f"<pg rank {self.rank} of {self.world_size}, {self.backend} on {self.device}>"

    def node_of(self, rank: int) -> int:
        """The node that ``rank`` runs on: a pooled group is on this one (SPMD mode spans several)."""
        return 0

    def link(self, a: int, b: int) -> str:
        """How ranks a and b are connected, to label P2P results: "intra-node" or "inter-node"."""
        return "intra-node" if self.node_of(a) == self.node_of(b) else "inter-node"

    def generator(self, rank: int | None = None) -> torch.Generator:
        """A CPU generator seeded from this test's seed and ``rank``: any rank can rebuild another's data."""
        return torch.Generator().manual_seed(self.seed * 1009 + (self.rank if rank is None else rank))


# --- process hygiene ------------------------------------------------------------------------------


def _die_with_parent() -> None:
    # Our parent is the forkserver, which exits when pytest does: PDEATHSIG turns that into our end,
    # even if we are stuck in a collective and can't read the EOF on our pipe.
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(1)


def _die_with_controller(pid: int, workdir: str) -> None:
    """End this rank when the pytest process ``pid`` ends, however it ends, and remove the group's folder
    ``workdir`` (and the pool's, once no group's is left in it).

    The forkserver exits once every holder of its liveness pipe has closed it, and each process it forks
    inherits one (so it could use the forkserver itself): while a rank lives, a SIGKILLed pytest leaves
    the forkserver, and so the ranks and their GPUs, alive for ever. So the rank watches pytest itself.
    A pytest that ends that way removes nothing, so its folders go with the last of its ranks.
    """
    if not pid:
        return

    def end() -> None:
        shutil.rmtree(workdir, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(workdir))  # fails while another group's folder is in it
        os._exit(1)

    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        end()
    except (AttributeError, OSError):  # Linux before 5.3: look every second
        pidfd = None

    def watch() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])  # readable once the process has exited
        else:
            while os.path.exists(f"/proc/{pid}"):
                time.sleep(1.0)
        end()

    threading.Thread(target=watch, name="collectives-watch-pytest", daemon=True).start()


def _open_capture(path: Path) -> int:
    # O_APPEND: after a truncate, writes start again at offset 0 instead of leaving a hole.
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)


class _Capture:
    """Per-test capture of fd 1 and 2, so output from C++ (gloo, NCCL) is kept too."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.fds = {1: _open_capture(files["stdout"]), 2: _open_capture(files["stderr"])}
        for target, fd in self.fds.items():
            os.dup2(fd, target)

    def reset(self) -> None:
        self.flush()
        for fd in self.fds.values():
            if os.fstat(fd).st_size:  # most tests print nothing
                os.ftruncate(fd, 0)

    def written(self) -> bool:
        self.flush()
        return any(os.fstat(fd).st_size for fd in self.fds.values())

    @staticmethod
    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()


# --- tracking async ops a test left behind, and calls that raised --------------------------------

_ASYNC_OPS = (
    "isend", "irecv", "batch_isend_irecv", "all_reduce", "reduce", "broadcast", "all_gather",
    "all_gather_into_tensor", "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_single", "all_to_all",
    "all_to_all_single", "gather", "scatter", "barrier",
)  # fmt: skip
_issued_work: list[Any] = []
_raised_calls: list[str] = []
# A Work holds its tensors: a benchmark that keeps issuing them would keep every message it sent (a ring
# all_reduce of 1 MiB grew a rank by 2 GB), so the completed ones are dropped as the list doubles.
_KEPT_AT_LEAST = 256
_prune_at = _KEPT_AT_LEAST


def _remember(works: list[Any]) -> None:
    """Keep ``works`` until the test ends, or until they are completed, for ``_pending_ops``."""
    global _prune_at
    _issued_work.extend(works)
    if len(_issued_work) >= _prune_at:
        _issued_work[:] = [w for w in _issued_work if not w.is_completed()]
        _prune_at = max(_KEPT_AT_LEAST, 2 * len(_issued_work))


def _track_async_ops() -> None:
    """Wrap torch.distributed's async entry points to remember the Work objects they hand out, and which
    of them raised."""

    def tracked(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                result = fn(*args, **kwargs)
            except Exception:
                _raised_calls.append(fn.__name__)
                raise
            works = result if isinstance(result, list) else [result]
            _remember([w for w in works if hasattr(w, "is_completed")])
            return result

        return wrapper

    # Both namespaces get the same wrapper: c10d checks P2POp ops by identity against its own globals.
    for name in _ASYNC_OPS:
        if hasattr(c10d, name):
            wrapped = tracked(getattr(c10d, name))
            setattr(c10d, name, wrapped)
            setattr(dist, name, wrapped)


def unfit_after_raising(backend: str, raised: list[str]) -> list[str]:
    """Why a rank whose calls raised may not be trusted with the next test (backends.py: NCCL can be left
    inside a group call, every later call taken and none run, and the next new_group hangs)."""
    if not raised or not keeps_state_after_a_raise(backend):
        return []
    calls = ", ".join(sorted(set(raised)))
    return [f"{calls} raised on {backend}, which can leave a backend inside a group call"]


def probe_group(pg: Any) -> None:
    """The group's own answer to whether a raise left it unfit (pool.GroupPool.run): one all_reduce on the
    thread the tests run on, checked. A group left inside a group call takes it and moves nothing."""
    t = torch.ones(1, device=pg.device)
    dist.all_reduce(t)
    assert t.item() == pg.world_size, f"the all_reduce of ones over {pg.world_size} ranks gave {t.item()}"


def _pending_ops() -> int:
    deadline = time.monotonic() + PENDING_GRACE_S
    while True:
        pending = [w for w in _issued_work if not w.is_completed()]
        if not pending or time.monotonic() > deadline:
            return len(pending)
        time.sleep(0.01)


# --- loading and calling the test -----------------------------------------------------------------


def _load_module(name: str, path: str) -> types.ModuleType:
    """Import the test module as pytest did, with pytest's assertion rewriting so failures show values."""
    if name in sys.modules:
        return sys.modules[name]
    try:
        from _pytest.assertion.rewrite import rewrite_asserts

        source = Path(path).read_bytes()
        tree = ast.parse(source, filename=path)
        rewrite_asserts(tree, source, Path(path), None)
        code = compile(tree, path, "exec", dont_inherit=True)
    except Exception:
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def resolve_test(task: Task) -> Callable[..., Any]:
    if task.sys_path != sys.path:
        sys.path[:] = task.sys_path
    obj: Any = _load_module(task.module, task.path)
    owner = None
    for part in task.qualname.split("."):
        obj = getattr(obj, part)
        if isinstance(obj, type):
            owner = obj = obj()  # a test class: pytest calls methods on a fresh instance
    if task.hypothesis_inner:
        inner = obj.hypothesis.inner_test
        return inner if owner is None else functools.partial(inner, owner)
    return obj


def seed_everything(seed: int) -> None:
    random.seed(seed)
    # torch.manual_seed visits every device's generator: 160 us a call, most of an empty test's dispatch
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)


def _outcome_of(exc: BaseException, tb: types.TracebackType | None) -> tuple[str, str]:
    import pytest

    if isinstance(exc, pytest.skip.Exception):
        return SKIPPED, str(exc.msg)
    if type(exc).__name__ == "UnsatisfiedAssumption":  # hypothesis' assume(): the engine decides, not us
        return SKIPPED, REJECTED
    return FAILED, "".join(traceback.format_exception(type(exc), exc, _without_harness(tb)))


def _without_harness(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the test's frame on, without this module's frames (the op-tracking wrappers)."""
    frames = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != __file__:
            frames.append(tb)
        tb = tb.tb_next
    head = None
    for frame in reversed(frames):
        head = types.TracebackType(head, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return head


def health(world_size: int, device: torch.device) -> list[str]:
    """Reasons this rank can't run the next test as it is; empty when it is fit for reuse."""
    reasons = []
    if not dist.is_initialized():
        return ["the test destroyed the default process group"]
    if dist.get_world_size() != world_size:
        reasons.append("the default process group was replaced")
    pending = _pending_ops()
    if pending:
        reasons.append(f"the test left {pending} async op(s) unfinished")
    if default_device() != torch.device("cpu"):
        reasons.append(f"the test changed the default device to {default_device()}")
    if torch.get_default_dtype() != torch.float32:
        reasons.append(f"the test changed the default dtype to {torch.get_default_dtype()}")
    current = devices.current_index(device)
    if current not in (None, device.index):
        reasons.append(f"the test changed the current {device.type} device to {current}")
    return reasons


def restore_defaults(device: torch.device) -> None:
    """Put back what a test may change for the tests after it on this process: default dtype and device,
    current GPU. (A destroyed group or an op left in flight can't be put back.)"""
    torch.set_default_dtype(torch.float32)
    torch.set_default_device(None)
    devices.select(device)


def call_test(task: Task, ctx: RankContext, test: Callable[[], Callable[..., Any]]) -> RankResult:
    """Run one test (or hypothesis example) on this rank, in either mode: seed, the rank's ``pg`` and
    benchmark in place of the controller's, the call, its outcome, and whether the rank is still fit.

    ``test`` returns the function to call, so that failing to import it is the test's failure too."""
    _issued_work.clear()
    _raised_calls.clear()
    shared_inputs.next_test()
    ctx.begin(task.seed)
    start = time.perf_counter()
    bench = None
    kwargs = dict(task.kwargs)
    if "pg" in kwargs:
        kwargs["pg"] = ctx
    if isinstance(kwargs.get("benchmark"), BenchSpec):
        bench = kwargs["benchmark"] = RankBenchmark(kwargs["benchmark"], ctx.device)
    returned = None
    noted: list[tuple[str, str, str]] = []
    tally = Tally(expected=task.expected)
    try:
        fn = test()  # imported outside the example's context: a module's @given must not see one
        with (
            _hypothesis_calls(noted) if task.hypothesis_inner else contextlib.nullcontext(),
            tallied(tally),
        ):
            returned = fn(**kwargs)
        outcome, longrepr = PASSED, ""
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - every outcome, skips included, goes back to pytest
        outcome, longrepr = _outcome_of(exc, exc.__traceback__)
    duration = time.perf_counter() - start
    devices.empty_cache(ctx.device)
    dirty = health(ctx.world_size, ctx.device)
    backend = dist.get_backend() if dist.is_initialized() else ""
    raised = unfit_after_raising(backend, _raised_calls) if backend else []
    # NCCL's group is replaced after a raise; another's is asked first (pool.GroupPool._asked)
    dirty, suspect = (dirty + raised, []) if left_inside_a_group_call(backend) else (dirty, raised)
    benchmark = bench and bench.result()
    return RankResult(
        ctx.rank,
        outcome,
        longrepr,
        duration,
        dirty,
        suspect,
        benchmark=benchmark,
        returned=returned,
        noted=noted,
        examples=tally.ran or 1,
        failed_example=tally.failed_example,
        turned_down=tally.turned_down,
        known=tally.known,
        refused=tally.refused,
        resume_at=tally.resume_at,
        known_failure=_outcome_of(known, known.__traceback__)[1] if (known := tally.known_error) else "",
        timeline=(start, start + duration),
    )


@contextlib.contextmanager
def _hypothesis_calls(noted: list[tuple[str, str, str]]) -> Any:
    """While an example runs here, hypothesis' note() and event() record into ``noted`` instead of raising
    "outside of a test": the engine's context is the controller's (session.py replays them there)."""
    from hypothesis import control, reporting

    data = types.SimpleNamespace(events={}, provider=types.SimpleNamespace(avoid_realization=False))
    context = types.SimpleNamespace(is_final=True, data=data)  # note() records; the engine decides
    try:
        with control._current_build_context.with_value(context):
            with reporting.with_reporter(lambda text: noted.append(("note", str(text), ""))):
                yield
    finally:
        noted.extend(("event", str(value), str(payload)) for value, payload in data.events.items())


def run_task(task: Task, ctx: RankContext, capture: _Capture, statm: int) -> RankResult:
    capture.reset()
    result = call_test(task, ctx, lambda: resolve_test(task))
    result.printed = capture.written()
    result.rss_bytes = resident_bytes(statm)  # the pool replaces a group whose ranks grew too much
    return result


def keep_to_core(cores: Sequence[int], rank: int) -> None:
    """Keep this process, rank ``rank``, to its core of ``cores`` (``pool.rank_cores``; none if empty)."""
    if cores:
        with contextlib.suppress(OSError):  # a core taken away since (cgroups): only slower unpinned
            os.sched_setaffinity(0, {cores[rank]})


def resident_bytes(statm: int) -> int:
    """This process's resident set, from its /proc statm file held open as ``statm``: opening the file
    for each test cost a rank 40 us of the 150 it spent outside the test (docs/measurements.md)."""
    return resource.getpagesize() * int(os.pread(statm, 128, 0).split()[1])


# --- test-only fault injection (COLLECTIVES_FAULT, see the module docstring) -------------------------

FAULT_ENV = "COLLECTIVES_FAULT"


def inject_fault(point: str, rank: int) -> None:
    """Do the fault $COLLECTIVES_FAULT names if it names this rank and point; once (it is then unset)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    fault_rank, fault_point, kind = spec.split(":", 2)
    if int(fault_rank) != rank or fault_point != point:
        return
    del os.environ[FAULT_ENV]
    kind, _, arg = kind.partition("=")
    if kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "raise":
        raise RuntimeError(f"injected fault: rank {rank} raised at {point}")
    elif kind == "exit":
        os._exit(int(arg or 3))
    elif kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "segfault":
        ctypes.string_at(0)
    elif kind == "memory":
        # A cap just above what the process maps now: the MemoryError comes in milliseconds, and never
        # from the machine running out of memory.
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        mapped = os.sysconf("SC_PAGE_SIZE") * int(Path("/proc/self/statm").read_text().split()[0])
        resource.setrlimit(resource.RLIMIT_AS, (mapped + (256 << 20), hard))
        try:
            hog = []
            while True:
                hog.append(bytearray(32 << 20))
        finally:
            hog = []
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    else:
        raise ValueError(f"{FAULT_ENV}={spec}: unknown fault kind {kind!r}")


# --- the worker's life ----------------------------------------------------------------------------


# --- what older torch lacks (the floor in pyproject.toml is older than these) ---------------------------


def default_device() -> torch.device:
    """torch.get_default_device (torch 2.3); before it, where a new tensor lands."""
    getter = getattr(torch, "get_default_device", None)
    return getter() if getter is not None else torch.empty(()).device


def bound_device(backend: str, device: torch.device) -> dict[str, Any]:
    """init_process_group's device_id for NCCL (torch 2.3): eager init, so a broken GPU fails at start
    rather than mid-test. Older torch initialises lazily: nothing to pass."""
    if backend != "nccl" or "device_id" not in inspect.signature(dist.init_process_group).parameters:
        return {}
    return {"device_id": device}


def _init_process_group(spec: GroupSpec, rank: int, device: torch.device) -> None:
    store = dist.FileStore(spec.store_path, spec.world_size)
    dist.init_process_group(
        spec.backend,
        store=store,
        rank=rank,
        world_size=spec.world_size,
        timeout=datetime.timedelta(seconds=spec.timeout_s),
        **bound_device(spec.backend, device),
    )


def worker_main(spec: GroupSpec, rank: int, conn: Connection) -> None:
    """Entry point of one rank (run in a process forked from the preloaded forkserver)."""
    _die_with_parent()
    _die_with_controller(spec.controller_pid, spec.workdir)
    files = rank_files(spec.workdir, rank)
    capture = _Capture(files)
    statm = os.open("/proc/self/statm", os.O_RDONLY)
    taken = tasks_taken(spec.workdir, spec.world_size)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(STACK_SIGNAL, file=open(files["stack"], "w"), all_threads=True)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(spec.env)
    # Local groups talk over loopback only.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ["NCCL_SOCKET_IFNAME"] = "lo"
    if spec.devices and spec.device_type == "cuda":
        # Before CUDA initialises: the group sees exactly its GPUs, rank r drives cuda:r.
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(spec.devices)
        device = torch.device("cuda", rank)
    elif spec.devices:
        device = torch.device(spec.device_type, int(spec.devices[rank]))
    else:
        device = torch.device("cpu")
    devices.select(device)
    keep_to_core(spec.cores, rank)  # before torch and the backend start their threads, which inherit it
    torch.set_num_threads(spec.threads_per_rank)
    _track_async_ops()
    ctx = RankContext(rank, spec.world_size, spec.backend, device, seed=0)
    inject_fault("init", rank)
    if spec.modules or spec.algorithms:
        sys.path[:] = spec.sys_path
        for module in spec.modules:  # a third-party backend registers itself when imported
            importlib.import_module(module)
        registry.load(spec.algorithms)  # users' algorithms, found by name in the tests
    try:
        _init_process_group(spec, rank, device)
    except Exception:  # noqa: BLE001 - the backend would not start: its words go to the controller
        conn.send(("refused", traceback.format_exc()))
        os._exit(1)
    shared_inputs.share_in(os.path.join(spec.workdir, "inputs"))  # the group's ranks share one machine
    conn.send(("ready", rank))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            break  # the controller is gone
        if task is None:
            inject_fault("teardown", rank)
            break
        took = time.perf_counter()
        taken[rank] += 1  # a rank that dies before this did not die in the test
        result = run_task(task, ctx, capture, statm)
        result.timeline = (took, *result.timeline, time.perf_counter())
        conn.send(("result", result))
        inject_fault("between", rank)
    os._exit(0)  # skip interpreter teardown: torch's atexit hooks can block on a broken group
