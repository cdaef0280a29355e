"""S3 requests and speed: what nczmap asks of the server, side by side with zarr-python + xarray.

moto runs as a separate process on 127.0.0.1, so the client's threads do not share its GIL. A counting
proxy (``tests/s3proxy.py``, in this process) sits in front of it, and every request is counted by kind.

1. Metadata: a 50-variable NCZarr (D3) store (a root group and 4 subgroups, 10 variables each), plain and
   consolidated. ``python -m nczmap ncdump -h`` runs as a subprocess.
   Targets: 0 HEAD, 0 LIST and at most 2 GETs per group and per variable; consolidated: exactly 1 GET.
   Compared with ``zarr.storage.ObjectStore`` + ``xarray.open_zarr`` (once per group) and
   ``xarray.open_datatree`` on the same stores.
2. Chunk throughput: one variable of N uncompressed 1 MiB chunks, read whole with nczmap, against a plain
   loop of ``obstore.get(store, path).bytes()`` (and an ``asyncio.gather`` of ``get_async``) over the same
   objects. Target: nczmap ≥ 0.8× the loop. Reported straight to moto and through the proxy, with the most
   GETs the proxy saw in flight at once for nczmap (bounded concurrency).

moto serves about 300 requests/s on a 2-core box, so wall times here measure request counts more than I/O.

    .venv/bin/python bench/bench_s3_requests.py [--chunks 64] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from s3proxy import S3Proxy
from s3server import BUCKET, CREDENTIALS, free_port

import nczmap

CHUNK_BYTES = 1 << 20
MIB = float(1 << 20)


# -------------------------------------------------------------------------------------------------- servers
@contextlib.contextmanager
def moto_process():
    """moto's server in a child process on 127.0.0.1 with the bucket created; yields its endpoint."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("moto did not start") from None
                time.sleep(0.05)
        endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        process.terminate()
        process.wait(10)


def s3_store(endpoint: str, prefix: str | None = None):
    """An obstore S3Store configured as nczmap configures its own."""
    from obstore.store import S3Store

    return S3Store(
        BUCKET,
        prefix=prefix,
        endpoint=endpoint,
        region="us-east-1",
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
    )


def url(endpoint: str, root: str, mode: str = "nczarr,s3") -> str:
    return f"{endpoint}/{BUCKET}/{root}#mode={mode}"


# ---------------------------------------------------------------------------------------------- 1. metadata
def build_metadata_store(target: str, groups: int, per_group: int) -> None:
    with nczmap.create_dataset(target) as ds:
        ds.attrs["title"] = "S3 request benchmark"
        ds.create_dimension("x", 10)
        ds.create_dimension("y", 20)
        for g in range(groups):
            group = ds if g == 0 else ds.create_group(f"g{g}")
            for v in range(per_group):
                var = group.create_variable(f"v{v}", ("x", "y"), "f4", data=np.full((10, 20), v, "f4"))
                var.attrs["units"] = "m s-1"
                var.attrs["long_name"] = f"variable {v} of group {g}"


def counted(proxy: S3Proxy, action) -> tuple[dict[str, int], float]:
    proxy.reset()
    start = time.perf_counter()
    action()
    return proxy.snapshot(), time.perf_counter() - start


def ncdump_header(target: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nczmap", "ncdump", "-h", target],
        capture_output=True,
        text=True,
        env={**os.environ, **CREDENTIALS},
        timeout=120,
        check=False,
    )
    if result.returncode != 0 or "variables:" not in result.stdout:
        raise RuntimeError(f"nczmap ncdump -h failed: {result.stderr.strip()}")


def xarray_per_group(store, groups: int, consolidated: bool) -> None:
    import xarray as xr

    for g in range(groups):
        xr.open_zarr(store, group=None if g == 0 else f"g{g}", consolidated=consolidated).close()


def xarray_tree(store, consolidated: bool) -> None:
    import xarray as xr

    xr.open_datatree(store, engine="zarr", consolidated=consolidated).close()


