import copy
import json
import math
import os
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
from helpers import cpu_fingerprint, gpu_fingerprint

from pytest_collectives.gate import baseline_format
from pytest_collectives.gate import store as baselines
from pytest_collectives.gate.baseline_format import (
    SCHEMA_VERSION,
    BaselineError,
    BenchmarkEntry,
    Run,
    Summary,
)
from pytest_collectives.gate.choosing import resolve_baseline
from pytest_collectives.gate.store import find_baseline, load_baseline, save_baseline, sittings
from pytest_collectives.schemas import load_schema
from pytest_collectives.schemas.validation import first_error
from pytest_collectives.topology.identity import topology_id

REPO = Path(__file__).parent.parent

SAMPLES = [1.02e-3, 0.98e-3, 1.00e-3, 1.10e-3, 0.99e-3]


def results() -> dict[str, BenchmarkEntry]:
    return {
        "all_reduce[1MiB]": BenchmarkEntry.from_samples(SAMPLES, {"bytes": 1 << 20, "busbw_GBps": 1.5}),
        "broadcast[4KiB]": BenchmarkEntry.from_samples([2e-5] * 6),
    }


def one_line(error: pytest.ExceptionInfo, path: Path, *fragments: str) -> str:
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ") or str(path) in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def saved(tmp_path: Path, **kwargs) -> Path:
    path, _ = save_baseline(tmp_path / "baselines", cpu_fingerprint(), results(), **kwargs)
    return path


# ---------------------------------------------------------------------------------------------------------
# Saving


def test_save_then_load_round_trip(tmp_path):
    path = saved(tmp_path)
    fp = cpu_fingerprint()
    assert path == tmp_path / "baselines" / topology_id(fp) / "baseline.json"
    baseline = load_baseline(path)
    assert baseline.fingerprint == fp
    assert baseline.topology_id == topology_id(fp)
    (run,) = baseline.runs
    # as written: each time to 4 significant digits
    assert {n: s.to_json() for n, s in run.benchmarks.items()} == {
        name: entry.summary().to_json() for name, entry in results().items()
    }
    summary = run.benchmarks["all_reduce[1MiB]"]
    assert summary == Summary(
        median=1.00e-3,
        q1=0.99e-3,
        q3=1.02e-3,
        rounds=5,
        iterations=1,
        min=0.98e-3,
        p05=pytest.approx(0.982e-3),  # inclusive: a fifth of the way from the fastest round to the second
    )
    assert run.benchmarks["broadcast[4KiB]"].q1 == run.benchmarks["broadcast[4KiB]"].q3 == 2e-5


def test_the_5th_percentile_is_judged_once_every_run_kept_it(tmp_path):
    """Runs recorded before the 5th percentile, or the minimum, was kept load, and make the gate judge the
    minimum, or the median, until they are gone: one statistic for every run, never the 5th percentile of
    one run against the median of another."""
    path = saved(tmp_path)
    saved(tmp_path)
    doc = json.loads(path.read_text())
    for summary in doc["runs"][0]["benchmarks"].values():
        del summary["min"], summary["p05"]
    for summary in doc["runs"][1]["benchmarks"].values():
        del summary["p05"]
    write(path, json.dumps(doc))
    older, old = load_baseline(path).runs
    assert older.benchmarks["all_reduce[1MiB]"].min is None and old.benchmarks["all_reduce[1MiB]"].p05 is None
    path = saved(tmp_path)  # a new run, with both, beside the old ones
    runs = load_baseline(path).runs
    assert [baseline_format.judged_statistic(runs[i:]) for i in range(3)] == ["median", "min", "p05"]


def test_a_run_records_its_boot_and_runs_of_one_boot_within_an_hour_are_one_sitting(tmp_path):
    (run,) = load_baseline(saved(tmp_path)).runs
    assert run.boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()

    def at(time: str, boot: str | None) -> Run:
        return Run(f"2026-11-{time}:00+00:00", None, {}, boot)

    runs = [
        at("23T10:00", "a"), at("23T10:40", "a"), at("23T11:30", "a"),  # 50 min apart: still one sitting
        at("23T13:00", "a"),  # 90 minutes later: another
        at("23T13:05", "b"),  # another boot (a reboot, or another machine)
        at("25T09:00", None), at("25T09:10", None),  # older files: by time alone
    ]  # fmt: skip
    assert sittings(runs) == [0, 0, 0, 1, 2, 3, 3]
    assert sittings(runs[::-1]) == [3, 3, 2, 1, 0, 0, 0]


