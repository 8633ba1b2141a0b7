"""The fleet view: nodes of one topology judged against the fleet's median, the same in any input order.

Fleets are simulated from the seed 8 x RTX 3090 matrix (tests/data) with seeded noise per figure; reports
are written with node_report.write_report (plots skipped: they are not what is read) and read back from disk.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers import gpu_data
from test_preflight import FakeNvml, hgx

from pytest_collectives.nodereport.fleet import cli as fleet
from pytest_collectives.nodereport.fleet import stats as fleetstats
from pytest_collectives.nodereport.fleet import write as fleetwrite
from pytest_collectives.nodereport.fleet.reading import load_reports, report_figures
from pytest_collectives.nodereport.fleet.stats import judge_fleet
from pytest_collectives.nodereport.fleet.write import render_html, to_json
from pytest_collectives.nodereport.judging.nvml import read_nvml
from pytest_collectives.nodereport.judging.verdicts import report_checks
from pytest_collectives.nodereport.outputs import plots
from pytest_collectives.nodereport.outputs import write as node_report
from pytest_collectives.nodereport.outputs.schema import ReportError, validate_data

NODES = 16
SICK = "node07"  # the degraded node of the simulated fleets
SLOW_GPU = 3
SLOW_LINK = (0, 1)  # an NV4 pair
SEED = gpu_data()  # the 8 x RTX 3090 node of tests/data: its matrix, collectives and benchmark rows
TOPOLOGY = SEED["topology_id"]


def node_data(
    rng: random.Random,
    noise: float = 0.05,
    slow_gpu: int | None = None,
    slow_link: tuple[int, int] | None = None,
    factor: float = 0.6,
) -> dict:
    """write_report's data for one node: every figure of the seed node times 1 +- `noise` (uniform), and
    `factor` on the links of `slow_gpu` and on `slow_link`."""

    def noisy(value: float) -> float:
        return value * rng.uniform(1 - noise, 1 + noise)

    def scale(i: int, j: int) -> float:
        return factor if slow_gpu in (i, j) or {i, j} == set(slow_link or ()) else 1.0

    p2p = SEED["p2p"]
    matrix = [
        [noisy(v) * (1.0 if i == j else scale(i, j)) for j, v in enumerate(row)]
        for i, row in enumerate(p2p["matrix"])
    ]
    collectives = []
    for row in SEED["collectives"]:
        busbw = noisy(row["busbw_GBps"])
        # Named as the session names them: the algorithm and the world size.
        collectives.append(
            {**row, "name": f"{row['name']} n=8", "busbw_GBps": busbw, "algbw_GBps": busbw / 2}
        )
    rows = []
    for row in SEED["baseline"]["rows"]:
        now = noisy(row["now_median_s"])
        rows.append({**row, "now_median_s": now, "ratio": now / row["baseline_median_s"]})
    # The fingerprint is shared, not copied: nothing writes to it, and 3200 copies would cost seconds.
    return {
        **SEED,
        "p2p": {**p2p, "matrix": matrix},
        "collectives": collectives,
        "baseline": {**SEED["baseline"], "rows": rows},
    }


def write_node(folder: Path, data: dict, host: str | None = None) -> str:
    """The real report.json of `data` (with its `host`) in `folder`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "_can_draw", lambda: False)  # the plots are not read, and cost seconds
        return str(
            node_report.write_report(folder, {**data, **({"host": host} if host else {})})["report.json"]
        )


def write_fleet(
    root: Path, seed: int, sick: dict | None = None, hosts: dict[str, str] | None = None
) -> list[str]:
    """NODES reports under root/nodeNN/; SICK degraded as `sick` says (node_data's keywords)."""
    rng = random.Random(seed)
    paths = []
    for k in range(NODES):
        name = f"node{k:02d}"
        data = node_data(rng, **(sick if sick and name == SICK else {}))
        paths.append(write_node(root / name, data, (hosts or {}).get(name)))
    return paths


def memory_fleet(rng: random.Random, noise: float = 0.05) -> list[fleetstats.Node]:
    """Healthy nodes straight from their data, for loops too long to write files in."""
    return [
        fleetstats.Node(
            f"node{k:02d}", f"node{k:02d}/report.json", TOPOLOGY, report_figures(node_data(rng, noise))
        )
        for k in range(NODES)
    ]


