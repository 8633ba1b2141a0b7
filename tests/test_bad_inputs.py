"""Each bad input: one line naming the input and the fix, a non-zero exit, no traceback, no baseline touched.

Options, and baseline files named with --baseline, are usage errors (exit 4, `ERROR: ...` on stderr); a bad
world_size marker is a collection error (exit 2, its one line under `ERROR collecting`); a bad baseline
found in the baseline directory is a gate error (exit 1, one `baseline error: ...` line). Each case runs a
whole pytest session (in-process, as test_gate.py does) over a module with a plain benchmark and a
distributed test, with a valid baseline of this machine's topology on disk; every file under baselines/
(and a file named with --baseline) is hashed before and after.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_collectives.execution import options
from pytest_collectives.gate.baseline_format import BenchmarkEntry
from pytest_collectives.gate.store import save_baseline
from pytest_collectives.topology.detect import detect

USAGE, COLLECTION = pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERRUPTED
BASELINE = pytest.ExitCode.TESTS_FAILED
BENCH_ID = "test_inputs.py::test_bench"

MODULE = """
import os
import pytest

@pytest.mark.world_size({sizes})
def test_distributed(pg):
    pass

def test_bench(benchmark):
    with open("ran", "a") as f:  # the body ran: the error, if any, came after the tests
        f.write("bench\\n")
    benchmark(sum, range(100))
"""


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...] = ()
    message: str = ""  # fnmatch pattern of the one error line ('ERROR: ' or 'baseline error: ' left out)
    exit: pytest.ExitCode = USAGE
    sizes: str = "2"  # the world_size marker's arguments
    ini: str = ""
    baseline: str = ""  # a bad baseline file: '<where>:<what>', where is 'dir' (found) or 'arg' (--baseline)
    gpus_present: int | None = None


def usage(id: str, *args: str, message: str, **kw: object) -> Case:
    return Case(id, args, message, USAGE, **kw)  # type: ignore[arg-type]


def marker(id: str, sizes: str, message: str) -> Case:
    return Case(id, (), message, COLLECTION, sizes=sizes)


def named(id: str, what: str, message: str) -> Case:
    """A bad file given as --baseline PATH: refused before the tests run, as a usage error."""
    return Case(id, (), "--baseline {path}: " + message, USAGE, baseline=f"arg:{what}")


def found(id: str, what: str, message: str, *args: str) -> Case:
    """A bad file where the gate looks for this topology's baseline: a gate error before the tests run."""
    return Case(id, args, message, BASELINE, baseline=f"dir:{what}")


