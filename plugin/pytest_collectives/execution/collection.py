"""Shaping the collected tests: world sizes and configurations parametrized, GPU tests skipped without GPUs,
each configuration's tests kept together, and which test is the last on each group size; whether a
session's paths hold distributed tests at all."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_collectives.execution import configurations, options
from pytest_collectives.execution.configurations import Env


def world_sizes_of(args: tuple[Any, ...], settings: options.Settings) -> tuple[Any, ...]:
    """A world_size marker's sizes: its own, the configured ones, or for 'max' the largest group the
    session can make (Settings.largest: the SPMD world, every GPU with --gpus, else the largest size)."""
    if args == ("max",):
        return (settings.largest or settings.gpus or max(settings.world_sizes),)
    return args or settings.world_sizes


def parametrize_world_size(
    metafunc: pytest.Metafunc, sizes: tuple[Any, ...], limit: int | None, too_big: str
) -> None:
    """Parametrize ``world_size`` over ``sizes`` (session scope, ids ws<n>); sizes above ``limit`` are kept
    as skips with the reason ``too_big`` (formatted with n), so the report says what did not run."""
    if not all(isinstance(n, int) and n >= 1 for n in sizes):
        pytest.fail(
            f"{metafunc.definition.nodeid}: world_size takes whole numbers >= 1 or 'max', got {sizes}",
            pytrace=False,
        )
    params = [
        pytest.param(
            n, id=f"ws{n}", marks=pytest.mark.skip(reason=too_big.format(n=n)) if limit and n > limit else ()
        )
        for n in sizes
    ]
    if not params:
        reason = f"no world size to run: no configured world size fits in {limit}"
        params = [pytest.param(0, id="ws0", marks=pytest.mark.skip(reason=reason))]
    if "world_size" not in metafunc.fixturenames:
        metafunc.fixturenames.append("world_size")
    metafunc.parametrize("world_size", params, scope="session")


def parametrize_configurations(
    metafunc: pytest.Metafunc, sweep: tuple[configurations.Configuration, ...]
) -> None:
    """Parametrize ``backend_env`` over the configurations of --backend-env (session scope, ids
    ``NAME=VALUE``, after the world size's); a plain run's one configuration adds nothing to the ids."""
    if not any(configuration.env for configuration in sweep):
        return
    if "backend_env" not in metafunc.fixturenames:
        metafunc.fixturenames.append("backend_env")
    params = [pytest.param(configuration, id=configuration.id) for configuration in sweep]
    metafunc.parametrize("backend_env", params, scope="session")


def one_configuration_at_a_time(
    items: list[pytest.Item], sweep: tuple[configurations.Configuration, ...]
) -> None:
    """Each configuration's tests together, in the order of a plain run: pytest's own order interleaves
    them, which would keep every configuration's groups alive at once."""
    if any(configuration.env for configuration in sweep):
        place = {configuration: i for i, configuration in enumerate(sweep)}
        items.sort(key=lambda item: place.get(configurations.of_item(item), -1))  # stable: keeps the rest


def last_of_each_size(items: list[pytest.Item]) -> dict[str, tuple[int, Env]]:
    """{node id: (n, env)} for the last of ``items`` to run on n ranks in a configuration, for each world
    size n and configuration's variables env."""
    last = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "world_size" in callspec.params:
            last[callspec.params["world_size"], configurations.of_item(item).env] = item.nodeid
    return {nodeid: group for group, nodeid in last.items()}


def world_sizes_run(items: list[pytest.Item]) -> dict[str, tuple[int, ...]]:
    """{node id: the world sizes its test runs at}, over ``items`` (those selected), a skipped size left
    out: one test at several world sizes differs only in its ``ws<n>`` id."""
    sizes: dict[tuple[str, str], list[int]] = {}
    test_of = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "world_size" not in callspec.params:
            continue
        n = callspec.params["world_size"]
        test = (item.nodeid.split("[")[0], callspec.id.replace(f"ws{n}", "", 1))
        test_of[item.nodeid] = test
        if not item.get_closest_marker("skip"):
            sizes.setdefault(test, []).append(n)
    return {nodeid: tuple(sorted(sizes.get(test, ()))) for nodeid, test in test_of.items()}


def skip_gpu_tests(items: list[pytest.Item], settings: options.Settings) -> None:
    if settings.gpus:
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA GPUs: run with --gpus N on a GPU machine")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip_gpu)


SCAN_LIMIT = 400  # files read to tell whether a session's paths hold distributed tests


def mentioned(paths: Iterable[Path], words: tuple[str, ...]) -> set[str]:
    """Which of ``words`` the Python files among ``paths`` name (files, or folders walked past their hidden
    and environment folders, SCAN_LIMIT files at most). ``world_size``: a session that will start worker
    groups; ``mark.training``: one whose ranks will import the training stacks."""
    found: set[str] = set()
    read = 0
    for path in paths:
        files = [path] if path.is_file() else _python_files(path)
        for file in files:
            if read >= SCAN_LIMIT or len(found) == len(words):
                return found
            read += 1
            try:
                if file.suffix == ".py":
                    text = file.read_text(errors="replace")
                    found.update(word for word in words if word in text)
            except OSError:
                continue
    return found


def _python_files(folder: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")) and d not in _NOT_TESTS)
        yield from (Path(root, f) for f in sorted(files) if f.endswith(".py"))


_NOT_TESTS = {"venv", "env", "build", "dist", "node_modules", "site-packages"}
