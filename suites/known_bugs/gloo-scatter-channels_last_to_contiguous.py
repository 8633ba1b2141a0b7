"""gloo: scatter of a channels_last input into a contiguous output, 2 ranks, torch.float32

Found by the pytest-collectives conformance suite: channels_last_to_contiguous scatter from rank 1
on rank 0: 56 of 60 elements wrong (0 never written); first at 1: got 1.469887137413025, expected
-1.631551742553711. Written from test_layouts.py::test_backend_call_in_a_layout[ws2-scatter-
channels_last_to_contiguous], torch.float32, on torch 2.13.0+cpu.

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
DTYPE, SHAPE = torch.float32, (2, 3, 2, 5)
INPUTS_LAYOUT, OUTPUTS_LAYOUT = 'channels_last', 'contiguous'
FILL = float('nan')  # what outputs start as, and no input holds: an element never written shows
WIDE = torch.float64  # the dtype the inputs are written in, and a sum is exact in
AS_BITS = False  # uint64's inputs are written as the int64 of the same bits
PREMUL_FACTOR = 2.0  # PREMUL_SUM's factor, where the call takes one
HANG = 120  # seconds: a rank not done by then is hung in the call
OP = dist.ReduceOp.SUM  # the call's reduce op, where it takes one
nan, inf = float("nan"), float("inf")
# INPUTS[r][p]: what rank r sends (group) rank p (INPUTS[r][0]: its one input, where it sends all ranks the
# same), flat, as the failing example had them; None for a rank whose inputs the call does not take (one
# outside the call's group, a scatter's non-root).
INPUTS = [
    None,  # rank 0
    [  # rank 1
        [
            -0.7122525572776794, -1.631551742553711, -1.2519012689590454, 0.7092400789260864,
            -1.41020667552948, 1.605820894241333, 1.5938222408294678, -1.3839918375015259,
            -0.8769298195838928, 1.1058967113494873, 1.469887137413025, -1.6786766052246094,
            -0.7815726399421692, 1.0476272106170654, 1.6463780403137207, -0.8641693592071533,
            0.8498964905738831, -0.7753363251686096, 0.7321652770042419, 1.632977843284607,
            1.0995862483978271, 0.8684130907058716, 1.387222409248352, 0.674343466758728,
            1.1679348945617676, -1.4307360649108887, -0.9943556189537048, -1.1583648920059204,
            1.231650710105896, 0.7419217228889465, 1.5032005310058594, 1.0340969562530518,
            1.0174322128295898, 1.1704156398773193, 0.556339681148529, 1.9648823738098145,
            1.7596557140350342, -0.8689743876457214, 0.5878631472587585, -1.8058016300201416,
            0.9120240211486816, -0.8702563643455505, 0.7660707831382751, 1.7427870035171509,
            -0.5633066892623901, 0.7243334054946899, -1.077850341796875, 0.8399728536605835,
            1.9912612438201904, 1.9374946355819702, 1.5660406351089478, -0.8726309537887573,
            -0.7641637325286865, -1.7550716400146484, -1.9723320007324219, -1.7591735124588013,
            -1.2672134637832642, 0.7999113202095032, -0.9371207356452942, -0.8510168194770813
        ],
        [
            0.6019087433815002, 1.4762085676193237, 1.3804333209991455, -0.510362982749939,
            -1.641099214553833, -0.616115927696228, 0.7471547722816467, 0.7709178328514099,
            -0.5538495182991028, -0.5424375534057617, -0.7288629412651062, 0.7900376319885254,
            1.1343374252319336, -0.7336100339889526, -0.5774694085121155, 0.8726317286491394,
            -0.5204815864562988, 0.5246058106422424, 1.7992384433746338, -1.928459644317627,
            0.9207128882408142, -0.7325537800788879, -0.5039524435997009, -1.9744070768356323,
            1.184823751449585, 1.4280933141708374, -0.7908495664596558, 1.3225011825561523,
            0.9214286804199219, -0.8462281227111816, -1.460668683052063, -0.8620271682739258,
            0.7038573622703552, -0.7778001427650452, -0.5328061580657959, -1.376932144165039,
            0.773797333240509, -0.770512580871582, -0.9901513457298279, -1.9164708852767944,
            0.6151213645935059, -0.6436004042625427, 1.1915488243103027, 0.7879067659378052,
            1.695855975151062, -1.3720338344573975, 0.7097640633583069, -0.656039297580719,
            1.3552441596984863, -0.676311194896698, -1.9374585151672363, -1.348009705543518,
            0.7124247550964355, 1.326375961303711, 0.8381760120391846, 0.8572241067886353,
            -0.5884496569633484, 0.6624472141265869, 1.4344172477722168, 1.3409359455108643
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
    output = unwritten(SHAPE)
    parts = [laid(given(ROOT, p)) for p in range(WORLD_SIZE)] if me == ROOT else None
    dist.scatter(output, parts, src=ROOT)
    return [(f"scatter from rank {ROOT}", output, exactly(given(ROOT, me)))]


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
