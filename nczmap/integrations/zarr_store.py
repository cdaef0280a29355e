"""A zarr-python ``Store`` over any zmap driver: ``zarr.open_group(nczmap.ZarrStore(url))``.

zarr keys ``a/b/.zarray`` are zmap keys ``/a/b/.zarray``; the zmap's blocking I/O runs in worker threads
so zarr's event loop never waits on it. Byte ranges become zmap range reads (never a whole-object read).

NCZarr stores are presented the way xarray reads Zarr: every array's ``.zattrs`` carries
``_ARRAY_DIMENSIONS`` with the dimension names nczmap's reader gives the variable (scalars, stored with
shape ``[1]``, get netcdf-c's ``_scalar_``), merged into whatever the stored ``.zattrs`` holds; a stored
``_ARRAY_DIMENSIONS`` is kept when it names as many dimensions as the array has. Groups without
``.zgroup`` (none in netcdf-c's own layouts, but cheap to cover) get ``{"zarr_format": 2}``;
``/.zmetadata`` shows the same attributes. ``get``, ``getsize``, ``exists`` and the listings agree on the
presented objects. Writes go to the zmap unchanged.

A store opened from a URL owns its map (opened on first use, closed by :meth:`ZarrStore.close`, which is
when the zip driver commits its archive); a store over a map the caller opened leaves closing it to them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar

import numpy as np
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from nczmap.errors import (
    DataError,
    EmptyError,
    KeyNameError,
    ModeError,
    NCZError,
    RangeError,
    ReadOnlyError,
    StorageError,
)
from nczmap.url import ParsedURL, parse_url
from nczmap.zmap import MODES, ZMap, driver_class, open_map
from nczmap.zmap.keys import ROOT, join, normalize_key, normalize_prefix, parent_and_name

__all__ = ["ZarrStore"]

T = TypeVar("T")
# Objects whose change can change what is presented (NCZarr metadata of every dialect, Zarr metadata).
_METADATA_NAMES = frozenset(
    {".zgroup", ".zattrs", ".zarray", ".zmetadata", "zarr.json"}
    | {".nczarr", ".nczgroup", ".nczvar", ".nczarray", ".nczattr", ".nczattrs"}
)
_SCALAR_DIMENSION = "_scalar_"  # netcdf-c's name for the one dimension of a scalar's [1]-shaped array
_ZGROUP = b'{"zarr_format": 2}'


class _Presentation:
    """What an NCZarr store shows zarr beyond its stored objects, worked out once per metadata state.

    ``dimensions`` maps each array's ``.zattrs`` key to its dimension names; ``groups`` holds the
    ``.zgroup`` keys of every group. Merged contents are made on first request and kept.
    """

    def __init__(self, dimensions: dict[str, list[str]], groups: set[str], nczarr: bool = False) -> None:
        self.dimensions = dimensions
        self.groups = groups
        self.nczarr = nczarr  # NCZarr metadata (not pure Zarr): text fill values are the text itself
        self.contents: dict[str, bytes | None] = {}

    def covers(self, key: str) -> bool:
        """True if ``key`` is presented whatever the store holds (it then always exists)."""
        return key in self.dimensions or key in self.groups

    def names(self) -> set[str]:
        return set(self.dimensions) | self.groups

    def content(self, zmap: ZMap, key: str) -> bytes | None:
        """The presented bytes of ``key``, or None when ``key`` is not presented (read it as stored)."""
        if key not in self.contents:
            if key in self.dimensions:
                self.contents[key] = _with_dimensions(_stored(zmap, key), self.dimensions[key])
            elif key in self.groups:
                self.contents[key] = _stored(zmap, key) or _ZGROUP
            elif key == "/.zmetadata":
                self.contents[key] = self._consolidated(_stored(zmap, key))
            elif parent_and_name(key)[1] == ".zarray":
                named = join(parent_and_name(key)[0], ".zattrs") in self.dimensions
                stored = _stored(zmap, key)
                self.contents[key] = _portable_zarray(zmap, key, stored, named, self.nczarr)
            elif parent_and_name(key)[1] in (".zattrs", ".zgroup"):
                stored = _stored(zmap, key)  # kept as read: zarr asks for it right after
                self.contents[key] = _strict_json(stored) or stored
            else:
                return None
        return self.contents[key]

    def _consolidated(self, stored: bytes | None) -> bytes | None:
        document = _json_object(stored)
        members = document.get("metadata") if document is not None else None
        if not isinstance(members, dict):
            return stored
        for key, names in self.dimensions.items():
            array = key[1:].rpartition("/")[0]
            if array + "/.zarray" in members:
                attrs = members.get(key[1:], {})
                if isinstance(attrs, dict) and not _names_dimensions(
                    attrs.get("_ARRAY_DIMENSIONS"), len(names)
                ):
                    members[key[1:]] = {**attrs, "_ARRAY_DIMENSIONS": names}
        for key in self.groups:
            members.setdefault(key[1:], {"zarr_format": 2})
        for key, member in members.items():
            if key.endswith(".zarray") and isinstance(member, dict):
                member.update(_portable_fields(member, self.nczarr))
        return json.dumps(document).encode()


def _stored(zmap: ZMap, key: str) -> bytes | None:
    try:
        return zmap.read(key)
    except EmptyError:
        return None


def _json_object(data: bytes | None) -> dict | None:
    """A JSON object as nczmap reads it: strict JSON, else netcdf-c's lenient grammar (bugs 20, 21)."""
    if data is None:
        return None
    from nczmap.format.jsonutil import loads

    try:
        value = loads(data)
    except NCZError:
        return None
    return value if isinstance(value, dict) else None


