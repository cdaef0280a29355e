"""xarray through the nczmap engine, side by side with xarray's own Zarr engine on zarr-python's LocalStore.

1. Read a 1 GiB float64 variable with dask (``chunks={}``: one task per 16 MiB storage chunk, the threaded
   scheduler) through ``xr.open_dataset(url, engine="nczmap")`` and through
   ``xr.open_zarr(LocalStore(path), consolidated=False)``, alternately, files in the page cache.
   Target: the engine's throughput ≥ 0.8× the Zarr engine's.
   Also zarr-python's own reading through ``nczmap.ZarrStore`` against ``LocalStore`` (no target).
2. Open the header of a store of 5,000 variables (no data read) both ways, without consolidated
   metadata. Target: the engine ≥ 2× faster.

Both read the same NCZarr store, written by nczmap (it carries ``_ARRAY_DIMENSIONS`` for xarray).

    .venv/bin/python bench/bench_xarray.py [--gib 1] [--variables 5000] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import dask
import numpy as np
import xarray as xr
import zarr

import nczmap

CHUNK = (1024, 2048)  # 16 MiB of float64


def build_big(path: Path, gib: float) -> str:
    url = path.as_uri() + "#mode=nczarr,file"
    columns = CHUNK[1] * 4
    rows = max(CHUNK[0], int(gib * 2**30) // (8 * columns) // CHUNK[0] * CHUNK[0])
    rng = np.random.default_rng(0)
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("y", rows)
        ds.create_dimension("x", columns)
        variable = ds.create_variable("v", ("y", "x"), "f8", chunks=CHUNK, fill_value=None)
        for start in range(0, rows, CHUNK[0]):
            variable[start : start + CHUNK[0], :] = rng.random((CHUNK[0], columns))
    return url


def build_wide(path: Path, count: int) -> str:
    url = path.as_uri() + "#mode=nczarr,file"
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("t", 10)
        for index in range(count):
            variable = ds.create_variable(f"var{index:05d}", ("t",), "f4", data=np.arange(10, dtype="f4"))
            variable.attrs["units"] = "K"
            variable.attrs["long_name"] = f"variable number {index}"
    return url


def same_values(url: str, path: Path) -> None:
    """Both ways read the same numbers (so the timings compare like with like)."""
    with xr.open_dataset(url, engine="nczmap", chunks={}) as ours:
        mine = float(ours.v.data.sum().compute())
    with xr.open_zarr(zarr.storage.LocalStore(path, read_only=True), consolidated=False, chunks={}) as theirs:
        peer = float(theirs.v.data.sum().compute())
    if mine != peer:
        raise SystemExit(f"the engine's sum {mine} differs from xr.open_zarr's {peer}")


def read_engine(url: str) -> float:
    start = time.perf_counter()
    with xr.open_dataset(url, engine="nczmap", chunks={}) as ds:
        ds.v.data.sum().compute()
    return time.perf_counter() - start


def read_zarr(path: Path) -> float:
    start = time.perf_counter()
    with xr.open_zarr(zarr.storage.LocalStore(path, read_only=True), consolidated=False, chunks={}) as ds:
        ds.v.data.sum().compute()
    return time.perf_counter() - start


def read_zarr_store(url: str) -> float:
    start = time.perf_counter()
    with xr.open_zarr(nczmap.ZarrStore(url), consolidated=False, chunks={}) as ds:
        ds.v.data.sum().compute()
    return time.perf_counter() - start


def header_engine(url: str) -> float:
    start = time.perf_counter()
    xr.open_dataset(url, engine="nczmap").close()
    return time.perf_counter() - start


def header_zarr(path: Path) -> float:
    start = time.perf_counter()
    xr.open_zarr(zarr.storage.LocalStore(path, read_only=True), consolidated=False).close()
    return time.perf_counter() - start


def side_by_side(label: str, ours, theirs, rounds: int) -> tuple[float, float]:
    """Median seconds of each, the two run alternately (after one warm-up each)."""
    ours(), theirs()
    mine, peer = [], []
    for _ in range(rounds):
        mine.append(ours())
        peer.append(theirs())
    return statistics.median(mine), statistics.median(peer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--variables", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs")
    args = parser.parse_args()
    if args.quick:
        args.gib, args.variables, args.rounds = 1 / 64, 50, 1
    dask.config.set(scheduler="threads")
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        big = Path(tmp, "big.file")
        url = build_big(big, args.gib)
        size = big.stat().st_size if big.is_file() else sum(p.stat().st_size for p in big.rglob("*"))
        same_values(url, big)
        ours, theirs = side_by_side("read", lambda: read_engine(url), lambda: read_zarr(big), args.rounds)
        print(f"1. read {size / 2**30:.2f} GiB with dask (threads), median of {args.rounds}:")
        print(f"   engine nczmap       {size / ours / 2**30:6.2f} GiB/s  ({ours:.3f} s)")
        print(f"   xr.open_zarr        {size / theirs / 2**30:6.2f} GiB/s  ({theirs:.3f} s)")
        print(f"   throughput ratio    {theirs / ours:.2f}×  (TARGET ≥ 0.8×)")
        store, local = side_by_side(
            "store", lambda: read_zarr_store(url), lambda: read_zarr(big), args.rounds
        )
        print(
            f"   xr.open_zarr(nczmap.ZarrStore) {size / store / 2**30:.2f} GiB/s vs LocalStore "
            f"{size / local / 2**30:.2f} GiB/s: {local / store:.2f}×"
        )

        wide = Path(tmp, "wide.file")
        wide_url = build_wide(wide, args.variables)
        ours, theirs = side_by_side(
            "header", lambda: header_engine(wide_url), lambda: header_zarr(wide), args.rounds
        )
        print(f"2. open the header of {args.variables} variables, unconsolidated, median of {args.rounds}:")
        print(f"   engine nczmap       {ours * 1e3:8.1f} ms")
        print(f"   xr.open_zarr        {theirs * 1e3:8.1f} ms")
        print(f"   speed ratio         {theirs / ours:.2f}×  (TARGET ≥ 2×)")


if __name__ == "__main__":
    main()
