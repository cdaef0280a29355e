"""A TIFF's structure as read from its bytes: the header, GDAL's ghost area, the IFD chain and tag values.

Both byte orders, classic and BigTIFF; every count and offset is checked against the file's size before
anything is read or allocated, and IFD loops are refused (never libtiff or GDAL).

What is read, and when: a remote read costs a request whatever its size, so the bytes are fetched in as
few reads as the layout allows and kept (:class:`Held`) for every later use:

- the first block, :data:`HEAD_BYTES` from offset 0 (``file.read_head``: the remote source's one first
  request). A Cloud-Optimized GeoTIFF keeps its header, its IFDs (image, overviews, masks) and their tag
  values there: GDAL's COG driver says so in the ghost area after the header
  (``LAYOUT=IFDS_BEFORE_DATA``, :attr:`TiffReader.ghost`);
- an IFD outside what is held is fetched with the bytes after it (:data:`HEAD_BYTES` the first time, and
  always when the ghost area says the IFDs come before the data: the next IFDs and their values are
  likely there; :data:`IFD_WINDOW` for the later pages of other files, which lie among their data);
- once the chain is known, every tag value still missing (tile or strip tables that reach past the
  first block, a GDAL_METADATA far away) is fetched at once by :meth:`TiffReader.fetch`: the ranges the
  IFD entries name, neighbours merged into spans, the spans in one ``file.read_ranges`` (bytes the source
  already holds, ``file.cached``, are taken without a request).

A file object needs ``name``, ``size`` and ``read(offset, length)``; ``read_head``, ``read_ranges`` and
``cached`` (a :class:`~.sources.SourceFile`'s) are used when it has them.
"""

from __future__ import annotations

import bisect
import functools
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from nczmap.errors import FormatError

MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
MAX_IFDS = 65536  # pages a file may chain (each costs at least one read)
# IFD entries read in all: IFDs may overlap, so a small file could otherwise make 65536 of 65535 entries
MAX_IFD_ENTRIES = 1 << 21
MAX_TEXT_TAG = 16 << 20  # XML / ASCII tags read as text
HEAD_BYTES = 64 << 10  # the first read: a COG's header, IFDs and (mostly) its tile tables lie there
IFD_WINDOW = 4 << 10  # read with an IFD of a later page of a file that is no COG
MAX_FETCH = 64 << 20  # tag values fetched ahead at once; past this they are read as they are needed
MAX_HELD = 64 << 20  # bytes kept for IFD windows; past this an IFD is read alone
GHOST = b"GDAL_STRUCTURAL_METADATA_SIZE="

# TIFF field types: numpy kind, bytes per value
FIELD_TYPES = {
    1: ("u1", 1),
    2: ("S1", 1),
    3: ("u2", 2),
    4: ("u4", 4),
    5: ("u4", 8),
    6: ("i1", 1),
    7: ("u1", 1),
    8: ("i2", 2),
    9: ("i4", 4),
    10: ("i4", 8),
    11: ("f4", 4),
    12: ("f8", 8),
    13: ("u4", 4),
    16: ("u8", 8),
    17: ("i8", 8),
    18: ("u8", 8),
}

# tags
NEW_SUBFILE_TYPE, SUBFILE_TYPE = 254, 255
IMAGE_WIDTH, IMAGE_LENGTH, BITS_PER_SAMPLE, COMPRESSION, PHOTOMETRIC = 256, 257, 258, 259, 262
FILL_ORDER, STRIP_OFFSETS, SAMPLES_PER_PIXEL, ROWS_PER_STRIP, STRIP_BYTE_COUNTS = 266, 273, 277, 278, 279
PLANAR_CONFIGURATION, PREDICTOR = 284, 317
TILE_WIDTH, TILE_LENGTH, TILE_OFFSETS, TILE_BYTE_COUNTS = 322, 323, 324, 325
CHUNK_TABLES = frozenset({STRIP_OFFSETS, STRIP_BYTE_COUNTS, TILE_OFFSETS, TILE_BYTE_COUNTS})
SAMPLE_FORMAT = 339
MODEL_PIXEL_SCALE, MODEL_TIEPOINT, MODEL_TRANSFORMATION = 33550, 33922, 34264
GEO_KEY_DIRECTORY, GEO_DOUBLE_PARAMS, GEO_ASCII_PARAMS = 34735, 34736, 34737
GDAL_METADATA, GDAL_NODATA = 42112, 42113


