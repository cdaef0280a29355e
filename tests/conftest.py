"""Shared fixtures: moto's S3 server for the whole session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 for the whole session (started on first use, stopped at the end)."""
    from s3server import start_server

    server = start_server()
    yield server
    server.stop()
