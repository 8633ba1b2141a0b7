"""Tests a selection holds that a mode of the run leaves out: pytest-benchmark's --benchmark-only and
--benchmark-skip, and benchmarks on a pytest-xdist worker, which cannot time them. Such a test was not asked
to run, as one that -k, -m or a path leaves out, so no rule about tests that did not run counts it: a
conformance run that checked nothing, a backend setting none of whose tests ran."""

from __future__ import annotations

import pytest

_PROPERTY = "left_out"  # on the test's reports (xdist's controller reads its workers'), with the mode


def why(item: pytest.Item) -> str:
    """The mode that leaves ``item`` out of this run, or "" where it runs."""
    config = item.config
    timed = "benchmark" in getattr(item, "fixturenames", ())
    if timed and config.getoption("benchmark_skip", False):
        return "--benchmark-skip"
    if not timed and config.getoption("benchmark_only", False):
        return "--benchmark-only"
    if timed and hasattr(config, "workerinput") and not config.getoption("benchmark_disable", False):
        return "pytest-xdist"
    return ""


def mark(item: pytest.Item) -> None:
    """Say on ``item``'s reports that a mode left it out, where one did."""
    mode = why(item)
    if mode and (_PROPERTY, mode) not in item.user_properties:
        item.user_properties.append((_PROPERTY, mode))


def of_report(report: pytest.TestReport) -> bool:
    """Whether a mode of the run left out the test ``report`` is of."""
    return any(name == _PROPERTY for name, _ in report.user_properties)
