"""Damaged source files through every command that reads them, in a child process with bounded memory.

A *case* is a source file's bytes (a seed written by the real library, then mutated) and a label that
says how it was made. :func:`run_cases` runs cases in a child interpreter (many a child: start-up is paid
once), whose address space is limited (``RLIMIT_AS``) and whose every case has a time limit: a case that
exceeds it, or kills the child, is reported as such and the child is started again for the cases after
it. Each case is tried as a user would: ``nczmap virtualize FILE`` and a read of every variable through
the manifest, ``nczmap ncdump FILE`` and (netCDF-4/HDF5) ``nczmap copy FILE STORE``. Its outcome:

- ``ok``: everything worked;
- ``error``: nczmap refused it with one of its own errors (an :class:`~nczmap.errors.NCZError`);
- ``traceback``: any other exception escaped; ``memory``: a MemoryError (the limit was hit);
  ``hang``: the time limit passed; ``crash``: the child died (a signal, an abort).

:func:`seeds` writes the seed files: netCDF-4 through netCDF4-python (a group, a chunked zlib variable, a
string scalar), the same through h5py in HDF5's earliest format (no checksums: damage reaches the
parser), netCDF-3 through netCDF4-python (a record variable with scale_factor, a char variable), a tiled
GeoTIFF through rasterio and GRIB2 through ecCodes. :func:`suite_cases` mutates them the suite's way: byte
flips in the first 4 KiB, 32- and 64-bit fields set to extremes, truncations and spliced runs, each case
reproducible from its format and number.

Run as a script (``python tests/source_fuzz.py [--cases N] [--formats netcdf4,tiff]``) it prints the
tally of the suite's mutations per format.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import pickle
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

FORMATS = ("netcdf4", "hdf5", "netcdf3", "tiff", "grib", "nczarr", "zarr")
WRITERS = {
    "netcdf4": "netCDF4",
    "hdf5": "h5py",
    "netcdf3": "netCDF4",
    "tiff": "rasterio",
    "grib": "eccodes",
    "nczarr": "netCDF4",
    "zarr": "zarr",
}
COPIED = ("netcdf4", "hdf5", "nczarr", "zarr")  # what `nczmap copy SOURCE` reads (stores and netCDF-4)
STORES = {"nczarr": "#mode=nczarr,zip", "zarr": "#mode=zarr,zip"}  # zip archives, opened as stores
OUTCOMES = ("ok", "error", "traceback", "memory", "hang", "crash")
TIME_LIMIT = 30.0  # seconds a case (three commands) may take
MEMORY_LIMIT = 1536 << 20  # the child's address space
HEAD = 4096  # byte flips land in the first HEAD bytes (the metadata of the seeds lies there mostly)


@dataclasses.dataclass(frozen=True)
class Case:
    label: str  # how the bytes were made: reproducible from it
    suffix: str  # the file name's extension
    data: bytes
    seed: bytes = b""  # with it, the case is tried through the other paths (see try_paths)


@dataclasses.dataclass(frozen=True)
class Result:
    case: Case
    outcome: str
    detail: str = ""  # the error or exception, with where an unexpected one was raised
    seconds: float = 0.0
    peak: int = 0  # the child's peak resident memory so far, in bytes


# ------------------------------------------------------------------------------------------ seeds
def seeds(folder: Path, formats=FORMATS) -> dict[str, Path]:
    """The seed files of ``formats``, written by the libraries that write such files: format -> path."""
    folder.mkdir(parents=True, exist_ok=True)
    writers = {
        "netcdf4": (_netcdf4_seed, "seed4.nc"),
        "hdf5": (_hdf5_seed, "seed.h5"),
        "netcdf3": (_netcdf3_seed, "seed3.nc"),
        "tiff": (_tiff_seed, "seed.tif"),
        "grib": (_grib_seed, "seed.grib2"),
        "nczarr": (_nczarr_seed, "nczarr.zip"),
        "zarr": (_zarr_seed, "zarr.zip"),
    }
    return {fmt: writers[fmt][0](folder / writers[fmt][1]) for fmt in formats}


def _netcdf4_seed(path: Path) -> Path:
    """A group, a chunked zlib variable, a string scalar, a coordinate and a few attributes."""
    import netCDF4
    import numpy as np

    with netCDF4.Dataset(path, "w", format="NETCDF4") as root:
        root.title = "fuzz seed"
        root.createDimension("x", 16)
        root.createDimension("y", 12)
        x = root.createVariable("x", "f8", ("x",))
        x[:] = np.arange(16) * 0.5
        x.units = "m"
        data = root.createVariable("data", "f4", ("y", "x"), zlib=True, chunksizes=(4, 8), fill_value=-1.0)
        data[:] = np.arange(192, dtype="f4").reshape(12, 16)
        data.long_name = "values"
        label = root.createVariable("label", str, ())
        label[()] = "hello, world"
        group = root.createGroup("g")
        group.createDimension("t", None)
        counts = group.createVariable("counts", "i4", ("t",))
        counts[:] = np.arange(5, dtype="i4")
        counts.note = "in a group"
    return path


def _hdf5_seed(path: Path) -> Path:
    """The netCDF-4 seed's content written by h5py in HDF5's earliest file format (superblock 0, version 1
    object headers, symbol tables: no checksums, as older netCDF-4 and HDF5 files are): damage is met by
    the parser rather than refused by a checksum when the file is opened."""
    import h5py
    import numpy as np

    with h5py.File(path, "w", libver="earliest") as root:
        root.attrs["title"] = np.bytes_(b"fuzz seed")
        x = root.create_dataset("x", data=np.arange(16) * 0.5)
        x.make_scale("x")
        x.attrs["units"] = np.bytes_(b"m")
        y = root.create_dataset("y", data=np.arange(12, dtype="i4"))
        y.make_scale("y")
        data = root.create_dataset(
            "data",
            data=np.arange(192, dtype="f4").reshape(12, 16),
            chunks=(4, 8),
            compression="gzip",
            fillvalue=-1.0,
        )
        data.dims[0].attach_scale(y)
        data.dims[1].attach_scale(x)
        data.attrs["long_name"] = np.bytes_(b"values")
        root.create_dataset("label", data="hello, world", dtype=h5py.string_dtype())
        group = root.create_group("g")
        t = group.create_dataset("t", data=np.arange(5, dtype="i4"), maxshape=(None,), chunks=(4,))
        t.make_scale("t")
        counts = group.create_dataset("counts", data=np.arange(5, dtype="i4"), maxshape=(None,), chunks=(4,))
        counts.dims[0].attach_scale(t)
        counts.attrs["note"] = "in a group"
    return path


def _grib_seed(path: Path) -> Path:
    """Two GRIB2 messages (temperature on two pressure levels) written by ecCodes from its sample."""
    import eccodes
    import numpy as np

    messages = []
    for level in (500, 850):
        handle = eccodes.codes_grib_new_from_samples("regular_ll_pl_grib2")
        try:
            eccodes.codes_set(handle, "level", level)
            count = eccodes.codes_get(handle, "numberOfValues")
            eccodes.codes_set_values(handle, np.linspace(200.0, 300.0, count) + level / 100)
            messages.append(eccodes.codes_get_message(handle))
        finally:
            eccodes.codes_release(handle)
    path.write_bytes(b"".join(messages))
    return path


def _nczarr_seed(path: Path) -> Path:
    """The netCDF-4 seed's content as libnetcdf writes an NCZarr directory store, zipped as netcdf-c's zip
    driver zips one (members stored as they are): damage reaches the JSON metadata and the chunks."""
    import netCDF4

    store = path.with_suffix(".dir")
    with netCDF4.Dataset(f"file://{store}#mode=nczarr,file", "w") as root:
        _fill_like_netcdf4_seed(root)
    return _zipped(store, path)


def _zarr_seed(path: Path) -> Path:
    """A Zarr v3 store as zarr-python writes it for xarray (``_ARRAY_DIMENSIONS``, fill values, a group),
    zipped with its members stored."""
    import numpy as np
    import zarr

    store = path.with_suffix(".dir")
    root = zarr.open_group(store, mode="w", zarr_format=3)
    root.attrs["title"] = "fuzz seed"
    data = root.create_array("data", shape=(12, 16), chunks=(4, 8), dtype="f4", fill_value=-1.0)
    data[...] = np.arange(192, dtype="f4").reshape(12, 16)
    data.attrs.update({"_ARRAY_DIMENSIONS": ["y", "x"], "long_name": "values"})
    x = root.create_array("x", shape=(16,), chunks=(16,), dtype="f8")
    x[...] = np.arange(16) * 0.5
    x.attrs["_ARRAY_DIMENSIONS"] = ["x"]
    counts = root.create_group("g").create_array("counts", shape=(5,), chunks=(4,), dtype="i4", fill_value=0)
    counts[...] = np.arange(5, dtype="i4")
    counts.attrs["_ARRAY_DIMENSIONS"] = ["t"]
    return _zipped(store, path)


def _zipped(folder: Path, path: Path) -> Path:
    import shutil

    from store_zip import zip_store

    zip_store(folder, path)
    shutil.rmtree(folder)
    return path


def _fill_like_netcdf4_seed(root) -> None:
    import numpy as np

    root.title = "fuzz seed"
    root.createDimension("x", 16)
    root.createDimension("y", 12)
    x = root.createVariable("x", "f8", ("x",))
    x[:] = np.arange(16) * 0.5
    x.units = "m"
    data = root.createVariable("data", "f4", ("y", "x"), chunksizes=(4, 8), fill_value=-1.0)
    data[:] = np.arange(192, dtype="f4").reshape(12, 16)
    data.long_name = "values"
    group = root.createGroup("g")
    group.createDimension("t", 5)
    counts = group.createVariable("counts", "i4", ("t",))
    counts[:] = np.arange(5, dtype="i4")
    counts.note = "in a group"


def _netcdf3_seed(path: Path) -> Path:
    """A record variable packed with scale_factor/add_offset, a char variable, global attributes."""
    import netCDF4
    import numpy as np

    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as root:
        root.title = "fuzz seed"
        root.createDimension("time", None)
        root.createDimension("x", 6)
        root.createDimension("strlen", 8)
        temp = root.createVariable("temp", "i2", ("time", "x"))
        temp.scale_factor = 0.01
        temp.add_offset = 273.15
        temp.units = "K"
        temp.set_auto_maskandscale(False)
        temp[0:4, :] = np.arange(24, dtype="i2").reshape(4, 6)
        name = root.createVariable("name", "S1", ("x", "strlen"))
        name[:] = netCDF4.stringtochar(np.array([f"site{i}" for i in range(6)], dtype="S8"))
        x = root.createVariable("x", "f4", ("x",))
        x[:] = np.arange(6, dtype="f4")
    return path


def _tiff_seed(path: Path) -> Path:
    """A tiled, deflated GeoTIFF of two bands with nodata, written by GDAL (rasterio)."""
    import numpy as np
    import rasterio
    from rasterio.transform import from_origin

    data = np.arange(2 * 64 * 64, dtype="u2").reshape(2, 64, 64)
    profile = {
        "driver": "GTiff",
        "width": 64,
        "height": 64,
        "count": 2,
        "dtype": "uint16",
        "crs": "EPSG:32633",
        "transform": from_origin(500000, 6000000, 30, 30),
        "nodata": 0,
        "tiled": True,
        "blockxsize": 16,
        "blockysize": 16,
        "compress": "deflate",
    }
    with rasterio.open(path, "w", **profile) as dataset:
        dataset.write(data)
    return path


# -------------------------------------------------------------------------------------- mutations
EXTREMES_32 = (0, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x00010000)
EXTREMES_64 = (0, (1 << 64) - 1, (1 << 63) - 1, 1 << 63, 1 << 32)
OPERATIONS = ("flip", "int32", "int64", "truncate", "splice")


def mutate(seed: bytes, fmt: str, number: int) -> tuple[str, bytes]:
    """Mutation ``number`` of ``seed`` (the same every time): ``(label, bytes)``."""
    rng = random.Random(f"{fmt}-{number}")
    operation = OPERATIONS[number % len(OPERATIONS)]
    data = bytearray(seed)
    head = min(HEAD, len(data))
    if operation == "flip":
        places = sorted(rng.randrange(head) for _ in range(rng.randint(1, 4)))
        for place in places:
            data[place] ^= rng.randrange(1, 256)
        what = ",".join(f"{p:#x}" for p in places)
    elif operation in ("int32", "int64"):
        width = 4 if operation == "int32" else 8
        extremes = EXTREMES_32 if width == 4 else EXTREMES_64
        span = head if rng.random() < 0.5 else len(data)
        place = rng.randrange(max(1, span - width)) // width * width
        value, order = rng.choice(extremes), rng.choice(("little", "big"))
        data[place : place + width] = value.to_bytes(width, order)
        what = f"{place:#x}={value:#x} ({order})"
    elif operation == "truncate":
        end = rng.randrange(head) if rng.random() < 0.5 else rng.randrange(len(data))
        del data[end:]
        what = f"at {end:#x}"
    else:
        length = rng.randint(8, 512)
        source, target = rng.randrange(len(data)), rng.randrange(len(data))
        run = seed[source : source + length]
        data[target : target + len(run)] = run
        del data[len(seed) :]
        what = f"{len(run)} bytes {source:#x}->{target:#x}"
    return f"{fmt}#{number} {operation} {what}", bytes(data)


FRESH_OPERATIONS = ("insert", "delete", "zero", "bits", "repeat", "shuffle")


def fresh_mutate(seed: bytes, fmt: str, number: int) -> tuple[str, bytes]:
    """Mutation ``number`` made another way than :func:`mutate`'s, anywhere in the file: bytes inserted or
    deleted (every offset after them shifted), a block zeroed, single bits flipped, a run repeated, a
    window shuffled."""
    rng = random.Random(f"fresh-{fmt}-{number}")
    operation = FRESH_OPERATIONS[number % len(FRESH_OPERATIONS)]
    data = bytearray(seed)
    place = rng.randrange(len(data))
    if operation == "insert":
        length = rng.randint(1, 64)
        data[place:place] = rng.randbytes(length)
    elif operation == "delete":
        length = rng.randint(1, 256)
        del data[place : place + length]
    elif operation == "zero":
        length = rng.choice((4, 16, 256, 4096))
        data[place : place + length] = bytes(len(data[place : place + length]))
    elif operation == "bits":
        length = rng.randint(1, 16)
        for _ in range(length):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif operation == "repeat":
        length = rng.randint(4, 1024)
        data[place:place] = seed[place : place + length]
    else:
        length = 32
        window = data[place : place + length]
        rng.shuffle(window)
        data[place : place + len(window)] = window
    return f"{fmt}#{number} fresh {operation} {length} at {place:#x}", bytes(data)


def mutate_member(seed: bytes, fmt: str, number: int, mutation=None) -> tuple[str, bytes]:
    """Mutation ``number`` of one member of the zip archive ``seed`` (its metadata most often), the archive
    written again around it (its checksums right): damage that reaches the store's JSON and chunks
    rather than the zip reader's checks."""
    import zipfile

    rng = random.Random(f"{fmt}-member-{number}")
    with zipfile.ZipFile(io.BytesIO(seed)) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    metadata = [name for name in members if name.rsplit("/", 1)[-1].startswith((".z", "zarr.json"))]
    consolidated = [name for name in metadata if name == ".zmetadata"]  # what readers read first, if there
    draw = rng.random()
    name = rng.choice(
        consolidated if consolidated and draw < 0.4 else metadata if draw < 0.8 else list(members)
    )
    label, members[name] = (mutation or mutate)(members[name], fmt, number)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    return f"{label.replace('#', f'#member {name} ', 1)}", out.getvalue()


