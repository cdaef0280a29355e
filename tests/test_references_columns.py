"""References written as columns, end to end and piece by piece.

``virtualize`` describes a new array's chunks as columns: in batches of sources (``output.BATCH_CHUNKS``
chunks) that :class:`~nczmap.zmap.manifest_tables.ChunkTableBuilder` turns into pages of the Parquet record
size (a page begun in one batch carried into the next), each source a block of Icechunk's grid at a time
(``IcechunkMap.set_virtual_block``), and the parsed sources' chunk columns spilled to a temporary file
(``parsed.SPILL_CHUNKS``) until they are written and let go. Here the knobs are made tiny so that every one
of those paths is taken with small files of every source format, and the results are held to oracles that
are not nczmap: netCDF4-python through ``xr.open_mfdataset(engine="netcdf4")``, rasterio, cfgrib and
zarr-python; the JSON, Parquet and Icechunk outputs must hold the same references as each other and as a
run with the default knobs, whether written at once or appended. The builder and the spill are then
tested on their own, through a real manifest map and a real temporary file.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import pickle
import re
import warnings
from array import array as int_array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nczmap
from nczmap.errors import DataError
from nczmap.integrations.virtualize import VirtualizeWarning, output, parsed, virtualize
from nczmap.manifest import kerchunk_parquet
from nczmap.manifest.model import Reference
from nczmap.zmap.manifest_tables import ChunkTableBuilder

netCDF4 = pytest.importorskip("netCDF4")
xr = pytest.importorskip("xarray")
pytest.importorskip("dask")  # open_mfdataset
ic = pytest.importorskip("icechunk")

from nczmap.zmap.icechunk import IcechunkMap  # noqa: E402
from nczmap.zmap.manifest import ManifestMap  # noqa: E402

SUFFIXES = (".json", ".parq", ".icechunk")
CHUNK_NAME = re.compile(r"\d+(\.\d+)*")


# ============================================================================================ the knobs
@dataclass
class Calls:
    """How often each path of the columns was taken (and for which arrays)."""

    finished: list[str] = field(default_factory=list)  # ChunkTableBuilder.finish: a table installed
    added: Counter = field(default_factory=Counter)  # ChunkTableBuilder.add: a batch described, by array
    blocks: Counter = field(default_factory=Counter)  # IcechunkMap.set_virtual_block: by array
    one_ref: int = 0  # IcechunkMap.set_virtual_ref: a chunk at a time
    by_name: Counter = field(default_factory=Counter)  # ManifestMap.set_chunk_references: by array
    spilled: int = 0  # ColumnSpill.put: a storage's columns moved to the temporary file
    read_back: int = 0  # ColumnSpill.get: a spilled column read back


def _wrapped(patch, owner: type, name: str, note) -> None:
    """``owner.name`` replaced by a wrapper that calls ``note(*args)`` then the real method."""
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        note(*args)
        return real(*args, **kwargs)

    patch.setattr(owner, name, counted)


@contextlib.contextmanager
def knobs(monkeypatch, tiny: bool = True):
    """The paths of the columns counted (the real methods called); ``tiny``: every storage of a chunk or
    more spilled, batches of two chunks, Parquet pages (records) of three chunks."""
    calls = Calls()

    def count(name: str):
        def note(*_):
            setattr(calls, name, getattr(calls, name) + 1)

        return note

    with monkeypatch.context() as patch:
        if tiny:
            patch.setattr(parsed, "SPILL_CHUNKS", 1)
            patch.setattr(output, "BATCH_CHUNKS", 2)
            patch.setattr(kerchunk_parquet, "RECORD_SIZE", 3)
        _wrapped(patch, ChunkTableBuilder, "finish", lambda builder: calls.finished.append(builder.array))
        _wrapped(patch, ChunkTableBuilder, "add", lambda builder, *_: calls.added.update([builder.array]))
        _wrapped(patch, IcechunkMap, "set_virtual_block", lambda _, array, *__: calls.blocks.update([array]))
        _wrapped(patch, IcechunkMap, "set_virtual_ref", count("one_ref"))
        _wrapped(
            patch, ManifestMap, "set_chunk_references", lambda _, array, *__: calls.by_name.update([array])
        )
        _wrapped(patch, parsed.ColumnSpill, "put", count("spilled"))
        _wrapped(patch, parsed.ColumnSpill, "get", count("read_back"))
        yield calls


def url_of(destination: Path) -> str:
    if destination.suffix == ".icechunk":
        return f"file://{destination}#mode=icechunk"
    return f"file://{destination}#mode=nczarr,manifest"


def quiet_virtualize(sources, destination: Path, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VirtualizeWarning)
        return virtualize([str(s) for s in sources], url_of(destination), **options)


def grants(result) -> list[str]:
    return [container.prefix for container in result.containers]


def open_output(destination: Path, containers: list[str], **options) -> xr.Dataset:
    with xr.open_dataset(
        url_of(destination), engine="nczmap", map_options={"containers": containers}, **options
    ) as ds:
        return ds.load()


# ============================================================================ the references of an output
def references(destination: Path, containers: list[str]) -> dict[tuple[str, tuple[int, ...]], tuple]:
    """Every chunk of the output that refers to a source: ``(array path, chunk index) -> (url, offset,
    length)`` (data held in the output itself, inline or native, left out)."""
    found: dict[tuple[str, tuple[int, ...]], tuple] = {}
    sources = tuple(containers)
    if destination.suffix == ".icechunk":
        virtual = int(ic.ChunkType.virtual)
        with nczmap.open_map(url_of(destination), containers=containers) as zmap:
            arrays = [
                key[: -len("/zarr.json")]
                for key in zmap.objects("/")
                if key.endswith("/zarr.json") and json.loads(zmap.read(key))["node_type"] == "array"
            ]
            for array in arrays:
                for coords, kinds, paths, offsets, lengths, _ in zmap.chunk_references(array):
                    for at in np.flatnonzero(np.asarray(kinds) == virtual).tolist():
                        index = tuple(int(i) for i in coords[at]) or (0,)
                        found[(array, index)] = (paths[at], int(offsets[at]), int(lengths[at]))
        return found
    with nczmap.open_map(url_of(destination)) as zmap:
        for key, entry in zmap.manifest.references():
            array, _, name = key.rpartition("/")
            if isinstance(entry, Reference) and CHUNK_NAME.fullmatch(name) and entry.url.startswith(sources):
                index = tuple(int(i) for i in name.split("."))
                found[("/" + array, index)] = (entry.url, entry.offset, entry.length)
    return found


def assert_values_equal(ours: xr.Dataset, theirs: xr.Dataset, names: list[str] | None = None) -> None:
    """Every variable of ``theirs`` (or the ``names``) in ``ours``, of the same dimensions and values."""
    for name in names if names is not None else list(theirs.variables):
        assert ours[name].dims == theirs[name].dims, name
        np.testing.assert_array_equal(ours[name].values, theirs[name].values, err_msg=name)


# ============================================================================ every source format
@dataclass
class Format:
    """How a collection of one source format is written, joined, and checked against its oracle."""

    write: object  # (folder) -> the files
    options: dict  # of virtualize: how the files are joined
    check: object  # (destination, containers, files): the output equals the oracle
    one_by_one: tuple[str, ...] | None = ()  # arrays whose references Icechunk gets a chunk at a time
    # (None: every array's)


def write_netcdf4(folder: Path, count: int = 4) -> list[Path]:
    """Daily netCDF-4 files: ``v(time, y, x)`` in 8 zlib chunks a file; ``late(station, time)`` whose
    joined axis is not its first (each file's chunks interleave with the others' in the joined grid, so the
    builder gets its columns out of order); ``quiet(time, n)``, whose chunks are small enough to be kept in
    the output in the first two files (zeros) and references in the others; ``g/u(time, z)`` in a group."""
    files = []
    for day in range(count):
        rng = np.random.default_rng(day)
        path = folder / f"day_{day:02d}.nc"
        with netCDF4.Dataset(path, "w") as ds:
            ds.title = "columns"
            ds.createDimension("time", None)
            ds.createDimension("y", 12)
            ds.createDimension("x", 16)
            ds.createDimension("station", 30)
            ds.createDimension("n", 20)
            time = ds.createVariable("time", "i4", ("time",))
            time.units = "days since 2024-01-01"
            time[:] = [2 * day, 2 * day + 1]
            v = ds.createVariable("v", "f4", ("time", "y", "x"), zlib=True, chunksizes=(1, 6, 8))
            v.units = "K"
            v[:] = rng.random((2, 12, 16), dtype="f4")
            late = ds.createVariable("late", "f8", ("station", "time"), chunksizes=(15, 1))
            late[:] = rng.random((30, 2))
            quiet = ds.createVariable("quiet", "f8", ("time", "n"), zlib=True, chunksizes=(1, 20))
            quiet[:] = np.zeros((2, 20)) if day < 2 else rng.random((2, 20))
            group = ds.createGroup("g")
            group.createDimension("z", 20)
            u = group.createVariable("u", "i8", ("time", "z"), chunksizes=(1, 20))
            u[:] = rng.integers(-(10**12), 10**12, (2, 20))
        files.append(path)
    return files


def check_netcdf4(destination: Path, containers: list[str], files: list[Path]) -> None:
    for group in (None, "g"):
        with xr.open_mfdataset(
            files, combine="nested", concat_dim="time", engine="netcdf4", group=group
        ) as theirs:
            assert_values_equal(open_output(destination, containers, group=group), theirs.load())


def write_netcdf3(folder: Path, count: int = 3) -> list[Path]:
    """64-bit offset netCDF-3 files of 3 records each: two record variables (each record a chunk),
    interleaved in the records, and a fixed one (contiguous: one reference, not a chunk column)."""
    files = []
    for part in range(count):
        rng = np.random.default_rng(100 + part)
        path = folder / f"obs_{part}.nc"
        with netCDF4.Dataset(path, "w", format="NETCDF3_64BIT_OFFSET") as ds:
            ds.createDimension("time", None)
            ds.createDimension("n", 20)
            ds.createDimension("m", 30)
            time = ds.createVariable("time", "f8", ("time",))
            time.units = "hours since 2000-01-01"
            time[:] = np.arange(3) + 3 * part
            ds.createVariable("a", "f8", ("time", "n"))[:] = rng.random((3, 20))
            ds.createVariable("b", "i4", ("time", "m"))[:] = rng.integers(-(2**31), 2**31 - 1, (3, 30))
            ds.createVariable("fixed", "f8", ("n",))[:] = np.linspace(0, 1, 20)
        files.append(path)
    return files


def check_netcdf3(destination: Path, containers: list[str], files: list[Path]) -> None:
    with xr.open_mfdataset(
        files,
        combine="nested",
        concat_dim="time",
        engine="netcdf4",
        data_vars="minimal",
        coords="minimal",
        compat="override",
    ) as theirs:
        assert_values_equal(open_output(destination, containers), theirs.load())


def write_cogs(folder: Path) -> list[Path]:
    """A COG series (rasterio writes it: 6 ZSTD tiles a file), dated by name."""
    pytest.importorskip("rasterio")
    from test_virtualize_collections import write_cog

    files = [folder / f"sst_2020010{day}.tif" for day in (1, 2, 3, 5)]
    for seed, path in enumerate(files):
        write_cog(path, seed)
    return files


def check_cogs(destination: Path, containers: list[str], files: list[Path]) -> None:
    import rasterio
    from test_virtualize_collections import dates_of

    ours = open_output(destination, containers, mask_and_scale=False)
    bands = []
    for path in files:
        with rasterio.open(path) as dataset:
            bands.append(dataset.read(1))
    assert ours["band_data"].dims == ("time", "y", "x")
    np.testing.assert_array_equal(ours["band_data"].values, np.stack(bands))
    np.testing.assert_array_equal(ours["time"].values, dates_of(files))


def write_grib(folder: Path) -> list[Path]:
    """Four HRRR-like analyses six hours apart (one message a field a file: a chunk each)."""
    pytest.importorskip("cfgrib")
    import grib_samples as gs

    return [
        gs.lambert(folder / f"hrrr.20240101.t{hour:02d}z.grib2", time=hour * 100) for hour in (0, 6, 12, 18)
    ]


def check_grib(destination: Path, containers: list[str], files: list[Path]) -> None:
    from test_virtualize_grib_e2e import cfgrib_joined

    for group, name in (("surface", "t"), ("heightAboveGround", "t2m")):
        theirs = cfgrib_joined(files, "time", group)
        ours = open_output(destination, containers, group=group)
        np.testing.assert_array_equal(ours[name].isel(step=0).values, theirs[name].values)
        np.testing.assert_array_equal(ours["time"].values, theirs["time"].values)
        np.testing.assert_array_equal(ours["latitude"].values, theirs["latitude"].values)


def write_zarr(folder: Path) -> list[Path]:
    """Three Zarr v2 stores xarray wrote (``temp`` in 8 chunks a store, each chunk its own file)."""
    from test_virtualize_stores import write_days

    return write_days(folder, 2)


def check_zarr(destination: Path, containers: list[str], files: list[Path]) -> None:
    import zarr

    ours = open_output(destination, containers, mask_and_scale=False, decode_times=False)
    stores = [zarr.open_group(str(path), mode="r") for path in files]
    np.testing.assert_array_equal(ours["temp"].values, np.concatenate([s["temp"][...] for s in stores]))
    for name in ("x", "y"):
        np.testing.assert_array_equal(ours[name].values, stores[0][name][...])


FORMATS = {
    "netcdf4": Format(write_netcdf4, {"concat": "time"}, check_netcdf4),
    "netcdf3": Format(write_netcdf3, {"concat": "time"}, check_netcdf3, one_by_one=("/fixed",)),
    "tiff": Format(write_cogs, {"new_dim": "time=%Y%m%d"}, check_cogs),
    "grib": Format(write_grib, {"concat": "time"}, check_grib),
    # a store's chunks each lie in their own file (``Storage.locations``): Icechunk gets them one by one
    "zarr": Format(write_zarr, {"concat": "time"}, check_zarr, one_by_one=None),
}


@pytest.fixture(scope="module", params=list(FORMATS))
def collection(request, tmp_path_factory) -> tuple[Format, list[Path]]:
    folder = tmp_path_factory.mktemp(f"sources-{request.param}")
    return FORMATS[request.param], FORMATS[request.param].write(folder)


def test_every_output_through_the_columns_equals_the_oracle_and_the_default_run(
    collection, tmp_path, monkeypatch
):
    """Every source format joined with the knobs tiny (each storage spilled, batches of two chunks, pages
    of three carried from batch to batch) into JSON, Parquet and Icechunk: each output reads as the
    oracle reads the files, and holds the references of the default run; the columns' paths were taken."""
    fmt, files = collection
    with knobs(monkeypatch, tiny=False) as calls:
        result = quiet_virtualize(files, tmp_path / "default.json", **fmt.options)
        assert not result.refused
        expected = references(tmp_path / "default.json", grants(result))
        result = quiet_virtualize(files, tmp_path / "default.parq", **fmt.options)
        assert references(tmp_path / "default.parq", grants(result)) == expected
    assert calls.spilled == 0, "no storage of these files is large enough to be spilled by default"
    sources: dict[str, set[str]] = {}  # array -> the sources its references point into
    for (array, _), (url, _, _) in expected.items():
        sources.setdefault(array, set()).add(url)
    assert expected and result.references == len(expected)
    one_by_one = set(sources) if fmt.one_by_one is None else set(fmt.one_by_one)
    tabled = set(sources) - set(fmt.one_by_one or ())
    for suffix in SUFFIXES:
        destination = tmp_path / f"tiny{suffix}"
        with knobs(monkeypatch) as calls:
            result = quiet_virtualize(files, destination, **fmt.options)
        assert not result.refused, suffix
        fmt.check(destination, grants(result), files)
        assert references(destination, grants(result)) == expected, suffix
        assert calls.spilled >= len(files) and calls.read_back >= 3, suffix  # spilled, then read back
        if suffix == ".icechunk":
            assert not calls.finished and not calls.added
            # a set_virtual_block per source and array (chunked storages of plain keys, not a store's)
            blocks = {array: len(urls) for array, urls in sources.items() if array not in one_by_one}
            assert calls.blocks == Counter(blocks)
            assert calls.one_ref == sum(1 for array, _ in expected if array in one_by_one)
        else:
            assert set(calls.finished) >= tabled and len(calls.finished) == len(set(calls.finished))
            for array in tabled:  # joined arrays described in several batches, a page carried over
                assert calls.added[array] >= (2 if len(sources[array]) > 2 else 1), (suffix, array)
            assert not calls.blocks and not calls.one_ref and not calls.by_name, "no chunk set by name"
        if suffix == ".parq":  # written in records of three chunks: several an array
            assert json.loads((destination / ".zmetadata").read_bytes())["record_size"] == 3
            for array in sources:
                held = sum(1 for name, _ in expected if name == array)
                records = list((destination / array.lstrip("/")).glob("refs.*.parq"))
                assert len(records) >= -(-held // 3), array


@pytest.mark.parametrize("collection", ["netcdf4"], indirect=True)
@pytest.mark.parametrize("suffix", [".json", ".parq"])
def test_checksummed_references_are_set_by_name_a_batch_at_a_time(collection, suffix, tmp_path, monkeypatch):
    """With checksums a manifest records the crc32c of every reference, which a table does not hold: the
    chunks are set by name, a batch of sources at a time; the same references as without, each with the
    CRC-32C (google_crc32c's) of the bytes it names."""
    google_crc32c = pytest.importorskip("google_crc32c")
    fmt, files = collection
    with knobs(monkeypatch, tiny=False):
        result = quiet_virtualize(files, tmp_path / "default.json", **fmt.options)
    expected = references(tmp_path / "default.json", grants(result))
    destination = tmp_path / f"summed{suffix}"
    with knobs(monkeypatch) as calls:
        result = quiet_virtualize(files, destination, checksums=True, **fmt.options)
    assert not calls.finished and calls.spilled >= len(files)
    assert calls.by_name["/v"] == len(files), "a batch a source: 8 chunks each, batches of 2"
    assert references(destination, grants(result)) == expected
    fmt.check(destination, grants(result), files)
    with nczmap.open_map(url_of(destination)) as zmap:
        recorded = dict(zmap.manifest.checksums)
    assert len(recorded) == len(expected)
    for (array, index), (url, offset, length) in expected.items():
        with open(url[len("file://") :], "rb") as source:
            source.seek(offset)
            data = source.read(length)
        assert recorded[f"{array[1:]}/{'.'.join(map(str, index))}"] == google_crc32c.value(data)


# ============================================================================================== appends
# A COG appended to an Icechunk repository of COGs was refused once: the repository's zstd codec reads
# back as {'id': 'zstd', 'level': 9, 'checksum': False} (Zarr v3 spells the default out) and the new COG's
# as {'id': 'zstd', 'level': 9}, taken for different codecs (codecs are now compared as numcodecs spells
# them in full).
APPENDS = [
    *(("netcdf4", suffix) for suffix in SUFFIXES),
    ("tiff", ".json"),
    ("tiff", ".parq"),
    ("tiff", ".icechunk"),
]


@pytest.mark.parametrize(("collection", "suffix"), APPENDS, indirect=["collection"])
def test_appends_with_tiny_knobs_equal_every_file_at_once_and_the_oracle(
    collection, suffix, tmp_path, monkeypatch
):
    """The first files, then the rest appended in one or several steps (the knobs tiny throughout): the
    references and values of every file joined at once, and the oracle's values. (An append's parses are
    not spilled: only a new dataset's are.)"""
    fmt, files = collection
    with knobs(monkeypatch):
        whole = tmp_path / f"whole{suffix}"
        result = quiet_virtualize(files, whole, **fmt.options)
    containers = grants(result)
    expected = references(whole, containers)
    at_once = open_output(whole, containers)
    tables: list[str] = []  # arrays an append installed a chunk table for
    for splits in ([1], [len(files) - 1], list(range(1, len(files)))):
        destination = tmp_path / f"after_{'_'.join(map(str, splits))}{suffix}"
        bounds = [0, *splits, len(files)]
        with knobs(monkeypatch):
            quiet_virtualize(files[: bounds[1]], destination, **fmt.options)
        for low, high in itertools.pairwise(bounds[1:]):
            with knobs(monkeypatch) as calls:
                result = quiet_virtualize(files[low:high], destination, append=True)
            assert result.references > 0
            tables += calls.finished
            if suffix == ".icechunk":  # the new files' chunks set a source's block at a time
                assert sum(calls.blocks.values()) >= high - low
            else:  # set by name or merged into the array's table as columns
                assert sum(calls.by_name.values()) + len(calls.finished) >= 1
        assert references(destination, containers) == expected, splits
        xr.testing.assert_identical(open_output(destination, containers), at_once)
        fmt.check(destination, containers, files)
    if suffix == ".json" and fmt is FORMATS["netcdf4"]:
        # the first file's chunks of /quiet are all kept in the JSON manifest (no table of references to
        # load), so the append builds the array's first table beside those loose chunks
        assert "/quiet" in tables


# ============================================================================ the builder through a map
ZARRAY = {"zarr_format": 2, "dtype": "<i1", "compressor": None, "filters": None, "fill_value": None}


def new_manifest(path: Path, folder: Path):
    """A new manifest map at ``path`` (its suffix says JSON or Parquet) granting ``folder``, with a group
    and nothing else."""
    url = nczmap.parse_url(f"file://{path}#mode=nczarr,manifest")
    zmap = nczmap.open_map(url, "w", containers=[str(folder) + "/"])
    zmap.write("/.zgroup", b'{"zarr_format": 2}')
    return zmap


def with_array(zmap, grid: tuple[int, ...], array: str = "/v"):
    zarray = {**ZARRAY, "shape": list(grid), "chunks": [1] * len(grid), "order": "C"}
    zmap.write(f"{array}/.zarray", json.dumps(zarray).encode())
    return zmap


def chunk_name(flat: int, grid: tuple[int, ...]) -> str:
    return ".".join(str(int(i)) for i in np.unravel_index(flat, grid))


def columns(*values) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(v, dtype=np.int64) for v in values)


