import json
import re

import numpy as np
import pytest
from helpers import DATA, read_p2p

from pytest_collectives.nodereport.judging import links
from pytest_collectives.nodereport.judging.bandwidth import class_figures, judge_node
from pytest_collectives.nodereport.judging.link_matrix import explain_pairs
from pytest_collectives.nodereport.judging.links import expected_gbps
from pytest_collectives.nodereport.judging.peers import device_outliers, link_outliers
from pytest_collectives.topology.links import parse_topo_matrix
from pytest_collectives.verdict import FAIL, PASS, WARN, Check, VerdictError, overall

# The 8 x RTX 3090 server of the project's seed documents: NV4 pairs 0-1, 2-3, 4-5, 6-7, SYS elsewhere.
TOPO_TEXT = (DATA / "rtx3090x8_topo_m.txt").read_text()
CLASSES = [list(row) for row in parse_topo_matrix(TOPO_TEXT).links]


RTX = read_p2p(DATA / "rtx3090x8_p2p_bidir_GBps.txt")


def flagged(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status != PASS]


def degrade_pair(matrix, i, j, gbps):
    out = [row[:] for row in matrix]
    out[i][j] = out[j][i] = gbps
    return out


def slow_device(matrix, d, factor):
    out = [row[:] for row in matrix]
    for k in range(len(out)):
        if k != d:
            out[d][k] *= factor
            out[k][d] *= factor
    return out


def test_fixture_is_what_the_tests_assume():
    assert len(RTX) == 8 and all(len(row) == 8 for row in RTX)
    assert CLASSES[0][1] == CLASSES[2][3] == "NV4" and CLASSES[0][2] == "SYS"
    nv = [RTX[i][j] for i in range(8) for j in range(8) if CLASSES[i][j] == "NV4"]
    sys_ = [RTX[i][j] for i in range(8) for j in range(8) if CLASSES[i][j] == "SYS"]
    assert 101 < min(nv) and max(nv) < 102 and 7.3 < min(sys_) and max(sys_) < 8.8


def test_real_node_flags_nothing():
    assert link_outliers(RTX, CLASSES) == []
    assert device_outliers(RTX, CLASSES) == []
    checks = judge_node(RTX, CLASSES, bidirectional=True, baseline=None)
    assert flagged(checks) == [] and overall(checks) == PASS
    names = [c.name for c in checks]
    assert names == ["link baseline", "link consistency", "class NV4", "class SYS"]
    assert checks[0].details == {"available": False}
    assert "no link baseline" in checks[0].reason.lower()


def test_degraded_pair_is_found_and_named():
    checks = judge_node(degrade_pair(RTX, 2, 3, 40.0), CLASSES, bidirectional=True)
    [bad] = flagged(checks)
    assert bad.name == "link GPU2<->GPU3" and bad.status == FAIL
    assert bad.details["class"] == "NV4" and bad.details["measured_GBps"] == 40.0
    assert bad.details["expected_GBps"] == pytest.approx(101.6, abs=0.5)
    assert sorted(bad.details["cells"]) == [[2, 3], [3, 2]]
    assert "GPU2<->GPU3" in bad.reason and "NV4" in bad.reason and "40.0 GB/s" in bad.reason
    assert "nvlink" in bad.reason  # says what to look at


def test_moderately_slow_pair_warns_and_a_quarter_lost_fails():
    # The SYS median is 7.89 GB/s: 6.3 is 80% of it (the doubtful band), 5.5 is 70% (below the FAIL line).
    [bad] = flagged(judge_node(degrade_pair(RTX, 0, 4, 6.3), CLASSES, bidirectional=True))
    assert bad.name == "link GPU0<->GPU4" and bad.status == WARN and bad.details["class"] == "SYS"
    assert "lspci" in bad.reason
    [bad] = flagged(judge_node(degrade_pair(RTX, 0, 4, 5.5), CLASSES, bidirectional=True))
    assert bad.name == "link GPU0<->GPU4" and bad.status == FAIL


