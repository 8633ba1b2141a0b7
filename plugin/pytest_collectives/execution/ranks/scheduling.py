"""How the kernel runs a rank: on a core of its own where ranks outnumber the cores, in short slices, and
its backend's event loops in the batch class."""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import struct
from collections.abc import Sequence

# The shortest slice the kernel takes (it clamps sched_runtime to 0.1-100 ms).
SLICE_NS = 100_000
_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}
# struct sched_attr as of Linux 3.14: size, policy, flags, nice, priority, runtime, deadline, period.
_SCHED_ATTR = struct.Struct("IIQiIQQQ")


def keep_to_core(cores: Sequence[int], rank: int) -> None:
    """Keep this process, rank ``rank``, to its core of ``cores`` (warm_groups.rank_cores; none if empty)."""
    if cores:
        with contextlib.suppress(OSError):  # a core taken away since (cgroups): only slower unpinned
            os.sched_setaffinity(0, {cores[rank]})


def short_slices() -> None:
    """Ask the kernel to run this process, and the threads and processes it starts after, in the shortest
    slice it grants (``sched_attr.sched_runtime`` of a SCHED_OTHER task, Linux 6.12 and later). Earlier
    kernels take the call and ignore the slice.

    A collective is a chain of wake-ups: a rank's thread hands the call to the backend's, whose socket
    wakes the peer's I/O thread, which wakes the peer's caller. Where a woken thread finds its core busy,
    EEVDF lets the running task finish its slice (1.4 ms on the 2-core machine) unless the woken one's is
    shorter. A rank's threads run for microseconds between wake-ups, so the short slice costs them
    nothing, and the conformance run took a tenth less (docs/measurements/plugin-overhead.md).
    """
    number = _SCHED_SETATTR.get(platform.machine())
    if number is None or os.sched_getscheduler(0) != os.SCHED_OTHER:
        return  # another policy was chosen for pytest: the ranks keep it
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    attr = ctypes.create_string_buffer(
        _SCHED_ATTR.pack(_SCHED_ATTR.size, os.SCHED_OTHER, 0, nice, 0, SLICE_NS, 0, 0)
    )
    with contextlib.suppress(OSError, AttributeError):  # no libc syscall(): a slower rank, nothing worse
        ctypes.CDLL(None, use_errno=True).syscall(number, 0, attr, 0)


# The backend threads that spin while another thread holds what they wait for: gloo's TCP event loop, one
# a group (its transport device), named by gloo.
SPINNING_LOOPS = frozenset({"gloo_tcp_loop"})


class LoopsYield:
    """Runs the backend's spinning event loops at ``SCHED_BATCH``, so that they never preempt on waking.

    gloo's loop thread polls its sockets level-triggered and, when a message arrives while a caller holds
    the pair's lock, leaves it unread and polls again at once: it spins until the holder releases the lock.
    Woken by the message, the loop could preempt the holder on its core, and spin there until the scheduler's
    next tick, 4 ms, gave the holder its core back; a test whose first collective met that paid it: after
    a gap between calls, a 1-element all_reduce at 2 ranks took 0.6 to 0.8 ms on average (95th percentile 3
    to 4 ms) against 0.3 (0.4) with the loop in the batch class, and back to back 0.16 to 0.32 against 0.08
    to 0.13 (docs/measurements/plugin-overhead.md). A batch thread waits for the running one to block or end
    its slice, and keeps its full share of the CPU otherwise: a killed rank's loop exits as promptly as any
    thread (``SCHED_IDLE``, which also yielded, left it waiting for a free core: a crash read as a hang).

    ``settle`` is called after the group starts and after each test; it looks for new loops (a subgroup's)
    only when the number of the process's threads changed, which costs a ``stat`` of ``/proc/self/task``.
    Loops of another class than ``SCHED_OTHER`` (chosen for pytest, and inherited) keep it.
    """

    def __init__(self) -> None:
        self._threads = 0

    def settle(self) -> None:
        with contextlib.suppress(OSError):  # no /proc (not Linux): the loops keep their class
            threads = os.stat("/proc/self/task").st_nlink
            if threads == self._threads:
                return
            self._threads = threads
            for tid in os.listdir("/proc/self/task"):
                with contextlib.suppress(OSError):  # a thread that ended since the listing
                    with open(f"/proc/self/task/{tid}/comm") as comm:
                        name = comm.read().strip()
                    if name in SPINNING_LOOPS and os.sched_getscheduler(int(tid)) == os.SCHED_OTHER:
                        os.sched_setscheduler(int(tid), os.SCHED_BATCH, os.sched_param(0))
