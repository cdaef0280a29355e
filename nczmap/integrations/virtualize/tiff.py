"""TIFF, BigTIFF, GeoTIFF and Cloud-Optimized GeoTIFF sources: the image's tiles or strips as chunks.

The IFDs are read here (both byte orders, classic and BigTIFF; every count and offset checked against the
file's size before anything is read or allocated, IFD loops refused), never through libtiff or GDAL.

The model (names as rioxarray's, so ``xarray.open_dataset`` gives what ``rioxarray.open_rasterio`` gives):

- ``band_data``: the first full-resolution image, dims ``(y, x)`` for one band, ``(y, x, band)`` for
  pixel-interleaved bands (PlanarConfiguration 1, chunks ``(ty, tx, nbands)``) and ``(band, y, x)`` for
  planar bands (chunks ``(1, ty, tx)``), with a ``band`` coordinate 1..n. Tiles are chunks; strips are
  chunks of RowsPerStrip whole rows. Sparse tiles or strips (offset or byte count 0) are missing chunks,
  read as the fill value.
- Codecs are the ids tifffile's ``write_fsspec`` and kerchunk write, so any reader with
  imagecodecs-numcodecs decodes them (nczmap without it uses :mod:`nczmap.format.tiffcodecs`): deflate
  -> ``zlib``, zstd -> ``zstd``, LZMA -> ``lzma``, LZW -> ``imagecodecs_lzw``, PackBits ->
  ``imagecodecs_packbits``; predictor 2 -> ``imagecodecs_delta``, 3 -> ``imagecodecs_floatpred`` (axis -2
  for pixel-interleaved bands). JPEG and every other compression are refused (NotVirtualizable).
- A last strip shorter than RowsPerStrip holds fewer bytes than a chunk: the filter ``nczmap.pad``
  (nczmap's own, registered through the ``numcodecs.codecs`` entry point) pads the decompressed bytes to
  a whole chunk before the predictor filter runs. It is only there when the height is not a multiple of
  RowsPerStrip.
- GeoTIFF: ``x``/``y`` coordinates at pixel centres (PixelIsPoint shifts the origin half a pixel, as
  GDAL does), and the scalar grid mapping ``spatial_ref`` (pyproj's ``to_cf()`` attributes, ``crs_wkt``,
  ``spatial_ref`` and GDAL's ``GeoTransform``) from the EPSG code of ProjectedCSTypeGeoKey or
  GeographicTypeGeoKey; data variables get ``grid_mapping = "spatial_ref"``. A rotated or sheared
  transform has no 1-D x/y (``GeoTransform`` on ``spatial_ref`` keeps it); a user-defined CRS (no EPSG
  code) has no ``spatial_ref`` (a refusal says so). A TIFF without georeferencing has no x/y variables.
- GDAL_NODATA -> ``_FillValue`` (and the fill of missing chunks). GDAL_METADATA: dataset items become
  global attributes; band descriptions ``long_name`` (a list for several bands); unit types ``units``;
  per-band SCALE/OFFSET ``scale_factor``/``add_offset``. Bands whose scale, offset, units or other band
  items differ are never collapsed: planar images become one variable per band (``band_1``, ``band_2``,
  ..., dims ``(y, x)``, each its own chunks); pixel-interleaved ones keep ``band_data`` with the values per
  band as ``band_scale_factor``/``band_add_offset`` (and a refusal of ``scale_factor``/``add_offset``).
- Overviews (NewSubfileType bit 0) become groups ``overview_1`` (the largest), ``overview_2``, ... with
  their own ``y``/``x`` dimensions and coordinates and the same variable names (``band`` and
  ``spatial_ref`` are the root's). Transparency masks (bit 2) are refused as ``/mask`` (and
  ``/overview_N/mask``); full-resolution pages after the first as ``/image_2``, ``/image_3``, ...
  SubIFDs are not followed.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from nczmap.errors import FormatError
from nczmap.format import Attribute, Dimension, Group
from nczmap.format.types import BY_NAME, CHAR, DOUBLE, INT, STRING, NCType, type_of_numpy
from nczmap.format.variable import ArrayLayout
from nczmap.integrations.virtualize.parsed import (
    Constant,
    NotVirtualizable,
    ParsedFile,
    ParseOptions,
    Refusal,
    SourceVariable,
    Storage,
    native_dtype,
    source_layout,
)

MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
MAX_IFDS = 65536  # pages a file may chain (each costs at least one read)
# IFD entries read in all: IFDs may overlap, so a small file could otherwise make 65536 of 65535 entries
MAX_IFD_ENTRIES = 1 << 21
MAX_CHUNK_BYTES = 1 << 31  # a decoded tile or strip larger than this is absurd
MAX_TEXT_TAG = 16 << 20  # XML / ASCII tags read as text
HEAD_BYTES = 64 << 10  # read at once: a COG's IFDs and tag values lie at its start

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

# GeoKeys
GT_MODEL_TYPE, GT_RASTER_TYPE, GEOGRAPHIC_TYPE, PROJECTED_CS_TYPE = 1024, 1025, 2048, 3072
PIXEL_IS_POINT = 2
USER_DEFINED = 32767

COMPRESSORS: dict[int, dict | None] = {
    1: None,
    5: {"id": "imagecodecs_lzw"},
    8: {"id": "zlib", "level": 6},
    32946: {"id": "zlib", "level": 6},
    32773: {"id": "imagecodecs_packbits"},
    34925: {"id": "lzma"},
    50000: {"id": "zstd", "level": 9},
}
COMPRESSION_NAMES = {
    2: "CCITT RLE",
    3: "CCITT Group 3",
    4: "CCITT Group 4",
    6: "old-style JPEG",
    7: "JPEG",
    34887: "LERC",
    34933: "PNG",
    50001: "WebP",
    50002: "JPEG XL",
    52546: "JPEG XL",
    33003: "JPEG 2000",
    33005: "JPEG 2000",
    34712: "JPEG 2000",
}


def sniff(read: Callable[[int, int], bytes], size: int) -> bool:
    """Whether the bytes are a classic TIFF or a BigTIFF (either byte order)."""
    return size >= 8 and bytes(read(0, 4)) in MAGICS


def parse(file, options: ParseOptions) -> ParsedFile:
    """The netCDF model of a TIFF's first full-resolution image, its overviews and georeferencing."""
    tiff = _Tiff(file)
    pages = tiff.ifds()
    full = [ifd for ifd in pages if not ifd.subfile & 5]
    if not full:
        raise FormatError(f"{tiff.name}: no full-resolution image (every IFD is an overview or mask)")
    main = full[0]
    root = Group("/", None)
    parsed = ParsedFile(tiff.name, root, [], "tiff")
    try:
        image = _image(tiff, main)
    except NotVirtualizable as exc:  # the whole source is refused: say which
        raise NotVirtualizable(f"{tiff.name}: {exc}") from None
    bands = _BandInfo.read(tiff, main, image, parsed.refused)
    geo = _Georeference.read(tiff, main, parsed.refused)
    _global_attributes(root, bands)
    if geo.crs_attributes is not None:
        _scalar_variable(root, "spatial_ref", tiff.name, geo.crs_attributes)
    if image.samples > 1:
        band = Dimension("band", image.samples, False, root)
        root.dimensions["band"] = band
        _coordinate(root, "band", band, np.arange(1, image.samples + 1, dtype=np.int32), tiff.name, {})
    _add_image(root, tiff, image, bands, geo, geo.transform, parsed.refused)
    overviews = 0
    for number, ifd in enumerate(pages, 1):
        if ifd is main:
            continue
        if not ifd.subfile & 5:
            parsed.refused.append(
                Refusal(
                    f"/image_{full.index(ifd) + 1}",
                    "only the first full-resolution image of a multi-page TIFF is virtualized",
                    tiff.name,
                )
            )
        elif ifd.subfile & 4:
            where = "/mask" if not ifd.subfile & 1 else f"/overview_{overviews}/mask"
            parsed.refused.append(
                Refusal(where, f"IFD {number} is a transparency mask, which is not virtualized", tiff.name)
            )
        else:
            overviews += 1
            _add_overview(root, tiff, ifd, overviews, image, bands, geo, parsed.refused)
    parsed.fingerprint = _fingerprint(tiff, pages, parsed)
    return parsed


