"""Judging a node: each check (links, peers, bandwidth, NVML preflight, GPU memory) and the verdict."""
