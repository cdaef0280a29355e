"""NCZarr and Zarr stores as sources: their chunks referred to where they lie, nothing copied.

A store is read with nczmap's own reader (every NCZarr dialect, pure Zarr v2 and v3, the xarray
convention, consolidated metadata), so its model is exactly what ``nczmap ncdump`` shows of it; its chunks
become references to the bytes where they are (:meth:`nczmap.zmap.ZMap.byte_ranges`):

- a directory store (``#mode=nczarr,file``, or a local directory): each chunk file ``[file, 0, size]``;
- netcdf-c's zip archive (``#mode=nczarr,zip``, or a local ``.zip``): each member's data inside the
  archive ``[archive, offset, size]`` -- only a member stored as is (netcdf-c writes them so); a compressed
  or encrypted member's bytes are not the chunk's, and its variable is loaded instead;
- an S3 store (``s3://bucket/run#mode=nczarr,s3``): each chunk object ``[object, 0, size]``, sizes and
  ETags from one listing a variable.

Missing chunks stay missing (the fill value); a Zarr v3 sharded array's inner chunks are referred to
inside their shards (from each shard's index). A variable whose chunks cannot be described as byte ranges
the manifest can hold (Fortran order, Zarr v3 transposes, variable-length strings) is loaded (its values
stored in the manifest) through the reader. The manifest records each chunk file's size and
modification time (an object's size and ETag; an archive's own), so a store rewritten later is refused by
reads through it.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
import threading
from collections.abc import Callable

import numpy as np

from nczmap.errors import FormatError, NCZError, StorageError
from nczmap.format import Group
from nczmap.format.variable import ArrayLayout
from nczmap.integrations.virtualize.files import LocalFile, SourceFile, file_stat
from nczmap.integrations.virtualize.parsed import (
    ParsedFile,
    ParseOptions,
    Refusal,
    Storage,
    model_of,
    native_dtype,
)
from nczmap.manifest.containers import Container, normalize
from nczmap.url import ParsedURL, parse_url

ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")  # a member first, or an empty archive's end record
STORE_MODES = frozenset({"nczarr", "zarr", "xarray"})


def sniff(read: Callable[[int, int], bytes], size: int) -> bool:
    """Whether the file is a zip archive (netcdf-c's zip stores)."""
    if size < 4:
        return False
    try:
        return read(0, 4) in ZIP_SIGNATURES
    except NCZError:
        return False


# ------------------------------------------------------------------------------------------ sources
def store_source(text: str, shown: str) -> SourceFile | None:
    """The source ``text`` names when it is a store (a local directory, a URL whose ``#mode=`` names
    nczarr, zarr or xarray), else None (a file: its parser decides, a zip archive being a store too)."""
    if "://" not in text:
        return StoreSource(_parse(text, shown), shown) if os.path.isdir(text) else None
    if not names_a_store(text):
        return None
    url = _parse(text, shown)
    if url.on_s3:
        return StoreSource(url, shown)
    if url.driver not in ("file", "zip"):
        raise FormatError(f"cannot virtualize {shown!r}: a store must be a directory, a zip archive or on S3")
    if os.path.isdir(url.path):
        return StoreSource(url, shown)
    return ZipFile(url, shown)


def names_a_store(text: str) -> bool:
    fragment = text.partition("#")[2]
    for item in fragment.split("&"):
        key, _, value = item.partition("=")
        words = set(value.split(",")) if key == "mode" else {key}
        if words & STORE_MODES:
            return True
    return False


def _parse(text: str, shown: str) -> ParsedURL:
    try:
        return parse_url(text)
    except NCZError as exc:
        raise FormatError(f"cannot virtualize {shown!r}: {exc}") from None


class StoreSource(SourceFile):
    """A directory or S3 store: its chunks are files or objects of their own, each referred to (and
    recorded) by its own URL. It is read as a store, never as a file."""

    def __init__(self, url: ParsedURL, shown: str) -> None:
        self.opening = url.original  # how it is opened (the fragment's modes kept)
        self.shown = shown
        self.on_s3 = url.on_s3
        if url.on_s3:
            self.name = self.url = normalize(url.location.rstrip("/"), None)
            self.options = {k: v for k, v in (("endpoint", url.endpoint), ("region", url.region)) if v}
        else:
            self.name = os.path.realpath(url.path)
            self.url = normalize(self.name, None, links=False)
            self.options = {}
        self.size = 0
        self.stamps: dict[str, dict] = {}  # each referenced chunk file or object: its size and mtime or ETag

    def read(self, offset: int, length: int) -> bytes:
        raise FormatError(f"{self.shown!r} is a store (a directory or prefix of chunk files), not a file")

    def read_head(self, offset: int, length: int) -> bytes:
        return self.read(offset, length)

    def grant(self) -> str | Container:
        parent = posixpath.dirname(self.url.rstrip("/")) + "/"
        if self.on_s3:
            return Container(parent, self.options)
        return os.path.dirname(self.name) + "/"

    def recorded(self) -> dict:
        return {}

    def recorded_sources(self) -> dict[str, dict]:
        return dict(self.stamps)

    def known(self) -> dict:
        return {"stamps": self.stamps}

    def adopt(self, known: dict) -> None:
        self.stamps.update(known.get("stamps") or {})

    def check_unchanged(self) -> None:
        """Every chunk file referred to still has the size and modification time it was listed with (an
        object's ETag is recorded: reads through the manifest compare it)."""
        if self.on_s3:
            return
        for url, stamp in self.stamps.items():
            path = url[len("file://") :]
            try:
                seen = file_stat(path)
            except OSError:
                seen = None
            if seen != (stamp["size"], stamp["mtime"]):
                raise StorageError(
                    f"the chunk file {path} of the store {self.shown} changed while it was being "
                    "virtualized; run again"
                )


class ZipFile(LocalFile):
    """A zip store named by a URL (``#mode=...,zip``): a local file whose fragment says how to open it."""

    def __init__(self, url: ParsedURL, shown: str) -> None:
        super().__init__(os.path.realpath(url.path), shown)
        self.opening = url.original


# ------------------------------------------------------------------------------------------ parsing
def parse(file: SourceFile, options: ParseOptions) -> ParsedFile:
    """The model of the store ``file`` and where each chunk of each variable lies."""
    opened = _Opened(_opening(file))
    try:
        dataset = opened.dataset
        located = isinstance(file, StoreSource)

        def storage_of(variable, shape: tuple[int, ...]) -> Storage:
            return _storage(file, opened, variable, shape, located)

        root = model_of(dataset, storage_of, untyped=not dataset.dialect.is_nczarr)
    except BaseException:
        opened.close()
        raise
    notes = []
    pure_v2 = not dataset.dialect.is_nczarr and not _zarr_v3(dataset)
    for group in root.walk():
        for variable in group.variables.values():
            variable.fill_is_missing = pure_v2 and variable.layout.fill_value is not None
            variable.layout = _as_source_layout(variable.layout)
            notes += _fill_as_attribute(variable, file)
    # arrays the store's reader could not read (damaged metadata, say): left out by name, never silently
    refused = [Refusal(key, f"it cannot be read: {why}", file.name) for key, why in dataset.problems]
    return ParsedFile(file.name, root, refused, format="zarr", closers=[opened.close], notes=notes)


def _zarr_v3(dataset) -> bool:
    return any(v.layout.zarr3 is not None for g in dataset.walk() for v in g.variables.values())


def _opening(file: SourceFile) -> str:
    """How to open ``file`` as a store: as it was named, or a local zip archive found by its bytes."""
    opening = getattr(file, "opening", None)
    if opening:
        return opening
    return f"file://{file.name}#mode=nczarr,zip"


def _storage(file: SourceFile, opened: _Opened, variable, shape: tuple[int, ...], located: bool) -> Storage:
    layout = variable.layout
    chunks = () if layout.scalar else tuple(layout.chunks)  # a scalar's one chunk: key 0 (v2), c (v3)
    storage = Storage(file.name, "chunked", shape, chunks, list(layout.codecs.configs))
    storage.values = _Values(opened, variable.key)
    storage.problem = _unreferenceable(layout)
    if storage.problem is not None:
        return storage
    zmap = opened.dataset.zmap
    pieces = []  # (chunk index, where its object lies, offset in the object, length)
    try:
        for found in zmap.byte_ranges(variable.key):
            name = found.key[len(variable.key) + 1 :]
            for index, offset, length in _chunks_in(found, name, layout, zmap):
                if found.problem is not None:
                    storage.problem = f"its chunk {found.key!r}: {found.problem}"
                    return storage
                pieces.append((index, found, offset, length))
    except FormatError as exc:  # a shard whose index cannot be read: its values are read (or fail) as such
        storage.problem = str(exc)
        return storage
    reads = []
    for index, found, offset, length in pieces:
        corner = tuple(i * k for i, k in zip(index, chunks, strict=True))
        storage.add_chunk(corner, found.offset + offset, length)
        reads.append((found.key, offset, length))
        if located:
            file.stamps[found.url] = found.stamp
    if located:
        storage.locations = [found.url for _, found, _, _ in pieces]
        storage.read_chunk = _ChunkReader(opened, reads, remote=file.on_s3)
    else:
        storage.read = file.read
    return storage


def _chunks_in(found, name: str, layout: ArrayLayout, zmap):
    """``(chunk index, offset, length)`` of the chunks the object ``found`` (named ``name`` below its
    array) holds: itself, or a shard's stored inner chunks (from its index); none for metadata or an
    object outside the grid."""
    shards = layout.shards
    if shards is None:
        grid = [] if layout.scalar else [-(-n // k) for n, k in zip(layout.shape, layout.chunks, strict=True)]
        index = chunk_index(name, layout, grid)
        return [] if index is None else [(index, 0, found.length)]
    shard_grid = [-(-n // k) for n, k in zip(layout.shape, shards.shard_shape, strict=True)]
    shard = chunk_index(name, layout, shard_grid)
    if shard is None:
        return []
    if found.problem is not None:
        return [(shard, 0, found.length)]  # the caller refuses it
    inner = []
    per_shard = shards.per_shard
    grid = [-(-n // k) for n, k in zip(layout.shape, layout.chunks, strict=True)]
    for position, entry in enumerate(shards.index(zmap, found.key)):
        if entry is None:
            continue  # not stored: the fill value
        offset, length = entry
        if offset + length > found.length:
            raise FormatError(f"shard {found.key!r}: an inner chunk at {offset}+{length} runs past its end")
        within = np.unravel_index(position, per_shard)
        index = tuple(int(s * n + w) for s, n, w in zip(shard, per_shard, within, strict=True))
        if all(i < g for i, g in zip(index, grid, strict=True)):
            inner.append((index, offset, length))
    return inner


def _unreferenceable(layout: ArrayLayout) -> str | None:
    """Why chunks of ``layout`` cannot be referenced as a manifest's chunks (None: they can). A sharded
    array's inner chunks can: each is a byte range of its shard."""
    if layout.vlen or layout.dtype.storage.kind == "O" or layout.dtype.nctype.name == "string":
        return "its values are variable-length strings"
    if layout.order != "C" or layout.transpose is not None:
        return "its chunks are not in C order"
    return None


_DIGITS = re.compile(r"0|[1-9][0-9]*")


def chunk_index(name: str, layout: ArrayLayout, grid: list[int]) -> tuple[int, ...] | None:
    """The chunk index a key below its array names (``1.2``, ``1/2``, ``c/1/2``, a scalar's ``0`` or
    ``c``), None when the name is no chunk of the array (metadata, or outside its grid)."""
    parts = name.split(layout.separator) if layout.separator != "/" else name.split("/")
    if layout.separator != "/" and "/" in name:
        return None
    if layout.key_prefix:
        if parts[0] != layout.key_prefix:
            return None
        parts = parts[1:]
    if not grid:  # a scalar: one chunk, "0" (v2) or "c" (v3)
        return () if parts == ([] if layout.key_prefix else ["0"]) else None
    if len(parts) != len(grid) or not all(_DIGITS.fullmatch(part) for part in parts):
        return None
    index = tuple(int(part) for part in parts)
    return index if all(i < n for i, n in zip(index, grid, strict=True)) else None


def _fill_as_attribute(variable, file: SourceFile) -> list[str]:
    """The variable's fill value made its ``_FillValue`` attribute where they differ (Zarr v3 as xarray
    writes it: ``fill_value`` NaN, ``_FillValue`` -999): the manifest is Zarr v2, whose readers (xarray's
    zarr backend) take ``fill_value`` as the value meaning "missing" and ignore the attribute, so that a
    manifest keeping the store's NaN would leave every -999 unmasked. Missing chunks then read as the
    attribute's value, missing too, instead of the store's fill: said in a note, naming the variable."""
    if "_FillValue" not in variable.attrs or variable.storages[0].kind != "chunked":
        return []
    layout = variable.layout
    try:
        wanted = np.asarray(variable.attrs.typed("_FillValue").value).astype(layout.dtype.storage).ravel()
    except (TypeError, ValueError):
        return []
    if wanted.size != 1 or _same_value(wanted[0], layout.fill_value):
        return []
    stored = layout.fill_value
    layout.fill = wanted[0]
    storage = variable.storages[0]
    grid = [-(-n // k) for n, k in zip(storage.shape, storage.chunks, strict=True)]
    if storage.problem is None and storage.chunk_count == int(np.prod(grid, dtype=np.int64)):
        return []
    return [
        f"{variable.key} of {file.shown}: its chunks that are not stored read as its _FillValue "
        f"{wanted[0]!r} (missing) in the manifest, not as the store's fill_value {stored!r}"
    ]


def _same_value(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" and b.dtype.kind == "f" and np.isnan(a) and np.isnan(b):
        return True
    return bool(a == b)


def _as_source_layout(layout: ArrayLayout) -> ArrayLayout:
    """The layout a manifest gives the referenced chunks: C order, ``.`` keys, no Zarr v3 key encoding
    or sharding, and the byte order the chunks really have (netcdf-c 4.8.0-4.9.2 wrote big-endian
    arrays in host order)."""
    dtype = layout.dtype
    if dtype.host_order:
        dtype = native_dtype(dtype.nctype, dtype.chunk)
    scalar = {"shape": (), "chunks": ()} if layout.scalar else {}
    return dataclasses.replace(
        layout,
        dtype=dtype,
        separator=".",
        order="C",
        key_prefix="",
        transpose=None,
        shards=None,
        zarr3=None,
        **scalar,
    )


class _Opened:
    """The store opened by nczmap's reader, once per process (opened again where a parse or a load runs
    in another process)."""

    def __init__(self, opening: str) -> None:
        self.opening = opening
        self._dataset = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"opening": self.opening}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["opening"])

    @property
    def dataset(self):
        with self._lock:
            if self._dataset is None:
                from nczmap.api import open_dataset

                self._dataset = open_dataset(self.opening, "r")
            return self._dataset

    def close(self) -> None:
        with self._lock:
            if self._dataset is not None:
                self._dataset.close()
                self._dataset = None


class _Values:
    """A variable's values read through the store (loading)."""

    def __init__(self, opened: _Opened, key: str) -> None:
        self.opened, self.key = opened, key

    def __call__(self) -> np.ndarray:
        variable = _find_variable(self.opened.dataset, self.key)
        return np.asarray(variable.read())


class _ChunkReader:
    """Chunk ``number``'s bytes, read through the store (small chunks kept in the manifest, checksums):
    ``reads`` holds each chunk's object key, offset and length in it."""

    def __init__(self, opened: _Opened, reads: list[tuple[str, int, int]], remote: bool) -> None:
        self.opened, self.reads, self.remote = opened, reads, remote

    def __call__(self, number: int) -> bytes:
        key, offset, length = self.reads[number]
        return self.opened.dataset.zmap.read(key, offset, length)


def _find_variable(root: Group, key: str):
    *groups, name = key.strip("/").split("/")
    group = root
    for part in groups:
        group = group.groups[part]
    return group.variables[name]


__all__ = ["StoreSource", "ZipFile", "chunk_index", "names_a_store", "parse", "sniff", "store_source"]
