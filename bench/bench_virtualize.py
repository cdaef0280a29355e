"""``virtualize()`` side by side with VirtualiZarr, virtual-tiff and kerchunk, and reading its COG result.

1. netCDF-4: ``--files`` daily files (``time`` unlimited, one record each; ``field(time, lat, lon)``
   float32 180×360 zlib; ``lat``, ``lon``), joined along ``time`` into kerchunk JSON:
   ``virtualize(files, out.json, concat="time")`` against VirtualiZarr's ``open_virtual_mfdataset``
   (HDFParser, ``loadable_variables=["time"]``, nested along ``time``) + ``.vz.to_kerchunk(format="json")``.
   Target: nczmap ≥ 5× faster.
2. COG: ``--files`` Cloud-Optimized GeoTIFFs (``--size``² int16, 512² tiles, ZSTD + PREDICTOR=2, GDAL's
   COG driver, so with overviews), named ``sst_YYYYMMDD.tif``, stacked along a new ``time`` dimension:
   ``virtualize(files, out.json|out.parq, new_dim="time=%Y%m%d")`` against virtual-tiff + VirtualiZarr
   (kerchunk JSON: its references hold Zarr v3 codecs, which VirtualiZarr's kerchunk Parquet writer
   refuses) and kerchunk's ``tiff_to_zarr`` per file + ``MultiZarrToZarr`` (JSON and Parquet). Target:
   ≥ 10× faster than the fastest peer. Then reading the result through nczmap's xarray engine (one time
   step, and all of them) against rasterio reading the same tiles: target ≥ 0.7× rasterio's throughput.
3. netCDF-3: one CDF-2 file (``NETCDF3_64BIT_OFFSET``) of ``--records`` records of ``--record-kib`` KiB
   (``v(time, y, x)`` float32, and small record variables ``time``, ``count``, ``quality``), 1 GiB by
   default: ``virtualize([file], out.json)`` (target < 1 s) against kerchunk's
   ``NetCDF3ToZarr(file).translate()`` written as JSON (needs scipy; shown as n/a without it).

Every result is checked before any timing counts: it opens through xarray (nczmap's engine, kerchunk's
engine, or zarr-python) with the values of the sources (``xr.open_mfdataset``, rasterio, netCDF4).
Times are medians of ``--rounds`` interleaved rounds, files in the page cache, libraries imported; what
importing costs is measured apart, in fresh processes. Inputs are built in a temporary directory, or in
``--workdir`` where they are kept and reused by the next run with the same sizes.

    .venv/bin/python bench/bench_virtualize.py [--files 100] [--size 2048] [--records 1000]
        [--record-kib 1024] [--rounds 5] [--workdir DIR] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from _common import fmt_ratio, fmt_time

START = datetime.date(2020, 1, 1)
ROWS: list[tuple[str, str, str, str]] = []  # measure, nczmap, peer, ratio (target)
NOTES: list[str] = []


# ------------------------------------------------------------------------------------------ inputs


def _stamped(directory: Path, stamp: dict) -> bool:
    """Whether ``directory`` holds inputs built with exactly these parameters (then they are reused)."""
    marker = directory / "built.json"
    return marker.is_file() and json.loads(marker.read_text()) == stamp


def _stamp(directory: Path, stamp: dict) -> None:
    (directory / "built.json").write_text(json.dumps(stamp))


def _fresh(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)


def build_netcdf4(directory: Path, count: int) -> list[str]:
    import netCDF4

    stamp = {"kind": "netcdf4", "files": count, "version": 1}
    if not _stamped(directory, stamp):
        _fresh(directory)
        rng = np.random.default_rng(0)
        lat = np.linspace(-89.5, 89.5, 180, dtype="f4")
        lon = np.linspace(-179.5, 179.5, 360, dtype="f4")
        yy, xx = np.meshgrid(np.radians(lat), np.radians(lon), indexing="ij")
        base = (280 + 20 * np.cos(yy) * np.cos(2 * xx)).astype("f4")
        for day in range(count):
            date = START + datetime.timedelta(days=day)
            with netCDF4.Dataset(directory / f"field_{date:%Y%m%d}.nc", "w") as ds:
                ds.createDimension("time", None)
                ds.createDimension("lat", 180)
                ds.createDimension("lon", 360)
                time_var = ds.createVariable("time", "f8", ("time",))  # chunked 512 by netCDF's default
                time_var.units = "days since 2020-01-01"
                time_var.calendar = "standard"
                ds.createVariable("lat", "f4", ("lat",))[:] = lat
                ds.createVariable("lon", "f4", ("lon",))[:] = lon
                field = ds.createVariable("field", "f4", ("time", "lat", "lon"), zlib=True)
                field.units = "K"
                time_var[0] = day
                field[0] = base + rng.normal(0, 1, base.shape).astype("f4")
        _stamp(directory, stamp)
    return sorted(glob.glob(str(directory / "field_*.nc")))


def build_cogs(directory: Path, count: int, size: int) -> list[str]:
    import rasterio
    from rasterio.transform import from_origin

    tile = 512 if size >= 1024 else max(16, size // 4 // 16 * 16)
    stamp = {"kind": "cog", "files": count, "size": size, "tile": tile, "version": 1}
    if not _stamped(directory, stamp):
        _fresh(directory)
        yy, xx = np.mgrid[0:size, 0:size].astype("f4") / size
        base = 1500 + 1000 * np.sin(6 * yy) * np.cos(4 * xx)  # a smooth field, like SST in centi-kelvin
        rng = np.random.default_rng(0)
        profile = {
            "driver": "COG",
            "width": size,
            "height": size,
            "count": 1,
            "dtype": "int16",
            "crs": "EPSG:4326",
            "transform": from_origin(-180, 90, 360 / size, 180 / size),
            "nodata": -32768,
            "compress": "ZSTD",
            "predictor": 2,
            "blocksize": tile,
        }
        for day in range(count):
            date = START + datetime.timedelta(days=day)
            data = (base + 20 * np.sin(day / 10) + rng.integers(-8, 8, (size, size))).astype("int16")
            with rasterio.open(directory / f"sst_{date:%Y%m%d}.tif", "w", **profile) as dataset:
                dataset.write(data, 1)
        _stamp(directory, stamp)
    return sorted(glob.glob(str(directory / "sst_*.tif")))


def build_netcdf3(directory: Path, records: int, record_kib: int) -> str:
    import netCDF4

    side = round((record_kib * 1024 / 4) ** 0.5)
    stamp = {"kind": "netcdf3", "records": records, "side": side, "version": 1}
    path = directory / "records.nc"
    if not _stamped(directory, stamp):
        _fresh(directory)
        with netCDF4.Dataset(path, "w", format="NETCDF3_64BIT_OFFSET") as ds:
            ds.createDimension("time", None)
            ds.createDimension("y", side)
            ds.createDimension("x", side)
            time_var = ds.createVariable("time", "f8", ("time",))
            time_var.units = "hours since 2020-01-01"
            count = ds.createVariable("count", "i4", ("time",))
            quality = ds.createVariable("quality", "i2", ("time",))
            ds.createVariable("y", "f4", ("y",))[:] = np.arange(side)
            ds.createVariable("x", "f4", ("x",))[:] = np.arange(side)
            v = ds.createVariable("v", "f4", ("time", "y", "x"))
            v.units = "K"
            base = np.random.default_rng(0).standard_normal((side, side)).astype("f4")
            step = max(1, (64 << 20) // (side * side * 4))
            for start in range(0, records, step):
                stop = min(records, start + step)
                time_var[start:stop] = np.arange(start, stop)
                count[start:stop] = np.arange(start, stop)
                quality[start:stop] = np.arange(start, stop) % 3
                v[start:stop] = base[None] + np.arange(start, stop, dtype="f4")[:, None, None]
        _stamp(directory, stamp)
    return str(path)


# ------------------------------------------------------------------------------------------ helpers


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def interleaved(cases: dict, rounds: int) -> dict[str, float]:
    """Median seconds of each case, the cases run in turn in every round (drift hits them all alike)."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, function in cases.items():
            samples[name].append(timed(function))
    for name, values in samples.items():  # every round, for whoever doubts a median
        print(f"  {name}: " + ", ".join(fmt_time(v).strip() for v in values), file=sys.stderr)
    return {name: statistics.median(values) for name, values in samples.items()}