def test_each_save_adds_a_run_and_the_last_n_are_kept(tmp_path):
    for i in range(4):
        entry = BenchmarkEntry.from_samples([(i + 1) * 1e-3] * 3, iterations=7)
        path, runs = save_baseline(tmp_path, cpu_fingerprint(), {"x": entry}, keep=3)
        assert runs == min(i + 1, 3)
    medians = [run.benchmarks["x"].median for run in load_baseline(path).runs]
    assert medians == [2e-3, 3e-3, 4e-3]  # oldest first, the first run dropped
    assert load_baseline(path).runs[0].benchmarks["x"].iterations == 7
    path, runs = save_baseline(tmp_path, cpu_fingerprint(), {"y": entry}, overwrite=True)
    (run,) = load_baseline(path).runs
    assert runs == 1 and set(run.benchmarks) == {"y"}


def test_a_save_never_drops_a_run_unless_told_how_many_to_keep(tmp_path):
    """A committed baseline of 5 runs, and a user's --baseline-save: it once dropped the oldest committed
    run without a word. Without --baseline-keep the save refuses, naming the ways on; the file is as it
    was; with it, the window rolls."""
    entry = BenchmarkEntry.from_samples([1e-3] * 3, iterations=7)
    for _ in range(5):
        path, runs = save_baseline(tmp_path, cpu_fingerprint(), {"x": entry})
    before = path.read_bytes()
    with pytest.raises(BaselineError) as refused:
        save_baseline(tmp_path, cpu_fingerprint(), {"x": entry})
    said = str(refused.value)
    assert said.startswith(f"{path} holds 5 runs: saving this one would drop its oldest (recorded ")
    assert all(way in said for way in ("--baseline-name NAME", "--baseline-keep 5", "--baseline-overwrite"))
    assert path.read_bytes() == before
    assert save_baseline(tmp_path, cpu_fingerprint(), {"x": entry}, keep=5) == (path, 5)


def test_file_is_sorted_json_with_one_benchmark_per_line(tmp_path):
    saved(tmp_path)
    path = saved(tmp_path)
    text = path.read_text()
    data = json.loads(text)
    assert list(data) == sorted(data) and data["schema_version"] == SCHEMA_VERSION
    assert data["fingerprint"] == cpu_fingerprint().to_json()
    (first, second) = data["runs"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", first["created"])
    assert first["commit"] is None  # tmp_path is not a git checkout
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith('"all_reduce[1MiB]"')]
    assert (
        lines
        == [
            '"all_reduce[1MiB]": {"iterations": 1, "median": 0.001, "min": 0.00098, "p05": 0.000982, '
            '"q1": 0.00099, "q3": 0.00102, "rounds": 5},'
        ]
        * 2
    )


def test_a_thousand_benchmarks_of_five_runs_stay_about_a_megabyte(tmp_path):
    rng = __import__("random").Random(0)
    many = {
        f"suites/perf/test_collectives.py::test_all_reduce[ws8-{i}-reduce_scatter_all_gather]":
        BenchmarkEntry.from_samples([rng.uniform(1e-5, 1e-2) for _ in range(50)], iterations=20)
        for i in range(1000)
    }  # fmt: skip
    for _ in range(5):
        path, _ = save_baseline(tmp_path, cpu_fingerprint(), many)
    assert path.stat().st_size < 1.25 * (1 << 20)  # 1.03 MiB with names of 80 characters


def test_commit_is_recorded_inside_a_git_checkout(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "-C", str(tmp_path), "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert load_baseline(saved(tmp_path)).runs[0].commit == head


@pytest.mark.parametrize("content", ["{", '{"schema_version": 1}'], ids=["corrupt", "old-format"])
def test_an_unreadable_baseline_is_never_replaced_without_the_flag(tmp_path, content):
    path = saved(tmp_path)
    path.write_text(content)
    with pytest.raises(BaselineError) as info:
        saved(tmp_path)
    one_line(info, path, "--baseline-overwrite")
    assert path.read_text() == content
    assert saved(tmp_path, overwrite=True) == path
    assert len(load_baseline(path).runs) == 1


def leftovers(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch, failing):
    path = saved(tmp_path)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(baselines.os, failing, boom)
    with pytest.raises(baseline_format.BaselineError, match=r"cannot write the baseline \(No space left"):
        save_baseline(tmp_path / "baselines", cpu_fingerprint(), results())
    assert path.read_bytes() == before
    assert leftovers(path) == []


def test_a_write_interrupted_halfway_leaves_no_file(tmp_path, monkeypatch):
    real_fdopen = os.fdopen

    class HalfWriter:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            raise KeyboardInterrupt

    monkeypatch.setattr(baselines.os, "fdopen", lambda fd, *a, **k: HalfWriter(real_fdopen(fd, *a, **k)))
    with pytest.raises(KeyboardInterrupt):
        saved(tmp_path)
    directory = tmp_path / "baselines" / topology_id(cpu_fingerprint())
    assert list(directory.iterdir()) == []


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"x": BenchmarkEntry.from_samples([])}, "benchmarks.x.samples"),
        ({"x": BenchmarkEntry.from_samples([1e-3, math.nan] * 3)}, "benchmarks.x.samples"),
        ({"x": BenchmarkEntry.from_samples([1e-3, 0.0] * 3)}, "benchmarks.x.samples"),
        ({}, "runs[0].benchmarks"),
    ],
)
def test_invalid_results_are_refused_before_writing(tmp_path, bad, field):
    with pytest.raises(BaselineError) as info:
        save_baseline(tmp_path / "baselines", cpu_fingerprint(), bad)
    one_line(info, tmp_path, f"field '{field}'")
    assert list((tmp_path / "baselines").rglob("*.json")) == []


