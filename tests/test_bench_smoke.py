"""The benchmarks still run (tiny sizes); their figures are read by people, not asserted here.

The scripts run two at a time from the first test on (much of a quick run is waiting: imports, child
processes, servers with latency), each test waiting for its own script's run.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(path.name for path in BENCH.glob("bench_*.py"))


def _run(script: str, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH / script), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
        check=False,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Future]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {script: pool.submit(_run, script, tmp_path_factory.mktemp(script)) for script in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_runs(script, runs):
    result = runs[script].result()
    assert result.returncode == 0, result.stderr
    assert "TARGET" in result.stdout or "×" in result.stdout
