"""Many chunks of a manifest read in columns: where each object's bytes go (:class:`Targets`), the
references of one source merged into spans (:class:`Spans`) and cut into runs contiguous in the file and
in memory (:func:`runs`), so that a whole-array read makes no object per chunk."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from nczmap._lazy import numpy as np


class Targets:
    """Where the bytes of each object read go: ``room[n]`` bytes at ``starts[n]`` of ``buffers[which[n]]``."""

    def __init__(self, buffers: list[memoryview], which: np.ndarray, starts: np.ndarray, room: np.ndarray):
        self.buffers = buffers
        self.which = which
        self.starts = starts
        self.room = room

    @classmethod
    def strided(cls, buffer: memoryview, count: int, size: int) -> Targets:
        """Object ``n`` in ``buffer[n * size : (n + 1) * size]``."""
        starts = np.arange(count, dtype=np.int64) * size
        return cls([buffer], np.zeros(count, dtype=np.int64), starts, np.full(count, size, dtype=np.int64))

    @classmethod
    def separate(cls, buffers: list[memoryview]) -> Targets:
        """Object ``n`` in ``buffers[n]``."""
        count = len(buffers)
        room = np.fromiter(map(len, buffers), dtype=np.int64, count=count)
        return cls(buffers, np.arange(count, dtype=np.int64), np.zeros(count, dtype=np.int64), room)

    def view(self, at: int, length: int) -> memoryview:
        start = int(self.starts[at])
        return self.buffers[int(self.which[at])][start : start + length]


class KeyNames(Protocol):
    """``names[n]``: the key of the ``n``-th object read (for errors and checksums)."""

    def __getitem__(self, at: int) -> str: ...


class ChunkNames:
    """``names[n]``: the key of the chunk at row ``n`` of ``indices`` (made only when it is asked for)."""

    def __init__(self, array: str, indices: np.ndarray, separator: str) -> None:
        self.array = array
        self.indices = indices
        self.separator = separator

    def __getitem__(self, at: int) -> str:
        return f"{self.array}/{self.separator.join(map(str, self.indices[at].tolist()))}"


class ColumnSpan(NamedTuple):
    """One read ``[start, end)`` of a source and the references it covers, in file order: their offsets,
    the bytes of each wanted, and their positions among the objects read."""

    start: int
    end: int
    offsets: np.ndarray
    lengths: np.ndarray
    positions: np.ndarray


class Spans:
    """References of one source merged into spans (:func:`byteranges.merge_ranges` in columns): the
    references in file order, where each span's begin among them (and where the last ends), each span's
    end in the file."""

    def __init__(self, offsets, lengths, positions, firsts: np.ndarray, ends: np.ndarray) -> None:
        self.offsets, self.lengths, self.positions = offsets, lengths, positions
        self.firsts = firsts
        self.ends = ends
        self.count = len(ends)

    @classmethod
    def merged(cls, offsets, lengths, positions, gap: int, longest: int) -> Spans:
        """References whose gaps are at most ``gap`` bytes (overlapping and adjacent ones always) merged
        into spans no longer than ``longest`` (unless one reference is)."""
        order = np.argsort(offsets, kind="stable")
        offsets, lengths, positions = offsets[order], lengths[order], positions[order]
        count = len(offsets)
        if not count:
            return cls(offsets, lengths, positions, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))
        ends = offsets + lengths
        reach = np.maximum.accumulate(ends)  # the furthest end so far: what a span covers
        firsts = np.concatenate([[0], np.flatnonzero(offsets[1:] - reach[:-1] > gap) + 1])
        lasts = np.append(firsts[1:], count) - 1
        too_long = np.flatnonzero(reach[lasts] - offsets[firsts] > longest)
        if len(too_long):
            cuts = [
                _cuts(offsets, reach, int(firsts[g]), int(lasts[g]) + 1, longest) for g in too_long.tolist()
            ]
            firsts = np.union1d(firsts, np.concatenate(cuts).astype(np.int64))
        return cls(offsets, lengths, positions, np.append(firsts, count), np.maximum.reduceat(ends, firsts))

    def span(self, number: int) -> ColumnSpan:
        first, last = int(self.firsts[number]), int(self.firsts[number + 1])
        return ColumnSpan(
            int(self.offsets[first]),
            int(self.ends[number]),
            self.offsets[first:last],
            self.lengths[first:last],
            self.positions[first:last],
        )


def _cuts(offsets: np.ndarray, reach: np.ndarray, first: int, stop: int, longest: int) -> list[int]:
    """Where references ``first...stop - 1`` (one merged group) are cut into spans of at most ``longest``
    bytes (a span holds one reference at least)."""
    cuts = []
    while True:
        first += max(1, int(np.searchsorted(reach[first:stop], offsets[first] + longest, side="right")))
        if first >= stop:
            return cuts
        cuts.append(first)


def runs(offsets, lengths, which, starts) -> tuple[np.ndarray, ...]:
    """References in file order, none overlapping another, as runs contiguous both in the file and in
    one buffer: per run the gap before it in the file, its buffer, its start there and its length."""
    gaps = offsets[1:] - (offsets[:-1] + lengths[:-1])
    joined = (gaps == 0) & (which[1:] == which[:-1]) & (starts[1:] == starts[:-1] + lengths[:-1])
    firsts = np.flatnonzero(np.concatenate([[True], ~joined]))
    before = np.concatenate([[0], gaps])[firsts]
    return before, which[firsts], starts[firsts], np.add.reduceat(lengths, firsts)
