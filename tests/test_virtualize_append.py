"""Appending files to a virtual dataset: the result of virtualizing every file at once, at the cost of
the new files, refusals that change nothing, and peers that read the appended result.

Oracles: ``virtualize`` of every file at once (compared reference by reference and value by value),
xarray's ``open_mfdataset`` with the netcdf4 engine, rasterio for COGs, and, for the peers, fsspec's
ReferenceFileSystem + zarr (kerchunk's readers) and plain icechunk + xarray in processes that never import
nczmap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from generated_archives import open_ours, snapshot, url_of
from test_virtualize import manifest_url, nczmap_command

import nczmap
from nczmap import FormatError

netCDF4 = pytest.importorskip("netCDF4")
xr = pytest.importorskip("xarray")
pytest.importorskip("dask")

from nczmap.integrations.virtualize import VirtualizeWarning, virtualize  # noqa: E402

LAT, LON = 6, 8


def write_day(path: Path, day: int, units: str | None = None, *, scale: float = 0.01) -> Path:
    """One daily file as real archives are written: ``time`` with its own units (``days since`` its own
    date unless ``units``), an int16 packed ``sst(time, lat, lon)`` (zlib, chunked by day), ``lat``/``lon``,
    a string history attribute that differs from day to day."""
    rng = np.random.default_rng(day + 1000)
    with netCDF4.Dataset(path, "w") as ds:
        ds.history = f"written for day {day}"
        ds.createDimension("time", None)
        ds.createDimension("lat", LAT)
        ds.createDimension("lon", LON)
        time = ds.createVariable("time", "i4", ("time",))
        if units is None:
            date = np.datetime64("2024-03-01") + np.timedelta64(day, "D")
            time.units = f"days since {date}"
            time[:] = [0]
        else:
            time.units = units
            time[:] = [day]
        time.calendar = "standard"
        lat = ds.createVariable("lat", "f4", ("lat",))
        lat[:] = np.linspace(-50, 50, LAT)
        lon = ds.createVariable("lon", "f4", ("lon",))
        lon[:] = np.linspace(0, 350, LON)
        sst = ds.createVariable("sst", "i2", ("time", "lat", "lon"), zlib=True, chunksizes=(1, LAT, LON),
                                fill_value=-32768)  # fmt: skip
        sst.scale_factor = np.float32(scale)
        sst.add_offset = np.float32(20)
        sst.units = "degC"
        sst.set_auto_maskandscale(False)
        raw = rng.integers(-1000, 1000, size=(1, LAT, LON)).astype("i2")
        raw[0, 0, 0] = -32768
        sst[:] = raw
    return path


@pytest.fixture
def days(tmp_path) -> list[Path]:
    return [write_day(tmp_path / f"sst_{day:03d}.nc", day) for day in range(6)]


def quiet_virtualize(*args, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VirtualizeWarning)
        return virtualize(*args, **options)


def values(destination: Path) -> xr.Dataset:
    return open_ours(destination)


def assert_same_dataset(appended: Path, whole: Path, files: list[Path]) -> None:
    """The appended dataset equals the one made of every file at once, and open_mfdataset of the files."""
    ours, all_at_once = values(appended), values(whole)
    xr.testing.assert_identical(ours, all_at_once)
    with xr.open_mfdataset(files, combine="nested", concat_dim="time", engine="netcdf4") as theirs:
        theirs = theirs.load()
        for name in theirs.variables:
            if appended.suffix == ".icechunk" and ours[name].dtype.kind == "f":
                # Zarr v3 attributes are JSON numbers: float32 scale_factor reads back float64, and xarray
                # then decodes in float64 (as for any Zarr store xarray writes)
                np.testing.assert_allclose(ours[name].values, theirs[name].values, rtol=1e-6, err_msg=name)
                continue
            np.testing.assert_array_equal(ours[name].values, theirs[name].values, err_msg=name)


# ==================================================================================== append = all at once
@pytest.mark.parametrize("suffix", [".json", ".parq", ".icechunk"])
def test_appending_day_by_day_gives_the_dataset_of_every_file(tmp_path, days, suffix):
    destination = tmp_path / f"archive{suffix}"
    whole = tmp_path / f"whole{suffix}"
    quiet_virtualize(days[:3], url_of(destination), concat="time")
    for day in days[3:]:
        result = quiet_virtualize([day], url_of(destination), append=True)
        assert result.references >= 1
    quiet_virtualize(days, url_of(whole), concat="time")
    assert_same_dataset(destination, whole, days)


def test_appended_references_are_those_of_every_file_at_once(tmp_path, days):
    appended, whole = tmp_path / "appended.json", tmp_path / "whole.json"
    quiet_virtualize(days[:2], appended, concat="time")
    quiet_virtualize(days[2:], appended, append=True)
    quiet_virtualize(days, whole, concat="time")
    mine, theirs = json.loads(appended.read_text()), json.loads(whole.read_text())
    assert mine["refs"] == theirs["refs"]
    assert mine["nczmap"]["sources"] == theirs["nczmap"]["sources"]
    assert mine["nczmap"]["virtualize"] == theirs["nczmap"]["virtualize"]


def test_the_cli_appends_with_the_recorded_join(tmp_path, days):
    refs = tmp_path / "refs.parq"
    assert nczmap_command("virtualize", *days[:4], refs, "--concat", "time").returncode == 0
    done = nczmap_command("virtualize", days[4], refs, "--append")
    assert done.returncode == 0, done.stderr
    done = nczmap_command("virtualize", days[5], refs, "--append", "--concat", "time")
    assert done.returncode == 0, done.stderr
    whole = tmp_path / "whole.parq"
    quiet_virtualize(days, whole, concat="time")
    assert_same_dataset(refs, whole, days)


def test_per_file_time_units_continue_the_recorded_encoding(tmp_path):
    files = [write_day(tmp_path / f"d{day}.nc", day, "days since 2024-03-01") for day in range(2)]
    files.append(write_day(tmp_path / "d2.nc", 2))  # days since 2024-03-03
    hourly = tmp_path / "d3.nc"
    write_day(hourly, 3, "hours since 2024-03-01 12:00:00")  # 3 "hours": 2024-03-01T15:00
    refs = tmp_path / "refs.json"
    quiet_virtualize(files[:2], refs, concat="time")
    quiet_virtualize([files[2]], refs, append=True)
    with xr.open_dataset(manifest_url(refs), engine="nczmap") as ds:
        assert ds["time"].encoding["units"] == "days since 2024-03-01"
    with pytest.raises(FormatError, match=r"d3\.nc.*not after"):  # 03-01T15:00 precedes 03-03
        quiet_virtualize([hourly], refs, append=True)


# ==================================================================================== refusals change nothing
def refusal_cases(tmp_path: Path, days: list[Path]) -> dict[str, tuple[list[Path], dict, str]]:
    other = tmp_path  # beside the archive's files: in the container a repository's reader grants
    lat = other / "sst_lat.nc"
    write_day(lat, 7)
    with netCDF4.Dataset(lat, "a") as ds:
        ds["lat"][:] = np.linspace(-40, 40, LAT)
    return {
        "again": ([days[1]], {}, "already in|not after"),  # a repository lists no sources: out of order
        "before": ([write_day(other / "sst_old.nc", -3)], {}, "not after"),
        "scale": ([write_day(other / "sst_scale.nc", 9, scale=0.02)], {}, "scale_factor"),
        "coordinate": ([lat], {}, "'/lat'"),
        "join": ([days[4]], {"new_dim": "time=%Y%m%d"}, "--concat time"),
        "load": ([days[4]], {"load": "lat"}, "--load"),
    }


@pytest.mark.parametrize("suffix", [".json", ".parq", ".icechunk"])
def test_a_refused_append_names_the_cause_and_changes_nothing(tmp_path, days, suffix):
    destination = tmp_path / f"archive{suffix}"
    quiet_virtualize(days[:3], url_of(destination), concat="time")
    before = snapshot(destination)
    for name, (files, options, message) in refusal_cases(tmp_path, days).items():
        with pytest.raises(FormatError, match=message):
            quiet_virtualize(files, url_of(destination), append=True, **options)
        assert snapshot(destination) == before, name
    quiet_virtualize([days[3]], url_of(destination), append=True)  # still appendable
    assert values(destination).sizes["time"] == 4


def test_skip_mismatched_leaves_out_and_names_a_file_that_cannot_be_appended(tmp_path, days):
    refs = tmp_path / "refs.json"
    quiet_virtualize(days[:3], refs, concat="time")
    scaled = write_day(tmp_path / "sst_scaled.nc", 3, scale=0.02)
    with pytest.warns(VirtualizeWarning, match="sst_scaled.nc left out.*scale_factor"):
        result = virtualize([scaled, days[4]], refs, append=True, skip_mismatched=True)
    assert [source for source, _ in result.skipped] == [str(scaled)]


def test_appending_to_what_virtualize_did_not_make_needs_the_join(tmp_path, days):
    refs = tmp_path / "refs.json"
    quiet_virtualize(days[:2], refs, concat="time")
    document = json.loads(refs.read_text())
    del document["nczmap"]["virtualize"]  # as made by another tool
    refs.write_text(json.dumps(document))
    with pytest.raises(FormatError, match="records no join"):
        quiet_virtualize([days[2]], refs, append=True)
    quiet_virtualize([days[2]], refs, append=True, concat="time")
    assert values(refs).sizes["time"] == 3


# ==================================================================================== peers read the result
PEER_READS_MANIFEST = """
import json, sys
import fsspec, zarr, numpy as np
assert "nczmap" not in sys.modules
path = sys.argv[1]
fs = fsspec.filesystem("reference", fo=path, remote_protocol="file")
group = zarr.open_group(fs.get_mapper(""), mode="r", zarr_format=2)
sst = group["sst"][:]
time = group["time"][:]
print(json.dumps({"sst": sst.tolist(), "time": time.tolist(), "units": group["time"].attrs["units"]}))
assert "nczmap" not in sys.modules
"""

PEER_READS_REPOSITORY = """
import json, sys
import icechunk, xarray as xr
assert "nczmap" not in sys.modules
path, granted = sys.argv[1], sys.argv[2]
storage = icechunk.local_filesystem_storage(path)
credentials = icechunk.containers_credentials({granted: None})
repo = icechunk.Repository.open(storage, authorize_virtual_chunk_access=credentials)
session = repo.readonly_session("main")
ds = xr.open_zarr(session.store, consolidated=False, decode_times=False, mask_and_scale=False)
print(json.dumps({"sst": ds["sst"].values.tolist(), "time": ds["time"].values.tolist(),
                  "units": ds["time"].attrs["units"]}))