THRESHOLD = "--regression-threshold"
CASES = [
    usage("gpus-negative", "--gpus", "-1", message="--gpus -1: * can't be negative; use 0 for CPU ranks"),
    usage("gpus-word", "--gpus", "two", message="--gpus two: expected a whole number of GPUs, e.g. --gpus 8"),
    usage("gpus-fraction", "--gpus", "1.5", message="--gpus 1.5: expected a whole number of GPUs*"),
    usage("gpus-empty", "--gpus", "", message="--gpus : expected a whole number of GPUs*"),
    usage("gpus-on-cpu", "--gpus", "2", message="--gpus 2: no GPU or other accelerator*; drop --gpus*"),
    usage("gpus-more-than-present", "--gpus", "8", gpus_present=2,
          message="--gpus 8: only 2 GPU(s) found; use --gpus 2 or fewer"),
    usage("gpus-ini", message="--gpus many: expected a whole number of GPUs*", ini="gpus = many"),
    usage("world-sizes-0", "--world-sizes", "0", message="--world-sizes 0: * at least 1 rank"),
    usage("world-sizes-negative", "--world-sizes=-2,2", message="--world-sizes -2,2: * at least 1 rank"),
    usage("world-sizes-twice", "--world-sizes", "2,3,2", message="--world-sizes 2,3,2: *listed twice; list*"),
    usage("world-sizes-word", "--world-sizes", "two", message="--world-sizes two: expected comma-separated*"),
    usage("world-sizes-gap", "--world-sizes", "2,,3", message="--world-sizes 2,,3: expected comma-sep*"),
    usage("world-sizes-ini", message="--world-sizes 2;3: expected comma-separated*", ini="world_sizes = 2;3"),
    usage("backend-nccl-on-cpu", "--backend", "nccl", message="--backend nccl runs on cuda*not on CPU*"),
    usage("backend-unknown", "--backend", "mpi", message="--backend mpi: this torch has no 'mpi' backend*"),
    usage("timeout-0", "--dist-timeout", "0", message="--dist-timeout 0: * positive number of seconds"),
    usage("timeout-negative", "--dist-timeout", "-1", message="--dist-timeout -1: * positive number*"),
    usage("timeout-nan", "--dist-timeout", "nan", message="--dist-timeout nan: * positive number*"),
    usage("timeout-inf", "--dist-timeout", "inf", message="--dist-timeout inf: * positive number*"),
    usage("timeout-word", "--dist-timeout", "soon", message="--dist-timeout soon: expected a number of *"),
    usage("threshold-0", THRESHOLD, "0", message=f"{THRESHOLD} 0*: * between 0 and 1*"),
    usage("threshold-2", THRESHOLD, "2", message=f"{THRESHOLD} 2*: * between 0 and 1*"),
    usage("threshold-nan", THRESHOLD, "nan", message=f"{THRESHOLD} nan: * between 0 and 1*"),
    usage("threshold-word", THRESHOLD, "lots", message=f"{THRESHOLD} lots: * between 0 and 1*"),
    usage("tolerance-0", "--machine-tolerance", "0", message="--machine-tolerance 0: * above 0, e.g. 0.1"),
    usage("tolerance-word", "--machine-tolerance", "some", message="--machine-tolerance some: * above 0*"),
    usage("tier-budget-negative", "--tier-budget=-1", message="--tier-budget -1: expected seconds, 0 or*"),
    usage("tier-budget-word", "--tier-budget", "ample", message="--tier-budget ample: expected seconds*"),
    usage("tier-budget-nan", "--tier-budget", "nan", message="--tier-budget nan: expected seconds*"),
    usage("overwrite-without-save", "--baseline-overwrite",
          message="--baseline-overwrite only makes sense with --baseline-save"),
    marker("marker-0", "0", "test_inputs.py::test_distributed: world_size takes whole numbers >= 1*"),
    marker("marker-negative", "-1", "*world_size takes whole numbers >= 1 or 'max', got (-1,)"),
    marker("marker-word", "'x'", "*world_size takes whole numbers >= 1 or 'max', got ('x',)"),
    marker("marker-fraction", "2.5", "*world_size takes whole numbers >= 1 or 'max', got (2.5,)"),
    marker("marker-max-and-2", "'max', 2", "*world_size takes whole numbers >= 1 or 'max', got ('max', 2)"),
    found("found-empty", "empty", "{path}: the file is empty; delete it and re-record the baseline"),
    found("found-truncated", "truncated", "{path}: invalid JSON at line 1 column *; the file may be trunc*"),
    found("found-old-schema", "schema", "{path}: field 'schema_version' is 99 but * reads version 2*"),
    found("found-not-utf8", "binary", "{path}: not UTF-8 text; delete it and re-record the baseline"),
    found("found-not-an-object", "list", "{path}: the file must hold a JSON object, not list; re-record it"),
    found("found-missing-field", "missing", "{path}: field 'runs' is missing; fix the file*"),
    found("found-other-topology", "foreign", "{path}: recorded on topology * move the file to * or name it*"),
    found("found-unreadable", "unreadable", "{path}: permission denied *; fix the file's permissions"),
    found("found-directory", "directory", "{path}: is a directory*", "--fail-on-regression"),
    found("save-onto-directory", "directory", "{path}*directory*", "--baseline-save", "--baseline-overwrite"),
    named("named-empty", "empty", "{path}: the file is empty; delete it and re-record the baseline"),
    named("named-truncated", "truncated", "{path}: invalid JSON at line 1 column *; the file may be trunc*"),
    named("named-old-schema", "schema", "{path}: field 'schema_version' is 99 but *; re-record*"),
    named("named-unreadable", "unreadable", "{path}: permission denied *; fix the file's permissions"),
    named("named-directory", "directory", "{path}/baseline.json: no such baseline file; check the path or*"),
    named("named-missing-file", "absent", "{path}: no such baseline file; check the path or record a base*"),
    Case("named-unknown-id", (), "baseline 'cpu-nowhere': neither a file nor a topology id * (known ids: *",
         BASELINE, baseline="arg:unknown-id"),
]  # fmt: skip
assert len(CASES) >= 30


def write_bad(path: Path, what: str, fingerprint: object, results: dict[str, BenchmarkEntry]) -> None:
    """Make ``path`` the bad baseline ``what``; a valid baseline may already be there."""
    if what == "absent":
        return
    if path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if what == "directory":
        path.mkdir()
        return
    if what == "foreign":  # a valid baseline, recorded on a machine with another CPU, under this id
        other = dataclasses.replace(fingerprint, cpu_model="Another CPU", logical_cores=96)  # type: ignore[type-var]
        saved, _ = save_baseline(path.parent.parent / "elsewhere", other, results)
        saved.rename(path)
        return
    content = {
        "empty": b"",
        "truncated": b'{"schema_version": 1, "benchmarks": {',
        "schema": b'{"schema_version": 99}',
        "binary": b"\xff\xfe\x00baseline",
        "list": b"[1, 2, 3]",
        "missing": b'{"schema_version": 2, "topology_id": "x", "fingerprint": {}}',
        "unreadable": b'{"schema_version": 1}',
    }[what]
    path.write_bytes(content)
    if what == "unreadable":
        path.chmod(0)


def snapshot(*roots: Path) -> dict[str, str]:
    """sha256 of every file under the roots (a directory's entry marks that it exists)."""
    digests = {}
    for root in roots:
        for path in [root, *root.rglob("*")] if root.is_dir() else [root] if root.exists() else []:
            digests[str(path)] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def _readable_despite_chmod(path: Path) -> bool:
    try:
        path.read_bytes()
    except PermissionError:
        return False
    return True


