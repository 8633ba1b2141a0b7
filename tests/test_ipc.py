"""CUDA IPC sharing: the handle's trip through JSON on CPU (the GPU copy itself is in test_gpu.py and
suites/perf/test_p2p.py::test_cuda_ipc_copy), and the JSON broadcast on a real gloo group."""

from __future__ import annotations

import inspect
import json
import textwrap

import pytest
import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor

from pytest_collectives.execution.ipc import describe, rebuild_args, share

# What UntypedStorage._share_cuda_() returns for a buffer on cuda:1: opaque handles are raw bytes.
SHARE = (1, b"\x00\xffhandle\x10", 4096, 512, b"refcounter\x00", 24, b"\x01event", True)


def test_a_described_tensor_rebuilds_with_the_arguments_torch_pickles() -> None:
    view = torch.empty(64, 8, dtype=torch.bfloat16)[3:, ::2]
    desc = json.loads(json.dumps(describe(SHARE, view)))  # only JSON crosses between the ranks
    expected = (
        torch.Tensor, torch.Size([61, 4]), (8, 2), 24, torch.UntypedStorage, torch.bfloat16,
        1, b"\x00\xffhandle\x10", 4096, 512, False, b"refcounter\x00", 24, b"\x01event", True,
    )  # fmt: skip
    assert rebuild_args(desc) == expected


def test_the_arguments_match_torchs_rebuild_cuda_tensor() -> None:
    # The order of rebuild_args is torch's: a torch that changes it fails here, on CPU, not on a GPU box.
    assert list(inspect.signature(rebuild_cuda_tensor).parameters) == [
        "tensor_cls", "tensor_size", "tensor_stride", "tensor_offset", "storage_cls", "dtype",
        "storage_device", "storage_handle", "storage_size_bytes", "storage_offset_bytes", "requires_grad",
        "ref_counter_handle", "ref_counter_offset", "event_handle", "event_sync_required",
    ]  # fmt: skip


def test_a_missing_share_field_is_an_error_not_a_wrong_tensor() -> None:
    with pytest.raises(RuntimeError, match="gave 7 fields"):
        describe(SHARE[:7], torch.empty(1))


def test_sharing_a_cpu_tensor_is_refused() -> None:
    with pytest.raises(ValueError, match="CUDA IPC shares CUDA tensors, got one on cpu"):
        share(torch.empty(4), owner=0)


def test_json_is_broadcast_from_any_rank(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_it=textwrap.dedent(
            """
            import pytest, torch
            from pytest_collectives.execution.ipc import broadcast_json

            @pytest.mark.world_size(2, 3)
            @pytest.mark.parametrize("src", [0, 1])
            def test_broadcast(pg, src):
                sent = {"handle": "00ff" * 40, "size": [3, 4], "from": src, "note": "ünïcode ✓"}
                got = broadcast_json(sent if pg.rank == src else None, src, pg.device)
                assert got == sent
            """
        )
    )
    pytester.runpytest().assert_outcomes(passed=4)
