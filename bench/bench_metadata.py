"""Metadata speed: opening a 5,000-variable, 50-group NCZarr store and walking every variable; and the
full ``ncdump`` (data included) of a 50 MB store.

1. ``nczmap ncdump -h`` against Debian's C ``ncdump -h`` as whole processes (start-up included), on a
   store written for netcdf-c 4.9.0 (dialect D1, which that ncdump reads). Target: ≤ 0.8× C's time.
2. In one process: ``nczmap.open_dataset`` plus touching every variable's dimensions, dtype and attributes,
   against netCDF4-python (libnetcdf 4.10) doing the same walk, on a 4.9.3+ (D3) store. Target: ≤ 0.4×.
3. ``nczmap ncdump`` against C ``ncdump`` as whole processes, of a 50 MB store of float32 values (random,
   4 MiB chunks, written for netcdf-c 4.9.0); the two outputs are compared first. Target: ≤ 1.0× C's time.

Every comparison runs the two sides in interleaved pairs (this VM's speed drifts, and is shared) and
reports medians and the median of the pairs' ratios; the machine's load average is printed before and
after, since a loaded machine slows both sides unevenly.

    .venv/bin/python bench/bench_metadata.py [--groups 50] [--variables 100] [--rounds 11]
                                             [--dump-mb 50] [--dump-rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import nczmap

DUMP_CHUNK = (512, 2048)  # 4 MiB of float32, as bench_data.py


def build_dump_store(path: Path, total_bytes: int) -> str:
    """Float32 variables of at most 128 MiB in 4 MiB chunks of random values, for netcdf-c 4.9.0."""
    url = path.as_uri() + "#mode=nczarr,file"
    per_variable = min(total_bytes, 128 << 20)
    rows = max(1, per_variable // (4 * DUMP_CHUNK[1]))
    block = np.random.default_rng(0).random(DUMP_CHUNK, dtype=np.float32)
    with nczmap.create_dataset(url, netcdf_version="4.9.0") as ds:
        ds.create_dimension("row", rows)
        ds.create_dimension("col", DUMP_CHUNK[1])
        for index in range(max(1, total_bytes // per_variable)):
            var = ds.create_variable(
                f"v{index}", ("row", "col"), "f4", chunks=(min(DUMP_CHUNK[0], rows), DUMP_CHUNK[1])
            )
            for start in range(0, rows, DUMP_CHUNK[0]):
                stop = min(rows, start + DUMP_CHUNK[0])
                var[start:stop, :] = block[: stop - start]
    return url


def build(path: Path, groups: int, variables: int, version: str | None) -> str:
    url = path.as_uri() + "#mode=nczarr,file"
    with nczmap.create_dataset(url, netcdf_version=version) as ds:
        ds.attrs["title"] = "metadata benchmark"
        for g in range(groups):
            group = ds.create_group(f"g{g}")
            group.create_dimension("x", 10)
            group.create_dimension("y", 20)
            for v in range(variables):
                var = group.create_variable(f"v{v}", ("x", "y"), "f4", fill_value=np.float32(-999))
                var.attrs["units"] = "m s-1"
                var.attrs["long_name"] = f"variable {v} of group {g}"
                var.attrs["scale"] = np.float64(0.5)
    return url


def timed(command) -> float:
    start = time.perf_counter()
    command()
    return time.perf_counter() - start


def median_time(command, rounds: int) -> float:
    return statistics.median(timed(command) for _ in range(rounds))


# As on a user's machine, Python may cache compiled modules (some shells set PYTHONDONTWRITEBYTECODE).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_process(args: list[str]) -> None:
    subprocess.run(
        args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600, env=CHILD_ENV
    )


def output_of(args: list[str]) -> bytes:
    return subprocess.run(args, check=True, capture_output=True, timeout=600, env=CHILD_ENV).stdout


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def compare_processes(label: str, ours: list[str], theirs: list[str], rounds: int, target: float) -> None:
    """Interleaved pairs of whole-process runs: medians and the median of the pairs' ratios."""
    pairs = [(timed(lambda: run_process(ours)), timed(lambda: run_process(theirs))) for _ in range(rounds)]
    t_ours = statistics.median(p[0] for p in pairs)
    t_c = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[0] / p[1] for p in pairs)
    print(f"nczmap {label + ' (process)':26s} {t_ours * 1000:9.1f} ms")
    print(f"C {label + ' 4.9.0 (process)':31s} {t_c * 1000:9.1f} ms")
    verdict = "TARGET MET" if ratio <= target else "TARGET MISSED"
    print(f"ratio nczmap/C {label} (median of {rounds} pairs) {ratio:5.2f}×   (target ≤ {target})  {verdict}")


