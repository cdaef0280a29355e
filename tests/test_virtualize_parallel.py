"""Virtualizing collections fast and elsewhere: a COG series parsed as twins of its first file, and parses
run on thread pools, process pools and dask distributed clusters.

The fast path is an optimisation, never a relaxation: for series whose files differ from the first in
one way a reader would not see in the file list (compression, nodata, transform, predictor, tile size,
band description, sparse tiles), the manifest written is the one the full parse of every file writes
(or the same error), and values read through it are rasterio's. Files are written by rasterio (GDAL's
COG driver), netCDF4-python and Debian's ncgen; parses run on a real ProcessPoolExecutor and a real
dask LocalCluster (threads and processes).
"""

from __future__ import annotations

import json
import re
import subprocess
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_virtualize import NCGEN, TIMEOUT, manifest_url
from test_virtualize_collections import NODATA, assert_cog_series, write_day

from nczmap.integrations.virtualize import PARSERS, VirtualizeWarning, parallel, tiff, virtualize
from nczmap.integrations.virtualize.parsed import ParseOptions
from nczmap.integrations.virtualize.sources import source_files

rasterio = pytest.importorskip("rasterio")
xr = pytest.importorskip("xarray")
from rasterio.transform import from_origin  # noqa: E402

DATES = ["20210301", "20210302", "20210303", "20210304"]
BASE = {
    "driver": "COG",
    "width": 600,
    "height": 400,
    "count": 1,
    "dtype": "int16",
    "crs": "EPSG:32633",
    "transform": from_origin(399960.0, 5500020.0, 250.0, 250.0),
    "nodata": NODATA,
    "compress": "ZSTD",
    "predictor": 2,
    "blocksize": 128,
    "overview_resampling": "nearest",
}


def write_cog(path: Path, seed: int, description: str | None = None, **changes) -> Path:
    profile = {**BASE, **changes}
    rng = np.random.default_rng(seed)
    data = rng.integers(-2000, 3500, (1, profile["height"], profile["width"])).astype("int16")
    data[0, :140, :] = profile["nodata"] if profile["nodata"] is not None else 0  # whole empty tiles
    with rasterio.open(path, "w", **profile) as dataset:
        dataset.write(data)
        if description is not None:
            dataset.set_band_description(1, description)
    return path


def series(folder: Path, odd: dict | None = None) -> list[Path]:
    """Four COGs written alike; the third with ``odd`` changes."""
    folder.mkdir(exist_ok=True)
    return [
        write_cog(folder / f"sst_{date}.tif", seed, **(odd if odd and i == 2 else {}))
        for i, (seed, date) in enumerate(zip(range(4), DATES, strict=True))
    ]


def twins_of(files: list[Path]) -> list[bool]:
    opened = source_files([str(f) for f in files])
    try:
        parsed = parallel.parse_all(opened, ParseOptions(), PARSERS)
        twins = [p.root is None for p in parsed]
        for item in parsed:
            item.close()
    finally:
        for file in opened:
            file.close()
    return twins


