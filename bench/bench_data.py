"""Data speed and memory: reading, copying and dumping stores, side by side with cat and C ncdump.

1. Read every variable of a 1 GiB uncompressed store into numpy; ``cat`` of the same files is the bar
   (target ≥ 0.8× its throughput), with the files in the page cache (warm) and, where the cache can be
   dropped (root), with every byte coming from the disk (cold).
2. ``nczmap copy`` of that store to a new directory store (target ≥ 0.8× cat's throughput), warm and
   cold. Warm, a copy is bound by the file system's write path, not by reading: the kernel's own
   ``copy_file_range`` of the same files, a thread per core, is printed as that ceiling.
3. ``nczmap copy`` of a 2 GiB store in a child process: peak resident memory (target < 300 MB).
4. Full ``nczmap ncdump`` (data included) of a 50 MB store against C ``ncdump`` (target ≤ 1.5× its time).

    .venv/bin/python bench/bench_data.py [--gib 1] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import nczmap
from nczmap.concurrency import LOCAL_WIDTH

CHUNK = (512, 2048)  # 4 MiB of float32


def build(path: Path, total_bytes: int, version: str | None = None) -> str:
    """Float32 variables of 128 MiB (fewer when small), 4 MiB chunks, random data (incompressible)."""
    url = path.as_uri() + "#mode=nczarr,file"
    per_variable = min(total_bytes, 128 << 20)
    rows = per_variable // (4 * CHUNK[1])
    rng = np.random.default_rng(0)
    block = rng.random((CHUNK[0], CHUNK[1]), dtype=np.float32)
    with nczmap.create_dataset(url, netcdf_version=version) as ds:
        ds.create_dimension("row", rows)
        ds.create_dimension("col", CHUNK[1])
        for index in range(max(1, total_bytes // per_variable)):
            chunks = (min(CHUNK[0], rows), CHUNK[1])
            var = ds.create_variable(f"v{index}", ("row", "col"), "f4", chunks=chunks)
            for start in range(0, rows, CHUNK[0]):
                stop = min(rows, start + CHUNK[0])
                var[start:stop, :] = block[: stop - start]
    return url


def drop_caches() -> bool:
    """Empty the page cache (needs root); False where that is not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as control:
            control.write("3\n")
        return True
    except OSError:
        return False


def cold(function, clear: Path | None = None) -> float:
    _clear(clear)
    drop_caches()
    return timed(function)


def _clear(path: Path | None) -> None:
    """Remove the previous round's output before the clock starts (deleting is not copying)."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


KERNEL_THREADS = LOCAL_WIDTH  # a thread per core, as nczmap uses for local storage


def copy_files_in_kernel(files: list[str], source: Path, destination: Path) -> None:
    """The fastest copy the kernel offers here: copy_file_range per file, a thread per core."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> None:
        target = destination / Path(name).relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(name, "rb") as reader, open(target, "wb") as writer:
            remaining = os.fstat(reader.fileno()).st_size
            while remaining > 0:
                done = os.copy_file_range(reader.fileno(), writer.fileno(), remaining)
                if not done:
                    break
                remaining -= done

    with ThreadPoolExecutor(KERNEL_THREADS) as pool:
        list(pool.map(one, files))


def files_of(path: Path) -> list[str]:
    return [str(p) for p in sorted(path.rglob("*")) if p.is_file()]


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def best_of(function, rounds: int, clear: Path | None = None) -> float:
    best = math.inf
    for _ in range(rounds):
        _clear(clear)
        best = min(best, timed(function))
    return best


# As on a user's machine, Python may cache compiled modules (some shells set PYTHONDONTWRITEBYTECODE).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def cat(files: list[str]) -> None:
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)


def read_into_new_arrays(files: list[str]) -> None:
    """The floor for reading into fresh numpy memory: bare preadv of each variable's chunk files, a thread
    per core, into a new array per variable (the kernel must zero every new page)."""
    from concurrent.futures import ThreadPoolExecutor

    by_variable: dict[str, list[str]] = {}
    for name in files:
        if not os.path.basename(name).startswith("."):
            by_variable.setdefault(os.path.dirname(name), []).append(name)
    with ThreadPoolExecutor(KERNEL_THREADS) as pool:
        for chunks in by_variable.values():
            sizes = [os.path.getsize(c) for c in chunks]
            out = np.empty(sum(sizes), np.uint8)
            offsets = np.cumsum([0, *sizes]).tolist()

            def one(index: int, chunks=chunks, out=out, offsets=offsets) -> None:
                fd = os.open(chunks[index], os.O_RDONLY)
                try:
                    os.preadv(fd, [out[offsets[index] : offsets[index + 1]]], 0)
                finally:
                    os.close(fd)

            list(pool.map(one, range(len(chunks))))


def read_all(url: str) -> int:
    total = 0
    with nczmap.open_dataset(url) as ds:
        for var in ds.variables.values():
            total += var[...].nbytes
    return total


def copy_in_child(source: str, destination: str) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of ``nczmap copy`` run as its own process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nczmap", "copy", source, destination], check=True, env=CHILD_ENV)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, max(peak, before) * 1024


