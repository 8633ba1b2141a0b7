"""The docs are tests: every fenced block of README.md and docs/*.md runs here, or says in the page why it
can't (``<!-- not run here: REASON -->`` on the line above the fence, unseen where the page is read).

- A shell block's pytest commands are run as typed, in a copy of the checkout's suites beside an empty
  baselines/, with ``--collect-only``: every flag, value, path and module they name must be what the
  plugin takes (a renamed flag fails here). The jobs themselves run to the end in test_jobs.py.
- A Python block that defines tests runs them; a ``# conftest.py`` block is a conftest under a test; any
  other Python block runs as a script.
- A JSON block must parse; one shaped as a known-bugs entry must load as a manifest.
- A block of output (no language, or ``text``) says what printed it (test_jobs.py, or .ci/run's run of the
  suites, holds it to that run's output: docblocks.py), or why it is not run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from docblocks import ALL, DIRECTIVE, MARK, OUTPUT, PAGES, ROOT, SUITES_RUN, Block, commands, pytest_args
from helpers import PLUGIN, copy_checkout, copy_conformance, torch_below

from pytest_collectives.conformance.known_bugs import load


def of(*langs: str) -> list[pytest.param]:
    return [
        pytest.param(b, id=b.where, marks=[pytest.mark.skip(reason=b.not_run)] if b.not_run else [])
        for b in ALL
        if b.lang in langs
    ]


def test_every_block_is_run_or_says_why_not() -> None:
    """A block added to the docs is run by this module (a shell block's commands must be pytest's:
    wrong_commands), or the page says why it can't be."""
    runnable = {"sh", "python", "json", *OUTPUT}
    unknown = [b.where for b in ALL if b.lang not in runnable and not DIRECTIVE.fullmatch(b.lang)]
    assert not unknown, f"blocks in a language this module does not run: {unknown}"
    unsaid = [b.where for b in ALL if b.lang in OUTPUT and not (b.printed_by or b.not_run)]
    assert not unsaid, f"blocks of output that say neither what printed them nor why not run: {unsaid}"
    assert len(ALL) > 40 and sum(b.lang == "sh" and not b.not_run for b in ALL) > 5  # the pages were read


def test_the_set_up_commands_are_what_ci_runs() -> None:
    """The blocks left to .ci/run: each of their commands is one .ci/run calls, as typed."""
    ci = (ROOT / ".ci" / "run").read_text()
    left = [b for b in ALL if b.not_run == ".ci/run runs these two commands"]
    assert left
    for command in (" ".join(c) for b in left for c in commands(b.text)):
        ran = re.search(rf"^{re.escape(command)}( |$)", ci, re.MULTILINE)
        assert ran, f".ci/run does not run {command!r}"


def test_a_block_of_output_is_held_to_what_printed_it() -> None:
    """Printed by the suites' run: .ci/run holds it to that run's output (docblocks.main); by a test of the
    plugin: that test holds it to what its run printed."""
    for b in ALL:
        if b.printed_by and b.printed_by != SUITES_RUN:
            test = ROOT / b.printed_by.split()[0]
            assert test.is_file() and "unshown(" in test.read_text(), f"{b.where}: {b.printed_by}"
    assert any(b.printed_by == SUITES_RUN for b in ALL)
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^python3 tests/support/docblocks\.py \S+$", ci, re.MULTILINE)


def test_a_block_that_is_not_run_says_why() -> None:
    for page in PAGES:
        for line in page.read_text().splitlines():
            if re.match(r"\s*<!-- (not run here|printed by)", line):
                assert MARK.fullmatch(line.strip()), f"{page.name}: a mark without its reason: {line!r}"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's clone (helpers.copy_checkout), with the README's vendor module."""
    root = tmp_path_factory.mktemp("checkout")
    copy_checkout(root)
    (root / "acme_backend.py").write_text(ACME)
    return root


ACME = """
import torch.distributed as dist
from pytest_collectives import refuses
from pytest_collectives.refbackend import ReferenceBackend

class Acme(ReferenceBackend):
    name = "acme"

