"""Acceptance tests of issue 15: collections of netCDF-4, netCDF-3 and COG files virtualized into one dataset.

Every expectation comes from a real component other than nczmap: xarray's ``open_mfdataset`` over the
netCDF-4 files themselves (netCDF4-python, libnetcdf, HDF5), Debian's ``ncgen``/``ncdump`` (netcdf-bin
4.9.0) for netCDF-3, rasterio (GDAL) and pyproj for GeoTIFFs. No mocks: the manifests are written by
``virtualize()`` or ``python -m nczmap virtualize`` and read back through nczmap's xarray engine, its
``ncdump`` and ``nczmap.open_dataset``.
"""

from __future__ import annotations

import datetime
import json
import random
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
from test_virtualize import CDL_DIR, CORPUS, NCDUMP, NCGEN, TIMEOUT, manifest_url, nczmap_command

import nczmap
from nczmap import FormatError

netCDF4 = pytest.importorskip("netCDF4")
xr = pytest.importorskip("xarray")
pytest.importorskip("dask")  # open_mfdataset

from nczmap.integrations.virtualize import VirtualizeWarning, virtualize  # noqa: E402

try:  # only the COG tests need it
    import rasterio
    from rasterio.transform import from_origin
except ImportError:
    rasterio = None


def references(manifest: Path) -> dict[str, object]:
    """The kerchunk JSON manifest's ``refs``: key -> inline text or ``[url, offset, length]``."""
    return json.loads(manifest.read_text())["refs"]


# ================================================================ 1. 100 daily netCDF-4 files, --concat time
DAYS = 100
LAT, LON = 18, 36


def write_day(path: Path, day: int) -> None:
    """One day: ``time`` unlimited of length 1 with its coordinate chunked as netCDF chooses (512),
    ``field(time, lat, lon)`` float32 zlib, ``lat``/``lon`` coordinates with attributes, global
    attributes."""
    rng = np.random.default_rng(day)
    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "daily field"
        ds.institution = "nczmap tests"
        ds.Conventions = "CF-1.8"
        ds.version = np.int32(3)
        ds.createDimension("time", None)
        ds.createDimension("lat", LAT)
        ds.createDimension("lon", LON)
        time = ds.createVariable("time", "f8", ("time",))
        time.units = "days since 2020-01-01"
        time.calendar = "standard"
        time.standard_name = "time"
        time[:] = [day]
        lat = ds.createVariable("lat", "f4", ("lat",))
        lat.units = "degrees_north"
        lat.standard_name = "latitude"
        lat[:] = np.linspace(-85, 85, LAT)
        lon = ds.createVariable("lon", "f4", ("lon",))
        lon.units = "degrees_east"
        lon.standard_name = "longitude"
        lon.valid_range = np.array([0, 360], dtype="f4")
        lon[:] = np.linspace(0, 350, LON)
        field = ds.createVariable("field", "f4", ("time", "lat", "lon"), zlib=True)
        field.units = "K"
        field.long_name = "surface temperature"
        field[:] = (rng.random((1, LAT, LON), dtype="f4") * 40 + 260).astype("f4")


@pytest.fixture(scope="module")
def daily(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("daily")
    files = [folder / f"day{day:03d}.nc" for day in range(DAYS)]
    for day, path in enumerate(files):
        write_day(path, day)
    with netCDF4.Dataset(files[0]) as ds:  # the trap of the issue: netCDF's default chunking of time
        assert ds["time"].chunking() == [512]
    return files


def assert_identical_to_mfdataset(url: str, files: list[Path]) -> None:
    """The virtual dataset equals ``open_mfdataset`` of the files: values, coordinates, attributes, and
    the encodings that decide values (storage dtypes, time units and calendar, fill values)."""
    with (
        xr.open_dataset(url, engine="nczmap") as ours,
        xr.open_mfdataset(files, combine="nested", concat_dim="time") as theirs,
    ):
        ours, theirs = ours.load(), theirs.load()
        xr.testing.assert_identical(ours, theirs)
        assert list(ours.variables) == list(theirs.variables)
        assert ours["time"].dtype.kind == "M"  # decoded to datetime64
        for name, variable in theirs.variables.items():
            mine = ours[name]
            assert mine.dtype == variable.dtype, name
            for key in ("dtype", "units", "calendar", "_FillValue", "scale_factor", "add_offset"):
                assert mine.encoding.get(key) == variable.encoding.get(key), (name, key)


def test_100_daily_files_joined_along_time_are_open_mfdataset(daily):
    refs = daily[0].parent / "api.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error", VirtualizeWarning)  # complete: nothing is left out
        result = virtualize(daily, refs, concat="time")
    assert result.refused == [] and result.skipped == []
    assert "/time" in result.loaded  # the joined coordinate is loaded, not referenced
    assert "/field" not in result.loaded and result.references >= DAYS  # the field is references
    refs_by_key = references(refs)
    field_refs = {k: v for k, v in refs_by_key.items() if k.startswith("field/") and isinstance(v, list)}
    assert {v[0] for v in field_refs.values()} == {p.as_uri() for p in daily}
    assert_identical_to_mfdataset(manifest_url(refs), daily)
    with xr.open_dataset(manifest_url(refs), engine="nczmap") as ds:
        assert ds["field"].dtype == np.float32 and ds["field"].encoding["dtype"] == np.float32
        assert ds["time"].encoding["units"] == "days since 2020-01-01"