def metadata_benchmark(proxy: S3Proxy, groups: int, per_group: int) -> list[str]:
    import zarr

    plain, consolidated = "meta-plain", "meta-consolidated"
    build_metadata_store(url(proxy.endpoint, plain), groups, per_group)
    build_metadata_store(url(proxy.endpoint, consolidated, "nczarr,s3,consolidated"), groups, per_group)
    variables = groups * per_group
    budget = 2 * (groups + variables)

    def zarr_store(root: str):
        return zarr.storage.ObjectStore(s3_store(proxy.endpoint, root), read_only=True)

    rows = []
    for root, mode, cons in ((plain, "nczarr,s3", False), (consolidated, "nczarr,s3,consolidated", True)):
        label = "consolidated" if cons else "plain"
        rows.append(
            (
                label,
                "nczmap ncdump -h (a process)",
                *counted(proxy, lambda r=root, m=mode: ncdump_header(url(proxy.endpoint, r, m))),
            )
        )
        rows.append(
            (
                label,
                f"xarray.open_zarr × {groups} groups",
                *counted(proxy, lambda r=root, c=cons: xarray_per_group(zarr_store(r), groups, c)),
            )
        )
        rows.append(
            (
                label,
                "xarray.open_datatree",
                *counted(proxy, lambda r=root, c=cons: xarray_tree(zarr_store(r), c)),
            )
        )

    print(f"1. Metadata: NCZarr D3 store, {groups} groups, {variables} variables (2 metadata objects each)")
    print(
        f"   {'store':<13} {'reader':<32} {'HEAD':>5} {'LIST':>5} {'GET':>5} {'wall':>9}  (through the proxy)"
    )
    for label, reader, counts, wall in rows:
        print(
            f"   {label:<13} {reader:<32} {counts['HEAD']:>5} {counts['LIST']:>5} {counts['GET']:>5} "
            f"{wall * 1000:>6.0f} ms"
        )
    plain_counts, cons_counts = rows[0][2], rows[3][2]
    zarr_tree = rows[2][2]
    verdicts = [
        _verdict(
            plain_counts["HEAD"] == 0 and plain_counts["LIST"] == 0,
            f"ncdump -h: 0 HEAD and 0 LIST (got {plain_counts['HEAD']} HEAD, {plain_counts['LIST']} LIST)",
        ),
        _verdict(
            plain_counts["GET"] <= budget,
            f"ncdump -h: ≤ 2 GETs per group and per variable = {budget} (got {plain_counts['GET']}"
            + (", the extra one is the /.zmetadata probe)" if plain_counts["GET"] == budget + 1 else ")"),
        ),
        _verdict(
            cons_counts["GET"] == 1 and cons_counts["HEAD"] == cons_counts["LIST"] == 0,
            f"consolidated ncdump -h: exactly 1 GET (got {cons_counts['GET']} GET, "
            f"{cons_counts['HEAD']} HEAD, {cons_counts['LIST']} LIST)",
        ),
    ]
    ratio = (zarr_tree["GET"] + zarr_tree["LIST"] + zarr_tree["HEAD"]) / max(1, sum(plain_counts.values()))
    print(f"   requests, xarray.open_datatree / nczmap ncdump -h (plain store): {ratio:.2f}×")
    return verdicts


# -------------------------------------------------------------------------------------------- 2. throughput
def build_chunked_variable(endpoint: str, root: str, chunks: int) -> tuple[str, list[str], np.ndarray]:
    per_chunk = CHUNK_BYTES // 8
    values = np.arange(chunks * per_chunk, dtype="f8")
    target = url(endpoint, root)
    with nczmap.create_dataset(target) as ds:
        ds.create_dimension("x", values.size)
        var = ds.create_variable("v", ("x",), "f8", data=values, chunks=(per_chunk,))
        paths = [root + var.chunk_key((i,)) for i in range(chunks)]
    return root, paths, values


def read_nczmap(target: str, expected: np.ndarray | None = None) -> float:
    with nczmap.open_dataset(target) as ds:
        var = ds.variables["v"]
        start = time.perf_counter()
        data = var[...]
        elapsed = time.perf_counter() - start
    if expected is not None and not np.array_equal(data, expected):
        raise RuntimeError("nczmap read the wrong values")
    return elapsed


def read_zmap_pool(target: str, chunks: int) -> float:
    """The driver alone: ``read_into`` of every chunk on nczmap's own pool (no selection planning)."""
    from nczmap.concurrency import run_bounded

    with nczmap.open_map(target, "r") as zmap:
        start = time.perf_counter()
        out = np.empty(chunks * CHUNK_BYTES, dtype="u1")
        views = [memoryview(out[i * CHUNK_BYTES : (i + 1) * CHUNK_BYTES]) for i in range(chunks)]
        tasks = [lambda i=i: zmap.read_into(f"/v/{i}", views[i]) for i in range(chunks)]
        got = sum(run_bounded(tasks))
        elapsed = time.perf_counter() - start
    if got != chunks * CHUNK_BYTES:
        raise RuntimeError("the zmap read the wrong sizes")
    return elapsed


def read_obstore_loop(store, paths: list[str]) -> float:
    import obstore

    start = time.perf_counter()
    total = 0
    for path in paths:
        total += len(obstore.get(store, path).bytes())
    elapsed = time.perf_counter() - start
    if total != len(paths) * CHUNK_BYTES:
        raise RuntimeError("obstore read the wrong sizes")
    return elapsed


