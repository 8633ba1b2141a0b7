"""What the suites found on NCCL at one rank, reproduced in one plain process on one GPU, one line each.

    python docs/measurements/scripts/nccl_findings.py  # needs a CUDA GPU; prints each call and what it gave

The suites' verdicts (suites/known_bugs.json) rest on these; the script shows a backend author the bare
calls, with no harness between them and the result.
"""

from __future__ import annotations

import multiprocessing
import threading
import time

import torch
import torch.distributed as dist


def show(what: str, call, *args) -> None:
    try:
        print(f"{what}: {call(*args)}", flush=True)
    except Exception as exc:  # noqa: BLE001 - what the backend raised is the finding
        print(f"{what}: raised {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)


def premul(dtype: torch.dtype, factor: float, tensor_factor: bool) -> list:
    x = torch.tensor([1.0, 2.0, 3.0], device="cuda").to(dtype)
    scale = torch.tensor([factor], dtype=dtype, device="cuda") if tensor_factor else factor
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(scale))
    return x.cpu().tolist()


def premul_reduce_scatter(dtype: torch.dtype, factor: float, single: bool) -> str:
    """reduce_scatter (``single``: reduce_scatter_tensor) with PREMUL_SUM at one rank: the factor must
    scale the one part (suites: left out of both)."""
    x = torch.tensor([1.0, 2.0, 3.0], device="cuda").to(dtype)
    output = torch.zeros_like(x)
    if single:
        dist.reduce_scatter_tensor(output, x, op=dist._make_nccl_premul_sum(factor))
    else:
        dist.reduce_scatter(output, [x], op=dist._make_nccl_premul_sum(factor))
    expected = (x.double() * factor).to(dtype)
    return f"{output.cpu().tolist()} (expected {expected.cpu().tolist()})"


def premul_tail(count: int, dtype: torch.dtype, factor: float) -> str:
    """all_reduce with PREMUL_SUM of ``count`` elements at one rank: which elements missed the factor
    (suites: the last of a 65537-element float64 all_reduce)."""
    x = torch.arange(1, count + 1, device="cuda").to(dtype)
    expected = x * factor
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(factor))
    wrong = (x != expected).nonzero().flatten().cpu().tolist()
    return f"{len(wrong)} of {count} elements wrong" + (f", at {wrong[:4]}" if wrong else "")


def all_to_all(splits: bool, synchronize: bool) -> list:
    source, output = torch.arange(1.0, 5.0, device="cuda"), torch.zeros(4, device="cuda")
    if splits:
        dist.all_to_all_single(output, source, [4], [4])
    else:
        dist.all_to_all_single(output, source)
    if synchronize:
        torch.cuda.synchronize()
    return output.cpu().tolist()


def all_to_all_as_the_perf_suite(nbytes: int, splits: list[int], calls: int) -> str:
    """suites/perf's test_all_to_all at one rank: an uninitialised output, the call timed many times, then
    once more and read (it read zeros there after the first such test of a session; bare calls above
    did not)."""
    count = nbytes // 4
    source = (torch.arange(count, device="cuda") % 251).float()
    output = torch.empty(count, device="cuda")
    for _ in range(calls):
        dist.all_to_all_single(output, source, splits, splits)
    output.zero_()
    dist.all_to_all_single(output, source, splits, splits)
    wrong = int((output != source).sum())
    return f"{wrong} of {count} elements wrong" + (f", first {output[:4].tolist()}" if wrong else "")


def _laid(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "channels_last":
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor.contiguous()


def moved_in_layouts(call: str, output_layout: str, input_layout: str) -> str:
    """Where the output's elements went: as laid out, in storage order as if dense, or nowhere."""
    expected = torch.arange(60.0, device="cuda").reshape(2, 3, 2, 5)
    output = _laid(torch.full_like(expected, float("nan")), output_layout)
    source = _laid(expected, input_layout)
    if call == "all_to_all":
        dist.all_to_all([output], [source])
    else:
        getattr(dist, call)(output, [source] if call == "reduce_scatter" else source)
    torch.cuda.synchronize()
    if torch.equal(output, expected):
        return "written as laid out"
    if output.isnan().all():
        return "never written (all NaN)"
    storage = output.permute(0, 2, 3, 1) if output_layout == "channels_last" else output
    if torch.equal(storage.flatten(), expected.flatten()):
        return "written in storage order, as if dense"
    return f"wrong: {output.flatten()[:8].cpu().tolist()}"


def _int16(n: int = 2) -> torch.Tensor:
    return torch.ones(n, dtype=torch.int16, device="cuda")


# Calls NCCL refuses (int16) made where torch may have opened an NCCL group (ncclGroupStart) first: if the
# refusal leaves it open, every later call on the thread is deferred, never run (the harness saw outputs
# left as they were, and new_group hang).
REFUSALS = {
    "nothing refused": lambda: None,
    "all_reduce int16": lambda: dist.all_reduce(_int16()),
    "all_to_all int16 lists": lambda: dist.all_to_all([_int16(1)], [_int16(1)]),
    "all_to_all_single int16": lambda: dist.all_to_all_single(_int16(), _int16()),
    "all_gather uneven int16": lambda: dist.all_gather([_int16(3)], _int16(3)),
    "batch_isend_irecv int16 to self": lambda: [
        w.wait()
        for w in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, _int16(), 0), dist.P2POp(dist.irecv, _int16(), 0)]
        )
    ],
    "coalescing manager int16": lambda: _coalesced(_int16()),
}