@st.composite
def tables(draw):
    """A grid, the chunks held (chunk number -> (URL number, offset, length)), the pieces they are added
    in (possibly empty, in order or not), the page size (None: a JSON manifest, one page) and how many
    URLs they refer to."""
    grid = tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=3)))
    cells = math.prod(grid)  # up to 1,728: sparse pages too (a page is sparse past 1,024 rows unheld)
    flats = sorted(draw(st.sets(st.integers(0, cells - 1), max_size=min(cells, 80))))
    count = draw(st.integers(1, 4))
    chunks = {
        flat: (draw(st.integers(0, count - 1)), draw(st.integers(0, 2**40)), draw(st.integers(1, 2**30)))
        for flat in flats
    }
    cuts = sorted(draw(st.lists(st.integers(0, len(flats)), max_size=6)))
    pieces = [flats[low:high] for low, high in zip([0, *cuts], [*cuts, len(flats)], strict=True)]
    order = draw(st.sampled_from(["in order", "pieces shuffled", "all shuffled"]))
    if order != "in order":
        pieces = draw(st.permutations(pieces))
    if order == "all shuffled":
        pieces = [draw(st.permutations(piece)) for piece in pieces]
    page_size = draw(st.one_of(st.none(), st.integers(1, cells + 2)))
    return grid, chunks, [list(piece) for piece in pieces], page_size, count


