"""``virtualize()`` of remote collections (HTTP and S3, 40 ms a request) side by side with the peers.

The sources are served by ``tests/latency_server.py`` (in a child process, so the server does not share
the measured client's interpreter lock): HEAD and single-range GET, every request answered after
``--latency`` seconds (40 ms), each one counted by method, file and bytes. Parts (``--only``):

1. ``cog``: ``--cogs`` daily Cloud-Optimized GeoTIFFs (``--size``² int16, ZSTD + PREDICTOR=2, 512² tiles
   — smaller under ``--quick`` —, overviews; GDAL's COG driver through rasterio), ``sst_YYYYMMDD.tif``:
   ``virtualize(urls, out.json, new_dim="time=%Y%m%d")`` against virtual-tiff + VirtualiZarr
   (``open_virtual_mfdataset(urls, parser=VirtualTIFF(ifd=0), registry=<obstore HTTPStore>,
   combine="nested", concat_dim="time", parallel=ThreadPoolExecutor(8 | 32))`` + ``to_kerchunk(json)``).
   Targets: ≥ 5× faster than the peer on 32 threads, ≤ 1.1 requests and ≤ 64 KiB a file. Beside them,
   the floor: what this server and machine allow, one 64 KiB GET a file, 128 in flight (obstore, asyncio);
   the same series to Parquet too. Targets: JSON and Parquet each within 1.5× of the floor.
   The default ``--size`` is 1024 (2×2 tiles of 512² and one overview, ~0.9 MiB a file), so that 600 files
   build in about a minute; a COG's header, IFDs and tile tables grow with its size (``--size 8192``: 256
   tiles), which is what a first block must hold.
2. ``nc4``: ``--netcdf`` daily netCDF-4 files (``time`` unlimited; ``lat``, ``lon``; two zlib int16
   variables ``sst`` and ``error`` of ``--nc-shape`` 1800×3600, one chunk each, netCDF's default):
   ``virtualize(urls, out.json, concat="time")`` against VirtualiZarr's HDFParser (same
   ``open_virtual_mfdataset`` call, ``loadable_variables=["time"]``, 8 and 32 threads). Targets: ≥ 5×
   faster than the faster peer, ≤ 3 requests a file.
3. ``catalogue``: ``--catalogue`` COGs (8,600, the GHRSST MUR series' length: hard links to the COG series
   under daily names from 2002-06-01) → Parquet, nczmap alone, in a child process stopped after
   ``--catalogue-timeout`` seconds. Target: under 15 s.
4. ``s3``: ``--s3`` COGs of the series uploaded to moto (``tests/s3server.py``'s ``start_server``, in a
   child process) behind ``tests/s3proxy.py`` (in another, adding ``--latency`` and counting requests):
   ``virtualize("<proxy>/<bucket>/cogs/#mode=s3", out.json, new_dim=...)``; the floor is a bare LIST plus
   one 64 KiB GET an object, 64 in flight (obstore, asyncio), against the same proxy. Targets: no HEAD,
   ≤ 1.1 GETs a COG with the listing included, within 1.5× of the floor.
5. ``faults``: the COG series and the netCDF-4 files again with ``--fault-error`` (15%) of GETs answered
   503 and ``--fault-cut`` (7.5%) cut mid-body (deterministic, seeded): the run must finish and its
   manifest must equal the fault-free one — the whole JSON, the sources' recorded sizes and ETags
   included, nothing removed (same server, same URLs). virtual-tiff (32 threads) under the same faults is
   shown for information.

Every result is checked before its time counts: nczmap's manifests are opened with
``xr.open_dataset(url, engine="nczmap", map_options={"containers": result.containers})`` and one time step
compared with rasterio's (netCDF4's) reading of the local file; the peers' chunk references are compared
with tifffile's tile offsets (h5py's chunk offsets) of the local files. A wrong result makes the run exit
1; an nczmap run that raises is reported and also exits 1, except under faults (then the target is
missed). Times are single runs by default (``--rounds`` interleaves more and keeps the median), after a
warm-up on two files with the libraries imported. Requests and bytes are counted by the server for
exactly the measured run (without the checks' reads). Inputs are built in a temporary directory, or in
``--workdir`` (kept and reused by the next run with the same sizes).

    .venv/bin/python bench/bench_remote.py [--cogs 600] [--size 1024] [--netcdf 200] [--nc-shape 1800x3600]
        [--catalogue 8600] [--s3 200] [--latency 0.04] [--threads 8,32] [--rounds 1] [--workdir DIR]
        [--only cog|nc4|catalogue|s3|faults ...] [--quick]

The local benchmarks of issue 15 are ``bench/bench_virtualize.py`` (they must not get slower).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from _common import fmt_ratio, fmt_time
from bench_virtualize import build_cogs  # the same daily COGs as the local benchmark

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from latency_server import InChild, serving

START = datetime.date(2020, 1, 1)
CATALOGUE_START = datetime.date(2002, 6, 1)  # the GHRSST MUR series' first day
METHODS = ("HEAD", "GET", "LIST")
FLOOR_FLIGHT = 64  # requests in flight of the S3 floor (a LIST + one 64 KiB GET an object)
COG_FLOOR_FLIGHT = 128  # requests in flight of the HTTP COG floor (one 64 KiB GET a file)
ROWS: list[tuple[str, ...]] = []
NOTES: list[str] = []
PROBLEMS: list[str] = []  # wrong results, nczmap runs that raised: the run exits 1


# ------------------------------------------------------------------------------------------ inputs
def _stamped(directory: Path, stamp: dict) -> bool:
    marker = directory / "built.json"
    return marker.is_file() and json.loads(marker.read_text()) == stamp


def _stamp(directory: Path, stamp: dict) -> None:
    (directory / "built.json").write_text(json.dumps(stamp))


def _fresh(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)


def build_netcdf4(directory: Path, count: int, shape: tuple[int, int]) -> list[str]:
    """``count`` daily netCDF-4 files: time (unlimited), lat, lon, and two zlib int16 variables."""
    import netCDF4

    ny, nx = shape
    stamp = {"kind": "netcdf4", "files": count, "shape": [ny, nx], "version": 1}
    if not _stamped(directory, stamp):
        _fresh(directory)
        lat = np.linspace(-90 + 90 / ny, 90 - 90 / ny, ny, dtype="f4")
        lon = np.linspace(-180 + 180 / nx, 180 - 180 / nx, nx, dtype="f4")
        yy, xx = np.meshgrid(np.radians(lat), np.radians(lon), indexing="ij")
        base = (1500 + 1000 * np.cos(yy) * np.cos(2 * xx)).astype("f4")
        rng = np.random.default_rng(0)
        for day in range(count):
            date = START + datetime.timedelta(days=day)
            with netCDF4.Dataset(directory / f"sst_{date:%Y%m%d}.nc", "w") as ds:
                ds.createDimension("time", None)
                ds.createDimension("lat", ny)
                ds.createDimension("lon", nx)
                time_var = ds.createVariable("time", "f8", ("time",))
                time_var.units = "days since 2020-01-01"
                time_var.calendar = "standard"
                ds.createVariable("lat", "f4", ("lat",))[:] = lat
                ds.createVariable("lon", "f4", ("lon",))[:] = lon
                time_var[0] = day
                for name, shift in (("sst", 0.0), ("error", 7.0)):
                    variable = ds.createVariable(
                        name, "i2", ("time", "lat", "lon"), zlib=True, fill_value=-32768
                    )
                    variable.scale_factor = 0.01
                    variable.add_offset = 0.0
                    variable.set_auto_maskandscale(False)
                    noise = rng.integers(-4, 4, base.shape)
                    variable[0] = (base + shift + 20 * np.sin(day / 10) + noise).astype("i2")
        _stamp(directory, stamp)
    return sorted(glob.glob(str(directory / "sst_*.nc")))


def build_catalogue(directory: Path, cogs: list[str], count: int) -> list[str]:
    """``count`` daily names from 2002-06-01, hard links to the COGs in turn (copies where links fail)."""
    stamp = {"kind": "catalogue", "files": count, "of": [os.path.basename(c) for c in cogs], "version": 1}
    if not _stamped(directory, stamp):
        _fresh(directory)
        for day in range(count):
            date = CATALOGUE_START + datetime.timedelta(days=day)
            target = directory / f"sst_{date:%Y%m%d}.tif"
            try:
                os.link(cogs[day % len(cogs)], target)
            except OSError:
                shutil.copyfile(cogs[day % len(cogs)], target)
        _stamp(directory, stamp)
    return sorted(glob.glob(str(directory / "sst_*.tif")))


# ------------------------------------------------------------------------------------------ measuring
@dataclass
class Run:
    """One measured run: its wall time (None when it raised), and what the server counted meanwhile."""

    label: str
    files: int
    seconds: float | None = None
    stats: dict = field(default_factory=dict)
    log: list = field(default_factory=list)
    error: str | None = None
    value: object = None

    def per_file(self, method: str | None = None) -> float:
        counts = self.stats.get("counts", Counter())
        total = counts.get(method, 0) if method else sum(counts.values())
        return total / self.files

    @property
    def kib(self) -> float | None:
        sent = self.stats.get("bytes_sent")
        return None if sent is None else sent / 1024 / self.files

    def shown_requests(self) -> str:
        counts = self.stats.get("counts", Counter())
        parts = [f"{m} {counts[m] / self.files:.2f}" for m in (*METHODS, *sorted(counts)) if counts.get(m)]
        return f"{self.per_file():.2f} (" + ", ".join(dict.fromkeys(parts)) + ")"


def run_counted(server, label: str, files: int, function, keep_log: bool = False) -> Run:
    """``function()`` timed, the server's counts reset before and read after."""
    server.reset()
    run = Run(label, files)
    start = time.perf_counter()
    try:
        run.value = function()
        run.seconds = time.perf_counter() - start
    except Exception as exc:
        run.error = f"{type(exc).__name__}: {exc}"[:300]
    run.stats = server.stats()
    if keep_log:
        run.log = server.log
    return run


