"""The manifest model: what each key of a virtual dataset holds.

A key holds one of:

- **inline** bytes kept in the manifest itself (metadata objects, small chunks);
- a **reference** ``(url, offset, length)`` into another file or object (``length`` -1: the whole object);
- nothing (a **missing** chunk, which reads as the fill value).

Keys are stored without their leading ``/`` (kerchunk's spelling). The chunk references of an array are
kept in an :class:`ArrayReferences` table: numpy columns (URL number, offset, length) in pages
of chunk numbers, dense or sparse, so memory follows the references held, never the chunk grid. A page
comes from memory (a JSON manifest, this session's changes) or from a :class:`PageSource` on demand (a
Parquet manifest's record files), kept in a bounded :class:`PageCache` shared by threads. Other keys are
**loose** entries, kept as parsed and resolved on first use.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import itertools
import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

from nczmap._lazy import numpy as np
from nczmap.errors import FormatError

WHOLE = -1  # a reference's length when it names a whole object
MAX_OFFSET = (1 << 63) - 1  # the largest offset or length of a reference (int64 columns, off_t)
MISSING, INLINE = -1, -2  # URL numbers of a page that are not URLs
MAX_CHUNKS = 1 << 62  # chunk numbers are int64 in memory: a grid of more chunks is kept loose (JSON)
CACHE_ROWS = 2_000_000  # rows of loaded pages (record files) a manifest keeps, about 40 MB
FOLD = 4096  # changes to one page kept aside before they are folded into its columns


class Reference(NamedTuple):
    """Bytes ``[offset, offset + length)`` of the object at ``url`` (``length`` WHOLE: all of it)."""

    url: str
    offset: int = 0
    length: int = WHOLE


Entry = bytes | Reference


class Page:
    """The references of chunks ``start + row`` of one array: per row held, the number of its URL in
    ``urls`` (INLINE: its bytes are ``inline[row]``), its offset and length.

    Dense (``rows`` None: row ``i`` of the columns is chunk ``start + i``, MISSING where none) or sparse
    (``rows``: the sorted rows held, one column entry each).
    """

    __slots__ = ("inline", "lengths", "offsets", "rows", "start", "urls", "where")

    def __init__(
        self,
        start: int,
        where: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        urls: list[str],
        inline: dict[int, bytes] | None = None,
        rows: np.ndarray | None = None,
    ) -> None:
        self.start = start
        self.where = where
        self.offsets = offsets
        self.lengths = lengths
        self.urls = urls
        self.inline = inline if inline is not None else {}
        self.rows = rows

    @classmethod
    def empty(cls, start: int = 0) -> Page:
        nothing = np.zeros(0, dtype=np.int64)
        return cls(start, nothing.astype(np.int32), nothing, nothing, [])

    @classmethod
    def build(
        cls,
        start: int,
        rows: np.ndarray,
        where: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        urls: list[str],
        inline: dict[int, bytes] | None = None,
    ) -> Page:
        """A page of the rows held (sorted, unique, none MISSING): dense when that takes at most about
        twice the memory, else sparse."""
        count = len(rows)
        span = int(rows[-1]) + 1 if count else 0
        if span > 2 * count + 1024:
            return cls(start, where.astype(np.int32), offsets, lengths, urls, inline, rows.astype(np.int64))
        dense_where = np.full(span, MISSING, dtype=np.int32)
        dense_offsets = np.zeros(span, dtype=np.int64)
        dense_lengths = np.zeros(span, dtype=np.int64)
        dense_where[rows], dense_offsets[rows], dense_lengths[rows] = where, offsets, lengths
        return cls(start, dense_where, dense_offsets, dense_lengths, urls, inline)

    @property
    def size(self) -> int:
        """Rows of columns held (what the page costs)."""
        return len(self.where)

    def get(self, row: int) -> Entry | None:
        at = self._find(row)
        return None if at is None else self._entry(at, row)

    def _find(self, row: int) -> int | None:
        if self.rows is None:
            return row if 0 <= row < len(self.where) else None
        at = int(np.searchsorted(self.rows, row))
        return at if at < len(self.rows) and int(self.rows[at]) == row else None

    def _entry(self, at: int, row: int) -> Entry | None:
        where = int(self.where[at])
        if where == MISSING:
            return None
        if where == INLINE:
            return self.inline[row]
        return Reference(self.urls[where], int(self.offsets[at]), int(self.lengths[at]))

    def columns(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row of ``rows``: the number of its URL in ``urls`` (MISSING, INLINE), its offset and length
        (meaningless where the number is not a URL's)."""
        if not len(self.where):
            nothing = np.zeros(len(rows), dtype=np.int64)
            return np.full(len(rows), MISSING, dtype=np.int64), nothing, nothing
        if self.rows is None:
            inside = (rows >= 0) & (rows < len(self.where))
            at = np.where(inside, rows, 0)
        else:
            at = np.minimum(np.searchsorted(self.rows, rows), len(self.rows) - 1)
            inside = self.rows[at] == rows
        where = np.where(inside, self.where[at], MISSING).astype(np.int64)
        return where, self.offsets[at], self.lengths[at]

    def entries(self, rows: np.ndarray) -> list[Entry | None]:
        """What each of ``rows`` holds (one Python step per row, for its Reference)."""
        gathered = Gathered(len(rows))
        gathered.add_page(np.arange(len(rows)), self, rows)
        return gathered.entries()

    def held(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows holding something (sorted) and their positions in the columns."""
        at = np.flatnonzero(self.where != MISSING)
        return (at if self.rows is None else self.rows[at]), at

    def changed(self, changes: dict[int, Entry | None]) -> Page:
        """This page with ``changes`` (row -> entry; None: nothing) applied."""
        rows, at = self.held()
        keep = ~np.isin(rows, np.fromiter(changes, dtype=np.int64, count=len(changes)))
        rows, at = rows[keep], at[keep]
        urls = list(self.urls)
        numbers = {url: number for number, url in enumerate(urls)}
        inline = {row: data for row, data in self.inline.items() if row not in changes}
        added: list[tuple[int, int, int, int]] = []
        for row, entry in changes.items():
            if entry is None:
                continue
            if isinstance(entry, bytes):
                inline[row] = entry
                added.append((row, INLINE, 0, 0))
                continue
            number = numbers.get(entry.url)
            if number is None:
                number = numbers[entry.url] = len(urls)
                urls.append(entry.url)
            added.append((row, number, entry.offset, entry.length))
        extra = np.array(added, dtype=np.int64).reshape(-1, 4)
        all_rows = np.concatenate([rows, extra[:, 0]])
        order = np.argsort(all_rows, kind="stable")
        return Page.build(
            self.start,
            all_rows[order],
            np.concatenate([self.where[at].astype(np.int64), extra[:, 1]])[order],
            np.concatenate([self.offsets[at], extra[:, 2]])[order],
            np.concatenate([self.lengths[at], extra[:, 3]])[order],
            urls,
            inline,
        )


class Gathered:
    """What each of ``count`` keys holds, gathered as columns (no object per key): ``where`` the number of
    its URL in ``urls`` (MISSING: nothing, INLINE: its bytes are ``inline[position]``), ``offsets`` and
    ``lengths`` (WHOLE: the whole object)."""

    def __init__(self, count: int) -> None:
        self.urls: list[str] = []
        self.where = np.full(count, MISSING, dtype=np.int64)
        self.offsets = np.zeros(count, dtype=np.int64)
        self.lengths = np.zeros(count, dtype=np.int64)
        self.inline: dict[int, bytes] = {}
        self._numbers: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.where)

    def number(self, url: str) -> int:
        """The number of ``url`` in ``urls`` (added if new)."""
        number = self._numbers.get(url)
        if number is None:
            number = self._numbers[url] = len(self.urls)
            self.urls.append(url)
        return number

    def put(self, at: int, entry: Entry | None) -> None:
        """Key ``at`` holds ``entry``."""
        self.inline.pop(at, None)
        if entry is None:
            self.where[at] = MISSING
        elif isinstance(entry, bytes):
            self.where[at] = INLINE
            self.inline[at] = entry
        else:
            self.where[at] = self.number(entry.url)
            self.offsets[at], self.lengths[at] = entry.offset, entry.length

    def add_page(self, positions: np.ndarray, page: Page, rows: np.ndarray) -> None:
        """Keys ``positions`` hold what ``rows`` of ``page`` hold."""
        where, offsets, lengths = page.columns(rows)
        self.add(positions, page.urls, where, offsets, lengths)
        inlined = where == INLINE
        if inlined.any():
            for at, row in zip(positions[inlined].tolist(), rows[inlined].tolist(), strict=True):
                self.inline[at] = page.inline[row]

    def add_gathered(self, positions: np.ndarray, other: Gathered) -> None:
        """Keys ``positions`` hold what the keys of ``other`` hold, in order."""
        self.add(positions, other.urls, other.where, other.offsets, other.lengths)
        self.inline.update((int(positions[at]), data) for at, data in other.inline.items())

    def add(self, positions: np.ndarray, urls: list[str], where, offsets, lengths) -> None:
        remap = np.array([self.number(url) for url in urls] + [MISSING], dtype=np.int64)
        self.where[positions] = np.where(where >= 0, remap[np.maximum(where, 0)], where)
        self.offsets[positions] = offsets
        self.lengths[positions] = lengths

    def entries(self) -> list[Entry | None]:
        """What each key holds, as entries."""
        urls, inline = self.urls, self.inline
        found: list[Entry | None] = []
        for at, (w, offset, length) in enumerate(
            zip(self.where.tolist(), self.offsets.tolist(), self.lengths.tolist(), strict=True)
        ):
            if w >= 0:
                found.append(Reference(urls[w], offset, length))
            else:
                found.append(None if w == MISSING else inline[at])
        return found


class PageSource(Protocol):
    """Where the pages of a table come from on demand (a Parquet manifest's record files)."""

    def load(self, number: int) -> Page | None:
        """Page ``number`` (None: it does not exist, every chunk of it is missing)."""
        ...

    def numbers(self) -> Iterable[int]:
        """The numbers of the pages that exist (what listing costs: a directory listing, say)."""
        ...


ROW_BYTES = 20  # what a row of a page's columns costs (int32 URL number, int64 offset and length)


def _cost(page: Page) -> int:
    """What ``page`` costs the cache, in rows: its columns, and its inline bytes (a Parquet record's
    ``raw`` column: unbounded by the row count) counted as the rows they would fill."""
    return page.size + sum(map(len, page.inline.values())) // ROW_BYTES


class PageCache:
    """The pages a manifest loaded, least recently used dropped past ``limit`` rows (inline bytes
    counted, see :func:`_cost`; at least one page kept); shared by the threads reading it."""

    def __init__(self, limit: int = CACHE_ROWS) -> None:
        self.limit = limit
        self._pages: OrderedDict[tuple[int, int], tuple[Page, int]] = OrderedDict()  # page, its cost
        self._rows = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[int, int]) -> Page | None:
        with self._lock:
            held = self._pages.get(key)
            if held is None:
                return None
            self._pages.move_to_end(key)
            return held[0]

    def put(self, key: tuple[int, int], page: Page) -> None:
        cost = _cost(page)
        with self._lock:
            self._drop_locked(key)
            self._rows += cost
            self._pages[key] = (page, cost)
            while self._rows > self.limit and len(self._pages) > 1:
                self._rows -= self._pages.popitem(last=False)[1][1]

    def drop(self, key: tuple[int, int]) -> None:
        with self._lock:
            self._drop_locked(key)

    def _drop_locked(self, key: tuple[int, int]) -> None:
        old = self._pages.pop(key, None)
        if old is not None:
            self._rows -= old[1]

    def __len__(self) -> int:
        return len(self._pages)


_TOKENS = itertools.count()  # tells the tables sharing a cache apart (never reused, unlike id())


class ArrayReferences:
    """The chunk references of one array over its chunk grid (chunk numbers in C order), in pages of
    ``page_size`` chunks (None: one page), held in memory or loaded from ``source`` on demand."""

    def __init__(
        self,
        grid: tuple[int, ...],
        separator: str = ".",
        page_size: int | None = None,
        source: PageSource | None = None,
        cache: PageCache | None = None,
    ) -> None:
        self.grid = tuple(grid)
        self.separator = separator
        self.page_size = page_size
        self.source = source
        self.count = math.prod(self.grid)  # a Python int: nothing is allocated per chunk
        self._held: dict[int, Page] = {}  # pages built in memory, never dropped
        self._changes: dict[int, dict[int, Entry | None]] = {}  # page -> row -> entry, not yet folded
        self._cache = cache if cache is not None else PageCache()
        self._token = next(_TOKENS)
        self._lock = threading.Lock()
        self._loading: dict[int, threading.Event] = {}

    @classmethod
    def from_columns(
        cls,
        grid: tuple[int, ...],
        paths: list[str],
        path_index: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        inline: dict[int, bytes] | None = None,
        separator: str = ".",
    ) -> ArrayReferences:
        """A table from columns over every chunk of ``grid`` (``path_index`` MISSING: no chunk, INLINE:
        ``inline[chunk]``)."""
        table = cls(grid, separator)
        table._held[0] = Page(
            0,
            np.asarray(path_index, dtype=np.int32),
            np.asarray(offsets, dtype=np.int64),
            np.asarray(lengths, dtype=np.int64),
            list(paths),
            dict(inline or {}),
        )
        return table

    def hold(self, number: int, page: Page) -> None:
        """Keep ``page`` as page ``number`` (built in memory)."""
        self._held[number] = page

    # ------------------------------------------------------------------ chunk names
    def position(self, name: str) -> int | None:
        """The chunk number of ``name`` (``"3.4"``, decimal without leading zeros), or None if it is no
        chunk of this grid."""
        return chunk_position(name, self.grid, self.separator)

    def name(self, flat: int) -> str:
        if not self.grid:
            return "0"
        parts = []
        for n in reversed(self.grid):
            flat, index = divmod(flat, n)
            parts.append(str(index))
        return self.separator.join(reversed(parts))

    # ------------------------------------------------------------------ reading
    def _locate(self, flat: int) -> tuple[int, int]:
        return (0, flat) if self.page_size is None else divmod(flat, self.page_size)

    def _start(self, number: int) -> int:
        return 0 if self.page_size is None else number * self.page_size

    def get(self, flat: int) -> Entry | None:
        number, row = self._locate(flat)
        changes = self._changes.get(number)
        if changes is not None and row in changes:
            return changes[row]
        page = self.page(number)
        return None if page is None else page.get(row)

    def page(self, number: int) -> Page | None:
        """Page ``number`` as stored (without this session's changes): held, cached, or loaded now (once,
        however many threads ask)."""
        held = self._held.get(number)
        if held is not None or self.source is None:
            return held
        key = (self._token, number)
        while True:
            page = self._cache.get(key)
            if page is not None:
                return page
            with self._lock:
                event = self._loading.get(number)
                mine = event is None
                if mine:
                    event = self._loading[number] = threading.Event()
            if not mine:
                event.wait()
                continue
            try:
                page = self.source.load(number) or Page.empty(self._start(number))
                self._cache.put(key, page)
                return page
            finally:
                with self._lock:
                    del self._loading[number]
                event.set()

    def get_many(self, flats: Sequence[int]) -> list[Entry | None]:
        """What each chunk of ``flats`` holds."""
        return self.columns(np.asarray(flats, dtype=np.int64)).entries()

    def columns(self, flats: np.ndarray) -> Gathered:
        """What each chunk of ``flats`` holds, in columns; the pages they need are loaded concurrently, a
        few at once, this session's changes applied over them."""
        gathered = Gathered(len(flats))
        if self.page_size is None:
            rows, wanted, groups = flats, [0], [np.arange(len(flats))]
        else:
            numbers, rows = np.divmod(flats, self.page_size)
            order = np.argsort(numbers, kind="stable")
            found, starts = np.unique(numbers[order], return_index=True)
            wanted, groups = found.tolist(), np.split(order, starts[1:])
        for (number, page), positions in zip(self._pages(wanted, changed=False), groups, strict=True):
            page_rows = rows[positions]
            gathered.add_page(positions, page, page_rows)
            changes = dict(self._changes.get(number) or {})  # a copy: a writer may add to it meanwhile
            if changes:
                changed = np.isin(page_rows, np.fromiter(changes, dtype=np.int64, count=len(changes)))
                for at, row in zip(positions[changed].tolist(), page_rows[changed].tolist(), strict=True):
                    gathered.put(at, changes[row])
        return gathered

    def numbers(self) -> list[int]:
        """The pages that may hold a chunk, in order."""
        found = set(self._held) | set(self._changes)
        if self.source is not None:
            found.update(self.source.numbers())
        return sorted(found)

    def pages(self) -> Iterator[tuple[int, Page]]:
        """``(number, page)`` for every page that may hold a chunk, with this session's changes, in order."""
        return self._pages(self.numbers(), changed=True)

    def _pages(self, numbers: list[int], changed: bool) -> Iterator[tuple[int, Page]]:
        from nczmap.concurrency import WIDTH, run_bounded

        def one(number: int) -> Page:
            page = self.page(number) or Page.empty(self._start(number))
            changes = self._changes.get(number) if changed else None
            return page.changed(changes) if changes else page

        tasks = (lambda n=number: one(n) for number in numbers)
        if self.source is None or len(numbers) < 2 or threading.current_thread().name.startswith("nczmap-io"):
            loaded: Iterable[Page] = (task() for task in tasks)  # in a worker already: no nested pool
        else:
            loaded = run_bounded(tasks, WIDTH)
        return zip(numbers, loaded, strict=True)  # type: ignore[arg-type]

    def stored(self, number: int) -> bool:
        """Whether page ``number`` is exactly what its source holds (loaded or not, nothing changed in it
        this session): a save may keep the source's record as it is, without reading it."""
        return self.source is not None and number not in self._held and number not in self._changes

    def regridded(self, grid: tuple[int, ...]) -> ArrayReferences:
        """This table over ``grid``, which differs from its own in the first dimension only (an array
        grown along its first axis): every chunk keeps its number in C order, so the pages are shared as
        they are, the source's included, and nothing is read or copied."""
        grid = tuple(grid)
        if len(grid) != len(self.grid) or grid[1:] != self.grid[1:]:
            raise ValueError(f"{grid} is not {self.grid} along its first dimension only")
        copy = ArrayReferences(grid, self.separator, self.page_size, self.source, self._cache)
        copy._token = self._token  # the same pages: those cached serve both
        with self._lock:
            copy._held = dict(self._held)
            copy._changes = {number: dict(changes) for number, changes in self._changes.items()}
        return copy

    def present(self) -> Iterator[int]:
        """Chunk numbers holding something, in order (every page is read: listing costs the references)."""
        for number, page in self.pages():
            start = self._start(number)
            for row in page.held()[0].tolist():
                yield start + row

    # ------------------------------------------------------------------ changes
    def set(self, flat: int, entry: Entry | None) -> None:
        number, row = self._locate(flat)
        with self._lock:
            changes = self._changes.setdefault(number, {})
            changes[row] = entry
            held = self._held.get(number)
            fold = len(changes) >= max(FOLD, held.size // 4 if held is not None else 0)
        if fold:
            self._fold(number)

    def _fold(self, number: int) -> None:
        """Fold the changes to page ``number`` into its columns (the page is then held in memory).

        Under the lock, so that two threads folding the same page cannot each start from the old page
        (the later one putting back the page without the other's changes); the new page is held before
        the changes are let go, so a reader (who takes no lock) sees them in one or the other."""
        loaded = self.page(number)  # may read a record file: outside the lock
        with self._lock:
            changes = self._changes.get(number)
            if not changes:
                return  # folded by another thread meanwhile
            page = self._held.get(number) or loaded or Page.empty(self._start(number))
            self._held[number] = page.changed(changes)
            del self._changes[number]
        self._cache.drop((self._token, number))

    def materialised(self) -> ArrayReferences:
        """A copy held wholly in memory (one page; memory follows the references held)."""
        copy = ArrayReferences(self.grid, self.separator)
        columns = [[], [], [], []]
        urls: list[str] = []
        numbers: dict[str, int] = {}
        inline: dict[int, bytes] = {}
        for number, page in self.pages():
            rows, at = page.held()
            start = self._start(number)
            remap = np.array([numbers.setdefault(u, len(numbers)) for u in page.urls] + [0], dtype=np.int64)
            where = page.where[at].astype(np.int64)
            columns[0].append(rows.astype(np.int64) + start)
            columns[1].append(np.where(where >= 0, remap[np.maximum(where, 0)], where))  # INLINE: -2
            columns[2].append(page.offsets[at])
            columns[3].append(page.lengths[at])
            inline.update({start + row: data for row, data in page.inline.items()})
        urls = list(numbers)
        if not columns[0]:
            return copy
        flats, where, offsets, lengths = (np.concatenate(c) for c in columns)
        copy.hold(0, Page.build(0, flats, where, offsets, lengths, urls, inline))
        return copy


SOURCE_FORMATS = ("netcdf4", "netcdf3", "tiff")


def extension_of(manifest: Manifest) -> dict[str, object]:
    """nczmap's additions to a manifest (the top-level ``"nczmap"`` key, which other readers ignore)."""
    extension: dict[str, object] = {}
    if manifest.sources:
        extension["sources"] = manifest.sources
    if manifest.source_format:
        extension["source_format"] = manifest.source_format
    if manifest.checksums:
        extension["crc32c"] = dict(sorted(manifest.checksums.items()))
    if manifest.virtualize is not None:
        extension["virtualize"] = manifest.virtualize
    return extension


def read_extension(manifest: Manifest, extension: object, where: str) -> None:
    """Take nczmap's additions (the ``"nczmap"`` object of a JSON manifest or of ``.zmetadata``) into
    ``manifest``: recorded sources, source format, per-reference checksums."""
    if not isinstance(extension, dict):
        return
    if "sources" in extension:
        manifest.sources.update(checked_sources(extension["sources"], where))
    if extension.get("source_format") in SOURCE_FORMATS:
        manifest.source_format = extension["source_format"]
    if "crc32c" in extension:
        manifest.checksums.update(checked_checksums(extension["crc32c"], where))
    if "virtualize" in extension:
        manifest.virtualize = extension["virtualize"]  # checked where it is used (an append)


def checked_checksums(checksums: object, where: str) -> dict[str, int]:
    """The ``"crc32c"`` of nczmap's manifest extension (``{key: crc32c of the referenced bytes}``), checked:
    a checksum that cannot be compared is an error, not a check silently skipped."""
    if not isinstance(checksums, dict):
        raise FormatError(f"{where}: 'crc32c' of the 'nczmap' key must be an object of checksums")
    for key, value in checksums.items():
        if type(value) is not int or not 0 <= value < 1 << 32:
            raise FormatError(f"{where}: the recorded crc32c of {key!r} is {str(value)[:60]!r}, not a uint32")
    return {key.lstrip("/"): value for key, value in checksums.items()}


class Manifest:
    """Every key of a virtual dataset and what it holds (keys without the leading ``/``)."""

    def __init__(self, templates: dict[str, str] | None = None) -> None:
        self.entries: dict[str, object] = {}  # key -> Entry, or a kerchunk value not yet resolved
        self.arrays: dict[str, ArrayReferences] = {}  # array key -> chunk table
        self.templates = dict(templates or {})  # kerchunk v1 {{name}} -> text, applied on use
        self.sources: dict[str, dict] = {}  # URL -> {"size", "mtime" or "etag"}: tampering shows
        self.record_size: int | None = None  # a Parquet manifest's, kept when it is saved in place
        self.source_format: str | None = None  # "netcdf3" when made of netCDF-3 files (ncdump shows it)
        self.checksums: dict[str, int] = {}  # key -> crc32c of the bytes its reference names (optional)
        self.virtualize: object = None  # how virtualize made it (for appends; see virtualize.append)
        self.cache = PageCache()  # pages of every table loaded on demand
        self.where = ""  # the manifest's location, named in the errors of its values ("": a new one)
        self._sorted: list[str] | None = None

    # ----------------------------------------------------------------- lookup
    def get(self, key: str) -> Entry | None:
        """What ``key`` holds, or None for nothing (absent, a directory, or a missing chunk)."""
        value = self.entries.get(key)
        if value is None:
            table, flat = self._chunk(key)
            return None if table is None else table.get(flat)
        if not isinstance(value, bytes | Reference):
            value = self.entries[key] = self._resolved(value, key)
        return value

    def _resolved(self, value: object, key: str) -> Entry:
        """:func:`resolve` of a loose value, its error naming the manifest too."""
        try:
            return resolve(value, key, self.templates)
        except FormatError as exc:
            if not self.where:
                raise
            raise FormatError(f"{self.where}: {exc}") from None

    def get_many(self, keys: Sequence[str]) -> list[Entry | None]:
        """:meth:`get` of every key."""
        return self.columns(keys).entries()

    def columns(self, keys: Sequence[str]) -> Gathered:
        """What every key holds, in columns; the chunks of each table looked up together (names parsed at
        once, the pages they need loaded concurrently)."""
        gathered = Gathered(len(keys))
        wanted: dict[str, tuple[list[int], list[str]]] = {}
        entries, arrays = self.entries, self.arrays
        for at, key in enumerate(keys):
            if entries.get(key) is not None:
                gathered.put(at, self.get(key))
                continue
            array, _, name = key.rpartition("/")
            if array in arrays:
                positions, names = wanted.setdefault(array, ([], []))
                positions.append(at)
                names.append(name)
        for array, (positions, names) in wanted.items():
            table = arrays[array]
            if table.count >= MAX_CHUNKS:  # chunk numbers beyond int64: one at a time
                for at, name in zip(positions, names, strict=True):
                    flat = table.position(name)
                    gathered.put(at, None if flat is None else table.get(flat))
                continue
            flats = chunk_numbers(names, table.grid, table.separator)
            valid = flats >= 0
            gathered.add_gathered(np.asarray(positions, dtype=np.int64)[valid], table.columns(flats[valid]))
        return gathered

    def chunk_columns(self, array: str, indices: np.ndarray, separator: str) -> Gathered | None:
        """What the chunks of ``array`` at ``indices`` (a row of chunk indices each, named by joining them
        with ``separator``) hold, in columns: nothing per chunk but for those a loose key holds (inline or
        malformed values, resolved as :meth:`get` resolves them). None unless the array's chunks are in a
        table of that rank and separator (ask by key then)."""
        table = self.arrays.get(array)
        if (
            table is None
            or not table.grid
            or table.count >= MAX_CHUNKS
            or table.separator != separator
            or indices.ndim != 2
            or indices.shape[1] != len(table.grid)
            or (len(indices) and indices.min() < 0)
        ):
            return None
        flats = flat_numbers(indices.copy(), table.grid)
        loose = self._loose_chunks(array, table)
        special = flats < 0
        if len(loose):
            special |= np.isin(flats, loose)
        if not special.any():
            return table.columns(flats)
        gathered = Gathered(len(flats))
        held = np.flatnonzero(~special)
        gathered.add_gathered(held, table.columns(flats[held]))
        for at in np.flatnonzero(special).tolist():
            gathered.put(at, self.get(array + "/" + separator.join(map(str, indices[at].tolist()))))
        return gathered

    def _loose_chunks(self, array: str, table: ArrayReferences) -> np.ndarray:
        """The chunk numbers of ``array`` that loose keys name (they come before its table's)."""
        keys = self.loose_keys()
        start = array + "/"
        first = bisect.bisect_left(keys, start)
        last = bisect.bisect_left(keys, array + "0", first)  # "0" follows "/"
        flats = [table.position(key[len(start) :]) for key in keys[first:last]]
        return np.array([flat for flat in flats if flat is not None], dtype=np.int64)

    def _chunk(self, key: str) -> tuple[ArrayReferences | None, int]:
        array, _, name = key.rpartition("/")
        table = self.arrays.get(array)
        if table is None:
            return None, 0
        flat = table.position(name)
        return (table, flat) if flat is not None else (None, 0)

    def sorted_keys(self) -> list[str]:
        """Every key that holds something, sorted (chunks of every table included: for writing out)."""
        names = self.loose_keys()
        if not self.arrays:
            return names
        for array, table in self.arrays.items():
            names = names + [f"{array}/{table.name(flat)}" for flat in table.present()]
        return sorted(names)

    def loose_keys(self) -> list[str]:
        """The keys of ``entries``, sorted once per change (tables' chunks are not among them)."""
        if self._sorted is None:
            self._sorted = sorted(k for k, v in self.entries.items() if v is not None)
        return self._sorted

    def children(self, prefix: str) -> list[str]:
        """Sorted names directly under ``prefix`` ("" for the root). Loose keys are found by skipping
        through them sorted (a few bisections per child); a table's chunks are listed only when ``prefix``
        is its array, so listing a group never expands a million chunk names."""
        keys = self.loose_keys()
        start = prefix + "/" if prefix else ""
        names: set[str] = set()
        at = bisect.bisect_left(keys, start)
        while at < len(keys) and keys[at].startswith(start):
            name, slash, _ = keys[at][len(start) :].partition("/")
            names.add(name)
            # keys below start + name lie in [start + name + "/", start + name + "0"): "0" follows "/"
            at = bisect.bisect_left(keys, start + name + "0", at) if slash else at + 1
        for array, table in self.arrays.items():
            if array == prefix:
                names.update(table.name(flat) for flat in table.present())
            elif array.startswith(start):
                names.add(array[len(start) :].partition("/")[0])
        return sorted(names)

    def directories(self) -> list[str]:
        """The keys of arrays held in tables (directories of their chunks)."""
        return list(self.arrays)

    # ----------------------------------------------------------------- changes
    def set(self, key: str, entry: Entry | None) -> None:
        if self.checksums:
            self.checksums.pop(key, None)  # recorded for what the key held before
        table, flat = self._chunk(key)
        if table is not None:
            table.set(flat, entry)
            self.entries.pop(key, None)
        elif entry is None:
            self.entries.pop(key, None)
        else:
            self.entries[key] = entry
        self._sorted = None

    def forget_order(self) -> None:
        """Keys or tables were added: the sorted keys are made again when next asked."""
        self._sorted = None

    def set_many(self, keys: Sequence[str], entries: Sequence[Entry]) -> None:
        """:meth:`set` of each key to its entry (never None): at once, when no table or checksum is
        concerned (a new manifest's chunks)."""
        if self.checksums or self.arrays:
            for key, entry in zip(keys, entries, strict=True):
                self.set(key, entry)
            return
        self.entries.update(zip(keys, entries, strict=True))
        self._sorted = None

    def delete_under(self, prefix: str) -> None:
        """Remove ``prefix`` and every key below it ("" empties the manifest)."""
        start = prefix + "/" if prefix else ""
        for key in [k for k in self.entries if k == prefix or k.startswith(start)]:
            del self.entries[key]
        for key in [k for k in self.checksums if k == prefix or k.startswith(start)]:
            del self.checksums[key]
        table, flat = self._chunk(prefix)
        if table is not None:  # one chunk of an array's table
            table.set(flat, None)
        for array in [a for a in self.arrays if a == prefix or a.startswith(start) or not prefix]:
            del self.arrays[array]
        self._sorted = None

    def references(self) -> Iterator[tuple[str, Entry]]:
        """``(key, entry)`` for every key that holds something, in key order."""
        for key in self.sorted_keys():
            entry = self.get(key)
            if entry is not None:
                yield key, entry


def chunk_grid(zarray: object) -> tuple[int, ...]:
    """The chunk grid of an array from its ``.zarray`` (a JSON object), for chunk names ``.``-separated;
    ValueError saying what is wrong otherwise (kerchunk's JSON leaves such an array's keys loose, its
    Parquet form refuses it)."""
    if not isinstance(zarray, dict):
        raise ValueError(f"it must be a JSON object, not {type(zarray).__name__}")
    shape, chunks = zarray.get("shape"), zarray.get("chunks")
    if (
        not isinstance(shape, list)
        or not isinstance(chunks, list)
        or len(shape) != len(chunks)
        or not all(type(n) is int and n >= 0 for n in shape)
        or not all(type(n) is int and n >= 1 for n in chunks)
    ):
        raise ValueError(
            "it needs 'shape' and 'chunks' lists of equal length (sizes >= 0, chunks >= 1); "
            f"found shape={shape!r} chunks={chunks!r}"
        )
    if zarray.get("dimension_separator") not in (None, "."):
        raise ValueError(
            f"its dimension_separator is {zarray.get('dimension_separator')!r}; kerchunk's references name "
            "chunks with '.' only"
        )
    return tuple(-(-s // c) for s, c in zip(shape, chunks, strict=True))


_DIGITS = r"(?:0|[1-9][0-9]{0,17})"  # a chunk index: decimal, no leading zero, fits int64


def chunk_position(name: str, grid: tuple[int, ...], separator: str = ".") -> int | None:
    """The chunk number of ``name`` (``"3.4"``) in ``grid`` (C order), or None if it names no chunk of it
    (indices in decimal without leading zeros, one per dimension, inside the grid; ``"0"`` for 0-d)."""
    parts = name.split(separator)
    grid = grid or (1,)
    if len(parts) != len(grid):
        return None
    flat = 0
    for part, n in zip(parts, grid, strict=True):
        if not (part.isascii() and part.isdigit()) or (part[0] == "0" and len(part) > 1):
            return None
        if len(part) > len(str(n)) or int(part) >= n:
            return None
        flat = flat * n + int(part)
    return flat


def chunk_numbers(names: list[str], grid: tuple[int, ...], separator: str = ".") -> np.ndarray:
    """:func:`chunk_position` of every name as int64 (-1: no chunk), all at once: their text is checked by
    a few scans (digits and separators only, one index per dimension, no empty index, no leading zero, at
    most 18 digits) and read by numpy; names that fail go one at a time. For grids under MAX_CHUNKS chunks."""
    if not names:
        return np.zeros(0, dtype=np.int64)
    dims = grid or (1,)
    values = parsed_indices("\n".join(names), len(names), len(dims), separator)
    if values is None:
        return np.array([_or_minus_one(chunk_position(n, grid, separator)) for n in names], dtype=np.int64)
    return flat_numbers(values, grid)


def flat_numbers(values: np.ndarray, grid: tuple[int, ...]) -> np.ndarray:
    """Chunk numbers of rows of indices (-1 for those outside ``grid``)."""
    dims = grid or (1,)
    inside = (values < np.array(dims, dtype=np.int64)).all(axis=1)
    values[~inside] = 0
    flats = values[:, 0].copy()
    for axis in range(1, len(dims)):
        flats = flats * dims[axis] + values[:, axis]
    flats[~inside] = -1
    return flats


def parsed_indices(text: str, count: int, rank: int, separator: str) -> np.ndarray | None:
    """The ``count`` x ``rank`` indices in ``text`` (a name a line), or None unless every name is ``rank``
    decimal indices (no leading zero, at most 18 digits) joined by ``separator``."""
    if len(separator) != 1 or not separator.isascii() or separator.isdigit() or separator == "\n":
        return None
    if not text.isascii():
        return None
    data = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    allowed = _INDEX_TEXT.get(separator)
    if allowed is None:
        allowed = _INDEX_TEXT[separator] = np.zeros(256, dtype=bool)
        allowed[[*b"0123456789\n", ord(separator)]] = True
    if not len(data) or not allowed[data].all():  # a table lookup: a regex takes 10x as long
        return None
    newline, sep = data == 10, data == ord(separator)
    bounds = np.flatnonzero(newline | sep)
    edges = np.concatenate([[-1], bounds, [len(data)]])
    sizes = np.diff(edges) - 1  # the digits of every index
    starts = edges[:-1] + 1
    if sizes.min() < 1 or sizes.max() > 18 or ((data[starts] == 48) & (sizes > 1)).any():
        return None
    if rank == 1 and sep.any():
        return None
    if rank > 1:  # one index per dimension on every line
        lines = np.flatnonzero(newline[bounds])  # which bounds end a line: separators lie between
        per_line = np.diff(np.concatenate([[-1], lines, [len(bounds)]])) - 1
        if not (per_line == rank - 1).all():
            return None
        text = text.replace(separator, "\n")
    values = np.fromstring(text, dtype=np.int64, sep="\n")
    return values.reshape(count, rank) if len(values) == count * rank else None


_INDEX_TEXT: dict[str, np.ndarray] = {}  # separator -> which bytes an index text may hold


def _or_minus_one(flat: int | None) -> int:
    return -1 if flat is None else flat


def resolve(value: object, key: str, templates: dict[str, str]) -> Entry:
    """A kerchunk value as an entry: ``[url, offset, length]``, ``[url]``, text (``base64:`` decoded) or
    a JSON object; ``{{name}}`` in URLs is replaced from ``templates``."""
    if type(value) is list:  # the common case first: a million of these may be resolved in a read
        if len(value) == 3:
            url, offset, length = value
            if type(url) is str and type(offset) is int and type(length) is int:
                if 0 <= offset <= MAX_OFFSET and 0 <= length <= MAX_OFFSET:
                    return Reference(checked_url(expand(url, templates, key), key), offset, length)
                raise FormatError(
                    f"manifest key {key!r}: {str(value)[:200]!r} is not a kerchunk reference: its offset and "
                    "length must be from 0 to 2**63 - 1"
                )
        elif len(value) == 1 and type(value[0]) is str:
            return Reference(checked_url(expand(value[0], templates, key), key))
    elif isinstance(value, str):
        return _base64(value[7:], key) if value.startswith("base64:") else _utf8(value, key)
    elif isinstance(value, dict):
        return json.dumps(value).encode("utf-8")  # a JSON object value holds its own text (as fsspec)
    raise FormatError(f"manifest key {key!r}: {str(value)[:200]!r} is not a kerchunk reference")


def checked_url(url: str, key: str) -> str:
    """``url``, refused when no file system or server could be asked for it (JSON can spell a lone
    surrogate, which has no UTF-8; a NUL ends a C string, so the path checked would not be the one opened)."""
    if "\x00" in url:
        raise FormatError(f"manifest key {key!r}: the reference URL {url!r} holds a NUL character")
    if not url.isascii():
        _utf8(url, key, "the reference URL")
    return url


def _utf8(text: str, key: str, what: str = "the value") -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise FormatError(
            f"manifest key {key!r}: {what} {text!r} is not valid Unicode (a lone surrogate)"
        ) from None


def _base64(text: str, key: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FormatError(f"manifest key {key!r}: {text[:60]!r} is not base64 ({exc})") from None


def checked_sources(sources: object, where: str) -> dict[str, dict]:
    """The ``"sources"`` of nczmap's manifest extension (``{url: {"size", "mtime" or "etag"}}``), checked:
    what the tamper checks compare must be there in the form they compare."""
    if not isinstance(sources, dict):
        kind = type(sources).__name__
        raise FormatError(f"{where}: 'sources' of the 'nczmap' key must be an object of sources, not {kind}")
    for url, recorded in sources.items():
        if not isinstance(recorded, dict):
            kind = type(recorded).__name__
            raise FormatError(f"{where}: the recorded source {url!r} must be an object, not {kind}")
        for name, kind in _RECORDED.items():
            if name in recorded and type(recorded[name]) is not kind:  # type(): a bool is no size
                value = str(recorded[name])[:60]
                raise FormatError(
                    f"{where}: the recorded {name} of {url!r} is {value!r}, not {kind.__name__}"
                )
    return sources


_RECORDED = {"size": int, "mtime": int, "etag": str}  # mtime: nanoseconds since the epoch


def expand(url: str, templates: dict[str, str], key: str) -> str:
    """Replace ``{{name}}`` template references in one pass (plain substitution, never code)."""
    if "{{" not in url:
        return url

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in templates:
            raise FormatError(f"manifest key {key!r}: URL {url!r} uses an undefined template {name!r}")
        return templates[name]

    return _TEMPLATE.sub(substitute, url)


_TEMPLATE = re.compile(r"\{\{\s*([^{}\s]*)\s*\}\}")