def test_cli_expands_a_quoted_glob_to_the_same_dataset(daily):
    refs = daily[0].parent / "cli.json"
    pattern = str(daily[0].parent / "*.nc")  # no shell: nczmap itself expands it
    done = nczmap_command("virtualize", pattern, refs, "--concat", "time")
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""  # no warning: complete
    assert set(json.loads(refs.read_text())["nczmap"]["sources"]) == {p.as_uri() for p in daily}
    assert_identical_to_mfdataset(manifest_url(refs), daily)


def test_parquet_output_gives_the_same_dataset(daily):
    pytest.importorskip("pyarrow")
    refs = daily[0].parent / "refs.parq"
    result = virtualize(daily, refs, concat="time")
    assert result.refused == [] and refs.is_dir()
    assert_identical_to_mfdataset(manifest_url(refs), daily)


STATIONS = ["Aberdeen", "Bergen", "Cádiz", "Dún Laoghaire", "Esbjerg"]
RECORDS = 3  # per file; ``misaligned`` is chunked by 2 along time, so file boundaries cut its chunks


def write_stations(path: Path, part: int) -> None:
    rng = np.random.default_rng(100 + part)
    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "station series"
        ds.createDimension("time", None)
        ds.createDimension("station", len(STATIONS))
        time = ds.createVariable("time", "i4", ("time",))
        time.units = "hours since 2021-06-01 00:00:00"
        time[:] = np.arange(part * RECORDS, (part + 1) * RECORDS) * 6
        station = ds.createVariable("station", str, ("station",))
        station.long_name = "station name"
        station[:] = np.array(STATIONS, dtype=object)
        ds.createDimension("depth", 10)
        aligned = ds.createVariable(
            "aligned", "f8", ("time", "station", "depth"), chunksizes=(1, len(STATIONS), 10)
        )
        aligned.units = "m"
        aligned[:] = rng.normal(size=(RECORDS, len(STATIONS), 10))
        misaligned = ds.createVariable(
            "misaligned", "i2", ("time", "station"), zlib=True, chunksizes=(2, 2), fill_value=np.int16(-99)
        )
        misaligned.long_name = "chunks straddling the files' boundaries"
        misaligned[:] = rng.integers(-50, 50, (RECORDS, len(STATIONS))).astype("i2")


@pytest.mark.parametrize("suffix", [".json", ".parq"])
def test_strings_and_misaligned_chunks_are_still_complete_and_identical(tmp_path, suffix):
    if suffix == ".parq":
        pytest.importorskip("pyarrow")
    files = [tmp_path / f"stations{part}.nc" for part in range(6)]
    for part, path in enumerate(files):
        write_stations(path, part)
    refs = tmp_path / f"refs{suffix}"
    with warnings.catch_warnings():
        warnings.simplefilter("error", VirtualizeWarning)
        result = virtualize(files, refs, concat="time")
    assert result.refused == []
    assert sorted(result.loaded) == ["/misaligned", "/station", "/time"]
    assert result.references >= len(files) * RECORDS  # ``aligned``: one reference per record
    if suffix == ".json":
        assert any(k.startswith("aligned/") and isinstance(v, list) for k, v in references(refs).items())
    assert_identical_to_mfdataset(manifest_url(refs), files)
    with xr.open_dataset(manifest_url(refs), engine="nczmap") as ds:
        assert ds["station"].values.tolist() == STATIONS
        assert ds["misaligned"].encoding["_FillValue"] == -99