def _is_strict_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return False
    return True


def _strict_json(stored: bytes | None) -> bytes | None:
    """Metadata netcdf-c wrote as JSON zarr-python refuses (raw control characters in strings, numbers
    such as ``0.``), as the strict JSON of what nczmap reads; None when it is strict (or absent)."""
    if stored is None or _is_strict_json(stored):
        return None
    document = _json_object(stored)
    return None if document is None else json.dumps(document).encode()


def _with_dimensions(stored: bytes | None, names: list[str]) -> bytes:
    """The stored ``.zattrs`` with ``_ARRAY_DIMENSIONS`` added; a usable one already there is kept.

    A stored value that cannot name the array's dimensions (netcdf-c 4.8.1-4.9.0 write ``[]`` for scalars,
    whose arrays have shape ``[1]``) is replaced, as xarray would otherwise refuse the whole group.
    """
    if stored is None:
        return json.dumps({"_ARRAY_DIMENSIONS": names}).encode()
    attrs = _json_object(stored)
    if attrs is None:
        return stored  # not ours to rewrite: zarr reports what is wrong with it
    if _names_dimensions(attrs.get("_ARRAY_DIMENSIONS"), len(names)):
        return stored if _is_strict_json(stored) else json.dumps(attrs).encode()
    return json.dumps({**attrs, "_ARRAY_DIMENSIONS": names}).encode()


def _portable_zarray(
    zmap: ZMap, key: str, stored: bytes | None, nczarr: bool = False, text_fill: bool = False
) -> bytes | None:
    """A ``.zarray`` as zarr-python 3 can read it, or None when it can as stored: a one-byte dtype with a
    byte order (netcdf-c writes ``>S1`` for char, ``<u1``) gets ``|``; netcdf-c 4.8.0-4.9.0's char arrays,
    declared ``<U1`` but stored one byte a character, are shown as the ``|S1`` they are (in an NCZarr
    store, never-written ones too: netCDF has no other ``U1``); 4.8.0's no-fill arrays, whose ``fill_value``
    is omitted, get ``null``; 4.10's shuffle ``elementsize: 0`` (the type's size) gets that size."""
    array = _json_object(stored)
    if array is None:
        return None
    fields = _portable_fields(array, text_fill)
    if array.get("dtype") in ("<U1", ">U1") and _one_byte_characters(zmap, key, array, nczarr):
        fields["dtype"] = "|S1"
    return json.dumps({**array, **fields}).encode() if fields else None


