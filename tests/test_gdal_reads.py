"""GDAL (rasterio's bundled libgdal, its Zarr driver through the multidimensional API) reads what nczmap
writes, value for value: JSON manifests of a COG series whole (its time, grid mapping and coordinates
kept inline, its tiles referenced), and NCZarr stores of every dialect since netcdf-c 4.8.1, zipped as
netcdf-c's zip driver zips them, and Zarr v3.

Oracles: rasterio reading each COG, and netCDF4-python / xarray's netcdf4 engine reading the netCDF file a
store was made from. Inline bytes that are not printable text are written as ``base64:``: GDAL's reference
parser (like kerchunk's) cuts a JSON string at its first NUL, so a small integer chunk written as text
(``"\\u0000\\u0000..."``) read back as zeros cut short.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from gdal_multidim import read_all
from store_zip import zip_store
from test_virtualize_parallel import DATES, write_cog

from nczmap.integrations.copy import copy
from nczmap.integrations.virtualize import virtualize

rasterio = pytest.importorskip("rasterio")
xr = pytest.importorskip("xarray")

CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def cog_series(folder, predictor: str = "NO"):
    """Four daily COGs as a series writer makes them (no predictor: GDAL's Zarr driver has no
    ``imagecodecs_delta`` filter, which predictor 2's references need)."""
    folder.mkdir()
    return [write_cog(folder / f"sst_{d}.tif", seed, predictor=predictor) for seed, d in enumerate(DATES)]


def test_gdal_reads_a_json_manifest_of_a_cog_series_whole(tmp_path):
    files = cog_series(tmp_path / "cogs")
    manifest = tmp_path / "series.json"
    virtualize([str(f) for f in files], manifest, new_dim="time=%Y%m%d")
    refs = json.loads(manifest.read_text())["refs"]
    inline = {key: value for key, value in refs.items() if isinstance(value, str)}
    assert all(not CONTROL.search(value) for value in inline.values()), "raw bytes written as text"
    assert {"time/0", "spatial_ref/0"} <= set(inline), sorted(inline)  # the small arrays kept inline

    arrays = read_all(f'ZARR:"{manifest}"')
    stacked = []
    for path in files:
        with rasterio.open(path) as cog:
            stacked.append(cog.read(1))
            transform, width, height = cog.transform, cog.width, cog.height
    np.testing.assert_array_equal(arrays["band_data"], np.stack(stacked).astype("f8"))
    dates = [np.datetime64(f"{d[:4]}-{d[4:6]}-{d[6:]}") for d in DATES]
    days = (np.array(dates) - dates[0]).astype(int)
    np.testing.assert_array_equal(arrays["time"], days)
    np.testing.assert_array_equal(arrays["x"], transform.c + (np.arange(width) + 0.5) * transform.a)
    np.testing.assert_array_equal(arrays["y"], transform.f + (np.arange(height) + 0.5) * transform.e)
    assert arrays["spatial_ref"].size == 1  # an NCZarr scalar: shape [1]
    with xr.open_dataset(f"file://{manifest}#mode=nczarr,manifest", engine="nczmap", decode_cf=False) as ours:
        assert arrays["spatial_ref"][0] == ours["spatial_ref"].values  # the grid mapping's value, not cut


def small_netcdf(path):
    """A netCDF-4 file with what stores hold: a time coordinate (fixed: netcdf-c before 4.9.3 has no
    unlimited NCZarr dimension), packed int16 (deflated: GDAL has no Zarr v3 codec for numcodecs'
    shuffle), float32 with a fill, and a scalar."""
    import netCDF4

    rng = np.random.default_rng(7)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", 3)
        ds.createDimension("y", 5)
        ds.createDimension("x", 7)
        time = ds.createVariable("time", "i4", ("time",))
        time.units = "days since 2000-01-01"
        time[:] = np.arange(3)
        t = ds.createVariable("t", "f4", ("time", "y", "x"), chunksizes=(1, 5, 4), fill_value=np.float32(-9))
        t[:] = rng.normal(size=(3, 5, 7)).astype("f4")
        packed = ds.createVariable("packed", "i2", ("time", "y", "x"), zlib=True, shuffle=False)
        packed.scale_factor = np.float32(0.5)
        packed[:] = rng.integers(-100, 100, (3, 5, 7)) * 0.5
        scalar = ds.createVariable("scalar", "f8", ())
        scalar[...] = 3.25
    return path


@pytest.mark.parametrize(
    ("version", "mode", "zipped"),
    [
        ("4.8.1", "nczarr", False),
        ("4.9.0", "nczarr", False),
        ("4.9.2", "nczarr", False),
        (None, "nczarr", False),
        ("4.9.0", "nczarr", True),
        (None, "nczarr", True),
        (None, "zarr,v3", False),
    ],
)
def test_gdal_reads_nczarr_stores_of_every_dialect_zipped_or_not_and_zarr_v3(tmp_path, version, mode, zipped):
    source = small_netcdf(tmp_path / "source.nc")
    store = tmp_path / "store.file"
    copy(str(source), f"file://{store}#mode={mode},file", netcdf_version=version)
    name = f'ZARR:"{store}"'
    if zipped:
        archive = zip_store(store, tmp_path / "store.zip")
        name = f'ZARR:"/vsizip/{archive}"'
    arrays = read_all(name)
    with xr.open_dataset(source, engine="netcdf4", decode_cf=False) as expected:
        for variable in ("time", "t", "packed", "scalar"):
            assert variable in arrays, (variable, sorted(arrays))
            np.testing.assert_array_equal(arrays[variable], expected[variable].values.astype("f8"), variable)
