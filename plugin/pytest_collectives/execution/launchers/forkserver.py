"""The server the ranks fork from, which imports torch once. Nothing here imports torch: the server is
started while pytest collects, so its import runs beside the collection's own."""

from __future__ import annotations

import multiprocessing
import tempfile

import pytest

PRELOAD = [
    "__main__", "torch", "torch.distributed", "pytest", "hypothesis",
    "pytest_collectives.execution.ranks.worker",
]  # fmt: skip
# What a test of the training stacks imports on every rank (conformance/training/stacks.py's _APIS), and
# torch._dynamo, which DTensor imports on its first distribute_tensor: each half a second a rank on 2 cores,
# where 2 to 8 ranks start 35 processes. Only for sessions that run them: the first group of any other
# session would wait for it.
TRAINING = [
    "torch.distributed.tensor", "torch.distributed.tensor.parallel", "torch.distributed.fsdp",
    "torch.distributed._functional_collectives", "torch._dynamo",
]  # fmt: skip


def forkserver_context(start_method: str = "forkserver") -> multiprocessing.context.BaseContext:
    """Workers fork from a server that has imported torch once: a group starts in a fraction of a second.

    ``spawn`` (a fresh interpreter per rank) is only for measuring what the pool saves.
    """
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def warm_up(ctx: multiprocessing.context.BaseContext, training: bool = False) -> None:
    """Start the forkserver now so its torch import overlaps with collection; with ``training``, the
    training stacks' modules too (once a server runs, its imports are settled)."""
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        ctx.set_forkserver_preload(PRELOAD + TRAINING * training)
        try:
            forkserver.ensure_running()
        except OSError as exc:
            if "too long" not in str(exc):
                raise
            # its socket goes in TMPDIR, and a Unix socket's path cannot pass 107 bytes
            raise pytest.UsageError(
                f"TMPDIR is too long a path for the forkserver's socket ({len(tempfile.gettempdir())} "
                "characters): set TMPDIR to a shorter folder, such as /tmp"
            ) from None
