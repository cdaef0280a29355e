"""Remote sources read as the network wants them: no request that is not needed, many in flight, bounded
time against any server, retries that end in the fault-free manifest, and catalogue-scale inputs.

Sources are served by ``latency_server.py`` (HTTP/1.1, HEAD and single-range GET, strong ETags,
``If-Match``/``If-Unmodified-Since`` answered 412, latency and faults: 503s, bodies cut short, trickled
bodies, ignored ranges, changing ETags; every request counted per file) and by moto behind
``s3proxy.py`` (requests counted by kind, faults injected). Nothing is mocked; nothing but 127.0.0.1 is
contacted. Files are written by netCDF4-python (netCDF-3 and netCDF-4) and rasterio (GDAL's COG driver).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
import warnings
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from latency_server import serving
from test_manifest_http import PROXY_VARIABLES
from test_manifest_http import serving as plain_serving
from test_virtualize import manifest_url

import nczmap
from nczmap.errors import AccessDenied, FormatError, NCZError, StorageError
from nczmap.integrations.virtualize import VirtualizeWarning, parallel, sources, virtualize
from nczmap.integrations.virtualize.sources import FIRST_BLOCK, HttpFile, ObjectFile, source_file
from nczmap.url import parse_url
from nczmap.zmap import http as http_reader
from nczmap.zmap.byteranges import RequestPolicy

netCDF4 = pytest.importorskip("netCDF4")
rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATES = [f"202103{day:02d}" for day in range(1, 7)]
NC3_FILES = 200
COG = {
    "driver": "COG",
    "width": 600,
    "height": 400,
    "count": 1,
    "dtype": "int16",
    "crs": "EPSG:32633",
    "transform": from_origin(399960.0, 5500020.0, 250.0, 250.0),
    "nodata": -32768,
    "compress": "ZSTD",
    "predictor": 2,
    "blocksize": 128,
}
pytestmark = pytest.mark.filterwarnings("ignore::nczmap.integrations.virtualize.VirtualizeWarning")


# ------------------------------------------------------------------------------------------------ inputs
def write_nc3(path: Path, day: int) -> None:
    with netCDF4.Dataset(path, "w", format="NETCDF3_64BIT_OFFSET") as ds:
        ds.createDimension("time", None)
        ds.createDimension("y", 30)
        ds.createDimension("x", 40)
        ds.createVariable("time", "f8", ("time",))[:] = [day]
        ds.createVariable("field", "f4", ("time", "y", "x"))[:] = (
            np.arange(1200, dtype="f4").reshape(1, 30, 40) + day
        )


def write_nc4(path: Path, day: int) -> None:
    rng = np.random.default_rng(day)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("lat", 90)
        ds.createDimension("lon", 180)
        ds.createVariable("time", "f8", ("time",))[:] = [day]
        ds.createVariable("lat", "f4", ("lat",))[:] = np.linspace(-89, 89, 90)
        ds.createVariable("lon", "f4", ("lon",))[:] = np.linspace(-179, 179, 180)
        for name in ("sst", "error"):
            variable = ds.createVariable(name, "i2", ("time", "lat", "lon"), zlib=True)
            variable[:] = rng.integers(-500, 3000, (1, 90, 180))


def write_cog(path: Path, seed: int) -> None:
    data = np.random.default_rng(seed).integers(-2000, 3500, (1, 400, 600)).astype("int16")
    with rasterio.open(path, "w", **COG) as dataset:
        dataset.write(data)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """``cog/sst_YYYYMMDD.tif`` (6 COGs, 20 tiles of 128² each and overviews), ``nc3/day*.nc``
    (200 small netCDF-3 files), ``nc4/day*.nc`` (6 netCDF-4 files, two zlib variables)."""
    root = tmp_path_factory.mktemp("remote-io")
    for folder in ("cog", "nc3", "nc4"):
        (root / folder).mkdir()
    for seed, date in enumerate(DATES):
        write_cog(root / "cog" / f"sst_{date}.tif", seed)
    for day in range(NC3_FILES):
        write_nc3(root / "nc3" / f"day{day:03d}.nc", day)
    for day in range(6):
        write_nc4(root / "nc4" / f"day{day:03d}.nc", day)
    return root


@pytest.fixture
def web(data, monkeypatch):
    """The data directory on a web server (no latency unless a test sets one)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with serving(data, latency=0.0) as server:
        yield server


@pytest.fixture
def s3_proxy(s3_server):
    from s3proxy import S3Proxy

    with S3Proxy(s3_server.endpoint) as running:
        yield running


