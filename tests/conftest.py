# pytester's in-process runs drop the modules each run imported. torch's C extension can't be imported a
# second time in one process (it segfaults), and a re-imported multiprocessing.forkserver would start a
# fresh forkserver (and its torch import) for every run: both are imported once here, before any run. So
# are the conformance strategies: a copy of capabilities imported afresh by one run, beside the copy the
# strategies of an earlier-imported cases module read, would leave them drawing from a probe nobody set
# ("nothing probed", seen on torch 2.2 when test_examples.py ran before test_algorithms.py). So is
# matplotlib's figure API, for the node report's plots: a run that drew the first plot of a process would
# take its axes and legend modules away with it, and the next plot would mix their classes with those of
# the modules kept ("Legend needs either Axes or FigureBase as parent").
import contextlib
import multiprocessing.forkserver  # noqa: F401
import sys
from pathlib import Path

import pytest
import torch  # noqa: F401
from hypothesis import settings

# The tests' support modules (helpers, docblocks, the planted backends) live apart from the tests, in
# support/; they are imported by name, as --backend-module names a planted backend.
sys.path.insert(0, str(Path(__file__).parent / "support"))

import pytest_collectives.conformance.cases  # noqa: E402, F401
import pytest_collectives.execution.launchers.warm_groups  # noqa: F401

with contextlib.suppress(ImportError):  # an extra; without it the plots are skipped
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401


@pytest.fixture(autouse=True)
def _hypothesis_seed_kept() -> object:
    """An in-process run given --hypothesis-seed sets hypothesis' process-wide forced seed, which pytest
    never unsets, and under a forced seed hypothesis saves no failure to its example database: a later
    test of the database replaying a failure would find none."""
    from hypothesis import core

    seed = core.global_force_seed
    yield
    core.global_force_seed = seed


@pytest.fixture(autouse=True)
def _hypothesis_profile_kept() -> object:
    """An in-process run loads its own profile (the suites' ci, a planted-bug run's planted without
    shrinking) into hypothesis' one global: the next test must not inherit it."""
    name = settings.get_current_profile_name()
    yield
    if settings.get_current_profile_name() != name:
        settings.load_profile(name)


@pytest.fixture(autouse=True, scope="session")
def _not_an_xdist_worker() -> object:
    """Where these tests themselves run under pytest-xdist (-n), the sessions they start are not its
    workers: the plugin reads a worker's identity from the environment (execution.modes.xdist.worker). For the
    whole session, so that a module's fixture starting a session sees it hidden too."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
            monkeypatch.delenv(name, raising=False)
        yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """tox runs these tests in two sessions, those marked alone apart (tox.ini): where a selection of its
    own (``tox -e tests -- tests/test_values.py``) leaves one of them nothing to run, that one passes."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and "alone" in session.config.getoption("markexpr"):
        session.exitstatus = pytest.ExitCode.OK
