"""Manifests at scale: what opening one and reading two chunks costs, and whole-array reads through one.

1. kerchunk Parquet, ``--references`` (default 100,000,000) references in record files of
   ``--record-size`` rows, written here with pyarrow directly and cached under ``--workdir``: open + first
   and last chunk, in a fresh process each time, by nczmap and by fsspec's ``LazyReferenceMapper`` (with
   ``ReferenceFileSystem``) on the same directory. Target: nczmap ≤ 0.2 s and ≤ 150 MiB.
2. kerchunk JSON, ``--json-references`` (default 2,000,000): open + first and last chunk by nczmap and by
   fsspec's ``ReferenceFileSystem``, then the whole array read (open included) by nczmap's ``open_dataset``
   and by ``ReferenceFileSystem`` + zarr (minutes and gigabytes: ``--skip json-peer`` leaves it out), fresh
   processes.
3. A 10,000-chunk whole-array read (16 KiB chunks) through a Parquet manifest, references in file order and
   shuffled, against one ``open().read()`` of the file. Target ≥ 0.8×.
4. The cost of per-reference checksums (``virtualize --checksums``): the same whole-array read through a
   JSON manifest with and without the crc32c of every reference. Target: ≤ 10% of the read time.

Time is counted after the libraries are imported; memory is the child's peak RSS (``VmHWM``; ``getrusage``'s
``ru_maxrss`` survives ``execve``, so a child of a large parent would report the parent's) minus its RSS
when the clock starts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 128  # bytes per chunk of the scale manifests: 16 float64 values
CHILD = r"""
import json, resource, sys, time
which, path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
import numpy, pandas, pyarrow.parquet, fsspec, nczmap
from fsspec.implementations.reference import LazyReferenceMapper, ReferenceFileSystem
from nczmap.zmap import manifest  # the driver's modules, imported before the clock starts
from nczmap.manifest import kerchunk_json, kerchunk_parquet
page = resource.getpagesize()
rss = int(open("/proc/self/statm").read().split()[1]) * page
start = time.perf_counter()
keys = ["v/0", f"v/{count - 1}"]
if which == "fsspec-parquet":
    mapper = LazyReferenceMapper(path, fs=fsspec.filesystem("file"), engine="pyarrow")
    fs = ReferenceFileSystem(fo=mapper, remote_protocol="file")
    data = [fs.cat_file(key) for key in keys]
elif which == "fsspec-json":
    fs = ReferenceFileSystem(fo=path, remote_protocol="file")
    data = [fs.cat_file(key) for key in keys]
elif which == "fsspec-array":
    import zarr
    mapper = fsspec.get_mapper("reference://v", fo=path, remote_protocol="file")
    values = zarr.open_array(mapper, mode="r", zarr_format=2)[...]
    assert values.size == count * 16
    data = [b"x" * 128] * 2
elif which == "nczmap-array":
    with nczmap.open_dataset(path + "#mode=zarr,manifest") as ds:
        values = ds.variables["v"][...]
    assert values.size == count * 16
    data = [b"x" * 128] * 2
else:
    with nczmap.open_map(path + "#mode=zarr,manifest", "r") as zmap:
        data = [zmap.read("/" + key) for key in keys]