# ============================================================ 2. netCDF-3 of every CDL netCDF-3 can hold
KINDS = {"nc3": "classic", "nc6": "64-bit offset", "nc5": "CDF-5"}
# ncdump breaks a char attribute after each embedded newline in a netCDF-3 file (pr_att_string: not for
# NC_FORMAT_NETCDF4); nczmap's ncdump of the NCZarr manifest dumps it as netcdf-c dumps NCZarr, unbroken.
NEWLINE_ATTRIBUTES = {"chars"}


@pytest.fixture(scope="session")
def netcdf3_files(tmp_path_factory) -> dict[tuple[str, str], Path | None]:
    """``(cdl name, ncgen kind) -> file``, or None where ncgen refuses (the CDL is not netCDF-3 data).
    ncgen refuses some CDLs with exit status 0 and no file (``-k or _Format conflicts with enhanced CDL
    input``): the file's absence is the refusal."""
    if NCGEN is None or NCDUMP is None:
        pytest.skip("netcdf-c ncgen/ncdump not on PATH")
    folder = tmp_path_factory.mktemp("netcdf3")
    made: dict[tuple[str, str], Path | None] = {}
    for name in CORPUS:
        for kind in KINDS:
            target = folder / kind / f"{name}.nc"
            target.parent.mkdir(exist_ok=True)
            done = subprocess.run(
                [NCGEN, "-k", kind, "-o", str(target), str(CDL_DIR / f"{name}.cdl")],
                capture_output=True,
                timeout=TIMEOUT,
                check=False,
            )
            made[name, kind] = target if done.returncode == 0 and target.is_file() else None
    return made


def _holdable() -> list[tuple[str, str]]:
    """The (CDL, ncgen kind) pairs ncgen writes: the CDLs netCDF-3 can hold, in each format. Found when
    the tests are collected, so no test is made (and skipped) for a pair that cannot exist."""
    if NCGEN is None:
        return []
    import tempfile

    pairs = []
    with tempfile.TemporaryDirectory() as folder:
        for name in CORPUS:
            for kind in KINDS:
                target = Path(folder) / f"{name}-{kind}.nc"
                done = subprocess.run(
                    [NCGEN, "-k", kind, "-o", str(target), str(CDL_DIR / f"{name}.cdl")],
                    capture_output=True,
                    timeout=TIMEOUT,
                    check=False,
                )
                if done.returncode == 0 and target.is_file():
                    pairs.append((name, kind))
    return pairs


HOLDABLE = _holdable()


def netcdf3_source(netcdf3_files, name: str, kind: str) -> Path:
    source = netcdf3_files[name, kind]
    if source is None:
        pytest.skip(f"ncgen -k {kind} refuses {name}.cdl: not {KINDS[kind]} netCDF-3 data")
    with open(source, "rb") as handle:
        assert handle.read(4) == {"nc3": b"CDF\x01", "nc6": b"CDF\x02", "nc5": b"CDF\x05"}[kind]
    return source


def test_the_corpus_has_netcdf3_files_of_every_format(netcdf3_files):
    holdable = {kind: sorted(n for (n, k), p in netcdf3_files.items() if k == kind and p) for kind in KINDS}
    assert all(holdable.values()), holdable
    assert {"types", "scalars"} <= set(holdable["nc5"])  # every numeric type of CDF-5


@pytest.mark.parametrize("name, kind", HOLDABLE)
def test_netcdf3_corpus_manifest_dumps_as_ncdump_dumps_the_file(tmp_path, netcdf3_files, name, kind):
    source = netcdf3_source(netcdf3_files, name, kind)
    refs = tmp_path / "refs.json"
    shutil.copy(source, tmp_path / source.name)  # beside its manifest: the default grant
    source = tmp_path / source.name
    done = nczmap_command("virtualize", source, refs)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    listing = nczmap_command("ncdump", "-n", name, manifest_url(refs))
    assert listing.returncode == 0, listing.stderr
    expected = subprocess.run([NCDUMP, str(source)], capture_output=True, timeout=TIMEOUT, check=True).stdout
    assert expected.startswith(f"netcdf {name} {{".encode())
    actual = listing.stdout
    if name in NEWLINE_ATTRIBUTES:  # ncdump breaks a netCDF-3 char attribute after each newline
        assert b'\\n",\n\t\t\t"' in expected
    assert actual.decode(errors="replace") == expected.decode(errors="replace")


