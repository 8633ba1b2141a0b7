"""What machine this is: GPUs, links (nvidia-smi topo -m, NVML), the topology id."""
