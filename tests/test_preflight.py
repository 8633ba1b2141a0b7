"""NVML preflight checks against a fake pynvml: a healthy node, one planted fault at a time, missing NVML."""

import inspect
import json
import re
import sys
from dataclasses import dataclass, field

import jsonschema
import pytest
from test_topology import FakeNvml as TopologyFakeNvml

from pytest_collectives.nodereport.judging.nvml import FACTS_SCHEMA, read_nvml, sample_throttle
from pytest_collectives.nodereport.judging.preflight import preflight_checks
from pytest_collectives.verdict import FAIL, PASS, WARN, Check

# Values as in pynvml (nvidia-ml-py 13.x).
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
_ERROR_TEXT = {2: "Invalid Argument", 3: "Not Supported", 9: "Driver Not Loaded", 15: "GPU is lost"}
REASON_BITS = {
    "GpuIdle": 0x1,
    "ApplicationsClocksSetting": 0x2,
    "SwPowerCap": 0x4,
    "HwSlowdown": 0x8,
    "SyncBoost": 0x10,
    "SwThermalSlowdown": 0x20,
    "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80,
    "DisplayClockSetting": 0x100,
}


class NVMLError(Exception):
    """pynvml's error: a value, and a subclass per value (NVMLError_NotSupported ...)."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    def __init__(self, value: int = NVML_ERROR_NOT_SUPPORTED) -> None:
        super().__init__(value)


def mask(*names: str) -> int:
    return sum(REASON_BITS[n] for n in names)


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    bus: int = 0x18
    gen: int = 5
    gen_max: int = 5
    width: int = 16
    width_max: int = 16
    nvlinks: list[bool] = field(default_factory=lambda: [True] * 18)
    ecc_mode: tuple[int, int] = (1, 1)
    volatile_uncorrected: int = 0
    aggregate_uncorrected: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)  # corrRows, uncRows, isPending, failureOccurred
    retired: tuple[list[int], list[int], int] | None = None  # None: page retirement unsupported (H100)
    reasons: int = mask("SwPowerCap")
    lost: bool = False


class FakeNvml:
    """The slice of pynvml that nvml.py uses; each GPU's state is a FakeGpu, changeable between calls."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 36  # nvidia-ml-py 13 (18 before NVLink 5)
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    # Optional queries: those a GeForce card, an older GPU or a MIG instance may answer "not supported".
    OPTIONAL = (
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetName",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetCurrentClocksEventReasons",
    )

    def __init__(self, gpus: list[FakeGpu], unsupported: tuple[str, ...] = (), init_error: int | None = None):
        self.gpus = gpus
        self.unsupported = set(unsupported)
        self.init_error = init_error
        self.initialised = 0
        self.calls: list[str] = []
        for name, bit in REASON_BITS.items():
            setattr(self, f"nvmlClocksEventReason{name}", bit)
            setattr(self, f"nvmlClocksThrottleReason{name}", bit)

    def _call(self, fn: str, handle: int | None = None) -> FakeGpu | None:
        assert self.initialised > 0, f"{fn} called outside nvmlInit/nvmlShutdown"
        self.calls.append(fn)
        if fn in self.unsupported:
            raise NVMLError_NotSupported()
        return None if handle is None else self.gpus[handle]

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        assert self.initialised > 0, "nvmlShutdown without nvmlInit"
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> bytes:
        self._call("nvmlSystemGetDriverVersion")
        return b"550.54.15"  # bytes, as older pynvml versions return

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._call("nvmlSystemGetCudaDriverVersion_v2")
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._call("nvmlDeviceGetHandleByIndex")
        if self.gpus[i].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._call("nvmlDeviceGetName", h).name

    def nvmlDeviceGetPciInfo(self, h: int):
        bus = self._call("nvmlDeviceGetPciInfo", h).bus
        return type("c_nvmlPciInfo_t", (), {"busId": f"00000000:{bus:02X}:00.0".encode()})()

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._call("nvmlDeviceGetCurrPcieLinkGeneration", h).gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._call("nvmlDeviceGetMaxPcieLinkGeneration", h).gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._call("nvmlDeviceGetCurrPcieLinkWidth", h).width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._call("nvmlDeviceGetMaxPcieLinkWidth", h).width_max

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        gpu = self._call("nvmlDeviceGetNvLinkState", h)
        if link >= len(gpu.nvlinks):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # past the GPU's own links
        return self.NVML_FEATURE_ENABLED if gpu.nvlinks[link] else self.NVML_FEATURE_DISABLED

    def nvmlDeviceGetEccMode(self, h: int) -> list[int]:
        return list(self._call("nvmlDeviceGetEccMode", h).ecc_mode)

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter_type: int) -> int:
        gpu = self._call("nvmlDeviceGetTotalEccErrors", h)
        assert error_type == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "only uncorrected errors are judged"
        return {
            self.NVML_VOLATILE_ECC: gpu.volatile_uncorrected,
            self.NVML_AGGREGATE_ECC: gpu.aggregate_uncorrected,
        }[counter_type]

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return self._call("nvmlDeviceGetRemappedRows", h).remapped

    def _retired(self, fn: str, h: int) -> tuple[list[int], list[int], int]:
        gpu = self._call(fn, h)
        if gpu.retired is None:
            raise NVMLError_NotSupported()
        return gpu.retired

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        return self._retired("nvmlDeviceGetRetiredPages", h)[cause]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return self._retired("nvmlDeviceGetRetiredPagesPendingStatus", h)[2]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._call("nvmlDeviceGetCurrentClocksEventReasons", h).reasons


