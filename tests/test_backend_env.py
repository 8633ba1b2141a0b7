"""Backend settings as an axis (--backend-env): the values parsed into configurations, each distributed test
run once per configuration in groups started with it, and a bug that shows under one setting only caught
there and named by it (a planted one: tests/mutant_backends.py's mutant_wrong_under_ll128)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from docblocks import block_of, unshown
from helpers import copy_checkout, copy_conformance, torch_below

from pytest_collectives import backend_declarations
from pytest_collectives.bench import side_by_side
from pytest_collectives.conformance.matrix import changes, differences
from pytest_collectives.execution import configurations
from pytest_collectives.execution.collection import one_configuration_at_a_time
from pytest_collectives.execution.configurations import Configuration, parse
from pytest_collectives.execution.options import OptionError
from pytest_collectives.execution.tally import Tally


def test_each_combination_of_the_values_is_a_configuration_in_the_order_given() -> None:
    found = parse(["ACME_PROTO=LL,LL128", "ACME_ALGO=Ring,Tree"])
    assert [c.id for c in found] == [
        "ACME_PROTO=LL+ACME_ALGO=Ring",
        "ACME_PROTO=LL+ACME_ALGO=Tree",
        "ACME_PROTO=LL128+ACME_ALGO=Ring",
        "ACME_PROTO=LL128+ACME_ALGO=Tree",
    ]
    assert found[1].env == (("ACME_PROTO", "LL"), ("ACME_ALGO", "Tree"))
    assert parse([]) == (Configuration(),)  # a plain run: the environment as it is


def test_a_preset_names_the_settings_a_vendor_sweeps() -> None:
    assert [c.id for c in parse(["nccl-proto"])] == ["NCCL_PROTO=LL", "NCCL_PROTO=LL128", "NCCL_PROTO=Simple"]
    configurations.backend_env_preset("acme-test-preset", {"ACME_X": ["1", "2"]})
    try:
        assert [c.id for c in parse(["acme-test-preset", "NCCL_P2P_DISABLE=1"])] == [
            "ACME_X=1+NCCL_P2P_DISABLE=1",
            "ACME_X=2+NCCL_P2P_DISABLE=1",
        ]
    finally:
        del configurations.PRESETS["acme-test-preset"]


@pytest.mark.parametrize(
    "values, message",
    [
        # (the presets named: those of the backend modules imported so far too, acme-proto in this process)
        (["nccl-protocol"], "--backend-env nccl-protocol: expected NAME=V1,V2 (a comma in a value written"),
        (["1BAD=a"], "--backend-env 1BAD=a: '1BAD' is not an environment variable's name"),
        (["ACME=a,,b"], "--backend-env ACME=a,,b: give each value, e.g. --backend-env ACME=A,B"),
        (["ACME=a,a"], "--backend-env ACME=a,a: a value is listed twice; list each once"),
        (["NCCL_PROTO=LL", "nccl-proto"], "--backend-env nccl-proto: NCCL_PROTO is already given;"),
    ],
)
def test_a_bad_value_names_what_to_fix(values: list[str], message: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse(values)
    assert str(caught.value).startswith(message)
    if values == ["nccl-protocol"]:
        assert all(preset in str(caught.value) for preset in ("gloo-lazy-init", "nccl-proto,", "nccl-nvls"))


def test_a_cell_differing_between_configurations_gets_one_line() -> None:
    def row(status: str) -> dict[str, str]:
        return {"operation": "all_reduce", "dtype": "float32", "reduce_op": "sum", "status": status}

    found = differences({"P=a": [row("PASS")], "P=b": [row("FAIL")], "P=c": [row("PASS")]})
    lines = [d["line"] for d in found]
    assert lines == ["all_reduce float32 sum FAILs only with P=b (PASS with P=a, P=c)"]
    # an untested cell (drawn in one configuration, not another) is no difference; the same status none
    assert differences({"P=a": [row("PASS")], "P=b": [row("untested")], "P=c": [row("PASS")]}) == []
    na = differences({"P=a": [row("N/A")], "P=b": [row("PASS")]})
    assert [d["line"] for d in na] == ["all_reduce float32 sum differs: N/A with P=a; PASS with P=b"]


python_backends = pytest.mark.skipif(
    torch_below(2, 13), reason="Python ProcessGroup backends crash before torch 2.13 (test_capabilities.py)"
)


@python_backends
def test_a_bug_under_one_setting_fails_only_there_and_the_run_names_it(pytester: pytest.Pytester) -> None:
    """The planted backend's float32 all_reduce is wrong only in groups started with ACME_PROTO=LL128:
    the plain run passes; the sweep of its module's preset fails exactly the LL128 tests, and the matrix
    says the cells fail only with it."""
    copy_conformance(pytester.path, ("test_all_reduce.py",))
    args = ["--backend-module", "mutant_backends", "--backend", "mutant_wrong_under_ll128", "--world-sizes",
            "2", "-k", "exact_reference and (-all_reduce] or -ring_all_reduce])", "-p",
            "no:cacheprovider"]  # fmt: skip
    plain = pytester.runpytest(*args)
    assert plain.ret == 0, plain.stdout.str()[-3000:]
    assert "ACME_PROTO" not in plain.stdout.str()  # the default run is unchanged: no configuration in ids

    swept = pytester.runpytest(
        *args, "--backend-env", "acme-proto", "--capability-json", "matrix.json", "--node-report", "report"
    )
    out = swept.stdout.str()
    failed = sorted(set(re.findall(r"^FAILED (\S+)", out, re.MULTILINE)))
    assert failed and all("[ws2-ACME_PROTO=LL128-" in nodeid for nodeid in failed), out[-3000:]
    # every test that passed in the plain run ran in each configuration, and passed but for those failed
    assert swept.parseoutcomes()["passed"] + len(failed) == 3 * plain.parseoutcomes()["passed"], out[-3000:]
    # (which cells each configuration drew differs: its examples are seeded by its test ids)
    assert re.search(r"^all_reduce float32 \w+ FAILs only with ACME_PROTO=LL128 \(PASS with ACME_", out, re.M)
    for name in ("LL", "LL128", "Simple"):
        assert f"with ACME_PROTO={name}:" in out
    doc = json.loads((pytester.path / "matrix.json").read_text())
    assert [c["backend_env"] for c in doc["configurations"]] == [
        "ACME_PROTO=LL", "ACME_PROTO=LL128", "ACME_PROTO=Simple"
    ]  # fmt: skip
    assert {(d["operation"], d["dtype"]) for d in doc["differences"]} >= {("all_reduce", "float32")}
    assert all(
        d["statuses"]["ACME_PROTO=LL128"] == "FAIL" and set(d["statuses"].values()) == {"FAIL", "PASS"}
        for d in doc["differences"]
    ), doc["differences"]
    # the node report: each configuration's tests, and the verdict that they fail under one setting only
    report = json.loads((pytester.path / "report" / "report.json").read_text())
    counts = {c["backend_env"]: c["failed"] for c in report["tests"]["configurations"]}
    assert counts == {"ACME_PROTO=LL": 0, "ACME_PROTO=LL128": len(failed), "ACME_PROTO=Simple": 0}, counts
    check = next(c for c in report["checks"] if c["name"] == "backend settings")
    assert check["status"] == "FAIL" and check["reason"].startswith("tests failed only with ACME_PROTO=LL128")


@pytest.mark.skipif(
    torch_below(2, 13), reason="gloo's GLOO_DEVICE_TRANSPORT (UV refused on Linux) checked on torch 2.13 only"
)
def test_a_setting_the_backend_rejects_is_n_a_with_its_words(pytester: pytest.Pytester) -> None:
    """gloo on Linux has no UV transport: the groups of GLOO_DEVICE_TRANSPORT=UV do not start, and its tests
    are N/A in gloo's declared words while TCP's run (a known bug of gloo still held by its plain id); UV
    is then untested, and the run that asked for it fails (exit 1) with no test failed."""
    copy_conformance(pytester.path, ("test_all_reduce.py",))
    result = pytester.runpytest(
        "--world-sizes", "2,3", "-k", "nan_and_inf_in_min_max or (exact_reference and -all_reduce])",
        "--backend-env", "gloo-transport",
        "-rsx", "-p", "no:cacheprovider",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 1, out[-3000:]  # UV is untested: the run asked for it
    outcomes = result.parseoutcomes()
    # TCP's: the all_reduce at 2 and 3 ranks, and gloo's known bug of NaN in MIN and MAX; UV's: N/A
    assert (outcomes["passed"], outcomes["xfailed"], outcomes["skipped"]) == (2, 2, 4), out[-3000:]
    assert "failed" not in outcomes and "errors" not in outcomes, out[-3000:]
    assert re.search(
        r"SKIPPED \[\d+\] .*N/A with GLOO_DEVICE_TRANSPORT=UV: gloo rejected it \(RuntimeError: "
        r"makeDeviceForInterface\(\): unsupported gloo device\)",
        out,
    ), out[-3000:]
    assert not unshown(block_of("docs/backend-settings.md", "rejected by gloo").text, out)
    # tried twice in the rejected configuration at each world size (a setting may be refused at one
    # size alone), not once per test: 2 + 2 x 2 started
    assert "collectives: 6 worker group(s) started" in out


def test_a_known_bug_names_a_test_as_a_plain_run_does() -> None:
    """Its configuration's id taken out of an id, wherever the test's own parameters put it."""
    assert (
        configurations.plain_id("t.py::test_x[ws2-P=LL-all_reduce]", "P=LL") == "t.py::test_x[ws2-all_reduce]"
    )
    assert configurations.plain_id("t.py::test_x[ws2-P=LL]", "P=LL") == "t.py::test_x[ws2]"
    assert configurations.plain_id("t.py::test_x[ws2-P=LL128]", "P=LL") == "t.py::test_x[ws2-P=LL128]"


def test_benchmarks_of_several_configurations_are_set_side_by_side() -> None:
    records = [  # as the session hands them over: the names as a plain run's
        ("b.py::test_ar[ws2-4KiB]", {"backend_env": "P=LL", "busbw_GBps": 1.5}),
        ("b.py::test_ar[ws2-4KiB]", {"backend_env": "P=LL128", "busbw_GBps": 2.5}),
        ("b.py::test_lat[ws2]", {"backend_env": "P=LL", "latency_us": 9.0}),
        ("b.py::test_lat[ws2]", {"backend_env": "P=LL128", "latency_us": 12.0}),
    ]
    head, bandwidth, latency = side_by_side.by_configuration(records)
    assert head.split() == ["benchmark", "P=LL", "P=LL128", "best"]
    assert bandwidth.split() == ["b.py::test_ar[ws2-4KiB]", "busbw", "GB/s", "1.500", "2.500", "P=LL128"]
    assert latency.split() == ["b.py::test_lat[ws2]", "latency", "us", "9.000", "12.000", "P=LL"]
    assert side_by_side.by_configuration(records[:1] + [("c.py::test_y[ws2]", {"busbw_GBps": 1.0})]) == []


@python_backends
def test_the_benchmarks_of_a_sweep_are_compared_per_setting(pytester: pytest.Pytester) -> None:
    """The perf suite's all_reduce at one size, once per TORCH_GLOO_LAZY_INIT: a table of both, each
    benchmark's extra_info naming its configuration."""
    copy_checkout(pytester.path)
    result = pytester.runpytest(
        "suites/perf/test_collectives.py", "-k", "test_all_reduce and ws2 and -4KiB- and -all_reduce]",
        "--backend-env", "TORCH_GLOO_LAZY_INIT=0,1", "--benchmark-json", "b.json", "--node-report", "report",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    table = out[out.index("benchmarks per backend setting") :].splitlines()[1:]
    assert table[0].split() == ["benchmark", "TORCH_GLOO_LAZY_INIT=0", "TORCH_GLOO_LAZY_INIT=1", "best"], out
    assert "::test_" not in table[2], out  # one benchmark: one row
    row = table[1].split()
    assert row[0].endswith("::test_all_reduce[ws2-4KiB-all_reduce]") and row[1:3] == ["busbw", "GB/s"], out
    assert row[-1] in ("TORCH_GLOO_LAZY_INIT=0", "TORCH_GLOO_LAZY_INIT=1"), out
    assert not unshown(block_of("docs/backend-settings.md", "TORCH_GLOO_LAZY_INIT=0  ").text, out)
    saved = json.loads((pytester.path / "b.json").read_text())["benchmarks"]
    assert sorted(b["extra_info"]["backend_env"] for b in saved) == [
        "TORCH_GLOO_LAZY_INIT=0",
        "TORCH_GLOO_LAZY_INIT=1",
    ]
    # in the node report, a line of the bus bandwidth plot per configuration
    report = json.loads((pytester.path / "report" / "report.json").read_text())
    assert sorted(row["name"] for row in report["collectives"]) == [
        "all_reduce n=2 TORCH_GLOO_LAZY_INIT=0",
        "all_reduce n=2 TORCH_GLOO_LAZY_INIT=1",
    ]


def test_a_saved_matrix_and_this_run_s_differ_by_the_cells_that_changed() -> None:
    def doc(*statuses: str) -> dict:
        cells = [("all_reduce", "float32", "sum"), ("broadcast", "int8", "-"), ("all_gather", "bool", "-")]
        rows = [
            {"operation": o, "dtype": d, "reduce_op": r, "status": s}
            for (o, d, r), s in zip(cells, statuses, strict=False)
        ]
        return {"cells": rows}

    assert changes(doc("PASS", "N/A", "PASS"), doc("FAIL", "PASS", "untested")) == [
        "all_reduce float32 sum: PASS -> FAIL",
        "broadcast int8: N/A -> PASS",
    ]  # untested in either is no change: the draws differ
    assert changes(doc("PASS", "PASS"), doc("PASS")) == ["broadcast int8: PASS -> not probed"]
    swept = {
        "cells": [],
        "configurations": [{"backend_env": "P=a", **doc("PASS")}, {"backend_env": "P=b", **doc("PASS")}],
    }
    later = {
        "cells": [],
        "configurations": [{"backend_env": "P=a", **doc("PASS")}, {"backend_env": "P=b", **doc("FAIL")}],
    }
    assert changes(swept, later) == ["all_reduce float32 sum with P=b: PASS -> FAIL"]


@python_backends
def test_a_run_compared_with_a_saved_matrix_names_the_cells_that_changed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before and after a driver upgrade, as a planted backend: the same run on refgloo, then on a backend
    whose float32 all_reduce turned wrong; the second names the cell that went from PASS to FAIL."""
    copy_conformance(pytester.path, ("test_all_reduce.py",))
    test = "test_all_reduce.py::test_all_reduce_matches_exact_reference[ws2-all_reduce]"
    args = [test, "--backend-module", "mutant_backends", "--world-sizes", "2", "--hypothesis-seed=3", "-p",
            "no:cacheprovider"]  # fmt: skip
    before = pytester.runpytest(*args, "--backend", "refgloo", "--capability-json", "before.json")
    assert before.ret == 0, before.stdout.str()[-3000:]
    monkeypatch.setenv("ACME_WEAR_CALLS", "0")
    after = pytester.runpytest(
        *args, "--backend", "mutant_wrong_after_wear", "--capability-compare", "before.json"
    )
    out = after.stdout.str()
    assert after.ret == 1 and re.search(r"^compared with before\.json: \d+ cell\(s\) changed:$", out, re.M), (
        out
    )
    assert re.search(r"^  all_reduce (float32|complex64) \w+: PASS -> FAIL$", out, re.M), out[-3000:]
    bad = pytester.runpytest(*args, "--capability-compare", "nothing.json")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--capability-compare nothing.json: not readable JSON" in bad.stderr.str()


def test_each_configuration_runs_whole_before_the_next_in_a_plain_run_s_order() -> None:
    """So that only one configuration's groups are alive at a time, as a plain run's."""
    a, b = parse(["P=a,b"])

    def item(name: str, configuration: Configuration | None) -> SimpleNamespace:
        params = {"world_size": 2} | ({"backend_env": configuration} if configuration else {})
        return SimpleNamespace(name=name, callspec=SimpleNamespace(params=params))

    items = [item("x-a", a), item("y-b", b), item("plain", None), item("y-a", a), item("x-b", b)]
    one_configuration_at_a_time(items, (a, b))  # type: ignore[arg-type]
    assert [i.name for i in items] == ["plain", "x-a", "y-a", "y-b", "x-b"]


def test_the_matrix_records_the_backend_version_the_ranks_ran(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend's version is what its ranks read, not what pytest's own process imported: a library path
    given as a backend setting may load another build. Here the backend module declares the version it
    finds in its environment, which only the ranks' holds, a different one in each configuration."""
    # the in-process run declares a version for gloo: this process's registry gets it back afterwards
    monkeypatch.setattr(backend_declarations, "_VERSIONS", dict(backend_declarations._VERSIONS))
    copy_conformance(pytester.path, ("test_all_reduce.py",))
    pytester.makepyfile(
        acme_versioned="""
        import os
        from pytest_collectives import declare

        declare("gloo", version=os.environ.get("ACME_BUILD", "the one pytest imported"))
        """
    )
    result = pytester.runpytest(
        "--world-sizes", "2", "-k", "exact_reference and -all_reduce]", "--backend-module", "acme_versioned",
        "--backend-env", "ACME_BUILD=1.0,2.0", "--capability-json", "cells.json", "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert json.loads((pytester.path / "cells.json").read_text())["backend_version"] == "1.0; 2.0"


@pytest.mark.skipif(torch_below(2, 13), reason="Python ProcessGroup backends crash before torch 2.13")
def test_a_setting_whose_group_never_starts_is_paid_once_and_named(pytester: pytest.Pytester) -> None:
    """Groups that hang as they start under one setting: its first test at each world size errs after the
    start's two tries, the others at once (not two more --dist-timeouts each), and the closing verdicts
    name the setting, not only the conformance cells of the one that ran. (A healthy group of 3 ranks
    took over 3 s to start on the busy 2-core machine: the timeout leaves it room.)"""
    copy_conformance(pytester.path, ("test_all_reduce.py",))
    result = pytester.runpytest(
        "--world-sizes", "2,3", "-k", "exact_reference and (-all_reduce] or ring_all_reduce])",
        "--backend-module", "mutant_backends", "--backend", "mutant_hangs_at_start_under_ll128",
        "--backend-env", "ACME_PROTO=LL,LL128", "--dist-timeout", "8", "-p", "no:cacheprovider",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 1, out[-3000:]
    # 3 tests at 2 world sizes in each setting; two starts at each world size in LL128, one in LL
    assert (result.parseoutcomes()["errors"], result.parseoutcomes()["passed"]) == (6, 6), out[-3000:]
    assert "collectives: 6 worker group(s) started" in out, out[-3000:]
    assert "not tried again for the tests after this one" in out
    result.stdout.fnmatch_lines(["backend settings: FAIL, groups did not start with ACME_PROTO=LL128"])


def test_a_setting_whose_tests_are_all_known_bugs_was_tested() -> None:
    """A known bug that fired was judged (the capability matrix counts it so): a setting all of whose
    tests are known bugs is no "untested" one, which once failed the run the same selection passed
    without the setting. A setting whose tests were all N/A still is."""
    def report(configuration: str, **outcome: object) -> SimpleNamespace:
        given = {"failed": False, "passed": False, "skipped": True, "outcome": "skipped", "when": "call",
                 "longrepr": None, "nodeid": f"t.py::test_x[{configuration}]", "keywords": {}}  # fmt: skip
        given.update(outcome)
        return SimpleNamespace(user_properties=[("backend_env", configuration)], **given)

    tally = Tally()
    tally.add(report("P=LL", wasxfail="known gloo bug: strided reduce_scatter"))
    tally.add(report("P=LL128", longrepr=("t.py", 1, "Skipped: N/A: acme supports no reduce_scatter")))
    assert tally.untested() == ["P=LL128"]
    assert (tally.counts.xfailed, tally.counts.skipped) == (1, 1)  # as pytest's summary counts them
    assert tally.untested_lines() == [
        "untested with P=LL128: none of its tests ran (N/A: acme supports no reduce_scatter); the run fails"
    ]
