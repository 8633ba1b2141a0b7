"""The probe of the live group, once per world size, before a conformance test draws its examples.

A test marked ``conformance`` (or ``needs``) draws its dtypes and reduce ops from what the probe found
(pytest_collectives.conformance.capabilities.probe, cases.py's strategies); its answer is also the N/A
cells of the capability matrix. A test marked ``needs(*operations)`` none of which the backend supports
here is skipped as N/A, saying which.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from pytest_collectives.conformance import known_bugs

if TYPE_CHECKING:  # torch and hypothesis are imported once a conformance test runs, not when pytest starts
    from pytest_collectives.conformance.capabilities import Capabilities

MARKERS = (
    "conformance: the test draws its examples from what the backend was probed to support "
    "(pytest_collectives.conformance.cases); the probe runs once per world size",
    "needs(*operations, together=False): a conformance test that is N/A where the backend supports none "
    "of the operations (with together: not all of them with one dtype and op)",
    "training: a conformance test of a training stack (FSDP2, tensor parallel, DTensor) on the backend; "
    "`-m training` runs just those",
    "huge: the conformance tier of 2**31 elements and more, 2 to 4 GiB a message a rank; the suites run it "
    "with --huge",
)

# per (world size, configuration's variables), for this session
_PROBED = pytest.StashKey[dict[tuple[int, Any], "Capabilities"]]()
# The session's conformance.matrix.CapabilityMatrix, handed over when pytest configures (hooks); none on an
# SPMD rank other than 0, which reports nothing.
MATRIX = pytest.StashKey[Any]()


@pytest.fixture
def capabilities(request: pytest.FixtureRequest, world_size: int, backend_env: Any) -> Capabilities:
    """What the backend supports at this world size (in this configuration of --backend-env), probed on
    the live group once per session (``probed`` keeps it). Not a session-scoped fixture: pytest would keep
    a probe's failure (a group that failed to start once) and fail every later test with it."""
    return probed(request.config, world_size)


def probed(config: pytest.Config, world_size: int) -> Capabilities:
    """The probe at ``world_size`` in the running test's configuration, run on the live group the first
    time it is asked for in a session."""
    from pytest_collectives.conformance import capabilities as caps
    from pytest_collectives.execution.suite_api import SESSION, run_on_ranks

    configuration = config.stash[SESSION].configuration
    found = config.stash.setdefault(_PROBED, {})
    key = (world_size, configuration.env)
    if key not in found:
        answers = run_on_ranks(config, world_size, caps.probe)
        if any(answer.cells != answers[0].cells for answer in answers):
            differ = [r for r, answer in enumerate(answers) if answer.cells != answers[0].cells]
            pytest.fail(f"the ranks' probes disagree on what the backend supports (ranks {differ} vs 0)")
        withheld = known_bugs.withheld(config, answers[0].backend, world_size)
        semantics = _agreed_semantics([answer.semantics for answer in answers])
        found[key] = dataclasses.replace(answers[0].withholding(withheld), semantics=semantics)
        if (matrix := config.stash.get(MATRIX, None)) is not None:
            matrix.add_probe(found[key], configuration.id)
    return found[key]


def sized(config: pytest.Config, found: Capabilities) -> Capabilities:
    """The probe ``found`` with whether a sweep runs every cell at 1 Mi (``tiers``): by the group's
    topology, or where --tier-budget asks, by what a 1 Mi example costs on its live group
    (tiers.large_example_s, the slowest rank's) against the budget for all_reduce's cells, the most any
    sweep has. Decided once per probe, before the first sweep (``@sweep``) that draws from it; kept in the
    probe's place, where the matrix and a soak's replays read it."""
    from pytest_collectives.execution.suite_api import SESSION

    configuration = config.stash[SESSION].configuration
    key = (found.world_size, configuration.env)
    probes = config.stash.setdefault(_PROBED, {})
    if probes.get(key) is found and not found.timed:
        probes[key] = _decided(config, found)
        if (matrix := config.stash.get(MATRIX, None)) is not None:
            matrix.add_probe(probes[key], configuration.id)
    return probes.get(key, found)