def test_bad_names_are_refused(tmp_path):
    with pytest.raises(BaselineError, match="--baseline-name '../x'"):
        save_baseline(tmp_path, cpu_fingerprint(), results(), name="../x")


# ---------------------------------------------------------------------------------------------------------
# Loading


def write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_unreadable_files_give_one_line_errors(tmp_path, monkeypatch):
    cases = {
        "missing.json": ("no such baseline file", None),
        "empty.json": ("the file is empty", ""),
        "blank.json": ("the file is empty", "  \n"),
        "truncated.json": ("invalid JSON at line 1", saved(tmp_path).read_text()[:50].replace("\n", " ")),
        "list.json": ("must hold a JSON object, not list", "[1, 2]"),
    }
    for name, (fragment, content) in cases.items():
        path = tmp_path / name
        if content is not None:
            write(path, content)
        with pytest.raises(BaselineError) as info:
            load_baseline(path)
        one_line(info, path, fragment)

    (tmp_path / "latin1.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(BaselineError) as info:
        load_baseline(tmp_path / "latin1.json")
    one_line(info, tmp_path / "latin1.json", "not UTF-8")

    with pytest.raises(BaselineError) as info:
        load_baseline(tmp_path)
    one_line(info, tmp_path, "is a directory")

    # chmod cannot stop root from reading, so simulate what an unprivileged user would see.
    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(BaselineError) as info:
        load_baseline(tmp_path / "empty.json")
    one_line(info, tmp_path / "empty.json", "permission denied", "permissions")


def mutate(doc: dict, dotted: str, value) -> None:
    *parents, last = dotted.split("/")
    for key in parents:
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    key = int(last) if isinstance(doc, list) else last
    if value is KeyError:
        del doc[key]
    else:
        doc[key] = value


R = "runs/0"
B = f"{R}/benchmarks/all_reduce[1MiB]"
F = "runs[0].benchmarks.all_reduce[1MiB]"


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        ("schema_version", KeyError, "schema_version"),
        ("topology_id", KeyError, "topology_id"),
        ("fingerprint", KeyError, "fingerprint"),
        ("runs", KeyError, "runs"),
        ("runs", [], "runs"),
        ("runs", {}, "runs"),
        ("surprise", 1, "surprise"),
        (f"{R}/created", KeyError, "runs[0].created"),
        (f"{R}/commit", KeyError, "runs[0].commit"),
        (f"{R}/benchmarks", KeyError, "runs[0].benchmarks"),
        (f"{R}/created", "yesterday", "runs[0].created"),
        (f"{R}/created", "2025-01-31T12:00:00+02:00", "runs[0].created"),
        (f"{R}/created", "2025-01-31T12:00:00", "runs[0].created"),
        (f"{R}/commit", "HEAD", "runs[0].commit"),
        (f"{R}/benchmarks", [], "runs[0].benchmarks"),
        (f"{R}/benchmarks", {}, "runs[0].benchmarks"),
        (f"{R}/surprise", 1, "runs[0].surprise"),
        ("fingerprint/logical_cores", 0, "fingerprint.logical_cores"),
        ("fingerprint/cpu_model", None, "fingerprint.cpu_model"),
        ("fingerprint/links", "NV4", "fingerprint.links"),
        ("fingerprint/os", "linux", "fingerprint.os"),
        (B, 1.0, F),
        (f"{B}/median", KeyError, f"{F}.median"),
        (f"{B}/median", "1e-3", f"{F}.median"),
        (f"{B}/median", True, f"{F}.median"),
        (f"{B}/median", -1e-3, f"{F}.median"),
        (f"{B}/median", math.nan, f"{F}.median"),
        (f"{B}/q1", math.inf, f"{F}.q1"),
        (f"{B}/q3", None, f"{F}.q3"),
        (f"{B}/q3", 0.5e-3, f"{F}.median"),
        (f"{B}/min", 1.01e-3, f"{F}.min"),
        (f"{B}/min", 0, f"{F}.min"),
        (f"{B}/p05", 0.97e-3, f"{F}.p05"),  # below the fastest round
        (f"{B}/p05", 0.995e-3, f"{F}.p05"),  # above the first quartile
        (f"{B}/p05", "fast", f"{F}.p05"),
        (f"{B}/rounds", 0, f"{F}.rounds"),
        (f"{B}/rounds", 5.0, f"{F}.rounds"),
        (f"{B}/iterations", False, f"{F}.iterations"),
        (f"{B}/samples", [1e-3], f"{F}.samples"),
    ],
)
def test_each_schema_defect_names_file_and_field(tmp_path, where, value, field):
    path = saved(tmp_path)
    doc = json.loads(path.read_text())
    mutate(doc, where, value)
    write(path, json.dumps(doc))  # Python writes NaN/Infinity, as a careless tool would
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    one_line(info, path, f"field '{field}'")


