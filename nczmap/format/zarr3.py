"""Zarr v3 (``zarr.json``) metadata: read as pure Zarr, written for ``#mode=zarr,v3``.

Reading maps a v3 array onto the same :class:`ArrayLayout` as a v2 one: ``data_type`` to a netCDF type,
the ``bytes`` codec's endian to the storage dtype, ``transpose`` to a memory order, the bytes-to-bytes
codecs (``gzip``, ``zstd``, ``blosc``, ``crc32c``, ``numcodecs.*``) to a numcodecs chain, the chunk key
encoding to a key prefix and separator, and ``sharding_indexed`` to a :class:`ShardLayout` (read only).
``dimension_names`` name netCDF dimensions as ``_ARRAY_DIMENSIONS`` does in pure Zarr v2.

Types: ``bool`` reads as ubyte; ``string`` (vlen-utf8) and ``fixed_length_utf32`` as string;
``null_terminated_bytes`` of one byte as char, longer as string (as ``|S<n>`` in pure Zarr v2).
Writing: numbers as their v3 names, string as ``string`` + ``vlen-utf8`` and char as
``null_terminated_bytes`` of length 1, both of which zarr-python 3.1 and xarray read. float16, complex,
variable-length bytes, datetimes and raw bits are refused: netCDF has no such types.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import struct
from dataclasses import dataclass
from typing import Any

from nczmap.errors import FormatError
from nczmap.format.codecs import CodecChain, check_codecs
from nczmap.format.types import BY_LETTER, CHAR, STRING, NCType, ParsedDtype, check_rank, convert_value
from nczmap.format.variable import ArrayLayout, PendingFill
from nczmap.format.zarr3_shard import ShardLayout

ZARR_JSON = "zarr.json"
_NUMBERS = {
    "bool": ("u1", "b1"),
    **{f"int{8 * n}": (f"i{n}", f"i{n}") for n in (1, 2, 4, 8)},
    **{f"uint{8 * n}": (f"u{n}", f"u{n}") for n in (1, 2, 4, 8)},
    "float32": ("f4", "f4"),
    "float64": ("f8", "f8"),
}
_V3_NAME = {letter: name for name, (letter, stored) in _NUMBERS.items() if letter == stored}
_BLOSC_SHUFFLES = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
_COMPRESSORS = ("gzip", "zstd", "blosc")
CONSOLIDATED_KIND = {"kind": "inline", "must_understand": False}


# ============================================================================ reading
@dataclass(frozen=True)
class _Type:
    nctype: NCType
    base: str  # numpy dtype body without byte order ("i4", "b1", "S5", "U3"); "" for vlen strings
    vlen: bool = False


@dataclass(frozen=True)
class _Codecs:
    """One codec list parsed: endian of the bytes codec, transpose, the bytes-to-bytes chain, shards."""

    endian: str | None
    transpose: tuple[int, ...] | None
    chain: CodecChain
    shards: Any  # a ShardLayout, whose ``inner`` is the inner chunks' _Codecs


def node_type(meta: object, key: str) -> str:
    """``group`` or ``array`` for a ``zarr.json`` document; FormatError for anything else."""
    if not isinstance(meta, dict):
        raise FormatError(f"{key!r} must hold a JSON object")
    if meta.get("zarr_format") != 3:
        raise FormatError(f"{key!r}: zarr_format {meta.get('zarr_format')!r} is not 3")
    kind = meta.get("node_type")
    if kind not in ("group", "array"):
        raise FormatError(f"{key!r}: node_type {kind!r} is neither 'group' nor 'array'")
    return kind


def attributes(meta: dict, key: str) -> dict:
    found = meta.get("attributes", {})
    if not isinstance(found, dict):
        raise FormatError(f"{key!r}: attributes must be a JSON object, not {type(found).__name__}")
    return found


def consolidated_entries(root: dict) -> dict | None:
    """The root's consolidated metadata (zarr-python's ``consolidated_metadata``): node path -> zarr.json."""
    found = root.get("consolidated_metadata")
    entries = found.get("metadata") if isinstance(found, dict) else None
    if not isinstance(entries, dict) or found.get("kind", "inline") != "inline":
        return None
    return entries


def dimension_names(meta: dict, rank: int, key: str) -> list[str | None]:
    names = meta.get("dimension_names")
    if names is None:
        return [None] * rank
    if (
        not isinstance(names, list)
        or len(names) != rank
        or not all(n is None or isinstance(n, str) for n in names)
    ):
        raise FormatError(f"array {key!r}: dimension_names {names!r} do not name its {rank} dimensions")
    return [n or None for n in names]


def parse_array(meta: dict, key: str) -> ArrayLayout:
    """The layout of the v3 array whose ``zarr.json`` is ``meta`` (``key`` names the array)."""
    if node_type(meta, key) != "array":
        raise FormatError(f"{key!r} is not an array")
    shape = meta.get("shape")
    if not _int_list(shape):
        raise FormatError(f"array {key!r}: bad shape {shape!r}")
    check_rank(shape, key)
    chunks = _chunk_grid(meta.get("chunk_grid"), len(shape), key)
    kind = _data_type(meta.get("data_type"), key)
    if meta.get("storage_transformers"):
        raise FormatError(f"array {key!r}: storage transformers are not supported")
    prefix, separator = _key_encoding(meta.get("chunk_key_encoding"), key)
    codecs = _codec_list(meta.get("codecs"), kind, tuple(chunks), key, sharding_allowed=True)
    inner = codecs
    if codecs.shards is not None:
        inner = codecs.shards.inner
        chunks = list(codecs.shards.inner_chunks)
    dtype = _parsed_dtype(kind, inner.endian)
    fill = parse_fill(meta.get("fill_value"), kind, key)
    scalar = not shape
    order, transpose = _order(inner.transpose, len(shape))
    return ArrayLayout(
        tuple(shape) or (1,),
        tuple(chunks) or (1,),
        dtype,
        fill,
        inner.chain,
        separator,
        order,
        scalar=scalar,
        key_prefix=prefix,
        transpose=transpose,
        shards=codecs.shards,
        vlen=kind.vlen,
        zarr3=meta,
    )


def _int_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 for v in value
    )


def _config(item: object, what: str, key: str) -> tuple[str, dict]:
    """(name, configuration) of a ``{"name": ..., "configuration": {...}}`` object (or a bare name)."""
    if isinstance(item, str):
        return item, {}
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise FormatError(f"array {key!r}: {what} must be an object with a name, not {item!r}")
    config = item.get("configuration", {})
    if not isinstance(config, dict):
        raise FormatError(f"array {key!r}: configuration of {what} {item['name']!r} must be an object")
    return item["name"], config


def _chunk_grid(grid: object, rank: int, key: str) -> list[int]:
    name, config = _config(grid, "chunk_grid", key)
    if name != "regular":
        raise FormatError(f"array {key!r}: chunk grid {name!r} is not supported (only 'regular')")
    chunks = config.get("chunk_shape")
    if not _int_list(chunks) or len(chunks) != rank or 0 in chunks:
        raise FormatError(f"array {key!r}: bad chunk_shape {chunks!r} for {rank} dimensions")
    return chunks


def _data_type(spec: object, key: str) -> _Type:
    name, config = _config(spec, "data_type", key)
    if name in _NUMBERS:
        letter, stored = _NUMBERS[name]
        return _Type(BY_LETTER[letter], stored)
    if name == "string":
        return _Type(STRING, "", vlen=True)
    if name in ("null_terminated_bytes", "fixed_length_utf32"):
        length = config.get("length_bytes")
        unit = 4 if name == "fixed_length_utf32" else 1
        if not isinstance(length, int) or isinstance(length, bool) or length < unit or length % unit:
            raise FormatError(f"array {key!r}: data type {name!r} has a bad length_bytes {length!r}")
        if unit == 4:
            return _Type(STRING, f"U{length // 4}")
        return _Type(CHAR, "S1") if length == 1 else _Type(STRING, f"S{length}")
    raise FormatError(f"array {key!r}: data type {name!r} has no netCDF equivalent (not supported)")


def _parsed_dtype(kind: _Type, endian: str | None) -> ParsedDtype:
    if kind.vlen:
        return ParsedDtype(STRING, "|O8", False, 0)
    if kind.nctype is CHAR:
        return ParsedDtype(CHAR, "S1", False)
    size = int(kind.base[1:]) * (4 if kind.base[0] == "U" else 1)
    multi = size > 1 and kind.base[0] not in "S"
    order = {"big": ">", "little": "<"}.get(endian or "", "<") if multi else "|"
    maxstrlen = int(kind.base[1:]) if kind.nctype is STRING else 0
    return ParsedDtype(kind.nctype, order + kind.base, multi and kind.base[0] != "U", maxstrlen)


def _key_encoding(encoding: object, key: str) -> tuple[str, str]:
    """(key prefix, separator): ``default`` keys are ``c/0/0`` (scalars ``c``), ``v2`` keys ``0.0``."""
    if encoding is None:
        return "c", "/"
    name, config = _config(encoding, "chunk_key_encoding", key)
    if name not in ("default", "v2"):
        raise FormatError(f"array {key!r}: chunk key encoding {name!r} is not supported")
    separator = config.get("separator", "/" if name == "default" else ".")
    if separator not in ("/", "."):
        raise FormatError(f"array {key!r}: chunk key separator {separator!r} is neither '/' nor '.'")
    return ("c" if name == "default" else ""), separator


def _codec_list(
    codecs: object, kind: _Type, chunks: tuple[int, ...], key: str, sharding_allowed: bool
) -> _Codecs:
    if not isinstance(codecs, list) or not codecs:
        raise FormatError(f"array {key!r}: codecs must be a non-empty list, not {codecs!r}")
    parsed = [_config(item, "codec", key) for item in codecs]
    position = 0
    transpose = None
    while position < len(parsed) and parsed[position][0] == "transpose":
        if transpose is not None:
            raise FormatError(f"array {key!r}: more than one transpose codec is not supported")
        transpose = _transpose(parsed[position][1], len(chunks), key)
        position += 1
    if position == len(parsed):
        raise FormatError(f"array {key!r}: its codecs have no array-to-bytes codec (bytes, vlen-utf8, ...)")
    name, config = parsed[position]
    endian, shards = None, None
    if name == "bytes":
        if kind.vlen:
            raise FormatError(f"array {key!r}: a string array needs the vlen-utf8 codec, not bytes")
        endian = config.get("endian", "little")
        if endian not in ("little", "big"):
            raise FormatError(f"array {key!r}: bytes codec endian {endian!r} is neither 'little' nor 'big'")
    elif name == "vlen-utf8":
        if not kind.vlen:
            raise FormatError(f"array {key!r}: codec vlen-utf8 only serialises the string data type")
    elif name == "sharding_indexed" and not sharding_allowed:
        raise FormatError(f"array {key!r}: sharding_indexed inside sharding_indexed is not supported")
    elif name == "sharding_indexed":
        if not chunks:
            raise FormatError(f"array {key!r}: a sharded scalar array is not supported")
        if transpose is not None:
            raise FormatError(f"array {key!r}: transpose before sharding_indexed is not supported")
        shards = _sharding(config, kind, chunks, key)
    else:
        raise FormatError(
            f"array {key!r}: unsupported codec {name!r} (where an array-to-bytes codec belongs)"
        )
    chain = _bytes_codecs(parsed[position + 1 :], kind, key)
    if shards is not None and chain.configs:
        raise FormatError(f"array {key!r}: codecs after sharding_indexed are not supported")
    return _Codecs(endian, transpose, chain, shards)


def _transpose(config: dict, rank: int, key: str) -> tuple[int, ...]:
    order = config.get("order")
    if not _int_list(order) or sorted(order) != list(range(rank)):
        raise FormatError(f"array {key!r}: transpose order {order!r} is no permutation of {rank} axes")
    return tuple(order)


def _bytes_codecs(items: list[tuple[str, dict]], kind: _Type, key: str) -> CodecChain:
    """The bytes-to-bytes codecs as a numcodecs chain; the last one is the compressor when it compresses."""
    itemsize = 1 if kind.vlen else max(1, int(kind.base[1:] or 1))
    configs = [_numcodecs_config(name, config, itemsize, key) for name, config in items]
    check_codecs(configs, f"array {key!r}")
    compressor = configs.pop() if configs and items[-1][0] in _COMPRESSORS else None
    return CodecChain(configs, compressor, itemsize)


def _numcodecs_config(name: str, config: dict, itemsize: int, key: str) -> dict:
    if name == "gzip":
        return {"id": "gzip", "level": _int_option(config, "level", 5, key)}
    if name == "zstd":
        return {
            "id": "zstd",
            "level": _int_option(config, "level", 0, key),
            "checksum": bool(config.get("checksum", False)),
        }
    if name == "blosc":
        shuffle = config.get("shuffle", "noshuffle")
        if shuffle not in _BLOSC_SHUFFLES or not isinstance(config.get("cname", "lz4"), str):
            raise FormatError(f"array {key!r}: bad blosc configuration {config!r}")
        return {
            "id": "blosc",
            "cname": config.get("cname", "lz4"),
            "clevel": _int_option(config, "clevel", 5, key),
            "shuffle": _BLOSC_SHUFFLES[shuffle],
            "blocksize": _int_option(config, "blocksize", 0, key),
            "typesize": _int_option(config, "typesize", itemsize, key),
        }
    if name == "crc32c":
        return {"id": "crc32c"}
    if name.startswith("numcodecs.") and len(name) > len("numcodecs."):
        return {**config, "id": name[len("numcodecs.") :]}
    raise FormatError(f"array {key!r}: unsupported codec {name!r}")


def _int_option(config: dict, name: str, default: int, key: str) -> int:
    value = config.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FormatError(f"array {key!r}: codec option {name}={value!r} is not an integer")
    return value


def _order(transpose: tuple[int, ...] | None, rank: int) -> tuple[str, tuple[int, ...] | None]:
    """The memory order a transpose amounts to: C (none), F (all axes reversed), or the permutation."""
    if transpose is None or transpose == tuple(range(rank)):
        return "C", None
    if transpose == tuple(reversed(range(rank))):
        return "F", None
    return "C", transpose


# ---------------------------------------------------------------------------- sharding
def _sharding(config: dict, kind: _Type, shard: tuple[int, ...], key: str) -> ShardLayout:
    inner_chunks = config.get("chunk_shape")
    if (
        not _int_list(inner_chunks)
        or len(inner_chunks) != len(shard)
        or 0 in inner_chunks
        or any(s % c for s, c in zip(shard, inner_chunks, strict=True))
    ):
        raise FormatError(
            f"array {key!r}: sharding chunk_shape {inner_chunks!r} does not divide {list(shard)}"
        )
    inner = _codec_list(config.get("codecs"), kind, tuple(inner_chunks), key, sharding_allowed=False)
    location = config.get("index_location", "end")
    if location not in ("start", "end"):
        raise FormatError(f"array {key!r}: sharding index_location {location!r} is neither start nor end")
    endian, checksum = _index_codecs(config.get("index_codecs"), key)
    return ShardLayout(tuple(shard), tuple(inner_chunks), endian, checksum, location == "end", inner)


def _index_codecs(codecs: object, key: str) -> tuple[str, bool]:
    """The shard index's codecs: ``bytes`` (any endian) optionally followed by ``crc32c``."""
    if not isinstance(codecs, list):
        raise FormatError(f"array {key!r}: sharding index_codecs must be a list, not {codecs!r}")
    parsed = [_config(item, "index codec", key) for item in codecs]
    names = [name for name, _ in parsed]
    if names not in (["bytes"], ["bytes", "crc32c"]):
        raise FormatError(
            f"array {key!r}: sharding index_codecs {names} are not supported (bytes [+ crc32c])"
        )
    endian = parsed[0][1].get("endian", "little")
    if endian not in ("little", "big"):
        raise FormatError(f"array {key!r}: sharding index endian {endian!r} is neither 'little' nor 'big'")
    return endian, len(names) == 2


