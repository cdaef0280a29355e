"""Parsing a remote HDF5 file through h5py in rounds, never waiting on the network while h5py holds its lock.

h5py holds one process-wide lock while HDF5 calls a Python file object back for bytes: a read that waits
on a request there stalls every other thread's parse. So a remote file is read through a file object
(:class:`HeldFile`) that serves only bytes already held — what the source has cached (its first read)
and what earlier rounds fetched — and, on a miss, records the range and raises :class:`Missing`. A round
carries on past the part that failed (the next link, variable, attribute list: ``hdf5``'s ``_Tolerant``)
so that it finds every range needed at its level of the file's structure (superblock -> groups ->
objects -> chunk indexes -> small values); the ranges it missed are then fetched at once
(``SourceFile.read_ranges``: merged, concurrent, outside the lock) and the next round starts from
scratch. :meth:`Rounds.run`:

1. *probes* (``hdf5._probe``): a walk of groups, objects, attribute lists and chunk indexes through
   h5py's low-level API that builds nothing (a third of a parse's time), asking for the bytes of small
   variables' values without reading them (:meth:`HeldFile.want`); repeated after each fetch until it
   misses nothing, or until what it missed was only chunk index nodes and values (their dependents are
   fetched along: see below);
2. *parses*: the real parse, again after each fetch of what it missed. The first one that misses nothing
   saw only the file's real bytes: its result is exactly the direct parse's. The probes' only effect is
   on how many parses (usually one) and fetches (usually one) that takes.

What is fetched for a miss: the enclosing :data:`ALIGN`-aligned block, 4 times larger at each fetch up to
:data:`MAX_ALIGN` (metadata written between data clusters: a file that needs many fetches gets wider
ones); a miss just past the bytes held from the start, everything up to :data:`GROWTH` times as far (at
most :data:`MAX_GROWTH` further: netCDF-4 writes its metadata first). Below a version-1 chunk B-tree
node read or fetched (node type 1): an internal node's children, level by level, each level one
``read_ranges`` call (a large chunk index is a request wave a level, not a round a leaf); the only leaf
of a small variable's index, its chunks (the parser reads small variables' values). Rounds and bytes
are bounded (:data:`MAX_ROUNDS`, :data:`MAX_BYTES`): past them :class:`Exhausted` is raised and the
caller parses the usual way.
"""

from __future__ import annotations

import bisect
import contextlib
import struct
import threading
from collections.abc import Callable
from typing import TypeVar

from nczmap.integrations.virtualize.files import SeekableReader, uncovered
from nczmap.integrations.virtualize.hdf5_guard import HeapGuard
from nczmap.integrations.virtualize.sources import SourceFile

HEAD = 64 << 10  # fetched first when the source holds nothing at 0 (netCDF-4's superblock and root)
ALIGN = 16 << 10  # a miss is fetched as the aligned blocks it lies in (4 times larger each fetch, up to:)
MAX_ALIGN = 256 << 10
GROWTH = 4  # a miss just past the bytes held from the start fetches up to GROWTH times as far,
MAX_GROWTH = 1 << 20  # but no more than this many bytes further
MAX_ROUNDS = 12  # probes, and parses, of one file before giving up on rounds
MAX_BYTES = 64 << 20  # bytes fetched in rounds before giving up on them
MAX_LEVELS = 16  # levels of one B-tree followed
SMALL_CHUNKS = 64 << 10  # a B-tree leaf whose chunks are this small in all: its chunks fetched along

T = TypeVar("T")
# Probes and parses of all files, one at a time: they only compute (every byte they read is held), under
# the interpreter lock and mostly h5py's, so running them side by side gains nothing, and dozens of
# threads contending for both locks cost twice the CPU time; the fetches between them overlap freely.
PARSING = threading.Lock()
UNDEFINED = b"\xff" * 8  # HDF5's undefined address


class Missing(Exception):
    """Raised through h5py when a read needs bytes not held (never an OSError/KeyError: nothing in the
    parser or h5py catches it by mistake)."""


