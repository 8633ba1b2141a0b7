import dataclasses
import json
import re
import stat
import sys
from pathlib import Path

import pytest
from helpers import cpu_fingerprint

from pytest_collectives.topology import detect as topology
from pytest_collectives.topology.compare import described, differences, looks_degraded, nearest
from pytest_collectives.topology.detect import (
    detect,
    detect_cpu,
    gpus_from_nvml,
    gpus_from_smi,
    physical_indices,
)
from pytest_collectives.topology.fingerprint import Fingerprint, FingerprintError, GpuInfo
from pytest_collectives.topology.identity import link_class, software_changes, topology_id
from pytest_collectives.topology.links import TopologyError, normalize_link, parse_topo_matrix

DATA = Path(__file__).parent / "data"
# rtx3090x8: the 8 x RTX 3090 server from the project's seed documents. h100x1: captured on an H100 machine.
# gpu4_nic2: written by hand from the documented format, for NIC rows/columns and PIX/PXB/NODE entries.
RTX = (DATA / "rtx3090x8_topo_m.txt").read_text()
NICS = (DATA / "gpu4_nic2_topo_m.txt").read_text()
H100 = (DATA / "h100x1_topo_m.txt").read_text()
SAFE_DIR_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


def rtx_links() -> tuple[tuple[str, ...], ...]:
    return parse_topo_matrix(RTX).links


def gpu_fp(**changes) -> Fingerprint:
    fp = Fingerprint(
        backend="nccl",
        torch_version="2.13.0+cu126",
        cpu_model="AMD EPYC 7302 16-Core Processor",
        logical_cores=64,
        sockets=2,
        numa_nodes=2,
        gpus=tuple(
            GpuInfo("NVIDIA GeForce RTX 3090", f"00000000:{i + 1:02X}:00.0", 1, 4, 16, 16) for i in range(8)
        ),
        links=rtx_links(),
        link_source="nvml",
        driver_version="535.104.05",
        cuda_version="12.6",
        nccl_version="2.21.5",
    )
    return dataclasses.replace(fp, **changes)


def assert_one_line(message: str, *fragments: str) -> None:
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


# ---------------------------------------------------------------------------------------------------------
# parse_topo_matrix


def test_parses_the_rtx3090_server():
    m = parse_topo_matrix(RTX)
    assert m.devices == tuple(f"GPU{i}" for i in range(8))
    assert m.gpus() == list(m.devices)
    assert m.link("GPU0", "GPU1") == "NV4"
    assert m.link("GPU6", "GPU7") == "NV4"
    assert m.link("GPU0", "GPU2") == "SYS"
    assert all(m.links[i][i] == "X" for i in range(8))
    assert all(m.links[i][j] == m.links[j][i] for i in range(8) for j in range(8))
    assert m.affinity["GPU0"] == {"CPU Affinity": "0-15,32-47", "NUMA Affinity": "0", "GPU NUMA ID": "N/A"}
    assert m.affinity["GPU7"]["NUMA Affinity"] == "1"
    assert m.nic_names == {}


def test_tabs_and_spaces_parse_the_same():
    assert parse_topo_matrix(RTX.expandtabs(8)) == parse_topo_matrix(RTX)
    assert parse_topo_matrix(RTX.expandtabs(4).replace("\n", "\r\n")) == parse_topo_matrix(RTX)


def test_nic_rows_and_columns():
    m = parse_topo_matrix(NICS)
    assert m.devices == ("GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1")
    assert m.gpus() == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert m.link("GPU0", "GPU1") == "NV12"
    assert m.link("GPU0", "NIC0") == "PIX"
    assert m.link("GPU1", "NIC0") == "PXB"
    assert m.link("GPU2", "GPU0") == "NODE"
    assert m.link("NIC1", "GPU3") == "PIX"
    assert m.affinity["NIC0"] == {}
    assert m.affinity["GPU3"]["CPU Affinity"] == "24-47,72-95"
    assert m.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}


