"""The conformance suites' capability probe and matrix: refusals recognised, N/A never a pass, and planted
backend bugs in the operations suite caught on every rank."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import suite_conftest

from pytest_collectives.conformance.capabilities import Capabilities, refusal
from pytest_collectives.conformance.matrix import CapabilityMatrix

SUITE = Path(__file__).resolve().parents[1] / "suites"


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("Cannot use ReduceOp.BAND with NCCL"),
        RuntimeError("Cannot use ReduceOp.PREMUL_SUM with Gloo"),
        RuntimeError("Invalid scalar type"),
        ValueError("Backend xccl does not support allgather_coalesced"),
        RuntimeError("reduce does not support\x02on complex tensors"),
        NotImplementedError(),
    ],
    ids=str,
)
def test_refusals_are_recognised(exc):
    reason = refusal(exc)
    assert reason and "\x02" not in reason


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer"),
        RuntimeError("NCCL error: unhandled cuda error"),
        AssertionError("1 of 4 elements differ"),
    ],
    ids=str,
)
def test_other_errors_are_not_refusals(exc):
    """A crash or a wrong answer is no refusal: the cell stays supported, so the suites draw it and fail."""
    assert refusal(exc) is None


class _Item:
    nodeid = "suites/conformance/test_x.py::test_y[ws2]"


class _Case:
    def __init__(self, *cells):
        self._cells = cells

    def cells(self):
        return list(self._cells)


def test_matrix_statuses():
    matrix = CapabilityMatrix(config=None, backend="nccl-like")
    for n in (2, 3):
        refused = "Cannot use ReduceOp.BAND with NCCL"
        cells = {"all_reduce/int32/band": refused, "all_reduce/int32/sum": "", "all_reduce/int8/sum": ""}
        cells["reduce/float32/sum"] = "" if n == 2 else "Invalid scalar type"  # supported at one size
        matrix.add_probe(Capabilities("nccl-like", "cpu", n, cells))
    calls = [(2, "int32", "passed"), (3, "int8", "passed"), (3, "int8", "failed"), (3, "int32", "skipped")]
    for n, dtype, verdict in calls:
        case = _Case(("all_reduce", dtype, "sum"))
        matrix.pytest_collectives_call_done(_Item(), n, {"case": case}, verdict)
    status = {(r["operation"], r["dtype"], r["reduce_op"]): r for r in matrix.rows()}
    assert status["all_reduce", "int32", "band"]["status"] == "N/A"
    assert status["all_reduce", "int32", "band"]["reason"] == "Cannot use ReduceOp.BAND with NCCL"
    assert status["all_reduce", "int32", "sum"]["status"] == "PASS"
    assert status["all_reduce", "int8", "sum"]["status"] == "FAIL"
    assert status["all_reduce", "int8", "sum"]["first_failure"].endswith("(3 ranks)")
    assert status["reduce", "float32", "sum"]["status"] == "untested"  # supported at 2 ranks, never drawn


def test_gloo_probe_and_matrix_end_to_end(pytester: pytest.Pytester) -> None:
    """The probe runs on the live group; what gloo refuses is N/A, and what ran is PASS, in the JSON."""
    copy_suite(pytester.path)
    result = pytester.runpytest(
        "test_point_to_point.py", "-k", "ring_exchange", "--world-sizes", "2", "--capability-json",
        "matrix.json", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*capability matrix*", "send_recv *P*"])
    doc = json.loads((pytester.path / "matrix.json").read_text())
    rows = {(r["operation"], r["dtype"], r["reduce_op"]): r for r in doc["cells"]}
    assert doc["backend"] == "gloo" and doc["world_sizes"] == [2]
    assert rows["all_reduce", "float32", "premul_sum"]["status"] == "N/A"
    assert "PREMUL_SUM" in rows["all_reduce", "float32", "premul_sum"]["reason"]
    assert rows["send_recv", "float32", "-"]["status"] == "PASS"
    assert rows["all_reduce", "float32", "sum"]["status"] == "untested"  # supported, not drawn here


# Planted backend bugs: each patches one torch.distributed call on the ranks (the test module is imported
# there) the way a broken backend would behave. (id, patch appended to test_operations.py, -k, message)
BACKEND_BUGS = [
    (
        "gather-permutes-ranks",
        """
_real = dist.gather
def _gather(tensor, gather_list=None, dst=0, group=None, **kw):
    _real(tensor, gather_list, dst=dst, group=group, **kw)
    if gather_list and len(gather_list) > 1 and gather_list[0].numel():
        gather_list.insert(0, gather_list.pop())  # and yet every part arrived
dist.gather = _gather
""",
        "test_gather",
        "*gather at group rank*",
    ),
    (
        "broadcast-unwritten-on-rank-1-only",
        """
_real = dist.broadcast
def _broadcast(tensor, src=0, group=None, **kw):
    _real(tensor, src=src, group=group, **kw)
    if dist.get_rank() == 1 and tensor.numel():
        tensor[-1:] = float("nan") if tensor.is_floating_point() or tensor.is_complex() else 0
dist.broadcast = _broadcast
""",
        "test_broadcast",
        "*never written*",
    ),
    (
        "all-to-all-single-uneven-off-by-one",
        """
_real = dist.all_to_all_single
def _a2a(output, input, output_split_sizes=None, input_split_sizes=None, group=None, **kw):
    _real(output, input, output_split_sizes, input_split_sizes, group=group, **kw)
    if output_split_sizes and output.numel() > 1 and len(set(output_split_sizes)) > 1:
        output[:-1] = output[1:].clone()  # every element one place early, as a wrong offset gives
dist.all_to_all_single = _a2a
""",
        "test_all_to_all_single",
        "*all_to_all_single on rank*",
    ),
]


def copy_suite(directory: Path) -> None:
    (directory / "conftest.py").write_text(suite_conftest(SUITE))
    for name in ("cases.py", "test_operations.py", "test_point_to_point.py"):
        shutil.copy(SUITE / "conformance" / name, directory / name)


@pytest.mark.parametrize("name, patch, select, message", BACKEND_BUGS, ids=[b[0] for b in BACKEND_BUGS])
def test_planted_backend_bug_is_caught(pytester: pytest.Pytester, name, patch, select, message) -> None:
    copy_suite(pytester.path)
    module = pytester.path / "test_operations.py"
    module.write_text(module.read_text() + patch)
    result = pytester.runpytest(
        "test_operations.py", "-x", "-k", select, "--world-sizes", "3", "--dist-timeout", "30",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.parseoutcomes().get("failed", 0) == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([message, "*Falsifying example*"])


def test_no_patch_passes(pytester: pytest.Pytester) -> None:
    """The control: the copied operations suite with nothing planted passes."""
    copy_suite(pytester.path)
    result = pytester.runpytest(
        "test_operations.py", "-k", "gather or broadcast or all_to_all_single", "--world-sizes", "3",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == 3, result.stdout.str()[-3000:]
