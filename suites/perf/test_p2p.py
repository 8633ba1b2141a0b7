"""Point-to-point: copies by memory against the send APIs, and the all-pairs bandwidth and latency matrices.

Seed 001 measured memcpy-based transfers (``tensor.to``/``copy_``) up to three times faster than NCCL's
send/recv on PCIe; these benchmarks put the same question to any machine. Bidirectional figures count
the bytes of both directions, like p2pBandwidthLatencyTest. The all-pairs transfers are byte-checked
(copycheck): a pair that is fast because its writes never land must fail, not top the matrix.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from copycheck import assert_copied, largest_group, pattern, sentinel

from pytest_collectives import Stamps, measure, share

LATENCY_BYTES = 4


def transfer(mode: str, direction: str, buf: torch.Tensor, inbox: torch.Tensor, me: int, src: int, dst: int):
    """One transfer of ``buf`` from src to dst (and back at the same time when bidirectional)."""
    if me not in (src, dst):
        return
    peer = dst if me == src else src
    sends = me == src or direction == "bidir"
    receives = me == dst or direction == "bidir"
    if mode == "send_recv":
        # Blocking calls must be ordered to pair up: the source sends first, the destination receives first.
        steps = [(sends, dist.send, buf), (receives, dist.recv, inbox)]
        for wanted, op, tensor in steps if me == src else steps[::-1]:
            if wanted:
                op(tensor, peer)
    elif mode == "isend_irecv":
        works = ([dist.isend(buf, peer)] if sends else []) + ([dist.irecv(inbox, peer)] if receives else [])
        for work in works:
            work.wait()
    else:
        ops = ([dist.P2POp(dist.isend, buf, peer)] if sends else []) + (
            [dist.P2POp(dist.irecv, inbox, peer)] if receives else []
        )
        for work in dist.batch_isend_irecv(ops):
            work.wait()


MODES = ["send_recv", "isend_irecv", "batch_isend_irecv"]


@pytest.mark.world_size(2)
@pytest.mark.parametrize("direction", ["unidir", "bidir"])
@pytest.mark.parametrize("mode", MODES)
def test_send_bandwidth(pg, benchmark, mode, direction, nbytes):
    buf, inbox = own_and_inbox(pg, nbytes)
    moved = nbytes * (2 if direction == "bidir" else 1)
    benchmark.extra_info.update(dtype="float32", mode=mode, direction=direction, src=0, dst=1)
    receives = pg.rank == 1 or direction == "bidir"
    stamps = Stamps(sends=[buf] * (pg.rank == 0 or direction == "bidir"), receives=[inbox] * receives)
    benchmark(
        transfer, mode, direction, buf, inbox, pg.rank, 0, 1, nbytes=moved, collective="p2p", stamps=stamps
    )
    if receives:
        peer = 1 - pg.rank
        sent = stamps.as_landed(pattern(nbytes, peer).view(torch.float32))
        assert_copied(inbox, sent, f"{mode} {direction}: rank {peer} -> rank {pg.rank}")


def own_and_inbox(pg, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's pattern to send and a sentinel inbox, as float32: what a transfer must have landed is
    the peer's pattern, which every rank can rebuild."""
    own = pattern(nbytes, pg.rank, pg.device).view(torch.float32)
    return own, sentinel(nbytes, pg.device).view(torch.float32)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("mode", MODES)
def test_send_latency(pg, benchmark, mode):
    """A ping-pong of one float: half the round trip is the one-way latency (in extra_info)."""
    buf, inbox = own_and_inbox(pg, LATENCY_BYTES)

    def ping_pong():
        transfer(mode, "unidir", buf, inbox, pg.rank, 0, 1)
        transfer(mode, "unidir", buf, inbox, pg.rank, 1, 0)

    benchmark.extra_info.update(dtype="float32", mode=mode, message_bytes=LATENCY_BYTES)
    # both ways checked: rank 0's ping lands at rank 1 as s, rank 1's pong at rank 0 as s + SPACING
    peer = 1 - pg.rank
    stamps = Stamps.apart([buf], [inbox], pg.rank, senders=[peer])
    benchmark(ping_pong, nbytes=2 * LATENCY_BYTES, collective="p2p", stamps=stamps)
    sent = stamps.as_landed(pattern(LATENCY_BYTES, peer).view(torch.float32))
    assert_copied(inbox, sent, f"{mode} ping-pong: rank {peer} -> rank {pg.rank}")


def _shared_buffer(pg, numel: int) -> tuple[torch.Tensor, str]:
    """A CPU tensor mapped by every rank of the group: the source's memory, readable by its peer."""
    path = f"/dev/shm/collectives-{os.getppid()}-{pg.world_size}-{numel}"
    if pg.rank == 0:
        torch.from_file(path, shared=True, size=numel, dtype=torch.float32).fill_(1.0)
    dist.barrier()
    return torch.from_file(path, shared=True, size=numel, dtype=torch.float32), path


