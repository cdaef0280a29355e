"""A new array's chunk references built as columns, a batch of sources at a time, in bounded memory.

:meth:`ManifestMap.chunk_table <nczmap.zmap.manifest.ManifestMap.chunk_table>` gives a
:class:`ChunkTableBuilder`; the writer adds the references of each batch of sources as columns (chunk
numbers in C order of the array's grid, URL numbers, offsets, lengths) and finishes it. Columns that come
in order of their chunks (a collection joined along its first dimension) become pages at once, in the
record size of a Parquet manifest (whose records are then written from the pages as they are): memory
follows the pages, about 20 bytes a reference, never a Python object a chunk. Columns out of order are
kept and sorted when the table is finished.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from nczmap._lazy import numpy as np
from nczmap.errors import DataError
from nczmap.manifest.model import ArrayReferences, Page


class TableOwner(Protocol):
    """What a builder needs of its manifest map (:class:`~nczmap.zmap.manifest.ManifestMap`)."""

    def _resolve(self, url: str, key: str) -> tuple: ...

    def _install_table(
        self, array: str, table: ArrayReferences, replacing: ArrayReferences | None
    ) -> None: ...


class ChunkTableBuilder:
    """The chunk table of array ``array`` of ``grid`` being built (pages of ``page_size`` chunks, None:
    one page)."""

    def __init__(
        self,
        zmap: TableOwner,
        array: str,
        grid: tuple[int, ...],
        page_size: int | None,
        base: ArrayReferences | None = None,
    ) -> None:
        self.zmap, self.array, self.grid, self.page_size = zmap, array, grid, page_size
        self.base = base  # the array's table the new pages are merged into (an append), if any
        self.cells = math.prod(grid)
        self.table = ArrayReferences(grid, ".", page_size)
        self.urls: list[str] = []  # canonical URLs, shared by every page
        self.count = 0
        self._last = -1  # the last chunk number added while in order
        self._carried: tuple | None = None  # the rows of the last page begun, not complete yet
        self._unordered: list[tuple] = []  # columns kept to be sorted at the end (and one-page tables')

    def add(self, flats, where, offsets, lengths, urls: Sequence[str]) -> None:
        """References of chunks ``flats``: chunk ``flats[i]`` to ``lengths[i]`` bytes at ``offsets[i]`` of
        ``urls[where[i]]`` (``urls``: every URL numbered so far, new ones checked here once)."""
        count = len(flats)
        if not len(where) == len(offsets) == len(lengths) == count:
            raise DataError(f"references for {self.array!r}: not one URL, offset and length per chunk")
        if not count:
            return
        if (
            int(offsets.min()) < 0 or int(lengths.min()) < 0 or int(flats.min()) < 0
            or int(flats.max()) >= self.cells or int(where.min()) < 0 or int(where.max()) >= len(urls)
        ):  # fmt: skip
            raise DataError(f"references for {self.array!r}: bad ranges, chunk numbers or URL numbers")
        for url in urls[len(self.urls) :]:
            self.urls.append(self.zmap._resolve(url, f"{self.array}/0")[0])
        piece = (flats, where.astype(np.int32), offsets, lengths)
        self.count += count
        in_order = int(flats[0]) > self._last and (count == 1 or bool((flats[1:] > flats[:-1]).all()))
        if self.page_size is None or self._unordered or not in_order:
            self._keep_unordered(piece)
            return
        self._last = int(flats[-1])
        if self._carried is not None:
            piece = tuple(np.concatenate(pair) for pair in zip(self._carried, piece, strict=True))
            self._carried = None
        numbers = piece[0] // self.page_size
        complete = int(np.searchsorted(numbers, numbers[-1]))  # the last page may go on in the next piece
        self._hold(*(column[:complete] for column in piece))
        self._carried = tuple(column[complete:].copy() for column in piece)

    def finish(self) -> int:
        """The table installed as the array's chunks; how many references it holds."""
        if self._unordered:
            self._sort_unordered()
        elif self._carried is not None:
            self._hold(*self._carried)
        self._carried = None
        table = self.table if self.base is None else self._merged_into(self.base)
        self.zmap._install_table(self.array, table, self.base)
        return self.count

    def _merged_into(self, base: ArrayReferences) -> ArrayReferences:
        """``base`` with the pages built here over its own (a chunk in both: the new reference)."""
        for number in self.table.numbers():
            new = self.table.page(number)
            old = base.page(number)  # a record file of a Parquet manifest is read here
            base.hold(number, new if old is None or not old.held()[0].size else _merged(old, new))
        return base

    def _keep_unordered(self, piece: tuple) -> None:
        if not self._unordered and (self.table.numbers() or self._carried is not None):
            self._unordered.append(_columns_of(self.table))  # the pages built so far, as columns again
            self.table = ArrayReferences(self.grid, ".", self.page_size)
            if self._carried is not None:
                self._unordered.append(self._carried)
                self._carried = None
        self._unordered.append(piece)

    def _sort_unordered(self) -> None:
        flats, where, offsets, lengths = (np.concatenate(c) for c in zip(*self._unordered, strict=True))
        self._unordered.clear()
        order = np.argsort(flats, kind="stable")
        flats, where, offsets, lengths = flats[order], where[order], offsets[order], lengths[order]
        if len(flats) > 1 and not (flats[1:] > flats[:-1]).all():
            raise DataError(f"references for {self.array!r}: a chunk named twice")
        if self.page_size is None:
            self.table.hold(0, Page.build(0, flats, where, offsets, lengths, self.urls))
        else:
            self._hold(flats, where, offsets, lengths)

    def _hold(self, flats, where, offsets, lengths) -> None:
        """Pages of the sorted columns held by the table (copies: the columns given are let go)."""
        if not len(flats):
            return
        size = self.page_size or self.cells
        numbers = flats // size
        cuts = (np.flatnonzero(numbers[1:] != numbers[:-1]) + 1).tolist()
        for low, high in zip([0, *cuts], [*cuts, len(flats)], strict=True):
            number = int(numbers[low])
            start = number * size
            part = slice(low, high)
            columns = (np.array(where[part]), np.array(offsets[part]), np.array(lengths[part]))
            self.table.hold(number, Page.build(start, flats[part] - start, *columns, self.urls))