_NAMES = itertools.count()


@settings(max_examples=40, deadline=None)
@given(tables())
def test_a_chunk_table_built_in_pieces_holds_every_chunk_after_saving(tmp_path_factory, table):
    """Any chunks of a grid added in any pieces, in order or not, with pages of any size (the Parquet
    record size) or one page (JSON): saved and opened again, each chunk refers where it was told, the
    others hold nothing."""
    grid, chunks, pieces, page_size, count = table
    folder = tmp_path_factory.mktemp("tables", numbered=True)
    urls = [f"file://{folder}/source{i}.bin" for i in range(count)]
    suffix = ".json" if page_size is None else ".parq"
    path = folder / f"table{next(_NAMES)}{suffix}"
    with pytest.MonkeyPatch.context() as patch:
        if page_size is not None:
            patch.setattr(kerchunk_parquet, "RECORD_SIZE", page_size)
        zmap = with_array(new_manifest(path, folder), grid)
        builder = zmap.chunk_table("/v", grid)
        assert builder is not None and builder.page_size == page_size
        numbered: dict[str, int] = {}  # the URLs as the writer numbers them: in the order first met
        for piece in pieces:
            where = [numbered.setdefault(urls[chunks[flat][0]], len(numbered)) for flat in piece]
            offsets = [chunks[flat][1] for flat in piece]
            lengths = [chunks[flat][2] for flat in piece]
            builder.add(*columns(piece, where, offsets, lengths), list(numbered))
        assert builder.finish() == len(chunks)
        zmap.close()
    if page_size is not None:
        assert json.loads((path / ".zmetadata").read_bytes())["record_size"] == page_size
    with nczmap.open_map(nczmap.parse_url(f"file://{path}#mode=nczarr,manifest")) as zmap:
        for flat in range(math.prod(grid)):
            found = zmap.reference(f"/v/{chunk_name(flat, grid)}")
            if flat in chunks:
                number, offset, length = chunks[flat]
                assert found == Reference(urls[number], offset, length), flat
            else:
                assert found is None and not zmap.exists(f"/v/{chunk_name(flat, grid)}"), flat
        held = [key for key, _ in zmap.manifest.references() if not key.endswith((".zarray", ".zgroup"))]
        assert len(held) == len(chunks)


