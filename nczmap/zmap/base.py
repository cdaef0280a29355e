"""The zmap contract: what every storage driver guarantees (netcdf-c ``zmap.h``, nczarr-format.md §1).

**Keys.** ``'/' | ('/' segment)+``: a segment is any UTF-8 text without ``/``, control characters or lone
surrogates, and is not empty, ``.``, ``..`` or a name starting with ``.nczmap-tmp-`` (reserved for staging).
Keys are relative to the dataset root; a missing leading ``/`` is added and ``/a/`` means ``/a`` in
``search``. :class:`ZMap`'s public methods check keys (``KeyNameError``) before a driver sees them, so no
key can name anything outside the root, and a driver's primitives always get the normalised form.

**Objects and directories.** A *content-bearing* key names an object: a byte string, possibly empty. Every
other key (an intermediate "directory" such as ``/g/v``, the root, or a key with nothing under it) has no
content. Objects are leaves: a key is never both an object and the prefix of another key, and a write that
would break this raises ``KeyConflictError``.

**The "no content" error.** ``len`` and ``read`` of a key without content raise :class:`EmptyError`
(netcdf-c's NC_EEMPTY) whether the key is a directory or absent: the contract does not tell them apart.
``exists`` answers the same question without raising. A missing dataset is ``DatasetNotFound`` at open.

**Search.** ``search(prefix)`` returns the names (single segments, not keys) of the immediate children of
``prefix`` -- objects and directories alike -- without duplicates, sorted bytewise by UTF-8 (code-point
order); ``[]`` for an object, an absent key or an empty directory. Names that cannot be keys (foreign files
such as ``a..b/`` spellings, staging files) are never listed.

**Byte ranges.** ``read(key, start, count)`` returns ``count`` bytes from ``start`` (to the end when
``count`` is None). A range running past the end is cut short like a Python slice (``b""`` from past the
end); it never returns garbage or padding. Negative values raise ``RangeError``. ``read_into`` fills a
caller's buffer the same way and returns the count.

**Writes.** ``write(key, data)`` replaces the whole object, creating directories as needed. It is atomic:
a reader (or a crash) sees the old content or the new, never a mix, and a failed write leaves the old
content readable. Drivers that commit at ``close`` (zip) stage writes and make them visible to their own
map at once. ``delete`` removes an object or a whole subtree (absent keys are not an error); ``truncate``
empties the dataset; ``close(delete=True)`` removes it.

**Capabilities** are declared on the driver class (netcdf-c ``NCZM_FEATURES``, zarr-python
``supports_*``): :attr:`ZMap.writable` (a read-only driver implements only the read primitives; any write
raises ``ReadOnlyError`` naming it), :attr:`ZMap.listable` (``search`` works), :attr:`ZMap.latency`
(``LOCAL`` storage is bound by CPU and disk, ``REMOTE`` by round trips, which callers overlap and batch).

**Threads.** One map may be used from several threads at once for reads and for writes of different keys
(chunk I/O runs on a pool); opening, ``truncate`` and ``close`` are not concurrent with anything else.

**Errors.** Everything raised derives from :class:`nczmap.NCZError` and names the key and the location.

**The primitives** a driver implements (``_``-prefixed, called with checked, normalised keys):

- ``_exists(key) -> bool``: the key is content-bearing.
- ``_len(key) -> int``: its size; ``EmptyError`` without content.
- ``_read(key, start, count) -> bytes``: the range, cut short at the end; ``EmptyError`` without content.
- ``_read_into(key, buffer, start) -> int``: optional, a faster ``_read`` into a caller's buffer.
- ``read_many_into(requests)``: optional (public), many whole objects into buffers at once; drivers that
  can merge neighbouring byte ranges (the manifest driver) override it.
- ``_search(prefix) -> list[str]``: sorted child names (listable drivers).
- ``_close(delete)``: release (and commit) everything; remove the dataset when ``delete``.
- writable drivers also: ``_write(key, data: memoryview)``, ``_delete(key)``, ``_truncate()``.
"""

from __future__ import annotations

import contextlib
import enum
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

from nczmap.concurrency import LOCAL_WIDTH, WIDTH, run_all
from nczmap.errors import DataError, EmptyError, RangeError, ReadOnlyError, StorageError
from nczmap.url import ParsedURL
from nczmap.zmap.keys import ROOT, join, normalize_key, normalize_prefix

MODES = ("r", "r+", "a", "w")
# Root objects that mark a directory or archive as a Zarr / NCZarr store (safe to truncate).
STORE_MARKERS = (".zgroup", ".zarray", ".zattrs", ".zmetadata", ".nczarr", "zarr.json")


def as_buffer(key: str, data: object) -> memoryview:
    """A flat byte view of ``data`` (bytes, bytearray, memoryview, numpy array...)."""
    if isinstance(data, str):
        raise DataError(f"write of {key!r}: data must be bytes-like, not str (encode it first)")
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError as exc:
        raise DataError(f"write of {key!r}: data must be bytes-like, not {type(data).__name__}") from exc
    if not view.contiguous:
        raise DataError(f"write of {key!r}: data must be a contiguous buffer")
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