def rounds_of(server, cases: dict, files: int, rounds: int, logged: set[str] = frozenset()) -> dict[str, Run]:
    """Each case run ``rounds`` times, the cases interleaved; the median time is kept, with the counts and
    value of the last round (a case that raises is not run again)."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    runs: dict[str, Run] = {}
    for _ in range(rounds):
        for name, function in cases.items():
            if name in runs and runs[name].error:
                continue
            runs[name] = run_counted(server, name, files, function, keep_log=name in logged)
            if runs[name].seconds is not None:
                samples[name].append(runs[name].seconds)
    for name, run in runs.items():
        if samples[name]:
            run.seconds = statistics.median(samples[name])
            if rounds > 1:
                shown = ", ".join(fmt_time(v).strip() for v in samples[name])
                print(f"  {name}: {shown}", file=sys.stderr)
    return runs


def verdict(met: bool) -> str:
    return "TARGET MET" if met else "TARGET MISSED"


def row(measure: str, run: Run | None = None, ratio: str = "", seconds: float | None = None) -> None:
    """One line of the table: the time, requests and KiB a file, peak in flight, and a ratio or target."""
    if run is None:
        ROWS.append((measure, fmt_time(seconds) if seconds else "", "", "", "", ratio))
        return
    if run.seconds is None:
        ROWS.append((measure, "failed", "", "", "", ratio or (run.error or "")[:60] + "... (below)"))
        return
    flight = str(run.stats.get("max_in_flight", ""))
    by_method = run.stats.get("max_in_flight_by_method") or {}
    if len(by_method) > 1:
        flight += " (" + ", ".join(f"{m} {by_method[m]}" for m in sorted(by_method)) + ")"
    kib = "n/a" if run.kib is None else f"{run.kib:.1f}"
    ROWS.append((measure, fmt_time(run.seconds), run.shown_requests(), kib, flight, ratio))


def target_row(text: str, met: bool) -> None:
    ROWS.append((f"  {text}", "", "", "", "", verdict(met)))


def speed(ours: Run, peer: Run | None) -> float | None:
    """How many times faster nczmap is (peer time / nczmap time)."""
    if peer is None or ours.seconds is None or peer.seconds is None:
        return None
    return peer.seconds / ours.seconds


def shown_speed(ratio: float | None) -> str:
    if ratio is None:
        return "n/a"
    return f"{fmt_ratio(ratio).strip()} faster" if ratio >= 1 else f"{fmt_ratio(1 / ratio).strip()} slower"


def file_pattern(run: Run, path: str) -> str:
    """The requests one file got, in order: ``HEAD, GET 0-262143, HEAD``."""
    seen = []
    for entry in run.log:
        if entry.path == path:
            shown = entry.method + (f" {entry.range.removeprefix('bytes=')}" if entry.range else "")
            if entry.status and entry.status not in (200, 206):
                shown += f" → {entry.status}"
            if entry.fault:
                shown += f" [{entry.fault}]"
            seen.append(shown)
    return ", ".join(seen)


def problem(text: str) -> None:
    PROBLEMS.append(text)
    print(f"PROBLEM: {text}", flush=True)


def quiet_warnings() -> None:
    warnings.filterwarnings("ignore", message=".*codecs are not in the Zarr version 3")
    warnings.filterwarnings("ignore", message="__eq__ currently is over-cautious")
    warnings.filterwarnings("ignore", category=UserWarning, module="virtualizarr")
    warnings.filterwarnings("ignore", message=".*was not created with `asynchronous=True`")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


# ------------------------------------------------------------------------------------------ the tools
def http_registry(base: str):
    """An obspec-utils registry answering every URL under ``base`` with an obstore HTTPStore."""
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import HTTPStore

    return ObjectStoreRegistry({base: HTTPStore.from_url(base, client_options={"allow_http": True})})


def http_floor_run(urls: list[str], base: str, flight: int):
    """What this server allows: one 64 KiB GET a file, ``flight`` in flight (obstore, asyncio), no parsing."""

    def run() -> int:
        import obstore
        from obstore.store import HTTPStore

        async def every() -> int:
            store = HTTPStore.from_url(base, client_options={"allow_http": True})
            limit = asyncio.Semaphore(flight)

            async def one(url: str) -> int:
                async with limit:
                    answer = await obstore.get_async(
                        store, url[len(base) + 1 :], options={"range": (0, 65536)}
                    )
                    return len(await answer.bytes_async())

            return sum(await asyncio.gather(*(one(url) for url in urls)))

        return asyncio.run(every())

    return run


def nczmap_run(urls: list[str], out: str, **options):
    from nczmap.integrations.virtualize import virtualize

    return lambda: virtualize(urls, out, **options)


def virtual_tiff_run(urls: list[str], base: str, threads: int, out: str):
    def run():
        from concurrent.futures import ThreadPoolExecutor

        from virtual_tiff import VirtualTIFF
        from virtualizarr import open_virtual_mfdataset

        with ThreadPoolExecutor(threads) as pool:
            vds = open_virtual_mfdataset(
                urls,
                parser=VirtualTIFF(ifd=0),  # the full-resolution image; its overviews would clash on y/x
                registry=http_registry(base),
                combine="nested",
                concat_dim="time",
                coords="minimal",
                compat="override",
                parallel=pool,
            )
        vds.vz.to_kerchunk(out, format="json", zarr_format=3)  # v3 codecs: the v2 form is refused
        return vds

    return run


def hdf_parser_run(urls: list[str], base: str, threads: int, out: str):
    def run():
        from concurrent.futures import ThreadPoolExecutor

        from virtualizarr import open_virtual_mfdataset
        from virtualizarr.parsers import HDFParser

        with ThreadPoolExecutor(threads) as pool:
            vds = open_virtual_mfdataset(
                urls,
                parser=HDFParser(),
                registry=http_registry(base),
                loadable_variables=["time"],
                combine="nested",
                concat_dim="time",
                coords="minimal",
                compat="override",
                parallel=pool,
            )
        vds.vz.to_kerchunk(out, format="json")
        return vds

    return run


# ------------------------------------------------------------------------------------------ checks
def manifest_engine_url(path: str) -> str:
    return "file://" + path + "#mode=nczarr,manifest"


def open_manifest(path: str, containers, **options):
    import xarray as xr

    return xr.open_dataset(
        manifest_engine_url(path), engine="nczmap", map_options={"containers": list(containers)}, **options
    )


def check_cog_manifest(path: str, containers, files: list[str], dates: list[datetime.date]) -> str:
    """One time step of nczmap's manifest, read through its engine, equals rasterio's reading of the local
    file; the time coordinate is the files' dates. Returns what was checked."""
    import rasterio

    step = len(files) // 2
    with rasterio.open(files[step]) as dataset:
        expected = dataset.read(1)
    with open_manifest(path, containers, mask_and_scale=False) as ds:
        got = ds["band_data"].isel(time=step).values
        times = list(ds["time"].values.astype("M8[D]"))
    if not np.array_equal(got, expected):
        raise AssertionError(f"{path}: band_data at time step {step} differs from rasterio's")
    if times != [np.datetime64(d, "D") for d in dates]:
        raise AssertionError(f"{path}: its time coordinate is not the files' dates")
    return f"step {step} = rasterio, {len(times)} dates"


