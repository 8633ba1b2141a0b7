"""Everything this plugin touches inside pytest-benchmark that is not its public API, in one place.

The rounds are timed on the ranks, so the controller's `benchmark` fixture is fed the ranks' samples
rather than timing anything itself; that needs the fixture's settings, its stats factory, its "used" mark
and the session's list of results, all private. pyproject.toml pins pytest-benchmark below the next major
version, and tests/test_timing.py exercises each of these against the installed one.
"""

from __future__ import annotations

from typing import Any


def is_fixture(value: Any) -> bool:
    """Whether ``value`` is pytest-benchmark's fixture (and not, say, a test's own argument of that name)."""
    return hasattr(value, "_make_stats")


def settings(fixture: Any) -> dict[str, Any]:
    """The fixture's --benchmark-* settings: enabled, min_rounds, max_time_s, min_time_s, warmup (the
    --benchmark-warmup-iterations when --benchmark-warmup is on, else 0)."""
    return {
        "enabled": not fixture.disabled,
        "min_rounds": fixture._min_rounds,
        "max_time_s": fixture._max_time,
        "min_time_s": fixture._min_time,
        "warmup": int(fixture._warmup or 0),
    }


def mark_used(fixture: Any) -> None:
    """Keep the fixture from failing the test as unused: it was used, on the ranks."""
    fixture._mode = "benchmark(...) on the ranks"


def new_stats(fixture: Any, iterations: int) -> Any:
    """The fixture's stats for rounds of ``iterations`` calls, to be fed with ``update(seconds)``."""
    return fixture._make_stats(iterations)


def session_results(config: Any) -> list[Any]:
    """The session's recorded benchmarks, in order (a list the caller may trim); empty without the plugin."""
    session = getattr(config, "_benchmarksession", None)
    return session.benchmarks if session is not None else []