def run_case(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, case: Case
) -> tuple[pytest.RunResult, str]:
    """The session for ``case``, and the one error message the case expects (path filled in)."""
    pytester.makepyfile(test_inputs=MODULE.format(sizes=case.sizes))
    pytester.makeini(f"[pytest]\nbaseline_dir = baselines\n{case.ini}\n")
    fingerprint = detect("gloo", 0)
    results = {BENCH_ID: BenchmarkEntry.from_samples([1e-6] * 5)}
    # A valid baseline of this machine is on disk in every case: no bad input may change it.
    good, _ = save_baseline(pytester.path / "baselines", fingerprint, results)
    path = good
    args = list(case.args)
    if case.baseline:
        where, what = case.baseline.split(":")
        if where == "arg":
            path = Path("cpu-nowhere") if what == "unknown-id" else pytester.path / "named.json"
            args += ["--baseline", str(path)]
            if what != "unknown-id":
                write_bad(path, what, fingerprint, results)
        else:
            write_bad(path, what, fingerprint, results)
        if what == "unreadable" and _readable_despite_chmod(path):
            pytest.skip("running as root: chmod 000 does not stop reads, so the file is not unreadable")
    if case.gpus_present is not None:
        monkeypatch.setattr(options, "count_accelerators", lambda: case.gpus_present)
    before = snapshot(pytester.path / "baselines", pytester.path / "named.json")
    result = pytester.runpytest(
        "-p", "no:randomly", "--benchmark-min-rounds", "5", "--benchmark-max-time", "0.01", *args
    )
    after = snapshot(pytester.path / "baselines", pytester.path / "named.json")
    assert after == before, "a baseline file changed"
    return result, case.message.format(path=path)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_bad_input_is_one_line_naming_the_input_and_the_fix(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, case: Case
) -> None:
    result, message = run_case(pytester, monkeypatch, case)
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret == case.exit, f"exit {result.ret!r}, expected {case.exit!r}\n{out}\n{err}"
    assert "Traceback" not in out + err and "INTERNALERROR" not in out + err, out + err
    if case.exit == USAGE:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
        result.stderr.fnmatch_lines([f"ERROR: {message}"])
    elif case.exit == COLLECTION:
        report = out.split(" ERROR collecting ", 1)[1].split("\n", 1)[1].split("=====", 1)[0]
        lines = [line for line in report.splitlines() if line.strip()]
        assert len(lines) == 1, f"expected one line under 'ERROR collecting', got:\n{out}"
        result.stdout.fnmatch_lines([message])
    else:
        lines = [line for line in out.splitlines() if line.startswith("baseline error:")]
        assert len(lines) == 1, out
        result.stdout.fnmatch_lines([f"baseline error: {message}"])


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c.id) for c in CASES if c.baseline],
)
def test_bad_baseline_is_reported_before_the_benchmarks_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, case: Case
) -> None:
    run_case(pytester, monkeypatch, case)
    assert not (pytester.path / "ran").exists(), "the benchmarks ran before the bad baseline was reported"


def test_the_cases_cover_every_kind_of_bad_input() -> None:
    """The table is the specification: keep every input of the tracker issue in it."""
    ids = {c.id for c in CASES}
    required = {
        "gpus-negative", "gpus-word", "gpus-more-than-present", "gpus-on-cpu", "world-sizes-0",
        "world-sizes-negative",  # one rank is a world size since the conformance suites took it (issue 17)
        "world-sizes-twice", "world-sizes-word", "backend-nccl-on-cpu", "marker-0", "marker-negative",
        "marker-word", "timeout-0", "timeout-negative", "timeout-nan", "timeout-inf", "timeout-word",
        "threshold-0", "threshold-2", "threshold-word", "overwrite-without-save", "found-empty",
        "named-truncated", "found-old-schema", "found-other-topology", "found-unreadable", "found-directory",
        "named-directory",
    }  # fmt: skip
    assert required <= ids, required - ids


def test_the_suites_without_the_plugin_say_so_in_one_line(tmp_path: Path) -> None:
    """A pytest whose Python lacks the plugin (a system pytest beside the tox set-up) is told what to do in
    one line, where the error raised while the suites' conftest was imported was printed as an
    ImportError with its frame."""
    suite = Path(__file__).parents[1] / "suites" / "conformance" / "test_layouts.py"
    # the plugin's package unimportable, as in a Python that never installed it
    hide = "import sys; sys.modules['pytest_collectives'] = None; import pytest; sys.exit(pytest.main())"
    run = subprocess.run(
        [sys.executable, "-c", hide, str(suite), "-p", "no:cacheprovider", "--co"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )  # fmt: skip
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    (line,) = [text for text in run.stderr.splitlines() if text.strip()]
    assert line.startswith("ERROR: the suites need the pytest-collectives plugin, which this Python"), line
    assert "Traceback" not in run.stdout + run.stderr and "ImportError" not in run.stdout + run.stderr
