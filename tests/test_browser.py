"""The node report opened in a real headless browser: Debian's chromium, driven by Playwright.

What a string check of the HTML cannot see: that every plot decodes and shows, that the verdict table is on
the page, that the browser logs no error, and that the page's Content-Security-Policy keeps its offline
promise (nothing is fetched from anywhere). A full-page screenshot is left for a reviewer in
$COLLECTIVES_ARTIFACTS, or build/artifacts/ in the checkout.

The browser is /usr/bin/chromium (`apt-get install chromium` on Debian; .ci/run installs it), or the one
$COLLECTIVES_CHROMIUM names. Playwright's own browser download (`playwright install`) is not used: it cannot
work on a closed network. Without the browser or the playwright package these tests skip, except under CI
(the CI variable set), where they fail, so that CI never skips them silently.

Another page is checked the same way with the `open_in_browser` fixture and `check_page`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import gpu_data

from pytest_collectives.nodereport.outputs.write import write_report

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VIEWPORT = {"width": 1280, "height": 900}

# Headless chromium on these machines: no sandbox (root in a container), no GPU, and none of the
# background connections (updates, sync, QUIC) that a closed network refuses.
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

INSTALL_HINT = (
    "install them with `apt-get install -y --no-install-recommends chromium` (Debian; .ci/run does this) "
    "and `pip install -e .[test]` (brings playwright); `playwright install` is not needed"
)


def in_ci() -> bool:
    """Whether the CI variable is set (tox passes it through); empty, 0, false or no count as unset."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def chromium_path() -> str:
    return os.environ.get("COLLECTIVES_CHROMIUM") or CHROMIUM


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package is not installed")
    path = chromium_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        missing.append(f"no chromium at {path}")
    return "; ".join(missing) or None


def require_browser() -> None:
    """Skip when the browser is missing, or fail under CI, saying how to install it."""
    reason = browser_missing()
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"CI is set and the browser tests cannot run: {reason}; {INSTALL_HINT}", pytrace=False)
    pytest.skip(f"browser tests need chromium and playwright: {reason}; {INSTALL_HINT}")


@pytest.fixture(scope="session")
def browser():
    require_browser()
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=LAUNCH_ARGS)
        yield browser
        browser.close()
    finally:
        playwright.stop()


@dataclass
class PageLog:
    """What a page did while it was open."""

    errors: list[str] = field(default_factory=list)  # console errors and uncaught page errors
    requests: list[str] = field(default_factory=list)  # every request it tried, blocked ones too
    routed: list[str] = field(default_factory=list)  # requests past the page's own policy: network-bound


def _local_only(route, log: PageLog) -> None:
    """Let file:// through and abort anything else, so no test can reach the network."""
    log.routed.append(route.request.url)
    if route.request.url.startswith("file:"):
        route.continue_()
    else:
        route.abort()


@pytest.fixture
def open_in_browser(browser):
    """open_in_browser(path) -> (page, log): the file loaded (images included) in a fresh context."""
    contexts = []

    def open_(path: Path):
        context = browser.new_context(viewport=VIEWPORT)
        contexts.append(context)
        log = PageLog()
        context.route("**/*", lambda route: _local_only(route, log))
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.on("console", lambda msg: msg.type == "error" and log.errors.append(f"console: {msg.text}"))
        page.on("pageerror", lambda error: log.errors.append(f"page error: {error}"))
        page.on("request", lambda request: log.requests.append(request.url))
        page.goto(Path(path).resolve().as_uri(), wait_until="load")
        return page, log

    yield open_
    for context in contexts:
        context.close()


IMAGES_JS = """() => Array.from(document.images, (img, index) => ({
    index, title: img.title || img.alt, src: img.getAttribute('src').slice(0, 40),
    complete: img.complete, width: img.naturalWidth, height: img.naturalHeight}))"""


def images(page) -> list[dict]:
    return page.evaluate(IMAGES_JS)


def broken_images(page) -> list[dict]:
    """The <img> elements that did not load: not complete, or decoded to nothing."""
    return [img for img in images(page) if not (img["complete"] and img["width"] > 0)]


