"""The ranks' device type comes from the machine's accelerator and the backend, not from CUDA alone: on
this CPU machine, a fake torch.accelerator stands for an XPU node."""

from __future__ import annotations

import pytest
import torch

from pytest_collectives import devices
from pytest_collectives.execution import options

pytestmark = pytest.mark.skipif(
    not hasattr(torch, "accelerator"), reason=f"torch {torch.__version__} has no torch.accelerator (2.6 has)"
)
VALUES = {"gpus": "2", "backend": "", "backend_module": "", "world_sizes": "", "dist_timeout": "120"}


@pytest.fixture
def xpu_node(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    """torch.accelerator as an XPU node shows it; what the code asks of it is recorded."""
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("xpu"))
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda i: calls.append(("set", i)))
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 1)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda d=None: calls.append(("sync", d)))
    return calls


def test_an_accelerator_device_is_driven_through_torch_accelerator(xpu_node) -> None:
    xpu = torch.device("xpu", 1)
    devices.select(xpu)
    devices.synchronize(xpu)
    assert xpu_node == [("set", 1), ("sync", xpu)]
    assert devices.current_index(xpu) == 1
    cpu = torch.device("cpu")
    devices.select(cpu)
    devices.synchronize(cpu)
    assert devices.current_index(cpu) is None and len(xpu_node) == 2  # a CPU rank has nothing to drive


def test_the_backend_follows_the_accelerator(xpu_node) -> None:
    assert options.accelerator_type() == "xpu"
    # torch's backend for xpu is xccl, which this CPU build of torch lacks: named, with the fix
    with pytest.raises(options.OptionError, match="--backend : this torch has no 'xccl' backend"):
        options.resolve(VALUES, lambda: 2)
    # gloo is recorded for cpu and cuda only: on an XPU node it is refused before any rank starts
    refused = "--backend gloo runs on cpu, cuda, not on this machine's xpu devices: drop --gpus"
    with pytest.raises(options.OptionError, match=refused):
        options.resolve({**VALUES, "backend": "gloo"}, lambda: 2)
    settings = options.resolve({**VALUES, "gpus": "0"}, lambda: 0)
    assert (settings.device_type, settings.backend) == ("cpu", "gloo")
