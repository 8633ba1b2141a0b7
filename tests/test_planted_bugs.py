"""The conformance suites can fail: plant a bug in each algorithm and watch the property tests catch it.

Each mutant is a copy of pytest_collectives/algorithms/collectives.py with one textual change, registered
beside the real algorithms under the prefix ``mutant_`` (builtin.register, the door users' algorithms
come through); the suite's test files are copied unchanged and select the mutant's variants. Shrinking is
left out (the ``planted`` profile) so the time measured is the time to the first failing example.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import copy_conformance

import pytest_collectives.algorithms.collectives
from pytest_collectives.conformance.known_bugs import load
from pytest_collectives.execution.outcome import last_words

# What a reduction's property says of a wrong result (reference.assert_reduced_close), any op and dtype
WRONG_REDUCTION = r"AssertionError: \w+ over \d ranks of torch\.\w+: \d+ of \d+ elements (differ|exceed)"

# (id, original text, planted text, test file, -k expression, what the first failing rank must end with)
# The last is the property's own message, or, where the bug makes a call invalid (a message of another
# size, a peer outside the group, splits that don't cover the input), the error that names that: nothing
# else counts as caught, neither a hang nor a crash nor an error of the harness itself.
MUTANTS = [
    (
        "ring-off-by-one-chunk",
        "chunks[(rank - step - 1) % n]",
        "chunks[(rank - step - 2) % n]",
        "test_all_reduce.py",
        "mutant_ring_all_reduce",
        # chunks of one size: wrong values; of two (most sizes), the receiver gets a chunk of the other size
        # (gloo's check, "... 5 vs 4. Received data size doesn't match expected size" on torch 2.13)
        rf"{WRONG_REDUCTION}|op\.preamble\.length <= op\.nbytes",
    ),
    (
        "ring-missing-last-step",
        "range(n - 1):\n            # Chunks are disjoint views",
        "range(n - 2):\n            # Chunks are disjoint views",
        "test_all_reduce.py",
        "mutant_ring_all_reduce",
        WRONG_REDUCTION,
    ),
    (
        "ring-wrong-peer-in-subgroups",
        "dist.get_global_rank(group, (rank + 1) % n)",
        "(rank + 1) % n",
        "test_all_reduce.py",
        "mutant_ring_all_reduce or mutant_naive_ring_all_reduce",
        # a peer outside the group: torch refuses it, or gloo finds no connection to it (torch 2.2: writev to
        # a pair with no peer, "[none]")
        rf"Global rank \d+ is not part of group|Pair is not connected|writev \[none\]|{WRONG_REDUCTION}",
    ),
    (
        "rings-wrong-op",
        "ReduceOp.MIN: lambda acc, x: torch.minimum(acc, x, out=acc)",
        "ReduceOp.MIN: lambda acc, x: torch.maximum(acc, x, out=acc)",
        "test_all_reduce.py",
        "mutant_ring_all_reduce or mutant_naive_ring_all_reduce",
        r"AssertionError: min over \d ranks of torch\.\w+: \d+ of \d+ elements differ",
    ),
    (
        "decomposition-dropped-padding",
        "pad = -flat.numel() % n",
        "pad = 0",
        "test_all_reduce.py",
        "mutant_reduce_scatter_all_gather",
        # unpadded, the input no world size divides is refused by reduce_scatter_tensor (torch 2.2's gloo
        # makes it of a scatter, which says so in its own words)
        r"Check failed: outputShape\[0\] \* worldSize == inputShape\[0\]|scatter: invalid tensor size",
    ),
    (
        "ring-reduce-scatter-wrong-block",
        "contribution((rank - t % n - 1) % n, t // n)",
        "contribution((rank - t % n) % n, t // n)",
        "test_reduce_scatter.py",
        "mutant_ring_reduce_scatter",
        WRONG_REDUCTION,
    ),
    (
        "ring-all-gather-receives-into-the-wrong-block",
        "blocks[(rank - step - 1) % n]",
        "blocks[(rank - step + 1) % n]",
        "test_reduce_scatter.py",
        "mutant_ring_all_gather",
        r"AssertionError: mutant_ring_all_gather of \d+ x \d+ torch\.\w+ on group rank \d+, stacked=\w+: "
        r"\d+ of \d+ elements wrong",
    ),
    (
        "all-to-all-cuts-its-output-by-the-input-splits",
        "_blocks(work, output_splits, n)",
        "_blocks(work, input_splits, n)",
        "test_operations.py",
        "mutant_pairwise_all_to_all",
        r"RuntimeError: split_with_sizes expects split_sizes to sum exactly to \d+"
        r"|AssertionError: mutant_pairwise_all_to_all on group rank \d+, splits",
    ),
    (
        "tree-broadcast-receives-into-a-copy",
        "dist.recv(work, src=",
        "dist.recv(work.clone(), src=",
        "test_operations.py",
        "mutant_binomial_tree_broadcast",
        r"AssertionError: mutant_binomial_tree_broadcast from group rank \d+ seen on group rank \d+: "
        r"\d+ of \d+ elements wrong",
    ),
    (
        "tree-reduce-folds-into-the-scratch-buffer",
        "combine(work, received)",
        "combine(received, work)",
        "test_operations.py",
        "mutant_binomial_tree_reduce",
        WRONG_REDUCTION,
    ),
    (
        "gemm-reduce-scatter-drops-partial-sum",
        "partial = received.add_(upcoming)",
        "partial = upcoming",
        "test_reduce_scatter.py",
        "mutant_gemm_reduce_scatter",
        r"AssertionError: sum of \d+ GEMMs in torch\.\w+: \d+ of \d+ elements exceed the rounding-error "
        r"bound",
    ),
]
# The mutants run here, and the control at each of them: a failure of the world size is not a catch.
WORLD_SIZES = "3,4"

PLANTED_PROFILE = """
from hypothesis import Phase, settings
settings.register_profile("planted", parent=settings.get_profile("ci"),
                          phases=[Phase.explicit, Phase.generate], database=None)