def test_real_output_with_terminal_escapes():
    # Captured from an H100 machine: nvidia-smi underlines the header even into a pipe.
    assert "\x1b[4m" in H100
    m = parse_topo_matrix(H100)
    assert m.devices == ("GPU0",)
    assert m.affinity["GPU0"]["CPU Affinity"] == "0-15"


def test_older_driver_format():
    # Older drivers: SOC for the inter-socket path, NICs named by device, a single affinity column.
    text = (
        "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\n"
        "GPU0\t X \tSOC\tPHB\t0-7\n"
        "GPU1\tSOC\t X \tSOC\t8-15\n"
        "mlx5_0\tPHB\tSOC\t X \t\n"
    )
    m = parse_topo_matrix(text)
    assert m.devices == ("GPU0", "GPU1", "mlx5_0")
    assert m.link("GPU0", "GPU1") == "SOC"
    assert normalize_link(m.link("GPU0", "GPU1")) == "SYS"
    assert m.affinity["GPU1"] == {"CPU Affinity": "8-15"}


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("", ["empty"]),
        ("   \n\t\n", ["empty"]),
        ("\tCPU Affinity\n", ["line 1", "no devices"]),
        ("\tGPU0\tGPU0\nGPU0\t X \t X \n", ["line 1", "repeats"]),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV4\n", ["line 2", "ends after 1 of 2"]),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV4\n\nGPU1\tNV4\t X \n", ["ends after 1 of 2"]),
        ("\tGPU0\tGPU1\nGPU1\t X \tNV4\n", ["line 2", "expected the row of GPU0"]),
        ("\tGPU0\tGPU1\nGPU0\t X \tFAST\nGPU1\tNV4\t X \n", ["line 2", "'FAST'", "GPU0 and GPU1"]),
        ("\tGPU0\tGPU1\nGPU0\t X \tX\nGPU1\tNV4\t X \n", ["line 2", "only a device's link to itself is X"]),
        ("\tGPU0\tGPU1\nGPU0\tNV4\tNV4\nGPU1\tNV4\t X \n", ["line 2", "only a device's link to itself"]),
        ("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tNV4\t X \n", ["line 2", "1 link entries for 2 devices"]),
        ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-7\t9\n", ["line 2", "2 values after the links for 1 columns"]),
        ("Usage: nvidia-smi topo [options]\n", ["line 1", "'Usage:' is not a device name"]),
        ("\tGPU0\tGPU1\n", ["line 1", "ends after 0 of 2"]),
    ],
)
def test_bad_text_gives_one_line_error(text, fragments):
    with pytest.raises(TopologyError) as info:
        parse_topo_matrix(text, source="topo.txt")
    assert_one_line(str(info.value), "topo.txt:", "nvidia-smi topo -m", *fragments)


def test_columns_shifted_by_a_missing_cell_are_caught():
    broken = RTX.replace("GPU3\tSYS\tSYS\tNV4\t X \tSYS", "GPU3\tSYS\tNV4\t X \tSYS", 1)
    with pytest.raises(TopologyError, match=r"line 5: .*only a device's link to itself is X"):
        parse_topo_matrix(broken)


# ---------------------------------------------------------------------------------------------------------
# Fingerprint and id


def test_fingerprint_json_round_trip():
    for fp in (gpu_fp(), cpu_fingerprint()):
        data = json.loads(json.dumps(fp.to_json()))
        assert Fingerprint.from_json(data) == fp


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.pop("backend"), "backend"),
        (lambda d: d.update(extra=1), "extra"),
        (lambda d: d.update(logical_cores="64"), "logical_cores"),
        (lambda d: d.update(sockets=True), "sockets"),
        (lambda d: d.update(gpus={}), "gpus"),
        (lambda d: d["gpus"][3].update(name=""), "gpus[3].name"),
        (lambda d: d["gpus"][1].update(pcie_gen_max=4.0), "gpus[1].pcie_gen_max"),
        (lambda d: d["gpus"][2].pop("pci_bus_id"), "gpus[2].pci_bus_id"),
        (lambda d: d["links"].pop(), "links"),
        (lambda d: d["links"][0].__setitem__(1, "FAST"), "links[0][1]"),
        (lambda d: d["links"][2].__setitem__(2, "SYS"), "links[2][2]"),
        (lambda d: d["links"].__setitem__(1, "NV4"), "links[1]"),
        (lambda d: d.update(link_source="guess"), "link_source"),
        (lambda d: d.update(nccl_version=2), "nccl_version"),
    ],
)
def test_fingerprint_from_json_names_the_bad_field(mutate, field):
    data = gpu_fp().to_json()
    mutate(data)
    with pytest.raises(FingerprintError) as info:
        Fingerprint.from_json(data)
    assert info.value.field == field
    assert_one_line(str(info.value), f"field '{field}' must be")


