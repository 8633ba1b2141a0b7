"""Verdicts on a GPU's memory from the NVML facts: uncorrectable ECC errors, the ECC mode, row remapping
(Ampere on) and page retirement (before Ampere).

These are the preflight's RMA questions: each FAIL or WARN names the GPU, the `nvidia-smi` query that shows
the counters, and when the counts call for a reset or a return to the vendor. preflight.py runs them with the
other categories.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_collectives.nodereport.judging.gpu_names import label, ngpus
from pytest_collectives.verdict import FAIL, PASS, WARN, Check

# ECC ships enabled on data-centre GPUs (Tesla, A100, H100, L40S, ...), so finding it off there means
# someone turned it off. Workstation cards (RTX A6000 ...) ship with it off, and GeForce cards have none
# (their ECC queries answer "not supported"), so neither is flagged.
_DATACENTRE = re.compile(r"\b(?:Tesla|[ABHLTVP]\d{1,3}S?|GH\d{3}|GB\d{3})\b")


def _memory_errors(n: int) -> str:
    return f"{n} uncorrectable memory error{'' if n == 1 else 's'}"


def judge_ecc(gpus: Sequence[Mapping[str, Any]]) -> list[Check]:
    checks, counted = [], 0
    for gpu in gpus:
        ecc, i = gpu["ecc"], gpu["index"]
        volatile, aggregate = ecc.get("volatile_uncorrected"), ecc.get("aggregate_uncorrected")
        counted += volatile is not None or aggregate is not None
        details = {"gpu": i, "volatile_uncorrected": volatile, "aggregate_uncorrected": aggregate}
        if volatile:
            checks.append(
                Check(
                    f"ecc GPU{i}",
                    FAIL,
                    f"{label(gpu)} has had {_memory_errors(volatile)} since the driver last loaded, so"
                    f" results computed on it cannot be trusted: check `nvidia-smi -q -d "
                    f"ECC,ROW_REMAPPER -i {i}` and `sudo dmesg | grep -i xid` (Xid 48, 63, 64, 94, 95), "
                    f"reset the GPU and re-run; if errors come back, open an RMA.",
                    details,
                )
            )
        elif aggregate:
            checks.append(
                Check(
                    f"ecc GPU{i}",
                    WARN,
                    f"{label(gpu)} has logged {_memory_errors(aggregate)} over its lifetime (none"
                    f" since the driver last loaded): compare `nvidia-smi -q -d ECC,ROW_REMAPPER,"
                    f"PAGE_RETIREMENT -i {i}` with NVIDIA's RMA thresholds and open an RMA if it meets them.",
                    details,
                )
            )
        if ecc.get("enabled") is False and _DATACENTRE.search(gpu.get("name") or ""):
            later = " (it is set to turn on at the next reboot)" if ecc.get("pending_enabled") else ""
            checks.append(
                Check(
                    f"ecc mode GPU{i}",
                    WARN,
                    f"ECC is disabled on {label(gpu)}, a data-centre GPU that ships with it on{later}, so "
                    f"memory errors go undetected: enable it with `sudo nvidia-smi -i {i} -e 1` and reboot.",
                    {"gpu": i, "enabled": False, "pending_enabled": ecc.get("pending_enabled")},
                )
            )
    if checks:
        return checks
    if not counted:
        return [
            Check("ecc", PASS, "NVML reported no ECC error counts (GPUs without ECC), so none were judged.")
        ]
    return [
        Check(
            "ecc",
            PASS,
            f"{ngpus(counted)} with no uncorrectable memory errors, since the driver loaded or over their "
            f"lifetime.",
            {"gpus": counted},
        )
    ]


def judge_row_remapping(gpus: Sequence[Mapping[str, Any]]) -> list[Check]:
    checks, judged = [], [g for g in gpus if g.get("remapped_rows") is not None]
    for gpu in judged:
        rows, i = gpu["remapped_rows"], gpu["index"]
        if rows["failure"]:
            checks.append(
                Check(
                    f"row remapping GPU{i}",
                    FAIL,
                    f"Row remapping has failed on {label(gpu)}: a memory bank ran out of spare rows, so "
                    f"errors in it can no longer be repaired, which NVIDIA counts as grounds for an RMA: "
                    f"confirm with `nvidia-smi -q -d ROW_REMAPPER -i {i}` (Remapping Failure Occurred: Yes).",
                    {"gpu": i, **rows},
                )
            )
        elif rows["pending"]:
            checks.append(
                Check(
                    f"row remapping GPU{i}",
                    WARN,
                    f"{label(gpu)} has a row remapping pending, which only takes effect at the next GPU "
                    f"reset: stop the processes on it and run `sudo nvidia-smi -r -i {i}` (or reboot), then "
                    f"check `nvidia-smi -q -d ROW_REMAPPER -i {i}` shows Pending: No.",
                    {"gpu": i, **rows},
                )
            )
    if checks:
        return checks
    if not judged:
        return [
            Check(
                "row remapping",
                PASS,
                "NVML reported no row remapper (it exists from Ampere on), so none was judged.",
            )
        ]
    remapped = sum(g["remapped_rows"]["correctable"] + g["remapped_rows"]["uncorrectable"] for g in judged)
    return [
        Check(
            "row remapping",
            PASS,
            f"{ngpus(len(judged))} with no pending or failed row remapping ({remapped} rows remapped in "
            f"all).",
            {"gpus": len(judged), "rows_remapped": remapped},
        )
    ]


def judge_retired_pages(gpus: Sequence[Mapping[str, Any]]) -> list[Check]:
    checks, judged = [], [g for g in gpus if g.get("retired_pages") is not None]
    for gpu in judged:
        pages, i = gpu["retired_pages"], gpu["index"]
        if pages["pending"]:
            checks.append(
                Check(
                    f"retired pages GPU{i}",
                    WARN,
                    f"{label(gpu)} has memory pages waiting to be retired, which happens at the next GPU "
                    f"reset: reset it (`sudo nvidia-smi -r -i {i}`) or reboot, and check `nvidia-smi -q -d "
                    f"PAGE_RETIREMENT -i {i}` against NVIDIA's RMA thresholds.",
                    {"gpu": i, **pages},
                )
            )
    if checks:
        return checks
    if not judged:
        return [Check("retired pages", PASS, "NVML reported no page retirement (a pre-Ampere feature).")]
    return [Check("retired pages", PASS, f"{ngpus(len(judged))} with no page retirement pending.")]