def test_a_chunk_table_written_as_parquet_records_is_read_by_fsspec(tmp_path):
    """Pages of three chunks, one carried from a piece to the next, then a piece out of order: the
    records read by fsspec's own reader of kerchunk Parquet references (no nczmap), bytes and all."""
    from test_manifest_parquet import fsspec_read, reference_fs

    grid = (4, 5)
    data = {name: np.random.default_rng(len(name)).bytes(2000) for name in ("a.bin", "bb.bin")}
    for name, content in data.items():
        (tmp_path / name).write_bytes(content)
    urls = [f"file://{tmp_path}/{name}" for name in data]
    pieces = [([0, 1, 4], [0, 0, 1]), ([5, 9, 10], [1, 0, 0]), ([2, 19], [1, 1])]  # the last out of order
    expected = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kerchunk_parquet, "RECORD_SIZE", 3)
        zmap = with_array(new_manifest(tmp_path / "refs.parq", tmp_path), grid)
        builder = zmap.chunk_table("/v", grid)
        for flats, where in pieces:
            offsets, lengths = [100 * f for f in flats], [10 + f for f in flats]
            builder.add(*columns(flats, where, offsets, lengths), urls)
            for flat, w, offset, length in zip(flats, where, offsets, lengths, strict=True):
                expected[f"v/{chunk_name(flat, grid)}"] = list(data.values())[w][offset : offset + length]
        assert builder.finish() == 8
        zmap.close()
    fs = reference_fs(tmp_path / "refs.parq", engine="pyarrow")
    for flat in range(math.prod(grid)):
        key = f"v/{chunk_name(flat, grid)}"
        assert fsspec_read(fs, key) == expected.get(key), key


