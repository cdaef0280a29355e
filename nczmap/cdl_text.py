"""Text and numbers as netcdf-c's ``ncdump`` prints them: names escaped (``escaped_name``), attribute
values (``pr_att_valgs``: type suffixes, ``%#.7g``/``%#.15g`` with trailing zeros trimmed), text quoted and
escaped for attributes and data, data values (``_`` for fills, NaN/Infinity, ``C_format``), and rows broken
into 80-column lines as ``lput`` breaks them. :mod:`nczmap.cdl` prints datasets with them.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import NamedTuple

from nczmap._lazy import numpy as np
from nczmap.errors import NCZError
from nczmap.format.model import Attribute
from nczmap.format.types import BY_NAME

MAX_LINE_LEN = 80 - 2  # vardata.c: set_max_len(80) stores len - 2
CONTINUATION = b"    "  # LINEPIND
FILL_STRING = b"_"
KEYWORDS = frozenset(["variables", "dimensions", "data", "group", "types"])
_NAME_SPECIALS = frozenset(b" !\"#$&'()*,:;<=>?[]\\^`{|}~")
_NAME_NEEDS_WORK = re.compile(b"[" + re.escape(bytes(sorted(_NAME_SPECIALS | {*range(0x20), 0x7F}))) + b"]")
ATT_SUFFIX = {
    "byte": "b",
    "short": "s",
    "ubyte": "UB",
    "ushort": "US",
    "uint": "U",
    "int64": "LL",
    "uint64": "ULL",
}
FLOAT_DATA_FORMAT = "%.7g"
DOUBLE_DATA_FORMAT = "%.15g"
_FLT_EPSILON = 2.0**-23  # FLT_EPSILON
_DBL_EPSILON = 2.0**-52  # DBL_EPSILON


class BadName(NCZError):
    """A name ncdump refuses to print: it begins with a space or a control character."""

    nc_code = -59  # NC_EBADNAME


# ============================================================================ text and number formatting
def encode_text(text: str) -> bytes:
    """A str as the UTF-8 bytes netcdf-c holds (lone surrogates from undecodable bytes map back)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


@functools.lru_cache(maxsize=8192)  # dimension and attribute names repeat on every variable
def escaped_name(name: str | bytes) -> bytes:
    """A name with CDL's special characters escaped (utils.c ``escaped_name``)."""
    raw = encode_text(name) if isinstance(name, str) else name
    if _NAME_NEEDS_WORK.search(raw) is None and not raw[:1].isdigit():
        return raw  # the common case: nothing to escape
    if raw and (0x01 <= raw[0] <= 0x20 or raw[0] == 0x7F):
        raise BadName(f"name begins with space or control-character: {raw[:1].decode('latin-1')!r}")
    out = bytearray(b"\\" if raw[:1].isdigit() else b"")
    for byte in raw:
        if byte < 0x20 or byte == 0x7F:
            out += b"\\%%%.2x" % byte
        elif byte in _NAME_SPECIALS:
            out += b"\\" + bytes([byte])
        else:
            out.append(byte)
    return bytes(out)


def printf(fmt: str, value: object) -> str:
    """C ``printf`` of one value; Python's %-formatting of floats is C's (same digits, 2-digit exponents)."""
    return fmt % value


_TRAILING_ZEROS = re.compile(r"^(-?[0-9.]*?)0+(?=[^0-9.]|$)")


def tztrim(text: str) -> str:
    """Remove trailing zeros after the decimal point, keeping the point and any exponent (ncdump.c)."""
    return _TRAILING_ZEROS.sub(r"\1", text, count=1)


def format_float_att(value: float) -> str:
    """One float attribute value: ``%#.7gf`` trimmed, or ``NaNf``/``Infinityf``/``-Infinityf``."""
    return _real_att("%#.7gf", "f", float(np.float32(value)))


def format_double_att(value: float) -> str:
    """One double attribute value: ``%#.15g`` trimmed, or ``NaN``/``Infinity``/``-Infinity``."""
    return _real_att("%#.15g", "", float(value))


def _real_att(fmt: str, suffix: str, value: float) -> str:
    if value and math.isfinite(value):  # 0.0 == -0.0 as cache keys: zeros are not cached
        return _trimmed(fmt, value)
    if math.isfinite(value):
        return tztrim(printf(fmt, value))
    return ("NaN" if math.isnan(value) else ("-Infinity" if value < 0 else "Infinity")) + suffix


@functools.lru_cache(maxsize=4096)  # fill values, scale factors... repeat on many variables
def _trimmed(fmt: str, value: float) -> str:
    return tztrim(printf(fmt, value))


def _octal(byte: int) -> bytes:
    return b"\\%03o" % byte


