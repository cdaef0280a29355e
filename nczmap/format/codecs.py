"""Zarr v2 codec chains (``filters`` then ``compressor``) through numcodecs, imported only when needed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from nczmap.errors import FormatError


@dataclass
class CodecChain:
    """The encode order is ``filters`` then ``compressor``; decoding runs it backwards."""

    filters: list[dict] = field(default_factory=list)
    compressor: dict | None = None
    itemsize: int = 1
    _codecs: list | None = field(default=None, repr=False)

    @property
    def configs(self) -> list[dict]:
        return [*self.filters, *([self.compressor] if self.compressor else [])]

    def _instances(self, where: str) -> list:
        if self._codecs is None:
            self._codecs = [self._make(config, where) for config in self.configs]
        return self._codecs

    def _make(self, config: dict, where: str):
        import numcodecs

        config = dict(config)
        if config.get("id") in _PREFERRED:  # nczmap's own reads as the source's own reader does
            return _preferred_codec(config, where)
        if config.get("id") == "shuffle" and not config.get("elementsize"):
            config["elementsize"] = self.itemsize  # netcdf-c 4.10 writes 0, meaning "the type's size"
        try:
            return numcodecs.get_codec(config)
        except (ValueError, KeyError, TypeError) as exc:
            own = _own_codec(config)  # TIFF's codecs when imagecodecs-numcodecs is not installed
            if own is not None:
                return own
            raise FormatError(
                f"{where} has unsupported codec: ({config.get('id')}): numcodecs cannot make it from "
                f"{json.dumps(config, default=repr)[:200]}: {exc}"
            ) from exc

    def decode(self, data: bytes, where: str, limit: int | None = None):
        """The decoded bytes as a buffer (bytes or a numpy array).

        ``limit`` (the chunk's size in bytes) bounds every stage: a compressed chunk that would inflate
        beyond it fails before the memory is taken, as a zip bomb of a chunk should. Stages before the last
        filter may be a little larger (fletcher32 adds a checksum), so the bound has a margin; the caller
        checks the final size exactly.
        """
        if limit is not None:
            limit += max(1 << 16, limit // 8)
        for codec, config in reversed(list(zip(self._instances(where), self.configs, strict=True))):
            name = config.get("id")
            try:
                data = _bounded_decode(codec, name, data, limit)
            except FormatError as exc:
                raise FormatError(f"cannot decode {where} with {name}: {exc}") from None
            except Exception as exc:  # numcodecs raises many unrelated types on corrupt input
                raise FormatError(f"cannot decode {where} with {name}: {exc}") from exc
            if limit is not None and memoryview(data).nbytes > limit:
                raise FormatError(f"cannot decode {where} with {name}: more than the chunk's {limit} bytes")
        return data

    def encode(self, data: bytes, where: str) -> bytes:
        for codec in self._instances(where):
            data = codec.encode(data)
        return bytes(data) if not isinstance(data, bytes) else data


# What each codec's options must be, where numcodecs would take anything and fail later (or never): option
# -> (kind, low, high) for integers, or the set of allowed values.
_INT = "int"
_TEXT = "text"
_FLOAT_TYPE = "float type"
_OPTIONS: dict[str, dict[str, tuple]] = {
    "zlib": {"level": (_INT, -1, 9)},
    "gzip": {"level": (_INT, -1, 9)},
    "zstd": {"level": (_INT, -(1 << 17), 22)},
    "bz2": {"level": (_INT, 1, 9)},
    "lz4": {"acceleration": (_INT, 1, 1 << 16)},
    "shuffle": {"elementsize": (_INT, 0, 1 << 16)},
    "blosc": {
        "clevel": (_INT, 0, 9),
        "shuffle": (_INT, -1, 2),
        "blocksize": (_INT, 0, 1 << 31),
        "typesize": (_INT, 0, 255),
        "cname": ({"blosclz", "lz4", "lz4hc", "snappy", "zlib", "zstd"},),
    },
    "szip": {"mask": (_INT, 0, 1 << 16), "pixels-per-block": (_INT, 0, 1 << 16)},
    "grib": {"var": (_TEXT,), "dtype": (_FLOAT_TYPE,)},
}


def check_codecs(configs: list[dict], where: str) -> None:
    """FormatError naming ``where`` (the array) and the codec unless every config is one numcodecs (or
    nczmap) can make, with options of the types and ranges it takes: checked where metadata is read, so
    that neither decoding nor reporting an encoding fails later on a malformed option."""
    for config in configs:
        name = config.get("id")
        if not isinstance(name, str) or not name:
            raise FormatError(f"{where}: a codec's id must be a name, not {name!r}")
        short = name.removeprefix("numcodecs.")
        for option, rule in _OPTIONS.get(short, {}).items():
            if option in config:
                _check_option(config[option], rule, f"{where}: codec {short} option {option}")


def _check_option(value: object, rule: tuple, where: str) -> None:
    if rule[0] == _TEXT:
        if not isinstance(value, str):
            raise FormatError(f"{where} is {value!r}, not a name")
    elif rule[0] == _FLOAT_TYPE:
        if value is not None and not _is_float_type(value):
            raise FormatError(f"{where} is {value!r}, not a floating-point type")
    elif rule[0] == _INT:
        _, low, high = rule
        if type(value) is not int or not low <= value <= high:  # type(): a bool is no level
            raise FormatError(f"{where} is {value!r}, not an integer from {low} to {high}")
    elif not isinstance(value, str) or value not in rule[0]:
        raise FormatError(f"{where} is {value!r}, not one of {sorted(rule[0])}")


def _is_float_type(value: object) -> bool:
    import numpy as np

    if not isinstance(value, str):
        return False
    try:
        return np.dtype(value).kind == "f"
    except TypeError:
        return False


def _preferred_codec(config: dict, where: str):
    """A codec nczmap implements itself even when numcodecs knows its id (``grib``: kerchunk's reads
    missing points differently from cfgrib)."""
    options = {k: v for k, v in config.items() if k != "id"}
    try:
        return _PREFERRED[config["id"]](**options)
    except (ValueError, TypeError) as exc:
        raise FormatError(f"{where} has unsupported codec: ({config['id']}): {exc}") from exc


def _grib(**options):
    from nczmap.format.gribcodec import Grib

    return Grib(**options)


_PREFERRED = {"grib": _grib}


def _own_codec(config: dict):
    """nczmap's implementation of a codec numcodecs does not know (None: there is none)."""
    from nczmap.format import tiffcodecs

    if config.get("id") not in tiffcodecs.CODECS:
        return None
    try:
        return tiffcodecs.get_codec(config)
    except (ValueError, TypeError):
        return None


_ZLIB_WINDOWS = {"zlib": 15, "gzip": 31}
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_PIECE = 1 << 20  # a frame without its size is measured this much at a time


def _bounded_decode(codec, name: str | None, data, limit: int | None):
    """``codec.decode(data)``, refusing output beyond ``limit`` bytes without producing it first."""
    if limit is None:
        return codec.decode(data)
    if name in _ZLIB_WINDOWS:
        import zlib

        inflater = zlib.decompressobj(_ZLIB_WINDOWS[name])
        out = inflater.decompress(data, limit + 1)
        if len(out) > limit or inflater.unconsumed_tail:
            raise FormatError(f"it inflates beyond the chunk's {limit} bytes")
        return out
    if hasattr(codec, "decode_limited"):  # nczmap's own LZW and PackBits stop at the limit
        return codec.decode_limited(data, limit)
    if name in _STREAMS:
        return _decode_streams(lambda: _STREAMS[name](codec), data, limit)
    claimed = _claimed_size(name, data)
    if claimed is not None and claimed > limit:
        raise FormatError(f"it claims {claimed} bytes, more than the chunk's {limit}")
    if name == "zstd" and claimed is None:  # no size in the frame header: numcodecs would inflate it all
        return _decode_zstd_bounded(data, limit)
    return codec.decode(data)


def _bz2_decompressor(codec):
    import bz2

    return bz2.BZ2Decompressor()


def _lzma_decompressor(codec):
    import lzma

    return lzma.LZMADecompressor(
        format=getattr(codec, "format", lzma.FORMAT_AUTO), filters=getattr(codec, "filters", None)
    )


_STREAMS = {"bz2": _bz2_decompressor, "lzma": _lzma_decompressor}


def _decode_streams(make, data, limit: int) -> bytes:
    """Concatenated streams, as ``bz2.decompress`` and ``lzma.decompress`` read them, but never producing
    more than ``limit`` + 1 bytes: the output limit of the streaming decoder, not a check afterwards."""
    rest = memoryview(data).cast("B")
    out = bytearray()
    while True:
        decompressor = make()
        try:
            out += decompressor.decompress(rest, limit + 1 - len(out))
        except Exception:
            if out:  # trailing bytes that are no stream are ignored, as the one-shot functions do
                return bytes(out)
            raise
        if len(out) > limit:
            raise FormatError(f"it inflates beyond the chunk's {limit} bytes")
        if not decompressor.eof:
            raise FormatError("the compressed data end before the end-of-stream marker")
        rest = decompressor.unused_data
        if not rest:
            return bytes(out)


def _decode_zstd_bounded(data, limit: int) -> bytes:
    """zstd frames (concatenated, as numcodecs reads them) decoded in pieces, refused past ``limit``
    bytes (``zstandard``'s reader stops at any size; numcodecs has no output limit). The output is the
    decoded chunk: decoding once, not measuring and then decoding again."""
    import zstandard

    reader = zstandard.ZstdDecompressor().stream_reader(bytes(data), read_across_frames=True)
    out = bytearray()
    with reader:
        while len(out) <= limit:
            piece = reader.read(min(limit + 1 - len(out), _ZSTD_PIECE))
            if not piece:
                return bytes(out)
            out += piece
    raise FormatError(f"it inflates beyond the chunk's {limit} bytes")


def _claimed_size(name: str | None, data) -> int | None:
    """The decoded size a blosc, lz4 or zstd frame announces in its header (None if it announces none)."""
    raw = memoryview(data).cast("B")
    if name == "blosc" and len(raw) >= 16:
        return int.from_bytes(raw[4:8], "little")
    if name == "lz4" and len(raw) >= 4:  # numcodecs' LZ4 allocates the size its first 4 bytes give
        return int.from_bytes(raw[:4], "little")
    if name == "zstd" and len(raw) >= 6 and bytes(raw[:4]) == _ZSTD_MAGIC:
        descriptor = raw[4]
        size_flag, single = descriptor >> 6, (descriptor >> 5) & 1
        width = (0 if not single else 1, 2, 4, 8)[size_flag]
        if not width:
            return None
        start = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
        if len(raw) < start + width:
            return None
        value = int.from_bytes(raw[start : start + width], "little")
        return value + 256 if width == 2 else value
    return None