"""


REGISTER_MUTANT = """
import mutant
from pytest_collectives.algorithms.builtin import register
register(mutant, prefix="mutant_")
"""


def plant(directory: Path, original: str, planted: str, *test_files: str) -> None:
    source = Path(pytest_collectives.algorithms.collectives.__file__).read_text()
    assert source.count(original) == 1, f"the mutation site {original!r} is not unique in collectives.py"
    (directory / "mutant.py").write_text(source.replace(original, planted))
    copy_conformance(directory, test_files, conftest_extra=PLANTED_PROFILE + REGISTER_MUTANT)


def first_failure(output: str) -> str:
    """The line the first rank to fail ended with (outcome.last_words); "" when no rank failed first (a
    hang alone)."""
    _, found, rest = output.partition("(first to fail) ====")
    return last_words(rest.split("\n=====", 1)[0]) if found else ""


@pytest.mark.parametrize(
    "name, original, planted, test_file, select, caught_by", MUTANTS, ids=[m[0] for m in MUTANTS]
)
def test_planted_bug_is_caught(
    pytester: pytest.Pytester, tmp_path: Path, name, original, planted, test_file, select, caught_by
) -> None:
    """Caught: one test of the mutant's variants fails, and its first failing rank ends with ``caught_by``."""
    if name == "decomposition-dropped-padding" and not gloo_reduce_scatter_honours_op(tmp_path):
        pytest.skip("this torch's gloo reduce_scatter_tensor sums under any op: the unmutated decomposition "
                    "fails as well (the control says so), so no failure of it is the padding's alone")
    plant(pytester.path, original, planted, test_file)
    start = time.monotonic()
    result = pytester.runpytest(
        test_file, "-x", "-k", select, "--world-sizes", WORLD_SIZES, "--dist-timeout", "90",
        "--hypothesis-profile", "planted", "-p", "no:cacheprovider",
    )  # fmt: skip
    elapsed = time.monotonic() - start
    output = result.stdout.str()
    failed = [line for line in output.splitlines() if line.startswith("FAILED ")]
    ending = first_failure(output)
    print(f"\nplanted bug {name}: {failed} in {elapsed:.1f} s, the first failing rank: {ending[:200]}")
    assert len(failed) == 1 and "-mutant_" in failed[0], f"{name} was not caught:\n{output[-3000:]}"
    assert re.search(caught_by, ending), f"{name} failed, but not as it must ({caught_by}):\n{output[-3000:]}"


