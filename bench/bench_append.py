"""Appending today's file to a virtual dataset: its cost against virtualizing every file again, what it
reads of a large Parquet manifest, and VirtualiZarr's append to Icechunk.

1. netCDF-4: ``--files`` + 1 daily files ``sst_YYYYMMDD.nc`` as archives are written (``time`` unlimited,
   one record, its own units ``days since <its date>``; ``sst(time, lat, lon)`` int16 180×360, zlib,
   chunked by day, packed with ``scale_factor``/``add_offset``, ``_FillValue``; ``lat``, ``lon``). The first
   ``--files`` are virtualized once (``concat="time"``) into kerchunk JSON, kerchunk Parquet and an
   Icechunk repository; then, per round, (a) ``virtualize([last file], dataset, append=True)`` on a fresh
   copy of that dataset (the manifest, or the repository directory, and any ``*.chunks`` file beside it,
   restored under the same name before each repetition; only the call is timed) against (b)
   ``virtualize(every file, fresh, concat="time")``. Target: (a) < 5% of (b) (the issue's target is for
   Parquet; JSON and Icechunk are shown alike).
2. COG: ``--files`` + 1 Cloud-Optimized GeoTIFFs ``sst_YYYYMMDD.tif`` (256² int16, 128² tiles, ZSTD +
   PREDICTOR=2, GDAL's COG driver, each file its own pixels), stacked with ``new_dim="time=%Y%m%d"``:
   (a) against (b) as in 1, for Parquet and JSON. Same target. A TIFF parses in well under a millisecond,
   so (b) is cheap here and the 5% is harder to meet than for netCDF-4.
3. A ``--series``-step COG series (100,000: one small COG hard-linked as ``cog_YYYYMMDD.tif``, dates
   from 1800-01-01; a byte-for-byte copy of it every 60,000 links, ext4's limit) virtualized once into
   Parquet (the time that takes is shown; the manifest is cached in ``--workdir``). ``virtualize`` holds
   every source open until it is done, so where the series has more files than ``ulimit -n`` allows, the
   one call fails (shown) and the manifest is built in batches of half that limit: one ``virtualize``,
   then appends. On a copy of it, every record file but the last ``refs.<n>.parq`` of each array
   directory is overwritten with garbage, then one new COG (its own pixels, dated after the last) is
   appended. Target: the append succeeds, so it read no record file but the last of each array; the
   result, read through ``xr.open_dataset(..., engine="nczmap")``, gives rasterio's pixels of the new COG
   at the last step; the record files it wrote are counted from the directory listings (inode numbers:
   the save hard-links the files it keeps, so a file with a new inode or a new name was written).
4. Peers: VirtualiZarr 2.8 appends to an Icechunk repository it made of the same ``--files`` files
   (``open_virtual_dataset(new, registry=, parser=HDFParser())`` + ``.vz.to_icechunk(session.store,
   append_dim="time")`` + commit; repository opened and session begun inside the timing, as nczmap's
   append does), interleaved with nczmap's append to its own repository. kerchunk has no append: its way
   is ``SingleHdf5ToZarr`` of the new file and ``MultiZarrToZarr`` over the references of every file again
   (``coo_map={"time": "cf:time"}`` for the per-file units), shown from per-file references kept in memory
   (the cheapest case for it). A peer that cannot run is shown n/a with the reason.

Every result is checked before any timing counts: the appended dataset opens through nczmap's xarray
engine (peers': icechunk + xarray, fsspec's reference file system) with ``--files`` + 1 steps, its whole
time coordinate is the files' dates, and its last step equals netCDF4-python's (raw, undecoded) or
rasterio's values of the new file; the full virtualizations are checked the same way. Times are medians of
``--rounds`` interleaved rounds, files in the page cache, libraries imported; every timed call starts after
``os.sync()`` and ``gc.collect()``, so that an append's fsyncs wait for its own writes, not the fresh
copy's, and no call pays for collecting another's garbage. ``--profile``
prints where an append's time goes (cProfile: top 15 by cumulative time, top 10 by own time) for Parquet
and Icechunk with netCDF-4, Parquet with COGs, and the long series.

The sources are local files: what an append costs in requests to a remote store (e.g. an HTTP server adding
40 ms per request) is not measured here. An append reads the new files, the dataset's metadata and (Parquet)
at most the last record file of each array (part 3 checks this), so its number of reads does not grow with
the archive; their size does (a Parquet manifest's ``.zmetadata`` records every source).

    .venv/bin/python bench/bench_append.py [--files 2000] [--series 100000] [--rounds 5] [--workdir DIR]
        [--only nc4|cog|series|peers] [--profile] [--quick]
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import glob
import io
import json
import os
import pstats
import resource
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import fmt_ratio, fmt_time

START = datetime.date(2000, 1, 1)  # the daily files' first day
SERIES_START = datetime.date(1800, 1, 1)
LAT, LON = 180, 360
COG_SIZE, COG_TILE = 256, 128
LINKS = 60_000  # hard links per template file (ext4 allows 65,000)
ROWS: list[tuple[str, str, str, str]] = []  # measure, ours, other, ratio (target)
TARGETS: list[str] = []
NOTES: list[str] = []


# ------------------------------------------------------------------------------------------ inputs


def _stamped(directory: Path, stamp: dict) -> bool:
    """Whether ``directory`` holds inputs built with exactly these parameters (then they are reused)."""
    marker = directory / "built.json"
    return marker.is_file() and json.loads(marker.read_text()).get("stamp") == stamp


def _stamp(directory: Path, stamp: dict, **facts) -> None:
    (directory / "built.json").write_text(json.dumps({"stamp": stamp, **facts}))


def _facts(directory: Path) -> dict:
    return json.loads((directory / "built.json").read_text())


def _fresh(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)


def day_name(prefix: str, start: datetime.date, day: int, suffix: str) -> str:
    return f"{prefix}_{start + datetime.timedelta(days=day):%Y%m%d}{suffix}"


def write_day(path: Path, day: int) -> None:
    """One daily file as real archives are written (like tests/test_virtualize_append.py's ``write_day``,
    at 180×360): ``time`` in days since its own date, packed int16 ``sst`` chunked by day."""
    import netCDF4

    rng = np.random.default_rng(day)
    lat = np.linspace(-89.5, 89.5, LAT, dtype="f4")
    lon = np.linspace(0.5, 359.5, LON, dtype="f4")
    yy, xx = np.meshgrid(np.radians(lat), np.radians(lon), indexing="ij")
    field = 15 + 12 * np.cos(yy) * np.cos(2 * xx + day / 30) + rng.normal(0, 0.2, yy.shape)
    raw = np.round((field - 20) / 0.01).astype("i2")
    raw[:20] = -32768  # the polar rows: land ice, fill
    date = START + datetime.timedelta(days=day)
    with netCDF4.Dataset(path, "w") as ds:
        ds.history = f"written for {date}"
        ds.createDimension("time", None)
        ds.createDimension("lat", LAT)
        ds.createDimension("lon", LON)
        time_var = ds.createVariable("time", "i4", ("time",))
        time_var.units = f"days since {date}"
        time_var.calendar = "standard"
        time_var[:] = [0]
        ds.createVariable("lat", "f4", ("lat",))[:] = lat
        ds.createVariable("lon", "f4", ("lon",))[:] = lon
        sst = ds.createVariable(
            "sst", "i2", ("time", "lat", "lon"), zlib=True, chunksizes=(1, LAT, LON), fill_value=-32768
        )
        sst.scale_factor = np.float32(0.01)
        sst.add_offset = np.float32(20)
        sst.units = "degC"
        sst.set_auto_maskandscale(False)
        sst[:] = raw[None]


def build_days(directory: Path, count: int) -> list[str]:
    stamp = {"kind": "netcdf4", "files": count, "lat": LAT, "lon": LON, "version": 1}
    if not _stamped(directory, stamp):
        _fresh(directory)
        for day in range(count):
            write_day(directory / day_name("sst", START, day, ".nc"), day)
        _stamp(directory, stamp)
    return sorted(glob.glob(str(directory / "sst_*.nc")))


def cog_profile(size: int, tile: int) -> dict:
    from rasterio.transform import from_origin

    return {
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


def write_cog(path: Path, seed: int, size: int = COG_SIZE, tile: int = COG_TILE) -> None:
    import rasterio

    yy, xx = np.mgrid[0:size, 0:size].astype("f4") / size
    rng = np.random.default_rng(seed)
    data = 1500 + 1000 * np.sin(6 * yy) * np.cos(4 * xx) + 20 * np.sin(seed / 10)
    data = (data + rng.integers(-8, 8, (size, size))).astype("int16")
    data[:9, :13] = -32768
    with rasterio.open(path, "w", **cog_profile(size, tile)) as dataset:
        dataset.write(data, 1)


def build_cogs(directory: Path, count: int) -> list[str]:
    stamp = {"kind": "cog", "files": count, "size": COG_SIZE, "tile": COG_TILE, "version": 1}
    if not _stamped(directory, stamp):
        _fresh(directory)
        for day in range(count):
            write_cog(directory / day_name("sst", START, day, ".tif"), day)
        _stamp(directory, stamp)
    return sorted(glob.glob(str(directory / "sst_*.tif")))


@dataclass
class Series:
    links: list[str]  # the series' files (hard links of one COG), in date order
    new: str  # the COG to append, dated after the last
    manifest: Path  # the Parquet manifest of ``links`` (a pristine copy: restore it before use)
    seconds: float  # what virtualizing the series took when it was built
    built_now: bool
    how: str  # in one call, or in batches
    failed: str | None  # why not in one call


def build_series(directory: Path, steps: int) -> Series:
    """One small COG hard-linked ``steps`` times, one distinct COG after them, and their manifest."""
    from nczmap.errors import StorageError
    from nczmap.integrations.virtualize import virtualize

    stamp = {"kind": "series", "steps": steps, "size": COG_SIZE, "tile": COG_TILE, "version": 1}
    folder = directory / "cogs"
    pristine = directory / "pristine" / "big.parq"
    built_now = not _stamped(directory, stamp)
    if built_now:
        _fresh(directory)
        folder.mkdir()
        template = directory / "template-0.tif"
        write_cog(template, 10**6)
        for step in range(steps):
            # ext4 allows 65,000 links to a file: a byte-for-byte copy of the template every 60,000
            twin = directory / f"template-{step // LINKS}.tif"
            if not twin.exists():
                shutil.copyfile(template, twin)
            os.link(twin, folder / day_name("cog", SERIES_START, step, ".tif"))
        write_cog(folder / day_name("cog", SERIES_START, steps, ".tif"), steps)
    links = sorted(glob.glob(str(folder / "cog_*.tif")))
    links, new = links[:steps], links[steps]
    if built_now:
        target = directory / "big.parq"
        facts: dict = {"how": "one call"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            try:  # a list, not the glob: the new COG is beside them
                virtualize(links, str(target), new_dim="time=%Y%m%d")
            except StorageError as exc:
                if "Too many open files" not in str(exc):
                    raise
                # virtualize holds every source open until it is done: more sources than the limit of
                # open files (ulimit -n) cannot be virtualized in one call. Batches: one, then appends.
                facts["failed"] = f"{str(exc)[:160]} after {time.perf_counter() - start:.1f} s"
                remove_dataset(target)
                batch = max(100, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2)
                start = time.perf_counter()
                virtualize(links[:batch], str(target), new_dim="time=%Y%m%d")
                for first in range(batch, steps, batch):
                    virtualize(links[first : first + batch], str(target), append=True)
                facts["how"] = f"{-(-steps // batch)} calls of {batch} files: one, then appends"
            facts["seconds"] = time.perf_counter() - start
        stash(target, pristine)
        _stamp(directory, stamp, **facts)
    facts = _facts(directory)
    return Series(links, new, pristine, facts["seconds"], built_now, facts["how"], facts.get("failed"))


# ------------------------------------------------------------------------------------------ datasets


def _beside(path: Path) -> list[Path]:
    """The chunk files a manifest keeps beside itself (``<manifest>.<token>.chunks``)."""
    return [Path(p) for p in glob.glob(glob.escape(str(path)) + ".*.chunks")]


def remove_dataset(path: Path) -> None:
    """A manifest or repository, its chunk files, and what its writers left beside it (lock, retired)."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    for extra in _beside(path) + [Path(p) for p in glob.glob(str(path.parent / f".nczmap-tmp-*{path.name}"))]:
        shutil.rmtree(extra) if extra.is_dir() else extra.unlink()


