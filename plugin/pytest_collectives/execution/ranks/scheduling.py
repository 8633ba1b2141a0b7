"""How the kernel runs a rank: on a core of its own where ranks outnumber the cores, and in short slices."""

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