@dataclass(frozen=True)
class ByteRange:
    """Where the bytes of one object are: ``length`` bytes at ``offset`` of the file or object at ``url``
    (``file:///path`` or ``s3://bucket/key``), what a manifest refers to instead of copying them."""

    key: str  # the object's key in the map
    url: str
    offset: int
    length: int
    stamp: dict  # what recognises the file or object at ``url`` unchanged: size and mtime (ns), or ETag
    problem: str | None = None  # why the bytes are not the object's as stored (a compressed zip member)


class Latency(enum.Enum):
    """What a storage's operations wait for: the local machine, or round trips to a server."""

    LOCAL = "local"
    REMOTE = "remote"


class ZMap(ABC):
    """One dataset's key/value storage. Keys are ``/``-separated with a leading ``/``."""

    driver: ClassVar[str] = ""
    writable: ClassVar[bool] = True
    listable: ClassVar[bool] = True
    latency: ClassVar[Latency] = Latency.LOCAL

    @property
    def io_width(self) -> int:
        """Chunk reads or writes worth running at once on this storage."""
        return WIDTH if self.latency is Latency.REMOTE else LOCAL_WIDTH

    def __init__(self, url: ParsedURL | None, mode: str) -> None:
        self.url = url
        self.mode = mode
        self._closed = False

    # ----------------------------------------------------------------- public contract
    @property
    def readonly(self) -> bool:
        return self.mode == "r" or not self.writable

    @property
    def closed(self) -> bool:
        return self._closed

    def exists(self, key: str) -> bool:
        """True if ``key`` names an object (content-bearing, possibly zero bytes)."""
        key = self._key(key)
        return key != ROOT and self._exists(key)

    def len(self, key: str) -> int:
        """Size in bytes of the object at ``key``; :class:`EmptyError` if it has no content."""
        key = self._key(key)
        if key == ROOT:
            raise EmptyError(key, self.location)
        return self._len(key)

    def read(self, key: str, start: int = 0, count: int | None = None) -> bytes:
        """``count`` bytes of the object from ``start`` (to the end when ``count`` is None).

        A range running past the end returns what is there (like a Python slice), never garbage.
        """
        key = self._key(key)
        if start < 0 or (count is not None and count < 0):
            raise RangeError(f"read of {key!r} in {self.location}: bad range start={start} count={count}")
        if key == ROOT:
            raise EmptyError(key, self.location)
        return self._read(key, start, count)

    def read_into(self, key: str, buffer: memoryview, start: int = 0) -> int:
        """Read up to ``len(buffer)`` bytes of the object from ``start`` into ``buffer``; returns the count.

        Lets callers fill a numpy array without an intermediate copy; drivers may override it.
        """
        key = self._key(key)
        if start < 0:
            raise RangeError(f"read of {key!r} in {self.location}: bad range start={start}")
        if key == ROOT:
            raise EmptyError(key, self.location)
        return self._read_into(key, buffer, start)

    def read_many_into(self, requests: Sequence[tuple[str, memoryview]]) -> list[int | None]:
        """Fill each buffer from the start of its key's object; the byte counts, None where a key has no
        content. Drivers that can read many objects at once (merging neighbouring ranges) override it."""
        results: list[int | None] = [None] * len(requests)

        def read_one(index: int, key: str, buffer: memoryview) -> None:
            with contextlib.suppress(EmptyError):
                results[index] = self.read_into(key, buffer)

        run_all([lambda i=i, k=k, b=b: read_one(i, k, b) for i, (k, b) in enumerate(requests)], self.io_width)
        return results

    def _read_into(self, key: str, buffer: memoryview, start: int) -> int:
        data = self._read(key, start, len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def write(self, key: str, data: object) -> None:
        """Store ``data`` as the whole content of ``key``, replacing any previous content atomically."""
        key = self._key(key, writing=True)
        if key == ROOT:
            raise DataError(f"cannot write the root key '/' of {self.location}")
        self._write(key, as_buffer(key, data))

    def copy_from(self, source: ZMap, source_key: str, key: str) -> bool:
        """Store a copy of ``source``'s object ``source_key`` at ``key``; False if it has no content."""
        try:
            data = source.read(source_key)
        except EmptyError:
            return False
        self.write(key, data)
        return True

    def search(self, prefix: str = ROOT) -> list[str]:
        """Bytewise-sorted names of the children of ``prefix``; ``[]`` for leaves and absent keys."""
        self._check_open()
        if not self.listable:
            raise StorageError(f"the {self.driver} driver cannot list keys ({self.location})")
        return self._search(normalize_prefix(prefix))

    def delete(self, key: str) -> None:
        """Remove the object at ``key``, or everything under it; nothing happens if there is nothing."""
        key = self._key(key, writing=True)
        if key == ROOT:
            self._truncate()
        else:
            self._delete(key)

    def truncate(self) -> None:
        """Remove all content of the dataset (the dataset itself stays, empty)."""
        self._check_writable(ROOT)
        self._truncate()

    def close(self, delete: bool = False) -> None:
        """Flush and release the dataset; ``delete=True`` removes it entirely."""
        if self._closed:
            return
        if delete:
            self._check_writable(ROOT)
        try:
            self._close(delete)
        finally:
            self._closed = True

    def walk(self, prefix: str = ROOT) -> Iterator[str]:
        """Every key below ``prefix``, objects and directories, depth-first pre-order, children sorted."""
        top = normalize_prefix(prefix)
        stack = [join(top, name) for name in reversed(self.search(top))]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(join(node, name) for name in reversed(self.search(node)))

    def objects(self, prefix: str = ROOT) -> Iterator[str]:
        """Every content-bearing key below ``prefix`` in :meth:`walk` order."""
        return (key for key in self.walk(prefix) if self.exists(key))

    def byte_ranges(self, prefix: str = ROOT) -> list[ByteRange]:
        """Every object below ``prefix`` (in :meth:`walk` order) with where its bytes are, so that they can
        be referred to where they lie (virtualizing a store); StorageError from a driver whose objects are
        not byte ranges of files or objects (memory, manifests, Icechunk)."""
        return [self._byte_range(key) for key in self.objects(prefix)]

    def _byte_range(self, key: str) -> ByteRange:
        raise StorageError(
            f"{self.location}: the {self.driver} driver cannot say where the bytes of its objects are"
        )

    @property
    def location(self) -> str:
        return self.url.location if self.url is not None else f"<{self.driver} map>"

    def __enter__(self) -> ZMap:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not self.readonly:
            self.abort()
        else:
            self.close()

    def abort(self) -> None:
        """Close without committing anything not yet committed (only the zip driver stages writes)."""
        self.close()

    # ----------------------------------------------------------------- pickling
    def __reduce__(self):
        """Maps travel to other processes (dask workers) as their URL and reopen there: read-only maps
        read-only, writable ones as ``r+`` (never ``w``, which would empty the dataset), with the same
        driver options. A map without a URL (memory) travels with its content."""
        return self.reopen_recipe() or super().__reduce__()

    def reopen_recipe(self) -> tuple | None:
        """``(function, arguments)`` that open this map again in another process; None without a URL."""
        if self.url is None:
            return None
        return (_reopen, (type(self), self.url, "r" if self.mode == "r" else "r+", self.reopen_options()))

    def reopened(self, mode: str) -> ZMap:
        """A new map on the same storage (``mode`` as for :func:`nczmap.open_map`)."""
        if self.url is None:
            raise StorageError(f"{self.location} has no URL to open it again by")
        return type(self)(self.url, mode, **self.reopen_options())

    def reopen_options(self) -> dict[str, object]:
        """The driver options this map was opened with, for reopening it elsewhere."""
        return {}

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.mode
        return f"<{type(self).__name__} {self.location!r} ({state})>"

    # ----------------------------------------------------------------- helpers
    def _key(self, key: str, writing: bool = False) -> str:
        if writing:
            self._check_writable(key)
        else:
            self._check_open()
        return normalize_key(key)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self.location} is closed")

    def _check_writable(self, key: str) -> None:
        self._check_open()
        if not self.writable:
            raise self._read_only(key)
        if self.readonly:
            raise ReadOnlyError(f"cannot modify {key!r}: {self.location} is open read-only")

    # ----------------------------------------------------------------- driver primitives
    @abstractmethod
    def _exists(self, key: str) -> bool: ...

    @abstractmethod
    def _len(self, key: str) -> int: ...

    @abstractmethod
    def _read(self, key: str, start: int, count: int | None) -> bytes: ...

    @abstractmethod
    def _search(self, prefix: str) -> list[str]: ...

    @abstractmethod
    def _close(self, delete: bool) -> None: ...

    # Write primitives: a writable driver overrides all three; a read-only one never gets here.
    def _write(self, key: str, data: memoryview) -> None:
        raise self._read_only(key)

    def _delete(self, key: str) -> None:
        raise self._read_only(key)

    def _truncate(self) -> None:
        raise self._read_only(ROOT)

    def _read_only(self, key: str) -> ReadOnlyError:
        return ReadOnlyError(
            f"cannot modify {key!r}: the {self.driver} driver is read-only ({self.location})"
        )

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.writable and ABC not in cls.__bases__:
            primitives = ("_write", "_delete", "_truncate")
            missing = [name for name in primitives if getattr(cls, name) is getattr(ZMap, name)]
            if missing:
                raise TypeError(f"{cls.__name__} declares writable = True but lacks {', '.join(missing)}")


def _reopen(cls: type[ZMap], url: ParsedURL, mode: str, options: dict[str, object]) -> ZMap:
    return cls(url, mode, **options)
