"""Key-tree dumps in the format of netcdf-c's ``zmapio -x objdump`` (``ref_*.zmap`` fixtures)."""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Iterator

from nczmap.errors import EmptyError, ModeError
from nczmap.zmap.base import ZMap
from nczmap.zmap.keys import ancestors, join, parent_and_name

# zmapio -t names -> (struct code, size, printf-style formatter)
TYPES: dict[str, tuple[str, int]] = {
    "ubyte": ("B", 1),
    "byte": ("b", 1),
    "char": ("c", 1),
    "ushort": ("H", 2),
    "short": ("h", 2),
    "uint": ("I", 4),
    "int": ("i", 4),
    "uint64": ("Q", 8),
    "int64": ("q", 8),
    "float": ("f", 4),
    "double": ("d", 8),
}
_HOST_ORDER = "<" if sys.byteorder == "little" else ">"


def _format_value(value: object, code: str) -> str:
    if code == "c":
        return "'" + value.decode("latin-1") + "'"  # type: ignore[union-attr]
    if code in "fd":
        return "nan" if math.isnan(value) else f"{value:f}"  # type: ignore[arg-type]
    return str(value)


def _byte_order(zmap: ZMap, key: str) -> str:
    """The byte order of the chunk's array, from the nearest ``.zarray`` above it (host order if none)."""
    for ancestor in ancestors(key):
        try:
            dtype = json.loads(zmap.read(join(ancestor, ".zarray"))).get("dtype", "")
        except (EmptyError, ValueError, AttributeError):
            continue
        return dtype[:1] if isinstance(dtype, str) and dtype[:1] in "<>" else _HOST_ORDER
    return _HOST_ORDER


def _chunk_record(zmap: ZMap, key: str, data: bytes, type_name: str, metadata_only: bool) -> bytes:
    if type_name.startswith("string/"):
        width = int(type_name.split("/", 1)[1])
        count = math.ceil(len(data) / width)
        header = f" : ({count}) "
        if metadata_only:
            return (header + "|...|").encode()
        values = [data[i : i + width] for i in range(0, len(data), width)]
        return header.encode() + b"|" + b", ".join(v.rjust(width) for v in values) + b"|"
    code, size = TYPES[type_name]
    count = math.ceil(len(data) / size)
    header = f" : ({count}) ({type_name}) "
    if metadata_only:
        return (header + "|...|").encode()
    whole = len(data) - len(data) % size
    order = _byte_order(zmap, key) if size > 1 else _HOST_ORDER
    values = struct.unpack(f"{order}{whole // size}{code}", data[:whole])
    return (header + "|" + ", ".join(_format_value(v, code) for v in values) + "|").encode()


def dump_records(zmap: ZMap, type_name: str = "ubyte", metadata_only: bool = False) -> Iterator[bytes]:
    """One record per object, numbered by its position in the pre-order key walk (directories consume
    an index without a record, as in zmapio)."""
    if type_name not in TYPES and not _is_string_type(type_name):
        raise ModeError(f"unknown dump type {type_name!r}: one of {', '.join(TYPES)} or string/<n>")
    for index, key in enumerate(zmap.walk()):
        if not zmap.exists(key):
            continue
        data = zmap.read(key)
        prefix = f"[{index}] {key}".encode()
        _, name = parent_and_name(key)
        if not data:
            yield prefix + b" : (0) ||"
        elif name.startswith("."):
            yield prefix + f" : ({len(data)}) |".encode() + data + b"|"
        else:
            yield prefix + _chunk_record(zmap, key, data, type_name, metadata_only)


def _is_string_type(type_name: str) -> bool:
    head, _, width = type_name.partition("/")
    return head == "string" and width.isdigit() and int(width) > 0