refuses("acme", like="gloo")
if "ACME" not in dist.Backend._plugins:
    dist.Backend.register_backend("acme", Acme, devices=["cpu"])
"""


def users_env(cwd: Path) -> dict[str, str]:
    """The environment a user's pytest runs in, in ``cwd``: pytest's own variables (PYTEST_CURRENT_TEST, an
    xdist worker's) are this session's, not the user's."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONPATH": str(cwd)}


def run_pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", *PLUGIN, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=users_env(cwd),
    )


# Every command's collection in a child forked from one process that imported, once, what each of them
# imports: torch's import is most of a collection's time (3 of its 5 CPU-seconds here).
_COLLECTOR = """
import json, os, sys, tempfile
import hypothesis, pytest, torch
import pytest_collectives.hooks
found = []
for args in json.loads(sys.stdin.read()):
    with tempfile.TemporaryFile() as out:
        child = os.fork()
        if child == 0:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            code = pytest.main(args)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(code))
        _, status = os.waitpid(child, 0)
        out.seek(0)
        found.append((os.waitstatus_to_exitcode(status), out.read().decode(errors="replace")))
print(json.dumps(found))
"""


def collections(cwd: Path, commands: list[tuple[str, ...]]) -> list[tuple[int, str]]:
    """Each pytest command's exit code and output, collected (``--collect-only -q``) in ``cwd``."""
    run = subprocess.run(
        [sys.executable, "-c", _COLLECTOR],
        input=json.dumps([[*PLUGIN, *args, "--collect-only", "-q"] for args in commands]),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=users_env(cwd),
    )
    assert run.returncode == 0, run.stderr
    return [(code, output) for code, output in json.loads(run.stdout)]


def wrong_commands(blocks: list[Block], checkout: Path) -> list[str]:
    """What is wrong with the blocks' pytest commands as typed, collected in ``checkout``: one line each."""
    typed = [(b, command, pytest_args(command)) for b in blocks for command in commands(b.text)]
    wrong = [f"{b.where}: not a pytest command: {' '.join(c)}" for b, c, args in typed if args is None]
    runnable = [(b, c, tuple(args)) for b, c, args in typed if args is not None]
    distinct = list(dict.fromkeys(args for _, _, args in runnable))  # the README and the pages repeat some
    results = dict(zip(distinct, collections(checkout, distinct), strict=True))
    for b, c, args in runnable:
        code, output = results[args]
        if code or not re.search(r"\d+ tests? collected", output):
            lines = output.splitlines()
            said = [line for line in lines if "error" in line.lower()][-1:] or lines[-1:]
            wrong.append(f"{b.where}: {' '.join(c)} exited {code}: {said}")
    return wrong


# The blocks' runs are the docs', not a torch version's: the floor's run (-m "not slow") leaves them out.
@pytest.mark.slow
def test_every_shell_block_collects_as_typed(checkout: Path) -> None:
    """Each pytest command of every shell block as typed (options, values, paths, modules), collected."""
    blocks = [b for b in ALL if b.lang == "sh" and not b.not_run]
    wrong = wrong_commands(blocks, checkout)
    assert blocks and not wrong, "\n".join(wrong)


@pytest.mark.slow
def test_a_command_with_a_renamed_flag_fails(checkout: Path) -> None:
    """The check can fail: the README's gate command with a flag misspelt, or a path that is not there."""
    readme = next(b for b in ALL if "--fail-on-regression" in b.text and b.page.name == "README.md")
    misspelt = Block(readme.page, readme.line, "sh", "pytest suites/perf --fail-on-regresion\n", "", "")
    moved = Block(readme.page, readme.line, "sh", "pytest suite/perf\n", "", "")
    wrong = wrong_commands([misspelt, moved], checkout)
    whys = ("unrecognized arguments: --fail-on-regresion", "not found")
    for line, why in zip(wrong, whys, strict=True):
        assert "exited 4" in line and why in line, line