def named(result: fleetstats.FleetResult) -> dict[str, str]:
    """The nodes the fleet names (any outlier figure), with their verdicts."""
    return {n.name: n.verdict for n in result.nodes if n.outliers}


def dumps(result: fleetstats.FleetResult) -> str:
    return json.dumps(to_json(result), indent=2, sort_keys=True) + "\n"


@pytest.fixture(scope="module", params=["gpu", "link"])
def sick_fleet(request, tmp_path_factory) -> tuple[str, list[str]]:
    sick = {"slow_gpu": SLOW_GPU} if request.param == "gpu" else {"slow_link": SLOW_LINK}
    return request.param, write_fleet(tmp_path_factory.mktemp(request.param), 11, sick)


# ---------------------------------------------------------------------------------------------------------
# The proof: one degraded node among 16, in 100 of 100 orders


def test_degraded_node_is_the_only_one_named_in_any_order(sick_fleet):
    kind, paths = sick_fleet
    nodes = load_reports(paths)
    reference = judge_fleet(nodes)
    assert named(reference) == {SICK: "FAIL"}
    sick = next(n for n in reference.nodes if n.name == SICK)
    figures = {c.name for c in sick.outliers}
    if kind == "gpu":
        # Every directed pair touching GPU3, both ways, is named; nothing else of the matrix.
        pairs = {f"p2p GPU{SLOW_GPU}->GPU{k}" for k in range(8) if k != SLOW_GPU}
        pairs |= {f"p2p GPU{k}->GPU{SLOW_GPU}" for k in range(8) if k != SLOW_GPU}
        assert {f for f in figures if "->" in f} == pairs
    else:
        assert figures == {"p2p GPU0->GPU1", "p2p GPU1->GPU0"}
    assert all(0.5 < c.details["ratio"] < 0.7 and c.details["z"] > 3.5 for c in sick.outliers)
    expected = dumps(reference)
    rng = random.Random(2024)
    for _ in range(100):
        shuffled = nodes[:]
        rng.shuffle(shuffled)
        result = judge_fleet(shuffled)
        assert named(result) == {SICK: "FAIL"}
        assert dumps(result) == expected


def test_cli_writes_identical_files_in_any_order(sick_fleet, tmp_path, capsys):
    _, paths = sick_fleet
    expected = dumps(judge_fleet(load_reports(paths)))
    rng = random.Random(7)
    for k in range(3):
        order = paths[:]
        rng.shuffle(order)
        assert fleet.main([*order, "--out", str(tmp_path / str(k))]) == 1
        assert (tmp_path / str(k) / "fleet.json").read_text() == expected
        assert (tmp_path / str(k) / "fleet.html").read_bytes() == (tmp_path / "0" / "fleet.html").read_bytes()
    out = capsys.readouterr().out
    assert f"FAIL {SICK}:" in out and out.count("FAIL node") == 3
    document = json.loads(expected)
    assert document["verdict"] == "FAIL" and document["topology_id"] == TOPOLOGY
    assert document["counts"] == {"FAIL": 1, "WARN": 0, "NOT JUDGED": 0, "N/A": 0, "PASS": NODES - 1}
    assert [n["name"] for n in document["nodes"]] == [f"node{k:02d}" for k in range(NODES)]
    assert (document["fail_below"], document["warn_below"]) == (0.75, 0.9)
    outlier = next(n for n in document["nodes"] if n["name"] == SICK)["outliers"][0]
    assert set(outlier) >= {"figure", "status", "value", "fleet_median", "ratio", "z"}
    assert document["medians"][outlier["figure"]]["median"] == outlier["fleet_median"]