def _copy(source: Path, target: Path) -> None:
    """A real copy (new inodes: writing into it never reaches the source), modification times kept (a
    manifest records its chunk files' size and modification time, and refuses them changed)."""
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy2(source, target)


def stash(made: Path, pristine: Path) -> None:
    """Move a dataset just made at ``made`` (with its chunk files) to ``pristine``, to be restored by
    :func:`restore` under the name it was made with: a manifest names its chunk files by absolute path."""
    remove_dataset(pristine)
    pristine.parent.mkdir(parents=True, exist_ok=True)
    for extra in _beside(made):
        extra.rename(pristine.parent / (pristine.name + extra.name[len(made.name) :]))
    made.rename(pristine)
    remove_dataset(made)  # the lock file and any retired version


def restore(pristine: Path, made: Path) -> None:
    """``made`` as it was when stashed, a fresh copy of ``pristine`` (and its chunk files)."""
    remove_dataset(made)
    _copy(pristine, made)
    for extra in _beside(pristine):
        _copy(extra, made.parent / (made.name + extra.name[len(pristine.name) :]))


def url_of(path: Path) -> str:
    if path.suffix == ".icechunk":
        return f"file://{path}#mode=icechunk"
    return str(path)


def engine_url(path: Path) -> str:
    return (
        f"file://{path}#mode=icechunk"
        if path.suffix == ".icechunk"
        else f"file://{path}#mode=nczarr,manifest"
    )


