"""The conformance suites' capability probe and matrix: refusals recognised, N/A never a pass, and planted
backend bugs in the operations suite caught on every rank."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import torch
from docblocks import block_of, unshown
from helpers import PLANTED_FILES, SUPPORT, copy_conformance, run_on_backend, torch_below

from pytest_collectives.algorithms.reference import defined
from pytest_collectives.conformance import capabilities as caps
from pytest_collectives.conformance import known_bugs
from pytest_collectives.conformance.capabilities import DTYPES, REDUCE_OPS, Capabilities, dtype_name, refusal
from pytest_collectives.conformance.cases import supported_cells
from pytest_collectives.conformance.known_bugs import KnownBug
from pytest_collectives.conformance.matrix import CapabilityMatrix

# The reference backends are Python ProcessGroups; torch 2.2's c10d crashes in them (a segfault in
# all_reduce, "Expected a proper Tensor but got None" on its peers). Run on 2.13; the floor skips them.
python_backends = pytest.mark.skipif(
    torch_below(2, 13),
    reason=f"Python ProcessGroup backends crash on torch {torch.__version__}: checked on 2.13",
)


@pytest.mark.parametrize(
    "exc, backend",
    [
        (RuntimeError("Cannot use ReduceOp.BAND with NCCL"), "nccl"),
        # seen on an H200 (torch 2.11, NCCL 2.28.9): all_reduce of int16 at the first probe
        (TypeError("Input tensor data type is not supported for NCCL process group: Short"), "nccl"),
        (RuntimeError("Cannot use ReduceOp.PREMUL_SUM with Gloo"), "gloo"),
        (RuntimeError("Invalid scalar type"), "cpu:gloo,cuda:nccl"),
        (ValueError("Backend xccl does not support allgather_coalesced"), "xccl"),
        (RuntimeError("reduce does not support\x02on complex tensors"), "nccl"),
        (ValueError("monitored_barrier is only implemented for GLOO backend."), "nccl"),
        (NotImplementedError(), "mpi"),
        (RuntimeError("Invalid scalar type"), "refgloo"),  # refbackend declares gloo's words as its own
    ],
    ids=str,
)
def test_refusals_are_recognised(exc, backend):
    import pytest_collectives.refbackend  # noqa: F401 - declares the reference backends' words

    reason = refusal(exc, backend)
    assert reason and "\x02" not in reason


@pytest.mark.parametrize(
    "exc, backend",
    [
        (RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer"), "gloo"),
        (RuntimeError("NCCL error: unhandled cuda error"), "nccl"),
        (AssertionError("1 of 4 elements differ"), "gloo"),
        # a fault is no refusal because its message holds a refusal's words, or another backend's
        (RuntimeError("recv: operation not supported by peer (errno 95), data lost"), "gloo"),
        (RuntimeError("Invalid scalar type in the payload header: wire corrupted"), "gloo"),
        (RuntimeError("Cannot use ReduceOp.BAND with NCCL"), "gloo"),
        (RuntimeError("Invalid scalar type"), "some_vendor"),
    ],
    ids=str,
)
def test_other_errors_are_not_refusals(exc, backend):
    """A crash or a wrong answer is no refusal: the cell stays supported, so the suites draw it and fail."""
    assert refusal(exc, backend) is None


def test_a_backend_declares_its_refusals():
    """A vendor's backend module says what its backend refuses, in its words, and nothing else is N/A."""
    from pytest_collectives.backend_declarations import refuses

    refuses("test_vendor", r"vendorccl: dtype \w+ unsupported", like="gloo")
    assert refusal(RuntimeError("vendorccl: dtype Float8_e4m3fn unsupported"), "test_vendor")
    assert refusal(RuntimeError("Invalid scalar type"), "test_vendor")
    assert (
        refusal(RuntimeError("vendorccl: dtype Float8_e4m3fn unsupported after 3 retries"), "test_vendor")
        is None
    )
    with pytest.raises(re.error):
        refuses("test_vendor", "(unclosed")


class _Item:
    nodeid = "suites/conformance/test_x.py::test_y[ws2]"
    originalname = "test_y"
    name = "test_y[ws2]"

    def __init__(self) -> None:
        self.stash = pytest.Stash()

    def add_marker(self, marker) -> None:
        pass


class _Config:
    def __init__(self) -> None:
        self.stash = pytest.Stash()


class _Case:
    def __init__(self, *cells):
        self._cells = cells

    def cells(self):
        return list(self._cells)


def test_matrix_statuses():
    matrix = CapabilityMatrix(config=None, backend="nccl-like")
    for n in (2, 3):
        refused = "Cannot use ReduceOp.BAND with NCCL"
        cells = {
            ("all_reduce", "int32", "band"): refused,
            ("all_reduce", "int32", "sum"): "",
            ("all_reduce", "int8", "sum"): "",
            ("reduce", "float32", "sum"): "" if n == 2 else "Invalid scalar type",  # supported at one size
        }
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
    # a test a known-bugs manifest expects to fail: its cells read "known bug", apart from FAIL
    expected = _Item()
    bug = KnownBug(("nccl-like",), "test_y", "AssertionError", "wrong", "drops it", "bugs.json")
    known_bugs.mark(_Config(), [expected], "nccl-like", [bug])
    matrix.pytest_collectives_call_done(
        expected, 2, {"case": _Case(("all_reduce", "int32", "sum"))}, "failed"
    )
    row = {(r["operation"], r["dtype"], r["reduce_op"]): r for r in matrix.rows()}[
        "all_reduce", "int32", "sum"
    ]
    assert (row["status"], row["known"], row["failed"], row["known_bug"]) == ("known bug", 1, 0, "drops it")


