"""Every code snippet of README.md, run for real, in README order (issue 26, 4a: the README cannot drift).

``readme_snippets`` finds the snippets (every fenced block; inline commands and ``nczmap`` calls that are
complete) and moves their example locations into a sandbox: ``/data`` and ``/archive`` into a temporary
directory, ``s3://bucket/`` onto the moto S3 server of ``conftest.s3_server``. The sandbox holds beforehand
what the snippets read (``Sandbox.build`` says what, made with nczmap, netCDF4-python, rasterio and
``nczmap.virtualize``), so that each snippet's comments hold: ``AFTER`` turns them (and what the prose around
a snippet promises) into assertions, run right after the statement or command on that README line. Python
snippets share one namespace (they are a story: the second uses the first's ``import nczmap``) and run
in-process with the working directory ``<sandbox>/data`` (the README's ``sst.parq`` is
``file:///data/sst.parq``); shell commands run as ``python -m nczmap`` there. A snippet run alone
(``-k L352``) runs the snippets before it first, so it sees what it would see in a whole run.

The synopsis block is not run: every subcommand and option it names must be in ``nczmap ... --help``.
``bash examples/run.sh`` (not a fenced block) is run by tests/test_example.py.

Nothing here reaches past 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np
import pytest

netCDF4 = pytest.importorskip("netCDF4")
xr = pytest.importorskip("xarray")
rasterio = pytest.importorskip("rasterio")
pytest.importorskip("moto")
pytest.importorskip("icechunk")
pytest.importorskip("dask")
pytest.importorskip("zarr")

import grib_samples  # noqa: E402
import readme_snippets  # noqa: E402
from readme_snippets import HOOK, Snippet, instrument, localize  # noqa: E402
from s3server import BUCKET  # noqa: E402
from store_zip import zip_store  # noqa: E402

import nczmap  # noqa: E402

SNIPPETS = readme_snippets.snippets()

# Snippets not run, and why. Keep it empty: a snippet that is not run is a snippet that can drift.
SKIPPED: dict[str, str] = {}  # Snippet.id -> reason

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
OBS_SHAPE, OBS_CHUNKS = (200, 300), (100, 300)  # to_nczarr's encoding makes them 100x100
MUR_DAYS = [date(2024, 6, d) for d in (1, 2, 3)]  # the catalogue of the remote-archives example
ARCHIVE_DAYS = [date(2026, 3, d) for d in (12, 13, 14)]  # /archive/sst_*.nc before the first virtualize
COG_DAYS = [date(2020, 5, 30), date(2020, 5, 31), date(2020, 6, 1), date(2020, 6, 2)]
COG_SCALE, COG_NODATA, COG_SHAPE = 0.01, -32768, (128, 256)  # two 128x128 tiles
HRRR_CYCLES = (0, 6, 12, 18)  # /data/hrrr/hrrr.t{HH}z.grib2
RUN_DAYS = [date(2024, 3, d) for d in (1, 2, 3)]  # /data/runs/day{D}.zip
RUNS_COMMAND = "nczmap virtualize 'file:///data/runs/day*.zip#mode=nczarr,zip' runs.json --concat time"


# ---------------------------------------------------------------------------------------------- inputs
def sst_values(day: date, shape=(16, 32)) -> np.ndarray:
    return np.random.default_rng(day.toordinal()).normal(20, 2, shape).astype("f4")


def write_sst(path: Path | str, day: date) -> np.ndarray:
    """A daily netCDF-4 file as archives hold them: time (days since that day), lat, lon, sst (zlib; chunks
    large enough to be referenced, not copied into the manifest); or the same as an NCZarr store (``path``
    a libnetcdf URL, ``file://...#mode=nczarr,file``)."""
    if isinstance(path, Path):
        path.parent.mkdir(parents=True, exist_ok=True)
    values = sst_values(day)
    with netCDF4.Dataset(str(path), "w") as nc:
        nc.createDimension("time", None)
        nc.createDimension("lat", values.shape[0])
        nc.createDimension("lon", values.shape[1])
        time = nc.createVariable("time", "f8", ("time",))
        time.units, time.calendar = f"days since {day.isoformat()}", "standard"
        time[:] = [0.5]
        lat = nc.createVariable("lat", "f4", ("lat",))
        lat.units, lat[:] = "degrees_north", np.arange(values.shape[0])
        lon = nc.createVariable("lon", "f4", ("lon",))
        lon.units, lon[:] = "degrees_east", np.arange(values.shape[1])
        sst = nc.createVariable(
            "sst", "f4", ("time", "lat", "lon"), zlib=True, chunksizes=(1, 8, 16), fill_value=np.float32(-999)
        )
        sst.units = "degC"
        sst[0] = values
    return values[np.newaxis]


def write_obs(url: str, netcdf_version: str | None = None) -> None:
    """The README's obs datasets: ``v(y, x)`` int32 in metres (zlib) and a group ``g``."""
    with nczmap.create_dataset(url, netcdf_version=netcdf_version, keep_filters=True) as ds:
        ds.create_dimension("y", OBS_SHAPE[0])
        ds.create_dimension("x", OBS_SHAPE[1])
        v = ds.create_variable("v", ("y", "x"), "i4", fill_value=-1, compression="zlib", chunks=OBS_CHUNKS)
        v.attrs["units"] = "m"
        v[:] = obs_values()
        g = ds.create_group("g")
        g.create_dimension("t", 2)
        g.create_variable("w", ("t",), "f8")[:] = [1.5, 2.5]


def obs_values() -> np.ndarray:
    return np.arange(np.prod(OBS_SHAPE), dtype="i4").reshape(OBS_SHAPE)


def cog_values(day: date) -> np.ndarray:
    """A COG's stored int16 (hundredths of a degree), nodata in one corner."""
    values = np.round(sst_values(day, COG_SHAPE) * 100).astype("i2")
    values[:16, :16] = COG_NODATA
    return values


def write_cog(path: Path, day: date) -> None:
    from rasterio.transform import from_origin

    profile = {
        "driver": "COG", "width": COG_SHAPE[1], "height": COG_SHAPE[0], "count": 1, "dtype": "int16",
        "crs": "EPSG:4326", "transform": from_origin(-12.0, 60.0, 0.25, 0.25), "nodata": COG_NODATA,
        "compress": "ZSTD", "predictor": 2, "blocksize": 128,
    }  # fmt: skip
    with rasterio.open(path, "w", **profile) as cog:
        cog.write(cog_values(day)[np.newaxis])
        cog.scales, cog.offsets = (COG_SCALE,), (0.0,)


class Sandbox:
    """Where the snippets run: ``root`` holds /data and /archive, ``endpoint`` is the S3 server."""

    def __init__(self, root: Path, server) -> None:
        self.root, self.server, self.endpoint = root, server, server.endpoint
        self.data, self.archive = root / "data", root / "archive"
        self.cwd = self.data
        self.namespace: dict[str, object] = {}  # the fenced Python snippets' one namespace
        self.sst: dict[Path, np.ndarray] = {}  # every netCDF file's sst, by path

    def url(self, path: Path, mode: str = "nczarr,manifest") -> str:
        return f"{path.as_uri()}#mode={mode}"

    def serve_catalogue(self) -> None:
        """Three daily COGs on a local web server (and one URL that is not there: --skip-unreadable), listed
        in ``mur_urls.txt``."""
        from test_manifest_http import Server

        server = Server()
        server.thread.start()
        self.catalogue = []
        lines = ["# MUR-like daily SST, one COG a day"]
        for day in MUR_DAYS:
            path = self.root / "upload" / f"mur_{day:%Y%m%d}.tif"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_cog(path, day)
            server.files[f"/mur/{path.name}"] = path.read_bytes()
            self.catalogue.append(path)
            lines.append(f"{server.root}/mur/{path.name}")
        lines.append(f"{server.root}/mur/mur_20240610.tif")  # a day the server does not have
        (self.cwd / "mur_urls.txt").write_text("\n".join(lines) + "\n")
        self.web = server  # stopped when the sandbox is

    def s3(self, key: str, mode: str = "s3") -> str:
        return f"{self.endpoint}/{BUCKET}/{key}#mode={mode}"

    def upload(self, path: Path, key: str) -> None:
        self.server.client().upload_file(str(path), BUCKET, key)

    def nc(self, path: Path, day: date) -> Path:
        self.sst[path] = write_sst(path, day)
        return path

    def run_store(self, path: Path, day: date) -> np.ndarray:
        """An NCZarr store libnetcdf writes, zipped as netcdf-c's zip driver zips one (members stored)."""
        folder = path.with_suffix(".file")
        folder.parent.mkdir(parents=True, exist_ok=True)
        values = write_sst(f"{folder.as_uri()}#mode=nczarr,file", day)
        zip_store(folder, path)
        shutil.rmtree(folder)
        return values

    def build(self) -> None:
        """What the snippets expect to find."""
        self.data.mkdir(parents=True)
        # ## Use, zarr-python, xarray and dask: obs.zip (default dialect) and obs.file (for 4.9.0)
        self.make_obs_zip()
        write_obs(self.url(self.data / "obs.file", "nczarr,file"), "4.9.0")
        # xarray and dask: s3://bucket/run1, a dataset with groups
        write_obs(self.s3("run1", "nczarr,s3"))
        # Virtual datasets (inline): /data/refs.json references /data/archive/ (its own directory's tree);
        # the grant example's manifest, outside /data, references /data/archive/ and s3://bucket/nc/
        local = self.nc(self.data / "archive" / "sst_20250101.nc", date(2025, 1, 1))
        nczmap.virtualize([local], self.data / "refs.json")
        remote = self.nc(self.root / "upload" / "sst_20250102.nc", date(2025, 1, 2))
        self.upload(remote, "nc/sst_20250102.nc")
        self.mixed = self.root / "manifests" / "refs.json"
        self.mixed.parent.mkdir()
        nczmap.virtualize([local, self.s3("nc/sst_20250102.nc")], self.mixed, concat="time")
        # Icechunk (inline copies): /data/refs.parq references /data/src/
        sources = [self.nc(self.data / "src" / f"sst_2025020{d}.nc", date(2025, 2, d)) for d in (1, 2)]
        nczmap.virtualize(sources, self.data / "refs.parq", concat="time")
        # --append: /archive/sst_*.nc (later days are written just before the commands that add them)
        for day in ARCHIVE_DAYS:
            self.nc(self.archive / f"sst_{day:%Y%m%d}.nc", day)
        # NCZarr stores: a model run's days as netcdf-c writes them into zip archives, /data/runs/day*.zip
        self.runs = {day: self.run_store(self.data / "runs" / f"day{day.day}.zip", day) for day in RUN_DAYS}
        # GRIB2: a day of HRRR-like cycles, /data/hrrr/hrrr.t{HH}z.grib2
        (self.data / "hrrr").mkdir()
        self.hrrr = [grib_samples.hrrr(self.data / "hrrr" / f"hrrr.t{h:02d}z.grib2", h) for h in HRRR_CYCLES]
        # A year of daily COGs: s3://bucket/sst/sst_2020*.tif, and one the pattern leaves out
        for day in [date(2019, 12, 31), *COG_DAYS]:
            path = self.root / "upload" / f"sst_{day:%Y%m%d}.tif"
            write_cog(path, day)
            self.upload(path, f"sst/{path.name}")

    def restored_copy(self, ns: dict) -> None:
        """/data/refs.json's source as a copy restored with a coarser clock leaves it: 1 s off."""
        source = self.data / "archive" / "sst_20250101.nc"
        stat = source.stat()
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns - 10**9))
        ns["url"] = self.url(self.data / "refs.json")

    def make_obs_zip(self) -> None:
        write_obs(self.url(self.data / "obs.zip", "nczarr,zip"))

    def manifest_sst(self, path: Path, *grants: Path) -> np.ndarray:
        containers = [f"{grant}/" for grant in grants]
        with nczmap.open_dataset(self.url(path), containers=containers) as ds:
            return ds.variables["sst"][...]

    def files_sst(self, *paths: Path) -> np.ndarray:
        return np.concatenate([self.sst[path] for path in paths])


