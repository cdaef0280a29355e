"""Benchmark: the file driver's ``search`` costs one directory scan, not a tree walk.

What is measured
    Two directory stores (Zarr v2 layout, one-byte chunk files) are built with plain ``os`` calls:

    * big:   ``--groups`` groups × ``--arrays`` arrays × ``--chunks`` chunks (default 50 × 100 × 3, about
      20,000 files), plus an array ``wide`` whose directory holds ``--entries`` chunks (default 10,000);
    * small: the same root (the same ``--groups`` groups and ``wide``), but one array of one chunk per group
      and 10 chunks in ``wide`` — the root directory is identical, the tree below it is tiny.

    Per call (interleaved rounds, median; warm OS caches), side by side in one process:

    * nczmap file driver ``search(prefix)`` (scandir, name filter, sort) for ``/``, ``/g0``, ``/wide``,
    * zarr-python ``LocalStore.list_dir(prefix)`` drained into a list, every call inside one coroutine on one
      event loop, timed inside the coroutine (event-loop start-up not counted),
    * raw ``os.scandir`` names of the same directory (the floor),
    * ``os.walk`` of the whole tree (what a search that walked the tree would cost),
    * ``search("/")`` on the small tree, to show the cost depends on the directory listed, not on the tree.

    Printed ratios: nczmap/scandir (expected about 1-2×), zarr/nczmap, walk/search and big/small.

How to run
    .venv/bin/python bench/bench_file_search.py             # default sizes, 10-30 s (mostly the build)
    .venv/bin/python bench/bench_file_search.py --quick     # smoke test, a few seconds
    .venv/bin/python bench/bench_file_search.py --entries 20000 --groups 50 --arrays 200 --chunks 5
    .venv/bin/python bench/bench_file_search.py --tmpdir /dev/shm   # build on tmpfs where creating
                                                                     # files on the disk is slow

The trees are built in a ``tempfile.TemporaryDirectory`` (under ``--tmpdir``, else ``$TMPDIR`` or ``/tmp``)
and removed at the end. Creating a file cost from 0.01 ms (tmpfs) to 0.7 ms (a busy virtual disk) on the
test box, which dominates the run time: the default tree (30,000 files) builds in 1-20 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from _common import Case, array_meta, async_batch, fmt_ratio, fmt_time, measure, print_cases, sync_batch
from zarr.storage import LocalStore

import nczmap

# nczmap prefix -> zarr-python list_dir prefix ("" is the root).
PREFIXES = {"/": "", "/g0": "g0", "/wide": "wide"}
GROUP = json.dumps({"zarr_format": 2}).encode()


@dataclass(frozen=True)
class Shape:
    """The size of one directory tree."""

    groups: int
    arrays: int
    chunks: int
    wide: int

    @property
    def files(self) -> int:
        return 2 + self.groups * (1 + self.arrays * (1 + self.chunks)) + self.wide


# ---------------------------------------------------------------------------------------------- building


def tree_files(shape: Shape) -> Iterator[tuple[str, bytes]]:
    """Relative paths and contents of every file of the tree, parents' metadata first."""
    yield ".zgroup", GROUP
    for group in range(shape.groups):
        yield f"g{group}/.zgroup", GROUP
        for array in range(shape.arrays):
            yield f"g{group}/a{array}/.zarray", array_meta(shape.chunks)
            for chunk in range(shape.chunks):
                yield f"g{group}/a{array}/{chunk}", b"\0"
    yield "wide/.zarray", array_meta(shape.wide)
    for chunk in range(shape.wide):
        yield f"wide/{chunk}", b"\0"


def build_tree(root: str, shape: Shape) -> int:
    """Create the tree under ``root`` with plain ``os`` calls; returns the number of files."""
    count = 0
    made: set[str] = set()
    for relative, data in tree_files(shape):
        path = os.path.join(root, relative)
        directory = os.path.dirname(path)
        if directory not in made:
            os.makedirs(directory, exist_ok=True)
            made.add(directory)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        count += 1
    return count


# ---------------------------------------------------------------------------------------------- listing
def scandir_names(path: str) -> list[str]:
    with os.scandir(path) as entries:
        return [entry.name for entry in entries]


def walk_tree(root: str) -> int:
    """Visit every directory and file of the tree; returns the number of names seen."""
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(root))


def zarr_names(runner: asyncio.Runner, store: LocalStore, prefix: str) -> list[str]:
    async def drain() -> list[str]:
        return [name async for name in store.list_dir(prefix)]

    return runner.run(drain())


def verify(runner: asyncio.Runner, root: str, store: LocalStore, zmap: nczmap.ZMap) -> dict[str, int]:
    """Check nczmap, zarr and raw scandir list the same names; returns the nczmap result sizes."""
    sizes = {}
    for ours, theirs in PREFIXES.items():
        expected = zmap.search(ours)
        if sorted(zarr_names(runner, store, theirs)) != expected:
            raise SystemExit(f"zarr list_dir({theirs!r}) differs from nczmap search({ours!r})")
        if sorted(scandir_names(os.path.join(root, theirs))) != expected:
            raise SystemExit(f"os.scandir of {theirs!r} differs from nczmap search({ours!r})")
        sizes[ours] = len(expected)
    return sizes


# ---------------------------------------------------------------------------------------------- timing
@dataclass
class Store:
    """One built tree, opened by both libraries."""

    root: str
    files: int
    zmap: nczmap.ZMap
    zarr: LocalStore
    sizes: dict[str, int]


def open_store(runner: asyncio.Runner, root: str, files: int) -> Store:
    zmap = nczmap.open_map(root, "r")
    store = runner.run(LocalStore.open(root, read_only=True))
    return Store(root, files, zmap, store, verify(runner, root, store, zmap))