def verdict(met: bool) -> str:
    return "TARGET MET" if met else "TARGET MISSED"


def row(measure: str, ours: float | None, peer: float | None, ratio: str) -> None:
    ROWS.append((measure, fmt_time(ours) if ours else "n/a", fmt_time(peer) if peer else "n/a", ratio))


def speed_row(measure: str, ours: float, peer: float | None, target: float | None) -> None:
    """``peer / ours``: how many times faster nczmap is."""
    if peer is None:
        row(measure, ours, None, "n/a")
        return
    ratio = peer / ours
    shown = fmt_ratio(ratio).strip()
    if target is not None:
        shown += f" (≥ {target:g}×) {verdict(ratio >= target)}"
    row(measure, ours, peer, shown)


def import_seconds(modules: list[str], rounds: int = 3) -> float | None:
    """Median time to import ``modules`` in a fresh interpreter (what a command-line run pays first);
    None when one of them is not installed."""
    code = (
        "import time, warnings; warnings.simplefilter('ignore'); s = time.perf_counter()\n"
        + "".join(f"import {name}\n" for name in modules)
        + "print(time.perf_counter() - s)"
    )
    results = []
    for _ in range(rounds):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return None
        results.append(float(done.stdout.split()[-1]))
    return statistics.median(results)


def local_registry():
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore

    return ObjectStoreRegistry({"file://": LocalStore()})


