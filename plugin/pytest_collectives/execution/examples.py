"""Several hypothesis examples per dispatch: ``@pytest_collectives.examples(**strategies)``.

Written like hypothesis' ``@given`` over a test's per-example parameters, it draws a batch of 1 to BATCH
examples as one hypothesis example, and every rank runs the whole batch in one call: a dispatch, a seed and
a result costs a few milliseconds at 8 ranks on 2 cores, more than most examples. The batch is drawn as a
list of short lists, flattened: hypothesis makes a list about 6 long on average whatever its largest size,
and at about 14 the default run takes 8 batches a test, where it took 20, for as many examples. A rank
whose check fails runs the rest of the batch (run_batch), so the ranks never need to agree after each
example whether it failed anywhere: that was a second all-reduce per example, as costly at 8 ranks on 2
cores as the example's own. Each reports the first example it failed, and the controller keeps the earliest
over the ranks (GroupOutcome.keep_first_failing_example). Hypothesis then shrinks the batch like any list,
down to the one example that fails, so the minimal example reads ``batch=[{...}]``.

Each example is seeded from its own values, not from the batch it came in: the one shrunk example sees the
inputs it saw in its batch.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import pytest

from pytest_collectives.execution.wrongness import kind_of

if TYPE_CHECKING:  # the ranks import this module for tallied(): hypothesis waits for a test's @examples
    from hypothesis import strategies as st

    from pytest_collectives.execution.messages import ExpectedFailure

# A batch is 1 to CHUNKS lists of 1 to CHUNK examples: about 14 on average, BATCH at most. It still shrinks
# to one example, in about as many calls as a flat list of 1 to 16 (of about 7) took.
CHUNK, CHUNKS = 4, 16
BATCH = CHUNK * CHUNKS  # the most examples in one dispatch

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass
class Tally:
    """What the examples of one call did on this rank, for its RankResult."""

    ran: int = 0
    failed_example: int | None = None
    # every example that failed, the first's batch going on past it to judge the rest (a sweep shows a
    # bug's whole scope), and the example after which none ran, where one raised what ends the batch
    failed: list[int] = dataclasses.field(default_factory=list)
    ended_at: int | None = None
    # examples the test turned down (``assume(False)``: a call refused in one of its cases), which tell
    # nothing: the matrix must not count them as passed
    turned_down: list[int] = dataclasses.field(default_factory=list)
    # the known bugs this test holds (Task.expected), and the examples that failed with one: the batch goes
    # on past them, judging the others
    expected: tuple[ExpectedFailure, ...] = ()
    known: list[int] = dataclasses.field(default_factory=list)
    known_error: BaseException | None = None  # the first of them
    refused: list[str] = dataclasses.field(default_factory=list)  # the words of each example refused
    # where a refusal ended the batch on a backend that may keep state after a raise: the first example
    # not run, which the controller runs in a call of its own, after the pool asked the group whether the
    # raise left it fit, or replaced it (warm_groups.GroupPool._asked; NCCL's always)
    resume_at: int | None = None


class ExampleRefused(pytest.skip.Exception):
    """The backend refused this example's call in its declared words (``refused_example``). A skip, so
    that outside a batch the test is N/A, as it always was."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"N/A: {reason}")
        self.reason = reason


def refused_example(reason: str) -> NoReturn:
    """End this example as N/A: the backend refused its call, ``reason`` its words (``refusal``). Only this
    example: the batch goes on with the next (on a backend that may keep state after a raise, on a fresh
    group), and a test is N/A only where none of its examples ran, so its verdict does not depend on the
    order examples are drawn in."""
    raise ExampleRefused(reason)


_TALLY: contextvars.ContextVar[Tally | None] = contextvars.ContextVar("collectives_tally", default=None)


@contextmanager
def tallied(tally: Tally) -> Iterator[None]:
    """While in effect, the batches run here count their examples into ``tally``."""
    token = _TALLY.set(tally)
    try:
        yield
    finally:
        _TALLY.reset(token)


