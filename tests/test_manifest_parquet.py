"""kerchunk's Parquet references (fsspec's LazyReferenceMapper layout), read and written by nczmap, checked
against fsspec's own reader and writer and zarr (no mocks)."""

from __future__ import annotations

import base64
import json
import math
import subprocess
import sys

import numpy as np
import pytest

fsspec = pytest.importorskip("fsspec")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
from fsspec.implementations.reference import LazyReferenceMapper  # noqa: E402

import nczmap  # noqa: E402
from nczmap import FormatError  # noqa: E402
from nczmap.errors import DatasetNotFound, EmptyError  # noqa: E402
from nczmap.manifest import kerchunk_json, kerchunk_parquet  # noqa: E402
from nczmap.manifest.model import WHOLE, ArrayReferences, Manifest, Reference  # noqa: E402

pytestmark = [  # pandas 3 deprecates the fastparquet engine that fsspec and kerchunk still default to
    pytest.mark.filterwarnings("ignore:The 'fastparquet' engine is deprecated"),
    pytest.mark.filterwarnings("ignore:The 'future.infer_string' option is deprecated"),
]


# ---------------------------------------------------------------------------------------------- helpers
def zarray(shape, chunks, dtype="<i2", fill=-1, **extra) -> dict:
    return {
        "shape": shape,
        "chunks": chunks,
        "dtype": dtype,
        "compressor": None,
        "fill_value": fill,
        "filters": None,
        "order": "C",
        "zarr_format": 2,
        **extra,
    }


def chunk_bytes(values: np.ndarray, chunks: tuple[int, ...], index: tuple[int, ...], fill) -> bytes:
    """The bytes of chunk ``index`` of ``values`` (edge chunks padded with ``fill``, as zarr stores them)."""
    block = np.full(chunks, fill, dtype=values.dtype)
    spans = zip(index, chunks, values.shape, strict=True)
    region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in spans)
    part = values[region]
    block[tuple(slice(0, n) for n in part.shape)] = part
    return block.tobytes()


ENGINES = ("fastparquet", "pyarrow")  # fsspec's Parquet engines; fastparquet is its default (and kerchunk's)


WRITTEN_WITH: dict[str, str] = {}  # reference directory -> the engine fsspec wrote it with


def lazy_mapper(root, engine: str | None = None) -> LazyReferenceMapper:
    """fsspec's mapper, reading with ``engine``: by default the one that wrote the directory if fsspec did
    (its engines do not read each other's files: fastparquet reads pyarrow's null ``raw`` as NaN), else
    fastparquet, fsspec's default."""
    engine = engine or WRITTEN_WITH.get(str(root), "fastparquet")
    return LazyReferenceMapper(str(root), fs=fsspec.filesystem("file"), engine=engine)


def reference_fs(root, asynchronous: bool = False, engine: str | None = None):
    """fsspec's ReferenceFileSystem over a Parquet reference directory (see :func:`lazy_mapper`).

    With fastparquet as ``fsspec.filesystem("reference", fo=str(root), remote_protocol="file")`` does."""
    mapper = lazy_mapper(root, engine)
    return fsspec.filesystem("reference", fo=mapper, remote_protocol="file", asynchronous=asynchronous)


def zarr_array(root, array: str, engine: str | None = None):
    """zarr reading ``array`` through fsspec's ReferenceFileSystem.

    (``zarr.open_array(fs.get_mapper(array))`` would rebuild the file system from its JSON form, which a
    LazyReferenceMapper does not have: the store is made directly.)"""
    zarr = pytest.importorskip("zarr")
    from zarr.storage import FsspecStore

    store = FsspecStore(reference_fs(root, asynchronous=True, engine=engine), path=array, read_only=True)
    return zarr.open_array(store, mode="r", zarr_format=2)


def fsspec_read(fs, key: str) -> bytes | None:
    """What fsspec's ReferenceFileSystem serves for ``key``; None for a missing chunk.

    Known fsspec issue (2026.9 with pandas 3): a null ``path`` in a record comes back from pandas as NaN, not
    None, so fsspec returns ``[nan]`` and fails on it (TypeError) instead of reporting a missing key; such a
    reference is taken here for the missing chunk it stands for."""
    try:
        ref = fs.references[key]
    except KeyError:
        return None
    if isinstance(ref, list) and not isinstance(ref[0], str):
        return None
    return fs.cat_file(key)