def _coalesced(t: torch.Tensor) -> None:
    with dist.distributed_c10d._coalescing_manager(device=t.device):
        dist.all_reduce(t)


def _after_refusal(name: str, on_a_thread: bool) -> None:
    """The refusal, on this thread or on one of its own (as the suites' probe makes each call: NCCL's group
    depth is per thread), then a call and new_group on this one."""
    dist.init_process_group(
        "nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0)
    )
    refused = []

    def refuse() -> None:
        torch.cuda.set_device(0)
        try:
            REFUSALS[name]()
            refused.append("ran")
        except Exception as exc:  # noqa: BLE001 - the refusal is expected; what follows it is the finding
            refused.append(f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:90]}")

    if on_a_thread:
        thread = threading.Thread(target=refuse)
        thread.start()
        thread.join()
    else:
        refuse()
    where = " on its own thread" if on_a_thread else ""
    output = torch.zeros(1, device="cuda")
    dist.all_gather_into_tensor(output, torch.ones(1, device="cuda"))
    torch.cuda.synchronize()
    print(f"{name}{where}: {refused[0]}; all_gather after it gives {output.item()} (1.0 ran)", flush=True)
    start = time.perf_counter()
    dist.new_group([0])
    print(f"{name}{where}: new_group([0]) after it took {time.perf_counter() - start:.2f} s", flush=True)
    dist.destroy_process_group()


def refusals_in_fresh_processes() -> None:
    """Each refusal in a process of its own, so that one that leaves NCCL hung hides none of the others."""
    context = multiprocessing.get_context("spawn")
    cases = [(name, False) for name in REFUSALS]
    cases += [("all_to_all int16 lists", True), ("batch_isend_irecv int16 to self", True)]
    for name, on_a_thread in cases:
        process = context.Process(target=_after_refusal, args=(name, on_a_thread))
        process.start()
        process.join(timeout=12)
        if process.is_alive():
            print(f"{name} (on a thread: {on_a_thread}): still running after 12 s, killed", flush=True)
            process.kill()
            process.join()


def main() -> None:
    dist.init_process_group(
        "nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0)
    )
    print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, {torch.cuda.get_device_name()}")
    show("all_reduce int16", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16, device="cuda")))
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128):
        for factor in (2.0, 0.5, 3.0):
            for tensor_factor in (False, True):
                kind = "tensor" if tensor_factor else "scalar"
                show(f"premul_sum {dtype} [1,2,3] by {kind} {factor}", premul, dtype, factor, tensor_factor)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for single, name in ((False, "reduce_scatter"), (True, "reduce_scatter_tensor")):
            what = f"premul_sum {name} {dtype} [1,2,3] by scalar 2.0"
            show(what, premul_reduce_scatter, dtype, 2.0, single)
    for count in (65536, 65537, 1 << 20):
        show(f"premul_sum all_reduce of {count} float64 by 2.0", premul_tail, count, torch.float64, 2.0)
    work = dist.all_reduce(torch.ones(2, device="cuda"), async_op=True)
    work.wait()
    show("Work.exception() after wait", work.exception)
    layout_calls = ("reduce_scatter", "reduce_scatter_tensor", "all_gather_into_tensor")
    for call in (*layout_calls, "all_to_all_single", "all_to_all"):
        # not a strided view: NCCL refuses it, and a refusal can leave it inside a group call
        for output_layout in ("contiguous", "channels_last"):
            for input_layout in ("contiguous", "channels_last"):
                show(
                    f"{call} into {output_layout} from {input_layout}",
                    moved_in_layouts,
                    call,
                    output_layout,
                    input_layout,
                )
    for trial in range(3):
        for splits in (False, True):
            for synchronize in (False, True):
                show(
                    f"all_to_all_single [1,2,3,4] try {trial} splits={splits} synchronize={synchronize}",
                    all_to_all,
                    splits,
                    synchronize,
                )
    for nbytes in (8, 1024, 1 << 20, 64 << 20):
        for calls in (1, 1000):
            show(
                f"all_to_all_single {nbytes} B after {calls} calls",
                all_to_all_as_the_perf_suite,
                nbytes,
                [nbytes // 4],
                calls,
            )
    start = time.perf_counter()
    print("new_group([0]) ...", flush=True)
    group = dist.new_group([0])
    ones = torch.ones(2, device="cuda")
    took = time.perf_counter() - start
    show(
        f"new_group([0]) took {took:.2f} s; all_reduce of ones on it",
        lambda: dist.all_reduce(ones, group=group),
    )
    print(f"... gives {ones.cpu().tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    refusals_in_fresh_processes()
    main()
