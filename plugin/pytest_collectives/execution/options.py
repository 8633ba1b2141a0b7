"""Execution's options (the groups, the backend, the soak): declared, parsed and checked here, as plain
functions, so every bad value has one message."""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable

import pytest

from pytest_collectives.errors import OptionError
from pytest_collectives.execution.configurations import Configuration, parse
from pytest_collectives.option import Option

CPU_WORLD_SIZES = (2, 3, 4)  # an odd size catches ring off-by-ones; 4 ranks still fit 2 cores
# One rank is a world size too: NCCL has had one-rank bugs (issue 1950, a bf16 AVG tail left unreduced),
# and with --gpus 1 it is the only one.
GPU_WORLD_SIZES = (1, 2, 3, 4, 8)
DEFAULT_TIMEOUT_S = 120.0

# each also an ini setting; the flag's value lands in collectives_<name>
OPTIONS = (
    Option(
        "gpus",
        "run distributed tests on N accelerators (torch.accelerator: CUDA GPUs, XPUs, ...) with one rank "
        "per device (default 0: CPU ranks)",
        default="0",
        ini="string",
        metavar="N",
        dest="collectives_gpus",
    ),
    Option(
        "backend",
        "torch.distributed backend: any this torch has (gloo, nccl, ucc, mpi, xccl), one registered with "
        "Backend.register_backend, or 'cpu:gloo,cuda:nccl' (default: torch's backend for the device type: "
        "nccl on CUDA GPUs, xccl on XPUs, gloo on CPU)",
        default="",
        ini="string",
        metavar="NAME",
        dest="collectives_backend",
    ),
    Option(
        "backend_module",
        "modules imported before any process group starts, in pytest and on every rank, e.g. one that "
        "registers a backend with Backend.register_backend (comma-separated)",
        default="",
        ini="string",
        metavar="MODULES",
        dest="collectives_backend_module",
    ),
    Option(
        "world_sizes",
        "comma-separated world sizes for tests marked world_size() with no sizes (default 2,3,4 on CPU, an "
        "odd size catching ring off-by-ones; with GPUs, those of 1,2,3,4,8 that fit, and the GPU count)",
        default="",
        ini="string",
        metavar="SIZES",
        dest="collectives_world_sizes",
    ),
    Option(
        "dist_timeout",
        "seconds a distributed test may run before its ranks count as hung: every rank's stack is shown and "
        "its group replaced (default 120)",
        default="120",
        ini="string",
        metavar="SECONDS",
        dest="collectives_dist_timeout",
    ),
    Option(
        "backend_env",
        "run the distributed tests once per backend setting: NAME=V1,V2 (environment variables the worker "
        "groups start with, a comma in a value written \\,; repeatable: every combination) or a preset "
        "(nccl-proto, nccl-algo, nccl-p2p, nccl-shm, nccl-nvls, gloo-transport, gloo-lazy-init, or a "
        "backend module's own); ini: one a line",
        default="",
        ini="string",
        action="append",
        metavar="SETTING",
        dest="collectives_backend_env",
    ),
    Option(
        "reproductions",
        "folder each failing check that can be reproduced alone writes its standalone reproduction to: a "
        "Python file needing only torch and the backend, named under the failure (default "
        ".collectives/reproductions under the rootdir)",
        default="",
        ini="string",
        metavar="DIR",
        dest="collectives_reproductions",
    ),
    Option(
        "soak",
        "burn-in: run the selected tests again and again (a fresh hypothesis seed each pass, the same "
        "worker groups) until DURATION (240s, 30m, 8h) is spent or Ctrl-C, then report each failure's "
        "rate, first time and replay command",
        metavar="DURATION",
    ),
)
_UNITS = {"s": 1, "m": 60, "h": 3600}


def texts(config: pytest.Config) -> dict[str, str]:
    """Each option's text, the command line over the ini: what ``resolve`` and ``soak_seconds`` parse."""
    return {option.name: option.text(config) for option in OPTIONS}


@dataclasses.dataclass(frozen=True)
class Settings:
    gpus: int = 0
    backend: str = "gloo"
    device_type: str = "cpu"  # the ranks' devices: cpu, or the accelerator's type with --gpus
    backend_modules: tuple[str, ...] = ()  # imported before a group starts, here and on every rank
    world_sizes: tuple[int, ...] = CPU_WORLD_SIZES
    timeout_s: float = DEFAULT_TIMEOUT_S
    # The most ranks one group can have, what world_size("max") means: the whole world under torchrun or
    # srun, else every GPU with --gpus, else the largest of the world sizes. 0: derive it from the others.
    largest: int = 0
    # --backend-env: each distributed test runs once per configuration; a plain run has the one, empty
    configurations: tuple[Configuration, ...] = ()
    reproductions: str = ""  # --reproductions as given; "" for the default under the rootdir


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
                f"--gpus {gpus}: no GPU or other accelerator (torch.accelerator) found on this machine; "
                "drop --gpus to run on CPU ranks"
            )
        if gpus > found:
            raise OptionError(f"--gpus {gpus}: only {found} GPU(s) found; use --gpus {found} or fewer")
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