def walk_nczmap(url: str) -> int:
    touched = 0
    with nczmap.open_dataset(url) as ds:
        for group in ds.walk():
            for var in group.variables.values():
                touched += len(var.dimensions) + len(dict(var.attrs)) + var.dtype.itemsize
    return touched


def walk_netcdf4(url: str) -> int:
    import netCDF4

    touched = 0
    with netCDF4.Dataset(url) as ds:
        stack = [ds]
        while stack:
            group = stack.pop()
            stack.extend(group.groups.values())
            for var in group.variables.values():
                touched += len(var.dimensions) + len({a: var.getncattr(a) for a in var.ncattrs()})
                touched += var.dtype.itemsize
    return touched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=50)
    parser.add_argument("--variables", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--dump-mb", type=float, default=50.0, help="size of the store dumped in full")
    parser.add_argument("--dump-rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="5 groups x 10 variables, 1 MB dump, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.groups, args.variables, args.rounds, args.dump_mb, args.dump_rounds = 5, 10, 2, 1.0, 2
    total = args.groups * args.variables
    print(load())
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        d1 = build(Path(tmp) / "d1.file", args.groups, args.variables, "4.9.0")
        d3 = build(Path(tmp) / "d3.file", args.groups, args.variables, None)
        built = time.perf_counter() - start
        print(f"{total} variables in {args.groups} groups; stores built in {built:.1f} s")

        ours = [sys.executable, "-m", "nczmap", "ncdump", "-h", d1]
        theirs = shutil.which("ncdump")
        run_process(ours)  # warm-up: compiles and caches nczmap's modules
        if theirs:
            compare_processes("ncdump -h", ours, [theirs, "-h", d1], args.rounds, 0.8)
        else:
            t_ours = median_time(lambda: run_process(ours), args.rounds)
            print(f"nczmap ncdump -h (process)       {t_ours * 1000:9.1f} ms")

        assert walk_nczmap(d3) == walk_netcdf4(d3), "the two walks disagree"
        rounds = range(args.rounds)
        pairs = [(timed(lambda: walk_nczmap(d3)), timed(lambda: walk_netcdf4(d3))) for _ in rounds]
        ratio = statistics.median(p[0] / p[1] for p in pairs)
        print(f"nczmap open + walk (in process)  {statistics.median(p[0] for p in pairs) * 1000:9.1f} ms")
        print(f"netCDF4 open + walk (libnetcdf)  {statistics.median(p[1] for p in pairs) * 1000:9.1f} ms")
        verdict = "TARGET MET" if ratio <= 0.4 else "TARGET MISSED"
        print(
            f"ratio nczmap/netCDF4 (median of {args.rounds} pairs) {ratio:6.2f}×   (target ≤ 0.4)  {verdict}"
        )
        shutil.rmtree(Path(tmp) / "d1.file")
        shutil.rmtree(Path(tmp) / "d3.file")

        dump = build_dump_store(Path(tmp) / "dump.file", int(args.dump_mb * (1 << 20)))
        ours = [sys.executable, "-m", "nczmap", "ncdump", dump]
        if theirs:
            if output_of(ours) != output_of([theirs, dump]):  # also the warm-up
                raise SystemExit("nczmap ncdump and C ncdump print different CDL for the dump store")
            compare_processes(f"ncdump {args.dump_mb:g} MB", ours, [theirs, dump], args.dump_rounds, 1.0)
        else:
            t_ours = median_time(lambda: run_process(ours), args.dump_rounds)
            print(f"nczmap ncdump of {args.dump_mb:g} MB (process)  {t_ours * 1000:9.1f} ms")
    print(load())


if __name__ == "__main__":
    main()