seconds = time.perf_counter() - start
assert [len(d) for d in data] == [128, 128], [len(d) for d in data]
# VmHWM, not getrusage's ru_maxrss: that survives execve, so a child of a large process reports its peak
peak = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
print(json.dumps({"seconds": seconds, "delta": peak - rss, "peak": peak}))
"""


def zarray(count: int, per_chunk: int) -> dict:
    return {
        "zarr_format": 2,
        "shape": [count * per_chunk],
        "chunks": [per_chunk],
        "dtype": "<f8",
        "compressor": None,
        "filters": None,
        "fill_value": None,
        "order": "C",
    }


def sparse_file(path: Path, size: int) -> None:
    """A file of ``size`` zero bytes that takes no disk (a hole), created once."""
    if not path.exists() or path.stat().st_size != size:
        with open(path, "wb") as handle:
            handle.truncate(size)


# ------------------------------------------------------------------------------------------ building
def record_file(path: Path, url: str, offsets, sizes, rows: int) -> None:
    """One kerchunk record file as kerchunk writes them (fastparquet's schema and pandas metadata)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nczmap.manifest.kerchunk_parquet import PANDAS_METADATA

    n = len(offsets)
    valid = np.zeros(rows, dtype=bool)
    valid[:n] = True
    indices = pa.array(np.zeros(rows, dtype=np.int32), mask=~valid)
    table = pa.table(
        {
            "path": pa.DictionaryArray.from_arrays(indices, pa.array([url])).cast(pa.string()),
            "offset": np.concatenate([offsets, np.zeros(rows - n, np.int64)]),
            "size": np.concatenate([sizes, np.zeros(rows - n, np.int64)]),
            "raw": pa.nulls(rows, pa.binary()),
        }
    )
    schema = pa.schema([pa.field(f.name, f.type, nullable=f.name in ("path", "raw")) for f in table.schema])
    options = {"compression": "zstd", "write_statistics": False, "store_schema": False}
    with pq.ParquetWriter(path, schema, **options) as out:
        out.write_table(table.cast(schema))
        out.add_key_value_metadata({"pandas": PANDAS_METADATA})


def build_parquet(root: Path, data: Path, count: int, per_chunk: int, record_size: int, order) -> None:
    """A Parquet manifest of ``count`` references (chunk ``i`` at ``order[i]`` in ``data``), written
    record by record; ``.zmetadata`` last, so a directory holding it is complete."""
    import numpy as np

    chunk = per_chunk * 8
    (root / "v").mkdir(parents=True, exist_ok=True)
    for record in range(-(-count // record_size)):
        start, stop = record * record_size, min(count, (record + 1) * record_size)
        where = np.arange(start, stop, dtype=np.int64) if order is None else order[start:stop]
        sizes = np.full(stop - start, chunk, dtype=np.int64)
        record_file(root / "v" / f"refs.{record}.parq", str(data), where * chunk, sizes, record_size)
    metadata = {".zgroup": {"zarr_format": 2}, "v/.zarray": zarray(count, per_chunk)}
    metadata["v/.zattrs"] = {"_ARRAY_DIMENSIONS": ["x"]}
    document = {"metadata": metadata, "record_size": record_size}
    (root / ".zmetadata").write_text(json.dumps(document))


def build_json(path: Path, data: Path, count: int) -> None:
    url = json.dumps(str(data))
    metadata = {".zgroup": json.dumps({"zarr_format": 2}), "v/.zarray": json.dumps(zarray(count, 16))}
    with open(path.with_suffix(".tmp"), "w") as out:
        out.write('{"version":1,"refs":{' + json.dumps(metadata)[1:-1])
        step = 100_000
        for first in range(0, count, step):
            refs = (f'"v/{i}":[{url},{i * CHUNK},{CHUNK}]' for i in range(first, min(count, first + step)))
            out.write("," + ",".join(refs))
        out.write("}}")
    os.replace(path.with_suffix(".tmp"), path)


def scale_parquet(workdir: Path, count: int, record_size: int) -> Path:
    root = workdir / f"scale-{count}-{record_size}.parq"
    data = workdir / "scale.bin"
    sparse_file(data, count * CHUNK)
    if not (root / ".zmetadata").exists():
        started = time.perf_counter()
        build_parquet(root, data, count, 16, record_size, None)
        took = time.perf_counter() - started
        print(f"  (wrote {count:,} Parquet references in {took:.0f} s to {root})", flush=True)
    return root


def scale_json(workdir: Path, count: int) -> Path:
    path = workdir / f"scale-{count}.json"
    data = workdir / "scale.bin"
    if not data.exists() or data.stat().st_size < count * CHUNK:
        sparse_file(data, count * CHUNK)
    if not path.exists():
        build_json(path, data, count)
    return path


# ------------------------------------------------------------------------------------------ measuring
def fresh(which: str, path: Path, count: int, rounds: int) -> dict:
    runs = []
    for _ in range(rounds):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, which, str(path), str(count)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
        runs.append(json.loads(done.stdout))
    return {name: statistics.median(r[name] for r in runs) for name in runs[0]}


def show(name: str, result: dict) -> None:
    if "error" in result:
        print(f"  {name:34s} failed: {result['error'][:200]}")
        return
    seconds, delta, peak = result["seconds"], result["delta"] / 2**20, result["peak"] / 2**20
    print(f"  {name:34s} {seconds * 1000:9.1f} ms   RSS +{delta:7.1f} MiB (peak {peak:6.0f} MiB)")


def compare(ours: dict, theirs: dict) -> None:
    if "error" not in ours and "error" not in theirs:
        ratio = theirs["seconds"] / ours["seconds"]
        print(f"  speed nczmap/fsspec {ratio:.2f}×, memory nczmap/fsspec "
              f"{ours['delta'] / max(theirs['delta'], 1):.2f}×")  # fmt: skip


def whole_array(workdir: Path, chunks: int, rounds: int) -> None:
    import numpy as np

    import nczmap

    per_chunk = (16 << 10) // 8
    values = np.arange(chunks * per_chunk, dtype="<f8")
    data = workdir / f"array-{chunks}.bin"
    if not data.exists() or data.stat().st_size != values.nbytes:
        data.write_bytes(values.tobytes())
    for shuffled in (False, True):
        order = np.random.default_rng(1).permutation(chunks) if shuffled else None
        root = workdir / f"array-{chunks}-{'shuffled' if shuffled else 'ordered'}.parq"
        if not (root / ".zmetadata").exists():
            build_parquet(root, data, chunks, per_chunk, 10_000, order)
        expected = values if order is None else values.reshape(chunks, per_chunk)[order].ravel()
        url = root.as_uri() + "#mode=zarr,manifest"

        def ours(url: str = url) -> np.ndarray:
            with nczmap.open_dataset(url) as ds:
                return ds.variables["v"][...]

        def raw() -> bytes:
            with open(data, "rb") as handle:
                return handle.read()

        assert np.array_equal(ours(), expected)
        raw()
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            ours()
            middle = time.perf_counter()
            raw()
            times.append((middle - start, time.perf_counter() - middle))
        mine, theirs = (statistics.median(t[i] for t in times) for i in range(2))
        ratio = statistics.median(t[1] / t[0] for t in times)
        label = "shuffled" if shuffled else "file order"
        print(f"{chunks:,} references of 16 KiB ({values.nbytes / 2**20:.0f} MiB), Parquet, {label}:")
        print(f"  nczmap whole-array read            {mine * 1000:9.1f} ms")
        print(f"  open().read() of the file          {theirs * 1000:9.1f} ms")
        verdict = "TARGET MET" if ratio >= 0.8 else "TARGET MISSED"
        print(f"  throughput nczmap/open().read()    {ratio:9.2f}×  (target ≥ 0.8)  {verdict}")


def checksum_cost(workdir: Path, chunks: int, rounds: int) -> None:
    """Whole-array reads through JSON manifests of the same references, without and with checksums."""
    import numpy as np

    import nczmap
    from nczmap.checksum import crc32c

    per_chunk = (16 << 10) // 8
    values = np.arange(chunks * per_chunk, dtype="<f8")
    data = workdir / f"array-{chunks}.bin"
    if not data.exists() or data.stat().st_size != values.nbytes:
        data.write_bytes(values.tobytes())
    size = per_chunk * 8
    refs = {".zgroup": json.dumps({"zarr_format": 2}), "v/.zarray": json.dumps(zarray(chunks, per_chunk))}
    refs["v/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["x"]})
    refs.update({f"v/{i}": [str(data), i * size, size] for i in range(chunks)})
    blob = values.tobytes()
    crc = {f"v/{i}": crc32c(blob[i * size : (i + 1) * size]) for i in range(chunks)}
    paths = {}
    for name, extension in (("plain", {}), ("checked", {"nczmap": {"crc32c": crc}})):
        paths[name] = workdir / f"array-{chunks}-{name}.json"
        paths[name].write_text(json.dumps({"version": 1, "refs": refs, **extension}))

    def read(path: Path) -> float:
        start = time.perf_counter()
        with nczmap.open_dataset(path.as_uri() + "#mode=nczarr,manifest") as ds:
            got = ds.variables["v"][...]
        took = time.perf_counter() - start
        assert np.array_equal(got, values)
        return took

    read(paths["plain"]), read(paths["checked"])
    pairs = []  # interleaved, the order alternating: drift in the machine's speed hits both alike
    for round_number in range(rounds):
        order = ("plain", "checked") if round_number % 2 else ("checked", "plain")
        took = {name: read(paths[name]) for name in order}
        pairs.append((took["plain"], took["checked"]))
    times = {
        "plain": statistics.median(p for p, _ in pairs),
        "checked": statistics.median(c for _, c in pairs),
    }
    cost = statistics.median(c / p for p, c in pairs) - 1
    print(
        f"{chunks:,} references of 16 KiB, JSON, whole-array read (open included), medians of {rounds} "
        "interleaved pairs:"
    )
    print(f"  without checksums                  {times['plain'] * 1000:9.1f} ms")
    print(f"  with crc32c checked                {times['checked'] * 1000:9.1f} ms")
    verdict = "TARGET MET" if cost <= 0.10 else "TARGET MISSED"
    print(f"  cost of checking                   {cost * 100:8.1f} %   (target ≤ 10%)  {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--references", type=int, default=100_000_000, help="Parquet references")
    parser.add_argument("--record-size", type=int, default=100_000)
    parser.add_argument("--json-references", type=int, default=2_000_000)
    parser.add_argument("--chunks", type=int, default=10_000, help="chunks of the whole-array read")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="where manifests are cached")
    parser.add_argument(
        "--skip", default="", help="comma-separated: parquet, json, json-peer, array, checksums"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.references, args.record_size, args.json_references, args.chunks, args.rounds = (
            20_000, 1000, 10_000, 200, 1)  # fmt: skip
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.workdir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        if "parquet" not in skip:
            root = scale_parquet(workdir, args.references, args.record_size)
            print(f"{args.references:,} Parquet references (records of {args.record_size:,}): open + first "
                  f"and last chunk, fresh process (median of {args.rounds})")  # fmt: skip
            ours = fresh("nczmap", root, args.references, args.rounds)
            show("nczmap", ours)
            show("fsspec LazyReferenceMapper", fresh("fsspec-parquet", root, args.references, args.rounds))
            met = "error" not in ours and ours["seconds"] <= 0.2 and ours["delta"] <= 150 * 2**20
            print(f"  nczmap ≤ 0.2 s and ≤ 150 MiB: {'TARGET MET' if met else 'TARGET MISSED'}")
        if "json" not in skip:
            path = scale_json(workdir, args.json_references)
            print(f"{args.json_references:,} JSON references: open + first and last chunk, fresh process")
            ours = fresh("nczmap", path, args.json_references, args.rounds)
            theirs = fresh("fsspec-json", path, args.json_references, args.rounds)
            show("nczmap", ours)
            show("fsspec ReferenceFileSystem", theirs)
            compare(ours, theirs)
            print(f"{args.json_references:,} JSON references: open + whole array, fresh process")
            ours = fresh("nczmap-array", path, args.json_references, args.rounds)
            show("nczmap open_dataset", ours)
            if "json-peer" not in skip:
                theirs = fresh("fsspec-array", path, args.json_references, 1)
                show("fsspec ReferenceFileSystem + zarr", theirs)
                compare(ours, theirs)
        if "array" not in skip:
            whole_array(workdir, args.chunks, args.rounds)
        if "checksums" not in skip:
            checksum_cost(workdir, args.chunks, max(args.rounds, 21))


if __name__ == "__main__":
    main()
