"""pytest-xdist: each worker runs its own pooled groups (own temp dirs, own FileStores), so ``-n K`` needs
nothing on CPU. With ``--gpus G``, worker i of K owns GPUs [i*G/K, (i+1)*G/K) and no two groups share a
GPU. Benchmarks are skipped: they need the whole node, and the other workers' traffic would be measured.
Each worker hands its example counts and capability matrix to the controller (xdist's workeroutput),
which prints and writes them as a serial run does.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import pytest

from pytest_collectives.execution import left_out
from pytest_collectives.execution.options import OptionError, Settings


def worker(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """(index, count) of this xdist worker, or None outside xdist (and in its controller)."""
    name, count = environ.get("PYTEST_XDIST_WORKER"), environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not name or not count:
        return None
    return int(name.removeprefix("gw")), int(count)


def gpu_subset(index: int, count: int, gpus: int) -> range:
    """The GPUs worker ``index`` of ``count`` owns among ``gpus``: disjoint, together all of them."""
    if gpus < count:
        raise OptionError(
            f"--gpus {gpus} with {count} xdist workers: each worker needs a GPU of its own; "
            f"use -n {gpus} or fewer"
        )
    return range(index * gpus // count, (index + 1) * gpus // count)


def visible_devices(subset: range, visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for a subset, through the one pytest was started with (GPUs 2,3 of '4,5,6,7'
    are 6,7)."""
    names = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(subset.stop)]
    return ",".join(names[i] for i in subset)


def configure(config: pytest.Config, settings: Settings, environ: MutableMapping[str, str]) -> None:
    """On an xdist worker: restrict its groups to its GPUs (the pool reads CUDA_VISIBLE_DEVICES when it
    starts a group) and skip what it can't run."""
    position = worker(environ)
    if position is None:
        return
    subset = gpu_subset(*position, settings.gpus) if settings.gpus else None
    if subset is not None:
        environ["CUDA_VISIBLE_DEVICES"] = visible_devices(subset, environ.get("CUDA_VISIBLE_DEVICES"))
    config.pluginmanager.register(XdistWorker(config, position, subset), "collectives-xdist")


class XdistWorker:
    def __init__(self, config: pytest.Config, position: tuple[int, int], subset: range | None) -> None:
        self.config = config
        self.name = f"xdist worker gw{position[0]} of {position[1]}"
        self.subset = subset

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        bench = pytest.mark.skip(
            reason=f"benchmark not run under pytest-xdist ({self.name}): it needs the whole node; run "
            "benchmarks without -n (or add --benchmark-disable to run each once as a smoke test)"
        )
        for item in items:
            if left_out.why(item) == "pytest-xdist":
                item.add_marker(bench)
            callspec = getattr(item, "callspec", None)
            n = callspec.params.get("world_size", 0) if callspec else 0
            if self.subset is not None and n > len(self.subset):
                gpus = ",".join(map(str, self.subset))
                reason = (
                    f"needs {n} GPUs; {self.name} owns GPUs {gpus} (run it without -n, or with fewer workers)"
                )
                item.add_marker(pytest.mark.skip(reason=reason))


class XdistController:
    """On the controller of an xdist run: adds each worker's counts and matrix to its own."""

    def __init__(self, session: Any, matrix: Any) -> None:
        """``session`` (execution.session.DistributedSession) counts the calls; ``matrix``
        (conformance.matrix.CapabilityMatrix) merges each worker's."""
        self.session, self.matrix = session, matrix

    def pytest_configure_node(self, node: Any) -> None:
        """One turn of the sweeps' rotation for the whole run, the controller's (printed once, in its
        summary): each worker drawing its own would turn the tiers differently on each, and say none."""
        node.workerinput.update(self.matrix.worker_input())

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        output = getattr(node, "workeroutput", {})
        session = self.session
        for n, count in output.get("collectives_calls", {}).items():
            session.calls[int(n)] = session.calls.get(int(n), 0) + count
        if "collectives_summary" in output:
            session.workers.append(f"{node.gateway.id}: {output['collectives_summary']}")
        if "collectives_matrix" in output:
            self.matrix.merge(output["collectives_matrix"])
