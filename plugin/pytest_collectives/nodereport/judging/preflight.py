"""NVML preflight verdicts: the facts that nvml.py read, judged next to the bandwidth verdicts of the link
checks.

A collective that runs slowly on a node may be the fault of the links themselves, or of a GPU that is not in
a state to be measured: a PCIe link trained at x8, an NVLink that is down, a GPU whose memory has
uncorrectable errors (gpumemory.py), or clocks cut in half by a hardware slowdown. `preflight_checks()` turns
the facts into `Check`s; every non-PASS Check names its GPU (index, model, PCI bus id) and says what to look
at, with the command to run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_collectives.nodereport.judging.gpu_names import label, labels, listed, lspci, ngpus
from pytest_collectives.nodereport.judging.gpumemory import (
    judge_ecc,
    judge_retired_pages,
    judge_row_remapping,
)
from pytest_collectives.verdict import FAIL, PASS, WARN, Check

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
                    f"{label(gpu)} has its PCIe link trained at x{width} of its maximum x{most}, which cuts "
                    f"its host and PCIe peer bandwidth to {width / most:.0%}: reseat the card or its riser "
                    f"and check `nvidia-smi -q -d PCI -i {gpu['index']}` (Link Width, Current against Max) "
                    f"or LnkSta against LnkCap in {lspci(gpu)}.",
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
            f"{ngpus(len(widths))} linked at their maximum PCIe width ({listed(widths, 'x{}')}).",
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
                f"{labels(low)} never reached their maximum PCIe generation while sampled ({figures}). GPUs "
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
            f"{ngpus(len(gens))} reached their maximum PCIe generation ({listed(gens, 'gen {}')}).",
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
                    f"{label(gpu)} has NVLink {', '.join(map(str, down))} down while its other {active} "
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
                    f"{label(gpu)} has none of its {len(down)} NVLinks active while other GPUs have active "
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
            f"{ngpus(len(with_links))} with all their NVLinks active ({listed(counts, '{}')} each).",
            {"gpus": len(with_links), "links": sum(counts)},
        )
    ]


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
                f"{label(gpu)} had its clocks cut: {seen}. Timings taken under it measure the cooling or "
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
            f"No hardware or thermal clock slowdown on {ngpus(len(judged))} over at least {samples} samples "
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
        judge_ecc,
        judge_row_remapping,
        judge_retired_pages,
        _judge_throttle,
    ):
        checks += judge(ready)
    return checks
