"""Whole arrays read through a manifest's table of references: in columns, without an object per chunk,
and with every reading rule of a read key by key (gaps, overlaps, inline and missing chunks, loose keys,
checksums, sizes, grants)."""

from __future__ import annotations

import base64
import json
import tracemalloc

import numpy as np
import pytest

import nczmap
from nczmap import AccessDenied, FormatError, StorageError
from nczmap.checksum import crc32c
from nczmap.manifest.model import ArrayReferences, Page, Reference

CHUNK = 4  # float64 values a chunk
SIZE = CHUNK * 8


def zarray(shape: list[int], chunks: list[int], fill: float | None = None) -> str:
    return json.dumps(
        {
            "zarr_format": 2,
            "shape": shape,
            "chunks": chunks,
            "dtype": "<f8",
            "compressor": None,
            "filters": None,
            "fill_value": fill,
            "order": "C",
        }
    )


def write(directory, refs: dict, extension: dict | None = None) -> str:
    document = {"version": 1, "refs": {".zgroup": json.dumps({"zarr_format": 2}), **refs}}
    if extension:
        document["nczmap"] = extension
    path = directory / "refs.json"
    path.write_text(json.dumps(document))
    return path.as_uri() + "#mode=zarr,manifest"


def read(url: str, selection: object = Ellipsis) -> np.ndarray:
    with nczmap.open_dataset(url) as ds:
        return ds.variables["v"][selection]


def chunk(number: int) -> np.ndarray:
    return np.arange(number * CHUNK, (number + 1) * CHUNK, dtype="<f8")


def test_a_whole_array_read_costs_columns_not_an_object_per_chunk(tmp_path):
    count = 100_000
    (tmp_path / "data.bin").write_bytes(np.arange(count * CHUNK, dtype="<f8").tobytes())
    members = ",".join(f'"v/{i}":["data.bin",{i * SIZE},{SIZE}]' for i in range(count))
    metadata = json.dumps(
        {".zgroup": json.dumps({"zarr_format": 2}), "v/.zarray": zarray([count * CHUNK], [CHUNK])}
    )
    (tmp_path / "refs.json").write_text('{"version":1,"refs":{' + metadata[1:-1] + "," + members + "}}")
    with nczmap.open_dataset((tmp_path / "refs.json").as_uri() + "#mode=zarr,manifest") as ds:
        variable = ds.variables["v"]
        tracemalloc.start()
        try:
            values = variable[...]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert np.array_equal(values, np.arange(count * CHUNK, dtype="<f8"))
    # the output, and a few columns of 8 bytes a chunk (read key by key: about 1 KB of objects a chunk)
    assert (peak - values.nbytes) / count < 300


