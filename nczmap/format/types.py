"""netCDF atomic types and their Zarr dtype spellings in every NCZarr dialect (nczarr-format.md §4)."""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass, replace

from nczmap._lazy import numpy as np
from nczmap.errors import FormatError
from nczmap.format.jsonutil import special_float

MAX_ITEMSIZE = 2**31 - 1  # numpy's largest item: wider fixed-length strings have no dtype
MAX_RANK = 64  # numpy's largest number of dimensions


@dataclass(frozen=True)
class NCType:
    name: str
    code: int  # nc_type number (D0 attribute types use it)
    letter: str  # Zarr dtype kind + size, e.g. "i4"; "" for char/string
    fill: object  # netCDF default fill value

    @property
    def is_integer(self) -> bool:
        return self.letter[:1] in ("i", "u")

    @property
    def is_text(self) -> bool:
        return self.name in ("char", "string")

    def __reduce__(self):  # unpickled as the one type of its name: types are compared by identity
        return _by_name, (self.name,)

    @functools.cached_property
    def numpy(self) -> np.dtype:
        """The native-order numpy dtype of one value (char: ``S1``; string: object)."""
        if self.name == "char":
            return np.dtype("S1")
        if self.name == "string":
            return np.dtype(object)
        return np.dtype(self.letter)


_TYPES = [
    NCType("byte", 1, "i1", -127),
    NCType("char", 2, "", b"\x00"),
    NCType("short", 3, "i2", -32767),
    NCType("int", 4, "i4", -2147483647),
    NCType("float", 5, "f4", struct.unpack("f", struct.pack("f", 9.9692099683868690e36))[0]),
    NCType("double", 6, "f8", 9.9692099683868690e36),
    NCType("ubyte", 7, "u1", 255),
    NCType("ushort", 8, "u2", 65535),
    NCType("uint", 9, "u4", 4294967295),
    NCType("int64", 10, "i8", -9223372036854775806),
    NCType("uint64", 11, "u8", 18446744073709551614),
    NCType("string", 12, "", ""),
]
BY_NAME = {t.name: t for t in _TYPES}


def _by_name(name: str) -> NCType:
    return BY_NAME[name]


BY_CODE = {t.code: t for t in _TYPES}
BY_LETTER = {t.letter: t for t in _TYPES if t.letter}
_INT_RANGES = {
    t.letter: (-(1 << (8 * int(t.letter[1:]) - 1)), (1 << (8 * int(t.letter[1:]) - 1)) - 1)
    if t.letter[0] == "i"
    else (0, (1 << (8 * int(t.letter[1:]))) - 1)
    for t in _TYPES
    if t.is_integer
}
CHAR = BY_NAME["char"]
STRING = BY_NAME["string"]
INT = BY_NAME["int"]
DOUBLE = BY_NAME["double"]
FLOAT = BY_NAME["float"]