# ------------------------------------------------------------------------ what the snippets must find
BEFORE: dict[str, Callable[[Sandbox, dict], None]] = {
    # the archive gains a file a day: each appended file appears just before the command appending it
    "nczmap virtualize /archive/sst_20260315.nc sst.parq --append": lambda sb, ns: sb.nc(
        sb.archive / "sst_20260315.nc", date(2026, 3, 15)
    ),
    'nczmap.virtualize(["/archive/sst_20260316.nc"], "sst.parq", append=True)': lambda sb, ns: sb.nc(
        sb.archive / "sst_20260316.nc", date(2026, 3, 16)
    ),
    # obs.zip as it was made: the first snippet's demonstration write replaced v/.zattrs, which in the
    # default (4.9.3+) dialect holds v's dimension names and attributes; the later snippets read the dataset
    'ds = xr.open_dataset("file:///data/obs.zip#mode=nczarr,zip"': lambda sb, ns: sb.make_obs_zip(),
    'store = nczmap.ZarrStore("file:///data/obs.zip#mode=nczarr,zip")': lambda sb, ns: sb.make_obs_zip(),
    # the prose's `url`: a manifest whose references need the grant, and one that needs none
    'containers=["/data/archive/"': lambda sb, ns: ns.update(url=sb.url(sb.mixed)),
    'open_map(url, "r", mtime_tolerance=2)': lambda sb, ns: sb.restored_copy(ns),
    # a catalogue of daily COGs on a web server: a local one, and the list of its URLs
    "nczmap virtualize @mur_urls.txt mur.parq --new-dim time=%Y%m%d --skip-unreadable": (
        lambda sb, ns: sb.serve_catalogue()
    ),
}


