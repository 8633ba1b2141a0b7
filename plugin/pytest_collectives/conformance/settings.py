"""The conformance run's options: declared here, read and checked once when pytest configures (a manifest
or saved matrix that can't be read is a one-line usage error before any test runs)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_collectives.conformance import known_bugs, tiers
from pytest_collectives.errors import OptionError
from pytest_collectives.option import Option

OPTIONS = (
    Option("capability_json", "write the conformance capability matrix (operation x dtype x reduce op) as "
           "JSON to PATH", metavar="PATH"),
    Option("capability_compare", "compare the capability matrix with an earlier run's --capability-json "
           "(before and after a driver or firmware upgrade): one line per cell whose status changed",
           metavar="PATH"),
    Option("known_bugs", "a JSON manifest of known backend bugs (tests that are strict xfails on named "
           "backends); repeatable, and added to the ini's and the suites' own", metavar="PATH",
           action="append", ini="paths"),
    Option("tier_budget", "seconds all_reduce's every cell at 1 Mi elements may take, at what an example of "
           "them costs on the live group (timed once per world size, so the tier then follows the "
           f"machine's load), on a machine that draws a 1 Mi input in {tiers.DRAW_S * 1e3:g} ms: where "
           "they fit, every sweep there runs every cell at 1 Mi, else one, turning with the run (0: always "
           f"one; inf: always every cell; e.g. {tiers.BUDGET_S:g}). By default the topology decides: every "
           "cell where each rank has a core or device of its own, else one", metavar="SECONDS"),
)  # fmt: skip
# The session's ConformanceSettings, for probing.sized, which sizes the tiers by its budget.
SETTINGS = pytest.StashKey["ConformanceSettings"]()


@dataclasses.dataclass(frozen=True)
class ConformanceSettings:
    capability_json: str | None = None  # where to write the matrix
    compare_with: str | None = None  # --capability-compare's path, and its document
    before: dict[str, Any] | None = None
    known_bugs: tuple[known_bugs.KnownBug, ...] = ()  # every manifest's: shipped, the ini's, the option's
    tier_budget_s: float | None = None  # None: the topology decides the 1 Mi tier (tiers)


def read(config: pytest.Config) -> ConformanceSettings:
    answers = config.hook.pytest_collectives_known_bugs(config=config)
    shipped = [path for paths in answers for path in paths or ()]
    manifests = [*shipped, *config.getini("known_bugs"), *(config.getoption("known_bugs") or ())]
    try:
        bugs = tuple(bug for path in manifests for bug in known_bugs.load(path))
    except known_bugs.ManifestError as exc:
        raise OptionError(str(exc)) from None
    path = config.getoption("capability_compare")
    budget = _seconds(config.getoption("tier_budget"))
    return ConformanceSettings(config.getoption("capability_json"), path, saved(path), bugs, budget)


def _seconds(text: str | None) -> float | None:
    """--tier-budget's seconds: a number, 0 or more; None where not given."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # NaN too
        raise OptionError(f"--tier-budget {text}: expected seconds, 0 or more, or inf, e.g. --tier-budget 3")
    return seconds


def saved(path: str | None) -> dict[str, Any] | None:
    """An earlier run's --capability-json, for --capability-compare."""
    if not path:
        return None
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OptionError(f"--capability-compare {path}: not readable JSON ({exc})") from None
    if not (isinstance(doc, dict) and isinstance(doc.get("cells"), list)):
        raise OptionError(
            f"--capability-compare {path}: not a capability matrix (--capability-json writes one)"
        )
    return doc
