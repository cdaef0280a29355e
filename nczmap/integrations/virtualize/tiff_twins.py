"""A TIFF series' fast path: files written alike (a COG series) are checked against the first file's
metadata and only their tile or strip tables read (see :mod:`.parsed` for the ``parse_twin`` contract).

A twin costs one read when its first file's metadata lies in one span from offset 0 (a COG: header,
IFDs, tag values and tables before the data): the first read covers that span; a file whose metadata lies
elsewhere (IFDs after the data) reads the rest in one more, all at once.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

import numpy as np

from nczmap.errors import FormatError
from nczmap.integrations.virtualize.parsed import ParsedFile, ParseOptions, Refusal
from nczmap.integrations.virtualize.tiff_ifds import FIELD_TYPES, Ifd, TiffReader, spans
from nczmap.integrations.virtualize.tiff_layout import (
    Image,
    check_chunks,
    data_storage,
    table_tags,
    table_values,
)


@dataclass
class Fingerprint:
    """What makes a TIFF's model: the bytes of its header, of every IFD and of every tag value but the
    chunk tables (a twin's offsets and byte counts are its own), and where those tables lie. Two files
    with these bytes in these places have one model (the IFD chain, the entries and every value parsed
    are the same): a twin's parse only compares them and reads its tables. Picklable, to be sent to
    other processes."""

    ranges: list[tuple[int, bytes]]  # (offset, the bytes there): sorted, disjoint, not touching
    slots: list[tuple[str, Image, int | None, tuple[Place, Place]]]  # variable, image, plane, tables
    refused: list[Refusal]
    head: int = 0  # bytes a twin reads first, from offset 0
    rest: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (offset, length): then these


@dataclass(frozen=True)
class Place:
    """Where a chunk table's values lie: offset, numpy dtype, count."""

    offset: int
    dtype: str
    count: int

    @property
    def nbytes(self) -> int:
        return self.count * np.dtype(self.dtype).itemsize


def take_fingerprint(tiff: TiffReader, pages: list[Ifd], parsed: ParsedFile) -> Fingerprint:
    slots = []
    for key, image, plane in tiff.slots:
        ifd = pages[image.page]
        offsets, counts = table_tags(image.stripped)
        slots.append((key, image, plane, (_place(tiff, ifd, offsets), _place(tiff, ifd, counts))))
    # the value fields holding a (short) chunk table in the IFD itself are the twin's own
    own = sorted({(p.offset, tiff.offset_size) for *_, places in slots for p in places})
    wanted = [(0, 16 if tiff.big else 8)]
    for ifd in pages:
        wanted.extend(_cut(ifd.offset, ifd.length, own))
        for tag, where, nbytes in tiff.value_ranges(ifd, tables=False):
            if where + nbytes > tiff.size:
                tiff.read(where, nbytes, f"tag {tag}")  # refused, naming the tag
            wanted.append((where, nbytes))
    ranges = []
    for start, end in _disjoint(wanted):
        ranges.append((start, tiff.read(start, end - start, "the TIFF's metadata")))
    tables = [(p.offset, p.nbytes) for *_, places in slots for p in places]
    reads = spans([*((o, len(data)) for o, data in ranges), *tables])
    head, rest = (reads[0][1], reads[1:]) if reads and reads[0][0] == 0 else (8, reads)
    return Fingerprint(
        ranges, slots, list(parsed.refused), head, [(start, end - start) for start, end in rest]
    )


def _disjoint(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(offset, length)`` ranges as sorted ``(start, end)`` spans, those that overlap or touch merged."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted((o, o + n) for o, n in ranges if n > 0):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _cut(offset: int, length: int, holes: list[tuple[int, int]]):
    """``[offset, offset + length)`` but the ``(offset, length)`` holes, as ``(offset, length)`` ranges."""
    start, end = offset, offset + length
    for hole, size in holes:
        if start <= hole < end:
            if hole > start:
                yield start, hole - start
            start = hole + size
    if end > start:
        yield start, end - start


def _place(tiff: TiffReader, ifd: Ifd, tag: int) -> Place:
    """Where ``tag``'s values lie in the file (in the IFD itself when they fit in its value field)."""
    ftype, count, field_bytes = ifd.entries[tag]
    kind, width = FIELD_TYPES[ftype]
    if count * width > tiff.offset_size:
        (where,) = struct.unpack(tiff.pointer, field_bytes)
    else:  # the value field of the entry parsed: the last one of that tag
        count_size, entry_size = (8, 20) if tiff.big else (2, 12)
        entries = ifd.raw[count_size : ifd.length - tiff.offset_size]
        tags = np.frombuffer(entries, dtype=tiff.entry_type(tiff.order, tiff.offset_size))["tag"]
        index = int(np.flatnonzero(tags == tag)[-1])
        where = ifd.offset + count_size + index * entry_size + entry_size - tiff.offset_size
    return Place(where, tiff.order + kind, count)


def parse_twin(file, fingerprint: Fingerprint, options: ParseOptions) -> ParsedFile | None:
    """``file`` as a twin of the file ``fingerprint`` was taken from, if it holds that file's metadata
    in the same places; None (parse it in full) otherwise, or if anything in it is wrong."""
    try:
        tiff = TiffReader(file, fingerprint.head)
        if fingerprint.rest:
            tiff.fetch(fingerprint.rest)
        for offset, data in fingerprint.ranges:
            if tiff.read(offset, len(data), "the TIFF's metadata") != data:
                return None
        storages = {}
        for key, like, plane, (offsets, counts) in fingerprint.slots:
            image = dataclasses.replace(like)
            image.offsets = _table_at(tiff, offsets, f"{image.label} offsets")
            image.counts = _table_at(tiff, counts, f"{image.label} byte counts")
            check_chunks(tiff, image, image.label)
            storages[key] = data_storage(tiff, image, plane)
    except FormatError:
        return None
    refused = [dataclasses.replace(r, source=tiff.name) for r in fingerprint.refused]
    return ParsedFile(tiff.name, None, refused, "tiff", storages=storages)


def _table_at(tiff: TiffReader, place: Place, what: str) -> np.ndarray:
    dtype = np.dtype(place.dtype)
    values = np.frombuffer(tiff.read(place.offset, place.count * dtype.itemsize, what), dtype=dtype)
    return table_values(tiff, values, what)
