"""The ranks' accelerator, whichever the backend runs on: CUDA through torch.cuda (every supported torch),
any other device type (xpu, hpu, ...) through torch.accelerator, which such backends need anyway."""

from __future__ import annotations

from typing import Any


def _api(device: Any) -> Any:
    import torch

    return torch.cuda if device.type == "cuda" else torch.accelerator


def select(device: Any) -> None:
    """Make ``device`` this process's current device (nothing to do for a CPU rank)."""
    if device.type == "cuda":
        _api(device).set_device(device)
    elif device.type != "cpu":
        _api(device).set_device_index(device.index)


def current_index(device: Any) -> int | None:
    """The index of this process's current device of ``device``'s type; None for a CPU rank."""
    if device.type == "cpu":
        return None
    api = _api(device)
    return api.current_device() if device.type == "cuda" else api.current_device_index()


def synchronize(device: Any) -> None:
    if device.type != "cpu":
        _api(device).synchronize(device)


def empty_cache(device: Any) -> None:
    if device.type != "cpu":
        _api(device).empty_cache()


def timing_event(device: Any) -> Any:
    """An event that records on the device's current stream and times the span between two of them."""
    import torch

    if device.type == "cuda":
        return torch.cuda.Event(enable_timing=True)
    return torch.Event(device=device.type, enable_timing=True)
