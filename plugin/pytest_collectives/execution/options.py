"""The plugin's options: parsed and checked here, as plain functions, so every bad value has one message."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

BACKENDS = ("gloo", "nccl")
CPU_WORLD_SIZES = (2, 3, 4)  # an odd size catches ring off-by-ones; 4 ranks still fit 2 cores
GPU_WORLD_SIZES = (2, 3, 4, 8)
DEFAULT_TIMEOUT_S = 120.0

# (name, help, default as ini text)
OPTIONS = (
    ("gpus", "run distributed tests on N CUDA GPUs with one rank per GPU (default 0: CPU ranks)", "0"),
    ("backend", "torch.distributed backend: gloo or nccl (default: nccl with --gpus, else gloo)", ""),
    ("world_sizes", "comma-separated world sizes for tests marked world_size() with no sizes", ""),
    ("dist_timeout", "seconds a distributed test may run before its ranks count as hung", "120"),
)


class OptionError(ValueError):
    """A bad option value; the message names the option and the fix."""


@dataclasses.dataclass(frozen=True)
class Settings:
    gpus: int = 0
    backend: str = "gloo"
    world_sizes: tuple[int, ...] = CPU_WORLD_SIZES
    timeout_s: float = DEFAULT_TIMEOUT_S
    # The most ranks one group can have, what world_size("max") means: the whole world under torchrun or
    # srun, else every GPU with --gpus, else the largest of the world sizes. 0: derive it from the others.
    largest: int = 0


def _gpus(text: str, count_gpus: Callable[[], int]) -> int:
    try:
        gpus = int(text)
    except ValueError:
        raise OptionError(f"--gpus {text}: expected a whole number of GPUs, e.g. --gpus 8") from None
    if gpus < 0:
        raise OptionError(f"--gpus {text}: the number of GPUs can't be negative; use 0 for CPU ranks")
    if gpus:
        found = count_gpus()
        if found == 0:
            raise OptionError(
                f"--gpus {gpus}: no CUDA GPU found on this machine; drop --gpus to run on CPU with gloo"
            )
        if gpus > found:
            raise OptionError(f"--gpus {gpus}: only {found} CUDA GPU(s) found; use --gpus {found} or fewer")
    return gpus


def _backend(text: str, gpus: int) -> str:
    backend = text or ("nccl" if gpus else "gloo")
    if backend not in BACKENDS:
        raise OptionError(f"--backend {text}: unknown backend; choose one of {', '.join(BACKENDS)}")
    if backend == "nccl" and not gpus:
        raise OptionError("--backend nccl needs GPUs: add --gpus N, or use --backend gloo on CPU")
    return backend


def _world_sizes(text: str, gpus: int) -> tuple[int, ...]:
    if not text:
        if not gpus:
            return CPU_WORLD_SIZES
        return tuple(sorted({n for n in GPU_WORLD_SIZES if n <= gpus} | ({gpus} if gpus >= 2 else set())))
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise OptionError(
            f"--world-sizes {text}: expected comma-separated whole numbers, e.g. --world-sizes 2,3,4"
        ) from None
    if any(n < 2 for n in sizes):
        raise OptionError(f"--world-sizes {text}: every world size must be at least 2 ranks")
    if len(set(sizes)) != len(sizes):
        raise OptionError(f"--world-sizes {text}: a world size is listed twice; list each once")
    if gpus and max(sizes) > gpus:
        raise OptionError(
            f"--world-sizes {text}: {max(sizes)} ranks need {max(sizes)} GPUs but --gpus is {gpus}"
        )
    return tuple(sorted(sizes))


def _timeout(text: str) -> float:
    try:
        timeout = float(text)
    except ValueError:
        raise OptionError(
            f"--dist-timeout {text}: expected a number of seconds, e.g. --dist-timeout 120"
        ) from None
    if not timeout > 0 or timeout == float("inf"):
        raise OptionError(f"--dist-timeout {text}: the timeout must be a positive number of seconds")
    return timeout


def resolve(values: dict[str, str], count_gpus: Callable[[], int]) -> Settings:
    """Settings from option texts (command line over ini); ``count_gpus`` is only called for --gpus > 0."""
    gpus = _gpus(values["gpus"], count_gpus)
    return Settings(
        gpus=gpus,
        backend=_backend(values["backend"], gpus),
        world_sizes=_world_sizes(values["world_sizes"], gpus),
        timeout_s=_timeout(values["dist_timeout"]),
    )


def count_cuda_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
