"""CRC-32C, the checksum of Zarr v3's ``crc32c`` codec and of nczmap's per-reference checksums.

Computed by ``google_crc32c`` (hardware CRC-32C; the package numcodecs' CRC32C codec recommends since
0.16.4, which warns on every start when it finds only the older ``crc32c`` package). It takes bytes and
numpy arrays; other buffers (memoryviews, bytearrays) are viewed as a numpy array, without a copy.
"""

from __future__ import annotations

from collections.abc import Callable

_compute: Callable[[object], int] | None = None


def crc32c(data) -> int:
    """The CRC-32C of ``data`` (any contiguous buffer)."""
    global _compute
    if _compute is None:  # imported once, when first needed: a call per chunk must not pay for it
        from google_crc32c import value

        _compute = value
    if not isinstance(data, bytes):
        import numpy as np

        data = np.frombuffer(data, dtype=np.uint8)
    return _compute(data)
