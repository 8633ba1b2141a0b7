"""Every place a run says its verdict, read back and held to one status a check: the closing verdicts of
the terminal, the exit status, the node report's report.json, report.md, report.xml and report.html, and
the gate's gate.json and gate.md (--gate-report)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from xml.etree import ElementTree

STATUS = r"PASS|N/A|NOT JUDGED|WARN|FAIL"
_LINE = re.compile(rf"(.+?): ({STATUS}), ")
_MD_ROW = re.compile(rf"^\| ({STATUS}) \| (.+?) \| ", re.MULTILINE)  # the checks' table: status first
_HTML_ROW = re.compile(r'<tr><td><span class="pill [^"]+">([^<]+)</span></td><td class=name>(.*?)</td>')


def terminal(out: str) -> dict[str, str]:
    """The closing verdicts (`name: STATUS, words`, a wrapped one's later lines indented): name -> status."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "collectives: verdicts" in line)
    said: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if line.startswith(("=", "-")):
            break
        if line.startswith(" ") or not line:  # a wrapped verdict's later line, or xdist's blank one
            continue
        m = _LINE.match(line)
        assert m, f"a closing verdict not of the form 'name: STATUS, words': {line!r}"
        assert m[1] not in said, f"two verdicts named {m[1]!r}"
        said[m[1]] = m[2]
    return said


def _junit(path: Path) -> dict[str, str]:
    found = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        prop = case.find("properties/property[@name='status']")
        found[case.get("name")] = "FAIL" if case.find("failure") is not None else prop.get("value")
    return found


def _unmarked(text: str) -> str:
    return html.unescape(re.sub(r"</?code>", "", text))


def report_views(folder: Path) -> dict[str, dict[str, str]]:
    """Each file of a node report: check name -> status, and its overall verdict under "node report"."""
    report = json.loads((folder / "report.json").read_text())
    views = {
        "report.json": {c["name"]: c["status"] for c in report["checks"]},
        "report.md": {name.replace("\\|", "|").strip("`"): status
                      for status, name in _MD_ROW.findall((folder / "report.md").read_text())},
        "report.xml": _junit(folder / "report.xml"),
        "report.html": {_unmarked(name): status
                        for status, name in _HTML_ROW.findall((folder / "report.html").read_text())},
    }  # fmt: skip
    for name, view in views.items():
        assert len(view) == len(report["checks"]), (name, view, report["checks"])
        view["node report"] = report["verdict"]
    return views


def counted(text: str) -> dict[str, int]:
    """``3 passed, 1 error, 2 xfailed``: outcome -> count (``error`` as ``errors``)."""
    found = re.finditer(r"(\d+) (passed|failed|errors?|skipped|xfailed)\b", text)
    return {("errors" if m[2].startswith("error") else m[2]): int(m[1]) for m in found}


def assert_one_verdict(out: str, ret: int, folder: Path | None = None, gate: Path | None = None) -> None:
    """The terminal's closing verdicts, the exit status and every file the run wrote give each check one
    status: a FAIL wherever the run failed, and none where it passed; the test run's counts are pytest's."""
    said = terminal(out)
    if "test run" in said:
        line = next(line for line in out.splitlines() if line.startswith("test run: "))
        final = [line for line in out.splitlines() if re.match(r"=+ .* in [\d.]+s", line)][-1]
        assert counted(line) == counted(final.split(" in ")[0]), (line, final)
    if ret in (0, 1):
        assert (ret == 1) == ("FAIL" in said.values()), (ret, said)
    if folder is not None and (folder / "report.json").exists():
        for name, view in report_views(folder).items():
            assert view == said, (name, view, said)
    if gate is not None and (gate / "gate.json").exists():
        data = json.loads((gate / "gate.json").read_text())
        assert data["status"] == said["performance gate"], (data["status"], said)
        assert (gate / "gate.md").read_text().startswith(f"## collectives gate: {data['status']}\n")