@pytest.fixture
def varied(tmp_path):
    """``v``: 24 chunks referring every way a manifest can, and the values it holds (fill value -1)."""
    chunks = 24
    expected = np.concatenate([chunk(n) for n in range(chunks)])
    data = bytearray()
    refs: dict[str, object] = {"v/.zarray": zarray([chunks * CHUNK], [CHUNK], fill=-1.0)}
    order = np.random.default_rng(5).permutation(range(2, chunks))
    for number in order.tolist():  # shuffled in the file, with gaps small and large between some
        data += bytes(7 if number % 3 == 0 else 0) + bytes(70_000 if number % 7 == 0 else 0)
        refs[f"v/{number}"] = ["data.bin", len(data), SIZE]
        data += chunk(number).tobytes()
    # chunk 0: bytes inside another chunk's (an overlap), read from there
    refs["v/0"] = ["data.bin", refs["v/5"][1], SIZE]
    expected[:CHUNK] = chunk(5)
    # chunk 1: the same bytes as chunk 6 (a duplicate reference)
    refs["v/1"] = list(refs["v/6"])
    expected[CHUNK : 2 * CHUNK] = chunk(6)
    # chunk 9: bytes straddling chunks 10 and 11 when they lie end to end
    refs["v/10"], refs["v/11"] = ["data.bin", len(data), SIZE], ["data.bin", len(data) + SIZE, SIZE]
    refs["v/9"] = ["data.bin", len(data) + SIZE // 2, SIZE]
    expected[9 * CHUNK : 10 * CHUNK] = np.concatenate([chunk(10)[CHUNK // 2 :], chunk(11)[: CHUNK // 2]])
    data += chunk(10).tobytes() + chunk(11).tobytes()
    # chunk 12: another file, whole; chunk 13 inline; chunk 14 missing
    (tmp_path / "other.bin").write_bytes(chunk(12).tobytes())
    refs["v/12"] = ["other.bin"]
    refs["v/13"] = "base64:" + base64.b64encode(chunk(13).tobytes()).decode()
    del refs["v/14"]
    expected[14 * CHUNK : 15 * CHUNK] = -1.0
    (tmp_path / "data.bin").write_bytes(bytes(data))
    return tmp_path, refs, expected


def test_a_whole_array_read_follows_every_kind_of_reference(varied):
    directory, refs, expected = varied
    url = write(directory, refs)
    assert np.array_equal(read(url), expected)
    assert np.array_equal(read(url, slice(3, 90)), expected[3:90])  # key by key: the same rules
    with nczmap.open_map(url, "r") as zmap:
        by_key = [zmap.read(f"/v/{n}") if zmap.exists(f"/v/{n}") else None for n in range(24)]
    assert b"".join(data or np.full(CHUNK, -1.0).tobytes() for data in by_key) == expected.tobytes()


def test_a_whole_array_read_checks_the_recorded_checksums(varied):
    directory, refs, expected = varied
    checksums = {
        f"v/{n}": crc32c(expected[n * CHUNK : (n + 1) * CHUNK].tobytes()) for n in range(24) if n != 14
    }
    assert np.array_equal(read(write(directory, refs, {"crc32c": checksums})), expected)
    checksums["v/20"] ^= 1
    with pytest.raises(StorageError, match=r"'/v/20'.*crc32c"):
        read(write(directory, refs, {"crc32c": checksums}))


def test_a_two_dimensional_array_chunked_along_its_first_dimension(tmp_path):
    rows = 6
    values = np.arange(rows * CHUNK * 3, dtype="<f8").reshape(rows * CHUNK, 3)
    (tmp_path / "data.bin").write_bytes(values[::-1].tobytes())  # the chunks in the file backwards
    refs = {"v/.zarray": zarray([rows * CHUNK, 3], [CHUNK, 3])}
    for row in range(rows):
        refs[f"v/{row}.0"] = ["data.bin", (rows - 1 - row) * CHUNK * 3 * 8, CHUNK * 3 * 8]
    backwards = values[::-1].reshape(rows, CHUNK, 3)[::-1].reshape(rows * CHUNK, 3)
    assert np.array_equal(read(write(tmp_path, refs)), backwards)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (["data.bin", -1, SIZE], FormatError, "'v/3'.*not a kerchunk reference"),
        ("base64:???", FormatError, "'v/3'.*not base64"),
        (["data.bin", 0, SIZE + 8], FormatError, "'/v/3' holds 40 bytes, expected 32"),
        (["data.bin", 10 * SIZE, SIZE], StorageError, "truncated or replaced"),
        (["/etc/passwd", 0, SIZE], AccessDenied, "/etc/passwd"),
    ],
)
def test_a_bad_chunk_fails_a_whole_array_read_as_it_fails_its_key(tmp_path, value, error, match):
    (tmp_path / "data.bin").write_bytes(np.arange(8 * CHUNK, dtype="<f8").tobytes())
    refs = {"v/.zarray": zarray([8 * CHUNK], [CHUNK])}
    refs.update({f"v/{n}": ["data.bin", n * SIZE, SIZE] for n in range(8)})
    refs["v/3"] = value
    url = write(tmp_path, refs)
    with pytest.raises(error, match=match):
        read(url)


def test_columns_of_a_table_follow_this_sessions_changes():
    table = ArrayReferences((1000,), page_size=100)
    for number in range(10):
        rows = np.arange(0, 100, 3, dtype=np.int64)
        table.hold(number, Page.build(number * 100, rows, rows % 2, rows * 10, rows + 1, ["a", "b"]))
    table.set(3, None)
    table.set(4, Reference("c", 1, 2))
    table.set(999, b"inline")
    flats = np.array([999, 0, 3, 4, 6, 7, 303, 998], dtype=np.int64)
    assert table.columns(flats).entries() == [table.get(int(flat)) for flat in flats]
    assert table.columns(flats).entries()[:4] == [b"inline", Reference("a", 0, 1), None, Reference("c", 1, 2)]
