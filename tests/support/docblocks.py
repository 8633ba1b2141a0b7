"""The fenced blocks of README.md and docs/*.md, as tests read them: test_docs.py runs them, test_jobs.py
runs the jobs' commands as the README types them and holds their shown output to what a run prints.

A comment on the line above a block's fence says what the reader can't see: ``<!-- not run here: WHY -->``,
or above a block of output, ``<!-- printed by: COMMAND -->``. The blocks printed by ``pytest suites`` are
held to what .ci/run's run of the suites printed: ``python3 tests/support/docblocks.py LOG``."""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
MARK = re.compile(r"<!-- (?P<kind>not run here|printed by): (?P<what>[^>]*\S) -->")
SUITES_RUN = "pytest suites"  # what .ci/run runs (tox -e suites), whose output it keeps
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
OUTPUT = ("", "text")
DIRECTIVE = re.compile(r"\{[\w-]+\}")  # MyST's {toctree}, {eval-rst}, the docs' own directives


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str  # the reason the page gives, or ""
    printed_by: str  # of a block of output, the command the page says printed it, or ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, each with the reason it isn't run, where the page gives one."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        mark = MARK.fullmatch(lines[i - 1].strip()) if i else None
        said = {mark["kind"]: mark["what"]} if mark else {}
        text = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(
            Block(page, i + 1, fence["lang"], text, said.get("not run here", ""), said.get("printed by", ""))
        )
        i = end + 1
    return found


ALL = [block for page in PAGES for block in blocks(page)]


def commands(script: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped, ``&&`` split."""
    joined = re.sub(r"\\\n\s*", " ", script)
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            found.append(words[:cut])
            words = words[cut + 1 :]
    return found


def pytest_args(command: list[str]) -> list[str] | None:
    """The arguments of a pytest command (``pytest ...``, ``python -m pytest ...``), else None."""
    if command[:1] == ["pytest"]:
        return command[1:]
    if len(command) > 2 and command[0].startswith("python") and command[1:3] == ["-m", "pytest"]:
        return command[3:]
    return None


def block_of(page: str, holding: str) -> Block:
    """The one block of ``page`` (relative to the checkout) whose text holds ``holding``."""
    (found,) = [b for b in blocks(ROOT / page) if holding in b.text]
    return found


# In a shown output, what differs from run to run: a parenthesised aside, a word with a digit (a figure,
# a date, a hash), and which way the machine drifted.
_VARYING = re.compile(r"\((?:[^()]|\([^()]*\))*\)|\S*\d\S*|slower|faster")


def shape(line: str) -> re.Pattern[str]:
    """A shown output line as a pattern the real line must match: its words as shown, what varies
    (_VARYING) free."""
    pattern, at = "", 0
    for m in _VARYING.finditer(line):
        free = r"\(.*\)" if m[0].startswith("(") else "(?:slower|faster)" if m[0].isalpha() else r"\S+"
        pattern += _words(line[at : m.start()]) + free
        at = m.end()
    return re.compile(pattern + _words(line[at:]))


def _words(text: str) -> str:
    """``text`` as a pattern, any run of spaces for its spaces (a table's columns are as wide as its
    widest name, which differs between runs)."""
    return r"\s+".join(re.escape(part) for part in re.split(r"\s+", text))


def unshown(shown: str, printed: str) -> list[str]:
    """The lines of a shown output that no line a run printed has the shape of."""
    lines = [line.strip() for line in printed.splitlines()]
    return [
        s for s in shown.splitlines() if s.strip() and not any(shape(s.strip()).fullmatch(x) for x in lines)
    ]


def main(log: str) -> int:
    """Hold every block printed by the suites' run to ``log``, what that run printed."""
    printed = Path(log).read_text()
    wrong = [
        f"{b.where}: {line}" for b in ALL if b.printed_by == SUITES_RUN for line in unshown(b.text, printed)
    ]
    for line in wrong:
        print(f"shown in the docs, not printed by {SUITES_RUN} ({log}): {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