assert "nczmap" not in sys.modules
"""


def raw_values(files: list[Path]) -> dict[str, np.ndarray]:
    with xr.open_mfdataset(
        files, combine="nested", concat_dim="time", engine="netcdf4", decode_times=False, mask_and_scale=False
    ) as ds:
        sst = ds["sst"].values
    with xr.open_mfdataset(files, combine="nested", concat_dim="time", engine="netcdf4") as ds:
        times = ds["time"].values
    return {"sst": sst, "time": times}


@pytest.mark.parametrize("suffix", [".json", ".parq", ".icechunk"])
def test_peers_read_the_appended_dataset_without_nczmap(tmp_path, days, suffix):
    destination = tmp_path / f"archive{suffix}"
    quiet_virtualize(days[:2], url_of(destination), concat="time")
    quiet_virtualize(days[2:4], url_of(destination), append=True)
    quiet_virtualize(days[4:], url_of(destination), append=True)
    script = PEER_READS_REPOSITORY if suffix == ".icechunk" else PEER_READS_MANIFEST
    granted = f"file://{days[0].parent}/"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(destination), granted],
        capture_output=True, timeout=180, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    read = json.loads(done.stdout)
    expected = raw_values(days)
    np.testing.assert_array_equal(np.asarray(read["sst"]), expected["sst"])
    unit, _, since = read["units"].partition(" since ")
    assert unit == "days"
    decoded = np.datetime64(since.strip()[:10], "ns") + np.asarray(read["time"]) * np.timedelta64(1, "D")
    np.testing.assert_array_equal(decoded, expected["time"])


# ==================================================================================== new-dim series
def write_named(folder: Path, date: str, seed: int) -> Path:
    """A file with no time at all, its date only in its name (stacked along a new dimension)."""
    path = folder / f"field_{date}.nc"
    rng = np.random.default_rng(seed)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", 3)
        ds.createDimension("x", 5)
        field = ds.createVariable("field", "f4", ("y", "x"), zlib=True, chunksizes=(3, 5))
        field[:] = rng.random((3, 5), dtype="f4")
    return path


@pytest.mark.parametrize("suffix", [".json", ".parq", ".icechunk"])
def test_new_dim_series_appended_equal_the_series_stacked_at_once(tmp_path, suffix):
    files = [write_named(tmp_path, f"202403{day:02d}", day) for day in (1, 2, 3, 5, 6)]
    destination, whole = tmp_path / f"series{suffix}", tmp_path / f"whole{suffix}"
    quiet_virtualize(files[:2], url_of(destination), new_dim="time=%Y%m%d")
    quiet_virtualize(files[2:4], url_of(destination), append=True)
    quiet_virtualize(files[4:], url_of(destination), append=True)
    quiet_virtualize(files, url_of(whole), new_dim="time=%Y%m%d")
    ours, theirs = values(destination), values(whole)
    xr.testing.assert_identical(ours, theirs)
    expected = [np.datetime64(f"2024-03-{day:02d}", "ns") for day in (1, 2, 3, 5, 6)]
    assert list(ours["time"].values) == expected
    with pytest.raises(FormatError, match="not after"):
        quiet_virtualize([write_named(tmp_path, "20240304", 9)], url_of(destination), append=True)


def test_a_cog_series_appended_equals_rasterio(tmp_path):
    pytest.importorskip("rasterio")
    from test_virtualize_collections import assert_cog_series, write_cog

    files = []
    for day in range(1, 6):
        path = tmp_path / f"sst_202401{day:02d}.tif"
        write_cog(path, day)
        files.append(path)
    refs = tmp_path / "cogs.parq"
    quiet_virtualize(files[:2], refs, new_dim="time=%Y%m%d")
    for path in files[2:]:
        quiet_virtualize([path], refs, append=True)
    whole = tmp_path / "whole.parq"
    quiet_virtualize(files, whole, new_dim="time=%Y%m%d")
    xr.testing.assert_identical(values(refs), values(whole))
    assert_cog_series(manifest_url(refs), files)  # rasterio's values, nodata, x/y and CRS


# ==================================================================================== one writer at a time
APPENDER = """
import sys, warnings
warnings.simplefilter("ignore")
from nczmap.integrations.virtualize import virtualize
virtualize([sys.argv[2]], sys.argv[1], append=True)
"""


@pytest.mark.parametrize("suffix", [".json", ".parq"])
def test_two_appends_at_once_never_lose_one(tmp_path, days, suffix):
    refs = tmp_path / f"refs{suffix}"
    quiet_virtualize(days[:3], refs, concat="time")
    env = {**os.environ, "NCZMAP_LOCK_TIMEOUT": "60"}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(refs), str(day)], env=env, stderr=subprocess.PIPE
        )
        for day in days[3:5]
    ]
    outcomes = [(run.wait(timeout=120), run.communicate()[1].decode()) for run in runs]
    for code, stderr in outcomes:
        assert code == 0 or "cannot be appended" in stderr or "not after" in stderr, stderr
    appended = [day for day, (code, _) in zip(days[3:5], outcomes, strict=True) if code == 0]
    with nczmap.open_map(manifest_url(refs)) as zmap:
        recorded = set(zmap.manifest.sources)
    assert {day.as_uri() for day in appended} <= recorded  # whoever succeeded is there
    assert {day.as_uri() for day in days[:3]} <= recorded
    assert values(refs).sizes["time"] == 3 + len(appended)


def test_an_append_that_finds_the_manifest_locked_fails_and_writes_nothing(tmp_path, days, monkeypatch):
    refs = tmp_path / "refs.json"
    quiet_virtualize(days[:3], refs, concat="time")
    monkeypatch.setenv("NCZMAP_LOCK_TIMEOUT", "0.3")
    failures = []

    def competing(done: int, total: int) -> None:  # runs while the first append holds the lock
        try:
            quiet_virtualize([days[4]], refs, append=True)
        except nczmap.errors.DatasetLocked as exc:
            failures.append(str(exc))

    quiet_virtualize([days[3]], refs, append=True, reading=competing)
    assert len(failures) == 1 and "open for writing" in failures[0]
    with nczmap.open_map(manifest_url(refs)) as zmap:
        assert days[4].as_uri() not in zmap.manifest.sources and days[3].as_uri() in zmap.manifest.sources
    assert values(refs).sizes["time"] == 4


def test_an_icechunk_append_racing_another_commit_commits_nothing(tmp_path, days):
    icechunk = pytest.importorskip("icechunk")
    repo = tmp_path / "repo.icechunk"
    quiet_virtualize(days[:3], url_of(repo), concat="time")
    storage = icechunk.local_filesystem_storage(str(repo))
    before = len(list(icechunk.Repository.open(storage).ancestry(branch="main")))

    def competing(done: int, total: int) -> None:  # another append commits while this one is open
        quiet_virtualize([days[3]], url_of(repo), append=True)

    with pytest.raises(nczmap.errors.StorageError, match=r"another commit conflicts.*nothing committed"):
        quiet_virtualize([days[4]], url_of(repo), append=True, reading=competing)
    history = list(icechunk.Repository.open(storage).ancestry(branch="main"))
    assert len(history) == before + 1  # the competing append only: one commit per append
    assert history[0].metadata["nczmap"]["virtualize"]["concat"] == "time"
    assert values(repo).sizes["time"] == 4


def test_appending_to_a_manifest_in_s3_is_refused_by_name(tmp_path, days, s3_server):
    from s3server import BUCKET
    from test_virtualize import upload

    key, _ = upload(s3_server, days[0])
    url = f"{s3_server.endpoint}/{BUCKET}/refs.json#mode=nczarr,manifest"
    with pytest.raises(FormatError, match=r"manifest in S3 has no writer lock.*Icechunk"):
        quiet_virtualize([f"{s3_server.endpoint}/{BUCKET}/{key}#mode=s3"], url, append=True)


PEER_READS_SERIES = """
import json, sys
assert "nczmap" not in sys.modules
path, granted = sys.argv[1], sys.argv[2]
if path.endswith(".icechunk"):
    import icechunk, zarr
    storage = icechunk.local_filesystem_storage(path)
    credentials = icechunk.containers_credentials({granted: None})
    repo = icechunk.Repository.open(storage, authorize_virtual_chunk_access=credentials)
    group = zarr.open_group(repo.readonly_session("main").store, mode="r")
