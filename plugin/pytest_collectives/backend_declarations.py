"""What the harness assumes of a backend after one of its calls raised, the words in which a backend says
it does not do something (the one rule for N/A, for a refused call and a setting it turns down at group
start alike), and how a backend's module declares both."""

from __future__ import annotations

import re

# gloo refuses a call before any state changes. NCCL does not always: torch raises two of its refusals
# (a list all_to_all, batch_isend_irecv) inside a group call it never closes, so every later call on that
# thread, or on that process group, is taken and never run (docs/measurements/scripts/nccl_findings.py).
# A backend the harness has not seen may do either: after its calls raised, its group is asked
# (warm_groups.GroupPool.run).
_CLEAN_AFTER_A_RAISE = {"gloo"}
_LEFT_INSIDE_A_GROUP_CALL = frozenset({"nccl"})


def clean_after_a_raise(backend: str) -> None:
    """Declare, from a backend's module, that a call of ``backend`` that raised leaves it as it was: its
    group is reused without a question after a test whose calls raised, and the suites try the calls after
    a refusal on the same thread."""
    _CLEAN_AFTER_A_RAISE.add(backend)


def keeps_state_after_a_raise(backend: str) -> bool:
    """Whether a call of ``backend`` that raised may have left it unfit for the calls after it."""
    return backend not in _CLEAN_AFTER_A_RAISE


def left_inside_a_group_call(backend: str) -> bool:
    """Whether a raise is known to leave ``backend`` unfit (its group is replaced, not asked)."""
    return backend in _LEFT_INSIDE_A_GROUP_CALL


# What each backend says for a call it does not implement, as data: each pattern must match the whole first
# line of the error (control bytes blanked: some messages carry a raw enum byte where an op's name goes).
# Anything else a call raises is a failure, never N/A: a fault whose message happens to hold "not
# supported" is still a fault. "*" holds c10d's own words, whatever the backend (a call a Python
# ProcessGroup does not override raises "No backend type associated with device type"). A backend module
# (--backend-module) adds its backend's words with refuses().
_REFUSALS: dict[str, list[str]] = {
    "*": [
        r"Cannot use ReduceOp\.\w+ with non-integral dtype",
        r"\w+ does not support (RedOpType\.\w+ )?on complex tensors",
        r"Backend \w+ does not support \w+",
        r"No backend type associated with device type \w+",
        r"monitored_barrier is only implemented for GLOO backend\.",
    ],
    "gloo": [
        r"Invalid scalar type",
        r"Cannot use ReduceOp\.\w+ with Gloo",  # PREMUL_SUM; AVG too before torch 2.3
        r"ProcessGroupGloo does not support \w+",  # reduce_scatter before torch 2.3
        r"Gloo reduce_scatter_base fallback not supported with async_op=True",  # before torch 2.3
        # gloo's AVG divides in place: of an integer tensor, torch refuses the cast back
        r"result type Float can't be cast to the desired output type \w+",
        # a layout it does not take: all_to_all_single of a strided view, send and recv of any non-dense one
        r"Tensors must be contiguous",
        r"input tensor has to be contiguous",
        # a transport the platform lacks (GLOO_DEVICE_TRANSPORT=UV on Linux): the group does not start
        r"makeDeviceForInterface\(\): unsupported gloo device",
    ],
    # ProcessGroupNCCL's words, from torch's source; the first seen on an H200 (torch 2.11, NCCL 2.28.9)
    "nccl": [
        r"Input tensor data type is not supported for NCCL process group: \w+",  # int16, uint16/32/64
        r"Cannot use ReduceOp\.\w+ with NCCL",
        r"Tensors must be (contiguous|CUDA and dense)",
        r"Cannot use ReduceOp\.AVG with boolean inputs",
        r"Unconvertible NCCL type \w+",
        r"Float8 dtypes are not currenlty supported for NCCL reductions",  # sic
        r"PreMulSum Data type must be half, float, bfloat16 or double",
    ],
}


def refuses(backend: str, *patterns: str, like: str | None = None) -> None:
    """Declare what ``backend`` says for a call it does not implement: regular expressions, each matched
    against the whole first line of an error, and with ``like`` every word of that backend too (one that
    hands its calls to gloo). Called by a backend's module on import, in pytest's process and on every
    rank (--backend-module)."""
    for pattern in patterns:
        re.compile(pattern)  # a bad pattern fails where it is declared
    patterns = (*_REFUSALS.get(like, ()), *patterns) if like else patterns
    known = _REFUSALS.setdefault(backend, [])
    known.extend(p for p in patterns if p not in known)


