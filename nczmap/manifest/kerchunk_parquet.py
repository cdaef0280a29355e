"""kerchunk's Parquet reference format: fsspec's ``LazyReferenceMapper`` layout, read and written.

A directory holds:

- ``.zmetadata``: JSON ``{"metadata": {key: JSON object or text}, "record_size": N}``; every key that is not
  a chunk of an array (metadata objects, and anything else) lives here;
- ``<array>/refs.<r>.parq`` per array with a ``<array>/.zarray``: columns ``path`` (text, nullable, often
  dictionary-encoded), ``offset`` and ``size`` (int64) and ``raw`` (binary, nullable). Row ``i`` of record
  ``r`` is chunk number ``r * N + i`` in C order over the chunk grid (``[1]`` for a 0-d array). ``raw``
  set: inline bytes; ``path`` set: a reference, the whole object when ``offset == size == 0``; neither: a
  missing chunk. An absent record file is a record of missing chunks.

Loading reads each record's columns with pyarrow straight into an :class:`ArrayReferences` (numpy columns,
the URLs dictionary-encoded into a small table): no Python object per chunk except inline data. Chunk keys
split on ``.`` only, so an array whose ``dimension_separator`` is ``/`` cannot be expressed.

nczmap's source-validation data goes under a top-level ``"nczmap"`` key of ``.zmetadata``
(``{"sources": {...}}``), which fsspec ignores.

Differences from fsspec worth knowing: fsspec serves a metadata value as ``json.dumps(value)``, so a JSON
object reads back in that (normalised) spelling from both; a *text* value (what :func:`dump` writes for a
non-JSON object key, ``base64:`` for binary) is its text to nczmap but a quoted JSON string to fsspec.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable
from typing import NamedTuple

from nczmap._lazy import numpy as np
from nczmap.errors import DatasetNotFound, FormatError, KeyNameError
from nczmap.manifest.model import (
    INLINE,
    MISSING,
    WHOLE,
    ArrayReferences,
    Manifest,
    Reference,
    checked_sources,
    resolve,
)
from nczmap.zmap.keys import normalize_key

METADATA = ".zmetadata"
EXTENSION = "nczmap"  # top-level key of nczmap's additions in .zmetadata (ignored by fsspec)
COLUMNS = ("path", "offset", "size", "raw")
RECORD_SIZE = 10000  # fsspec's default
# Record files fetched and decoded at once: overlaps S3 latency; locally, more only costs memory (pyarrow
# keeps a memory arena per thread) on a machine of few cores.
WIDTH = 4

Reader = Callable[[str], "bytes | None"]
Writer = Callable[[str, bytes], None]


class MissingMetadata(DatasetNotFound, FormatError):
    """No ``.zmetadata``: not a Parquet reference set (also DatasetNotFound, so mode "a" can create one)."""


def record_name(array: str, record: int) -> str:
    return f"{array}/refs.{record}.parq"


# ============================================================================================== loading
def load(read: Reader, where: str) -> Manifest:
    """The manifest in the Parquet reference directory whose files ``read(name)`` returns (None if
    absent); ``where`` names the directory in errors."""
    where = where.rstrip("/")
    place = f"{where}/{METADATA}"
    data = read(METADATA)
    if data is None:
        raise MissingMetadata(f"{place} does not exist: {where} is not a kerchunk Parquet reference set")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{place} is not JSON: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
        raise FormatError(f"{place} must be a JSON object with a 'metadata' object")
    record_size = document.get("record_size")
    if not _is_int(record_size) or record_size < 1:
        raise FormatError(f"{place}: 'record_size' must be a positive integer, not {record_size!r}")

    manifest = Manifest()
    grids: dict[str, tuple[int, ...]] = {}
    for key, value in document["metadata"].items():
        if not isinstance(key, str):
            continue
        key = key.lstrip("/")
        manifest.entries[key] = _metadata_bytes(value, key, place)
        array, _, name = key.rpartition("/")
        if name == ".zarray" and array:  # a root array's chunk keys have no "/": fsspec cannot serve them
            _check_field(array, place)
            grids[array] = _grid(value, key, place)
    extension = document.get(EXTENSION)
    if isinstance(extension, dict) and "sources" in extension:
        manifest.sources.update(checked_sources(extension["sources"], where))
    for array, grid in grids.items():
        manifest.arrays[array] = _load_array(read, where, array, grid, record_size)
    return manifest


def _metadata_bytes(value: object, key: str, place: str) -> bytes:
    """A ``.zmetadata`` value as the key's bytes: text as itself (``base64:`` decoded), anything else as
    fsspec serves it (``json.dumps``)."""
    if isinstance(value, str):
        try:
            if value.startswith("base64:"):
                return base64.b64decode(value[7:], validate=True)
            return value.encode("utf-8")
        except (binascii.Error, ValueError) as exc:
            raise FormatError(f"{place}: the value of {key!r} cannot be decoded: {exc}") from None
    return json.dumps(value).encode("utf-8")


def _grid(zarray: object, key: str, place: str) -> tuple[int, ...]:
    """The chunk grid of an array from its ``.zarray`` (checked: fsspec's layout depends on it)."""
    if not isinstance(zarray, dict):
        raise FormatError(f"{place}: {key!r} must be a JSON object, not {type(zarray).__name__}")
    shape, chunks = zarray.get("shape"), zarray.get("chunks")
    if (
        not isinstance(shape, list)
        or not isinstance(chunks, list)
        or len(shape) != len(chunks)
        or not all(_is_int(n) and n >= 0 for n in shape)
        or not all(_is_int(n) and n >= 1 for n in chunks)
    ):
        raise FormatError(
            f"{place}: {key!r} needs 'shape' and 'chunks' lists of equal length (sizes >= 0, chunks >= 1); "
            f"found shape={shape!r} chunks={chunks!r}"
        )
    if zarray.get("dimension_separator") not in (None, "."):
        raise FormatError(
            f"{place}: the array {key.rpartition('/')[0]!r} has dimension_separator "
            f"{zarray.get('dimension_separator')!r}; kerchunk's Parquet references name chunks with '.' only"
        )
    return tuple(math.ceil(s / c) for s, c in zip(shape, chunks, strict=True))


def _check_field(array: str, place: str) -> None:
    """An array's name becomes a directory of the reference set: never ``..``, never absolute."""
    try:
        normalize_key(array)
    except KeyNameError as exc:
        raise FormatError(f"{place}: {exc}; it cannot name a directory of references") from None


def _load_array(
    read: Reader, where: str, array: str, grid: tuple[int, ...], record_size: int
) -> ArrayReferences:
    """An array's references: record files fetched and decoded concurrently (storage latency and
    Parquet decoding overlap), merged into the table in order."""
    from nczmap.concurrency import run_bounded

    count = math.prod(grid)
    table = ArrayReferences.empty(grid)

    def fetch(record: int) -> _Record | None:
        name = record_name(array, record)
        data = read(name)
        need = min(record_size, count - record * record_size)
        return None if data is None else _decode_record(data, f"{where}/{name}", need, record_size)

    tasks = (lambda r=record: fetch(r) for record in range(-(-count // record_size)))
    for record, decoded in enumerate(run_bounded(tasks, WIDTH)):
        if decoded is not None:
            _merge_record(table, record * record_size, decoded)
    return table


class _Record(NamedTuple):
    """One decoded record file: rows' URL numbers into ``urls`` (-1: none), ranges and inline data."""

    urls: list
    rows: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    inline: dict[int, bytes]


def _decode_record(data: bytes, place: str, need: int, record_size: int) -> _Record:
    """Rows ``[0, need)`` of one record file (rows past ``need`` are padding).

    Columns are read through their Arrow buffers with numpy: pyarrow's conversions and compute functions
    import pandas, which costs more than the whole load.
    """
    import pyarrow as pa

    try:
        columns = _read_columns(data, place, need, record_size)
        urls, rows = _path_numbers(columns.get("path"), need)
        inline: dict[int, bytes] = {}
        at = 0
        for chunk in columns["raw"].chunks if "raw" in columns else ():
            for row in np.flatnonzero(_validity(chunk)[: max(0, need - at)]).tolist():
                inline[at + row] = _raw_bytes(chunk[row].as_py(), place)
            at += len(chunk)
        if "path" in columns:
            offsets = _integers(columns["offset"], place)[:need]
            sizes = _integers(columns["size"], place)[:need]
        else:
            offsets = sizes = np.zeros(need, dtype=np.int64)
    except (pa.ArrowException, ValueError, TypeError, OSError, IndexError) as exc:
        raise FormatError(f"{place} is not a readable kerchunk reference record: {exc}") from None
    rows = rows[:need]
    if inline:
        rows[list(inline)] = -1
    named = rows >= 0
    if (offsets[named] < 0).any() or (sizes[named] < 0).any():
        raise FormatError(f"{place}: a reference has a negative offset or size")
    return _Record(urls, rows, offsets, sizes, inline)


def _merge_record(table: ArrayReferences, start: int, record: _Record) -> None:
    """A decoded record into ``table`` at ``start``: its URLs numbered in ``table.paths``."""
    mapping = np.empty(len(record.urls) + 1, dtype=np.int32)  # the record's URL numbers -> table.paths
    for at, url in enumerate(record.urls):
        mapping[at] = table.number_of(url) if url is not None else MISSING
    mapping[-1] = MISSING
    where = mapping[record.rows]
    if record.inline:
        where[list(record.inline)] = INLINE
    refs = where >= 0
    whole = refs & (record.offsets == 0) & (record.sizes == 0)
    stop = start + len(where)
    table.path_index[start:stop] = where
    table.offsets[start:stop] = np.where(refs, record.offsets, 0)
    table.lengths[start:stop] = np.where(whole, WHOLE, np.where(refs, record.sizes, 0))
    for row, data in record.inline.items():
        table.inline[start + row] = data


def _read_columns(data: bytes, place: str, need: int, record_size: int) -> dict:
    """The columns of a record file (pyarrow ChunkedArrays), checked."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:  # the path column read dictionary-encoded: URL indices come straight from the file's pages
        parquet = pq.ParquetFile(pa.BufferReader(data), read_dictionary=["path"])
    except KeyError:
        parquet = pq.ParquetFile(pa.BufferReader(data))
    schema = parquet.schema_arrow
    names = set(schema.names)
    if not ({"path", "offset", "size"} <= names or "raw" in names) or (
        "path" in names and not {"offset", "size"} <= names
    ):
        raise FormatError(
            f"{place} has columns {schema.names}; kerchunk references need 'path', 'offset' and 'size', "
            "or 'raw', or all four"
        )
    for name in COLUMNS:
        if name in names and not _fits(name, schema.field(name).type):
            raise FormatError(f"{place}: column {name!r} has type {schema.field(name).type}")
    rows = parquet.metadata.num_rows
    if not need <= rows <= record_size:
        raise FormatError(
            f"{place} has {rows} rows; this record of the array needs {need}"
            + (f" (at most the record size, {record_size})" if rows > record_size else "")
        )
    table = parquet.read(columns=[c for c in COLUMNS if c in names], use_threads=False)
    return {name: table.column(name) for name in table.column_names}


def _fits(name: str, kind) -> bool:
    import pyarrow.types as t

    if t.is_dictionary(kind):
        kind = kind.value_type
    if t.is_null(kind):
        return True
    if name == "path":
        return t.is_string(kind) or t.is_large_string(kind) or t.is_string_view(kind)
    if name == "raw":
        return any(
            test(kind)
            for test in (t.is_binary, t.is_large_binary, t.is_binary_view, t.is_string, t.is_large_string)
        ) or t.is_string_view(kind)
    return t.is_integer(kind)


def _path_numbers(column, need: int) -> tuple[list, np.ndarray]:
    """The URLs a record names and, per row, the number of its URL among them (-1: none)."""
    import pyarrow as pa

    if column is None:
        return [], np.full(need, -1, dtype=np.int64)
    urls: list = []
    parts = []
    for chunk in column.chunks:
        if pa.types.is_null(chunk.type):
            parts.append(np.full(len(chunk), -1, dtype=np.int64))
            continue
        if pa.types.is_dictionary(chunk.type):  # the usual case: a few URLs, numpy indices
            names, numbers = chunk.dictionary.to_pylist(), _integers(chunk.indices, "")
            valid = _validity(chunk.indices)
            if (numbers[valid] < 0).any() or (numbers[valid] >= len(names)).any():
                raise ValueError("a path index lies outside its dictionary")
        else:  # plain text (a Parquet column reads dictionary-encoded, so rare): per row
            values = chunk.to_pylist()
            names = list(dict.fromkeys(v for v in values if v is not None))
            local = {url: at for at, url in enumerate(names)}
            numbers = np.array([-1 if v is None else local[v] for v in values], dtype=np.int64)
            valid = numbers >= 0
        parts.append(np.where(valid, numbers + len(urls), -1))
        urls.extend(names)
    return urls, (np.concatenate(parts) if len(parts) != 1 else parts[0])


def _validity(array) -> np.ndarray:
    """Which rows of one Arrow array are not null, from its validity bitmap."""
    n = len(array)
    if array.null_count == 0:
        return np.ones(n, dtype=bool)
    if array.null_count == n:
        return np.zeros(n, dtype=bool)
    bits = np.frombuffer(array.buffers()[0], dtype=np.uint8)
    return np.unpackbits(bits, count=array.offset + n, bitorder="little")[array.offset :].astype(bool)


def _integers(column, place: str) -> np.ndarray:
    """An integer column (a ChunkedArray or one Array) as int64, nulls as 0, from its data buffers."""
    import pyarrow as pa

    parts = []
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else (column,):
        n = len(chunk)
        if pa.types.is_null(chunk.type) or n == 0 or chunk.null_count == n:
            parts.append(np.zeros(n, dtype=np.int64))
            continue
        if pa.types.is_dictionary(chunk.type):  # unusual: small, so through Python
            parts.append(np.array([v or 0 for v in chunk.to_pylist()], dtype=np.int64))
            continue
        kind = np.dtype(str(chunk.type))
        values = np.frombuffer(chunk.buffers()[1], dtype=kind, count=chunk.offset + n)[chunk.offset :]
        if kind == np.uint64 and (values > np.iinfo(np.int64).max).any():
            raise FormatError(f"{place}: an offset or size does not fit in 64 bits")
        values = values.astype(np.int64)
        if chunk.null_count:
            values[~_validity(chunk)] = 0
        parts.append(values)
    return np.concatenate(parts) if len(parts) != 1 else parts[0]


def _raw_bytes(value: object, place: str) -> bytes:
    """An inline value as fsspec serves it (text as UTF-8, ``base64:`` decoded)."""
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if data.startswith(b"base64:"):
        try:
            return base64.b64decode(data[7:], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise FormatError(f"{place}: inline data marked base64 cannot be decoded: {exc}") from None
    return data


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ============================================================================================== writing
def dump(manifest: Manifest, write: Writer, record_size: int = RECORD_SIZE) -> None:
    """Write ``manifest`` as a Parquet reference set through ``write(name, data)``: the record files of
    every array (all of them, so none left from an earlier save is read), then ``.zmetadata``.

    Chunks come from the manifest's :class:`ArrayReferences` and from loose chunk keys (a manifest loaded
    from JSON), grouped by array with each array's ``.zarray``; other keys go to ``.zmetadata`` (JSON
    objects as objects, other data as text or ``base64:``). A reference under a key that is not a chunk of
    an array with a ``.zarray``, a reference from an offset to the end of an object, and an array whose
    ``dimension_separator`` is ``/`` cannot be expressed: FormatError.
    """
    if not _is_int(record_size) or record_size < 1:
        raise ValueError(f"record_size must be a positive integer, not {record_size!r}")
    arrays: dict[str, ArrayReferences] = {}
    for key, value in manifest.entries.items():
        array, _, name = key.rpartition("/")
        if name == ".zarray" and array and value is not None:
            arrays[array] = _writable_table(manifest, array, key)
    for array, table in manifest.arrays.items():
        if array not in arrays and next(iter(table.present()), None) is not None:
            raise FormatError(f"array {array!r} holds chunk references but has no .zarray")

    metadata: dict[str, object] = {}
    for key, value in manifest.entries.items():  # per key: a manifest loaded from JSON has a million
        if value is None:
            continue
        entry = value if isinstance(value, bytes | Reference) else resolve(value, key, manifest.templates)
        array, _, name = key.rpartition("/")
        table = arrays.get(array)
        flat = _chunk_number(name, table.grid) if table is not None else None
        if flat is not None:
            table.set(flat, entry)
        elif isinstance(entry, Reference):
            raise FormatError(
                f"manifest key {key!r} holds a reference, but is no chunk of an array with a .zarray: "
                "kerchunk's Parquet references keep other keys inline in .zmetadata"
            )
        else:
            metadata[key] = _metadata_value(entry)

    for array, table in arrays.items():
        inline: dict[int, dict[int, bytes]] = {}  # record -> row -> data
        for flat, data in table.inline.items():
            inline.setdefault(flat // record_size, {})[flat % record_size] = data
        for record in range(-(-math.prod(table.grid) // record_size)):
            data = _record(table, array, record, record_size, inline.get(record, {}))
            write(record_name(array, record), data)
    document: dict[str, object] = {"metadata": dict(sorted(metadata.items())), "record_size": record_size}
    if manifest.sources:
        document[EXTENSION] = {"sources": manifest.sources}
    write(METADATA, json.dumps(document, separators=(",", ":")).encode("utf-8"))


def _writable_table(manifest: Manifest, array: str, key: str) -> ArrayReferences:
    """A copy of ``array``'s chunk table over the grid its ``.zarray`` gives (checked)."""
    place = f"manifest key {key!r}"
    entry = manifest.get(key)
    if not isinstance(entry, bytes):
        raise FormatError(f"{place} holds a reference; kerchunk's Parquet references keep metadata inline")
    try:
        zarray = json.loads(entry)
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{place} is not JSON: {exc}") from None
    try:
        normalize_key(array)
    except KeyNameError as exc:
        raise FormatError(f"{place}: {exc}") from None
    grid = _grid(zarray, key, place)
    held = manifest.arrays.get(array)
    if held is not None and held.separator != ".":
        raise FormatError(f"array {array!r} names chunks with {held.separator!r}; Parquet references use '.'")
    if held is not None and held.grid == grid:
        return ArrayReferences(
            grid,
            list(held.paths),
            held.path_index.copy(),
            held.offsets.copy(),
            held.lengths.copy(),
            dict(held.inline),
        )
    copy = ArrayReferences.empty(grid)
    if held is None:
        return copy
    # The .zarray changed shape since the table was made: chunks keep their names (rare, so per chunk).
    for flat in held.present():
        name = held.name(flat)
        moved = copy.position(name)
        if moved is None:
            entry = held.get(flat)
            if isinstance(entry, Reference):
                raise FormatError(f"chunk {array}/{name} lies outside the grid of {key!r}")
            continue
        copy.set(moved, held.get(flat))
    return copy


def _chunk_number(name: str, grid: tuple[int, ...]) -> int | None:
    """The flat index of chunk ``name`` (``"3.4"``) in ``grid``, or None (``ArrayReferences.position``
    for the one separator this format has, made cheap: it runs once per loose key)."""
    if len(grid) <= 1:
        if not (name.isascii() and name.isdigit()):
            return None
        flat = int(name)
        return flat if flat < (grid[0] if grid else 1) else None
    parts = name.split(".")
    if len(parts) != len(grid) or not name.replace(".", "").isascii():
        return None
    flat = 0
    for part, n in zip(parts, grid, strict=True):
        if not part.isdigit() or int(part) >= n:
            return None
        flat = flat * n + int(part)
    return flat


def _record(table: ArrayReferences, array: str, record: int, record_size: int, inline: dict) -> bytes:
    """One record file: rows for chunks ``[record * record_size, ...)`` (only as many as the grid has);
    ``inline``: this record's inline chunks by row. Built from numpy buffers (``pa.array`` imports pandas).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    start = record * record_size
    stop = min(start + record_size, math.prod(table.grid))
    where = table.path_index[start:stop]
    offsets = table.offsets[start:stop]
    lengths = table.lengths[start:stop]
    refs = where >= 0
    whole = refs & (lengths == WHOLE)
    if (whole & (offsets != 0)).any():
        flat = start + int(np.flatnonzero(whole & (offsets != 0))[0])
        raise FormatError(
            f"chunk {array}/{table.name(flat)} refers to the end of an object from an offset; kerchunk "
            "references name a range or a whole object"
        )
    empty = refs & (offsets == 0) & (lengths == 0)  # would read as a whole object: store b"" inline
    if empty.any():
        refs &= ~empty
        inline = {**inline, **dict.fromkeys(np.flatnonzero(empty).tolist(), b"")}

    used, local = np.unique(where[refs], return_inverse=True)
    indices = np.zeros(stop - start, dtype=np.int32)
    indices[refs] = local
    urls = _text_array([table.paths[i].encode("utf-8") for i in used.tolist()], pa.string())
    path = pa.DictionaryArray.from_buffers(
        pa.dictionary(pa.int32(), pa.string()), stop - start, [_bitmap(refs), pa.py_buffer(indices)], urls
    )
    rows = sorted(inline)
    present = np.zeros(stop - start, dtype=bool)
    present[rows] = True
    sizes = np.zeros(stop - start, dtype=np.int64)
    values = [_raw_value(inline[row]) for row in rows]
    sizes[rows] = [len(value) for value in values]
    raw = _text_array(values, pa.binary(), sizes, present)
    columns = [
        path,
        _int64_array(np.where(refs & ~whole, offsets, 0)),
        _int64_array(np.where(refs & ~whole, lengths, 0)),
        raw,
    ]
    # offset and size are never null: declared so, fastparquet (VirtualiZarr's reader) reads them as
    # integers rather than as nullable floats
    schema = pa.schema(
        [
            pa.field(name, column.type, nullable=name in ("path", "raw"))
            for name, column in zip(COLUMNS, columns, strict=True)
        ]
    )
    sink = pa.BufferOutputStream()
    pq.write_table(
        pa.Table.from_arrays(columns, schema=schema), sink, compression="zstd", write_statistics=False
    )
    return sink.getvalue().to_pybytes()


def _bitmap(valid: np.ndarray):
    """An Arrow validity bitmap (None: every row valid)."""
    import pyarrow as pa

    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _int64_array(values: np.ndarray):
    import pyarrow as pa

    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values.astype(np.int64))])


def _text_array(values: list[bytes], kind, sizes=None, present=None):
    """A binary or string Arrow array of ``values`` (all rows, or the ``present`` rows of ``sizes``)."""
    import pyarrow as pa

    if sizes is None:
        sizes = np.array([len(value) for value in values], dtype=np.int64)
        present = np.ones(len(values), dtype=bool)
    ends = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=ends[1:])
    if ends[-1] >= 1 << 31:
        kind = pa.large_binary() if kind == pa.binary() else pa.large_string()
    else:
        ends = ends.astype(np.int32)
    return pa.Array.from_buffers(
        kind, len(sizes), [_bitmap(present), pa.py_buffer(ends), pa.py_buffer(b"".join(values))]
    )


def _raw_value(data: bytes) -> bytes:
    """Inline bytes as stored: fsspec decodes a ``base64:`` prefix, so such data is itself encoded."""
    return b"base64:" + base64.b64encode(data) if data.startswith(b"base64:") else data


def _metadata_value(data: bytes) -> object:
    """A non-chunk key's bytes in ``.zmetadata``: a JSON object as itself (as fsspec and zarr need it),
    other UTF-8 text as text, anything else (or text that starts ``base64:``) as ``base64:``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, dict):
        return value
    return "base64:" + base64.b64encode(data).decode("ascii") if text.startswith("base64:") else text
