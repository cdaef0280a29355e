"""What parsers read sources through (:class:`SourceFile`), and local files (:class:`LocalFile`): their size
and modification time from one ``stat``, a bounded number held open at once."""

from __future__ import annotations

import bisect
import contextlib
import io
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from nczmap.errors import FormatError, NCZError, StorageError
from nczmap.manifest.containers import Container, normalize
from nczmap.zmap import byteranges

OPEN_FILES = 64  # local sources held open at once, at most (a quarter of the descriptor limit if lower)


def file_stat(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns


class SourceFile:
    """One source as parsers read it and as the manifest refers to it."""

    name: str  # in messages and refusals: the real path, or s3://bucket/key
    url: str  # in references: file:///real/path or s3://bucket/key
    shown: str  # as the user gave it
    size: int  # a remote source's: known after its first read (asking for it makes that read)
    error: Exception | None = None  # why a read through h5py failed (h5py reports only an OSError)

    def open(self, h5py):
        """The source opened by h5py (netCDF-4/HDF5 sources)."""
        raise NotImplementedError

    def read(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (StorageError if the source ends before)."""
        raise NotImplementedError

    def read_head(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer at the end): what parsers sniff formats from."""
        return self.read(offset, max(0, min(length, self.size - offset)))

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Exactly the bytes of each ``(offset, length)``, fetched together (a remote source merges
        neighbours and fetches the rest concurrently); StorageError if the source ends before one."""
        return [self.read(offset, length) for offset, length in ranges]

    def cached(self, offset: int, length: int) -> bytes | None:
        """The bytes at ``offset`` if they can be had without waiting on a request (a local file: always;
        a remote one: what it has fetched already), else None. Fewer at the end of the source."""
        return self.read_head(offset, length)

    def grant(self) -> str | Container:
        """The container it lies in by default (its directory or bucket prefix)."""
        raise NotImplementedError

    def recorded(self) -> dict:
        """What the manifest records to recognise a changed source (size and modification time, or size
        and ETag)."""
        raise NotImplementedError

    def recorded_sources(self) -> dict[str, dict]:
        """What the manifest records of each file or object its references point into, by URL: this
        source's :meth:`recorded` (a store's chunk files each have their own)."""
        return {self.url: self.recorded()}

    def check_unchanged(self) -> None:
        """StorageError if the source changed while it was read."""

    def known(self) -> dict:
        """What was learnt of the source by reading it (a remote one's size, ETag, modification time), for
        a copy of it in another process: :meth:`adopt`."""
        return {}

    def adopt(self, known: dict) -> None:
        """Take what another copy of this source learnt (:meth:`known`); StorageError if it contradicts
        what this one knows (the source changed between their reads)."""

    def release(self) -> None:
        """Parsing is done: let go of the descriptor and of most bytes held (a later read takes them
        again, checked to be of the same version)."""
        self.close()

    def close(self) -> None:
        pass


class LocalFile(SourceFile):
    """A local file: its size and modification time from one ``stat``, opened when first read (checked
    to be that file still) and held open until :meth:`release` or :meth:`close`; at most
    :data:`OPEN_FILES` local sources are open at once, the least recently read closed first."""

    def __init__(self, path: str, shown: str) -> None:
        self.name = path
        self.url = normalize(path, None, links=False)  # ``path`` is real already: links resolved
        self.shown = shown
        try:
            info = os.stat(path)
        except OSError as exc:
            raise StorageError(f"cannot read the source {shown!r}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(info.st_mode):
            raise FormatError(f"the source {shown!r} is not a regular file")
        self.size = info.st_size
        self.stat = (info.st_size, info.st_mtime_ns)
        self.fd = -1
        self._users = 0  # reads in progress on ``fd`` (it is never closed under one)

    def __getstate__(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key not in ("fd", "_users")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.fd, self._users = -1, 0

    def open(self, h5py):
        try:
            return h5py.File(self.name, "r")
        except OSError as exc:
            raise FormatError(f"cannot open {self.name!r} as netCDF-4/HDF5: {exc}") from exc

    def read(self, offset: int, length: int) -> bytes:
        with self._descriptor() as fd:
            try:
                return byteranges.read_exact(fd, length, offset, self.name)
            except OSError as exc:
                if isinstance(exc, NCZError):
                    raise
                raise StorageError(f"cannot read {length} bytes at {offset} of {self.name}: {exc}") from exc

    def read_head(self, offset: int, length: int) -> bytes:
        return self.read(offset, max(0, min(length, self.size - offset)))

    @contextlib.contextmanager
    def _descriptor(self):
        with _OPEN.lock:
            if self.fd >= 0:
                self._users += 1
                _OPEN.files.move_to_end(id(self))
                fd = self.fd
            else:
                fd = -1
        if fd < 0:
            fd = self._open()
            with _OPEN.lock:
                if self.fd >= 0:  # another thread opened it meanwhile
                    os.close(fd)
                    fd = self.fd
                else:
                    self.fd = fd
                    _OPEN.files[id(self)] = self
                self._users += 1
        try:
            yield fd
        finally:
            with _OPEN.lock:
                self._users -= 1
                _OPEN.trim()

    def _open(self) -> int:
        try:
            fd = os.open(self.name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise StorageError(f"cannot read the source {self.shown!r}: {exc.strerror or exc}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or (info.st_size, info.st_mtime_ns) != self.stat:
                raise StorageError(
                    f"the source {self.name} changed while it was being virtualized; run again"
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def grant(self) -> str:
        return os.path.dirname(self.name) + "/"

    def recorded(self) -> dict:
        size, mtime = self.stat
        return {"size": size, "mtime": mtime}

    def check_unchanged(self) -> None:
        if file_stat(self.name) != self.stat:  # raising here abandons the manifest unwritten
            raise StorageError(f"the source {self.name} changed while it was being virtualized; run again")

    def close(self) -> None:
        with _OPEN.lock:
            if self.fd >= 0 and self._users == 0:
                _OPEN.files.pop(id(self), None)
                os.close(self.fd)
                self.fd = -1


class _OpenFiles:
    """The local sources holding a descriptor, least recently read first (at most :data:`OPEN_FILES`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.files: OrderedDict[int, LocalFile] = OrderedDict()
        self.limit: int | None = None  # found at the first need: the descriptor limit may be lowered first

    def trim(self) -> None:
        """Close the least recently read idle files over the limit (called holding ``lock``)."""
        if len(self.files) <= 2:
            return
        if self.limit is None:
            self.limit = min(OPEN_FILES, _descriptor_share())
        limit = self.limit
        if len(self.files) <= limit:
            return
        for key, file in list(self.files.items()):
            if len(self.files) <= limit:
                break
            if file._users == 0:
                del self.files[key]
                os.close(file.fd)
                file.fd = -1


_OPEN = _OpenFiles()


def _after_fork() -> None:
    """The lock another thread of the parent may have held at the fork, made again in the child."""
    _OPEN.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _descriptor_share() -> int:
    """A quarter of the process's descriptor limit (the rest for h5py, sockets, the manifest...)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return OPEN_FILES
    return OPEN_FILES if soft == resource.RLIM_INFINITY else max(2, soft // 4)


class SeekableReader(io.RawIOBase):
    """A read-only file object of ``size`` bytes for h5py and tifffile: subclasses keep ``position`` and
    implement ``readinto``."""

    position = 0
    size: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position


def uncovered(starts: list[int], end_of: Callable[[int], int], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of ``[start, end)`` outside sorted, non-overlapping extents (extent ``i`` from
    ``starts[i]`` to ``end_of(i)``), as ``(start, end)``."""
    gaps, at = [], start
    index = max(0, bisect.bisect_right(starts, start) - 1)
    while at < end and index < len(starts):
        first, last = starts[index], end_of(index)
        index += 1
        if last <= at:
            continue
        if first >= end:
            break
        if first > at:
            gaps.append((at, first))
        at = max(at, last)
    if at < end:
        gaps.append((at, end))
    return gaps
