"""Byte counts as people read them (1 MiB, not 1048576).

The report's tables, its plots' axes and the fleet's figure names (`busbw all_reduce @ 1 MiB`) all show
message sizes; one format for all of them lets a reader match a fleet outlier to the row of the node's report
it came from.
"""

from __future__ import annotations


def human_bytes(value: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:g} {unit}"
    return f"{value:g} B"
