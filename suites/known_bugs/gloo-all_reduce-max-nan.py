"""gloo: all_reduce max of a nan one rank holds, 2 ranks, torch.float32

Found by the pytest-collectives conformance suite: max of torch.float32 over 2 ranks: nan held by
rank 0 at element 0 gives nan (nan), held by rank 1 at element 1 gives finite (1.4939465522766113):
the result depends on which rank holds it. Written from test_all_reduce.py's nan in max of 6
torch.float32 elements, on torch 2.13.0+cpu.

Standalone: needs only torch and the backend. Run it as `python THIS_FILE`: it starts the ranks on this
machine, makes the call, and prints on each rank what came back against what was expected. It exits 1 while
the bug is there, 0 once it is fixed.
"""

import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BACKEND, WORLD_SIZE, DEVICE = 'gloo', 2, 'cpu'
ROOT = 1  # the call's root, where it has one: a rank of its group
DTYPE, SHAPE = torch.float32, (6,)
INPUTS_LAYOUT, OUTPUTS_LAYOUT = 'contiguous', 'contiguous'
FILL = float('nan')  # what outputs start as, and no input holds: an element never written shows
WIDE = torch.float64  # the dtype the inputs are written in, and a sum is exact in
AS_BITS = False  # uint64's inputs are written as the int64 of the same bits
PREMUL_FACTOR = 2.0  # PREMUL_SUM's factor, where the call takes one
HANG = 120  # seconds: a rank not done by then is hung in the call
OP = dist.ReduceOp.MAX  # the call's reduce op, where it takes one
nan, inf = float("nan"), float("inf")
# INPUTS[r][p]: what rank r sends (group) rank p (INPUTS[r][0]: its one input, where it sends all ranks the
# same), flat, as the failing example had them; None for a rank whose inputs the call does not take (one
# outside the call's group, a scatter's non-root).
INPUTS = [
    [  # rank 0
        [
            nan, 1.4939465522766113, nan, -0.9850618243217468, nan, 0.5413845181465149
        ],
    ],
    [  # rank 1
        [
            0.5347418189048767, nan, -1.1862980127334595, nan, 1.6961195468902588, nan
        ],
    ],
]


def given(r, p=0):
    return narrow(torch.tensor(INPUTS[r][p], dtype=WIDE)).reshape(SHAPE).to(DEVICE)


def narrow(values):  # WIDE values as DTYPE (uint64's bits as they are)
    return values.view(DTYPE) if AS_BITS else values.to(DTYPE)


def widen(values):
    return values.view(WIDE) if AS_BITS else values.to(WIDE)


def arranged(tensor, layout):
    if layout == "channels_last":
        return tensor.contiguous(memory_format=torch.channels_last)
    if layout == "strided":  # every other element of the last dimension of a buffer twice as wide
        buffer = torch.full((*tensor.shape[:-1], 2 * tensor.shape[-1]), FILL, dtype=DTYPE, device=DEVICE)
        buffer[..., ::2].copy_(tensor)
        return buffer[..., ::2]  # a view: torch hands it to the backend as it is
    if layout == "offset":  # a view one element into a buffer one element longer at each end
        buffer = torch.full((tensor.numel() + 2,), FILL, dtype=DTYPE, device=DEVICE)
        buffer[1:-1].copy_(tensor.flatten())
        return buffer[1:-1].view(tensor.shape)
    return tensor.contiguous()


def around(tensor):  # a view's buffer outside it, which a call must leave FILL: None where it has none
    if OUTPUTS_LAYOUT == "strided":
        return tensor._base[..., 1::2]
    return tensor._base[[0, -1]] if OUTPUTS_LAYOUT == "offset" else None


def laid(tensor):  # an input, in the call's input layout
    return arranged(tensor, INPUTS_LAYOUT)


def unwritten(shape):  # an output, in the call's output layout, every element FILL
    return arranged(torch.full(shape, FILL, dtype=DTYPE, device=DEVICE), OUTPUTS_LAYOUT)


def exactly(tensor):  # what a move must deliver, bit for bit
    return tensor, 0


def total(parts):  # the sum of every rank's part as DTYPE holds it, and how far any order of it may round
    return reduced("sum", parts)