def test_slow_gpu_is_one_device_outlier():
    checks = judge_node(slow_device(RTX, 5, 0.4), CLASSES, bidirectional=True)
    [bad] = flagged(checks)
    assert bad.name == "device GPU5" and bad.status == FAIL
    assert bad.details["device"] == 5 and bad.details["slow_links"] == bad.details["links"] == 7
    assert len(bad.details["cells"]) == 14
    # Its links are left out of the class figures, so the classes still look healthy.
    assert {c.name: c.details["pairs"] for c in checks if c.name.startswith("class")} == {
        "class NV4": 3,
        "class SYS": 18,
    }


def test_degraded_pair_and_slow_gpu_at_once():
    # Half the NV4 entries are now slow: a plain class median would sit between good and bad.
    matrix = slow_device(degrade_pair(RTX, 2, 3, 40.0), 5, 0.4)
    assert sorted(c.name for c in flagged(judge_node(matrix, CLASSES, bidirectional=True))) == [
        "device GPU5",
        "link GPU2<->GPU3",
    ]


def test_partner_gpus_both_slow():
    matrix = slow_device(slow_device(RTX, 4, 0.4), 5, 0.4)
    names = [c.name for c in flagged(judge_node(matrix, CLASSES, bidirectional=True))]
    assert names == ["device GPU4", "device GPU5"]


@pytest.mark.parametrize("baseline", [None, class_figures(RTX, CLASSES, True)])
def test_noise_raises_no_false_flags(baseline):
    rng = np.random.default_rng(20240601)
    base = np.array(RTX)
    for trial in range(200):
        noisy = (base * rng.uniform(0.95, 1.05, size=base.shape)).tolist()
        bad = flagged(judge_node(noisy, CLASSES, bidirectional=True, baseline=baseline))
        assert bad == [], f"trial {trial}: {bad}"


def test_planted_faults_survive_noise():
    rng = np.random.default_rng(7)
    for _ in range(50):
        noisy = (np.array(RTX) * rng.uniform(0.95, 1.05, size=(8, 8))).tolist()
        matrix = slow_device(degrade_pair(noisy, 6, 7, 45.0), 1, 0.35)
        names = sorted(c.name for c in flagged(judge_node(matrix, CLASSES, bidirectional=True)))
        assert names == ["device GPU1", "link GPU6<->GPU7"]


def test_one_slow_direction_is_named_with_its_direction():
    matrix = [row[:] for row in RTX]
    matrix[2][3] = 30.0
    [bad] = link_outliers(matrix, CLASSES)
    assert bad.name == "link GPU2->GPU3" and bad.details["cells"] == [[2, 3]]


def test_labels_name_the_devices():
    labels = [f"cuda:{i}" for i in range(8)]
    [bad] = flagged(judge_node(degrade_pair(RTX, 2, 3, 40.0), CLASSES, True, labels=labels))
    assert bad.name == "link cuda:2<->cuda:3"


def scale_class(matrix, link, factor):
    return [
        [v * factor if CLASSES[i][j] == link else v for j, v in enumerate(row)]
        for i, row in enumerate(matrix)
    ]


def test_uniform_slowdown_needs_a_baseline_or_the_floor():
    slow_nv = scale_class(RTX, "NV4", 0.8)
    # 81 GB/s over NV4 is consistent and above the 64 GB/s floor: only a baseline sees it.
    assert flagged(judge_node(slow_nv, CLASSES, True)) == []
    baseline = class_figures(RTX, CLASSES, True)
    [bad] = flagged(judge_node(slow_nv, CLASSES, True, baseline))
    assert bad.name == "class NV4" and bad.status == WARN and bad.details["ratio"] == pytest.approx(0.8, 0.01)
    [bad] = flagged(judge_node(scale_class(RTX, "NV4", 0.7), CLASSES, True, baseline))
    assert bad.name == "class NV4" and bad.status == FAIL
    [bad] = flagged(judge_node(scale_class(RTX, "SYS", 0.4), CLASSES, True))
    assert bad.name == "class SYS" and bad.status == FAIL and "sanity floor" in bad.reason