def test_the_shipped_schema_accepts_committed_and_written_baselines(tmp_path):
    schema = load_schema("baseline.schema.json")  # from the package's data, as a tool would read it
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema == baseline_format.BASELINE_SCHEMA and schema["properties"]["schema_version"]["const"] == 2
    committed = sorted((REPO / "baselines").glob("*/*.json"))
    assert committed
    gpu = gpu_fingerprint()
    runs = [
        Run("2025-01-31T12:00:00+00:00", "0" * 40, {"x": Summary(1e-3, 9e-4, 2e-3, 5, 3)}),
        Run("2025-02-01T12:00:00+00:00", "a" * 64, {"x": Summary(1e-3, 1e-3, 1e-3, 1)}),
    ]
    (tmp_path / "gpu.json").write_text(baselines.render(topology_id(gpu), gpu, runs))
    written = [saved(tmp_path), saved(tmp_path), tmp_path / "gpu.json"]
    for path in committed + written:
        data = json.loads(path.read_text())
        # Both a plain Draft 2020-12 validator (what another tool uses) and the loader's stricter one.
        jsonschema.Draft202012Validator(schema).validate(data)
        assert first_error(data, schema) is None, path
        assert load_baseline(path).topology_id == data["topology_id"]


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (f"{B}/rounds", "5", f"field '{F}.rounds' must be integer, got '5'"),
        (f"{B}/iterations", True, f"field '{F}.iterations' must be integer, got True"),
        (f"{B}/rounds", 0, f"field '{F}.rounds' must be >= 1, got 0"),
        (f"{B}/median", -1e-3, f"field '{F}.median' must be > 0, got -0.001"),
        (f"{B}/q3", KeyError, f"field '{F}.q3' is missing"),
        (f"{B}/mean", 1e-3, f"field '{F}.mean' is not a known field (known: min, p05, median, q1, q3"),
        (f"{R}/commit", "HEAD", "field 'runs[0].commit' must match ^([0-9a-f]{40}|[0-9a-f]{64})$ (git"),
        (f"{R}/benchmarks", {}, "field 'runs[0].benchmarks' must not be empty"),
        ("runs", [], "field 'runs' must have at least 1 item(s)"),
        ("fingerprint/gpus", [{"name": "H100"}], "field 'fingerprint.gpus[0].pci_bus_id' is missing"),
        ("fingerprint/link_source", "smi", "field 'fingerprint.link_source' must be one of \"nvml\", "),
    ],
)
def test_a_broken_file_gets_the_schemas_one_line_message(tmp_path, where, value, message):
    path = saved(tmp_path)
    doc = json.loads(path.read_text())
    mutate(doc, where, value)
    write(path, doc)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    text = one_line(info, path)
    assert text.startswith(f"{path}: {message}") and text.endswith("; fix the file or re-record it"), text


def test_the_first_error_is_the_first_field_in_the_file(tmp_path):
    # Indices compare as numbers: of runs[2] and runs[10], runs[2] is named (as text, "10" < "2").
    path = saved(tmp_path)
    doc = json.loads(path.read_text())
    doc["runs"] = [copy.deepcopy(doc["runs"][0]) for _ in range(11)]
    for i in (10, 2):
        mutate(doc, f"{R.replace('0', str(i))}/benchmarks/all_reduce[1MiB]/rounds", 0)
    write(path, doc)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    one_line(info, path, "field 'runs[2].benchmarks.all_reduce[1MiB].rounds' must be >= 1")
    expected = "runs[2].benchmarks.all_reduce[1MiB].rounds must be >= 1, got 0"  # the node report's style
    assert first_error(doc, baseline_format.BASELINE_SCHEMA) == expected


