"""The pooled launcher: this pytest forks its ranks, in warm worker groups it reuses (warm_groups.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_collectives.execution.configurations import Env
from pytest_collectives.execution.messages import Task
from pytest_collectives.execution.options import Settings
from pytest_collectives.execution.outcome import GroupOutcome
from pytest_collectives.topology.detect import usable_cores


def oversubscribed(cores: int) -> str:
    """Why a CPU benchmark of more ranks than usable cores is skipped."""
    return (
        f"benchmark of {{n}} CPU ranks on {cores} usable core(s) would time the scheduler, not the "
        "communication; run it where the session may use as many cores as ranks (os.sched_getaffinity)"
    )


class PooledLauncher:
    survives_a_crash = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._pool: Any = None

    @property
    def pool(self) -> Any:
        # Imported lazily: a session without distributed tests never loads torch.
        if self._pool is None:
            from pytest_collectives.execution.launchers.warm_groups import GroupPool

            s = self.settings
            self._pool = GroupPool(
                s.backend, s.timeout_s, s.gpus, device_type=s.device_type, modules=s.backend_modules
            )
        return self._pool

    def size_limit(self, metafunc: pytest.Metafunc) -> tuple[int | None, str]:
        gpus = self.settings.gpus
        if gpus:
            return gpus, f"needs {{n}} GPUs; --gpus is {gpus}"
        if "benchmark" in metafunc.fixturenames:
            cores = len(usable_cores())
            return cores, oversubscribed(cores)
        return None, ""

    def collected(self, items: list[pytest.Item]) -> None:
        # Started already where the paths named world_size (hooks._expect_groups); else not yet.
        if any(item.get_closest_marker("world_size") for item in items):
            from pytest_collectives.execution.launchers.forkserver import forkserver_context, warm_up

            warm_up(forkserver_context(), training=any(item.get_closest_marker("training") for item in items))

    @contextlib.contextmanager
    def hypothesis_settings(self, fn: Any) -> Iterator[None]:
        yield  # the engine runs here, in the controller, as it would without the plugin

    def run(self, task: Task, test: Callable[..., Any]) -> GroupOutcome:
        return self.pool.run(task, task.world_size)

    def done_with(self, world_size: int, env: Env = ()) -> None:
        # Groups of every size kept to the end would hold 35 processes for world sizes 2 to 8; tests are
        # ordered by world size, so a size's group is seldom needed again (and is started anew if it is).
        if self._pool is not None:
            self._pool.discard(world_size, env)

    def summary(self) -> str:
        return f"{self.pool.started} worker group(s) started"

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