def same(mine: bytes | None, theirs: bytes | None, key: str) -> bool:
    """Equal bytes; for metadata (``.z*``) equal JSON: fsspec serialises a metadata value with ujson when
    it is installed (compact, ``/`` escaped), with the standard ``json.dumps`` otherwise, as nczmap does."""
    if key.rsplit("/", 1)[-1].startswith(".z") and mine is not None and theirs is not None:
        return json.loads(mine) == json.loads(theirs)
    return mine == theirs


def ours(zmap, key: str) -> bytes | None:
    return zmap.read("/" + key) if zmap.exists("/" + key) else None


def chunk_keys(array: str, grid: tuple[int, ...]) -> list[str]:
    if not grid:
        return [f"{array}/0"]
    return [f"{array}/" + ".".join(map(str, i)) for i in np.ndindex(*grid)]


def directory_io(root):
    """The ``read``/``write`` functions the manifest driver gives the format, over a local directory."""

    def read(name: str) -> bytes | None:
        path = root / name
        return path.read_bytes() if path.is_file() else None

    def write(name: str, data: bytes) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    return read, write


def manifest_url(root) -> str:
    return root.as_uri() + "#mode=zarr,manifest"


# ---------------------------------------------------------------------------------------------- fsspec writes
T = np.arange(20, dtype="<i2") * 3  # 10 chunks of 2
M = (np.arange(20, dtype="<i2") + 100).reshape(5, 4)  # chunks (2, 3): a 3 x 2 grid, edges padded
S = np.array(42, dtype="<i2")  # 0-d
FILL = -1