# ------------------------------------------------------------------------------- collections: twins
@dataclass
class _Fingerprint:
    """What makes a TIFF's model: the bytes of its header, of every IFD and of every tag value but the
    chunk tables (a twin's offsets and byte counts are its own), and where those tables lie. Two files
    with these bytes in these places have one model (the IFD chain, the entries and every value parsed
    are the same): a twin's parse only compares them and reads its tables. Picklable, to be sent to
    other processes."""

    ranges: list[tuple[int, bytes]]  # (offset, the bytes there)
    slots: list[tuple[str, _Image, int | None, tuple[_Place, _Place]]]  # variable, image, plane, tables
    refused: list[Refusal]


@dataclass(frozen=True)
class _Place:
    """Where a chunk table's values lie: offset, numpy dtype, count."""

    offset: int
    dtype: str
    count: int


def _fingerprint(tiff: _Tiff, pages: list[_Ifd], parsed: ParsedFile) -> _Fingerprint | None:
    slots = []
    for key, image, plane in tiff.slots:
        ifd = pages[image.page]
        tags = (STRIP_OFFSETS, STRIP_BYTE_COUNTS) if image.stripped else (TILE_OFFSETS, TILE_BYTE_COUNTS)
        slots.append((key, image, plane, (_place(tiff, ifd, tags[0]), _place(tiff, ifd, tags[1]))))
    # the value fields holding a (short) chunk table in the IFD itself are the twin's own
    own = sorted({(p.offset, tiff.offset_size) for *_, places in slots for p in places})
    ranges = [(0, tiff.read(0, 16 if tiff.big else 8, "the header"))]
    for ifd in pages:
        ranges.extend(_cut(tiff, ifd.offset, ifd.length, own, f"IFD {ifd.page + 1}"))
        for tag, (ftype, count, field_bytes) in ifd.entries.items():
            width = FIELD_TYPES.get(ftype, ("", 0))[1]
            if tag not in CHUNK_TABLES and count * width > tiff.offset_size:
                (where,) = struct.unpack(tiff.order + ("Q" if tiff.big else "I"), field_bytes)
                ranges.append((where, tiff.read(where, count * width, f"tag {tag}")))
    return _Fingerprint(ranges, slots, list(parsed.refused))


def _cut(tiff: _Tiff, offset: int, length: int, holes: list[tuple[int, int]], what: str):
    """The bytes of ``[offset, offset + length)`` but the ``(offset, length)`` holes, as ranges."""
    start, end = offset, offset + length
    for hole, size in holes:
        if start <= hole < end:
            if hole > start:
                yield start, tiff.read(start, hole - start, what)
            start = hole + size
    if end > start:
        yield start, tiff.read(start, end - start, what)


def _place(tiff: _Tiff, ifd: _Ifd, tag: int) -> _Place:
    """Where ``tag``'s values lie in the file (in the IFD itself when they fit in its value field)."""
    ftype, count, field_bytes = ifd.entries[tag]
    kind, width = FIELD_TYPES[ftype]
    if count * width > tiff.offset_size:
        (where,) = struct.unpack(tiff.order + ("Q" if tiff.big else "I"), field_bytes)
    else:  # the value field of the entry parsed: the last one of that tag
        count_size, entry_size = (8, 20) if tiff.big else (2, 12)
        raw = tiff.read(ifd.offset + count_size, ifd.length - count_size - tiff.offset_size, "an IFD")
        tags = np.frombuffer(raw, dtype=tiff.entry_type(tiff.order, tiff.offset_size))["tag"]
        index = int(np.flatnonzero(tags == tag)[-1])
        where = ifd.offset + count_size + index * entry_size + entry_size - tiff.offset_size
    return _Place(where, tiff.order + kind, count)