# Rank 0 of two gets max(1, 2) = 2 from a correct backend, 1 + 2 = 3 from one that sums under any op. Each
# rank prints its answer as soon as it has it and leaves without tearing gloo down: torch 2.2's gloo may
# abort ("terminate called") or hang in destroy_process_group once the other rank has gone.
_REDUCE_SCATTER_PROBE = """
import os, sys, torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[2], 2), rank=rank, world_size=2)
out = torch.empty(1)
dist.reduce_scatter_tensor(out, torch.tensor([1.0 + rank, 5.0 - rank]), op=dist.ReduceOp.MAX)
print(out.item(), flush=True)
dist.barrier()
os._exit(0)
"""


def _answer(rank: subprocess.Popen) -> str:
    """What a probe rank printed; one that hangs after printing is killed (its answer stands)."""
    try:
        printed = rank.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        rank.kill()
        printed = rank.communicate()[0]
    return printed.strip()


def gloo_reduce_scatter_honours_op(tmp_path: Path) -> bool:
    """Whether this torch's gloo reduce_scatter_tensor applies its op (2.2 to 2.7 sum under any op)."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    store = str(tmp_path / "probe-store")
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _REDUCE_SCATTER_PROBE, str(rank), store],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    printed = [_answer(rank) for rank in ranks]
    assert all(re.fullmatch(r"[0-9.]+", answer) for answer in printed), f"the probe failed: {printed}"
    return printed[0] == "2.0"


def test_the_unmutated_copy_passes(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The control: the same harness with nothing planted passes, so a catch above is the bug's doing.

    Where the backend itself is wrong (gloo's reduce_scatter_tensor summing under any op, as on the torch
    floor), the unmutated decomposition built from that call must fail. (On that floor, 2.2, the rings' large
    bool transfers also came back wrong and a rank crashed on the replay, once in CI: only the
    decomposition is checked there.)
    """
    files = sorted({m[3] for m in MUTANTS})
    plant(pytester.path, "def all_reduce_direct(", "def all_reduce_direct(", *files)
    honours = gloo_reduce_scatter_honours_op(tmp_path)
    # every test a mutant above selects, at the same world sizes, large messages included
    selection = " or ".join(sorted({m[4] for m in MUTANTS}))
    if not honours:
        selection = "matches_exact_reference and mutant_reduce_scatter"
    result = pytester.runpytest(
        *(files if honours else ["test_all_reduce.py"]), "-k", selection, "--world-sizes", WORLD_SIZES,
        "--hypothesis-profile", "planted", "-p", "no:cacheprovider",
    )  # fmt: skip
    sizes = len(WORLD_SIZES.split(","))
    if honours:
        # at each world size: 3 all-reduces (2 rings, 1 decomposition) at small and large sizes and in the
        # shapes of a training step, 2 ring reduce-scatters, 1 ring all-gather, 3 GEMM + reduce-scatters, 1
        # all-to-all, 1 broadcast, 1 reduce
        result.assert_outcomes(passed=18 * sizes)
    else:
        result.assert_outcomes(failed=sizes)
        result.stdout.fnmatch_lines(
            # summing under MAX, or under PREMUL_SUM, which the floor's gloo also accepts there
            ["*operations=('mutant_reduce_scatter_all_gather',)*", "AssertionError: * over * ranks of *"]
        )