@pytest.mark.parametrize("name, kind", HOLDABLE)
def test_netcdf3_corpus_values_equal_netcdf4_python(tmp_path, netcdf3_files, name, kind):
    source = netcdf3_source(netcdf3_files, name, kind)
    refs = tmp_path / "refs.json"
    shutil.copy(source, tmp_path / source.name)
    source = tmp_path / source.name
    result = virtualize(source, refs)
    assert result.refused == []
    with netCDF4.Dataset(source) as theirs, nczmap.open_dataset(manifest_url(refs)) as ours:
        theirs.set_auto_maskandscale(False)
        theirs.set_auto_chartostring(False)
        assert list(ours.variables) == list(theirs.variables)
        assert list(ours.dimensions) == list(theirs.dimensions)
        for dim_name, dim in theirs.dimensions.items():
            assert ours.dimensions[dim_name].size == len(dim), dim_name
            assert ours.dimensions[dim_name].unlimited == dim.isunlimited(), dim_name
        for var_name, variable in theirs.variables.items():
            want = np.asarray(variable[...])
            got = np.asarray(ours.variables[var_name][...])
            assert got.shape == want.shape, var_name
            assert got.dtype == want.dtype.newbyteorder("="), var_name
            assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), var_name
            assert sorted(ours.variables[var_name].attrs) == sorted(variable.ncattrs()), var_name


# ========================================================================== 3. a COG time series
NODATA = -32768
DATES = ["20200101", "20200102", "20200104", "20200105", "20200106"]  # 2020-01-03 is missing


def write_cog(path: Path, seed: int, width: int = 150, height: int = 100) -> None:
    rng = np.random.default_rng(seed)
    data = rng.integers(-2000, 3500, (1, height, width)).astype("int16")
    data[0, :9, :13] = NODATA  # a corner of nodata
    data[0, rng.integers(0, height, 40), rng.integers(0, width, 40)] = NODATA
    profile = {
        "driver": "COG",
        "width": width,
        "height": height,
        "count": 1,
        "dtype": "int16",
        "crs": "EPSG:32633",
        "transform": from_origin(399960.0, 5500020.0, 250.0, 250.0),
        "nodata": NODATA,
        "compress": "ZSTD",
        "predictor": 2,
        "blocksize": 64,
    }
    with rasterio.open(path, "w", **profile) as dataset:
        dataset.write(data)


@pytest.fixture
def cogs(tmp_path) -> list[Path]:
    if rasterio is None:
        pytest.skip("rasterio is not installed")
    folder = tmp_path / "sst"
    folder.mkdir()
    files = [folder / f"sst_{date}.tif" for date in DATES]
    for seed, path in enumerate(files):
        write_cog(path, seed)
    with rasterio.open(files[0]) as dataset:  # what the issue describes, as GDAL wrote it
        structure = dataset.tags(ns="IMAGE_STRUCTURE")
        assert (structure["LAYOUT"], structure["COMPRESSION"], structure["PREDICTOR"]) == ("COG", "ZSTD", "2")
        assert dataset.profile["tiled"] and dataset.crs.to_epsg() == 32633
    return files


def expected_cogs(files: list[Path]):
    """rasterio's reading: the stacked band with nodata as NaN (xarray's decoding of _FillValue into
    float32), pixel-centre x and y, the CRS."""
    stack, xs, ys = [], None, None
    for path in files:
        with rasterio.open(path) as dataset:
            stack.append(dataset.read(1))
            rows, cols = np.arange(dataset.height), np.arange(dataset.width)
            xs, _ = rasterio.transform.xy(dataset.transform, np.zeros_like(cols), cols)
            _, ys = rasterio.transform.xy(dataset.transform, rows, np.zeros_like(rows))
    raw = np.stack(stack)
    masked = np.where(raw == NODATA, np.nan, raw).astype("float32")
    return raw, masked, np.asarray(xs), np.asarray(ys)


def dates_of(files: list[Path]) -> np.ndarray:
    names = [re.search(r"\d{8}", p.name).group(0) for p in files]
    return np.array([datetime.datetime.strptime(n, "%Y%m%d") for n in names], dtype="datetime64[ns]")


