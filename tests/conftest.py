"""Shared fixtures: moto's S3 server for the whole session. And a clean exit when ecCodes was loaded."""

from __future__ import annotations

import os
import sys

import pytest

_exit_status: int | None = None


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 for the whole session (started on first use, stopped at the end)."""
    from s3server import start_server

    server = start_server()
    yield server
    server.stop()


def pytest_sessionfinish(session, exitstatus) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    """Leave without running C++ static destructors once ecCodes is loaded (xarray imports it with
    cfgrib's backend, in every process that lists its engines): its wheel's eckit bundles its own PROJ,
    whose destructors and those of pyproj's PROJ free the same objects at exit (a double free, SIGABRT
    after every test passed). Everything is reported and written by now."""
    if _exit_status is not None and "eccodes" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)