@pytest.fixture
def table_maps(tmp_path, monkeypatch):
    """New manifests (pages of three chunks) holding array ``/v`` of a 4 x 5 grid, made on demand by
    suffix, abandoned at the end."""
    monkeypatch.setattr(kerchunk_parquet, "RECORD_SIZE", 3)
    made = []

    def make(suffix: str = ".parq"):
        made.append(with_array(new_manifest(tmp_path / f"refs{len(made)}{suffix}", tmp_path), (4, 5)))
        return made[-1]

    yield make
    for zmap in made:
        zmap.abort()


@pytest.fixture
def table_map(tmp_path, table_maps):
    """A new Parquet manifest of ``table_maps`` and two URLs it may refer to."""
    return table_maps(), [f"file://{tmp_path}/a.bin", f"file://{tmp_path}/b.bin"]


def add_all(builder, pieces: list[list[int]], urls: list[str]) -> None:
    for piece in pieces:
        count = len(piece)
        builder.add(*columns(piece, [0] * count, [7] * count, [100] * count), urls)


@pytest.mark.parametrize(
    ("pieces", "json_manifest"),
    [
        ([[1, 1]], False),  # in one piece
        ([[0, 1], [1, 2]], False),  # in order, across pieces
        ([[0, 1, 2, 3, 4], [4, 5]], False),  # the carried page's last chunk again
        ([[0, 1, 2, 3, 4, 5, 6], [2]], False),  # a chunk of a page already held
        ([[5, 3], [3]], False),  # out of order
        ([[2], [0], [2]], True),  # one page (JSON)
    ],
)
def test_a_chunk_named_twice_is_a_data_error_naming_the_array(table_maps, table_map, pieces, json_manifest):
    zmap, urls = table_map
    if json_manifest:
        zmap = table_maps(".json")
    builder = zmap.chunk_table("/v", (4, 5))
    with pytest.raises(DataError, match=r"'/v'.*named twice"):
        add_all(builder, pieces, urls)
        builder.finish()
    assert zmap.reference("/v/0.1") is None, "nothing installed"