def parse_twin(file, fingerprint: _Fingerprint, options: ParseOptions) -> ParsedFile | None:
    """``file`` as a twin of the file ``fingerprint`` was taken from, if it holds that file's metadata
    in the same places; None (parse it in full) otherwise, or if anything in it is wrong."""
    try:
        tiff = _Tiff(file)
        for offset, data in fingerprint.ranges:
            if tiff.read(offset, len(data), "the TIFF's metadata") != data:
                return None
        storages = {}
        for key, like, plane, (offsets, counts) in fingerprint.slots:
            image = dataclasses.replace(like)
            image.offsets = _table_at(tiff, offsets, f"{image.label} offsets")
            image.counts = _table_at(tiff, counts, f"{image.label} byte counts")
            _check_chunks(tiff, image, image.label)
            storages[key] = _data_storage(tiff, image, plane)
    except FormatError:
        return None
    refused = [dataclasses.replace(r, source=tiff.name) for r in fingerprint.refused]
    return ParsedFile(tiff.name, None, refused, "tiff", storages=storages)


def _table_at(tiff: _Tiff, place: _Place, what: str) -> np.ndarray:
    dtype = np.dtype(place.dtype)
    values = np.frombuffer(tiff.read(place.offset, place.count * dtype.itemsize, what), dtype=dtype)
    return _table_values(tiff, values, what)


# ------------------------------------------------------------------------------------------ reading
@dataclass
class _Ifd:
    offset: int
    entries: dict[int, tuple[int, int, bytes]]  # tag -> (field type, count, the value field's bytes)
    subfile: int = 0
    page: int = 0  # its place in the chain, from 0
    length: int = 0  # bytes: entry count, entries, next IFD's offset


class _Tiff:
    """A TIFF's header and IFDs; every read checked against the file's size first."""

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

    def __init__(self, file) -> None:
        self.name = str(file.name)
        self.size = int(file.size)
        self.source_read = file.read
        self.slots: list[tuple[str, _Image, int | None]] = []  # the data variables made
        self.head = b""
        self.head = self.read(0, min(self.size, HEAD_BYTES), "the header")
        head = self.head[:16]
        if len(head) < 8:
            raise FormatError(f"{self.name}: not a TIFF file ({self.size} bytes)")
        if head[:4] not in MAGICS:
            raise FormatError(f"{self.name}: not a TIFF file (magic {head[:4]!r})")
        self.order = "<" if head[:2] == b"II" else ">"
        self.big = head[2:4] in (b"+\x00", b"\x00+")
        if self.big:
            if len(head) < 16:
                raise FormatError(f"{self.name}: BigTIFF header truncated ({self.size} bytes)")
            bytesize, zero, first = struct.unpack(self.order + "HHQ", head[4:16])
            if bytesize != 8 or zero != 0:
                raise FormatError(f"{self.name}: BigTIFF header has offset size {bytesize}, not 8")
        else:
            (first,) = struct.unpack(self.order + "I", head[4:8])
        self.first = first
        self.offset_size = 8 if self.big else 4
        self.entries_read = 0  # IFD entries parsed so far (MAX_IFD_ENTRIES)

    def read(self, offset: int, length: int, what: str) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise FormatError(
                f"{self.name}: {what} ({length} bytes at offset {offset}) lies past the end of the "
                f"file ({self.size} bytes)"
            )
        if offset + length <= len(self.head):
            return self.head[offset : offset + length]
        data = bytes(self.source_read(offset, length)) if length else b""
        if len(data) != length:
            raise FormatError(f"{self.name}: {what}: read {len(data)} of {length} bytes at {offset}")
        return data

    def ifds(self) -> list[_Ifd]:
        found: list[_Ifd] = []
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

    def _ifd(self, offset: int, number: int) -> tuple[_Ifd, int]:
        what = f"IFD {number}"
        count_size, entry_size = (8, 20) if self.big else (2, 12)
        (count,) = struct.unpack(self.order + ("Q" if self.big else "H"), self.read(offset, count_size, what))
        if count * entry_size + count_size + self.offset_size > self.size - offset:
            raise FormatError(
                f"{self.name}: {what} at offset {offset} claims {count} entries, more than the file holds"
            )
        self.entries_read += count
        if self.entries_read > MAX_IFD_ENTRIES:
            raise FormatError(f"{self.name}: its IFDs hold more than {MAX_IFD_ENTRIES} entries in all")
        raw = self.read(offset + count_size, count * entry_size + self.offset_size, what)
        kind = self.entry_type(self.order, self.offset_size)
        entries = {}
        for tag, ftype, n, field_bytes in np.frombuffer(raw, dtype=kind, count=count).tolist():
            entries[tag] = (ftype, n, field_bytes)
        (following,) = struct.unpack(self.order + ("Q" if self.big else "I"), raw[count * entry_size :])
        ifd = _Ifd(offset, entries, page=number - 1, length=count_size + len(raw))
        ifd.subfile = self.integer(ifd, NEW_SUBFILE_TYPE, 0)
        if SUBFILE_TYPE in entries and self.integer(ifd, SUBFILE_TYPE, 1) == 2:
            ifd.subfile |= 1
        return ifd, following

    def values(self, ifd: _Ifd, tag: int, what: str, limit: int | None = None) -> np.ndarray | None:
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
            (where,) = struct.unpack(self.order + ("Q" if self.big else "I"), field_bytes)
            data = self.read(where, nbytes, f"{what} (tag {tag})")
        dtype = np.dtype(kind if kind in ("S1", "u1", "i1") else self.order + kind)
        values = np.frombuffer(data, dtype=dtype)
        return values.reshape(-1, 2) if ftype in (5, 10) else values

    def integer(self, ifd: _Ifd, tag: int, default: int | None, what: str = "") -> int:
        values = self.values(ifd, tag, what or f"tag {tag}", limit=1 << 16)
        if values is None or values.size == 0:
            if default is None:
                raise FormatError(f"{self.name}: IFD at offset {ifd.offset} lacks required tag {what or tag}")
            return default
        if values.dtype.kind not in "iu" or values.ndim != 1:
            raise FormatError(f"{self.name}: {what or f'tag {tag}'} is not an integer")
        return int(values[0])

    def text(self, ifd: _Ifd, tag: int, what: str) -> str | None:
        values = self.values(ifd, tag, what, limit=MAX_TEXT_TAG)
        if values is None:
            return None
        return values.tobytes().split(b"\x00", 1)[0].decode("utf-8", "replace")

    def doubles(self, ifd: _Ifd, tag: int, what: str, limit: int = 1 << 16) -> np.ndarray | None:
        values = self.values(ifd, tag, what, limit=limit)
        if values is None:
            return None
        if values.dtype.kind == "S":
            raise FormatError(f"{self.name}: {what} (tag {tag}) is text, not numbers")
        if values.ndim == 2:
            return values[:, 0] / np.where(values[:, 1] == 0, np.nan, values[:, 1])
        return values.astype(np.float64)