def read_obstore_gather(runner: asyncio.Runner, store, paths: list[str]) -> float:
    import obstore

    async def one(path: str) -> int:
        result = await obstore.get_async(store, path)
        return len(await result.bytes_async())

    async def run() -> float:
        start = time.perf_counter()
        sizes = await asyncio.gather(*(one(p) for p in paths))
        elapsed = time.perf_counter() - start
        if sum(sizes) != len(paths) * CHUNK_BYTES:
            raise RuntimeError("obstore read the wrong sizes")
        return elapsed

    return runner.run(run())


def throughput_benchmark(moto: str, proxy: S3Proxy, chunks: int, rounds: int) -> list[str]:
    root, paths, values = build_chunked_variable(moto, "throughput", chunks)
    size_mib = chunks * CHUNK_BYTES / MIB
    print(f"\n2. Chunk throughput: one variable, {chunks} uncompressed chunks of 1 MiB ({size_mib:.0f} MiB)")
    print(f"   {'route':<16} {'reader':<40} {'median':>10} {'best':>10}  {'median MiB/s':>12}")
    verdicts = []
    with asyncio.Runner() as runner:
        for route, endpoint in (("straight to moto", moto), ("through proxy", proxy.endpoint)):
            target = url(endpoint, root)
            store = s3_store(endpoint)
            read_nczmap(target, values)  # warm up both clients, check the values
            read_obstore_loop(store, paths)
            cases = {
                "nczmap variables['v'][...]": lambda t=target: read_nczmap(t),
                "nczmap zmap.read_into on its pool": lambda t=target: read_zmap_pool(t, chunks),
                "obstore.get(...).bytes() loop": lambda s=store: read_obstore_loop(s, paths),
                "obstore get_async, asyncio.gather": lambda s=store: read_obstore_gather(runner, s, paths),
            }
            samples: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(rounds):  # interleaved, so drifting load hits every reader alike
                for name, case in cases.items():
                    samples[name].append(case())
            for name, times in samples.items():
                median = statistics.median(times)
                print(
                    f"   {route:<16} {name:<40} {median * 1000:>7.0f} ms {min(times) * 1000:>7.0f} ms  "
                    f"{size_mib / median:>12.0f}"
                )
            nczmap_time = statistics.median(samples["nczmap variables['v'][...]"])
            loop_time = statistics.median(samples["obstore.get(...).bytes() loop"])
            ratio = loop_time / nczmap_time
            driver = loop_time / statistics.median(samples["nczmap zmap.read_into on its pool"])
            print(f"   {route:<16} nczmap variable / obstore loop throughput: {ratio:.2f}×")
            print(f"   {route:<16} nczmap zmap (driver) / obstore loop throughput: {driver:.2f}×")
            if endpoint == moto:  # through the proxy, the proxy shares this process's GIL with the readers
                verdicts.append(
                    _verdict(
                        ratio >= 0.8, f"nczmap variable read ≥ 0.8× the obstore get loop (got {ratio:.2f}×)"
                    )
                )
    proxy.reset()
    read_nczmap(url(proxy.endpoint, root))
    counts = proxy.snapshot()
    in_flight = proxy.max_in_flight["GET"]
    from nczmap.concurrency import WIDTH

    print(
        f"   nczmap read through the proxy: {counts['GET']} GETs ({chunks} chunks + metadata), "
        f"{counts['HEAD']} HEAD, {counts['LIST']} LIST; at most {in_flight} GETs in flight "
        f"(pool width {WIDTH})"
    )
    verdicts.append(
        _verdict(
            1 < in_flight <= WIDTH,
            f"chunk GETs concurrent and bounded: 1 < {in_flight} in flight ≤ {WIDTH}",
        )
    )
    return verdicts


def _verdict(met: bool, text: str) -> str:
    return f"TARGET {'MET   ' if met else 'MISSED'} {text}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--variables", type=int, default=50, help="in all, spread over the groups")
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run")
    args = parser.parse_args()
    if args.quick:
        args.groups, args.variables, args.chunks, args.rounds = 2, 10, 8, 1
    os.environ.update(CREDENTIALS)
    started = time.perf_counter()
    import importlib.metadata as meta

    versions = ", ".join(f"{p} {meta.version(p)}" for p in ("obstore", "zarr", "xarray", "moto"))
    print(f"S3 requests and throughput ({versions}); moto in a child process on 127.0.0.1\n")
    with moto_process() as moto, S3Proxy(moto) as proxy:
        verdicts = metadata_benchmark(proxy, args.groups, max(1, args.variables // args.groups))
        verdicts += throughput_benchmark(moto, proxy, args.chunks, args.rounds)
    print()
    for line in verdicts:
        print(line)
    print(f"\n(total {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
