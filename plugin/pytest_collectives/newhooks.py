"""Hook specs of pytest-collectives, added with ``pytest_addhooks`` (as pytest-xdist's newhooks.py)."""

from __future__ import annotations

from typing import Any

import pytest


def pytest_collectives_call_done(
    item: pytest.Item, world_size: int, kwargs: dict[str, Any], verdict: str
) -> None:
    """A distributed call ended: one call of a plain test, or one hypothesis example, on ``world_size``
    ranks with these arguments (the values hypothesis drew among them); ``verdict`` is "passed", "failed"
    or "skipped". Called in the process that runs the session (each rank's own under torchrun/srun)."""