def test_baseline_availability_is_stated():
    baseline = class_figures(RTX, CLASSES, True)
    assert baseline == {"bidirectional": True, "GBps": {"NV4": 101.665, "SYS": 7.89}}
    check = judge_node(RTX, CLASSES, True, baseline)[0]
    assert check.name == "link baseline" and check.details["available"] is True and "NV4, SYS" in check.reason


def test_floors_scale_with_nvlink_count_and_direction():
    assert expected_gbps("NV4", True) == 4 * expected_gbps("NV1", True) == 2 * expected_gbps("NV4", False)
    assert expected_gbps("PIX", False) >= expected_gbps("PHB", False) >= expected_gbps("SYS", False)
    assert expected_gbps("unknown", True) is None
    # The real node clears every floor.
    for i in range(8):
        for j in range(8):
            if i != j:
                assert RTX[i][j] > expected_gbps(CLASSES[i][j], True)


def two_gpus(gbps: float) -> tuple[list[list[float]], list[list[str]]]:
    return [[800.0, gbps], [gbps, 800.0]], [["X", "NV4"], ["NV4", "X"]]


def test_a_single_pair_cannot_be_judged_by_peers():
    matrix, classes = two_gpus(40.0)
    [note] = link_outliers(matrix, classes)
    assert note.status == PASS and "only NV4 pair" in note.reason
    [bad] = link_outliers(matrix, classes, expected={"NV4": 101.7})
    assert bad.name == "link GPU0<->GPU1" and bad.status == FAIL and "expected NV4 figure" in bad.reason
    assert device_outliers(matrix, classes) == []  # either end could be at fault
    assert [c.name for c in flagged(judge_node(matrix, classes, True))] == ["class NV4"]  # below the floor
    assert flagged(judge_node(*two_gpus(101.0), True)) == []


def test_three_gpus_one_slow():
    classes = [["X", "PIX", "PIX"], ["PIX", "X", "PIX"], ["PIX", "PIX", "X"]]
    matrix = [[0.0, 10.0, 4.0], [10.0, 0.0, 4.0], [4.0, 4.0, 0.0]]
    [bad] = device_outliers(matrix, classes)
    assert bad.name == "device GPU2"


def test_fully_connected_nvlink_one_slow_gpu():
    classes = [["X" if i == j else "NV12" for j in range(4)] for i in range(4)]
    matrix = [[0.0 if i == j else (90.0 if 3 in (i, j) else 230.0) for j in range(4)] for i in range(4)]
    assert [c.name for c in flagged(judge_node(matrix, classes, False))] == ["device GPU3"]


def test_unknown_links_are_not_judged_and_say_so():
    classes = [["X" if i == j else "unknown" for j in range(8)] for i in range(8)]
    checks = judge_node(RTX, classes, True)
    [warning] = flagged(checks)
    assert warning.name == "class unknown" and "nvidia-smi" in warning.reason


def test_single_gpu():
    checks = judge_node([[800.0]], [["X"]], True)
    assert [c.name for c in checks] == ["link baseline", "links"] and overall(checks) == WARN  # none judged
    assert "only GPU" in explain_pairs([["X"]])


def test_explain_pairs_names_each_class():
    text = explain_pairs(CLASSES, 0, matrix=RTX)
    assert "GPU0->GPU1 crosses NV4: a connection traversing a bonded set of 4 NVLinks" in text
    assert "GPU0->GPU2, GPU3, GPU4, GPU5, GPU6 and GPU7 cross SYS" in text
    assert "(measured 101.8 GB/s)" in text and "(measured 7.6-8.5 GB/s)" in text
    assert "13x as long to GPU4 (SYS) as to GPU1 (NV4)" in text
    # Without figures the classes alone explain it.
    plain = explain_pairs(CLASSES, src=4)
    assert "GPU4->GPU5 crosses NV4" in plain and "measured" not in plain