def test_cells_a_known_bug_withholds_are_never_drawn_and_read_known_bug():
    """A manifest entry with cells (patterns): on its backend and world sizes the supported cells they match
    leave the draws (supports() is False) and the matrix shows them as known bugs with the reason; a
    refused cell stays N/A, another backend's probe or another world size is untouched, and an xdist
    worker's export carries them to the controller."""
    cell, refused_cell = ("all_reduce", "bfloat16", "premul_sum"), ("all_reduce", "int32", "premul_sum")
    other = ("all_reduce", "bfloat16", "sum")
    bug = KnownBug(
        ("nccl",),
        "test_p",
        "AssertionError",
        "got 0",
        "zeros",
        "bugs.json",
        (("*", "*", "premul_sum"),),
        (2,),
    )
    config = _Config()
    known_bugs.mark(config, [], "nccl", [bug])
    probed = Capabilities(
        "nccl", "cuda", 2, {cell: "", other: "", refused_cell: "PreMulSum Data type must be ..."}
    )
    assert probed.supports(*cell)
    found = probed.withholding(known_bugs.withheld(config, "nccl", 2))
    assert not found.supports(*cell) and found.supports(*other) and found.withheld == {cell: "zeros"}
    assert probed.withholding(known_bugs.withheld(config, "gloo", 2)).supports(*cell)
    assert probed.withholding(known_bugs.withheld(config, "nccl", 3)).supports(*cell)  # world_sizes: [2]
    matrix = CapabilityMatrix(config=None, backend="nccl")
    matrix.add_probe(found)
    merged = CapabilityMatrix(config=None, backend="nccl")
    merged.merge(matrix.export())
    for m in (matrix, merged):
        rows = {(r["operation"], r["dtype"], r["reduce_op"]): r for r in m.rows()}
        assert (rows[cell]["status"], rows[cell]["known_bug"]) == ("known bug", "zeros")
        assert rows[refused_cell]["status"] == "N/A"


def test_gloo_probe_and_matrix_end_to_end(pytester: pytest.Pytester) -> None:
    """The probe runs on the live group; what gloo refuses is N/A, and what ran is PASS, in the JSON."""
    copy_conformance(pytester.path, PLANTED_FILES)
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
    # the dtypes are drawn: some of them ran (float32 alone went undrawn in one run of 20 batches)
    assert any(r["status"] == "PASS" for (operation, _, _), r in rows.items() if operation == "send_recv")
    assert rows["all_reduce", "float32", "sum"]["status"] == "untested"  # supported, not drawn here


def test_a_run_that_checked_nothing_fails(pytester: pytest.Pytester) -> None:
    """Every conformance test N/A (point to point at one rank: no peer) proves nothing: the run fails."""
    copy_conformance(pytester.path, PLANTED_FILES)
    result = pytester.runpytest("test_point_to_point.py", "--world-sizes", "1", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=7)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["conformance: FAIL, every conformance test was skipped (N/A)*"])


@pytest.mark.skipif(torch_below(2, 13), reason="the strided reduce_scatter bug is gloo's of torch 2.13")
def test_a_known_bug_that_fired_was_judged_and_any_failed_test_fails_the_verdict(
    pytester: pytest.Pytester,
) -> None:
    """A run of nothing but a known bug judged a test: it passes, not "checked nothing" (issue 74's item
    7). Seed 6 draws gloo's strided reduce_scatter writing into the view's gaps, a symptom the manifest's
    entry holds by its kinds (issue 75). Without the manifest the test fails, and the closing verdict
    says so though the test tried no cell of the matrix (it read PASS above the FAILED line)."""
    copy_conformance(pytester.path, ("test_layouts.py",))
    args = (
        "test_layouts.py", "-k", "reduce_scatter-strided", "--world-sizes", "2", "--hypothesis-seed", "6",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    result = pytester.runpytest(*args)
    result.assert_outcomes(xfailed=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["conformance: PASS, *"])
    (pytester.path / "known_bugs.json").write_text('{"known_bugs": []}')
    result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["conformance: FAIL, 1 test failed, *"])


