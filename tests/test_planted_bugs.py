"""The conformance suites can fail: plant a bug in each algorithm and watch the property tests catch it.

Each mutant is a copy of pytest_collectives/algorithms/collectives.py with one textual change, registered
beside the real algorithms under the prefix ``mutant_`` (builtin.register, the door users' algorithms
come through); the suite's test files are copied unchanged and select the mutant's variants. Shrinking is
left out (the ``planted`` profile) so the time measured is the time to the first failing example.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import copy_conformance

import pytest_collectives.algorithms.collectives
from pytest_collectives.conformance.known_bugs import load

# (id, original text, planted text, test file, -k expression)
MUTANTS = [
    (
        "ring-off-by-one-chunk",
        "chunks[(rank - step - 1) % n]",
        "chunks[(rank - step - 2) % n]",
        "test_all_reduce.py",
        "mutant_ring_all_reduce",
    ),
    (
        "ring-missing-last-step",
        "range(n - 1):\n            # Chunks are disjoint views",
        "range(n - 2):\n            # Chunks are disjoint views",
        "test_all_reduce.py",
        "mutant_ring_all_reduce",
    ),
    (
        "ring-wrong-peer-in-subgroups",
        "dist.get_global_rank(group, (rank + 1) % n)",
        "(rank + 1) % n",
        "test_all_reduce.py",
        "mutant_ring_all_reduce or mutant_naive_ring_all_reduce",
    ),
    (
        "rings-wrong-op",
        "ReduceOp.MIN: lambda acc, x: torch.minimum(acc, x, out=acc)",
        "ReduceOp.MIN: lambda acc, x: torch.maximum(acc, x, out=acc)",
        "test_all_reduce.py",
        "mutant_ring_all_reduce or mutant_naive_ring_all_reduce",
    ),
    (
        "decomposition-dropped-padding",
        "pad = -flat.numel() % n",
        "pad = 0",
        "test_all_reduce.py",
        "mutant_reduce_scatter_all_gather",
    ),
    (
        "ring-reduce-scatter-wrong-block",
        "contribution((rank - t % n - 1) % n, t // n)",
        "contribution((rank - t % n) % n, t // n)",
        "test_reduce_scatter.py",
        "mutant_ring_reduce_scatter",
    ),
    (
        "ring-all-gather-receives-into-the-wrong-block",
        "blocks[(rank - step - 1) % n]",
        "blocks[(rank - step + 1) % n]",
        "test_reduce_scatter.py",
        "mutant_ring_all_gather",
    ),
    (
        "all-to-all-cuts-its-output-by-the-input-splits",
        "_blocks(work, output_splits, n)",
        "_blocks(work, input_splits, n)",
        "test_operations.py",
        "mutant_pairwise_all_to_all",
    ),
    (
        "tree-broadcast-receives-into-a-copy",
        "dist.recv(work, src=",
        "dist.recv(work.clone(), src=",
        "test_operations.py",
        "mutant_binomial_tree_broadcast",
    ),
    (
        "tree-reduce-folds-into-the-scratch-buffer",
        "combine(work, received)",
        "combine(received, work)",
        "test_operations.py",
        "mutant_binomial_tree_reduce",
    ),
    (
        "gemm-reduce-scatter-drops-partial-sum",
        "partial = received.add_(upcoming)",
        "partial = upcoming",
        "test_reduce_scatter.py",
        "mutant_gemm_reduce_scatter",
    ),
]

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


@pytest.mark.parametrize("name, original, planted, test_file, select", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_planted_bug_is_caught(pytester: pytest.Pytester, name, original, planted, test_file, select) -> None:
    plant(pytester.path, original, planted, test_file)
    start = time.monotonic()
    result = pytester.runpytest(
        test_file, "-x", "-k", select, "--world-sizes", "3,4", "--dist-timeout", "20",
        "--hypothesis-profile", "planted", "-p", "no:cacheprovider",
    )  # fmt: skip
    elapsed = time.monotonic() - start
    outcomes = result.parseoutcomes()
    print(f"\nplanted bug {name}: caught={outcomes.get('failed', 0) > 0} in {elapsed:.1f} s")
    assert outcomes.get("failed", 0) >= 1, f"{name} was not caught:\n{result.stdout.str()[-3000:]}"


# Rank 0 of two gets max(1, 2) = 2 from a correct backend, 1 + 2 = 3 from one that sums under any op.
_REDUCE_SCATTER_PROBE = """
import sys, torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[2], 2), rank=rank, world_size=2)
out = torch.empty(1)
dist.reduce_scatter_tensor(out, torch.tensor([1.0 + rank, 5.0 - rank]), op=dist.ReduceOp.MAX)
print(out.item())
"""


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
    printed = [rank.communicate(timeout=120)[0].strip() for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), f"the probe failed: {printed}"
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
    # every test that selects a mutant above, less the large messages, which take most of the time
    selection = "mutant_ and not large" if honours else "matches_exact_reference and mutant_reduce_scatter"
    result = pytester.runpytest(
        *(files if honours else ["test_all_reduce.py"]), "-k", selection, "--world-sizes", "3",
        "--hypothesis-profile", "planted", "-p", "no:cacheprovider",
    )  # fmt: skip
    if honours:
        # 5 all-reduces, 3 reduce-scatters, 3 GEMM + reduce-scatters, and 2 each of the other four
        result.assert_outcomes(passed=19)
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(
            # summing under MAX, or under PREMUL_SUM, which the floor's gloo also accepts there
            ["*operations=('mutant_reduce_scatter_all_gather',)*", "AssertionError: * over * ranks of *"]
        )


PREMUL_PLANTED = """
import sys, types, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import test_all_reduce as suite
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
dist._make_nccl_premul_sum = lambda factor: dist.ReduceOp.SUM  # the planted bug: the factor left out
pg = types.SimpleNamespace(world_size=1, rank=0, device=torch.device("cpu"), backend="gloo")
try:
    suite.test_premul_sum_factors(pg, torch.bfloat16)
except AssertionError as exc:
    print(exc)
"""


def test_premul_sum_test_catches_a_factor_left_out() -> None:
    """gloo refuses PREMUL_SUM, so its test is proven on a gloo group of one with PREMUL_SUM planted as a
    plain SUM (the factor left out, as NCCL's reduce_scatter at one rank does): every call is listed, in
    the words the NCCL known bug's match expects."""
    suites = Path(__file__).parents[1] / "suites" / "conformance"
    run = subprocess.run(
        [sys.executable, "-c", PREMUL_PLANTED, str(suites)], capture_output=True, text=True, timeout=120
    )
    message = run.stdout.strip()
    head = "premul_sum of bfloat16 over 1 ranks, 15 of 15 calls wrong: "
    assert message.startswith(head), run.stderr[-2000:]
    assert "reduce_scatter by scalar 2.0 gives 1.0 at element 0, exact 2.0" in message
    assert "all_reduce by tensor 0.25 gives 1.0 at element 0, exact 0.25" in message
    (bug,) = [b for b in load(suites.parent / "known_bugs.json") if b.test == "test_premul_sum_factors"]
    assert bug.explains(f"AssertionError: {message}")
