"""Backend settings as an axis (--backend-env): the configurations a session runs its distributed tests in.

A configuration is a set of environment variables its worker groups start with (``NCCL_PROTO=LL128``).
Backends have shipped corruptions that show under one of their own settings only (NCCL's broadcast with
LL128, all_reduce with ``NCCL_P2P_DISABLE=1``), found by rerunning a suite once per setting by hand; with
``--backend-env NAME=V1,V2`` one session runs every distributed test once per value, in groups of its own,
and its test ids, failures, capability matrix and benchmarks name the configuration.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping, Sequence

import pytest

from pytest_collectives.errors import OptionError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
Env = tuple[tuple[str, str], ...]  # a configuration's variables, in the order given


@dataclasses.dataclass(frozen=True)
class Configuration:
    """Environment variables a worker group starts with, over pytest's own; empty: pytest's as it is."""

    env: Env = ()

    @property
    def id(self) -> str:
        """How test ids and reports name it: ``NCCL_PROTO=LL128+NCCL_ALGO=Ring``."""
        return "+".join(f"{name}={value}" for name, value in self.env)

    def __str__(self) -> str:
        return self.id or "the environment as it is"


# name -> {variable: values}; the suites run once per combination of the values. The values are those each
# backend documents; one the installed version does not have is rejected by it, and reported as N/A.
PRESETS: dict[str, dict[str, tuple[str, ...]]] = {
    # NCCL's protocols: LL128 broadcast corruption (NVIDIA/nccl#740, #831), MSCCL's LL at small sizes
    "nccl-proto": {"NCCL_PROTO": ("LL", "LL128", "Simple")},
    # NCCL's algorithms (NCCL_ALGO); those the node has no hardware for are rejected, as N/A
    "nccl-algo": {"NCCL_ALGO": ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")},
    # NCCL's transports off one at a time: wrong all_reduce with P2P off (NVIDIA/nccl#1199)
    "nccl-p2p": {"NCCL_P2P_DISABLE": ("0", "1")},
    "nccl-shm": {"NCCL_SHM_DISABLE": ("0", "1")},
    "nccl-nvls": {"NCCL_NVLS_ENABLE": ("0", "1")},
    # gloo's transports (UV only where torch was built with libuv) and its lazy connection set-up
    "gloo-transport": {"GLOO_DEVICE_TRANSPORT": ("TCP", "UV")},
    "gloo-lazy-init": {"TORCH_GLOO_LAZY_INIT": ("0", "1")},
}


def backend_env_preset(name: str, variables: Mapping[str, Sequence[str]]) -> None:
    """Declare, from a backend's module (--backend-module), a preset of its own settings:
    ``backend_env_preset("acme-proto", {"ACME_PROTO": ["LL", "LL128"]})``; then
    ``--backend-env acme-proto``."""
    axes = {variable: tuple(values) for variable, values in variables.items()}
    for variable, values in axes.items():
        _check(f"preset {name}: {variable}", variable, values)
    PRESETS[name] = axes


def _check(where: str, variable: str, values: tuple[str, ...]) -> None:
    if not _NAME.match(variable):
        raise OptionError(f"--backend-env {where}: {variable!r} is not an environment variable's name")
    if not values or not all(values):
        raise OptionError(f"--backend-env {where}: give each value, e.g. --backend-env {variable}=A,B")
    if len(set(values)) != len(values):
        raise OptionError(f"--backend-env {where}: a value is listed twice; list each once")


def parse(texts: Sequence[str]) -> tuple[Configuration, ...]:
    """The configurations of ``--backend-env`` values (each ``NAME=V1,V2`` or a preset's name): every
    combination of their values, in the order given. None given: the one configuration of a plain run."""
    axes: dict[str, tuple[str, ...]] = {}
    for text in (t.strip() for t in texts if t.strip()):
        if "=" in text:
            variable, _, values = text.partition("=")
            # a value holding a comma (NCCL_PROTO=LL,LL128 is one setting) is written with it escaped
            split = re.split(r"(?<!\\),", values)
            given = {variable.strip(): tuple(v.replace("\\,", ",").strip() for v in split)}
        elif text in PRESETS:
            given = PRESETS[text]
        else:
            raise OptionError(
                f"--backend-env {text}: expected NAME=V1,V2 (a comma in a value written \\,) or a preset "
                f"({', '.join(sorted(PRESETS))}); a backend module declares its own with backend_env_preset()"
            )
        for variable, values in given.items():
            _check(text, variable, values)
            if variable in axes:
                raise OptionError(
                    f"--backend-env {text}: {variable} is already given; give each variable once"
                )
            axes[variable] = values
    if not axes:
        return (Configuration(),)
    return tuple(
        Configuration(tuple(zip(axes, values, strict=True))) for values in itertools.product(*axes.values())
    )


def as_option(name: str, value: str) -> str:
    """``NAME=VALUE`` as ``--backend-env`` reads it back as this one setting: a comma in it escaped."""
    return f"{name}={value}".replace(",", "\\,")


class Rejected(Exception):
    """A group would not start in a configuration, its ranks raising (not crashing or hanging): the backend
    rejected the setting. The configuration's tests are N/A, with the backend's words."""

    def __init__(self, configuration: Configuration, backend: str, words: str) -> None:
        super().__init__(f"N/A with {configuration.id}: {backend} rejected it ({words})")
        self.configuration = configuration
        self.words = words


def of_item(item: pytest.Item) -> Configuration:
    """The configuration ``item`` runs in (the ``backend_env`` parameter; a plain run's where it has none)."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("backend_env", Configuration()) if callspec else Configuration()


def plain_id(nodeid: str, configuration_id: str) -> str:
    """``nodeid`` as a plain run (no --backend-env) names it, its configuration's id taken out (it follows
    the world size's: ``[ws2-NCCL_PROTO=LL-all_reduce]``): what a known-bug manifest names."""
    if not configuration_id:
        return nodeid
    return nodeid.replace(f"-{configuration_id}-", "-").replace(f"-{configuration_id}]", "]")


@pytest.fixture(scope="session")
def backend_env(request: pytest.FixtureRequest) -> Configuration:
    """The configuration the test runs in; a session-scoped fixture that depends on it (the probe of the
    backend) is then set up once per configuration."""
    return getattr(request, "param", Configuration())
