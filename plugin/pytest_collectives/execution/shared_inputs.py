"""A large input drawn once per group and read by the other ranks, not drawn again on each of them.

Every rank checks its own result against the exact reference, and the reference needs every member's input:
drawn on each rank from the shared seed, an example of n ranks draws n x n inputs. At 8 ranks on 2 cores
that was most of a large example's time (drawing 1 Mi float32 elements takes about 10 ms, gloo's whole
all_reduce of them 22 ms). Here the first rank of a pooled group to need an input draws it and leaves a copy
in the group's folder; the others read the copy. A copy is named by everything that determines it
(``reference.rank_input`` is a pure function of them), so it can never be stale: a rank that finds none
draws its own, as a rank with no folder always does (SPMD mode, ranks on several nodes; a test run outside
a pooled group). The checks stay each rank's own: only the drawing is shared, never a result.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

MIN_ELEMENTS = 1 << 14  # below this, drawing costs less than a file's round trip
# A rank keeps the copies it wrote for the example it is in and the one before: a peer still checking an
# example is at most one behind, since the next example's calls wait for it (one that is later anyway
# draws its own).
KEEP = 2

_folder: Path | None = None
_written: collections.deque[list[Path]] = collections.deque([[]])


def share_in(folder: str | os.PathLike[str] | None) -> None:
    """Share this rank's large inputs through ``folder`` (one per group, on the group's machine); None:
    draw every input here."""
    global _folder
    _folder = None if folder is None else Path(folder)
    if _folder is not None:
        _folder.mkdir(parents=True, exist_ok=True)


def next_example() -> None:
    """A new example begins on this rank: the copies it wrote KEEP examples ago go."""
    _written.append([])
    while len(_written) > KEEP:
        for path in _written.popleft():
            with contextlib.suppress(OSError):
                path.unlink()


def next_test() -> None:
    """A new test begins on this rank: every rank has ended the last one, so every copy this rank wrote
    goes (a group's last copies stay until it stops, with its folder)."""
    for _ in range(KEEP):
        next_example()


def drawn(
    key: tuple[object, ...], shape: tuple[int, ...], dtype: torch.dtype, draw: Callable[[], torch.Tensor]
) -> torch.Tensor:
    """``draw()``, a ``shape`` tensor of ``dtype`` that ``key`` and they determine, read from the group's
    copy where a rank has drawn it already."""
    if _folder is None or math.prod(shape) < MIN_ELEMENTS:
        return draw()  # before the name: most inputs are small, and this is every example's path
    path = _folder / "-".join(map(str, (*key, "x".join(map(str, shape)), dtype)))
    try:
        copy = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below
    except FileNotFoundError:
        pass
    else:
        with copy:
            tensor = torch.empty(shape, dtype=dtype)
            if copy.readinto(_bytes(tensor)) == tensor.nbytes:
                return tensor
    tensor = draw()
    _write(path, tensor)
    return tensor


def _bytes(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def _write(path: Path, tensor: torch.Tensor) -> None:
    """Leave a copy of ``tensor`` at ``path``, whole or not at all: a full disk costs the peers a draw.

    Not ``atomic.write_atomic``: a copy read within its example and removed after it needs none of the
    durability its fsyncs buy, on every large example's path, nor its copy of the tensor into bytes."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with open(partial, "wb") as f:
            f.write(_bytes(tensor.contiguous()))
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()
        return
    _written[-1].append(path)