def open_ours(path: Path, sources: list[str], **options):
    import xarray as xr

    granted = sorted({"file://" + os.path.dirname(f) + "/" for f in sources})
    return xr.open_dataset(engine_url(path), engine="nczmap", map_options={"containers": granted}, **options)


def quiet(function: Callable, *args, **options):
    from nczmap.integrations.virtualize import VirtualizeWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VirtualizeWarning)
        return function(*args, **options)


# ------------------------------------------------------------------------------------------ expected values


def nc4_expected(path: str) -> tuple[np.ndarray, np.datetime64]:
    """netCDF4-python's raw sst and decoded time of a daily file."""
    import netCDF4

    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        raw = ds["sst"][0]
        when = netCDF4.num2date(ds["time"][0], ds["time"].units, ds["time"].calendar)
    return np.asarray(raw), np.datetime64(when.isoformat(), "ns")


def cog_expected(path: str) -> np.ndarray:
    import rasterio

    with rasterio.open(path) as dataset:
        return dataset.read(1)


def dates_of(files: list[str]) -> np.ndarray:
    stems = [Path(f).stem.rsplit("_", 1)[1] for f in files]
    return np.array([np.datetime64(f"{s[:4]}-{s[4:6]}-{s[6:]}", "ns") for s in stems])


def check_nc4(path: Path, files: list[str], what: str) -> None:
    """The dataset at ``path`` holds every file of ``files``, the last one's values at its last step."""
    raw, when = nc4_expected(files[-1])
    with open_ours(path, files, mask_and_scale=False) as ds:
        times = ds["time"].values
        assert ds.sizes["time"] == len(files), (what, ds.sizes["time"], len(files))
        np.testing.assert_array_equal(times, dates_of(files), err_msg=what)
        assert times[-1] == when, (what, times[-1], when)
        np.testing.assert_array_equal(ds["sst"].isel(time=-1).values, raw, err_msg=what)


