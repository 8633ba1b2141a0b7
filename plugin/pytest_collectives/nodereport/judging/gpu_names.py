"""How a verdict names the GPUs it describes: every non-PASS Check names its GPU by index, model and PCI
bus id, as NVML reported them (nvml.py), so that the line read on a dashboard finds the card in the rack.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any


def label(gpu: Mapping[str, Any]) -> str:
    return (
        f"GPU{gpu['index']} ({gpu.get('name') or 'unknown model'}, {gpu.get('bus_id') or 'unknown bus id'})"
    )


def labels(gpus: Sequence[Mapping[str, Any]]) -> str:
    names = [label(g) for g in gpus]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def lspci(gpu: Mapping[str, Any]) -> str:
    # NVML writes an 8-digit PCI domain ("00000000:18:00.0"); lspci -s wants the usual 4-digit one.
    m = re.fullmatch(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", gpu.get("bus_id") or "")
    if not m:
        return "`sudo lspci -vv`"
    return f"`sudo lspci -vv -s {int(m[1], 16):04x}:{m[2]}:{m[3]}.{m[4]}`".lower()


def ngpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def listed(values: Sequence[int], fmt: str) -> str:
    return "/".join(fmt.format(v) for v in sorted(set(values)))