_COMMON_ESCAPES = {
    0x08: b"\\b", 0x0C: b"\\f", 0x0D: b"\\r", 0x09: b"\\t", 0x0B: b"\\v",
    0x5C: b"\\\\", 0x27: b"\\'", 0x22: b'\\"',
}  # fmt: skip
_ATT_ESCAPES = {**_COMMON_ESCAPES, 0x0A: b"\\n"}
# netCDF-3 files: ncdump breaks a char attribute's text after each newline (not for netCDF-4 and NCZarr,
# where that would read as a list of strings)
_CLASSIC_ATT_ESCAPES = {**_COMMON_ESCAPES, 0x0A: b'\\n",\n\t\t\t"'}
_CHAR_DATA_ESCAPES = {**_COMMON_ESCAPES, 0x0A: b'\\n",\n    "'}
_STRING_DATA_ESCAPES = {**_COMMON_ESCAPES, 0x0A: b"\\n", 0x0B: b"\\n"}  # sic: ncstring_typ_tostring


def is_cntrl(byte: int) -> bool:
    return byte < 0x20 or byte == 0x7F


def _is_print(byte: int) -> bool:
    return 0x20 <= byte < 0x7F


def _escape(raw: bytes, table: dict[int, bytes], plain: Callable[[int], bool]) -> bytes:
    if _plain_pattern(table, plain).search(raw) is None:
        return b'"' + raw + b'"'  # the common case: nothing to escape
    out = bytearray(b'"')
    for byte in raw:
        escape = table.get(byte)
        if escape is not None:
            out += escape
        elif plain(byte):
            out.append(byte)
        else:
            out += _octal(byte)
    out += b'"'
    return bytes(out)


_PLAIN_PATTERNS: dict[tuple[int, int], re.Pattern[bytes]] = {}


def _plain_pattern(table: dict[int, bytes], plain: Callable[[int], bool]) -> re.Pattern[bytes]:
    """A pattern matching any byte that :func:`_escape` would not copy as it is."""
    cache_key = (id(table), id(plain))
    pattern = _PLAIN_PATTERNS.get(cache_key)
    if pattern is None:
        special = bytes(b for b in range(256) if b in table or not plain(b))
        pattern = _PLAIN_PATTERNS[cache_key] = re.compile(b"[" + re.escape(special) + b"]")
    return pattern


def _not_cntrl(byte: int) -> bool:
    return not is_cntrl(byte)


def quote_att_text(raw: bytes, classic: bool = False) -> bytes:
    """A text attribute value as ncdump prints it (``pr_att_string``; trailing NULs dropped)."""
    return _escape(raw.rstrip(b"\x00"), _CLASSIC_ATT_ESCAPES if classic else _ATT_ESCAPES, _not_cntrl)


def quote_char_data(raw: bytes) -> bytes:
    """One row of a char variable (``pr_tvals``): non-printable bytes, UTF-8 included, as octal."""
    return _escape(raw.rstrip(b"\x00"), _CHAR_DATA_ESCAPES, _is_print)


def quote_string_data(raw: bytes) -> bytes:
    """One value of a string variable (``ncstring_typ_tostring``; ``\\v`` is printed as ``\\n``)."""
    return _escape(raw.split(b"\x00", 1)[0], _STRING_DATA_ESCAPES, _not_cntrl)


def format_attribute_values(nctype: str, value: object) -> bytes:
    """The text after ``name = `` of one attribute (``pr_att_valgs``)."""
    return attribute_text(Attribute("", BY_NAME[nctype], value))


def attribute_text(attribute: Attribute, classic: bool = False) -> bytes:
    """:func:`format_attribute_values` of an :class:`Attribute` (numbers read need no numpy); ``classic``:
    as ncdump prints it for a netCDF-3 file."""
    nctype = attribute.nctype.name
    if nctype in ("char", "string"):
        return _format_text_values(nctype, attribute.value, classic)
    return _format_numbers(nctype, attribute.numbers())


def _format_text_values(nctype: str, value: object, classic: bool = False) -> bytes:
    if nctype == "char" or (not isinstance(value, str) and len(value) == 0):
        return quote_att_text(encode_text(value) if isinstance(value, str) else b"", classic)
    return b", ".join(quote_att_text(encode_text(s).split(b"\x00", 1)[0]) for s in value)


def _format_numbers(nctype: str, numbers: list) -> bytes:
    """Numbers exactly of the attribute's type (a float's value is a float32's) as ncdump prints them."""
    if not numbers:
        return b'""'
    if nctype == "float":
        items = [_real_att("%#.7gf", "f", v) for v in numbers]
    elif nctype == "double":
        items = [format_double_att(v) for v in numbers]
    else:
        suffix = ATT_SUFFIX.get(nctype, "")
        items = [f"{int(v)}{suffix}" for v in numbers]
    return ", ".join(items).encode("ascii")