@dataclass
class Ifd:
    offset: int
    entries: dict[int, tuple[int, int, bytes]]  # tag -> (field type, count, the value field's bytes)
    subfile: int = 0
    page: int = 0  # its place in the chain, from 0
    raw: bytes = b""  # its bytes: entry count, entries, next IFD's offset

    @property
    def length(self) -> int:
        return len(self.raw)


class Held:
    """Bytes of one file already read: sorted, disjoint spans (neighbours are not merged: a read across
    them joins the pieces)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.datas: list[bytes] = []
        self.total = 0

    def get(self, offset: int, length: int) -> bytes | None:
        """The bytes at ``[offset, offset + length)`` if all are held, else None."""
        i = bisect.bisect_right(self.starts, offset) - 1
        if i < 0:
            return None
        start, end = self.starts[i], offset + length
        if end <= self.ends[i]:
            return self.datas[i][offset - start : end - start]
        if offset > self.ends[i]:
            return None
        pieces = [self.datas[i][offset - start :]]
        for k in range(i + 1, len(self.starts)):
            if self.starts[k] != self.ends[k - 1]:
                return None
            if end <= self.ends[k]:
                pieces.append(self.datas[k][: end - self.starts[k]])
                return b"".join(pieces)
            pieces.append(self.datas[k])
        return None

    def missing(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """The parts of the ``(start, end)`` ranges not held: sorted, disjoint ``(start, end)`` spans."""
        parts: list[tuple[int, int]] = []
        for start, end in ranges:
            i = max(0, bisect.bisect_right(self.starts, start) - 1)
            while start < end:
                if i < len(self.starts) and self.starts[i] < end:
                    if self.starts[i] > start:
                        parts.append((start, self.starts[i]))
                    start = max(start, self.ends[i])
                    i += 1
                else:
                    parts.append((start, end))
                    break
        return _merged(parts, 0)

    def add(self, offset: int, data: bytes) -> None:
        """Keep ``data``, the bytes at ``offset`` (the parts not held already)."""
        for start, end in self.missing([(offset, offset + len(data))]):
            i = bisect.bisect_left(self.starts, start)
            piece = data if end - start == len(data) else data[start - offset : end - offset]
            self.starts.insert(i, start)
            self.ends.insert(i, end)
            self.datas.insert(i, piece)
            self.total += end - start


def _merged(spans: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """``(start, end)`` spans sorted and merged where less than ``gap`` bytes apart (``gap`` 0: where
    they overlap or touch)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1] + gap:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def spans(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(offset, length)`` ranges as the ``(start, end)`` spans one read each fetches: neighbours merged
    across the smallest gaps first, as long as the bytes read for nothing stay below what is wanted in
    all (or :data:`HEAD_BYTES`): a request costs more than that many bytes, and pages spread through a
    large file are not read whole."""
    wanted = _merged([(o, o + n) for o, n in ranges if n > 0], 0)
    budget = max(HEAD_BYTES, sum(end - start for start, end in wanted))
    gaps = sorted(range(len(wanted) - 1), key=lambda i: wanted[i + 1][0] - wanted[i][1])
    joined = set()
    for i in gaps:
        budget -= wanted[i + 1][0] - wanted[i][1]
        if budget < 0:
            break
        joined.add(i)
    found: list[tuple[int, int]] = []
    for i, (start, end) in enumerate(wanted):
        if i - 1 in joined:
            found[-1] = (found[-1][0], end)
        else:
            found.append((start, end))
    return found


class TiffReader:
    """A TIFF's header and IFDs; every read checked against the file's size first, every byte read kept.

    ``head``: the bytes read first (:data:`HEAD_BYTES`; a twin reads what its first file's metadata
    spans). ``slots``: the data variables a parse made (``(key, image, plane)``, for the twins' check)."""

    @staticmethod
    @functools.lru_cache(maxsize=4)
    def entry_type(order: str, width: int) -> np.dtype:
        """An IFD entry: tag, field type, count, value field (offset-sized)."""
        return np.dtype(
            [
                ("tag", order + "u2"),
                ("type", order + "u2"),
                ("count", f"{order}u{width}"),
                ("value", f"V{width}"),
            ]
        )

    def __init__(self, file, head: int = HEAD_BYTES) -> None:
        self.name = str(file.name)
        self.file = file
        self.source_read = file.read
        self.slots: list[tuple] = []  # the data variables made
        self.held = Held()
        self.windows = 0  # IFDs read with the bytes after them
        reader = getattr(file, "read_head", None)
        if reader is not None:  # first: a remote source learns its size from its first read
            data = bytes(reader(0, max(head, 16)))
            self.size = int(file.size)
        else:
            self.size = int(file.size)
            data = bytes(file.read(0, min(self.size, max(head, 16))))
        length = min(self.size, max(head, 16))
        if len(data) != length:
            raise FormatError(f"{self.name}: the header: read {len(data)} of {length} bytes at 0")
        self.head = data
        self.held.add(0, data)
        head16 = data[:16]
        if len(head16) < 8:
            raise FormatError(f"{self.name}: not a TIFF file ({self.size} bytes)")
        if head16[:4] not in MAGICS:
            raise FormatError(f"{self.name}: not a TIFF file (magic {head16[:4]!r})")
        self.order = "<" if head16[:2] == b"II" else ">"
        self.big = head16[2:4] in (b"+\x00", b"\x00+")
        if self.big:
            if len(head16) < 16:
                raise FormatError(f"{self.name}: BigTIFF header truncated ({self.size} bytes)")
            bytesize, zero, first = struct.unpack(self.order + "HHQ", head16[4:16])
            if bytesize != 8 or zero != 0:
                raise FormatError(f"{self.name}: BigTIFF header has offset size {bytesize}, not 8")
        else:
            (first,) = struct.unpack(self.order + "I", head16[4:8])
        self.first = first
        self.offset_size = 8 if self.big else 4
        self.pointer = self.order + ("Q" if self.big else "I")
        self.entries_read = 0  # IFD entries parsed so far (MAX_IFD_ENTRIES)

    # ------------------------------------------------------------------------------------- bytes
    def read(self, offset: int, length: int, what: str) -> bytes:
        end = offset + length
        if offset < 0 or length < 0 or end > self.size:
            raise FormatError(
                f"{self.name}: {what} ({length} bytes at offset {offset}) lies past the end of the "
                f"file ({self.size} bytes)"
            )
        if end <= len(self.head):
            return self.head[offset:end]
        data = self.held.get(offset, length)
        if data is not None:
            return data
        data = bytes(self.source_read(offset, length)) if length else b""
        if len(data) != length:
            raise FormatError(f"{self.name}: {what}: read {len(data)} of {length} bytes at {offset}")
        return data

    def fetch(self, ranges: Iterable[tuple[int, int]], limit: int = MAX_FETCH) -> None:
        """Fetch and keep the bytes of the ``(offset, length)`` ranges not held yet, in as few reads as
        :func:`spans` makes, all at once. Ranges past the end of the file are left for :meth:`read` to
        refuse; nothing is fetched when more than ``limit`` bytes are missing (they are then read when
        needed)."""
        wanted = [(o, o + n) for o, n in ranges if n > 0 and o >= 0 and o + n <= self.size]
        parts = self.held.missing(_merged(wanted, 0))
        if not parts or sum(end - start for start, end in parts) > limit:
            return
        todo = []
        cached = getattr(self.file, "cached", None)
        for start, end in spans((start, end - start) for start, end in parts):
            data = cached(start, end - start) if cached is not None else None
            if data is not None and len(data) == end - start:
                self.held.add(start, bytes(data))
            else:
                todo.append((start, end - start))
        if not todo:
            return
        read_ranges = getattr(self.file, "read_ranges", None)
        if read_ranges is not None:
            datas = read_ranges(todo)
        else:
            datas = [self.source_read(offset, length) for offset, length in todo]
        for (offset, length), data in zip(todo, datas, strict=True):
            if len(data) != length:
                raise FormatError(f"{self.name}: read {len(data)} of {length} bytes at {offset}")
            self.held.add(offset, bytes(data))

    @functools.cached_property
    def ghost(self) -> dict[str, str]:
        """GDAL's structural metadata after the header (``LAYOUT``, ``BLOCK_ORDER``, ...), {} if none."""
        at = 16 if self.big else 8
        if self.head[at : at + len(GHOST)] != GHOST:
            return {}
        digits = self.head[at + len(GHOST) : at + len(GHOST) + 6]
        if not digits.isdigit():
            return {}
        text = self.head[at + len(GHOST) + len(b"000000 bytes\n") :][: int(digits)]
        found = {}
        for line in text.decode("ascii", "replace").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                found[key.strip()] = value.strip()
        return found

    @property
    def ifds_first(self) -> bool:
        """Whether GDAL says every IFD and tag value lies before the image data (a COG not edited since)."""
        ghost = self.ghost
        return ghost.get("LAYOUT") == "IFDS_BEFORE_DATA" and ghost.get("KNOWN_INCOMPATIBLE_EDITION") == "NO"

    # -------------------------------------------------------------------------------------- IFDs
    def ifds(self) -> list[Ifd]:
        found: list[Ifd] = []
        seen: set[int] = set()
        offset = self.first
        while offset:
            if offset in seen:
                raise FormatError(f"{self.name}: IFD chain loops back to offset {offset}")
            if len(found) >= MAX_IFDS:
                raise FormatError(f"{self.name}: more than {MAX_IFDS} IFDs")
            seen.add(offset)
            ifd, offset = self._ifd(offset, len(found) + 1)
            found.append(ifd)
        if not found:
            raise FormatError(f"{self.name}: the TIFF has no IFD")
        return found

    def _ifd(self, offset: int, number: int) -> tuple[Ifd, int]:
        what = f"IFD {number}"
        count_size, entry_size = (8, 20) if self.big else (2, 12)
        self._window(offset, count_size)
        (count,) = struct.unpack(self.order + ("Q" if self.big else "H"), self.read(offset, count_size, what))
        if count * entry_size + count_size + self.offset_size > self.size - offset:
            raise FormatError(
                f"{self.name}: {what} at offset {offset} claims {count} entries, more than the file holds"
            )
        self.entries_read += count
        if self.entries_read > MAX_IFD_ENTRIES:
            raise FormatError(f"{self.name}: its IFDs hold more than {MAX_IFD_ENTRIES} entries in all")
        length = count_size + count * entry_size + self.offset_size
        self._window(offset, length)
        raw = self.read(offset, length, what)
        kind = self.entry_type(self.order, self.offset_size)
        entries = {}
        for tag, ftype, n, field_bytes in np.frombuffer(raw, kind, count, count_size).tolist():
            entries[tag] = (ftype, n, field_bytes)
        (following,) = struct.unpack(self.pointer, raw[length - self.offset_size :])
        ifd = Ifd(offset, entries, page=number - 1, raw=raw)
        ifd.subfile = self.integer(ifd, NEW_SUBFILE_TYPE, 0)
        if SUBFILE_TYPE in entries and self.integer(ifd, SUBFILE_TYPE, 1) == 2:
            ifd.subfile |= 1
        return ifd, following

    def _window(self, offset: int, length: int) -> None:
        """Fetch ``length`` bytes at ``offset`` (an IFD) with those after it unless they are held."""
        if offset < 0 or offset + length > self.size or self.held.get(offset, length) is not None:
            return  # past the end: read() says so
        window = HEAD_BYTES if not self.windows or self.ifds_first else IFD_WINDOW
        self.windows += 1
        if self.held.total < MAX_HELD:
            length = min(max(length, window), self.size - offset)
        self.fetch([(offset, length)])

    def value_ranges(self, ifd: Ifd, tables: bool) -> list[tuple[int, int, int]]:
        """``(tag, offset, bytes)`` of each tag value of ``ifd`` that lies outside it (the chunk tables'
        only if ``tables``); values of unknown field types are not read and not listed."""
        found = []
        for tag, (ftype, count, field_bytes) in ifd.entries.items():
            width = FIELD_TYPES.get(ftype, ("", 0))[1]
            if count * width > self.offset_size and (tables or tag not in CHUNK_TABLES):
                (where,) = struct.unpack(self.pointer, field_bytes)
                found.append((tag, where, count * width))
        return found

    # ------------------------------------------------------------------------------------ values
    def values(self, ifd: Ifd, tag: int, what: str, limit: int | None = None) -> np.ndarray | None:
        """A tag's values (rationals as (numerator, denominator) pairs); None when the tag is absent."""
        entry = ifd.entries.get(tag)
        if entry is None:
            return None
        ftype, count, field_bytes = entry
        if ftype not in FIELD_TYPES:
            raise FormatError(f"{self.name}: {what} (tag {tag}) has unknown field type {ftype}")
        kind, width = FIELD_TYPES[ftype]
        nbytes = count * width
        if limit is not None and count > limit:
            raise FormatError(f"{self.name}: {what} (tag {tag}) has {count} values, more than {limit}")
        if nbytes > self.size:
            raise FormatError(
                f"{self.name}: {what} (tag {tag}) claims {count} values ({nbytes} bytes), more than the "
                f"file's {self.size} bytes"
            )
        if nbytes <= self.offset_size:
            data = field_bytes[:nbytes]
        else:
            (where,) = struct.unpack(self.pointer, field_bytes)
            data = self.read(where, nbytes, f"{what} (tag {tag})")
        dtype = np.dtype(kind if kind in ("S1", "u1", "i1") else self.order + kind)
        values = np.frombuffer(data, dtype=dtype)
        return values.reshape(-1, 2) if ftype in (5, 10) else values

    def integer(self, ifd: Ifd, tag: int, default: int | None, what: str = "") -> int:
        values = self.values(ifd, tag, what or f"tag {tag}", limit=1 << 16)
        if values is None or values.size == 0:
            if default is None:
                raise FormatError(f"{self.name}: IFD at offset {ifd.offset} lacks required tag {what or tag}")
            return default
        if values.dtype.kind not in "iu" or values.ndim != 1:
            raise FormatError(f"{self.name}: {what or f'tag {tag}'} is not an integer")
        return int(values[0])

    def text(self, ifd: Ifd, tag: int, what: str) -> str | None:
        values = self.values(ifd, tag, what, limit=MAX_TEXT_TAG)
        if values is None:
            return None
        return values.tobytes().split(b"\x00", 1)[0].decode("utf-8", "replace")

    def doubles(self, ifd: Ifd, tag: int, what: str, limit: int = 1 << 16) -> np.ndarray | None:
        values = self.values(ifd, tag, what, limit=limit)
        if values is None:
            return None
        if values.dtype.kind == "S":
            raise FormatError(f"{self.name}: {what} (tag {tag}) is text, not numbers")
        if values.ndim == 2:
            return values[:, 0] / np.where(values[:, 1] == 0, np.nan, values[:, 1])
        return values.astype(np.float64)