def check_search(sb: Sandbox, value, ns) -> None:
    assert value == [".zattrs", ".zgroup", "g", "v"]
    assert value == sorted(value, key=lambda name: name.encode())


def check_range(sb: Sandbox, value, ns) -> None:
    with zipfile.ZipFile(sb.data / "obs.zip") as archive:
        assert value == archive.read("obs/v/0.0")[8:24]


def check_staged(sb: Sandbox, value, ns) -> None:
    with zipfile.ZipFile(sb.data / "obs.zip") as archive:
        assert archive.read("obs/v/.zattrs") != b"{}"  # not yet: staged until close


def check_committed(sb: Sandbox, value, ns) -> None:
    with zipfile.ZipFile(sb.data / "obs.zip") as archive:
        assert archive.read("obs/v/.zattrs") == b"{}"


def check_created(sb: Sandbox, value, ns) -> None:
    with nczmap.open_dataset(sb.url(sb.data / "new.zip", "nczarr,zip")) as ds:
        assert ds.dialect is nczmap.Dialect.NCZARR_UPPER_KEYS  # netcdf_version="4.9.0"
        v = ds.variables["v"]
        assert v[:].tolist() == [1, 2, -1] and v.attrs["units"] == "m"


def check_dialect(sb: Sandbox, value, ns) -> None:
    assert value is nczmap.Dialect.NCZARR_UPPER_KEYS
    assert value.value == "nczarr-4.8.1" and value.releases == "4.8.1-4.9.0"


