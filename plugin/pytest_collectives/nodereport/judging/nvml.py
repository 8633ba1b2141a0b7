"""NVML facts: the GPU health that makes a communication measurement meaningless when it is bad, read once
before the run (and sampled again under load); the names a verdict gives the GPUs are gpu_names.py's.

NVML is the `pynvml` module of the optional package nvidia-ml-py, as in topology/detect.py. Reading is kept
apart from judging (preflight.py) so that the facts can travel in report.json, validated by `FACTS_SCHEMA`,
and be judged again from there:

- `read_nvml()` returns the facts as a JSON-compatible dict. A query a GPU does not support (GeForce cards
  have no ECC or row remapper) leaves its field None; it never raises.
- `sample_throttle()` samples the clock-event (throttle) reasons and the PCIe link again, e.g. at session
  end, and merges them into the facts: both depend on load, and the preflight runs on idle GPUs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from pytest_collectives.schemas import load_schema

# Names as in pynvml, after the nvmlClocksEventReason / nvmlClocksThrottleReason prefix. BoardLimit and
# Reliability exist only in newer NVML; a bit the module has no constant for is reported as its hex value.
CLOCK_REASONS = (
    "GpuIdle",
    "ApplicationsClocksSetting",
    "SwPowerCap",
    "HwSlowdown",
    "SyncBoost",
    "SwThermalSlowdown",
    "HwThermalSlowdown",
    "HwPowerBrakeSlowdown",
    "DisplayClockSetting",
    "BoardLimit",
    "Reliability",
)

# The facts travel in report.json, so their schema is part of the published report schema.
FACTS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    **load_schema("node-report.schema.json")["$defs"]["nvml_facts"],
}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _text(value: Any) -> str | None:
    if value is None:
        return None
    # pynvml returns bytes or str depending on its version.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _import(nvml: ModuleType | Any | None) -> tuple[Any, str | None]:
    if nvml is not None:
        return nvml, None
    try:
        import pynvml
    except ImportError as exc:
        return None, f"pynvml could not be imported ({_one_line(exc)})"
    return pynvml, None


def _query(nvml: Any, fn_name: str, *args: Any) -> Any:
    """One NVML call, or None when it fails: a field this GPU or driver cannot report stays empty."""
    fn = getattr(nvml, fn_name, None)
    if fn is None:  # an older pynvml without this function
        return None
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _int(nvml: Any, fn_name: str, *args: Any) -> int | None:
    value = _query(nvml, fn_name, *args)
    return None if value is None else int(value)


def _init(nvml: Any) -> str | None:
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError, OSError) as exc:
        return f"nvmlInit failed ({_one_line(exc)})"
    return None


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        pass  # the facts are read; a failed shutdown must not lose them


def _unavailable(error: str) -> dict[str, Any]:
    return {
        "available": False,
        "error": error,
        "driver_version": None,
        "cuda_driver_version": None,
        "gpus": [],
    }


def _cuda_version(nvml: Any) -> str | None:
    for fn_name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
        value = _int(nvml, fn_name)
        if value is not None:
            return f"{value // 1000}.{value % 1000 // 10}"  # 12020 -> 12.2, as nvidia-smi prints it
    return None


def _reason_bits(nvml: Any) -> list[tuple[str, int]]:
    bits = []
    for name in CLOCK_REASONS:
        bit = getattr(nvml, f"nvmlClocksEventReason{name}", None)
        if bit is None:
            bit = getattr(nvml, f"nvmlClocksThrottleReason{name}", None)
        if bit:
            bits.append((name, int(bit)))
    return bits


def _throttle_reasons(nvml: Any, handle: Any) -> list[str] | None:
    """The clock-event reasons active now, by name; None when neither NVML function answers."""
    mask = None
    # The Throttle function is deprecated in favour of the Event one, which older drivers lack.
    for fn_name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        mask = _int(nvml, fn_name, handle)
        if mask is not None:
            break
    if mask is None:
        return None
    names = []
    for name, bit in _reason_bits(nvml):
        if mask & bit:
            names.append(name)
            mask &= ~bit
    names += [f"0x{1 << b:x}" for b in range(mask.bit_length()) if mask >> b & 1]
    return sorted(names)


def _nvlinks(nvml: Any, handle: Any) -> list[dict[str, Any]]:
    links = []
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 0))):
        state = _query(nvml, "nvmlDeviceGetNvLinkState", handle, link)
        if state is not None:  # links past the GPU's own count answer "not supported" or "invalid"
            links.append({"link": link, "active": state == enabled})
    return links


def _ecc(nvml: Any, handle: Any) -> dict[str, Any]:
    mode = _query(nvml, "nvmlDeviceGetEccMode", handle)  # [current, pending]
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    return {
        "enabled": None if mode is None else mode[0] == enabled,
        "pending_enabled": None if mode is None else mode[1] == enabled,
        "volatile_uncorrected": _int(
            nvml, "nvmlDeviceGetTotalEccErrors", handle, uncorrected, getattr(nvml, "NVML_VOLATILE_ECC", 0)
        ),
        "aggregate_uncorrected": _int(
            nvml, "nvmlDeviceGetTotalEccErrors", handle, uncorrected, getattr(nvml, "NVML_AGGREGATE_ECC", 1)
        ),
    }


def _remapped_rows(nvml: Any, handle: Any) -> dict[str, Any] | None:
    rows = _query(nvml, "nvmlDeviceGetRemappedRows", handle)  # (corrRows, uncRows, isPending, failure)
    if rows is None:
        return None
    corr, unc, pending, failure = rows
    return {
        "correctable": int(corr),
        "uncorrectable": int(unc),
        "pending": bool(pending),
        "failure": bool(failure),
    }


def _retired_pages(nvml: Any, handle: Any) -> dict[str, Any] | None:
    def count(cause: str, default: int) -> int | None:
        pages = _query(nvml, "nvmlDeviceGetRetiredPages", handle, getattr(nvml, cause, default))
        return None if pages is None else len(pages)

    pending = _query(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    pages = {
        "single_bit_ecc": count("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
        "double_bit_ecc": count("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1),
        "pending": None if pending is None else pending == getattr(nvml, "NVML_FEATURE_ENABLED", 1),
    }
    # Page retirement is the pre-Ampere mechanism (Ampere and later remap rows instead).
    return None if all(v is None for v in pages.values()) else pages


def _read_gpu(nvml: Any, index: int) -> dict[str, Any]:
    gpu: dict[str, Any] = {
        "index": index,
        "error": None,
        "name": None,
        "bus_id": None,
        "pcie": dict.fromkeys(("gen", "gen_max", "width", "width_max", "gen_best", "width_best")),
        "nvlinks": [],
        "ecc": dict.fromkeys(("enabled", "pending_enabled", "volatile_uncorrected", "aggregate_uncorrected")),
        "remapped_rows": None,
        "retired_pages": None,
        "throttle": None,
        "throttle_counts": {},
        "throttle_samples": 0,
    }
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        gpu["error"] = _one_line(exc)  # "GPU is lost", "Unknown Error": the GPU itself is unreachable
        return gpu
    gpu["name"] = _text(_query(nvml, "nvmlDeviceGetName", handle))
    pci = _query(nvml, "nvmlDeviceGetPciInfo", handle)
    gpu["bus_id"] = _text(getattr(pci, "busId", None))
    pcie = gpu["pcie"]
    pcie["gen"] = pcie["gen_best"] = _int(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle)
    pcie["gen_max"] = _int(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle)
    pcie["width"] = pcie["width_best"] = _int(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle)
    pcie["width_max"] = _int(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle)
    gpu["nvlinks"] = _nvlinks(nvml, handle)
    gpu["ecc"] = _ecc(nvml, handle)
    gpu["remapped_rows"] = _remapped_rows(nvml, handle)
    gpu["retired_pages"] = _retired_pages(nvml, handle)
    _merge_sample(nvml, handle, gpu)
    return gpu


def _merge_sample(nvml: Any, handle: Any, gpu: dict[str, Any]) -> None:
    reasons = _throttle_reasons(nvml, handle)
    if reasons is not None:
        gpu["throttle"] = sorted(set(gpu["throttle"] or ()) | set(reasons))
        for name in reasons:
            gpu["throttle_counts"][name] = gpu["throttle_counts"].get(name, 0) + 1
        gpu["throttle_samples"] += 1
    pcie = gpu["pcie"]
    for key, fn_name in (
        ("gen_best", "nvmlDeviceGetCurrPcieLinkGeneration"),
        ("width_best", "nvmlDeviceGetCurrPcieLinkWidth"),
    ):
        value = _int(nvml, fn_name, handle)
        if value is not None:
            pcie[key] = value if pcie[key] is None else max(pcie[key], value)


def read_nvml(nvml: ModuleType | None = None) -> dict[str, Any]:
    """The NVML facts of every GPU (see FACTS_SCHEMA); `nvml` is pynvml or a stand-in with its API.

    Never raises for a missing library, driver or unsupported query: no pynvml or a failing nvmlInit gives
    {"available": False, "error": "<why>"}, and a query that fails leaves its field None.
    """
    nvml, error = _import(nvml)
    if nvml is None:
        return _unavailable(error or "pynvml is not available")
    error = _init(nvml)
    if error:
        return _unavailable(error)
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            return _unavailable(f"nvmlDeviceGetCount failed ({_one_line(exc)})")
        return {
            "available": True,
            "error": None,
            "driver_version": _text(_query(nvml, "nvmlSystemGetDriverVersion")),
            "cuda_driver_version": _cuda_version(nvml),
            "gpus": [_read_gpu(nvml, i) for i in range(count)],
        }
    finally:
        _shutdown(nvml)


def sample_throttle(facts: Mapping[str, Any], nvml: ModuleType | None = None) -> dict[str, Any]:
    """A copy of `facts` with one more sample of each GPU's clock-event reasons and PCIe link merged in.

    Call it while or right after the GPUs are loaded (e.g. at session end): throttling that only shows
    under load is recorded (sorted union of reasons, with a count per reason), and so is the highest PCIe
    generation and width reached, which idle GPUs lower to save power. Facts without NVML come back as they
    are, as do GPUs that cannot be reached now.
    """
    out = copy.deepcopy(dict(facts))
    if not out.get("available"):
        return out
    nvml, _ = _import(nvml)
    if nvml is None or _init(nvml):
        return out
    try:
        for gpu in out["gpus"]:
            if gpu.get("error") is not None:
                continue
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(gpu["index"])
            except nvml.NVMLError:
                continue
            _merge_sample(nvml, handle, gpu)
    finally:
        _shutdown(nvml)
    return out
