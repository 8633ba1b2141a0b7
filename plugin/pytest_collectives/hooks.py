"""The plugin's entry point (pytest11): its options, and at configure time the session with its launcher,
the baseline gate and the node report. The logic lives in the subpackages:

- execution/: the session (session.py), its launchers (launchers/), the ranks' side (ranks/), the
  session-level modes (modes/: soak, xdist), outcomes and verdicts (outcome.py);
- bench/: timing on the ranks (timing.py) and pytest-benchmark's fixture (shim.py);
- gate/: the baseline store, the statistics, the plugin and its reports;
- topology/: what machine this is; nodereport/: node validation and the fleet view;
- algorithms/: what the suites test, with exact references.
"""

from __future__ import annotations

import os

import pytest

from pytest_collectives.algorithms import registry
from pytest_collectives.conformance import known_bugs, probing
from pytest_collectives.conformance import settings as conformance_settings
from pytest_collectives.conformance.matrix import CapabilityMatrix
from pytest_collectives.errors import OptionError
from pytest_collectives.execution import configurations, options
from pytest_collectives.execution.collection import mentioned
from pytest_collectives.execution.launchers import spmd
from pytest_collectives.execution.modes import soak
from pytest_collectives.execution.modes import xdist as xdist_support
from pytest_collectives.execution.session import DistributedSession, Launcher
from pytest_collectives.execution.suite_api import SESSION, pg, settings_of, world_size
from pytest_collectives.gate import baseline_gate as gate
from pytest_collectives.gate import settings as gate_settings
from pytest_collectives.nodereport import collect as session_report
from pytest_collectives.nodereport import settings as report_settings
from pytest_collectives.option import declare
from pytest_collectives.run import Run

__all__ = ["pg", "world_size"]  # the fixtures, found here by pytest


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_collectives import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("collectives", "distributed worker groups (pytest-collectives)")
    declare(
        parser,
        group,
        options.OPTIONS,
        gate_settings.OPTIONS,
        conformance_settings.OPTIONS,
        report_settings.OPTIONS,
    )


_KNOWN_BUGS = pytest.StashKey[list[known_bugs.KnownBug]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    known_bugs.mark(config, items, settings_of(config).backend, config.stash.get(_KNOWN_BUGS, []))


def _expect_groups(config: pytest.Config) -> None:
    """Start the forkserver, whose torch import the first group waits for, before this process imports
    torch (resolving --backend does): both imports then run at once. Only where the paths to collect name
    world_size; otherwise the launcher starts it once the collected tests say so."""
    paths = [config.invocation_params.dir / arg.split("::")[0] for arg in config.args]
    named = mentioned(paths, ("world_size", "mark.training"))
    if "world_size" in named:
        from pytest_collectives.execution.launchers.forkserver import forkserver_context, warm_up

        warm_up(forkserver_context(), training="mark.training" in named)


def pytest_configure(config: pytest.Config) -> None:
    try:
        _configure(config)
    except (OptionError, spmd.SpmdError) as exc:  # every bad option value's one path to the user
        raise pytest.UsageError(str(exc)) from None


def _configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "world_size(*sizes): run the test body on every rank of a process group of each size "
        "(no sizes: the --world-sizes; 'max': the largest of them); the test takes the `pg` fixture",
    )
    config.addinivalue_line("markers", "gpu: needs CUDA GPUs (--gpus N); skipped on CPU runs")
    for line in probing.MARKERS:
        config.addinivalue_line("markers", line)
    config.pluginmanager.register(probing, "collectives-probing")  # its fixtures
    config.pluginmanager.register(known_bugs, "collectives-known-bugs")  # judges their failures
    config.pluginmanager.register(configurations, "collectives-configurations")  # its fixture
    config.add_cleanup(registry.forget_session)
    # every option is read and checked first, before any part is made
    values = options.texts(config)
    env = spmd.detect(os.environ)
    under_xdist = bool(getattr(config.option, "numprocesses", None))
    soak_s = options.soak_seconds(values["soak"], spmd_mode=env is not None, under_xdist=under_xdist)
    gate_read, report_dir = gate_settings.read(config), report_settings.read(config)
    conformance = conformance_settings.read(config)
    config.stash[conformance_settings.SETTINGS] = conformance
    # under xdist the workers start their own; a collection alone starts no group
    if env is None and not under_xdist and not config.option.collectonly:
        _expect_groups(config)
    if env is None:
        settings = options.resolve(values, options.count_accelerators)
    else:
        settings = spmd.settings_for(values, env, options.count_accelerators)
    xdist_support.configure(config, settings, os.environ)
    config.stash[_KNOWN_BUGS] = list(conformance.known_bugs)
    known_bugs.remember(config, conformance.known_bugs)  # what drops an inherited entry holds from the start
    if env is None:
        from pytest_collectives.execution.launchers.pooled import PooledLauncher

        launcher: Launcher = PooledLauncher(settings)
    else:
        launcher = spmd.SpmdLauncher(config, settings, env)
        config.pluginmanager.register(launcher, "collectives-spmd")  # its own hooks: rank 0 alone speaks
    # The parts are made here and handed the parts they use; each is registered for its own hooks only.
    session = DistributedSession(config, settings, launcher)
    config.stash[SESSION] = session
    config.pluginmanager.register(session, "collectives-session")
    if xdist_support.worker(os.environ) is not None:
        # its matrix goes to the controller (xdist.XdistController), which reports for the session
        matrix = CapabilityMatrix(config, settings.backend, conformance, worker=True, outcomes=session.tally)
        config.stash[probing.MATRIX] = matrix
        config.pluginmanager.register(matrix, "collectives-capabilities")
        config.pluginmanager.register(Run(session, matrix), "collectives-run")
        return
    if env is not None and env.rank != 0:
        # one process compares, saves and reports for the session: rank 0 in SPMD mode
        config.pluginmanager.register(Run(session), "collectives-run")
        return
    matrix = CapabilityMatrix(config, settings.backend, conformance, outcomes=session.tally)
    config.stash[probing.MATRIX] = matrix
    config.pluginmanager.register(matrix, "collectives-capabilities")
    if config.pluginmanager.hasplugin("xdist") and under_xdist:
        controller = xdist_support.XdistController(session, matrix)
        config.pluginmanager.register(controller, "collectives-xdist-controller")
    baseline_gate = gate.BaselineGate(
        config, gate_read, settings.backend, settings.gpus, can_remeasure=env is None
    )
    config.pluginmanager.register(baseline_gate, "collectives-gate")
    soaking = None
    if soak_s:  # a drift beyond the gate's tolerance over the passes is a WARN
        drift = baseline_gate.settings.tolerance or baseline_gate.settings.min_effect
        soaking = soak.Soak(soak_s, session, drift, probing.pinned)
        config.pluginmanager.register(soaking, "collectives-soak")
    if isinstance(launcher, spmd.SpmdLauncher):
        launcher.gate = baseline_gate  # rank 0's: a bad baseline stops every rank
    report = None
    if report_dir is not None:
        report = session_report.NodeReport(
            config, report_dir, settings.gpus, baseline_gate, matrix, soaking, session.tally
        )
        config.pluginmanager.register(report, "collectives-node-report")
    # the session-level hooks are the run's alone, over these parts, in one order (run.py)
    config.pluginmanager.register(Run(session, matrix, baseline_gate, soaking, report), "collectives-run")
