"""Reading Zarr v3 ``sharding_indexed`` arrays: one stored object (a shard) holds a grid of inner chunks and
an index of their (offset, length) pairs, at its start or end. An inner chunk costs two ranged reads, the
index (kept for the next inner chunk of that shard) and its own bytes."""

from __future__ import annotations

import math
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from nczmap.checksum import crc32c
from nczmap.errors import FormatError
from nczmap.zmap import ZMap

_EMPTY = 2**64 - 1
_KEPT_INDEXES = 64


@dataclass(frozen=True)
class ShardLayout:
    shard_shape: tuple[int, ...]
    inner_chunks: tuple[int, ...]
    index_endian: str
    index_checksum: bool
    index_at_end: bool
    inner: Any = field(compare=False)  # the inner chunks' codecs (zarr3._Codecs)
    _indexes: OrderedDict = field(default_factory=OrderedDict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @property
    def per_shard(self) -> tuple[int, ...]:
        return tuple(s // c for s, c in zip(self.shard_shape, self.inner_chunks, strict=True))

    @property
    def index_bytes(self) -> int:
        return math.prod(self.per_shard) * 16 + (4 if self.index_checksum else 0)

    def shard_of(self, inner_index: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(i // n for i, n in zip(inner_index, self.per_shard, strict=True))

    def position(self, inner_index: tuple[int, ...]) -> int:
        """Where in its shard's index (C order) an inner chunk's entry is."""
        place = 0
        for i, n in zip(inner_index, self.per_shard, strict=True):
            place = place * n + i % n
        return place

    def read(self, zmap: ZMap, key: str, inner_index: tuple[int, ...]) -> bytes | None:
        """The encoded bytes of one inner chunk of the shard at ``key``; None when it is not stored
        (``EmptyError`` from the map when the shard is missing)."""
        entry = self.index(zmap, key)[self.position(inner_index)]
        if entry is None:
            return None
        offset, length = entry
        data = zmap.read(key, offset, length)
        if len(data) != length:
            raise FormatError(
                f"shard {key!r}: inner chunk {inner_index} at {offset}+{length} runs past its end"
            )
        return data

    def index(self, zmap: ZMap, key: str) -> list[tuple[int, int] | None]:
        with self._lock:
            found = self._indexes.get(key)
            if found is not None:
                self._indexes.move_to_end(key)
                return found
        size = self.index_bytes
        if self.index_at_end:
            total = zmap.len(key)
            if total < size:
                raise FormatError(f"shard {key!r} holds {total} bytes, less than its {size}-byte index")
            data = zmap.read(key, total - size, size)
        else:
            data = zmap.read(key, 0, size)
        entries = parse_index(data, self, key)
        with self._lock:
            self._indexes[key] = entries
            while len(self._indexes) > _KEPT_INDEXES:
                self._indexes.popitem(last=False)
        return entries


def parse_index(data: bytes, shards: ShardLayout, key: str) -> list[tuple[int, int] | None]:
    """The (offset, length) of each inner chunk of a shard (None: not stored), checksum verified."""
    if len(data) != shards.index_bytes:
        raise FormatError(f"shard {key!r}: its index holds {len(data)} bytes, expected {shards.index_bytes}")
    body = data
    if shards.index_checksum:
        body, stored = data[:-4], int.from_bytes(data[-4:], "little")
        if crc32c(body) != stored:
            raise FormatError(f"shard {key!r}: the crc32c checksum of its index does not match")
    count = len(body) // 8
    numbers = struct.unpack(("<" if shards.index_endian == "little" else ">") + f"{count}Q", body)
    entries: list[tuple[int, int] | None] = []
    for offset, length in zip(numbers[0::2], numbers[1::2], strict=True):
        entries.append(None if offset == _EMPTY and length == _EMPTY else (offset, length))
    return entries
