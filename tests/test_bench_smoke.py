"""The benchmarks still run (tiny sizes); their figures are read by people, not asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("script", sorted(path.name for path in BENCH.glob("bench_*.py")))
def test_benchmark_runs(script, tmp_path):
    result = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "TARGET" in result.stdout or "×" in result.stdout
