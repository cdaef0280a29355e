"""The zmap contract (netcdf-c ``zmap.h``) as a Python abstract class.

Public methods validate keys, the open mode and the arguments, then call the driver's ``_``-prefixed
primitive with a normalised key. Drivers never parse JSON and never see an illegal key.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar

from nczmap.concurrency import LOCAL_WIDTH
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


class ZMap(ABC):
    """One dataset's key/value storage. Keys are ``/``-separated with a leading ``/``."""

    driver: ClassVar[str] = ""
    io_width: ClassVar[int] = LOCAL_WIDTH  # chunk reads/writes worth running at once on this storage

    def __init__(self, url: ParsedURL | None, mode: str) -> None:
        self.url = url
        self.mode = mode
        self._closed = False

    # ----------------------------------------------------------------- public contract
    @property
    def readonly(self) -> bool:
        return self.mode == "r"

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
        if key == ROOT:
            raise EmptyError(key, self.location)
        return self._read_into(key, buffer, start)

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
    def _write(self, key: str, data: memoryview) -> None: ...

    @abstractmethod
    def _search(self, prefix: str) -> list[str]: ...

    @abstractmethod
    def _delete(self, key: str) -> None: ...

    @abstractmethod
    def _truncate(self) -> None: ...

    @abstractmethod
    def _close(self, delete: bool) -> None: ...
