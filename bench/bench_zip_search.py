"""Benchmark: listing the children of a prefix in a zip store — nczmap's zip driver vs zarr-python.

What is measured
    One zip archive in zarr-python ``ZipStore`` layout (entries at the archive root, no directory
    entries) is built with the stdlib ``zipfile``: a Zarr v2 group with an array ``v`` of ``--entries``
    one-byte chunks (``v/0``, ``v/1``, …) and a few small groups (``g1``, ``g2/sub``, ``g3``). The same
    file is then opened by

    * nczmap: ``open_map(path, "r")`` once, then ``search(prefix)`` (an index lookup),
    * zarr-python: ``ZipStore.open(path, mode="r")`` once, then ``list_dir(prefix)`` drained into a list;
      every call runs inside one coroutine on one event loop, timed inside the coroutine, so the
      event-loop start-up is not counted,
    * fsspec: ``ZipFileSystem(fo=path)``, then ``ls(prefix, detail=False)`` (for reference).

    The three are first checked to list the same names for every prefix, then timed side by side
    (interleaved rounds, per-call median). The one-off cost of opening (parsing the central directory,
    and for nczmap building its key index) is reported separately. The project target is nczmap's
    ``search`` at least 20× faster per call than ``ZipStore.list_dir`` for every prefix.

How to run
    .venv/bin/python bench/bench_zip_search.py              # 100,000 chunk entries, about 15-20 s
    .venv/bin/python bench/bench_zip_search.py --quick      # smoke test, a few seconds
    .venv/bin/python bench/bench_zip_search.py --entries 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator

from _common import (
    Case,
    array_meta,
    async_batch,
    fmt_ratio,
    fmt_time,
    measure,
    print_cases,
    sync_batch,
    time_once,
)
from fsspec.implementations.zip import ZipFileSystem
from zarr.storage import ZipStore

import nczmap

TARGET_SPEEDUP = 20.0
# nczmap prefix -> zarr-python list_dir prefix ("" is the root; list_dir strips a trailing "/").
PREFIXES = {"/v": "v", "/": "", "/g1": "g1"}
# Small groups: group path -> {array name: number of chunks}.
SMALL_GROUPS = {"g1": {"a": 4, "b": 4}, "g2": {"c": 2}, "g2/sub": {"d": 1}, "g3": {}}
DATE = (2024, 1, 1, 0, 0, 0)


# ---------------------------------------------------------------------------------------------- building


def archive_entries(chunks: int) -> Iterator[tuple[str, bytes]]:
    """Entry names and contents, ZipStore layout: root-level names, no directory entries."""
    group = json.dumps({"zarr_format": 2}).encode()
    yield ".zgroup", group
    yield "v/.zarray", array_meta(chunks)
    for index in range(chunks):
        yield f"v/{index}", bytes([index % 256])
    for path, arrays in SMALL_GROUPS.items():
        yield f"{path}/.zgroup", group
        for name, count in arrays.items():
            yield f"{path}/{name}/.zarray", array_meta(count)
            for index in range(count):
                yield f"{path}/{name}/{index}", bytes([index])


def build_archive(path: str, chunks: int) -> int:
    """Write the archive with stdlib ``zipfile`` (stored, 1-byte chunks); returns the entry count."""
    count = 0
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in archive_entries(chunks):
            info = zipfile.ZipInfo(name, date_time=DATE)
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
            count += 1
    return count


# ---------------------------------------------------------------------------------------------- listing
def zarr_names(runner: asyncio.Runner, store: ZipStore, prefix: str) -> list[str]:
    async def drain() -> list[str]:
        return [name async for name in store.list_dir(prefix)]

    return runner.run(drain())


def fsspec_names(filesystem: ZipFileSystem, prefix: str) -> list[str]:
    return [path.rsplit("/", 1)[-1] for path in filesystem.ls(prefix, detail=False)]


def verify(
    runner: asyncio.Runner, store: ZipStore, zmap: nczmap.ZMap, filesystem: ZipFileSystem
) -> dict[str, int]:
    """Check all three list the same names for every prefix; returns the nczmap result sizes."""
    sizes = {}
    for ours, theirs in PREFIXES.items():
        expected = zmap.search(ours)
        zarr_listed = zarr_names(runner, store, theirs)
        fsspec_listed = fsspec_names(filesystem, theirs)
        if expected != sorted(set(expected)):
            raise SystemExit(f"nczmap search({ours!r}) is not sorted and unique")
        if sorted(zarr_listed) != expected or len(zarr_listed) != len(set(zarr_listed)):
            raise SystemExit(f"zarr list_dir({theirs!r}) differs from nczmap search({ours!r})")
        if sorted(fsspec_listed) != expected:
            raise SystemExit(f"fsspec ls({theirs!r}) differs from nczmap search({ours!r})")
        sizes[ours] = len(expected)
    return sizes


def check_zarr_reads(runner: asyncio.Runner, store: ZipStore) -> None:
    """The archive is a real zarr-python store: zarr reads the first chunks of ``v`` back."""
    import zarr

    group = zarr.open_group(store=store, mode="r", zarr_format=2)
    first = group["v"][:4].tolist()
    if first != [0, 1, 2, 3][: len(first)]:
        raise SystemExit(f"zarr read v[:4] = {first}, expected [0, 1, 2, 3]")


# ---------------------------------------------------------------------------------------------- opening
def open_costs(runner: asyncio.Runner, path: str, repeats: int) -> dict[str, float]:
    """Median one-off cost of opening the archive, per library (each opened and closed again)."""

    def nczmap_open() -> None:
        nczmap.open_map(path, "r").close()

    async def zarr_open() -> None:
        store = await ZipStore.open(path, mode="r")
        store.close()

    def fsspec_open() -> None:
        filesystem = ZipFileSystem(fo=path, mode="r")
        filesystem.ls("", detail=False)  # the first ls builds fsspec's directory cache
        filesystem.zip.close()
        filesystem.fo.close()

    return {
        "nczmap open_map(path, 'r') (central directory + key index)": time_once(nczmap_open, repeats),
        "zarr ZipStore.open(path, mode='r') (central directory)": time_once(
            lambda: runner.run(zarr_open()), repeats
        ),
        "fsspec ZipFileSystem(fo=path) + first ls (dir cache)": time_once(fsspec_open, repeats),
    }


# ---------------------------------------------------------------------------------------------- timing
def search_cases(
    runner: asyncio.Runner,
    store: ZipStore,
    zmap: nczmap.ZMap,
    filesystem: ZipFileSystem,
    sizes: dict[str, int],
) -> list[Case]:
    cases = []
    for ours, theirs in PREFIXES.items():
        size = sizes[ours]
        cases.append(Case(f"nczmap search({ours!r})", sync_batch(zmap.search, ours), size))
        cases.append(Case(f"zarr   list_dir({theirs!r})", async_batch(runner, store.list_dir, theirs), size))
        fsspec_ls = functools.partial(fsspec_names, filesystem)
        cases.append(Case(f"fsspec ls({theirs!r})", sync_batch(fsspec_ls, theirs), size))
    return cases


def report(cases: list[Case]) -> bool:
    """Print the timing table and the ratios; True if every prefix meets the target."""
    by_name = {case.name: case for case in cases}
    print_cases(cases)
    goal = f"target ≥ {TARGET_SPEEDUP:.0f}×"
    print(f"\n{'prefix':<8} {'names':>7}  {'zarr/nczmap':>11}  {'fsspec/nczmap':>13}  {goal}")
    met = True
    for ours, theirs in PREFIXES.items():
        search = by_name[f"nczmap search({ours!r})"]
        zarr_ratio = by_name[f"zarr   list_dir({theirs!r})"].median / search.median
        fsspec_ratio = by_name[f"fsspec ls({theirs!r})"].median / search.median
        verdict = "TARGET MET" if zarr_ratio >= TARGET_SPEEDUP else "TARGET MISSED"
        met = met and zarr_ratio >= TARGET_SPEEDUP
        ratios = f"{fmt_ratio(zarr_ratio):>11}  {fmt_ratio(fsspec_ratio):>13}"
        print(f"{ours:<8} {search.size:>7}  {ratios}  {verdict}")
    return met


def compare(runner: asyncio.Runner, path: str, rounds: int, target: float) -> bool:
    """Open the archive once per library, check the listings agree, then time them side by side."""
    store = runner.run(ZipStore.open(path, mode="r"))
    zmap = nczmap.open_map(path, "r")
    filesystem = ZipFileSystem(fo=path, mode="r")
    try:
        sizes = verify(runner, store, zmap, filesystem)
        check_zarr_reads(runner, store)
        print("\nlistings agree (zarr list_dir == nczmap search == fsspec ls, as sets); zarr reads v")
        cases = search_cases(runner, store, zmap, filesystem, sizes)
        print(f"\nper-call listing time ({rounds} rounds, batches of ~{target * 1e3:.0f} ms):")
        measure(cases, rounds, target)
        return report(cases)
    finally:
        zmap.close()
        store.close()
        filesystem.zip.close()
        filesystem.fo.close()


def run(chunks: int, rounds: int, target: float, open_repeats: int) -> bool:
    with tempfile.TemporaryDirectory(prefix="nczmap-bench-") as directory:
        path = os.path.join(directory, "store.zip")
        start = time.perf_counter()
        entries = build_archive(path, chunks)
        built = time.perf_counter() - start
        size = os.path.getsize(path)
        print(f"archive: {entries:,} entries, {size / 2**20:.1f} MiB, built in {built:.2f} s")
        with asyncio.Runner() as runner:
            print(f"\none-off open (median of {open_repeats} opens):")
            for name, seconds in open_costs(runner, path, open_repeats).items():
                print(f"  {name:<62} {fmt_time(seconds)}")
            met = compare(runner, path, rounds, target)
    verdict = "TARGET MET" if met else "TARGET MISSED"
    print(f"\n{verdict} overall: nczmap search ≥ {TARGET_SPEEDUP:.0f}× faster per call than zarr list_dir")
    return met


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=None, help="chunk entries under v (default 100000)")
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds (default 7, quick 3)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    chunks = args.entries if args.entries is not None else 2_000 if args.quick else 100_000
    rounds = args.rounds if args.rounds is not None else 3 if args.quick else 7
    target = 0.01 if args.quick else 0.1
    run(max(chunks, 4), rounds, target, open_repeats=2 if args.quick else 3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
