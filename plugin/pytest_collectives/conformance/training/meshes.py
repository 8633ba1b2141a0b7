"""Device meshes over the default group, made once per shape in each rank process: each is a group
rendezvous of every rank.
"""

from __future__ import annotations

from typing import Any

_MESHES: dict[tuple[Any, str, tuple[int, ...]], Any] = {}


def mesh(device_type: str, shape: tuple[int, ...]) -> Any:
    """The device mesh of ``shape`` over the default group, cached for the process."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    key = (dist.group.WORLD, device_type, shape)
    if key not in _MESHES:
        names = ("dp", "tp") if len(shape) == 2 else None
        _MESHES[key] = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return _MESHES[key]


def mesh_shape(world_size: int, dims: int) -> tuple[int, ...] | None:
    """Every rank on one dimension, or (dp, tp) with tp = 2 where the world size is even and 4 or more."""
    if dims == 1:
        return (world_size,)
    return (world_size // 2, 2) if world_size >= 4 and world_size % 2 == 0 else None