# ============================================================================ data values
class ValueFormatter:
    """Turns a block of one variable's values into the strings ncdump prints (``_`` for fill)."""

    def __init__(
        self, nctype: str, fill: object, c_format: str | None = None, empty_is_null: bool = True
    ) -> None:
        self.nctype = nctype
        self.fill = fill  # None: no fill value is recognised
        self.empty_is_null = empty_is_null  # an empty string reads as NULL (NCZarr), not "" (HDF5)
        self.c_format = _python_format(c_format) if c_format else None

    def __call__(self, values: np.ndarray) -> list[bytes]:
        flat = values.reshape(-1)
        if self.nctype == "string":
            return [self._string(v) for v in flat.tolist()]
        texts = self._numbers(flat)
        if self.fill is not None:
            for index in np.flatnonzero(self._fill_mask(flat)).tolist():
                texts[index] = FILL_STRING
        return texts

    def joined(self, values: np.ndarray, separator: bytes) -> bytes | None:
        """All values formatted and joined in one C-level call, or None when some value needs more than
        the plain format (a fill ``_``, NaN, Infinity, strings, C_format conversions)."""
        if self.nctype == "string" or self.c_format is not None or not values.size:
            return None
        if self.nctype in ("float", "double"):
            if not np.isfinite(values).all():
                return None
            fmt = FLOAT_DATA_FORMAT if self.nctype == "float" else DOUBLE_DATA_FORMAT
        else:
            fmt = "%d"
        if self.fill is not None and self._may_hold_fill(values) and self._fill_mask(values).any():
            return None
        text = separator.decode().join([fmt] * values.size) % tuple(values.tolist())
        return text.encode("ascii")

    def _string(self, value: str | None) -> bytes:
        if value == "" and self.empty_is_null:
            value = None  # NCZarr returns NULL for a string whose first byte is NUL
        if value is not None and value == self.fill:
            return FILL_STRING
        return b"NIL" if value is None else quote_string_data(encode_text(value))

    def _numbers(self, flat: np.ndarray) -> list[bytes]:
        values = flat.tolist()
        if self.nctype in ("float", "double"):
            special = "f" if self.nctype == "float" else ""
            fmt = self.c_format or (FLOAT_DATA_FORMAT if special else DOUBLE_DATA_FORMAT)
            if fmt[-1] not in "eEfFgG":
                return [_format_real(fmt, v, special) for v in values]
            texts = _format_all(fmt, values)
            for index in np.flatnonzero(~np.isfinite(flat)).tolist():
                texts[index] = _format_real(fmt, values[index], special)
            return texts
        if self.c_format is not None:
            return [_c_format(self.c_format, v) for v in values]
        return _format_all("%d", values)

    def _may_hold_fill(self, values: np.ndarray) -> bool:
        """False when no value can be the fill (:meth:`_fill_mask` all false), known from the extremes
        alone: a finite real fill ``f`` matches only values of its sign within a relative epsilon, so
        all of them are below ``|f| / (1 + 4ε)`` or above ``|f| / (1 - 4ε)`` in magnitude (four times
        the epsilon :func:`_float_equals` allows, for its rounding). True: look at every value."""
        if self.nctype not in ("float", "double"):
            return True
        fill = float(self.fill)
        if fill == 0 or not math.isfinite(fill):
            return True
        slack = 4 * (_FLT_EPSILON if self.nctype == "float" else _DBL_EPSILON)
        low, high = float(values.min()), float(values.max())
        near, far = fill / (1 + slack), fill / (1 - slack)  # |near| < |fill| < |far|
        if fill > 0:
            return not (high < near or low > far)
        return not (high < far or low > near)

    def _fill_mask(self, flat: np.ndarray) -> np.ndarray:
        if self.nctype == "float":
            return _float_equals(np.float32(self.fill), flat.astype(np.float32), np.float32(_FLT_EPSILON))
        if self.nctype == "double":
            return _float_equals(np.float64(self.fill), flat.astype(np.float64), _DBL_EPSILON)
        return flat == self.fill


def _format_all(fmt: str, values: list) -> list[bytes]:
    """``fmt % v`` for every value in one C-level formatting call (NUL never occurs in a number)."""
    if not values:
        return []
    return ("\0".join([fmt] * len(values)) % tuple(values)).encode("ascii").split(b"\0")


def _format_real(fmt: str, value: float, suffix: str) -> bytes:
    if math.isfinite(value):
        return (fmt % value).encode("ascii") if fmt[-1] in "eEfFgG" else _c_format(fmt, value)
    if math.isnan(value):
        return b"NaN" + suffix.encode()
    return (b"-Infinity" if value < 0 else b"Infinity") + suffix.encode()