def suite_cases(seed_files: dict[str, Path], count: int, formats=FORMATS, mutation=None) -> list[Case]:
    """``count`` mutations of each format's seed, the suite's way (or ``mutation``'s): a store's half the
    time inside one of its members."""
    mutation = mutation or mutate
    cases = []
    for fmt in formats:
        seed = seed_files[fmt].read_bytes()
        suffix = seed_files[fmt].suffix
        for number in range(count):
            if fmt in STORES and number % 2:
                label, data = mutate_member(seed, fmt, number, mutation)
            else:
                label, data = mutation(seed, fmt, number)
            cases.append(Case(label, suffix, data))
    return cases


def paths_cases(seed_files: dict[str, Path], count: int, formats=FORMATS) -> list[Case]:
    """The suite's first ``count`` mutations of each format, each with its seed: tried through the paths
    of :func:`try_paths`."""
    cases = suite_cases(seed_files, count, formats)
    return [dataclasses.replace(c, seed=seed_files[c.label.split("#")[0]].read_bytes()) for c in cases]


# ------------------------------------------------------------------------------------------ parent
def run_cases(
    cases: list[Case], scratch: Path, time_limit: float = TIME_LIMIT, memory_limit: int = MEMORY_LIMIT
) -> list[Result]:
    """Every case's result, in order; the cases run in child processes (one until a case kills it or runs
    past ``time_limit``, then another for the cases after it)."""
    scratch.mkdir(parents=True, exist_ok=True)
    batch = scratch / "cases.pickle"
    batch.write_bytes(pickle.dumps(cases))
    results: list[Result] = []
    while len(results) < len(cases):
        results.extend(_run_child(cases, len(results), batch, scratch, time_limit, memory_limit))
    return results