# -------------------------------------------------------------------------------------------- image
@dataclass
class _Image:
    width: int
    height: int
    samples: int
    planar: bool  # PlanarConfiguration 2: each band its own tiles or strips
    dtype: np.dtype  # in the file's byte order
    nctype: NCType
    chunk_height: int
    chunk_width: int
    offsets: np.ndarray | None  # int64, one per tile / strip (plane-major for planar images)
    counts: np.ndarray | None
    compressor: dict | None
    predictor: int
    stripped: bool
    page: int = 0  # its IFD's place in the chain
    label: str = "tile"  # or "strip"

    @property
    def across(self) -> int:
        return -(-self.width // self.chunk_width)

    @property
    def down(self) -> int:
        return -(-self.height // self.chunk_height)

    @property
    def chunk_bytes(self) -> int:
        samples = 1 if self.planar else self.samples
        return self.chunk_height * self.chunk_width * samples * self.dtype.itemsize


def _image(tiff: _Tiff, ifd: _Ifd) -> _Image:
    name = tiff.name
    width = tiff.integer(ifd, IMAGE_WIDTH, None, "ImageWidth")
    height = tiff.integer(ifd, IMAGE_LENGTH, None, "ImageLength")
    if width <= 0 or height <= 0:
        raise FormatError(f"{name}: the image is {width} x {height} pixels")
    samples = tiff.integer(ifd, SAMPLES_PER_PIXEL, 1, "SamplesPerPixel")
    if samples <= 0:
        raise FormatError(f"{name}: SamplesPerPixel is {samples}")
    planar = tiff.integer(ifd, PLANAR_CONFIGURATION, 1, "PlanarConfiguration") == 2 and samples > 1
    dtype, nctype = _sample_type(tiff, ifd, samples)
    compressor, predictor = _compression(tiff, ifd, dtype)
    if tiff.integer(ifd, FILL_ORDER, 1, "FillOrder") != 1:
        raise NotVirtualizable("its FillOrder 2 (bits in reversed order) has no codec")
    if tiff.integer(ifd, PHOTOMETRIC, 1, "PhotometricInterpretation") == 6:
        raise NotVirtualizable("its YCbCr samples may be subsampled, which no codec undoes")
    stripped = TILE_WIDTH not in ifd.entries and TILE_OFFSETS not in ifd.entries
    if stripped:
        rows = tiff.integer(ifd, ROWS_PER_STRIP, (1 << 32) - 1, "RowsPerStrip")
        if rows <= 0:
            raise FormatError(f"{name}: RowsPerStrip is {rows}")
        chunk_height, chunk_width = min(rows, height), width
        label = "strip"
    else:
        chunk_width = tiff.integer(ifd, TILE_WIDTH, None, "TileWidth")
        chunk_height = tiff.integer(ifd, TILE_LENGTH, None, "TileLength")
        if chunk_width <= 0 or chunk_height <= 0:
            raise FormatError(f"{name}: tiles of {chunk_width} x {chunk_height} pixels")
        label = "tile"
    image = _Image(
        width,
        height,
        samples,
        planar,
        dtype,
        nctype,
        chunk_height,
        chunk_width,
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
        compressor,
        predictor,
        stripped,
        ifd.page,
        label,
    )
    if image.chunk_bytes > MAX_CHUNK_BYTES:
        raise FormatError(f"{name}: a {label} of {image.chunk_bytes} bytes (absurd dimensions)")
    return _tables(tiff, ifd, image)


def _tables(tiff: _Tiff, ifd: _Ifd, image: _Image) -> _Image:
    """``image`` with its tile or strip offsets and byte counts, read from ``ifd`` and checked."""
    tags = (STRIP_OFFSETS, STRIP_BYTE_COUNTS) if image.stripped else (TILE_OFFSETS, TILE_BYTE_COUNTS)
    expected = image.across * image.down * (image.samples if image.planar else 1)
    image.offsets = _chunk_table(tiff, ifd, tags[0], expected, f"{image.label} offsets")
    image.counts = _chunk_table(tiff, ifd, tags[1], expected, f"{image.label} byte counts")
    _check_chunks(tiff, image, image.label)
    return image


def _sample_type(tiff: _Tiff, ifd: _Ifd, samples: int) -> tuple[np.dtype, NCType]:
    bits = tiff.values(ifd, BITS_PER_SAMPLE, "BitsPerSample", limit=1 << 16)
    bits = [1] if bits is None else sorted({int(b) for b in bits.ravel()})
    formats = tiff.values(ifd, SAMPLE_FORMAT, "SampleFormat", limit=1 << 16)
    formats = [1] if formats is None else sorted({int(f) for f in formats.ravel()})
    if len(bits) != 1 or len(formats) != 1:
        raise NotVirtualizable(f"its bands differ in type (BitsPerSample {bits}, SampleFormat {formats})")
    kind = {1: "u", 2: "i", 3: "f"}.get(formats[0])
    if kind is None:
        raise NotVirtualizable(f"its SampleFormat {formats[0]} (complex or undefined) has no netCDF type")
    if bits[0] not in (8, 16, 32, 64):
        raise NotVirtualizable(f"its {bits[0]}-bit samples are not whole bytes a netCDF type holds")
    dtype = np.dtype(f"{kind}{bits[0] // 8}")
    try:
        nctype = type_of_numpy(dtype)
    except FormatError:
        raise NotVirtualizable(f"its {dtype} samples have no netCDF type") from None
    return dtype.newbyteorder(tiff.order) if dtype.itemsize > 1 else dtype, nctype


def _compression(tiff: _Tiff, ifd: _Ifd, dtype: np.dtype) -> tuple[dict | None, int]:
    code = tiff.integer(ifd, COMPRESSION, 1, "Compression")
    if code not in COMPRESSORS:
        label = COMPRESSION_NAMES.get(code, "unknown")
        raise NotVirtualizable(f"its compression {code} ({label}) has no codec nczmap writes references for")
    predictor = tiff.integer(ifd, PREDICTOR, 1, "Predictor")
    if predictor not in (1, 2, 3):
        raise NotVirtualizable(f"its predictor {predictor} has no codec")
    if predictor == 3 and dtype.kind != "f":
        raise NotVirtualizable(f"its floating-point predictor is applied to {dtype} samples")
    compressor = COMPRESSORS[code]
    return (None if compressor is None else dict(compressor)), predictor


def _chunk_table(tiff: _Tiff, ifd: _Ifd, tag: int, expected: int, what: str) -> np.ndarray:
    entry = ifd.entries.get(tag)
    if entry is None:
        raise FormatError(f"{tiff.name}: the image has no {what} (tag {tag})")
    if entry[1] != expected:
        raise FormatError(f"{tiff.name}: {entry[1]} {what} for an image of {expected}")
    return _table_values(tiff, tiff.values(ifd, tag, what), what)


def _table_values(tiff: _Tiff, values: np.ndarray, what: str) -> np.ndarray:
    if values.dtype.kind not in "iu" or values.ndim != 1:
        raise FormatError(f"{tiff.name}: the {what} are not integers")
    if values.dtype == np.uint64 and values.size and int(values.max()) >= 1 << 62:
        raise FormatError(f"{tiff.name}: {what} beyond any file size")
    return values.astype(np.int64)


def _check_chunks(tiff: _Tiff, image: _Image, label: str) -> None:
    present = (image.offsets > 0) & (image.counts > 0)
    ends = image.offsets + image.counts
    beyond = np.flatnonzero(present & (ends > tiff.size))
    if beyond.size:
        i = int(beyond[0])
        raise FormatError(
            f"{tiff.name}: {label} {i} ({int(image.counts[i])} bytes at offset {int(image.offsets[i])}) "
            f"runs past the end of the file ({tiff.size} bytes)"
        )
    if image.compressor is None:
        needed = _raw_sizes(image)
        short = np.flatnonzero(present & (image.counts < needed))
        if short.size:
            i = int(short[0])
            raise FormatError(
                f"{tiff.name}: uncompressed {label} {i} has {int(image.counts[i])} bytes, "
                f"{int(needed[i])} needed"
            )


def _raw_sizes(image: _Image) -> np.ndarray:
    """The decoded bytes each tile or strip holds (a last strip holds only the rows left)."""
    full = np.full(image.offsets.shape, image.chunk_bytes, np.int64)
    if image.stripped and image.height % image.chunk_height:
        row_bytes = image.chunk_bytes // image.chunk_height
        last = (image.height % image.chunk_height) * row_bytes
        full.reshape(-1, image.down)[:, -1] = last
    return full


# ------------------------------------------------------------------------------------ band metadata
@dataclass
class _BandInfo:
    """What GDAL records per band and for the dataset (GDAL_NODATA, GDAL_METADATA)."""

    samples: int
    fill: object = None
    fill_problem: str | None = None
    dataset_items: dict[str, str] = field(default_factory=dict)
    per_band: list[dict[str, object]] = field(default_factory=list)  # attribute name -> value, per band

    @classmethod
    def read(cls, tiff: _Tiff, ifd: _Ifd, image: _Image, refused: list[Refusal]) -> _BandInfo:
        info = cls(image.samples, per_band=[{} for _ in range(image.samples)])
        nodata = tiff.text(ifd, GDAL_NODATA, "GDAL_NODATA")
        if nodata is not None:
            info.fill, info.fill_problem = _nodata(nodata.strip(), image.dtype)
        xml = tiff.text(ifd, GDAL_METADATA, "GDAL_METADATA")
        if xml:
            info._metadata(xml, tiff.name, refused)
        return info

    def _metadata(self, xml: str, source: str, refused: list[Refusal]) -> None:
        import xml.etree.ElementTree as ElementTree

        try:
            items = ElementTree.fromstring(xml).iter("Item")
            items = list(items)
        except ElementTree.ParseError as exc:
            refused.append(Refusal("/", f"its GDAL_METADATA is not XML: {exc}", source, "GDAL_METADATA"))
            return
        for item in items:
            name, role, sample = item.get("name"), item.get("role"), item.get("sample")
            text = item.text or ""
            if sample is None:
                if name and not role:
                    self.dataset_items[name] = text
                continue
            if not sample.isdigit() or int(sample) >= self.samples:
                continue
            band = self.per_band[int(sample)]
            if role == "description":
                band["long_name"] = text
            elif role == "unittype":
                band["units"] = text
            elif role in ("scale", "offset"):
                try:
                    band["scale_factor" if role == "scale" else "add_offset"] = float(text)
                except ValueError:
                    refused.append(Refusal("/band_data", f"its {role} {text!r} is no number", source, role))
            elif name and not role:
                band[name] = text

    def uniform(self) -> bool:
        """Whether every band carries the same attributes (descriptions aside)."""

        def strip(band: dict) -> dict:
            return {k: v for k, v in band.items() if k != "long_name"}

        return all(strip(band) == strip(self.per_band[0]) for band in self.per_band)


def _nodata(text: str, dtype: np.dtype) -> tuple[object, str | None]:
    try:
        value = int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text)
    except ValueError:
        return None, f"GDAL_NODATA {text!r} is no number"
    if dtype.kind == "f":
        return np.array(value, dtype=dtype.newbyteorder("="))[()], None
    if isinstance(value, float):
        if not value.is_integer():
            return None, f"GDAL_NODATA {text!r} is not an integer of the image's type {dtype}"
        value = int(value)
    info = np.iinfo(dtype)
    if not info.min <= value <= info.max:
        return None, f"GDAL_NODATA {text!r} is outside the range of the image's type {dtype}"
    return np.array(value, dtype=dtype.newbyteorder("="))[()], None


# ---------------------------------------------------------------------------------- georeferencing
@dataclass
class _Georeference:
    transform: tuple[float, ...] | None = None  # affine a, b, c, d, e, f (x = a*col + b*row + c)
    geographic: bool = False
    units: str | None = None
    crs_attributes: dict[str, object] | None = None

    @classmethod
    def read(cls, tiff: _Tiff, ifd: _Ifd, refused: list[Refusal]) -> _Georeference:
        geo = cls()
        keys = _geokeys(tiff, ifd)
        geo.transform = _transform(tiff, ifd, keys.get(GT_RASTER_TYPE) == PIXEL_IS_POINT)
        if keys:
            geo._crs(keys, tiff.name, refused)
        if geo.crs_attributes is not None and geo.transform is not None:
            a, b, c, d, e, f = geo.transform
            geo.crs_attributes["GeoTransform"] = " ".join(repr(float(v)) for v in (c, a, b, f, d, e))
        return geo

    def _crs(self, keys: dict[int, object], source: str, refused: list[Refusal]) -> None:
        model = keys.get(GT_MODEL_TYPE)
        code = keys.get(PROJECTED_CS_TYPE) if model != 2 else None
        if not isinstance(code, int) or not 0 < code < USER_DEFINED:
            code = keys.get(GEOGRAPHIC_TYPE)
            if model == 1 and keys.get(PROJECTED_CS_TYPE) is not None:
                code = None  # a user-defined projection: its geographic CRS alone would be wrong
        if not isinstance(code, int) or not 0 < code < USER_DEFINED:
            refused.append(
                Refusal("/spatial_ref", "its CRS is user-defined (no EPSG code), not translated", source)
            )
            return
        try:
            self.geographic, self.units, attributes = _epsg(code)
        except ImportError:
            refused.append(Refusal("/spatial_ref", "pyproj is not installed (nczmap[virtual])", source))
            return
        except ValueError as exc:
            refused.append(Refusal("/spatial_ref", f"EPSG:{code} is unknown to PROJ: {exc}", source))
            return
        self.crs_attributes = dict(attributes)  # a copy: GeoTransform is added per file

    def scaled(self, image: _Image, full: _Image) -> tuple[float, ...] | None:
        """The transform of an image whose extent is the full image's (overviews)."""
        if self.transform is None:
            return None
        a, b, c, d, e, f = self.transform
        sx, sy = full.width / image.width, full.height / image.height
        return (a * sx, b * sy, c, d * sx, e * sy, f)


@functools.lru_cache(maxsize=64)
def _epsg(code: int) -> tuple[bool, str | None, dict[str, object]]:
    """(geographic, axis units, CF attributes with ``crs_wkt`` and ``spatial_ref``) of an EPSG CRS, once
    per code: a collection's files share it, and PROJ takes milliseconds to describe one."""
    import pyproj

    try:
        crs = pyproj.CRS.from_epsg(code)
    except pyproj.exceptions.CRSError as exc:
        raise ValueError(str(exc)) from None
    unit = crs.axis_info[0].unit_name if crs.axis_info else None
    units = {"metre": "m", "meter": "m", "foot": "ft", "US survey foot": "US_survey_foot"}.get(unit, unit)
    attributes = dict(crs.to_cf())
    wkt = crs.to_wkt()
    attributes["crs_wkt"] = wkt
    attributes["spatial_ref"] = wkt
    return crs.is_geographic, units, attributes


def _geokeys(tiff: _Tiff, ifd: _Ifd) -> dict[int, object]:
    directory = tiff.values(ifd, GEO_KEY_DIRECTORY, "GeoKeyDirectoryTag")
    if directory is None:
        return {}
    directory = directory.astype(np.int64).ravel()
    if directory.size < 4 or directory.size < 4 + 4 * int(directory[3]):
        raise FormatError(f"{tiff.name}: GeoKeyDirectoryTag is shorter than the keys it announces")
    doubles = tiff.doubles(ifd, GEO_DOUBLE_PARAMS, "GeoDoubleParamsTag")
    ascii_params = tiff.text(ifd, GEO_ASCII_PARAMS, "GeoAsciiParamsTag") or ""
    keys: dict[int, object] = {}
    for key, location, count, value in directory[4 : 4 + 4 * int(directory[3])].reshape(-1, 4).tolist():
        if location == 0:
            keys[key] = value
        elif location == GEO_DOUBLE_PARAMS and doubles is not None:
            keys[key] = doubles[value : value + count].tolist()
        elif location == GEO_ASCII_PARAMS:
            keys[key] = ascii_params[value : value + count].rstrip("|\x00")
    return keys


def _transform(tiff: _Tiff, ifd: _Ifd, point: bool) -> tuple[float, ...] | None:
    matrix = tiff.doubles(ifd, MODEL_TRANSFORMATION, "ModelTransformationTag")
    scale = tiff.doubles(ifd, MODEL_PIXEL_SCALE, "ModelPixelScaleTag")
    tiepoints = tiff.doubles(ifd, MODEL_TIEPOINT, "ModelTiepointTag")
    if matrix is not None and matrix.size >= 16:
        a, b, c, d, e, f = (float(matrix[i]) for i in (0, 1, 3, 4, 5, 7))
    elif scale is not None and scale.size >= 2 and tiepoints is not None and tiepoints.size == 6:
        i, j, x, y = (float(tiepoints[k]) for k in (0, 1, 3, 4))
        a, e = float(scale[0]), -float(scale[1])
        b = d = 0.0
        c, f = x - i * a, y - j * e
    else:
        return None  # no georeferencing, or ground control points only
    if point:  # PixelIsPoint: GDAL moves the origin half a pixel, so pixel centres fall on the model points
        c, f = c - 0.5 * a - 0.5 * b, f - 0.5 * d - 0.5 * e
    return (a, b, c, d, e, f)


# ------------------------------------------------------------------------------------------- model
def _global_attributes(root: Group, bands: _BandInfo) -> None:
    for name, text in bands.dataset_items.items():
        if _valid_name(name):
            root.attrs.load({name: Attribute(name, CHAR, text)})


def _add_overview(
    root: Group,
    tiff: _Tiff,
    ifd: _Ifd,
    number: int,
    full: _Image,
    bands: _BandInfo,
    geo: _Georeference,
    refused: list[Refusal],
) -> None:
    where = f"/overview_{number}"
    try:
        image = _image(tiff, ifd)
    except NotVirtualizable as exc:
        refused.append(Refusal(where, str(exc), tiff.name))
        return
    if image.samples != full.samples or image.dtype != full.dtype or image.planar != full.planar:
        refused.append(Refusal(where, "its bands differ from the full-resolution image's", tiff.name))
        return
    group = Group(f"overview_{number}", root)
    root.groups[group.name] = group
    # dimensions of their own names: xarray's DataTree cannot align a group's x with its parent's
    _add_image(group, tiff, image, bands, geo, geo.scaled(image, full), refused, f"_overview_{number}")


def _add_image(
    group: Group,
    tiff: _Tiff,
    image: _Image,
    bands: _BandInfo,
    geo: _Georeference,
    transform: tuple[float, ...] | None,
    refused: list[Refusal],
    suffix: str = "",
) -> None:
    y = Dimension("y" + suffix, image.height, False, group)
    x = Dimension("x" + suffix, image.width, False, group)
    group.dimensions[y.name], group.dimensions[x.name] = y, x
    _xy(group, tiff.name, x, y, transform, geo)
    band_dim = group.root.dimensions.get("band")
    georeferenced = geo.crs_attributes is not None
    if image.samples > 1 and image.planar and not bands.uniform():
        for plane in range(image.samples):
            variable = _data_variable(group, f"band_{plane + 1}", (y, x), image, plane, tiff)
            _band_attributes(variable, bands, [plane], georeferenced, refused)
        return
    dims = (y, x) if image.samples == 1 else ((band_dim, y, x) if image.planar else (y, x, band_dim))
    variable = _data_variable(group, "band_data", dims, image, None, tiff)
    _band_attributes(variable, bands, list(range(image.samples)), georeferenced, refused)


def _xy(group: Group, source: str, x: Dimension, y: Dimension, transform, geo: _Georeference) -> None:
    if transform is None:
        return
    a, b, c, d, e, f = transform
    if b != 0 or d != 0:
        return  # rotated or sheared: no 1-D coordinates (GeoTransform on spatial_ref keeps it)
    for dim, start, step, axis in ((x, c, a, "X"), (y, f, e, "Y")):
        values = start + (np.arange(dim.size, dtype=np.float64) + 0.5) * step
        attrs: dict[str, object] = {"axis": axis}
        if geo.crs_attributes is not None:
            if geo.geographic:
                standard = "longitude" if axis == "X" else "latitude"
                attrs.update(
                    standard_name=standard,
                    long_name=standard,
                    units="degrees_east" if axis == "X" else "degrees_north",
                )
            else:
                attrs.update(
                    standard_name=f"projection_{axis.lower()}_coordinate",
                    long_name=f"{axis.lower()} coordinate of projection",
                )
                if geo.units:
                    attrs["units"] = geo.units
        _coordinate(group, dim.name, dim, values, source, attrs)


def _data_variable(group: Group, name: str, dims, image: _Image, plane: int | None, tiff: _Tiff):
    storage = _data_storage(tiff, image, plane)
    filters, compressor = _codecs(image, storage.chunks)
    dtype = native_dtype(image.nctype, image.dtype)
    layout = source_layout(storage.shape, storage.chunks, dtype, None, filters, compressor)
    variable = SourceVariable(group, name, dims, layout, storage)
    group.variables[name] = variable
    tiff.slots.append((variable.key, dataclasses.replace(image, offsets=None, counts=None), plane))
    return variable


def _data_storage(tiff: _Tiff, image: _Image, plane: int | None) -> Storage:
    """The tiles or strips of ``image`` (of one ``plane``, or all bands) as a variable's storage."""
    h, w, ch, cw = image.height, image.width, image.chunk_height, image.chunk_width
    if plane is not None or image.samples == 1:
        shape, chunks = (h, w), (ch, cw)
    elif image.planar:
        shape, chunks = (image.samples, h, w), (1, ch, cw)
    else:
        shape, chunks = (h, w, image.samples), (ch, cw, image.samples)
    filters, compressor = _codecs(image, chunks)
    codecs = [*filters, *([compressor] if compressor else [])]
    storage = Storage(tiff.name, "chunked", shape, chunks, codecs, read=tiff.source_read)
    _add_chunks(storage, image, plane, len(shape))
    return storage


def _codecs(image: _Image, chunks: tuple[int, ...]) -> tuple[list[dict], dict | None]:
    filters: list[dict] = []
    if image.predictor > 1:
        filters.append(
            {
                "id": "imagecodecs_delta" if image.predictor == 2 else "imagecodecs_floatpred",
                "axis": -2 if image.samples > 1 and not image.planar else -1,
                "dist": 1,
                "shape": list(chunks),
                "dtype": image.dtype.str,
            }
        )
    if image.stripped and image.height % image.chunk_height:
        filters.append({"id": "nczmap.pad", "nbytes": image.chunk_bytes})
    return filters, image.compressor


def _add_chunks(storage: Storage, image: _Image, plane: int | None, ndim: int) -> None:
    """Every allocated tile or strip (of one plane, or of all) as a chunk: corner, offset, size."""
    planes = image.samples if image.planar else 1
    corners, chosen = _chunk_grid(
        image.across, image.down, image.chunk_height, image.chunk_width, planes, plane, ndim
    )
    offsets, sizes = image.offsets, image.counts
    if image.compressor is None:
        sizes = np.minimum(sizes, _raw_sizes(image))
    if chosen is not None:
        offsets, sizes = offsets[chosen], sizes[chosen]
    keep = (offsets > 0) & (sizes > 0)
    if not keep.all():
        corners, offsets, sizes = corners[keep], offsets[keep], sizes[keep]
    storage.corners.frombytes(corners.tobytes())
    storage.offsets.frombytes(offsets.tobytes())
    storage.sizes.frombytes(sizes.tobytes())


@functools.lru_cache(maxsize=64)
def _chunk_grid(
    across: int, down: int, height: int, width: int, planes: int, plane: int | None, ndim: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """The corner of every tile or strip of an image of ``across`` x ``down`` chunks per plane, as rows of
    ``ndim`` indices: of ``plane`` (``(y, x)``), or of every plane of a planar image (``(band, y, x)``),
    or of a pixel-interleaved image (``(y, x, 0)``) or a one-band one (``(y, x)``); and which entries of
    the chunk tables they are (None: all). Kept (read-only): a collection's files share it."""
    per_plane = across * down
    chosen = None
    if plane is not None:
        chosen = np.arange(plane * per_plane, (plane + 1) * per_plane, dtype=np.int64)
        planes = 1
    index = np.arange(per_plane * planes, dtype=np.int64)
    band, within = np.divmod(index, per_plane)
    rows, cols = np.divmod(within, across)
    corner = [rows * height, cols * width]
    if ndim == 3:
        corner = [band, *corner] if plane is None and planes > 1 else [*corner, np.zeros_like(rows)]
    columns = np.stack(corner, axis=1)
    columns.flags.writeable = False
    return columns, chosen


def _band_attributes(variable, bands: _BandInfo, planes: list[int], georeferenced: bool, refused) -> None:
    attrs: dict[str, Attribute] = {}
    nctype = variable.layout.dtype.nctype
    source = variable.storages[0].source
    if bands.fill is not None:
        variable.layout.fill = bands.fill
        attrs["_FillValue"] = Attribute("_FillValue", nctype, np.array([bands.fill], dtype=nctype.numpy))
    elif bands.fill_problem:
        refused.append(Refusal(variable.key, bands.fill_problem, source, "_FillValue"))
    if georeferenced:
        attrs["grid_mapping"] = Attribute("grid_mapping", CHAR, "spatial_ref")
    selected = [bands.per_band[p] for p in planes]
    descriptions = [band.get("long_name") for band in selected]
    if any(descriptions):
        text = [d or "" for d in descriptions]
        attrs["long_name"] = (
            Attribute("long_name", CHAR, text[0]) if len(text) == 1 else _strings("long_name", text)
        )
    names = sorted({k for band in selected for k in band} - {"long_name"})
    for name in names:
        values = [band.get(name) for band in selected]
        if all(v == values[0] for v in values):
            if _valid_name(name):
                attrs[name] = _attribute(name, values[0])
            continue
        if name in ("scale_factor", "add_offset"):
            default = 1.0 if name == "scale_factor" else 0.0
            filled = [default if v is None else v for v in values]
            attrs[f"band_{name}"] = Attribute(f"band_{name}", DOUBLE, np.array(filled, dtype=np.float64))
        reason = f"its bands differ in {name} ({values}) and share their chunks (pixel-interleaved)"
        refused.append(Refusal(variable.key, reason, source, name))
    variable.attrs.load(attrs)


# ---------------------------------------------------------------------------------------- helpers
def _attribute(name: str, value: object) -> Attribute:
    if isinstance(value, str):
        return Attribute(name, CHAR, value)
    if isinstance(value, bool | int | np.integer) and not isinstance(value, bool):
        kind = INT if -(1 << 31) < int(value) < (1 << 31) else BY_NAME["int64"]
        return Attribute(name, kind, np.array([value], dtype=kind.numpy))
    if isinstance(value, list | tuple):
        return Attribute(name, DOUBLE, np.array(value, dtype=np.float64))
    return Attribute(name, DOUBLE, np.array([float(value)], dtype=np.float64))


def _strings(name: str, values: list[str]) -> Attribute:
    return Attribute(name, STRING, list(values))


def _valid_name(name: str) -> bool:
    return bool(name) and "/" not in name and not name.startswith(("_", ".")) and name.isprintable()


def _values_layout(values: np.ndarray, nctype: NCType) -> ArrayLayout:
    shape = values.shape
    return source_layout(
        shape, tuple(max(1, n) for n in shape), native_dtype(nctype, values.dtype), scalar=not shape
    )


def _coordinate(
    group: Group, name: str, dim: Dimension, values: np.ndarray, source: str, attrs: dict
) -> None:
    nctype = type_of_numpy(values.dtype)
    storage = Storage(source, "values", values.shape, values=Constant(values))
    variable = SourceVariable(group, name, [dim], _values_layout(values, nctype), storage)
    variable.attrs.load({k: _attribute(k, v) for k, v in attrs.items()})
    group.variables[name] = variable


def _scalar_variable(group: Group, name: str, source: str, attrs: dict[str, object]) -> None:
    values = np.array(0, dtype=np.int32)
    storage = Storage(source, "values", (), values=Constant(values))
    variable = SourceVariable(group, name, [], _values_layout(values, INT), storage)
    variable.attrs.load({k: _attribute(k, v) for k, v in attrs.items()})
    group.variables[name] = variable
