"""report.xml: the node report's verdicts as JUnit XML, which every CI system and test dashboard reads.

One testcase per check. JUnit has no warning outcome, so a WARN passes with its reason in system-out and a
`status` property that a fleet dashboard can filter on; only FAIL is a failure, and a check with nothing to
judge (NOT JUDGED) is skipped, as a test that could not run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from xml.etree import ElementTree

from pytest_collectives.verdict import FAIL, NA, NOT_JUDGED, TABLE, Check


def render_junit(report: Mapping[str, Any]) -> str:
    """The verdicts as JUnit XML, one testcase per check: FAIL is a failure, N/A and NOT JUDGED skipped;
    WARN passes with its reason in system-out and a `status` property (JUnit has no warning outcome; a fleet
    dashboard can filter on it)."""
    checks = [Check(**c) for c in report["checks"]]
    suite = ElementTree.Element(
        "testsuite",
        name="node-report",
        tests=str(len(checks)),
        failures=str(sum(c.status == FAIL for c in checks)),
        errors="0",
        skipped=str(sum(c.status in (NA, NOT_JUDGED) for c in checks)),
        timestamp=report["created"],
        hostname=report.get("host", ""),
    )
    properties = ElementTree.SubElement(suite, "properties")
    ElementTree.SubElement(properties, "property", name="topology_id", value=report["topology_id"])
    ElementTree.SubElement(properties, "property", name="verdict", value=report["verdict"])
    for key, value in report.get("run", {}).items():  # what ran, to run it again
        ElementTree.SubElement(properties, "property", name=key, value="" if value is None else value)
    for check in checks:
        case = ElementTree.SubElement(
            suite, "testcase", classname=f"node-report.{report['topology_id']}", name=check.name, time="0"
        )
        listing = ""
        if table := check.details.get(TABLE):
            listing = "\n" + "\n".join("  ".join(map(str, row)) for row in table["rows"])
        if check.status == FAIL:
            failure = ElementTree.SubElement(case, "failure", message=check.reason, type=FAIL)
            failure.text = check.reason + listing
        else:
            if check.status in (NA, NOT_JUDGED):
                ElementTree.SubElement(case, "skipped", message=check.reason)
            status = ElementTree.SubElement(ElementTree.SubElement(case, "properties"), "property")
            status.set("name", "status")
            status.set("value", check.status)
            ElementTree.SubElement(case, "system-out").text = f"{check.status}: {check.reason}{listing}"
    root = ElementTree.Element("testsuites", name="pytest-collectives node report")
    root.append(suite)
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"
