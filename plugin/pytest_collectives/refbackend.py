"""Reference backends written in Python, for trying the conformance suites on a backend that is not gloo
or NCCL, and for planting bugs in one (tests/support/mutant_backends.py).

``refgloo``: a ``dist.ProcessGroup`` subclass that hands every call a Python process group may override to
a gloo group of its own. Calls it can't override (reduce, gather, scatter and the single-tensor
all-gather and reduce-scatter on this torch) are refused by c10d, and the probe reports them N/A, as it
would for any backend that lacks them.

``refgloo_nccl_rules``: the same, refusing what NCCL refuses, with NCCL's words: bitwise reduce ops
("Cannot use ReduceOp.BAND with NCCL"). The conformance suites must run green on it, those rows N/A: the
CPU proof that ``pytest --gpus 8 suites/`` can pass on healthy GPUs.

    pytest suites/conformance --backend-module pytest_collectives.refbackend --backend refgloo
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch._C._distributed_c10d as _options  # every op's options (torch.distributed lacks some)
import torch.distributed as dist

from pytest_collectives.backend_declarations import declare, refuses

__all__ = ["NcclRulesBackend", "ReferenceBackend", "register"]

_BITWISE = {dist.ReduceOp.BAND: "BAND", dist.ReduceOp.BOR: "BOR", dist.ReduceOp.BXOR: "BXOR"}


class ReferenceBackend(dist.ProcessGroup):
    """Every call a Python process group can make, made by a gloo group of the same ranks. (torch 2.2
    calls some of them without options: each has its defaults.)"""

    name = "refgloo"
    refusals: tuple[str, ...] = ()  # what it refuses in its own words, besides gloo's

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self.inner = dist.ProcessGroupGloo(dist.PrefixStore("refgloo", store), rank, size, timeout)

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return self.name

    def refuse(self, opts: Any) -> None:
        """Raise what this backend says for a reduce op it does not implement; nothing by default."""

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        opts = opts or _options.AllreduceOptions()
        self.refuse(opts)
        return self.inner.allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        opts = opts or _options.AllreduceCoalescedOptions()
        self.refuse(opts)
        return self.inner.allreduce_coalesced(tensors, opts)

    def reduce_scatter(self, outputs: list[Any], inputs: list[list[Any]], opts: Any = None) -> dist.Work:
        opts = opts or _options.ReduceScatterOptions()
        self.refuse(opts)
        return self.inner.reduce_scatter(outputs, inputs, opts)

    def broadcast(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        return self.inner.broadcast(tensors, opts or _options.BroadcastOptions())

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        return self.inner.allgather(outputs, inputs, opts or _options.AllgatherOptions())

    def alltoall_base(
        self, output: Any, input: Any, out_splits: list[int], in_splits: list[int], opts: Any = None
    ):
        return self.inner.alltoall_base(
            output, input, out_splits, in_splits, opts or _options.AllToAllOptions()
        )

    def alltoall(self, outputs: list[Any], inputs: list[Any], opts: Any = None) -> dist.Work:
        return self.inner.alltoall(outputs, inputs, opts or _options.AllToAllOptions())

    def barrier(self, opts: Any = None) -> dist.Work:
        return self.inner.barrier(opts or _options.BarrierOptions())

    def send(self, tensors: list[Any], dst: int, tag: int) -> dist.Work:
        return self.inner.send(tensors, dst, tag)

    def recv(self, tensors: list[Any], src: int, tag: int) -> dist.Work:
        return self.inner.recv(tensors, src, tag)

    def recv_anysource(self, tensors: list[Any], tag: int) -> dist.Work:
        return self.inner.recv_anysource(tensors, tag)


class NcclRulesBackend(ReferenceBackend):
    """The reference backend refusing what NCCL refuses, in NCCL's words."""

    name = "refgloo_nccl_rules"
    refusals = (r"Cannot use ReduceOp\.(BAND|BOR|BXOR) with NCCL",)

    def recv_anysource(self, tensors: list[Any], tag: int) -> dist.Work:
        # ProcessGroupNCCL leaves c10d's Backend::recvAnysource as it is, which refuses so
        raise RuntimeError("Backend NCCL does not support recvAnysource")

    def refuse(self, opts: Any) -> None:
        op = getattr(opts, "reduceOp", None)
        for bitwise, name in _BITWISE.items():
            if op == bitwise:
                raise ValueError(f"Cannot use ReduceOp.{name} with NCCL")


def register(*backends: type[ReferenceBackend]) -> None:
    """Register each class under its ``name`` for CPU tensors (again on re-import: a no-op then), with
    what it refuses: gloo's words and its own."""
    for backend in backends:
        refuses(backend.name, *backend.refusals, like="gloo")
        declare(backend.name, version=f"the reference backend, gloo of torch {torch.__version__}")
        if backend.name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(backend.name, backend, devices=["cpu"])


register(ReferenceBackend, NcclRulesBackend)
