"""Settings shared by the suites: hypothesis profiles and the message-size sweep of the benchmarks."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

try:
    from pytest_collectives import format_size, parse_size, settings_of, size_sweep

    _MISSING = ""
except ModuleNotFoundError as exc:  # this pytest's Python lacks the plugin: said at configure (below)
    _MISSING = str(exc.name)

# Examples run on every rank, so their time varies with the machine's load: no deadline. The example
# database is hypothesis' default (.hypothesis/ in the working directory), so a failure found once is
# tried first on the next run; print_blob prints a @reproduce_failure line for any failure.
_COMMON = {"deadline": None, "print_blob": True, "suppress_health_check": [HealthCheck.too_slow]}
# The conformance suites batch their examples (@pytest_collectives.examples): max_examples counts batches
# of 1 to 64 examples, about 14 on average, and a large-message test takes a tenth of it, 3 at least.
# ci is a budget per run: 8 batches a test at each of the default 3 world sizes, about as many examples as
# 20 batches of 1 to 16 drew; more world sizes share CI_BATCHES_PER_TEST (3 each at 4 or 5, 2 at 6 or more),
# which keeps a run of 2 to 8 ranks within the 3 minutes asked of it. Every supported cell is swept at every
# world size anyway (test_every_cell.py), so that run still draws over 11,000 examples, where 10,000 are
# asked.
CI_BATCHES = 8
CI_BATCHES_PER_TEST = 15
settings.register_profile("ci", max_examples=CI_BATCHES, **_COMMON)
settings.register_profile("thorough", max_examples=200, **_COMMON)
settings.load_profile("ci")  # --hypothesis-profile thorough (hypothesis' own option) overrides this


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Where this pytest's Python lacks the plugin, say what to do in one line: an error raised while the
    conftest is imported is printed as an ImportError with its frame."""
    if _MISSING:
        raise pytest.UsageError(
            f"the suites need the pytest-collectives plugin, which this Python ({_MISSING} missing) lacks: "
            "run them with the Python that has it (after the tox set-up: .tox/suites/bin/python -m pytest "
            "suites), or install it here: python -m pip install -e '.[suites]'"
        )


@pytest.hookimpl(trylast=True)  # after the plugin settled the world sizes and hypothesis its profile
def pytest_configure(config: pytest.Config) -> None:
    current = getattr(settings, "get_current_profile_name", lambda: settings._current_profile)()
    if current == "ci":
        sizes = len(settings_of(config).world_sizes)
        batches = CI_BATCHES if sizes <= 3 else max(2, CI_BATCHES_PER_TEST // sizes)
        settings.register_profile("ci", max_examples=batches, **_COMMON)
        settings.load_profile("ci")


# (option, default on CPU, default with GPUs): like nccl-tests -b, -e, -f
SWEEP = (
    ("--min-bytes", "4K", "8"),
    ("--max-bytes", "1M", "256M"),
    ("--step-factor", "16", "4"),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(
        "collectives-sweep", "message sizes of the performance suites (nccl-tests -b -e -f)"
    )
    for flag, cpu, gpu in SWEEP:
        group.addoption(flag, default=None, help=f"default {cpu} on CPU, {gpu} with --gpus")
    parser.getgroup("collectives").addoption(
        "--huge",
        action="store_true",
        help="also run the conformance tier straddling 2**31 elements and 2**32 bytes (test_huge.py): "
        "2 to 4 GiB a message on every rank, for big-memory nodes",
    )


def sweep_sizes(config: pytest.Config) -> list[int]:
    gpus = settings_of(config).gpus
    values = []
    for flag, cpu, gpu in SWEEP:
        text = config.getoption(flag.lstrip("-").replace("-", "_")) or (gpu if gpus else cpu)
        try:
            values.append(int(text) if flag == "--step-factor" else parse_size(text))
        except ValueError as exc:
            raise pytest.UsageError(f"{flag} {text}: {exc}") from None
    try:
        return size_sweep(*values)
    except ValueError as exc:
        raise pytest.UsageError(f"--min-bytes/--max-bytes/--step-factor: {exc}") from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "nbytes" in metafunc.fixturenames:
        sizes = sweep_sizes(metafunc.config)
        metafunc.parametrize("nbytes", sizes, ids=[format_size(n) for n in sizes])


# The backends' defects the suites have found: strict xfails there (a fix shows up as XPASS), marked by the
# plugin with a user's own manifests.
KNOWN_BUGS = Path(__file__).with_name("known_bugs.json")


def pytest_collectives_known_bugs(config: pytest.Config) -> list[Path]:
    return [KNOWN_BUGS]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("huge"):
        off = pytest.mark.skip(reason="the 2**31-element tier runs with --huge (2 to 4 GiB a message a rank)")
        for item in items:
            if item.get_closest_marker("huge"):
                item.add_marker(off)
