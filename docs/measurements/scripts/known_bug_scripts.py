"""Rewrite the standalone reproductions committed beside suites/known_bugs.json from the suite's own
failures, so that they stay what the plugin writes today (its template changes: a file rendezvous, a hang
watchdog). For each entry "ready to file, known_bugs/gloo-CALL-LAYOUTS.py", runs that call's layout test on
gloo at 2 ranks with --reproductions, and copies the float32 script it writes over the committed one.

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


def main(write: bool) -> int:
    manifest = json.loads((SUITES / "known_bugs.json").read_text())["known_bugs"]
    # the layout tests' scripts: others are written by hand, where no property writes one
    layouts = (entry for entry in manifest if "layout" in entry["test"])
    found = (re.search(r"known_bugs/(\S+)\.py", entry["upstream"]) for entry in layouts)
    targets = sorted({match.group(1) for match in found if match})
    changed = 0
    for name in targets:
        _, call, layouts = name.split("-", 2)
        # one run a script: the inputs a test draws depend on what else the run selected
        with tempfile.TemporaryDirectory() as folder:
            command = [sys.executable, "-m", "pytest", str(SUITES / "conformance" / "test_layouts.py"), "-qk"]
            command += [f"{call}- and {layouts}", "--world-sizes", "2", "--reproductions", folder]
            subprocess.run([*command, "-p", "no:cacheprovider"], cwd=SUITES.parent, capture_output=True)
            written = Path(folder) / f"{name}-ws2-float32.py"
            if not written.is_file():
                print(f"{name}: no script written (the bug no longer fires?)")
                return 1
            committed, text = SUITES / "known_bugs" / f"{name}.py", written.read_text()
            if committed.read_text() != text:
                changed += 1
                print(f"{committed}: {'rewritten' if write else 'differs (--write rewrites it)'}")
                if write:
                    committed.write_text(text)
    print(f"{changed} of {len(targets)} scripts {'rewritten' if write else 'differ'}")
    return 0


if __name__ == "__main__":
    sys.exit(main("--write" in sys.argv[1:]))
