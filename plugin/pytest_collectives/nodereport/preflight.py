"""NVML preflight: the GPU health facts that make a communication measurement meaningless when they are bad.

A collective that runs slowly on a node may be the fault of the links themselves, or of a GPU that is
not in a state to be measured: a PCIe link trained at x8, an NVLink that is down, a GPU whose memory has
uncorrectable errors, or clocks cut in half by a hardware slowdown. NVML (the `pynvml` module of the
optional package nvidia-ml-py, as in topology/machine.py) reports all of these, so they are read once
before the run and judged next to the bandwidth verdicts of checks.py:

- `read_nvml()` returns the facts as a JSON-compatible dict (validated by `FACTS_SCHEMA`). A query a GPU
  does not support (GeForce cards have no ECC or row remapper) leaves its field None; it never raises.
- `sample_throttle()` samples the clock-event (throttle) reasons and the PCIe link again, e.g. at session
  end, and merges them into the facts: both depend on load, and the preflight runs on idle GPUs.
- `preflight_checks()` turns the facts into `Check`s. Every non-PASS Check names its GPU (index, model,
  PCI bus id) and says what to look at, with the command to run.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from pytest_collectives.nodereport.checks import FAIL, PASS, WARN, Check
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
# The throttle rule. NVML documents the three HW reasons as "reducing the core clocks by a factor of 2 or
# more": a GPU under one runs every kernel at half speed or worse, so what the run measures is the cooling
# or power delivery, not the links, and both are the vendor's to fix. HW thermal and HW power brake have no
# innocent cause, so one sighting FAILs. NVML's note on HwSlowdown adds that it "may be also reported
# during PState or clock change", so one sighting of it alone can be that transient (the first sample is
# taken at idle, just as clocks start to move): it FAILs only when seen in at least two samples, and WARNs
# otherwise. SW thermal slowdown means the driver keeps the GPU or its memory below their maximum operating
# temperature: clocks drop gradually, results stay valid, but the cooling has no margin, so it WARNs.
# SwPowerCap (clocks held within the power limit under full load), GpuIdle, ApplicationsClocksSetting,
# SyncBoost and DisplayClockSetting are normal operation and are only listed.
HW_THROTTLE_FAIL = ("HwThermalSlowdown", "HwPowerBrakeSlowdown")
HW_SLOWDOWN = "HwSlowdown"
HW_SLOWDOWN_MIN_SAMPLES = 2
THROTTLE_WARN = ("SwThermalSlowdown",)
_REASON_TEXT = {
    "HwSlowdown": "HW slowdown (clocks cut by half or more: overheating, a power-brake signal, or a power "
    "spike)",
    "HwThermalSlowdown": "HW thermal slowdown (clocks cut by half or more because the GPU is too hot)",
    "HwPowerBrakeSlowdown": "HW power brake (clocks cut by half or more because the system, e.g. its power "
    "supply, asserted the power-brake signal)",
    "SwThermalSlowdown": "SW thermal slowdown (clocks lowered to keep the GPU or its memory below their "
    "maximum operating temperature)",
}
_THROTTLE_ADVICE = (
    "check `nvidia-smi -q -d PERFORMANCE` (Clocks Event Reasons) and `nvidia-smi -q -d TEMPERATURE,POWER` "
    "under load, then the fans, airflow and inlet temperature, and the power supplies and GPU power cables"
)

# ECC ships enabled on data-centre GPUs (Tesla, A100, H100, L40S, ...), so finding it off there means
# someone turned it off. Workstation cards (RTX A6000 ...) ship with it off, and GeForce cards have none
# (their ECC queries answer "not supported"), so neither is flagged.
_DATACENTRE = re.compile(r"\b(?:Tesla|[ABHLTVP]\d{1,3}S?|GH\d{3}|GB\d{3})\b")

# The facts travel in report.json, so their schema is part of the published report schema.
FACTS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    **load_schema("node-report.schema.json")["$defs"]["nvml_facts"],
}


# ---------------------------------------------------------------------------------------------------------
# Reading NVML


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


# ---------------------------------------------------------------------------------------------------------
# Judging


def _label(gpu: Mapping[str, Any]) -> str:
    return (
        f"GPU{gpu['index']} ({gpu.get('name') or 'unknown model'}, {gpu.get('bus_id') or 'unknown bus id'})"
    )


def _labels(gpus: Sequence[Mapping[str, Any]]) -> str:
    names = [_label(g) for g in gpus]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _lspci(gpu: Mapping[str, Any]) -> str:
    # NVML writes an 8-digit PCI domain ("00000000:18:00.0"); lspci -s wants the usual 4-digit one.
    m = re.fullmatch(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", gpu.get("bus_id") or "")
    if not m:
        return "`sudo lspci -vv`"
    return f"`sudo lspci -vv -s {int(m[1], 16):04x}:{m[2]}:{m[3]}.{m[4]}`".lower()


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _values(values: Sequence[int], fmt: str) -> str:
    return "/".join(fmt.format(v) for v in sorted(set(values)))


def _nvml_missing(facts: Mapping[str, Any]) -> Check:
    error = facts.get("error") or "NVML is not available"
    return Check(
        "nvml",
        WARN,
        f"NVML could not be read ({error}), so PCIe link width and generation, NVLink state, ECC errors, row "
        f"remapping, retired pages and clock throttling were not checked: install nvidia-ml-py "
        f"(`pip install nvidia-ml-py`) and make sure the NVIDIA driver is loaded (`nvidia-smi` must list the "
        f"GPUs).",
        {"error": error},
    )


def _versions(facts: Mapping[str, Any]) -> Check:
    driver = facts.get("driver_version") or "unknown"
    cuda = facts.get("cuda_driver_version") or "unknown"
    return Check(
        "nvidia driver",
        PASS,
        f"NVIDIA driver {driver}, supporting CUDA up to {cuda}.",
        {
            "driver_version": facts.get("driver_version"),
            "cuda_driver_version": facts.get("cuda_driver_version"),
        },
    )


def _lost(gpu: Mapping[str, Any]) -> Check:
    return Check(
        f"nvml GPU{gpu['index']}",
        FAIL,
        f"GPU{gpu['index']} could not be reached through NVML ({gpu['error']}): check `nvidia-smi` and the "
        f"kernel log (`sudo dmesg | grep -i xid`) for Xid errors; a GPU that has fallen off the bus needs a "
        f"reset or reboot, and replacing if it recurs.",
        {"gpu": gpu["index"], "error": gpu["error"]},
    )


def _judge_pcie_width(gpus: Sequence[Mapping[str, Any]]) -> list[Check]:
    checks, widths = [], []
    for gpu in gpus:
        pcie = gpu["pcie"]
        width, most = pcie.get("width_best"), pcie.get("width_max")
        if width is None or most is None:
            continue
        widths.append(width)
        if width < most:
            # NVIDIA GPUs keep their lanes when idle (they save power by lowering the generation), and the
            # highest width seen over all samples is judged, so a narrow link is a bad seat or riser.
            checks.append(
                Check(
                    f"pcie width GPU{gpu['index']}",
                    FAIL,
                    f"{_label(gpu)} has its PCIe link trained at x{width} of its maximum x{most}, which cuts "
                    f"its host and PCIe peer bandwidth to {width / most:.0%}: reseat the card or its riser "
                    f"and check `nvidia-smi -q -d PCI -i {gpu['index']}` (Link Width, Current against Max) "
                    f"or LnkSta against LnkCap in {_lspci(gpu)}.",
                    {"gpu": gpu["index"], "width": width, "width_max": most},
                )
            )
    if checks:
        return checks
    if not widths:
        return [Check("pcie width", PASS, "NVML reported no PCIe link width, so none was judged.")]
    return [
        Check(
            "pcie width",
            PASS,
            f"{_gpus(len(widths))} linked at their maximum PCIe width ({_values(widths, 'x{}')}).",
            {"gpus": len(widths)},
        )
    ]


def _judge_pcie_gen(gpus: Sequence[Mapping[str, Any]]) -> list[Check]:
    # GPUs lower their PCIe generation when idle to save power (nvidia-smi's own help says the current
    # generation "may be reduced when the GPU is not in use"; an NVIDIA engineer shows an RTX GPU at gen 1 in
    # P8 and gen 3 in P0, NVIDIA/open-gpu-kernel-modules#731). A preflight at idle therefore sees gen 1 on
    # healthy GPUs, while a link stuck below its maximum under load is a real fault (a slot forced to a
    # lower speed in the BIOS, a bad riser or retimer). So the highest generation seen over every sample is
    # judged (sample_throttle() adds samples under load), and falling short only WARNs, saying to re-check
    # under load: one snapshot cannot tell power saving from a fault.
    low, gens = [], []
    for gpu in gpus:
        pcie = gpu["pcie"]
        gen, most = pcie.get("gen_best"), pcie.get("gen_max")
        if gen is None or most is None:
            continue
        gens.append(gen)
        if gen < most:
            low.append(gpu)
    if low:
        figures = "; ".join(
            f"GPU{g['index']} gen {g['pcie']['gen_best']} of {g['pcie']['gen_max']}" for g in low
        )
        return [
            Check(
                "pcie generation",
                WARN,
                f"{_labels(low)} never reached their maximum PCIe generation while sampled ({figures}). GPUs "
                f"lower the generation when idle to save power, so this is expected if they were idle: "
                f"re-check under load, e.g. watch `nvidia-smi --query-gpu=index,pstate,pcie.link.gen.current,"
                f"pcie.link.gen.max --format=csv -l 1` during the bandwidth tests. A link that stays below "
                f"its maximum in P0 points to the BIOS PCIe speed setting, the riser or the slot (LnkSta "
                f"against LnkCap in `sudo lspci -vv`).",
                {"gpus": [g["index"] for g in low]},
            )
        ]
    if not gens:
        return [Check("pcie generation", PASS, "NVML reported no PCIe link generation, so none was judged.")]
    return [
        Check(
            "pcie generation",
            PASS,
            f"{_gpus(len(gens))} reached their maximum PCIe generation ({_values(gens, 'gen {}')}).",
            {"gpus": len(gens)},
        )
    ]


def _judge_nvlink(gpus: Sequence[Mapping[str, Any]]) -> list[Check]:
    checks = []
    with_links = [g for g in gpus if g.get("nvlinks")]
    any_active = any(link["active"] for g in with_links for link in g["nvlinks"])
    for gpu in with_links:
        down = [link["link"] for link in gpu["nvlinks"] if not link["active"]]
        active = len(gpu["nvlinks"]) - len(down)
        if active and down:
            checks.append(
                Check(
                    f"nvlink GPU{gpu['index']}",
                    FAIL,
                    f"{_label(gpu)} has NVLink {', '.join(map(str, down))} down while its other {active} "
                    f"are active, so its NVLink bandwidth is cut to {active / len(gpu['nvlinks']):.0%}: "
                    f"check `nvidia-smi nvlink --status -i {gpu['index']}` and reseat the NVLink bridge (or "
                    f"the GPU on its baseboard).",
                    {"gpu": gpu["index"], "down": down, "active": active},
                )
            )
        elif down and any_active:
            # All links of this GPU down while other GPUs have theirs up: a missing bridge, or a GPU cut off
            # the NVSwitch fabric. Mixed bridged and unbridged cards are legitimate, hence only a WARN.
            checks.append(
                Check(
                    f"nvlink GPU{gpu['index']}",
                    WARN,
                    f"{_label(gpu)} has none of its {len(down)} NVLinks active while other GPUs have active "
                    f"NVLinks: if it should be bridged or on the NVSwitch fabric, check `nvidia-smi nvlink "
                    f"--status -i {gpu['index']}`, the bridge, and on NVSwitch systems the fabric manager "
                    f"(`systemctl status nvidia-fabricmanager`).",
                    {"gpu": gpu["index"], "down": down, "active": 0},
                )
            )
    if checks:
        return checks
    if not any_active:
        return [Check("nvlink", PASS, "No GPU has an active NVLink (a PCIe-only node), so none was judged.")]
    counts = [len(g["nvlinks"]) for g in with_links]
    return [
        Check(
            "nvlink",
            PASS,
            f"{_gpus(len(with_links))} with all their NVLinks active ({_values(counts, '{}')} each).",
            {"gpus": len(with_links), "links": sum(counts)},
        )
    ]


def _memory_errors(n: int) -> str:
    return f"{n} uncorrectable memory error{'' if n == 1 else 's'}"


def _judge_ecc(gpus: Sequence[Mapping[str, Any]]) -> list[Check]:
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
                    f"{_label(gpu)} has had {_memory_errors(volatile)} since the driver last loaded, so"
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
                    f"{_label(gpu)} has logged {_memory_errors(aggregate)} over its lifetime (none"
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
                    f"ECC is disabled on {_label(gpu)}, a data-centre GPU that ships with it on{later}, so "
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
            f"{_gpus(counted)} with no uncorrectable memory errors, since the driver loaded or over their "
            f"lifetime.",
            {"gpus": counted},
        )
    ]


def _judge_row_remapping(gpus: Sequence[Mapping[str, Any]]) -> list[Check]:
    checks, judged = [], [g for g in gpus if g.get("remapped_rows") is not None]
    for gpu in judged:
        rows, i = gpu["remapped_rows"], gpu["index"]
        if rows["failure"]:
            checks.append(
                Check(
                    f"row remapping GPU{i}",
                    FAIL,
                    f"Row remapping has failed on {_label(gpu)}: a memory bank ran out of spare rows, so "
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
                    f"{_label(gpu)} has a row remapping pending, which only takes effect at the next GPU "
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
            f"{_gpus(len(judged))} with no pending or failed row remapping ({remapped} rows remapped in "
            f"all).",
            {"gpus": len(judged), "rows_remapped": remapped},
        )
    ]


def _judge_retired_pages(gpus: Sequence[Mapping[str, Any]]) -> list[Check]:
    checks, judged = [], [g for g in gpus if g.get("retired_pages") is not None]
    for gpu in judged:
        pages, i = gpu["retired_pages"], gpu["index"]
        if pages["pending"]:
            checks.append(
                Check(
                    f"retired pages GPU{i}",
                    WARN,
                    f"{_label(gpu)} has memory pages waiting to be retired, which happens at the next GPU "
                    f"reset: reset it (`sudo nvidia-smi -r -i {i}`) or reboot, and check `nvidia-smi -q -d "
                    f"PAGE_RETIREMENT -i {i}` against NVIDIA's RMA thresholds.",
                    {"gpu": i, **pages},
                )
            )
    if checks:
        return checks
    if not judged:
        return [Check("retired pages", PASS, "NVML reported no page retirement (a pre-Ampere feature).")]
    return [Check("retired pages", PASS, f"{_gpus(len(judged))} with no page retirement pending.")]


def _judge_throttle(gpus: Sequence[Mapping[str, Any]]) -> list[Check]:
    checks, judged = [], [g for g in gpus if g.get("throttle") is not None]
    for gpu in judged:
        counts, samples = gpu.get("throttle_counts") or {}, gpu.get("throttle_samples") or 0
        fail = [r for r in HW_THROTTLE_FAIL if r in gpu["throttle"]]
        warn = [r for r in THROTTLE_WARN if r in gpu["throttle"]]
        if HW_SLOWDOWN in gpu["throttle"]:
            if counts.get(HW_SLOWDOWN, 0) >= HW_SLOWDOWN_MIN_SAMPLES:
                fail.append(HW_SLOWDOWN)
            else:
                warn.append(HW_SLOWDOWN)
        if not fail and not warn:
            continue
        seen = "; ".join(f"{_REASON_TEXT[r]} in {counts.get(r, 0)} of {samples} samples" for r in fail + warn)
        once = (
            " NVML notes that HW slowdown can show briefly during a P-state change, so HW slowdown seen in a "
            "single sample only warns until it is seen again."
            if HW_SLOWDOWN in warn
            else ""
        )
        checks.append(
            Check(
                f"clocks GPU{gpu['index']}",
                FAIL if fail else WARN,
                f"{_label(gpu)} had its clocks cut: {seen}. Timings taken under it measure the cooling or "
                f"the power supply, not the links: {_THROTTLE_ADVICE}.{once}",
                {"gpu": gpu["index"], "reasons": fail + warn, "counts": dict(counts), "samples": samples},
            )
        )
    if checks:
        return checks
    if not judged:
        return [Check("clocks", PASS, "NVML reported no clock-event reasons, so none were judged.")]
    normal = sorted({r for g in judged for r in g["throttle"]})
    samples = min(g.get("throttle_samples") or 0 for g in judged)
    return [
        Check(
            "clocks",
            PASS,
            f"No hardware or thermal clock slowdown on {_gpus(len(judged))} over at least {samples} samples "
            f"each" + (f" (normal reasons seen: {', '.join(normal)})." if normal else "."),
            {"gpus": len(judged), "reasons": normal},
        )
    ]


def preflight_checks(facts: Mapping[str, Any]) -> list[Check]:
    """Verdicts on `read_nvml()` facts: versions, then PCIe, NVLink, memory errors and clock throttling.

    Without NVML this is one WARN saying what could not be checked. Otherwise each category gives one PASS
    when every GPU is fine, or a FAIL or WARN per GPU at fault (PCIe generation: one WARN naming them all).
    """
    if not facts.get("available"):
        return [_nvml_missing(facts)]
    checks = [_versions(facts)]
    gpus = list(facts.get("gpus") or [])
    if not gpus:
        return [
            *checks,
            Check(
                "gpus",
                WARN,
                "NVML is available but found no GPUs: check `nvidia-smi -L` and that the GPUs are not hidden "
                "from this container or VM.",
            ),
        ]
    checks += [_lost(g) for g in gpus if g.get("error") is not None]
    ready = [g for g in gpus if g.get("error") is None]
    for judge in (
        _judge_pcie_width,
        _judge_pcie_gen,
        _judge_nvlink,
        _judge_ecc,
        _judge_row_remapping,
        _judge_retired_pages,
        _judge_throttle,
    ):
        checks += judge(ready)
    return checks