def accelerator_type() -> str:
    """The device type of this machine's accelerator (cuda, xpu, hpu, ...): torch.accelerator's, where this
    torch has it (2.6 and later), else CUDA's."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return "cuda"
    found = accelerator.current_accelerator()
    return found.type if found is not None else "cuda"


def count_accelerators() -> int:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return accelerator.device_count() if accelerator.is_available() else 0


def backend_devices(backend: str) -> list[str]:
    """The device types ``backend`` runs on, as torch.distributed records them (a built-in's, or what
    ``Backend.register_backend(devices=)`` said); a 'cpu:gloo,cuda:nccl' string runs on those it names."""
    import torch.distributed as dist

    if ":" in backend:
        return [part.split(":", 1)[0].strip().lower() for part in backend.split(",")]
    # (torch before 2.1 kept no such record: its built-ins' then)
    recorded = getattr(dist.Backend, "backend_capability", {"nccl": ["cuda"]})
    return list(recorded.get(backend.lower(), ["cpu", "cuda"]))


def default_backend(device_type: str) -> str:
    """torch's backend for ``device_type`` (nccl on cuda, xccl on xpu, gloo on cpu, or a registered one)."""
    import torch.distributed as dist

    defaults = getattr(dist.Backend, "default_device_backend_map", {"cpu": "gloo", "cuda": "nccl"})
    return defaults.get(device_type, "gloo")


def _backend(
    text: str,
    device_type: str,
    available: Callable[[], list[str]] = available_backends,
    devices_of: Callable[[str], list[str]] = backend_devices,
) -> str:
    backend = text or default_backend(device_type)
    runs_on = devices_of(backend)
    if device_type not in runs_on:
        where = ", ".join(runs_on)
        if device_type == "cpu":
            raise OptionError(
                f"--backend {backend} runs on {where} devices, not on CPU ranks: add --gpus N (one rank per "
                "device), or use --backend gloo on CPU"
            )
        torchs = default_backend(device_type)  # gloo where this torch maps no backend to the device type
        raise OptionError(
            f"--backend {backend} runs on {where}, not on this machine's {device_type} devices: drop --gpus "
            f"to run it on CPU ranks, or pick a backend for {device_type}"
            + (f" (torch's is {torchs})" if torchs != backend else "")
        )
    # "cpu:gloo,cuda:nccl" names a backend per device type
    names = [part.split(":", 1)[-1].strip().lower() for part in backend.split(",")]
    known = available()
    missing = [name for name in names if name not in known]
    if missing:
        raise OptionError(
            f"--backend {text}: this torch has no {missing[0]!r} backend (it has {', '.join(known)}); a "
            "third-party backend registers itself when its module is imported: add --backend-module MODULE"
        )
    return backend


def _device_and_backend(text: str, gpus: int) -> tuple[str, str]:
    """The ranks' device type (cpu, or the accelerator's with --gpus) and the backend checked against it."""
    device_type = accelerator_type() if gpus else "cpu"
    return device_type, _backend(text, device_type)


def _world_sizes(text: str, gpus: int, world: int) -> tuple[int, ...]:
    if not text:
        if world:  # torchrun's or srun's: 2, 3, 4, 8 where they fit, and the whole world
            return tuple(sorted({n for n in GPU_WORLD_SIZES if 1 < n <= world} | {world}))
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
    if gpus and not world and max(sizes) > gpus:  # a world of several nodes has more ranks than GPUs here
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


def resolve(
    values: dict[str, str], count_gpus: Callable[[], int], world: int = 0, per_node: int = 0
) -> Settings:
    """Settings from option texts (command line over ini); ``count_gpus`` is only called for --gpus > 0.
    ``world``, ``per_node``: the ranks torchrun or srun started (SPMD mode), and how many of them run on each
    node: the largest group and the world sizes' default, each node's ranks driving its GPUs (--gpus counts
    this node's)."""
    gpus = _gpus(values["gpus"], count_gpus)
    if gpus and per_node > gpus:
        raise OptionError(
            f"--gpus {gpus}: {per_node} ranks per node need a GPU each; use --gpus {per_node} or start fewer "
            "ranks per node"
        )
    modules = backend_modules(values["backend_module"])  # before the presets: a module may add its own
    device_type, backend = _device_and_backend(values["backend"], gpus)
    return Settings(
        configurations=parse(values.get("backend_env", "").splitlines()),
        gpus=gpus,
        backend=backend,
        device_type=device_type,
        backend_modules=modules,
        world_sizes=_world_sizes(values["world_sizes"], gpus, world),
        timeout_s=_timeout(values["dist_timeout"]),
        largest=world,
        reproductions=values.get("reproductions", ""),
    )


def duration(text: str) -> float:
    """Seconds of ``240s``, ``30m``, ``8h`` or a plain number of seconds; a bad one is a one-line error."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not found or float(found.group(1)) <= 0:
        raise OptionError(f"--soak {text}: expected a duration such as 240s, 30m or 8h")
    return float(found.group(1)) * _UNITS[found.group(2) or "s"]


def soak_seconds(text: str, spmd_mode: bool, under_xdist: bool) -> float | None:
    """The seconds --soak asks for (None without it); an error where it can't run (a bad duration,
    pytest-xdist, SPMD mode)."""
    if not text:
        return None
    if spmd_mode or under_xdist:
        raise OptionError(
            "--soak runs the tests pass after pass in this pytest: drop -n (pytest-xdist), and torchrun "
            "or srun"
        )
    return duration(text)
