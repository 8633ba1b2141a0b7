"""Backends that are wrong on purpose: the reference backend (pytest_collectives.refbackend)
with one real-world-shaped bug each, registered as ``mutant_<name>``. tests/test_capabilities.py runs the
conformance suites on each and expects the bug caught, with a minimal example naming the operation; or,
for the two that the suites must survive (a refusal that leaves a group call open, NaN skipped by MIN and
MAX alike on every rank), the suites passing and the semantics reported."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import torch
import torch._C._distributed_c10d as _options  # every op's options (torch.distributed lacks some)
import torch.distributed as dist

from pytest_collectives import backend_env_preset, complement, declare, refuses
from pytest_collectives.refbackend import NcclRulesBackend, ReferenceBackend, register


class GatherPermutesRanks(ReferenceBackend):
    """all_gather hands every part back, in the wrong order (gloo's gather bug, pytorch PR 158903)."""

    name = "mutant_gather_permutes_ranks"

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        work = super().allgather(outputs, inputs, opts)
        work.wait()
        parts = outputs[0]
        if len(parts) > 1 and parts[0].numel():
            saved = [p.clone() for p in parts]
            for i, part in enumerate(parts):
                part.copy_(saved[(i + 1) % len(parts)])
        return work


class UnevenAllToAllOffByOne(ReferenceBackend):
    """all_to_all_single with uneven splits writes every received element one place early."""

    name = "mutant_uneven_all_to_all_off_by_one"

    def alltoall_base(
        self, output: Any, input: Any, out_splits: list[int], in_splits: list[int], opts: Any = None
    ):
        work = super().alltoall_base(output, input, out_splits, in_splits, opts)
        work.wait()
        if len(set(out_splits)) > 1 and output.numel() > 1:
            output[:-1] = output[1:].clone()
        return work


class BroadcastFromRankZero(ReferenceBackend):
    """broadcast from a non-zero root sends rank 0's tensor instead."""

    name = "mutant_broadcast_ignores_root"

    def broadcast(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        opts = opts or _options.BroadcastOptions()
        opts.rootRank = 0
        return super().broadcast(tensors, opts)


class Bf16TailUnreduced(ReferenceBackend):
    """all_reduce of bfloat16 leaves the last element as this rank's own (NCCL issue 1950's shape)."""

    name = "mutant_bf16_tail_unreduced"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        if tensors[0].dtype == torch.bfloat16 and tensors[0].numel() > 1:
            return super().allreduce([tensors[0].view(-1)[:-1]], opts)
        return super().allreduce(tensors, opts)


class LastElementWrongInEveryDtype(ReferenceBackend):
    """all_reduce's last element comes back as its bits inverted (a bool negated), in every dtype and
    reduce op: a bug of the whole call, whose scope the matrix must show cell by cell."""

    name = "mutant_last_element_wrong_in_every_dtype"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        work = super().allreduce(tensors, opts)
        work.wait()
        tail = tensors[0].view(-1)[-1:]
        tail.copy_(complement(tail))
        return work


class WritesThenRefusesChannelsLast(ReferenceBackend):
    """all_reduce of a non-contiguous tensor zeroes it, then refuses the layout in NCCL's words: a refusal
    that has already changed the caller's tensor, which read as N/A."""

    name = "mutant_writes_then_refuses_channels_last"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        if not tensors[0].is_contiguous():
            tensors[0].zero_()
            raise RuntimeError("Tensors must be contiguous")
        return super().allreduce(tensors, opts)


class StorageOffsetIgnored(ReferenceBackend):
    """broadcast reads and writes a view as if it began at the start of its storage."""

    name = "mutant_storage_offset_ignored"

    def broadcast(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        t = tensors[0]
        return super().broadcast([t.as_strided(t.shape, t.stride(), 0)], opts)


class ReceivedAtTheStorageStart(ReferenceBackend):
    """recv into a view at a storage offset (a slice of a flat buffer, as the registered algorithms pass)
    lands the data at the storage's start."""

    name = "mutant_received_at_the_storage_start"

    def recv(self, tensors: list[Any], src: int, tag: int) -> dist.Work:
        t = tensors[0]
        return super().recv([t.as_strided(t.shape, t.stride(), 0)], src, tag)


class UnwrittenOnRankOne(ReferenceBackend):
    """all_gather leaves the last element of rank 1's output unwritten, on rank 1 only."""

    name = "mutant_unwritten_on_rank_1"

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        last = outputs[0][-1]
        before = last.clone()
        work = super().allgather(outputs, inputs, opts)
        work.wait()
        if self.rank() == 1 and last.numel():
            last.view(-1)[-1:] = before.view(-1)[-1:]
        return work


class CoalescedSumsUnderAnyOp(ReferenceBackend):
    """all_reduce inside the coalescing manager sums whatever op it was given (pytorch issue 104168)."""

    name = "mutant_coalesced_sums_under_any_op"

    def allreduce_coalesced(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        opts = opts or _options.AllreduceCoalescedOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        return super().allreduce_coalesced(tensors, opts)


class CoalescedInt32RefusedFloat64Wrong(ReferenceBackend):
    """Coalesced all_reduce refuses int32, in gloo's words (which a ReferenceBackend declares), and zeroes
    float64: one refused example once ended the test as N/A, depending on which dtype was drawn first."""

    name = "mutant_coalesced_int32_refused_float64_wrong"

    def allreduce_coalesced(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        if tensors[0].dtype == torch.int32:
            raise RuntimeError("Invalid scalar type")
        work = super().allreduce_coalesced(tensors, opts)
        work.wait()
        for tensor in tensors:
            if tensor.dtype == torch.float64:
                tensor.zero_()
        return work


class ChannelsLast1ByteRefused8ByteWrong(ReferenceBackend):
    """all_to_all_single refuses a channels_last tensor of a 1-byte dtype, in gloo's words, and zeroes one
    of an 8-byte dtype."""

    name = "mutant_channels_last_1_byte_refused_8_byte_wrong"

    def alltoall_base(
        self, output: Any, input: Any, out_splits: list[int], in_splits: list[int], opts: Any = None
    ):
        channels_last = input.dim() == 4 and input.is_contiguous(memory_format=torch.channels_last)
        if channels_last and not input.is_contiguous() and input.element_size() == 1:
            raise RuntimeError("Tensors must be contiguous")
        work = super().alltoall_base(output, input, out_splits, in_splits, opts)
        work.wait()
        if channels_last and output.element_size() == 8:
            output.zero_()
        return work


class ChannelsLastWrittenContiguous(ReferenceBackend):
    """all_gather writes a channels_last output in contiguous order (pytorch issue 163483's shape): the
    bytes arrive, the layout does not."""

    name = "mutant_channels_last_written_contiguous"

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        parts = outputs[0]
        dense = [torch.empty(p.shape, dtype=p.dtype, device=p.device) for p in parts]
        work = super().allgather([dense], inputs, opts)
        work.wait()
        for part, got in zip(parts, dense, strict=True):
            part.as_strided(part.shape, got.stride()).copy_(got)
        return work


class WrongThenRefusing(ReferenceBackend):
    """all_gather into channels_last outputs writes one element wrong in float32 and refuses every other
    dtype in gloo's words: the refusal, later in the layout sweep, must not erase the float32 failure."""

    name = "mutant_wrong_then_refusing"

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        parts = outputs[0]
        if parts[0].dim() != 4 or parts[0].is_contiguous():
            return super().allgather(outputs, inputs, opts)
        if parts[0].dtype != torch.float32:
            raise RuntimeError("Tensors must be contiguous")
        work = super().allgather(outputs, inputs, opts)
        work.wait()
        parts[-1][(0,) * parts[-1].dim()] += 1
        return work


class StorageCopiedAsDense(ReferenceBackend):
    """all_gather copies each tensor's storage byte for byte, as NCCL's all_gather_into_tensor did at one
    rank: right whenever the input and the outputs share a layout, permuted where they do not."""

    name = "mutant_storage_copied_as_dense"

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        parts = outputs[0]
        dense = [torch.empty(p.shape, dtype=p.dtype, device=p.device) for p in parts]
        work = super().allgather([dense], [_as_if_dense(t) for t in inputs], opts)
        work.wait()
        for part, got in zip(parts, dense, strict=True):
            _as_if_dense(part).copy_(got)
        return work


class StridesInFloat32Bytes(ReferenceBackend):
    """all_gather packs a non-contiguous input by byte offsets reckoned for 4-byte elements, as a pack
    kernel written for float32 would: right in float32 and int32, in every layout; wrong in any other
    element size."""

    name = "mutant_strides_in_float32_bytes"

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        return super().allgather(outputs, [_packed_as_if_4_bytes(t) for t in inputs], opts)


def _packed_as_if_4_bytes(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.is_contiguous():
        return tensor
    size, storage = tensor.element_size(), tensor.untyped_storage()
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
    offsets = torch.arange(storage.nbytes() // size).as_strided(
        tensor.shape, tensor.stride(), tensor.storage_offset()
    )
    at = (offsets * 4).unsqueeze(-1) + torch.arange(size)  # the bug: 4 where ``size`` belongs
    return raw[at.clamp(max=storage.nbytes() - 1).to(tensor.device)].view(tensor.dtype).reshape(tensor.shape)


def _as_if_dense(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s storage read in memory order, with the strides of a contiguous tensor of its shape."""
    return tensor.as_strided(tensor.shape, torch.empty(tensor.shape, device="meta").stride())


class ReducedThrough(ReferenceBackend):
    """all_reduce of dtype ``wide`` in a copy of dtype ``narrow``, written back: the reduction's own type
    is wrong, where the bits still fit it. Each mutant names its pair."""

    wide: torch.dtype
    narrow: torch.dtype

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        tensor = tensors[0]
        if tensor.dtype != self.wide:
            return super().allreduce(tensors, opts)
        copy = tensor.to(self.narrow)
        work = super().allreduce([copy], opts)
        work.wait()
        tensor.copy_(copy)
        return work


class Int64ReducedIn32Bits(ReducedThrough):
    """all_reduce of int64 computes in int32 (HCOLL's int64 MIN mapped to 32 bits, ompi 10521)."""

    name = "mutant_int64_reduced_in_32_bits"
    wide, narrow = torch.int64, torch.int32


class Bf16ReducedThroughFp16(ReducedThrough):
    """all_reduce of bfloat16 computes in float16: past 65504 it overflows, below 2**-24 it flushes."""

    name = "mutant_bf16_reduced_through_fp16"
    wide, narrow = torch.bfloat16, torch.float16


class MismatchReducedInFloat32(ReducedThrough):
    """all_reduce of any floating dtype computes in float32, so a float64 rank and its float32 peers send
    the same bytes: a dtype that differs between ranks returns silently (pytorch 150248's kind)."""

    name = "mutant_mismatch_reduced_in_float32"
    wide, narrow = torch.float64, torch.float32


class LargeInt32SumUnreduced(ReferenceBackend):
    """all_reduce SUM of int32 from 512 Ki elements on leaves the last element unreduced: a large-message
    path of one cell, which only the 1 Mi tier's rotation reaches (it stood still at float16 SUM once)."""

    name = "mutant_large_int32_sum_unreduced"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        opts = opts or _options.AllreduceOptions()
        tensor = tensors[0]
        if tensor.dtype == torch.int32 and tensor.numel() >= 1 << 19 and opts.reduceOp == dist.ReduceOp.SUM:
            return super().allreduce([tensor.view(-1)[:-1]], opts)
        return super().allreduce(tensors, opts)


class Float32ProductWrongAt64Ki(ReferenceBackend):
    """all_reduce PRODUCT of float32 at exactly 64 Ki elements leaves the first element unreduced: one cell
    at one size, which a rotation of the 64 Ki tier over reduce ops reached in 2 default runs of 5."""

    name = "mutant_float32_product_wrong_at_64ki"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        opts = opts or _options.AllreduceOptions()
        tensor = tensors[0]
        product = opts.reduceOp == dist.ReduceOp.PRODUCT
        if tensor.dtype == torch.float32 and tensor.numel() == 1 << 16 and product:
            return super().allreduce([tensor.view(-1)[1:]], opts)
        return super().allreduce(tensors, opts)


class UnreducedPast2To31(ReferenceBackend):
    """all_reduce reduces the first 2**31 elements only, the rest left as they were: a 32-bit count (Open
    MPI 9606's kind). Only the opt-in --huge tier reaches it; run by hand (docs/measurements.md)."""

    name = "mutant_unreduced_past_2_31"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        return super().allreduce([tensors[0].view(-1)[: 1 << 31]], opts)


class Uint8ComparedAsInt8(ReferenceBackend):
    """all_reduce MIN/MAX of uint8 compares the bytes as int8: 200 is less than 1."""

    name = "mutant_uint8_compared_as_int8"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        opts = opts or _options.AllreduceOptions()
        # ReduceOp == RedOpType holds where RedOpType == ReduceOp (and so `in`) does not
        compares = opts.reduceOp == dist.ReduceOp.MIN or opts.reduceOp == dist.ReduceOp.MAX
        signed = tensors[0].dtype == torch.uint8 and compares
        return super().allreduce([tensors[0].view(torch.int8)] if signed else tensors, opts)


class AvgRunAsSum(ReferenceBackend):
    """AVG runs as SUM in reduce_scatter and all_reduce (gloo's reduce_scatter, pytorch 162338): FSDP2's
    gradients multiplied by the world size."""

    name = "mutant_avg_run_as_sum"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        return super().allreduce(tensors, _sum_for_avg(opts or _options.AllreduceOptions()))

    def reduce_scatter(self, outputs: list[Any], inputs: list[list[Any]], opts: Any = None) -> dist.Work:
        return super().reduce_scatter(outputs, inputs, _sum_for_avg(opts or _options.ReduceScatterOptions()))


class LargeReduceScatterTailUnreduced(ReferenceBackend):
    """reduce_scatter of blocks of 64 Ki elements or more leaves the last element of this rank's block its
    own input, unreduced (the shape of the large-message bugs of pytorch 50092 and nccl 1950)."""

    name = "mutant_large_reduce_scatter_tail_unreduced"

    def reduce_scatter(self, outputs: list[Any], inputs: list[list[Any]], opts: Any = None) -> dist.Work:
        output, mine = outputs[0], inputs[0][self.rank()]
        if output.numel() < 1 << 16:
            return super().reduce_scatter(outputs, inputs, opts)
        own = mine.reshape(-1)[-1].clone()
        work = super().reduce_scatter(outputs, inputs, opts)
        work.wait()
        output.view(-1)[-1] = own
        return work


class _Wrapped(dist.Work):
    """A Work that is ``inner``'s, but for what a mutant changes."""

    def __init__(self, inner: dist.Work) -> None:
        super().__init__()
        self.inner = inner

    def wait(self, timeout: Any = None) -> bool:
        return self.inner.wait()

    def is_completed(self) -> bool:
        return self.inner.is_completed()


class _Landing(_Wrapped):
    """A receive that lands in a buffer of its own and is copied to ``target`` when waited (only the
    ``parts`` of its flat elements given, where some are)."""

    def __init__(
        self,
        inner: dist.Work,
        landing: torch.Tensor,
        target: torch.Tensor,
        parts: tuple[slice, ...] = (slice(None),),
    ) -> None:
        super().__init__(inner)
        self.landing, self.target, self.parts, self.waited = landing, target, parts, False

    def wait(self, timeout: Any = None) -> bool:
        self.inner.wait()
        if not self.waited:
            for part in self.parts:
                self.target.view(-1)[part].copy_(self.landing.view(-1)[part])
            self.waited = True
        return True


class SharedStagingBuffer(ReferenceBackend):
    """all_reduce stages each (shape, dtype) in one buffer of its own, reduces there and copies it back when
    waited: right one call at a time, while two of one shape in flight both get the later one's result."""

    name = "mutant_shared_staging_buffer"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.staging: dict[tuple[Any, ...], torch.Tensor] = {}

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        target = tensors[0]
        key = (tuple(target.shape), target.dtype)
        staging = self.staging.setdefault(key, torch.empty(target.shape, dtype=target.dtype))
        staging.copy_(target)
        work = super().allreduce([staging], opts)
        work.wait()  # reduced now, copied back only when waited: what a later call left there by then
        return _Landing(work, staging, target)


class BarrierReturnsAtOnce(ReferenceBackend):
    """barrier returns at once without waiting for the other ranks."""

    name = "mutant_barrier_returns_at_once"

    def barrier(self, opts: Any = None) -> dist.Work:
        return _Done()


class _Done(dist.Work):
    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class SamePeerMessagesSwapped(ReferenceBackend):
    """Two receives from one peer in flight at once get each other's message (the MPI backend swapped two
    tagged messages to one peer, pytorch 63486); a receive waited before the next is posted is right."""

    name = "mutant_same_peer_messages_swapped"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.in_flight: dict[int, _Landing] = {}

    def recv(self, tensors: list[Any], src: int, tag: int) -> dist.Work:
        target = tensors[0]
        landing = torch.empty_like(target)
        work = _Landing(super().recv([landing], src, tag), landing, target)
        earlier = self.in_flight.get(src)
        if earlier and not earlier.waited and earlier.target.shape == target.shape:
            earlier.target, work.target = work.target, earlier.target
        self.in_flight[src] = work
        return work


class ReceivedNanDroppedInSum(ReferenceBackend):
    """all_reduce SUM of floats sanitises what it receives (NaN to 0) but not its own input: a NaN counts
    only on the rank that holds it."""

    name = "mutant_received_nan_dropped_in_sum"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        opts = opts or _options.AllreduceOptions()
        tensor = tensors[0]
        if not (tensor.is_floating_point() and opts.reduceOp == dist.ReduceOp.SUM):
            return super().allreduce(tensors, opts)
        parts = [torch.empty_like(tensor) for _ in range(self.size())]
        work = super().allgather([parts], [tensor])
        work.wait()
        others = [p.nan_to_num(nan=0.0) for i, p in enumerate(parts) if i != self.rank()]
        tensor.copy_(sum(others, parts[self.rank()].clone()))
        return work


class _GroupLeftOpen:
    """A group some threads left inside a group call: their calls are checked (refused as before) and
    taken, and their data never lands (the calls run on copies). Other threads' calls run."""

    def __init__(self, inner: dist.ProcessGroup) -> None:
        self.inner, self.thread = inner, threading.local()  # as NCCL's group depth: dies with its thread

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.inner, name)
        if not getattr(self.thread, "left_open", False):
            return call
        return lambda *args: call(*map(_copied, args))


def _copied(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        return arg.clone()
    return [_copied(a) for a in arg] if isinstance(arg, list) else arg


class RefusalLeavesGroupOpen(NcclRulesBackend):
    """A refused call leaves its thread inside a group call, as NCCL does after a refused all_to_all or
    batch_isend_irecv (docs/measurements/scripts/nccl_findings.py): every later call on that thread is
    taken and moves nothing."""

    name = "mutant_refusal_leaves_group_open"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.inner = _GroupLeftOpen(self.inner)

    def refuse(self, opts: Any) -> None:
        try:
            super().refuse(opts)
        except ValueError:
            self.inner.thread.left_open = True
            raise


class BarrierRaisesAnEarlierRefusal(NcclRulesBackend):
    """On rank 0, a barrier raises the last refusal again instead of taking part, while the other ranks
    wait in theirs. gloo does this by chance: its barrier waits on, and raises the error of, every earlier
    call its worker threads have not yet let go of; on torch 2.2 under load, one rank's refused call was
    still held and the other's was not, and the probe hung at its barrier (CI, 2026-11-28)."""

    name = "mutant_barrier_raises_an_earlier_refusal"
    refused: ValueError | None = None

    def refuse(self, opts: Any) -> None:
        try:
            super().refuse(opts)
        except ValueError as exc:
            self.refused = exc
            raise

    def barrier(self, opts: Any = None) -> dist.Work:
        refused, self.refused = self.refused, None
        if refused is not None and self.rank() == 0:
            raise refused
        return super().barrier(opts)


class NanDroppedInMinMax(ReferenceBackend):
    """all_reduce MIN and MAX of floats skip NaN on every rank alike (fmin/fmax, not min/max): a semantics
    of its own, the same whichever rank holds the NaN, that the matrix reports and no test fails."""

    name = "mutant_nan_dropped_in_min_max"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        opts = opts or _options.AllreduceOptions()
        tensor, is_max = tensors[0], opts.reduceOp == dist.ReduceOp.MAX  # RedOpType == ReduceOp is False
        if not (tensor.is_floating_point() and (is_max or opts.reduceOp == dist.ReduceOp.MIN)):
            return super().allreduce(tensors, opts)
        parts = [torch.empty_like(tensor) for _ in range(self.size())]
        work = super().allgather([parts], [tensor])
        work.wait()
        skip = float("-inf") if is_max else float("inf")
        stacked = torch.stack(parts).nan_to_num(nan=skip, posinf=float("inf"), neginf=float("-inf"))
        tensor.copy_(stacked.amax(0) if is_max else stacked.amin(0))
        return work


class WrongUnderOneProtocol(ReferenceBackend):
    """float32 all_reduce is off by one in its first element, only when the group started with
    ACME_PROTO=LL128 (read once, as NCCL reads NCCL_PROTO when its communicator starts): NCCL's LL128 bugs'
    shape (NVIDIA/nccl#740). Its module declares the preset acme-proto, as a vendor's would."""

    name = "mutant_wrong_under_ll128"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.protocol = os.environ.get("ACME_PROTO", "Simple")

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        work = super().allreduce(tensors, opts)
        if self.protocol == "LL128" and tensors[0].dtype == torch.float32 and tensors[0].numel():
            work.wait()
            tensors[0].view(-1)[0] += 1
        return work


class FaultsAtStartUnderOneProtocol(ReferenceBackend):
    """Every rank raises as its group starts with ACME_PROTO=LL128, in words no backend declares: a fault
    (a CUDA error in transport setup), not the backend turning the setting down. Its tests must fail."""

    name = "mutant_faults_at_start_under_ll128"

    def __init__(self, *args: Any) -> None:
        if os.environ.get("ACME_PROTO") == "LL128":
            raise RuntimeError(
                "internal error: unhandled cuda error (illegal memory access) in transport setup"
            )
        super().__init__(*args)


class HangsAtStartUnderLl128(ReferenceBackend):
    """Every rank's group start never returns with ACME_PROTO=LL128 (a transport waiting on a peer that
    never answers): its tests fail, the start is paid once, and the closing verdicts name the setting."""

    name = "mutant_hangs_at_start_under_ll128"

    def __init__(self, *args: Any) -> None:
        while os.environ.get("ACME_PROTO") == "LL128":
            time.sleep(1)
        super().__init__(*args)


class RejectsOneProtocol(ReferenceBackend):
    """Every rank turns ACME_PROTO=LL128 down as its group starts, in words its module declares: N/A."""

    name = "mutant_rejects_ll128"
    refusals = (r"ACME_PROTO=\w+ is not supported on this node",)

    def __init__(self, *args: Any) -> None:
        if os.environ.get("ACME_PROTO") == "LL128":
            raise RuntimeError("ACME_PROTO=LL128 is not supported on this node")
        super().__init__(*args)


class RejectsOneProtocolAtOneSize(ReferenceBackend):
    """Every rank turns ACME_PROTO=LL128 down, in its module's declared words, as a world of
    ACME_REFUSED_AT ranks starts (a protocol a backend has no kernels for at that size; its subgroups,
    made once it started, are not refused), and takes it at any other size: N/A there alone, and the
    setting was tested."""

    name = "mutant_rejects_ll128_at_one_size"
    refusals = (r"ACME_PROTO=\w+ is not supported at \d+ ranks",)

    def __init__(self, store: dist.Store, rank: int, size: int, *args: Any) -> None:
        refused_at = os.environ.get("ACME_REFUSED_AT")
        if not dist.is_initialized() and os.environ.get("ACME_PROTO") == "LL128" and str(size) == refused_at:
            raise RuntimeError(f"ACME_PROTO=LL128 is not supported at {size} ranks")
        super().__init__(store, rank, size, *args)


class RefusesOnOneRankFaultsOnAnother(ReferenceBackend):
    """With ACME_PROTO=LL128, rank 0 turns the setting down in its module's declared words as the group
    starts while the last rank faults (a CUDA error): the fault is what the setting did, and the rank that
    refused must not hide it."""

    name = "mutant_refuses_on_one_rank_faults_on_another"
    refusals = (r"ACME_PROTO=\w+ is not supported on this node",)

    def __init__(self, store: dist.Store, rank: int, size: int, *args: Any) -> None:
        if os.environ.get("ACME_PROTO") == "LL128" and rank == 0:
            raise RuntimeError("ACME_PROTO=LL128 is not supported on this node")
        if os.environ.get("ACME_PROTO") == "LL128" and rank == size - 1:
            raise RuntimeError("internal error: unhandled cuda error (illegal memory access) in setup")
        super().__init__(store, rank, size, *args)


class FaultsAtFirstStart(ReferenceBackend):
    """Rank 0 raises as the session's first group starts (a port taken, a link retraining), and never
    again: the file ACME_START_FAULT_FILE says it has. The second start works; the setting is still
    reported failing."""

    name = "mutant_faults_at_first_start"

    def __init__(self, store: dist.Store, rank: int, *args: Any) -> None:
        marker = os.environ.get("ACME_START_FAULT_FILE", "")
        if marker and rank == 0 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("transport setup: link retraining, no route to rank 1")
        super().__init__(store, rank, *args)


class TransfersDropped(ReferenceBackend):
    """Receives, all_reduces, all_to_alls, gathers and scatters that do not land: after the first call of
    each (ACME_DROP=after-first) or one call in a hundred (ACME_DROP=1-in-100). The data moves into a
    scratch buffer, so the ranks stay paired and the figures look healthy; only a check of each timed
    call's bytes can tell."""

    name = "mutant_transfers_dropped"
    calls: dict[str, int] = {}

    @staticmethod
    def _dropped(kind: str, tensors: list[Any]) -> bool:
        if kind == "allreduce" and tensors[0].numel() < 256:  # the harness's (a round's times, its verdict)
            return False
        count = TransfersDropped.calls[kind] = TransfersDropped.calls.get(kind, 0) + 1
        how = os.environ.get("ACME_DROP", "after-first")
        return count > 1 if how == "after-first" else count % 100 == 0

    def recv(self, tensors: list[Any], src: int, tag: int) -> dist.Work:
        if self._dropped("recv", tensors):
            tensors = [torch.empty_like(t) for t in tensors]
        return super().recv(tensors, src, tag)

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        if self._dropped("allreduce", tensors):
            tensors = [t.clone() for t in tensors]
        return super().allreduce(tensors, opts)

    def alltoall_base(self, output: Any, input: Any, *args: Any) -> dist.Work:  # noqa: A002 - c10d's name
        if self._dropped("alltoall", [output]):
            output = torch.empty_like(output)
        return super().alltoall_base(output, input, *args)

    # gather and scatter, which the reference backends do not take, handed to gloo with the drop
    def gather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any) -> dist.Work:
        if outputs and outputs[0] and self._dropped("gather", outputs[0]):
            outputs = [[torch.empty_like(t) for t in outputs[0]]]
        return self.inner.gather(outputs, inputs, opts)

    def scatter(self, outputs: list[Any], inputs: list[list[Any]], opts: Any) -> dist.Work:
        if self._dropped("scatter", outputs):
            outputs = [torch.empty_like(t) for t in outputs]
        return self.inner.scatter(outputs, inputs, opts)


class UnevenListAllToAllOffByOne(ReferenceBackend):
    """The list all_to_all takes parts of different sizes (as NCCL does; gloo refuses them), through one flat
    all_to_all_single, and reads each received part after the first one element early."""

    name = "mutant_uneven_list_all_to_all_off_by_one"

    def alltoall(self, outputs: list[Any], inputs: list[Any], opts: Any = None) -> dist.Work:
        if len({t.numel() for t in (*outputs, *inputs)}) == 1:
            return super().alltoall(outputs, inputs, opts)
        flat = [torch.view_as_real(t) if t.is_complex() else t for t in (*outputs, *inputs)]
        outs, ins = flat[: len(outputs)], flat[len(outputs) :]
        received = torch.empty(sum(t.numel() for t in outs), dtype=outs[0].dtype, device=outs[0].device)
        sent = torch.cat([t.reshape(-1) for t in ins])
        splits = ([t.numel() for t in outs], [t.numel() for t in ins])
        super().alltoall_base(received, sent, *splits).wait()
        start = 0
        for i, t in enumerate(outs):
            at = max(start - (i > 0), 0)  # the bug: every part after the first read one element early
            t.view(-1).copy_(received[at : at + t.numel()])
            start += t.numel()
        return _Done()


class _FromAnotherRank(_Wrapped):
    """A receive from any source that lands its message and names the wrong sender: two ranks up (in a
    ring of 3 or more, not the receiver itself, which torch would refuse to return)."""

    def __init__(self, inner: dist.Work, world_size: int) -> None:
        super().__init__(inner)
        self.world_size = world_size

    def _source_rank(self) -> int:
        return (self.inner._source_rank() + 2) % self.world_size


class _Stale(_Wrapped):
    """A Work whose future and result hold ``value``, not what the call wrote."""

    def __init__(self, inner: dist.Work, value: list[torch.Tensor]) -> None:
        super().__init__(inner)
        self.value = value

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        self.inner.wait()
        future.set_result(self.value)
        return future

    def result(self) -> list[torch.Tensor]:
        return self.value


class FutureHoldsTheInput(ReferenceBackend):
    """all_reduce reduces right in place, and its Work's future (what DDP's communication hooks read the
    reduced bucket from) and result() hold a copy of the input as it was before the call."""

    name = "mutant_future_holds_the_input"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        before = [t.clone() for t in tensors]
        return _Stale(super().allreduce(tensors, opts), before)


class _NeverCompleted(_Wrapped):
    """A Work that does its work when waited and never says it is completed."""

    def is_completed(self) -> bool:
        return False


class AllGatherNeverCompleted(ReferenceBackend):
    """all_gather gathers right, and its Work's is_completed() stays False once wait() returned: code that
    polls it (or counts unfinished work) waits for good."""

    name = "mutant_all_gather_never_completed"

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        return _NeverCompleted(super().allgather(outputs, inputs, opts))


class RootedListsRotated(ReferenceBackend):
    """gather hands its root each member's part one place along its list, and scatter sends each rank the
    next one's part: a root's list indexed from the wrong end (the shape of gloo's gather bug, pytorch PR
    158903). The reference backend makes neither call: this one makes both, through gloo."""

    name = "mutant_rooted_lists_rotated"

    def gather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        rotated = [parts[1:] + parts[:1] for parts in outputs]  # empty off the root
        return self.inner.gather(rotated, inputs, opts or _options.GatherOptions())

    def scatter(self, outputs: list[Any], inputs: list[list[Any]], opts: Any = None) -> dist.Work:
        rotated = [parts[1:] + parts[:1] for parts in inputs]
        return self.inner.scatter(outputs, rotated, opts or _options.ScatterOptions())


class AnySourceNamesAnotherSender(ReferenceBackend):
    """A receive from any source lands its message and returns the wrong sender's rank."""

    name = "mutant_any_source_names_another_sender"

    def recv_anysource(self, tensors: list[Any], tag: int) -> dist.Work:
        return _FromAnotherRank(super().recv_anysource(tensors, tag), self.size())


class LandsPartOnRepeat(ReferenceBackend):
    """Receives, all_reduces and broadcasts whose repeat calls on a buffer land only part of it: its first
    16 elements (ACME_PART=first-16), its last 16 (last-16), or all but a middle chunk of an eighth
    (middle). The first call of each lands whole and every timed call sends the same bytes, so a check of
    one element of each call, or of the whole payload at the end, passes it."""

    name = "mutant_lands_part_on_repeat"
    seen: set[tuple[str, int]] = set()

    @staticmethod
    def _parts(kind: str, tensor: torch.Tensor) -> tuple[slice, ...] | None:
        """The parts a repeat call lands; None for a call that lands whole."""
        n = tensor.numel()
        if n < 256 or (kind, n) not in LandsPartOnRepeat.seen:  # a first call, or the harness's own
            LandsPartOnRepeat.seen.add((kind, n))
            return None
        how = os.environ.get("ACME_PART", "first-16")
        if how == "middle":
            return (slice(None, n // 2), slice(n // 2 + n // 8, None))
        return (slice(None, 16),) if how == "first-16" else (slice(n - 16, None),)

    def _landed(self, kind: str, tensors: list[Any], call: Any) -> dist.Work:
        parts = self._parts(kind, tensors[0])
        if parts is None:
            return call(tensors)
        landing = tensors[0].clone()
        return _Landing(call([landing]), landing, tensors[0], parts)

    def recv(self, tensors: list[Any], src: int, tag: int) -> dist.Work:
        parent = super()
        return self._landed("recv", tensors, lambda ts: parent.recv(ts, src, tag))

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        parent = super()
        return self._landed("allreduce", tensors, lambda ts: parent.allreduce(ts, opts))

    def broadcast(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        parent = super()
        return self._landed("broadcast", tensors, lambda ts: parent.broadcast(ts, opts))


class LargeObjectsTruncated(ReferenceBackend):
    """all_gather and broadcast of a byte tensor past 64 KiB (a pickled object's data) zero its last
    byte: a large-message path that small objects never take."""

    name = "mutant_large_objects_truncated"

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        work = super().allgather(outputs, inputs, opts)
        work.wait()
        for part in outputs[0]:
            if part.dtype == torch.uint8 and part.numel() > 1 << 16:
                part.view(-1)[-1] = 0
        return work

    def broadcast(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        work = super().broadcast(tensors, opts)
        work.wait()
        if tensors[0].dtype == torch.uint8 and tensors[0].numel() > 1 << 16:
            tensors[0].view(-1)[-1] = 0
        return work


class WrongAfterWear(ReferenceBackend):
    """float32 all_reduce turns wrong (its first element off by one) once the rank has made ACME_WEAR_CALLS
    of them: a node that fails only after a while under load (thermal, a link degrading). A short run
    passes; a soak fails, and says when."""

    name = "mutant_wrong_after_wear"
    calls = 0  # the process's, over every group it made (a test's subgroups are new instances)

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        work = super().allreduce(tensors, opts)
        if tensors[0].dtype == torch.float32 and tensors[0].numel():
            WrongAfterWear.calls += 1
            if WrongAfterWear.calls > int(os.environ.get("ACME_WEAR_CALLS", "100000")):
                work.wait()
                tensors[0].view(-1)[0] += 1
        return work


class WrongWhileCold(ReferenceBackend):
    """float32 all_reduce wrong (its first element changed) in a rank's first call of 16 elements or
    more (the capability probes' are smaller): a buffer set up lazily, read before it is. Deterministic:
    every fresh start meets it, and a soak's kept groups meet it once, in their first pass; tried again
    there, it passes."""

    name = "mutant_wrong_while_cold"
    calls = 0  # the process's, over every group it made

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        work = super().allreduce(tensors, opts)
        if tensors[0].dtype == torch.float32 and tensors[0].numel() >= 16:
            WrongWhileCold.calls += 1
            if WrongWhileCold.calls == 1:
                work.wait()
                first = tensors[0].view(-1)[:1]
                # changed whatever it holds: +1 is lost on a large float, and on inf or NaN
                first.copy_(torch.where(first.isfinite(), first + first.abs().clamp(min=1.0), 0.0))
        return work


class WrongOnceInThousands(ReferenceBackend):
    """float32 all_reduce is wrong (its first element changed) in one call of ACME_ONE_IN (default 3000) on
    average, at random: an intermittent corruption a single run seldom meets. ACME_ONE_IN_SEED fixes the
    draws (a test's, so that which calls it hits does not vary from run to run)."""

    name = "mutant_wrong_once_in_thousands"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.one_in = int(os.environ.get("ACME_ONE_IN", "3000"))
        self.random = random.Random(os.environ.get("ACME_ONE_IN_SEED") or os.urandom(8))

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        work = super().allreduce(tensors, opts)
        float32 = tensors[0].dtype == torch.float32 and tensors[0].numel()
        if float32 and self.random.randrange(self.one_in) == 0:
            work.wait()
            first = tensors[0].view(-1)[:1]
            # changed whatever it holds: +1 is lost on a large float, and on inf or NaN
            first.copy_(torch.where(first.isfinite(), first + first.abs().clamp(min=1.0), 0.0))
        return work


def _sum_for_avg(opts: Any) -> Any:
    if opts.reduceOp == dist.ReduceOp.AVG:
        opts.reduceOp = dist.ReduceOp.SUM
    return opts


def buffer_form(tensor: torch.Tensor) -> str:
    """How a tensor handed to the backend is laid out in its storage."""
    if tensor.is_contiguous():
        return "dense at an offset" if tensor.storage_offset() else "dense"
    if tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    return "strided"


def _tensors(arg: Any) -> list[torch.Tensor]:
    if isinstance(arg, torch.Tensor):
        return [arg]
    if isinstance(arg, (list, tuple)):
        return [t for a in arg for t in _tensors(a)]
    return []


class RecordsBufferForms(ReferenceBackend):
    """Not wrong: each (call, form) of the tensors the backend is handed, kept in ACME_FORMS.<pid>, so a
    test can hold the forms the algorithms pass to those the backend's own tests draw."""

    name = "recording_forms"
    seen: set[tuple[str, str]] = set()

    def _record(self, call: str, roles: tuple[str, ...], *args: Any) -> None:
        new = {
            (call, role, buffer_form(t))
            for role, arg in zip(roles, args, strict=False)
            for t in _tensors(arg)
            if t.numel()
        } - RecordsBufferForms.seen
        if new:
            RecordsBufferForms.seen |= new
            with open(f"{os.environ['ACME_FORMS']}.{os.getpid()}", "a", encoding="utf-8") as out:
                out.writelines("\t".join(seen) + "\n" for seen in sorted(new))


def _recorded(call: str, roles: tuple[str, ...]) -> Any:
    def method(self: RecordsBufferForms, *args: Any) -> dist.Work:
        self._record(call, roles, *args)
        return getattr(ReferenceBackend, call)(self, *args)

    return method


# each call's tensor arguments, in order: what the backend reads, writes, or both
_ROLES = {
    "allreduce": ("in and out",), "allreduce_coalesced": ("in and out",), "broadcast": ("in and out",),
    "reduce_scatter": ("out", "in"), "allgather": ("out", "in"), "alltoall_base": ("out", "in"),
    "alltoall": ("out", "in"), "send": ("in",), "recv": ("out",),
}  # fmt: skip
for _call, _roles in _ROLES.items():
    setattr(RecordsBufferForms, _call, _recorded(_call, _roles))


def _shares_memory(tensor: torch.Tensor, *others: torch.Tensor) -> bool:
    return any(tensor.untyped_storage().data_ptr() == other.untyped_storage().data_ptr() for other in others)


class ReduceScatterInItsInput(ReferenceBackend):
    """reduce_scatter out of place reduces in its input's own block and copies that to the output: right
    output, and the caller's input holds the reduced block afterwards."""

    name = "mutant_reduce_scatter_in_its_input"

    def reduce_scatter(self, outputs: list[Any], inputs: list[list[Any]], opts: Any = None) -> dist.Work:
        work = super().reduce_scatter(outputs, inputs, opts)
        work.wait()
        own = inputs[0][self.rank()]
        if not _shares_memory(own, outputs[0]):
            own.copy_(outputs[0])
        return work


class AllGatherThroughItsInput(ReferenceBackend):
    """all_gather out of place receives the last part through its input buffer: right outputs, and the
    caller's input holds the last rank's part afterwards."""

    name = "mutant_all_gather_through_its_input"

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        work = super().allgather(outputs, inputs, opts)
        work.wait()
        last = outputs[0][-1]
        if last.shape == inputs[0].shape and not _shares_memory(inputs[0], *outputs[0]):
            inputs[0].copy_(last)
        return work


class AllToAllThroughItsInput(ReferenceBackend):
    """all_to_all_single out of place stages what it received in its input: right output, and the caller's
    input holds the output afterwards."""

    name = "mutant_all_to_all_through_its_input"

    def alltoall_base(self, output: Any, input: Any, *args: Any) -> dist.Work:  # noqa: A002 - c10d's name
        work = super().alltoall_base(output, input, *args)
        work.wait()
        if output.numel() == input.numel() and not _shares_memory(input, output):
            input.copy_(output.view(input.shape))
        return work


class SendEncodesInPlace(ReferenceBackend):
    """send encodes the payload in the caller's tensor (every bit inverted, as a transport's in-place
    transform) and never decodes it: the peer receives it right, the sender's tensor is spoiled."""

    name = "mutant_send_encodes_in_place"

    def send(self, tensors: list[Any], dst: int, tag: int) -> dist.Work:
        work = super().send([tensors[0].clone()], dst, tag)
        tensors[0].copy_(complement(tensors[0]))
        return work


def _in_whole_vectors(tensor: torch.Tensor) -> torch.Tensor | None:
    """``tensor`` flat, rounded up to whole 16-byte vectors where its storage goes on that far (a kernel
    that handles a tail so); None where it is not contiguous or no element is past its end."""
    per_vector = max(1, 16 // tensor.element_size())
    rounded = -(-tensor.numel() // per_vector) * per_vector
    room = tensor.untyped_storage().nbytes() // tensor.element_size() - tensor.storage_offset()
    if not tensor.is_contiguous() or rounded == tensor.numel() or rounded > room:
        return None
    return tensor.as_strided((rounded,), (1,), tensor.storage_offset())


class WholeVectorsReduced(ReferenceBackend):
    """all_reduce reduces whole 16-byte vectors: of a view whose end is not on one, the elements after it to
    the next are reduced with the peers' too, where its storage goes on (a kernel's tail rounded up)."""

    name = "mutant_whole_vectors_reduced"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        rounded = _in_whole_vectors(tensors[0])
        return super().allreduce(tensors if rounded is None else [rounded], opts)


class AllGatherInWholeVectors(ReferenceBackend):
    """all_gather writes each part in whole 16-byte vectors, the last one's padding zeroed: every part right,
    and up to 15 bytes after each zeroed where its storage goes on (a caller's other tensors)."""

    name = "mutant_all_gather_in_whole_vectors"

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> dist.Work:
        work = super().allgather(outputs, inputs, opts)
        work.wait()
        for part in outputs[0]:
            rounded = _in_whole_vectors(part)
            if rounded is not None:
                rounded[part.numel() :].view(torch.uint8).zero_()
        return work


class ScalarPassedOver(ReferenceBackend):
    """all_reduce counts a tensor's elements by its dimensions, of which a 0-d tensor has none: a loss or a
    metric is left as this rank's own, every tensor of one dimension or more is right."""

    name = "mutant_scalar_passed_over"

    def allreduce(self, tensors: list[Any], opts: Any = None) -> dist.Work:
        if tensors[0].dim() == 0:
            tensors = [tensors[0].view(1)[:0]]
        return super().allreduce(tensors, opts)


MUTANTS = [
    Int64ReducedIn32Bits,
    Bf16ReducedThroughFp16,
    MismatchReducedInFloat32,
    UnreducedPast2To31,
    LargeInt32SumUnreduced,
    Float32ProductWrongAt64Ki,
    Uint8ComparedAsInt8,
    AvgRunAsSum,
    SamePeerMessagesSwapped,
    SharedStagingBuffer,
    BarrierReturnsAtOnce,
    ReceivedNanDroppedInSum,
    LargeReduceScatterTailUnreduced,
    GatherPermutesRanks,
    UnevenAllToAllOffByOne,
    BroadcastFromRankZero,
    Bf16TailUnreduced,
    StorageOffsetIgnored,
    ReceivedAtTheStorageStart,
    UnwrittenOnRankOne,
    CoalescedSumsUnderAnyOp,
    CoalescedInt32RefusedFloat64Wrong,
    ChannelsLast1ByteRefused8ByteWrong,
    ChannelsLastWrittenContiguous,
    StorageCopiedAsDense,
    StridesInFloat32Bytes,
    WrongThenRefusing,
    RefusalLeavesGroupOpen,
    BarrierRaisesAnEarlierRefusal,
    NanDroppedInMinMax,
    WrongUnderOneProtocol,
    TransfersDropped,
    LargeObjectsTruncated,
    FaultsAtStartUnderOneProtocol,
    RejectsOneProtocol,
    HangsAtStartUnderLl128,
    RefusesOnOneRankFaultsOnAnother,
    RejectsOneProtocolAtOneSize,
    FaultsAtFirstStart,
    WrongAfterWear,
    WrongWhileCold,
    WrongOnceInThousands,
    ReduceScatterInItsInput,
    AllGatherThroughItsInput,
    AllToAllThroughItsInput,
    SendEncodesInPlace,
    WholeVectorsReduced,
    AllGatherInWholeVectors,
    ScalarPassedOver,
    LastElementWrongInEveryDtype,
    WritesThenRefusesChannelsLast,
    LandsPartOnRepeat,
    UnevenListAllToAllOffByOne,
    AnySourceNamesAnotherSender,
    FutureHoldsTheInput,
    AllGatherNeverCompleted,
    RootedListsRotated,
]
register(*MUTANTS, RecordsBufferForms)
refuses(WritesThenRefusesChannelsLast.name, "Tensors must be contiguous")
declare(RecordsBufferForms.name, built_on="gloo")  # it is gloo: gloo's known bugs hold
backend_env_preset("acme-proto", {"ACME_PROTO": ["LL", "LL128", "Simple"]})
