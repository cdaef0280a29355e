"""Chunk data a manifest keeps beside itself: files ``<manifest>.<token>.chunks`` its references name.

A manifest holds small chunks inline; data it cannot refer to elsewhere and that is too large to inline
(variables a virtualization loads: NC_STRING data, coordinates, re-chunked arrays) is appended to a chunk
file, and the manifest refers to byte ranges of it like any other source (kerchunk and fsspec read it
as one). Each session that writes such data makes a new file, never changing an existing one: it is
written as a temporary file, renamed to its own name just before the manifest is saved, and recorded
in the manifest (size and modification time). Files no manifest entry names any more are removed after
the manifest is saved. So a writer killed at any moment leaves the previous manifest and every file it
names intact: at worst a temporary file or an unreferenced chunk file remains, removed by the next
writer of the manifest. Both happen under the manifest's writer lock (local manifests, the only ones
with chunk files), so one writer never removes another's file being written.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Container

from nczmap.errors import StorageError, from_os_error
from nczmap.zmap.osutil import remove_if_present

SUFFIX = ".chunks"
TEMP = ".nczmap-tmp-"


class Sidecar:
    def __init__(self, manifest_path: str) -> None:
        self.base = os.path.realpath(manifest_path.rstrip("/"))
        self.path = f"{self.base}.{os.urandom(4).hex()}{SUFFIX}"
        self.url = "file://" + self.path
        self.fd = -1  # the temporary file being written
        self._temp: str | None = None
        self._size = 0
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """The bytes written so far."""
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
        self._temp = f"{self.path}{TEMP}{os.urandom(6).hex()}"
        try:
            self.fd = os.open(self._temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            self.discard()
            raise from_os_error(exc, f"cannot write the chunk file {self.path!r}") from exc

    def commit(self) -> dict | None:
        """Put the file in place under its own name; what the manifest records of it (None when nothing
        was written)."""
        if self.fd < 0:
            return None
        try:
            os.fsync(self.fd)
            info = os.fstat(self.fd)
            os.rename(self._temp, self.path)
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


def remove_unreferenced(manifest_path: str, referenced: Container[str]) -> None:
    """Remove the chunk files beside ``manifest_path`` whose ``file://`` URL is not in ``referenced`` (the
    saved manifest's sources), and temporary ones a dead writer left. Run after the manifest is saved, by
    the holder of its writer lock."""
    base = os.path.realpath(manifest_path.rstrip("/"))
    pattern = glob.escape(base) + ".*" + SUFFIX
    for path in glob.glob(pattern) + glob.glob(pattern + TEMP + "*"):
        if TEMP in os.path.basename(path) or "file://" + path not in referenced:
            remove_if_present(path)