@pytest.mark.parametrize(
    ("flats", "where", "offsets", "lengths", "words"),
    [
        ([3], [0], [-1], [10], "bad ranges"),
        ([3], [0], [0], [-1], "bad ranges"),
        ([-1], [0], [0], [10], "bad ranges"),
        ([20], [0], [0], [10], "bad ranges"),  # beyond the grid of 20 chunks
        ([3], [-1], [0], [10], "bad ranges"),
        ([3], [2], [0], [10], "bad ranges"),  # two URLs
        ([3, 4], [0], [0, 0], [10, 10], "not one URL, offset and length per chunk"),
    ],
)
def test_bad_columns_are_a_data_error_and_change_nothing(table_map, flats, where, offsets, lengths, words):
    zmap, urls = table_map
    builder = zmap.chunk_table("/v", (4, 5))
    builder.add(*columns([0, 1], [0, 1], [5, 6], [50, 60]), urls)
    with pytest.raises(DataError, match=rf"'/v'.*{words}"):
        builder.add(*columns(flats, where, offsets, lengths), urls)
    assert builder.finish() == 2  # the columns refused left out, the others kept
    assert zmap.reference("/v/0.0") == Reference(urls[0], 5, 50)
    assert zmap.reference("/v/0.1") == Reference(urls[1], 6, 60)
    assert zmap.reference("/v/0.3") is None