# ---------------------------------------------------------------------------- fill values
def parse_fill(value: object, kind: _Type, key: str) -> object:
    if value is None:
        return None
    where = f"fill_value of {key!r}"
    if kind.nctype is CHAR:
        return (_base64_bytes(value, where)[:1]) or b"\x00"
    if kind.nctype is STRING:
        if kind.base.startswith("S"):
            return _base64_bytes(value, where).split(b"\x00", 1)[0].decode("utf-8", "replace")
        if not isinstance(value, str):
            raise FormatError(f"{where}: {value!r} is not a string")
        return value
    nctype = kind.nctype
    if kind.base == "b1":
        if not isinstance(value, bool):
            raise FormatError(f"{where}: {value!r} is not a boolean")
        number: object = int(value)
    elif isinstance(value, str) and value.lower().startswith("0x") and nctype.letter[0] == "f":
        number = _hex_float(value, nctype, where)
    else:
        number = convert_value(value, nctype, where)
    return PendingFill(functools.partial(nctype.numpy.type, number))  # picklable: parsed elsewhere


def _base64_bytes(value: object, where: str) -> bytes:
    if not isinstance(value, str):
        raise FormatError(f"{where}: {value!r} is not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value.encode("utf-8", "replace")


def _hex_float(text: str, nctype: NCType, where: str) -> float:
    """A float given by its bits: ``"0x7fc00000"`` is a float32 NaN."""
    size = nctype.numpy.itemsize
    try:
        raw = bytes.fromhex(text[2:])
    except ValueError:
        raise FormatError(f"{where}: {text!r} is not a hexadecimal float") from None
    if len(raw) != size:
        raise FormatError(f"{where}: {text!r} does not have the {size} bytes of a {nctype.name}")
    return struct.unpack(">f" if size == 4 else ">d", raw)[0]


def xarray_fill_attribute(value: object, nctype: NCType) -> object:
    """xarray's v3 ``_FillValue`` attribute of a float variable: base64 of a little-endian double."""
    if nctype.letter[:1] != "f" or not isinstance(value, str):
        return value
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value
    return struct.unpack("<d", raw)[0] if len(raw) == 8 else value


# ============================================================================ writing
def group_json(attrs: dict, consolidated: dict | None = None) -> dict:
    meta: dict = {"zarr_format": 3, "node_type": "group", "attributes": attrs}
    if consolidated is not None:
        meta["consolidated_metadata"] = {**CONSOLIDATED_KIND, "metadata": consolidated}
    return meta


def data_type_json(nctype: NCType) -> object:
    if nctype is STRING:
        return "string"
    if nctype is CHAR:
        return {"name": "null_terminated_bytes", "configuration": {"length_bytes": 1}}
    return _V3_NAME[nctype.letter]


def codecs_json(layout: ArrayLayout, nctype: NCType) -> list[dict]:
    """The codec list of a new array: bytes (or vlen-utf8), then its compressor and filters as v3 codecs."""
    if nctype is STRING:
        serializer: dict = {"name": "vlen-utf8", "configuration": {}}
    elif layout.dtype.storage.itemsize > 1:
        endian = "big" if layout.dtype.storage.byteorder == ">" else "little"
        serializer = {"name": "bytes", "configuration": {"endian": endian}}
    else:
        serializer = {"name": "bytes", "configuration": {}}
    return [serializer, *(codec_json(config) for config in layout.codecs.configs)]


def codec_json(config: dict) -> dict:
    """A numcodecs (v2) configuration as a v3 codec: the spec's own where there is one."""
    name = config.get("id")
    options = {k: v for k, v in config.items() if k != "id"}
    if name == "gzip":
        return {"name": "gzip", "configuration": {"level": int(options.get("level", 5))}}
    if name == "zstd":
        level, checksum = int(options.get("level", 0)), bool(options.get("checksum", False))
        return {"name": "zstd", "configuration": {"level": level, "checksum": checksum}}
    if name == "blosc":
        shuffle = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle", -1: "shuffle"}.get(
            options.get("shuffle", 1)
        )
        return {
            "name": "blosc",
            "configuration": {
                "cname": options.get("cname", "lz4"),
                "clevel": int(options.get("clevel", 5)),
                "shuffle": shuffle or "shuffle",
                "typesize": int(options.get("typesize", 1) or 1),
                "blocksize": int(options.get("blocksize", 0)),
            },
        }
    if name == "crc32c":
        return {"name": "crc32c"}
    return {"name": f"numcodecs.{name}", "configuration": options}


