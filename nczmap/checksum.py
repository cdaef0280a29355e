"""CRC-32C, the checksum of Zarr v3's ``crc32c`` codec and of nczmap's per-reference checksums.

The ``crc32c`` package (the one numcodecs' CRC32C codec uses) computes it in hardware and releases the
GIL while it does, so chunks read concurrently are also hashed concurrently; it takes any buffer (bytes,
memoryview, numpy arrays) without a copy.
"""

from __future__ import annotations


def crc32c(data) -> int:
    """The CRC-32C of ``data`` (any contiguous buffer)."""
    from crc32c import crc32c as compute

    return compute(data)