# What a backend module declared of its backend (declare): the backend it hands its calls to, its version.
_BUILT_ON: dict[str, str] = {}
_VERSIONS: dict[str, str] = {}
# The backends torch itself ships: their version is torch's (NCCL's own is read from torch.cuda).
BUNDLED = frozenset({"gloo", "nccl", "mpi", "ucc", "xccl"})


def declare(backend: str, *, built_on: str | None = None, version: str | None = None) -> None:
    """Declare, in one line of a backend's module, what ``backend`` is: ``built_on`` the backend it hands
    its calls to (gloo, nccl), whose refusal words and known bugs it then inherits (its own manifest may
    add entries); ``version`` what the capability matrix and its JSON record for it (a driver's version,
    the field a vendor diffs)."""
    if built_on:
        if built_on == backend:
            raise ValueError(f"declare({backend!r}): a backend is not built on itself")
        _BUILT_ON[backend] = built_on
        refuses(backend, like=built_on)
    if version:
        _VERSIONS[backend] = version


def lineage(backend: str) -> tuple[str, ...]:
    """``backend`` and each backend it is built on, itself first: whose known bugs it holds."""
    names = [backend]
    while names[-1] in _BUILT_ON and _BUILT_ON[names[-1]] not in names:
        names.append(_BUILT_ON[names[-1]])
    return tuple(names)


def declared_version(backend: str) -> str | None:
    return _VERSIONS.get(backend)


def backend_version(backend: str) -> str:
    """What the matrix records of the backend's version: a third-party backend's own (``declare``), never
    torch's, which ships only gloo, NCCL and their kin. Read on the ranks (the probe): what they ran."""
    import torch

    if declared := declared_version(backend):
        return declared
    if "nccl" in backend and torch.cuda.is_available():
        return "NCCL " + ".".join(map(str, torch.cuda.nccl.version()))
    if all(name in BUNDLED for name in backend_names(backend)):
        return f"bundled with torch {torch.__version__}"
    base = lineage(backend)[1:]
    return "version not declared" + (f" (built on {base[0]})" if base else "")


def backend_names(backend: str) -> list[str]:
    """The backends' names in a backend spec: "gloo", or "cpu:gloo,cuda:nccl"."""
    return [part.split(":")[-1].lower() for part in backend.split(",")]


_ERROR_LINE = re.compile(r"^\w*(?:Error|Exception): (.+)$", re.MULTILINE)


def resembles(failure: str, backend: str) -> tuple[str, str] | None:
    """Where ``backend`` declares no refusal words, an error line of ``failure`` (a report's text) that is
    another backend's refusal, as (that backend, the line): the failure stands (N/A only in a backend's
    own words), but a vendor who forgot ``refuses(backend, like=...)`` is told so."""
    if any(name in _REFUSALS for name in backend_names(backend)):
        return None
    for line in (m.group(1).strip() for m in _ERROR_LINE.finditer(failure)):
        for other, patterns in _REFUSALS.items():
            if other != "*" and any(re.fullmatch(p, line) for p in patterns):
                return other, line[:200]
    return None


_RAISED = re.compile(r"((?:\w+\.)*(\w+)): (.*)")


def refused_in(line: str, backend: str) -> str | None:
    """The same rule for what a rank reported rather than an exception in hand: ``line`` is the last line of
    its traceback ("RuntimeError: words"), as a group that would not start under a setting left it."""
    raised = _RAISED.fullmatch(line.strip())
    if raised is None:
        return None
    return declared_refusal(raised.group(3).strip(), backend, raised.group(2) == "NotImplementedError")


def declared_refusal(text: str, backend: str, not_implemented: bool) -> str | None:
    """``text`` (an error's first line) where it is N/A by the one rule: an error that says it is not
    implemented, or one of the backend's declared words (refuses()); else None, a failure."""
    patterns = [p for name in ("*", *backend_names(backend)) for p in _REFUSALS.get(name, ())]
    if not_implemented or any(re.fullmatch(p, text) for p in patterns):
        return text[:200]
    return None