def _portable_fields(array: dict, nczarr: bool = False) -> dict:
    """The fields of the ``.zarray`` ``array`` that zarr-python cannot read as they are, made readable
    (``nczarr``: an NCZarr array, whose text fill value is the text itself)."""
    fields: dict = {}
    dtype = array.get("dtype")
    if _portable_dtype(dtype) != dtype:
        fields["dtype"] = _portable_dtype(dtype)
    if "fill_value" not in array:
        fields["fill_value"] = None
    fill = array.get("fill_value")
    if isinstance(fill, str) and isinstance(dtype, str) and dtype[1:2] == "S" and (nczarr or not _b64(fill)):
        # netcdf-c writes a string or char array's fill value as its text; Zarr v2 (and zarr-python)
        # read the fill value of a fixed-width bytes dtype as base64 (nczmap's pure Zarr writes that)
        fields["fill_value"] = base64.b64encode(fill.encode("utf-8", "surrogateescape")).decode("ascii")
    filters = array.get("filters")
    if isinstance(filters, list) and any(_unsized_shuffle(f) for f in filters):
        try:
            size = np.dtype(dtype).itemsize
        except (TypeError, ValueError):
            size = None
        if size:
            fields["filters"] = [{**f, "elementsize": size} if _unsized_shuffle(f) else f for f in filters]
    return fields


def _b64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error is one
        return False
    return True


def _unsized_shuffle(codec: object) -> bool:
    return isinstance(codec, dict) and codec.get("id") == "shuffle" and codec.get("elementsize") == 0


def _one_byte_characters(zmap: ZMap, key: str, array: dict, unwritten: bool = False) -> bool:
    """An uncompressed array's first chunk holds one byte per value (netcdf-c's ``<U1`` char data);
    ``unwritten`` when there is no first chunk."""
    chunks = array.get("chunks")
    if array.get("compressor") or array.get("filters") or not isinstance(chunks, list):
        return False
    if not all(isinstance(size, int) and size > 0 for size in chunks):
        return False
    separator = array.get("dimension_separator", ".")
    first = separator.join("0" for _ in chunks) or "0"
    try:
        return zmap.len(join(parent_and_name(key)[0], first)) == math.prod(chunks)
    except EmptyError:
        return unwritten
    except KeyNameError:
        return False


def _portable_dtype(dtype: object) -> object:
    if (
        isinstance(dtype, str)
        and len(dtype) == 3
        and dtype[0] in "<>"
        and dtype[1:] in ("S1", "u1", "i1", "b1")
    ):
        return "|" + dtype[1:]
    return dtype


def _names_dimensions(value: object, rank: int) -> bool:
    return isinstance(value, list) and len(value) == rank and all(isinstance(name, str) for name in value)


def _written_by_netcdf_c(zmap: ZMap) -> bool:
    """The root says NCZarr (4.8.0's ``/.nczarr``, or an ``_nczarr``/``_NCZARR`` key in ``/.zgroup``,
    4.8.1-4.9.2, or ``/.zattrs``, 4.9.3 and later) or names netcdf-c in ``_NCProperties`` (its pure Zarr,
    which may lack ``_ARRAY_DIMENSIONS``). Two or three small reads, instead of the whole model."""
    if zmap.exists("/.nczarr"):
        return True
    for key in ("/.zgroup", "/.zattrs"):
        document = _json_object(_stored(zmap, key))
        if document is not None and any(
            name.lower().startswith(("_nczarr", "_ncproperties")) for name in document
        ):
            return True
    return False


