"""Remote coalescing: a virtual array of 10,000 references into one S3 object, against one whole-object GET.

One object (256 MiB of ``<f8``, ``--size``) is uploaded to moto's S3 server, which runs as a child process on
127.0.0.1 (so its work does not share this process's GIL). Two kerchunk JSON manifests describe an array
whose 10,000 chunks (``--chunks``) are consecutive ranges of that object, one listing the references in file
order, one shuffled. Measured side by side, rounds interleaved:

(a) one ``obstore.get(store, key).bytes()`` of the whole object (the same bytes, one request);
(b) ``nczmap.open_dataset(manifest).variables["v"][...]``, the whole array through the manifest driver,
    which merges neighbouring references and reads the merged spans as concurrent range GETs.

Times are taken straight to moto; requests are counted in one more run of each through a counting proxy
(``tests/s3proxy.py``). Target (issue 16, item 5): (b) at least 0.8x the throughput of (a), with at least
20x fewer requests than chunks.

    .venv/bin/python bench/bench_manifest_s3.py [--size 256] [--chunks 10000] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_s3_requests import moto_process, s3_store
from kerchunk_refs import array_refs
from s3proxy import S3Proxy
from s3server import BUCKET, CREDENTIALS

import nczmap

KEY = "coalesce/data.bin"
MIB = float(1 << 20)


def upload(endpoint: str, size: int) -> np.ndarray:
    import obstore

    values = np.arange(size // 8, dtype="<f8")
    obstore.put(s3_store(endpoint), KEY, memoryview(values).cast("B"))
    return values


def write_manifests(directory: Path, chunks: int, chunk_bytes: int) -> dict[str, str]:
    manifests = {}
    for label, seed in (("file order", None), ("shuffled", 3)):
        path = directory / f"{label.replace(' ', '-')}.json"
        refs = array_refs(f"s3://{BUCKET}/{KEY}", chunks, chunk_bytes, seed=seed)
        path.write_text(json.dumps({"version": 1, "refs": refs}))
        manifests[label] = path.as_uri() + "#mode=zarr,manifest"
    return manifests


def grant(endpoint: str) -> dict:
    return {f"s3://{BUCKET}/{KEY.rpartition('/')[0]}/": {"endpoint": endpoint, "region": "us-east-1"}}


def read_whole_object(endpoint: str, size: int) -> float:
    import obstore

    store = s3_store(endpoint)
    start = time.perf_counter()
    data = obstore.get(store, KEY).bytes()
    elapsed = time.perf_counter() - start
    if len(data) != size:
        raise RuntimeError(f"the whole-object GET returned {len(data)} of {size} bytes")
    return elapsed


def read_manifest(manifest: str, endpoint: str, expected: np.ndarray | None = None) -> float:
    with nczmap.open_dataset(manifest, containers=grant(endpoint)) as ds:
        var = ds.variables["v"]
        start = time.perf_counter()
        data = var[...]
        elapsed = time.perf_counter() - start
    if expected is not None and not np.array_equal(data, expected):
        raise RuntimeError("the manifest read returned the wrong values")
    return elapsed


def counted(proxy: S3Proxy, action) -> dict[str, int]:
    proxy.reset()
    action()
    return proxy.snapshot()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="MiB in the object (default 256)")
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="8 MiB, 200 chunks, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.size, args.chunks, args.rounds = 8, 200, 1
    os.environ.update(CREDENTIALS)
    chunk_bytes = (args.size << 20) // args.chunks // 8 * 8
    size = chunk_bytes * args.chunks
    import importlib.metadata as meta

    from nczmap.zmap.manifest_sources import REMOTE_GAP

    versions = ", ".join(f"{p} {meta.version(p)}" for p in ("obstore", "moto"))
    print(f"Remote coalescing ({versions}); moto in a child process on 127.0.0.1")
    print(
        f"one object of {size / MIB:.1f} MiB; {args.chunks} references of {chunk_bytes} bytes into it; "
        f"REMOTE_GAP {REMOTE_GAP >> 10} KiB\n"
    )
    verdicts = []
    with moto_process() as moto, S3Proxy(moto) as proxy, tempfile.TemporaryDirectory() as tmp:
        values = upload(moto, size)
        manifests = write_manifests(Path(tmp), args.chunks, chunk_bytes)
        whole_counts = counted(proxy, lambda: read_whole_object(proxy.endpoint, size))
        print(
            f"{'reader':<44} {'median':>9} {'best':>9} {'MiB/s':>7} {'GET':>5} {'HEAD':>5} "
            f"{'chunks/request':>15}"
        )
        for label, manifest in manifests.items():
            read_manifest(manifest, moto, values)  # warm up, check the values
            read_whole_object(moto, size)
            counts = counted(proxy, lambda m=manifest: read_manifest(m, proxy.endpoint, values))
            in_flight = proxy.max_in_flight["GET"]
            ours, whole = [], []
            for _ in range(args.rounds):  # interleaved, so drifting load hits both alike
                ours.append(read_manifest(manifest, moto))
                whole.append(read_whole_object(moto, size))
            requests = sum(counts.values())
            rows = (
                ("(a) obstore.get(whole object).bytes()", whole, whole_counts),
                (f"(b) nczmap manifest, references {label}", ours, counts),
            )
            for name, times, seen in rows:
                median = statistics.median(times)
                per_request = f"{args.chunks / max(1, sum(seen.values())):.1f}" if seen is counts else "-"
                print(
                    f"{name:<44} {median * 1000:>6.0f} ms {min(times) * 1000:>6.0f} ms "
                    f"{size / MIB / median:>7.0f} {seen['GET']:>5} {seen['HEAD']:>5} {per_request:>15}"
                )
            ratio = statistics.median(w / o for w, o in zip(whole, ours, strict=True))
            fewer = args.chunks / max(1, requests)
            print(
                f"    throughput (b)/(a) {ratio:.2f}×; {requests} requests for {args.chunks} chunks "
                f"({fewer:.1f}× fewer); at most {in_flight} GETs in flight\n"
            )
            verdicts.append(
                f"TARGET {'MET   ' if ratio >= 0.8 and fewer >= 20 else 'MISSED'} references {label}: "
                f"{ratio:.2f}× the whole-object GET's throughput (≥ 0.8), {fewer:.1f}× fewer requests "
                "than chunks (≥ 20)"
            )
    for line in verdicts:
        print(line)


if __name__ == "__main__":
    main()