class Exhausted(Exception):
    """The rounds' bounds were reached: parse some other way."""


class Held:
    """Byte spans of one file, sorted, non-overlapping (neighbours merged)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.datas: list[bytes] = []

    def get(self, offset: int, length: int) -> bytes | None:
        at = bisect.bisect_right(self.starts, offset) - 1
        if at < 0:
            return None
        start, data = self.starts[at], self.datas[at]
        if offset + length > start + len(data):
            return None
        return data[offset - start : offset - start + length]

    def add(self, offset: int, data: bytes) -> None:
        if not data:
            return
        end = offset + len(data)
        low = bisect.bisect_left(self.starts, offset)
        if low and self.starts[low - 1] + len(self.datas[low - 1]) >= offset:
            low -= 1
        high = low
        while high < len(self.starts) and self.starts[high] <= end:
            high += 1
        if low < high:  # merge with the spans it touches
            first, last = self.starts[low], self.starts[high - 1] + len(self.datas[high - 1])
            start = min(first, offset)
            merged = bytearray(max(last, end) - start)
            for s, d in zip(self.starts[low:high], self.datas[low:high], strict=True):
                merged[s - start : s - start + len(d)] = d
            merged[offset - start : end - start] = data
            self.starts[low:high], self.datas[low:high] = [start], [bytes(merged)]
        else:
            self.starts.insert(low, offset)
            self.datas.insert(low, bytes(data))

    def missing(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` not held, as ``(start, end)``."""
        return uncovered(self.starts, lambda i: self.starts[i] + len(self.datas[i]), start, end)

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.datas))


class HeldFile(SeekableReader):
    """A read-only file object for h5py over the bytes held (``held``, then the source's ``cached``):
    a read of anything else records ``(offset, length)`` in ``misses`` and raises :class:`Missing`; a
    global heap collection HDF5 could not decode is refused (:mod:`.hdf5_guard`)."""

    def __init__(self, source: SourceFile, held: Held) -> None:
        super().__init__()
        self.source, self.held, self.size = source, held, source.size
        self.position = 0
        self.misses: list[tuple[int, int]] = []
        self.nodes: list[tuple[int, int]] = []  # B-tree nodes read (served): what is below them comes next
        self.wanted: set[tuple[int, int]] = set()  # misses that are ``want``s (values' bytes)
        self.guard = HeapGuard()

    def want(self, offset: int, length: int) -> None:
        """Record ``(offset, length)`` as missed unless it is held (bytes known to be read next)."""
        length = min(length, self.size - offset)
        if length > 0 and self.held.get(offset, length) is None:
            data = self.source.cached(offset, length)
            if data is None or len(data) < length:
                self.misses.append((offset, length))
                self.wanted.add((offset, length))

    def readinto(self, buffer) -> int:
        offset = self.position
        length = min(len(buffer), self.size - offset)
        if length <= 0:
            return 0  # past the end: HDF5 reads zeros there
        data = self.held.get(offset, length)
        if data is None:
            data = self.source.cached(offset, length)
            if data is not None and len(data) < length:
                data = None
        if data is None:
            self.misses.append((offset, length))
            raise Missing(f"{length} bytes at {offset} are not held yet")
        self.guard.check(offset, data)
        memoryview(buffer).cast("B")[:length] = data
        self.position = offset + length
        if length >= 24 and data[:4] == b"TREE":
            self.nodes.append((offset, length))
        return length