def check_obs_values(sb: Sandbox, value, ns) -> None:
    values, units = value
    assert np.array_equal(values, obs_values()) and units == "m"


def check_first_virtualize(sb: Sandbox, value, ns) -> None:
    days = [sb.archive / f"sst_{day:%Y%m%d}.nc" for day in ARCHIVE_DAYS]
    assert np.array_equal(sb.manifest_sst(sb.data / "sst.parq", sb.archive), sb.files_sst(*days))


def check_appended(sb: Sandbox, value, ns, count: int = len(ARCHIVE_DAYS) + 1) -> None:
    days = sorted(sb.archive.glob("sst_*.nc"))
    assert len(days) == count
    assert np.array_equal(sb.manifest_sst(sb.data / "sst.parq", sb.archive), sb.files_sst(*days))
    with nczmap.open_dataset(sb.url(sb.data / "sst.parq"), containers=[f"{sb.archive}/"]) as ds:
        time = ds.variables["time"]  # each file's own "days since <its day>", joined in one encoding
        noons = netCDF4.num2date(time[:], time.attrs["units"], time.attrs["calendar"])
        assert [t.isoformat() for t in noons] == [f"2026-03-{12 + n}T12:00:00" for n in range(count)]


def check_cube(sb: Sandbox, value, ns) -> None:
    grant = {f"s3://{BUCKET}/sst/": {"endpoint": sb.endpoint}}
    with nczmap.open_dataset(sb.url(sb.data / "sst.parq"), containers=[grant]) as ds:
        assert ds.variables["band_data"].shape == (len(COG_DAYS), *COG_SHAPE)  # sst_2019... left out


