"""netCDF-3 sources: classic (CDF-1), 64-bit offset (CDF-2) and 64-bit data (CDF-5) files.

The header (big-endian throughout) gives the whole model: one root group, its dimensions (the one of
length 0 is the unlimited dimension, as long as ``numrecs``), global and variable attributes, and each
variable's type, dimensions and ``begin``. The data is never compressed:

- a fixed-size variable is one ``contiguous`` run of bytes at ``begin``;
- a record variable is ``chunked``, one chunk per record: record ``r`` of it starts at ``begin + r *
  recsize``, where ``recsize`` is the sum of the record variables' sizes, each padded to 4 bytes, but
  unpadded when a single record variable makes up the whole record (netCDF-C's special case).

Every header value is checked against the bytes that remain before anything is made from it, so a
hostile header fails with a :class:`~nczmap.errors.FormatError` naming the file and the problem.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from nczmap.errors import FormatError, NCZError
from nczmap.format import Attribute, Dimension, Group
from nczmap.format.types import BY_CODE, CHAR, NCType
from nczmap.format.variable import ArrayLayout
from nczmap.integrations.virtualize.parsed import (
    ParsedFile,
    ParseOptions,
    SourceVariable,
    Storage,
    native_dtype,
    source_layout,
)

FORMAT = "netCDF-3"  # how messages name the format
VERSIONS = {1: "CDF-1", 2: "CDF-2", 5: "CDF-5"}
TAG_DIMENSION, TAG_VARIABLE, TAG_ATTRIBUTE = 10, 11, 12
# nc_type -> the big-endian dtype of its stored values; CDF-1 and CDF-2 have the first six only
STORAGE_DTYPES = {
    1: "i1",
    2: "S1",
    3: ">i2",
    4: ">i4",
    5: ">f4",
    6: ">f8",
    7: "u1",
    8: ">u2",
    9: ">u4",
    10: ">i8",
    11: ">u8",
}
CLASSIC_TYPES = 6
HEADER_BLOCK = 64 << 10  # the header is read in blocks this large (it is parsed in 4- and 8-byte steps)
BAD_NAME = re.compile(r"[/\x00-\x1f\x7f]")
MAX_NUMPY_DIMS = 64
MAX_VAR_DIMS = 1024  # NC_MAX_VAR_DIMS
# One chunk per record costs 8 bytes per axis plus 16 in the index; a file whose records would need more
# index than this (per byte of the file, or at least INDEX_FLOOR) is refused rather than allowed to take
# the memory: only a crafted header (records of many axes and a few bytes each) comes near it.
INDEX_PER_FILE_BYTE = 48
INDEX_FLOOR = 64 << 20


class SourceFile(Protocol):
    name: str
    size: int

    def read(self, offset: int, length: int) -> bytes: ...


def sniff(read: Callable[[int, int], bytes], size: int) -> bool:
    """Whether the file starts with a netCDF-3 signature (``CDF`` and version 1, 2 or 5)."""
    if size < 4:
        return False
    try:
        head = read(0, 4)
    except NCZError:
        return False
    return head[:3] == b"CDF" and head[3] in VERSIONS


def parse(file: SourceFile, options: ParseOptions) -> ParsedFile:
    """The model of a netCDF-3 file and where each variable's bytes are (``options`` changes nothing:
    contiguous data is split by the combiner)."""
    header = _Header.read(file)
    layout = _RecordLayout.of(header, file.size)
    root = Group("/", None)
    root.attrs.load(header.attributes)
    dimensions = [
        Dimension(name, layout.numrecs if length == 0 else length, length == 0, root)
        for name, length in header.dimensions
    ]
    for dimension in dimensions:
        root.dimensions[dimension.name] = dimension
    for var in header.variables:
        if var.name in root.variables:
            raise header.error(f"two variables are named {var.name!r}")
        dims = [dimensions[dimid] for dimid in var.dimids]
        storage = _storage(file, var, dims, layout)
        variable = SourceVariable(root, var.name, dims, _array_layout(var, dims), storage)
        variable.attrs.load(var.attributes)
        root.variables[var.name] = variable
    return ParsedFile(file.name, root, format="netcdf3")


# ------------------------------------------------------------------------------------- the header
@dataclass
class _Var:
    name: str
    dimids: list[int]
    attributes: dict[str, Attribute]
    nctype: NCType
    dtype: np.dtype  # the stored (big-endian) dtype
    begin: int

    def shape(self, dims: list[Dimension]) -> tuple[int, ...]:
        return tuple(dim.size for dim in dims)

    def is_record(self, header: _Header) -> bool:
        return bool(self.dimids) and header.dimensions[self.dimids[0]][1] == 0

    def slice_bytes(self, header: _Header) -> int:
        """Bytes of one record (a record variable) or of all values (a fixed one), without padding."""
        lengths = [header.dimensions[d][1] for d in self.dimids[1 if self.is_record(header) else 0 :]]
        return math.prod(lengths) * self.dtype.itemsize


@dataclass
class _Header:
    file: SourceFile
    version: int
    numrecs: int  # -1 while streaming (the record count is not recorded: the file size tells it)
    dimensions: list[tuple[str, int]]  # (name, length in the header: 0 for the unlimited one)
    attributes: dict[str, Attribute]
    variables: list[_Var]

    def error(self, message: str) -> FormatError:
        return _error(self.file, message)

    @classmethod
    def read(cls, file: SourceFile) -> _Header:
        head = file.read(0, 4) if file.size >= 4 else b""
        if len(head) < 4 or head[:3] != b"CDF" or head[3] not in VERSIONS:
            raise _error(file, f"it does not start with a netCDF-3 signature ({head!r})")
        cursor = _Cursor(file, head[3])
        header = cls(file, head[3], _numrecs(cursor), [], {}, [])
        header.dimensions = _dimensions(cursor)
        header.attributes = _attributes(cursor, "the global attributes")
        header.variables = _variables(cursor, header)
        return header


def _error(file: SourceFile, message: str) -> FormatError:
    return FormatError(f"netCDF-3 file {file.name}: {message}")


class _Cursor:
    """Reads the header front to back: 4-byte tags and types, ``count``-sized counts, ``offset``-sized
    ``begin`` values, each checked against the end of the file first."""

    def __init__(self, file: SourceFile, version: int) -> None:
        self.file = file
        self.version = version
        self.count_size = 8 if version == 5 else 4
        self.offset_size = 4 if version == 1 else 8
        self.pos = 4
        self.start = 4
        self.buffer = b""

    def error(self, message: str) -> FormatError:
        return _error(self.file, message)

    @property
    def remaining(self) -> int:
        return self.file.size - self.pos

    def take(self, length: int, what: str) -> bytes:
        if length > self.remaining:
            raise self.error(
                f"the header is truncated: {what} needs {length} bytes at offset {self.pos}, "
                f"past the end of the file ({self.file.size} bytes)"
            )
        end = self.pos + length
        if end > self.start + len(self.buffer):  # the cursor only moves forward
            self.start = self.pos
            self.buffer = self.file.read(self.pos, min(max(length, HEADER_BLOCK), self.remaining))
        data = self.buffer[self.pos - self.start : end - self.start]
        self.pos = end
        return data

    def unsigned(self, size: int, what: str) -> int:
        return int.from_bytes(self.take(size, what), "big")

    def count(self, what: str) -> int:
        """A count or size: 32 bits (CDF-1, CDF-2) or a signed 64-bit integer that must not be negative."""
        value = self.unsigned(self.count_size, what)
        if self.count_size == 8 and value >= 1 << 63:
            raise self.error(f"{what} is negative ({value - (1 << 64)})")
        return value

    def padded(self, length: int, what: str) -> bytes:
        """``length`` bytes, then the padding to a multiple of 4."""
        return self.take(length + (-length % 4), what)[:length]


def _numrecs(cursor: _Cursor) -> int:
    value = cursor.unsigned(cursor.count_size, "numrecs")
    if value == (1 << (8 * cursor.count_size)) - 1:
        return -1  # STREAMING
    if value >= 1 << 63:
        raise cursor.error(f"numrecs is negative ({value - (1 << 64)})")
    return value


def _list(cursor: _Cursor, tag: int, what: str, smallest: int) -> int:
    """The element count of a dimension, attribute or variable list (0 for ABSENT)."""
    found = cursor.unsigned(4, f"the tag of {what}")
    count = cursor.count(f"the number of {what}")
    if count == 0:
        return 0  # ABSENT, whatever the tag (as netCDF-C reads it)
    if found != tag:
        raise cursor.error(f"{what} have tag {found:#x}, not {tag:#x}")
    if count > cursor.remaining // smallest:
        raise cursor.error(
            f"{count} {what} claimed, but only {cursor.remaining} bytes of the file remain "
            f"(at least {smallest} each)"
        )
    return count


def _name(cursor: _Cursor, what: str) -> str:
    length = cursor.count(f"the name length of {what}")
    if length == 0:
        raise cursor.error(f"{what} has an empty name")
    if length > cursor.remaining:
        raise cursor.error(
            f"the name length of {what} is {length} bytes, "
            f"past the end of the file ({cursor.file.size} bytes)"
        )
    raw = cursor.padded(length, f"the name of {what}")
    try:
        name = unicodedata.normalize("NFC", raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise cursor.error(f"the name of {what} is not UTF-8: {raw[:64]!r}") from None
    if BAD_NAME.search(name):
        raise cursor.error(f"the name of {what}, {name!r}, has a '/' or a control character")
    return name


def _type(cursor: _Cursor, what: str) -> tuple[NCType, np.dtype]:
    code = cursor.unsigned(4, f"the type of {what}")
    if code not in STORAGE_DTYPES or (cursor.version != 5 and code > CLASSIC_TYPES):
        raise cursor.error(f"{what} has nc_type {code}, unknown in {VERSIONS[cursor.version]}")
    return BY_CODE[code], np.dtype(STORAGE_DTYPES[code])


def _dimensions(cursor: _Cursor) -> list[tuple[str, int]]:
    count = _list(cursor, TAG_DIMENSION, "dimensions", 2 * cursor.count_size + 4)
    found: list[tuple[str, int]] = []
    for index in range(count):
        name = _name(cursor, f"dimension {index}")
        found.append((name, cursor.count(f"the length of dimension {name!r}")))
    seen: set[str] = set()
    for name, _ in found:
        if name in seen:
            raise cursor.error(f"two dimensions are named {name!r}")
        seen.add(name)
    unlimited = [name for name, length in found if length == 0]
    if len(unlimited) > 1:
        raise cursor.error(f"more than one dimension is unlimited (length 0): {unlimited[:2]}")
    return found


def _attributes(cursor: _Cursor, where: str) -> dict[str, Attribute]:
    count = _list(cursor, TAG_ATTRIBUTE, f"attributes of {where}", 2 * cursor.count_size + 8)
    found: dict[str, Attribute] = {}
    for index in range(count):
        name = _name(cursor, f"attribute {index} of {where}")
        what = f"attribute {name!r} of {where}"
        if name in found:
            raise cursor.error(f"{where} has two attributes named {name!r}")
        nctype, dtype = _type(cursor, what)
        length = cursor.count(f"the number of values of {what}")
        if length > cursor.remaining // dtype.itemsize:
            raise cursor.error(
                f"{what} claims {length} values of {nctype.name}, past the end of the file "
                f"({cursor.remaining} bytes remain)"
            )
        found[name] = _attribute(name, nctype, dtype, cursor.padded(length * dtype.itemsize, what))
    return found


def _attribute(name: str, nctype: NCType, dtype: np.dtype, raw: bytes) -> Attribute:
    if nctype is CHAR:
        if raw == b"\x00":
            raw = b""  # netCDF-C stores an empty char attribute as one NUL
        return Attribute(name, CHAR, raw.decode("utf-8", "surrogateescape"))
    return Attribute(name, nctype, np.frombuffer(raw, dtype).astype(nctype.numpy))


def _variables(cursor: _Cursor, header: _Header) -> list[_Var]:
    smallest = 3 * cursor.count_size + 4 + (4 + cursor.count_size) + 4 + cursor.offset_size
    count = _list(cursor, TAG_VARIABLE, "variables", smallest)
    return [_variable(cursor, header, index) for index in range(count)]


def _variable(cursor: _Cursor, header: _Header, index: int) -> _Var:
    name = _name(cursor, f"variable {index}")
    what = f"variable {name!r}"
    ndims = cursor.count(f"the number of dimensions of {what}")
    if ndims > cursor.remaining // cursor.count_size:
        raise cursor.error(f"{what} claims {ndims} dimensions, past the end of the file")
    if ndims > MAX_VAR_DIMS:
        raise cursor.error(f"{what} has {ndims} dimensions, more than netCDF's {MAX_VAR_DIMS}")
    dimids = [cursor.count(f"a dimension id of {what}") for _ in range(ndims)]
    for position, dimid in enumerate(dimids):
        if dimid >= len(header.dimensions):
            raise cursor.error(
                f"{what} uses dimension id {dimid}, out of range (the file has {len(header.dimensions)})"
            )
        if position and header.dimensions[dimid][1] == 0:
            raise cursor.error(f"{what} uses the unlimited dimension other than first (axis {position})")
    attributes = _attributes(cursor, what)
    nctype, dtype = _type(cursor, what)
    cursor.count(f"the vsize of {what}")  # netCDF-C recomputes it from the shape (it overflows 32 bits)
    begin = cursor.unsigned(cursor.offset_size, f"the begin offset of {what}")
    if begin >= 1 << 63:
        raise cursor.error(f"the begin offset of {what} is negative ({begin - (1 << 64)})")
    return _Var(name, dimids, attributes, nctype, dtype, begin)


# ------------------------------------------------------------------------------------- the data
@dataclass
class _RecordLayout:
    numrecs: int
    recsize: int

    @classmethod
    def of(cls, header: _Header, size: int) -> _RecordLayout:
        records = [var for var in header.variables if var.is_record(header)]
        padded = [_padded(var.slice_bytes(header)) for var in records]
        recsize = sum(padded)
        if records and recsize == padded[0]:
            recsize = records[0].slice_bytes(header)  # one record variable: records are not padded
        numrecs = header.numrecs
        if numrecs < 0:
            start = records[0].begin if records else size
            numrecs = (size - start) // recsize if recsize and start <= size else 0
        layout = cls(numrecs, recsize)
        for var in header.variables:
            layout.check_extent(header, var, size)
        layout.check_index(header, records, size)
        return layout

    def check_index(self, header: _Header, records: list[_Var], size: int) -> None:
        cost = sum(8 * (len(var.dimids) + 2) for var in records if var.slice_bytes(header)) * self.numrecs
        if cost > max(INDEX_FLOOR, INDEX_PER_FILE_BYTE * size):
            raise header.error(
                f"its {self.numrecs} records of {len(records)} record variables would need {cost} bytes of "
                f"chunk index, more than {INDEX_PER_FILE_BYTE} per byte of the file"
            )

    def check_extent(self, header: _Header, var: _Var, size: int) -> None:
        nbytes = var.slice_bytes(header)
        end = var.begin + nbytes
        if var.is_record(header):
            # no record, no bytes: netCDF-C places record variables past the end of a file without records
            end = var.begin + (self.numrecs - 1) * self.recsize + nbytes if self.numrecs and nbytes else 0
        if end > size:
            raise header.error(
                f"variable {var.name!r} at begin offset {var.begin} needs the file's bytes up to {end}, "
                f"past its end ({size} bytes)"
            )


def _padded(nbytes: int) -> int:
    return nbytes + (-nbytes % 4)


def _array_layout(var: _Var, dims: list[Dimension]) -> ArrayLayout:
    shape = var.shape(dims)
    record = bool(dims) and dims[0].unlimited
    chunks = (1, *(max(1, n) for n in shape[1:])) if record else tuple(max(1, n) for n in shape)
    return source_layout(shape, chunks, native_dtype(var.nctype, var.dtype), _fill(var), scalar=not dims)


def _fill(var: _Var) -> object:
    """The ``_FillValue`` attribute (of the variable's type), else netCDF's default fill for the type."""
    attribute = var.attributes.get("_FillValue")
    if attribute is not None and attribute.nctype is var.nctype:
        if var.nctype is CHAR:
            raw = attribute.value.encode("utf-8", "surrogateescape")
            if raw:
                return raw[:1]
        elif len(attribute.value):
            return attribute.value[0]
    if var.nctype is CHAR:
        return var.nctype.fill
    return np.asarray(var.nctype.fill, dtype=var.nctype.numpy)[()]


def _storage(file: SourceFile, var: _Var, dims: list[Dimension], layout: _RecordLayout) -> Storage:
    shape = var.shape(dims)
    if dims and dims[0].unlimited:
        return _record_storage(file, var, shape, layout)
    storage = Storage(file.name, "contiguous", shape, offset=var.begin, read=file.read)
    nbytes = math.prod(shape) * var.dtype.itemsize
    storage.values = functools.partial(_values, file, var, 1, 0, nbytes, shape)
    return storage


def _record_storage(file: SourceFile, var: _Var, shape: tuple[int, ...], layout: _RecordLayout) -> Storage:
    rest = shape[1:]
    storage = Storage(file.name, "chunked", shape, (1, *(max(1, n) for n in rest)), read=file.read)
    nbytes = math.prod(rest) * var.dtype.itemsize
    records = layout.numrecs if nbytes else 0  # an empty record holds no chunk
    corners = np.zeros((records, len(shape)), dtype="q")
    corners[:, 0] = np.arange(records)
    storage.corners.frombytes(corners.tobytes())
    storage.offsets.frombytes((var.begin + np.arange(records, dtype="q") * layout.recsize).tobytes())
    storage.sizes.frombytes(np.full(records, nbytes, dtype="q").tobytes())
    storage.values = functools.partial(_values, file, var, records, layout.recsize, nbytes, shape)
    return storage


def _values(file: SourceFile, var: _Var, records: int, step: int, nbytes: int, shape: tuple[int, ...]):
    """A variable's values: ``nbytes`` at its start, and at every ``step`` bytes after it for each of
    ``records`` (a picklable ``values``)."""
    offsets = (var.begin + r * step for r in range(records))
    return _decode(file, var, _read_all(file, offsets, nbytes), shape)


def _read_all(file: SourceFile, offsets: Iterable[int], nbytes: int) -> bytes:
    return b"".join(file.read(offset, nbytes) for offset in offsets) if nbytes else b""


def _decode(file: SourceFile, var: _Var, data: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """The values in native byte order."""
    if len(shape) > MAX_NUMPY_DIMS:
        raise _error(
            file, f"variable {var.name!r} has {len(shape)} dimensions: numpy loads at most {MAX_NUMPY_DIMS}"
        )
    return np.frombuffer(data, var.dtype).reshape(shape).astype(var.dtype.newbyteorder("="))