def listing_cases(runner: asyncio.Runner, big: Store, small: Store) -> list[Case]:
    cases = []
    for ours, theirs in PREFIXES.items():
        size = big.sizes[ours]
        directory = os.path.join(big.root, theirs)
        cases.append(Case(f"big   nczmap search({ours!r})", sync_batch(big.zmap.search, ours), size))
        cases.append(
            Case(f"big   zarr   list_dir({theirs!r})", async_batch(runner, big.zarr.list_dir, theirs), size)
        )
        cases.append(Case(f"big   os.scandir({theirs!r})", sync_batch(scandir_names, directory), size))
    cases.append(Case("small nczmap search('/')", sync_batch(small.zmap.search, "/"), small.sizes["/"]))
    cases.append(Case("small os.scandir('')", sync_batch(scandir_names, small.root), small.sizes["/"]))
    cases.append(Case("big   os.walk(whole tree)", sync_batch(walk_tree, big.root), big.files))
    cases.append(Case("small os.walk(whole tree)", sync_batch(walk_tree, small.root), small.files))
    return cases


def report(cases: list[Case], big: Store, small: Store) -> None:
    by_name = {case.name: case for case in cases}
    print_cases(cases)
    print(f"\n{'prefix':<7} {'names':>6}  {'per name':>11}  {'nczmap/scandir':>14}  {'zarr/nczmap':>11}")
    for ours, theirs in PREFIXES.items():
        search = by_name[f"big   nczmap search({ours!r})"]
        scandir = by_name[f"big   os.scandir({theirs!r})"].median
        zarr = by_name[f"big   zarr   list_dir({theirs!r})"].median
        per_name = fmt_time(search.median / search.size)
        print(
            f"{ours:<7} {search.size:>6}  {per_name:>11}  {fmt_ratio(search.median / scandir):>14}  "
            f"{fmt_ratio(zarr / search.median):>11}"
        )
    report_tree_independence(by_name, big, small)


def report_tree_independence(by_name: dict[str, Case], big: Store, small: Store) -> None:
    big_search = by_name["big   nczmap search('/')"].median
    small_search = by_name["small nczmap search('/')"].median
    big_walk = by_name["big   os.walk(whole tree)"].median
    small_walk = by_name["small os.walk(whole tree)"].median
    names = big.sizes["/"]
    print(f"\nsearch('/') lists {names} names in both trees ({big.files:,} vs {small.files:,} files below):")
    print(f"  big tree:   {fmt_time(big_search)} per call, {fmt_time(big_search / names)} per name")
    print(f"  small tree: {fmt_time(small_search)} per call, {fmt_time(small_search / names)} per name")
    rows = [
        ("search('/')    big/small", big_search / small_search, "≈1: independent of the tree below"),
        ("os.walk        big/small", big_walk / small_walk, "grows with the tree"),
        ("os.walk(big) / search('/')", big_walk / big_search, "what a tree-walking search would cost"),
    ]
    wide = by_name["big   nczmap search('/wide')"]
    rows.append(("os.walk(big) / search('/wide')", big_walk / wide.median, f"{wide.size} names listed"))
    for label, ratio, note in rows:
        print(f"  {label:<31} {fmt_ratio(ratio)}  ({note})")


# ---------------------------------------------------------------------------------------------- driver
def build(root: str, label: str, shape: Shape) -> int:
    start = time.perf_counter()
    files = build_tree(root, shape)
    print(f"{label} tree: {files:,} files, built in {time.perf_counter() - start:.2f} s ({shape})")
    return files


def run(shape: Shape, rounds: int, target: float, tmpdir: str | None) -> None:
    small_shape = Shape(groups=shape.groups, arrays=1, chunks=1, wide=min(10, shape.wide))
    with tempfile.TemporaryDirectory(prefix="nczmap-bench-", dir=tmpdir) as directory:
        big_root = os.path.join(directory, "big.file")
        small_root = os.path.join(directory, "small.file")
        big_files = build(big_root, "big", shape)
        small_files = build(small_root, "small", small_shape)
        with asyncio.Runner() as runner:
            big = open_store(runner, big_root, big_files)
            small = open_store(runner, small_root, small_files)
            try:
                print("\nlistings agree (nczmap search == sorted zarr list_dir == sorted os.scandir)")
                cases = listing_cases(runner, big, small)
                print(f"\nper-call time ({rounds} rounds, batches of ~{target * 1e3:.0f} ms):")
                measure(cases, rounds, target)
                report(cases, big, small)
            finally:
                for store in (big, small):
                    store.zmap.close()
                    store.zarr.close()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=None, help="children of /wide (default 10000)")
    parser.add_argument("--groups", type=int, default=None, help="groups in the big tree (default 50)")
    parser.add_argument("--arrays", type=int, default=None, help="arrays per group (default 100)")
    parser.add_argument("--chunks", type=int, default=None, help="chunks per array (default 3)")
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds (default 7, quick 3)")
    parser.add_argument("--tmpdir", default=None, help="where to build the trees (default: system temp)")
    return parser.parse_args(argv)


def pick(value: int | None, quick: bool, small: int, default: int) -> int:
    return value if value is not None else small if quick else default


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    shape = Shape(
        groups=max(1, pick(args.groups, args.quick, 5, 50)),
        arrays=max(1, pick(args.arrays, args.quick, 20, 100)),
        chunks=max(1, pick(args.chunks, args.quick, 2, 3)),
        wide=max(1, pick(args.entries, args.quick, 500, 10_000)),
    )
    run(shape, pick(args.rounds, args.quick, 3, 7), 0.01 if args.quick else 0.1, args.tmpdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
