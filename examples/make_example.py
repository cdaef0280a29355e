"""Write a small NCZarr dataset (netcdf-c 4.9.3+ layout) into a zip archive and a directory.

The content is the worked example of the NCZarr format notes: dims x=2, y=3; int v(x, y) with a fill
value and a units attribute; subgroup g with double d(y).

    python examples/make_example.py OUTDIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from nczmap import open_map

TYPES = {"_nczarr_attr": "|J0"}


def attrs(items: dict, types: dict) -> bytes:
    body = dict(items)
    body["_nczarr_attr"] = {"types": {**types, **TYPES}}
    return json.dumps(body).encode()


def zarray(shape: list[int], dtype: str, fill: object) -> bytes:
    meta = {
        "zarr_format": 2,
        "shape": shape,
        "dtype": dtype,
        "chunks": shape,
        "fill_value": fill,
        "order": "C",
        "compressor": None,
        "filters": None,
    }
    return json.dumps(meta).encode()


def objects() -> dict[str, bytes]:
    group = {"dimensions": {"x": 2, "y": 3}, "arrays": ["v"], "groups": ["g"]}
    return {
        "/.zgroup": b'{"zarr_format": 2}',
        "/.zattrs": attrs(
            {"_nczarr_group": group, "_nczarr_superblock": {"version": "2.0.0"}},
            {"_nczarr_group": "|J0", "_nczarr_superblock": "|J0"},
        ),
        "/v/.zarray": zarray([2, 3], "<i4", -1),
        "/v/.zattrs": attrs(
            {
                "_FillValue": -1,
                "units": "m",
                "_ARRAY_DIMENSIONS": ["x", "y"],
                "_nczarr_array": {"dimension_references": ["/x", "/y"], "storage": "chunked"},
            },
            {"_FillValue": "<i4", "units": ">S1", "_nczarr_array": "|J0"},
        ),
        "/v/0.0": np.array([1, 2, 3, 4, 5, -1], "<i4").tobytes(),
        "/g/.zgroup": b'{"zarr_format": 2}',
        "/g/.zattrs": attrs(
            {"_nczarr_group": {"dimensions": {}, "arrays": ["d"], "groups": []}}, {"_nczarr_group": "|J0"}
        ),
        "/g/d/.zarray": zarray([3], "<f8", "NaN"),
        "/g/d/.zattrs": attrs(
            {
                "_ARRAY_DIMENSIONS": ["y"],
                "_nczarr_array": {"dimension_references": ["/y"], "storage": "chunked"},
            },
            {"_nczarr_array": "|J0"},
        ),
        "/g/d/0": np.array([1.5, 2.5, 3.5], "<f8").tobytes(),
    }


def main(outdir: str) -> None:
    Path(outdir).mkdir(parents=True, exist_ok=True)
    for name in ("obs.zip", "obs.file"):
        with open_map(str(Path(outdir, name).resolve()), "w") as zmap:
            for key, data in objects().items():
                zmap.write(key, data)
        print(f"wrote {Path(outdir, name)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "example")