def test_a_url_outside_the_containers_is_refused(table_map):
    zmap, _ = table_map
    builder = zmap.chunk_table("/v", (4, 5))
    with pytest.raises(nczmap.AccessDenied, match="outside every authorised container"):
        builder.add(*columns([0], [0], [0], [10]), ["file:///elsewhere/data.bin"])


def test_two_tables_begun_for_one_array_the_second_is_refused(table_map):
    zmap, urls = table_map
    first, second = zmap.chunk_table("/v", (4, 5)), zmap.chunk_table("/v", (4, 5))
    add_all(first, [[0, 1]], urls)
    add_all(second, [[2]], urls)
    assert first.finish() == 2
    with pytest.raises(DataError, match=r"'/v'.*set meanwhile"):
        second.finish()
    assert zmap.reference("/v/0.0") == Reference(urls[0], 7, 100) and zmap.reference("/v/0.2") is None


def test_a_table_asked_for_again_is_none_or_merged_into_the_first(table_map):
    """Once an array holds a table, another builder is either refused (None: set the chunks by name) or
    adds its chunks to that table, the first table's chunks kept."""
    zmap, urls = table_map
    first = zmap.chunk_table("/v", (4, 5))
    first.add(*columns([0, 1], [0, 1], [5, 6], [50, 60]), urls)
    assert first.finish() == 2
    again = zmap.chunk_table("/v", (4, 5))
    expected = {0: Reference(urls[0], 5, 50), 1: Reference(urls[1], 6, 60)}
    if again is not None:
        again.add(*columns([5, 17], [1, 0], [8, 9], [80, 90]), urls)
        again.finish()
        expected.update({5: Reference(urls[1], 8, 80), 17: Reference(urls[0], 9, 90)})
    for flat in range(20):
        assert zmap.reference(f"/v/{chunk_name(flat, (4, 5))}") == expected.get(flat), flat


def test_no_table_for_the_root_a_scalar_or_a_chunk_held_inline(table_map):
    zmap, urls = table_map
    for array, grid in (("/", (3,)), ("/v", ())):
        with pytest.raises(DataError, match="no chunk table"):
            zmap.chunk_table(array, grid)
    zmap.write("/v/0.1", b"inline bytes")
    builder = zmap.chunk_table("/v", (4, 5))
    add_all(builder, [[0, 1, 2]], urls)
    with pytest.raises(DataError, match=r"'/v'.*also held inline"):
        builder.finish()
    assert zmap.read("/v/0.1") == b"inline bytes" and zmap.reference("/v/0.0") is None


