"""What the copy benchmarks share: the byte check of every copy, and one parameter per rank of the group.

A copy can be fast and wrong. Under an IOMMU, or with ACS redirecting peer traffic, DMA and peer-to-peer
writes can be dropped silently while CUDA's access check passes, so a benchmark that never looks at what it
moved reports a healthy figure for a broken path. So the destination starts as SENTINEL, the source as a
pattern, and after the benchmark the destination must hold the source's bytes exactly.
"""

from __future__ import annotations

import pytest
import torch

from pytest_collectives import settings_of, world_sizes_of

SENTINEL = 0xA5
# Knuth's multiplicative hash of the word index: neighbouring words differ in every byte, so data landing
# at the wrong offset shows, not only data that never landed.
_HASH = 2654435761
_SALT = 40503


def pattern(
    nbytes: int, salt: int, device: torch.device | str = "cpu", pin_memory: bool = False
) -> torch.Tensor:
    """``nbytes`` uint8 that differ with ``salt`` (e.g. the source rank): a copy from the wrong buffer shows.

    The words are 31-bit, so every fourth byte is below 0x80 and never SENTINEL: a write that did not land
    is always seen, however short.
    """
    words = torch.arange(-(-nbytes // 4), dtype=torch.int64, device=device)
    words.mul_(_HASH).add_(salt * _SALT + 1).bitwise_and_(0x7FFFFFFF)
    data = words.to(torch.int32).view(torch.uint8)[:nbytes]
    return data.pin_memory() if pin_memory else data


def sentinel(nbytes: int, device: torch.device | str = "cpu", pin_memory: bool = False) -> torch.Tensor:
    """``nbytes`` uint8 that all hold SENTINEL: what a destination holds before any write lands."""
    return torch.full((nbytes,), SENTINEL, dtype=torch.uint8, device=device, pin_memory=pin_memory)


def assert_copied(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    """``dst`` holds exactly the bytes of ``src`` (contiguous tensors of any dtype and device)."""
    if dst.is_cuda or src.is_cuda:
        torch.cuda.synchronize()  # a non_blocking copy into host memory may still be in flight
    got = dst.flatten().view(torch.uint8)
    want = src.flatten().view(torch.uint8).to(got.device)
    if got.numel() != want.numel():
        raise AssertionError(f"{what}: {got.numel()} bytes received, {want.numel()} sent")
    if torch.equal(got, want):
        return
    wrong = got != want
    first = int(wrong.to(torch.uint8).argmax())
    untouched = int((wrong & (got == SENTINEL)).sum())
    raise AssertionError(
        f"{what}: {int(wrong.sum())} of {got.numel()} bytes differ from the source, the first at byte "
        f"{first}, and {untouched} of them still hold the sentinel (writes that never landed): the copy was "
        f"dropped or corrupted on its way; look for IOMMU faults in `dmesg` (DMAR, AMD-Vi) and check ACS on "
        f"the PCIe switches"
    )


def largest_group(metafunc: pytest.Metafunc) -> int:
    """The world size of a test marked world_size("max"): every GPU with --gpus, else the largest size."""
    marker = metafunc.definition.get_closest_marker("world_size")
    (n,) = world_sizes_of(marker.args, settings_of(metafunc.config)) or (1,)
    return n
