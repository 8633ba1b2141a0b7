"""What older torch lacks: the floor in pyproject.toml is older than these."""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.distributed as dist


def default_device() -> torch.device:
    """torch.get_default_device (torch 2.3); before it, where a new tensor lands."""
    getter = getattr(torch, "get_default_device", None)
    return getter() if getter is not None else torch.empty(()).device


def bound_device(backend: str, device: torch.device) -> dict[str, Any]:
    """init_process_group's device_id for NCCL (torch 2.3): eager init, so a broken GPU fails at start
    rather than mid-test. Older torch initialises lazily: nothing to pass."""
    if backend != "nccl" or "device_id" not in inspect.signature(dist.init_process_group).parameters:
        return {}
    return {"device_id": device}