def check_catalogue(sb: Sandbox, value, ns) -> None:
    assert "HEAD" not in sb.web.methods()  # virtualizing made GETs only
    assert "mur_20240610.tif" in value.stderr  # the unreadable one is named, and left out
    grant = [f"{sb.web.root}/mur/"]
    with nczmap.open_dataset(sb.url(sb.data / "mur.parq"), containers=grant) as ds:
        assert ds.variables["band_data"].shape == (len(MUR_DAYS), *COG_SHAPE)  # the missing day left out
        for step, path in enumerate(sb.catalogue):
            with rasterio.open(path) as cog:
                assert np.array_equal(ds.variables["band_data"][step], cog.read(1))


def check_needs_grant(sb: Sandbox, value, ns) -> None:
    ds = ns["ds"]
    assert ds.band_data.chunks is not None  # chunks={}: dask
    ungranted = xr.open_dataset(sb.url(sb.data / "sst.parq"), engine="nczmap", chunks={})
    with ungranted, pytest.raises(nczmap.AccessDenied, match=f"s3://{BUCKET}/sst/"):
        ungranted.band_data.load()


def check_june_mean(sb: Sandbox, value, ns) -> None:
    ds = ns["ds"]
    assert np.issubdtype(ds.time.dtype, np.datetime64)
    assert ds.spatial_ref.attrs["grid_mapping_name"] == "latitude_longitude"
    assert "WGS 84" in ds.spatial_ref.attrs["crs_wkt"]
    assert np.allclose(ds.x, -12.0 + 0.25 * (np.arange(COG_SHAPE[1]) + 0.5))  # pixel centres, degrees east
    assert np.allclose(ds.y, 60.0 - 0.25 * (np.arange(COG_SHAPE[0]) + 0.5))
    june = [cog_values(day) for day in COG_DAYS if day.month == 6]
    expected = np.mean([np.where(v == COG_NODATA, np.nan, v * COG_SCALE) for v in june], axis=0)
    assert value.dims == ("y", "x")
    assert np.allclose(value.values, expected, equal_nan=True)


def check_runs_joined(sb: Sandbox, value, ns) -> None:
    assert value.returncode == 0, value.stderr
    archives = [sb.data / "runs" / f"day{day.day}.zip" for day in RUN_DAYS]
    with nczmap.open_dataset(sb.url(sb.data / "runs.json"), containers=[f"{sb.data / 'runs'}/"]) as ds:
        np.testing.assert_array_equal(ds.variables["sst"][...], np.concatenate(list(sb.runs.values())))
        references = {ds.zmap.reference(f"/sst/{day}.0.0") for day in range(len(RUN_DAYS))}
    assert {r.url.partition("#")[0] for r in references} == {a.as_uri() for a in archives}  # into the zips


def check_hrrr_joined(sb: Sandbox, value, ns) -> None:
    assert value.returncode == 0, value.stderr
    with nczmap.open_dataset(sb.url(sb.data / "hrrr.json"), containers=[f"{sb.data / 'hrrr'}/"]) as ds:
        assert ds.dimensions["time"].size == len(HRRR_CYCLES)
        assert sorted(ds.groups) == ["isobaricInhPa", "surface"]


def check_hrrr_500(sb: Sandbox, value, ns) -> None:
    assert value.dims == ("time", "y", "x")
    for index, path in enumerate(sb.hrrr):
        theirs = grib_samples.cfgrib_dataset(path, filter_by_keys={"typeOfLevel": "isobaricInhPa"})
        assert np.array_equal(value.values[index], theirs.t.sel(isobaricInhPa=500).values)


def check_lazy(sb: Sandbox, value, ns) -> None:
    import dask.array

    assert isinstance(ns["ds"].v.data, dask.array.Array)


def check_tree(sb: Sandbox, value, ns) -> None:
    tree = ns["tree"]
    assert isinstance(tree, xr.DataTree)
    assert np.array_equal(tree["v"].values, obs_values())
    assert tree["g/w"].values.tolist() == [1.5, 2.5]


def check_to_nczarr(sb: Sandbox, value, ns) -> None:
    with nczmap.open_dataset(sb.url(sb.data / "copy.file", "nczarr,file")) as ds:
        assert ds.dialect is nczmap.Dialect.NCZARR_UPPER_KEYS
        v = ds.variables["v"]
        assert v.chunks == (100, 100)  # the encoding's chunksizes
        assert np.array_equal(v[...], obs_values())


