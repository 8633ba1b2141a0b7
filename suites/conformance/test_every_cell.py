"""Every supported cell, every run: each registered implementation of each operation the registry has a
contract for (the backend's own calls among them) over every (dtype, reduce op) the probe found supported,
at every world size, at three size tiers, with small values and the dtypes' whole range. The random
examples of the other files vary everything else; this sweep leaves no supported cell to chance."""

from __future__ import annotations

import pytest

from pytest_collectives import algorithm_named, every_cell, matches_reference, registered, sweep

pytestmark = pytest.mark.conformance  # drawn from the probe of the live group

CONTRACTS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")


@pytest.mark.world_size()
@pytest.mark.parametrize("algorithm", [p for contract in CONTRACTS for p in registered(contract)])
@sweep(case=every_cell())
def test_every_supported_cell(pg, algorithm, case):
    implementation = algorithm_named(algorithm)
    matches_reference(pg, implementation.operation, implementation, case)
