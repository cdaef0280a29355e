"""The manifest model: what each key of a virtual dataset holds.

A key holds one of:

- **inline** bytes kept in the manifest itself (metadata objects, small chunks);
- a **reference** ``(url, offset, length)`` into another file or object (``length`` -1: the whole object);
- nothing (a **missing** chunk, which reads as the fill value).

Keys are stored without their leading ``/`` (kerchunk's spelling). References of an array can be kept in
an :class:`ArrayReferences` table (numpy columns over the chunk grid, URLs in a table of their own), which
is how the scalable forms load; loose references (the JSON form) stay as parsed until first used.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import math
import re
from collections.abc import Iterator
from typing import NamedTuple

from nczmap._lazy import numpy as np
from nczmap.errors import FormatError

WHOLE = -1  # a reference's length when it names a whole object
MISSING, INLINE = -1, -2  # path indices of ArrayReferences that are not URLs


class Reference(NamedTuple):
    """Bytes ``[offset, offset + length)`` of the object at ``url`` (``length`` WHOLE: all of it)."""

    url: str
    offset: int = 0
    length: int = WHOLE


Entry = bytes | Reference


class ArrayReferences:
    """The chunk references of one array: columns over its chunk grid in C order."""

    def __init__(
        self,
        grid: tuple[int, ...],
        paths: list[str],
        path_index: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        inline: dict[int, bytes] | None = None,
        separator: str = ".",
    ) -> None:
        self.grid = grid
        self.paths = paths
        self.path_index = path_index
        self.offsets = offsets
        self.lengths = lengths
        self.inline = inline or {}
        self.separator = separator
        self._numbers: dict[str, int] | None = None  # URL -> position in paths, built on first use

    @classmethod
    def empty(cls, grid: tuple[int, ...], separator: str = ".") -> ArrayReferences:
        count = math.prod(grid)
        return cls(
            grid,
            [],
            np.full(count, MISSING, dtype=np.int32),
            np.zeros(count, dtype=np.int64),
            np.zeros(count, dtype=np.int64),
            separator=separator,
        )

    def position(self, name: str) -> int | None:
        """The flat index of chunk ``name`` (``"3.4"``), or None if it is no chunk of this grid."""
        parts = name.split(self.separator)
        if len(parts) != max(len(self.grid), 1) or not all(p.isascii() and p.isdigit() for p in parts):
            return None
        indices = [int(p) for p in parts]
        grid = self.grid or (1,)
        if any(i >= n for i, n in zip(indices, grid, strict=True)):
            return None
        flat = 0
        for i, n in zip(indices, grid, strict=True):
            flat = flat * n + i
        return flat

    def name(self, flat: int) -> str:
        if not self.grid:
            return "0"
        return self.separator.join(str(int(i)) for i in np.unravel_index(flat, self.grid))

    def get(self, flat: int) -> Entry | None:
        where = int(self.path_index[flat])
        if where == MISSING:
            return None
        if where == INLINE:
            return self.inline[flat]
        return Reference(self.paths[where], int(self.offsets[flat]), int(self.lengths[flat]))

    def set(self, flat: int, entry: Entry | None) -> None:
        self.inline.pop(flat, None)
        if entry is None:
            self.path_index[flat] = MISSING
        elif isinstance(entry, bytes):
            self.path_index[flat] = INLINE
            self.inline[flat] = entry
        else:
            self.path_index[flat] = self.number_of(entry.url)
            self.offsets[flat] = entry.offset
            self.lengths[flat] = entry.length

    def number_of(self, url: str) -> int:
        """The position of ``url`` in :attr:`paths`, appended if new (a dict: no search per chunk)."""
        if self._numbers is None or len(self._numbers) != len(self.paths):
            self._numbers = {known: at for at, known in enumerate(self.paths)}
        where = self._numbers.get(url)
        if where is None:
            where = self._numbers[url] = len(self.paths)
            self.paths.append(url)
        return where

    def present(self) -> Iterator[int]:
        """Flat indices of the chunks that hold something."""
        return (int(i) for i in np.flatnonzero(self.path_index != MISSING))


class Manifest:
    """Every key of a virtual dataset and what it holds (keys without the leading ``/``)."""

    def __init__(self, templates: dict[str, str] | None = None) -> None:
        self.entries: dict[str, object] = {}  # key -> Entry, or a kerchunk value not yet resolved
        self.arrays: dict[str, ArrayReferences] = {}  # array key -> chunk table
        self.templates = dict(templates or {})  # kerchunk v1 {{name}} -> text, applied on use
        self.sources: dict[str, dict] = {}  # URL -> {"size", "mtime" or "etag"}: tampering shows
        self._sorted: list[str] | None = None

    # ----------------------------------------------------------------- lookup
    def get(self, key: str) -> Entry | None:
        """What ``key`` holds, or None for nothing (absent, a directory, or a missing chunk)."""
        value = self.entries.get(key)
        if value is None:
            table, flat = self._chunk(key)
            return None if table is None else table.get(flat)
        if not isinstance(value, bytes | Reference):
            value = self.entries[key] = resolve(value, key, self.templates)
        return value

    def _chunk(self, key: str) -> tuple[ArrayReferences | None, int]:
        array, _, name = key.rpartition("/")
        table = self.arrays.get(array)
        if table is None:
            return None, 0
        flat = table.position(name)
        return (table, flat) if flat is not None else (None, 0)

    def sorted_keys(self) -> list[str]:
        """Every key that holds something, sorted (chunks of every table included: for writing out)."""
        names = self.loose_keys()
        if not self.arrays:
            return names
        for array, table in self.arrays.items():
            names = names + [f"{array}/{table.name(flat)}" for flat in table.present()]
        return sorted(names)

    def loose_keys(self) -> list[str]:
        """The keys of ``entries``, sorted once per change (tables' chunks are not among them)."""
        if self._sorted is None:
            self._sorted = sorted(k for k, v in self.entries.items() if v is not None)
        return self._sorted

    def children(self, prefix: str) -> list[str]:
        """Sorted names directly under ``prefix`` ("" for the root). Loose keys are found by skipping
        through them sorted (a few bisections per child); a table's chunks are listed only when ``prefix``
        is its array, so listing a group never expands a million chunk names."""
        keys = self.loose_keys()
        start = prefix + "/" if prefix else ""
        names: set[str] = set()
        at = bisect.bisect_left(keys, start)
        while at < len(keys) and keys[at].startswith(start):
            name, slash, _ = keys[at][len(start) :].partition("/")
            names.add(name)
            # keys below start + name lie in [start + name + "/", start + name + "0"): "0" follows "/"
            at = bisect.bisect_left(keys, start + name + "0", at) if slash else at + 1
        for array, table in self.arrays.items():
            if array == prefix:
                names.update(table.name(flat) for flat in table.present())
            elif array.startswith(start):
                names.add(array[len(start) :].partition("/")[0])
        return sorted(names)

    def directories(self) -> list[str]:
        """The keys of arrays held in tables (directories of their chunks)."""
        return list(self.arrays)

    # ----------------------------------------------------------------- changes
    def set(self, key: str, entry: Entry | None) -> None:
        table, flat = self._chunk(key)
        if table is not None:
            table.set(flat, entry)
            self.entries.pop(key, None)
        elif entry is None:
            self.entries.pop(key, None)
        else:
            self.entries[key] = entry
        self._sorted = None

    def delete_under(self, prefix: str) -> None:
        """Remove ``prefix`` and every key below it ("" empties the manifest)."""
        start = prefix + "/" if prefix else ""
        for key in [k for k in self.entries if k == prefix or k.startswith(start)]:
            del self.entries[key]
        table, flat = self._chunk(prefix)
        if table is not None:  # one chunk of an array's table
            table.set(flat, None)
        for array in [a for a in self.arrays if a == prefix or a.startswith(start) or not prefix]:
            del self.arrays[array]
        self._sorted = None

    def references(self) -> Iterator[tuple[str, Entry]]:
        """``(key, entry)`` for every key that holds something, in key order."""
        for key in self.sorted_keys():
            entry = self.get(key)
            if entry is not None:
                yield key, entry


def resolve(value: object, key: str, templates: dict[str, str]) -> Entry:
    """A kerchunk value as an entry: ``[url, offset, length]``, ``[url]``, text (``base64:`` decoded) or
    a JSON object; ``{{name}}`` in URLs is replaced from ``templates``."""
    if type(value) is list:  # the common case first: a million of these may be resolved in a read
        if len(value) == 3:
            url, offset, length = value
            if type(url) is str and type(offset) is int and type(length) is int and offset >= 0 <= length:
                return Reference(_checked_url(expand(url, templates, key), key), offset, length)
        elif len(value) == 1 and type(value[0]) is str:
            return Reference(_checked_url(expand(value[0], templates, key), key))
    elif isinstance(value, str):
        return _base64(value[7:], key) if value.startswith("base64:") else _utf8(value, key)
    elif isinstance(value, dict):
        return json.dumps(value).encode("utf-8")  # a JSON object value holds its own text (as fsspec)
    raise FormatError(f"manifest key {key!r}: {str(value)[:200]!r} is not a kerchunk reference")


def _checked_url(url: str, key: str) -> str:
    """``url``, refused when no file system or server could be asked for it (JSON can spell a lone
    surrogate, which has no UTF-8; a NUL ends a C string, so the path checked would not be the one opened)."""
    if "\x00" in url:
        raise FormatError(f"manifest key {key!r}: the reference URL {url!r} holds a NUL character")
    if not url.isascii():
        _utf8(url, key, "the reference URL")
    return url


def _utf8(text: str, key: str, what: str = "the value") -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise FormatError(
            f"manifest key {key!r}: {what} {text!r} is not valid Unicode (a lone surrogate)"
        ) from None


def _base64(text: str, key: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FormatError(f"manifest key {key!r}: {text[:60]!r} is not base64 ({exc})") from None


def checked_sources(sources: object, where: str) -> dict[str, dict]:
    """The ``"sources"`` of nczmap's manifest extension (``{url: {"size", "mtime" or "etag"}}``), checked:
    what the tamper checks compare must be there in the form they compare."""
    if not isinstance(sources, dict):
        kind = type(sources).__name__
        raise FormatError(f"{where}: 'sources' of the 'nczmap' key must be an object of sources, not {kind}")
    for url, recorded in sources.items():
        if not isinstance(recorded, dict):
            kind = type(recorded).__name__
            raise FormatError(f"{where}: the recorded source {url!r} must be an object, not {kind}")
        for name, kind in _RECORDED.items():
            if name in recorded and type(recorded[name]) is not kind:  # type(): a bool is no size
                value = str(recorded[name])[:60]
                raise FormatError(
                    f"{where}: the recorded {name} of {url!r} is {value!r}, not {kind.__name__}"
                )
    return sources


_RECORDED = {"size": int, "mtime": int, "etag": str}  # mtime: nanoseconds since the epoch


def expand(url: str, templates: dict[str, str], key: str) -> str:
    """Replace ``{{name}}`` template references in one pass (plain substitution, never code)."""
    if "{{" not in url:
        return url

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in templates:
            raise FormatError(f"manifest key {key!r}: URL {url!r} uses an undefined template {name!r}")
        return templates[name]

    return _TEMPLATE.sub(substitute, url)


_TEMPLATE = re.compile(r"\{\{\s*([^{}\s]*)\s*\}\}")
