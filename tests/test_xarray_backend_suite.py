"""xarray's own netCDF-4 backend tests (``NetCDF4Base`` of ``xarray/tests/test_backends.py``, shipped in the
xarray wheel), run against ``xr.open_dataset(engine="nczmap")`` and ``nczmap.to_nczarr``.

Each test writes through the suite's ``save`` and reads through its ``open``, which here go to an NCZarr
zip archive beside the file name the suite picks. Left out, not collected, are only the tests that do not
go through ``save``/``open``: they write or read a netCDF-4 file with netCDF4-python or ``to_netcdf``
itself (listed in :data:`OTHER_ENGINES`, with what they do instead).
"""

from __future__ import annotations

import contextlib
import os

import pytest

xr = pytest.importorskip("xarray")
pytest.importorskip("netCDF4")
pytest.importorskip("dask")
suite = pytest.importorskip("xarray.tests.test_backends")
from xarray.tests.conftest import time_unit, use_dask  # noqa: E402, F401  (fixtures the suite uses)

import nczmap  # noqa: E402

OTHER_ENGINES = {
    "test_open_group": "writes its file with netCDF4.Dataset",
    "test_open_subgroup": "writes its file with netCDF4.Dataset",
    "test_refresh_from_disk": "writes its files with to_netcdf (engine netcdf4)",
    "test_encoding_enum__no_fill_value": "writes its file with netCDF4.Dataset (enums NCZarr has not)",
    "test_encoding_enum__multiple_variable_with_enum": "writes its file with netCDF4.Dataset (enums)",
    "test_encoding_enum__error_multiple_variable_with_changing_enum": "writes with netCDF4.Dataset (enums)",
    "test_create_default_indexes": "writes with to_netcdf(engine=...), which knows only its own engines",
    "test_encoding_masked_arrays": "writes with to_netcdf (engine netcdf4), reads that file",
    "test_write_store": "writes through create_store, a netCDF4 data store",
    "test_coordinate_variables_after_iris_roundtrip": "converts to iris and back, no file at all",
    "test_load_async": "skipped by xarray for every netCDF backend (no async loading)",
}


def _url(path: str) -> str:
    return f"file://{os.path.abspath(path)}.zip#mode=nczarr,zip"


class TestNCZmapEngine(suite.NetCDF4Base):
    engine = "nczmap"
    file_format = "NETCDF4"  # what the suite checks to know netCDF-4 types are written

    @contextlib.contextmanager
    def create_store(self):
        raise NotImplementedError("the suite's tests here go through save() and open()")

    def save(self, dataset, path, **kwargs):
        kwargs.pop("engine", None)
        kwargs.pop("format", None)
        return nczmap.to_nczarr(dataset, _url(path), **kwargs)

    @contextlib.contextmanager
    def open(self, path, **kwargs):
        with xr.open_dataset(_url(path), engine="nczmap", **kwargs) as ds:
            yield ds

    def test_roundtrip_example_1_netcdf(self) -> None:
        """xarray skips it unless a module "netcdf" (in no package index) imports; it needs none here."""
        suite.CFEncodedBase.test_roundtrip_example_1_netcdf(self)


for _name in OTHER_ENGINES:  # not collected: None is no test
    if hasattr(TestNCZmapEngine, _name):
        setattr(TestNCZmapEngine, _name, None)
