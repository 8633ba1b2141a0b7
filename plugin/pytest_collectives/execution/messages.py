"""What the controller and the ranks say to each other over their private pipes.

The pipes are anonymous socket pairs inherited by the workers: nothing listens on a port, so no other
process can speak on them. Tests are named by reference (module + qualname), never pickled as closures.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import sys
import zlib
from collections.abc import Callable, Mapping
from typing import Any

# a known bug as the ranks recognise it: the exception's name, a pattern of its message, and the kinds of
# wrongness it may show (execution.wrongness; empty: any)
ExpectedFailure = tuple[str, str, tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """Everything a rank needs to join its group: fixed for the group's life."""

    world_size: int
    backend: str
    devices: tuple[str, ...]  # the GPUs, one per rank, as CUDA_VISIBLE_DEVICES names them; empty on CPU
    device_type: str  # of those devices: cuda, or another accelerator's (xpu, hpu, ...)
    store_path: str  # FileStore rendezvous: no port to choose, none to collide on
    workdir: str  # where each rank writes its captured output and stack dumps
    timeout_s: float  # the backend's own timeout, kept above the controller's deadline
    threads_per_rank: int
    env: dict[str, str]  # pytest's environment when the group starts: the forkserver's may be older
    controller_pid: int = 0  # the pytest process the ranks answer to: they end when it does
    modules: tuple[str, ...] = ()  # --backend-module: imported before the group starts
    sys_path: tuple[str, ...] = ()  # where to import them from: pytest's sys.path
    algorithms: tuple[tuple[str, str], ...] = ()  # (module, file) that registered users' algorithms
    # rank r's core (cores[r]) where the group has more ranks than the session has cores; empty: the
    # scheduler places the ranks (warm_groups.rank_cores says why)
    cores: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Task:
    """One call of a test function, the same on every rank."""

    nodeid: str
    module: str
    path: str
    qualname: str
    kwargs: dict[str, Any]
    seed: int
    sys_path: list[str]
    hypothesis_inner: bool = False  # call fn.hypothesis.inner_test: the controller runs the engine
    world_size: int = 0  # the ranks it runs on
    timeout_s: float = 0.0  # how long the ranks get: 0 for the session's --dist-timeout
    # the known bugs the test holds: a batch of examples goes on past an example that fails with one
    # (examples.run_batch), so that it hides only itself
    expected: tuple[ExpectedFailure, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # its configuration (--backend-env): what its group starts with
    reproductions: str = ""  # the folder its standalone reproductions go to (--reproductions), absolute

    @classmethod
    def calling(cls, fn: Callable[..., Any], world_size: int, timeout_s: float = 0.0, **kwargs: Any) -> Task:
        """The task of calling ``fn(pg=..., **kwargs)``, a module-level function, on every rank of a group
        of ``world_size``: how the harness asks a live group a question (a probe, its health)."""
        name = f"{fn.__module__}.{fn.__qualname__}"
        return cls(
            nodeid=f"{name} ({world_size} ranks)",
            module=fn.__module__,
            path=fn.__code__.co_filename,
            qualname=fn.__qualname__,
            kwargs={"pg": None, **kwargs},
            seed=stable_seed_of(name),
            sys_path=list(sys.path),
            world_size=world_size,
            timeout_s=timeout_s,
        )


def packed(task: Task) -> bytes:
    """``task`` pickled, as the pipes carry it. The session packs each task to learn that it can be sent
    (in both modes: a test that runs under torchrun must run pooled too), and the pooled launcher sends
    those bytes rather than pickling it again: the last task's are kept."""
    if _packed[0] is not task:
        _packed[:] = [task, pickle.dumps(task)]
    return _packed[1]


_packed: list[Any] = [None, b""]  # the last task packed, and its bytes


PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"
# A rank's skip reason when hypothesis' assume() (or reject()) turned down the example it was running.
REJECTED = "hypothesis rejected the example (assume)"


@dataclasses.dataclass
class RankResult:
    rank: int
    outcome: str  # PASSED, FAILED or SKIPPED
    longrepr: str = ""  # the formatted traceback, or the skip reason
    duration_s: float = 0.0
    dirty: list[str] = dataclasses.field(default_factory=list)  # why this rank's group can't be reused
    suspect: list[str] = dataclasses.field(default_factory=list)  # why it may not be: the group is asked
    rss_bytes: int = 0
    benchmark: dict[str, Any] | None = None  # per-round maxima across ranks, when the test benchmarked
    returned: Any = None  # what it returned: tests return None, a probe (suite_api.run_on_ranks) data
    # hypothesis' note() and event() calls in an example's body: ("note", text, "") or ("event", value,
    # payload), replayed in the controller's engine, which alone has the example's context
    noted: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    examples: int = 1  # hypothesis examples this call ran: several where @examples batched them
    failed_example: int | None = None  # the first of them that failed on this rank, counted from 0
    failed: list[int] = dataclasses.field(default_factory=list)  # every one that failed (Tally.failed)
    ended_at: int | None = None  # the last that ran, where an error ended the batch (Tally.ended_at)
    turned_down: list[int] = dataclasses.field(default_factory=list)  # those an assumption refused
    known: list[int] = dataclasses.field(default_factory=list)  # those that failed with a known bug
    known_failure: str = ""  # the first of them, its traceback
    refused: list[str] = dataclasses.field(default_factory=list)  # the words of each example refused
    resume_at: int | None = None  # the first example a refusal left unrun (examples.Tally.resume_at)
    # path -> text of each standalone reproduction the call drafted: the controller writes the one of the
    # rank the failure is told by (reproductions.write_drafts)
    drafts: dict[str, str] = dataclasses.field(default_factory=dict)
    printed: bool = True  # whether the rank wrote to its stdout or stderr in the test
    # time.perf_counter() when the rank took the task, began the body, ended it and answered: where a test's
    # time goes on the ranks (docs/measurements/scripts/bench_harness_cost.py)
    timeline: tuple[float, ...] = ()


def stable_seed_of(text: str, values: Mapping[str, Any] | None = None) -> int:
    """A seed from ``text`` and the reprs of ``values`` that every process derives alike (unlike hash(),
    which is salted per process)."""
    if values is not None:
        text += repr(sorted((k, _stable_repr(v)) for k, v in values.items()))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") & 0x7FFFFFFF


_LONG_BYTES = 256  # shorter bytes keep their repr


def _stable_repr(value: Any) -> str:
    """repr(value), but long bytes stand for their length and checksum, in lists, tuples and dicts too: the
    repr of a drawn blob of 5 MiB, made again on every rank for every example, was most of what a test of
    object collectives cost. A CRC-32, not a cryptographic digest: the seed it goes into has 31 bits, and
    a blake2b of 5 MiB took 6 ms, four times as long."""
    kind = type(value)
    if kind in (bytes, bytearray) and len(value) > _LONG_BYTES:
        return f"<{len(value)} bytes, crc32 {zlib.crc32(value):08x}>"
    if kind is list:
        return "[" + ", ".join(map(_stable_repr, value)) + "]"
    if kind is tuple:
        return "(" + ", ".join(map(_stable_repr, value)) + ("," if len(value) == 1 else "") + ")"
    if kind is dict:
        return "{" + ", ".join(f"{_stable_repr(k)}: {_stable_repr(v)}" for k, v in value.items()) + "}"
    return repr(value)