def assert_cog_series(url: str, files: list[Path]) -> None:
    pyproj = pytest.importorskip("pyproj")
    files = sorted(files, key=lambda p: p.name)
    raw, masked, xs, ys = expected_cogs(files)
    with xr.open_dataset(url, engine="nczmap") as ds:
        assert ds["time"].dtype.kind == "M"
        np.testing.assert_array_equal(ds["time"].values, dates_of(files))
        band = ds["band_data"]
        assert band.dims == ("time", "y", "x")
        assert band.encoding["dtype"] == np.int16 and band.encoding["_FillValue"] == NODATA
        assert band.dtype == np.float32
        np.testing.assert_array_equal(band.values, masked)  # NaN where rasterio reads nodata
        np.testing.assert_allclose(ds["x"].values, xs, rtol=0, atol=1e-9)
        np.testing.assert_allclose(ds["y"].values, ys, rtol=0, atol=1e-9)
        assert band.attrs.get("grid_mapping", band.encoding.get("grid_mapping")) == "spatial_ref"
        assert pyproj.CRS.from_wkt(ds["spatial_ref"].attrs["crs_wkt"]) == pyproj.CRS.from_epsg(32633)
    with xr.open_dataset(url, engine="nczmap", mask_and_scale=False) as ds:
        np.testing.assert_array_equal(ds["band_data"].values, raw)


def test_cog_time_series_from_a_glob(cogs):
    refs = cogs[0].parent / "refs.json"
    with pytest.warns(VirtualizeWarning, match=r"gap.*2020-01-02.*2020-01-04") as caught:
        result = virtualize(str(cogs[0].parent / "sst_*.tif"), refs, new_dim="time=%Y%m%d")
    assert len(caught) == 1
    assert result.refused == [] and result.skipped == [] and len(result.notes) == 1
    assert result.references > 0 and "/band_data" not in result.loaded
    assert_cog_series(manifest_url(refs), cogs)


def test_cog_time_series_is_sorted_by_date_whatever_the_order_given(cogs):
    shuffled = list(cogs)
    random.Random(3).shuffle(shuffled)
    assert shuffled != cogs
    refs = cogs[0].parent / "refs.json"
    with pytest.warns(VirtualizeWarning, match="gap"):
        virtualize(shuffled, refs, new_dim=("time", "%Y%m%d"))
    assert_cog_series(manifest_url(refs), cogs)


def test_cog_time_series_through_the_cli(cogs):
    refs = cogs[0].parent / "refs.json"
    done = nczmap_command("virtualize", cogs[0].parent / "*.tif", refs, "--new-dim", "time=%Y%m%d")
    assert done.returncode == 0, done.stderr
    assert b"gap" in done.stderr and b"2020-01-04" in done.stderr
    assert_cog_series(manifest_url(refs), cogs)


def test_two_cogs_of_the_same_date_are_an_error_naming_both(cogs):
    twin = cogs[0].parent / "again_sst_20200104.tif"
    write_cog(twin, 99)
    refs = cogs[0].parent / "refs.json"
    with pytest.raises(FormatError) as raised:
        virtualize([*cogs, twin], refs, new_dim="time=%Y%m%d")
    assert "sst_20200104.tif" in str(raised.value) and "again_sst_20200104.tif" in str(raised.value)
    assert "2020-01-04" in str(raised.value)
    assert not refs.exists()


@pytest.mark.parametrize(
    ("new_dim", "message"),
    [("x/y=%Y%m%d", "illegal new dimension name 'x/y'"), (("x/y", "%Y"), "'x/y'"), ("time=%Q", "%Q"),
     ("time", "NAME=PATTERN"), ("=%Y", "NAME=PATTERN")],
)  # fmt: skip
def test_a_bad_new_dim_is_an_error_before_any_source_is_read(tmp_path, new_dim, message):
    missing = [tmp_path / "absent_20200101.nc", tmp_path / "absent_20200102.nc"]  # never opened
    with pytest.raises(FormatError, match=re.escape(message)):
        virtualize(missing, tmp_path / "refs.json", new_dim=new_dim)
    assert not (tmp_path / "refs.json").exists()


