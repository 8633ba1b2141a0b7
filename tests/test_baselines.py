import json
import math
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import cpu_fingerprint

from pytest_collectives import baselines
from pytest_collectives.baselines import (
    SCHEMA_VERSION,
    BaselineError,
    BenchmarkEntry,
    find_baseline,
    load_baseline,
    resolve_baseline,
    save_baseline,
)
from pytest_collectives.topology import topology_id

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


def saved(tmp_path: Path) -> Path:
    return save_baseline(tmp_path / "baselines", cpu_fingerprint(), results())


# ---------------------------------------------------------------------------------------------------------
# Saving


def test_save_then_load_round_trip(tmp_path):
    path = saved(tmp_path)
    fp = cpu_fingerprint()
    assert path == tmp_path / "baselines" / topology_id(fp) / "baseline.json"
    baseline = load_baseline(path)
    assert baseline.fingerprint == fp
    assert baseline.topology_id == topology_id(fp)
    assert baseline.benchmarks == results()
    entry = baseline.benchmarks["all_reduce[1MiB]"]
    assert entry.samples == tuple(SAMPLES)
    assert entry.median == 1.00e-3 and entry.rounds == 5 and entry.unit == "s"
    assert entry.min == min(SAMPLES) and entry.max == max(SAMPLES)
    assert entry.mean == pytest.approx(sum(SAMPLES) / 5)
    assert entry.stddev == pytest.approx(4.8166e-5, rel=1e-3)
    assert entry.extra_info == {"bytes": 1 << 20, "busbw_GBps": 1.5}
    assert baseline.benchmarks["broadcast[4KiB]"].stddev == 0.0


def test_file_is_readable_sorted_json(tmp_path):
    path = saved(tmp_path)
    text = path.read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["fingerprint"] == cpu_fingerprint().to_json()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", data["created"])
    assert data["commit"] is None  # tmp_path is not a git checkout


def test_commit_is_recorded_inside_a_git_checkout(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "-C", str(tmp_path), "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert load_baseline(saved(tmp_path)).commit == head


def test_refuses_to_overwrite_without_the_flag(tmp_path):
    path = saved(tmp_path)
    before = path.read_bytes()
    with pytest.raises(BaselineError) as info:
        saved(tmp_path)
    one_line(info, path, "already exists", "--baseline-overwrite")
    assert path.read_bytes() == before
    fewer = {"broadcast[4KiB]": BenchmarkEntry.from_samples([3e-5] * 5)}
    assert save_baseline(tmp_path / "baselines", cpu_fingerprint(), fewer, overwrite=True) == path
    assert list(load_baseline(path).benchmarks) == ["broadcast[4KiB]"]


def leftovers(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch, failing):
    path = saved(tmp_path)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(baselines.os, failing, boom)
    with pytest.raises(baselines.BaselineError, match=r"cannot write the baseline \(No space left"):
        save_baseline(tmp_path / "baselines", cpu_fingerprint(), results(), overwrite=True)
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
        ({"x": BenchmarkEntry.from_samples(SAMPLES, {"busbw": math.inf})}, "benchmarks.x.extra_info.busbw"),
        ({"x": BenchmarkEntry.from_samples(SAMPLES, {"when": object()})}, "benchmarks.x.extra_info.when"),
        ({}, "benchmarks"),
    ],
)
def test_invalid_results_are_refused_before_writing(tmp_path, bad, field):
    with pytest.raises(BaselineError) as info:
        save_baseline(tmp_path / "baselines", cpu_fingerprint(), bad)
    one_line(info, tmp_path, f"field '{field}'")
    assert list((tmp_path / "baselines").rglob("*.json")) == []


def test_bad_names_are_refused(tmp_path):
    with pytest.raises(BaselineError, match="baseline name '../x'"):
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


B = "benchmarks/all_reduce[1MiB]"


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        ("schema_version", KeyError, "schema_version"),
        ("topology_id", KeyError, "topology_id"),
        ("fingerprint", KeyError, "fingerprint"),
        ("created", KeyError, "created"),
        ("commit", KeyError, "commit"),
        ("benchmarks", KeyError, "benchmarks"),
        ("surprise", 1, "surprise"),
        ("created", "yesterday", "created"),
        ("created", "2025-01-31T12:00:00+02:00", "created"),
        ("created", "2025-01-31T12:00:00", "created"),
        ("commit", "HEAD", "commit"),
        ("benchmarks", [], "benchmarks"),
        ("benchmarks", {}, "benchmarks"),
        ("fingerprint/logical_cores", 0, "fingerprint.logical_cores"),
        ("fingerprint/cpu_model", None, "fingerprint.cpu_model"),
        ("fingerprint/links", "NV4", "fingerprint.links"),
        ("fingerprint/os", "linux", "fingerprint.os"),
        (B, 1.0, "benchmarks.all_reduce[1MiB]"),
        (f"{B}/samples", KeyError, "benchmarks.all_reduce[1MiB].samples"),
        (f"{B}/samples", [], "benchmarks.all_reduce[1MiB].samples"),
        (f"{B}/samples", "1e-3", "benchmarks.all_reduce[1MiB].samples"),
        (f"{B}/samples", [1e-3, "2e-3", 1e-3, 1e-3, 1e-3], "benchmarks.all_reduce[1MiB].samples"),
        (f"{B}/samples", [1e-3, True, 1e-3, 1e-3, 1e-3], "benchmarks.all_reduce[1MiB].samples"),
        (f"{B}/samples", [1e-3, -1e-3, 1e-3, 1e-3, 1e-3], "benchmarks.all_reduce[1MiB].samples"),
        (f"{B}/samples/2", math.nan, "benchmarks.all_reduce[1MiB].samples"),
        (f"{B}/median", math.inf, "benchmarks.all_reduce[1MiB].median"),
        (f"{B}/stddev", None, "benchmarks.all_reduce[1MiB].stddev"),
        (f"{B}/mean", KeyError, "benchmarks.all_reduce[1MiB].mean"),
        (f"{B}/rounds", 4, "benchmarks.all_reduce[1MiB].rounds"),
        (f"{B}/rounds", 5.0, "benchmarks.all_reduce[1MiB].rounds"),
        (f"{B}/unit", "ms", "benchmarks.all_reduce[1MiB].unit"),
        (f"{B}/extra_info", [], "benchmarks.all_reduce[1MiB].extra_info"),
        (f"{B}/extra_info/busbw_GBps", math.nan, "benchmarks.all_reduce[1MiB].extra_info.busbw_GBps"),
        (
            f"{B}/extra_info/nested",
            {"a": [1, -math.inf]},
            "benchmarks.all_reduce[1MiB].extra_info.nested.a[1]",
        ),
        (f"{B}/speed", 1, "benchmarks.all_reduce[1MiB].speed"),
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
    other_path = save_baseline(root, other, results())
    here = cpu_fingerprint()
    assert resolve_baseline(root, here, None) is None
    by_path = resolve_baseline(root, here, str(other_path))
    by_id = resolve_baseline(root, here, topology_id(other))
    for resolved in (by_path, by_id):
        assert resolved.foreign and resolved.baseline.topology_id == topology_id(other)


def test_a_foreign_file_in_this_topologys_directory_is_refused(tmp_path):
    root = tmp_path / "baselines"
    other_path = save_baseline(root, cpu_fingerprint(logical_cores=64), results())
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
