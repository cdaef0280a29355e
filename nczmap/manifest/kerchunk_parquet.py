"""kerchunk's Parquet reference format: fsspec's ``LazyReferenceMapper`` layout, read and written.

A directory holds:

- ``.zmetadata``: JSON ``{"metadata": {key: JSON object or text}, "record_size": N}``; every key that is not
  a chunk of an array (metadata objects, and anything else) lives here;
- ``<array>/refs.<r>.parq`` per array with a ``<array>/.zarray``: columns ``path`` (text, nullable, often
  dictionary-encoded), ``offset`` and ``size`` (int64) and ``raw`` (binary, nullable). Row ``i`` of record
  ``r`` is chunk number ``r * N + i`` in C order over the chunk grid (``[1]`` for a 0-d array). ``raw``
  set: inline bytes; ``path`` set: a reference, the whole object when ``offset == size == 0``; neither: a
  missing chunk. An absent record file is a record of missing chunks.

Opening reads ``.zmetadata`` only: each array becomes an :class:`ArrayReferences` whose pages are its record
files, read when a chunk of them is asked for (columns through their Arrow buffers into numpy: no Python
object per chunk except inline data) and kept in the manifest's bounded cache. Nothing is allocated per
chunk of the grid: which records exist comes from the files (a directory listing, for listing chunks), an
absent record is a record of missing chunks, so a grid larger than its records is sparse. Chunk keys split
on ``.`` only, so an array whose ``dimension_separator`` is ``/`` cannot be expressed.

Record files are written as kerchunk writes them (``kerchunk.df.refs_to_dataframe``, pandas and
fastparquet): ``record_size`` rows each (the last padded), ``path`` text (nullable, dictionary-encoded
pages), ``offset`` and ``size`` int64 declared not null, ``raw`` binary (nullable), zstd, and the ``pandas``
schema metadata fastparquet needs to read ``offset``/``size`` as integers; only records holding something
are written (an absent record is all missing chunks, to fsspec as to nczmap). Saving a manifest over the
reference set it was loaded from (``dump(..., keep=)``) writes only the records whose chunks changed: the
others are kept as they are, unread, when the layout is unchanged or the array grew along its first axis
(C-order chunk numbers unchanged); any other change of an array's chunk grid lays its table out again.

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
import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

from nczmap._lazy import numpy as np
from nczmap._version import __version__
from nczmap.errors import DatasetNotFound, FormatError, KeyNameError, StorageError
from nczmap.manifest.model import (
    INLINE,
    MAX_CHUNKS,
    MISSING,
    WHOLE,
    ArrayReferences,
    Manifest,
    Page,
    Reference,
    chunk_grid,
    chunk_numbers,
    chunk_position,
    extension_of,
    read_extension,
    resolve,
)
from nczmap.zmap.keys import normalize_key

METADATA = ".zmetadata"
EXTENSION = "nczmap"  # top-level key of nczmap's additions in .zmetadata (ignored by fsspec)
COLUMNS = ("path", "offset", "size", "raw")
RECORD_SIZE = 10000  # fsspec's default
MAX_RECORD_SIZE = 10_000_000  # rows of one record file (a page in memory: 20 bytes a row)
PROBED = 100_000  # records probed one by one when the files cannot be listed
# Record files fetched and decoded at once: overlaps S3 latency; locally, more only costs memory (pyarrow
# keeps a memory arena per thread) on a machine of few cores.
WIDTH = 4


def _pandas_metadata() -> bytes:
    """The ``pandas`` schema metadata kerchunk's writer (pandas + fastparquet) puts in every record file:
    fastparquet reads ``offset``/``size`` as int64 (not nullable floats) only with it, pyarrow's pandas
    conversion names the columns from it."""
    kinds = {"path": ("object", "unicode"), "offset": ("int64", "int64"), "size": ("int64", "int64"),
             "raw": ("object", "bytes")}  # fmt: skip
    document = {
        "column_indexes": [
            {"field_name": None, "metadata": None, "name": None, "numpy_type": "str"}
            | {"pandas_type": "mixed-integer"}
        ],
        "columns": [
            {"field_name": name, "metadata": None, "name": name, "numpy_type": numpy, "pandas_type": pandas}
            for name, (numpy, pandas) in kinds.items()
        ],
        "creator": {"library": "nczmap", "version": __version__},
        "index_columns": [],
        "pandas_version": "2.2.3",
        "partition_columns": [],
    }
    return json.dumps(document).encode("utf-8")


PANDAS_METADATA = _pandas_metadata()

Reader = Callable[[str], "bytes | None"]
Writer = Callable[[str, bytes], None]
Lister = Callable[[str], "list[str] | None"]  # names in a directory of the reference set (None: cannot list)
Keeper = Callable[[str], None]  # keep the record file of this name as it is in the saved version
RECORD_FILE = re.compile(r"refs\.(0|[1-9][0-9]{0,30})\.parq")


class MissingMetadata(DatasetNotFound, FormatError):
    """No ``.zmetadata``: not a Parquet reference set (also DatasetNotFound, so mode "a" can create one)."""


def record_name(array: str, record: int) -> str:
    return f"{array}/refs.{record}.parq"


# ============================================================================================== loading
def load(
    read: Reader, where: str, listdir: Lister | None = None, replaced: Callable[[], bool] | None = None
) -> Manifest:
    """The manifest in the Parquet reference directory whose files ``read(name)`` returns (None if
    absent); ``where`` names the directory in errors. Only ``.zmetadata`` is read now: record files are
    read when their chunks are asked for; ``listdir(array)`` (the names in an array's directory) says
    which exist when chunks are listed (without it, every record of the grid is tried, up to PROBED).

    ``replaced()`` says whether the directory read has been removed (or is being removed) since: then a
    record found absent, or a listing, may be short of what the version held, and is a StorageError
    rather than missing chunks (which would read as fill values)."""
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
    if not _is_int(record_size) or not 1 <= record_size <= MAX_RECORD_SIZE:
        raise FormatError(
            f"{place}: 'record_size' must be an integer from 1 to {MAX_RECORD_SIZE}, not {record_size!r}"
        )

    manifest = Manifest()
    manifest.where = where
    manifest.record_size = record_size
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
    read_extension(manifest, extension, where)
    for array, grid in grids.items():
        records = _Records(read, where, array, grid, record_size, listdir, replaced)
        manifest.arrays[array] = ArrayReferences(grid, ".", record_size, records, manifest.cache)
    return manifest


class _Records:
    """The record files of one array, the pages of its table (a ``PageSource``)."""

    def __init__(
        self,
        read: Reader,
        where: str,
        array: str,
        grid: tuple[int, ...],
        size: int,
        listdir: Lister | None,
        replaced: Callable[[], bool] | None = None,
    ) -> None:
        self.read, self.where, self.array, self.size, self.listdir = read, where, array, size, listdir
        self.replaced = replaced
        self.count = math.prod(grid)
        self.records = -(-self.count // size)  # a Python int: a grid of 2**63 chunks allocates nothing

    def rows(self, number: int) -> int:
        """The rows of record ``number`` that are chunks of the grid (0: no such record)."""
        return min(self.size, self.count - number * self.size) if 0 <= number < self.records else 0

    def load(self, number: int) -> Page | None:
        if not 0 <= number < self.records:
            return None
        name = record_name(self.array, number)
        data = self.read(name)
        if data is None:
            self._check_held(f"its record file {name!r} is gone")
            return None
        need = self.rows(number)
        return _page(number * self.size, _decode_record(data, f"{self.where}/{name}", need, self.size))

    def _check_held(self, what: str) -> None:
        """Refuse to go on when the directory read was removed: ``what`` may be its removal, not the
        version's content (an absent record would read as fill values: silently wrong data)."""
        if self.replaced is not None and self.replaced():
            raise StorageError(
                f"the manifest {self.where} was replaced while open and the version this map was reading "
                f"has been removed ({what}): open it again"
            )

    def numbers(self) -> Iterable[int]:
        names = self.listdir(self.array) if self.listdir is not None else None
        if names is not None:
            self._check_held("its records cannot be listed")
            found = (RECORD_FILE.fullmatch(name) for name in names)
            return sorted(n for n in (int(m.group(1)) for m in found if m) if n < self.records)
        if self.records > PROBED:
            raise FormatError(
                f"{self.where}: listing the chunks of {self.array!r} means trying its {self.records} record "
                f"files one by one (more than {PROBED}); list the directory instead"
            )
        return range(self.records)


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
    try:
        return chunk_grid(zarray)
    except ValueError as exc:
        where = place if key in place else f"{place}: {key!r}"
        raise FormatError(f"{where}: the array {key.rpartition('/')[0]!r}: {exc}") from None


def _check_field(array: str, place: str) -> None:
    """An array's name becomes a directory of the reference set: never ``..``, never absolute."""
    try:
        normalize_key(array)
    except KeyNameError as exc:
        raise FormatError(f"{place}: {exc}; it cannot name a directory of references") from None


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
            unset = (_nulls(columns["offset"]) | _nulls(columns["size"]))[:need]
        else:
            offsets = sizes = np.zeros(need, dtype=np.int64)
            unset = np.zeros(need, dtype=bool)
    except (pa.ArrowException, ValueError, TypeError, OSError, IndexError) as exc:
        raise FormatError(f"{place} is not a readable kerchunk reference record: {exc}") from None
    rows = rows[:need]
    if inline:
        rows[list(inline)] = -1
    named = rows >= 0
    if (offsets[named] < 0).any() or (sizes[named] < 0).any():
        raise FormatError(f"{place}: a reference has a negative offset or size")
    if (unset & named).any():  # read as 0 they would make a whole-object reference of a range
        row = int(np.flatnonzero(unset & named)[0])
        raise FormatError(f"{place}: row {row} is a reference without an offset or size (null)")
    return _Record(urls, rows, offsets, sizes, inline)


def _page(start: int, record: _Record) -> Page:
    """A decoded record as a dense page of its rows: URL numbers into its own URLs, whole-object
    references (``offset == size == 0``) as WHOLE."""
    urls = record.urls
    mapping = np.full(len(urls) + 1, MISSING, dtype=np.int32)  # the last: rows without a path
    named = [at for at, url in enumerate(urls) if url is not None]
    mapping[named] = named
    where = mapping[record.rows]
    if record.inline:
        where[list(record.inline)] = INLINE
    refs = where >= 0
    whole = refs & (record.offsets == 0) & (record.sizes == 0)
    offsets = np.where(refs, record.offsets, 0)
    lengths = np.where(whole, WHOLE, np.where(refs, record.sizes, 0))
    return Page(start, where, offsets, lengths, [url or "" for url in urls], dict(record.inline))


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


def _nulls(column) -> np.ndarray:
    """Which rows of a column (a ChunkedArray) are null."""
    parts = [~_validity(chunk) for chunk in column.chunks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


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
def dump(
    manifest: Manifest, write: Writer, record_size: int | None = None, keep: Keeper | None = None
) -> dict[str, set[int]]:
    """Write ``manifest`` as a Parquet reference set through ``write(name, data)``: the record files that
    hold something, then ``.zmetadata``; returns the records written (or kept) per array (any other record
    file of those arrays left from an earlier save must be removed: it would be read).

    ``keep(name)``: the manifest is being saved over the reference set it was loaded from, and a record
    file this session did not change is kept as it is (linked into the new version, or left in place)
    instead of being read and written again: only the records whose chunks changed are read. Without it,
    every record is read and written.

    ``record_size``: the manifest's own (a Parquet manifest saved in place keeps its layout), else
    RECORD_SIZE. Chunks come from the manifest's tables (read a record at a time, so a manifest saved in
    place is read before it is overwritten) and from loose chunk keys (a manifest loaded from JSON),
    grouped by array with each array's ``.zarray``; other keys go to ``.zmetadata`` (JSON objects as
    objects, other data as text or ``base64:``). A reference under a key that is not a chunk of an array
    with a ``.zarray``, a reference from an offset to the end of an object, and an array whose
    ``dimension_separator`` is ``/`` cannot be expressed: FormatError.
    """
    record_size = record_size if record_size is not None else manifest.record_size or RECORD_SIZE
    if not _is_int(record_size) or not 1 <= record_size <= MAX_RECORD_SIZE:
        raise ValueError(f"record_size must be an integer from 1 to {MAX_RECORD_SIZE}, not {record_size!r}")
    tables: dict[str, ArrayReferences] = {}
    for key, value in manifest.entries.items():
        if key.endswith("/.zarray") and value is not None:
            tables[key[: -len("/.zarray")]] = _writable_table(
                manifest, key[: -len("/.zarray")], key, record_size
            )
    for array, table in manifest.arrays.items():
        if array not in tables and next(iter(table.present()), None) is not None:
            raise FormatError(f"array {array!r} holds chunk references but has no .zarray")

    metadata: dict[str, object] = {}
    loose: dict[str, dict[int, Page]] = {}  # array -> record -> the loose chunks there
    candidates: dict[str, tuple[list[str], list[str], list[Entry]]] = {}  # array -> keys, names, entries
    for key, value in manifest.entries.items():  # per key: a manifest loaded from JSON may have many
        if value is None:
            continue
        entry = value if isinstance(value, bytes | Reference) else resolve(value, key, manifest.templates)
        array, _, name = key.rpartition("/")
        if array in tables and name[:1].isdigit():  # a chunk's name, most likely: parsed below, together
            keys, names, entries = candidates.setdefault(array, ([], [], []))
            keys.append(key)
            names.append(name)
            entries.append(entry)
        else:
            metadata[key] = _metadata_value(_not_a_chunk(key, entry))
    for array, (keys, names, entries) in candidates.items():
        grid = tables[array].grid
        if math.prod(grid) < MAX_CHUNKS:
            flats = chunk_numbers(names, grid).tolist()
        else:
            flats = [-1 if (f := chunk_position(n, grid)) is None else f for n in names]
        chunks = [(flat, entry) for flat, entry in zip(flats, entries, strict=True) if flat >= 0]
        for key, flat, entry in zip(keys, flats, entries, strict=True):
            if flat < 0:
                metadata[key] = _metadata_value(_not_a_chunk(key, entry))
        loose[array] = _loose_pages(chunks, record_size)

    written: dict[str, set[int]] = {}
    for array, table in tables.items():
        written[array] = _write_records(array, table, loose.get(array, {}), record_size, write, keep)
    document: dict[str, object] = {"metadata": dict(sorted(metadata.items())), "record_size": record_size}
    extension = extension_of(manifest)
    if extension:
        document[EXTENSION] = extension
    write(METADATA, json.dumps(document, separators=(",", ":")).encode("utf-8"))
    return written


Entry = bytes | Reference


def _not_a_chunk(key: str, entry: Entry) -> bytes:
    """The data of a key that is no chunk of an array (it goes to ``.zmetadata``): a reference is
    refused."""
    if isinstance(entry, Reference):
        raise FormatError(
            f"manifest key {key!r} holds a reference, but is no chunk of an array with a .zarray: "
            "kerchunk's Parquet references keep other keys inline in .zmetadata"
        )
    return entry


def _loose_pages(chunks: list[tuple[int, Entry]], record_size: int) -> dict[int, Page]:
    """``(chunk number, entry)`` pairs as pages of ``record_size`` rows, by record number."""
    chunks.sort(key=lambda pair: pair[0])
    flats = np.array([flat for flat, _ in chunks], dtype=np.int64)
    entries = [entry for _, entry in chunks]
    inline = [at for at, entry in enumerate(entries) if type(entry) is not Reference]
    references = [_NOT_A_REFERENCE if type(e) is not Reference else e for e in entries] if inline else entries
    urls: dict[str, int] = {}
    where = np.array([urls.setdefault(r[0], len(urls)) for r in references], dtype=np.int64)
    columns = np.array([r[1:] for r in references], dtype=np.int64).reshape(len(references), 2)
    where[inline] = INLINE
    pages = {}
    numbers = flats // record_size
    cuts = np.flatnonzero(np.diff(numbers)) + 1
    for positions in np.split(np.arange(len(chunks)), cuts):
        if not len(positions):
            continue
        number = int(numbers[positions[0]])
        first = number * record_size
        rows = flats[positions] - first
        held = {int(flats[at]) - first: entries[at] for at in inline if positions[0] <= at <= positions[-1]}
        page_columns = (where[positions], columns[positions, 0], columns[positions, 1])
        pages[number] = Page.build(first, rows, *page_columns, list(urls), held)
    return pages


_NOT_A_REFERENCE = Reference("", 0, 0)  # stands for inline data in the reference columns


def _write_records(
    array: str,
    table: ArrayReferences,
    loose: dict[int, Page],
    record_size: int,
    write: Writer,
    keep: Keeper | None = None,
) -> set[int]:
    """Write every record of ``table`` (pages of ``record_size`` chunks) that holds something, with the
    ``loose`` chunks (pages by record number) over it, or ``keep`` it when it is the source's record
    unchanged; the records written or kept."""
    numbers = sorted(set(table.numbers()) | set(loose))
    written = set()
    if keep is not None:
        kept = [n for n in numbers if n not in loose and _unchanged(array, table, n, record_size)]
        for number in kept:
            keep(record_name(array, number))
        written.update(kept)
        numbers = [n for n in numbers if n not in written]
    for number, page in table._pages(numbers, changed=True):
        if number in loose:
            over = loose[number]
            if page.held()[0].size:  # the table's own chunks there, with the loose ones over them
                over = page.changed(dict(zip(over.held()[0].tolist(), _entries(over), strict=True)))
            page = over
        if not page.held()[0].size:
            continue
        need = min(record_size, table.count - number * record_size)
        write(record_name(array, number), _record(page, array, table, need, record_size))
        written.add(number)
    return written


def _unchanged(array: str, table: ArrayReferences, number: int, record_size: int) -> bool:
    """Whether record ``number`` of ``table`` is its source's record file as it is: the array's own
    records, in the same layout (``table`` is the loaded one, or :meth:`ArrayReferences.regridded` along its
    first dimension: chunk numbers unchanged), nothing changed in the page, and as many rows of it chunks
    of the grid as before (a last record that was partial is written again: its padding rows are chunks
    now)."""
    source = table.source
    if not isinstance(source, _Records) or source.array != array or source.size != record_size:
        return False
    if table.page_size != record_size or not table.stored(number):
        return False
    rows = source.rows(number)
    return rows > 0 and rows == min(record_size, table.count - number * record_size)


def _entries(page: Page) -> list[Entry | None]:
    return page.entries(page.held()[0])


def _writable_table(manifest: Manifest, array: str, key: str, record_size: int) -> ArrayReferences:
    """``array``'s chunk table over the grid its ``.zarray`` gives (checked), in pages of ``record_size``
    chunks: the manifest's own when it already is that (nothing copied), else a copy in memory."""
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
    if held is None:
        return ArrayReferences(grid, ".", record_size)
    if held.grid == grid and held.page_size == record_size:
        return held
    if held.page_size == record_size and _grown_along_first(held.grid, grid):
        return held.regridded(grid)  # every chunk keeps its number: its records need not be read
    if max(held.count, math.prod(grid)) >= MAX_CHUNKS:
        raise FormatError(f"array {array!r}: a grid of {math.prod(grid)} chunks cannot be laid out again")
    return _repaged(held.materialised(), grid, record_size)


def _grown_along_first(old: tuple[int, ...], new: tuple[int, ...]) -> bool:
    """Whether grid ``new`` is ``old`` grown along its first dimension only (an append)."""
    return len(old) == len(new) > 0 and new[1:] == old[1:] and new[0] > old[0]


def _repaged(whole: ArrayReferences, grid: tuple[int, ...], record_size: int) -> ArrayReferences:
    """A table held in one page, over ``grid`` in pages of ``record_size`` chunks. Chunks keep their
    names; one outside ``grid`` is dropped, reference or not: the table was built over the grid of the
    ``.zarray`` then, so the ``.zarray`` was changed since (a new chunk shape, a smaller shape), and no
    reader would read such a chunk."""
    page = whole.page(0) or Page.empty()
    flats, at = page.held()
    inline = {int(flat): data for flat, data in page.inline.items()}
    if whole.grid != grid:  # the .zarray changed shape since the table was made (rare, so per chunk)
        moved = chunk_numbers([whole.name(f) for f in flats.tolist()], grid)
        inside = moved >= 0
        pairs = zip(flats.tolist(), moved.tolist(), strict=True)
        inline = {m: inline[f] for f, m in pairs if f in inline and m >= 0}
        flats, at = moved[inside], at[inside]
        order = np.argsort(flats, kind="stable")
        flats, at = flats[order], at[order]
    table = ArrayReferences(grid, ".", record_size)
    numbers = flats // record_size
    cuts = np.flatnonzero(np.diff(numbers)) + 1
    for part, positions in zip(np.split(flats, cuts), np.split(at, cuts), strict=True):
        if not len(part):
            continue
        number = int(part[0]) // record_size
        start = number * record_size
        rows = part - start
        held_inline = {row: inline[start + row] for row in rows.tolist() if start + row in inline}
        columns = (page.where[positions], page.offsets[positions], page.lengths[positions])
        table.hold(number, Page.build(start, rows, *columns, page.urls, held_inline))
    return table


def _record(page: Page, array: str, table: ArrayReferences, need: int, record_size: int) -> bytes:
    """One record file from a page: ``record_size`` rows (past ``need``, padding), as kerchunk writes it.
    Built from numpy buffers (``pa.array`` of Python objects would import pandas)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, at = page.held()
    where = np.full(record_size, MISSING, dtype=np.int64)
    offsets = np.zeros(record_size, dtype=np.int64)
    lengths = np.zeros(record_size, dtype=np.int64)
    where[rows], offsets[rows], lengths[rows] = page.where[at], page.offsets[at], page.lengths[at]
    refs = where >= 0
    whole = refs & (lengths == WHOLE)
    if (whole & (offsets != 0)).any():
        flat = page.start + int(np.flatnonzero(whole & (offsets != 0))[0])
        raise FormatError(
            f"chunk {array}/{table.name(flat)} refers to the end of an object from an offset; kerchunk "
            "references name a range or a whole object"
        )
    inline = {row: page.inline[row] for row in rows[where[rows] == INLINE].tolist()}
    empty = refs & (offsets == 0) & (lengths == 0)  # would read as a whole object: store b"" inline
    if empty.any():
        refs &= ~empty
        inline.update(dict.fromkeys(np.flatnonzero(empty).tolist(), b""))

    used, local = np.unique(where[refs], return_inverse=True)
    indices = np.zeros(record_size, dtype=np.int32)
    indices[refs] = local.ravel()
    urls = _text_array([page.urls[i].encode("utf-8") for i in used.tolist()], pa.string())
    # written as it is: a Parquet string column with dictionary pages (as any string column of few values
    # is written), never expanded to one string a row
    path = pa.DictionaryArray.from_buffers(
        pa.dictionary(pa.int32(), pa.string()), record_size, [_bitmap(refs), pa.py_buffer(indices)], urls
    )
    ordered = sorted(inline)
    present = np.zeros(record_size, dtype=bool)
    present[ordered] = True
    sizes = np.zeros(record_size, dtype=np.int64)
    values = [_raw_value(inline[row]) for row in ordered]
    sizes[ordered] = [len(value) for value in values]
    raw = _text_array(values, pa.binary(), sizes, present)
    columns = [
        path,
        _int64_array(np.where(refs & ~whole, offsets, 0)),
        _int64_array(np.where(refs & ~whole, lengths, 0)),
        raw,
    ]
    # offset and size are never null, and declared so; with the pandas metadata, fastparquet (fsspec's
    # default engine, VirtualiZarr's) reads them as int64 rather than as nullable floats
    schema = pa.schema(
        [
            pa.field(name, column.type, nullable=name in ("path", "raw"))
            for name, column in zip(COLUMNS, columns, strict=True)
        ]
    )
    sink = pa.BufferOutputStream()
    # no Arrow schema (kerchunk's files have none), the pandas metadata alone
    with pq.ParquetWriter(
        sink, schema, compression="zstd", write_statistics=False, store_schema=False
    ) as out:
        out.write_table(pa.Table.from_arrays(columns, schema=schema))
        out.add_key_value_metadata({"pandas": PANDAS_METADATA})
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
