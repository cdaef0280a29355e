"""End to end: ``virtualize()`` of GeoTIFFs, read back through nczmap's xarray engine and, in a process that
never imports nczmap, through fsspec's ReferenceFileSystem and zarr-python (imagecodecs-numcodecs; the
partial-strip case needs nczmap installed, so that its ``nczmap.pad`` codec's ``numcodecs.codecs`` entry
point is in the environment).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
xr = pytest.importorskip("xarray")
pyproj = pytest.importorskip("pyproj")
pytest.importorskip("imagecodecs.numcodecs")
from rasterio.transform import from_origin  # noqa: E402

CASES = {
    "tiled-deflate-pred2-pixel": ("int16", 3, {"tiled": True, "blockxsize": 32, "blockysize": 32,
                                               "compress": "deflate", "predictor": 2}),
    "tiled-zstd-pred3-band-big": ("float32", 2, {"tiled": True, "blockxsize": 32, "blockysize": 32,
                                                 "compress": "zstd", "predictor": 3, "interleave": "band",
                                                 "endianness": "big"}),
    "strip-lzw-partial": ("uint16", 1, {"compress": "lzw", "predictor": 2, "blockysize": 7}),
    "cog-packbits": ("uint8", 1, {"driver": "COG", "compress": "packbits", "blocksize": 64}),
}  # fmt: skip


def _write(path, dtype: str, bands: int, options: dict, nodata=None):
    rng = np.random.default_rng(5)
    data = (rng.standard_normal((bands, 75, 90)) * 100).astype(dtype)
    profile = {
        "driver": "GTiff",
        "width": 90,
        "height": 75,
        "count": bands,
        "dtype": dtype,
        "crs": "EPSG:32633",
        "transform": from_origin(500000, 6000000, 30, 30),
        "nodata": nodata,
        **options,
    }
    with rasterio.open(path, "w", **profile) as dataset:
        dataset.write(data)
    return path


def _expected(path):
    with rasterio.open(path) as dataset:
        data = dataset.read()
        rows, cols = np.arange(dataset.height), np.arange(dataset.width)
        xs, _ = rasterio.transform.xy(dataset.transform, np.zeros_like(cols), cols)
        _, ys = rasterio.transform.xy(dataset.transform, rows, np.zeros_like(rows))
        return data, np.asarray(xs), np.asarray(ys), dataset.crs.to_wkt()


@pytest.mark.parametrize("case", list(CASES))
def test_virtualized_tiff_opens_in_xarray(tmp_path, case):
    from nczmap.integrations.virtualize import virtualize

    dtype, bands, options = CASES[case]
    source = _write(tmp_path / "image.tif", dtype, bands, options, nodata=-1 if dtype[0] != "u" else None)
    refs = tmp_path / "refs.json"
    virtualize([source], refs)
    data, xs, ys, wkt = _expected(source)
    url = f"file://{refs}#mode=nczarr,manifest"
    with xr.open_dataset(url, engine="nczmap", mask_and_scale=False) as ds:
        values = ds["band_data"]
        order = [d for d in ("band", "y", "x") if d in values.dims]
        got = values.transpose(*order).values
        np.testing.assert_array_equal(got.reshape(data.shape), data)
        np.testing.assert_allclose(ds["x"].values, xs, atol=1e-9)
        np.testing.assert_allclose(ds["y"].values, ys, atol=1e-9)
        assert pyproj.CRS.from_wkt(ds["spatial_ref"].attrs["crs_wkt"]) == pyproj.CRS.from_wkt(wkt)
        assert values.attrs.get("grid_mapping", ds["band_data"].encoding.get("grid_mapping")) == "spatial_ref"


READER = textwrap.dedent(
    """
    import json, sys
    import fsspec, numpy as np, zarr

    refs_path, out_path = sys.argv[1], sys.argv[2]
    fs = fsspec.filesystem("reference", fo=refs_path, remote_protocol="file")
    store = zarr.storage.FsspecStore(fs, read_only=True, path="")
    group = zarr.open_group(store, mode="r", zarr_format=2)
    array = group["band_data"]
    np.save(out_path, array[...])
    print(json.dumps({"dims": array.attrs.get("_ARRAY_DIMENSIONS"),
                      "nczmap": any(m.startswith("nczmap") for m in sys.modules)}))
    """
)


@pytest.mark.parametrize(
    "case", ["tiled-deflate-pred2-pixel", "tiled-zstd-pred3-band-big", "strip-lzw-partial"]
)
def test_refs_read_by_zarr_python_without_nczmap(tmp_path, case):
    from nczmap.integrations.virtualize import virtualize

    dtype, bands, options = CASES[case]
    source = _write(tmp_path / "image.tif", dtype, bands, options)
    refs = tmp_path / "refs.json"
    virtualize([source], refs)
    script = tmp_path / "read.py"
    script.write_text(READER)
    out = tmp_path / "values.npy"
    result = subprocess.run(
        [sys.executable, str(script), str(refs), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # only the padding codec of a partial last strip comes from nczmap (through its entry point)
    assert report["nczmap"] == ("partial" in case)
    data, *_ = _expected(source)
    values = np.load(out)
    dims = report["dims"] or ["band", "y", "x"][-values.ndim :]
    order = [dims.index(d) for d in ("band", "y", "x") if d in dims]
    np.testing.assert_array_equal(values.transpose(order).reshape(data.shape), data)