def hgx(n: int = 8, **changes) -> list[FakeGpu]:
    """A healthy H100 HGX node, as sampled under load: every link at its maximum, all NVLinks up."""
    return [FakeGpu(bus=0x18 + 0x10 * i, **changes) for i in range(n)]


def flagged(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status != PASS]


def named_gpus(checks: list[Check]) -> set[int]:
    return {int(m) for c in checks for m in re.findall(r"GPU(\d+)", f"{c.name} {c.reason}")}


def validate(facts: dict) -> None:
    jsonschema.Draft202012Validator(FACTS_SCHEMA).validate(facts)


# ---------------------------------------------------------------------------------------------------------
# Reading


def test_healthy_node_passes_every_category_with_counts():
    nvml = FakeNvml(hgx())
    facts = read_nvml(nvml)
    assert nvml.initialised == 0, "nvmlShutdown must follow nvmlInit"
    assert facts["available"] and facts["error"] is None
    assert facts["driver_version"] == "550.54.15" and facts["cuda_driver_version"] == "12.4"
    gpu = facts["gpus"][2]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["bus_id"] == "00000000:38:00.0"
    assert gpu["pcie"] == {
        "gen": 5,
        "gen_max": 5,
        "width": 16,
        "width_max": 16,
        "gen_best": 5,
        "width_best": 16,
    }
    assert gpu["nvlinks"] == [{"link": i, "active": True} for i in range(18)]
    assert gpu["ecc"] == {
        "enabled": True,
        "pending_enabled": True,
        "volatile_uncorrected": 0,
        "aggregate_uncorrected": 0,
    }
    assert gpu["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert gpu["retired_pages"] is None  # H100 remaps rows instead
    assert gpu["throttle"] == ["SwPowerCap"] and gpu["throttle_samples"] == 1

    checks = preflight_checks(facts)
    assert flagged(checks) == []
    by_name = {c.name: c for c in checks}
    assert set(by_name) == {
        "nvidia driver",
        "pcie width",
        "pcie generation",
        "nvlink",
        "ecc",
        "row remapping",
        "retired pages",
        "clocks",
    }
    assert "550.54.15" in by_name["nvidia driver"].reason and "12.4" in by_name["nvidia driver"].reason
    assert by_name["pcie width"].reason.startswith("8 GPUs linked at their maximum PCIe width (x16)")
    assert "8 GPUs reached their maximum PCIe generation (gen 5)" in by_name["pcie generation"].reason
    assert "8 GPUs with all their NVLinks active (18 each)" in by_name["nvlink"].reason
    assert "SwPowerCap" in by_name["clocks"].reason  # normal under load: listed, not judged


def plant(index: int, **state):
    def apply(gpus: list[FakeGpu]) -> None:
        for key, value in state.items():
            setattr(gpus[index], key, value)

    return apply


def one_link_down(gpus: list[FakeGpu]) -> None:
    gpus[3].nvlinks = [True] * 17 + [False]


# (what is planted on GPU3, the status and the name of the one check that must flag it)
FAULTS = {
    "width x8 of x16": (plant(3, width=8), FAIL, "pcie width GPU3"),
    "one NVLink down": (one_link_down, FAIL, "nvlink GPU3"),
    "all NVLinks down": (plant(3, nvlinks=[False] * 18), WARN, "nvlink GPU3"),
    "volatile uncorrected ECC": (plant(3, volatile_uncorrected=2, aggregate_uncorrected=2), FAIL, "ecc GPU3"),
    "aggregate uncorrected ECC": (plant(3, aggregate_uncorrected=1), WARN, "ecc GPU3"),
    "ECC off on a data-centre GPU": (plant(3, ecc_mode=(0, 0)), WARN, "ecc mode GPU3"),
    "row remap failure": (plant(3, remapped=(0, 8, 0, 1)), FAIL, "row remapping GPU3"),
    "row remap pending": (plant(3, remapped=(0, 1, 1, 0)), WARN, "row remapping GPU3"),
    "retired pages pending": (plant(3, retired=([], [0x1234], 1)), WARN, "retired pages GPU3"),
    "HW thermal slowdown": (plant(3, reasons=mask("HwThermalSlowdown")), FAIL, "clocks GPU3"),
    "HW power brake": (plant(3, reasons=mask("HwPowerBrakeSlowdown", "SwPowerCap")), FAIL, "clocks GPU3"),
    "SW thermal slowdown": (plant(3, reasons=mask("SwThermalSlowdown")), WARN, "clocks GPU3"),
    "HW slowdown in one sample": (plant(3, reasons=mask("HwSlowdown")), WARN, "clocks GPU3"),
    "GPU lost": (plant(3, lost=True), FAIL, "nvml GPU3"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_one_planted_fault_is_flagged_on_its_gpu_alone(fault):
    apply, status, name = FAULTS[fault]
    gpus = hgx()
    apply(gpus)
    facts = read_nvml(FakeNvml(gpus))
    validate(facts)
    bad = flagged(preflight_checks(facts))
    assert [(c.name, c.status) for c in bad] == [(name, status)]
    assert named_gpus(bad) == {3}, bad[0].reason
    # Named by index, model and bus id, so the vendor finds the card.
    assert "GPU3 (NVIDIA H100 80GB HBM3, 00000000:48:00.0)" in bad[0].reason or fault == "GPU lost"
    assert "`" in bad[0].reason, "every non-PASS check quotes a command to run"


def test_advice_names_the_commands_to_run():
    gpus = hgx()
    gpus[3].width = 8
    one_link_down(gpus)
    checks = {c.name: c for c in preflight_checks(read_nvml(FakeNvml(gpus)))}
    width = checks["pcie width GPU3"]
    assert "x8 of its maximum x16" in width.reason and "50%" in width.reason
    assert "nvidia-smi -q -d PCI" in width.reason and "lspci -vv -s 0000:48:00.0" in width.reason
    assert width.details == {"gpu": 3, "width": 8, "width_max": 16}
    assert "nvidia-smi nvlink --status -i 3" in checks["nvlink GPU3"].reason
    assert checks["nvlink GPU3"].details["down"] == [17]


def test_hw_slowdown_seen_in_two_samples_fails():
    gpus = hgx()
    gpus[3].reasons = mask("HwSlowdown", "SwPowerCap")
    nvml = FakeNvml(gpus)
    once = read_nvml(nvml)
    twice = sample_throttle(once, nvml)
    assert twice["gpus"][3]["throttle_counts"] == {"HwSlowdown": 2, "SwPowerCap": 2}
    bad = flagged(preflight_checks(twice))
    assert [(c.name, c.status) for c in bad] == [("clocks GPU3", FAIL)]
    assert "in 2 of 2 samples" in bad[0].reason and "nvidia-smi -q -d PERFORMANCE" in bad[0].reason
    # Gone by the second sample: the P-state-change transient NVML documents, so only a WARN.
    gpus[3].reasons = mask("SwPowerCap")
    assert [c.status for c in flagged(preflight_checks(sample_throttle(once, nvml)))] == [WARN]


def test_idle_pcie_generation_warns_and_a_loaded_sample_clears_it():
    gpus = hgx(gen=1, reasons=mask("GpuIdle"))  # at preflight: idle, links at gen 1 to save power
    nvml = FakeNvml(gpus)
    idle = read_nvml(nvml)
    bad = flagged(preflight_checks(idle))
    assert [(c.name, c.status) for c in bad] == [("pcie generation", WARN)]
    assert named_gpus(bad) == set(range(8)) and "re-check under load" in bad[0].reason
    for gpu in gpus:  # the run loads them
        gpu.gen, gpu.reasons = 5, mask("SwPowerCap")
    loaded = sample_throttle(idle, nvml)
    assert nvml.initialised == 0
    assert flagged(preflight_checks(loaded)) == []
    assert loaded["gpus"][0]["pcie"] == {
        "gen": 1,
        "gen_max": 5,
        "width": 16,
        "width_max": 16,
        "gen_best": 5,
        "width_best": 16,
    }
    assert loaded["gpus"][0]["throttle"] == ["GpuIdle", "SwPowerCap"]  # sorted union
    assert idle["gpus"][0]["throttle"] == ["GpuIdle"], "sample_throttle must not change its input"


def test_a_link_stuck_below_its_generation_names_only_that_gpu():
    gpus = hgx()
    gpus[5].gen = 3
    bad = flagged(preflight_checks(read_nvml(FakeNvml(gpus))))
    assert [(c.name, c.status) for c in bad] == [("pcie generation", WARN)]
    assert named_gpus(bad) == {5} and "gen 3 of 5" in bad[0].reason


def test_not_supported_everywhere_gives_no_crash_and_no_false_alarm():
    gpus = hgx(nvlinks=[False] * 4)
    facts = read_nvml(FakeNvml(gpus, unsupported=FakeNvml.OPTIONAL))
    validate(facts)
    gpu = facts["gpus"][0]
    assert gpu["name"] is None and gpu["bus_id"] is None and gpu["nvlinks"] == []
    assert set(gpu["pcie"].values()) == {None} and set(gpu["ecc"].values()) == {None}
    assert gpu["remapped_rows"] is None and gpu["retired_pages"] is None and gpu["throttle"] is None
    checks = preflight_checks(facts)
    assert flagged(checks) == []
    assert all("judged" in c.reason or c.name in ("nvidia driver", "retired pages") for c in checks)


def test_geforce_node_without_ecc_or_nvlink_passes():
    gpus = hgx(
        n=2,
        name="NVIDIA GeForce RTX 4090",
        gen_max=4,
        gen=4,
        nvlinks=[],
        ecc_mode=(0, 0),
        reasons=mask("GpuIdle"),
    )
    unsupported = (
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetNvLinkState",
    )
    checks = preflight_checks(read_nvml(FakeNvml(gpus, unsupported=unsupported)))
    assert flagged(checks) == []


def test_ecc_off_on_a_workstation_card_is_not_flagged():
    gpus = hgx(n=2, name="NVIDIA RTX A6000", ecc_mode=(0, 0), nvlinks=[])
    assert flagged(preflight_checks(read_nvml(FakeNvml(gpus)))) == []


class OldFakeNvml(FakeNvml):
    """A pynvml from before the clocks-event names: only the Throttle function and constants."""

    nvmlDeviceGetCurrentClocksEventReasons = None

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(gpus)
        for name in REASON_BITS:
            delattr(self, f"nvmlClocksEventReason{name}")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h).reasons


def test_older_pynvml_with_throttle_names_only():
    nvml = OldFakeNvml(hgx(n=1, reasons=mask("HwThermalSlowdown") | 0x800))
    assert not hasattr(nvml, "nvmlClocksEventReasonHwThermalSlowdown")
    facts = read_nvml(nvml)
    assert facts["gpus"][0]["throttle"] == ["0x800", "HwThermalSlowdown"]  # an unknown bit keeps its value


def test_event_function_unsupported_falls_back_to_throttle_function():
    nvml = FakeNvml(
        hgx(n=1, reasons=mask("SwThermalSlowdown")), unsupported=("nvmlDeviceGetCurrentClocksEventReasons",)
    )
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: nvml.gpus[h].reasons
    assert read_nvml(nvml)["gpus"][0]["throttle"] == ["SwThermalSlowdown"]


# ---------------------------------------------------------------------------------------------------------
# Without NVML


def test_pynvml_missing_gives_exactly_one_warn(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    facts = read_nvml()
    assert facts["available"] is False and "pynvml" in facts["error"]
    validate(facts)
    checks = preflight_checks(facts)
    assert [c.status for c in checks] == [WARN]
    reason = checks[0].reason
    for topic in (
        "PCIe",
        "NVLink",
        "ECC",
        "row remapping",
        "throttling",
        "pip install nvidia-ml-py",
        "driver",
    ):
        assert topic in reason
    # sample_throttle has nothing to add either.
    assert sample_throttle(facts) == facts


def test_nvml_init_failure_gives_one_warn_and_no_shutdown():
    nvml = FakeNvml(hgx(), init_error=NVML_ERROR_DRIVER_NOT_LOADED)
    facts = read_nvml(nvml)
    assert facts == {
        "available": False,
        "error": "nvmlInit failed (NVMLError: Driver Not Loaded)",
        "driver_version": None,
        "cuda_driver_version": None,
        "gpus": [],
    }
    checks = preflight_checks(facts)
    assert [c.status for c in checks] == [WARN] and "Driver Not Loaded" in checks[0].reason


def test_shutdown_follows_a_failing_device_count():
    nvml = FakeNvml(hgx())

    def broken() -> int:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)

    nvml.nvmlDeviceGetCount = broken
    facts = read_nvml(nvml)
    assert facts["available"] is False and "GPU is lost" in facts["error"]
    assert nvml.initialised == 0


def test_nvml_without_gpus_warns():
    checks = preflight_checks(read_nvml(FakeNvml([])))
    assert [(c.name, c.status) for c in checks] == [("nvidia driver", PASS), ("gpus", WARN)]


# ---------------------------------------------------------------------------------------------------------
# Schema


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(FACTS_SCHEMA)
    assert FACTS_SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("fault", [None, *FAULTS])
def test_facts_validate_and_survive_a_json_round_trip(fault):
    gpus = hgx(retired=([1, 2], [], 0))
    if fault:
        FAULTS[fault][0](gpus)
    nvml = FakeNvml(gpus)
    facts = sample_throttle(read_nvml(nvml), nvml)
    validate(facts)
    assert json.loads(json.dumps(facts)) == facts
    assert json.loads(json.dumps([c.to_json() for c in preflight_checks(facts)]))


@pytest.mark.parametrize(
    "spoil",
    [
        lambda f: f["gpus"][0]["pcie"].update(width="x16"),
        lambda f: f["gpus"][0]["nvlinks"].append({"link": 18}),
        lambda f: f["gpus"][0].update(throttle="HwSlowdown"),
        lambda f: f["gpus"][0].pop("ecc"),
        lambda f: f.update(extra=1),
    ],
)
def test_schema_rejects_malformed_facts(spoil):
    facts = read_nvml(FakeNvml(hgx(n=1)))
    spoil(facts)
    with pytest.raises(jsonschema.ValidationError):
        validate(facts)


@pytest.mark.parametrize("fake", [FakeNvml(hgx(n=1)), TopologyFakeNvml(["NVIDIA H100"] * 2, ())])
def test_the_fakes_are_the_real_pynvml_s_api(fake):
    """Each fake's NVML names exist in nvidia-ml-py (the test extra), its functions take as many arguments
    and its constants have the same values: a fake that drifted would pass code the real module breaks."""
    import pynvml

    for name in (n for n in dir(fake) if n.startswith(("nvml", "NVML"))):
        assert hasattr(pynvml, name), f"{name}: not in nvidia-ml-py {pynvml.__name__}"
        mine, real = getattr(fake, name), getattr(pynvml, name)
        if isinstance(mine, int):
            assert mine == real, f"{name} = {mine}, nvidia-ml-py's is {real}"
        elif callable(mine) and not isinstance(mine, type):
            assert len(inspect.signature(mine).parameters) == len(inspect.signature(real).parameters), name


# ---------------------------------------------------------------------------------------------------------
# In the node report


def test_the_node_report_judges_the_preflight_and_publishes_its_facts(tmp_path):
    from helpers import gpu_data

    from pytest_collectives.nodereport.outputs.schema import REPORT_SCHEMA
    from pytest_collectives.nodereport.outputs.write import write_report

    gpus = hgx()
    plant(3, width=8)(gpus)
    data = {**gpu_data(), "preflight": sample_throttle(read_nvml(FakeNvml(gpus)), FakeNvml(gpus))}
    files = write_report(tmp_path, data)
    report = json.loads(files["report.json"].read_text())
    jsonschema.validate(report, REPORT_SCHEMA)  # the facts' schema is part of the published one
    assert report["verdict"] == FAIL and report["preflight"] == data["preflight"]
    assert [c["name"] for c in report["checks"] if c["status"] == FAIL] == ["pcie width GPU3"]
    assert "pcie width GPU3" in files["report.xml"].read_text()


def test_a_gpu_run_without_nvml_warns_in_the_report(tmp_path, monkeypatch):
    from helpers import gpu_data

    from pytest_collectives.nodereport.outputs.write import write_report

    monkeypatch.setitem(sys.modules, "pynvml", None)
    report_files = write_report(tmp_path, {**gpu_data(), "preflight": read_nvml()})
    report = json.loads(report_files["report.json"].read_text())
    assert report["verdict"] == WARN
    assert [c["name"] for c in report["checks"] if c["status"] != PASS] == ["nvml"]