# ============================================================================================ the spill
def chunked_storage(count: int, seed: int = 0) -> parsed.Storage:
    """A chunked storage of ``count`` chunks of a (count, 4) variable, by rows, at random offsets."""
    rng = np.random.default_rng(seed)
    storage = parsed.Storage(f"source{seed}.nc", "chunked", (count, 4), (1, 4))
    corners = np.stack([np.arange(count), np.zeros(count, dtype=np.int64)], axis=1)
    storage.set_columns(corners, rng.integers(0, 2**40, count), rng.integers(100, 10**6, count))
    return storage


def held_columns(storage: parsed.Storage) -> tuple[bytes, bytes, bytes]:
    return bytes(storage.corners), bytes(storage.offsets), bytes(storage.sizes)


@pytest.fixture
def spill(monkeypatch):
    """A real ColumnSpill (a temporary file), storages of 3 chunks or more spilled to it, its reads
    counted."""
    monkeypatch.setattr(parsed, "SPILL_CHUNKS", 3)
    calls = Calls()
    _wrapped(
        monkeypatch, parsed.ColumnSpill, "get", lambda *_: setattr(calls, "read_back", calls.read_back + 1)
    )
    to = parsed.ColumnSpill()
    yield to, calls
    to.close()


def test_spilled_columns_read_back_equal_and_their_count_needs_no_read(spill):
    to, calls = spill
    storages = [chunked_storage(count, seed) for seed, count in enumerate((2, 3, 50, 7))]
    expected = [held_columns(storage) for storage in storages]
    for storage in storages:
        storage.spill(to)
    assert [s.spill_file is to for s in storages] == [False, True, True, True]  # 2 < SPILL_CHUNKS: held
    assert [s.chunk_count for s in storages] == [2, 3, 50, 7] and calls.read_back == 0
    for storage in reversed(storages):  # read back in any order, each from its own place
        assert held_columns(storage) == expected[storages.index(storage)]
    assert calls.read_back == 9, "three columns a spilled storage, each read once"
    assert all(s.spill_file is None for s in storages) and storages[2].chunk_count == 50
    storages[2].spill(to)  # spilled again (as a new dimension's storage is, once grown), read back again
    assert storages[2].spill_file is to and held_columns(storages[2]) == expected[2]


def test_a_spilled_storage_pickled_carries_its_columns(spill):
    to, _ = spill
    storage = chunked_storage(20, seed=4)
    expected = held_columns(storage)
    storage.spill(to)
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.spill_file is None and "_spilled" not in copy.__dict__  # the columns themselves
    assert held_columns(copy) == expected and copy.chunk_count == 20
    assert copy.source == storage.source and copy.shape == storage.shape and copy.chunks == storage.chunks
    assert held_columns(storage) == expected  # the original still reads its own


def test_a_named_copy_of_a_spilled_storage_reads_the_same_columns(spill):
    to, _ = spill
    storage = chunked_storage(10, seed=5)
    expected = held_columns(storage)
    storage.spill(to)
    twin = storage.named("other.nc")
    assert twin.spill_file is to and twin.chunk_count == 10
    assert held_columns(twin) == expected and held_columns(storage) == expected


def test_release_columns_empties_them_without_reading_them_back(spill):
    to, calls = spill
    spilled, held = chunked_storage(8, seed=6), chunked_storage(2, seed=7)
    spilled.spill(to)
    held.spill(to)
    for storage in (spilled, held):
        storage.release_columns()
        assert storage.spill_file is None and storage.chunk_count == 0
        assert held_columns(storage) == (b"", b"", b"")
    assert calls.read_back == 0


def test_batches_follow_the_chunk_counts_of_spilled_storages_without_reading_them(spill, monkeypatch):
    """A source is never split between batches, and a batch closes once it holds BATCH_CHUNKS chunks."""
    to, calls = spill
    monkeypatch.setattr(output, "BATCH_CHUNKS", 5)
    storages = [chunked_storage(count, seed) for seed, count in enumerate((3, 1, 4, 6, 2, 2))]
    for storage in storages:
        storage.spill(to)
    batches = [[s.chunk_count for s, _ in batch] for batch in output._batches([(s, 0) for s in storages])]
    assert batches == [[3, 1, 4], [6], [2, 2]]
    assert calls.read_back == 0


def test_a_spill_cut_short_is_an_os_error(spill):
    to, _ = spill
    [(offset, count)] = to.put(int_array("q", [1, 2, 3]))
    assert list(to.get(offset, count)) == [1, 2, 3]
    with pytest.raises(OSError, match="cut short"):
        to.get(offset, count + 1)
