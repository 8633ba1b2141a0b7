"""The outlier rule every node and fleet check shares (they return verdict.Check, as every part of a run).

A figure is judged against a reference (its peers' median, a baseline, a floor): FAIL below DEFAULT_THRESHOLD
times it, WARN below DEFAULT_WARN (`status_for`), and against peers only where it also stands out from
their own spread (`below_peers`, the modified z-score). The link checks, the host-device checks, the NVML
preflight and the fleet all speak in these terms, so a status means the same wherever it is read.
"""

from __future__ import annotations

import numpy as np

from pytest_collectives.nodereport.judging.links import LOOPBACK_LINK
from pytest_collectives.verdict import FAIL, PASS, WARN, VerdictError

# The lines come from the spread healthy pairs show. In the seed 8 x RTX 3090 matrix the NV4 pairs sit within
# 0.4% of their median and the SYS pairs (staged through host memory) within -7% and +11% (MAD 3%); +-5% noise
# on top of that (a repeat of the measurement) still leaves every healthy pair above 0.88 x its class median.
# So 0.90 is where doubt starts, and 0.75 is far below anything healthy: no vendor ships a node with a quarter
# of a bond's bandwidth gone. A pair must also stand out from its class's own spread (MODIFIED_Z).
DEFAULT_THRESHOLD = 0.75  # a pair or device below this fraction of its reference FAILs
DEFAULT_WARN = 0.9  # ... and below this one WARNs
# Iglewicz and Hoaglin's cut-off for the modified z-score 0.6745 (x - median) / MAD: besides being well below
# the median, an outlier must stand out from the spread the class shows anyway (NUMA distance, slots).
MODIFIED_Z = 3.5
_MAD_SCALE = 0.6745


class NodeCheckError(VerdictError):
    """Bad input to a node check; the message is one line naming what to fix."""


def check_levels(threshold: float, warn: float) -> None:
    if not 0 < threshold <= warn <= 1:
        raise NodeCheckError(f"need 0 < threshold <= warn <= 1, got threshold={threshold} and warn={warn}")


def status_for(ratio: float, threshold: float, warn: float, link: str = "") -> str:
    """FAIL below ``threshold`` x the reference, WARN below ``warn`` x, else PASS (never FAIL on loopback)."""
    status = FAIL if ratio < threshold else WARN if ratio < warn else PASS
    # Loopback between CPU ranks has no hardware to fail: its speed is the host's load, worth a warning only.
    return WARN if status == FAIL and link == LOOPBACK_LINK else status


def robust(values: np.ndarray) -> tuple[float, float]:
    """The median of ``values`` and their median absolute deviation (MAD) from it."""
    median = float(np.median(values))
    return median, float(np.median(np.abs(values - median)))


def modified_z(value: float, median: float, mad: float) -> float | None:
    """How far ``value`` is below ``median`` in units of the spread (None when there is no spread)."""
    return float(_MAD_SCALE * (median - value) / mad) if mad > 0 else None


def below_peers(value: float, median: float, mad: float, warn: float) -> bool:
    """The outlier rule, for pairs, GPUs and fleet nodes alike: below ``warn`` x the median, and standing out
    from the spread (MODIFIED_Z), or from no spread at all."""
    if median <= 0 or value / median >= warn:
        return False
    z = modified_z(value, median, mad)
    return z is None or z > MODIFIED_Z