def test_a_cog_of_another_shape_is_an_error_naming_it_or_skipped(cogs):
    odd = cogs[0].parent / "sst_20200107.tif"
    write_cog(odd, 42, width=140)
    refs = cogs[0].parent / "refs.json"
    with pytest.raises(FormatError, match=re.escape(str(odd))):
        virtualize([*cogs, odd], refs, new_dim="time=%Y%m%d")
    assert not refs.exists()
    done = nczmap_command("virtualize", *cogs, odd, refs, "--new-dim", "time=%Y%m%d")
    assert done.returncode == 1 and str(odd).encode() in done.stderr and b"Traceback" not in done.stderr

    with pytest.warns(VirtualizeWarning) as caught:
        result = virtualize([*cogs, odd], refs, new_dim="time=%Y%m%d", skip_mismatched=True)
    assert [source for source, _ in result.skipped] == [str(odd)]
    assert "140" in result.skipped[0][1] or "150" in result.skipped[0][1]  # says what differs
    assert any(str(odd) in str(w.message) and "left out" in str(w.message) for w in caught)
    assert_cog_series(manifest_url(refs), cogs)  # the other five, the time axis without the 7th

    done = nczmap_command(
        "virtualize", *cogs, odd, cogs[0].parent / "cli.json", "--new-dim", "time=%Y%m%d", "--skip-mismatched"
    )
    assert done.returncode == 0, done.stderr
    assert str(odd).encode() in done.stderr and b"left out" in done.stderr
    assert_cog_series(manifest_url(cogs[0].parent / "cli.json"), cogs)


