"""The session of both modes (DistributedSession) and the launcher interface it drives: what runs where,
when groups are started and dropped, and how each test's outcome on the ranks becomes its report."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pickle
import sys
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from pytest_collectives.bench import shim as benchmark_shim
from pytest_collectives.bench import side_by_side
from pytest_collectives.bench.timing import BenchSpec, record
from pytest_collectives.execution import configurations, examples, left_out, options
from pytest_collectives.execution.collection import (
    last_of_each_size,
    one_configuration_at_a_time,
    parametrize_configurations,
    parametrize_world_size,
    skip_gpu_tests,
    world_sizes_of,
    world_sizes_run,
)
from pytest_collectives.execution.configurations import Env
from pytest_collectives.execution.hypothesis_calls import (
    distributed_call,
    examples_sent_to,
    replay_hypothesis_calls,
    stable_seed,
)
from pytest_collectives.execution.messages import REJECTED, ExpectedFailure, Task, packed
from pytest_collectives.execution.outcome import DistributedTestFailure, GroupOutcome
from pytest_collectives.execution.reproductions import (
    drop_drafts,
    hang_record,
    reproductions_folder,
    reproductions_in,
    write_closest,
    write_drafts,
)
from pytest_collectives.execution.suite_api import PARAMS, SIZES, OnRanks
from pytest_collectives.execution.tally import UNSTARTED, Tally, judge_settings, judge_tests
from pytest_collectives.verdict import Check

_outcome_key = pytest.StashKey[GroupOutcome]()


# The known bugs a test holds: conformance.known_bugs sets it, and the ranks run a batch of examples past
# one that fails with one of them (examples.run_batch).
EXPECTED_FAILURES = pytest.StashKey[tuple[ExpectedFailure, ...]]()
_KNOWN_SEEN = pytest.StashKey[str]()  # the first example's failure with one of them
_DRAFTS = pytest.StashKey[set[str]]()  # the reproductions its failing examples wrote, shrinking ones too


@dataclasses.dataclass
class _Examples:
    """A test's examples over all its dispatches: how many ran, and the backend's words for each refused."""

    ran: int = 0
    refused: list[str] = dataclasses.field(default_factory=list)

    def not_applicable(self) -> str | None:
        """The N/A reason where the backend refused every example and none ran, else None."""
        if self.ran or not self.refused:
            return None
        return f"N/A: every example refused ({len(self.refused)}): {self.refused[0]}"


_EXAMPLES = pytest.StashKey[_Examples]()


class KnownBugSeen(Exception):
    """Raised once a test's examples all ran, where some failed with a known bug of the test and none with
    anything else: the failure (a rank's traceback) the known-bug manifest's strict xfail then judges."""


class GroupReplacedWarning(pytest.PytestWarning):
    """A test left its group unfit for the next one (its own verdict stands): a fresh group was started,
    or under torchrun/srun, where a rank can't be replaced, what can be put back was."""


class Launcher(Protocol):
    """How a session's ranks are started and reached: the one thing the two modes do differently.

    PooledLauncher (launchers/pooled.py) forks worker groups from this pytest; SpmdLauncher
    (launchers/spmd.py) is this pytest as one rank of a world torchrun or srun started. Everything else is
    DistributedSession's, once."""

    # Whether the session goes on after a rank crashes: a pooled group is replaced, while in SPMD mode
    # the crashed rank was one of the job's own processes.
    survives_a_crash: bool

    def size_limit(self, metafunc: pytest.Metafunc) -> tuple[int | None, str]:
        """The most ranks a group can have for this test, and why a bigger size is skipped ({n}: the size)."""

    def collected(self, items: list[pytest.Item]) -> None:
        """The session's tests are known: get ready to run them."""

    def hypothesis_settings(self, fn: Any) -> contextlib.AbstractContextManager[None]:
        """What hypothesis' engine needs around a property test in this mode."""

    def run(self, task: Task, test: Callable[..., Any]) -> GroupOutcome:
        """Run ``task`` on its ranks (``test``: the function itself, for a launcher that runs in-process)."""

    def done_with(self, world_size: int, env: Env = ()) -> None:
        """No test left in the session runs on ``world_size`` ranks started with ``env``."""

    def summary(self) -> str:
        """What ran the tests, for the terminal summary: "4 worker groups started", "SPMD mode (...)"."""

    def close(self) -> None:
        """Stop every rank it started."""


class DistributedSession:
    """The session of both modes: parametrizing, argument shipping, seeding, hypothesis routing, outcome
    and verdict, benchmark recording and reporting. The launcher only starts ranks and carries messages."""

    def __init__(self, config: pytest.Config, settings: options.Settings, launcher: Launcher) -> None:
        self.config = config
        self.settings = settings
        self.launcher = launcher
        self.calls: dict[int, int] = {}  # world size -> test calls and hypothesis examples run on ranks
        self.workers: list[str] = []  # under xdist, on the controller: what each worker's launcher did
        self.last_of_size: dict[str, tuple[int, Env]] = {}  # node id -> the group no later test runs on
        # the running test's (--backend-env): every group call during its set-up, call and teardown
        self.configuration = configurations.Configuration()
        self.sizes_run: dict[str, tuple[int, ...]] = {}  # node id -> world sizes its test runs at
        self.tally = Tally()  # the run's one count of outcomes: every part reads it
        self.reproductions = str(reproductions_folder(config, settings))  # handed to each test's ranks
        self.reproductions_kept: set[str] = set()  # those a report named: no later test's draft

    @pytest.hookimpl(tryfirst=True)
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        marker = metafunc.definition.get_closest_marker("world_size")
        if marker is None:
            return
        limit, too_big = self.launcher.size_limit(metafunc)
        parametrize_world_size(metafunc, world_sizes_of(marker.args, self.settings), limit, too_big)
        parametrize_configurations(metafunc, self.settings.configurations)

    @pytest.hookimpl(trylast=True)  # after pytest ordered them by their session-scoped parameters
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        skip_gpu_tests(items, self.settings)
        one_configuration_at_a_time(items, self.settings.configurations)
        self.launcher.collected(items)

    def collected(self, session: pytest.Session) -> None:
        self.last_of_size = last_of_each_size(session.items)
        self.sizes_run = world_sizes_run(session.items)

    def keep_groups(self) -> None:
        """Keep every group to the session's end, the tests running again (a soak): a group is then
        replaced only after a test left it unfit."""
        self.last_of_size = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> None:
        self.begin(item)

    def begin(self, item: pytest.Item) -> None:
        """Ready ``item`` to run: its configuration, and nothing left of an earlier run of it (a soak's
        earlier pass, or its tries again at the same draw)."""
        self.configuration = configurations.of_item(item)
        if self.configuration.env and ("backend_env", self.configuration.id) not in item.user_properties:
            # on its reports (under xdist too) and in JUnit XML: which settings each outcome was under
            item.user_properties.append(("backend_env", self.configuration.id))
        left_out.mark(item)
        for key in (_outcome_key, _KNOWN_SEEN, _EXAMPLES, _DRAFTS):
            if key in item.stash:
                del item.stash[key]

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        if item.nodeid in self.last_of_size:
            self.launcher.done_with(*self.last_of_size[item.nodeid])

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        call = distributed_call(pyfuncitem)
        if call is None:
            return None
        n, funcargs = call
        fn = pyfuncitem.obj
        if not hasattr(fn, "hypothesis"):
            self.dispatch(pyfuncitem, n, funcargs, fn, hypothesis_inner=False)
            return True

        # Each example hypothesis draws runs on every rank with the same values.
        def on_ranks(inner: Callable[..., Any], owner: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.dispatch(pyfuncitem, n, kwargs, functools.partial(inner, *owner), hypothesis_inner=True)

        # hypothesis keys its example database by node id only for tests with a parametrize marker; the
        # world sizes come from metafunc, so without this a failure found at 3 ranks replays at 2 first,
        # passes there and is deleted.
        fn.hypothesis.inner_test._hypothesis_internal_add_digest = pyfuncitem.nodeid.encode()
        from hypothesis.errors import FailedHealthCheck, Unsatisfiable

        callspec = getattr(pyfuncitem, "callspec", None)
        token = PARAMS.set(dict(callspec.params) if callspec else {})
        sizes_token = SIZES.set(self.sizes_run.get(pyfuncitem.nodeid, ()))
        try:
            # (the marker, not its condition: the suites' known bugs are unconditional)
            expected_to_fail = pyfuncitem.get_closest_marker("xfail") and not self.config.option.runxfail
            tuned = examples.settings_for(fn, bool(expected_to_fail))
            with self.launcher.hypothesis_settings(fn), tuned, examples_sent_to(fn, on_ranks):
                fn(**funcargs)
        except (Unsatisfiable, FailedHealthCheck):
            # hypothesis found no example to run: N/A below where the backend refused each one
            if not pyfuncitem.stash.get(_EXAMPLES, _Examples()).not_applicable():
                raise
        finally:
            PARAMS.reset(token)
            SIZES.reset(sizes_token)
        if reason := pyfuncitem.stash.get(_EXAMPLES, _Examples()).not_applicable():
            pytest.skip(reason)
        if _KNOWN_SEEN in pyfuncitem.stash:  # every example ran and no other failed: the test holds its bug
            raise KnownBugSeen(pyfuncitem.stash[_KNOWN_SEEN])
        return True

    def dispatch(
        self,
        item: pytest.Function,
        n: int,
        kwargs: dict[str, Any],
        test: Callable[..., Any],
        hypothesis_inner: bool,
    ) -> None:
        module = item.module
        shipped = {k: _shippable(k, v) for k, v in kwargs.items()}
        task = Task(
            nodeid=item.nodeid,
            module=module.__name__,
            path=module.__file__,
            qualname=(f"{item.cls.__qualname__}." if item.cls else "") + item.originalname,
            kwargs=shipped,
            seed=stable_seed(item, kwargs),
            sys_path=list(sys.path),
            hypothesis_inner=hypothesis_inner,
            world_size=n,
            expected=item.stash.get(EXPECTED_FAILURES, ()),
            env=self.configuration.env,
            reproductions=self.reproductions,
        )
        try:
            packed(task)
        except Exception as exc:
            names = ", ".join(k for k, v in shipped.items() if not _picklable(v))
            pytest.fail(
                f"{item.nodeid}: argument(s) {names} can't be sent to the ranks ({exc}); "
                "build such values inside the test, on each rank",
                pytrace=False,
            )
        bench = kwargs.get("benchmark")
        if benchmark_shim.is_fixture(bench):
            benchmark_shim.mark_used(bench)
        outcome = self.run(task, test)
        outcome.keep_first_failing_example()
        self.calls[n] = self.calls.get(n, 0) + outcome.examples()
        item.stash[_outcome_key] = outcome
        if hypothesis_inner:
            replay_hypothesis_calls(outcome)
        if self.config.getoption("capture") == "no":
            for title, text in outcome.sections():
                sys.stdout.write("".join(f"[{title}] {line}\n" for line in text.splitlines()))
        verdict = outcome.verdict()
        batched = hypothesis_inner and examples.is_batched(item.obj)
        failed_at = outcome.failed_example() if batched else None
        calls = (
            list(
                examples.each_example(
                    kwargs, verdict, outcome.failed(), outcome.turned_down(), outcome.known(),
                    outcome.resume_at(), outcome.ended_at(),
                )  # fmt: skip
            )
            if batched
            else [(kwargs, verdict)]
        )
        if batched:
            seen = item.stash.setdefault(_EXAMPLES, _Examples())
            seen.ran += len(calls)
            seen.refused += outcome.refused()
        write_drafts(outcome)
        if verdict == "failed" or outcome.known_failure():
            item.stash.setdefault(_DRAFTS, set()).update(reproductions_in(outcome.render()))
        if outcome.known_failure() and _KNOWN_SEEN not in item.stash:
            item.stash[_KNOWN_SEEN] = outcome.known_failure()
        if verdict == "failed" and failed_at is not None:
            example = kwargs["batch"][failed_at]
            outcome.failing_example = ", ".join(f"{k}={v!r}" for k, v in example.items())
        for call_kwargs, call_verdict in calls:
            self.config.hook.pytest_collectives_call_done(
                item=item, world_size=n, kwargs=call_kwargs, verdict=call_verdict
            )
        unfit = [f"worker group replaced: {'; '.join(outcome.replaced)}"] * bool(outcome.replaced)
        unfit += [f"rank state restored: {'; '.join(outcome.restored)}"] * bool(outcome.restored)
        if unfit and verdict != "failed":
            warnings.warn_explicit(
                GroupReplacedWarning("; ".join(unfit)),
                category=None,
                filename=str(item.path),
                lineno=item.function.__code__.co_firstlineno,
            )
        if verdict == "skipped":
            if hypothesis_inner and outcome.skip_reason() == REJECTED:
                from hypothesis import assume

                assume(False)  # every rank's assume() turned the example down: hypothesis draws another
            pytest.skip(outcome.skip_reason())
        if verdict == "failed":
            if outcome.hung():
                under = f" under {self.configuration.id}" * bool(self.configuration.env)
                run = f"pytest-collectives: backend {self.settings.backend}{under}, {n} ranks"
                text = hang_record(item.nodeid, outcome, shipped, run)
                outcome.hang_record = write_closest(
                    self.reproductions, f"{item.nodeid} hang", text, "a hang cannot be reproduced alone",
                    "what each rank waited in",
                )  # fmt: skip
            raise DistributedTestFailure.of(outcome)
        if benchmark_shim.is_fixture(bench):
            s = self.settings
            context = {"world_size": n, "backend": s.backend, "devices": list(range(n)) if s.gpus else "cpu"}
            if self.configuration.env:
                context["backend_env"] = self.configuration.id
            record(bench, outcome.benchmark(), context)
        resume = outcome.resume_at() if batched else None
        if resume is not None and resume < len(kwargs["batch"]):
            # a refusal ended the batch on a backend that may keep state after a raise: the rest of it
            # runs in a call of its own, once the pool asked the group (or replaced it), each example judged
            rest = type(kwargs["batch"])(kwargs["batch"][resume:])
            self.dispatch(item, n, {**kwargs, "batch": rest}, test, hypothesis_inner)

    def run_on_ranks(self, n: int, fn: Callable[..., Any], kwargs: dict[str, Any]) -> list[Any]:
        outcome = self.outcome_on_ranks(n, fn, kwargs)
        if outcome.verdict() != "passed":
            raise DistributedTestFailure.of(outcome)
        return [report.returned for report in outcome.ranks]

    def outcome_on_ranks(
        self, n: int, fn: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float = 0.0
    ) -> GroupOutcome:
        task = dataclasses.replace(Task.calling(fn, n, timeout_s, **kwargs), env=self.configuration.env)
        return self.run(task, fn)

    def run(self, task: Task, test: Callable[..., Any]) -> GroupOutcome:
        """The launcher's run of ``task``; N/A (a skip) where the backend rejected its configuration."""
        try:
            return self.launcher.run(task, test)
        except configurations.Rejected as rejected:
            self.config.hook.pytest_collectives_configuration_rejected(
                configuration=rejected.configuration.id, words=rejected.words
            )
            pytest.skip(str(rejected))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):  # noqa: ANN201
        report = yield
        rep = report.get_result()
        failure = call.excinfo.value if call.excinfo is not None else None
        if isinstance(failure, DistributedTestFailure) and failure.outcome.unstarted:
            # in any phase (a fixture's group too): the closing verdicts name the setting (tally)
            rep.user_properties.append((UNSTARTED, "true"))
        if call.when != "call":
            return
        outcome = item.stash.get(_outcome_key, None)
        if isinstance(failure, DistributedTestFailure):
            outcome = failure.outcome  # also when the group failed to start, before any dispatch
        if outcome is not None and self.config.getoption("capture") != "no":
            for title, text in outcome.sections():
                rep.sections.append((f"Captured {title}", text))
        if call.excinfo is not None and isinstance(call.excinfo.value, DistributedTestFailure):
            exc = call.excinfo.value
            notes = "\n".join(getattr(exc, "__notes__", []))
            rep.longrepr = f"{notes}\n\n{exc.outcome.render()}" if notes else exc.outcome.render()
        drop_drafts(item.stash.get(_DRAFTS, set()), rep.longreprtext, self.reproductions_kept)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.tally.add(report)

    def finish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workeroutput"):  # an xdist worker: the controller prints the counts
            self.config.workeroutput["collectives_calls"] = {str(n): c for n, c in self.calls.items()}
            self.config.workeroutput["collectives_summary"] = self.launcher.summary()

    def checks(self) -> list[Check]:
        """The test run, and under --backend-env each backend setting, judged from the one tally."""
        # a worker's reports reach the controller, which judges them; a collection ran nothing to judge
        if hasattr(self.config, "workeroutput") or self.config.option.collectonly:
            return []
        return [judge_tests(self.tally), *filter(None, [judge_settings(self.tally)])]

    def summary(self, terminalreporter: Any) -> None:
        records = side_by_side.records(self.config)
        plain = [(configurations.plain_id(name, e.get("backend_env", "")), e) for name, e in records]
        compared = side_by_side.by_configuration(plain)
        if compared:
            terminalreporter.section("collectives: benchmarks per backend setting")
            for line in compared:
                terminalreporter.write_line(line)
        for line in self.tally.untested_lines():
            terminalreporter.write_line(line, red=True)
        if self.calls:
            sizes = ", ".join(f"{n} ranks: {c}" for n, c in sorted(self.calls.items()))
            calls = f"{sum(self.calls.values())} distributed examples ({sizes})"
            where = self.launcher.summary()
            if self.workers:
                where = f"{len(self.workers)} xdist workers ({', '.join(sorted(self.workers))})"
            terminalreporter.write_line(f"collectives: {where}; {calls}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.launcher.close()


def _shippable(name: str, value: Any) -> Any:
    """What a controller-side argument becomes on the ranks: pg and benchmark are rebuilt there."""
    if isinstance(value, OnRanks):
        return None
    if name == "benchmark" and benchmark_shim.is_fixture(value):
        return BenchSpec.from_fixture(value)
    return value


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True