def test_fingerprint_from_json_rejects_non_objects():
    with pytest.raises(FingerprintError, match="must be an object"):
        Fingerprint.from_json([])


def test_ids_look_like_the_examples():
    assert re.fullmatch(r"gpu-8x-rtx-3090-nv4-sys-[0-9a-f]{8}", topology_id(gpu_fp()))
    assert re.fullmatch(r"cpu-2c-amd-epyc-7b13-[0-9a-f]{8}", topology_id(cpu_fingerprint()))
    intel = cpu_fingerprint(cpu_model="Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", logical_cores=16)
    assert re.fullmatch(r"cpu-16c-intel-xeon-platinum-8375c-[0-9a-f]{8}", topology_id(intel))


def test_id_is_stable_and_safe_as_a_directory_name():
    odd = cpu_fingerprint(cpu_model="../../etc/passwd ☃ " + "x" * 200)
    for fp in (gpu_fp(), cpu_fingerprint(), odd, gpu_fp(gpus=gpu_fp().gpus[:1], links=(("X",),))):
        first = topology_id(fp)
        assert first == topology_id(Fingerprint.from_json(json.loads(json.dumps(fp.to_json()))))
        assert SAFE_DIR_NAME.fullmatch(first) and len(first) <= 80, first
    # Pinned: a change here silently orphans every recorded baseline.
    assert topology_id(cpu_fingerprint()) == "cpu-2c-amd-epyc-7b13-1e60dc5f"


def test_what_changes_the_id():
    base = topology_id(gpu_fp())
    links = [list(row) for row in rtx_links()]
    links[0][1] = links[1][0] = "PIX"
    gpus = list(gpu_fp().gpus)
    gpus[5] = dataclasses.replace(gpus[5], pcie_width_max=8)
    for changed in (
        gpu_fp(backend="gloo"),
        gpu_fp(links=tuple(map(tuple, links))),
        gpu_fp(gpus=tuple(gpus)),
        gpu_fp(cpu_model="Intel(R) Xeon(R) Gold 6338"),
        gpu_fp(gpus=gpu_fp().gpus[:4], links=tuple(row[:4] for row in rtx_links()[:4])),
    ):
        assert topology_id(changed) != base


def test_what_does_not_change_the_id():
    base = topology_id(gpu_fp())
    idle = tuple(
        dataclasses.replace(g, pcie_gen_current=4, pcie_width_current=8, pci_bus_id=None)
        for g in gpu_fp().gpus
    )
    for same in (
        gpu_fp(torch_version="2.14.0", nccl_version="2.22.3", cuda_version="12.8", driver_version="550.1"),
        gpu_fp(gpus=idle),
        gpu_fp(link_source="nvidia-smi"),
    ):
        assert topology_id(same) == base


def test_mixed_models_and_link_order_in_the_slug():
    gpus = (
        GpuInfo("NVIDIA A100-SXM4-80GB"),
        GpuInfo("NVIDIA H100 80GB HBM3"),
        GpuInfo("NVIDIA A100-SXM4-80GB"),
    )
    links = (("X", "PIX", "SYS"), ("PIX", "X", "NV2"), ("SYS", "NV2", "X"))
    assert topology_id(gpu_fp(gpus=gpus, links=links)).startswith("gpu-3x-mixed-nv2-pix-sys-")
    assert topology_id(gpu_fp(gpus=gpus[:1] * 3, links=())).startswith("gpu-3x-a100-sxm4-80gb-")


