import copy
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from xml.etree import ElementTree

import jsonschema
import pytest
from helpers import cpu_data, gpu_data

import pytest_collectives
from pytest_collectives.conformance.judging import judge_conformance
from pytest_collectives.execution.modes.soak import judge_soak
from pytest_collectives.execution.tally import Counts, Tally, judge_settings, judge_tests
from pytest_collectives.gate.baseline_format import BenchmarkEntry
from pytest_collectives.gate.baseline_gate import judge_gate
from pytest_collectives.nodereport.collect import p2p_matrix
from pytest_collectives.nodereport.outputs import plots
from pytest_collectives.nodereport.outputs.schema import DATA_SCHEMA, REPORT_SCHEMA, ReportError, validate
from pytest_collectives.nodereport.outputs.write import write_report
from pytest_collectives.verdict import Check

# matplotlib is in the `test` extra; the plots are what most of this file checks.
imread = pytest.importorskip("matplotlib.image").imread

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def gpu_report(tmp_path_factory) -> dict[str, Path]:
    return write_report(tmp_path_factory.mktemp("gpu"), gpu_data())


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory) -> dict[str, Path]:
    return write_report(tmp_path_factory.mktemp("cpu"), cpu_data())


def judged(data: dict, *checks: Check) -> dict:
    """``data`` with the run's checks as the run judged them: the report renders them as they are."""
    data["run_checks"] = [check.to_json() for check in checks]
    return data


def tally_of(passed: int, failed: int, skipped: int = 0, failures: tuple = (), **settings: Counts) -> Tally:
    """The run's tally of outcomes (execution.tally), as its test reports would make it."""
    tally = Tally()
    tally.counts = Counts(passed=passed, failed=failed, skipped=skipped, judged=passed + failed)
    tally.failures = list(failures)
    tally.by_configuration = {name.replace("_", "="): counts for name, counts in settings.items()}
    return tally


def slower(*ratios: float) -> list[tuple[str, SimpleNamespace]]:
    """The gate's comparisons (name, its verdict) of benchmarks ``ratios`` x slower than the baseline."""
    return [
        (f"test_all_reduce[{k}MiB]", SimpleNamespace(ratio=r, verdict="regression"))
        for k, r in enumerate(ratios, 1)
    ]


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    height, width = imread(path).shape[:2]
    assert height > 0 and width > 0


def read_json(files: dict[str, Path]) -> dict:
    return json.loads(files["report.json"].read_text())


def test_gpu_report_has_every_file(gpu_report):
    assert set(gpu_report) == {
        "report.json",
        "report.html",
        "report.xml",
        "report.md",
        "p2p_bandwidth.png",
        "busbw_vs_size.png",
        "baseline_comparison.png",
    }
    for name in ("p2p_bandwidth.png", "busbw_vs_size.png", "baseline_comparison.png"):
        assert_png(gpu_report[name])
    assert {p.name for p in gpu_report["report.json"].parent.iterdir()} == set(gpu_report)  # no temp files


def test_json_validates_and_round_trips(gpu_report):
    report = read_json(gpu_report)
    validate(report, REPORT_SCHEMA)
    data = gpu_data()
    assert {k: report[k] for k in data} == data
    assert report["schema_version"] == 1 and report["verdict"] == "PASS"
    assert [c["name"] for c in report["checks"]] == [
        "link baseline",
        "link consistency",
        "class NV4",
        "class SYS",
        "test run",
    ]
    assert all(p["written"] for p in report["plots"])


def test_cpu_report_skips_the_p2p_plot_and_says_so(cpu_report):
    assert "p2p_bandwidth.png" not in cpu_report and "baseline_comparison.png" not in cpu_report
    assert_png(cpu_report["busbw_vs_size.png"])
    report = read_json(cpu_report)
    validate(report, REPORT_SCHEMA)
    assert {k: report[k] for k in cpu_data()} == cpu_data()
    skipped = {p["file"]: p["note"] for p in report["plots"] if not p["written"]}
    assert set(skipped) == {"p2p_bandwidth.png", "baseline_comparison.png"}
    page = cpu_report["report.html"].read_text()
    assert "No P2P bandwidth matrix in this run" in page
    assert "No benchmark was compared with a baseline" in page
    assert report["checks"][0]["name"] == "links" and report["verdict"] == "WARN"  # no link was judged
    assert report["checks"][0]["status"] == "WARN"