# =================================================================================== 4. load= / --load
def write_small(path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    values = {
        "lat": np.linspace(-60, 60, 40).astype("f4"),
        "lon": np.linspace(0, 350, 80).astype("f8"),
        "field": rng.normal(size=(40, 80)).astype("f4"),
        "counts": rng.integers(0, 1000, (40, 80)).astype("i4"),
    }
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("lat", 40)
        ds.createDimension("lon", 80)
        ds.createVariable("lat", "f4", ("lat",))[:] = values["lat"]
        ds.createVariable("lon", "f8", ("lon",), contiguous=True)[:] = values["lon"]
        ds.createVariable("field", "f4", ("lat", "lon"), zlib=True, chunksizes=(10, 40))[:] = values["field"]
        ds.createVariable("counts", "i4", ("lat", "lon"), contiguous=True)[:] = values["counts"]
    return values


def source_references(refs: Path, variable: str, sources: set[str]) -> list[str]:
    """The chunk keys of ``variable`` that refer to bytes of one of ``sources``."""
    return [
        key
        for key, value in references(refs).items()
        if key.startswith(variable + "/") and isinstance(value, list) and value[0] in sources
    ]


@pytest.mark.parametrize("how", ["api", "cli"])
def test_loaded_variables_are_data_not_references(tmp_path, how):
    source = tmp_path / "small.nc"
    values = write_small(source)
    refs = tmp_path / "refs.json"
    if how == "api":
        result = virtualize(source, refs, load=["lat", "/field"])
        assert sorted(result.loaded) == ["/field", "/lat"]
    else:
        done = nczmap_command("virtualize", source, refs, "--load", "lat,field")
        assert done.returncode == 0 and done.stderr == b"", done.stderr
    uri = {source.as_uri()}
    assert source_references(refs, "lat", uri) == [] and source_references(refs, "field", uri) == []
    assert source_references(refs, "counts", uri) and source_references(refs, "lon", uri)  # the others
    document = references(refs)
    assert [k for k in document if k.startswith("field/") and not k.split("/")[-1].startswith(".")]
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        for name, want in values.items():
            got = ds.variables[name][...]
            assert got.dtype == want.dtype and np.array_equal(got, want), name


def test_a_loaded_cog_band_is_data_with_rasterios_values(cogs):
    """TIFF's parser gives no values of its own: loading decodes the tiles it would have referenced."""
    refs = cogs[0].parent / "refs.json"
    with pytest.warns(VirtualizeWarning, match="gap") as caught:
        result = virtualize(cogs, refs, new_dim="time=%Y%m%d", load="/band_data")
    assert len(caught) == 1 and result.refused == []
    assert "/band_data" in result.loaded and "/overview_1/band_data" not in result.loaded
    assert source_references(refs, "band_data", {p.as_uri() for p in cogs}) == []
    assert source_references(refs, "overview_1/band_data", {p.as_uri() for p in cogs})
    assert_cog_series(manifest_url(refs), cogs)


def test_loading_an_unknown_variable_is_an_error_naming_it(tmp_path):
    source = tmp_path / "small.nc"
    write_small(source)
    refs = tmp_path / "refs.json"
    with pytest.raises(FormatError, match="no_such_variable"):
        virtualize(source, refs, load="lat,no_such_variable")
    assert not refs.exists()
    done = nczmap_command("virtualize", source, refs, "--load", "no_such_variable")
    assert done.returncode == 1 and b"no_such_variable" in done.stderr and b"Traceback" not in done.stderr


# ================================================================================ 5. --max-chunk-bytes
BIG = np.arange(1536 * 1024, dtype="f8").reshape(1536, 1024)  # 12 MiB


def write_big(path: Path, fmt: str) -> None:
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("y", BIG.shape[0])
        ds.createDimension("x", BIG.shape[1])
        options = {"contiguous": True} if fmt == "NETCDF4" else {}
        ds.createVariable("v", "f8", ("y", "x"), **options)[:] = BIG


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_64BIT_OFFSET"])
@pytest.mark.parametrize("how", ["api", "cli"])
def test_max_chunk_bytes_bounds_the_references_of_contiguous_data(tmp_path, fmt, how):
    source = tmp_path / "big.nc"
    write_big(source, fmt)
    if fmt == "NETCDF4":
        with netCDF4.Dataset(source) as ds:
            assert ds["v"].chunking() == "contiguous"
    refs = tmp_path / "refs.json"
    limit = 1 << 20
    if how == "api":
        virtualize(source, refs, max_chunk_bytes=limit)
    else:
        done = nczmap_command("virtualize", source, refs, "--max-chunk-bytes", str(limit))
        assert done.returncode == 0, done.stderr
    ranges = [v for k, v in references(refs).items() if k.startswith("v/") and isinstance(v, list)]
    assert len(ranges) >= BIG.nbytes // limit
    assert all(value[0] == source.as_uri() and 0 < value[2] <= limit for value in ranges), ranges
    assert sum(value[2] for value in ranges) == BIG.nbytes  # the whole variable, each byte once
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        variable = ds.variables["v"]
        assert np.array_equal(variable[...], BIG)
        assert np.array_equal(variable[1000:1003, 5:9], BIG[1000:1003, 5:9])


# =================================================================================== 6. bad sources
def test_a_source_of_no_known_format_is_an_error_naming_it(tmp_path):
    good = tmp_path / "small.nc"
    write_small(good)
    text = tmp_path / "notes.nc"
    text.write_bytes(b"these are notes, not data\n" * 20)
    refs = tmp_path / "refs.json"
    with pytest.raises(FormatError, match=re.escape(str(text)) + ".*not a file nczmap can virtualize"):
        virtualize([good, text], refs, concat="lat")
    assert not refs.exists()
    done = nczmap_command("virtualize", text, refs)
    assert done.returncode == 1 and str(text).encode() in done.stderr and b"Traceback" not in done.stderr


def test_a_glob_matching_nothing_is_an_error_naming_the_pattern(tmp_path):
    pattern = str(tmp_path / "nothing" / "*.nc")
    refs = tmp_path / "refs.json"
    with pytest.raises(FormatError, match=re.escape(pattern)):
        virtualize(pattern, refs, concat="time")
    done = nczmap_command("virtualize", pattern, refs, "--concat", "time")
    assert done.returncode == 1 and pattern.encode() in done.stderr and b"Traceback" not in done.stderr
    assert not refs.exists()


def test_a_gap_left_by_a_skipped_cog_is_reported(cogs):
    filler = cogs[0].parent / "sst_20200103.tif"  # would close the gap, but is of another shape
    write_cog(filler, 7, height=90)
    refs = cogs[0].parent / "refs.json"
    with pytest.warns(VirtualizeWarning) as caught:
        result = virtualize([*cogs, filler], refs, new_dim="time=%Y%m%d", skip_mismatched=True)
    assert [source for source, _ in result.skipped] == [str(filler)]
    messages = [str(w.message) for w in caught]
    assert any("gap" in m and "2020-01-02" in m and "2020-01-04" in m for m in messages), messages
    assert_cog_series(manifest_url(refs), cogs)