# What the running example's failure must say of where it ran, beyond its drawn values: the group its calls
# saw (cases.group_of), where the example names members to fold over the world size
_WHERE: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("collectives_where", default=None)


def ran_in(where: str) -> None:
    """Note, for the running example's failure, where it ran (``"the group of global ranks [0, 2]"``): a
    failure names the group as the call saw it, not the members drawn (frozenset({0, 2, 4, 6}) at 4 ranks
    is the group [0, 2])."""
    said = _WHERE.get()
    if said is not None and where not in said:
        said.append(where)


def examples(**strategies: st.SearchStrategy[Any]) -> Callable[[F], F]:
    """Like ``hypothesis.given(**strategies)``, with BATCH examples at most per call of the test."""
    from hypothesis import strategies as st

    chunk = st.lists(st.fixed_dictionaries(strategies), min_size=1, max_size=CHUNK)
    drawn = st.lists(chunk, min_size=1, max_size=CHUNKS).map(_flattened)
    return _batched("@examples", strategies, drawn)


def _flattened(chunks: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [example for chunk in chunks for example in chunk]


def sweep(**listings: st.SearchStrategy[list[Any]]) -> Callable[[F], F]:
    """A deterministic sweep as one batch: each of ``listings`` draws the whole list of its parameter's
    values (all of one length), and the test runs once on each of their zipped examples, one hypothesis
    example in all (``max_examples=1``), so every listed example runs on every run. The listings are drawn
    while the test runs, so they can read the probe of the live group (``capabilities.active()``) and the
    test's parameters (``suite_api.item_parameter``); a failure names the example that failed."""
    from hypothesis import settings
    from hypothesis import strategies as st

    def zipped(lists: dict[str, list[Any]]) -> list[dict[str, Any]]:
        lengths = {name: len(values) for name, values in lists.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"@sweep: the listings differ in length: {lengths}")
        return Sweep(dict(zip(lists, values, strict=True)) for values in zip(*lists.values(), strict=True))

    drawn = st.fixed_dictionaries(listings).map(zipped)
    batched = _batched("@sweep", listings, drawn)

    def decorate(fn: F) -> F:
        swept = settings(max_examples=1)(batched(fn))
        swept.collectives_sweep = True  # type: ignore[attr-defined]  # the size tiers are timed for it
        return swept

    return decorate


class Sweep(list):
    """A sweep's batch: its examples are listed, not drawn, and hundreds of them would bury the report;
    the one that failed is named on its own."""

    def __repr__(self) -> str:
        return f"<a sweep of {len(self)} examples>"


def _batched(
    decorator: str, strategies: dict[str, Any], drawn: st.SearchStrategy[list[dict[str, Any]]]
) -> Callable[[F], F]:
    """``given(batch=drawn)`` over a test that runs every example of the drawn batch (run_batch)."""
    from hypothesis import given

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        unknown = sorted(set(strategies) - set(signature.parameters))
        if unknown:
            raise TypeError(f"{decorator}: {fn.__qualname__} has no parameter {', '.join(unknown)}")
        kept = [p for name, p in signature.parameters.items() if name not in strategies]

        def batch_of_examples(*args: Any, **kwargs: Any) -> None:
            run_batch(fn, kwargs.pop("batch"), args, kwargs)

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(batch_of_examples, attr, getattr(fn, attr))
        batch_of_examples.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*kept, inspect.Parameter("batch", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        )
        batch_of_examples.__dict__.update(fn.__dict__)  # pytest's marks, applied below this decorator
        batch_of_examples.collectives_batch = True  # type: ignore[attr-defined]
        return given(batch=drawn)(batch_of_examples)  # type: ignore[return-value]

    return decorate


def run_batch(
    fn: Callable[..., Any], batch: list[dict[str, Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Run the examples of ``batch``; raise this rank's first failure, if any.

    A rank whose check failed (an AssertionError, after the example's calls) runs the rest of the batch,
    so that its calls keep pairing with the others' and every rank ends the call; any other exception may
    have cut the example's calls short, so it ends the batch at once, and the ranks left waiting in a call
    it skipped are reported hung a few seconds later (the pool's grace after a failure). An example that
    fails with the test's known bug (``Tally.expected``), whatever it raises, is tallied and passed over.

    The first failure stands whatever a later example does: a skip (``pytest.skip``, a BaseException) or an
    error after it is named beside it, never instead of it. A refused example (``refused_example``) ends
    only itself."""
    from hypothesis.errors import UnsatisfiedAssumption

    from pytest_collectives.backend_declarations import keeps_state_after_a_raise

    tally = _TALLY.get() or Tally()
    pg = kwargs.get("pg")
    first: AssertionError | None = None
    for i, example in enumerate(batch):
        if hasattr(pg, "reseed"):
            pg.reseed(example)
        where = _WHERE.set([])
        try:
            fn(*args, **kwargs, **example)
        except ExampleRefused as exc:
            tally.turned_down.append(i)
            tally.refused.append(exc.reason)
            if keeps_state_after_a_raise(getattr(pg, "backend", "")):
                tally.resume_at = i + 1  # the refusal may have left this group unfit for the next
                if first is not None:
                    _note(first, f"example {i + 1}, after this failure, was refused and ended the batch: "
                          f"{exc.reason}")  # fmt: skip
                break
            continue
        except UnsatisfiedAssumption:
            tally.turned_down.append(i)  # every rank draws the same, so on every rank
            continue
        except Exception as exc:
            if _expected(tally.expected, exc):
                # the test's known bug: its entry names what every rank raises (a wrong value, or an
                # argument check before any transfer), so the ranks go on together to the next example
                tally.known.append(i)
                tally.known_error = tally.known_error or exc
            else:
                _said_where(exc)
                tally.failed.append(i)
                if not isinstance(exc, AssertionError):
                    _raise_after(first, exc, i, tally)
                    break
                if first is None:
                    first, tally.failed_example = exc, i
        # pytest's skip and fail are BaseExceptions (``except Exception`` in a test must not swallow
        # them): a batch catches them too, or a later example's skip would hide an earlier failure
        except (pytest.skip.Exception, pytest.fail.Exception) as exc:
            if isinstance(exc, pytest.fail.Exception):
                tally.failed.append(i)
            _raise_after(first, exc, i, tally)
            break
        finally:
            _WHERE.reset(where)
        tally.ran += 1
    if first is not None:
        raise first
    # every example turned down: hypothesis draws another batch; but a sweep, refused throughout, would
    # only be drawn again the same: it ends, and the test is N/A if no example of it ran (dispatch)
    if not tally.ran and tally.resume_at is None and not (tally.refused and isinstance(batch, Sweep)):
        raise UnsatisfiedAssumption


def _said_where(exc: BaseException) -> None:
    """Note on ``exc`` where its example ran (``ran_in``)."""
    if said := _WHERE.get():
        _note(exc, f"(ran in {'; '.join(said)})")


def _raise_after(first: AssertionError | None, exc: BaseException, i: int, tally: Tally) -> None:
    """End a batch at example ``i``, which raised ``exc``: raise it, unless this rank failed a check before
    (that failure is the call's, raised by run_batch; ``exc`` is named beside it)."""
    tally.ran += 1
    tally.ended_at = i
    if first is None:
        tally.failed_example = i
        raise exc
    _note(first, f"example {i + 1}, after this failure, then ended the batch: {_one_line(exc)}")


def explains(raises: str, match: str, failure: str, kinds: Collection[str] = ()) -> bool:
    """Whether a failure's text (an exception as ``Name: message``, or a traceback) holds a line
    ``<raises>: <message>`` whose message ``match`` (a regular expression) finds and, where ``kinds`` are
    given, that reports one of those kinds of wrongness (``wrongness.kind_of``): the one rule by which a
    known bug is recognised, on the ranks (run_batch) and in pytest (known_bugs.KnownBug.explains)."""
    import re

    pattern = re.compile(rf"(?:^|\W){re.escape(raises)}: (.*)$", re.MULTILINE)
    return any(
        re.search(match, m.group(1)) and (not kinds or kind_of(m.group(1)) in kinds)
        for m in pattern.finditer(failure)
    )


def _expected(expected: tuple[ExpectedFailure, ...], exc: BaseException) -> bool:
    """Whether ``exc`` is one of the ``expected`` known bugs."""
    failure = f"{type(exc).__name__}: {exc}"
    return any(explains(name, match, failure, kinds) for name, match, kinds in expected)


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "msg", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, which Python 3.10 lacks: there the note joins the message."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        exc.args = (f"{exc.args[0] if exc.args else ''}\n{note}", *exc.args[1:])


KNOWN = "known"  # an example's verdict: it failed with a known bug of its test (Tally.known)


def each_example(
    kwargs: dict[str, Any],
    verdict: str,
    failed: Collection[int] = (),
    turned_down: Collection[int] = (),
    known: Collection[int] = (),
    resume_at: int | None = None,
    ended_at: int | None = None,
) -> Iterator[tuple[dict[str, Any], str]]:
    """(arguments, verdict) of each example of a batch that ran: those ``failed`` (on any rank) failed,
    the others passed, the batch having gone on past a failed check; where none is named, each has the
    call's verdict (a crash fails them all). Those ``turned_down`` (an assumption or a refusal turned them
    down) tell nothing, nor do those past ``ended_at`` (an error ended the batch there) or from
    ``resume_at`` on (not run in this call). Those ``known`` failed with a known bug of the test: KNOWN."""
    fixtures = {k: v for k, v in kwargs.items() if k != "batch"}
    named = verdict == "failed" and bool(failed)
    last = len(kwargs["batch"]) if ended_at is None else ended_at + 1
    for i, example in enumerate(kwargs["batch"][: min(last, resume_at or last)]):
        if i in known:
            yield {**fixtures, **example}, KNOWN
        elif named and i in failed:
            yield {**fixtures, **example}, verdict
        elif i not in turned_down:
            yield {**fixtures, **example}, "passed" if named else verdict


def is_batched(test: Any) -> bool:
    """Whether a hypothesis test's inner test is @examples' batch of examples."""
    return bool(
        getattr(getattr(test, "hypothesis", None), "inner_test", None).__dict__.get("collectives_batch")
    )


@contextmanager
def settings_changed(test: Any, change: Callable[[Any], Any]) -> Iterator[None]:
    """While in effect, the hypothesis test ``test`` runs under ``change(its settings)``."""
    holder = getattr(test, "__func__", test)
    current = holder._hypothesis_internal_use_settings
    holder._hypothesis_internal_use_settings = change(current)
    try:
        yield
    finally:
        holder._hypothesis_internal_use_settings = current


def settings_for(test: Any, expected_to_fail: bool) -> contextlib.AbstractContextManager[None]:
    """The hypothesis settings ``test`` runs under: no built-in deadline; a batched test with no explain
    phase, an expected failure with no shrinking either.

    A distributed example's time is the ranks' (its dispatch, the group's first call, the machine's load):
    hypothesis' built-in 200 ms deadline failed a healthy test at random (the docs' first ``@given``
    example, at 348 ms on 2 cores). A deadline the test or its profile sets is kept.

    Explain varies each part of the failing batch to find what does not matter, at one dispatch per try:
    about as many calls again as shrinking (480 after 470 for a channels_last mutant at 3 ranks), to mark
    the passing examples before the failing one, which the report already names. An expected failure (a
    known backend bug) needs no minimal example, and shrinking one can take minutes: a batch whose failure
    needs the examples before it cannot lose any (gloo's uneven all_gather failed only as the 13th of 13
    identical examples) until hypothesis' five-minute shrink limit."""
    from hypothesis import Phase, settings

    dropped = {Phase.explain} if is_batched(test) else set()
    dropped |= {Phase.explain, Phase.shrink} if expected_to_fail else set()
    built_in = settings.get_profile("default").deadline

    def changed(current: Any) -> Any:
        return settings(
            current,
            phases=[phase for phase in current.phases if phase not in dropped],
            deadline=None if current.deadline == built_in else current.deadline,
        )

    return settings_changed(test, changed)
