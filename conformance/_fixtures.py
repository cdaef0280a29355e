"""Where netcdf-c's test fixtures are: ``../shared/conformance/netcdf-c`` beside the repository."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def fixtures_dir() -> Path:
    override = os.environ.get("NCZMAP_NETCDF_FIXTURES")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "shared" / "conformance" / "netcdf-c"


FIXTURES = fixtures_dir()
needs_fixtures = pytest.mark.skipif(
    not FIXTURES.is_dir(),
    reason=f"netcdf-c's fixtures are not at {FIXTURES}: point NCZMAP_NETCDF_FIXTURES at a copy of "
    "netcdf-c's nczarr_test reference files",
)


def run_checked(cmd: list, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a real tool (ncgen, ncdump, zip...); a failure shows its command, stdout and stderr."""
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=timeout, check=False)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed ({proc.returncode})\n"
        f"stdout: {proc.stdout.decode(errors='replace')}\nstderr: {proc.stderr.decode(errors='replace')}"
    )
    return proc
