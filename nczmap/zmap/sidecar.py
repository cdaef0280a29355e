"""Chunk data a manifest keeps beside itself: one file, ``<manifest>.chunks``, that its references name.

A manifest holds small chunks inline; data it cannot refer to elsewhere and that is too large to inline
(variables a virtualization loads: NC_STRING data, coordinates, re-chunked arrays) is appended to this
file, and the manifest refers to byte ranges of it like any other source. The file is written as a
temporary file (holding the previous file's bytes first, so earlier references stay valid) and renamed
into place just before the manifest itself is saved; the manifest records its size and modification
time, so a manifest whose chunk file was replaced by another is refused, not misread. Other readers
(kerchunk, fsspec) read it as an ordinary reference target.
"""

from __future__ import annotations

import os
import threading

from nczmap.errors import StorageError, from_os_error
from nczmap.zmap.osutil import remove_if_present

SUFFIX = ".chunks"


class Sidecar:
    def __init__(self, manifest_path: str) -> None:
        self.path = os.path.realpath(manifest_path.rstrip("/")) + SUFFIX
        self.url = "file://" + self.path
        self.fd = -1  # the temporary file being written
        self._temp: str | None = None
        self._size = 0
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """The bytes written so far (those of the previous file included)."""
        return self._size

    def append(self, data: memoryview | bytes) -> int:
        """Add ``data``; returns its offset in the file."""
        with self._lock:
            if self.fd < 0:
                self._start()
            offset = self._size
            try:
                written = os.pwrite(self.fd, data, offset)
            except OSError as exc:
                raise from_os_error(exc, f"cannot write the chunk file {self.path!r}") from exc
            if written != len(data):
                raise StorageError(f"cannot write the chunk file {self.path!r}: short write")
            self._size += written
            return offset

    def _start(self) -> None:
        self._temp = f"{self.path}.nczmap-tmp-{os.urandom(6).hex()}"
        try:
            self.fd = os.open(self._temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            self._size = _copy_existing(self.path, self.fd)
        except OSError as exc:
            self.discard()
            raise from_os_error(exc, f"cannot write the chunk file {self.path!r}") from exc

    def commit(self) -> dict | None:
        """Put the file in place; what the manifest records of it (None when nothing was written)."""
        if self.fd < 0:
            return None
        try:
            os.fsync(self.fd)
            info = os.fstat(self.fd)
            os.replace(self._temp, self.path)
        except OSError as exc:
            self.discard()
            raise from_os_error(exc, f"cannot write the chunk file {self.path!r}") from exc
        os.close(self.fd)
        self.fd, self._temp = -1, None
        return {"size": info.st_size, "mtime": info.st_mtime_ns}

    def discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._temp is not None:
            remove_if_present(self._temp)
            self._temp = None


def _copy_existing(path: str, fd: int) -> int:
    try:
        source = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(source).st_size
        done = 0
        while done < size:
            copied = os.copy_file_range(source, fd, size - done, done, done)
            if not copied:
                raise StorageError(f"the chunk file {path!r} shrank while it was copied")
            done += copied
        return size
    finally:
        os.close(source)