def check_read_only(sb: Sandbox, value, ns) -> None:
    assert ns["store"].read_only


def check_zarr(sb: Sandbox, value, ns) -> None:
    import zarr

    assert isinstance(ns["root"], zarr.Group) and sorted(ns["root"].array_keys()) == ["v"]
    ds = ns["ds"]
    assert ds.v.dims == ("y", "x") and np.array_equal(ds.v.values, obs_values())


def check_ncdump(sb: Sandbox, value, ns) -> None:
    assert value.stdout.startswith("netcdf refs {") and "float sst(time, lat, lon) ;" in value.stdout


def check_grant(sb: Sandbox, value, ns) -> None:
    from nczmap.format import open_on

    local = sb.sst[sb.data / "archive" / "sst_20250101.nc"]
    remote = sb.sst[sb.root / "upload" / "sst_20250102.nc"]
    with value as zmap:  # both halves read: the local one under /data/archive/, the other from S3
        assert np.array_equal(open_on(zmap).variables["sst"][...], np.concatenate([local, remote]))
    ungranted = nczmap.open_dataset(ns["url"], containers=[f"{sb.data}/archive/"])
    with ungranted, pytest.raises(nczmap.AccessDenied, match=f"s3://{BUCKET}/nc/"):
        ungranted.variables["sst"][...]  # the S3 half needs its grant


def check_mtime_tolerance(sb: Sandbox, value, ns) -> None:
    from nczmap.format import open_on

    expected = sb.sst[sb.data / "archive" / "sst_20250101.nc"]
    with value as zmap:  # the source's time is 1 s off: within the tolerance
        assert np.array_equal(open_on(zmap).variables["sst"][...], expected)
    exact = nczmap.open_dataset(ns["url"])
    with exact, pytest.raises(nczmap.StorageError, match=r"modification time|mtime"):
        exact.variables["sst"][...]


def check_to_icechunk(sb: Sandbox, value, ns) -> None:
    sources = sorted((sb.data / "src").glob("*.nc"))
    with nczmap.open_dataset(sb.url(sb.data / "repo", "icechunk"), containers=[f"{sb.data}/"]) as ds:
        assert np.array_equal(ds.variables["sst"][...], sb.files_sst(*sources))


def check_from_icechunk(sb: Sandbox, value, ns) -> None:
    sources = sorted((sb.data / "src").glob("*.nc"))
    assert np.array_equal(sb.manifest_sst(sb.data / "refs.parq", sb.data / "src"), sb.files_sst(*sources))


# README line (a unique part of it) -> check run after its statement or command: its value (an expression
# statement's; a command's CompletedProcess; a `with` line's None, after the block), the sandbox, the
# namespace. Every Python line with a comment needs one: comments that state a value are asserted here.
AFTER: dict[str, Callable[[Sandbox, object, dict], None]] = {
    # ## Use
    'with nczmap.open_map("file:///data/obs.zip#mode=nczarr,zip", "a") as zmap:': check_committed,
    "zmap.search(\"/\")  # ['.zattrs', '.zgroup', 'g', 'v']  bytewise sorted": check_search,
    'zmap.read("/v/0.0", 8, 16)  # bytes 8..23 of a chunk': check_range,
    'zmap.write("/v/.zattrs", b"{}")  # staged; the archive is rewritten atomically at close': check_staged,
    'with nczmap.create_dataset("file:///data/new.zip#mode=nczarr,zip"': check_created,
    'ds.dialect  # e.g. Dialect.NCZARR_UPPER_KEYS, "nczarr-4.8.1"; .releases: "4.8.1-4.9.0"': check_dialect,
    'ds.variables["v"][:], ds.variables["v"].attrs["units"]': check_obs_values,
    # Virtual datasets (inline)
    "nczmap ncdump file:///data/refs.json#mode=nczarr,manifest": check_ncdump,
    'open_map(url, "r", containers=["/data/archive/"': check_grant,
    "nczmap copy 'file:///data/refs.parq#mode=nczarr,manifest' 'file:///data/repo#mode=icechunk'": (
        check_to_icechunk
    ),
    "nczmap copy --allow /data/src 'file:///data/repo#mode=icechunk'": check_from_icechunk,
    'open_map(url, "r", mtime_tolerance=2)': check_mtime_tolerance,
    # Keeping it current: --append
    "nczmap virtualize /archive/sst_*.nc sst.parq --concat time          # once": check_first_virtualize,
    "nczmap virtualize /archive/sst_20260315.nc sst.parq --append        # every day": check_appended,
    'nczmap.virtualize(["/archive/sst_20260316.nc"], "sst.parq", append=True)': (
        lambda sb, value, ns: check_appended(sb, value, ns, len(ARCHIVE_DAYS) + 2)
    ),
    # Remote archives
    "nczmap virtualize @mur_urls.txt mur.parq --new-dim time=%Y%m%d --skip-unreadable": check_catalogue,
    # A year of daily COGs
    "nczmap virtualize 's3://bucket/sst/sst_2020*.tif' sst.parq --new-dim time=%Y%m%d": check_cube,
    ")  # the grant the references need": check_needs_grant,
    'ds.band_data.sel(time="2020-06").mean("time")  # time is datetime64, x/y in the CRS': check_june_mean,
    # NCZarr stores; GRIB2
    RUNS_COMMAND: check_runs_joined,
    "nczmap virtualize '/data/hrrr/hrrr.t*z.grib2' hrrr.json --concat time": check_hrrr_joined,
    'hrrr.t.sel(isobaricInhPa=500, step="0h")  # (time, y, x)': check_hrrr_500,
    # xarray and dask
    "chunks={})  # lazy, dask": check_lazy,
    'tree = xr.open_datatree("s3://bucket/run1#mode=nczarr,s3", engine="nczmap")  # groups': check_tree,
    'encoding={"v": {"chunksizes": (100, 100), "zlib": True, "complevel": 4}},': check_to_nczarr,
    # zarr-python
    'store = nczmap.ZarrStore("file:///data/obs.zip#mode=nczarr,zip")  # read-only unless': check_read_only,
    "ds = xr.open_zarr(store, consolidated=False)": check_zarr,
}


