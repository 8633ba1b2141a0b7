"""What a suite calls inside pytest: the ``pg`` and ``world_size`` fixtures, the running test's parameters
(set by the session around each call), and questions put to the live group through the session."""

from __future__ import annotations

import contextvars
import types
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from pytest_collectives.execution import options
from pytest_collectives.execution.outcome import GroupOutcome

# The running test's parameters and world sizes, set by DistributedSession around each call: a strategy is
# drawn inside the call, where the item itself is out of its reach.
PARAMS: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "collectives_params", default=types.MappingProxyType({})
)
SIZES: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar("collectives_sizes", default=())


def item_world_sizes() -> tuple[int, ...]:
    """The world sizes the running test runs at in this session (those selected and not skipped), for a
    strategy that shares work among them."""
    return SIZES.get()


def item_parameter(name: str) -> Any:
    """What the running test is parametrized with for ``name``. A hypothesis strategy is built before pytest
    parametrizes the test; one that draws what the parameter allows (the cases an algorithm supports)
    reads it here, while the examples are drawn."""
    params = PARAMS.get()
    if name not in params:
        known = ", ".join(params) or "none"
        raise LookupError(f"the running test has no parameter {name!r} (it has {known})")
    return params[name]


class OnRanks:
    """What ``pg`` is in the controller: the real one exists only on the ranks."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def __repr__(self) -> str:
        return f"<pg: {self.world_size} ranks>"


# Session scope: the value is fixed per parametrization, and hypothesis rightly objects to function-scoped
# fixtures shared by its examples. It also groups tests by world size, so groups are switched less often.
@pytest.fixture(scope="session")
def world_size(request: pytest.FixtureRequest) -> int:
    pytest.fail(
        f"{request.node.nodeid} uses world_size/pg but has no @pytest.mark.world_size(...) marker",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def pg(world_size: int) -> OnRanks:
    """On each rank: rank, world_size, backend, device, seed, group, new_group(ranks), generator(rank)."""
    return OnRanks(world_size)


# The session's DistributedSession, handed to the config when pytest configures (hooks.pytest_configure): how
# the functions below, which a suite calls with its config, reach it.
SESSION = pytest.StashKey["DistributedSession"]()


def settings_of(config: pytest.Config) -> options.Settings:
    """The resolved options of this session, for suites that size their parameters by them."""
    return config.stash[SESSION].settings


def run_on_ranks(config: pytest.Config, world_size: int, fn: Callable[..., Any], **kwargs: Any) -> list[Any]:
    """Call ``fn(pg=..., **kwargs)`` on every rank of a ``world_size`` group and return what each rank
    returned, in rank order: how a suite asks the live group a question (what its backend supports)
    before it draws examples. ``fn`` must be a module-level function; a failure on any rank raises."""
    return config.stash[SESSION].run_on_ranks(world_size, fn, kwargs)


def outcome_on_ranks(
    config: pytest.Config, world_size: int, fn: Callable[..., Any], timeout_s: float = 0.0, **kwargs: Any
) -> GroupOutcome:
    """``run_on_ranks``' call, its outcome returned whatever it is, a rank's failure, crash or hang (after
    ``timeout_s``, by default --dist-timeout) included: for a question whose answer is how the ranks end
    (conformance.mismatches). A group left unfit is replaced before the next call, as after a test."""
    return config.stash[SESSION].outcome_on_ranks(world_size, fn, kwargs, timeout_s)


def survives_a_crash(config: pytest.Config) -> bool:
    """Whether this session goes on after a rank crashes (pooled groups), or ends (torchrun, srun): for a
    test whose question may crash a rank."""
    return config.stash[SESSION].launcher.survives_a_crash