def outcome(files: list[Path], refs: Path) -> tuple[str, object, list[str]]:
    """("manifest", its JSON, warnings) or ("error", its message, warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", VirtualizeWarning)
        try:
            virtualize([str(f) for f in files], refs, new_dim="time=%Y%m%d")
        except Exception as exc:  # compared with the full path's
            return "error", f"{type(exc).__name__}: {exc}", [str(w.message) for w in caught]
    # data loaded rather than referenced lies beside the manifest, in a file of a new name each time
    text = re.sub(rf"{re.escape(refs.name)}\.[0-9a-f]+\.chunks", "CHUNKS", refs.read_text())
    document = json.loads(text)
    for url, recorded in document.get("nczmap", {}).get("sources", {}).items():
        if url.endswith("/CHUNKS"):
            recorded.pop("mtime")
    return "manifest", document, [str(w.message) for w in caught]


def full_outcome(files: list[Path], refs: Path, monkeypatch) -> tuple[str, object, list[str]]:
    """The outcome with every file parsed in full (the fast path turned off)."""
    with monkeypatch.context() as patched:
        patched.setattr(tiff, "parse_twin", lambda file, fingerprint, options: None)
        return outcome(files, refs)


def test_a_series_written_alike_is_parsed_as_twins_and_reads_as_rasterio(tmp_path, monkeypatch):
    files = series(tmp_path / "sst")
    assert twins_of(files) == [False, True, True, True]
    refs = tmp_path / "refs.json"
    fast = outcome(files, refs)
    assert fast[0] == "manifest", fast
    assert fast == full_outcome(files, tmp_path / "full.json", monkeypatch)
    assert_cog_series(manifest_url(refs), files)
    with rasterio.open(files[0]) as dataset:
        assert dataset.overviews(1), "the series has overviews, twins carry them too"
    with xr.open_dataset(manifest_url(refs), engine="nczmap", group="overview_1") as overview:
        for step, path in enumerate(files):
            with rasterio.open(path) as dataset:
                factor = dataset.overviews(1)[0]
                want = dataset.read(1, out_shape=(dataset.height // factor, dataset.width // factor))
            got = overview["band_data"].isel(time=step).values
            np.testing.assert_array_equal(np.where(np.isnan(got), NODATA, got).astype("int16"), want)


ODD = {
    "compression": {"compress": "DEFLATE"},
    "nodata": {"nodata": -9999},
    "transform": {"transform": from_origin(400000.0, 5500000.0, 250.0, 250.0)},
    "predictor": {"predictor": 1},
    "tile size": {"blocksize": 256},
    "band description": {"description": "sea surface temperature"},
    "no overviews": {"overviews": "NONE"},
}


@pytest.mark.parametrize("odd", list(ODD), ids=list(ODD))
def test_a_file_unlike_the_first_is_parsed_in_full_with_the_full_paths_outcome(tmp_path, monkeypatch, odd):
    files = series(tmp_path / "sst", ODD[odd])
    assert twins_of(files) == [False, True, False, True]
    fast = outcome(files, tmp_path / "fast.json")
    assert fast == full_outcome(files, tmp_path / "full.json", monkeypatch)
    if fast[0] == "manifest":  # whatever the full path makes of the odd file, the values are rasterio's
        with xr.open_dataset(
            manifest_url(tmp_path / "fast.json"), engine="nczmap", mask_and_scale=False
        ) as ds:
            for step, path in enumerate(files):
                with rasterio.open(path) as dataset:
                    np.testing.assert_array_equal(ds["band_data"].isel(time=step).values, dataset.read(1))


def test_sparse_tiles_of_a_twin_are_missing_chunks(tmp_path, monkeypatch):
    """SPARSE_OK leaves empty tiles unwritten (offset and byte count 0): a table's content, so the file is
    still a twin, its empty tiles missing chunks reading as nodata."""
    folder = tmp_path / "sst"
    folder.mkdir()
    files = [
        write_cog(folder / f"sst_{date}.tif", seed, sparse_ok=seed % 2 == 1)
        for seed, date in enumerate(DATES)
    ]
    assert twins_of(files) == [False, True, True, True]
    refs = tmp_path / "refs.json"
    fast = outcome(files, refs)
    assert fast == full_outcome(files, tmp_path / "full.json", monkeypatch)
    chunks = fast[1]["refs"]
    assert "band_data/1.0.0" not in chunks and "band_data/0.0.0" in chunks  # file 2's first tile is empty
    assert_cog_series(manifest_url(refs), files)


# ------------------------------------------------------------------------------------------ executors
CDL = """netcdf r {{
dimensions: time = UNLIMITED ; x = 4 ;
variables: int time(time) ; double v(time, x) ; char name(x) ;
data: time = {day} ; v = {values} ; name = "abcd" ;
}}"""


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> dict[str, tuple[list[Path], dict]]:
    """A COG series, daily netCDF-4 files and daily netCDF-3 files, each with how it is joined."""
    folder = tmp_path_factory.mktemp("mixed")
    cogs = series(folder / "cogs")
    nc4 = []
    for day in range(3):
        nc4.append(folder / f"day{day}.nc")
        write_day(nc4[-1], day)
    nc3 = []
    for day in range(3):
        cdl = folder / f"r{day}.cdl"
        cdl.write_text(CDL.format(day=day, values=", ".join(str(day + i / 4) for i in range(4))))
        nc3.append(folder / f"r{day}.nc")
        subprocess.run([NCGEN, "-k", "nc3", "-o", nc3[-1], cdl], check=True, timeout=TIMEOUT)
    return {
        "cog": (cogs, {"new_dim": "time=%Y%m%d"}),
        "netcdf4": (nc4, {"concat": "time"}),
        "netcdf3": (nc3, {"concat": "time"}),
    }


def manifests(mixed, folder: Path, executor) -> dict[str, dict]:
    made = {}
    for name, (files, how) in mixed.items():
        refs = folder / f"{name}.json"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", VirtualizeWarning)
            virtualize([str(f) for f in files], refs, executor=executor, **how)
        made[name] = json.loads(refs.read_text())
    return made


@pytest.fixture(scope="module")
def serial(mixed, tmp_path_factory) -> dict[str, dict]:
    return manifests(mixed, tmp_path_factory.mktemp("serial"), None)


def test_a_thread_pool_gives_the_serial_result(mixed, serial, tmp_path):
    with ThreadPoolExecutor(2) as pool:
        assert manifests(mixed, tmp_path, pool) == serial


def test_a_process_pool_gives_the_serial_result(mixed, serial, tmp_path):
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        assert manifests(mixed, tmp_path, pool) == serial


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_a_dask_client_gives_the_serial_result(mixed, serial, tmp_path, processes):
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        assert manifests(mixed, tmp_path, client) == serial


def test_a_failure_elsewhere_is_raised_here_naming_the_file(mixed, tmp_path):
    cogs = list(mixed["cog"][0])
    broken = tmp_path / "sst_20210309.tif"
    broken.write_bytes(b"II*\x00" + b"\xff" * 60)  # a TIFF whose first IFD lies past its end
    with (
        ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool,
        pytest.raises(Exception, match=str(broken.name)),
    ):
        virtualize(
            [*map(str, cogs), str(broken)], tmp_path / "refs.json", new_dim="time=%Y%m%d", executor=pool
        )


def test_a_parse_that_cannot_be_sent_back_is_an_nczmap_error_naming_the_file(mixed, tmp_path, monkeypatch):
    """A parse holding what pickle cannot carry (a bug of nczmap's: found once, a lambda in a fill value)
    is an nczmap error naming the file, not a bare AttributeError from the worker."""
    from nczmap.errors import NCZError

    files, how = mixed["netcdf4"]
    parse = parallel.parse_one

    def unpicklable(file, options, parsers):
        parsed = parse(file, options, parsers)
        parsed.notes.append(lambda: None)
        return parsed

    monkeypatch.setattr(parallel, "parse_one", unpicklable)
    with (
        ProcessPoolExecutor(1, mp_context=get_context("fork")) as pool,  # forked: the patch goes along
        pytest.raises(NCZError, match=f"{files[1].name}.*cannot be sent back"),
    ):
        virtualize([str(f) for f in files], tmp_path / "refs.json", executor=pool, **how)


# --------------------------------------------------------------------------------- the twin check, fuzzed
class _Bytes:
    def __init__(self, data: bytes, name: str) -> None:
        self.name, self.data, self.size = name, data, len(data)

    def read(self, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[object, bytes]:
    """A COG's fingerprint and the bytes of another written alike."""
    folder = tmp_path_factory.mktemp("pair")
    first, second = (write_cog(folder / f"sst_{date}.tif", seed) for seed, date in enumerate(DATES[:2]))
    parsed = tiff.parse(_Bytes(first.read_bytes(), str(first)), ParseOptions())
    return parsed.fingerprint, second.read_bytes()


def _storages(parsed) -> dict[str, tuple]:
    return {
        key: (s.shape, s.chunks, s.codecs, list(s.corners), list(s.offsets), list(s.sizes))
        for key, s in parsed.storages.items()
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), min_size=1, max_size=6))
def test_a_twin_is_accepted_only_where_the_full_parse_agrees(pair, edits):
    """Bytes of a twin changed at random in its first 4 KiB (header, IFDs, tag values, tables): either
    it is no twin, or the full parse of the same bytes gives the same chunks (and no error)."""
    fingerprint, data = pair
    changed = bytearray(data)
    for offset, value in edits:
        changed[offset] = value
    source = _Bytes(bytes(changed), "fuzzed.tif")
    twin = tiff.parse_twin(source, fingerprint, ParseOptions())
    if twin is None:
        return
    full = tiff.parse(source, ParseOptions())  # an error here would be a twin the full parse refuses
    expected = {}
    for group in full.root.walk():
        for variable in group.variables.values():
            if variable.key in twin.storages:
                expected[variable.key] = variable.storages[0]
    assert _storages(twin) == {
        key: (s.shape, s.chunks, s.codecs, list(s.corners), list(s.offsets), list(s.sizes))
        for key, s in expected.items()
    }
    assert tiff.parse(source, ParseOptions()).fingerprint.ranges == fingerprint.ranges
