"""Zarr v3 ``vlen-utf8`` chunks: a little-endian uint32 count, then each string as uint32 length + UTF-8."""

from __future__ import annotations

import struct

from nczmap._lazy import numpy as np
from nczmap.errors import FormatError


def decode_vlen_utf8(data: object, count: int, key: str) -> np.ndarray:
    """The ``count`` strings of a decoded chunk, as an object array."""
    raw = memoryview(data).cast("B")
    if len(raw) < 4 or int.from_bytes(raw[:4], "little") != count:
        raise FormatError(f"chunk {key!r}: a vlen-utf8 chunk of {count} strings must say so in its header")
    out = np.empty(count, dtype=object)
    at = 4
    for i in range(count):
        if at + 4 > len(raw):
            raise FormatError(f"chunk {key!r}: vlen-utf8 data ends after {i} of {count} strings")
        length = int.from_bytes(raw[at : at + 4], "little")
        at += 4
        if at + length > len(raw):
            raise FormatError(f"chunk {key!r}: string {i} runs past the end of the vlen-utf8 data")
        out[i] = bytes(raw[at : at + length]).decode("utf-8", "replace")
        at += length
    return out


def encode_vlen_utf8(values: np.ndarray) -> bytes:
    """C-order ``values`` (str or None) as a vlen-utf8 chunk."""
    encoded = [("" if v is None else str(v)).encode("utf-8") for v in values.ravel()]
    parts = [struct.pack("<I", len(encoded))]
    for item in encoded:
        parts.append(struct.pack("<I", len(item)))
        parts.append(item)
    return b"".join(parts)