def to_float32(value: float) -> float:
    """The nearest float32 as a Python float (as numpy casts: out of range gives infinity)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


@dataclass(frozen=True)
class ParsedDtype:
    """A Zarr dtype string read as netCDF: the type, the storage dtype, and the string width."""

    nctype: NCType
    spec: object  # the storage dtype: a numpy dtype or its spelling (made a dtype only when needed)
    explicit_order: bool  # "<" or ">" given (ncdump -s shows _Endianness)
    maxstrlen: int = 0
    chunk_spec: object = None  # the dtype chunk bytes really have, where not ``spec`` (see host_order)

    @functools.cached_property
    def storage(self) -> np.dtype:
        """The declared dtype (byte order included): what ``.zarray`` says and ``_Endianness`` shows."""
        return np.dtype(self.spec)

    @functools.cached_property
    def chunk(self) -> np.dtype:
        """The dtype of the bytes in chunks: ``storage``, except for :meth:`host_order` ones."""
        return self.storage if self.chunk_spec is None else np.dtype(self.chunk_spec)

    @property
    def host_order(self) -> bool:
        """Declared big-endian, but chunks hold little-endian bytes (netcdf-c 4.8.0-4.9.2, bug 18)."""
        return self.chunk_spec is not None

    def in_host_order(self) -> ParsedDtype:
        """This dtype with chunks read as little-endian, for a multi-byte ``>`` dtype written by a netcdf-c
        release that ignored the declared order (itself otherwise: ``_Endianness`` still shows "big")."""
        if not (self.explicit_order and isinstance(self.spec, str) and self.spec.startswith(">")):
            return self
        return _in_host_order(self)

    @functools.cached_property
    def itemsize(self) -> int:
        """Bytes per stored value, read from the spelling (no numpy needed)."""
        if not isinstance(self.spec, str):
            return self.spec.itemsize
        body = self.spec.lstrip("<>|=")
        return int(body[1:]) * (4 if body[0] == "U" else 1)


@functools.lru_cache(maxsize=64)
def _in_host_order(parsed: ParsedDtype) -> ParsedDtype:
    # the writers' hosts were little-endian: every NCZarr store observed, and what nczarr-format.md assumes
    return replace(parsed, chunk_spec="<" + parsed.spec[1:])


def parse_dtype(text: object, pure_zarr: bool = False, where: str = "") -> ParsedDtype:
    """Zarr dtype string -> netCDF type (§4.2). ``>S1`` is char in NCZarr mode; ``U1`` is 4.8/4.9.0 char."""
    if not isinstance(text, str):
        raise FormatError(f"unsupported dtype {text!r} in {where}")
    parsed = _parse_dtype(text, pure_zarr)
    if isinstance(parsed, str):
        raise FormatError(f"unsupported dtype {text!r} in {where}{parsed}")
    return parsed


@functools.lru_cache(maxsize=256)
def _parse_dtype(text: str, pure_zarr: bool) -> ParsedDtype | str:
    """The parsed dtype, or the reason it is not a netCDF type (cached: stores repeat a few dtypes)."""
    if len(text) < 2:
        return ""
    order, body = (text[0], text[1:]) if text[0] in "<>|" else ("|", text)
    letter, size = body[:1], body[1:]
    if not size.isdigit():
        return ""
    if letter == "S":
        width = int(size)
        if width > MAX_ITEMSIZE:
            return f": a width of {width} bytes is more than the {MAX_ITEMSIZE} a value can have"
        if width == 1 and order == ">" and not pure_zarr:
            return ParsedDtype(CHAR, "S1", False)
        return ParsedDtype(STRING, f"S{width}", False, width)
    if letter == "U" and size == "1":
        return ParsedDtype(CHAR, f"{'<' if order == '|' else order}U1", False)
    nctype = BY_LETTER.get(body)
    if nctype is None:
        return ": not a netCDF atomic type"
    return ParsedDtype(nctype, ("=" if order == "|" else order) + body, order in "<>" and int(size) > 1)


def check_rank(shape: list, key: str) -> None:
    """FormatError naming the array when it has more dimensions than numpy can hold."""
    if len(shape) > MAX_RANK:
        raise FormatError(f"array {key!r}: {len(shape)} dimensions, more than numpy's {MAX_RANK}")


def dtype_string(nctype: NCType, byteorder: str = "<", maxstrlen: int = 128, char: str = ">S1") -> str:
    """The dtype netcdf-c writes for a variable or attribute of this type (§4.1); ``char`` is the
    dialect's spelling of NC_CHAR (``Dialect.char_dtype``)."""
    if nctype is CHAR:
        return char
    if nctype is STRING:
        return f"|S{maxstrlen}"
    return byteorder + nctype.letter


def type_of_numpy(dtype: np.dtype) -> NCType:
    """The netCDF type of a numpy dtype (``S1``/``U1`` -> char, other ``S``/``U``/object -> string)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "SU":
        return (
            CHAR
            if dtype.itemsize in (1, 4) and dtype.kind == ("S" if dtype.itemsize == 1 else "U")
            else STRING
        )
    if dtype.kind == "O":
        return STRING
    if dtype.kind == "b":
        return BY_NAME["ubyte"]
    nctype = BY_LETTER.get(f"{dtype.kind}{dtype.itemsize}")
    if nctype is None:
        raise FormatError(f"numpy dtype {dtype} has no netCDF type")
    return nctype


def infer_json_type(value: object) -> NCType | None:
    """netcdf-c 4.9.1+'s type for an untyped JSON attribute value; None means 'complex JSON' (char text)."""
    if isinstance(value, list):
        if not value or any(isinstance(v, (list, dict)) or v is None for v in value):
            return None
        first = infer_json_type(value[0])
        if first is CHAR:
            return None if len(value) > 1 else CHAR
        return _widest(value) if first is not None and first.is_integer else first
    if isinstance(value, bool):
        return BY_NAME["ubyte"]
    if isinstance(value, int):
        return _int_type(value)
    if isinstance(value, float):
        return DOUBLE
    if isinstance(value, str):
        return CHAR
    return None


def _int_type(value: int) -> NCType:
    if value < 0:
        return INT if value >= -(2**31) else BY_NAME["int64"]
    if value <= 2**31 - 1:
        return INT
    if value <= 2**32 - 1:
        return BY_NAME["uint"]
    return BY_NAME["uint64"] if value >= 2**63 - 1 else BY_NAME["int64"]


def _widest(values: list) -> NCType:
    if any(isinstance(v, (float, str)) for v in values):
        return DOUBLE
    return _int_type(min(values)) if min(values) < 0 else _int_type(max(values))


def convert_value(value: object, nctype: NCType, where: str) -> object:
    """One JSON value as a Python number of ``nctype`` (NaN/Infinity spellings accepted for floats)."""
    if isinstance(value, str):
        number = special_float(value)
        if number is None or nctype.letter[:1] != "f":
            raise FormatError(f"{where}: {value!r} is not a {nctype.name}")
        return number
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, (int, float)):
        raise FormatError(f"{where}: {value!r} is not a {nctype.name}")
    if nctype.is_integer:
        if isinstance(value, float) and not value.is_integer():
            raise FormatError(f"{where}: {value!r} is not a {nctype.name}")
        low, high = _INT_RANGES[nctype.letter]
        if not low <= int(value) <= high:
            raise FormatError(f"{where}: {value!r} is out of range for {nctype.name}")
        return int(value)
    return float(value)