def test_link_class():
    fp = gpu_fp()
    assert link_class(fp, 0, 1) == "NV4"
    assert link_class(fp, 1, 0) == "NV4"
    assert link_class(fp, 0, 7) == "SYS"
    assert link_class(fp, 3, 3) == "X"
    assert link_class(cpu_fingerprint(), 0, 1) == "unknown"
    assert link_class(gpu_fp(links=()), 0, 1) == "unknown"
    soc = gpu_fp(gpus=fp.gpus[:2], links=(("X", "SOC"), ("SOC", "X")))
    assert link_class(soc, 0, 1) == "SYS"
    with pytest.raises(TopologyError) as info:
        link_class(fp, 0, 8)
    assert_one_line(str(info.value), "(0, 8)", "8 GPUs")


def test_software_changes():
    assert software_changes(gpu_fp(), gpu_fp()) == []
    newer = gpu_fp(torch_version="2.14.0", nccl_version="2.22.3")
    assert software_changes(gpu_fp(), newer) == ["torch 2.13.0+cu126 -> 2.14.0", "NCCL 2.21.5 -> 2.22.3"]


# ---------------------------------------------------------------------------------------------------------
# CPU detection


def test_detect_cpu_from_fake_proc_and_sys(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    blocks = [f"processor\t: {i}\nmodel name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz\n" for i in range(4)]
    cpuinfo.write_text("\n".join(blocks))
    system = tmp_path / "system"
    for cpu, package in enumerate([0, 0, 1, 1]):
        topo_dir = system / "cpu" / f"cpu{cpu}" / "topology"
        topo_dir.mkdir(parents=True)
        (topo_dir / "physical_package_id").write_text(f"{package}\n")
    for node in ("node0", "node1", "has_cpu"):
        (system / "node" / node).mkdir(parents=True)
    cpu = detect_cpu(cpuinfo, system)
    assert cpu.model == "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"
    assert (cpu.sockets, cpu.numa_nodes) == (2, 2)
    assert cpu.logical_cores >= 1


def test_detect_cpu_falls_back_without_sysfs(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name : AMD EPYC\nphysical id : 0\n\nmodel name : AMD EPYC\nphysical id : 1\n")
    cpu = detect_cpu(cpuinfo, tmp_path / "missing")
    assert (cpu.model, cpu.sockets, cpu.numa_nodes) == ("AMD EPYC", 2, 1)
    bare = detect_cpu(tmp_path / "no-cpuinfo", tmp_path / "missing")
    assert bare.model and (bare.sockets, bare.numa_nodes) == (1, 1)


def test_detect_on_this_machine_is_a_stable_cpu_fingerprint():
    fp = detect("gloo", 0)
    assert fp.kind == "cpu" and fp.link_source == "none" and not fp.gpus
    assert fp.torch_version
    assert topology_id(fp) == topology_id(detect("gloo", 0))
    assert topology_id(fp).startswith(f"cpu-{fp.logical_cores}c-")


# ---------------------------------------------------------------------------------------------------------
# GPU detection, without GPUs: a fake pynvml and a fake nvidia-smi


class FakeNvml:
    """The slice of pynvml that gpus_from_nvml uses, modelling a machine from its link matrix."""

    class NVMLError(Exception):
        pass

    NVML_NVLINK_MAX_LINKS = 36  # nvidia-ml-py 13 (18 before NVLink 5)
    NVML_FEATURE_ENABLED = 1

    def __init__(self, names, links, switch_links=0):
        self.names = names
        self.links = links
        self.switch_links = switch_links

    @staticmethod
    def pci(bus):
        return type(
            "PciInfo",
            (),
            {"domain": 0, "bus": bus, "device": 0, "busId": f"00000000:{bus:02X}:00.0".encode()},
        )

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.names[h]

    def nvmlDeviceGetPciInfo(self, h):
        return self.pci(0x10 + h)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 1

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 4

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        raise self.NVMLError("Not Supported")

    def nvmlSystemGetDriverVersion(self):
        return b"535.104.05"

    def _remotes(self, h):
        remotes = []
        for peer, link in enumerate(self.links[h]):
            if link.startswith("NV") and not self.switch_links:
                remotes += [0x10 + peer] * int(link[2:])
        return remotes + [0xF0] * self.switch_links  # switches sit at bus 0xF0

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= len(self._remotes(h)) + 2:
            raise self.NVMLError("Not Supported")
        return int(link < len(self._remotes(h)))  # two trailing links are present but down

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return self.pci(self._remotes(h)[link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        link = self.links[a][b]
        assert not link.startswith("NV"), "NVLink pairs must not be asked for their PCIe ancestor"
        return {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}[link]


def test_nvml_links_match_nvidia_smi_on_the_rtx_server():
    nvml = FakeNvml(["NVIDIA GeForce RTX 3090"] * 8, rtx_links())
    gpu = gpus_from_nvml(nvml, range(8))
    assert gpu.links == rtx_links()
    assert gpu.link_source == "nvml" and gpu.driver_version == "535.104.05"
    assert gpu.gpus[0] == GpuInfo("NVIDIA GeForce RTX 3090", "00000000:10:00.0", 1, 4, 16, None)


def test_nvml_subset_and_pcie_classes():
    nics = parse_topo_matrix(NICS)
    gpu_links = tuple(row[:4] for row in nics.links[:4])
    gpu = gpus_from_nvml(FakeNvml(["A"] * 4, gpu_links), [3, 0, 2])
    assert gpu.links == (("X", "SYS", "SYS"), ("SYS", "X", "NODE"), ("SYS", "NODE", "X"))
    with pytest.raises(TopologyError) as info:
        gpus_from_nvml(FakeNvml(["A"] * 4, gpu_links), [0, 4])
    assert_one_line(str(info.value), "GPU index 4", "4 GPUs")


def test_nvml_nvswitch_fabric_shows_every_pair_as_nv_links():
    names = ["NVIDIA H100 80GB HBM3"] * 4
    gpu = gpus_from_nvml(FakeNvml(names, [["X"] * 4] * 4, switch_links=18), range(4))
    assert all(gpu.links[i][j] == ("X" if i == j else "NV18") for i in range(4) for j in range(4))


SMI_QUERY = "\n".join(
    f"{i}, NVIDIA GeForce RTX 3090, 00000000:{i + 1:02X}:00.0, 1, 4, 16, [N/A], 535.104.05" for i in range(8)
)


def test_gpus_from_smi():
    gpu = gpus_from_smi(SMI_QUERY, RTX, [0, 1, 2])
    assert gpu.links == tuple(row[:3] for row in rtx_links()[:3])
    assert gpu.link_source == "nvidia-smi"
    assert gpu.gpus[2] == GpuInfo("NVIDIA GeForce RTX 3090", "00000000:03:00.0", 1, 4, 16, None)
    assert gpu.driver_version == "535.104.05"
    assert gpus_from_smi(SMI_QUERY, None, [0]).link_source == "none"


def test_gpus_from_smi_errors():
    with pytest.raises(TopologyError) as info:
        gpus_from_smi("No devices were found\n", None, [0])
    assert_one_line(str(info.value), "--query-gpu", "No devices were found")
    with pytest.raises(TopologyError, match="GPU index 8"):
        gpus_from_smi(SMI_QUERY, RTX, [8])
    nine = SMI_QUERY + "\n8, NVIDIA GeForce RTX 3090, 00000000:09:00.0, 1, 4, 16, 16, 535.104.05"
    with pytest.raises(TopologyError, match="no row for GPU8"):
        gpus_from_smi(nine, RTX, [7, 8])


def test_physical_indices():
    assert physical_indices(3, None) == [0, 1, 2]
    assert physical_indices(2, "4,5,6") == [4, 5]
    for visible, fragment in (("GPU-8a1f", "UUIDs"), ("0", "1 GPUs visible but 2")):
        with pytest.raises(TopologyError) as info:
            physical_indices(2, visible)
        assert_one_line(str(info.value), "CUDA_VISIBLE_DEVICES", fragment)


def test_detect_gpus_through_a_fake_nvidia_smi(tmp_path, monkeypatch):
    (tmp_path / "topo.txt").write_text(RTX)
    (tmp_path / "query.csv").write_text(SMI_QUERY + "\n")
    script = tmp_path / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = topo ]; then cat {tmp_path}/topo.txt; else cat {tmp_path}/query.csv; fi\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if nvidia-ml-py were not installed
    fp = detect("nccl", 2)
    assert fp.link_source == "nvidia-smi"
    assert fp.links == (("X", "NV4"), ("NV4", "X"))
    assert [g.pci_bus_id for g in fp.gpus] == ["00000000:03:00.0", "00000000:04:00.0"]
    assert re.fullmatch(r"gpu-2x-rtx-3090-nv4-[0-9a-f]{8}", topology_id(fp))


def test_detect_without_nvml_or_nvidia_smi_keeps_names_only(monkeypatch):
    monkeypatch.setattr(topology, "_detect_nvml", lambda indices: None)
    monkeypatch.setattr(topology, "_detect_smi", lambda indices: None)
    names = topology.GpuTopology((GpuInfo("NVIDIA L4"),), (), "none", None)
    monkeypatch.setattr(topology, "_detect_torch", lambda gpus: names)
    fp = detect("nccl", 1)
    assert fp.gpus == (GpuInfo("NVIDIA L4"),) and fp.links == () and link_class(fp, 0, 0) == "unknown"


def test_nvml_source_is_skipped_when_pynvml_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert topology._detect_nvml([0]) is None


def test_smi_source_is_skipped_without_the_command(monkeypatch):
    monkeypatch.setattr(topology.shutil, "which", lambda name: None)
    assert topology._detect_smi([0]) is None


def test_a_node_that_lost_hardware_looks_degraded() -> None:
    fewer_cpus = differences(gpu_fp(), gpu_fp(logical_cores=48))
    assert described(fewer_cpus) == "CPUs 64 -> 48" and looks_degraded(fewer_cpus)
    links = [list(row) for row in rtx_links()]
    links[2][3] = links[3][2] = "SYS"  # the NVLink between GPUs 2 and 3 went down
    lost_link = differences(gpu_fp(), gpu_fp(links=tuple(map(tuple, links))))
    assert described(lost_link) == "GPU 2 - GPU 3: NV4 -> SYS" and looks_degraded(lost_link)
    narrower = gpu_fp(gpus=(dataclasses.replace(gpu_fp().gpus[0], pcie_width_max=8), *gpu_fp().gpus[1:]))
    assert described(differences(gpu_fp(), narrower)) == "GPU 0: PCIe width x16 -> PCIe width x8"
    seven = gpu_fp(gpus=gpu_fp().gpus[:7], links=tuple(row[:7] for row in rtx_links()[:7]))
    assert described(differences(gpu_fp(), seven)) == "GPUs 8 -> 7" and looks_degraded(
        differences(gpu_fp(), seven)
    )
    # more of something, or something faster, is not a loss
    assert not looks_degraded(differences(gpu_fp(logical_cores=48), gpu_fp()))


def test_another_model_is_another_machine_and_the_nearest_is_named() -> None:
    other_cpu = gpu_fp(cpu_model="Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", logical_cores=32)
    found = differences(gpu_fp(), other_cpu)
    assert [d.text for d in found] == [
        "CPU model 'AMD EPYC 7302 16-Core Processor' -> 'Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz'",
        "CPUs 64 -> 32",
    ]
    assert not looks_degraded(found)  # fewer cores of another CPU: another machine, not a broken one
    near = nearest(
        [gpu_fp(logical_cores=96, sockets=4), gpu_fp(logical_cores=96), gpu_fp(backend="gloo")], gpu_fp()
    )
    assert near is not None and near.topology_id == topology_id(gpu_fp(logical_cores=96))
    assert nearest([gpu_fp(backend="gloo"), gpu_fp()], gpu_fp()) is None  # another backend, or this machine
