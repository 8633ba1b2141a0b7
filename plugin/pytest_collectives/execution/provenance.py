"""What ran: the versions, the command as typed and the seed, recorded in every report a run writes, so a
report someone signs (or files) says how to run it again."""

from __future__ import annotations

import importlib.metadata
import platform
import shlex
import sys
from typing import Any

import pytest


def provenance(config: pytest.Config) -> dict[str, Any]:
    """The plugin's, torch's and Python's versions, the command line as typed, the folder it was typed
    in, and the ``--hypothesis-seed`` given (None: each test drew its own, its failure says which; as
    typed, not a soak's seed of its last pass)."""
    try:
        plugin = importlib.metadata.version("pytest-collectives")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout's plugin/ on the path
        plugin = "not installed"
    torch = sys.modules.get("torch")
    seed = getattr(config.known_args_namespace, "hypothesis_seed", None)
    return {
        "plugin": plugin,
        "torch": str(getattr(torch, "__version__", "not imported")),
        "python": platform.python_version(),
        "command": shlex.join(["pytest", *map(str, config.invocation_params.args)]),
        "directory": str(config.invocation_params.dir),
        "hypothesis_seed": None if seed is None else str(seed),
    }


def provenance_line(run: dict[str, Any]) -> str:
    """The record as one line a report opens with (the seed is in the command where one was given)."""
    return (
        f"pytest-collectives {run['plugin']}, torch {run['torch']}, Python {run['python']}: "
        f"`{run['command']}` in {run['directory']}"
    )