def _presentation_of(zmap: ZMap) -> _Presentation:
    """Read the store's netCDF model; a store netcdf-c wrote gets its dimension names presented."""
    from nczmap.format.dataset import FormatOptions
    from nczmap.format.dialects import Dialect
    from nczmap.format.reader import read_dataset

    if not _written_by_netcdf_c(zmap):  # other writers' Zarr (or nothing): shown as stored, no model read
        return _Presentation({}, set())
    try:
        dataset = read_dataset(zmap, FormatOptions())
    except NCZError:  # empty, not NCZarr, or metadata nczmap cannot read: zarr sees the store as it is
        return _Presentation({}, set())
    if dataset.dialect is not Dialect.PURE_ZARR and not dataset.dialect.is_nczarr:
        return _Presentation({}, set())
    dimensions: dict[str, list[str]] = {}
    groups: set[str] = set()
    for group in dataset.walk():
        groups.add(join(group.path, ".zgroup"))
        for variable in group.variables.values():
            names = list(variable.dimensions)
            if variable.layout.scalar:
                names = [_SCALAR_DIMENSION] * len(variable.layout.shape)
            if len(names) == len(variable.layout.shape):
                dimensions[join(variable.key, ".zattrs")] = names
    return _Presentation(dimensions, groups, dataset.dialect.is_nczarr)


# --------------------------------------------------------------------------------------- byte ranges
def _check_range(key: str, byte_range: object) -> None:
    if byte_range is None:
        return
    if not isinstance(byte_range, RangeByteRequest | OffsetByteRequest | SuffixByteRequest):
        raise DataError(
            f"Unexpected byte_range, got {byte_range!r} for {key!r}: expected None, a RangeByteRequest, "
            "an OffsetByteRequest or a SuffixByteRequest"
        )
    bad = (
        (isinstance(byte_range, RangeByteRequest) and not 0 <= byte_range.start <= byte_range.end)
        or (isinstance(byte_range, OffsetByteRequest) and byte_range.offset < 0)
        or (isinstance(byte_range, SuffixByteRequest) and byte_range.suffix < 0)
    )
    if bad:
        raise RangeError(f"bad byte range {byte_range!r} for {key!r}: offsets and lengths must be >= 0")


def _slice(data: bytes, byte_range: ByteRequest | None) -> bytes:
    """``byte_range`` of ``data`` (already checked), cut short at the end like a Python slice."""
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start : byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset :]
    return data[len(data) - byte_range.suffix :] if byte_range.suffix else b""


def _read_range(zmap: ZMap, key: str, byte_range: ByteRequest | None) -> bytes:
    """One zmap read for the range (two for a suffix of an object whose size the driver does not know)."""
    if byte_range is None:
        return zmap.read(key)
    if isinstance(byte_range, RangeByteRequest):
        return zmap.read(key, byte_range.start, byte_range.end - byte_range.start)
    if isinstance(byte_range, OffsetByteRequest):
        return zmap.read(key, byte_range.offset)
    size = zmap.len(key)
    return zmap.read(key, max(size - byte_range.suffix, 0)) if byte_range.suffix else b""


# --------------------------------------------------------------------------------------- keys
def _zmap_key(key: object) -> str:
    """The zmap key of zarr key ``key``; a KeyNameError naming it when nczmap cannot store it."""
    if not isinstance(key, str):
        raise KeyNameError(f"a zarr key must be a str, not {type(key).__name__}: {key!r}")
    if key.startswith("/"):
        raise KeyNameError(f"zarr key {key!r} cannot be stored by nczmap: zarr keys have no leading '/'")
    try:
        return normalize_key("/" + key)
    except KeyNameError as exc:
        raise KeyNameError(f"zarr key {key!r} cannot be stored by nczmap: {exc}") from None


def _zmap_prefix(prefix: str) -> str | None:
    """The zmap directory of a prefix (``""``, ``a/b`` or ``a/b/``); None if no key can be under it."""
    try:
        return normalize_prefix("/" + prefix)
    except KeyNameError:
        return None