def reduced(op, parts):  # the parts reduced by op as DTYPE holds it, and how far any order of it may round
    wide = [widen(p) for p in parts]  # bools stay bools: their sum is "any", their product "all"
    folds = {"sum": torch.add, "avg": torch.add, "premul_sum": torch.add, "product": torch.mul,
             "min": torch.minimum, "max": torch.maximum, "band": torch.bitwise_and,
             "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}
    exact = wide[0]
    for part in wide[1:]:
        exact = folds[op](exact, part)
    exact = exact * PREMUL_FACTOR if op == "premul_sum" else exact / len(parts) if op == "avg" else exact
    if not (DTYPE.is_floating_point or DTYPE.is_complex) or op in ("min", "max"):
        return narrow(exact), 0  # exact (whole numbers wrapping around as DTYPE does)
    eps = torch.finfo(DTYPE.to_real() if DTYPE.is_complex else DTYPE).eps
    magnitude = exact.abs() if op == "product" else sum(p.abs() for p in wide)
    return narrow(exact), 2 * len(parts) * eps * magnitude


def wrong(got, want, slack):  # where got differs from want by more than slack (NaN matching NaN)
    if not (DTYPE.is_floating_point or DTYPE.is_complex):
        return got != want
    got, want = widen(got), widen(want)
    return ~(((got - want).abs() <= slack) | (got == want) | (got.isnan() & want.isnan()))


def report(me, what, got, want, slack=0):  # print what came back against what was expected; True if it was
    bad = wrong(got, want, slack).nonzero().tolist()
    verdict = f"{len(bad)} of {want.numel()} elements WRONG" if bad else "as expected"
    lines = [f"rank {me}: {what}: {verdict}"]
    for at in bad[:8]:
        at = tuple(at)
        lines.append(f"  at {at}: got {got[at].item()}, expected {want[at].item()}")
    print("\n".join(lines) + "\n", end="", flush=True)  # one write: the ranks' lines do not interleave
    return not bad


def call(me):
    tensor = laid(given(me))  # element j holds the nan on rank j % WORLD_SIZE alone
    dist.all_reduce(tensor, op=OP)
    print(f"rank {me}: max gave {tensor.tolist()}\n", end="", flush=True)
    got = tensor.detach().cpu()
    kinds = got.isnan().long() + 2 * got.isinf().long()  # 0 finite, 1 NaN, 2 infinite
    what = "each element's kind (0 finite, 1 NaN, 2 infinite), whichever rank held the nan"
    return [(what, kinds, exactly(torch.full_like(kinds, int(kinds[0]))))]


def rank(me, store, failed, done):
    if DEVICE == "cuda":
        torch.cuda.set_device(me)
    dist.init_process_group(BACKEND, init_method=f"file://{store}", rank=me, world_size=WORLD_SIZE)
    for what, got, (want, slack) in call(me):
        failed[me] += not report(me, what, got, want, slack)
        if (outside := around(got)) is not None:
            unwritten = torch.full_like(outside, FILL)
            failed[me] += not report(me, f"{what}: its buffer around it", outside, unwritten)
    done[me] = 1
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's ranks talk over loopback only
    failed, done = (mp.get_context("spawn").Array("i", WORLD_SIZE) for _ in range(2))
    with tempfile.TemporaryDirectory() as folder:  # the ranks meet in a file: no port to race another for
        store = os.path.join(folder, "store")
        ranks = mp.start_processes(rank, (store, failed, done), WORLD_SIZE, join=False, start_method="spawn")
        deadline = time.monotonic() + HANG
        while not ranks.join(timeout=1):  # raises where a rank raised, as mp.spawn does
            if time.monotonic() > deadline:  # a hang is the bug too: say where, rather than wait forever
                for process in ranks.processes:
                    process.kill()
                hung = [r for r in range(WORLD_SIZE) if not done[r]]
                where = f"rank(s) {hung} still in the call" if hung else "every call returned; the teardown"
                print(f"{where} after {HANG} s: it hangs", flush=True)
                sys.exit(1)
    print(f"{sum(failed)} result(s) wrong" if sum(failed) else "every result as expected")
    sys.exit(1 if sum(failed) else 0)
