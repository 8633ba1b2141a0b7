"""The verdict audit: planted backends by the modes a run can take, each row with the verdict it must give.

Every path to a verdict (a group start under a setting, a refused example, a timed transfer, the soak,
xdist, the node report, the 1 Mi tier a time budget sizes and a soak's replay of it) once had its own
rule, and a broken backend passed through some of them. Each row here is one of those findings (issue 54
on, the tier's issue 56), run as a user types it, in a session of its own; each failed before its fix. The
last rows are the controls: the clean reference backend passes every mode. The same bugs under torchrun
(SPMD mode: pytest on every rank, rank 0 reporting) follow, at 2 and 3 ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SUITES, SUPPORT, copy_conformance, run_on_backend, torch_below
from verdict_views import assert_one_verdict

from pytest_collectives.execution.reproductions import reproductions_in

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch_below(2, 13), reason="Python ProcessGroup backends crash before torch 2.13"),
]

ALL_REDUCE = ["test_all_reduce.py", "-k", "exact_reference and -all_reduce]"]
SWEEP = ["--backend-env", "ACME_PROTO=LL,LL128"]
SWEPT_AT_BOTH = [*ALL_REDUCE, *SWEEP, "--world-sizes", "2,3"]
P2P = ["test_p2p.py", "-k", "send_bandwidth and send_recv-unidir", "--max-bytes", "4K", "--world-sizes", "2"]
# every kind of timed transfer: P2P, all-pairs, overlap and a collective, each call's receive checked
TIMED = [
    "test_p2p.py", "test_overlap.py", "test_collectives.py", "--max-bytes", "4K", "--world-sizes", "2",
    "--benchmark-min-rounds", "120", "--benchmark-max-time", "0", "-k",
    "(send_bandwidth and send_recv-unidir) or pair_bandwidth or two_transfers"
    " or (matmul_with_transfer and send) or (test_all_reduce and -all_reduce])",
]
# ... and the rest: all_to_all, gather and scatter, the hypercube, the registered algorithms, the ping-pong
TIMED_TOO = [
    "test_p2p.py", "test_collectives.py", "--max-bytes", "4K", "--world-sizes", "2",
    "--benchmark-min-rounds", "120", "--benchmark-max-time", "0", "-k",
    "all_to_all or gather_scatter or hypercube or registered_algorithm or send_latency",
]
# ... and a broadcast: a repeat call that lands only part of its buffer, each call's stamp elsewhere in it
PARTS = [*TIMED[:-1], f"{TIMED[-1]} or test_broadcast"]

# gather and scatter alone, each failure's standalone reproduction written
ROOTED = [
    "test_operations.py", "-k", "(test_gather or test_scatter) and not object", "--reproductions", "repro",
]
# the all_reduce sweep at 2 ranks with its 1 Mi tier as a budget that holds every cell decides it
TIERED = [
    "test_every_cell.py", "-k", "every_supported_cell and all_reduce and not ring", "--world-sizes", "2",
    "--tier-budget", "inf", "--hypothesis-seed", "1",
]  # fmt: skip

# each call made async, the Work it returns held to torch's word: all_gather's (a row apart) and broadcast's
WORKS = ["test_works.py", "-k", "test_async_work_completes and (all_gather or broadcast)"]

# (row, backend, arguments, environment, exit status, a line the output must hold)
ROWS = [
    ("a fault at group start under one setting", "mutant_faults_at_start_under_ll128", [*ALL_REDUCE, *SWEEP],
     {}, 1, "*the group failed to start 2 of 2 times with ACME_PROTO=LL128*"),
    ("... in the soak", "mutant_faults_at_start_under_ll128", [*ALL_REDUCE, *SWEEP, "--soak", "2s"],
     {}, 1, "*failed in * of * passes*"),
    ("... in the node report", "mutant_faults_at_start_under_ll128",
     [*ALL_REDUCE, *SWEEP, "--node-report", "report"], {}, 1, "node report: *report.html"),
    ("a setting rejected in the backend's words is untested", "mutant_rejects_ll128", [*ALL_REDUCE, *SWEEP],
     {}, 1, "untested with ACME_PROTO=LL128: none of its tests ran*"),
    ("every rank's words at group start: one's refusal hides no other's fault",
     "mutant_refuses_on_one_rank_faults_on_another", [*ALL_REDUCE, *SWEEP], {}, 1,
     "*illegal memory access*"),
    ("... one's refusal, another's fault, at 2 ranks", "mutant_refuses_on_one_rank_faults_on_another",
     [*ALL_REDUCE, *SWEEP, "--world-sizes", "2"], {}, 1, "*illegal memory access*"),
    ("a setting refused at 2 ranks alone is N/A there, and tested", "mutant_rejects_ll128_at_one_size",
     SWEPT_AT_BOTH, {"ACME_REFUSED_AT": "2"}, 0, "*= 3 passed, 1 skipped, *"),
    ("... refused at 3 ranks alone", "mutant_rejects_ll128_at_one_size",
     SWEPT_AT_BOTH, {"ACME_REFUSED_AT": "3"}, 0, "*= 3 passed, 1 skipped, *"),
    ("a setting whose tests are all known bugs was tested", "refgloo",
     ["test_all_reduce.py", "-k", "nan_and_inf_in_min_max", *SWEEP], {}, 0, "*, 2 xfailed in *"),
    ("... all known bugs, at 2 ranks", "refgloo",
     ["test_all_reduce.py", "-k", "nan_and_inf_in_min_max", *SWEEP, "--world-sizes", "2"], {}, 0,
     "*, 2 xfailed in *"),
    ("a fault at the first group start only, in the soak", "mutant_faults_at_first_start",
     [*ALL_REDUCE, "--soak", "2s"], {"ACME_START_FAULT_FILE": "{tmp}/faulted"}, 1,
     "*failed to start 1 of 2 times*"),
    ("a bug of new groups, in the soak, is labelled by its replay, which fails", "mutant_wrong_while_cold",
     [*ALL_REDUCE, "--soak", "2s"], {}, 1, "*failed in 1 of * passes*; fails when its groups are new: its "
     "replay fails, the soaked groups only sometimes (1 of 3 tries at seed *"),
    ("... at 2 ranks", "mutant_wrong_while_cold", [*ALL_REDUCE, "--soak", "2s", "--world-sizes", "2"], {}, 1,
     "*failed in 1 of * passes*; fails when its groups are new: its replay fails, *"),
    ("... under xdist", "mutant_faults_at_first_start", [*ALL_REDUCE, "-n", "2"],
     {"ACME_START_FAULT_FILE": "{tmp}/faulted"}, 1, "*failed to start 1 of 2 times*"),
    ("a refused example hides no other", "mutant_coalesced_int32_refused_float64_wrong",
     ["test_operations.py", "-k", "coalesced", "--hypothesis-seed", "1"], {}, 1,
     "*over 3 ranks of torch.float64*"),
    ("timed receives that land once", "mutant_transfers_dropped", TIMED, {"ACME_DROP": "after-first"}, 1,
     "*6 failed*"),
    ("timed receives that drop one in a hundred", "mutant_transfers_dropped", TIMED,
     {"ACME_DROP": "1-in-100"}, 1, "*6 failed*"),
    ("... every other timed collective and ping-pong", "mutant_transfers_dropped", TIMED_TOO,
     {"ACME_DROP": "after-first"}, 1, "*12 failed*"),
    ("... with --baseline-save: nothing saved", "mutant_transfers_dropped", [*P2P, "--baseline-save"],
     {"ACME_DROP": "after-first"}, 1, "*timed receives of a round did not land as sent*"),
    ("timed receives whose repeat calls land their first 16 elements", "mutant_lands_part_on_repeat", PARTS,
     {"ACME_PART": "first-16"}, 1, "*= 7 failed, *"),
    ("... their last 16", "mutant_lands_part_on_repeat", PARTS, {"ACME_PART": "last-16"}, 1,
     "*= 7 failed, *"),
    ("... all but a middle chunk", "mutant_lands_part_on_repeat", PARTS, {"ACME_PART": "middle"}, 1,
     "*= 7 failed, *"),
    ("a receive that ignores a view's offset", "mutant_received_at_the_storage_start",
     ["test_point_to_point.py", "-k", "test_receiver_sees_exactly_what_was_sent and not large"], {}, 1,
     "*receiving * from rank *elements wrong*"),
    ("a cell wrong only at 1 Mi, where the budget holds every cell", "mutant_large_int32_sum_unreduced",
     TIERED, {}, 1, "*dtype=torch.int32, op='sum', size=1048576*"),
    ("... in the soak, whose replay pins the tier", "mutant_large_int32_sum_unreduced",
     [*TIERED, "--soak", "2s"], {}, 1, "*failed in * of * passes*; replay: *--tier-budget inf"),
    ("a benchmark declares the backend calls it makes: N/A where one is refused", "refgloo_nccl_rules",
     ["test_overlap.py", "-rs", "-k", "gemm_reduce_scatter", "--world-sizes", "2",
      "--benchmark-max-time", "0"],
     {}, 0, "*N/A: refgloo_nccl_rules supports no reduce_scatter_single at 2 ranks"),
    ("the gate's judge without a baseline fails, in the terminal, the node report and its own report",
     "refgloo", [*P2P, "--fail-on-regression", "--gate-report", "gate", "--node-report", "report"], {}, 1,
     "performance gate: FAIL, baseline error: no baseline for this topology*"),
    ("an async Work that never reads completed, at 2 and 3 ranks", "mutant_all_gather_never_completed",
     [*WORKS, "--world-sizes", "2,3"], {}, 1, "*= 2 failed, 2 passed, 2 skipped*"),
    ("... an async Work under xdist", "mutant_all_gather_never_completed",
     [*WORKS, "--world-sizes", "2,3", "-n", "2"], {}, 1, "*= 2 failed, 2 passed, 2 skipped*"),
    ("gather and scatter whose root's list is rotated, at 2 and 3 ranks", "mutant_rooted_lists_rotated",
     [*ROOTED, "--world-sizes", "2,3"], {}, 1, "*= 4 failed, *"),
    ("control: the clean reference backend, swept", "refgloo", [*ALL_REDUCE, *SWEEP], {}, 0, "*2 passed*"),
    ("control: ... its node report under --benchmark-only", "refgloo",
     [*P2P, "--benchmark-only", "--node-report", "report"], {}, 0, "node report: WARN, *report.html"),
    ("control: ... its sweep at every cell at 1 Mi", "refgloo", TIERED, {}, 0, "*1 passed*"),
    ("control: ... in the soak", "refgloo", [*ALL_REDUCE, "--soak", "2s"], {}, 0,
     "*no test failed in any pass*"),
    ("control: ... its timed transfers", "refgloo", PARTS, {}, 0, "*= 7 passed, *"),
    ("control: ... the others", "refgloo", TIMED_TOO, {}, 0, "*10 passed, 2 skipped*"),
]  # fmt: skip


@pytest.mark.parametrize(
    "backend, args, env, status, line", [row[1:] for row in ROWS], ids=[row[0] for row in ROWS]
)
def test_each_planted_bug_gets_its_verdict_in_each_mode(
    pytester: pytest.Pytester, backend, args, env, status, line
) -> None:
    result = run_on_backend(
        pytester, backend, *args, perf=True, dist_timeout=60, subprocess_timeout=600,
        files=(
            "test_all_reduce.py", "test_operations.py", "test_point_to_point.py", "test_every_cell.py",
            "test_works.py",
        ),
        env={"ACME_PROTO": "", **{name: value.format(tmp=pytester.path) for name, value in env.items()}},
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == status, out[-4000:]
    result.stdout.fnmatch_lines([line])
    if "--baseline-save" in args and status:  # a run that failed is never stored as a baseline
        assert not list(pytester.path.glob("baselines/**/*.json")), out[-2000:]
    report = pytester.path / "report" / "report.json"
    if report.exists():  # a node report never reads PASS for a run that failed, nor FAIL for one that passed
        assert (json.loads(report.read_text())["verdict"] == "FAIL") == bool(status), out[-2000:]
    # the terminal, the exit status and every file written give each check one status
    assert_one_verdict(out, result.ret, pytester.path / "report", pytester.path / "gate")
    _scripts_named_exist(out, args, status)


# (row, backend, arguments, environment, ranks, exit status, a line the output must hold)
SPMD_ROWS = [
    ("timed receives whose repeat calls land their first 16 elements, at 2 ranks",
     "mutant_lands_part_on_repeat", P2P, {"ACME_PART": "first-16"}, 2, 1, "*= 1 failed, *"),
    ("float32 all_reduce wrong on every call, at 3 ranks (and 2, a subgroup), in the node report",
     "mutant_wrong_after_wear", [*ALL_REDUCE, "--node-report", "report"], {"ACME_WEAR_CALLS": "0"}, 3, 1,
     "*= 2 failed, *"),
    ("an async Work that never reads completed, at 2 ranks", "mutant_all_gather_never_completed", WORKS, {},
     2, 1, "*= 1 failed, 1 passed, 1 skipped*"),
    ("... an async Work at 3 ranks (and 2, a subgroup)", "mutant_all_gather_never_completed", WORKS, {}, 3, 1,
     "*= 2 failed, 2 passed, 2 skipped*"),
    ("gather and scatter whose root's list is rotated, at 3 ranks (and 2)", "mutant_rooted_lists_rotated",
     ROOTED, {}, 3, 1, "*= 4 failed, *"),
    ("control: the clean reference backend's timed transfers, at 2 ranks", "refgloo", P2P, {}, 2, 0,
     "*= 1 passed, *"),
    ("control: ... its all_reduce at 3 ranks (and 2), in the node report", "refgloo",
     [*ALL_REDUCE, "--node-report", "report"], {}, 3, 0, "*= 2 passed, *"),
]  # fmt: skip


@pytest.mark.parametrize(
    "backend, args, env, ranks, status, line",
    [row[1:] for row in SPMD_ROWS],
    ids=[row[0] for row in SPMD_ROWS],
)
def test_each_planted_bug_gets_its_verdict_under_torchrun(
    pytester: pytest.Pytester, backend, args, env, ranks, status, line
) -> None:
    copy_conformance(pytester.path, ("test_all_reduce.py", "test_operations.py", "test_works.py"))
    for path in (SUITES / "perf").glob("*.py"):
        (pytester.path / path.name).write_text(path.read_text())
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    command = [*launcher, "-m", "pytest", "--backend-module", "mutant_backends", "--backend", backend,
               "--dist-timeout", "60", "-p", "no:cacheprovider", *args]  # fmt: skip
    run = subprocess.run(
        command, cwd=pytester.path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(SUPPORT), "GLOO_SOCKET_IFNAME": "lo", "ACME_PROTO": "", **env},
    )  # fmt: skip
    out = run.stdout
    assert run.returncode == status, (out + run.stderr)[-4000:]
    assert f"collectives: SPMD mode (torchrun), {ranks} ranks on 1 node(s)" in out, out[-4000:]
    pytest.LineMatcher(out.splitlines()).fnmatch_lines([line])
    report = pytester.path / "report" / "report.json"
    assert report.exists() == ("--node-report" in args), out[-2000:]
    assert_one_verdict(out, run.returncode, pytester.path / "report")
    _scripts_named_exist(out, args, status)


def _scripts_named_exist(out: str, args: list[str], status: int) -> None:
    """Every standalone reproduction (or record) the output names is there, and a failed run that asked
    for them in a folder of its own names some."""
    named = reproductions_in(out)
    assert all(Path(path).is_file() for path in named), [path for path in named if not Path(path).is_file()]
    assert named or not status or "--reproductions" not in args, out[-2000:]
