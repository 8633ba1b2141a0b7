"""The node report's latency matrix and host-device figures: gathered from the session's benchmarks, judged
GPU against GPU, shown in the HTML, described by the schema; and the byte check the copy suites share."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import jsonschema
import pytest
import torch
from helpers import gpu_data

import pytest_collectives
from pytest_collectives.gate.baseline_format import BenchmarkEntry
from pytest_collectives.nodereport.collect import host_device, p2p_latency, p2p_matrix
from pytest_collectives.nodereport.judging.verdicts import report_checks
from pytest_collectives.nodereport.outputs.schema import ReportError
from pytest_collectives.nodereport.outputs.write import build_report, write_report
from pytest_collectives.verdict import FAIL, NOT_JUDGED, PASS

SCHEMA_FILE = Path(pytest_collectives.__file__).parent / "schemas" / "node-report.schema.json"
SERIES = ("h2d pinned", "h2d pageable", "d2h pinned", "d2h pageable", "bidir pinned", "local device")
HEALTHY = {"h2d pinned": 25.0, "h2d pageable": 11.0, "d2h pinned": 26.0, "d2h pageable": 9.0,
           "bidir pinned": 40.0, "local device": 780.0}  # fmt: skip


def entry(**info) -> BenchmarkEntry:
    return BenchmarkEntry.from_samples([1e-3] * 3, info)


def latency_entry(src: int, dst: int, us: float, nbytes: int = 4, devices="cpu") -> BenchmarkEntry:
    return entry(matrix="latency", src=src, dst=dst, nbytes=nbytes, latency_us=us, algbw_GBps=1.0,
                 devices=devices, src_node=0, dst_node=0)  # fmt: skip


def host_entry(device: int, series: str, gbps: float, message_bytes: int, node: int = 0) -> BenchmarkEntry:
    direction, memory = series.split()
    moved = message_bytes * (2 if direction == "bidir" else 1)
    return entry(matrix="host", direction=direction, memory=memory, device=device, node=node, dtype="uint8",
                 message_bytes=message_bytes, nbytes=moved, algbw_GBps=gbps)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Gathering


def test_latency_matrix_is_gathered_apart_from_the_bandwidth_one():
    results = {f"l{s}{d}": latency_entry(s, d, 10.0 * s + d) for s in range(3) for d in range(3) if s != d}
    results["bw"] = entry(matrix="pairs", src=0, dst=1, nbytes=1 << 20, algbw_GBps=5.0, devices="cpu")
    latency = p2p_latency(results)
    assert latency == {
        "devices": ["rank0", "rank1", "rank2"],
        "matrix_us": [[None, 1.0, 2.0], [10.0, None, 12.0], [20.0, 21.0, None]],
    }
    # The bandwidth matrix neither sees the latency pairs nor is completed by them.
    assert p2p_matrix(results, lambda i, j: "LOOPBACK") is None
    del results["l21"]
    assert p2p_latency(results) is None  # a partial matrix is not reported
    assert p2p_latency({"bw": results["bw"]}) is None


def test_host_device_takes_each_gpu_at_the_largest_buffer():
    results = {}
    for size, scale in ((1 << 20, 0.5), (1 << 28, 1.0)):
        for d in range(3):
            for name in ("h2d pinned", "bidir pinned", "local device"):
                results[f"{name}{d}{size}"] = host_entry(d, name, HEALTHY[name] * scale + d, size)
    results["pair"] = entry(matrix="pairs", src=0, dst=1, nbytes=1 << 30, algbw_GBps=5.0)
    host = host_device(results)
    # bidir moved 2 x 256 MiB: still the 256 MiB figure, chosen by its buffer size, not the bytes moved
    assert host == {
        "bytes": 1 << 28,
        "devices": ["GPU0", "GPU1", "GPU2"],
        "series": {
            "h2d pinned": [25.0, 26.0, 27.0],
            "bidir pinned": [40.0, 41.0, 42.0],
            "local device": [780.0, 781.0, 782.0],
        },
    }
    del results[f"h2d pinned1{1 << 28}"]
    assert host_device(results)["series"]["h2d pinned"] == [25.0, None, 27.0]
    assert host_device({"pair": results["pair"]}) is None  # a CPU run measures no host copies


def test_host_device_labels_gpus_by_node():
    results = {f"g{d}": host_entry(d, "h2d pinned", 25.0, 1 << 20, node=d // 2) for d in range(4)}
    assert host_device(results)["devices"] == ["node0:GPU0", "node0:GPU1", "node1:GPU0", "node1:GPU1"]


# ---------------------------------------------------------------------------------------------------------
# Checks


def host_data(figures: dict[str, list[float | None]]) -> dict:
    data = gpu_data()
    n = len(next(iter(figures.values())))
    data["host_device"] = {"bytes": 1 << 28, "devices": [f"GPU{i}" for i in range(n)], "series": figures}
    return data


def healthy(n: int, rng: random.Random | None = None, noise: float = 0.0) -> dict[str, list[float | None]]:
    rng = rng or random.Random(0)
    return {name: [HEALTHY[name] * (1 + rng.uniform(-noise, noise)) for _ in range(n)] for name in SERIES}


def host_checks(data: dict) -> list:
    # Without the P2P matrix, whose checks take most of the time of the many noise trials below.
    return [c for c in report_checks({**data, "p2p": None}) if c.name.startswith("host-device")]


def test_a_gpu_at_60_percent_on_h2d_pinned_fails_and_is_the_only_one_named():
    figures = healthy(8, random.Random(1), noise=0.05)
    figures["h2d pinned"][5] = 0.6 * HEALTHY["h2d pinned"]
    (check,) = host_checks(host_data(figures))
    assert check.status == FAIL and check.name == "host-device GPU5"
    assert "GPU5's h2d pinned copies" in check.reason and "`nvidia-smi -q -d PCI`" in check.reason
    assert "LnkSta" in check.reason and "reseat" in check.reason
    assert [row[0] for row in check.details["table"]["rows"]] == ["h2d pinned"]
    assert check.details["device"] == 5
    assert not any(f"GPU{i}" in check.reason for i in range(8) if i != 5)


def test_a_slow_gpu_memory_gets_advice_about_the_gpu_not_its_link():
    figures = healthy(4)
    figures["local device"][2] = 0.85 * HEALTHY["local device"]
    (check,) = host_checks(host_data(figures))
    assert check.status == "WARN" and check.name == "host-device GPU2"
    assert "CLOCK,PERFORMANCE" in check.reason and "LnkSta" not in check.reason


@pytest.mark.parametrize("n", [3, 4, 8])
def test_healthy_gpus_within_5_percent_never_fail(n):
    rng = random.Random(n)
    for _ in range(300):
        checks = host_checks(host_data(healthy(n, rng, noise=0.05)))
        assert [(c.name, c.status) for c in checks] == [("host-device copies", PASS)]


def test_fewer_than_3_gpus_have_no_peers_and_a_cpu_run_no_check():
    figures = healthy(2)
    figures["h2d pinned"][1] = 1.0  # far below, but nothing says which GPU is the odd one
    (check,) = host_checks(host_data(figures))
    assert check.status == NOT_JUDGED and "needs 3" in check.reason  # judging nothing, it says so
    # A GPU not measured at all (deselected) doesn't count as a peer.
    three = {name: [*values, None] for name, values in healthy(2).items()}
    assert "needs 3" in host_checks(host_data(three))[0].reason
    data = gpu_data()
    data["host_device"] = None
    assert host_checks(data) == [] and host_checks(gpu_data()) == []


# ---------------------------------------------------------------------------------------------------------
# HTML and schema


def full_data() -> dict:
    data = host_data(healthy(8))
    data["p2p_latency"] = {
        "devices": [f"GPU{i}" for i in range(8)],
        "matrix_us": [[None if i == j else i + j / 10 for j in range(8)] for i in range(8)],
    }
    return data


def test_the_html_shows_the_latency_matrix_and_host_figures(tmp_path):
    files = write_report(tmp_path, full_data())
    html = files["report.html"].read_text()
    latency = html[html.index("<h2>GPU-to-GPU latency</h2>") :]
    latency = latency[: latency.index("</table>")]
    assert "<th>from \\ to</th>" in latency and latency.count("<tr>") == 9  # header and 8 rows
    assert "<td class=num>7.3</td>" in latency  # GPU7 -> GPU3
    host = html[html.index("<h2>Copies between host and GPU</h2>") :]
    host = host[: host.index("</table>")]
    assert "256 MiB" in host and "<th class=num>h2d pinned</th>" in host
    assert host.count("<td class=num>780.0</td>") == 8  # local device, every GPU
    report = json.loads(files["report.json"].read_text())
    assert report["p2p_latency"]["matrix_us"][7][3] == 7.3 and report["host_device"]["bytes"] == 1 << 28
    # Fleet tooling reads the new fields with the published schema and no code of ours.
    jsonschema.validate(report, json.loads(SCHEMA_FILE.read_text()))


def test_a_report_without_them_says_what_was_not_measured(tmp_path):
    data = gpu_data()
    data["p2p_latency"] = data["host_device"] = None
    html = write_report(tmp_path, data)["report.html"].read_text()
    assert "No pair latency was measured" in html and "No copies between host and GPU were measured" in html


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("host_device.series", {"h2d managed": [1.0] * 8}, "host_device.series.h2d managed is not a known"),
        ("host_device.series", {"h2d pinned": [1.0] * 7}, "series.h2d pinned must have 8 figures"),
        ("host_device.bytes", 0, "host_device.bytes must be >= 1"),
        ("p2p_latency.matrix_us", [[None, -1.0], [1.0, None]], "p2p_latency.matrix_us[0][1] must be >= 0"),
        ("p2p_latency.matrix_us", [[None, 1.0]], "p2p_latency.matrix_us must be 8 x 8"),
        ("p2p_latency.unit", "us", "p2p_latency.unit is not a known field"),
    ],
)
def test_the_schema_rejects_bad_new_fields(field, value, message):
    data = full_data()  # accepted as it is: test_the_html_shows_the_latency_matrix_and_host_figures
    top, key = field.split(".")
    data[top][key] = value
    with pytest.raises(ReportError) as info:
        build_report(data)
    assert message in str(info.value)


# ---------------------------------------------------------------------------------------------------------
# The byte check the copy suites share (suites/perf/copycheck.py)


@pytest.fixture(scope="module")
def copycheck():
    path = Path(__file__).resolve().parents[1] / "suites" / "perf" / "copycheck.py"
    spec = importlib.util.spec_from_file_location("copycheck", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_byte_check_passes_a_copy_and_catches_dropped_or_misplaced_bytes(copycheck):
    src = copycheck.pattern(4096, salt=3).view(torch.float32)
    dst = copycheck.sentinel(4096).view(torch.float32)
    dst.copy_(src)
    copycheck.assert_copied(dst, src, "fine")
    dropped = dst.clone()
    dropped.view(torch.uint8)[1024:1088] = copycheck.SENTINEL  # one 64-byte write never landed
    with pytest.raises(AssertionError, match=r"dropped: 6\d of 4096 bytes differ .* first at byte 10\d\d"):
        copycheck.assert_copied(dropped, src, "dropped")
    with pytest.raises(AssertionError, match=r"shifted: \d+ of 4096 bytes differ"):
        copycheck.assert_copied(src.roll(1), src, "shifted")
    with pytest.raises(AssertionError, match="other source"):
        copycheck.assert_copied(copycheck.pattern(4096, salt=4), src, "other source")


def test_the_pattern_never_matches_the_sentinel_word_for_word(copycheck):
    data = copycheck.pattern(1 << 16, salt=7)
    assert int(data[3::4].max()) < 0x80 < copycheck.SENTINEL  # every word has a byte that is never SENTINEL
    assert len(set(data.view(torch.int32).tolist())) == 1 << 14  # no two words alike