def check_nc4_manifest(path: str, containers, files: list[str]) -> str:
    import xarray as xr

    step = len(files) // 2
    with xr.open_dataset(files[step], engine="netcdf4") as local:
        expected = local.load()
    with open_manifest(path, containers) as ds:
        got = ds.isel(time=step).load()
        count = ds.sizes["time"]
    for name in ("sst", "error", "lat", "lon", "time"):
        np.testing.assert_array_equal(got[name].values, expected[name].values.squeeze(), err_msg=name)
    if count != len(files):
        raise AssertionError(f"{path}: {count} time steps for {len(files)} files")
    return f"step {step} (sst, error, lat, lon, time) = netCDF4"


def check_tiff_peer(vds, urls: list[str], files: list[str]) -> str:
    """The peer's chunk references of one time step are the file's tiles (tifffile's offsets)."""
    import tifffile

    step = len(files) // 2
    manifest = vds["0"].data.manifest.dict()
    with tifffile.TiffFile(files[step]) as tif:
        page = tif.pages[0]
        across = -(-page.imagewidth // page.tilewidth)
        for index, (offset, length) in enumerate(zip(page.dataoffsets, page.databytecounts, strict=True)):
            ref = manifest[f"{step}.{index // across}.{index % across}"]
            if (ref["path"], ref["offset"], ref["length"]) != (urls[step], offset, length):
                raise AssertionError(f"virtual-tiff: tile {index} of step {step} refers to {ref}")
    return f"step {step}'s tiles = tifffile's"


def check_hdf_peer(vds, urls: list[str], files: list[str]) -> str:
    import h5py

    step = len(files) // 2
    with h5py.File(files[step], "r") as f:
        for name in ("sst", "error"):
            manifest = vds[name].data.manifest.dict()
            dataset = f[name]
            for index in range(dataset.id.get_num_chunks()):
                info = dataset.id.get_chunk_info(index)
                key = ".".join(str(o // c) for o, c in zip(info.chunk_offset, dataset.chunks, strict=True))
                ref = manifest[f"{step}." + key.split(".", 1)[1]]
                if (ref["path"], ref["offset"], ref["length"]) != (urls[step], info.byte_offset, info.size):
                    raise AssertionError(f"HDFParser: {name} chunk {key} of step {step} refers to {ref}")
    return f"step {step}'s chunks = h5py's"


def checked(label: str, run: Run, check) -> bool:
    """Run ``check(run.value)``; a wrong result is a problem (the run's time does not count)."""
    if run.seconds is None:
        return False
    try:
        what = check(run.value)
    except Exception as exc:
        problem(f"{label}: the result is wrong: {type(exc).__name__}: {exc}"[:400])
        run.seconds = None
        run.error = "wrong result"
        return False
    print(f"check {label}: {what}", flush=True)
    return True


# ------------------------------------------------------------------------------------------ 1. COGs
def bench_cogs(server, files: list[str], out: Path, threads: list[int], rounds: int) -> dict:
    urls = [server.url_of(f) for f in files]
    dates = [datetime.datetime.strptime(Path(f).stem[-8:], "%Y%m%d").date() for f in files]
    ours_path = str(out / "nczmap-cog.json")
    parquet_path = str(out / "nczmap-cog.parq")
    warm = nczmap_run(urls[:2], str(out / "warm.json"), new_dim="time=%Y%m%d")
    warm()
    nczmap_run(urls[:2], str(out / "warm.parq"), new_dim="time=%Y%m%d")()
    cases = {
        "nczmap": nczmap_run(urls, ours_path, new_dim="time=%Y%m%d"),
        "nczmap parquet": nczmap_run(urls, parquet_path, new_dim="time=%Y%m%d"),
    }
    for count in threads:
        try:
            virtual_tiff_run(urls[:2], server.url, count, str(out / "warm-vt.json"))()
        except Exception as exc:
            NOTES.append(f"virtual-tiff does not run here: {type(exc).__name__}: {exc}"[:300])
            break
        cases[f"virtual-tiff {count} threads"] = virtual_tiff_run(
            urls, server.url, count, str(out / f"vt{count}.json")
        )
    http_floor_run(urls[:2], server.url, COG_FLOOR_FLIGHT)()
    cases["floor"] = http_floor_run(urls, server.url, COG_FLOOR_FLIGHT)
    runs = rounds_of(server, cases, len(files), rounds, logged={"nczmap"})
    ours, ours_parquet = runs["nczmap"], runs.pop("nczmap parquet")
    for label, run, path in (("JSON", ours, ours_path), ("Parquet", ours_parquet, parquet_path)):
        if run.error:
            problem(f"nczmap on {len(files)} COGs over HTTP to {label} raised: {run.error}")
        checked(
            f"nczmap {len(files)} COGs → {label}",
            run,
            lambda r, path=path: check_cog_manifest(path, r.containers, files, dates),
        )
    floor = runs.pop("floor")
    for name, run in runs.items():
        if name != "nczmap" and run.seconds is not None:
            checked(name, run, lambda vds: check_tiff_peer(vds, urls, files))
        elif name != "nczmap":
            NOTES.append(f"COG peer {name} failed: {run.error}")
    n = len(files)
    row(f"COG ×{n} over HTTP: nczmap → JSON", ours)
    row(f"COG ×{n} over HTTP: nczmap → Parquet", ours_parquet)
    for name, run in runs.items():
        if name != "nczmap":
            row(f"COG ×{n}: {name} → JSON", run, shown_speed(speed(ours, run)))
    row(f"COG ×{n}: floor, one 64 KiB GET a file, {COG_FLOOR_FLIGHT} in flight (obstore)", floor)
    for label, run in (("JSON", ours), ("Parquet", ours_parquet)):
        if run.seconds is not None and floor.seconds:
            ratio = run.seconds / floor.seconds
            target_row(f"COG ×{n} → {label}: within 1.5× of the floor ({ratio:.2f}× its time)", ratio <= 1.5)
    target_peer = runs.get(f"virtual-tiff {max(threads)} threads")
    ratio = speed(ours, target_peer)
    if ours.seconds is not None:
        shown = shown_speed(ratio)
        target_row(
            f"COG ×{n}: ≥ 5× faster than virtual-tiff on {max(threads)} threads ({shown})",
            ratio is not None and ratio >= 5,
        )
        target_row(f"COG ×{n}: ≤ 1.1 requests a file ({ours.per_file():.2f})", ours.per_file() <= 1.1)
        target_row(f"COG ×{n}: ≤ 64 KiB a file ({ours.kib:.1f})", ours.kib <= 64)
        NOTES.append(f"nczmap, requests of {Path(files[0]).name}: {file_pattern(ours, urls_path(urls[0]))}")
    if target_peer is not None and target_peer.seconds is not None:
        NOTES.append(
            f"virtual-tiff, requests of {Path(files[0]).name}: "
            + ", ".join(f"{m} {c / n:.2f}" for m, c in sorted(target_peer.stats["counts"].items()))
            + " a file"
        )
    return {"runs": runs, "urls": urls, "manifest": ours_path}


def urls_path(url: str) -> str:
    from urllib.parse import unquote, urlsplit

    return unquote(urlsplit(url).path)


# ------------------------------------------------------------------------------------------ 2. netCDF-4
def bench_netcdf4(server, files: list[str], out: Path, threads: list[int], rounds: int) -> dict:
    urls = [server.url_of(f) for f in files]
    ours_path = str(out / "nczmap-nc4.json")
    nczmap_run(urls[:2], str(out / "warm-nc4.json"), concat="time")()
    cases = {"nczmap": nczmap_run(urls, ours_path, concat="time")}
    for count in threads:
        try:
            hdf_parser_run(urls[:2], server.url, count, str(out / "warm-vz.json"))()
        except Exception as exc:
            NOTES.append(f"VirtualiZarr's HDFParser does not run here: {type(exc).__name__}: {exc}"[:300])
            break
        cases[f"HDFParser {count} threads"] = hdf_parser_run(
            urls, server.url, count, str(out / f"vz{count}.json")
        )
    runs = rounds_of(server, cases, len(files), rounds, logged={"nczmap"})
    ours = runs["nczmap"]
    if ours.error:
        problem(f"nczmap on {len(files)} netCDF-4 files over HTTP raised: {ours.error}")
    checked(
        f"nczmap {len(files)} netCDF-4", ours, lambda r: check_nc4_manifest(ours_path, r.containers, files)
    )
    for name, run in runs.items():
        if name != "nczmap" and run.seconds is not None:
            checked(name, run, lambda vds: check_hdf_peer(vds, urls, files))
        elif name != "nczmap":
            NOTES.append(f"netCDF-4 peer {name} failed: {run.error}")
    n = len(files)
    row(f"nc4 ×{n} over HTTP: nczmap → JSON", ours)
    peers = {name: run for name, run in runs.items() if name != "nczmap"}
    for name, run in peers.items():
        row(f"nc4 ×{n}: VirtualiZarr {name} → JSON", run, shown_speed(speed(ours, run)))
    timed = [run for run in peers.values() if run.seconds is not None]
    fastest = min(timed, key=lambda run: run.seconds) if timed else None
    if ours.seconds is not None:
        ratio = speed(ours, fastest)
        label = fastest.label if fastest else "n/a"
        target_row(
            f"nc4 ×{n}: ≥ 5× faster than VirtualiZarr's {label} ({shown_speed(ratio)})",
            ratio is not None and ratio >= 5,
        )
        target_row(f"nc4 ×{n}: ≤ 3 requests a file ({ours.per_file():.2f})", ours.per_file() <= 3)
        NOTES.append(f"nczmap, requests of {Path(files[0]).name}: {file_pattern(ours, urls_path(urls[0]))}")
    return {"runs": runs, "urls": urls, "manifest": ours_path}


# ------------------------------------------------------------------------------------------ 3. catalogue
CATALOGUE_CHILD = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
from nczmap.integrations.virtualize import virtualize
urls = open(sys.argv[1]).read().split()
start = time.perf_counter()
result = virtualize(urls, sys.argv[2], new_dim="time=%Y%m%d")
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "containers": [c.prefix for c in result.containers]}))
"""


def bench_catalogue(server, files: list[str], out: Path, timeout: float) -> None:
    urls = [server.url_of(f) for f in files]
    listing = out / "catalogue-urls.txt"
    listing.write_text("\n".join(urls) + "\n")
    manifest = str(out / "catalogue.parq")
    dates = [datetime.datetime.strptime(Path(f).stem[-8:], "%Y%m%d").date() for f in files]
    server.reset()
    run = Run(f"catalogue ×{len(files)}", len(files))
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", CATALOGUE_CHILD, str(listing), manifest],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode:
            lines = (done.stderr.strip().splitlines() or ["?"])[-1]
            run.error = f"exit {done.returncode}: {lines}"[:300]
        else:
            answer = json.loads(done.stdout.strip().splitlines()[-1])
            run.seconds, containers = answer["seconds"], answer["containers"]
    except subprocess.TimeoutExpired:
        run.error = f"still running after {timeout:.0f} s: stopped"
    elapsed = time.perf_counter() - started
    run.stats = server.stats()
    n = len(files)
    if run.seconds is not None:
        if checked(
            f"nczmap catalogue ×{n}", run, lambda _: check_cog_manifest(manifest, containers, files, dates)
        ):
            row(f"catalogue ×{n} COGs over HTTP: nczmap → Parquet", run)
    else:
        row(
            f"catalogue ×{n} COGs over HTTP: nczmap → Parquet",
            run,
            f"failed after {elapsed:.0f} s: {run.error}",
        )
        if not (run.error or "").startswith("still running"):
            problem(f"nczmap on the {n}-file catalogue: {run.error}")
    met = run.seconds is not None and run.seconds < 15
    shown = fmt_time(run.seconds).strip() if run.seconds is not None else f"> {elapsed:.0f} s"
    target_row(f"catalogue ×{n} at {server.latency * 1000:g} ms: under 15 s ({shown})", met)
    NOTES.append(
        f"catalogue: {n} names over {len(set(os.stat(f).st_ino for f in files))} distinct COGs (hard links), "
        "run in a child process (its imports not timed)"
    )


# ------------------------------------------------------------------------------------------ 4. S3
def bench_s3(files: list[str], out: Path, latency: float, rounds: int) -> None:
    import boto3
    import obstore
    from obstore.store import S3Store
    from s3server import BUCKET, CREDENTIALS

    from nczmap.integrations.virtualize import virtualize

    os.environ.update(CREDENTIALS)
    n = len(files)
    dates = [datetime.datetime.strptime(Path(f).stem[-8:], "%Y%m%d").date() for f in files]
    with contextlib.ExitStack() as stack:
        moto = stack.enter_context(InChild("s3server", "start_server", stderr=subprocess.DEVNULL))
        endpoint = moto.get("endpoint")
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        started = time.perf_counter()
        for f in files:
            client.put_object(Bucket=BUCKET, Key=f"cogs/{Path(f).name}", Body=Path(f).read_bytes())
        for f in files[:2]:
            client.put_object(Bucket=BUCKET, Key=f"warm/{Path(f).name}", Body=Path(f).read_bytes())
        print(f"S3: {n} COGs uploaded to moto in {time.perf_counter() - started:.1f} s", flush=True)
        proxy = stack.enter_context(InChild("s3proxy", "S3Proxy", endpoint, latency=latency))
        front = proxy.get("endpoint")
        store_options = {
            "endpoint": front,
            "region": "us-east-1",
            "virtual_hosted_style_request": False,
            "client_options": {"allow_http": True},
        }

        async def floor_async() -> int:
            store = S3Store(BUCKET, **store_options)
            listing = await obstore.list(store, "cogs/").collect_async()
            limit = asyncio.Semaphore(FLOOR_FLIGHT)

            async def one(path: str) -> int:
                async with limit:
                    answer = await obstore.get_async(store, path, options={"range": (0, 65536)})
                    return len(await answer.bytes_async())

            sizes = await asyncio.gather(*(one(item["path"]) for item in listing))
            if len(sizes) != n:
                raise AssertionError(f"the floor listed {len(sizes)} objects, not {n}")
            return sum(sizes)

        manifest = str(out / "nczmap-s3.json")
        source = f"{front}/{BUCKET}/cogs/#mode=s3"
        virtualize(f"{front}/{BUCKET}/warm/#mode=s3", str(out / "warm-s3.json"), new_dim="time=%Y%m%d")
        asyncio.run(floor_async())  # warm

        class Counted:  # the proxy's counts, as the latency server's
            latency = 0.0

            @staticmethod
            def reset():
                proxy.call("reset")

            @staticmethod
            def stats():
                counts = Counter({k: v for k, v in proxy.call("snapshot").items() if v})
                flight = Counter({k: v for k, v in proxy.get("max_in_flight").items() if v})
                return {
                    "counts": counts,
                    "bytes_sent": None,
                    "max_in_flight": sum(flight.values()),
                    "max_in_flight_by_method": flight,
                }

        cases = {
            "nczmap": lambda: virtualize(source, manifest, new_dim="time=%Y%m%d"),
            "floor": lambda: asyncio.run(floor_async()),
        }
        runs = rounds_of(Counted, cases, n, rounds)
        ours, floor = runs["nczmap"], runs["floor"]
        if ours.error:
            problem(f"nczmap on {n} COGs in S3 raised: {ours.error}")
        checked(f"nczmap S3 ×{n}", ours, lambda r: check_cog_manifest(manifest, r.containers, files, dates))
    row(f"S3 ×{n} COGs (moto + proxy): nczmap → JSON", ours)
    row(f"S3 ×{n}: floor, LIST + one 64 KiB GET an object, 64 in flight", floor)
    if ours.seconds is not None and floor.seconds is not None:
        counts = ours.stats["counts"]
        ratio = ours.seconds / floor.seconds
        target_row(f"S3 ×{n}: no HEAD ({counts.get('HEAD', 0)})", counts.get("HEAD", 0) == 0)
        gets = (counts.get("GET", 0) + counts.get("LIST", 0)) / n
        target_row(f"S3 ×{n}: ≤ 1.1 GETs a COG, the listing included ({gets:.2f})", gets <= 1.1)
        target_row(f"S3 ×{n}: within 1.5× of the floor ({ratio:.2f}× the floor's time)", ratio <= 1.5)
    NOTES.append("S3: bytes are not counted (the proxy counts requests); 'in flight' sums each kind's most")


# ------------------------------------------------------------------------------------------ 5. faults
def bench_faults(
    server, part: str, files: list[str], clean: str, out: Path, error: float, cut: float, threads: list[int]
) -> None:
    """The same run with faults injected: it must finish with a manifest equal to the fault-free one."""
    urls = [server.url_of(f) for f in files]
    n = len(files)
    path = str(out / f"nczmap-{part}-faults.json")
    options = {"new_dim": "time=%Y%m%d"} if part == "cog" else {"concat": "time"}
    server.faults(error=error, cut=cut, seed=25)
    try:
        run = run_counted(server, "nczmap faults", n, nczmap_run(urls, path, **options), keep_log=True)
        peer = None
        if part == "cog" and threads:
            peer = run_counted(
                server,
                "virtual-tiff faults",
                n,
                virtual_tiff_run(urls, server.url, max(threads), str(out / "vt-faults.json")),
                keep_log=True,
            )
    finally:
        server.faults()
    injected = Counter(entry.fault for entry in run.log if entry.fault)
    label = f"{part} ×{n} with {error:.1%} 503 + {cut:.1%} cut GETs: nczmap"
    same = False
    if run.seconds is not None:
        with open(clean) as a, open(path) as b:
            same = json.load(a) == json.load(b)
        row(label, run, "manifest = fault-free" if same else "manifest DIFFERS from the fault-free one")
    else:
        row(label, run)
    shown = ", ".join(f"{k} {v}" for k, v in sorted(injected.items())) or "none"
    target_row(f"{part} ×{n} under faults ({shown} injected): finishes, manifest equal", same)
    if run.seconds is None:
        NOTES.append(f"{part} under faults: nczmap raised {run.error}")
        named = re.search(r"https?://127\.0\.0\.1:\d+(/[^\s:,;]+)", run.error or "")
        if named:
            NOTES.append(f"{part} under faults, requests of {named[1]}: {file_pattern(run, named[1])}")
    if peer is not None:
        outcome = "finished" if peer.seconds is not None else f"aborted ({(peer.error or '')[:150]})"
        reference = out / f"vt{max(threads)}.json"
        if peer.seconds is not None and reference.is_file():
            with open(reference) as a, open(out / "vt-faults.json") as b:
                equal = json.load(a) == json.load(b)
            outcome += ", its JSON " + ("equal to" if equal else "DIFFERENT from") + " its fault-free one"
        faults = Counter(entry.fault for entry in peer.log if entry.fault)
        shown_faults = ", ".join(f"{k} {v}" for k, v in sorted(faults.items())) or "none"
        NOTES.append(f"virtual-tiff {max(threads)} threads under the same faults ({shown_faults}): {outcome}")


# ------------------------------------------------------------------------------------------ main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cogs", type=int, default=600, help="daily COGs of the series")
    parser.add_argument("--size", type=int, default=1024, help="COG width and height (512² tiles)")
    parser.add_argument("--netcdf", type=int, default=200, help="daily netCDF-4 files")
    parser.add_argument("--nc-shape", default="1800x3600", help="lat×lon of the netCDF-4 variables")
    parser.add_argument("--catalogue", type=int, default=8600, help="COGs of the catalogue run")
    parser.add_argument("--catalogue-timeout", type=float, default=3600, help="seconds before it is stopped")
    parser.add_argument("--s3", type=int, default=200, help="COGs of the S3 run")
    parser.add_argument("--latency", type=float, default=0.04, help="seconds before each answer")
    parser.add_argument("--threads", default="8,32", help="the peers' thread pools")
    parser.add_argument("--fault-error", type=float, default=0.15, help="share of GETs answered 503")
    parser.add_argument("--fault-cut", type=float, default=0.075, help="share of GETs cut mid-body")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="build (and keep, and reuse) the inputs here")
    parts_all = ["cog", "nc4", "catalogue", "s3", "faults"]
    parser.add_argument("--only", choices=parts_all, action="append", help="run some parts")
    parser.add_argument("--quick", action="store_true", help="a few small files of each kind (< 60 s)")
    args = parser.parse_args()
    if args.quick:
        args.cogs, args.size, args.netcdf, args.nc_shape = 12, 256, 4, "180x360"
        args.catalogue, args.s3, args.catalogue_timeout = 60, 12, 120
    parts = args.only or parts_all
    threads = [int(t) for t in args.threads.split(",")]
    shape = tuple(int(v) for v in args.nc_shape.lower().split("x"))
    quiet_warnings()

    with tempfile.TemporaryDirectory() as scratch:
        work = (args.workdir or Path(scratch) / "inputs").resolve()
        work.mkdir(parents=True, exist_ok=True)
        out = Path(scratch) / "out"
        out.mkdir()
        started = time.perf_counter()
        count = max(args.cogs, args.s3 if "s3" in parts else 0)
        cogs = build_cogs(work / f"cog-{count}-{args.size}", count, args.size)
        netcdf = []
        if {"nc4", "faults"} & set(parts):
            netcdf = build_netcdf4(work / f"nc4-{args.netcdf}-{shape[0]}x{shape[1]}", args.netcdf, shape)
        catalogue = []
        if "catalogue" in parts:
            catalogue = build_catalogue(work / f"catalogue-{args.catalogue}", cogs[:20], args.catalogue)
        print(f"inputs ready in {time.perf_counter() - started:.1f} s under {work}", flush=True)
        import xarray  # noqa: F401  (imported before any timing, as every tool needs it)

        with serving(work, latency=args.latency, process=True) as server:
            print(f"latency server {server.url}, {args.latency * 1000:g} ms a request", flush=True)
            clean: dict[str, dict] = {}
            for part in parts:
                print(f"== {part}", flush=True)
                try:
                    if part == "cog":
                        clean["cog"] = bench_cogs(server, cogs[: args.cogs], out, threads, args.rounds)
                    elif part == "nc4":
                        clean["nc4"] = bench_netcdf4(server, netcdf, out, threads, args.rounds)
                    elif part == "catalogue":
                        bench_catalogue(server, catalogue, out, args.catalogue_timeout)
                    elif part == "s3":
                        bench_s3(cogs[: args.s3], out, args.latency, args.rounds)
                    else:
                        for kind, files in (("cog", cogs[: args.cogs]), ("nc4", netcdf)):
                            if kind not in clean:  # the fault-free manifest first
                                urls = [server.url_of(f) for f in files]
                                path = str(out / f"nczmap-{kind}.json")
                                option = {"new_dim": "time=%Y%m%d"} if kind == "cog" else {"concat": "time"}
                                nczmap_run(urls, path, **option)()
                                clean[kind] = {"manifest": path}
                            bench_faults(
                                server,
                                kind,
                                files,
                                clean[kind]["manifest"],
                                out,
                                args.fault_error,
                                args.fault_cut,
                                threads,
                            )
                except Exception as exc:
                    traceback.print_exc()
                    problem(f"part {part} failed: {type(exc).__name__}: {exc}"[:400])

    print()
    timing = f"median of {args.rounds} runs" if args.rounds > 1 else "one run"
    print(
        f"{args.latency * 1000:g} ms a request; times: {timing} each; requests and KiB a file as the server "
        "counted them; ratio: how many times faster nczmap is"
    )
    header = ("measure", "time", "requests a file (by method)", "KiB a file", "in flight", "ratio / target")
    widths = [max(len(r[i]) for r in [header, *ROWS]) for i in range(len(header))]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for measured in ROWS:
        print(" | ".join(c.ljust(w) for c, w in zip(measured, widths, strict=True)))
    print()
    versions = []
    from importlib import metadata

    for package in ("nczmap", "virtualizarr", "virtual-tiff", "obstore", "h5py", "rasterio", "moto"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions.append(f"{package} {metadata.version(package)}")
    import nczmap

    NOTES.append(
        "versions: " + ", ".join(versions) + f"; nczmap imported from {Path(nczmap.__file__).parent}"
    )
    NOTES.append("issue 15's local benchmarks: bench/bench_virtualize.py (run it before and after a change)")
    for note in NOTES:
        print("- " + note)
    for text in PROBLEMS:
        print("PROBLEM: " + text)
    return 1 if PROBLEMS else 0


if __name__ == "__main__":
    sys.exit(main())