def engine_url(path: str) -> str:
    return "file://" + path + "#mode=nczarr,manifest"


def open_ours(manifest: str, sources: list[str], **options):
    """A manifest of nczmap's through its xarray engine, its sources' directory granted."""
    import xarray as xr

    granted = sorted({"file://" + os.path.dirname(f) + "/" for f in sources})
    return xr.open_dataset(
        engine_url(manifest), engine="nczmap", map_options={"containers": granted}, **options
    )


# ------------------------------------------------------------------------------------------ 1. netCDF-4


def bench_netcdf4(files: list[str], out: Path, rounds: int) -> None:
    import xarray as xr
    from virtualizarr import open_virtual_mfdataset
    from virtualizarr.parsers import HDFParser

    from nczmap.integrations.virtualize import virtualize

    ours_path, peer_path, threaded_path = (str(out / name) for name in ("nczmap.json", "vz.json", "vzt.json"))

    def ours():
        virtualize(files, ours_path, concat="time")

    def peer(parallel=False, path=peer_path):
        vds = open_virtual_mfdataset(
            ["file://" + f for f in files],
            parser=HDFParser(),
            registry=local_registry(),
            loadable_variables=["time"],
            combine="nested",
            concat_dim="time",
            # VirtualiZarr's advice for nested combining: without these, lat/lon (virtual, so not
            # comparable) are concatenated along time too
            coords="minimal",
            compat="override",
            parallel=parallel,
        )
        vds.vz.to_kerchunk(path, format="json")

    def peer_threads():
        from concurrent.futures import ThreadPoolExecutor

        peer(ThreadPoolExecutor, threaded_path)

    cases = {"nczmap": ours, "VirtualiZarr": peer, "VirtualiZarr threads": peer_threads}
    for function in cases.values():  # warm-up, and the results to check
        function()
    with xr.open_mfdataset(files, combine="nested", concat_dim="time") as expected:
        expected = expected.load()
    with open_ours(ours_path, files) as got:
        xr.testing.assert_equal(got.load(), expected)
    for path in (peer_path, threaded_path):
        with xr.open_dataset(path, engine="kerchunk") as got:
            xr.testing.assert_equal(got.load(), expected)
    print(
        f"netCDF-4 check: nczmap's manifest (engine nczmap) and VirtualiZarr's (engine kerchunk) equal "
        f"xr.open_mfdataset of the {len(files)} files (field {expected.field.shape}, time "
        f"{str(expected.time.values[0])[:10]}..{str(expected.time.values[-1])[:10]})"
    )
    medians = interleaved(cases, rounds)
    peer_best = min(medians["VirtualiZarr"], medians["VirtualiZarr threads"])
    label = "VirtualiZarr threads" if peer_best == medians["VirtualiZarr threads"] else "VirtualiZarr"
    speed_row(f"nc4: virtualize {len(files)} files → JSON", medians["nczmap"], medians["VirtualiZarr"], 5)
    speed_row(
        "nc4:   vs VirtualiZarr parallel=threads", medians["nczmap"], medians["VirtualiZarr threads"], 5
    )
    NOTES.append(
        f"nc4 peer: open_virtual_mfdataset(HDFParser, loadable_variables=['time'], combine='nested', "
        f"coords='minimal', compat='override') + to_kerchunk(json); faster variant: {label}"
    )


