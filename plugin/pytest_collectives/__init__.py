"""pytest-collectives: run tests on every rank of a real torch.distributed process group."""
