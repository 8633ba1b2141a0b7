"""The mutant table of the README: how often the conformance suites catch each backend that is wrong on
purpose (tests/support/mutant_backends.py), after how many examples, and the minimal example they print.

    python docs/measurements/scripts/bench_mutants.py [--runs 5] [--mutant NAME ...]

Each run is a fresh pytest session of the suite file the mutant's operation lives in, at 3 ranks, with the
default ``ci`` profile: once without shrinking (the examples drawn until the first failure) and once as a
user runs it (the printed minimal example).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# the tests' support modules: helpers and the mutant backends the tests use
TESTS = Path(__file__).resolve().parents[3] / "tests" / "support"
sys.path.insert(0, str(TESTS))
from helpers import copy_conformance  # noqa: E402
from test_capabilities import MUTANTS  # noqa: E402

NO_SHRINK = """
from hypothesis import Phase, settings
settings.register_profile(
    "planted", parent=settings.get_profile("ci"), phases=[Phase.generate], database=None
)
"""


def session(directory: Path, backend: str, test_file: str, select: str, profile: str) -> str:
    command = [
        sys.executable, "-m", "pytest", test_file, "-x", "-k", select, "-p", "no:cacheprovider",
        "--backend-module", "mutant_backends", "--backend", backend, "--world-sizes", "3",
        "--hypothesis-profile", profile,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    done = subprocess.run(command, cwd=directory, capture_output=True, text=True, env=env)
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--mutant", action="append", help="only these (e.g. channels_last_written_contiguous)"
    )
    args = parser.parse_args()
    print("| mutant | caught | examples to the first failure | minimal example |")
    print("|---|---|---|---|")
    for backend, test_file, select, _ in MUTANTS:
        if args.mutant and backend.removeprefix("mutant_") not in args.mutant:
            continue
        caught, examples, minimal = 0, [], ""
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                directory = Path(tmp)
                copy_conformance(directory, (test_file,), conftest_extra=NO_SHRINK)
                out = session(directory, backend, test_file, select, "planted")
                calls = re.search(r"(\d+) distributed examples", out)
                if " failed" in out.splitlines()[-1]:
                    caught += 1
                    examples.append(int(calls.group(1)) if calls else 0)
                if not minimal:
                    out = session(directory, backend, test_file, select, "ci")
                    case = re.search(r"case=Case\((.*?root=\d+)\)", out, flags=re.S)
                    # an exception group's lines start with "|": not part of the example
                    minimal = " ".join(case.group(1).replace("|", " ").split()) if case else ""
        shown = f"{min(examples)}-{max(examples)}" if examples else "-"
        print(f"| {backend.removeprefix('mutant_')} | {caught}/{args.runs} | {shown} | `{minimal}` |")


if __name__ == "__main__":
    main()
