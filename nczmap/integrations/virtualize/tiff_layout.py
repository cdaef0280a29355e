"""How a TIFF image's pixels are stored: its sample type, compression and predictor, its tiles or strips
and their offset and byte-count tables, as a variable's chunked :class:`~.parsed.Storage`.

Tiles are chunks; strips are chunks of RowsPerStrip whole rows (a last strip shorter than that is padded
by the ``nczmap.pad`` filter); sparse tiles or strips (offset or byte count 0) are missing chunks. Codecs
are the ids tifffile's ``write_fsspec`` and kerchunk write (see :mod:`.tiff`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from nczmap.errors import FormatError
from nczmap.format.types import NCType, type_of_numpy
from nczmap.integrations.virtualize.parsed import NotVirtualizable, Storage
from nczmap.integrations.virtualize.tiff_ifds import (
    BITS_PER_SAMPLE,
    COMPRESSION,
    FILL_ORDER,
    IMAGE_LENGTH,
    IMAGE_WIDTH,
    PHOTOMETRIC,
    PLANAR_CONFIGURATION,
    PREDICTOR,
    ROWS_PER_STRIP,
    SAMPLE_FORMAT,
    SAMPLES_PER_PIXEL,
    STRIP_BYTE_COUNTS,
    STRIP_OFFSETS,
    TILE_BYTE_COUNTS,
    TILE_LENGTH,
    TILE_OFFSETS,
    TILE_WIDTH,
    Ifd,
    TiffReader,
)

MAX_CHUNK_BYTES = 1 << 31  # a decoded tile or strip larger than this is absurd

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


def table_tags(stripped: bool) -> tuple[int, int]:
    """The tags of the offsets and byte counts of an image's strips or tiles."""
    return (STRIP_OFFSETS, STRIP_BYTE_COUNTS) if stripped else (TILE_OFFSETS, TILE_BYTE_COUNTS)


@dataclass
class Image:
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


def read_image(tiff: TiffReader, ifd: Ifd) -> Image:
    """The image of ``ifd`` with its chunk tables (NotVirtualizable if no codec reads its pixels)."""
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
    image = Image(
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


def _tables(tiff: TiffReader, ifd: Ifd, image: Image) -> Image:
    """``image`` with its tile or strip offsets and byte counts, read from ``ifd`` and checked."""
    tags = table_tags(image.stripped)
    expected = image.across * image.down * (image.samples if image.planar else 1)
    image.offsets = _chunk_table(tiff, ifd, tags[0], expected, f"{image.label} offsets")
    image.counts = _chunk_table(tiff, ifd, tags[1], expected, f"{image.label} byte counts")
    check_chunks(tiff, image, image.label)
    return image


def _sample_type(tiff: TiffReader, ifd: Ifd, samples: int) -> tuple[np.dtype, NCType]:
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


def _compression(tiff: TiffReader, ifd: Ifd, dtype: np.dtype) -> tuple[dict | None, int]:
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


def _chunk_table(tiff: TiffReader, ifd: Ifd, tag: int, expected: int, what: str) -> np.ndarray:
    entry = ifd.entries.get(tag)
    if entry is None:
        raise FormatError(f"{tiff.name}: the image has no {what} (tag {tag})")
    if entry[1] != expected:
        raise FormatError(f"{tiff.name}: {entry[1]} {what} for an image of {expected}")
    return table_values(tiff, tiff.values(ifd, tag, what), what)


def table_values(tiff: TiffReader, values: np.ndarray, what: str) -> np.ndarray:
    if values.dtype.kind not in "iu" or values.ndim != 1:
        raise FormatError(f"{tiff.name}: the {what} are not integers")
    if values.dtype == np.uint64 and values.size and int(values.max()) >= 1 << 62:
        raise FormatError(f"{tiff.name}: {what} beyond any file size")
    return values.astype(np.int64)


def check_chunks(tiff: TiffReader, image: Image, label: str) -> None:
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
        needed = raw_sizes(image)
        short = np.flatnonzero(present & (image.counts < needed))
        if short.size:
            i = int(short[0])
            raise FormatError(
                f"{tiff.name}: uncompressed {label} {i} has {int(image.counts[i])} bytes, "
                f"{int(needed[i])} needed"
            )


def raw_sizes(image: Image) -> np.ndarray:
    """The decoded bytes each tile or strip holds (a last strip holds only the rows left)."""
    full = np.full(image.offsets.shape, image.chunk_bytes, np.int64)
    if image.stripped and image.height % image.chunk_height:
        row_bytes = image.chunk_bytes // image.chunk_height
        last = (image.height % image.chunk_height) * row_bytes
        full.reshape(-1, image.down)[:, -1] = last
    return full


# ------------------------------------------------------------------------------------------ chunks
def data_storage(tiff: TiffReader, image: Image, plane: int | None) -> Storage:
    """The tiles or strips of ``image`` (of one ``plane``, or all bands) as a variable's storage."""
    h, w, ch, cw = image.height, image.width, image.chunk_height, image.chunk_width
    if plane is not None or image.samples == 1:
        shape, chunks = (h, w), (ch, cw)
    elif image.planar:
        shape, chunks = (image.samples, h, w), (1, ch, cw)
    else:
        shape, chunks = (h, w, image.samples), (ch, cw, image.samples)
    filters, compressor = image_codecs(image, chunks)
    codecs = [*filters, *([compressor] if compressor else [])]
    storage = Storage(tiff.name, "chunked", shape, chunks, codecs, read=tiff.source_read)
    _add_chunks(storage, image, plane, len(shape))
    return storage


def image_codecs(image: Image, chunks: tuple[int, ...]) -> tuple[list[dict], dict | None]:
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


def _add_chunks(storage: Storage, image: Image, plane: int | None, ndim: int) -> None:
    """Every allocated tile or strip (of one plane, or of all) as a chunk: corner, offset, size."""
    planes = image.samples if image.planar else 1
    corners, chosen = _chunk_grid(
        image.across, image.down, image.chunk_height, image.chunk_width, planes, plane, ndim
    )
    offsets, sizes = image.offsets, image.counts
    if image.compressor is None:
        sizes = np.minimum(sizes, raw_sizes(image))
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
