"""The rank side: joins a process group once, then runs the tests the controller names, one at a time.

A worker never decides its own fate: it reports each test's outcome and whether its group is still fit
for reuse, and the controller kills and replaces groups. Stacks for hung ranks come out of band
(faulthandler on SIGUSR1) because a rank stuck in a native wait cannot run Python to answer."""

from __future__ import annotations

import datetime
import faulthandler
import importlib
import importlib.util
import os
import sys
import time
import traceback
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from pytest_collectives import devices
from pytest_collectives.algorithms import registry
from pytest_collectives.execution import shared_inputs
from pytest_collectives.execution.messages import (
    GroupSpec,
)
from pytest_collectives.execution.ranks.calling import run_task
from pytest_collectives.execution.ranks.compat import bound_device
from pytest_collectives.execution.ranks.context import STACK_SIGNAL, RankContext, rank_files, tasks_taken
from pytest_collectives.execution.ranks.faults import inject_fault
from pytest_collectives.execution.ranks.hygiene import Capture, die_with_controller, die_with_parent
from pytest_collectives.execution.ranks.pending import track_async_ops
from pytest_collectives.execution.ranks.scheduling import LoopsYield, keep_to_core, short_slices


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
    # before this rank, torch and the backend start threads, which inherit both
    keep_to_core(spec.cores, rank)
    short_slices()
    die_with_parent()
    die_with_controller(spec.controller_pid, spec.workdir)
    files = rank_files(spec.workdir, rank)
    capture = Capture(files)
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
    torch.set_num_threads(spec.threads_per_rank)
    track_async_ops()
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
    loops = LoopsYield()
    loops.settle()
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
        loops.settle()
        inject_fault("between", rank)
    os._exit(0)  # skip interpreter teardown: torch's atexit hooks can block on a broken group