def _run_child(
    cases: list[Case], start: int, batch: Path, scratch: Path, time_limit: float, memory_limit: int
) -> list[Result]:
    """Results from one child, from case ``start`` until the end, or until one hangs or kills it."""
    log = scratch / f"child-{start}.log"
    command = [
        sys.executable,
        __file__,
        "--child",
        str(batch),
        str(start),
        str(memory_limit),
        str(time_limit),
    ]
    with open(log, "wb") as errors:
        # its own process group: the pools a case starts in it (process pool workers) are killed with it
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, cwd=scratch, start_new_session=True
        )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_forward, args=(child.stdout, lines), daemon=True)
    reader.start()
    results: list[Result] = []
    current: int | None = None
    started = 0.0
    try:
        while True:
            try:
                line = lines.get(timeout=time_limit + 5 if current is not None else 120)
            except queue.Empty:
                line = None
            if line is None:  # the child ended, or a case ran past its time
                break
            message = json.loads(line)
            if "start" in message:
                current, started = message["start"], time.monotonic()
                continue
            case = cases[message["index"]]
            outcome, detail = message["outcome"], message["detail"]
            results.append(Result(case, outcome, detail, message["seconds"], message["peak"]))
            current = None
            if message["index"] == len(cases) - 1:
                return results
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the child and whatever it started
        child.wait()
        reader.join(5)
    if current is None:
        current = start + len(results)
        if current >= len(cases):
            return results
    elapsed = time.monotonic() - started if started else 0.0
    outcome = "hang" if child.returncode == -9 else "crash"
    stack = log.read_text(errors="replace")[-2000:]
    detail = f"exit status {child.returncode} after {elapsed:.1f} s; child's stderr ends:\n{stack}"
    results.append(Result(cases[current], outcome, detail, elapsed))
    return results