def _zarr_key(key: str) -> str:
    return key[1:]


def _resolve_mode(read_only: bool | None, mode: str | None, where: str) -> tuple[bool, str]:
    if mode is not None and mode not in MODES:
        raise ModeError(f"mode {mode!r} for {where} is not one of {', '.join(MODES)}")
    if read_only is None:
        read_only = mode in (None, "r")
    if mode is None:
        mode = "r" if read_only else "a"
    if read_only != (mode == "r"):
        raise ModeError(f"read_only={read_only} contradicts mode {mode!r} for {where}")
    return read_only, mode


class ZarrStore(Store):
    """A zarr-python store over a zmap: a dataset URL (opened with :func:`nczmap.open_map`) or an open map.

    ``read_only`` defaults to the map's (for a URL: ``mode``, whose default is ``"r"``); ``mode`` is the
    zmap open mode (``r``, ``r+``, ``a``, ``w``; ``read_only=False`` alone means ``a``). ``map_options``
    go to the driver. Stores over a URL pickle by URL (a writable one reopens ``r+``, never ``w``), stores
    over a memory map with its content.
    """

    def __init__(
        self,
        url_or_map: str | os.PathLike[str] | ParsedURL | ZMap,
        *,
        read_only: bool | None = None,
        mode: str | None = None,
        **map_options: Any,
    ) -> None:
        self._lock = threading.Lock()
        self._building = threading.Lock()
        self._presentation: _Presentation | None = None
        self._generation = 0
        self._options = dict(map_options)
        if isinstance(url_or_map, ZMap):
            read_only = self._adopt(url_or_map, read_only, mode)
        else:
            url = url_or_map if isinstance(url_or_map, ParsedURL) else parse_url(url_or_map)
            read_only, self._mode = _resolve_mode(read_only, mode, repr(url.original))
            self._url: ParsedURL | None = url
            self._driver = driver_class(url.driver)
            if not read_only and not self._driver.writable:
                raise ReadOnlyError(f"the {url.driver} driver is read-only: open {url.original!r} read-only")
            self._map: ZMap | None = None
            self._owns_map = True
            self._reopenable = True
        super().__init__(read_only=read_only)

    def _adopt(self, zmap: ZMap, read_only: bool | None, mode: str | None) -> bool:
        if mode is not None or self._options:
            raise ModeError(f"{zmap!r} is already open: mode and driver options are only for URLs")
        if zmap.closed:
            raise StorageError(f"{zmap!r} is closed")
        if read_only is None:
            read_only = zmap.readonly
        if not read_only and zmap.readonly:
            raise ReadOnlyError(f"{zmap!r} is read-only: a writable ZarrStore needs a map open for writing")
        self._url, self._mode, self._driver = zmap.url, zmap.mode, type(zmap)
        self._map, self._owns_map, self._reopenable = zmap, False, False
        return read_only

    # ----------------------------------------------------------------- the map
    @property
    def zmap(self) -> ZMap:
        """The map under the store (opened now if it is not yet)."""
        return self._require_map()

    def _require_map(self) -> ZMap:
        with self._lock:
            if self._map is None or (self._map.closed and self._reopenable):
                self._map = open_map(self._url, self._mode, **self._options)
                self._owns_map = True
                if self._mode == "w":
                    self._mode = "r+"  # opened (and emptied) once; reopening must keep what was written
            elif self._map.closed:
                raise StorageError(f"{self._map!r} under this ZarrStore is closed")
            return self._map

    async def _open(self) -> None:
        if self._is_open:
            raise ValueError("store is already open")
        await asyncio.to_thread(self._require_map)
        self._is_open = True

    def _ensure_open_sync(self) -> ZMap:
        zmap = self._require_map()
        self._is_open = True
        return zmap

    async def _run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(zmap, *args)`` in a worker thread, the map opened first if needed."""
        if not self._is_open:
            await self._open_quietly()
        return await asyncio.to_thread(lambda: function(self._require_map(), *args))

    async def _open_quietly(self) -> None:
        # Concurrent first calls (a gather of sets) each open: the map is opened once under the lock.
        await asyncio.to_thread(self._require_map)
        self._is_open = True

    def close(self) -> None:
        """Close the store; a map it opened is closed too (committing a zip archive)."""
        super().close()
        with self._lock:
            if self._owns_map and self._map is not None:
                self._map.close()
                if self._reopenable:
                    self._map = None
            self._presentation = None

    def __del__(self) -> None:
        # A read-only map this store opened holds nothing but open files: release them. A writable one is
        # left to its driver (the zip driver discards uncommitted writes with a warning, never commits).
        zmap = getattr(self, "_map", None)
        if getattr(self, "_owns_map", False) and zmap is not None and zmap.mode == "r":
            zmap.close()

    # ----------------------------------------------------------------- capabilities
    @property
    def supports_writes(self) -> bool:
        return self._driver.writable

    @property
    def supports_deletes(self) -> bool:
        return self._driver.writable

    @property
    def supports_listing(self) -> bool:
        return self._driver.listable

    def with_read_only(self, read_only: bool = False) -> ZarrStore:
        """The same storage with another ``read_only``: the same open map when it can serve it."""
        if self._map is not None and not self._map.closed and (read_only or not self._map.readonly):
            copy = ZarrStore.__new__(ZarrStore)
            copy.__dict__.update(self.__dict__)
            copy._lock, copy._building = threading.Lock(), threading.Lock()
            copy._presentation = None
            copy._owns_map = False
            copy._is_open = False
            copy._read_only = read_only
            return copy
        if self._url is None:
            raise ReadOnlyError(f"{self._map!r} is read-only: it cannot give a writable ZarrStore")
        mode = "r" if read_only else ("a" if self._mode in ("r", "a") else "r+")
        return ZarrStore(self._url, read_only=read_only, mode=mode, **self._options)

    # ----------------------------------------------------------------- identity
    def _identity(self) -> tuple:
        if self._url is None:
            return ("memory", id(self._map))
        return (self._url.driver, self._url.location, self._url.endpoint)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ZarrStore) or self.read_only != other.read_only:
            return False
        if self._identity() == other._identity():
            return True
        if self._url is None and other._url is None:
            return _contents(self._map) == _contents(other._map)
        return False

    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = {"url": self._url, "read_only": self._read_only, "map": None}
        state["mode"] = "r" if self._mode == "r" else ("a" if self._mode == "a" else "r+")  # never "w"
        options = dict(self._options)
        if self._url is None:
            state["map"] = self._map  # a memory map travels with its content
        elif self._map is not None and not self._map.closed:
            self._map.__reduce__()  # the driver may refuse to travel (a zip archive open for writing)
            options.update(self._map.reopen_options())
        state["options"] = options
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self._building = threading.Lock()
        self._presentation = None
        self._generation = 0
        self._url, self._options, self._mode = state["url"], state["options"], state["mode"]
        self._map = state["map"]
        self._driver = type(self._map) if self._url is None else driver_class(self._url.driver)
        self._owns_map = True
        self._reopenable = self._url is not None
        self._is_open = False
        self._read_only = state["read_only"]

    def __repr__(self) -> str:
        where = self._url.original if self._url is not None else f"<{self._driver.driver} map>"
        return f"ZarrStore({where!r}, driver={self._driver.driver!r}, read_only={self.read_only})"

    def __str__(self) -> str:
        return self._url.original if self._url is not None else repr(self)

    # ----------------------------------------------------------------- presentation
    def _presented(self, zmap: ZMap) -> _Presentation:
        presentation = self._presentation
        if presentation is None:
            with self._building:  # concurrent first requests (zarr gathers them) read the model once
                presentation = self._presentation
                if presentation is None:
                    generation = self._generation
                    presentation = _presentation_of(zmap)
                    if generation == self._generation:  # no write while it was being read
                        self._presentation = presentation
        return presentation

    def _maybe_presented(self, zmap: ZMap, key: str) -> _Presentation | None:
        """The presentation when ``key`` could be presented (only metadata names are)."""
        if parent_and_name(key)[1] not in (".zattrs", ".zgroup", ".zmetadata", ".zarray"):
            return None
        return self._presented(zmap)

    def _changed(self, key: str) -> None:
        if parent_and_name(key)[1] in _METADATA_NAMES or key == ROOT:
            self._forget_presentation()

    def _forget_presentation(self) -> None:
        self._generation += 1
        self._presentation = None

    # ----------------------------------------------------------------- reading
    def _get_blocking(self, zmap: ZMap, key: str, byte_range: ByteRequest | None) -> bytes | None:
        presentation = self._maybe_presented(zmap, key)
        if presentation is not None:
            content = presentation.content(zmap, key)
            if content is not None:
                return _slice(content, byte_range)
        try:
            return _read_range(zmap, key, byte_range)
        except EmptyError:
            return None

    async def get(
        self, key: str, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        prototype = prototype or default_buffer_prototype()
        zkey = _zmap_key(key)
        _check_range(key, byte_range)
        data = await self._run(self._get_blocking, zkey, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    def get_sync(
        self, key: str, *, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        prototype = prototype or default_buffer_prototype()
        zkey = _zmap_key(key)
        _check_range(key, byte_range)
        data = self._get_blocking(self._ensure_open_sync(), zkey, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    async def get_partial_values(
        self, prototype: BufferPrototype | None, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        """Every range at once, read in parallel on the driver's own pool (as wide as its latency needs)."""
        prototype = prototype or default_buffer_prototype()
        requests = [(_zmap_key(key), byte_range) for key, byte_range in key_ranges]
        for zkey, byte_range in requests:
            _check_range(_zarr_key(zkey), byte_range)
        if not requests:
            return []
        results = await self._run(self._get_all, requests)
        return [None if data is None else prototype.buffer.from_bytes(data) for data in results]

    def _get_all(self, zmap: ZMap, requests: list[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        from nczmap.concurrency import run_all

        results: list[bytes | None] = [None] * len(requests)
        for key, _ in requests:  # built here: reading the model uses the same pool, and must not wait on it
            self._maybe_presented(zmap, key)

        def one(index: int) -> None:
            results[index] = self._get_blocking(zmap, *requests[index])

        run_all([lambda i=i: one(i) for i in range(len(requests))], zmap.io_width)
        return results

    def _exists_blocking(self, zmap: ZMap, key: str) -> bool:
        presentation = self._maybe_presented(zmap, key)
        return (presentation is not None and presentation.covers(key)) or zmap.exists(key)

    async def exists(self, key: str) -> bool:
        return await self._run(self._exists_blocking, _zmap_key(key))

    def _size_blocking(self, zmap: ZMap, key: str) -> int:
        presentation = self._maybe_presented(zmap, key)
        content = presentation.content(zmap, key) if presentation is not None else None
        if content is not None:
            return len(content)
        try:
            return zmap.len(key)
        except EmptyError:
            raise FileNotFoundError(f"no object {_zarr_key(key)!r} in {zmap.location}") from None

    async def getsize(self, key: str) -> int:
        return await self._run(self._size_blocking, _zmap_key(key))

    # ----------------------------------------------------------------- writing
    def _writable_key(self, key: str, value: object = None, *, check_value: bool = False) -> str:
        self._check_writable()
        zkey = _zmap_key(key)
        if check_value and not isinstance(value, Buffer):
            raise DataError(f"value for zarr key {key!r} must be a zarr Buffer, not {type(value).__name__}")
        return zkey

    def _set_blocking(self, zmap: ZMap, key: str, value: Buffer) -> None:
        zmap.write(key, value.as_numpy_array())
        self._changed(key)

    async def set(self, key: str, value: Buffer) -> None:
        zkey = self._writable_key(key, value, check_value=True)
        await self._run(self._set_blocking, zkey, value)

    def set_sync(self, key: str, value: Buffer) -> None:
        zkey = self._writable_key(key, value, check_value=True)
        self._set_blocking(self._ensure_open_sync(), zkey, value)

    def _set_if_absent_blocking(self, zmap: ZMap, key: str, value: Buffer) -> None:
        # zmap has no conditional write: this is atomic among users of this store, not across processes
        with self._lock:
            if not zmap.exists(key):
                self._set_blocking(zmap, key, value)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        zkey = self._writable_key(key, value, check_value=True)
        await self._run(self._set_if_absent_blocking, zkey, value)

    def _delete_blocking(self, zmap: ZMap, key: str) -> None:
        zmap.delete(key)
        self._forget_presentation()

    def _check_deletes(self) -> None:
        self._check_writable()
        if not self.supports_deletes:
            raise NotImplementedError(f"the {self._driver.driver} driver cannot delete")

    async def delete(self, key: str) -> None:
        self._check_deletes()
        await self._run(self._delete_blocking, _zmap_key(key))

    def delete_sync(self, key: str) -> None:
        self._check_deletes()
        self._delete_blocking(self._ensure_open_sync(), _zmap_key(key))

    def _delete_dir_blocking(self, zmap: ZMap, directory: str) -> None:
        if directory == ROOT:
            zmap.truncate()
        elif not zmap.exists(directory):  # an object of that name is not under the prefix: it stays
            zmap.delete(directory)
        self._forget_presentation()

    async def delete_dir(self, prefix: str) -> None:
        self._check_deletes()
        directory = _zmap_prefix(prefix)
        if directory is not None:
            await self._run(self._delete_dir_blocking, directory)

    # ----------------------------------------------------------------- listing
    def _objects(self, zmap: ZMap, top: str) -> list[str]:
        """Every object key under ``top``: one search per directory, no request for an object."""
        found, pending = [], [top]
        while pending:
            directory = pending.pop()
            for name in zmap.search(directory):
                key = join(directory, name)
                (found if zmap.exists(key) else pending).append(key)
        return found

    def _listed(self, zmap: ZMap, top: str) -> list[str]:
        keys = set(self._objects(zmap, top))
        under = top if top == ROOT else top + "/"
        keys.update(key for key in self._presented(zmap).names() if key.startswith(under))
        return sorted(keys)

    def _listed_prefix(self, zmap: ZMap, prefix: str) -> list[str]:
        top = _zmap_prefix(prefix.rpartition("/")[0])
        if top is None:
            return []
        return [zarr for zarr in map(_zarr_key, self._listed(zmap, top)) if zarr.startswith(prefix)]

    async def list(self) -> AsyncIterator[str]:
        for key in await self._run(self._listed, ROOT):
            yield _zarr_key(key)

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key in await self._run(self._listed_prefix, prefix):
            yield key

    def _children(self, zmap: ZMap, directory: str) -> list[str]:
        names = set(zmap.search(directory))
        for key in self._presented(zmap).names():
            parent, name = parent_and_name(key)
            if parent == directory:
                names.add(name)
        return sorted(names)

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        directory = _zmap_prefix(prefix)
        if directory is None:
            return
        for name in await self._run(self._children, directory):
            yield name

    async def is_empty(self, prefix: str) -> bool:
        directory = _zmap_prefix(prefix)
        if directory is None:
            return True
        return not await self._run(lambda zmap: zmap.search(directory))

    async def clear(self) -> None:
        self._check_deletes()
        await self._run(self._delete_dir_blocking, ROOT)


def _contents(zmap: ZMap | None) -> dict[str, bytes]:
    if zmap is None or zmap.closed:
        return {}
    return {key: zmap.read(key) for key in zmap.objects()}