@pytest.mark.skipif(torch_below(2, 13), reason="Python ProcessGroup backends crash before torch 2.13")
def test_a_sweep_goes_on_past_its_first_failing_cell_so_the_matrix_shows_the_bug_s_scope(
    pytester: pytest.Pytester,
) -> None:
    """A bug of every dtype fails every cell of the sweep, not the first alone: the batch goes on past a
    failed check and every example is judged (the other dtypes once kept PASS)."""
    result = run_on_backend(
        pytester, "mutant_last_element_wrong_in_every_dtype", "-k",
        "every_supported_cell and all_reduce and not ring", "--capability-json", "m.json",
        files=("test_every_cell.py",), world_sizes="2",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    rows = json.loads((pytester.path / "m.json").read_text())["cells"]
    judged = [r for r in rows if r["operation"] == "all_reduce" and r["status"] in ("PASS", "FAIL")]
    assert len(judged) > 30 and {r["status"] for r in judged} == {"FAIL"}, judged


# all_reduce wrong in its last element, planted in the test module itself (imported by pytest and the
# ranks): a Python backend can't run the decompositions (torch gives its reduce no device backend)
_LAST_ELEMENT_WRONG = """
import torch.distributed as _dist
from pytest_collectives import complement as _complement

_all_reduce = _dist.all_reduce


def _planted(tensor, *args, **kwargs):
    done = _all_reduce(tensor, *args, **kwargs)
    if tensor.numel():
        last = (-1,) * tensor.dim()
        tensor[last] = _complement(tensor[last].reshape(1).clone())[0]
    return done


_dist.all_reduce = _planted
"""


def test_a_broken_all_reduce_is_blamed_not_the_decompositions_that_are_right(
    pytester: pytest.Pytester,
) -> None:
    """Each decomposition is judged against the exact reference: a broken all_reduce fails as all_reduce,
    where it once read "reduce_broadcast(root=-1) disagrees with all_reduce"."""
    copy_conformance(pytester.path, ("test_all_reduce.py",))
    suite = pytester.path / "test_all_reduce.py"
    suite.write_text(suite.read_text() + _LAST_ELEMENT_WRONG)
    result = pytester.runpytest(
        "test_all_reduce.py", "-k", "decompositions_agree", "--world-sizes", "2", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: all_reduce: * over 2 ranks of torch.*"])
    assert "reduce_broadcast(root=-1):" not in result.stdout.str()
    assert "reduce_scatter_all_gather:" not in result.stdout.str()


@pytest.mark.skipif(torch_below(2, 13), reason="Python ProcessGroup backends crash before torch 2.13")
def test_a_refusal_that_wrote_the_caller_s_tensor_fails(pytester: pytest.Pytester) -> None:
    """A refusal in the backend's own words is N/A only where the call changed nothing: one that zeroed the
    caller's tensor first read as N/A beside an honest refusal."""
    result = run_on_backend(
        pytester, "mutant_writes_then_refuses_channels_last", "-k", "all_reduce-channels_last",
        files=("test_layouts.py",), world_sizes="2",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    said = "channels_last all_reduce, refused, on rank ? (which the call must only read): * elements wrong"
    result.stdout.fnmatch_lines([f"*AssertionError: {said}*"])


# Backends wrong on purpose (mutant_backends.py): (backend, suite file, -k, what the report must say)
MUTANTS = [
    # the dtype's whole range reaches these in every run: the sweep tries each supported cell at its top
    ("mutant_int64_reduced_in_32_bits", "test_every_cell.py", "every", "*over 3 ranks of torch.int64: *"),
    ("mutant_uint8_compared_as_int8", "test_every_cell.py", "every", "*m?? over 3 ranks of torch.uint8: *"),
    ("mutant_bf16_reduced_through_fp16", "test_every_cell.py", "every", "*over 3 ranks of torch.bfloat16: *"),
    (
        "mutant_avg_run_as_sum",
        "test_every_cell.py",
        "every",
        "*avg over 3 ranks of *it is the SUM: AVG not divided*",
    ),
    (
        "mutant_large_reduce_scatter_tail_unreduced",
        "test_operations.py",
        "reduce_scatter_list_every_cell",
        "*over 3 ranks of torch.*: 1 of 65536 elements *",
    ),
    (
        "mutant_received_nan_dropped_in_sum",
        "test_all_reduce.py",
        "sum_avg_product_whichever",
        "*sum of torch.* over 3 ranks: nan held by rank 0 at element 0 gives nan (nan), held by*finite*",
    ),
    (
        "mutant_same_peer_messages_swapped",
        "test_point_to_point.py",
        "in_flight",
        "*message 1 of * in flight from rank * to rank *",
    ),
    (
        "mutant_gather_permutes_ranks",
        "test_operations.py",
        "test_all_gather_list",
        "*all_gather: group rank*",
    ),
    (
        "mutant_uneven_all_to_all_off_by_one",
        "test_operations.py",
        "test_all_to_all_single",
        "*all_to_all_single on group rank*",
    ),
    # the list form with parts of different sizes, which gloo refuses and this one takes
    ("mutant_uneven_list_all_to_all_off_by_one", "test_operations.py", "test_all_to_all_list",
     "*all_to_all: from rank * on rank *"),  # fmt: skip
    # a receive from any source naming another rank than the one whose message it landed
    ("mutant_any_source_names_another_sender", "test_point_to_point.py", "any_source",
     "*from any source; told rank *"),  # fmt: skip
    ("mutant_broadcast_ignores_root", "test_operations.py", "test_broadcast", "*broadcast from group rank*"),
    # the rooted list calls, which the reference backend does not make
    ("mutant_rooted_lists_rotated", "test_operations.py", "not object and test_gather",
     "*gather at group rank *: group rank *'s part*"),  # fmt: skip
    ("mutant_rooted_lists_rotated", "test_operations.py", "not object and test_scatter",
     "*scatter from group rank * on group rank *"),  # fmt: skip
    # right in place, its Work's future holding the input as it was: what DDP's hooks read
    ("mutant_future_holds_the_input", "test_works.py", "async_op_with_wait",
     "*all_reduce's Work.get_future() value on rank *, against the output*"),  # fmt: skip
    # async_op_with_wait draws the backend's all_reduce alone over 5 dtypes: bf16 in a fifth of its examples
    (
        "mutant_bf16_tail_unreduced",
        "test_works.py",
        "async_op_with_wait",
        "*over * ranks of torch.bfloat16*",
    ),
    ("mutant_storage_offset_ignored", "test_operations.py", "test_broadcast", "*broadcast from group rank*"),
    ("mutant_unwritten_on_rank_1", "test_operations.py", "test_all_gather_list", "*never written*"),
    # a receive into a view at a storage offset fails the backend's own send_recv row, not only the algorithms
    (
        "mutant_received_at_the_storage_start",
        "test_point_to_point.py",
        "test_receiver_sees_exactly_what_was_sent",
        "*receiving * from rank *elements wrong*",
    ),
    ("mutant_coalesced_sums_under_any_op", "test_operations.py", "coalesced", "*over * ranks of*"),
    # right one call at a time: only all_reduces of one shape in flight at once see it
    ("mutant_shared_staging_buffer", "test_all_reduce.py", "in_flight", "*all_reduce ? of ? in flight*"),
    (
        "mutant_channels_last_written_contiguous",
        "test_operations.py",
        "channels_last",
        "*channels_last all_gather: rank * part on rank*",
    ),
    # right results, with the caller's input or the memory around its view spoiled
    (
        "mutant_reduce_scatter_in_its_input",
        "test_operations.py",
        "test_reduce_scatter_list",
        "*reduce_scatter's input for group rank * (which the call must only read): *",
    ),
    (
        "mutant_all_gather_through_its_input",
        "test_operations.py",
        "test_all_gather_list",
        "*all_gather's input on group rank * (which the call must only read): *",
    ),
    (
        "mutant_all_to_all_through_its_input",
        "test_every_cell.py",
        "all_to_all and every_supported_cell",
        "*all_to_all_single's input on group rank * (which the call must only read): *",
    ),
    (
        "mutant_send_encodes_in_place",
        "test_point_to_point.py",
        "test_receiver_sees_exactly_what_was_sent",
        "*rank *'s tensor sent * to rank * (which the call must only read): *",
    ),
    (
        "mutant_whole_vectors_reduced",
        "test_all_reduce.py",
        "test_all_reduce_matches_exact_reference",
        "*over * ranks of torch.*: * element(s) written outside the tensor, in the buffer it is a view of*",
    ),
    (
        "mutant_all_gather_in_whole_vectors",
        "test_operations.py",
        "test_all_gather_list",
        "*all_gather: group rank *'s part on group rank *: * element(s) written outside the tensor*",
    ),
    # right on the flat buffers every other example hands it
    (
        "mutant_scalar_passed_over",
        "test_all_reduce.py",
        "test_all_reduce_of_a_scalar_and_of_a_matrix",
        "*over * ranks of torch.*: * of * elements *",
    ),
]


@python_backends
@pytest.mark.parametrize("backend, test_file, select, message", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_mutant_backend_is_caught(pytester: pytest.Pytester, backend, test_file, select, message) -> None:
    result = run_on_backend(pytester, backend, test_file, "-x", "-k", select)
    assert result.parseoutcomes().get("failed", 0) == 1, result.stdout.str()[-3000:]
    # the minimal example is printed ("Falsifying example:" became "Failing test case:" in hypothesis 6.16x)
    result.stdout.fnmatch_lines([f"*{select.split()[-1]}*(*", "*Case(operations=*", message])


@python_backends
def test_the_reference_backend_passes_what_its_mutants_fail(pytester: pytest.Pytester) -> None:
    """The control: the same selections on the clean reference backend pass."""
    selections = " or ".join({m[2] for m in MUTANTS})
    files = {m[1] for m in MUTANTS}
    result = run_on_backend(pytester, "refgloo", *sorted(files), "-k", selections)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 5, result.stdout.str()[-3000:]


@python_backends
def test_a_work_that_never_completes_fails_its_own_row(pytester: pytest.Pytester) -> None:
    """An all_gather that gathers right and whose Work never reads completed fails all_gather's async row,
    at two world sizes, and no other row; on the clean reference backend the same rows pass."""
    select = ["-k", "test_async_work_completes and (all_gather or broadcast)", "--world-sizes", "2,3"]
    mutant = run_on_backend(pytester, "mutant_all_gather_never_completed", "test_works.py", *select)
    mutant.assert_outcomes(failed=2, passed=2, skipped=2)  # all_gather_single: N/A on a Python backend
    never = "*all_gather's Work on rank *: is_completed() is False once wait() returned"
    mutant.stdout.fnmatch_lines([never])
    failed = sorted(re.findall(r"^FAILED \S+::(\S+)", mutant.stdout.str(), flags=re.M))
    assert failed == [f"test_async_work_completes[ws{n}-all_gather]" for n in (2, 3)], failed
    run_on_backend(pytester, "refgloo", "test_works.py", *select).assert_outcomes(passed=4, skipped=2)


@python_backends
@pytest.mark.parametrize(
    "backend, failing, wrong_in_float32",
    [
        (
            "mutant_channels_last_written_contiguous",
            ("strided", "channels_last", "contiguous_to_channels_last"),
            True,
        ),
        # right when both sides share a layout: only a call from one layout into another catches it
        (
            "mutant_storage_copied_as_dense",
            ("strided", "channels_last_to_contiguous", "contiguous_to_channels_last"),
            True,
        ),
        # right in float32, the one dtype the layout test tried before it swept the element sizes
        (
            "mutant_strides_in_float32_bytes",
            ("strided", "channels_last", "channels_last_to_contiguous"),
            False,
        ),
    ],
)
def test_a_layout_moved_as_if_dense_fails_the_layout_test(
    pytester: pytest.Pytester, backend, failing, wrong_in_float32
):
    """test_layouts.py, proved on backends whose all_gather writes its outputs, copies its storage, or packs
    its input, as if dense: each layout pair that moves the wrong elements fails with the part, the rank
    and the dtype named, and the other passes (all_gather_into_tensor: N/A, the Python backends lack it)."""
    result = run_on_backend(pytester, backend, "test_layouts.py", "-k", "all_gather")
    result.assert_outcomes(failed=3, passed=1, skipped=4)
    wrong = "all_gather: rank ?'s part on rank ?: * elements wrong"
    result.stdout.fnmatch_lines_random([f"*AssertionError: {layout} {wrong}*" for layout in failing])
    named = [line for line in result.outlines if "the failing example: tensors=Tensors(dtype=" in line]
    # float32 is each call's first example: a mutant right in it fails in another
    assert named and all(("dtype=torch.float32," in line) == wrong_in_float32 for line in named), named


# the every-cell sweep of the backend's own all_reduce (not the rings, which send and receive)
EVERY_ALL_REDUCE = ("test_every_cell.py", "-k", "every_supported_cell and all_reduce and not ring")


def turn_to_int32_sum(pytester: pytest.Pytester, backend: str) -> int:
    """The turn at which every_cell's 1 Mi tier stands at all_reduce int32 SUM on ``backend`` (probed)."""
    probe = run_on_backend(
        pytester, backend, "test_point_to_point.py", "-k", "ring_exchange", "--world-sizes", "2",
        "--capability-json", "m.json",
    )  # fmt: skip
    probe.assert_outcomes(passed=1)
    rows = json.loads((pytester.path / "m.json").read_text())["cells"]
    ours = [r for r in rows if r["operation"] == "all_reduce"]
    supported = {(r["dtype"], r["reduce_op"]) for r in ours if r["status"] != "N/A"}
    # the order the sweep lists them in (cases.supported_cells)
    cells = [(dtype_name(d), op) for d in DTYPES for op in REDUCE_OPS if defined(d, op)]
    cells = [cell for cell in cells if cell in supported]
    return cells.index(("int32", "sum")) + len(cells)  # a turn, and so a seed, of at least 0


@python_backends
@pytest.mark.slow
def test_a_cell_wrong_only_at_1_mi_is_caught_where_the_seed_turns_the_tier_to_it(pytester) -> None:
    """int32 all_reduce SUM wrong from 512 Ki elements on: where the 1 Mi tier turns (no budget), the run
    whose --hypothesis-seed turns it to that cell at 2 ranks fails, naming it (the tier once stood at the
    first cell in every run)."""
    backend = "mutant_large_int32_sum_unreduced"
    seed = turn_to_int32_sum(pytester, backend) - 2  # the turn is the seed plus the world size
    result = run_on_backend(
        pytester, backend, *EVERY_ALL_REDUCE, "--world-sizes", "2", f"--hypothesis-seed={seed}",
        "--tier-budget", "0",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "the failing example: case=Case(operations=('all_reduce',), dtype=torch.int32, op='sum', "
            "size=1048576*",
            f"*turned at {seed}, *",
        ]
    )


@python_backends
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_cell_wrong_only_at_1_mi_is_caught_at_every_seed_where_the_budget_holds_every_cell(
    pytester, seed: int
) -> None:
    """int32 all_reduce SUM wrong from 512 Ki elements on: where the budget holds every cell at 1 Mi (at 2
    ranks of the 2-core machine the default does; a budget without end holds them anywhere), every seed's
    run fails, naming it."""
    result = run_on_backend(
        pytester, "mutant_large_int32_sum_unreduced", *EVERY_ALL_REDUCE, "--world-sizes", "2",
        f"--hypothesis-seed={seed}", "--tier-budget", "inf",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["the failing example: case=Case(operations=('all_reduce',), dtype=torch.int32, op='sum', "
         "size=1048576*", "*every cell at 2 ranks: a 1 Mi example * ms at 2, * cells in inf s*"]
    )  # fmt: skip


@python_backends
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_cell_wrong_only_at_64_ki_is_caught_at_every_seed(pytester, seed: int) -> None:
    """float32 all_reduce PRODUCT wrong at exactly 64 Ki elements: every cell runs at 64 Ki in every run, so
    each seed's run fails, naming it (the 64 Ki tier once rotated a dtype's reduce op: 2 runs in 5)."""
    result = run_on_backend(
        pytester, "mutant_float32_product_wrong_at_64ki", *EVERY_ALL_REDUCE, "--world-sizes", "2",
        f"--hypothesis-seed={seed}",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["the failing example: case=Case(operations=('all_reduce',), dtype=torch.float32, op='product', "
         "size=65536*"]
    )  # fmt: skip


@python_backends
@pytest.mark.slow
def test_a_soak_s_replay_commands_reproduce_their_failures_as_typed(pytester, monkeypatch) -> None:
    """A soak at 2 and 3 ranks whose first pass turns the 1 Mi tier to the wrong cell at 3 ranks (and the
    second pass at 2): each replay the soak prints, run as typed, fails with the same example. It once
    added --world-sizes N, which moved the rotation, and the failure at 3 ranks passed when replayed."""
    backend = "mutant_large_int32_sum_unreduced"
    seed = turn_to_int32_sum(pytester, backend) - 3
    soak = run_on_backend(
        pytester, backend, *EVERY_ALL_REDUCE, "--world-sizes", "2,3", f"--hypothesis-seed={seed}", "--soak",
        "1s",
    )  # fmt: skip
    out = soak.stdout.str()
    replays = re.findall(r"failed in \d+ of \d+ passes, .*; replay: (pytest .+)$", out, re.M)
    assert any("[ws3-all_reduce]" in command for command in replays), out[-3000:]
    monkeypatch.setenv("PYTHONPATH", str(SUPPORT))  # where mutant_backends is, as typed
    for command in replays:
        args = shlex.split(command)[1:]
        again = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider")
        assert again.ret == pytest.ExitCode.TESTS_FAILED, f"{command}\n{again.stdout.str()[-3000:]}"
        again.stdout.fnmatch_lines(
            ["*case=Case(operations=('all_reduce',), dtype=torch.int32, op='sum', size=1048576*"]
        )


@python_backends
def test_a_barrier_that_does_not_wait_fails_every_time(pytester: pytest.Pytester) -> None:
    """The last rank comes late to the barrier: one that returns at once fails, whatever the timing."""
    result = run_on_backend(pytester, "mutant_barrier_returns_at_once", "test_operations.py", "-k", "barrier")
    result.assert_outcomes(failed=1, skipped=1)  # monitored_barrier: N/A on a Python process group
    result.stdout.fnmatch_lines(["*AssertionError: rank ? left the barrier before ranks [[]*2] entered it"])


VENDOR = """
import torch.distributed as dist
from pytest_collectives.refbackend import ReferenceBackend


class Acme(ReferenceBackend):  # gloo underneath; its module forgot refuses("acme", like="gloo")
    name = "acme"


if "ACME" not in dist.Backend._plugins:
    dist.Backend.register_backend("acme", Acme, devices=["cpu"])
"""


@python_backends
def test_a_backend_failing_in_another_backends_refusal_words_is_told_how_to_declare_them(pytester) -> None:
    """The failures stand (N/A only in the backend's own words), and the summary says once what to do."""
    pytester.makepyfile(acme_backend=VENDOR)
    copy_conformance(pytester.path, PLANTED_FILES)
    result = pytester.runpytest(
        "--backend-module", "acme_backend", "--backend", "acme", "--world-sizes", "2", "-p",
        "no:cacheprovider", *EVERY_ALL_REDUCE,
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    assert not unshown(block_of("docs/extending.md", "refusal words").text, result.stdout.str())
    result.stdout.fnmatch_lines(
        [
            "1 failure(s) raised gloo's refusal words (*), and acme declares no refusal words of its own, so "
            "they are failures, not N/A. If acme refuses these calls as gloo does, declare it in its backend "
            'module: refuses("acme", like="gloo") (from pytest_collectives import refuses)'
        ]
    )


@python_backends
def test_a_later_refusal_never_erases_an_earlier_failure(pytester: pytest.Pytester) -> None:
    """The layout sweep's float32 example fails and its later dtypes are refused in gloo's words, on a
    backend that is not gloo (where a refusal ends the test as N/A): the test fails on the float32 example,
    with the refusal named beside it."""
    result = run_on_backend(
        pytester, "mutant_wrong_then_refusing", "test_layouts.py", "-k", "all_gather-channels_last and not to"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "the failing example: tensors=Tensors(dtype=torch.float32,*",
            "*AssertionError: channels_last all_gather: rank ?'s part on rank ?: 1 of * elements wrong*",
            "example 2, after this failure, was refused and ended the batch: *refuses all_gather*",
        ]
    )


@python_backends
def test_a_dtype_mismatch_reduced_silently_is_reported_silent_not_failed(pytester: pytest.Pytester) -> None:
    """The reference backend (gloo) ends an all_reduce whose last rank holds float64 in a crash, named;
    one that reduces every float in float32 returns on every rank: the matrix says silent, and the
    session goes on (the sum after it is right), so both runs pass."""
    behaviours = {}
    for backend in ("refgloo", "mutant_mismatch_reduced_in_float32"):
        args = ("test_mismatches.py", "-k", "all_reduce and dtype", "--capability-json", "m.json")
        result = run_on_backend(pytester, backend, *args)
        result.assert_outcomes(passed=1)
        (row,) = json.loads((pytester.path / "m.json").read_text())["mismatches"]
        assert (row["operation"], row["kind"], row["world_size"]) == ("all_reduce", "dtype", 3)
        behaviours[backend] = row["behaviour"]
    assert behaviours["mutant_mismatch_reduced_in_float32"] == "silent"
    assert behaviours["refgloo"].startswith("detected: rank "), behaviours
    result.stdout.fnmatch_lines(
        [
            "cross-rank mismatches (*), at 3 ranks: 0 of 1 * detected, silent in:",
            "  all_reduce: dtype, returned on every rank",
        ]
    )


@python_backends
def test_nccl_rules_leave_bitwise_ops_na_and_the_suite_green(pytester: pytest.Pytester) -> None:
    """A backend that refuses bitwise reduce ops as NCCL does: never drawn, N/A in the matrix, no failure."""
    result = run_on_backend(
        pytester, "refgloo_nccl_rules", "test_all_reduce.py", "-k", "matches_exact_reference",
        "--capability-json", "matrix.json",
    )  # fmt: skip
    result.assert_outcomes(passed=3, skipped=2)  # the two decompositions need reduce: N/A here
    rows = {
        (r["operation"], r["dtype"], r["reduce_op"]): r
        for r in json.loads((pytester.path / "matrix.json").read_text())["cells"]
    }
    assert rows["all_reduce", "int32", "band"]["status"] == "N/A"
    assert rows["all_reduce", "int32", "band"]["reason"] == "Cannot use ReduceOp.BAND with NCCL"
    assert not any(r["status"] == "FAIL" for r in rows.values())
    # the rings implement every op themselves: bitwise ones are still drawn for them
    rings = ("ring_all_reduce", "naive_ring_all_reduce")
    bitwise = ("band", "bor", "bxor")
    assert any(r["operation"] in rings and r["reduce_op"] in bitwise and r["passed"] for r in rows.values())


@python_backends
@pytest.mark.parametrize(
    "backend", ["mutant_refusal_leaves_group_open", "mutant_barrier_raises_an_earlier_refusal"]
)
def test_the_probe_survives_what_a_refusal_leaves_behind(pytester: pytest.Pytester, backend: str) -> None:
    """NCCL, after a refused all_to_all or batch_isend_irecv, takes every later call on the thread and runs
    none (docs/measurements/scripts/nccl_findings.py); so does the first mutant, from its first refusal,
    made by the probe. Each probe call runs on a thread of its own, so the probe's answers and the tests
    after it are right. gloo's barrier may raise an earlier refusal again on one rank while the others wait
    in it; so does the second mutant, always: the probe calls the barriers before anything it may refuse."""
    result = run_on_backend(pytester, backend, "test_all_reduce.py", "-k", "matches_exact_reference")
    result.assert_outcomes(passed=3, skipped=2)


@python_backends
@pytest.mark.parametrize(
    "backend, groups",
    [("mutant_refusal_leaves_group_open", 2), ("refgloo_nccl_rules", 1), ("nccl_rules_declared_clean", 1)],
)
def test_a_group_a_test_left_in_a_group_call_is_replaced_before_the_next_test(
    pytester: pytest.Pytester, backend: str, groups: int
) -> None:
    """A test's own refused call (caught: the test passes) leaves the mutant's group taking calls and
    running none: the group, asked (a checked all_reduce), fails to answer, and the next test gets a fresh
    group. A backend whose raise left it as it was answers, and keeps its group, as does one whose module
    declares it clean after a raise (backends.clean_after_a_raise), unasked."""
    pytester.makepyfile(
        declared="""
        from pytest_collectives.backend_declarations import clean_after_a_raise
        from pytest_collectives.refbackend import NcclRulesBackend, register

        class Declared(NcclRulesBackend):
            name = "nccl_rules_declared_clean"

        register(Declared)
        clean_after_a_raise("nccl_rules_declared_clean")
        """,
        test_it="""
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_a_refusal_caught(pg):
            with pytest.raises(ValueError, match="Cannot use ReduceOp.BAND with NCCL"):
                dist.all_reduce(torch.ones(1, dtype=torch.int32), op=dist.ReduceOp.BAND)

        @pytest.mark.world_size(2)
        def test_the_next_sum(pg):
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == 2.0
        """,
    )
    pytester.syspathinsert()
    module = "declared" if backend == "nccl_rules_declared_clean" else "mutant_backends"
    result = pytester.runpytest("--backend-module", module, "--backend", backend, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, warnings=groups - 1)
    result.stdout.fnmatch_lines([f"collectives: {groups} worker group(s) started*"])
    if groups > 1:
        result.stdout.fnmatch_lines(["*raised on *; and the group then failed a probe all_reduce (rank ?: *"])


@python_backends
def test_nan_dropped_in_max_is_the_backends_semantics_not_a_failure(pytester: pytest.Pytester) -> None:
    """A backend whose MIN and MAX skip NaN alike on every rank (fmin, fmax) is not wrong, and not torch:
    the matrix says so in rows of their own, and the NaN tests pass. The reference backend (gloo's MIN and
    MAX: a known bug) keeps a NaN from rank 0 alone, and gives what torch gives in SUM, AVG and PRODUCT."""
    args = ("test_all_reduce.py", "-k", "nan_and_inf", "--capability-json", "matrix.json")
    behaviours = {}
    for backend in ("mutant_nan_dropped_in_min_max", "refgloo"):
        result = run_on_backend(pytester, backend, *args)
        outcomes = result.parseoutcomes()
        ran = outcomes.get("passed", 0) + outcomes.get("xfailed", 0)  # gloo's MIN/MAX: a known bug
        assert outcomes.get("failed", 0) == 0 and ran == 2, result.stdout.str()[-3000:]
        doc = json.loads((pytester.path / "matrix.json").read_text())
        rows = doc["semantics"]
        behaviours[backend] = {(r["reduce_op"], r["value"], r["dtype"]): r["behaviour"] for r in rows}
    dropped, gloo = behaviours["mutant_nan_dropped_in_min_max"], behaviours["refgloo"]
    assert len(gloo) == len(dropped) >= 30  # the float dtypes gloo takes x 5 reduce ops x 3 values
    assert dropped["max", "nan", "float32"] == "finite where torch gives nan"
    assert dropped["min", "nan", "bfloat16"] == "finite where torch gives nan"
    assert gloo["max", "nan", "float32"] == gloo["min", "nan", "bfloat16"] == "depends on which rank holds it"
    rest = {key: b for key, b in dropped.items() if key[1] != "nan" or key[0] not in ("min", "max")}
    assert set(rest.values()) == {"as torch"} and rest == {key: gloo[key] for key in rest}
    result.stdout.fnmatch_lines(
        ["NaN and +-inf in all_reduce: * of * as torch on one process, not the others*",
         "  all_reduce max nan: depends on which rank holds it (*f32*)"]
    )  # fmt: skip


def test_only_gloo_is_trusted_after_a_call_raised():
    from pytest_collectives.execution.ranks.pending import unfit_after_raising

    assert unfit_after_raising("nccl", []) == []
    assert unfit_after_raising("gloo", ["all_to_all"]) == []
    assert unfit_after_raising("nccl", ["all_to_all", "batch_isend_irecv", "all_to_all"]) == [
        "all_to_all, batch_isend_irecv raised on nccl, which can leave a backend inside a group call"
    ]


def test_unknown_backend_and_module_are_usage_errors(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--backend", "nosuch")
    result.stderr.fnmatch_lines(["ERROR: --backend nosuch: this torch has no 'nosuch' backend (it has gloo*"])
    result = pytester.runpytest("--backend-module", "no_such_module_here")
    result.stderr.fnmatch_lines(["ERROR: --backend-module no_such_module_here: can't import it (*"])


def test_backend_names_and_devices_are_checked_against_what_torch_has():
    from pytest_collectives.execution import options

    def have() -> list[str]:
        return ["gloo", "nccl", "refgloo", "xccl"]

    runs_on = {"gloo": ["cpu", "cuda"], "nccl": ["cuda"], "refgloo": ["cpu"], "xccl": ["xpu"]}

    def devices(backend: str) -> list[str]:
        return options.backend_devices(backend) if ":" in backend else runs_on.get(backend, ["cpu", "cuda"])

    assert options._backend("cpu:gloo,cuda:nccl", "cuda", have, devices) == "cpu:gloo,cuda:nccl"
    assert options._backend("refgloo", "cpu", have, devices) == "refgloo"
    assert options._backend("", "cuda", have, devices) == "nccl"  # torch's default for the device type
    with pytest.raises(
        options.OptionError, match="this torch has no 'ucc' backend .it has gloo, nccl, refgloo, xccl"
    ):
        options._backend("ucc", "cpu", have, devices)
    with pytest.raises(options.OptionError, match="--backend nccl runs on cuda devices, not on CPU ranks"):
        options._backend("nccl", "cpu", have, devices)
    refused = "--backend refgloo runs on cpu, not on this machine's xpu devices: drop --gpus"
    with pytest.raises(options.OptionError, match=refused):
        options._backend("refgloo", "xpu", have, devices)


def test_a_backend_registered_for_another_device_is_a_usage_error_on_cpu(pytester: pytest.Pytester) -> None:
    """What a backend runs on comes from its registration (``register_backend(devices=)``), not its name."""
    pytester.makepyfile(
        hpu_only="import torch.distributed as dist\n"
        "from pytest_collectives.refbackend import ReferenceBackend\n"
        "if 'HPUONLY' not in dist.Backend._plugins:\n"
        "    dist.Backend.register_backend('hpuonly', ReferenceBackend, devices=['hpu'])\n"
    )
    result = pytester.runpytest_subprocess("--backend-module", "hpu_only", "--backend", "hpuonly")
    result.stderr.fnmatch_lines(
        ["ERROR: --backend hpuonly runs on hpu devices, not on CPU ranks: add --gpus N*"]
    )


def test_torch_fake_backend_fails_loudly(pytester: pytest.Pytester) -> None:
    """torch's fake backend accepts every call and moves nothing: every probe passes, so every cell is
    drawn, and the sentinel shows the elements it never wrote. Not a silent pass."""
    copy_conformance(pytester.path, PLANTED_FILES)
    result = pytester.runpytest(
        "test_operations.py", "-k", "test_broadcast and not binomial", "--world-sizes", "2",
        "-p", "no:cacheprovider", "--backend", "fake",
        "--backend-module", "torch.testing._internal.distributed.fake_pg",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*never written*"])


@pytest.mark.skipif(
    torch_below(2, 13),
    reason=f"gloo on torch {torch.__version__} has bugs the suites catch (README): checked on 2.13",
)
def test_one_rank_is_a_world_size(pytester: pytest.Pytester) -> None:
    """`--gpus 1` has no other world size: every conformance test runs at one rank or is N/A, saying so
    (point-to-point needs a peer)."""
    copy_conformance(
        pytester.path,
        (
            "test_all_reduce.py",
            "test_operations.py",
            "test_point_to_point.py",
            "test_reduce_scatter.py",
            "test_every_cell.py",
        ),
    )
    result = pytester.runpytest("--world-sizes", "1", "-p", "no:cacheprovider", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("error", 0) == 0, result.stdout.str()[-3000:]
    assert outcomes.get("passed", 0) >= 20
    result.stdout.fnmatch_lines(["*1 ranks: *"])
    skips = [line for line in result.stdout.lines if line.startswith("SKIPPED")]
    assert skips and all(re.search(r"N/A: gloo (supports no|refuses) ", line) for line in skips), skips


@pytest.mark.skipif(
    torch_below(2, 13),
    reason=f"gloo on torch {torch.__version__} crashes now and then (a SIGSEGV, README): checked on 2.13",
)
def test_the_node_report_holds_the_capability_matrix(pytester: pytest.Pytester) -> None:
    copy_conformance(pytester.path, ("test_operations.py",))
    result = pytester.runpytest(
        "test_operations.py", "-k", "test_broadcast", "--world-sizes", "2", "--node-report", "report",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=2)  # the backend's broadcast and the binomial tree
    report = json.loads((pytester.path / "report" / "report.json").read_text())
    rows = {(c["operation"], c["dtype"], c["reduce_op"]): c for c in report["capabilities"]["cells"]}
    # Which dtypes hypothesis draws varies between runs; the cells it drew read PASS, none FAIL.
    broadcast = {key[1]: cell["status"] for key, cell in rows.items() if key[0] == "broadcast"}
    assert report["capabilities"]["backend"] == "gloo" and "PASS" in broadcast.values()
    assert "FAIL" not in broadcast.values()
    check = next(c for c in report["checks"] if c["name"] == "conformance")
    assert check["status"] == "PASS" and check["details"]["backend"] == "gloo"
    assert "<td>broadcast</td>" in (pytester.path / "report" / "report.html").read_text()


@pytest.mark.skipif(
    torch_below(2, 5),
    reason=f"torch {torch.__version__} does not load the torch.backends entry points (2.5 does)",
)
def test_a_backend_installed_as_a_torch_backends_entry_point_needs_no_module(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package in torch's ``torch.backends`` entry-point group registers its backend when torch is
    imported, in pytest's process and on every rank: ``--backend`` names it with no --backend-module."""
    pytester.makepyfile(
        acme_backend="def load():\n"
        "    from pytest_collectives.refbackend import ReferenceBackend, register\n"
        "    register(type('Acme', (ReferenceBackend,), {'name': 'acme'}))\n",
        test_acme="import pytest, torch, torch.distributed as dist\n"
        "@pytest.mark.world_size(2)\n"
        "def test_acme(pg):\n"
        "    t = torch.ones(3)\n"
        "    dist.all_reduce(t)\n"
        "    assert dist.get_backend() == 'acme' and t.tolist() == [2.0, 2.0, 2.0]\n",
    )
    info = pytester.path / "acme_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nacme = acme_backend:load\n")
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))
    result = pytester.runpytest_subprocess("--backend", "acme", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_only_cells_an_operation_takes_are_drawn_and_tallied():
    """A reduce op drawn for an operation that moves data made cells that do not exist ("broadcast
    bfloat16 premul_sum PASS" beside an N/A all_reduce premul_sum): an operation that does not reduce,
    as a backend call or a registered algorithm, draws and tallies its dtype's one cell."""
    from pytest_collectives.conformance import capabilities as caps
    from pytest_collectives.conformance.capabilities import NO_OP
    from pytest_collectives.conformance.cases import Case, supported_cells

    cells = {("broadcast", "float32", NO_OP): "", ("all_reduce", "float32", "sum"): ""}
    caps.use(Capabilities("gloo", "cpu", 2, cells))
    try:
        ops = (*REDUCE_OPS, NO_OP)
        assert supported_cells(["broadcast"], [torch.float32], ops) == [(torch.float32, NO_OP)]
        assert supported_cells(["binomial_tree_broadcast"], [torch.float32], REDUCE_OPS) == []
        assert supported_cells(["all_reduce"], [torch.float32], ops) == [(torch.float32, "sum")]
    finally:
        caps.use(None)
    drawn = Case(("broadcast", "all_reduce"), torch.float32, "premul_sum", 4, "contiguous", None, 0)
    assert drawn.cells() == [("broadcast", "float32", NO_OP), ("all_reduce", "float32", "premul_sum")]


@python_backends
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_refused_example_never_hides_the_others(pytester: pytest.Pytester, seed: int) -> None:
    """The backend refuses coalesced int32 in gloo's words and zeroes coalesced float64. One refused example
    once ended the test as N/A, so the verdict hung on which dtype was drawn first (N/A at seeds 1 and 2,
    FAIL at 3); now a refusal ends only its example, and the float64 examples fail at every seed."""
    result = run_on_backend(
        pytester, "mutant_coalesced_int32_refused_float64_wrong", "test_operations.py", "-k", "coalesced",
        "--hypothesis-seed", str(seed), "--world-sizes", "2",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*over 2 ranks of torch.float64: * elements differ*"])


@python_backends
def test_a_backend_wrong_on_large_objects_fails_the_object_collectives(pytester: pytest.Pytester) -> None:
    """Objects drawn to several MiB: a backend whose byte tensors past 64 KiB lose their last byte (the
    pickle's) fails, where objects of a few hundred bytes passed every test."""
    result = run_on_backend(
        pytester, "mutant_large_objects_truncated", "test_operations.py", "-k", "test_object_collectives"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*UnpicklingError*"])


def test_each_probe_keeps_its_own_answers_and_a_withheld_cell_is_never_drawn() -> None:
    """supported_cells answers once per probe (it is asked at every draw): a probe with a known bug withheld
    is another probe with answers of its own, and a caller changing the list it got changes no later one."""
    cells = {("all_reduce", "float32", "sum"): "", ("all_reduce", "int32", "sum"): ""}
    probed = Capabilities("fake", "cpu", 2, cells)
    both = {(torch.float32, "sum"), (torch.int32, "sum")}
    try:
        caps.use(probed)
        first = supported_cells(["all_reduce"], DTYPES, ("sum",))
        assert set(first) == both
        first.clear()
        assert set(supported_cells(["all_reduce"], DTYPES, ("sum",))) == both
        caps.use(probed.withholding({("all_reduce", "int32", "*"): "a known bug"}))
        assert supported_cells(["all_reduce"], DTYPES, ("sum",)) == [(torch.float32, "sum")]
    finally:
        caps.use(None)