def ratio_line(label: str, value: float, target: str, met: bool) -> None:
    print(f"{label:42s} {value:8.2f}×   (target {target})  {'TARGET MET' if met else 'TARGET MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the read/copy store")
    parser.add_argument("--memory-gib", type=float, default=2.0, help="size of the store copied for memory")
    parser.add_argument("--dump-mb", type=float, default=50.0, help="size of the ncdump store")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round")
    args = parser.parse_args()
    if args.quick:
        args.gib, args.memory_gib, args.dump_mb, args.rounds = 1 / 64, 1 / 32, 1.0, 1
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        size = int(args.gib * (1 << 30))
        url = build(base / "store.file", size)
        files = files_of(base / "store.file")
        nbytes = sum(os.path.getsize(f) for f in files)
        cat(files)  # warm the page cache
        t_cat = best_of(lambda: cat(files), args.rounds)
        t_read = best_of(lambda: read_all(url), args.rounds)
        print(f"store: {nbytes / 2**20:.0f} MiB in {len(files)} files")
        print(f"cat                                        {nbytes / t_cat / 2**20:8.0f} MiB/s")
        print(f"nczmap read every variable                 {nbytes / t_read / 2**20:8.0f} MiB/s")
        t_floor = best_of(lambda: read_into_new_arrays(files), args.rounds)
        floor_label = f"bare preadv into new arrays, {KERNEL_THREADS} threads"
        print(f"{floor_label:42s} {nbytes / t_floor / 2**20:8.0f} MiB/s")
        ratio_line("read throughput nczmap/cat", t_cat / t_read, "≥ 0.8", t_cat / t_read >= 0.8)
        print(f"{'read throughput nczmap/bare preadv':42s} {t_floor / t_read:8.2f}×")

        copy_path, cp_path = base / "copy.file", base / "cp.file"

        def copy_once() -> None:
            nczmap.integrations.copy.copy(url, str(copy_path))

        def cp_once() -> None:
            subprocess.run(["cp", "-r", str(base / "store.file"), str(cp_path)], check=True)

        def kernel_copy() -> None:
            copy_files_in_kernel(files, base / "store.file", cp_path)

        t_copy = best_of(copy_once, args.rounds, clear=copy_path)
        t_cp = best_of(cp_once, args.rounds, clear=cp_path)
        t_kernel = best_of(kernel_copy, args.rounds, clear=cp_path)
        shutil.rmtree(cp_path, ignore_errors=True)
        print(f"nczmap copy file -> file                   {nbytes / t_copy / 2**20:8.0f} MiB/s")
        print(f"cp -r of the same directory (reference)    {nbytes / t_cp / 2**20:8.0f} MiB/s")
        kernel_label = f"kernel copy_file_range, {KERNEL_THREADS} threads (ceiling)"
        print(f"{kernel_label:42s} {nbytes / t_kernel / 2**20:8.0f} MiB/s")
        ratio_line("copy throughput nczmap/cat", t_cat / t_copy, "≥ 0.8", t_cat / t_copy >= 0.8)
        ceiling = t_kernel / t_copy
        print(f"{'copy throughput nczmap/kernel ceiling':42s} {ceiling:8.2f}×   (the write path's limit)")
        if drop_caches():  # cold: every byte comes from the disk, for cat and nczmap alike
            t_cat_cold = min(cold(lambda: cat(files)) for _ in range(args.rounds))
            t_read_cold = min(cold(lambda: read_all(url)) for _ in range(args.rounds))
            t_copy_cold = min(cold(copy_once, clear=copy_path) for _ in range(args.rounds))
            rates = [nbytes / t / 2**20 for t in (t_cat_cold, t_read_cold, t_copy_cold)]
            print(
                "cold cache: cat {:.0f} MiB/s, nczmap read {:.0f} MiB/s, nczmap copy {:.0f} MiB/s".format(
                    *rates
                )
            )
            ratio_line(
                "cold read throughput nczmap/cat",
                t_cat_cold / t_read_cold,
                "≥ 0.8",
                t_cat_cold / t_read_cold >= 0.8,
            )
            ratio_line(
                "cold copy throughput nczmap/cat",
                t_cat_cold / t_copy_cold,
                "≥ 0.8",
                t_cat_cold / t_copy_cold >= 0.8,
            )
        else:
            print("cold-cache figures skipped: the page cache cannot be dropped here (needs root)")
        shutil.rmtree(copy_path, ignore_errors=True)
        shutil.rmtree(base / "store.file", ignore_errors=True)

        big = build(base / "big.file", int(args.memory_gib * (1 << 30)))
        seconds, peak = copy_in_child(big, str(base / "big-copy.zip"))
        print(f"nczmap copy of {args.memory_gib:g} GiB to zip: {seconds:.1f} s, peak RSS {peak / 1e6:.0f} MB")
        print(
            f"{'peak memory of that copy':42s} {peak / 1e6:8.0f} MB  (target < 300 MB)  "
            f"{'TARGET MET' if peak < 300e6 else 'TARGET MISSED'}"
        )
        shutil.rmtree(base / "big.file", ignore_errors=True)
        (base / "big-copy.zip").unlink()

        dump_url = build(base / "dump.file", int(args.dump_mb * (1 << 20)), "4.9.0")
        ours = [sys.executable, "-m", "nczmap", "ncdump", dump_url]
        subprocess.run([*ours[:-1], "-h", ours[-1]], stdout=subprocess.DEVNULL, check=True, env=CHILD_ENV)
        t_ours = best_of(
            lambda: subprocess.run(ours, stdout=subprocess.DEVNULL, check=True, env=CHILD_ENV), args.rounds
        )
        print(f"nczmap ncdump of {args.dump_mb:g} MB                    {t_ours:8.2f} s")
        if shutil.which("ncdump"):
            theirs = ["ncdump", dump_url]
            t_c = best_of(lambda: subprocess.run(theirs, stdout=subprocess.DEVNULL, check=True), args.rounds)
            print(f"C ncdump of the same store                 {t_c:8.2f} s")
            ratio_line("ncdump time nczmap/C", t_ours / t_c, "≤ 1.5", t_ours / t_c <= 1.5)


if __name__ == "__main__":
    import nczmap.integrations.copy

    main()
