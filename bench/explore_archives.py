"""Generated archives with fresh randomness: any number of examples, failures counted by class.

    .venv/bin/python bench/explore_archives.py 5000 [--output .json,.parq,.icechunk] [--show 3]

Runs ``tests/generated_archives.check`` (the suite CI runs with a fixed seed) on archives hypothesis draws
afresh, never stopping at a failure: every example's outcome is counted ("joined", a refusal's class, or a
failure's class: its exception type and message with numbers and names blanked), and a few archives of
each failure class are printed so that they can become fixed examples of the test.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

os.environ.setdefault("NCZMAP_HYPOTHESIS", "explore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import generated_archives as ga
from hypothesis import HealthCheck, given, settings


def failure_class(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    text = re.sub(r"f\d{3}\.nc", "fNNN.nc", text)
    text = re.sub(r"/\S+", "PATH", text)
    text = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", text)
    return f"{type(error).__name__}: {text[:160]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples", type=int, nargs="?", default=500)
    parser.add_argument("--output", default=".json,.parq,.icechunk", help="outputs to draw from")
    parser.add_argument("--show", type=int, default=2, help="archives printed for each failure class")
    options = parser.parse_args()
    outcomes: Counter[str] = Counter()
    shown: dict[str, list[str]] = defaultdict(list)
    started = time.perf_counter()

    @settings(max_examples=options.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(ga.archives(outputs=tuple(options.output.split(","))))
    def explore(archive):
        with tempfile.TemporaryDirectory() as folder:
            try:
                outcomes[ga.check(archive, Path(folder))] += 1
            except Exception as error:  # every outcome is counted; the run goes on
                kind = failure_class(error)
                outcomes["FAILED " + kind] += 1
                if len(shown[kind]) < options.show:
                    shown[kind].append(f"{archive!r}\n{traceback.format_exc(limit=-3)}")

    explore()
    elapsed = time.perf_counter() - started
    total = sum(outcomes.values())
    print(f"{total} archives in {elapsed:.0f} s ({elapsed / max(total, 1):.2f} s each)")
    for outcome, count in outcomes.most_common():
        print(f"{count:6d}  {outcome}")
    for reason, text in ga.REFUSALS_SEEN.items():
        print(f"refused ({reason}), e.g.: {text}")
    for kind, archives in shown.items():
        print(f"\n=== {kind}")
        for text in archives:
            print(text)
    return 1 if any(o.startswith("FAILED") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