def _decided(config: pytest.Config, found: Capabilities) -> Capabilities:
    from pytest_collectives.conformance import tiers
    from pytest_collectives.conformance.capabilities import DTYPES, REDUCE_OPS
    from pytest_collectives.conformance.cases import TIERS, supported_cells
    from pytest_collectives.conformance.settings import SETTINGS, ConformanceSettings
    from pytest_collectives.execution.suite_api import run_on_ranks

    budget = config.stash.get(SETTINGS, ConformanceSettings()).tier_budget_s
    if budget is None:
        (sharing, *_) = run_on_ranks(config, found.world_size, tiers.ranks_sharing_a_core)
        whole = tiers.every_cell_by_topology(found.device_type, sharing)
        return dataclasses.replace(found, timed=True, ranks_a_core=sharing, whole_large_tier=whole)
    sample = [cell for cell in tiers.SAMPLE if found.supports("all_reduce", *cell)]
    if not budget or not sample:
        return dataclasses.replace(found, timed=True)
    most = len(supported_cells(["all_reduce"], DTYPES, REDUCE_OPS, found))  # its sweep's cells
    ((took, draw), *_) = run_on_ranks(
        config, found.world_size, tiers.large_example_s, cells=sample, size=TIERS[1], most=most,
        budget_s=budget,
    )  # fmt: skip
    whole = tiers.every_cell_fits(most, took, draw, budget)
    return dataclasses.replace(
        found, timed=True, large_example_s=took, draw_s=draw, large_cells=most, whole_large_tier=whole
    )


def pinned(config: pytest.Config, world_size: int | None, env: Any) -> list[str]:
    """What a replay at ``world_size`` (in the configuration of ``env``) must say to run the 1 Mi tier as
    this session did, every cell or the one the seed turns to, whatever it would measure."""
    caps = config.stash.get(_PROBED, {}).get((world_size, env))
    if caps is None or not caps.tier_decided:
        return []
    return ["--tier-budget", "inf" if caps.whole_large_tier else "0"]


def _agreed_semantics(per_rank: list[dict[Any, str]]) -> dict[Any, str]:
    """Each rank's view of the backend's semantics, one answer per key: a backend whose ranks end with
    different results says so here (the suites' own tests fail it)."""
    agreed = {}
    for key, first in per_rank[0].items():
        answers = [ranks.get(key, "") for ranks in per_rank]
        agreed[key] = first if len(set(answers)) == 1 else "differs between ranks: " + " / ".join(answers)
    return agreed


_TRAINING_PROBED = pytest.StashKey[set[tuple[int, Any]]]()  # the probes (as _PROBED keys them) with them


@pytest.fixture(autouse=True)
def _drawn_from_probe(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("needs")
    if marker is None and request.node.get_closest_marker("conformance") is None:
        return
    from pytest_collectives.conformance import capabilities as caps
    from pytest_collectives.conformance import rotation
    from pytest_collectives.conformance.cases import applicable

    rotation.use(rotation.of_run(request.config))
    found: Capabilities = request.getfixturevalue("capabilities")
    if getattr(request.node.function, "collectives_sweep", False):
        found = sized(request.config, found)
    if request.node.get_closest_marker("training"):
        found = _with_training_rows(request, found)
    caps.use(found)
    if marker and not applicable(marker.args, **marker.kwargs):
        names = ", ".join(marker.args)
        pytest.skip(f"N/A: {found.backend} supports no {names} at {found.world_size} ranks")


def _with_training_rows(request: pytest.FixtureRequest, found: Capabilities) -> Capabilities:
    """The probe with the training stacks' rows added, probed once per world size, only in sessions that
    run a test marked ``training`` (each makes device meshes, a group rendezvous per mesh dimension)."""
    from pytest_collectives.conformance.training import stacks
    from pytest_collectives.execution.suite_api import SESSION, run_on_ranks

    configuration = request.config.stash[SESSION].configuration
    done = request.config.stash.setdefault(_TRAINING_PROBED, set())
    if (found.world_size, configuration.env) not in done:
        answers = run_on_ranks(request.config, found.world_size, stacks.probe_rows)
        found.cells.update(answers[0])
        found.answered.clear()  # answers given before these rows were there
        done.add((found.world_size, configuration.env))
        if (matrix := request.config.stash.get(MATRIX, None)) is not None:
            matrix.add_probe(found, configuration.id)
    return found