def _forward(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


# ------------------------------------------------------------------------------------------- child
def _child(batch: str, start: int, memory_limit: int, time_limit: float) -> None:
    """Run the cases from ``start`` on, one JSON line before (``start``) and after (the result) each."""
    import faulthandler
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    faulthandler.enable()  # a crash's Python stack, in the log
    report = os.fdopen(os.dup(1), "w", buffering=1)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # what ncdump prints goes nowhere; stderr stays the parent's log
    cases: list[Case] = pickle.loads(Path(batch).read_bytes())
    for index in range(start, len(cases)):
        report.write(json.dumps({"start": index}) + "\n")
        faulthandler.dump_traceback_later(time_limit, exit=False)  # where a hang is, in the log
        began = time.monotonic()
        outcome, detail = try_case(cases[index], Path(f"case{index}"))
        faulthandler.cancel_dump_traceback_later()
        seconds = time.monotonic() - began
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
        result = {"index": index, "outcome": outcome, "detail": detail, "seconds": seconds, "peak": peak}
        report.write(json.dumps(result) + "\n")


NETCDF = ("netcdf4", "hdf5", "netcdf3")  # what the xarray engine opens as a file


def try_paths(case: Case, folder: Path) -> list[tuple[str, object]]:
    """The other paths that parse source files: the damaged file joined after its intact seed (parsed
    first, in this process) on threads, on a process pool and on a dask client, and (netCDF) the xarray
    engine opening the file."""
    from concurrent.futures import ThreadPoolExecutor

    import nczmap

    seed, damaged = folder / f"20200101{case.suffix}", folder / f"20200102{case.suffix}"
    seed.write_bytes(case.seed)
    damaged.write_bytes(case.data)
    fmt = case.label.split("#")[0]

    def joined(executor) -> None:
        out = folder / "joined.json"
        nczmap.virtualize([str(seed), str(damaged)], out, new_dim="time=%Y%m%d", executor=executor)

    steps: list[tuple[str, object]] = [
        ("threads", lambda: joined(ThreadPoolExecutor(2))),
        ("processes", lambda: joined(_process_pool())),
        ("dask", lambda: joined(_dask_client())),
    ]
    if fmt in NETCDF:
        steps.append(("xarray", lambda: _xarray_load(damaged)))
    return steps


_POOLS: dict[str, object] = {}


def _process_pool():
    from concurrent.futures import ProcessPoolExecutor

    return _POOLS.setdefault("processes", ProcessPoolExecutor(2))


def _dask_client():
    if "dask" not in _POOLS:
        from distributed import Client

        _POOLS["dask"] = Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None)
    return _POOLS["dask"]