def test_html_is_self_contained(gpu_report, cpu_report):
    for files in (gpu_report, cpu_report):
        page = files["report.html"].read_text()
        assert "http://" not in page and "https://" not in page
        assert "<script" not in page.lower() and "<link" not in page.lower()
        references = re.findall(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]+)""", page)
        assert references and all(r.startswith("data:image/png;base64,") for r in references)
    # Every plot written is inlined.
    assert gpu_report["report.html"].read_text().count("data:image/png;base64,") == 3


def test_html_shows_checks_and_explains_links(gpu_report):
    page = gpu_report["report.html"].read_text()
    assert "Overall verdict: PASS" in page
    assert page.index("Overall verdict") < page.index("GPU-to-GPU bandwidth")  # the verdict comes first
    assert "GPU0-&gt;GPU1 crosses NV4" in page and "SYS" in page
    assert "<code>nvidia-smi topo -m</code>" in page


def test_failed_run_with_hostile_names_still_reports(tmp_path):
    data = gpu_data()
    data["p2p"]["matrix"][2][3] = data["p2p"]["matrix"][3][2] = 40.0
    failure = {"nodeid": "suites/t.py::test_<script>alert(1)</script>", "longrepr": "E  <b>x</b> & y"}
    data["tests"] = {"passed": 3, "failed": 1, "skipped": 0, "failures": [failure]}
    data["baseline"]["rows"][0].update(ratio=1.3, now_median_s=0.013, verdict="regression")
    gate = judge_gate("", "FAIL", ["1 confirmed regression(s)"], slower(1.3), None)
    files = write_report(tmp_path, judged(data, judge_tests(tally_of(3, 1, failures=(failure,))), *gate))
    page = files["report.html"].read_text()
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "E  &lt;b&gt;x&lt;/b&gt; &amp; y" in page
    report = read_json(files)
    assert report["verdict"] == "FAIL"
    failing = {c["name"] for c in report["checks"] if c["status"] == "FAIL"}
    assert failing == {"link GPU2<->GPU3", "test run", "performance gate"}
    # The regressed benchmarks are a table, in every output, not a paragraph of ids in the reason.
    check = next(c for c in report["checks"] if c["name"] == "performance gate")
    assert check["details"]["table"]["rows"] == [["test_all_reduce[1MiB]", "1.30x"]]
    assert "test_all_reduce" not in check["reason"]
    assert "<td>test_all_reduce[1MiB]</td><td>1.30x</td>" in page
    assert "| test_all_reduce[1MiB] | 1.30x |" in files["report.md"].read_text()

    # JUnit XML: one testcase per check, the FAILs as failures, hostile names escaped by the XML writer.
    suite = ElementTree.parse(files["report.xml"]).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [c["name"] for c in report["checks"]]
    assert int(suite.get("tests")) == len(cases) and int(suite.get("failures")) == 3
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert failed == {"link GPU2<->GPU3", "test run", "performance gate"}
    baseline_case = next(c for c in cases if c.get("name") == "performance gate")
    assert "test_all_reduce[1MiB]  1.30x" in baseline_case.find("failure").text


def test_every_output_lists_the_failing_tests_with_their_reproductions(tmp_path):
    """A vendor signs off (or files) from any one output: each lists each failing test, its message and
    the standalone reproduction it wrote."""
    data = cpu_data()
    written = "E   AssertionError: 3 elements WRONG\nE   standalone reproduction: /r/gloo-reduce-ws2.py"
    failures = (
        {"nodeid": "c.py::test_a[ws2]", "longrepr": written, "reproductions": ["/r/gloo-reduce-ws2.py"]},
        {"nodeid": "c.py::test_b", "longrepr": "def test_b():\n>   assert 1 == 2\nE   assert 1 == 2"},
    )
    data["tests"] = {"passed": 3, "failed": 2, "skipped": 0, "failures": list(failures)}
    files = write_report(tmp_path, judged(data, judge_tests(tally_of(3, 2, failures=failures))))
    check = next(c for c in read_json(files)["checks"] if c["name"] == "test run")
    assert check["status"] == "FAIL" and check["details"]["table"]["rows"] == [
        ["c.py::test_a[ws2]", "AssertionError: 3 elements WRONG", "/r/gloo-reduce-ws2.py"],
        ["c.py::test_b", "assert 1 == 2", "-"],
    ]
    markdown = files["report.md"].read_text()
    assert "| c.py::test_a[ws2] | AssertionError: 3 elements WRONG | /r/gloo-reduce-ws2.py |" in markdown
    assert "| c.py::test_b | assert 1 == 2 | - |" in markdown
    suite = ElementTree.parse(files["report.xml"]).getroot().find("testsuite")
    case = next(c for c in suite.findall("testcase") if c.get("name") == "test run")
    listed = case.find("failure").text
    assert "c.py::test_a[ws2]  AssertionError: 3 elements WRONG  /r/gloo-reduce-ws2.py" in listed
    assert "<td>/r/gloo-reduce-ws2.py</td>" in files["report.html"].read_text()


def test_a_reused_folder_loses_stale_plots(tmp_path):
    write_report(tmp_path, gpu_data())
    files = write_report(tmp_path, cpu_data())
    assert not (tmp_path / "p2p_bandwidth.png").exists()
    assert set(files) == {"report.json", "report.html", "report.xml", "report.md", "busbw_vs_size.png"}


def test_one_gpu_has_no_pairs_to_plot(tmp_path):
    data = cpu_data()
    data["p2p"] = {
        "unit": "GB/s",
        "bidirectional": False,
        "devices": ["GPU0"],
        "matrix": [[None]],
        "classes": [["X"]],
    }
    files = write_report(tmp_path, data)
    assert "p2p_bandwidth.png" not in files
    assert read_json(files)["checks"][0]["name"] == "links"


def test_p2p_baseline_is_used(tmp_path):
    data = gpu_data()
    data["p2p"]["baseline"] = {"bidirectional": True, "GBps": {"NV4": 120.0, "SYS": 7.9}}  # NV4 at 85%
    report = read_json(write_report(tmp_path, data))
    nv4 = next(c for c in report["checks"] if c["name"] == "class NV4")
    assert nv4["status"] == "WARN" and "baseline" in nv4["reason"]


def test_without_matplotlib_plots_are_skipped_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    files = write_report(tmp_path, gpu_data())
    assert set(files) == {"report.json", "report.html", "report.xml", "report.md"}
    assert "matplotlib is not installed" in files["report.html"].read_text()


def mutate(path: str, value):
    """A copy of gpu_data() with the field at `path` (dots and [i]) set to `value`, or deleted for DELETE."""

    def apply(data):
        keys = [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", path)]
        target = data
        for key in keys[:-1]:
            target = target[key]
        if value is DELETE:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value
        return data

    return apply


DELETE = object()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (mutate("tests", DELETE), "tests is missing"),
        (mutate("tests.passed", True), "tests.passed must be integer"),
        (mutate("colour", "red"), "colour is not a known field"),
        (mutate("collectives[1].bytes", -1), "collectives[1].bytes must be >= 1"),
        (mutate("collectives[0].busbw_GBps", float("nan")), "collectives[0].busbw_GBps must be number"),
        (mutate("p2p.matrix[1][2]", "fast"), "p2p.matrix[1][2] must be number or null"),
        (mutate("p2p.matrix[0][1]", -3.0), "p2p.matrix[0][1] must be a finite bandwidth"),
        (mutate("p2p.classes[0][1]", "PCI"), "p2p.classes[0][1] must be a link class"),
        (mutate("p2p.classes", [["X"]]), "p2p.classes must be 8 x 8"),
        (mutate("p2p.unit", "MB/s"), 'p2p.unit must be one of "GB/s"'),
        (mutate("p2p.baseline", {"bidirectional": False, "GBps": {}}), "p2p.baseline.bidirectional"),
        (mutate("created", "yesterday"), "created must be an ISO 8601 time"),
        (mutate("fingerprint.cpu_model", DELETE), "fingerprint.cpu_model must be present"),
        (mutate("baseline.rows[1].verdict", "slower"), "baseline.rows[1].verdict must be one of"),
        (mutate("baseline.rows[0].ratio", 0), "baseline.rows[0].ratio must be > 0"),
        (mutate("tests.failures[0]", {"nodeid": "x"}), "tests.failures[0].longrepr is missing"),
    ],
)
def test_bad_data_is_one_line_naming_the_field(tmp_path, change, message):
    data = gpu_data()
    data["tests"]["failures"] = [{"nodeid": "a::b", "longrepr": "E"}]
    folder = tmp_path / "report"
    with pytest.raises(ReportError) as info:
        write_report(folder, change(data))
    text = str(info.value)
    assert message in text and "\n" not in text
    assert not folder.exists()  # nothing is written from bad data


def test_not_a_dict_at_all(tmp_path):
    with pytest.raises(ReportError, match=r"\(top level\) must be object"):
        write_report(tmp_path, ["not", "a", "dict"])


def test_schemas_describe_the_documents():
    # The report is the data plus what write_report adds, and both are plain JSON.
    added = set(REPORT_SCHEMA["properties"]) - set(DATA_SCHEMA["properties"])
    assert added == {"schema_version", "verdict", "checks", "plots"}
    json.dumps(REPORT_SCHEMA)
    validate(copy.deepcopy(gpu_data()), DATA_SCHEMA)
    with pytest.raises(ReportError, match="optional_float must be number"):
        validate({"optional_float": float("inf")}, {"properties": {"optional_float": {"type": "number"}}})


def test_png_plots_draw_directly():
    data = gpu_data()
    png = plots.p2p_plot(data["p2p"], [])
    assert png[:8] == PNG_MAGIC
    assert plots.busbw_plot(data["collectives"])[:8] == PNG_MAGIC
    assert plots.baseline_plot(data["baseline"]["rows"], 1.05)[:8] == PNG_MAGIC


def _pair(src: int, dst: int, gbps: float, nodes: tuple[int, ...]) -> BenchmarkEntry:
    info = {"matrix": "pairs", "src": src, "dst": dst, "nbytes": 1 << 20, "algbw_GBps": gbps,
            "devices": "cuda", "src_node": nodes[src], "dst_node": nodes[dst]}  # fmt: skip
    return BenchmarkEntry.from_samples([1e-3] * 3, info)


@pytest.mark.parametrize("nodes", [(0, 0, 0, 0), (0, 0, 1, 1)], ids=["one-node", "two-nodes"])
def test_p2p_matrix_labels_pairs_by_node(nodes):
    pairs = [(s, d) for s in range(4) for d in range(4) if s != d]
    results = {f"p{s}{d}": _pair(s, d, 10.0 * (s + 1) + d, nodes) for s, d in pairs}
    seen = []

    def link(i: int, j: int) -> str:
        seen.append((i, j))
        return "NV4"

    p2p = p2p_matrix(results, link)
    assert p2p["matrix"][2][1] == 31.0 and p2p["matrix"][1][2] == 22.0
    if nodes == (0, 0, 0, 0):
        assert p2p["devices"] == ["GPU0", "GPU1", "GPU2", "GPU3"]
        assert {c for row in p2p["classes"] for c in row} == {"X", "NV4"}
    else:
        # node1's GPUs are its local GPU0 and GPU1: the intra-node class is looked up by local index
        assert p2p["devices"] == ["node0:GPU0", "node0:GPU1", "node1:GPU0", "node1:GPU1"]
        assert p2p["classes"][0] == ["X", "NV4", "NET", "NET"]
        assert p2p["classes"][3] == ["NET", "NET", "NV4", "X"]
        assert set(seen) == {(0, 1), (1, 0)}


def test_markdown_and_junit_of_a_warning(tmp_path):
    data = gpu_data()
    data["host"] = "node-a|17"
    data["p2p"]["baseline"] = {"bidirectional": True, "GBps": {"NV4": 120.0, "SYS": 7.9}}  # NV4 at 85%: WARN
    files = write_report(tmp_path, data)
    report = read_json(files)
    markdown = files["report.md"].read_text()
    assert markdown.startswith("### Node report: WARN\n") and "on `node-a|17`" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(report["checks"]) and rows[0].startswith("| WARN | class NV4 |")  # worst first
    suite = ElementTree.parse(files["report.xml"]).getroot().find("testsuite")
    assert suite.get("failures") == "0" and suite.get("hostname") == "node-a|17"
    warned = next(c for c in suite.findall("testcase") if c.get("name") == "class NV4")
    assert warned.find("failure") is None and warned.find("system-out").text.startswith("WARN: ")
    assert warned.find("properties/property").attrib == {"name": "status", "value": "WARN"}


def test_the_published_schema_validates_report_json_with_plain_jsonschema(gpu_report):
    # Fleet tooling reads the schema file shipped in the package, with no code of ours.
    schema_file = Path(pytest_collectives.__file__).parent / "schemas" / "node-report.schema.json"
    schema = json.loads(schema_file.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    report = read_json(gpu_report)
    jsonschema.validate(report, schema)
    report["verdict"] = "MAYBE"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, schema)


def capability_matrix(failing: bool) -> dict:
    cells = [
        {"operation": "all_reduce", "dtype": "float32", "reduce_op": "sum", "status": "PASS", "passed": 9,
         "failed": 0},
        {"operation": "all_reduce", "dtype": "int32", "reduce_op": "band", "status": "N/A", "passed": 0,
         "failed": 0, "reason": "Cannot use ReduceOp.BAND with NCCL"},
        {"operation": "all_gather_single_stacked", "dtype": "float16", "reduce_op": "-",
         "status": "FAIL" if failing else "untested", "passed": 0, "failed": 2 if failing else 0},
    ]  # fmt: skip
    if failing:
        cells[2]["first_failure"] = "suites/conformance/test_reduce_scatter.py::test_x[ws2] (2 ranks)"
        cells[2]["reproductions"] = ["/r/nccl-all_gather-ws2.py"]
    return {"backend": "nccl", "backend_version": "NCCL 2.27.3", "torch": "2.13.0", "world_sizes": [1, 2],
            "cells": cells,
            "training": {"FSDP2": "PASS", "tensor parallel": "PASS (1 of 2 meshes N/A)"}}  # fmt: skip


@pytest.mark.parametrize("failing", [False, True])
def test_the_capability_matrix_is_a_check_in_every_output(tmp_path, failing):
    data = cpu_data()
    data["capabilities"] = capability_matrix(failing)
    files = write_report(tmp_path, judged(data, judge_conformance(data["capabilities"], False)))
    report = read_json(files)
    assert report["capabilities"] == data["capabilities"]  # the matrix itself, for a vendor to diff
    check = next(c for c in report["checks"] if c["name"] == "conformance")
    assert check["status"] == ("FAIL" if failing else "PASS")
    assert report["verdict"] == ("FAIL" if failing else "WARN")  # a CPU run judges no link
    assert check["details"]["backend_version"] == "NCCL 2.27.3" and check["details"]["world_sizes"] == [1, 2]
    # the columns: PASS, FAIL, known bug, N/A, untested
    assert check["details"]["table"]["rows"] == [
        ["all_gather_single_stacked", "", "f16" if failing else "", "", "", "" if failing else "f16"],
        ["all_reduce band", "", "", "", "i32", ""],
        ["all_reduce sum", "f32", "", "", "", ""],
    ]
    assert check["details"]["training"] == {"FSDP2": "PASS", "tensor parallel": "PASS (1 of 2 meshes N/A)"}
    if failing:
        assert check["reason"].startswith("1 cells failed, 1 cells passed, 1 N/A, first ")
        assert "all_gather_single_stacked float16 - (suites/" in check["reason"]
        assert "(2 ranks); standalone reproduction: /r/nccl-all_gather-ws2.py)" in check["reason"]
        assert check["details"]["reproductions"] == [
            "all_gather_single_stacked float16 - (FAIL): /r/nccl-all_gather-ws2.py"
        ]
    else:
        assert check["reason"] == "1 cells passed, 1 N/A"
    assert "<td>all_reduce band</td>" in files["report.html"].read_text()
    assert "| all_reduce sum | f32 |" in files["report.md"].read_text()


def test_a_known_bug_that_fired_is_judged_and_a_run_that_tried_nothing_fails():
    """Every supported cell a known bug: judged (it fired), as the closing verdict and the settings count
    it; a run whose every conformance test was N/A or skipped tried no cell and fails."""
    matrix = capability_matrix(False)
    matrix["cells"][0].update(status="known bug", passed=0, known=3)
    check = judge_conformance(matrix, False)
    assert (check.status, check.reason) == ("PASS", "1 known bugs, 1 N/A")
    check = judge_conformance(matrix, True)
    assert check.status == "FAIL" and check.reason.startswith("every conformance test was skipped (N/A)")


def test_a_failed_conformance_test_fails_the_check_whether_or_not_it_tried_a_cell():
    matrix = {**capability_matrix(False), "failing_tests": [{"test": "t.py::test_layout", "status": "FAIL"}]}
    check = judge_conformance(matrix, False)
    assert check.status == "FAIL" and check.reason.startswith("1 test failed, 1 cells passed"), check
    matrix["training"]["FSDP2"] = "FAIL"
    assert judge_conformance({**matrix, "failing_tests": []}, False).reason.endswith(", FSDP2 failed")


def test_a_report_without_conformance_tests_has_no_matrix_check(tmp_path):
    data = cpu_data()
    data["capabilities"] = None
    report = read_json(write_report(tmp_path, data))
    assert "conformance" not in {c["name"] for c in report["checks"]}
    data["capabilities"] = {**capability_matrix(False), "cells": "all of them"}
    with pytest.raises(ReportError, match="capabilities.cells"):
        write_report(tmp_path, data)


def test_a_sweep_of_backend_settings_is_in_the_report(tmp_path):
    """Under --backend-env the matrix holds each configuration's cells and what differs between them: the
    report validates, and its matrix check names the differences and a rejected configuration."""
    data = cpu_data()
    data["capabilities"] = matrix = capability_matrix(True)
    matrix["configurations"] = [
        {"backend_env": "NCCL_PROTO=LL", "cells": matrix["cells"][:2]},
        {"backend_env": "NCCL_PROTO=LL128", "cells": matrix["cells"]},
        {"backend_env": "NCCL_PROTO=Bad", "rejected": "RuntimeError: unknown protocol"},
    ]
    line = "all_gather_single_stacked float16 FAILs only with NCCL_PROTO=LL128 (PASS with NCCL_PROTO=LL)"
    matrix["differences"] = [
        {"operation": "all_gather_single_stacked", "dtype": "float16", "reduce_op": "-", "line": line,
         "statuses": {"NCCL_PROTO=LL": "PASS", "NCCL_PROTO=LL128": "FAIL"}},
    ]  # fmt: skip
    report = read_json(write_report(tmp_path, judged(data, judge_conformance(matrix, False))))
    assert report["capabilities"] == matrix
    check = next(c for c in report["checks"] if c["name"] == "conformance")
    assert f", 2 difference(s) between backend settings, first: {line}" in check["reason"]
    rejected = "NCCL_PROTO=Bad: rejected (RuntimeError: unknown protocol)"
    assert check["details"]["backend_settings"] == [line, rejected]


@pytest.mark.parametrize(
    "failed, status, said",
    [
        # a skipped test beside the passes is no "every test ran": the count says how many did not
        ((0, 0, 0), "PASS", "no test failed in any of the 3 settings, and each ran tests (3 skipped"),
        ((0, 4, 0), "FAIL", "tests failed only with P=LL128 (none with P=LL, P=Simple): the backend is"),
        ((1, 4, 2), "FAIL", "tests failed in every one of the 3 settings: not a fault of one setting"),
    ],
)
def test_the_tests_of_each_configuration_are_a_table_naming_the_setting_they_fail_under(
    tmp_path, failed, status, said
):
    names = ("P_LL", "P_LL128", "P_Simple")
    settings = {
        name: Counts(passed=10 - n, failed=n, skipped=1, judged=10)
        for name, n in zip(names, failed, strict=True)
    }
    check = judge_settings(tally_of(30 - sum(failed), sum(failed), 3, **settings))
    files = write_report(tmp_path, judged(cpu_data(), check))
    check = next(c for c in read_json(files)["checks"] if c["name"] == "backend settings")
    assert check["status"] == status and check["reason"].startswith(said), check
    assert check["details"]["table"]["rows"][1] == ["P=LL128", 10 - failed[1], failed[1], 1]
    assert f"| P=LL128 | {10 - failed[1]} | {failed[1]} | 1 |" in files["report.md"].read_text()
    assert judge_settings(tally_of(30, 0)) is None  # a plain run: no such check


def test_a_setting_all_of_whose_tests_are_known_bugs_is_tested_and_one_none_of_whose_ran_is_not():
    """No test passed or failed under P=LL (each a known bug that fired), yet it was judged: tested.
    P=LL128, whose every test was N/A (its groups rejected, or each skipped), verified nothing: FAIL."""
    known = Counts(xfailed=2, judged=2)
    assert judge_settings(tally_of(0, 0, 0, P_LL=known)).status == "PASS"
    check = judge_settings(tally_of(0, 0, 2, P_LL=known, P_LL128=Counts(skipped=2)))
    assert check.status == "FAIL" and check.reason.startswith("untested: P=LL128, none of whose tests ran")


def soak_data(values: list[float], failures: list[dict] | None = None) -> dict:
    return {
        "duration_s": 600.0, "elapsed_s": 30.0 * len(values), "passes": len(values),
        "ended": "the time was spent", "first_seed": 7, "tolerance": 0.1, "failures": failures or [],
        "series": [
            {"benchmark": "perf/test_c.py::test_all_reduce[ws2-1MiB]", "unit": "busbw GB/s",
             "points": [[30.0 * (k + 1), v] for k, v in enumerate(values)]},
            {"benchmark": "perf/test_p2p.py::test_send_latency[ws2]", "unit": "latency us",
             "points": [[30.0 * (k + 1), 20.0] for k in range(len(values))]},
        ],
    }  # fmt: skip


def soak_report(tmp_path: Path, data: dict) -> tuple[dict, dict]:
    """The report of a soak, its checks judged by the soak from its document (judge_soak)."""
    files = write_report(tmp_path, judged(data, *judge_soak(data["soak"])))
    return files, read_json(files)


def test_a_soak_s_bandwidth_over_time_is_plotted_and_a_drift_beyond_the_tolerance_warns(tmp_path):
    data = cpu_data()
    data["soak"] = soak_data([2.0, 2.1, 1.9, 2.0, 1.8, 1.9, 1.5, 1.4, 1.5])
    files, report = soak_report(tmp_path, data)
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["soak"]["status"] == "PASS"
    assert by_name["soak"]["reason"] == (
        "9 passes in 4m30s (the time was spent; first hypothesis seed 7): no test failed in any pass."
    )
    drift = by_name["soak bandwidth"]
    assert drift["status"] == "WARN" and report["verdict"] == "WARN", drift
    assert drift["reason"].startswith("1 of 2 benchmarks got worse over the soak beyond the tolerance of 10%")
    assert drift["details"]["table"]["rows"] == [
        ["perf/test_c.py::test_all_reduce[ws2-1MiB]", "busbw GB/s", "2.000", "1.500", "25%"]
    ]
    assert_png(files[plots.SOAK_PLOT])
    html = files["report.html"].read_text()
    assert "<h2>Burn-in</h2>" in html and "9 passes of the selected tests in 270 s of the 600 asked" in html
    # steady: PASS; too few passes to tell the first third from the last: NOT JUDGED, saying so
    by_name = {c.name: c for c in judge_soak(soak_data([2.0] * 9))}
    assert by_name["soak bandwidth"].status == "PASS"
    assert "none got worse from its first passes to its last" in by_name["soak bandwidth"].reason
    by_name = {c.name: c for c in judge_soak(soak_data([2.0, 1.0, 0.5]))}
    assert by_name["soak bandwidth"].status == "NOT JUDGED"
    assert "too few to judge a drift" in by_name["soak bandwidth"].reason


def test_a_soak_s_failures_are_a_table_with_their_rate_and_replay_command(tmp_path):
    data = cpu_data()
    replay = "pytest 't.py::test_x[ws2-P=LL128]' --hypothesis-seed=9 --backend acme --world-sizes 2"
    failure = {"nodeid": "t.py::test_x[ws2-P=LL128]", "backend_env": "P=LL128", "failed_passes": 3,
               "first_pass": 3, "first_at_s": 75.5, "replay": replay,
               "draws": [{"seed": 9, "tries": 3, "failed": 3}],
               "kind": "fails every time its draw comes round, and its replay fails: 3 of 3 tries at seed 9",
               "replay_exit_status": 1}  # fmt: skip
    data["soak"] = {**soak_data([2.0] * 5, [failure]), "series": []}
    files, report = soak_report(tmp_path, data)
    check = next(c for c in report["checks"] if c["name"] == "soak")
    assert check["status"] == "FAIL" and report["verdict"] == "FAIL"
    assert check["reason"].startswith(
        "5 passes in 2m30s (the time was spent; first hypothesis seed 7): 1 test(s) failed, first "
        "t.py::test_x[ws2-P=LL128] at 1m15s (pass 3, failing in 3 of 5)"
    )
    assert check["details"]["table"]["rows"] == [
        ["t.py::test_x[ws2-P=LL128]", "P=LL128", "3 of 5 passes", failure["kind"], "1m15s (pass 3)", replay]
    ]
    assert "soak bandwidth" not in {c["name"] for c in report["checks"]}  # no benchmark ran
    assert not files.get(plots.SOAK_PLOT)
    assert "No benchmark ran in the soak" in files["report.html"].read_text()
    data["soak"]["failures"][0]["failed_passes"] = 0
    with pytest.raises(ReportError, match=r"soak\.failures\[0\]\.failed_passes"):
        write_report(tmp_path, data)


@pytest.mark.parametrize(
    "error, status, outcome, foreign, said",
    [
        ("", "NOT JUDGED", ["no baseline for cpu-2x, so no speed was compared"], None,
         "no baseline for cpu-2x"),
        ("", None, ["saved as run 1 of the baseline b.json"], None, "saved as run 1"),
        ("baseline error: no baseline for this topology, so nothing can be judged", None, [], None,
         "baseline error: no baseline"),
        ("", "FAIL", ["a machine-wide slowdown"], None, "a machine-wide slowdown"),
        ("", "PASS", ["2 benchmark(s) judged against b.json"], "gpu-8x",
         "judged against a baseline of another topology (gpu-8x), as asked: 2 benchmark(s) judged"),
    ],
)  # fmt: skip
def test_the_gate_s_check_is_its_own_verdict_and_the_report_renders_it(
    tmp_path, error, status, outcome, foreign, said
):
    """The report renders what the gate decided, never a rule of its own: it read PASS, "none is slower
    beyond noise", beside a machine-wide slowdown the gate failed with exit 1 (no one benchmark was slower
    than the rest), PASS against another topology's baseline without saying so, and PASS for a run whose
    gate judged nothing. A gate that only saved judged nothing either."""
    (check,) = judge_gate(error, status, outcome, slower(), foreign)
    expected = "FAIL" if error else status or "NOT JUDGED"
    assert check.status == expected and check.reason.startswith(said), check
    report = read_json(write_report(tmp_path, judged(cpu_data(), check)))
    rendered = next(c for c in report["checks"] if c["name"] == "performance gate")
    assert rendered == check.to_json()
    assert report["verdict"] == ("FAIL" if expected == "FAIL" else "WARN")  # a CPU run's links WARN
    assert judge_gate("", None, [], slower(), None) == []  # nothing to say: no check
