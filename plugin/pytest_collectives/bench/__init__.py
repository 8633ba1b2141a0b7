"""Timing on the ranks (nccl-tests' schedule), bandwidth, and pytest-benchmark's fixture."""
