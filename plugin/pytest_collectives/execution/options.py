"""The plugin's options: parsed and checked here, as plain functions, so every bad value has one message."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

CPU_WORLD_SIZES = (2, 3, 4)  # an odd size catches ring off-by-ones; 4 ranks still fit 2 cores
# One rank is a world size too: NCCL has had one-rank bugs (issue 1950, a bf16 AVG tail left unreduced),
# and with --gpus 1 it is the only one.
GPU_WORLD_SIZES = (1, 2, 3, 4, 8)
DEFAULT_TIMEOUT_S = 120.0

# (name, help, default as ini text)
OPTIONS = (
    ("gpus", "run distributed tests on N CUDA GPUs with one rank per GPU (default 0: CPU ranks)", "0"),
    (
        "backend",
        "torch.distributed backend: any this torch has (gloo, nccl, ucc, mpi, xccl), one registered with "
        "Backend.register_backend, or 'cpu:gloo,cuda:nccl' (default: nccl with --gpus, else gloo)",
        "",
    ),
    (
        "backend_module",
        "modules imported before any process group starts, in pytest and on every rank, e.g. one that "
        "registers a backend with Backend.register_backend (comma-separated)",
        "",
    ),
    ("world_sizes", "comma-separated world sizes for tests marked world_size() with no sizes", ""),
    ("dist_timeout", "seconds a distributed test may run before its ranks count as hung", "120"),
)


class OptionError(ValueError):
    """A bad option value; the message names the option and the fix."""


@dataclasses.dataclass(frozen=True)
class Settings:
    gpus: int = 0
    backend: str = "gloo"
    backend_modules: tuple[str, ...] = ()  # imported before a group starts, here and on every rank
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


def available_backends() -> list[str]:
    """The backends this torch can start: its built-ins that were compiled in, and registered ones."""
    import torch.distributed as dist

    built_in = [
        name
        for name in ("gloo", "nccl", "ucc", "mpi", "xccl")
        if getattr(dist, f"is_{name}_available", lambda: False)()
    ]
    return built_in + sorted(name.lower() for name in dist.Backend._plugins)


def backend_modules(text: str, load: Callable[[str], object] = importlib.import_module) -> tuple[str, ...]:
    """Import each of the comma-separated modules (a third-party backend registers itself on import)."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    for name in names:
        try:
            load(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is the user's to fix, in one line
            raise OptionError(
                f"--backend-module {name}: can't import it ({type(exc).__name__}: {exc}); check the name "
                "and that its package is installed in this environment"
            ) from None
    return names


def _backend(text: str, gpus: int, available: Callable[[], list[str]] = available_backends) -> str:
    backend = text or ("nccl" if gpus else "gloo")
    # "cpu:gloo,cuda:nccl" names a backend per device type
    names = [part.split(":", 1)[-1].strip().lower() for part in backend.split(",")]
    if "nccl" in names and not gpus:
        raise OptionError("--backend nccl needs GPUs: add --gpus N, or use --backend gloo on CPU")
    known = available()
    missing = [name for name in names if name not in known]
    if missing:
        raise OptionError(
            f"--backend {text}: this torch has no {missing[0]!r} backend (it has {', '.join(known)}); a "
            "third-party backend registers itself when its module is imported: add --backend-module MODULE"
        )
    return backend


def _world_sizes(text: str, gpus: int) -> tuple[int, ...]:
    if not text:
        if not gpus:
            return CPU_WORLD_SIZES
        return tuple(sorted({n for n in GPU_WORLD_SIZES if n <= gpus} | {gpus}))
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise OptionError(
            f"--world-sizes {text}: expected comma-separated whole numbers, e.g. --world-sizes 2,3,4"
        ) from None
    if any(n < 1 for n in sizes):
        raise OptionError(f"--world-sizes {text}: every world size must be at least 1 rank")
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
    modules = backend_modules(values["backend_module"])
    return Settings(
        gpus=gpus,
        backend=_backend(values["backend"], gpus),
        backend_modules=modules,
        world_sizes=_world_sizes(values["world_sizes"], gpus),
        timeout_s=_timeout(values["dist_timeout"]),
    )


def count_cuda_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
