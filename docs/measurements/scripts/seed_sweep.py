"""The same run at consecutive hypothesis seeds: does a healthy backend stay green at every one?

    python docs/measurements/scripts/seed_sweep.py --seeds 1-20 -- suites/conformance
    python docs/measurements/scripts/seed_sweep.py --seeds 1-20 -- suites/conformance --backend refgloo

Runs ``pytest <args> --hypothesis-seed S -p no:cacheprovider`` for each seed S, one after another, and
prints a line a seed (exit status, pytest's counts, the closing conformance verdict, the failed tests'
ids) and a closing line: how many seeds were green. Exits 1 where any seed was not.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time


def seeds(text: str) -> list[int]:
    """``"1-20"`` or ``"3,6,9"``."""
    if "-" in text:
        first, last = (int(part) for part in text.split("-", 1))
        return list(range(first, last + 1))
    return [int(part) for part in text.split(",")]


def one(seed: int, args: list[str]) -> tuple[int, str]:
    """One run's exit status and its line."""
    start = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--hypothesis-seed", str(seed), "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
    )
    lines = run.stdout.splitlines()
    counts = next((line.strip("= ") for line in reversed(lines) if " in " in line and "=" in line), "?")
    verdict = next((line for line in lines if line.startswith("conformance: ")), "")
    failed = [m.group(1) for line in lines if (m := re.match(r"(?:FAILED|ERROR) (\S+)", line))]
    took = time.monotonic() - start
    said = f"seed {seed}: exit {run.returncode}, {counts}, {took:.0f} s; {verdict}"
    return run.returncode, "\n    ".join([said, *failed])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=seeds, default=seeds("1-20"), help="first-last, or a,b,c")
    parser.add_argument("args", nargs="+", help="pytest's arguments, after --")
    options = parser.parse_args()
    red = []
    for seed in options.seeds:
        rc, line = one(seed, options.args)
        print(line, flush=True)
        if rc != 0:
            red.append(seed)
    green = len(options.seeds) - len(red)
    print(f"{green} of {len(options.seeds)} seeds green" + (f"; not: {red}" if red else ""))
    return 1 if red else 0


if __name__ == "__main__":
    sys.exit(main())
