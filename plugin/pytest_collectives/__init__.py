"""pytest-collectives: run tests on every rank of a real torch.distributed process group."""

from pytest_collectives.algorithms.registry import algorithm
from pytest_collectives.execution.examples import examples, sweep

__all__ = ["algorithm", "examples", "sweep"]