@pytest.fixture(params=ENGINES)
def kerchunked(tmp_path, request):
    """A dataset referenced by Parquet references that fsspec's LazyReferenceMapper wrote (record size 3,
    with each of its engines):
    inline chunks, ranges of a local file (as a path and as a file:// URL), a whole-file reference, missing
    chunks (inside records and a whole absent record), a 2-D array in a group and a 0-d array.

    Returns the reference directory and the values each array should read as."""
    blob, whole, root = tmp_path / "data.bin", tmp_path / "whole.bin", tmp_path / "refs.parq"
    content = bytearray(b"HEADER")
    refs: dict[str, object] = {}

    def ranged(key: str, data: bytes, url: str = str(blob)) -> None:
        refs[key] = [url, len(content), len(data)]
        content.extend(data + b"--gap--")

    t = lambda i: chunk_bytes(T, (2,), (i,), FILL)  # noqa: E731
    m = lambda i, j: chunk_bytes(M, (2, 3), (i, j), FILL)  # noqa: E731
    refs["t/0"] = t(0)  # inline
    ranged("t/1", t(1))
    ranged("t/2", t(2), blob.as_uri())
    whole.write_bytes(t(3))
    refs["t/3"] = [str(whole)]  # the whole file
    ranged("t/5", t(5))  # t/4 missing inside record 1; t/6..8 missing: record 2 never written
    ranged("t/9", t(9))  # the last record, padded by fsspec
    ranged("g/m/0.0", m(0, 0))
    refs["g/m/0.1"] = m(0, 1)
    ranged("g/m/1.1", m(1, 1))  # g/m/1.0 and g/m/2.1 missing
    ranged("g/m/2.0", m(2, 0))
    ranged("s/0", S.tobytes())
    blob.write_bytes(bytes(content))

    mapper = LazyReferenceMapper.create(
        str(root), fs=fsspec.filesystem("file"), record_size=3, engine=request.param
    )
    WRITTEN_WITH[str(root)] = request.param
    mapper[".zgroup"] = json.dumps({"zarr_format": 2})
    mapper["t/.zarray"] = json.dumps(zarray([20], [2]))
    mapper["t/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["x"], "units": "m"})
    mapper["g/.zgroup"] = json.dumps({"zarr_format": 2})
    mapper["g/m/.zarray"] = json.dumps(zarray([5, 4], [2, 3]))
    mapper["g/m/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["y", "z"]})
    mapper["s/.zarray"] = json.dumps(zarray([], []))
    mapper["s/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": []})
    for key, value in refs.items():
        mapper[key] = value
    mapper.flush()
    assert not (root / "t" / "refs.2.parq").exists()  # the absent record is part of the test

    t_values = T.copy()
    t_values[[8, 9, 12, 13, 14, 15, 16, 17]] = FILL  # chunks 4, 6, 7, 8
    m_values = M.copy()
    m_values[2:4, 0:3] = FILL  # chunk 1.0
    m_values[4:, 3:] = FILL  # chunk 2.1
    return root, {"t": t_values, "g/m": m_values, "s": S}


GRIDS = {"t": (10,), "g/m": (3, 2), "s": ()}


def test_fsspec_parquet_references_read_key_for_key(kerchunked):
    root, _ = kerchunked
    fs = reference_fs(root)
    metadata = list(json.loads((root / ".zmetadata").read_bytes())["metadata"])
    keys = metadata + [key for array, grid in GRIDS.items() for key in chunk_keys(array, grid)]
    with nczmap.open_map(manifest_url(root), "r") as zmap:
        for key in keys:
            assert same(ours(zmap, key), fsspec_read(fs, key), key), key
        # every kind of entry is there, as the model holds it
        table = zmap.manifest.arrays["t"]
        assert zmap.manifest.get("t/0") == chunk_bytes(T, (2,), (0,), FILL)
        assert zmap.reference("/t/3") == Reference(str(root.parent / "whole.bin"), 0, WHOLE)
        assert zmap.reference("/t/2").url == (root.parent / "data.bin").as_uri()
        present = [True] * 4 + [False, True] + [False] * 3 + [True]
        assert [zmap.exists(f"/t/{i}") for i in range(10)] == present
        # pages are the record files (record 2 has none), each of its URLs and a row per chunk
        assert table.page_size == 3 and list(table.numbers()) == [0, 1, 3]
        assert set(table.page(1).urls) == {str(root.parent / "whole.bin"), str(root.parent / "data.bin")}
        assert table.page(2).size == 0
        assert table.page(0).where.dtype == np.int32 and table.page(3).size == 1  # padding dropped
        assert sorted(zmap.search("/")) == [".zgroup", "g", "s", "t"]
        assert zmap.search("/t") == sorted([".zarray", ".zattrs", "0", "1", "2", "3", "5", "9"])
        with pytest.raises(EmptyError):
            zmap.read("/t/4")


def test_fsspec_parquet_references_open_as_a_dataset(kerchunked):
    root, expected = kerchunked
    with nczmap.open_dataset(manifest_url(root)) as ds:
        np.testing.assert_array_equal(ds.variables["t"][...], expected["t"])
        np.testing.assert_array_equal(ds.groups["g"].variables["m"][...], expected["g/m"])
        np.testing.assert_array_equal(ds.variables["s"][...], expected["s"])
        assert ds.variables["t"].attrs["units"] == "m"
    # zarr through fsspec reads the same values where fsspec can (see fsspec_read: not a chunk missing
    # inside a record)
    t = zarr_array(root, "t")
    np.testing.assert_array_equal(t[0:8], expected["t"][0:8])
    np.testing.assert_array_equal(t[10:20], expected["t"][10:20])  # chunks 6-8: an absent record
    s = zarr_array(root, "s")
    np.testing.assert_array_equal(s[...], expected["s"])


# ---------------------------------------------------------------------------------------------- nczmap writes
@pytest.mark.parametrize("engine", ENGINES)
def test_nczmap_writes_parquet_that_fsspec_and_zarr_read(tmp_path, engine):
    values = np.arange(12, dtype="<f8").reshape(3, 4) * 1.5  # chunks (1, 2): 3 x 2 grid
    blob = tmp_path / "data.bin"
    blob.write_bytes(b"\x00" * 8 + values[1:].tobytes())  # rows 1, 2 (chunk data is row halves)
    (tmp_path / "whole.bin").write_bytes(values[0, 2:].tobytes())
    root = tmp_path / "out.parq"
    with nczmap.open_map(manifest_url(root), "w") as zmap:
        zmap.write("/.zgroup", json.dumps({"zarr_format": 2}).encode())
        zmap.write("/v/.zarray", json.dumps(zarray([3, 4], [1, 2], "<f8", None)).encode())
        zmap.write("/v/.zattrs", json.dumps({"_ARRAY_DIMENSIONS": ["y", "x"]}).encode())
        zmap.write("/v/0.0", values[0, :2].tobytes())  # inline
        zmap.set_reference("/v/0.1", str(tmp_path / "whole.bin"))  # the whole file
        for i in (1, 2):
            for j in (0, 1):
                start = 8 + ((i - 1) * 4 + j * 2) * 8
                zmap.set_reference(f"/v/{i}.{j}", "data.bin", start, 16)
        zmap.write("/w/.zarray", json.dumps(zarray([4], [2], "<i2", 7)).encode())
        zmap.write("/w/1", np.array([5, 6], "<i2").tobytes())  # w/0 missing
        zmap.write("/notes.txt", b"not JSON")
    assert sorted(p.name for p in root.iterdir()) == [".zmetadata", "v", "w"]
    assert json.loads((root / ".zmetadata").read_bytes())["metadata"]["notes.txt"] == "not JSON"

    fs = reference_fs(root, engine=engine)
    with nczmap.open_map(manifest_url(root), "r") as zmap:
        for key in [".zgroup", "v/.zarray", "v/.zattrs", "w/.zarray", *chunk_keys("v", (3, 2)), "w/0", "w/1"]:
            assert same(ours(zmap, key), fsspec_read(fs, key), key), key
        assert zmap.read("/notes.txt") == b"not JSON"  # fsspec serves it as JSON text: '"not JSON"'
    assert fs.references["v/0.1"] == [(tmp_path / "whole.bin").resolve().as_uri()]
    _, offset, size = fs.references["v/1.0"]
    assert type(offset) is not float and type(size) is not float and (int(offset), int(size)) == (8, 16)
    np.testing.assert_array_equal(zarr_array(root, "v", engine)[...], values)
    with nczmap.open_dataset(manifest_url(root)) as ds:
        np.testing.assert_array_equal(ds.variables["v"][...], values)
        np.testing.assert_array_equal(ds.variables["w"][...], [7, 7, 5, 6])


def test_updating_a_parquet_manifest_rewrites_its_records(kerchunked):
    root, expected = kerchunked
    (root.parent / "new.bin").write_bytes(np.array([-5, -6], "<i2").tobytes())
    with nczmap.open_map(manifest_url(root), "r+") as zmap:
        zmap.set_reference("/t/4", "new.bin", 0, 4)  # was missing inside record 1
        zmap.write("/t/7", np.array([70, 71], "<i2").tobytes())  # record 2, which had no file
        zmap.delete("/t/9")
    # saved in its own layout (record size 3): record 2 now written, record 3 (only t/9) removed
    assert json.loads((root / ".zmetadata").read_bytes())["record_size"] == 3
    assert sorted(p.name for p in (root / "t").iterdir()) == ["refs.0.parq", "refs.1.parq", "refs.2.parq"]
    assert pq.ParquetFile(root / "t" / "refs.0.parq").metadata.num_rows == 3
    fs = reference_fs(root)
    with nczmap.open_map(manifest_url(root), "r") as zmap:
        for key in chunk_keys("t", (10,)):
            assert same(ours(zmap, key), fsspec_read(fs, key), key), key
    with nczmap.open_dataset(manifest_url(root)) as ds:
        t = expected["t"].copy()
        t[8:10], t[14:16], t[18:20] = [-5, -6], [70, 71], FILL
        np.testing.assert_array_equal(ds.variables["t"][...], t)
        np.testing.assert_array_equal(ds.groups["g"].variables["m"][...], expected["g/m"])


def test_append_mode_creates_a_missing_parquet_manifest(tmp_path):
    root = tmp_path / "new.parq"
    with nczmap.open_map(manifest_url(root), "a") as zmap:
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
    assert json.loads(reference_fs(root).cat_file(".zgroup")) == {"zarr_format": 2}


# ---------------------------------------------------------------------------------------------- round trip
def test_json_to_parquet_to_json_keeps_every_entry(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * 4)
    refs: dict[str, object] = {
        ".zgroup": '{\n    "zarr_format": 2\n}',  # metadata as text, as kerchunk writes it
        "a/.zarray": zarray([25], [1], "|u1", 0),  # 25 chunks: 4 records of 7
        "a/.zattrs": {"_ARRAY_DIMENSIONS": ["x"]},
        "b/.zarray": json.dumps(zarray([3, 5], [2, 2], "|u1", 0)),  # a 2 x 3 grid
        "c/.zarray": zarray([], [], "|u1", 0),  # 0-d
        "c/0": ["{{u}}", 7, 1],  # a template
        "README": "free text, not JSON",
        "bin/blob": "base64:" + base64.b64encode(b"\xff\x00\xfe").decode(),
        "odd": "base64:" + base64.b64encode(b"base64:looks encoded").decode(),
        "b/0.0": "inline text chunk",
        "b/0.2": "base64:" + base64.b64encode(b"\x00\x01").decode(),
        "b/1.1": ["{{u}}"],
        "b/1.2": [str(data), 10, 5],
        "b/1.0": [str(data), 0, 0],  # empty: kerchunk would read [url, 0, 0] as the whole file
    }
    for i in range(25):
        if i % 5 == 3:
            continue  # missing
        if i % 5 == 4:
            refs[f"a/{i}"] = "base64:" + base64.b64encode(b"base64:" + bytes([i])).decode()
        elif i % 5 == 2:
            refs[f"a/{i}"] = [str(data)]
        else:
            refs[f"a/{i}"] = [data.as_uri(), i * 3, i + 1]
    document = {
        "version": 1,
        "templates": {"u": str(data)},
        "refs": refs,
        "nczmap": {"sources": {str(data): {"size": 1024}}},
    }
    original = kerchunk_json.load(json.dumps(document).encode(), "refs.json")

    root = tmp_path / "refs.parq"
    read, write = directory_io(root)
    kerchunk_parquet.dump(original, write, record_size=7)
    assert sorted(p.name for p in (root / "a").iterdir()) == [f"refs.{r}.parq" for r in range(4)]
    loaded = kerchunk_parquet.load(read, str(root))
    before, after = dict(original.references()), dict(loaded.references())
    assert list(before) == list(after)
    assert before.pop("b/1.0") == Reference(str(data), 0, 0) and after.pop("b/1.0") == b""  # same bytes
    for key, entry in before.items():
        if key.rsplit("/", 1)[-1].startswith(".z"):  # JSON objects: fsspec's json.dumps spelling
            assert json.loads(after[key]) == json.loads(entry), key
        else:
            assert after[key] == entry, key
    assert after["c/0"] == Reference(str(data), 7, 1)
    assert after["odd"] == b"base64:looks encoded"
    assert loaded.sources == {str(data): {"size": 1024}}
    assert json.loads((root / ".zmetadata").read_bytes())["nczmap"] == {"sources": loaded.sources}
    assert set(loaded.arrays) == {"a", "b", "c"}  # chunks in tables, not loose entries
    assert not [
        k for k in loaded.entries if k[:2] in ("a/", "b/", "c/") and not k.endswith((".zarray", ".zattrs"))
    ]

    again = kerchunk_json.load(kerchunk_json.dump(loaded), "again.json")
    assert dict(again.references()) == {**after, "b/1.0": b""}
    assert again.sources == loaded.sources

    # fsspec reads the same references from what nczmap wrote
    fs = reference_fs(root)
    for key, entry in after.items():
        if isinstance(entry, Reference):
            expected = [entry.url] if entry.length == WHOLE else [entry.url, entry.offset, entry.length]
            assert [v if isinstance(v, str) else int(v) for v in fs.references[key]] == expected, key
        elif not key.rsplit("/", 1)[-1].startswith(".") and key[:2] in ("a/", "b/", "c/"):
            assert fs.cat_file(key) == entry, key


def test_many_references_round_trip_as_columns(tmp_path):
    """The scalable path at a moderate size: one array's references as numpy columns, no per-chunk keys."""
    count = 200_000
    manifest = Manifest()
    manifest.entries["v/.zarray"] = json.dumps(zarray([count * 4], [4], "<i4", 0)).encode()
    offsets = np.arange(count, dtype=np.int64) * 16
    manifest.arrays["v"] = ArrayReferences.from_columns(
        (count,),
        ["file:///data/a.bin", "file:///data/b.bin"],
        (np.arange(count) % 2).astype(np.int32),
        offsets,
        np.full(count, 16, dtype=np.int64),
    )
    root = tmp_path / "big.parq"
    read, write = directory_io(root)
    kerchunk_parquet.dump(manifest, write)
    loaded = kerchunk_parquet.load(read, str(root))
    table = loaded.arrays["v"]
    assert len(loaded.cache) == 0  # opening read .zmetadata only
    assert loaded.get("v/199999") == Reference("file:///data/b.bin", 199999 * 16, 16)
    assert len(loaded.cache) == 1  # the last record, only
    entries = loaded.get_many([f"v/{i}" for i in range(count)])
    assert [e.url for e in entries[:4]] == ["file:///data/a.bin", "file:///data/b.bin"] * 2
    assert [e.offset for e in entries] == offsets.tolist() and {e.length for e in entries} == {16}
    assert list(table.numbers()) == list(range(20))  # records found by trying them (no listing given)
    assert loaded._sorted is None  # get() never needed the sorted key list


def test_reading_a_parquet_manifest_does_not_import_pandas(kerchunked):
    root, _ = kerchunked
    code = (
        "import sys, nczmap\n"
        f"with nczmap.open_map({manifest_url(root)!r}, 'r') as z:\n"
        "    assert z.read('/t/1')\n"
        "assert 'pyarrow' in sys.modules and 'pandas' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------- bad input
def _record_table(rows: int, **columns) -> bytes:
    table = pa.table(
        columns
        or {
            "path": pa.array(["x.bin"] * rows),
            "offset": pa.array([0] * rows, pa.int64()),
            "size": pa.array([1] * rows, pa.int64()),
            "raw": pa.nulls(rows, pa.binary()),
        }
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _overwrite(path, start: int, stop: int) -> None:
    """Garble bytes ``[start, stop)`` of a file: page headers and data, the footer left intact."""
    data = bytearray(path.read_bytes())
    data[start:stop] = b"\x07" * (stop - start)
    path.write_bytes(bytes(data))


def _metadata(root, **changes) -> None:
    document = json.loads((root / ".zmetadata").read_bytes())
    document.update(changes)
    (root / ".zmetadata").write_text(json.dumps(document))


BAD = {
    "corrupt parquet": ("t/refs.0.parq", lambda root: (root / "t/refs.0.parq").write_bytes(b"PAR1 garbage")),
    "truncated parquet": (
        "t/refs.1.parq",
        lambda root: (root / "t/refs.1.parq").write_bytes((root / "t/refs.1.parq").read_bytes()[:-30]),
    ),
    "corrupt pages": ("t/refs.1.parq", lambda root: _overwrite(root / "t/refs.1.parq", 4, 100)),
    "not parquet at all": ("t/refs.0.parq", lambda root: (root / "t/refs.0.parq").write_text("{}")),
    "wrong columns": (
        "t/refs.0.parq",
        lambda root: (root / "t/refs.0.parq").write_bytes(
            _record_table(3, a=pa.array([1, 2, 3]), b=pa.array(["x", "y", "z"]))
        ),
    ),
    "path without offset": (
        "g/m/refs.0.parq",
        lambda root: (root / "g/m/refs.0.parq").write_bytes(_record_table(3, path=pa.array(["a", "b", "c"]))),
    ),
    "wrong column type": (
        "t/refs.0.parq",
        lambda root: (root / "t/refs.0.parq").write_bytes(
            _record_table(
                3,
                path=pa.array([1, 2, 3]),
                offset=pa.array([0, 0, 0]),
                size=pa.array([1, 1, 1]),
                raw=pa.nulls(3, pa.binary()),
            )
        ),
    ),
    "too many rows": ("t/refs.0.parq", lambda root: (root / "t/refs.0.parq").write_bytes(_record_table(4))),
    "too few rows": ("t/refs.1.parq", lambda root: (root / "t/refs.1.parq").write_bytes(_record_table(2))),
    "negative offset": (
        "t/refs.0.parq",
        lambda root: (root / "t/refs.0.parq").write_bytes(
            _record_table(
                3,
                path=pa.array(["x", "y", "z"]),
                offset=pa.array([0, -4, 0]),
                size=pa.array([1, 1, 1]),
            )
        ),
    ),
    "metadata not JSON": (".zmetadata", lambda root: (root / ".zmetadata").write_text("{not json")),
    "no metadata object": (".zmetadata", lambda root: (root / ".zmetadata").write_text('{"record_size": 3}')),
    "record_size zero": (".zmetadata", lambda root: _metadata(root, record_size=0)),
    "record_size text": (".zmetadata", lambda root: _metadata(root, record_size="3")),
    "record_size absent": (
        ".zmetadata",
        lambda root: (root / ".zmetadata").write_text(json.dumps({"metadata": {}})),
    ),
    "zarray without chunks": (
        ".zmetadata",
        lambda root: _metadata(root, metadata={"t/.zarray": {"shape": [20]}}),
    ),
    "slash separator": (
        ".zmetadata",
        lambda root: _metadata(root, metadata={"t/.zarray": zarray([20], [2], dimension_separator="/")}),
    ),
    "array outside the directory": (
        ".zmetadata",
        lambda root: _metadata(root, metadata={"../t/.zarray": zarray([20], [2])}),
    ),
    "missing .zmetadata": (".zmetadata", lambda root: (root / ".zmetadata").unlink()),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_parquet_references_are_format_errors_naming_the_file(kerchunked, case):
    root, _ = kerchunked
    name, spoil = BAD[case]
    spoil(root)
    # .zmetadata is checked at open, a record file when its chunks are read
    with pytest.raises(FormatError) as info, nczmap.open_map(manifest_url(root), "r") as zmap:
        for array, grid in GRIDS.items():
            for key in chunk_keys(array, grid):
                zmap.exists("/" + key)
    assert f"{root}/{name}" in str(info.value)
    assert not isinstance(info.value, pa.ArrowException)
    assert info.value.__cause__ is None or not isinstance(info.value.__cause__, pa.ArrowException)
    if case == "missing .zmetadata":
        assert isinstance(info.value, DatasetNotFound)


def test_what_parquet_references_cannot_express_is_refused_on_dump(tmp_path):
    _, write = directory_io(tmp_path / "out.parq")

    def manifest(**entries) -> Manifest:
        m = Manifest()
        m.entries.update(entries)
        return m

    with pytest.raises(FormatError, match=r"'v'.*dimension_separator"):
        kerchunk_parquet.dump(
            manifest(**{"v/.zarray": json.dumps(zarray([4], [2], dimension_separator="/")).encode()}), write
        )
    with pytest.raises(FormatError, match="'loose'"):
        kerchunk_parquet.dump(manifest(loose=Reference("file:///x", 0, 4)), write)
    with pytest.raises(FormatError, match="v/1"):
        kerchunk_parquet.dump(
            manifest(
                **{"v/.zarray": json.dumps(zarray([4], [2])).encode(), "v/1": Reference("file:///x", 3)}
            ),
            write,
        )
    with pytest.raises(FormatError, match=r"'v/\.zarray'"):
        kerchunk_parquet.dump(manifest(**{"v/.zarray": Reference("file:///meta.json")}), write)
    assert not (tmp_path / "out.parq" / ".zmetadata").exists()


# ---------------------------------------------------------------------------------------------- huge grids
HUGE = {"1e9": [10**9], "1e15": [10**15], "1e6^3": [10**6] * 3, "2^63-1": [2**63 - 1]}
HUGE_CHILD = r"""
import json, resource, sys
import numpy, pyarrow.parquet, nczmap
from nczmap.manifest import kerchunk_json, kerchunk_parquet
from nczmap.zmap import manifest
url, first, last = sys.argv[1], sys.argv[2], sys.argv[3]
before = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
with nczmap.open_map(url, "r") as zmap:
    got = [zmap.read("/v/" + first), zmap.read("/v/" + last), zmap.exists("/v/" + last.replace("9", "8", 1))]
    listed = zmap.search("/v")
    buffers = [memoryview(bytearray(4)), memoryview(bytearray(4))]
    many = zmap.read_many_into([("/v/" + first, buffers[0]), ("/v/" + last, buffers[1])])
# VmHWM, not getrusage's ru_maxrss: that survives execve, so a child of a large process reports its peak
peak = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
print(json.dumps({"got": [g if isinstance(g, bool) else g.hex() for g in got], "listed": listed,
                  "many": many, "grown": peak - before}))
"""


def huge_manifests(tmp_path, grid: list[int]) -> tuple[str, str, str]:
    """A Parquet (record size 4) and a JSON manifest of an array over ``grid`` (chunks of one element) with
    two references, to its first and last chunk; and the last chunk's name."""
    (tmp_path / "data.bin").write_bytes(b"\x01\x02\x03\x04\x05\x06\x07\x08")
    count = math.prod(grid)
    last = ".".join(str(n - 1) for n in grid)
    za = zarray(grid, [1] * len(grid), "<i4", 0)
    root = tmp_path / "huge.parq"
    (root / "v").mkdir(parents=True)
    (root / ".zmetadata").write_text(json.dumps({"metadata": {"v/.zarray": za}, "record_size": 4}))
    records = {0: {0: 0}}
    records.setdefault((count - 1) // 4, {})[(count - 1) % 4] = 4
    for record, rows in records.items():
        offsets = [rows.get(row, 0) for row in range(4)]
        table = pa.table(
            {
                "path": pa.array([str(tmp_path / "data.bin") if row in rows else None for row in range(4)]),
                "offset": pa.array(offsets, pa.int64()),
                "size": pa.array([4 if row in rows else 0 for row in range(4)], pa.int64()),
                "raw": pa.nulls(4, pa.binary()),
            }
        )
        pq.write_table(table, root / "v" / f"refs.{record}.parq")
    first = ".".join("0" * len(grid))
    refs = {"v/.zarray": json.dumps(za), f"v/{first}": ["data.bin", 0, 4], f"v/{last}": ["data.bin", 4, 4]}
    (tmp_path / "huge.json").write_text(json.dumps({"version": 1, "refs": refs}))
    return manifest_url(root), (tmp_path / "huge.json").as_uri() + "#mode=zarr,manifest", last


@pytest.mark.parametrize("grid", list(HUGE.values()), ids=list(HUGE))
def test_huge_chunk_grids_cost_what_their_references_hold(tmp_path, grid):
    """B7: nothing is allocated per chunk of the grid, in Parquet (records come from the files present) or
    JSON: reading, listing and a batch read take memory for the references there are."""
    first, last = ".".join("0" * len(grid)), ".".join(str(n - 1) for n in grid)
    for url in huge_manifests(tmp_path, grid)[:2]:
        done = subprocess.run(
            [sys.executable, "-c", HUGE_CHILD, url, first, last], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["got"] == ["01020304", "05060708", False], url
        assert result["listed"] == sorted([".zarray", first, last]), url
        assert result["many"] == [4, 4], url
        # about 60 MiB whatever the grid (lazy imports, thread pools); a column per chunk would take GBs
        assert result["grown"] < 128 << 20, (url, result["grown"])


def test_a_record_short_of_its_grid_is_a_format_error_naming_it(tmp_path):
    url, _, _ = huge_manifests(tmp_path, [10**9])
    records = tmp_path / "huge.parq" / "v"
    short = pa.table({"path": pa.array(["x"]), "offset": pa.array([0]), "size": pa.array([1])})
    pq.write_table(short, records / "refs.0.parq")
    with nczmap.open_map(url, "r") as zmap, pytest.raises(FormatError, match=r"refs\.0\.parq has 1 rows"):
        zmap.read("/v/0")


def test_the_page_cache_counts_inline_bytes():
    """A record's ``raw`` column is not bounded by its row count: the cache counts its bytes too."""
    from nczmap.manifest.model import INLINE, ROW_BYTES, Page, PageCache

    rows = 10
    nothing = np.zeros(rows, dtype=np.int64)
    inline = {row: bytes(100 * ROW_BYTES) for row in range(rows)}  # 100 rows' worth each
    page = Page(0, np.full(rows, INLINE, dtype=np.int32), nothing, nothing, [], inline)
    cache = PageCache(limit=1500)
    cache.put((0, 0), page)
    cache.put((0, 1), page)  # 2 * (10 + 1000) rows > 1500: the older one goes
    assert cache.get((0, 0)) is None and cache.get((0, 1)) is page
    cache.drop((0, 1))
    assert len(cache) == 0 and cache._rows == 0


def test_concurrent_changes_folded_into_one_page_are_all_kept(monkeypatch):
    """Two threads folding the same page must not each start from the old page (the later one would put
    back a page without the other's changes)."""
    import threading
    import time

    from nczmap.manifest import model
    from nczmap.manifest.model import ArrayReferences, Page, Reference

    monkeypatch.setattr(model, "FOLD", 1)  # every change folds at once
    changed = Page.changed

    def slow_changed(self, changes):
        time.sleep(0.001)  # widen the window between reading the page and holding the new one
        return changed(self, changes)

    monkeypatch.setattr(Page, "changed", slow_changed)
    table = ArrayReferences((64,))
    threads_count, per_thread = 8, 8

    def write(first: int) -> None:
        for flat in range(first, first + per_thread):
            table.set(flat, Reference("/data/a.bin", flat, 1))

    threads = [threading.Thread(target=write, args=(n * per_thread,)) for n in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [table.get(flat) for flat in range(64)] == [Reference("/data/a.bin", f, 1) for f in range(64)]