JOINS = {"cog": {"new_dim": "time=%Y%m%d"}, "nc3": {"concat": "time"}, "nc4": {"concat": "time"}}


def files_of(data: Path, kind: str, count: int | None = None) -> list[Path]:
    pattern = "sst_*.tif" if kind == "cog" else "day*.nc"
    return sorted((data / kind).glob(pattern))[:count]


def urls_of(server, files: list[Path]) -> list[str]:
    return [server.url_of(file) for file in files]


def refs_of(path: Path) -> dict:
    """A manifest's references with each source's URL reduced to its file name (to compare manifests
    of the same files read from different places)."""
    refs = json.loads(path.read_text())["refs"]
    return {
        key: [value[0].rsplit("/", 1)[-1], *value[1:]] if isinstance(value, list) else value
        for key, value in refs.items()
    }


def counts_by_file(server) -> dict[str, dict[str, int]]:
    return {path.rsplit("/", 1)[-1]: dict(counts) for path, counts in server.per_file.items()}


def upload_folder(s3_server, files: list[Path]) -> str:
    prefix = uuid.uuid4().hex
    client = s3_server.client()
    for file in files:
        client.put_object(Bucket="nczbucket", Key=f"{prefix}/{file.name}", Body=file.read_bytes())
    return prefix


def nczmap_command(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "nczmap", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)


