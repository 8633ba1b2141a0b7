"""A rank's process hygiene: it dies with its parent and with the controller, and its fd 1/2 are captured
per test into files the controller reads even after a kill."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import signal
import sys
import threading
import time
from pathlib import Path


def die_with_parent() -> None:
    # Our parent is the forkserver, which exits when pytest does: PDEATHSIG turns that into our end,
    # even if we are stuck in a collective and can't read the EOF on our pipe.
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(1)


def die_with_controller(pid: int, workdir: str) -> None:
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


class Capture:
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
