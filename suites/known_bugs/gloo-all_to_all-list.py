"""gloo: all_to_all on ranks [0, 1] of 2, torch.float32

Found by the pytest-collectives conformance suite: RuntimeError: ProcessGroupGloo::alltoall: invalid
tensor size at index 1 (expected (30), got (69)). Written from
test_operations.py::test_all_to_all_list, parts of sizes [[30, 69], [39, 80]], contiguous, on torch
2.13.0+cpu.

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
DTYPE, SHAPE = torch.float32, (-1,)
INPUTS_LAYOUT, OUTPUTS_LAYOUT = 'contiguous', 'contiguous'
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
            -0.5126142501831055, -0.5396732687950134, -0.6292802691459656, 1.0959140062332153,
            1.490917444229126, -1.8711007833480835, -1.3288055658340454, -1.2175735235214233,
            1.950158953666687, -0.8050106763839722, 0.8561737537384033, 0.7973644733428955,
            -0.5084636807441711, -1.7339489459991455, -1.9792560338974, 0.6334928870201111,
            0.9968776702880859, 0.702244758605957, 1.6330783367156982, -1.899245262145996,
            0.6091867089271545, 1.5790159702301025, 1.6558252573013306, -1.0833942890167236,
            -1.5304443836212158, -1.6829068660736084, 0.5710486173629761, -1.1728405952453613,
            -0.589211106300354, 1.0217779874801636
        ],
        [
            -1.319993495941162, -1.9723352193832397, 0.5602014064788818, -1.5474320650100708,
            -1.0223140716552734, -1.1680145263671875, 0.6641571521759033, 1.1244498491287231,
            -1.335733413696289, -0.530208170413971, -1.6832184791564941, -0.912605345249176,
            0.7454257607460022, 0.8259958624839783, -0.9355487823486328, -1.3817963600158691,
            -0.8960462808609009, -1.5609755516052246, -1.243379831314087, 0.8555184006690979,
            -1.3066288232803345, 1.572013258934021, 1.8851066827774048, -0.7808650135993958,
            -0.7029834389686584, -1.6137447357177734, -1.7631213665008545, 1.09811532497406,
            -0.5397953391075134, -1.179377555847168, -1.0904886722564697, -1.8523519039154053,
            0.6284494996070862, 1.118393063545227, -1.0943549871444702, 1.3487435579299927,
            1.7148423194885254, 0.7416290044784546, 1.0774304866790771, 1.4581867456436157,
            1.6365289688110352, -1.2724635601043701, 0.5635854601860046, 0.9769713282585144,
            -1.290582299232483, -0.5567943453788757, -1.1182003021240234, -0.555192768573761,
            1.5920512676239014, 0.8284842371940613, 0.6304262280464172, -1.2657618522644043,
            1.2296476364135742, 0.8281647562980652, -1.515781283378601, -0.8666149973869324,
            -1.8115023374557495, -1.8459758758544922, 0.8617321252822876, -1.5449475049972534,
            0.8111056685447693, -0.6239773631095886, -1.1573045253753662, 0.6781355738639832,
            0.5938761830329895, -0.8177506327629089, 1.4055486917495728, 0.9208066463470459,
            1.736116647720337
        ],
    ],
    [  # rank 1
        [
            -0.5950720906257629, -0.9952502250671387, -0.7496532201766968, 0.9804468750953674,
            1.8703317642211914, 1.946861982345581, 0.6308062076568604, -1.5971335172653198,
            0.7516766786575317, -0.6935005784034729, -1.0078792572021484, -1.8421685695648193,
            1.6612964868545532, 1.347737193107605, 0.7616801261901855, 0.8338433504104614,
            -1.3736673593521118, 1.6122099161148071, -1.4911259412765503, -1.0385050773620605,
            1.884724736213684, 0.6731942892074585, -1.156041145324707, 1.8608845472335815,
            -1.1271982192993164, -1.0549182891845703, 0.5871753096580505, 1.9764217138290405,
            -1.3798755407333374, -1.70674729347229, 1.0403192043304443, 0.6273400187492371,
            -0.8736892938613892, 0.5937893390655518, -1.361480712890625, -0.7681014537811279,
            0.6575241684913635, 0.7301220297813416, -0.6963965892791748
        ],
        [
            -0.9947004318237305, 1.9933350086212158, 0.758027970790863, 1.3117895126342773,
            0.7138441801071167, -1.0065155029296875, -1.6013575792312622, 0.5920016169548035,
            -1.44705069065094, 1.6658018827438354, 1.4993387460708618, 0.61661297082901,
            1.2399002313613892, -0.513027012348175, -1.9090675115585327, -1.9840924739837646,
            -0.5520823001861572, 1.1411470174789429, 0.6887801289558411, 1.4855010509490967,
            1.6116373538970947, -0.7972588539123535, -0.993933379650116, 0.5687537789344788,
            1.4984395503997803, -0.7608514428138733, -1.453932523727417, 0.6806648373603821,
            -0.7112440466880798, -0.647291898727417, 1.3699567317962646, -1.4912374019622803,
            -1.6530349254608154, 1.0708707571029663, -1.0233460664749146, 1.9149742126464844,
            1.3728485107421875, 1.2865004539489746, 1.6350475549697876, -1.8074909448623657,
            1.697457194328308, -0.5097562074661255, -1.457998275756836, 0.5153295397758484,
            0.6276636123657227, -0.7670111060142517, 1.1764779090881348, 0.6284778118133545,
            0.8098777532577515, -1.8244736194610596, -0.9124642610549927, -0.7948343753814697,
            0.5753504037857056, 0.6981340646743774, 1.9559236764907837, -0.6317245960235596,
            0.7143019437789917, -1.695991039276123, -1.165331482887268, 0.7968244552612305,
            0.6550220251083374, -0.5754171013832092, 0.9126617312431335, 1.2988674640655518,
            -0.779238224029541, 0.8832545876502991, -1.3062747716903687, 1.2870780229568481,
            -0.6853499412536621, -0.5683361291885376, -0.8382716774940491, -0.8689813613891602,
            -1.8072397708892822, -1.109710693359375, -0.9001856446266174, 1.6490862369537354,
            -1.5860412120819092, -1.1708484888076782, 0.5771915316581726, 0.5288147330284119
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
    members = [0, 1]  # the drawn group's global ranks: every rank creates it, its members call
    group = dist.new_group(members)
    if me not in members:
        return []
    at = members.index(me)  # this rank's rank in the group
    outputs = [unwritten(given(r, at).shape) for r in members]
    parts = [laid(given(me, p)) for p in range(len(members))]
    dist.all_to_all(outputs, parts, group=group)
    received = [(f"all_to_all in the group of ranks [0, 1]: from group rank {i}", outputs[i],
                 exactly(given(r, at))) for i, r in enumerate(members)]
    return received + [(f"its part for group rank {p}, after the call", part, exactly(given(me, p)))
                       for p, part in enumerate(parts)]


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