def check_cog(path: Path, files: list[str], what: str) -> None:
    """The dataset at ``path`` holds every COG of ``files``, rasterio's pixels of the last at its end."""
    with open_ours(path, files, mask_and_scale=False) as ds:
        times = ds["time"].values
        assert ds.sizes["time"] == len(files), (what, ds.sizes["time"], len(files))
        np.testing.assert_array_equal(times, dates_of(files), err_msg=what)
        np.testing.assert_array_equal(
            ds["band_data"].isel(time=-1).values, cog_expected(files[-1]), err_msg=what
        )


# ------------------------------------------------------------------------------------------ timing


@dataclass
class Trial:
    """One measured operation: ``prepare()`` (not timed) then ``run()`` (timed)."""

    run: Callable[[], object]
    prepare: Callable[[], object] = lambda: None


def ready(trial: Trial) -> None:
    """``trial.prepare()``, then everything written flushed to disk: an append's fsyncs then wait for its
    own writes only, not for the copy made just before it (a real archive was written long before); and
    the garbage of the trials before collected, so that no trial pays for another's (as in a fresh
    process, where a daily append runs)."""
    trial.prepare()
    os.sync()
    gc.collect()


def interleaved(trials: dict[str, Trial], rounds: int) -> dict[str, float]:
    """Median seconds of each trial's ``run``, the trials taken in turn in every round."""
    samples: dict[str, list[float]] = {name: [] for name in trials}
    for _ in range(rounds):
        for name, trial in trials.items():
            ready(trial)
            start = time.perf_counter()
            trial.run()
            samples[name].append(time.perf_counter() - start)
    for name, values in samples.items():  # every round, for whoever doubts a median
        print(f"  {name}: " + ", ".join(fmt_time(v).strip() for v in values), file=sys.stderr)
    return {name: statistics.median(values) for name, values in samples.items()}


def verdict(met: bool) -> str:
    return "MET" if met else "MISSED"


def row(measure: str, ours: float | None, other: float | None, ratio: str) -> None:
    shown = [fmt_time(v).strip() if v is not None else "n/a" for v in (ours, other)]
    ROWS.append((measure, shown[0], shown[1], ratio))


def share_row(label: str, append: float, whole: float, target: float | None = 0.05) -> None:
    """An append against virtualizing everything again: the share it costs, against ``target``."""
    share = append / whole
    shown = f"{share:.1%}"
    if target is not None:
        shown += f" (< {target:.0%}) {verdict(share < target)}"
        TARGETS.append(
            f"TARGET append < {target:.0%} of virtualizing all again, {label}: {fmt_time(append).strip()} "
            f"= {share:.1%} of {fmt_time(whole).strip()} ({whole / append:.0f}× less): "
            + verdict(share < target)
        )
    row(label, append, whole, shown)