def _xarray_load(path: Path) -> None:
    import xarray as xr

    with xr.open_dataset(path, engine="nczmap") as dataset:
        dataset.load()


def try_case(case: Case, folder: Path) -> tuple[str, str]:
    """``nczmap virtualize`` + a read of every variable through the manifest, ``nczmap ncdump`` and
    ``nczmap copy`` (a case with its seed: :func:`try_paths`): the worst outcome of the steps, and what
    it was."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"source{case.suffix}"
    path.write_bytes(case.data)
    fmt = case.label.split("#")[0]
    source = f"file://{path.resolve()}{STORES[fmt]}" if fmt in STORES else str(path)
    manifest = folder / "refs.json"
    if case.seed:
        steps = try_paths(case, folder)
    else:
        steps = [
            ("virtualize+read", lambda: _virtualize_and_read(source, manifest)),
            ("ncdump", lambda: _command(["ncdump", source])),
        ]
        if fmt in COPIED:
            steps.append(("copy", lambda: _command(["copy", source, str(folder / "copy.zarr")])))
    worst, detail = "ok", ""
    for name, step in steps:
        outcome, text = _outcome(step)
        if OUTCOMES.index(outcome) > OUTCOMES.index(worst):
            worst, detail = outcome, f"{name}: {text}"
    shutil.rmtree(folder, ignore_errors=True)
    return worst, detail


def _outcome(step) -> tuple[str, str]:
    from nczmap.errors import NCZError

    try:
        step()
    except NCZError as exc:
        return "error", f"{type(exc).__name__}: {exc}"[:500]
    except MemoryError:
        return "memory", _described()
    except Exception:
        return "traceback", _described()
    return "ok", ""


def _described() -> str:
    """The exception being handled, with the innermost frames of nczmap (and below) that raised it."""
    kind, exc, trace = sys.exc_info()
    frames = traceback.extract_tb(trace)
    ours = [f for f in frames if "/nczmap/" in f.filename] or frames
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(ours[-3:]))
    return f"{kind.__name__}: {str(exc)[:300]} [{where}]"


def _command(argv: list[str]) -> None:
    """``nczmap ARGV`` in this process: NCZError when it reports an error, what escaped it otherwise."""
    from nczmap import cli
    from nczmap.errors import NCZError

    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        status = cli.main(argv)
    if status:
        raise NCZError((errors.getvalue().strip().splitlines() or ["(no message)"])[-1])


def _virtualize_and_read(source: str, manifest: Path) -> None:
    import nczmap

    _command(["virtualize", source, str(manifest)])
    url = f"file://{manifest.resolve()}#mode=nczarr,manifest"
    with nczmap.open_dataset(url, containers=[str(manifest.parent.resolve()) + "/"]) as dataset:
        for group in dataset.walk():
            for variable in group.variables.values():
                variable.read()


# ------------------------------------------------------------------------------------------ report
def tally(results: list[Result]) -> dict[str, Counter]:
    """Outcomes counted per format (a case's label starts with it)."""
    counts: dict[str, Counter] = {}
    for result in results:
        counts.setdefault(result.case.label.split("#")[0], Counter())[result.outcome] += 1
    return counts


def table(results: list[Result]) -> str:
    """The outcomes per format, with the slowest case and the largest memory a child reached."""
    counts = tally(results)
    rows = [f"{'format':10}" + "".join(f"{o:>10}" for o in OUTCOMES) + f"{'slowest':>10}{'peak':>10}"]
    for fmt, counter in counts.items():
        mine = [r for r in results if r.case.label.startswith(fmt + "#")]
        slowest = max(r.seconds for r in mine)
        peak = max(r.peak for r in mine) >> 20
        cells = "".join(f"{counter[o]:>10}" for o in OUTCOMES)
        rows.append(f"{fmt:10}{cells}{slowest:>9.1f}s{peak:>7} MiB")
    return "\n".join(rows)


def available(formats=FORMATS) -> list[str]:
    """The formats whose seed writer is installed."""
    import importlib.util

    return [fmt for fmt in formats if importlib.util.find_spec(WRITERS[fmt]) is not None]


def failures(results: list[Result]) -> list[Result]:
    return [r for r in results if r.outcome not in ("ok", "error")]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        batch, start, memory, limit = sys.argv[2:6]
        _child(batch, int(start), int(memory), float(limit))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=120, help="mutations per format")
    parser.add_argument("--formats", default=",".join(available()))
    parser.add_argument("--show", action="store_true", help="print every unexpected outcome")
    parser.add_argument("--fresh", action="store_true", help="mutations made another way (fresh_mutate)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nczmap-fuzz-") as folder:
        began = time.monotonic()
        seed_files = seeds(Path(folder) / "seeds", args.formats.split(","))
        results = run_cases(
            suite_cases(
                seed_files, args.cases, args.formats.split(","), fresh_mutate if args.fresh else None
            ),
            Path(folder) / "run",
        )
        print(table(results))
        print(f"{len(results)} cases in {time.monotonic() - began:.1f} s")
        for result in failures(results) if args.show else []:
            print(f"{result.case.label}: {result.outcome}: {result.detail}")


if __name__ == "__main__":
    main()