def test_wrong_schema_version(tmp_path):
    path = saved(tmp_path)
    doc = json.loads(path.read_text())
    doc["schema_version"] = 99
    write(path, doc)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    one_line(
        info, path, "field 'schema_version' is 99", f"reads version {SCHEMA_VERSION}", "--baseline-overwrite"
    )


def test_a_baseline_of_the_old_format_says_how_to_re_record(tmp_path):
    path = write(tmp_path / "old.json", {"schema_version": 1, "benchmarks": {}})
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    one_line(info, path, "is 1", "several runs", "--baseline-save --baseline-overwrite once")


def test_edited_fingerprint_no_longer_matches_its_id(tmp_path):
    path = saved(tmp_path)
    doc = json.loads(path.read_text())
    doc["fingerprint"]["logical_cores"] = 64
    write(path, doc)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    one_line(
        info,
        path,
        "field 'topology_id'",
        topology_id(cpu_fingerprint()),
        topology_id(cpu_fingerprint(logical_cores=64)),
    )


def test_software_versions_may_differ_inside_one_topology(tmp_path):
    path = saved(tmp_path)
    newer = cpu_fingerprint(torch_version="2.14.0")
    assert find_baseline(tmp_path / "baselines", newer) == path


# ---------------------------------------------------------------------------------------------------------
# Finding and resolving


def test_find_baseline(tmp_path):
    root = tmp_path / "baselines"
    assert find_baseline(root, cpu_fingerprint()) is None
    path = saved(tmp_path)
    assert find_baseline(root, cpu_fingerprint()) == path
    assert find_baseline(root, cpu_fingerprint(), name="other") is None
    assert find_baseline(root, cpu_fingerprint(logical_cores=4)) is None


def test_resolve_the_current_topology(tmp_path):
    root = tmp_path / "baselines"
    assert resolve_baseline(root, cpu_fingerprint(), None) is None
    path = saved(tmp_path)
    resolved = resolve_baseline(root, cpu_fingerprint(), None)
    assert resolved.baseline.path == path and not resolved.foreign
    for explicit in (str(path), topology_id(cpu_fingerprint()), str(path.parent)):
        again = resolve_baseline(root, cpu_fingerprint(), explicit)
        assert again.baseline.path.samefile(path) and not again.foreign


def test_a_foreign_baseline_is_used_only_when_named(tmp_path):
    root = tmp_path / "baselines"
    other = cpu_fingerprint(logical_cores=64)
    other_path, _ = save_baseline(root, other, results())
    here = cpu_fingerprint()
    assert resolve_baseline(root, here, None) is None
    by_path = resolve_baseline(root, here, str(other_path))
    by_id = resolve_baseline(root, here, topology_id(other))
    for resolved in (by_path, by_id):
        assert resolved.foreign and resolved.baseline.topology_id == topology_id(other)


def test_a_foreign_file_in_this_topologys_directory_is_refused(tmp_path):
    root = tmp_path / "baselines"
    other_path, _ = save_baseline(root, cpu_fingerprint(logical_cores=64), results())
    misplaced = root / topology_id(cpu_fingerprint()) / "baseline.json"
    misplaced.parent.mkdir(parents=True)
    misplaced.write_bytes(other_path.read_bytes())
    with pytest.raises(BaselineError) as info:
        resolve_baseline(root, cpu_fingerprint(), None)
    one_line(info, misplaced, topology_id(cpu_fingerprint()), topology_id(cpu_fingerprint(logical_cores=64)))


def test_an_unknown_explicit_baseline_lists_the_known_ids(tmp_path):
    root = tmp_path / "baselines"
    saved(tmp_path)
    with pytest.raises(BaselineError) as info:
        resolve_baseline(root, cpu_fingerprint(), "gpu-8x-rtx-3090-nv4-sys-00000000")
    one_line(info, root, "gpu-8x-rtx-3090-nv4-sys-00000000", f"known ids: {topology_id(cpu_fingerprint())}")
    with pytest.raises(BaselineError) as info:
        resolve_baseline(root, cpu_fingerprint(), str(tmp_path / "nope.json"))
    one_line(info, tmp_path / "nope.json", "no such baseline file")
