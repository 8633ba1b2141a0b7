"""The CUDA/NCCL paths of the plugin, run on whatever GPUs the machine has (skipped without one).

Run with ``pytest tests/test_gpu.py``; each test starts its own inner session with --gpus.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = needs_gpu


def gpu_count() -> int:
    return torch.cuda.device_count()


def test_nccl_group_runs_on_cuda_with_events_timing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it=textwrap.dedent(
            """
            import os, pytest, torch, torch.distributed as dist
            from pytest_collectives.algorithms import collectives as alg

            @pytest.mark.world_size(1)
            def test_on_gpu(pg):
                assert pg.backend == "nccl" and pg.device == torch.device("cuda", 0)
                assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
                t = torch.arange(10.0, device=pg.device)
                for fn in (alg.all_reduce_direct, alg.ring_all_reduce, alg.naive_ring_all_reduce):
                    assert torch.equal(fn(t.clone()), t)

            @pytest.mark.world_size(1)
            def test_bench(pg, benchmark):
                t = torch.ones(1 << 20, device=pg.device)
                benchmark(dist.all_reduce, t, nbytes=4 << 20, collective="all_reduce")
            """
        )
    )
    result = pytester.runpytest("--gpus", "1", "--benchmark-json", "out.json")
    result.assert_outcomes(passed=2)
    data = json.loads((pytester.path / "out.json").read_text())
    (bench,) = data["benchmarks"]
    assert bench["extra_info"]["backend"] == "nccl" and bench["extra_info"]["devices"] == [0]
    assert bench["stats"]["rounds"] >= 5 and bench["stats"]["median"] > 0


def test_gpu_usage_errors_name_the_count(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    n = gpu_count()
    result = pytester.runpytest("--gpus", str(n + 1))
    message = f"ERROR: --gpus {n + 1}: only {n} GPU(s) found; use --gpus {n} or fewer"
    result.stderr.fnmatch_lines([message])


def test_topology_fingerprint_on_gpu() -> None:
    from pytest_collectives.topology.detect import detect
    from pytest_collectives.topology.identity import topology_id

    fp = detect("nccl", gpu_count())
    assert topology_id(fp).startswith(f"gpu-{gpu_count()}x-")


@pytest.mark.skipif(gpu_count() < 2, reason="CUDA IPC between ranks needs 2 GPUs (one per rank)")
def test_cuda_ipc_copy_reads_the_owners_memory(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it=textwrap.dedent(
            """
            import pytest, torch, torch.distributed as dist
            from pytest_collectives.execution.ipc import share

            @pytest.mark.world_size(2)
            def test_ipc(pg):
                mine = torch.arange(1000.0, device=pg.device) * (pg.rank + 1)
                views = [share(mine[10:], owner=0)]
                assert views[0].device == torch.device("cuda", 0)
                if pg.rank == 1:
                    assert torch.equal(views[0].to(pg.device), torch.arange(10.0, 1000.0, device=pg.device))
                dist.barrier()
                if pg.rank == 0:
                    mine.fill_(-1.0)  # the owner writes; the peer sees it in place
                    torch.cuda.synchronize()
                dist.barrier()
                if pg.rank == 1:
                    assert views[0].eq(-1.0).all()
                views.clear()
                dist.barrier()
            """
        )
    )
    pytester.runpytest("--gpus", "2").assert_outcomes(passed=1)
