"""How a hypothesis test's examples leave pytest's process for the ranks and come back: the body swapped for
a sender, each example's stable seed, and the ranks' note()/event() calls replayed in the engine."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_collectives.execution.messages import stable_seed_of
from pytest_collectives.execution.outcome import GroupOutcome


def stable_seed(item: pytest.Function, kwargs: dict[str, Any]) -> int:
    """Same test and same example give the same seed, on every rank, in every rerun and in both modes.

    Only the test id and the values hypothesis drew count: fixture values (tmp_path, benchmark, ...) have
    reprs with addresses and per-run paths, so hashing them would give a new seed every run."""
    drawn = {k: v for k, v in kwargs.items() if k not in item.funcargs}
    return stable_seed_of(item.nodeid, drawn)


def distributed_call(item: pytest.Function) -> tuple[int, dict[str, Any]] | None:
    """The world size and fixture values of a test marked world_size; None for a plain test."""
    if item.get_closest_marker("world_size") is None:
        return None
    funcargs = {name: item.funcargs[name] for name in item._fixtureinfo.argnames}
    return item.callspec.params["world_size"], funcargs


@contextlib.contextmanager
def examples_sent_to(
    fn: Any, send: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], None]
) -> Iterator[None]:
    """While in effect, calling the hypothesis test ``fn`` hands each example to ``send(inner_test, owner,
    kwargs)`` (owner: the test's bound instance arguments, if any) instead of running its body here."""
    hypothesis = fn.hypothesis
    inner = hypothesis.inner_test

    signature = inspect.signature(inner)

    @functools.wraps(inner)
    def sent(*args: Any, **kwargs: Any) -> None:
        # hypothesis may pass any argument by position: by name they reach the ranks, a test class's
        # instance (self) apart
        arguments = signature.bind(*args, **kwargs).arguments
        owner = (arguments.pop("self"),) if "self" in arguments else ()
        send(inner, owner, arguments)

    hypothesis.inner_test = sent
    try:
        yield
    finally:
        hypothesis.inner_test = inner


def replay_hypothesis_calls(outcome: GroupOutcome) -> None:
    """The ranks' note() and event() calls, made again in this engine's context: a note every rank made
    alike once, a note that differs between ranks with its rank."""
    from hypothesis import event, note

    calls = [report.noted for report in outcome.ranks]
    alike = all(c == calls[0] for c in calls)
    for report in outcome.ranks[:1] if alike else outcome.ranks:
        for kind, text, payload in report.noted:
            if kind == "note":
                note(text if alike else f"rank {report.rank}: {text}")
            else:
                event(text, payload)
