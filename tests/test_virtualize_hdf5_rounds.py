"""Remote netCDF-4/HDF5 sources parsed in rounds (``hdf5.parse_remote``, :mod:`.hdf5_prefetch`): h5py
reads only bytes already held, each round's missing ranges are fetched together outside h5py's lock.

Proofs, on real files (ncgen's conformance corpus, netCDF4-python's and h5py's files of the other tests):
the model equals the direct parse's (groups, dimensions, typed attributes, layouts, codecs, every chunk's
corner/offset/size, refusals, values), also when every read-ahead is tiny so that each file takes many
rounds; few fetches a file; files parsed on threads overlap their waits; a damaged file is a FormatError
naming it after a bounded number of rounds; the same over HTTP from a counting server.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from nczmap.errors import FormatError
from nczmap.integrations.virtualize import hdf5
from nczmap.integrations.virtualize import hdf5_prefetch as prefetch
from nczmap.integrations.virtualize.parsed import Constant, ParsedFile, ParseOptions
from nczmap.integrations.virtualize.sources import LocalFile

h5py = pytest.importorskip("h5py")
netCDF4 = pytest.importorskip("netCDF4")

from test_virtualize import CORPUS, ncgen, write_compressed  # noqa: E402

OPTIONS = ParseOptions()


# ------------------------------------------------------------------------------------- a remote double
class Fetching(LocalFile):
    """A local file read as a remote one is: ``cached`` gives only what was fetched (its first ``first``
    bytes, as a source's first read, and what ``read_ranges`` fetched since); ``read_ranges`` counts its
    calls and ranges and waits ``delay`` seconds, as a request does."""

    def __init__(self, path: Path, first: int = 64 << 10, delay: float = 0.0) -> None:
        super().__init__(os.path.realpath(path), str(path))
        self.delay = delay
        self.spans: list[tuple[int, bytes]] = []
        self.calls: list[list[tuple[int, int]]] = []
        if first:
            self.spans.append((0, self.read_head(0, first)))

    def cached(self, offset: int, length: int) -> bytes | None:
        length = max(0, min(length, self.size - offset))
        for start, data in self.spans:
            if start <= offset and offset + length <= start + len(data):
                return data[offset - start : offset - start + length]
        return None

    def read_ranges(self, ranges):
        self.calls.append(list(ranges))
        if self.delay:
            time.sleep(self.delay)
        found = [self.read(offset, length) for offset, length in ranges]
        self.spans.extend((offset, data) for (offset, _), data in zip(ranges, found, strict=True))
        return found

    @property
    def fetched(self) -> int:
        return sum(length for call in self.calls for _, length in call)


def remote_parse(path: Path, **options) -> tuple[ParsedFile, prefetch.Rounds, Fetching]:
    source = Fetching(path, **options)
    rounds = prefetch.Rounds(source)
    try:
        parsed = hdf5.parse_remote(source, OPTIONS, rounds)
    except BaseException:
        source.close()
        raise
    parsed.closers.append(source.close)
    return parsed, rounds, source


def direct_parse(path: Path) -> ParsedFile:
    source = LocalFile(os.path.realpath(path), str(path))
    parsed = hdf5.parse_direct(source, OPTIONS)
    parsed.closers.append(source.close)
    return parsed


# ---------------------------------------------------------------------------------- the model, in full
def _value(value) -> object:
    """A comparable form of attribute values, fill values and arrays (NaN equal to NaN, dtypes kept)."""
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
        if array.dtype == object:
            return ("object", array.shape, [str(v) for v in array.ravel()])
        return (array.dtype.str, array.shape, array.tobytes())
    if isinstance(value, list):
        return [_value(v) for v in value]
    return value


def describe(parsed: ParsedFile, values: bool = True) -> dict:
    """Everything a ParsedFile says, with the source's name left out (it differs between two readings);
    ``values``: also the values of variables too large to be read while parsing (read now)."""
    found: dict = {
        "format": parsed.format,
        "refused": [
            (r.variable, r.reason.replace(parsed.source, "<source>"), r.attribute) for r in parsed.refused
        ],
    }
    for group in parsed.root.walk():
        found[group.path] = {
            "attrs": [(a.name, a.nctype.name, _value(a.value)) for a in group.attrs.all_typed()],
            "dims": [(d.name, d.size, d.unlimited, d.group.path) for d in group.dimensions.values()],
            "variables": {name: _variable(v, values) for name, v in group.variables.items()},
        }
    return found


def _variable(variable, later: bool) -> dict:
    layout, storage = variable.layout, variable.storages[0]
    values = storage.values
    eager = isinstance(values, Constant)  # read while parsing (small): both paths alike
    return {
        "dims": [d.path for d in variable.dims],
        "attrs": [(a.name, a.nctype.name, _value(a.value)) for a in variable.attrs.all_typed()],
        "layout": (
            layout.shape,
            layout.chunks,
            repr(layout.dtype.nctype),
            layout.dtype.storage.str,
            layout.dtype.explicit_order,
            layout.dtype.maxstrlen,
            _value(layout.fill_value),
            layout.codecs.configs,
            layout.scalar,
        ),
        "storage": (
            storage.kind,
            storage.shape,
            storage.chunks,
            storage.codecs,
            storage.offset,
            storage.problem,
            storage.corners.tolist(),
            storage.offsets.tolist(),
            storage.sizes.tolist(),
        ),
        "eager": eager,
        "values": None if values is None or not (eager or later) else _value(np.asarray(values())),
    }


def assert_same_model(path: Path, **options) -> prefetch.Rounds:
    expected = direct_parse(path)
    parsed, rounds, source = remote_parse(path, **options)
    try:
        assert describe(parsed) == describe(expected)
    finally:
        parsed.close()
        expected.close()
    assert rounds.rounds <= prefetch.MAX_ROUNDS and rounds.probes <= prefetch.MAX_ROUNDS
    assert len(source.calls) == rounds.requests
    return rounds


@pytest.fixture
def no_fallback(monkeypatch):
    """The rounds must carry every remote parse: giving them up (for the direct path) fails the test."""
    run = prefetch.Rounds.run

    def bounded(self, *args):
        try:
            return run(self, *args)
        except prefetch.Exhausted as exc:
            raise AssertionError(f"the remote parse gave up its rounds: {exc}") from None

    monkeypatch.setattr(prefetch.Rounds, "run", bounded)


@pytest.fixture
def tiny_reads(monkeypatch, no_fallback):
    """Read-ahead of a few hundred bytes: every file takes many rounds (what tolerance must survive)."""
    monkeypatch.setattr(prefetch, "HEAD", 512)
    monkeypatch.setattr(prefetch, "ALIGN", 64)
    monkeypatch.setattr(prefetch, "MAX_ALIGN", 64)
    monkeypatch.setattr(prefetch, "GROWTH", 1)
    monkeypatch.setattr(prefetch, "MAX_ROUNDS", 200)


# ---------------------------------------------------------------------------------------------- files
def write_daily(path: Path, day: int, ny: int = 600, nx: int = 1200) -> None:
    """The issue's daily file, smaller: two zlib int16 variables of one chunk each, time unlimited."""
    rng = np.random.default_rng(day)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("lat", ny)
        ds.createDimension("lon", nx)
        time_ = ds.createVariable("time", "i4", ("time",))
        time_.units = "days since 2020-01-01"
        time_[:] = [day]
        ds.createVariable("lat", "f4", ("lat",))[:] = np.linspace(-89.95, 89.95, ny)
        ds.createVariable("lon", "f4", ("lon",))[:] = np.linspace(-179.95, 179.95, nx)
        for name in ("sst", "mask"):
            v = ds.createVariable(
                name, "i2", ("time", "lat", "lon"), zlib=True, complevel=1, chunksizes=(1, ny, nx)
            )
            v.scale_factor, v.long_name = 0.01, name
            v[0] = rng.integers(-2000, 3000, size=(ny, nx), dtype="i2")
        ds.title = "daily"


def write_rich(path: Path) -> None:
    """Groups in groups, many attributes (dense storage), many variables (dense links), NC_STRING, a
    chunk index of several levels, metadata written between data (continuation blocks far away)."""
    rng = np.random.default_rng(3)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("y", 60)
        ds.createDimension("x", 80)
        for a in range(20):
            setattr(ds, f"global_{a}", f"global attribute {a} " * 4)
        ds.createVariable("time", "f8", ("time",))[:] = np.arange(70)
        deep = ds.createVariable("deep", "f4", ("time", "y", "x"), zlib=True, chunksizes=(1, 30, 40))
        deep[:] = rng.standard_normal((70, 60, 80)).astype("f4")  # 280 chunks: a two-level B-tree
        for g in ("sea", "land"):
            group = ds.createGroup(g)
            group.description = f"the {g} group"
            inner = group.createGroup("detail")
            inner.level = np.int16(2)
            for k in range(10):
                v = group.createVariable(
                    f"{g}{k}", "f4", ("time", "y", "x"), zlib=True, chunksizes=(10, 60, 80)
                )
                for a in range(12):
                    setattr(v, f"attribute_{a}", f"value {a} of {g}{k}")
                v.valid_range = np.array([-5, 5], dtype="f4")
                v[:20] = rng.standard_normal((20, 60, 80)).astype("f4")
            inner.createVariable("w", "i2", ("y", "x"), zlib=True)[:] = rng.integers(0, 99, (60, 80))
            inner.createVariable("names", str, ("x",))[:] = np.array(
                [f"n{i}" for i in range(80)], dtype=object
            )
        ds.history = "attributes added after the data"


def write_refused(path: Path) -> None:
    """What NCZarr cannot hold (refused) or reference (loaded), as test_virtualize's awkward file."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("n", 3)
        ds.createVariable("fine", "i4", ("n",))[:] = [1, 2, 3]
        ds.createVariable(
            "compound", ds.createCompoundType(np.dtype([("a", "i4"), ("b", "f8")]), "pair"), ("n",)
        )
        ds.createVariable(
            "enum", ds.createEnumType("u1", "colour", {"red": 0, "green": 1}), ("n",), fill_value=0
        )
        ds.createVariable("vlen", ds.createVLType("i4", "ragged"), ("n",))
        ds.createVariable("text", str, ("n",))[:] = np.array(["a", "bb", "ccc"], dtype=object)
        ds.createVariable("checked8", "f8", ("n",), shuffle=True, fletcher32=True, zlib=True)[:] = [1, 2, 3]
    with h5py.File(path, "a") as raw:
        raw.create_dataset("lzf", data=np.arange(100, dtype="i4"), chunks=(10,), compression="lzf")
        masked = raw.create_dataset(
            "masked", data=np.arange(100, dtype="i4"), chunks=(10,), compression="gzip"
        )
        masked.id.write_direct_chunk((10,), np.arange(10, 20, dtype="i4").tobytes(), filter_mask=1)
        raw["fine"].attrs["odd"] = np.zeros(1, dtype=[("a", "i4"), ("b", "f4")])


def write_plain(path: Path) -> None:
    """An h5py file: no dimension scales (phony dimensions), a user block, a soft link."""
    with h5py.File(path, "w", userblock_size=512) as raw:
        raw.create_dataset("a", data=np.arange(12, dtype="i4").reshape(3, 4))
        raw.create_dataset("square", data=np.arange(9.0).reshape(3, 3))
        raw.create_dataset("big", data=np.arange(300000, dtype=">f8"))
        raw.attrs["title"] = "plain"
        raw["alias"] = h5py.SoftLink("/a")


def write_plugins(path: Path) -> None:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", 60)
        ds.createDimension("x", 100)
        for compression in ("zstd", "bzip2", "blosc_lz4"):
            if getattr(netCDF4, f"__has_{compression.split('_')[0]}_support__", False):
                v = ds.createVariable(
                    compression, "f8", ("y", "x"), chunksizes=(20, 50), compression=compression
                )
                v[:] = (np.arange(6000, dtype="f8").reshape(60, 100) * 1.37) % 97


WRITERS = {
    "filters": lambda path: write_compressed(path),
    "daily": lambda path: write_daily(path, 0),
    "rich": write_rich,
    "refused": write_refused,
    "plain": write_plain,
    "plugins": write_plugins,
}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """``made(name)``: the file of that name (corpus or writer), made once for the module."""
    folder = tmp_path_factory.mktemp("made")
    paths: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in paths:
            if name in WRITERS:
                paths[name] = folder / f"{name}.nc"
                WRITERS[name](paths[name])
            else:
                paths[name] = ncgen(name, folder)
        return paths[name]

    return make


ALL = [*CORPUS, *WRITERS]
# Full parses and fetches (after the first 64 KiB) a file may take: one parse (the probes find what it
# needs) and two fetches at most, but for the file whose metadata was written between its data (each
# object's header, attributes and links far from the last)
LIMITS = {"rich": (2, 9)}


# ----------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", ALL)
def test_the_model_read_in_rounds_equals_the_direct_parse(made, name, no_fallback):
    rounds = assert_same_model(made(name))
    most_parses, most_fetches = LIMITS.get(name, (1, 2))
    assert rounds.rounds <= most_parses and rounds.requests <= most_fetches, (rounds.rounds, rounds.requests)


@pytest.mark.parametrize("probing", [True, False], ids=["probes", "parses only"])
@pytest.mark.parametrize("name", ALL)
def test_the_model_is_the_same_when_every_read_ahead_is_tiny(made, name, tiny_reads, probing, monkeypatch):
    """Nothing held but what each round asked for: dozens of rounds, each passing over what failed
    (with the probes finding most of it, or, without them, the full parses)."""
    if not probing:
        monkeypatch.setattr(hdf5, "_probe", lambda h5py, fileobj: None)
    path = made(name)
    rounds = assert_same_model(path, first=0)
    assert (rounds.rounds if not probing else rounds.probes + rounds.rounds) > 3  # many rounds
    print(f"{name}: {rounds.probes} probes, {rounds.rounds} parses, {rounds.requests} fetches")


def test_a_daily_file_takes_one_fetch_after_the_first_read(tmp_path, no_fallback):
    """The issue's file: all but the second variable's chunk index lies in the first 64 KiB."""
    path = tmp_path / "day.nc"
    write_daily(path, 0)
    with h5py.File(path) as raw:
        assert raw["mask"].id.get_chunk_info(0).byte_offset > 64 << 10  # the index is far
    rounds = assert_same_model(path)
    assert (rounds.probes, rounds.rounds, rounds.requests, rounds.ranges) == (1, 1, 1, 1)
    assert rounds.fetched <= 16 << 10


def test_a_deep_chunk_index_is_fetched_a_level_at_a_time_not_a_round_a_leaf(tmp_path, no_fallback):
    path = tmp_path / "deep.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("y", 64)
        ds.createDimension("x", 64)
        v = ds.createVariable("v", "f4", ("time", "y", "x"), zlib=True, chunksizes=(1, 16, 16))
        rng = np.random.default_rng(0)
        for step in range(100):  # 1,600 chunks: leaves spread between the data
            v[step] = rng.standard_normal((64, 64)).astype("f4")
    with h5py.File(path) as raw:
        assert raw["v"].id.get_num_chunks() == 1600
    rounds = assert_same_model(path, first=64 << 10)
    assert rounds.rounds == 1 and rounds.requests <= 2  # the root's children in one call


def test_files_parsed_on_threads_wait_for_their_fetches_together(tmp_path, no_fallback):
    """h5py's lock is never held while a fetch waits: 50 files of one fetch each (between the probe and
    the parse), 40 ms a fetch, 16 threads take little more than the same parses without any wait
    (serialised waits would add 2 s)."""
    path = tmp_path / "day.nc"
    write_daily(path, 0)

    def parse_all(delay: float) -> tuple[float, int]:
        sources = [Fetching(path, delay=delay) for _ in range(50)]
        try:
            started = time.perf_counter()
            with ThreadPoolExecutor(16) as pool:
                parsed = list(pool.map(lambda s: hdf5.parse_remote(s, OPTIONS), sources))
            elapsed = time.perf_counter() - started
            for item in parsed:
                item.close()
        finally:
            for source in sources:
                source.close()
        return elapsed, sum(len(s.calls) for s in sources)

    parse_all(0.0)  # warm
    unwaited, _ = parse_all(0.0)
    delay = 0.04
    elapsed, fetches = parse_all(delay)
    assert fetches == 50  # one a file
    serial = fetches * delay  # what waiting with the lock held would add: 2 s
    waited = elapsed - unwaited  # ideally 4 waves of 16 files: 0.16 s
    assert waited < serial / 4, f"{elapsed:.2f} s ({unwaited:.2f} s without waits) for {fetches} fetches"


def test_waiting_inside_h5py_would_serialise_the_same_parses(tmp_path):
    """The contrast: a file object that waits for its bytes while h5py reads (the direct parse of a remote
    file) makes 8 threads no faster than one."""
    import io

    path = tmp_path / "day.nc"
    write_daily(path, 0)
    data = path.read_bytes()

    class Slow(io.RawIOBase):
        def __init__(self) -> None:
            self.position = 0

        def readable(self):
            return True

        def seekable(self):
            return True

        def seek(self, offset, whence=0):
            self.position = (0, self.position, len(data))[whence] + offset
            return self.position

        def tell(self):
            return self.position

        def readinto(self, buffer):
            time.sleep(0.01)
            part = data[self.position : self.position + len(buffer)]
            buffer[: len(part)] = part
            self.position += len(part)
            return len(part)

    def parse_once(_) -> None:
        with h5py.File(Slow(), "r") as raw:
            raw["mask"].id.get_chunk_info(0)

    started = time.perf_counter()
    parse_once(0)
    one = time.perf_counter() - started
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(parse_once, range(8)))
    eight = time.perf_counter() - started
    assert eight > 6 * one  # the lock: the eight waited one after another


@pytest.mark.parametrize("damage", ["truncated", "corrupt_head", "corrupt_far", "not_hdf5_after_all"])
def test_a_damaged_file_is_a_format_error_naming_it_after_few_rounds(tmp_path, damage):
    path = tmp_path / "day.nc"
    write_daily(path, 0)
    data = bytearray(path.read_bytes())
    with h5py.File(path) as raw:
        far = raw["mask"].id.get_chunk_info(0)
    if damage == "truncated":
        data = data[: 40 << 10]
    elif damage == "corrupt_head":
        rng = np.random.default_rng(1)
        for at in rng.integers(100, 6000, 300):
            data[at] = int(rng.integers(256))
    elif damage == "corrupt_far":  # the far chunk index: its root node overwritten
        index = data.find(b"TREE", 64 << 10)
        assert 64 << 10 < index < far.byte_offset
        data[index : index + 3136] = os.urandom(3136)
    else:
        data[8:4096] = bytes(4088)
    path.write_bytes(bytes(data))
    parsed = None
    started = time.perf_counter()
    with pytest.raises(FormatError, match=str(path.resolve())):
        parsed, _, _ = remote_parse(path)
    assert parsed is None
    assert time.perf_counter() - started < 10


def test_the_rounds_are_bounded_and_then_the_file_is_parsed_directly(made, monkeypatch):
    path = made("rich")
    monkeypatch.setattr(prefetch, "MAX_ROUNDS", 1)
    parsed, rounds, _ = remote_parse(path)
    direct = direct_parse(path)
    try:
        assert rounds.rounds == 1 and describe(parsed) == describe(direct)
    finally:
        parsed.close()
        direct.close()


def test_rounds_leave_no_hdf5_file_open(made, tiny_reads):
    path = made("rich")
    before = h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_ALL)
    parsed, rounds, _ = remote_parse(path, first=0)
    assert rounds.probes + rounds.rounds > 10
    parsed.close()
    assert h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_ALL) == before


def test_values_loaded_after_the_parse_come_through_the_source(tmp_path, no_fallback):
    """Large variables stored as values are read when loaded, by h5py reading the source itself."""
    path = tmp_path / "refused.nc"
    write_refused(path)
    with h5py.File(path, "a") as raw:
        raw.create_dataset("big_lzf", data=np.arange(40000, dtype="i4"), chunks=(1000,), compression="lzf")
    parsed, _, _ = remote_parse(path)
    try:
        storage = parsed.root.variables["big_lzf"].storages[0]
        assert not isinstance(storage.values, Constant)  # too large to be read while parsing
        assert np.array_equal(storage.values(), np.arange(40000, dtype="i4"))
    finally:
        parsed.close()


# --------------------------------------------------------------------------------------------- over HTTP
@pytest.fixture
def web(monkeypatch):
    from test_manifest_http import PROXY_VARIABLES, serving

    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "*")
    with serving() as server:
        yield server


def _gets(server, path: str) -> int:
    with server.lock:
        return sum(1 for method, where, *_ in server.requests if method == "GET" and where == path)


def _requests(server, path: str) -> int:
    with server.lock:
        return sum(1 for _, where, *_ in server.requests if where == path)


@pytest.mark.parametrize("name", ALL)
def test_over_http_the_model_equals_the_local_one(made, web, name, no_fallback):
    from nczmap.integrations.virtualize.sources import source_file

    path = made(name)
    web.files[f"/data/{name}.nc"] = path.read_bytes()
    source = source_file(f"{web.root}/data/{name}.nc")
    try:
        parsed = hdf5.parse(source, OPTIONS)
        gets = _gets(web, f"/data/{name}.nc")  # describe() below reads large variables' values too
        try:
            expected = direct_parse(path)
            assert describe(parsed, values=False) == describe(expected, values=False)
            expected.close()
        finally:
            parsed.close()
    finally:
        source.close()
    # the first read and a fetch; the scattered file: its ranges (its ~30 ranges in 6 fetches, each range
    # a GET unless the source merges it with a neighbour)
    assert gets <= (40 if name == "rich" else 3), gets


def test_daily_files_over_http_take_at_most_three_requests_each(tmp_path, web, no_fallback):
    from nczmap.integrations.virtualize import virtualize

    sources = []
    for day in range(4):
        path = tmp_path / f"day{day}.nc"
        write_daily(path, day)
        web.files[f"/data/day{day}.nc"] = path.read_bytes()
        sources.append(f"{web.root}/data/day{day}.nc")
    local = tmp_path / "local.json"
    virtualize(sorted(tmp_path.glob("day*.nc")), local, concat="time")
    refs = tmp_path / "refs.json"
    virtualize(sources, refs, concat="time")
    for day in range(4):
        gets, requests = _gets(web, f"/data/day{day}.nc"), _requests(web, f"/data/day{day}.nc")
        assert gets <= 2 and requests <= 3, f"day{day}: {requests} requests, {gets} GETs"  # first read, fetch
    import json

    ours, theirs = json.loads(refs.read_text())["refs"], json.loads(local.read_text())["refs"]
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():
        if isinstance(value, list):
            assert value[1:] == theirs[key][1:], key
        else:
            assert value == theirs[key], key


def test_an_hdf5_file_over_http_that_is_damaged_is_a_format_error_naming_it(tmp_path, web):
    from nczmap.integrations.virtualize.sources import source_file

    path = tmp_path / "day.nc"
    write_daily(path, 0)
    data = bytearray(path.read_bytes())
    index = data.find(b"TREE", 64 << 10)
    data[index : index + 64] = bytes(64)
    web.files["/data/bad.nc"] = bytes(data)
    source = source_file(f"{web.root}/data/bad.nc")
    try:
        with pytest.raises(FormatError, match=r"/data/bad\.nc"):
            hdf5.parse(source, OPTIONS)
    finally:
        source.close()
    assert _gets(web, "/data/bad.nc") <= 3


# ------------------------------------------------------------------------------------------ the pieces
def test_held_spans_merge_and_answer_exactly():
    held = prefetch.Held()
    held.add(10, b"abcdef")
    held.add(30, b"XYZ")
    held.add(14, b"efgh")  # overlaps and extends the first
    assert held.get(10, 8) == b"abcdefgh" and held.get(12, 3) == b"cde"
    assert held.get(9, 2) is None and held.get(17, 2) is None
    assert held.missing(0, 40) == [(0, 10), (18, 30), (33, 40)]
    held.add(18, bytes(12))  # bridges the gap: one span
    assert held.starts == [10] and held.get(16, 17) == b"gh" + bytes(12) + b"XYZ"
    assert held.missing(10, 33) == [] and held.nbytes == 23


def test_a_miss_is_recorded_and_raised_not_guessed(tmp_path):
    path = tmp_path / "day.nc"
    write_daily(path, 0)
    source = Fetching(path, first=4096)
    try:
        fileobj = prefetch.HeldFile(source, prefetch.Held())
        buffer = bytearray(8)
        assert fileobj.readinto(buffer) == 8 and bytes(buffer) == b"\x89HDF\r\n\x1a\n"
        fileobj.seek(10000)
        with pytest.raises(prefetch.Missing):
            fileobj.readinto(bytearray(100))
        assert fileobj.misses == [(10000, 100)]
        fileobj.seek(source.size + 10)
        assert fileobj.readinto(bytearray(16)) == 0  # past the end: nothing (HDF5 reads zeros)
    finally:
        source.close()


def test_internal_chunk_index_nodes_name_their_children(tmp_path):
    """What the prefetcher reads in a chunk B-tree node: the children of an internal node; the chunks of
    a small variable's only leaf; nothing below a leaf among many, or below what is not such a node."""
    path = tmp_path / "deep.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("t", None)
        ds.createDimension("x", 8)
        v = ds.createVariable("v", "i2", ("t", "x"), chunksizes=(1, 8))
        v[0:200] = np.ones((200, 8), dtype="i2")  # 200 chunks: a root over 4 leaves
        small = ds.createVariable("small", "i2", ("t", "x"), chunksizes=(2, 8))
        small[0:10] = np.ones((10, 8), dtype="i2")  # 5 chunks: one leaf, the root
    data = path.read_bytes()
    with h5py.File(path) as raw:
        offsets = {
            name: {raw[name].id.get_chunk_info(i).byte_offset for i in range(n)}
            for name, n in (("v", 200), ("small", 5))
        }
    size = 24 + 65 * 32 + 64 * 8  # K = 32, keys of 8 + 8 × (2 + 1) bytes
    nodes = []
    at = data.find(b"TREE")
    while at >= 0:
        if data[at + 4] == 1:
            nodes.append(at)
        at = data.find(b"TREE", at + 1)
    below = {at: prefetch.btree_below(data[at : at + size], len(data)) for at in nodes}
    [root] = [at for at in nodes if data[at + 5] == 1]
    leaves = {child for child, n in below[root]}
    assert len(leaves) == 4 and all(n == size for _, n in below[root]) and leaves <= set(nodes)
    assert all(below[leaf] == [] for leaf in leaves)  # chunks of a large variable: not fetched
    [only] = [at for at in nodes if at != root and at not in leaves]
    assert {offset for offset, _ in below[only]} == offsets["small"] and all(n == 32 for _, n in below[only])
    assert prefetch.btree_below(b"TREE" + bytes(100), len(data)) == []
    assert prefetch.btree_below(b"NOPE" + data[root + 4 : root + size], len(data)) == []