def _merged(old: Page, new: Page) -> Page:
    """One page of ``old``'s chunks and ``new``'s (``new``'s where both hold one), URLs numbered anew."""
    old_rows, old_at = old.held()
    new_rows, new_at = new.held()
    kept = ~np.isin(old_rows, new_rows)
    numbers: dict[str, int] = {url: at for at, url in enumerate(old.urls)}
    remap = np.array([numbers.setdefault(url, len(numbers)) for url in new.urls] + [0], dtype=np.int32)
    new_where = new.where[new_at]
    new_where = np.where(new_where >= 0, remap[np.maximum(new_where, 0)], new_where)
    rows = np.concatenate([old_rows[kept], new_rows])
    where = np.concatenate([old.where[old_at][kept], new_where]).astype(np.int32)
    offsets = np.concatenate([old.offsets[old_at][kept], new.offsets[new_at]])
    lengths = np.concatenate([old.lengths[old_at][kept], new.lengths[new_at]])
    replaced = set(new_rows.tolist())
    inline = {row: data for row, data in old.inline.items() if row not in replaced}
    inline.update(new.inline)
    order = np.argsort(rows, kind="stable")
    return Page.build(
        old.start, rows[order], where[order], offsets[order], lengths[order], list(numbers), inline
    )


def _columns_of(table: ArrayReferences) -> tuple:
    """Every chunk a table built here holds, as ``(flats, where, offsets, lengths)``."""
    parts = []
    for number, page in table.pages():
        rows, at = page.held()
        start = 0 if table.page_size is None else number * table.page_size
        parts.append((rows.astype(np.int64) + start, page.where[at], page.offsets[at], page.lengths[at]))
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.astype(np.int32), empty, empty
    return tuple(np.concatenate(column) for column in zip(*parts, strict=True))
