"""Sources on web servers and under S3 prefixes: virtualized as local files are, read through the grants."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_manifest_http import serving
from test_virtualize import manifest_url, upload

import nczmap
from nczmap.errors import AccessDenied, FormatError
from nczmap.integrations.virtualize import virtualize

netCDF4 = pytest.importorskip("netCDF4")


def write_day(path: Path, day: int, fmt: str = "NETCDF4") -> np.ndarray:
    values = np.arange(1200, dtype="f4").reshape(1, 30, 40) + 10000 * day
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("time", None)
        ds.createDimension("y", 30)
        ds.createDimension("x", 40)
        ds.createVariable("time", "f8", ("time",))[:] = [day]
        ds.createVariable("field", "f4", ("time", "y", "x"))[:] = values
    return values


@pytest.fixture
def web():
    with serving() as server:
        yield server


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_64BIT_OFFSET"])
def test_files_on_a_web_server_are_virtualized_and_read_under_their_grant(tmp_path, web, fmt):
    expected = []
    for day in range(3):
        path = tmp_path / f"day{day}.nc"
        expected.append(write_day(path, day, fmt))
        web.files[f"/data/day{day}.nc"] = path.read_bytes()
    sources = [f"{web.root}/data/day{day}.nc" for day in range(3)]
    refs = tmp_path / "refs.json"
    result = virtualize(sources, refs, concat="time")
    assert [c.prefix for c in result.containers] == [f"{web.root}/data/"]
    assert {v[0] for v in json.loads(refs.read_text())["refs"].values() if isinstance(v, list)} <= set(
        sources
    )
    with pytest.raises(AccessDenied), nczmap.open_dataset(manifest_url(refs)) as ds:
        ds.variables["field"][...]  # the web server is not granted by default
    with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds:
        assert np.array_equal(ds.variables["field"][...], np.concatenate(expected))
        assert ds.variables["time"][...].tolist() == [0, 1, 2]


def test_a_web_source_that_redirects_is_refused_naming_where_it_goes(tmp_path, web):
    write_day(tmp_path / "a.nc", 0)
    web.files["/data/a.nc"] = (tmp_path / "a.nc").read_bytes()
    web.redirects["/data/moved.nc"] = (302, "/data/a.nc")
    with pytest.raises(AccessDenied, match=r"redirect.*/data/a\.nc"):
        virtualize([f"{web.root}/data/moved.nc"], tmp_path / "refs.json")
    assert not (tmp_path / "refs.json").exists()


def test_the_objects_under_an_s3_prefix_are_the_sources_in_name_order(tmp_path, s3_server):
    from s3server import BUCKET

    prefix = None
    expected = []
    for day in (2, 0, 1):  # uploaded out of order
        path = tmp_path / f"day{day}.nc"
        values = write_day(path, day)
        key, _ = upload(s3_server, path, f"{prefix}/day{day}.nc" if prefix else None)
        prefix = prefix or key.rsplit("/", 1)[0]
        expected.append((day, values))
    upload(s3_server, tmp_path / "day0.nc", f"{prefix}/notes/other.nc")  # below: not a source
    expected = np.concatenate([v for _, v in sorted(expected, key=lambda pair: pair[0])])
    for spelled in (f"{prefix}/", f"{prefix}/day*.nc"):
        refs = tmp_path / "refs.json"
        result = virtualize([f"{s3_server.endpoint}/{BUCKET}/{spelled}#mode=s3"], refs, concat="time")
        with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds:
            assert np.array_equal(ds.variables["field"][...], expected), spelled
    with pytest.raises(FormatError, match="no object matches"):
        virtualize([f"{s3_server.endpoint}/{BUCKET}/{prefix}/none*.nc#mode=s3"], tmp_path / "x.json")
