"""Where netcdf-c's test fixtures are: ``../shared/conformance/netcdf-c`` beside the repository."""

from __future__ import annotations

import os
from pathlib import Path


def fixtures_dir() -> Path:
    override = os.environ.get("NCZMAP_NETCDF_FIXTURES")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "shared" / "conformance" / "netcdf-c"


FIXTURES = fixtures_dir()
