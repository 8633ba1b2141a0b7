"""What is recorded of a machine (CPU, GPUs, the links between them, software versions), and reading it
back from JSON with an error that names the field."""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_collectives.topology.links import is_link_token

LINK_SOURCES = ("nvml", "nvidia-smi", "none")


class FingerprintError(ValueError):
    """A fingerprint dict that does not have the expected shape; `field` is its path inside the dict."""

    def __init__(self, field: str, expected: str) -> None:
        self.field = field
        self.expected = expected
        super().__init__(f"field '{field}' must be {expected}")


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    name: str
    pci_bus_id: str | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    backend: str
    torch_version: str
    cpu_model: str
    logical_cores: int
    sockets: int
    numa_nodes: int
    gpus: tuple[GpuInfo, ...] = ()
    links: tuple[tuple[str, ...], ...] = ()  # links[i][j] between gpus i and j; empty when not known
    link_source: str = "none"  # one of LINK_SOURCES
    driver_version: str | None = None
    cuda_version: str | None = None
    nccl_version: str | None = None

    @property
    def kind(self) -> str:
        return "gpu" if self.gpus else "cpu"

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["gpus"] = [dataclasses.asdict(g) for g in self.gpus]
        data["links"] = [list(row) for row in self.links]
        return data

    @classmethod
    def from_json(cls, data: Any) -> Fingerprint:
        """Rebuild from `to_json()` output, checking every field; raises FingerprintError."""
        fields = {f.name for f in dataclasses.fields(cls)}
        d = _mapping(data, "", fields)
        gpus = tuple(_gpu_from_json(g, f"gpus[{i}]") for i, g in enumerate(_list(d, "gpus")))
        links = tuple(tuple(_str_list(row, f"links[{i}]")) for i, row in enumerate(_list(d, "links")))
        if links and (len(links) != len(gpus) or any(len(row) != len(gpus) for row in links)):
            raise FingerprintError(
                "links", f"an empty list or a {len(gpus)} x {len(gpus)} matrix, one row per GPU"
            )
        for i, row in enumerate(links):
            for j, cell in enumerate(row):
                if not is_link_token(cell) or (cell == "X") != (i == j):
                    raise FingerprintError(
                        f"links[{i}][{j}]", "X on the diagonal, else NV#, PIX, PXB, PHB, NODE or SYS"
                    )
        link_source = _str(d, "link_source")
        if link_source not in LINK_SOURCES:
            raise FingerprintError("link_source", f"one of {', '.join(LINK_SOURCES)}")
        return cls(
            backend=_str(d, "backend"),
            torch_version=_str(d, "torch_version"),
            cpu_model=_str(d, "cpu_model"),
            logical_cores=_positive_int(d, "logical_cores"),
            sockets=_positive_int(d, "sockets"),
            numa_nodes=_positive_int(d, "numa_nodes"),
            gpus=gpus,
            links=links,
            link_source=link_source,
            driver_version=_optional_str(d, "driver_version"),
            cuda_version=_optional_str(d, "cuda_version"),
            nccl_version=_optional_str(d, "nccl_version"),
        )


def _mapping(data: Any, where: str, fields: set[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise FingerprintError(where or "(top level)", "an object")
    prefix = f"{where}." if where else ""
    missing, unknown = sorted(fields - data.keys()), sorted(data.keys() - fields)
    if missing:
        raise FingerprintError(prefix + missing[0], "present")
    if unknown:
        raise FingerprintError(prefix + unknown[0], "absent (unknown field)")
    return {f"{prefix}{k}": v for k, v in data.items()}


def _gpu_from_json(data: Any, where: str) -> GpuInfo:
    d = _mapping(data, where, {f.name for f in dataclasses.fields(GpuInfo)})
    ints = ("pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max")
    return GpuInfo(
        name=_str(d, f"{where}.name"),
        pci_bus_id=_optional_str(d, f"{where}.pci_bus_id"),
        **{k: _optional_positive_int(d, f"{where}.{k}") for k in ints},
    )


def _str(d: dict[str, Any], key: str) -> str:
    value = d[key]
    if not isinstance(value, str) or not value:
        raise FingerprintError(key, "a non-empty string")
    return value


def _optional_str(d: dict[str, Any], key: str) -> str | None:
    return None if d[key] is None else _str(d, key)


def _positive_int(d: dict[str, Any], key: str) -> int:
    value = d[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise FingerprintError(key, "a positive integer")
    return value


def _optional_positive_int(d: dict[str, Any], key: str) -> int | None:
    return None if d[key] is None else _positive_int(d, key)


def _list(d: dict[str, Any], key: str) -> list[Any]:
    if not isinstance(d[key], list):
        raise FingerprintError(key, "a list")
    return d[key]


def _str_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FingerprintError(where, "a list of strings")
    return value
