"""Damage HDF5 itself cannot survive, refused before it reads it.

libhdf5 decodes a global heap collection (where variable-length data lives: strings, ``DIMENSION_LIST``)
object by object, each object's size telling where the next starts. A damaged collection whose free-space
object (index 0) has size 0 makes it decode the same object forever (netcdf-c's ncdump hangs on such a
file too); an object claiming more bytes than the collection holds sends it past its end. HDF5 reads
through a Python file object here (:class:`GuardedFile` for a local file, ``HeldFile`` for the rounds of a
remote one), so every read that returns a global heap collection is walked first as HDF5 would walk it
(:class:`HeapGuard`), and one HDF5 would not get through is refused with :class:`DamagedHeap`, which h5py
raises in place of its own error.
"""

from __future__ import annotations

import os

from nczmap.integrations.virtualize.files import SeekableReader

SIGNATURE = b"\x89HDF\r\n\x1a\n"
COLLECTION = b"GCOL\x01"  # signature and version 1, the only one there is


class DamagedHeap(OSError):
    """A global heap collection HDF5 would decode forever, or past its end."""


class HeapGuard:
    """Checks the reads of one HDF5 file; learns the size of lengths from the superblock (read first)."""

    def __init__(self) -> None:
        self.lengths: int | None = None

    def check(self, offset: int, data: bytes | memoryview) -> None:
        """Raise :class:`DamagedHeap` if ``data``, read at ``offset``, is a collection HDF5 cannot decode."""
        head = bytes(data[:16])
        if head.startswith(SIGNATURE) and len(head) >= 15:
            self.lengths = _superblock_lengths(head)
        elif head.startswith(COLLECTION) and self.lengths:
            why = heap_damage(data, self.lengths)
            if why is not None:
                raise DamagedHeap(f"its global heap collection at byte {offset} is damaged: {why}")


def _superblock_lengths(head: bytes) -> int | None:
    """The size of lengths a superblock declares (versions 0 and 1 keep it at byte 14, 2 and 3 at 10)."""
    version = head[8]
    size = head[14] if version in (0, 1) else head[10] if version in (2, 3) else 0
    return size if size in (2, 4, 8, 16) else None


def heap_damage(data: bytes | memoryview, lengths: int) -> str | None:
    """Why HDF5 could not decode the global heap collection ``data`` starts with (its objects walked as HDF5
    walks them: an index, a count, 4 reserved bytes, a size of ``lengths`` bytes, then the data padded to 8
    bytes; the free space, index 0, without header or padding), or None. Only the objects ``data`` holds
    whole are looked at (a first read of a collection may hold a part of it)."""
    view = memoryview(data).cast("B")
    header = 8 + lengths  # the collection's and each object's
    if len(view) < header:
        return None
    size = int.from_bytes(view[8:header], "little")
    at = header
    while at < size:
        if at + header > size:
            return None  # too little left for an object: HDF5 takes it as free space
        if at + header > len(view):
            return None  # not read yet
        index = int.from_bytes(view[at : at + 2], "little")
        length = int.from_bytes(view[at + 8 : at + header], "little")
        need = length if index == 0 else header + -(-length // 8) * 8
        if need == 0:
            return f"its free space at byte {at} is empty (HDF5 would read it forever)"
        if need > size - at:
            return f"object {index} at byte {at} claims {length} bytes, past the collection's {size}"
        at += need
    return None


class GuardedFile(SeekableReader):
    """A local HDF5 file for h5py, read with ``pread`` and checked by a :class:`HeapGuard`."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.size = os.fstat(self.fd).st_size
        self.position = 0
        self.guard = HeapGuard()

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        count = 0
        while count < len(view):
            got = os.preadv(self.fd, [view[count:]], self.position + count)
            if not got:
                break  # the end of the file: HDF5 reads zeros past it
            count += got
        self.guard.check(self.position, view[:count])
        self.position += count
        return count

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)
        super().close()
