"""Copies between host memory and each GPU, and inside each GPU, through torch: nvbandwidth's
host_to_device_memcpy_ce and device_to_host_memcpy_ce (and their bidirectional forms), and
p2pBandwidthLatencyTest's diagonal.

One benchmark per GPU: only the rank driving that GPU copies, the others run empty rounds, so each GPU's
PCIe link is measured alone, as nvbandwidth does. A GPU whose link trained at x8 or at a lower generation
then stands out from its peers in the node report (the host-device checks of nodereport/verdicts.py).
Pinned host memory is what a DMA engine copies at link speed; pageable memory is staged through a pinned
buffer by the driver, so its figure also shows the CPU's memcpy. Bidirectional figures count the bytes of
both directions, like p2pBandwidthLatencyTest's. Every copy is byte-checked after its benchmark (copycheck).
"""

from __future__ import annotations

import pytest
import torch
from copycheck import assert_copied, largest_group, pattern, sentinel

KINDS = [("h2d", "pinned"), ("h2d", "pageable"), ("d2h", "pinned"), ("d2h", "pageable"), ("bidir", "pinned")]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One benchmark per GPU of the largest group."""
    if "gpu" in metafunc.fixturenames:
        n = largest_group(metafunc)
        metafunc.parametrize("gpu", range(n), ids=[f"gpu{i}" for i in range(n)])


def describe(benchmark, pg, gpu: int, direction: str, memory: str, nbytes: int) -> None:
    benchmark.extra_info.update(
        matrix="host", direction=direction, memory=memory, device=gpu, node=pg.node_of(gpu), dtype="uint8",
        message_bytes=nbytes,
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.world_size("max")
@pytest.mark.parametrize(("direction", "memory"), KINDS, ids=[f"{d}-{m}" for d, m in KINDS])
def test_host_copy(pg, benchmark, gpu, direction, memory, nbytes):
    """Host to GPU, GPU to host, or both at once on two streams (each direction on its own copy engine)."""
    pinned = memory == "pinned"
    copies = []  # (destination, source, name): none on the ranks that don't own the GPU
    if pg.rank == gpu:
        if direction in ("h2d", "bidir"):
            h2d = (sentinel(nbytes, pg.device), pattern(nbytes, 2 * gpu, pin_memory=pinned), "h2d")
            copies.append(h2d)
        if direction in ("d2h", "bidir"):
            d2h = (sentinel(nbytes, pin_memory=pinned), pattern(nbytes, 2 * gpu + 1, pg.device), "d2h")
            copies.append(d2h)
    streams = [torch.cuda.Stream() for _ in copies] if direction == "bidir" else []

    def one_way():
        for dst, src, _ in copies:
            dst.copy_(src, non_blocking=pinned)

    def both_ways():
        if not copies:
            return
        current = torch.cuda.current_stream()
        # Both streams wait for the timer's start event before either copy starts, and the timer's end
        # event waits for both copies, so the time measured covers the two directions together.
        for stream in streams:
            stream.wait_stream(current)
        for stream, (dst, src, _) in zip(streams, copies, strict=True):
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)
        for stream in streams:
            current.wait_stream(stream)

    describe(benchmark, pg, gpu, direction, memory, nbytes)
    moved = nbytes * (2 if direction == "bidir" else 1)
    benchmark(both_ways if direction == "bidir" else one_way, nbytes=moved, collective="p2p")
    for dst, src, name in copies:
        assert_copied(dst, src, f"GPU{gpu} {name} ({memory} host memory)")


@pytest.mark.gpu
@pytest.mark.world_size("max")
def test_local_copy(pg, benchmark, gpu, nbytes):
    """``dst.copy_(src)`` inside one GPU: its memory bandwidth, the diagonal of p2pBandwidthLatencyTest (the
    figure counts each byte once, though the memory reads and writes it)."""
    mine = pg.rank == gpu
    src = pattern(nbytes, gpu, pg.device) if mine else None
    dst = sentinel(nbytes, pg.device) if mine else None
    describe(benchmark, pg, gpu, "local", "device", nbytes)
    benchmark(lambda: dst.copy_(src) if mine else None, nbytes=nbytes, collective="p2p")
    if mine:
        assert_copied(dst, src, f"GPU{gpu} local copy")