else:
    import fsspec, zarr
    fs = fsspec.filesystem("reference", fo=path, remote_protocol="file")
    group = zarr.open_group(fs.get_mapper(""), mode="r", zarr_format=2)
print(json.dumps({"field": group["field"][:].tolist(), "time": group["time"][:].tolist(),
                  "units": group["time"].attrs["units"]}))
assert "nczmap" not in sys.modules
"""


@pytest.mark.parametrize("suffix", [".json", ".parq", ".icechunk"])
def test_peers_read_an_appended_new_dim_series_without_nczmap(tmp_path, suffix):
    dates = ["20240301", "20240302", "20240304", "20240305"]
    files = [write_named(tmp_path, date, seed) for seed, date in enumerate(dates)]
    destination = tmp_path / f"series{suffix}"
    quiet_virtualize(files[:2], url_of(destination), new_dim="time=%Y%m%d")
    quiet_virtualize(files[2:], url_of(destination), append=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PEER_READS_SERIES), str(destination), f"file://{tmp_path}/"],
        capture_output=True, timeout=180, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    read = json.loads(done.stdout)
    expected = []
    for path in files:
        with netCDF4.Dataset(path) as ds:
            expected.append(ds["field"][:])
    np.testing.assert_array_equal(np.asarray(read["field"], dtype="f4"), np.stack(expected))
    unit, _, since = read["units"].partition(" since ")
    days = np.datetime64(since.strip()[:10], "D") + np.asarray(read["time"]) * np.timedelta64(1, "D")
    assert unit == "days" and [str(day).replace("-", "") for day in days] == dates


def test_an_append_to_a_long_parquet_series_reads_no_record_but_the_last(tmp_path):
    """3,400 daily COGs (hard links of one) fill several record files of each array; every record file but
    the last of each array is replaced with garbage before the append, which must still succeed (it read
    none of them) and give rasterio's values for the new day."""
    rasterio = pytest.importorskip("rasterio")
    import datetime

    from test_virtualize_collections import write_cog

    one = tmp_path / "one.tif"
    write_cog(one, 1)
    folder = tmp_path / "series"
    folder.mkdir()
    start = datetime.date(2000, 1, 1)
    for day in range(3400):
        os.link(one, folder / f"sst_{start + datetime.timedelta(days=day):%Y%m%d}.tif")
    refs = tmp_path / "series.parq"
    quiet_virtualize(str(folder / "sst_*.tif"), refs, new_dim="time=%Y%m%d")
    records = {}
    for directory in sorted(p for p in refs.rglob("*") if p.is_dir()):
        names = sorted(directory.glob("refs.*.parq"), key=lambda p: int(p.name.split(".")[1]))
        records.update({path: path.read_bytes() for path in names[:-1]})
    assert len(records) >= 2  # several records, the earlier ones turned to garbage
    for path in records:
        path.write_bytes(b"garbage, not a record")
    new = folder / f"sst_{start + datetime.timedelta(days=3400):%Y%m%d}.tif"
    write_cog(new, 7)
    quiet_virtualize([new], refs, append=True)
    for path, data in records.items():  # untouched (and, being garbage, unread): now put back
        assert path.read_bytes() == b"garbage, not a record"
        path.write_bytes(data)
    with (
        xr.open_dataset(manifest_url(refs), engine="nczmap", mask_and_scale=False) as ds,
        rasterio.open(new) as last,
        rasterio.open(one) as first,
    ):
        assert ds.sizes["time"] == 3401
        assert ds["time"].values[-1] == np.datetime64(start + datetime.timedelta(days=3400), "ns")
        np.testing.assert_array_equal(ds["band_data"][-1].values, last.read(1))
        np.testing.assert_array_equal(ds["band_data"][0].values, first.read(1))


