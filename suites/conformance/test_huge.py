"""The opt-in tier for big-memory nodes (``--huge``): messages straddling 2**31 elements, and in bfloat16
2**32 bytes, the counts past which backends have reduced wrongly (Open MPI 9606 and 10093: a 32-bit
count or byte offset). Off by default: a message is 2 or 4 GiB on every rank.

Every rank's input is a formula of its rank and the element's index (``pattern``), so the reference is
computed, and compared, a slice at a time: nothing the size of the message is built but the message. A
slice whose elements are wrong names the first bad index, which says whether the fault starts at 2**31.
Where the memory is short the test is skipped, saying how much it needs.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.huge

ELEMENTS = (1 << 31) + 1025  # past 2**31 elements; in bfloat16, past 2**32 bytes
SLICE = 1 << 26
# the message, the backend's staging of it, and a slice of the check at a time, on each rank
COPIES = 3


PERIOD = 251 * 7
BLOCK = 1 << 20


def pattern(rank: int, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s elements ``start`` to ``stop``: small integers in [-4, 4], exact in every dtype and in
    any sum of 8 of them. They repeat every PERIOD elements, shifted by the rank, and step with each BLOCK
    of them, so an element read from the wrong place shows, 2**31 or 2**32 bytes away included. Made by
    tiling, not by arithmetic on every index: a 2**31-element check is otherwise minutes of CPU."""
    index = torch.arange(PERIOD, dtype=torch.int64)
    period = ((index % 251 + 3 * rank) % 7 - 3).to(torch.int16)  # int16: a quarter of the memory traffic
    first, last = start // BLOCK, (stop - 1) // BLOCK + 1
    blocks = (torch.arange(first, last, dtype=torch.int64) % 3 - 1).to(torch.int16)
    offset = first * BLOCK % PERIOD
    tiled = period.roll(-offset).repeat((last - first) * BLOCK // PERIOD + 2)[: (last - first) * BLOCK]
    values = (tiled.view(-1, BLOCK) + blocks[:, None]).view(-1)
    return values[start - first * BLOCK : stop - first * BLOCK].to(dtype)


def fill(tensor: torch.Tensor, rank: int) -> torch.Tensor:
    for start in range(0, tensor.numel(), SLICE):
        stop = min(start + SLICE, tensor.numel())
        tensor[start:stop] = pattern(rank, start, stop, tensor.dtype).to(tensor.device)
    return tensor


def first_wrong(tensor: torch.Tensor, expected_of: object) -> str | None:
    """The first slice of ``tensor`` that differs from ``expected_of(start, stop)``: where and how many."""
    for start in range(0, tensor.numel(), SLICE):
        stop = min(start + SLICE, tensor.numel())
        got, want = tensor[start:stop].cpu(), expected_of(start, stop)  # type: ignore[operator]
        bad = got != want
        if bad.any():
            i = int(bad.nonzero()[0])
            return (
                f"{int(bad.sum())} of elements {start} to {stop} wrong; first at {start + i} "
                f"({(start + i) / (1 << 31):.4f} x 2**31): got {got[i].item()}, expected {want[i].item()}"
            )
    return None


def _memory_short(pg, nbytes: int) -> str | None:  # noqa: ANN001
    need = COPIES * nbytes
    if pg.device.type == "cuda":
        free = torch.cuda.mem_get_info(pg.device)[0]
    else:  # the ranks share the host's memory
        need *= pg.world_size
        free = _available_host_memory()
    if free >= need:
        return None
    gib = 1 << 30
    return f"N/A: a {nbytes / gib:.1f} GiB message needs {need / gib:.0f} GiB free, {free / gib:.0f} here"


def _available_host_memory() -> int:
    """Linux's estimate of the memory a new allocation can get (MemAvailable), or 0 where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@pytest.mark.world_size()
@pytest.mark.needs("all_reduce", "broadcast")
@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16], ids=str)
def test_all_reduce_and_broadcast_past_2_31_elements(pg, dtype):
    """all_reduce SUM, then broadcast from the last rank, of 2**31 + 1025 elements: every slice exact."""
    nbytes = ELEMENTS * torch.empty(0, dtype=dtype).element_size()
    if reason := _memory_short(pg, nbytes):
        pytest.skip(reason)
    n = pg.world_size
    tensor = fill(torch.empty(ELEMENTS, dtype=dtype, device=pg.device), pg.rank)
    dist.all_reduce(tensor)

    def summed(start: int, stop: int) -> torch.Tensor:
        return sum(pattern(r, start, stop, torch.int16) for r in range(n)).to(dtype)

    wrong = first_wrong(tensor, summed)
    assert wrong is None, f"all_reduce sum of {ELEMENTS} {dtype} over {n} ranks: {wrong}"
    root = n - 1
    if pg.rank == root:
        fill(tensor, root)
    dist.broadcast(tensor, src=root)
    wrong = first_wrong(tensor, lambda start, stop: pattern(root, start, stop, dtype))
    assert wrong is None, f"broadcast of {ELEMENTS} {dtype} from rank {root} on rank {pg.rank}: {wrong}"