@pytest.mark.world_size(2)
def test_shared_memory_copy(pg, benchmark, nbytes):
    """CPU copy by memory between processes: rank 1 copies straight out of rank 0's buffer (one memcpy,
    like tensor.to between GPUs or CUDA IPC), compared with a memcpy inside one process."""
    if pg.device.type != "cpu":
        pytest.skip(
            "shared memory between processes is the CPU path; GPUs copy by CUDA IPC (test_cuda_ipc_copy)"
        )
    numel = nbytes // 4
    shared, path = _shared_buffer(pg, numel)
    private = torch.ones(numel)
    dst = torch.empty(numel)
    local = bench_local_memcpy(pg, dst, private)
    benchmark.extra_info.update(dtype="float32", src=0, dst=1, threads=torch.get_num_threads())
    # rank 1 stamps rank 0's memory through its own mapping, then copies out of it: each copy checked
    reader = pg.rank == 1
    stamps = Stamps([shared] * reader, [dst] * reader)
    benchmark(lambda: dst.copy_(shared) if reader else None, nbytes=nbytes, collective="p2p", stamps=stamps)
    benchmark.extra_info["memcpy_median_s"] = local
    if reader:
        assert torch.equal(dst, stamps.as_landed(torch.ones(numel))), "the copy did not read rank 0's memory"
    dist.barrier()
    if pg.rank == 0:
        os.unlink(path)


@pytest.mark.gpu
@pytest.mark.world_size(2)
def test_cuda_ipc_copy(pg, benchmark, nbytes):
    """GPU copy by memory between processes: rank 1 copies straight out of rank 0's buffer on cuda:0, opened
    by CUDA IPC (a peer-to-peer copy over the GPUs' link, like tensor.to), against the send APIs above."""
    numel = nbytes // 4
    mine = torch.full((numel,), float(pg.rank + 1), device=pg.device)
    views = [share(mine, owner=0)]  # rank 0: its own tensor; rank 1: rank 0's memory
    dst = torch.empty(numel, device=pg.device)
    benchmark.extra_info.update(dtype="float32", src=0, dst=1, mode="cuda_ipc")
    benchmark(lambda: dst.copy_(views[0]) if pg.rank == 1 else None, nbytes=nbytes, collective="p2p")
    if pg.rank == 1:
        assert dst.eq(1.0).all(), "the copy did not read rank 0's memory"
    views.clear()
    dist.barrier()  # rank 0 frees its buffer only after rank 1 dropped its view


def bench_local_memcpy(pg, dst: torch.Tensor, src: torch.Tensor) -> float:
    """Median time of the same copy between two private buffers of rank 1: the memcpy reference."""
    times, _ = measure(lambda: dst.copy_(src) if pg.rank == 1 else None, pg.device, 20)
    return sorted(times)[len(times) // 2]


@pytest.mark.gpu
@pytest.mark.world_size("max")
@pytest.mark.parametrize("peer", [0, 1], ids=["same-device", "device1"])
def test_tensor_to(pg, benchmark, peer, nbytes):
    """``tensor.to`` from cuda:0 inside one process (seed 000's puzzler): to itself and to its neighbour."""
    if peer >= pg.world_size:
        pytest.skip(f"needs {peer + 1} GPUs")
    src = torch.ones(nbytes // 4, device="cuda:0")
    target = torch.device("cuda", peer)

    def copy():
        if pg.rank == 0:
            src.to(target, copy=True)  # to the same device, .to() would return src itself
            torch.cuda.synchronize(target)

    benchmark.extra_info.update(dtype="float32", src=0, dst=peer)
    benchmark(copy, nbytes=nbytes, collective="p2p")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The all-pairs matrices: one benchmark per (src, dst) pair of the largest group."""
    if "pair" in metafunc.fixturenames:
        n = largest_group(metafunc)
        pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
        metafunc.parametrize("pair", pairs, ids=[f"{s}to{d}" for s, d in pairs])


def checked_pair(pg, benchmark, pair: tuple[int, int], nbytes: int, matrix: str) -> None:
    """One send/recv from src to dst, benchmarked, then the destination's bytes compared with the source's."""
    src, dst = pair
    # Every rank can rebuild the source's pattern, so the destination checks without a second transfer.
    buf = pattern(nbytes, src, pg.device).view(torch.float32)
    inbox = sentinel(nbytes, pg.device).view(torch.float32)
    benchmark.extra_info.update(
        dtype="float32", src=src, dst=dst, mode="send_recv", matrix=matrix, link=pg.link(src, dst),
        src_node=pg.node_of(src), dst_node=pg.node_of(dst),
    )  # fmt: skip
    stamps = Stamps(sends=[buf] * (pg.rank == src), receives=[inbox] * (pg.rank == dst))
    benchmark(
        transfer, "send_recv", "unidir", buf, inbox, pg.rank, src, dst, nbytes=nbytes, collective="p2p",
        stamps=stamps,
    )  # fmt: skip
    if pg.rank == dst:
        assert_copied(inbox, stamps.as_landed(pattern(nbytes, src, pg.device).view(torch.float32)),
                      f"rank {src} -> rank {dst}")  # fmt: skip


@pytest.mark.world_size("max")
def test_pair_bandwidth(pg, benchmark, pair, nbytes):
    """p2pBandwidthLatencyTest's unidirectional bandwidth matrix, one result per pair, by send/recv."""
    checked_pair(pg, benchmark, pair, nbytes, "pairs")


@pytest.mark.world_size("max")
def test_pair_latency(pg, benchmark, pair):
    """p2pBandwidthLatencyTest's latency matrix: the time per 4-byte send/recv from src to dst, messages sent
    back to back as that tool times its copies (test_send_latency's ping-pong gives one pair's round trip)."""
    checked_pair(pg, benchmark, pair, LATENCY_BYTES, "latency")