class Rounds:
    """One remote file's rounds: what is held, what was fetched, how often."""

    def __init__(self, source: SourceFile) -> None:
        self.source = source
        self.held = Held()
        self.rounds = 0  # parses made
        self.probes = 0  # probes made (see run)
        self.fetches = 0  # fetches of missed ranges (each followed by a probe or a parse)
        self.requests = 0  # read_ranges calls (each one wave of concurrent requests)
        self.ranges = 0  # ranges asked for in them
        self.fetched = 0  # bytes fetched

    def run(
        self,
        attempt: Callable[[HeldFile], T],
        close: Callable[[T], None],
        probe: Callable[[HeldFile], None] | None = None,
    ) -> T:
        """``attempt(file object)``'s result from the first round that missed nothing (its exception, if
        it raised one); rounds that missed are discarded (``close`` releases their result). ``probe``, a
        cheaper walk of what the attempt will read (its failures ignored), is run first, again after
        each fetch of what it missed until it misses nothing: most of what the attempt needs is then
        held before its first round."""
        self._absorb_head()
        if self._front() >= self.source.size:
            probe = None  # all of it held: nothing to find
        while probe is not None and self.probes < MAX_ROUNDS:
            self.probes += 1
            fileobj = HeldFile(self.source, self.held)
            with PARSING, contextlib.suppress(Exception):
                probe(fileobj)
            if not fileobj.misses:
                break
            self.fetch(fileobj.misses, fileobj.nodes)
            if self._leaves_only(fileobj):
                break  # what lies below them was fetched too: the parse should miss nothing now
        while True:
            if self.rounds >= MAX_ROUNDS:
                raise Exhausted(f"its HDF5 metadata needs more than {MAX_ROUNDS} rounds of reads")
            self.rounds += 1
            fileobj = HeldFile(self.source, self.held)
            try:
                with PARSING:
                    result = attempt(fileobj)
            except Exception:
                if not fileobj.misses:
                    raise
            else:
                if not fileobj.misses:
                    return result
                close(result)
            self.fetch(fileobj.misses, fileobj.nodes)

    def _leaves_only(self, fileobj: HeldFile) -> bool:
        """Whether a probe missed only chunk index nodes and values' bytes (whose dependents
        :meth:`fetch` fetched along), nothing the walk of objects goes on from."""
        read = [miss for miss in fileobj.misses if miss not in fileobj.wanted]
        return all(self.held.get(offset, 5) == b"TREE\x01" for offset, _ in read)

    def _absorb_head(self) -> None:
        """What the source holds from its start (its first read) made part of the held bytes, fetched
        (:data:`HEAD` bytes) if it holds nothing there."""
        for length in (1 << 20, 256 << 10, HEAD, 16 << 10, 4 << 10, 512):
            data = self.source.cached(0, min(length, self.source.size))
            if data:
                self.held.add(0, data)
                return
        self._get([(0, min(HEAD, self.source.size))])

    def fetch(self, misses: list[tuple[int, int]], nodes: list[tuple[int, int]] = ()) -> None:
        """Every missed range (widened: :meth:`_widened`; what is held left out) in one ``read_ranges``,
        with what lies below the B-tree nodes read (``nodes``) and fetched; then, a level a call, what
        lies below the nodes fetched."""
        wanted = [self._widened(offset, length) for offset, length in misses]
        self.fetches += 1
        below = [r for node in nodes for r in self._below(*node) if self.held.get(*r) is None]
        self._get(wanted + [(o, o + n) for o, n in below])
        nodes = [(o, n) for o, n in [*misses, *below] if n >= 24]
        for _ in range(MAX_LEVELS):
            below = [r for node in nodes for r in self._below(*node) if self.held.get(*r) is None]
            if not below:
                break
            self._get([(o, o + n) for o, n in below])
            nodes = [(o, n) for o, n in below if n >= 24]

    def _front(self) -> int:
        """Where the bytes held from the start of the file end."""
        if not self.held.starts or self.held.starts[0] != 0:
            return 0
        return len(self.held.datas[0])

    def _widened(self, offset: int, length: int) -> tuple[int, int]:
        """What to fetch for a missed range: all of ``[front, GROWTH × front)`` (at most
        :data:`MAX_GROWTH` bytes) when it lies there (the parse runs past the metadata held from the
        start, which netCDF-4 writes first: read much more of it), else its aligned blocks."""
        front = self._front()
        reach = min(GROWTH * front, front + MAX_GROWTH)
        if front <= offset < reach:
            return front, min(self.source.size, max(reach, offset + length))
        return self._aligned(offset, length, min(MAX_ALIGN, ALIGN << 2 * self.fetches))

    def _aligned(self, offset: int, length: int, align: int = ALIGN) -> tuple[int, int]:
        start = offset // align * align
        end = min(self.source.size, -(-(offset + length) // align) * align)
        return start, max(end, start)

    def _get(self, spans: list[tuple[int, int]]) -> None:
        gaps: list[tuple[int, int]] = []
        for start, end in sorted(spans):
            for s, e in self.held.missing(start, end):
                if gaps and s <= gaps[-1][1]:
                    gaps[-1] = (gaps[-1][0], max(gaps[-1][1], e))
                else:
                    gaps.append((s, e))
        for s, e in list(gaps):  # what the source holds already (its first read) needs no request
            data = self.source.cached(s, e - s)
            if data is not None and len(data) == e - s:
                self.held.add(s, data)
                gaps.remove((s, e))
        if not gaps:
            return
        size = sum(e - s for s, e in gaps)
        if self.fetched + size > MAX_BYTES:
            raise Exhausted(f"its HDF5 metadata takes more than {MAX_BYTES >> 20} MiB of reads")
        datas = self.source.read_ranges([(s, e - s) for s, e in gaps])
        self.requests += 1
        self.ranges += len(gaps)
        self.fetched += size
        for (start, _), data in zip(gaps, datas, strict=True):
            self.held.add(start, data)

    def _below(self, offset: int, length: int) -> list[tuple[int, int]]:
        """What HDF5 reads next under the node read at ``offset``: the children of an internal
        version-1 B-tree node (nodes as long as it), the chunks of a small variable's leaf."""
        node = self.held.get(offset, length)
        if node is None:
            return []
        return btree_below(node, self.source.size)


def btree_below(node: bytes, size: int) -> list[tuple[int, int]]:
    """The ranges below a version-1 B-tree node of chunks (node type 1), 8-byte addresses: its children
    when it is internal (each a node as long as this one), its chunks when it is the only leaf (no
    siblings: the whole index of a variable of at most 2K chunks) and they hold at most
    :data:`SMALL_CHUNKS` bytes in all (what the parser reads of small variables); ``[]`` otherwise."""
    if len(node) < 24 or node[:4] != b"TREE" or node[4] != 1:
        return []
    level, used = node[5], struct.unpack_from("<H", node, 6)[0]
    for key in _key_sizes(len(node), used):
        # every key but the last (a bound) ends with the offset along the element axis: 0
        ends = [node[24 + i * (key + 8) + key - 8 : 24 + i * (key + 8) + key] for i in range(used)]
        if any(end != bytes(8) for end in ends):
            continue
        at, children, sizes = 24, [], []
        for _ in range(used):
            sizes.append(struct.unpack_from("<I", node, at)[0])
            children.append(struct.unpack_from("<Q", node, at + key)[0])
            at += key + 8
        if all(child < size for child in children):
            break
    else:
        return []
    if level > 0:
        return [(child, len(node)) for child in children]
    root = node[8:24] == UNDEFINED * 2  # no siblings: the leaf is the whole index (a small variable's)
    if root and sum(sizes) <= SMALL_CHUNKS:
        return [(child, n) for child, n in zip(children, sizes, strict=True) if n and child + n <= size]
    return []


def _key_sizes(length: int, used: int) -> list[int]:
    """The key sizes a chunk B-tree node read whole could have (``length`` bytes: 24 of header, 2K+1 keys
    of 8 + 8 × (rank + 1) bytes and 2K addresses of 8, for some K)."""
    found = []
    for key in range(24, 8 + 8 * 34, 8):  # rank 1 to 32, plus the element axis
        twice_k, rest = divmod(length - 24 - key, key + 8)  # length = 24 + (2K + 1) key + 2K 8
        if not rest and twice_k > 0 and twice_k % 2 == 0 and used <= twice_k:
            found.append(key)
    return found