# ------------------------------------------------------------------------------------------ 2. COG


def bench_cog(files: list[str], out: Path, rounds: int, read_rounds: int) -> None:
    import rasterio

    from nczmap.integrations.virtualize import virtualize

    dates = [datetime.datetime.strptime(Path(f).stem.rsplit("_", 1)[1], "%Y%m%d") for f in files]
    ours_json, ours_parq = str(out / "nczmap.json"), str(out / "nczmap.parq")
    tiff_json, kc_json, kc_parq = (
        str(out / "vtiff.json"),
        str(out / "kerchunk.json"),
        str(out / "kerchunk.parq"),
    )

    def ours(path):
        return lambda: virtualize(files, path, new_dim="time=%Y%m%d")

    def virtual_tiff():
        from virtual_tiff import VirtualTIFF
        from virtualizarr import open_virtual_mfdataset

        vds = open_virtual_mfdataset(
            ["file://" + f for f in files],
            parser=VirtualTIFF(ifd=0),  # the full-resolution image; its overviews would clash on y/x
            registry=local_registry(),
            combine="nested",
            concat_dim="time",
            coords="minimal",
            compat="override",
        )
        vds.vz.to_kerchunk(tiff_json, format="json", zarr_format=3)

    def kerchunk_refs() -> dict:
        from kerchunk.combine import MultiZarrToZarr
        from kerchunk.tiff import tiff_to_zarr

        def first_image(refs: dict) -> dict:  # tiff_to_zarr names IFDs 0, 1, 2 and gives no dimensions
            kept = {k: v for k, v in refs.items() if "/" not in k or k.startswith("0/")}
            kept["0/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["y", "x"]})
            return kept

        def coordinate(index, *_):
            return np.datetime64(dates[index], "D")

        combined = MultiZarrToZarr(
            [first_image(tiff_to_zarr(f)) for f in files],
            concat_dims=["time"],
            coo_map={"time": coordinate},
            coo_dtypes={"time": "M8[D]"},
        )
        return combined.translate()

    def kerchunk_json():
        with open(kc_json, "w") as handle:
            json.dump(kerchunk_refs(), handle)

    def kerchunk_parquet():
        from kerchunk.df import refs_to_dataframe

        shutil.rmtree(kc_parq, ignore_errors=True)
        refs_to_dataframe(kerchunk_refs(), kc_parq)

    peers = {
        "virtual-tiff + VirtualiZarr (JSON, Zarr v3)": virtual_tiff,
        "kerchunk tiff_to_zarr + MZZ (JSON)": kerchunk_json,
        "kerchunk tiff_to_zarr + MZZ (Parquet)": kerchunk_parquet,
    }
    peers_all = list(peers)
    failed = {}
    for name, function in list(peers.items()):
        try:
            function()
        except Exception as exc:  # a peer that does not run here is reported, not fatal
            failed[name] = f"{type(exc).__name__}: {exc}"[:200]
            del peers[name]
    try:  # what the brief's first choice would be: VirtualiZarr's Parquet writer on virtual-tiff
        from virtual_tiff import VirtualTIFF
        from virtualizarr import open_virtual_dataset

        vds = open_virtual_dataset("file://" + files[0], parser=VirtualTIFF(ifd=0), registry=local_registry())
        vds.vz.to_kerchunk(str(out / "vtiff.parq"), format="parquet")
    except Exception as exc:
        failed["virtual-tiff + VirtualiZarr (Parquet)"] = f"{type(exc).__name__}: {exc}"[:200]
    for name, why in failed.items():
        NOTES.append(f"COG peer {name} does not run here: {why}")

    ours(ours_json)()
    ours(ours_parq)()
    outputs = dict(zip(peers_all, (tiff_json, kc_json, kc_parq), strict=True))
    check_cog_results(
        files, dates, ours_json, ours_parq, *(outputs[n] if n in peers else None for n in peers_all)
    )
    cases = {"nczmap JSON": ours(ours_json), "nczmap Parquet": ours(ours_parq), **peers}
    medians = interleaved(cases, rounds)
    json_peers = {n: medians[n] for n in peers if "Parquet" not in n}
    parq_peers = {n: medians[n] for n in peers if "Parquet" in n}
    fastest = min(json_peers, key=json_peers.get) if json_peers else None
    for name in peers:
        NOTES.append(f"COG peer {name}: {fmt_time(medians[name]).strip()}")
    n = len(files)
    speed_row(
        f"COG: virtualize {n} files → JSON",
        medians["nczmap JSON"],
        json_peers.get(fastest) if fastest else None,
        10,
    )
    if parq_peers:
        best = min(parq_peers, key=parq_peers.get)
        speed_row(f"COG: virtualize {n} files → Parquet", medians["nczmap Parquet"], parq_peers[best], 10)
    every = min(medians[p] for p in peers) if peers else None
    speed_row("COG:   Parquet vs fastest peer of any form", medians["nczmap Parquet"], every, 10)
    if fastest:
        NOTES.append(f"COG fastest JSON peer: {fastest}")

    # reading: one time step, then all, through the engine on the Parquet manifest, against rasterio
    with rasterio.open(files[0]) as dataset:
        shape = dataset.shape
    step = len(files) // 2

    def read_one_ours():
        with open_ours(ours_parq, files, mask_and_scale=False) as ds:
            return ds["band_data"].isel(time=step).values

    def read_one_rasterio():
        with rasterio.open(files[step]) as dataset:
            return dataset.read(1)

    def read_all_ours():
        with open_ours(ours_parq, files, mask_and_scale=False) as ds:
            return ds["band_data"].values

    def read_all_rasterio():
        result = np.empty((len(files), *shape), dtype="int16")
        for index, path in enumerate(files):
            with rasterio.open(path) as dataset:
                dataset.read(1, out=result[index])
        return result

    assert np.array_equal(read_one_ours(), read_one_rasterio())
    assert np.array_equal(read_all_ours(), read_all_rasterio())
    print(f"COG read check: the engine's band_data equals rasterio's, one step and all {n} ({shape} int16)")
    one = interleaved({"ours": read_one_ours, "rasterio": read_one_rasterio}, max(read_rounds, 5))
    every_step = interleaved({"ours": read_all_ours, "rasterio": read_all_rasterio}, read_rounds)
    for label, medians_read, count in (("one time step", one, 1), (f"all {n} steps", every_step, n)):
        ratio = medians_read["rasterio"] / medians_read["ours"]
        mib = count * shape[0] * shape[1] * 2 / 2**20
        row(
            f"COG read {label} ({mib:.0f} MiB), throughput",
            medians_read["ours"],
            medians_read["rasterio"],
            f"{fmt_ratio(ratio).strip()} (≥ 0.7×) {verdict(ratio >= 0.7)}",
        )
    NOTES.append(
        "COG read: xr.open_dataset(manifest.parq, engine='nczmap', mask_and_scale=False)['band_data'] "
        "(open included) vs rasterio.open(file).read(1) per file (GDAL defaults); ratio = nczmap's "
        "throughput / rasterio's"
    )


def check_cog_results(files, dates, ours_json, ours_parq, tiff_json, kc_json, kc_parq) -> None:
    """nczmap's manifests (both forms), and the peers', hold the pixels rasterio reads from the files."""
    import rasterio
    import xarray as xr

    steps = sorted({0, len(files) // 2, len(files) - 1})
    expected = {}
    for step in steps:
        with rasterio.open(files[step]) as dataset:
            expected[step] = dataset.read(1)
    for path in (ours_json, ours_parq):
        with open_ours(path, files, mask_and_scale=False) as ds:
            got = ds["band_data"]
            assert got.dims == ("time", "y", "x"), got.dims
            assert list(ds["time"].values.astype("M8[D]")) == [np.datetime64(d, "D") for d in dates]
            for step in steps:
                assert np.array_equal(got.isel(time=step).values, expected[step]), (path, step)
    checked = ["nczmap JSON", "nczmap Parquet"]
    if tiff_json:
        import fsspec
        import virtual_tiff  # noqa: F401  (registers its Zarr v3 codecs)
        import zarr

        fs = fsspec.filesystem("reference", fo=tiff_json, remote_protocol="file")
        array = zarr.open_group(
            zarr.storage.FsspecStore(fs, read_only=True, path=""), mode="r", zarr_format=3
        )["0"]
        for step in steps:
            assert np.array_equal(array[step], expected[step]), ("virtual-tiff", step)
        checked.append("virtual-tiff")
    for path in (kc_json, kc_parq):
        if path:
            options = {
                "storage_options": {"remote_protocol": "file"},
                "open_dataset_options": {"mask_and_scale": False},
            }
            with xr.open_dataset(path, engine="kerchunk", **options) as ds:
                for step in steps:
                    assert np.array_equal(ds["0"].isel(time=step).values, expected[step]), (path, step)
                assert list(ds["time"].values.astype("M8[D]")) == [np.datetime64(d, "D") for d in dates]
            checked.append(Path(path).name)
    print(f"COG check: {', '.join(checked)} give rasterio's pixels at time steps {steps}")


# ------------------------------------------------------------------------------------------ 3. netCDF-3


def bench_netcdf3(path: str, out: Path, rounds: int) -> None:
    import xarray as xr

    from nczmap.integrations.virtualize import virtualize

    ours_path, peer_path = str(out / "nczmap.json"), str(out / "kerchunk.json")

    def ours():
        virtualize([path], ours_path)

    def peer():
        from kerchunk.netCDF3 import NetCDF3ToZarr

        refs = NetCDF3ToZarr(path).translate()
        with open(peer_path, "w") as handle:
            json.dump(refs, handle)

    cases = {"nczmap": ours}
    try:
        peer()
        cases["kerchunk"] = peer
    except ImportError as exc:
        NOTES.append(f"nc3 peer kerchunk NetCDF3ToZarr does not run here: {exc}".split(". Please")[0])
    ours()
    with xr.open_dataset(path, engine="netcdf4") as expected:
        records = expected.sizes["time"]
        picks = sorted({0, 1, records // 2, records - 1})
        want = {name: expected[name].values for name in ("time", "count", "quality", "x", "y")}
        want_v = expected["v"].isel(time=picks).values
        targets = [("nczmap", ours_path, "nczmap")]
        if "kerchunk" in cases:
            targets.append(("kerchunk", peer_path, "kerchunk"))
        for label, url, engine in targets:
            opened = open_ours(url, [path]) if engine == "nczmap" else xr.open_dataset(url, engine=engine)
            with opened as got:
                for name, values in want.items():
                    np.testing.assert_array_equal(got[name].values, values, err_msg=f"{label} {name}")
                np.testing.assert_array_equal(got["v"].isel(time=picks).values, want_v, err_msg=label)
    size = os.path.getsize(path)
    print(
        f"netCDF-3 check: {' and '.join(t[0] for t in targets)} manifests give netCDF4's values (time, "
        f"count, quality, x, y whole; v at records {picks}) of the {size / 2**30:.2f} GiB file"
    )
    medians = interleaved(cases, rounds)
    ours_time = medians["nczmap"]
    label = f"nc3: virtualize {size / 2**30:.2f} GiB, {records} records"
    row(label, ours_time, None, f"< 1 s {verdict(ours_time < 1)}")
    if "kerchunk" in medians:
        speed_row("nc3:   vs kerchunk NetCDF3ToZarr → JSON", ours_time, medians["kerchunk"], None)


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100, help="daily netCDF-4 files and COGs")
    parser.add_argument("--size", type=int, default=2048, help="COG width and height")
    parser.add_argument("--records", type=int, default=1000, help="netCDF-3 records")
    parser.add_argument("--record-kib", type=int, default=1024, help="KiB of v per netCDF-3 record")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", type=Path, help="build (and keep, and reuse) the inputs here")
    parser.add_argument("--only", choices=["nc4", "cog", "nc3"], action="append", help="run some parts")
    parser.add_argument("--quick", action="store_true", help="4 files, 256² COGs, 20 small records")
    args = parser.parse_args()
    if args.quick:
        args.files, args.size, args.records, args.record_kib, args.rounds = 4, 256, 20, 16, 1
    parts = args.only or ["nc4", "cog", "nc3"]
    warnings.filterwarnings("ignore", message=".*codecs are not in the Zarr version 3")
    warnings.filterwarnings("ignore", message="__eq__ currently is over-cautious")
    warnings.filterwarnings("ignore", category=UserWarning, module="virtualizarr")
    warnings.filterwarnings("ignore", message=".*was not created with `asynchronous=True`")

    with tempfile.TemporaryDirectory() as scratch:
        work = args.workdir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        outputs = Path(scratch) / "out"
        started = time.perf_counter()
        inputs = {}
        if "nc4" in parts:
            inputs["nc4"] = build_netcdf4(work / f"nc4-{args.files}", args.files)
        if "cog" in parts:
            inputs["cog"] = build_cogs(work / f"cog-{args.files}-{args.size}", args.files, args.size)
        if "nc3" in parts:
            inputs["nc3"] = build_netcdf3(
                work / f"nc3-{args.records}-{args.record_kib}", args.records, args.record_kib
            )
        print(f"inputs ready in {time.perf_counter() - started:.1f} s under {work}")

        imports = {
            "nc4": (["nczmap.integrations.virtualize", "h5py"],
                    ["virtualizarr", "virtualizarr.parsers", "obstore", "obspec_utils.registry"]),
            "cog": (["nczmap.integrations.virtualize"],
                    ["virtualizarr", "virtual_tiff", "obstore", "obspec_utils.registry"]),
        }  # fmt: skip
        for part in ("nc4", "cog", "nc3"):
            if part not in parts:
                continue
            place = outputs / part
            place.mkdir(parents=True)
            if part == "nc4":
                bench_netcdf4(inputs["nc4"], place, args.rounds)
            elif part == "cog":
                bench_cog(inputs["cog"], place, args.rounds, max(1, args.rounds))
            else:
                bench_netcdf3(inputs["nc3"], place, args.rounds)
            if part in imports:
                ours, theirs = imports[part]
                mine = import_seconds(ours)
                if mine is not None:
                    speed_row(f"{part}:   imports, fresh process", mine, import_seconds(theirs), None)

    print()
    print(
        f"median of {args.rounds} round(s); ratio = peer time / nczmap time (for reads: nczmap's "
        "throughput / rasterio's)"
    )
    header = ("measure", "nczmap", "peer", "ratio (target)")
    widths = [max(len(r[i]) for r in [header, *ROWS]) for i in range(4)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for measured in ROWS:
        print(" | ".join(c.ljust(w) for c, w in zip(measured, widths, strict=True)))
    print()
    for note in NOTES:
        print("- " + note)


if __name__ == "__main__":
    main()
