"""Async work a test issued and left pending, and the calls that raised: what decides whether a rank may be
trusted with the next test."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from pytest_collectives.backend_declarations import keeps_state_after_a_raise

PENDING_GRACE_S = 2.0  # NCCL work completes on the GPU a little after the host returns


_ASYNC_OPS = (
    "isend", "irecv", "batch_isend_irecv", "all_reduce", "reduce", "broadcast", "all_gather",
    "all_gather_into_tensor", "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_single", "all_to_all",
    "all_to_all_single", "gather", "scatter", "barrier",
)  # fmt: skip
issued_work: list[Any] = []
raised_calls: list[str] = []
# A Work holds its tensors: a benchmark that keeps issuing them would keep every message it sent (a ring
# all_reduce of 1 MiB grew a rank by 2 GB), so the completed ones are dropped as the list doubles.
_KEPT_AT_LEAST = 256
_prune_at = _KEPT_AT_LEAST


def _remember(works: list[Any]) -> None:
    """Keep ``works`` until the test ends, or until they are completed, for ``pending_ops``."""
    global _prune_at
    issued_work.extend(works)
    if len(issued_work) >= _prune_at:
        issued_work[:] = [w for w in issued_work if not w.is_completed()]
        _prune_at = max(_KEPT_AT_LEAST, 2 * len(issued_work))


def track_async_ops() -> None:
    """Wrap torch.distributed's async entry points to remember the Work objects they hand out, and which
    of them raised."""

    def tracked(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                result = fn(*args, **kwargs)
            except Exception:
                raised_calls.append(fn.__name__)
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
    """Why a rank whose calls raised may not be trusted with the next test (backend_declarations.py: NCCL can
    be left inside a group call, every later call taken and none run, and the next new_group hangs)."""
    if not raised or not keeps_state_after_a_raise(backend):
        return []
    calls = ", ".join(sorted(set(raised)))
    return [f"{calls} raised on {backend}, which can leave a backend inside a group call"]


def probe_group(pg: Any) -> None:
    """The group's own answer to whether a raise left it unfit (warm_groups.GroupPool.run): one all_reduce on
    the thread the tests run on, checked. A group left inside a group call takes it and moves nothing."""
    t = torch.ones(1, device=pg.device)
    dist.all_reduce(t)
    assert t.item() == pg.world_size, f"the all_reduce of ones over {pg.world_size} ranks gave {t.item()}"


def pending_ops() -> int:
    deadline = time.monotonic() + PENDING_GRACE_S
    while True:
        pending = [w for w in issued_work if not w.is_completed()]
        if not pending or time.monotonic() > deadline:
            return len(pending)
        time.sleep(0.01)