def test_explanations_use_the_legend_of_nvidia_smi():
    legend = dict(re.findall(r"^\s*(NV#|[A-Z]+)\s*= Connection traversing (.+?)\s*$", TOPO_TEXT, flags=re.M))
    assert legend == links.LINK_LEGEND
    for link in ("NV2", "PIX", "PXB", "PHB", "NODE", "SYS"):
        assert links.link_meaning(link).startswith("a connection traversing ")


def test_one_direction_class_only_explained():
    classes = [["X", "PIX", "PIX"], ["PIX", "X", "PIX"], ["PIX", "PIX", "X"]]
    assert "All peers share one link class" in explain_pairs(classes, 1)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: judge_node([], [], True), "matrix must be a non-empty list"),
        (
            lambda: judge_node([[0, 1], [1]], [["X", "PIX"], ["PIX", "X"]], True),
            "matrix[1] must be a row of 2",
        ),
        (lambda: judge_node([[0, float("nan")], [1, 0]], [["X", "PIX"], ["PIX", "X"]], True), "matrix[0][1]"),
        (lambda: judge_node([[0, -1], [1, 0]], [["X", "PIX"], ["PIX", "X"]], True), "matrix[0][1]"),
        (lambda: judge_node([[0, True], [1, 0]], [["X", "PIX"], ["PIX", "X"]], True), "matrix[0][1]"),
        (lambda: judge_node([[0, 1], [1, 0]], [["X", "PCI"], ["PCI", "X"]], True), "classes[0][1]"),
        (lambda: judge_node([[0, 1], [1, 0]], [["X", "PIX"], ["SYS", "X"]], True), "classes[0][1] is 'PIX'"),
        (lambda: judge_node([[0, 1], [1, 0]], [["X", "PIX"]], True), "classes must be 2 rows"),
        (
            lambda: judge_node(RTX, CLASSES, False, class_figures(RTX, CLASSES, True)),
            "baseline.bidirectional",
        ),
        (lambda: judge_node(RTX, CLASSES, True, {"NV4": 100.0}), "baseline must be"),
        (
            lambda: judge_node(RTX, CLASSES, True, {"bidirectional": True, "GBps": {"NV4": 0}}),
            "baseline.GBps.NV4",
        ),
        (lambda: judge_node(RTX, CLASSES, True, {"bidirectional": True, "GBps": {"NVL": 1}}), "'NVL' is not"),
        (lambda: judge_node(RTX, CLASSES, True, threshold=0.95), "threshold <= warn"),
        (lambda: judge_node(RTX, CLASSES, True, labels=["a"]), "labels must be 8"),
        (lambda: explain_pairs(CLASSES, 8), "src must be a device index from 0 to 7"),
        (lambda: link_outliers(RTX, CLASSES, expected={"NV4": -1}), "expected['NV4'] must be a positive"),
        (lambda: Check("x", "OK", "r"), "status must be one of"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(call, message):
    with pytest.raises(VerdictError) as info:  # NodeCheckError's base: a Check built wrong too
        call()
    assert message in str(info.value) and "\n" not in str(info.value)


def test_diagonal_may_be_missing_and_soc_means_sys():
    matrix = [[None, 8.0, 8.0], [8.0, None, 8.0], [8.0, 8.0, None]]
    classes = [["X", "SOC", "SOC"], ["SOC", "X", "SOC"], ["SOC", "SOC", "X"]]
    checks = judge_node(matrix, classes, True)
    assert overall(checks) == PASS and checks[-1].name == "class SYS"


def test_checks_are_plain_json():
    checks = judge_node(slow_device(degrade_pair(RTX, 2, 3, 40.0), 5, 0.4), CLASSES, True)
    for check in checks:
        # json.dumps refuses numpy scalars, so this proves the details hold only plain Python values.
        assert json.loads(json.dumps(check.to_json(), allow_nan=False)) == {
            "name": check.name,
            "status": check.status,
            "reason": check.reason,
            "details": check.details,
        }


def test_small_classes_of_a_four_gpu_node_are_left_to_floors_and_baselines():
    # GPU rows of a hand-written 4-GPU topology: one NV12 pair, two NODE pairs, three SYS pairs.
    topo = parse_topo_matrix((DATA / "gpu4_nic2_topo_m.txt").read_text())
    gpus = topo.gpus()
    classes = [[topo.link(a, b) for b in gpus] for a in gpus]
    typical = {"NV12": 230.0, "NODE": 20.0, "SYS": 15.0}
    matrix = [[0.0 if i == j else typical[classes[i][j]] for j in range(4)] for i in range(4)]
    checks = judge_node(matrix, classes, False)
    assert flagged(checks) == []
    notes = {c.name: c.reason for c in checks if c.name.endswith(" peers")}
    assert set(notes) == {"class NV12 peers", "class NODE peers"}
    assert "GPU0<->GPU1 is the only NV12 pair" in notes["class NV12 peers"]
    assert "GPU0<->GPU2 and GPU1<->GPU2 are the only NODE pairs" in notes["class NODE peers"]
    # A baseline judges the single pair that peers cannot.
    matrix[0][1] = matrix[1][0] = 100.0
    baseline = {"bidirectional": False, "GBps": typical}
    assert [c.name for c in flagged(judge_node(matrix, classes, False, baseline))] == ["class NV12"]


def test_cpu_ranks_over_loopback_are_judged_by_consistency_alone():
    n = 4
    matrix = [[0.0 if i == j else 1.3 + 0.01 * ((i + j) % 3) for j in range(n)] for i in range(n)]
    classes = [["X" if i == j else links.LOOPBACK_LINK for j in range(n)] for i in range(n)]
    assert all(c.status == "PASS" for c in judge_node(matrix, classes, bidirectional=False))
    matrix[1][2] = matrix[2][1] = 0.3
    checks = judge_node(matrix, classes, bidirectional=False)
    flagged = [c for c in checks if c.status != "PASS"]
    # Loopback has no hardware to fail: a slow pair is the host's load, a warning with advice about the host.
    assert [(c.name, c.status) for c in flagged] == [("link GPU1<->GPU2", "WARN")]
    assert "one rank per core" in flagged[0].reason and "nvidia-smi" not in flagged[0].reason
    assert "loopback" in links.link_meaning(links.LOOPBACK_LINK)


def test_a_starved_cpu_rank_gets_host_advice_never_gpu_advice():
    n = 4
    matrix = [[0.0 if i == j else 1.3 + 0.01 * ((i + j) % 3) for j in range(n)] for i in range(n)]
    classes = [["X" if i == j else links.LOOPBACK_LINK for j in range(n)] for i in range(n)]
    labels = [f"rank{i}" for i in range(n)]
    [bad] = flagged(judge_node(slow_device(matrix, 0, 0.5), classes, bidirectional=False, labels=labels))
    assert bad.name == "device rank0" and bad.status == WARN
    assert "other ranks" in bad.reason and "one rank per core" in bad.reason
    assert not re.search(r"GPU|PCIe|nvidia-smi|reseat", bad.reason), bad.reason


def test_pairs_across_nodes_are_judged_among_themselves_as_network_links():
    # Two nodes of two GPUs: NVLink inside a node, a 10x slower network between them.
    node = [0, 0, 1, 1]
    link = [["NV4" if node[i] == node[j] else "NET" for j in range(4)] for i in range(4)]
    classes = [["X" if i == j else link[i][j] for j in range(4)] for i in range(4)]
    matrix = [[0.0 if i == j else 90.0 if node[i] == node[j] else 9.0 + 0.1 * (i + j) for j in range(4)]
              for i in range(4)]  # fmt: skip
    assert all(c.status == "PASS" for c in judge_node(matrix, classes, bidirectional=False))
    matrix[1][2] = matrix[2][1] = 2.0  # one node pair's NIC port trained at a quarter of its speed
    bad = [c for c in judge_node(matrix, classes, bidirectional=False) if c.status != "PASS"]
    assert [(c.name, c.status) for c in bad] == [("link GPU1<->GPU2", "FAIL")]
    assert "check the NICs of both nodes" in bad[0].reason, bad[0].reason
    assert "between two nodes" in links.link_meaning(links.NETWORK_LINK)


# ---------------------------------------------------------------------------------------------------------
# The sign-off proof: three topologies, planted faults FAIL, healthy noise never does.


def _modelled(classes: list[list[str]], gbps: dict[str, float], seed: int) -> list[list[float]]:
    """A healthy matrix: each class at its figure, each pair within +-3% of it (slots and NUMA distance)."""
    rng = np.random.default_rng(seed)
    n = len(classes)
    return [
        [0.0 if i == j else gbps[classes[i][j]] * rng.uniform(0.97, 1.03) for j in range(n)] for i in range(n)
    ]


# 8 x H100 SXM: every pair over NV18, about 370 GB/s one way (p2pBandwidthLatencyTest, copy engines).
NVSWITCH_CLASSES = [["X" if i == j else "NV18" for j in range(8)] for i in range(8)]
NVSWITCH = _modelled(NVSWITCH_CLASSES, {"NV18": 370.0}, seed=1)
# 8 PCIe Gen4 GPUs, two sockets, two switches per socket with two GPUs each: PIX under one switch, NODE
# between the switches of a socket, SYS across sockets.
_SWITCH = [i // 2 for i in range(8)]
PCIE_CLASSES = [
    [
        "X" if i == j else "PIX" if _SWITCH[i] == _SWITCH[j] else "NODE" if i // 4 == j // 4 else "SYS"
        for j in range(8)
    ]
    for i in range(8)
]
PCIE = _modelled(PCIE_CLASSES, {"PIX": 25.0, "NODE": 20.0, "SYS": 14.0}, seed=2)
TOPOLOGIES = {
    "rtx3090-nv4-sys (seed, measured)": (RTX, CLASSES, True),
    "h100-nv18-all-pairs": (NVSWITCH, NVSWITCH_CLASSES, False),
    "pcie-switches-pix-node-sys": (PCIE, PCIE_CLASSES, False),
}


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_healthy_nodes_never_fail_in_1000_noisy_trials(topology):
    matrix, classes, bidirectional = TOPOLOGIES[topology]
    rng = np.random.default_rng(20261123)
    base = np.array(matrix)
    warned = 0
    for trial in range(1000):
        noisy = (base * rng.uniform(0.95, 1.05, size=base.shape)).tolist()
        checks = judge_node(noisy, classes, bidirectional)
        assert overall(checks) != FAIL, f"trial {trial}: {[c for c in checks if c.status == FAIL]}"
        warned += overall(checks) == WARN
    assert warned <= 10  # the doubtful band is for doubtful pairs, not for noise


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_a_link_at_60_percent_and_a_gpu_at_60_percent_fail(topology):
    matrix, classes, bidirectional = TOPOLOGIES[topology]
    rng = np.random.default_rng(60)
    # A pair of the node's most common class, so its peers can outvote it.
    common = max(
        {c for row in classes for c in row if c != "X"}, key=lambda c: sum(r.count(c) for r in classes)
    )
    i, j = next(
        (i, j) for i in range(8) for j in range(8) if classes[i][j] == common and {i, j}.isdisjoint({5})
    )
    for _ in range(50):
        noisy = (np.array(matrix) * rng.uniform(0.95, 1.05, size=(8, 8))).tolist()
        bad_link = [row[:] for row in noisy]
        bad_link[i][j] *= 0.6
        bad_link[j][i] *= 0.6
        failed = [c.name for c in judge_node(bad_link, classes, bidirectional) if c.status == FAIL]
        assert (
            failed == [f"link GPU{i}<->GPU{j}"]
            or failed == [f"link GPU{i}->GPU{j}"]
            or failed == [f"link GPU{j}->GPU{i}"]
        ), failed
        failed = [
            c.name for c in judge_node(slow_device(noisy, 5, 0.6), classes, bidirectional) if c.status == FAIL
        ]
        assert failed == ["device GPU5"]