def run_python(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


# ------------------------------------------------------------------------------------- requests: HTTP
@pytest.mark.parametrize(("kind", "most"), [("cog", 1), ("nc3", 1), ("nc4", 3)])
def test_http_sources_cost_no_head_and_one_get_when_their_metadata_fits(tmp_path, data, web, kind, most):
    files = files_of(data, kind, 6)
    web.reset()
    result = virtualize(urls_of(web, files), tmp_path / "refs.json", **JOINS[kind])
    counts = counts_by_file(web)
    assert set(counts) == {file.name for file in files}
    for name, by_method in counts.items():
        assert by_method.get("HEAD", 0) == 0, (name, by_method)
        assert 1 <= by_method["GET"] <= most, (name, by_method)
    if most == 1:  # the one GET is the first block, from the start
        first = [entry for entry in web.log if entry.path.endswith(files[0].name)]
        assert [entry.range for entry in first] == [f"bytes=0-{FIRST_BLOCK - 1}"]
    local = virtualize([str(file) for file in files], tmp_path / "local.json", **JOINS[kind])
    assert refs_of(tmp_path / "refs.json") == refs_of(tmp_path / "local.json")
    assert result.formats == local.formats
    recorded = json.loads((tmp_path / "refs.json").read_text())["nczmap"]["sources"]
    for file in files:  # size and ETag from the first GET's Content-Range and ETag
        entry = recorded[web.url_of(file)]
        assert entry["size"] == file.stat().st_size and entry["etag"].startswith('"')


def on_threads(monkeypatch, seen=lambda file: file.name) -> list:
    """``seen(file)`` of each file handed to the parse threads (``parallel._gathered``) from now on."""
    handed: list = []
    gathered = parallel._gathered

    def spy(files, *args):
        handed.extend(seen(file) for file in files)
        return gathered(files, *args)

    monkeypatch.setattr(parallel, "_gathered", spy)
    return handed


@pytest.mark.parametrize("first_block", [None, 256])
def test_a_cog_series_is_parsed_as_its_first_blocks_come_in(tmp_path, data, web, monkeypatch, first_block):
    """The first reads go out together (many in flight, from this thread), and each twin is parsed here
    as its block is in: no parse thread, one GET a file. A first block too small for a twin's tables: its
    parse from held bytes stops (NotHeld, which no parser takes for a damaged file) and the twin is parsed
    on the threads, with the reads it needs. Either way, the manifest of the local files."""
    if first_block is not None:
        monkeypatch.setattr(sources, "FIRST_BLOCK", first_block)
    web.set_latency(0.02)
    files = files_of(data, "cog")
    web.reset()
    handed = on_threads(monkeypatch)
    progress: list[int] = []
    virtualize(
        urls_of(web, files),
        tmp_path / "refs.json",
        new_dim="time=%Y%m%d",
        reading=lambda done, total: progress.append(done),
    )
    assert progress == list(range(1, len(files) + 1))
    counts = counts_by_file(web)
    if first_block is None:
        assert handed == []
        assert all(count == {"GET": 1} for count in counts.values()), counts
        assert web.max_in_flight >= len(files) // 2, web.max_in_flight
    else:
        assert handed == urls_of(web, files[1:])
        assert all(count["GET"] >= 2 for count in counts.values()), counts
    virtualize([str(file) for file in files], tmp_path / "local.json", new_dim="time=%Y%m%d")
    assert refs_of(tmp_path / "refs.json") == refs_of(tmp_path / "local.json")


def test_first_reads_made_together_are_bounded_when_the_first_file_makes_no_twins(
    tmp_path, data, web, monkeypatch
):
    """netCDF-4 files have no twins: their first reads go out together only up to ``AHEAD`` files, the
    rest are left to the parses on the threads (a catalogue's first blocks are not all held beforehand)."""
    monkeypatch.setattr(parallel, "AHEAD", 3)
    web.set_latency(0.02)
    files = files_of(data, "nc4", 6)
    handed = on_threads(monkeypatch, lambda file: file.started)
    virtualize(urls_of(web, files), tmp_path / "refs.json", concat="time", concurrency=2)
    assert len(handed) == len(files) - 1 and handed[:2] == [True, True] and not all(handed), handed
    assert all(1 <= counts["GET"] <= 3 for counts in counts_by_file(web).values()), counts_by_file(web)
    virtualize([str(file) for file in files], tmp_path / "local.json", concat="time")
    assert refs_of(tmp_path / "refs.json") == refs_of(tmp_path / "local.json")


def test_first_reads_made_together_report_each_outcome(data, web):
    """``fetch_each``: the bytes, None for a failure that may pass (503: the caller's own read retries),
    and the error itself where another request would fail the same way (404), one request each."""
    files = files_of(data, "cog")
    web.faults(error=1.0, path=re.escape(files[1].name))
    readers = [http_reader.HttpReader(url) for url in urls_of(web, files)]
    readers.append(http_reader.HttpReader(f"{web.url}/cog/none.tif"))
    web.reset()
    seen: list[int] = []
    results = http_reader.fetch_each(
        [(reader, 0, 1000) for reader in readers], 3, lambda index, result: seen.append(index)
    )
    assert sorted(seen) == list(range(len(readers)))
    assert results[0] == files[0].read_bytes()[:1000] and readers[0].size == files[0].stat().st_size
    assert results[1] is None
    assert isinstance(results[-1], StorageError) and "none.tif" in str(results[-1])
    assert len(web.log) == len(readers)
    assert web.max_in_flight <= 3


def test_a_source_is_made_without_a_request_and_sniffed_from_its_first_block(data, web):
    cog = files_of(data, "cog")[0]
    web.reset()
    file = source_file(web.url_of(cog))
    assert web.log == [] and file.cached(0, 8) is None  # nothing held, nothing asked
    assert file.size == cog.stat().st_size  # asking for the size makes the first read
    assert file.cached(0, FIRST_BLOCK) == cog.read_bytes()[:FIRST_BLOCK]
    assert file.read_ranges([(10, 20), (FIRST_BLOCK - 4, 4)]) == [
        cog.read_bytes()[10:30],
        cog.read_bytes()[FIRST_BLOCK - 4 : FIRST_BLOCK],
    ]
    assert len(web.log) == 1  # all of it held already
    size = file.size
    middle = size // 2
    far = [(middle, 100), (middle + 200, 50), (size - 10, 10)]  # two spans: neighbours merged
    assert file.read_ranges(far) == [cog.read_bytes()[o : o + n] for o, n in far]
    later = web.log[1:]
    assert sorted(entry.range for entry in later) == sorted(
        [f"bytes={middle}-{middle + 249}", f"bytes={size - 10}-{size - 1}"]
    )
    assert all(entry.headers.get("If-Match") == file.etag for entry in later)  # conditional on the first
    file.close()


# --------------------------------------------------------------------------------------- requests: S3
@pytest.mark.parametrize("kind", ["cog", "nc3"])
def test_an_s3_prefix_costs_one_listing_and_one_get_an_object(tmp_path, data, s3_server, s3_proxy, kind):
    files = files_of(data, kind, 6)
    prefix = upload_folder(s3_server, files)
    s3_proxy.reset()
    refs = tmp_path / "refs.json"
    result = virtualize([f"{s3_proxy.endpoint}/nczbucket/{prefix}/#mode=s3"], refs, **JOINS[kind])
    counts = s3_proxy.snapshot()
    assert (counts["LIST"], counts["HEAD"], counts["GET"]) == (1, 0, len(files)), counts
    local = virtualize([str(file) for file in files], tmp_path / "local.json", **JOINS[kind])
    assert refs_of(refs) == refs_of(tmp_path / "local.json")
    client = s3_server.client()
    recorded = json.loads(refs.read_text())["nczmap"]["sources"]
    for file in files:  # the listing's size and ETag
        head = client.head_object(Bucket="nczbucket", Key=f"{prefix}/{file.name}")
        assert recorded[f"s3://nczbucket/{prefix}/{file.name}"] == {
            "size": file.stat().st_size,
            "etag": head["ETag"],
        }
    with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds:
        assert ds.variables["time"].shape[0] == len(files) == len(local.formats)


def test_s3_reads_are_retried_as_object_stores_retry(tmp_path, data, s3_server, s3_proxy):
    """Five 503s in a row on a GET: obstore's retries under the virtualize policy (10 attempts) carry
    the run through (the s3 driver's own policy, three attempts, would not)."""
    files = files_of(data, "cog", 3)
    prefix = upload_folder(s3_server, files)
    s3_proxy.reset()
    s3_proxy.fail(503, code="SlowDown", times=5, kind="GET")
    virtualize([f"{s3_proxy.endpoint}/nczbucket/{prefix}/#mode=s3"], tmp_path / "refs.json", **JOINS["cog"])
    statuses = [entry.status for entry in s3_proxy.log if entry.kind == "GET"]
    assert statuses.count(503) == 5 and statuses.count(206) == len(files)
    virtualize([str(file) for file in files], tmp_path / "local.json", **JOINS["cog"])
    assert refs_of(tmp_path / "refs.json") == refs_of(tmp_path / "local.json")


# ----------------------------------------------------------------------------------- changed sources
def test_an_http_source_replaced_between_two_reads_is_an_error_naming_it(tmp_path, data, web):
    served = tmp_path / "served"
    served.mkdir()
    original = files_of(data, "cog")[0].read_bytes()
    (served / "a.tif").write_bytes(original)
    with serving(served, latency=0.0) as server:
        file = source_file(server.url_of(served / "a.tif"))
        assert file.read_head(0, 8) == original[:8]
        time.sleep(0.01)
        (served / "a.tif").write_bytes(original[::-1])  # a new version: another ETag
        assert file.read(0, 8) == original[:8]  # held: no request, the version first seen
        with pytest.raises(StorageError, match="changed while it was being virtualized") as info:
            file.read(len(original) - 100, 100)
        assert server.url_of(served / "a.tif") in str(info.value)
        assert [entry.status for entry in server.log] == [206, 412]


def test_a_source_whose_etag_changes_mid_parse_leaves_nothing_written(tmp_path, data, web):
    """Every read after a source's first is conditional on its first ETag: a server whose ETag changes
    (a source replaced while it is parsed) answers 412, and the run stops naming the source."""
    files = files_of(data, "nc4", 3)
    web.faults(changing_etag=True, path=files[1].name)
    refs = tmp_path / "refs.json"
    with pytest.raises(StorageError, match="changed while it was being virtualized") as info:
        virtualize(urls_of(web, files), refs, concat="time")
    assert web.url_of(files[1]) in str(info.value)
    assert not refs.exists()
    assert any(entry.status == 412 and entry.path.endswith(files[1].name) for entry in web.log)


def test_an_s3_object_replaced_after_its_listing_is_an_error_naming_it(tmp_path, data, s3_server):
    files = files_of(data, "nc3", 4)
    prefix = upload_folder(s3_server, files)

    def replace_the_third(done: int, total: int) -> None:
        if done == 1:  # the first file is parsed before the others start
            s3_server.client().put_object(
                Bucket="nczbucket", Key=f"{prefix}/{files[2].name}", Body=files[3].read_bytes()
            )

    refs = tmp_path / "refs.json"
    with pytest.raises(StorageError, match="changed while it was being virtualized") as info:
        virtualize(
            [f"{s3_server.endpoint}/nczbucket/{prefix}/#mode=s3"],
            refs,
            concat="time",
            reading=replace_the_third,
        )
    assert f"s3://nczbucket/{prefix}/{files[2].name}" in str(info.value)
    assert not refs.exists()


# ------------------------------------------------------------------------------------------- faults
def test_503s_and_cut_bodies_end_in_the_fault_free_manifest(tmp_path, data, web):
    """200 files (and COGs and netCDF-4 files, whose parses need more requests) with 15% of GETs
    answered 503 and 7.5% cut in the middle of their body: every run finishes, and its manifest is the
    fault-free one, byte for byte (recorded sizes and ETags included)."""
    web.set_latency(0.005)
    cases = [("nc3", files_of(data, "nc3")), ("cog", files_of(data, "cog")), ("nc4", files_of(data, "nc4"))]
    for kind, files in cases:
        urls = urls_of(web, files)
        web.faults()
        clean = tmp_path / f"{kind}-clean.json"
        virtualize(urls, clean, **JOINS[kind])
        for seed in (1, 2):
            web.faults(error=0.15, cut=0.075, seed=seed)
            web.reset()
            faulty = tmp_path / f"{kind}-faults-{seed}.json"
            virtualize(urls, faulty, **JOINS[kind])
            injected = [entry.fault for entry in web.log if entry.fault]
            assert "error" in injected and (kind != "nc3" or "cut" in injected), (kind, seed, injected)
            assert faulty.read_text() == clean.read_text(), (kind, seed)
    assert len(files_of(data, "nc3")) == NC3_FILES


def test_a_server_ignoring_range_is_read_only_as_far_as_needed(tmp_path, data, web):
    files = files_of(data, "nc3", 3)
    cogs = files_of(data, "cog", 2)
    virtualize(urls_of(web, files), tmp_path / "clean.json", concat="time")
    virtualize(urls_of(web, cogs), tmp_path / "cogs.json", new_dim="time=%Y%m%d")
    web.faults(ignore_range=True)
    web.reset()
    virtualize(urls_of(web, files), tmp_path / "whole.json", concat="time")
    virtualize(urls_of(web, cogs), tmp_path / "cogs-whole.json", new_dim="time=%Y%m%d")
    assert (tmp_path / "whole.json").read_text() == (tmp_path / "clean.json").read_text()
    assert refs_of(tmp_path / "cogs-whole.json") == refs_of(tmp_path / "cogs.json")
    assert {entry.status for entry in web.log} == {200}
    assert all(count["GET"] == 1 for count in counts_by_file(web).values())  # the first block was enough


# ----------------------------------------------------------------------------------------- deadlines
def test_cogs_packed_differently_a_day_decode_as_rasterio_reads_them(tmp_path, monkeypatch):
    """Per-file scale, offset and nodata: no file is a twin of the first, each is parsed in full from the
    bytes its first read brought (on the thread that made the first reads), and the joined manifest (the
    values decoded into it), read through the engine, equals rasterio's reading of each file, masked and
    unpacked."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    packing = [(1.0, 0.0, -32768), (0.01, 273.15, -32768), (1.0, 0.0, -9999), (0.02, -5.0, -32768)]
    folder = tmp_path / "cog"
    folder.mkdir()
    for day, (scale, offset, nodata) in enumerate(packing, 1):
        values = np.random.default_rng(day).integers(-1000, 1000, (1, 256, 256), dtype=np.int16)
        values[0, :10, :10] = nodata
        profile = {**COG, "width": 256, "height": 256, "nodata": nodata}
        with rasterio.open(folder / f"sst_202103{day:02d}.tif", "w", **profile) as dataset:
            dataset.write(values)
            dataset.scales, dataset.offsets = [scale], [offset]
    files = sorted(folder.glob("*.tif"))
    handed = on_threads(monkeypatch)
    with serving(tmp_path, latency=0.005) as server:
        virtualize(urls_of(server, files), tmp_path / "refs.json", new_dim="time=%Y%m%d")
        assert handed == []
        with xr.open_dataset(
            manifest_url(tmp_path / "refs.json"),
            engine="nczmap",
            map_options={"containers": [f"{server.url}/cog/"]},
        ) as ds:
            for step, file in enumerate(files):
                with rasterio.open(file) as source:
                    raw = source.read(1).astype("f8")
                    expected = np.where(
                        raw == source.nodata, np.nan, raw * source.scales[0] + source.offsets[0]
                    )
                assert np.allclose(ds.band_data[step].values, expected, equal_nan=True, rtol=1e-6), file.name


@pytest.mark.parametrize("fault", ["wrong_range", "changing_etag", "huge_length", "cut_always"])
def test_a_misbehaving_server_gives_the_right_manifest_or_an_error_naming_the_source(
    tmp_path, data, web, monkeypatch, fault
):
    """Answers that are not the bytes asked for (another range, another ETag each time, a 2**62
    Content-Length, every body cut short), to the first reads made together and to the parses' own reads,
    and then to reads through the manifest: the fault-free manifest and values, or an nczmap error naming a
    source, in bounded time; never other bytes."""
    monkeypatch.setattr(http_reader, "DEFAULT_POLICY", RequestPolicy(attempts=3, budget=5))
    cases = [("cog", files_of(data, "cog", 4)), ("nc4", files_of(data, "nc4", 3))]
    faults = {"cut": 1.0, "keep": 0.5} if fault == "cut_always" else {fault: True}
    for kind, files in cases:
        urls = urls_of(web, files)
        web.faults()
        clean = tmp_path / f"{kind}-clean.json"
        virtualize(urls, clean, **JOINS[kind])
        web.faults(**faults)
        began = time.monotonic()
        try:
            virtualize(urls, tmp_path / f"{kind}.json", retry_budget=5, **JOINS[kind])
        except NCZError as exc:
            assert any(url in str(exc) for url in urls), str(exc)
            assert not (tmp_path / f"{kind}.json").exists()
        else:  # (each answer's ETag is recorded: with changing ones, the references alone are the same)
            made = tmp_path / f"{kind}.json"
            assert refs_of(made) == refs_of(clean), (kind, fault)
            assert fault == "changing_etag" or made.read_text() == clean.read_text(), (kind, fault)
        assert time.monotonic() - began < 60
        with nczmap.open_dataset(manifest_url(clean), containers=[f"{web.url}/{kind}/"]) as ds:
            name = "band_data" if kind == "cog" else "sst"
            try:
                values = ds.variables[name][0]
            except NCZError as exc:
                assert any(url in str(exc) for url in urls), str(exc)
            else:
                web.faults()
                with nczmap.open_dataset(manifest_url(clean), containers=[f"{web.url}/{kind}/"]) as again:
                    assert np.array_equal(values, again.variables[name][0], equal_nan=True)


def test_a_trickling_server_ends_in_an_error_within_the_deadline(tmp_path, data, web, monkeypatch):
    """One byte every two seconds: each request ends at its deadline (here 1 s + 1 s a MB), retries end
    with the budget, and the error names the source; the same for reads through a manifest."""
    cog = files_of(data, "cog")[0]
    virtualize([web.url_of(cog)], tmp_path / "refs.json", new_dim="time=%Y%m%d")
    web.faults(trickle=2.0)
    began = time.monotonic()
    with pytest.raises(StorageError, match="deadline") as info:
        virtualize(
            [web.url_of(cog)], tmp_path / "late.json", new_dim="time=%Y%m%d", deadline=1, retry_budget=1
        )
    took = time.monotonic() - began
    assert web.url_of(cog) in str(info.value)
    assert took < 6, took  # two attempts of ~1.07 s and the back-off between them
    assert not (tmp_path / "late.json").exists()

    monkeypatch.setattr(http_reader, "DEFAULT_POLICY", RequestPolicy(deadline=1, budget=1))
    result_grant = [f"{web.url}/cog/"]
    began = time.monotonic()
    with (
        nczmap.open_dataset(manifest_url(tmp_path / "refs.json"), containers=result_grant) as ds,
        pytest.raises(StorageError, match="deadline") as info,
    ):
        ds.variables["band_data"][0]
    assert time.monotonic() - began < 8
    assert web.url_of(cog) in str(info.value)


def test_policy_options_are_checked(tmp_path, data, web):
    url = web.url_of(files_of(data, "nc3")[0])
    for options in ({"deadline": 0}, {"retry_budget": -1}, {"deadline": float("inf")}, {"concurrency": 0}):
        with pytest.raises(FormatError):
            virtualize([url], tmp_path / "refs.json", **options)
    assert web.log == []


# -------------------------------------------------------------------------------------- concurrency
def test_many_sources_are_parsed_at_once_on_few_connections(tmp_path, data, web):
    web.set_latency(0.05)
    files = files_of(data, "nc3", 96)
    progress: list[tuple[int, int]] = []
    began = time.monotonic()
    virtualize(
        urls_of(web, files),
        tmp_path / "refs.json",
        concat="time",
        concurrency=32,
        reading=lambda done, total: progress.append((done, total)),
    )
    took = time.monotonic() - began
    assert web.max_in_flight >= 16, web.max_in_flight
    assert web.connections <= 40, web.connections  # a pool per host: connections reused across threads
    assert took < len(files) * 0.05 / 4, took  # one after another would take 4.8 s
    assert progress == [(done, len(files)) for done in range(1, len(files) + 1)]


def test_sources_parsed_in_other_processes_cost_no_more_requests(tmp_path, data, web):
    files = files_of(data, "cog")
    urls = urls_of(web, files)
    virtualize(urls, tmp_path / "threads.json", new_dim="time=%Y%m%d")
    web.reset()
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        virtualize(urls, tmp_path / "processes.json", new_dim="time=%Y%m%d", executor=pool)
    assert (tmp_path / "processes.json").read_text() == (tmp_path / "threads.json").read_text()
    assert all(counts == {"GET": 1} for counts in counts_by_file(web).values()), counts_by_file(web)


# --------------------------------------------------------------------------------------- catalogues
def test_more_local_sources_than_the_descriptor_limit(tmp_path, data):
    """200 files with at most 64 descriptors: a source is held open only while it is read."""
    script = """
        import glob, json, os, resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        from nczmap.integrations.virtualize import virtualize
        peak = []
        result = virtualize(sys.argv[1], sys.argv[2], concat="time",
                            reading=lambda done, total: peak.append(len(os.listdir("/proc/self/fd"))))
        print(json.dumps({"formats": len(result.formats), "peak": max(peak)}))
    """
    for kind in ("nc3", "nc4"):
        pattern = str(data / kind / "day*.nc")
        if kind == "nc4":  # 200 netCDF-4 files too
            folder = tmp_path / "nc4"
            folder.mkdir()
            for day in range(NC3_FILES):
                (folder / f"day{day:03d}.nc").hardlink_to(data / "nc4" / f"day{day % 6:03d}.nc")
            pattern = str(folder / "day*.nc")
        done = run_python(script, pattern, str(tmp_path / f"{kind}.json"))
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        assert found["formats"] == NC3_FILES and found["peak"] < 40, found
        sources = json.loads((tmp_path / f"{kind}.json").read_text())["nczmap"]["sources"]
        assert len(sources) == NC3_FILES


def test_a_local_source_is_reopened_for_later_reads_and_checked(tmp_path, data):
    path = tmp_path / "a.nc"
    path.write_bytes(files_of(data, "nc3")[0].read_bytes())
    file = source_file(str(path))
    assert file.fd < 0  # made: not open
    head = file.read(0, 4)
    assert head == b"CDF\x02" and file.fd >= 0
    file.release()
    assert file.fd < 0
    assert file.read(0, 4) == head  # opened again
    file.release()
    os.utime(path, ns=(0, 0))
    with pytest.raises(StorageError, match="changed while it was being virtualized"):
        file.read(0, 4)


def test_a_list_of_sources(tmp_path, data, web):
    files = files_of(data, "nc3", 5)
    listing = tmp_path / "lists" / "urls.txt"
    listing.parent.mkdir()
    (tmp_path / "lists" / "near.nc").write_bytes(files[3].read_bytes())
    listing.write_text(
        "# daily files\n\n"
        + "\n".join(web.url_of(file) for file in files[:3])
        + "\n   \nnear.nc\n"  # relative to the list's directory
        + f"  {files[4]}  \n# the end\n"
    )
    result = virtualize([f"@{listing}"], tmp_path / "listed.json", concat="time")
    sources = list(json.loads((tmp_path / "listed.json").read_text())["nczmap"]["sources"])
    assert sources == [
        *(web.url_of(file) for file in files[:3]),
        (tmp_path / "lists" / "near.nc").as_uri(),
        files[4].as_uri(),
    ]
    assert len(result.formats) == 5
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nczmap",
            "virtualize",
            f"@{listing}",
            str(tmp_path / "cli.json"),
            "--concat",
            "time",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert refs_of(tmp_path / "cli.json") == refs_of(tmp_path / "listed.json")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(FormatError, match="names no source"):
        virtualize(f"@{tmp_path / 'empty.txt'}", tmp_path / "x.json")


def test_unreadable_sources_are_skipped_and_listed_or_named(tmp_path, data, web):
    files = files_of(data, "nc3", 3)
    junk = data / "nc3" / "junk.bin"
    junk.write_bytes(b"not a netCDF file at all" * 100)
    try:
        sources = [
            *urls_of(web, files[:2]),
            f"{web.url}/nc3/missing.nc",
            web.url_of(junk),
            web.url_of(files[2]),
        ]
        with pytest.raises(StorageError, match="does not exist") as info:
            virtualize(sources, tmp_path / "refs.json", concat="time")
        assert f"{web.url}/nc3/missing.nc" in str(info.value)
        assert not (tmp_path / "refs.json").exists()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", VirtualizeWarning)
            result = virtualize(sources, tmp_path / "refs.json", concat="time", skip_unreadable=True)
        assert [source for source, _ in result.skipped] == [f"{web.url}/nc3/missing.nc", web.url_of(junk)]
        assert "not a file nczmap can virtualize" in result.skipped[1][1]
        assert sum("left out" in str(w.message) for w in caught) == 2
        recorded = json.loads((tmp_path / "refs.json").read_text())["nczmap"]["sources"]
        assert list(recorded) == urls_of(web, files)
        options = ["--concat", "time", "--skip-unreadable", "--concurrency", "4"]
        done = nczmap_command("virtualize", *sources, str(tmp_path / "cli.json"), *options)
        assert done.returncode == 0, done.stderr
        left_out = [line for line in done.stderr.splitlines() if "left out" in line]
        assert len(left_out) == 2 and "missing.nc" in left_out[0] and "junk.bin" in left_out[1]
    finally:
        junk.unlink()


# ---------------------------------------------------------------------------- reading the manifests
def test_http_references_are_read_in_merged_spans(tmp_path, data, web):
    """A COG's compressed tiles lie end to end: a time step read through the manifest is one GET (as an
    S3 object's), not one a tile; values as rasterio reads them."""
    files = files_of(data, "cog")
    result = virtualize(urls_of(web, files), tmp_path / "refs.json", new_dim="time=%Y%m%d")
    web.reset()
    with nczmap.open_dataset(manifest_url(tmp_path / "refs.json"), containers=result.containers) as ds:
        step = ds.variables["band_data"][2]
    with rasterio.open(files[2]) as dataset:
        assert np.array_equal(step, dataset.read(1))
    counts = counts_by_file(web)
    assert counts == {files[2].name: {"HEAD": 1, "GET": 1}}, counts
    (entry,) = [entry for entry in web.log if entry.method == "GET"]
    assert entry.headers.get("If-Match")  # conditional on the ETag the HEAD just checked


def test_s3_references_of_compressed_tiles_are_read_in_merged_spans(tmp_path, data, s3_server, s3_proxy):
    files = files_of(data, "cog")
    prefix = upload_folder(s3_server, files)
    result = virtualize(
        [f"{s3_proxy.endpoint}/nczbucket/{prefix}/#mode=s3"], tmp_path / "refs.json", new_dim="time=%Y%m%d"
    )
    s3_proxy.reset()
    with nczmap.open_dataset(manifest_url(tmp_path / "refs.json"), containers=result.containers) as ds:
        step = ds.variables["band_data"][1]
    with rasterio.open(files[1]) as dataset:
        assert np.array_equal(step, dataset.read(1))
    counts = s3_proxy.snapshot()
    assert (counts["HEAD"], counts["GET"]) == (1, 1), counts


def test_redirects_are_still_refused_and_never_followed(tmp_path, monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with plain_serving() as server, plain_serving() as other:
        server.redirects["/data/moved.nc"] = (307, f"{other.root}/data/data.bin")
        with pytest.raises(AccessDenied, match="redirect") as info:
            virtualize([f"{server.root}/data/moved.nc"], tmp_path / "refs.json")
        assert f"{other.root}/data/data.bin" in str(info.value)
        assert other.requests == [] and server.methods() == ["GET"]
        assert not (tmp_path / "refs.json").exists()


def test_http_sources_pickle_without_their_connections(data, web):
    import pickle

    file = source_file(web.url_of(files_of(data, "cog")[0]), policy=RequestPolicy(deadline=5))
    file.read_head(0, 8)
    copy = pickle.loads(pickle.dumps(file))
    assert isinstance(copy, HttpFile) and copy.policy == file.policy and copy.known() == file.known()
    assert copy.cached(0, 8) is None and copy.read(0, 8) == file.read(0, 8)
    s3 = ObjectFile(parse_url("s3://nczbucket/a/b.nc#mode=s3"), size=10, etag='"x"')
    assert pickle.loads(pickle.dumps(s3)).known() == {"size": 10, "etag": '"x"'}


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured_and_other_4xx_are_not_retried(data, web, status):
    url = web.url_of(files_of(data, "nc3")[0])
    web.faults(error=1.0, error_status=status, retry_after=0.4)
    reader = http_reader.HttpReader(url, policy=RequestPolicy(attempts=3, budget=10))
    began = time.monotonic()
    with pytest.raises(StorageError, match=f"{status}.*3 attempts") as info:
        reader.fetch(0, 100)
    assert time.monotonic() - began >= 0.8  # two waits of the 0.4 s asked for (the back-off is shorter)
    assert url in str(info.value) and len(web.log) == 3
    web.faults()
    web.reset()
    missing = http_reader.HttpReader(f"{web.url}/nc3/none.nc")
    with pytest.raises(StorageError, match="does not exist"):
        missing.fetch(0, 100)
    assert [entry.status for entry in web.log] == [404]  # a 4xx other than 408/429: no second attempt