def test_a_refused_icechunk_commit_saves_no_new_container(tmp_path, days):
    """An append bringing a source from a new directory adds a virtual chunk container; when its commit is
    refused (another commit landed meanwhile) the repository's configuration is left as it was."""
    icechunk = pytest.importorskip("icechunk")
    repo = tmp_path / "repo.icechunk"
    quiet_virtualize(days[:3], url_of(repo), concat="time")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    late = write_day(elsewhere / "sst_009.nc", 9)
    storage = icechunk.local_filesystem_storage(str(repo))
    before = set(icechunk.Repository.fetch_config(storage).virtual_chunk_containers or {})

    def competing(done: int, total: int) -> None:
        quiet_virtualize([days[3]], url_of(repo), append=True)

    with pytest.raises(nczmap.errors.StorageError, match="another commit conflicts"):
        grants = [str(elsewhere), str(tmp_path)]  # elsewhere/ a container of its own: new to the repository
        quiet_virtualize([late], url_of(repo), append=True, allow=grants, reading=competing)
    after = set(icechunk.Repository.fetch_config(storage).virtual_chunk_containers or {})
    assert after == before and not any("elsewhere" in prefix for prefix in after)


def test_an_append_writes_only_the_new_values_of_a_loaded_variable(tmp_path, days):
    """A loaded variable (not the joined coordinate, not re-encoded) keeps its layout and the chunks it
    holds: only the new files' values are added (it was written again whole in another layout when a
    check meant for strings took every number for an over-long string)."""
    destination = tmp_path / "archive.json"
    quiet_virtualize(days[:3], url_of(destination), concat="time", load=["sst"])
    before = json.loads(destination.read_text())["refs"]
    quiet_virtualize(days[3:4], url_of(destination), append=True)
    after = json.loads(destination.read_text())["refs"]
    assert json.loads(after["sst/.zarray"])["chunks"] == json.loads(before["sst/.zarray"])["chunks"]
    held = {key: value for key, value in before.items() if key.startswith("sst/") and "/." not in key}
    assert held and all(after[key] == value for key, value in held.items())
    assert_same_dataset(destination, _whole(tmp_path, days[:4], load=["sst"]), days[:4])


def _whole(tmp_path: Path, files: list[Path], **options) -> Path:
    whole = tmp_path / "whole.json"
    quiet_virtualize(files, url_of(whole), concat="time", **options)
    return whole
