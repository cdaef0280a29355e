"""Run benchmarks on an earlier revision and on the working tree side by side, alternating, in one run.

    .venv/bin/python bench/compare_revisions.py 8d61ebf bench_metadata bench_zip_search --rounds 2

The earlier revision is checked out into a temporary git worktree and each benchmark runs there with that
revision's own code (``PYTHONPATH``), then here, then there again..., so drift in this machine's speed hits
both alike. Only the result lines (those with a ratio or a rate) are printed, each labelled with its side.
Extra arguments after ``--`` go to every benchmark.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
RESULT_MARKS = ("×", "MiB/s", " ms", "requests", "GET", "LIST", "HEAD", "peak RSS")


def run(tree: Path, bench: str, extra: list[str]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    script = tree / "bench" / f"{bench}.py"
    result = subprocess.run(
        [sys.executable, str(script), *extra], cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode:
        return [f"FAILED ({result.returncode}): {result.stderr.strip().splitlines()[-1:]}"]
    return [line for line in result.stdout.splitlines() if any(mark in line for mark in RESULT_MARKS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="the earlier revision (commit, tag, branch)")
    parser.add_argument("benches", nargs="+", help="benchmark names, e.g. bench_metadata")
    parser.add_argument("--rounds", type=int, default=1, help="alternations per benchmark")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.revision], cwd=HERE, check=True)
        try:
            for bench in args.benches:
                for round_number in range(1, args.rounds + 1):
                    for label, tree in ((args.revision, base), ("working tree", HERE)):
                        print(f"== {bench} round {round_number}: {label}", flush=True)
                        for line in run(tree, bench, extra):
                            print("   " + line, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=HERE, check=False)


if __name__ == "__main__":
    main()