def test_the_fleet_command_as_typed(sick_fleet, tmp_path):
    """``collectives-fleet``, the console script the package installs beside its Python."""
    _, paths = sick_fleet
    out = tmp_path / "new" / "dir"  # created
    command = Path(sys.executable).parent / "collectives-fleet"
    run = subprocess.run(
        [str(command), *paths, "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1, run.stderr
    assert run.stderr == "" and (out / "fleet.json").is_file() and (out / "fleet.html").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["fleet.html", "fleet.json"]  # no temp files left


# ---------------------------------------------------------------------------------------------------------
# Healthy fleets, and the rule's two halves


@pytest.mark.parametrize(("noise", "fleets"), [(0.05, 200), (0.15, 50)])
def test_healthy_fleets_name_no_node(noise, fleets):
    # At +-15% a dozen nodes' MAD often comes out at a third of the true spread: the kind's typical spread
    # keeps such a figure from naming a healthy node (without it, about half of these fleets warned).
    rng = random.Random(5)
    for _ in range(fleets):
        result = judge_fleet(memory_fleet(rng, noise))
        assert named(result) == {} and result.verdict == "PASS"


def flat_fleet(values: list[float], direction: str = fleetstats.HIGHER) -> list[fleetstats.Node]:
    return [
        fleetstats.Node(f"n{k}", f"n{k}/report.json", "t", {"f": fleetstats.Figure(v, direction, "x")})
        for k, v in enumerate(values)
    ]


def verdicts(nodes: list[fleetstats.Node]) -> dict[str, str]:
    return {n.name: n.verdict for n in judge_fleet(nodes).nodes}


def test_fraction_alone_decides_without_spread():
    assert verdicts(flat_fleet([10, 10, 10, 10, 8.5])) == {f"n{k}": "PASS" for k in range(4)} | {"n4": "WARN"}
    assert verdicts(flat_fleet([10, 10, 10, 7]))["n3"] == "FAIL"
    assert verdicts(flat_fleet([10, 10, 10, 9.5]))["n3"] == "PASS"  # 95%: within the lines


def test_both_rules_must_hold():
    # Far out in z (the fleet is tight) but only 8% below: not named.
    assert verdicts(flat_fleet([10.0, 10.01, 9.99, 10.0, 10.02, 9.2]))["n5"] == "PASS"
    # 20% below, in a fleet spread evenly from 80% to 120%: z is 1.3, so not named.
    spread = verdicts(flat_fleet([8 + 4 * k / 15 for k in range(16)]))
    assert set(spread.values()) == {"PASS"}
    # 30% below, but the fleet spreads as much: z = 0.6745 * 3 / 3 < 3.5.
    assert verdicts(flat_fleet([10, 13, 7, 10, 13, 7, 7.0]))["n6"] == "PASS"
    # 30% below a tight fleet: FAIL.
    assert verdicts(flat_fleet([10, 10.1, 9.9, 10, 10.1, 9.9, 7.0]))["n6"] == "FAIL"


def test_times_are_better_lower():
    times = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0]  # with a 7th node, the median is 1.0
    slow = verdicts(flat_fleet([*times, 1.6], fleetstats.LOWER))
    fast = verdicts(flat_fleet([*times, 0.6], fleetstats.LOWER))
    assert slow["n6"] == "FAIL" and set(fast.values()) == {"PASS"}
    result = judge_fleet(flat_fleet([*times, 1.6], fleetstats.LOWER))
    check = result.nodes[-1].outliers[0]
    assert check.details["ratio"] == round(1.0 / 1.6, 4)  # a speed ratio
    assert check.details["value"] == 1.6 and check.details["fleet_median"] == 1.0


def test_figures_of_fewer_than_three_nodes_are_not_judged():
    nodes = flat_fleet([10, 10, 10, 10])
    odd = [fleetstats.Node(n.name, n.path, n.topology_id, {**n.figures}) for n in nodes]
    odd[0] = fleetstats.Node(
        "n0", "n0/report.json", "t", {**nodes[0].figures, "g": fleetstats.Figure(1, "higher", "x")}
    )
    odd[1] = fleetstats.Node(
        "n1", "n1/report.json", "t", {**nodes[1].figures, "g": fleetstats.Figure(9, "higher", "x")}
    )
    result = judge_fleet(odd)
    assert result.unjudged == ("g",) and result.verdict == "PASS" and list(result.stats) == ["f"]


def test_figures_of_a_report():
    figures = report_figures(node_data(random.Random(1), noise=0.0))
    assert figures["p2p GPU0->GPU1"] == fleetstats.Figure(101.78, "higher", "GB/s")
    assert figures["p2p class NV4 median"].value == pytest.approx((101.65 + 101.68) / 2)
    assert "p2p GPU0->GPU0" not in figures
    assert figures["busbw all_reduce n=8 @ 4 MiB"].value == pytest.approx(7.0 * 4 / 5)
    assert figures["time test_all_reduce[64MiB]"] == fleetstats.Figure(0.01 * 0.92, "lower", "s")
    assert len(figures) == 56 + 2 + 10 + 2
    empty = {"p2p": None, "collectives": [], "baseline": {"available": False, "path": None, "rows": []}}
    assert report_figures(empty) == {}


# ---------------------------------------------------------------------------------------------------------
# Names


def test_nodes_are_named_by_host_then_folder_then_path(tmp_path):
    rng = random.Random(3)
    paths = [
        write_node(tmp_path / "a", node_data(rng), host="gpu-a.example"),
        write_node(tmp_path / "b", node_data(rng)),
        write_node(tmp_path / "c" / "b", node_data(rng)),  # the same folder name as the one before
        write_node(tmp_path / "d", node_data(rng), host="twin"),
        write_node(tmp_path / "e", node_data(rng), host="twin"),
    ]
    expected = {
        paths[0]: "gpu-a.example",
        paths[1]: paths[1],
        paths[2]: paths[2],
        paths[3]: paths[3],
        paths[4]: paths[4],
    }
    for _ in range(10):  # no node keeps a shared name for coming first
        rng.shuffle(paths)
        assert {n.path: n.name for n in load_reports(paths)} == expected
    paths.append(write_node(tmp_path / "f", node_data(rng)))
    assert {n.path: n.name for n in load_reports(paths)}[paths[-1]] == "f"


def test_one_host_given_twice_is_warned_of(tmp_path, capsys):
    """Two reports of one host (a node run twice, or its report copied) count it twice in every median:
    the fleet says so, and still judges what it was given."""
    rng = random.Random(5)
    paths = [write_node(tmp_path / name, node_data(rng), host=f"{name}.example") for name in "abcd"]
    paths.append(write_node(tmp_path / "a-again", node_data(rng), host="a.example"))
    fleet.main([*paths, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.splitlines()
    given = ", ".join(sorted([paths[0], paths[-1]]))
    assert err == [
        f"fleet: warning: a.example: 2 reports of this one host ({given}); its figures count 2 times in the "
        "fleet's medians: give one report a node"
    ]
    fleet.main([*paths[:-1], "--out", str(tmp_path / "out")])
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------------------
# Bad inputs: one line naming the file, exit 2


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> list[str]:
    return write_fleet(tmp_path_factory.mktemp("good"), 1)[:3]


def bad_file(tmp_path: Path, content: str | bytes) -> str:
    path = tmp_path / "bad" / "report.json"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def other_topology(tmp_path: Path, good: list[str]) -> str:
    report = json.loads(Path(good[0]).read_text())
    report["topology_id"] = "gpu-4x-h100-nv18-deadbeef"
    return bad_file(tmp_path, json.dumps(report))


def bad_field(tmp_path: Path, good: list[str]) -> str:
    report = json.loads(Path(good[0]).read_text())
    report["collectives"][0]["busbw_GBps"] = "fast"
    return bad_file(tmp_path, json.dumps(report))


CASES = {
    "missing": (lambda tmp, good: str(tmp / "nowhere" / "report.json"), "cannot read it"),
    "directory": (lambda tmp, good: str(tmp), "cannot read it"),
    "bad json": (lambda tmp, good: bad_file(tmp, '{"topology_id": '), "not valid JSON"),
    "bad utf-8": (lambda tmp, good: bad_file(tmp, b"\xff\xfe{}"), "not valid JSON"),
    "deep json": (lambda tmp, good: bad_file(tmp, "[" * 100000), "not valid JSON"),
    "a list": (lambda tmp, good: bad_file(tmp, "[1, 2]"), "not a node report ((top level) must be object"),
    "other json": (lambda tmp, good: bad_file(tmp, '{"verdict": "PASS"}'), "not a node report"),
    "bad field": (bad_field, "collectives[0].busbw_GBps must be number"),
    "nan": (
        lambda tmp, good: bad_file(
            tmp, Path(good[0]).read_text().replace('"busbw_GBps": ', '"busbw_GBps": NaN, "x": ', 1)
        ),
        "not a node report",
    ),
    "topology": (other_topology, "differs from"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_naming_the_file(case, good, tmp_path, capsys):
    make, message = CASES[case]
    path = make(tmp_path, good)
    code = fleet.main([*good, path, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"fleet: {path}: ") and message in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_too_few_reports_and_repeats(good, tmp_path, capsys):
    assert fleet.main([*good[:2], "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and good[0] in err and good[1] in err and "at least 3" in err
    assert fleet.main([*good, good[0], "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"fleet: {good[0]}: given twice" in err


@pytest.mark.parametrize("lines", [["--fail-below", "0.95"], ["--warn-below", "1.5"], ["--fail-below", "x"]])
def test_bad_lines_are_one_line(lines, good, tmp_path, capsys):
    assert fleet.main([*good, *lines, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fleet: ") and "below" in err


def test_bad_input_from_the_command_line(good, tmp_path):
    missing = str(tmp_path / "gone.json")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_collectives.nodereport.fleet.cli",
            *good,
            missing,
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and run.stderr.startswith(f"fleet: {missing}: cannot read it")


def test_healthy_fleet_exits_zero(tmp_path, capsys):
    paths = write_fleet(tmp_path, 4)
    assert fleet.main([*paths, "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "fleet.json").read_text())["verdict"] == "PASS"


# ---------------------------------------------------------------------------------------------------------
# HTML


class Tables(HTMLParser):
    """The text of every table cell, table by table, and the tags seen."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[list[list[str]]] = []
        self.headings: list[str] = []
        self.tags: list[str] = []
        self.metas: list[dict] = []
        self._cell: list[str] | None = None
        self._heading: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "meta":
            self.metas.append(dict(attrs))
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "h2":
            self._heading = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "h2" and self._heading is not None:
            self.headings.append("".join(self._heading))
            self._heading = None

    def handle_data(self, data):
        for part in (self._cell, self._heading):
            if part is not None:
                part.append(data)


def test_html_names_the_outlier_and_escapes_data(tmp_path):
    host = "<script>alert(1)</script>"
    paths = write_fleet(tmp_path, 11, {"slow_gpu": SLOW_GPU}, hosts={SICK: host, "node02": "a&b"})
    result = judge_fleet(load_reports(paths))
    page = render_html(result)
    assert "<script" not in page.lower() and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "http://" not in page and "https://" not in page
    parser = Tables()
    parser.feed(page)
    parser.close()
    csp = [m["content"] for m in parser.metas if m.get("http-equiv") == "Content-Security-Policy"]
    assert csp == ["default-src 'none'; img-src data:; style-src 'unsafe-inline'"]
    assert "script" not in parser.tags
    nodes = parser.tables[0]
    assert nodes[0] == ["Node", "Verdict", "Outlier figures", "Figures judged"]
    by_name = {row[0]: row for row in nodes[1:]}
    assert len(by_name) == NODES and by_name[host][1:3] == ["FAIL", "14"] and "a&b" in by_name
    assert all(row[1:3] == ["PASS", "0"] for name, row in by_name.items() if name != host)
    # One table for the one outlier node, under its name, with its figures.
    assert parser.headings[1:] == [f"{host}: FAIL"] and len(parser.tables) == 2
    outliers = parser.tables[1]
    assert outliers[0][:4] == ["Figure", "Status", "Node value", "Fleet median"]
    assert f"p2p GPU{SLOW_GPU}->GPU0" in {row[0] for row in outliers[1:]}
    assert len(outliers) - 1 == 14 and all(row[1] == "FAIL" for row in outliers[1:])
    assert "Overall verdict: FAIL: 1 of 16 nodes fail" in page


# ---------------------------------------------------------------------------------------------------------
# Markup in any field of a report stays text, on the node's page and on the fleet's

# It closes a cell, opens a script, breaks out of an attribute quoted either way, and hides a tag in
# backticks, which the `code` filter turns into <code>: escaping after that rule would let the tag through.
HOSTILE = """</td><script>alert(1)</script>" onmouseover="alert(2)" x=' onfocus='alert(3)' """
HOSTILE += "`<img src=x onerror=alert(4)>`"
# Every (element, attribute) the templates write; data never adds one.
ATTRIBUTES = {
    ("html", "lang"), ("meta", "charset"), ("meta", "http-equiv"), ("meta", "content"), ("meta", "name"),
    ("div", "class"), ("span", "class"), ("p", "class"), ("th", "class"), ("td", "class"),
    ("img", "src"), ("img", "alt"), ("img", "title"), ("details", "open"), ("a", "href"), ("h2", "id"),
}  # fmt: skip


def string_fields(value, path=()):
    """(path, text) of every string in `value`, dict keys aside."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from string_fields(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from string_fields(item, (*path, i))


def put(data, path, value) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def plant_markup(data: dict) -> set[str]:
    """Set every string field of `data` that write_report takes as free text to HOSTILE plus a number;
    return the fields planted, list indices written []. A field of a fixed vocabulary (link classes,
    verdicts, the time) keeps its value: write_report refuses anything else there."""
    fields: dict[str, list] = {}
    for path, text in string_fields(data):
        field = "".join("[]" if isinstance(k, int) else f".{k}" for k in path)
        fields.setdefault(field, []).append((path, text))
    number = itertools.count()
    planted = set()
    for field, found in fields.items():
        for path, _ in found:
            put(data, path, f"{HOSTILE}{next(number)}")
        try:
            validate_data(data)
            report_checks(data)
        except ReportError:
            for path, text in found:
                put(data, path, text)
        else:
            planted.add(field)
    return planted


class Elements(HTMLParser):
    """Every element with its attributes, and the page's text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, list]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, attrs))

    def handle_data(self, data):
        self.text.append(data)


def assert_inert(page: str, images: int) -> Elements:
    parser = Elements()
    parser.feed(page)
    parser.close()
    assert "<script" not in page.lower()
    attributes = {(tag, name) for tag, attrs in parser.elements for name, _ in attrs}
    assert attributes <= ATTRIBUTES, attributes - ATTRIBUTES
    assert [tag for tag, _ in parser.elements].count("img") == images
    assert HOSTILE in "".join(parser.text)  # shown, as text
    return parser


def test_markup_in_any_field_stays_text(tmp_path, monkeypatch):
    # Images are inlined, but matplotlib is not what this reads, and it takes seconds over these labels.
    for plot in ("p2p_plot", "busbw_plot", "baseline_plot"):
        monkeypatch.setattr(plots, plot, lambda *args: b"\x89PNG\r\n\x1a\n")
    data = gpu_data()
    labels = [f"GPU{i}" for i in range(8)]
    latency = [[None if i == j else 2.0 for j in range(8)] for i in range(8)]
    data["p2p_latency"] = {"devices": labels, "matrix_us": latency}
    data["host_device"] = {"bytes": 1 << 28, "devices": labels, "series": {"h2d pinned": [25.0] * 7 + [10.0]}}
    failure = {"nodeid": "t.py::x", "longrepr": "E"}
    data["tests"] = {"passed": 1, "failed": 1, "skipped": 0, "failures": [failure]}
    data["baseline"]["rows"][0].update(ratio=1.3, now_median_s=0.013, verdict="regression")
    gpus = hgx()
    gpus[3].width = 8  # a preflight check names GPU3 by its model and bus id
    data["preflight"] = read_nvml(FakeNvml(gpus))
    data["host"] = "host"
    planted = plant_markup(data)
    assert planted >= {
        ".topology_id", ".host", ".fingerprint.cpu_model", ".fingerprint.gpus[].name", ".p2p.devices[]",
        ".p2p_latency.devices[]", ".host_device.devices[]", ".collectives[].name", ".baseline.path",
        ".baseline.rows[].benchmark", ".tests.failures[].nodeid", ".tests.failures[].longrepr",
        ".preflight.gpus[].name", ".preflight.gpus[].bus_id",
    }  # fmt: skip
    files = node_report.write_report(tmp_path / "node", data)
    assert_inert(files["report.html"].read_text(), images=3)

    # The fleet: its node names, paths, figure names (device labels, collectives, benchmarks) and topology
    # come from the reports. One node slow, for an outlier section; one with a figure alone, for "Not judged".
    paths = []
    for k in range(4):
        node = copy.deepcopy(data)
        if k == 3:
            node["p2p"]["matrix"] = [[v and v / 2 for v in row] for row in node["p2p"]["matrix"]]
        if k == 0:
            node["collectives"].append({**node["collectives"][0], "name": f"{HOSTILE}alone"})
        paths.append(write_node(tmp_path / f"{k}<b title='x'>", node, host=f"{HOSTILE}host{k}"))
    files = fleetwrite.write_fleet(tmp_path / "fleet", judge_fleet(load_reports(paths)))
    page = files["fleet.html"].read_text()
    parser = assert_inert(page, images=0)
    ids = [dict(attrs)["id"] for tag, attrs in parser.elements if tag == "h2" and attrs]
    assert ids == ["node-3"] and "Not judged" in parser.text