def _float_equals(fill, values: np.ndarray, epsilon) -> np.ndarray:
    """``ncfloat_val_equals``/``ncdouble_val_equals``: equal within epsilon, NaN == NaN, inf == inf."""
    with np.errstate(invalid="ignore", over="ignore"):
        same_side = (fill > 0) == (values > 0)
        close = np.isfinite(fill) & np.isfinite(values) & (np.abs(fill - values) <= np.abs(epsilon * values))
        both_nan = np.isnan(fill) & np.isnan(values)
        both_inf = np.isinf(fill) & np.isinf(values)
    return same_side & (close | both_nan | both_inf)


_C_CONVERSION = re.compile(r"%([-+ #0]*)(\d*)(?:\.(\d*))?(?:hh|h|ll|l|L|q|j|z|t)?([diouxXeEfFgGcs%])")


def _python_format(c_format: str) -> str | None:
    """A ``C_format`` attribute as a Python %-format with one conversion, or None if it has none."""
    conversions = [m for m in _C_CONVERSION.finditer(c_format) if m.group(4) != "%"]
    if len(conversions) != 1:
        return None
    return _C_CONVERSION.sub(lambda m: m.group(0) if m.group(4) == "%" else _python_spec(m), c_format)


def _python_spec(match: re.Match) -> str:
    flags, width, precision, kind = match.groups()
    kind = {"i": "d", "u": "d"}.get(kind, kind)
    return "%" + flags + width + ("" if precision is None else "." + precision) + kind


def _c_format(fmt: str, value: object) -> bytes:
    """One value through a translated ``C_format`` (values are converted to what the conversion wants)."""
    kind = _C_CONVERSION.search(fmt)
    kind = kind.group(4) if kind else "s"
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    try:
        if kind in "eEfFgG":
            return (fmt % float(value)).encode("latin-1")
        if kind in "dioxXc":
            return (fmt % int(value)).encode("latin-1")
        return (fmt % (value,)).encode("utf-8", "surrogateescape")
    except (TypeError, ValueError, OverflowError):
        return str(value).encode("utf-8", "surrogateescape")


# ============================================================================ output with ncdump's lput
@functools.lru_cache(maxsize=64)
def _fitting(width: int, separator: bytes) -> re.Pattern[bytes]:
    """The longest prefix of at most ``width`` bytes that ends with ``separator`` (never matches if <= 0)."""
    if width <= 0:
        return re.compile(b"(?!)")
    return re.compile(b"(?s).{1,%d}(?<=%s)" % (width, re.escape(separator)))


@functools.lru_cache(maxsize=64)
def _lines(width: int, separator: bytes) -> re.Pattern[bytes]:
    """Successive output lines: the longest fitting run of units, else one unit too long for any line."""
    unit_end = re.escape(separator)
    overlong = b".+?%s" % unit_end
    if width <= 0:
        return re.compile(overlong, re.DOTALL)
    return re.compile(b".{1,%d}(?<=%s)|%s" % (width, unit_end, overlong), re.DOTALL)


def wrapped(row: bytes, separator: bytes, linep: int, indent: int) -> tuple[bytes, int]:
    """``row`` (units ``item + separator``, no item holding ``separator``) broken into lines as ``lput``
    breaks them from line position ``linep``, and the line position after it. A line per regex match:
    the longest run of whole units that fits is exactly what ``lput`` puts on a line, and an item too
    long for any line goes alone after its wrap."""
    fresh = len(CONTINUATION) + indent
    first = _fitting(MAX_LINE_LEN - linep, separator).match(row)
    position = first.end() if first else 0
    lines = [row[:position], *_lines(MAX_LINE_LEN - fresh, separator).findall(row, position)]
    text = (b"\n" + b" " * indent + CONTINUATION).join(lines)
    return text, (linep if len(lines) == 1 else fresh) + len(lines[-1])


class Formatted(NamedTuple):
    """A row's values formatted and, but the last, broken into lines from a line position."""

    lines: bytes  # the values but the last, joined and broken into lines
    linep: int  # the line position after them
    last: bytes  # the last value


def format_rows(
    nctype: str, fill: object, rows: np.ndarray, linep: int, indent: int
) -> list[Formatted | None]:
    """Each row as :meth:`_VariableData._row` prints it from line position ``linep`` (run in a worker
    process); None where a value needs more than the plain format (:meth:`ValueFormatter.joined`)."""
    formatter = ValueFormatter(nctype, fill)
    done: list[Formatted | None] = []
    for row in rows:
        text = formatter.joined(row, b", ")
        if text is None:
            done.append(None)
            continue
        head, _, last = text.rpartition(b", ")
        lines, after = wrapped(head + b", ", b", ", linep, indent) if head else (b"", linep)
        done.append(Formatted(lines, after, last))
    return done
