"""Kerchunk references of one 1-D ``<f8`` array whose chunks are consecutive ranges of data files."""

from __future__ import annotations

import json

import numpy as np


def array_refs(urls: str | list[str], chunks: int, chunk_bytes: int, seed: int | None = 3) -> dict:
    """``v`` of ``chunks`` chunks, chunk ``i`` at byte ``i * chunk_bytes`` of ``urls[i % len(urls)]``,
    the references listed in a shuffled order (``seed``; None keeps file order)."""
    urls = [urls] if isinstance(urls, str) else urls
    zarray = {
        "zarr_format": 2,
        "shape": [chunks * chunk_bytes // 8],
        "chunks": [chunk_bytes // 8],
        "dtype": "<f8",
        "compressor": None,
        "filters": None,
        "fill_value": None,
        "order": "C",
    }
    refs: dict[str, object] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "v/.zarray": json.dumps(zarray),
        "v/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x"]}),
    }
    order = np.random.default_rng(seed).permutation(chunks) if seed is not None else range(chunks)
    refs.update({f"v/{i}": [urls[int(i) % len(urls)], int(i) * chunk_bytes, chunk_bytes] for i in order})
    return refs
