"""The node report's option: declared, read and checked here once, when pytest configures."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_collectives.errors import OptionError
from pytest_collectives.option import Option

NODE_REPORT = Option(
    "node_report", "write a node validation report (report.html, report.json, plots) into DIR", metavar="DIR"
)
OPTIONS = (NODE_REPORT,)


def read(config: pytest.Config) -> Path | None:
    """The folder to write the report into; None without --node-report."""
    given = NODE_REPORT.value(config)
    if not given:
        return None
    directory = Path(given)
    if directory.exists() and not directory.is_dir():
        raise OptionError(f"--node-report {given}: is a file; name a folder to write into")
    return directory