def local_only(urls: list[str]) -> bool:
    return all(url.startswith(("file:", "data:")) for url in urls)


def check_page(page, log: PageLog, expected_images: int) -> None:
    """Every image shown, none missing; no error logged; nothing asked of the network."""
    assert len(images(page)) == expected_images, images(page)
    assert broken_images(page) == []
    assert log.errors == []
    assert local_only(log.requests), log.requests
    assert local_only(log.routed), log.routed


def artifacts_dir() -> Path:
    folder = Path(os.environ.get("COLLECTIVES_ARTIFACTS") or REPO / "build" / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshot(page, name: str) -> Path:
    """A full-page PNG in the artifacts folder, for a reviewer; returns its path."""
    path = artifacts_dir() / name
    page.screenshot(path=str(path), full_page=True)
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000
    print(f"\nscreenshot: {path} ({len(data)} bytes)")
    return path


def png_size(data: bytes) -> tuple[int, int]:
    return struct.unpack(">II", data[16:24])


# ---------------------------------------------------------------------------------------------------------
# The node report

SLOW_LINK = "link GPU2<->GPU3"


def failing_gpu_data() -> dict:
    """The 8-GPU node with a slow NV4 link planted, a benchmark regression, and a failed test."""
    data = gpu_data()
    data["p2p"]["matrix"][2][3] = data["p2p"]["matrix"][3][2] = 40.0
    data["baseline"]["rows"][0].update(ratio=1.3, now_median_s=0.013, verdict="regression")
    for row in data["collectives"]:  # all_gather a little slower: its line is not hidden under all_reduce
        if row["name"] == "all_gather":
            row.update(busbw_GBps=row["busbw_GBps"] * 0.8, algbw_GBps=row["algbw_GBps"] * 0.8)
    failure = {"nodeid": "suites/test_p2p.py::test_copy[2-3]", "longrepr": "E  assert 40.0 >= 80.0"}
    data["tests"] = {"passed": 11, "failed": 1, "skipped": 1, "failures": [failure]}
    # the run's checks, as the run judged them
    data["run_checks"] = [
        {"name": "test run", "status": "FAIL", "reason": "11 passed, 1 failed, 1 skipped", "details": {}},
        {"name": "performance gate", "status": "FAIL", "reason": "1 confirmed regression(s)", "details": {}},
    ]
    return data


@pytest.fixture(scope="module")
def failing_report(tmp_path_factory) -> dict[str, Path]:
    return write_report(tmp_path_factory.mktemp("browser"), failing_gpu_data())


def written_plots(files: dict[str, Path]) -> list[str]:
    report = json.loads(files["report.json"].read_text())
    return [plot["file"] for plot in report["plots"] if plot["written"]]


def test_node_report_shows_in_the_browser(failing_report, open_in_browser):
    plots = written_plots(failing_report)
    assert sorted(plots) == ["baseline_comparison.png", "busbw_vs_size.png", "p2p_bandwidth.png"]
    page, log = open_in_browser(failing_report["report.html"])
    check_page(page, log, expected_images=len(plots))
    assert page.get_by_text("Overall verdict: FAIL").is_visible()
    for check in (SLOW_LINK, "performance gate", "test run"):
        row = page.locator("tr").filter(has=page.locator("td", has_text=check))
        assert row.count() >= 1, check
        assert row.first.locator("td").first.inner_text().strip() == "FAIL", check
    shot = screenshot(page, "node_report.png")
    width, height = png_size(shot.read_bytes())
    assert width == VIEWPORT["width"] and height > VIEWPORT["height"]  # the whole page, not the viewport


def test_node_report_fetches_nothing(failing_report, open_in_browser):
    page, log = open_in_browser(failing_report["report.html"])
    assert log.requests and log.routed  # the page itself was seen: the log works
    assert local_only(log.requests) and local_only(log.routed), (log.requests, log.routed)
    # Whatever the page might be made to load later, its Content-Security-Policy blocks it in the browser.
    page.evaluate(
        """() => { const img = document.createElement('img');
                   img.src = 'https://example.invalid/beacon.png'; document.body.append(img); }"""
    )
    page.wait_for_timeout(300)
    assert "https://example.invalid/beacon.png" in log.requests
    assert local_only(log.routed), log.routed  # never got past the policy
    assert any("Content Security Policy" in error for error in log.errors), log.errors


# ---------------------------------------------------------------------------------------------------------
# The checks themselves catch what they are for


def plant_broken_image(html_path: Path) -> None:
    """Break the page's first image: a PNG signature and nothing decodable after it."""
    page = html_path.read_text()
    src = re.search(r"<img\b[^>]*\bsrc=\"([^\"]+)\"", page).group(1)
    broken = PNG_MAGIC + b"not an image"
    if src.startswith("data:"):
        page = page.replace(src, "data:image/png;base64," + base64.b64encode(broken).decode(), 1)
        html_path.write_text(page)
    else:
        (html_path.parent / src).write_bytes(broken)


def test_a_broken_image_is_caught(tmp_path, open_in_browser):
    files = write_report(tmp_path, failing_gpu_data())
    plant_broken_image(files["report.html"])
    page, log = open_in_browser(files["report.html"])
    assert [img["index"] for img in broken_images(page)] == [0]
    with pytest.raises(AssertionError):
        check_page(page, log, expected_images=len(written_plots(files)))


def test_an_outside_request_is_seen_and_stopped(tmp_path, open_in_browser):
    page_path = tmp_path / "leaky.html"
    page_path.write_text('<!DOCTYPE html><title>leaky</title><img src="http://example.invalid/x.png">')
    page, log = open_in_browser(page_path)
    assert "http://example.invalid/x.png" in log.routed  # reached the route, which aborted it
    assert not local_only(log.requests)
    assert broken_images(page) and log.errors  # the aborted load shows as a broken image and an error


@pytest.mark.parametrize("ci", ["1", None], ids=["ci", "local"])
def test_a_missing_browser_fails_in_ci_and_skips_elsewhere(monkeypatch, tmp_path, ci):
    monkeypatch.setenv("COLLECTIVES_CHROMIUM", str(tmp_path / "no-chromium"))
    if ci:
        monkeypatch.setenv("CI", ci)
    else:
        monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.fail.Exception if ci else pytest.skip.Exception) as info:
        require_browser()
    message = str(info.value)
    assert f"no chromium at {tmp_path / 'no-chromium'}" in message
    assert "apt-get install -y --no-install-recommends chromium" in message and "pip install" in message


