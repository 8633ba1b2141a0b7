"""Loading a test on a rank and calling it: the module imported with pytest's assertion rewriting, the rank
seeded, its ``pg`` and benchmark in place, the outcome classified, the rank's health checked after."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import os
import resource
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pytest_collectives import devices
from pytest_collectives.backend_declarations import left_inside_a_group_call
from pytest_collectives.bench.timing import BenchSpec, RankBenchmark
from pytest_collectives.execution import shared_inputs
from pytest_collectives.execution.examples import Tally, tallied
from pytest_collectives.execution.messages import (
    FAILED,
    PASSED,
    REJECTED,
    SKIPPED,
    RankResult,
    Task,
)
from pytest_collectives.execution.ranks import pending
from pytest_collectives.execution.ranks.compat import default_device
from pytest_collectives.execution.ranks.context import RankContext
from pytest_collectives.execution.ranks.hygiene import Capture


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
    left = pending.pending_ops()
    if left:
        reasons.append(f"the test left {left} async op(s) unfinished")
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
    pending.issued_work.clear()
    pending.raised_calls.clear()
    shared_inputs.next_test()
    ctx.begin(task.seed)
    ctx.reproductions, ctx.drafts = task.reproductions, {}
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
    raised = pending.unfit_after_raising(backend, pending.raised_calls) if backend else []
    # NCCL's group is replaced after a raise; another's is asked first (warm_groups.GroupPool._asked)
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
        failed=tally.failed,
        ended_at=tally.ended_at,
        turned_down=tally.turned_down,
        known=tally.known,
        refused=tally.refused,
        resume_at=tally.resume_at,
        drafts=ctx.drafts,
        known_failure=_outcome_of(known, known.__traceback__)[1] if (known := tally.known_error) else "",
        timeline=(start, start + duration),
    )


@contextlib.contextmanager
def _hypothesis_calls(noted: list[tuple[str, str, str]]) -> Any:
    """While an example runs here, hypothesis' note() and event() record into ``noted`` instead of raising
    "outside of a test": the engine's context is the controller's (hypothesis_calls.py replays them there)."""
    from hypothesis import control, reporting

    data = types.SimpleNamespace(events={}, provider=types.SimpleNamespace(avoid_realization=False))
    context = types.SimpleNamespace(is_final=True, data=data)  # note() records; the engine decides
    try:
        with control._current_build_context.with_value(context):
            with reporting.with_reporter(lambda text: noted.append(("note", str(text), ""))):
                yield
    finally:
        noted.extend(("event", str(value), str(payload)) for value, payload in data.events.items())


def run_task(task: Task, ctx: RankContext, capture: Capture, statm: int) -> RankResult:
    capture.reset()
    result = call_test(task, ctx, lambda: resolve_test(task))
    result.printed = capture.written()
    result.rss_bytes = resident_bytes(statm)  # the pool replaces a group whose ranks grew too much
    return result


def resident_bytes(statm: int) -> int:
    """This process's resident set, from its /proc statm file held open as ``statm``: opening the file
    for each test cost a rank 40 us of the 150 it spent outside the test (docs/measurements.md)."""
    return resource.getpagesize() * int(os.pread(statm, 128, 0).split()[1])
