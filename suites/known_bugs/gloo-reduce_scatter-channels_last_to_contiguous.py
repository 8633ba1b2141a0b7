"""gloo: reduce_scatter of a channels_last input into a contiguous output, 2 ranks, torch.float32

Found by the pytest-collectives conformance suite: channels_last_to_contiguous reduce_scatter on
rank 0: sum over 2 ranks of torch.float32: 56 of 60 elements exceed the rounding-error bound; worst
at (1, 2, 1, 0): got 3.8368802070617676, exact 0.08644556999206543, error 3.75 > bound 2.2e-07.
Written from test_layouts.py::test_backend_call_in_a_layout[ws2-reduce_scatter-
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
    [  # rank 0
        [
            -1.2045230865478516, -0.8757376074790955, -0.8036091923713684, -0.5783247947692871,
            -0.7134105563163757, 1.8090801239013672, 0.5428293943405151, -0.8066825270652771,
            1.4525823593139648, -0.7892999053001404, 0.6711044311523438, 1.0360136032104492,
            -1.3843132257461548, -1.240191102027893, -1.4973539113998413, -1.9755291938781738,
            1.1470918655395508, 0.6606844067573547, 0.8310191035270691, -1.5425950288772583,
            -1.2687987089157104, 1.8556921482086182, 0.7548332214355469, -0.557736337184906,
            0.7620303630828857, 1.693580150604248, -0.6790481805801392, -0.6029061675071716,
            0.7380387783050537, -0.6174824833869934, -0.8186747431755066, -0.5894477963447571,
            0.5978617072105408, 0.5272188186645508, 0.8328731060028076, -0.799635648727417,
            0.5210108160972595, 1.0368685722351074, -1.1395221948623657, 1.3811720609664917,
            0.74457848072052, 0.5818868279457092, -1.7368875741958618, 0.5214803218841553,
            -1.4881659746170044, 1.4694983959197998, -1.7842775583267212, -0.9152852892875671,
            1.7750190496444702, 0.5967438220977783, -0.7681885361671448, 0.5345596075057983,
            -0.9473248720169067, -0.5076453685760498, 0.5404979586601257, 1.8456190824508667,
            -1.6368494033813477, 0.5962307453155518, 1.5637925863265991, -1.468230962753296
        ],
        [
            -1.3266639709472656, 1.036548376083374, -1.2246485948562622, 1.0195854902267456,
            -0.6697555780410767, 0.5429106950759888, 0.5195326805114746, 1.040337324142456,
            -0.7488069534301758, 1.3060109615325928, -0.909690797328949, 1.0285842418670654,
            0.6209092736244202, -0.6302546858787537, 0.751024603843689, -0.5171369314193726,
            0.7946981191635132, 0.7266961932182312, -1.920282006263733, -0.7272201776504517,
            0.7852091193199158, -1.2803164720535278, 1.2723238468170166, -1.0393562316894531,
            0.9069843292236328, 0.8485895395278931, 0.7402878403663635, -0.5071170330047607,
            1.5337470769882202, 1.4012726545333862, 0.6856911182403564, 0.6825786828994751,
            1.0203505754470825, 0.5316441655158997, -0.500588595867157, 0.7732049226760864,
            -0.5034089088439941, 1.0767408609390259, 1.240134835243225, -1.6168923377990723,
            0.7189124226570129, 0.553465723991394, -1.814213514328003, 1.3250017166137695,
            -0.8746185302734375, 1.0711557865142822, -0.6584054231643677, 0.9574679732322693,
            0.6773313879966736, -1.260438084602356, 0.6941675543785095, -0.8672910928726196,
            0.871842622756958, -0.8579164743423462, -1.797797679901123, 0.9741154909133911,
            -1.810643196105957, 0.7171528935432434, 1.8124439716339111, 1.6247568130493164
        ],
    ],
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
    dist.reduce_scatter(output, [laid(given(me, p)) for p in range(WORLD_SIZE)])
    return [("reduce_scatter", output, total([given(r, me) for r in range(WORLD_SIZE)]))]


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
