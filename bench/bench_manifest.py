"""Reading a virtual array: 10,000 references of 16 KiB into one 160 MiB file, side by side with peers.

The array (``<f8``, uncompressed, one chunk a reference) is read whole through nczmap's manifest driver,
through kerchunk references with fsspec's ReferenceFileSystem and zarr, and compared with one Python
``open().read()`` of the same bytes (warm page cache), for references in file order and shuffled.
Target: nczmap at least 0.7x the throughput of ``open().read()``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import nczmap


def build(directory: Path, chunks: int, chunk_bytes: int, shuffled: bool) -> tuple[str, np.ndarray]:
    per_chunk = chunk_bytes // 8
    values = np.arange(chunks * per_chunk, dtype="<f8")
    data = directory / "data.bin"
    data.write_bytes(values.tobytes())
    order = list(range(chunks))
    if shuffled:
        random.Random(1).shuffle(order)
    refs = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "v/.zarray": json.dumps(
            {
                "zarr_format": 2,
                "shape": [chunks * per_chunk],
                "chunks": [per_chunk],
                "dtype": "<f8",
                "compressor": None,
                "filters": None,
                "fill_value": None,
                "order": "C",
            }
        ),
        "v/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x"]}),
    }
    for i in order:
        refs[f"v/{i}"] = [data.as_uri(), i * chunk_bytes, chunk_bytes]
    path = directory / ("shuffled.json" if shuffled else "sequential.json")
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return str(path), values


def read_nczmap(path: str) -> np.ndarray:
    with nczmap.open_dataset(Path(path).as_uri() + "#mode=zarr,manifest") as ds:
        return ds.variables["v"][...]


def read_fsspec_zarr(path: str) -> np.ndarray:
    import fsspec
    import zarr

    mapper = fsspec.get_mapper("reference://v", fo=path)
    return zarr.open_array(mapper, mode="r", zarr_format=2)[...]


def read_file(path: str) -> bytes:
    with open(Path(path).parent / "data.bin", "rb") as handle:
        return handle.read()


def timed(function, argument) -> float:
    start = time.perf_counter()
    function(argument)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--chunk-bytes", type=int, default=16 << 10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="200 chunks, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.chunks, args.rounds = 200, 2
    with tempfile.TemporaryDirectory() as tmp:
        for shuffled in (False, True):
            place = Path(tmp) / ("s" if shuffled else "q")
            place.mkdir()
            path, values = build(place, args.chunks, args.chunk_bytes, shuffled)
            assert np.array_equal(read_nczmap(path), values)
            assert np.array_equal(read_fsspec_zarr(path), values)
            read_file(path)
            rounds = [
                (timed(read_nczmap, path), timed(read_file, path), timed(read_fsspec_zarr, path))
                for _ in range(args.rounds)
            ]
            ours, raw, peer = (statistics.median(r[i] for r in rounds) for i in range(3))
            label = "shuffled" if shuffled else "file order"
            size = values.nbytes / 2**20
            print(f"{args.chunks} references of {args.chunk_bytes} bytes ({size:.0f} MiB), {label}:")
            print(f"  nczmap manifest driver          {ours * 1000:8.1f} ms")
            print(f"  open().read() of the file       {raw * 1000:8.1f} ms")
            print(f"  kerchunk refs: fsspec + zarr    {peer * 1000:8.1f} ms")
            ratio = statistics.median(r[1] / r[0] for r in rounds)
            verdict = "TARGET MET" if ratio >= 0.7 else "TARGET MISSED"
            print(f"  throughput nczmap/open().read() {ratio:6.2f}×  (target ≥ 0.7)  {verdict}")
            print(f"  speed-up over fsspec + zarr     {statistics.median(r[2] / r[0] for r in rounds):6.1f}×")


if __name__ == "__main__":
    main()