@pytest.mark.slow
@pytest.mark.parametrize("block", of("python"))
def test_python_block(block: Block, tmp_path: Path) -> None:
    """Tests it defines pass; a conftest is loaded under a test of its own; a backend module
    (``# NAME_backend.py``) passes the all-reduce suite at 2 ranks as --backend NAME; a script runs."""
    module = re.match(r"# (\w+)_backend\.py\n", block.text)
    if module:
        if torch_below(2, 13):
            pytest.skip("Python ProcessGroup backends crash before torch 2.13 (docs/limits.md)")
        (tmp_path / f"{module[1]}_backend.py").write_text(block.text)
        copy_conformance(tmp_path, ("test_all_reduce.py",))
        args = ("--backend-module", f"{module[1]}_backend", "--backend", module[1], "-p", "no:cacheprovider")
        result = run_pytest(tmp_path, "--world-sizes", "2", *args)
        assert re.search(r"\d+ passed", result.stdout) and " failed" not in result.stdout, result.stdout[
            -3000:
        ]
    elif block.text.startswith("# conftest.py"):
        (tmp_path / "conftest.py").write_text(block.text)
        (tmp_path / "test_it.py").write_text("def test_loaded():\n    pass\n")
        result = run_pytest(tmp_path, "--world-sizes", "2")
    elif re.search(r"^def test_", block.text, re.MULTILINE):
        (tmp_path / "test_block.py").write_text(block.text)
        result = run_pytest(tmp_path, "--world-sizes", "2")
    else:
        result = subprocess.run(
            [sys.executable, "-c", block.text], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
    assert result.returncode == 0, f"{block.where}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"


@pytest.mark.parametrize("block", of("json"))
def test_json_block(block: Block, tmp_path: Path) -> None:
    entry = json.loads(block.text)
    if {"backends", "test", "raises", "match"} <= set(entry):
        path = tmp_path / "bugs.json"
        path.write_text(json.dumps({"known_bugs": [entry]}))
        assert load(path)


def test_every_file_of_the_tests_is_in_their_readme() -> None:
    """tests/README.md maps each file here to the part it proves: a new file is added to it."""
    readme = (ROOT / "tests" / "README.md").read_text()
    files = [*(ROOT / "tests").glob("*.py"), *(ROOT / "tests" / "support").glob("*.py")]
    missing = [p.name for p in sorted(files) if f"`{p.name}`" not in readme]
    assert not missing, f"tests/README.md does not say what these are for: {missing}"
    # the tests apart from what supports them: only tests and the conftest beside them
    beside = [p.name for p in (ROOT / "tests").glob("*.py") if not p.name.startswith("test_")]
    assert beside == ["conftest.py"], f"a support module among the tests (its place: support/): {beside}"


def test_every_measurement_script_is_on_the_measurements_page_and_not_among_the_tests() -> None:
    """The scripts that produce the figures live beside them, each named on the page, none in tests/."""
    scripts = ROOT / "docs" / "measurements" / "scripts"
    page = (scripts.parent / "index.md").read_text()
    missing = [p.name for p in sorted(scripts.glob("*.py")) if f"`{p.name}`" not in page]
    assert scripts.is_dir() and not missing, f"docs/measurements/index.md does not name: {missing}"
    assert not [p.name for p in (ROOT / "tests").glob("bench_*.py")], "a measurement script among the tests"


def test_the_reference_sections_are_what_the_plugin_declares() -> None:
    """The options, hook specs, public names and algorithm contracts written into the pages are the
    plugin's own: an option, spec or name added or changed and not written there fails here."""
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import plugin_reference
    finally:
        sys.path.pop(0)
    holding = {}
    for path in sorted((ROOT / "docs").glob("*.md")):
        page = path.read_text(encoding="utf-8")
        holding.update(
            {name: path.name for name in plugin_reference.SECTIONS if f"generated: {name} " in page}
        )
        assert plugin_reference.rewritten(page) == page, (
            f"docs/{path.name}: a generated section is out of date; run python docs/_ext/plugin_reference.py"
        )
    assert set(holding) == set(plugin_reference.SECTIONS), holding
    hooks = (ROOT / "docs" / "hooks.md").read_text()
    assert "## `pytest_collectives_known_bugs(config)`" in hooks  # the specs are there, not an empty list