def hooked_lines(snippet: Snippet, table: dict) -> dict[int, Callable]:
    """README line -> the table's function for it."""
    return {number: table[key] for number, text in snippet.lines() for key in table if key in text}


# -------------------------------------------------------------------------------------------- running
class Runner:
    """Runs snippets in README order, each once; a snippet's test runs those before it first."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.outcomes: dict[str, BaseException | None] = {}

    def run_through(self, snippet: Snippet) -> None:
        for earlier in SNIPPETS:
            runnable = earlier.kind in ("python", "shell") and earlier.id not in SKIPPED
            if runnable and earlier.line < snippet.line and earlier.id not in self.outcomes:
                self._run(earlier)
        if snippet.id not in self.outcomes:
            self._run(snippet)
        error = self.outcomes[snippet.id]
        if error is not None:
            raise error

    def _run(self, snippet: Snippet) -> None:
        try:
            with contextlib.chdir(self.sandbox.cwd):
                if snippet.kind == "python":
                    self._python(snippet)
                elif snippet.kind == "shell":
                    self._shell(snippet)
                else:
                    raise AssertionError(
                        f"README line {snippet.line}: no way to run a {snippet.kind!r} snippet"
                    )
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # AssertionError, pytest's Failed...: kept for the snippet's own test
            self.outcomes[snippet.id] = error
        else:
            self.outcomes[snippet.id] = None

    def _python(self, snippet: Snippet) -> None:
        sb = self.sandbox
        namespace = (
            {name: getattr(nczmap, name) for name in nczmap.__all__} if snippet.inline else sb.namespace
        )
        for function in hooked_lines(snippet, BEFORE).values():
            function(sb, namespace)
        after = hooked_lines(snippet, AFTER)
        checked: set[int] = set()

        def hook(lines: tuple[int, ...], value):
            for number in lines:
                after[number](sb, value, namespace)
                checked.add(number)
            return value

        namespace[HOOK] = hook
        code = localize(snippet.code, "python", sb.root, sb.endpoint, BUCKET)
        exec(compile(instrument(snippet, code, set(after)), str(readme_snippets.README), "exec"), namespace)
        assert checked == set(after), f"checks of README lines {sorted(set(after) - checked)} never ran"

    def _shell(self, snippet: Snippet) -> None:
        sb = self.sandbox
        before, after = hooked_lines(snippet, BEFORE), hooked_lines(snippet, AFTER)
        local = dataclasses.replace(
            snippet, code=localize(snippet.code, "shell", sb.root, sb.endpoint, BUCKET)
        )
        checked: set[int] = set()
        for number, argv in local.commands():
            if before.get(number):
                before[number](sb, {})
            assert argv[0] == "nczmap", f"README line {number}: only nczmap commands are run here: {argv}"
            done = subprocess.run(
                [sys.executable, "-m", "nczmap", *argv[1:]], capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, f"README line {number}: {argv} failed:\n{done.stdout}\n{done.stderr}"
            if after.get(number):
                after[number](sb, done, {})
                checked.add(number)
        assert checked == set(after), f"checks of README lines {sorted(set(after) - checked)} never ran"

    def close(self) -> None:
        for value in list(self.sandbox.namespace.values()):
            if hasattr(value, "close") and not isinstance(value, type(os)):
                with contextlib.suppress(Exception):
                    value.close()
        web = getattr(self.sandbox, "web", None)
        if web is not None:
            web.httpd.shutdown()
            web.httpd.server_close()
            web.thread.join(5)


@pytest.fixture(scope="module")
def runner(tmp_path_factory, s3_server):
    with pytest.MonkeyPatch.context() as patch:
        for name in PROXY_VARIABLES:
            patch.delenv(name, raising=False)
        patch.setenv("NO_PROXY", "*")
        patch.delenv("AWS_ENDPOINT_URL", raising=False)
        sandbox = Sandbox(tmp_path_factory.mktemp("readme"), s3_server)
        sandbox.build()
        running = Runner(sandbox)
        try:
            yield running
        finally:
            running.close()


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("snippet", SNIPPETS, ids=[snippet.id for snippet in SNIPPETS])
def test_snippet(snippet: Snippet, request):
    if snippet.id in SKIPPED:
        pytest.skip(SKIPPED[snippet.id])
    if snippet.kind == "synopsis":
        check_synopsis(snippet)
    else:
        request.getfixturevalue("runner").run_through(snippet)


def check_synopsis(snippet: Snippet) -> None:
    """Every subcommand and option the synopsis names is in the command's --help; --version works."""
    commands, version = readme_snippets.synopsis(snippet)

    def helped(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "nczmap", *argv], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"nczmap {' '.join(argv)}: {done.stderr}"
        return done.stdout

    main = helped("--help")
    listed = set(re.findall(r"^    ([a-z][\w-]*)\b", main.split("positional arguments:")[1], re.MULTILINE))
    assert set(commands) <= listed, f"not in nczmap --help: {set(commands) - listed}"
    assert listed <= set(commands), f"commands the synopsis does not show: {listed - set(commands)}"
    for command, options in commands.items():
        text = helped(command, "--help")
        for option in options:
            assert f"[{option}" in text or f" {option}," in text or f" {option} " in text, (
                f"nczmap {command} --help does not show {option}"
            )
    if version:
        assert helped("--version").strip() == f"nczmap {nczmap.__version__}"


