"""Shared fixtures: a factory that opens the same logical dataset on every driver."""

from __future__ import annotations

import pytest

from nczmap import open_map
from nczmap.zmap import MemoryMap, ZMap

DRIVERS = ["memory", "file", "zip", "s3"]


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 for the whole session (started on first use, stopped at the end)."""
    from s3server import start_server

    server = start_server()
    yield server
    server.stop()


def dataset_url(tmp_path, driver: str, s3=None) -> str:
    if driver == "file":
        return (tmp_path / "ds.file").as_uri() + "#mode=nczarr,file"
    if driver == "s3":
        return s3.url()
    return (tmp_path / "ds.zip").as_uri() + "#mode=nczarr,zip"


class MapFactory:
    """Opens and re-opens one dataset on one driver (memory maps survive 'reopening' as the same object)."""

    def __init__(self, tmp_path, driver: str, s3=None) -> None:
        self.driver = driver
        self.url = None if driver == "memory" else dataset_url(tmp_path, driver, s3)
        self._memory: MemoryMap | None = None
        self.opened: list[ZMap] = []

    @property
    def persistent(self) -> bool:
        return self.driver != "memory"

    def open(self, mode: str = "a") -> ZMap:
        if self.driver == "memory":
            if self._memory is None or self._memory.closed:
                self._memory = MemoryMap(mode)
            return self._memory
        zmap = open_map(self.url, mode)
        self.opened.append(zmap)
        return zmap

    def reopen(self, zmap: ZMap, mode: str = "a") -> ZMap:
        if self.driver == "memory":
            return zmap
        zmap.close()
        return self.open(mode)

    def close_all(self) -> None:
        for zmap in self.opened:
            zmap.close()


@pytest.fixture(params=DRIVERS)
def factory(request, tmp_path) -> MapFactory:
    s3 = request.getfixturevalue("s3_server") if request.param == "s3" else None
    made = MapFactory(tmp_path, request.param, s3)
    yield made
    made.close_all()


@pytest.fixture
def zmap(factory) -> ZMap:
    return factory.open("w")