def profile_top(label: str, trial: Trial, lines: int = 15) -> str:
    """Where one run of ``trial`` spends its time: cProfile, the top ``lines`` functions by cumulative time
    and by own time (the benchmark's own frames left out)."""
    ready(trial)
    profiler = cProfile.Profile()
    profiler.enable()
    trial.run()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    total = stats.total_tt  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(r"^(?!.*bench_append)", lines)
    stats.sort_stats("tottime").print_stats(lines // 3 * 2)
    cut = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/"
    packages = os.path.dirname(os.path.dirname(np.__file__)) + "/"
    text = out.getvalue().replace(packages, "").replace(cut, "")
    tables = [t[t.index("   ncalls") :].split("\n\n")[0] for t in text.split("Ordered by")[1:]]
    return (
        f"profile of one append, {label}: {total * 1000:.1f} ms under cProfile\n"
        f"top {lines} by cumulative time:\n{tables[0]}\ntop {lines // 3 * 2} by own time:\n{tables[1]}"
    )


# ------------------------------------------------------------------------------------------ 1. netCDF-4


def bench_nc4(
    files: list[str], work: Path, rounds: int, profile: bool, peers: bool, cache: Path
) -> list[str]:
    from nczmap.integrations.virtualize import virtualize

    base, new = files[:-1], files[-1]
    n = len(base)
    trials: dict[str, Trial] = {}
    profiles = []
    forms = {"JSON": "refs.json", "Parquet": "refs.parq", "Icechunk": "repo.icechunk"}
    for form, name in forms.items():
        made, pristine, whole = work / name, work / "pristine" / name, work / ("all-" + name)
        started = time.perf_counter()
        quiet(virtualize, base, url_of(made), concat="time")
        NOTES.append(
            f"nc4 {form}: virtualizing the first {n} files took {time.perf_counter() - started:.1f} s"
        )
        stash(made, pristine)

        def append(made=made):
            quiet(virtualize, [new], url_of(made), append=True)

        def everything(whole=whole):
            quiet(virtualize, files, url_of(whole), concat="time")

        trials[f"{form} append"] = Trial(append, lambda made=made, pristine=pristine: restore(pristine, made))
        trials[f"{form} all again"] = Trial(everything, lambda whole=whole: remove_dataset(whole))
        for trial in (trials[f"{form} append"], trials[f"{form} all again"]):  # warm-up, and the results
            ready(trial)
            trial.run()
        check_nc4(made, files, f"nc4 {form} appended")
        check_nc4(whole, files, f"nc4 {form} all at once")
        if form in ("Parquet", "Icechunk") and profile:
            profiles.append(profile_top(f"{form}, netCDF-4, {n} files + 1", trials[f"{form} append"]))
    print(f"nc4 check: JSON, Parquet and Icechunk, appended and made at once, hold {len(files)} steps; time "
          f"is the files' dates; the last step is netCDF4-python's raw sst of {Path(new).name}")  # fmt: skip
    if peers:
        trials.update(peer_trials(files, work, cache))
    medians = interleaved(trials, rounds)
    for form in forms:
        share_row(
            f"nc4 {form}: append 1 to {n} files", medians[f"{form} append"], medians[f"{form} all again"]
        )
    if "VirtualiZarr append" in medians:
        ratio = medians["VirtualiZarr append"] / medians["Icechunk append"]
        ROWS.append(
            (
                f"peer: VirtualiZarr append 1 to {n} (Icechunk)",
                fmt_time(medians["Icechunk append"]).strip(),
                fmt_time(medians["VirtualiZarr append"]).strip(),
                f"{fmt_ratio(ratio).strip()} (VirtualiZarr / nczmap)",
            )
        )
    if "kerchunk recombine" in medians:
        ratio = medians["kerchunk recombine"] / medians["JSON append"]
        ROWS.append(
            (
                f"peer: kerchunk, no append: MZZ over {len(files)} (JSON)",
                fmt_time(medians["JSON append"]).strip(),
                fmt_time(medians["kerchunk recombine"]).strip(),
                f"{fmt_ratio(ratio).strip()} (kerchunk / nczmap)",
            )
        )
    return profiles


# ------------------------------------------------------------------------------------------ peers


def local_registry():
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore

    return ObjectStoreRegistry({"file://": LocalStore()})


def vz_repository(path: Path, prefix: str, create: bool):
    import icechunk

    storage = icechunk.local_filesystem_storage(str(path))
    credentials = icechunk.containers_credentials({prefix: icechunk.credentials.LocalFileSystemAccess})
    if not create:
        return icechunk.Repository.open(storage, authorize_virtual_chunk_access=credentials)
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(
        icechunk.VirtualChunkContainer(prefix, icechunk.local_filesystem_store(prefix[len("file://") :]))
    )
    return icechunk.Repository.create(storage, config, authorize_virtual_chunk_access=credentials)


def build_vz_repository(files: list[str], cache: Path) -> Path:
    """VirtualiZarr's repository of ``files`` (cached: building it parses every file with HDFParser)."""
    import virtualizarr
    from virtualizarr import open_virtual_mfdataset
    from virtualizarr.parsers import HDFParser

    stamp = {"kind": "vz", "files": len(files), "last": Path(files[-1]).name, "vz": virtualizarr.__version__}
    repo = cache / "vz.icechunk"
    if not _stamped(cache, stamp):
        _fresh(cache)
        from concurrent.futures import ThreadPoolExecutor

        prefix = "file://" + os.path.dirname(files[0]) + "/"
        vds = open_virtual_mfdataset(
            ["file://" + f for f in files],
            parser=HDFParser(),
            registry=local_registry(),
            combine="nested",
            concat_dim="time",
            coords="minimal",
            compat="override",
            parallel=ThreadPoolExecutor,
        )
        session = vz_repository(repo, prefix, create=True).writable_session("main")
        vds.vz.to_icechunk(session.store)
        session.commit(f"{len(files)} files")
        _stamp(cache, stamp)
    return repo


def check_vz(repo: Path, files: list[str]) -> None:
    import xarray as xr

    prefix = "file://" + os.path.dirname(files[0]) + "/"
    raw, when = nc4_expected(files[-1])
    session = vz_repository(repo, prefix, create=False).readonly_session("main")
    with xr.open_zarr(session.store, consolidated=False, zarr_format=3, mask_and_scale=False) as ds:
        assert ds.sizes["time"] == len(files), ds.sizes
        np.testing.assert_array_equal(ds["time"].values, dates_of(files), err_msg="VirtualiZarr time")
        assert ds["time"].values[-1] == when
        np.testing.assert_array_equal(ds["sst"].isel(time=-1).values, raw, err_msg="VirtualiZarr sst")


def peer_trials(files: list[str], work: Path, cache: Path) -> dict[str, Trial]:
    trials: dict[str, Trial] = {}
    new = files[-1]
    try:
        from virtualizarr import open_virtual_dataset
        from virtualizarr.parsers import HDFParser

        pristine = build_vz_repository(files[:-1], cache / f"vz-{len(files) - 1}")
        repo = work / "vz.icechunk"
        prefix = "file://" + os.path.dirname(new) + "/"

        def vz_append():
            session = vz_repository(repo, prefix, create=False).writable_session("main")
            vds = open_virtual_dataset("file://" + new, registry=local_registry(), parser=HDFParser())
            vds.vz.to_icechunk(session.store, append_dim="time")
            session.commit("one more day")

        trial = Trial(vz_append, lambda: restore(pristine, repo))
        ready(trial)
        trial.run()
        check_vz(repo, files)
        print(f"peer check: VirtualiZarr's appended repository holds {len(files)} steps, the last one "
              "netCDF4-python's")  # fmt: skip
        trials["VirtualiZarr append"] = trial
    except Exception as exc:  # a peer that does not run here is reported, not fatal
        NOTES.append(f"peer VirtualiZarr append: n/a ({type(exc).__name__}: {str(exc)[:200]})")
    try:
        trials["kerchunk recombine"] = kerchunk_trial(files, work, cache)
    except Exception as exc:
        NOTES.append(f"peer kerchunk: n/a ({type(exc).__name__}: {str(exc)[:200]})")
    return trials


def kerchunk_trial(files: list[str], work: Path, cache: Path) -> Trial:
    """kerchunk's "append": the new file's references, then MultiZarrToZarr over every file's again."""
    import fsspec
    import zarr
    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.hdf import SingleHdf5ToZarr

    def single(path: str) -> dict:
        with open(path, "rb") as handle:
            return SingleHdf5ToZarr(handle, "file://" + path, inline_threshold=0).translate()

    folder = cache / f"kerchunk-{len(files) - 1}"
    stamp = {"kind": "kerchunk-singles", "files": len(files) - 1, "last": Path(files[-2]).name}
    if not _stamped(folder, stamp):
        _fresh(folder)
        (folder / "singles.json").write_text(json.dumps([single(f) for f in files[:-1]]))
        _stamp(folder, stamp)
    singles = json.loads((folder / "singles.json").read_text())
    out = work / "kerchunk.json"

    def recombine():
        combined = MultiZarrToZarr(
            [*singles, single(files[-1])],
            concat_dims=["time"],
            identical_dims=["lat", "lon"],
            coo_map={"time": "cf:time"},
        ).translate()
        out.write_text(json.dumps(combined))

    recombine()
    raw, when = nc4_expected(files[-1])
    fs = fsspec.filesystem("reference", fo=str(out), remote_protocol="file")
    group = zarr.open_group(fs.get_mapper(""), mode="r", zarr_format=2)
    assert group["time"].shape == (len(files),), group["time"].shape
    np.testing.assert_array_equal(group["sst"][-1], raw, err_msg="kerchunk sst")
    import cftime

    last = cftime.num2date(group["time"][-1], group["time"].attrs["units"], "standard")
    assert np.datetime64(last.isoformat(), "ns") == when, (last, when)
    print(
        f"peer check: kerchunk's recombined references hold {len(files)} steps, the last one netCDF4-python's"
    )
    return Trial(recombine)


# ------------------------------------------------------------------------------------------ 2. COG


def bench_cog(files: list[str], work: Path, rounds: int, profile: bool) -> list[str]:
    from nczmap.integrations.virtualize import virtualize

    base, new = files[:-1], files[-1]
    n = len(base)
    trials: dict[str, Trial] = {}
    profiles = []
    forms = {"Parquet": "cogs.parq", "JSON": "cogs.json"}
    for form, name in forms.items():
        made, pristine, whole = work / name, work / "pristine" / name, work / ("all-" + name)
        quiet(virtualize, base, url_of(made), new_dim="time=%Y%m%d")
        stash(made, pristine)

        def append(made=made):
            quiet(virtualize, [new], url_of(made), append=True)

        def everything(whole=whole):
            quiet(virtualize, files, url_of(whole), new_dim="time=%Y%m%d")

        trials[f"{form} append"] = Trial(append, lambda made=made, pristine=pristine: restore(pristine, made))
        trials[f"{form} all again"] = Trial(everything, lambda whole=whole: remove_dataset(whole))
        for trial in (trials[f"{form} append"], trials[f"{form} all again"]):
            ready(trial)
            trial.run()
        check_cog(made, files, f"COG {form} appended")
        check_cog(whole, files, f"COG {form} all at once")
        if form == "Parquet" and profile:
            profiles.append(profile_top(f"Parquet, COG, {n} files + 1", trials["Parquet append"]))
    print(f"COG check: Parquet and JSON, appended and made at once, hold {len(files)} steps; time is the "
          f"names' dates; the last step is rasterio's pixels of {Path(new).name}")  # fmt: skip
    medians = interleaved(trials, rounds)
    for form in forms:
        share_row(
            f"COG {form}: append 1 to {n} files", medians[f"{form} append"], medians[f"{form} all again"]
        )
    return profiles


# ------------------------------------------------------------------------------------------ 3. a long series


def listing(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``directory``: relative path -> (inode, size)."""
    found = {}
    for path in directory.rglob("*"):
        if path.is_file():
            status = path.stat()
            found[str(path.relative_to(directory))] = (status.st_ino, status.st_size)
    return found


def last_records(manifest: Path) -> dict[str, str]:
    """Each array directory's last record file (``refs.<n>.parq`` of the largest ``n``)."""
    last = {}
    for folder in sorted({p.parent for p in manifest.rglob("refs.*.parq")}):
        numbers = [int(p.name.split(".")[1]) for p in folder.glob("refs.*.parq")]
        last[str(folder.relative_to(manifest))] = f"refs.{max(numbers)}.parq"
    return last


def spoil(made: Path) -> tuple[dict[str, str], int, int]:
    """Every record file of the manifest ``made`` but the last of each array overwritten with garbage:
    (each array directory's last record file, record files, record files spoiled)."""
    last = last_records(made)
    records = sorted(made.rglob("refs.*.parq"))
    spoiled = 0
    for path in records:
        if path.name != last[str(path.parent.relative_to(made))]:
            path.write_bytes(b"garbage, not Parquet: a read of this record file fails loudly\n" * 8)
            spoiled += 1
    return last, len(records), spoiled


def bench_series(series: Series, profile: bool) -> list[str]:
    import xarray as xr

    from nczmap.integrations.virtualize import virtualize

    steps = len(series.links)
    made = series.manifest.parent.parent / "big.parq"  # the name it was made with
    append = Trial(lambda: quiet(virtualize, [series.new], str(made), append=True))
    try:
        restore(series.manifest, made)
        last, record_files, spoiled = spoil(made)
        before = listing(made)
        beside_before = {p.name for p in _beside(made)}
        os.sync()
        start = time.perf_counter()
        try:
            append.run()
            failure = None
        except Exception as exc:  # reported: this is what the target is about
            failure = f"{type(exc).__name__}: {str(exc)[:300]}"
        seconds = time.perf_counter() - start
        after = listing(made)
        beside_after = {p.name for p in _beside(made)}
        if failure is None:
            granted = ["file://" + os.path.dirname(series.new) + "/"]
            url = f"file://{made}#mode=nczarr,manifest"
            options = {"map_options": {"containers": granted}, "mask_and_scale": False}
            with xr.open_dataset(url, engine="nczmap", **options) as ds:
                assert ds.sizes["time"] == steps + 1, ds.sizes
                last_time = ds["time"].values[-1]
                got = ds["band_data"].isel(time=-1).values
            np.testing.assert_array_equal(got, cog_expected(series.new), err_msg="series: the appended step")
            assert last_time == dates_of([series.new])[0], last_time
        profiles = []
        if profile and failure is None:
            append.prepare = lambda: (restore(series.manifest, made), spoil(made))
            profiles.append(profile_top(f"Parquet, COG, {steps} steps + 1 (spoiled records)", append))
    finally:
        remove_dataset(made)
    written = sorted(name for name, (inode, _) in after.items() if before.get(name, (None,))[0] != inode)
    records_written = [name for name in written if name.endswith(".parq")]
    removed = sorted(set(before) - set(after))
    label = "built now" if series.built_now else "cached in --workdir: its build's time"
    row(f"series: virtualize {steps} COGs → Parquet ({label})", series.seconds, None, series.how)
    if series.failed:
        NOTES.append(f"series: virtualize of all {steps} COGs in one call failed: {series.failed}")
    outcome = "succeeded" if failure is None else "FAILED"
    row(
        f"series: append 1 to {steps} ({spoiled} of {record_files} record files garbage)",
        seconds,
        None,
        f"{outcome}; wrote {len(records_written)} record file(s) {verdict(failure is None)}",
    )
    if failure is None:
        TARGETS.append(
            f"TARGET append to a {steps}-step Parquet manifest reads no record file but the last of each of "
            f"its {len(last)} arrays: {spoiled} of {record_files} record files overwritten with garbage, the "
            f"append succeeded in {fmt_time(seconds).strip()}, wrote {len(records_written)} record file(s), "
            f"and its last step ({str(last_time)[:10]}) is rasterio's pixels of {Path(series.new).name}: MET"
        )
        print(f"series check: the append to the spoiled {steps}-step manifest succeeded; the engine reads "
              f"{steps + 1} steps, the last rasterio's pixels of {Path(series.new).name}")  # fmt: skip
    else:
        TARGETS.append(
            f"TARGET append to a {steps}-step Parquet manifest reads no record file but the last of each "
            f"array: the append failed on the garbage ({failure}): MISSED"
        )
    NOTES.append(
        f"series append wrote {len(records_written)} record file(s) ({', '.join(records_written) or 'none'}) "
        f"of the {len(after)} files of the manifest; every file with a new inode or a new name: "
        f"{', '.join(written)}" + (f"; gone: {', '.join(removed)}" if removed else "")
    )
    NOTES.append(
        f"series: chunk files beside the manifest (the loaded time coordinate): {len(beside_before)} before "
        f"the append, {len(beside_after)} after ({len(beside_after - beside_before)} new, "
        f"{len(beside_before - beside_after)} removed)"
    )
    return profiles


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000, help="files in the dataset appended to")
    parser.add_argument("--series", type=int, default=100_000, help="steps of the long COG series")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", type=Path, help="build (and keep, and reuse) the inputs here")
    parser.add_argument("--only", choices=["nc4", "cog", "series", "peers"], action="append")
    parser.add_argument("--profile", action="store_true", help="where an append's time goes (cProfile)")
    parser.add_argument("--quick", action="store_true", help="40 files, a 3,000-step series, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.files, args.series, args.rounds = 40, 3000, 1
    parts = args.only or ["nc4", "cog", "series", "peers"]
    warnings.filterwarnings("ignore", message=".*codecs are not in the Zarr version 3")
    warnings.filterwarnings("ignore", message="__eq__ currently is over-cautious")
    warnings.filterwarnings("ignore", category=UserWarning, module="virtualizarr")
    warnings.filterwarnings("ignore", message=".*was not created with `asynchronous=True`")
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="zarr")

    profiles: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        work = args.workdir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        out = Path(scratch) / "out"
        started = time.perf_counter()
        days = cogs = series = None
        if "nc4" in parts or "peers" in parts:
            days = build_days(work / f"nc4-{args.files + 1}", args.files + 1)
        if "cog" in parts:
            cogs = build_cogs(work / f"cog-{args.files + 1}", args.files + 1)
        if "series" in parts:
            series = build_series(work / f"series-{args.series}", args.series)
        print(f"inputs ready in {time.perf_counter() - started:.1f} s under {work}")
        if days is not None:
            (out / "nc4").mkdir(parents=True)
            profiles += bench_nc4(days, out / "nc4", args.rounds, args.profile, "peers" in parts, work)
        if cogs is not None:
            (out / "cog").mkdir(parents=True)
            profiles += bench_cog(cogs, out / "cog", args.rounds, args.profile)
        if series is not None:
            profiles += bench_series(series, args.profile)

    print()
    print(f"median of {args.rounds} round(s); files in the page cache, libraries imported")
    header = ("measure", "append (nczmap)", "all again / peer", "ratio (target)")
    widths = [max(len(r[i]) for r in [header, *ROWS]) for i in range(4)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for measured in ROWS:
        print(" | ".join(c.ljust(w) for c, w in zip(measured, widths, strict=True)))
    print()
    for line in TARGETS:
        print(line)
    print()
    for note in NOTES:
        print("- " + note)
    for text in profiles:
        print()
        print(text)


if __name__ == "__main__":
    main()
