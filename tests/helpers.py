"""What several test modules share: how they load the plugin in a subprocess, a CPU fingerprint, JUnit
outcomes."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

from pytest_collectives.topology import Fingerprint

# Load the plugin by module name, so a checkout's copy on PYTHONPATH wins over an installed one.
PLUGIN = ["-p", "no:collectives", "-p", "pytest_collectives.hooks", "-p", "no:cacheprovider"]


def cpu_fingerprint(**changes: object) -> Fingerprint:
    """The CI machine's fingerprint (gloo on a 2-core EPYC), with ``changes``."""
    fp = Fingerprint(
        backend="gloo",
        torch_version="2.13.0+cpu",
        cpu_model="AMD EPYC 7B13 64-Core Processor",
        logical_cores=2,
        sockets=1,
        numa_nodes=1,
    )
    return dataclasses.replace(fp, **changes)


def outcomes(junit: Path) -> dict[str, str]:
    """Test name -> passed, failure, error or skipped, from a --junitxml file."""
    result = {}
    for case in ET.parse(junit).iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        result[case.get("name")] = kinds[0] if kinds else "passed"
    return result
