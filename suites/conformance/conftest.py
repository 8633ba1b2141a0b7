"""Probe what the backend supports once per world size, before the suites draw their examples.

The probe runs on the live group (pytest_collectives.conformance.capabilities.probe); its answer is what
the strategies in cases.py draw from and the N/A cells of the capability matrix. A test marked
``needs(*operations)`` none of which the backend supports here is skipped as N/A, saying which.
"""

from __future__ import annotations

import pytest
from cases import applicable

from pytest_collectives.conformance import capabilities as caps
from pytest_collectives.execution.session import run_on_ranks, settings_of

_PROBED = pytest.StashKey[dict[int, caps.Capabilities]]()  # per world size, for this session


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(*operations, together=False): the test is N/A where the backend supports none "
        "of the operations (with together: not all of them with one dtype and op)",
    )


@pytest.fixture(scope="session")
def capabilities(request: pytest.FixtureRequest, world_size: int) -> caps.Capabilities:
    probed = request.config.stash.setdefault(_PROBED, {})
    if world_size not in probed:
        answers = run_on_ranks(request.config, world_size, caps.probe)
        if any(answer != answers[0] for answer in answers):
            differ = [r for r, answer in enumerate(answers) if answer != answers[0]]
            pytest.fail(f"the ranks' probes disagree on what the backend supports (ranks {differ} vs 0)")
        settings = settings_of(request.config)
        device_type = "cuda" if settings.gpus else "cpu"
        probed[world_size] = caps.Capabilities(settings.backend, device_type, world_size, answers[0])
        matrix = request.config.pluginmanager.get_plugin("collectives-capabilities")
        if matrix is not None:
            matrix.add_probe(probed[world_size])
    return probed[world_size]


@pytest.fixture(autouse=True)
def _drawn_from_probe(request: pytest.FixtureRequest, capabilities: caps.Capabilities) -> None:
    caps.use(capabilities)
    marker = request.node.get_closest_marker("needs")
    if marker and not applicable(marker.args, **marker.kwargs):
        names = ", ".join(marker.args)
        pytest.skip(f"N/A: {capabilities.backend} supports no {names} at {capabilities.world_size} ranks")
