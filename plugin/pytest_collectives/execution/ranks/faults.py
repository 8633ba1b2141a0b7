"""``COLLECTIVES_FAULT`` is used only by the plugin's own tests (tests/test_fault_campaign.py): set to
``rank:point:kind``, that rank does the fault at that point of its life. Points: ``init`` (before joining
the group; set it in pytest's environment before the group starts), ``between`` (after a result is sent,
before the next task) and ``teardown`` (when told to stop; set these two in the rank's own os.environ from
a test body). Kinds: ``hang``, ``raise``, ``exit[=N]``, ``sigkill``, ``segfault``, ``memory``.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import time
from pathlib import Path

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