# gloo refuses PREMUL_SUM (and before torch 2.3 reduce_scatter), so the suite's PREMUL_SUM test is run at
# one rank on calls planted in torch.distributed: a SUM of one rank (its input), then the factor applied,
# which is what PREMUL_SUM is there, right or wrong in one way per mode, each mode a bug NCCL shipped or
# one beside it. Printed: each (mode, operation, dtype)'s failure.
PREMUL_PLANTED = """
import json, sys, types, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import test_all_reduce as suite
SUM_OF_ONE_RANK = {
    "all_reduce": lambda tensor, **kwargs: None,
    "reduce": lambda tensor, dst, **kwargs: None,
    "reduce_scatter": lambda out, parts, **kwargs: out.copy_(parts[0]),
    "reduce_scatter_tensor": lambda out, tensor, **kwargs: out.copy_(tensor),
}
dist._make_nccl_premul_sum = lambda f: float(f.item() if torch.is_tensor(f) else f)
MODE = None

def applied(name, out, factor):
    if MODE == "left_out_of_reduce_scatter" and name.startswith("reduce_scatter"):
        return
    if MODE == "zeros" and name == "all_reduce" and out.dtype == torch.bfloat16:
        return out.zero_()
    if MODE == "tail" and name == "all_reduce" and len(out) == 65537 and out.dtype == torch.float64:
        return out[:-1].mul_(factor)
    if MODE == "left_out_and_one_off" and name.startswith("reduce_scatter"):
        out[len(out) // 2 :] += 1 if len(out) > 16 else 0
        return
    out.mul_(factor)

def planted(name):
    def call(out, *args, op, **kwargs):
        SUM_OF_ONE_RANK[name](out, *args, **kwargs)
        applied(name, out, op)
    return call

for name in SUM_OF_ONE_RANK:
    setattr(dist, name, planted(name))
pg = types.SimpleNamespace(world_size=1, rank=0, device=torch.device("cpu"), backend="gloo")
found = {}
for MODE in ("right", "left_out_of_reduce_scatter", "zeros", "tail", "left_out_and_one_off"):
    for operation in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_single"):
        for dtype in (torch.bfloat16, torch.float64):
            try:
                suite.test_premul_sum_factors(pg, operation, dtype)
            except AssertionError as exc:
                found[f"{MODE} {operation} {dtype}"] = str(exc).splitlines()[0]
print(json.dumps(found))
"""


def test_premul_sum_test_tells_each_nccl_bug_from_any_other() -> None:
    """Each of NCCL's three PREMUL_SUM bugs at one rank, planted, fails the suite's test of its own
    cells only, in words its known-bugs entry explains; a right PREMUL_SUM passes every cell, and each
    entry explains nothing else: not another bug of its own cell (one element off as well), nor another
    bug of the factor in another cell."""
    suites = Path(__file__).parents[1] / "suites" / "conformance"
    run = subprocess.run(
        [sys.executable, "-c", PREMUL_PLANTED, str(suites)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout)
    failed = {key.rsplit(" ", 1)[0]: message for key, message in found.items() if "bfloat16" in key}
    assert not [key for key in found if key.startswith("right ")], found
    assert sorted(found) == sorted(
        [f"left_out_of_reduce_scatter {op} torch.{d}" for op in ("reduce_scatter", "reduce_scatter_single")
         for d in ("bfloat16", "float64")]
        + ["zeros all_reduce torch.bfloat16", "tail all_reduce torch.float64"]
        + [f"left_out_and_one_off {op} torch.float64" for op in ("reduce_scatter", "reduce_scatter_single")]
        + [f"left_out_and_one_off {op} torch.bfloat16" for op in ("reduce_scatter", "reduce_scatter_single")]
    ), found  # fmt: skip
    shown = "by scalar 2.0 of 16: 16 of 16 elements wrong (the factor left out), first at 0: 1.0, exact 2.0"
    assert shown in failed["left_out_of_reduce_scatter reduce_scatter_single"]
    bugs = {b.test: b for b in load(suites.parent / "known_bugs.json") if "premul" in b.test}
    explained = {
        key: sorted(test for test, bug in bugs.items() if bug.explains(f"AssertionError: {message}"))
        for key, message in found.items()
    }
    left_out, bfloat16, float64 = sorted(bugs, key=lambda t: ("reduce_scatter" not in t, "float64" in t))
    assert explained == {
        key: [] if key.startswith("left_out_and_one_off")
        else [left_out] if key.startswith("left_out_of")
        else [bfloat16] if key.startswith("zeros") else [float64]
        for key in found
    }, explained  # fmt: skip
