"""CRC-32C, the checksum of Zarr v3's ``crc32c`` codec and of nczmap's per-reference checksums.

The ``crc32c`` package (the one numcodecs' CRC32C codec uses) computes it in hardware and releases the
GIL while it does, so chunks read concurrently are also hashed concurrently; it takes any buffer (bytes,
memoryview, numpy arrays) without a copy.
"""

from __future__ import annotations

from collections.abc import Callable

_compute: Callable[[object], int] | None = None


def crc32c(data) -> int:
    """The CRC-32C of ``data`` (any contiguous buffer)."""
    global _compute
    if _compute is None:  # imported once, when first needed: a call per chunk must not pay for it
        from crc32c import crc32c as compute

        _compute = compute
    return _compute(data)
