"""The server the ranks fork from, which imports torch once. Nothing here imports torch: the server is
started while pytest collects, so its import runs beside the collection's own."""

from __future__ import annotations

import multiprocessing

PRELOAD = [
    "__main__", "torch", "torch.distributed", "pytest", "hypothesis", "pytest_collectives.execution.rank"
]  # fmt: skip


def forkserver_context(start_method: str = "forkserver") -> multiprocessing.context.BaseContext:
    """Workers fork from a server that has imported torch once: a group starts in a fraction of a second.

    ``spawn`` (a fresh interpreter per rank) is only for measuring what the pool saves.
    """
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def warm_up(ctx: multiprocessing.context.BaseContext) -> None:
    """Start the forkserver now so its torch import overlaps with collection."""
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()