def test_every_kind_of_snippet_is_found():
    kinds = {(snippet.kind, snippet.inline) for snippet in SNIPPETS}
    expected = {("python", False), ("shell", False), ("synopsis", False), ("python", True), ("shell", True)}
    assert expected <= kinds
    unknown = [snippet.id for snippet in SNIPPETS if snippet.kind not in ("python", "shell", "synopsis")]
    assert not unknown, f"README blocks in a language this test cannot run: {unknown}"


def test_every_check_applies_to_one_readme_line():
    """A check whose line changed no longer runs: it must be moved with the README."""
    for table in (BEFORE, AFTER):
        for key in table:
            lines = [(s.id, n) for s in SNIPPETS for n, text in s.lines() if key in text]
            assert len(lines) == 1, f"{key!r} matches {lines or 'no README snippet line'}"


def test_every_commented_python_line_is_checked():
    """A comment in a Python snippet tells the reader what to expect: AFTER asserts it."""
    for snippet in SNIPPETS:
        if snippet.kind != "python":
            continue
        checked = hooked_lines(snippet, AFTER)
        for number, comment in readme_snippets.comment_lines(snippet).items():
            assert number in checked, f"README line {number} ({comment!r}): no check in AFTER"


def test_skipped_names_snippets():
    ids = {snippet.id for snippet in SNIPPETS}
    assert set(SKIPPED) <= ids, f"SKIPPED names snippets that are gone: {set(SKIPPED) - ids}"
