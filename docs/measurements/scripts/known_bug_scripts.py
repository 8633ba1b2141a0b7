"""Rewrite the standalone reproductions committed beside suites/known_bugs.json from the suite's own
failures, so that they stay what the plugin writes today (its template changes: a file rendezvous, a hang
watchdog). For each entry "ready to file, known_bugs/gloo-CALL-....py", runs the test that writes it (a
layout bug's: that call's layout test) on gloo at 2 ranks with --reproductions, and copies the float32
script it writes over the committed one.

    python docs/measurements/scripts/known_bug_scripts.py            # says which files would change
    python docs/measurements/scripts/known_bug_scripts.py --write    # and rewrites them
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SUITES = Path(__file__).resolve().parents[3] / "suites"
# the committed scripts no layout test writes: (test file, -k, the scripts it writes, float32 taken first)
WRITTEN_BY = {
    "gloo-all_reduce-max-nan": ("test_all_reduce.py", "test_nan_and_inf_in_min_max", "max-nan-ws2-*"),
    "gloo-all_to_all-list": ("test_operations.py", "test_all_to_all_list", "list-contiguous-ws2-*"),
}


def main(write: bool) -> int:
    manifest = json.loads((SUITES / "known_bugs.json").read_text())["known_bugs"]
    found = (re.search(r"known_bugs/(\S+)\.py", entry["upstream"]) for entry in manifest)
    targets = {}
    for name in sorted({match.group(1) for match in found if match}):
        _, call, layouts = name.split("-", 2)
        if name in WRITTEN_BY:
            test, select, written = WRITTEN_BY[name]
            targets[name] = (test, select, f"gloo-{call}-{written}.py")
        elif "_to_" in layouts or layouts == "strided":
            targets[name] = ("test_layouts.py", f"{call}- and {layouts}", f"{name}-ws2-float32.py")
        # the others are written by hand, where no test writes one
    changed = 0
    for name, (test, select, written) in targets.items():
        # one run a script: the inputs a test draws depend on what else the run selected
        with tempfile.TemporaryDirectory() as folder:
            command = [sys.executable, "-m", "pytest", str(SUITES / "conformance" / test), "-qk", select]
            command += ["--world-sizes", "2", "--reproductions", folder, "-p", "no:cacheprovider"]
            command += ["--hypothesis-seed", "0"]  # the same examples each time: a rewrite changes only code
            subprocess.run(command, cwd=SUITES.parent, capture_output=True)
            scripts = sorted(Path(folder).glob(written), key=lambda path: "float32" not in path.name)
            if not scripts:
                print(f"{name}: no script written (the bug no longer fires?)")
                return 1
            committed, text = SUITES / "known_bugs" / f"{name}.py", scripts[0].read_text()
            if not committed.is_file() or committed.read_text() != text:
                changed += 1
                print(f"{committed}: {'rewritten' if write else 'differs (--write rewrites it)'}")
                if write:
                    committed.write_text(text)
    print(f"{changed} of {len(targets)} scripts {'rewritten' if write else 'differ'}")
    return 0


if __name__ == "__main__":
    sys.exit(main("--write" in sys.argv[1:]))
