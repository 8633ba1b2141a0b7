"""Copies by memory between GPU processes: one rank's CUDA buffer, opened by its peers through CUDA IPC.

torch.multiprocessing shares a CUDA tensor by pickling it. Here its IPC handle travels as JSON in a uint8
tensor broadcast over the group, so what one rank sends another is only ever parsed as JSON. The owner must
keep its tensor alive until every peer has dropped its view: `share` users end with a barrier after the
peers' last use.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

# The fields of UntypedStorage._share_cuda_(), in its order (torch >= 2.1); the bytes ones travel as hex.
SHARE_FIELDS = (
    "device",
    "handle",
    "storage_bytes",
    "storage_offset_bytes",
    "ref_counter_handle",
    "ref_counter_offset",
    "event_handle",
    "event_sync_required",
)
_BYTES = {"handle", "ref_counter_handle", "event_handle"}


def describe(share: tuple[Any, ...], tensor: torch.Tensor) -> dict[str, Any]:
    """JSON for ``share`` (``tensor.untyped_storage()._share_cuda_()``) and ``tensor``'s view of it."""
    if len(share) != len(SHARE_FIELDS):
        raise RuntimeError(
            f"_share_cuda_() gave {len(share)} fields, expected {len(SHARE_FIELDS)}: torch changed"
        )
    fields = {
        name: (value.hex() if isinstance(value, bytes) else value)
        for name, value in zip(SHARE_FIELDS, share, strict=True)
    }
    return {
        **fields,
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "size": list(tensor.size()),
        "stride": list(tensor.stride()),
        "offset": tensor.storage_offset(),
    }


def rebuild_args(desc: dict[str, Any]) -> tuple[Any, ...]:
    """The arguments of torch's ``rebuild_cuda_tensor`` for a ``describe``d tensor, as ``reduce_tensor``
    would have pickled them."""
    field = {
        name: (bytes.fromhex(desc[name]) if name in _BYTES and desc[name] is not None else desc[name])
        for name in SHARE_FIELDS
    }
    return (
        torch.Tensor,
        torch.Size(desc["size"]),
        tuple(desc["stride"]),
        desc["offset"],
        torch.UntypedStorage,
        getattr(torch, desc["dtype"]),
        field["device"],
        field["handle"],
        field["storage_bytes"],
        field["storage_offset_bytes"],
        False,  # requires_grad
        field["ref_counter_handle"],
        field["ref_counter_offset"],
        field["event_handle"],
        field["event_sync_required"],
    )


def broadcast_json(obj: Any, src: int, device: torch.device, group: Any = None) -> Any:
    """``obj`` of rank ``src`` on every rank of ``group``: UTF-8 JSON in a uint8 tensor, its length first."""
    mine = dist.get_rank() == src
    data = json.dumps(obj).encode() if mine else b""
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(length, src, group=group)
    if mine:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    dist.broadcast(buf, src, group=group)
    return json.loads(buf.cpu().numpy().tobytes())


def share(tensor: torch.Tensor, owner: int, group: Any = None) -> torch.Tensor:
    """On every rank of the group: ``owner``'s CUDA ``tensor``; its own on the owner, elsewhere a view of
    the owner's memory, opened by CUDA IPC. Every rank passes a tensor on its own device (only the owner's
    is used)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if tensor.device.type != "cuda":
        raise ValueError(f"share: CUDA IPC shares CUDA tensors, got one on {tensor.device}")
    mine = dist.get_rank() == owner
    desc = describe(tensor.untyped_storage()._share_cuda_(), tensor) if mine else None
    desc = broadcast_json(desc, owner, tensor.device, group)
    return tensor if mine else rebuild_cuda_tensor(*rebuild_args(desc))
