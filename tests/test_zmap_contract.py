"""The zmap contract (netcdf-c zmap.h semantics, nczarr-format.md §1), run on every driver.

The tests live in :mod:`nczmap.testing`; each class here says how to open its driver's maps. Seeded maps are
written with the driver itself (mode ``"w"``) and reopened read-only; every test gets fresh datasets (files
under its ``tmp_path``, a new key prefix in the moto bucket for S3).
"""

from __future__ import annotations

import itertools
from typing import ClassVar

import pytest

from nczmap import open_map
from nczmap.testing import ReadContract, WriteContract
from nczmap.zmap import MemoryMap, ZMap

# Contract breaches the drivers are known to have (reported, not fixed here): those tests must fail.
S3_MISSING_READ_ONLY = (
    "s3 driver: mode 'r' makes no request at open, so a missing (or deleted) dataset opens as an empty one "
    "instead of raising DatasetNotFound as base.py says (mode 'r+' does raise)"
)


class DriverChecks:
    """Checks of the subclasses themselves: their hooks open the driver they are named after."""

    driver: ClassVar[str]

    def test_hooks_open_the_driver(self) -> None:
        seeded = self.seeded({"/a": b"1"})
        writable = self.writable()
        assert (seeded.driver, writable.driver) == (self.driver, self.driver)
        assert seeded.readonly
        assert not writable.readonly


class TestMemory(DriverChecks, ReadContract, WriteContract):
    """Memory maps cannot be reopened: a seeded map is frozen read-only in place, a reopened map is itself."""

    driver = "memory"
    persistent = False

    def open_seeded(self, objects: dict[str, bytes]) -> ZMap:
        zmap = MemoryMap("w")
        for key, data in objects.items():
            zmap.write(key, data)
        zmap.mode = "r"
        return zmap

    def open_writable(self, mode: str = "w") -> ZMap:
        return MemoryMap(mode)

    def reopen(self, zmap: ZMap, mode: str) -> ZMap:
        zmap.mode = mode
        return zmap


class URLContract(ReadContract, WriteContract):
    """A driver opened by URL: every dataset of a test is new (a directory, an archive, an S3 prefix)."""

    driver: ClassVar[str]
    suffix: ClassVar[str] = ""

    @pytest.fixture(autouse=True)
    def _locations(self, request: pytest.FixtureRequest, tmp_path) -> None:
        self.s3 = request.getfixturevalue("s3_server") if self.driver == "s3" else None
        self.paths = (tmp_path / f"ds{number}{self.suffix}" for number in itertools.count())

    def new_url(self) -> str:
        if self.s3 is not None:
            return self.s3.url()
        return next(self.paths).as_uri() + f"#mode=nczarr,{self.driver}"

    def open_seeded(self, objects: dict[str, bytes]) -> ZMap:
        url = self.new_url()
        with open_map(url, "w") as writer:
            for key, data in objects.items():
                writer.write(key, data)
        return open_map(url, "r")

    def open_writable(self, mode: str = "w") -> ZMap:
        return open_map(self.new_url(), mode)

    def reopen(self, zmap: ZMap, mode: str) -> ZMap:
        zmap.close()
        return open_map(zmap.url, mode)


class TestFile(DriverChecks, URLContract):
    driver = "file"
    suffix = ".file"


class TestZip(DriverChecks, URLContract):
    driver = "zip"
    suffix = ".zip"


class TestS3(DriverChecks, URLContract):
    driver = "s3"
    known_violations: ClassVar[dict[str, str]] = {
        "test_deleted_dataset_is_not_found_read_only": S3_MISSING_READ_ONLY,
    }