def test_a_missing_playwright_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # the import raises
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="the playwright package is not installed"):
        require_browser()


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("1", True), (None, False), ("", False), ("0", False), ("false", False)],
)
def test_what_counts_as_ci(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert in_ci() is expected


# ---------------------------------------------------------------------------------------------------------
# The fleet page


def test_fleet_page_shows_in_the_browser(tmp_path, open_in_browser):
    import random

    from test_fleet import SICK, SLOW_GPU, memory_fleet, node_data

    from pytest_collectives.nodereport.fleet import stats as fleetstats
    from pytest_collectives.nodereport.fleet import write as fleetwrite
    from pytest_collectives.nodereport.fleet.reading import report_figures

    nodes = [n for n in memory_fleet(random.Random(3)) if n.name != SICK]
    sick = report_figures(node_data(random.Random(4), slow_gpu=SLOW_GPU))
    nodes.append(fleetstats.Node(SICK, f"{SICK}/report.json", nodes[0].topology_id, sick))
    files = fleetwrite.write_fleet(tmp_path, fleetstats.judge_fleet(nodes))
    page, log = open_in_browser(files["fleet.html"])
    check_page(page, log, expected_images=0)
    assert page.get_by_text("FAIL: 1 of 16 nodes fail").is_visible()
    row = page.locator("tr").filter(has=page.locator("td", has_text=SICK))
    assert row.first.locator("td").nth(1).inner_text().strip() == "FAIL"
    screenshot(page, "fleet.png")