def v3_codec_config(config: dict, itemsize: int) -> dict:
    """A requested v2 codec (from ``create_variable``) as the numcodecs config a v3 array stores: zlib
    has no v3 codec, so it becomes gzip (same deflate stream, gzip framing); blosc records its typesize."""
    if config.get("id") == "zlib":
        return {"id": "gzip", "level": int(config.get("level", 5))}
    if config.get("id") == "blosc":
        return {"typesize": itemsize, **config}
    return dict(config)


def array_json(
    layout: ArrayLayout, nctype: NCType, fill: object, attrs: dict, dims: list[str] | None
) -> dict:
    """The ``zarr.json`` of a new array (an array read from a v3 store keeps its own codecs and keys)."""
    shape = [] if layout.scalar else list(layout.shape)
    chunks = [] if layout.scalar else list(layout.chunks)
    meta: dict = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": data_type_json(nctype),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": codecs_json(layout, nctype),
        "attributes": attrs,
    }
    if dims is not None and not layout.scalar:
        meta["dimension_names"] = dims
    return meta


def updated_json(stored: dict, layout: ArrayLayout, attrs: dict, dims: list[str] | None) -> dict:
    """A read array's ``zarr.json`` with what nczmap can change: its shape, attributes and dimensions."""
    meta = dict(stored)
    if not layout.scalar:
        meta["shape"] = list(layout.shape)
    meta["attributes"] = attrs
    if dims is not None and not layout.scalar:
        meta["dimension_names"] = dims
    return meta


def fill_json(nctype: NCType, fill: object, number: object) -> object:
    """The v3 ``fill_value`` (required: the netCDF default when the variable has none)."""
    if nctype is CHAR:
        return base64.b64encode(fill if isinstance(fill, bytes) else b"\x00").decode()
    if nctype is STRING:
        return fill if isinstance(fill, str) else ""
    if isinstance(number, float) and not math.isfinite(number):
        return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
    return number
