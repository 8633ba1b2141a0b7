"""The gate on real sessions (not a timed test: run it by hand on a quiet machine).

    python docs/measurements/scripts/bench_gate_sessions.py [--unchanged 20] [--planted 20] [--max-time 0.2]

In a scratch directory it writes 30 real 2-rank gloo benchmarks (all_reduce, broadcast, all_gather over 10
sizes, each call doing the collective 4 times), records a baseline of 3 sessions, then runs: unchanged
sessions (a flagged one is a false alarm), sessions where one benchmark does its collective 5 times instead
of 4 (a planted 25% slowdown: caught?), and one session where every benchmark does (machine-wide: caught?).
Each session's verdict is read from --gate-report's gate.json. It also times the gate itself on 1000
synthetic benchmarks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCHMARKS = """
import os
import pytest, torch, torch.distributed as dist

SIZES = [256 * 2 ** i for i in range(10)]
OPS = {
    "all_reduce": lambda t, out: dist.all_reduce(t),
    "broadcast": lambda t, out: dist.broadcast(t, 0),
    "all_gather": lambda t, out: dist.all_gather_into_tensor(out, t),
}

@pytest.mark.world_size(2)
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("nbytes", SIZES)
def test_collective(pg, benchmark, op, nbytes):
    t = torch.ones(nbytes // 4)
    out = torch.empty(2 * t.numel())
    plant = os.environ.get("PLANT", "")
    reps = int(os.environ.get("PLANT_REPS", "5")) if plant in ("all", f"{op}-{nbytes}") else 4
    def call():
        for _ in range(reps):
            OPS[op](t, out)
    benchmark(call, nbytes=nbytes, collective=op)
"""


def session(where: Path, max_time: float, *args: str, plant: str = "", reps: int = 5) -> dict:
    env = {**os.environ, "PLANT": plant, "PLANT_REPS": str(reps)}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--benchmark-max-time",
        str(max_time),
    ]
    done = subprocess.run([*cmd, *args], cwd=where, env=env, capture_output=True, text=True)
    report = where / "gate" / "gate.json"
    if "--baseline-save" in args:
        assert done.returncode == 0, done.stdout[-3000:]
        return {}
    data = json.loads(report.read_text())
    report.unlink()
    return data


def why(data: dict) -> str:
    """What failed a session: the confirmed regressions, family slowdowns and the machine-wide verdict."""
    flagged = [b["name"].split("[")[1][:-1] for b in data["benchmarks"] if b["verdict"] == "regression"]
    families = [f"{f['name']} {f['relative']:.2f}x" for f in data["families"] if f["verdict"] == "regression"]
    machine = f"{data['machine']['factor']:.3f}x {data['machine']['verdict']}"
    return f"regressions {flagged}, families {families}, machine {machine}"


def gate_cost(benchmarks: int = 1000, runs: int = 5) -> float:
    """Seconds the gate takes to judge and tabulate ``benchmarks`` against ``runs`` baseline runs."""
    import random

    from pytest_collectives.gate.report import format_table, markdown
    from pytest_collectives.gate.statistics import judge

    rng = random.Random(0)
    names = [f"test_all_reduce[ws8-{i}]" for i in range(benchmarks)]
    base = [{n: rng.uniform(1e-5, 1e-2) for n in names} for _ in range(runs)]
    start = time.perf_counter()
    result = judge(base, {n: t * rng.uniform(0.9, 1.1) for n, t in base[0].items()})
    format_table(result.rows)
    markdown(result, [], failed=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unchanged", type=int, default=20)
    parser.add_argument("--planted", type=int, default=20)
    parser.add_argument("--max-time", type=float, default=0.2)
    parser.add_argument(
        "--plant-reps",
        type=int,
        default=5,
        help="collectives per call when planted (4 unplanted): 5 is 25%% slower",
    )
    parser.add_argument(
        "--target",
        default="auto",
        help="the benchmark slowed down, as op-nbytes (default: the one whose detectable slowdown the first "
        "unchanged session says is smallest)",
    )
    opts = parser.parse_args()
    print(f"gate cost: {gate_cost():.3f} s to judge 1000 benchmarks against 5 runs and write its tables")
    where = Path(tempfile.mkdtemp(prefix="gate-sessions-"))
    (where / "test_gate_sessions.py").write_text(BENCHMARKS)
    (where / "pytest.ini").write_text("[pytest]\nbaseline_dir = baselines\n")
    start = time.time()
    for _ in range(3):
        session(where, opts.max_time, "--baseline-save")
    gate = ("--fail-on-regression", "--gate-report", "gate")
    false_alarms, first = 0, None
    for i in range(max(opts.unchanged, 1)):
        data = session(where, opts.max_time, *gate)
        first = first or data
        if i >= opts.unchanged:  # only a probe for the target
            break
        false_alarms += data["verdict"] == "fail"
        print(f"unchanged {i + 1}: {data['verdict']}; {why(data)}")
    if opts.target == "auto":
        target = min(first["benchmarks"], key=lambda b: b["detectable"] or math.inf)["name"]
        nbytes, op = target.split("[ws2-")[1].rstrip("]").split("-")
    else:
        op, nbytes = opts.target.split("-")
        target = f"test_gate_sessions.py::test_collective[ws2-{nbytes}-{op}]"
    caught = 0
    for i in range(opts.planted):
        data = session(where, opts.max_time, *gate, plant=f"{op}-{nbytes}", reps=opts.plant_reps)
        row = next(b for b in data["benchmarks"] if b["name"] == target)
        caught += data["verdict"] == "fail" and row["verdict"] == "regression"
        print(
            f"planted {i + 1}: {data['verdict']}, {target} {row['relative']:.3f}x (detects >= "
            f"{row['detectable']:.0%}), again {row['remeasured']}; {why(data)}"
        )
    data = session(where, opts.max_time, *gate, plant="all", reps=5)
    machine = data["machine"]
    print(f"uniform 25%: {data['verdict']}, machine {machine['factor']:.3f}x {machine['verdict']}")
    print(
        f"\nfalse alarms: {false_alarms} of {opts.unchanged} unchanged sessions; planted {opts.plant_reps}/4 "
        f"slowdown of {target}: caught in {caught} of {opts.planted}; uniform 25%: {machine['verdict']} "
        f"({time.time() - start:.0f} s, scratch {where})"
    )


if __name__ == "__main__":
    main()
