"""Shared fixtures: moto's S3 server for the whole session. ecCodes loaded into its own scope first."""

from __future__ import annotations

import contextlib

import pytest

with contextlib.suppress(ImportError):
    # before xarray's cfgrib backend loads it into the global scope, where its bundled PROJ would make the
    # process crash at exit once pyproj is loaded (see nczmap.format.gribcodec.import_eccodes)
    from nczmap.format.gribcodec import import_eccodes

    import_eccodes()


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 for the whole session (started on first use, stopped at the end)."""
    from s3server import start_server

    server = start_server()
    yield server
    server.stop()
