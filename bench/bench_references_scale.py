"""References at scale (issue 34): collections of many-chunk files virtualized beside VirtualiZarr.

1. ``--files`` (200) netCDF-4 files of ``--side``² (500²) float32 values in chunks of 1×5×5 (10,000 chunks a
   file: 2,000,000 references), ``time`` unlimited, written with netCDF4-python. Each case runs in a fresh
   process (time counted after the imports; peak RSS is the child's ``VmHWM``):

   - nczmap: ``virtualize(files, out.parq, concat="time")``, to Icechunk (``#mode=icechunk``), to JSON,
     and to Parquet with a ``dask.distributed`` LocalCluster of 2 workers as the executor (its workers'
     peak RSS shown beside);
   - VirtualiZarr: ``open_virtual_mfdataset`` (HDFParser, serial, ``loadable_variables=["time"]``,
     nested along ``time``) alone, + ``to_kerchunk(parquet)``, + ``to_icechunk`` and a commit.

   Targets: nczmap ≥ 5× faster than VirtualiZarr's parse + Parquet and parse + Icechunk + commit, with peak
   RSS ≤ 1/3 of VirtualiZarr's; the distributed run no slower than the local one. Every output is checked:
   sampled chunks and the whole array's mean equal netCDF4's, and the Parquet, JSON and Icechunk outputs
   equal to each other (every reference).
2. ``--huge-files`` (1,000) names of one netCDF-4 file of ``--huge-chunks`` (100,000) chunks (hard links,
   daily names: ``new_dim="time=%Y%m%d"``): 100,000,000 references into Parquet and Icechunk, nczmap
   alone; time and peak RSS (target: within 4 GB), then two chunks read back (the first and the last, in a
   fresh process: open + read, target under 1 s). ``--skip huge`` leaves it out.

    .venv/bin/python bench/bench_references_scale.py [--files 200] [--side 500] [--huge-files 1000]
        [--huge-chunks 100000] [--workdir DIR] [--skip huge|peers|distributed ...] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD_PRELUDE = r"""
import glob, json, os, sys, time
def peak():
    with open("/proc/self/status") as status:
        return int(status.read().split("VmHWM:")[1].split()[0]) * 1024
def rss():
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) * 1024
"""

NCZMAP_CHILD = (
    CHILD_PRELUDE
    + r"""
case, folder, out, join = sys.argv[1:5]
import numpy, h5py, pyarrow.parquet, icechunk, zarr
from nczmap.integrations.virtualize import virtualize
files = sorted(glob.glob(folder + "/*.nc"))
options = {"concat": "time"} if join == "concat" else {"new_dim": "time=%Y%m%d"}
executor = None
if case == "distributed":
    from dask.distributed import Client, LocalCluster
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    executor = Client(cluster)
started = time.perf_counter()
result = virtualize(files, out, executor=executor, **options)
seconds = time.perf_counter() - started
workers = None
if executor is not None:
    def worker_peak():
        with open("/proc/self/status") as status:
            return int(status.read().split("VmHWM:")[1].split()[0]) * 1024
    workers = max(executor.run(worker_peak).values())
    executor.close()
    cluster.close()
print(json.dumps({"seconds": seconds, "peak": peak(), "references": result.references,
                  "containers": [getattr(c, "prefix", c) for c in result.containers], "workers": workers}))
"""
)

PEER_CHILD = (
    CHILD_PRELUDE
    + r"""
case, folder, out = sys.argv[1:4]
import warnings
warnings.filterwarnings("ignore")
import numpy, h5py, icechunk, xarray
from obspec_utils.registry import ObjectStoreRegistry
from obstore.store import LocalStore
from virtualizarr import open_virtual_mfdataset
from virtualizarr.parsers import HDFParser
files = sorted(glob.glob(folder + "/*.nc"))
started = time.perf_counter()
vds = open_virtual_mfdataset(
    ["file://" + f for f in files], parser=HDFParser(),
    registry=ObjectStoreRegistry({"file://": LocalStore()}), loadable_variables=["time"],
    combine="nested", concat_dim="time", coords="minimal", compat="override",
)
if case == "parquet":
    vds.vz.to_kerchunk(out, format="parquet")
elif case == "icechunk":
    prefix = "file://" + folder.rstrip("/") + "/"
    config = icechunk.RepositoryConfig.default()
    container = icechunk.VirtualChunkContainer(prefix, icechunk.local_filesystem_store(folder))
    config.set_virtual_chunk_container(container)
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(out), config,
                                      authorize_virtual_chunk_access={prefix: None})
    session = repo.writable_session("main")
    vds.vz.to_icechunk(session.store)
    session.commit("virtualized")
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "peak": peak()}))
"""
)

READ_CHILD = (
    CHILD_PRELUDE
    + r"""
url, containers, variable = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
import numpy
import nczmap
from nczmap.zmap import manifest, icechunk
start_rss = rss()
started = time.perf_counter()
with nczmap.open_dataset(url, containers=containers) as ds:
    array = ds.variables[variable]
    first = array[(slice(0, 1),) + tuple(slice(0, 5) for _ in array.shape[1:])]
    last = array[(slice(array.shape[0] - 1, None),) + tuple(slice(n - 5, n) for n in array.shape[1:])]
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "peak": peak() - start_rss,
                  "first": float(numpy.asarray(first).sum()), "last": float(numpy.asarray(last).sum())}))
"""
)


# ------------------------------------------------------------------------------------------ inputs
def build_collection(folder: Path, files: int, side: int) -> list[str]:
    """``files`` netCDF-4 files of one record each, ``v(time, y, x)`` in chunks of 1×5×5."""
    import netCDF4
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / "stamp.json"
    wanted = {"files": files, "side": side}
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return sorted(str(p) for p in folder.glob("*.nc"))
    for old in folder.glob("*.nc"):
        old.unlink()
    rng = np.random.default_rng(34)
    for number in range(files):
        with netCDF4.Dataset(folder / f"f{number:05d}.nc", "w") as ds:
            ds.createDimension("time", None)
            ds.createDimension("y", side)
            ds.createDimension("x", side)
            times = ds.createVariable("time", "f8", ("time",))
            times.units = "days since 2000-01-01"
            times[:] = [number]
            values = ds.createVariable("v", "f4", ("time", "y", "x"), chunksizes=(1, 5, 5))
            values[0] = rng.random((side, side), dtype=np.float32)
    stamp.write_text(json.dumps(wanted))
    return sorted(str(p) for p in folder.glob("*.nc"))


def build_huge(folder: Path, files: int, chunks: int) -> list[str]:
    """``files`` daily names (hard links) of one netCDF-4 file of ``chunks`` chunks of 5×5 (``v(y, x)``)."""
    import netCDF4
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / "stamp.json"
    wanted = {"files": files, "chunks": chunks}
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return sorted(str(p) for p in folder.glob("*.nc"))
    shutil.rmtree(folder)
    folder.mkdir(parents=True)
    rows = 100
    columns = -(-chunks // rows)
    first = folder / "one.data"
    with netCDF4.Dataset(first, "w") as ds:
        ds.createDimension("y", rows * 5)
        ds.createDimension("x", columns * 5)
        values = ds.createVariable("v", "f4", ("y", "x"), chunksizes=(5, 5))
        values[:] = np.random.default_rng(34).random((rows * 5, columns * 5), dtype=np.float32)
    day = datetime.date(2000, 1, 1)
    for number in range(files):
        os.link(first, folder / f"v_{(day + datetime.timedelta(days=number)):%Y%m%d}.nc")
    stamp.write_text(json.dumps(wanted))
    return sorted(str(p) for p in folder.glob("*.nc"))


# ------------------------------------------------------------------------------------------ running
CHILD_TIMEOUT = [3600.0]  # seconds a case may take (--timeout)


def run_child(code: str, *args: str) -> dict:
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT[0],
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"still running after {CHILD_TIMEOUT[0]:.0f} s: stopped"}
    if done.returncode:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        return {"error": f"exit {done.returncode}: {tail}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def fresh(path: Path) -> str:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    return str(path)


ROWS: list[tuple[str, str, str, str]] = []
MISSED: list[str] = []
PROBLEMS: list[str] = []  # a case that failed, an output that read wrong: the run exits 1


def show(label: str, run: dict, ratio: str = "") -> None:
    if "error" in run:
        ROWS.append((label, "failed", "", run["error"][-200:]))
        return
    peak = f"{run['peak'] / 2**20:,.0f} MiB"
    if run.get("workers"):
        peak += f" (workers {run['workers'] / 2**20:,.0f} MiB each at most)"
    ROWS.append((label, f"{run['seconds']:.2f} s", peak, ratio))


def target(text: str, met: bool) -> None:
    ROWS.append((f"  {text}", "", "", "TARGET MET" if met else "TARGET MISSED"))
    if not met:
        MISSED.append(text)


def print_rows() -> None:
    widths = [max(len(row[i]) for row in ROWS) for i in range(4)]
    head = ("case", "time", "peak RSS", "ratio / target")
    widths = [max(w, len(h)) for w, h in zip(widths, head, strict=True)]
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in ROWS:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


# ------------------------------------------------------------------------------------------ checks
def check_outputs(files: list[str], outputs: dict[str, str], containers: list[str]) -> str:
    """Sampled time steps of every output, and the whole array's mean through the Parquet output, equal
    netCDF4's reading of the files."""
    import netCDF4
    import numpy as np
    import xarray as xr

    opened = {
        name: xr.open_dataset(url, engine="nczmap", map_options={"containers": containers})
        for name, url in outputs.items()
    }
    try:
        rng = np.random.default_rng(7)
        picks = rng.integers(0, len(files), 8)
        for name, ds in opened.items():
            for pick in picks.tolist():
                with netCDF4.Dataset(files[pick]) as source:
                    expected = source["v"][0].filled()
                got = ds["v"].isel(time=pick).values
                if not np.array_equal(got, expected):
                    raise AssertionError(f"{name}: time step {pick} differs from netCDF4's")
        # the whole array once (2M chunk reads); the other outputs' references are compared with its own
        means = {"Parquet": float(opened["Parquet"]["v"].mean(dtype="f8").values)}
    finally:
        for ds in opened.values():
            ds.close()
    total, count = 0.0, 0
    for path in files:
        with netCDF4.Dataset(path) as source:
            values = source["v"][:].filled().astype("f8")
            total, count = total + values.sum(), count + values.size
    expected_mean = total / count
    for name, mean in means.items():
        if not np.isclose(mean, expected_mean, rtol=1e-9, atol=0):
            raise AssertionError(f"{name}: mean {mean} differs from netCDF4's {expected_mean}")
    return (
        f"{len(picks)} sampled steps of {sorted(opened)} and the Parquet output's mean ({expected_mean:.6f}) "
        "equal netCDF4's"
    )


def same_references(parquet: str, others: dict[str, str], containers: list[str]) -> str:
    """Every chunk reference of ``v`` in the Parquet output equals the other outputs' (JSON through
    nczmap's manifest map, Icechunk through its chunk listing)."""
    import numpy as np

    from nczmap.url import parse_url
    from nczmap.zmap import open_map

    def manifest_columns(url: str) -> dict[str, tuple[str, int, int]]:
        zmap = open_map(parse_url(url), "r", containers=containers)
        try:
            manifest = zmap.manifest
            table = manifest.arrays.get("v")
            if table is None:
                return {
                    k[2:]: tuple(e)
                    for k, e in manifest.references()
                    if k.startswith("v/") and not k.startswith("v/.")
                }
            found = {}
            for number, page in table.pages():
                rows, at = page.held()
                for row, where, offset, length in zip(
                    rows.tolist(),
                    page.where[at].tolist(),
                    page.offsets[at].tolist(),
                    page.lengths[at].tolist(),
                    strict=True,
                ):
                    found[table.name(table._start(number) + row)] = (page.urls[where], offset, length)
            return found
        finally:
            zmap.close()

    expected = manifest_columns(parquet)
    checked = []
    for name, url in others.items():
        if "icechunk" in url:
            zmap = open_map(parse_url(url), "r", containers=containers)
            try:
                batches = zmap.chunk_references("/v")
            finally:
                zmap.close()
            got = {}
            for coords, _kinds, paths, offsets, lengths, _inline in batches:
                coords = np.asarray(coords)
                for index, path, offset, length in zip(
                    coords.tolist(), paths, list(offsets), list(lengths), strict=True
                ):
                    got[".".join(map(str, index))] = (str(path), int(offset), int(length))
        else:
            got = manifest_columns(url)
        if got != expected:
            missing = set(expected) ^ set(got)
            differ = [k for k in expected if k in got and got[k] != expected[k]][:1]
            raise AssertionError(
                f"{name}'s references differ from Parquet's: {len(missing)} keys apart, {differ}"
            )
        checked.append(name)
    return f"every one of the {len(expected):,} references of v equal in Parquet and {', '.join(checked)}"


# ------------------------------------------------------------------------------------------ parts
def bench_collection(args, work: Path) -> None:
    files = build_collection(work / f"collection-{args.files}x{args.side}", args.files, args.side)
    folder = str(Path(files[0]).parent)
    references = len(files) * (args.side // 5) ** 2
    out = work / "out"
    out.mkdir(exist_ok=True)
    parquet, ice, js = out / "nczmap.parq", out / "nczmap.icechunk", out / "nczmap.json"
    runs = {}
    runs["parquet"] = run_child(NCZMAP_CHILD, "local", folder, fresh(parquet), "concat")
    runs["icechunk"] = run_child(NCZMAP_CHILD, "local", folder, fresh(ice) + "#mode=icechunk", "concat")
    runs["json"] = run_child(NCZMAP_CHILD, "local", folder, fresh(js), "concat")
    if "distributed" not in args.skip:
        dist = out / "dist.parq"
        runs["distributed"] = run_child(NCZMAP_CHILD, "distributed", folder, fresh(dist), "concat")
    peers = {}
    if "peers" not in args.skip:
        peers["parse"] = run_child(PEER_CHILD, "parse", folder, "")
        peers["parquet"] = run_child(PEER_CHILD, "parquet", folder, fresh(out / "vz.parq"))
        peers["icechunk"] = run_child(PEER_CHILD, "icechunk", folder, fresh(out / "vz.icechunk"))
    for name, run in {**runs, **{f"peer {k}": v for k, v in peers.items()}}.items():
        if "error" in run:
            print(f"PROBLEM: {name}: {run['error']}", flush=True)
            PROBLEMS.append(name)
    containers = runs["parquet"].get("containers", ["file://" + folder + "/"])
    if all("error" not in run for run in runs.values()):
        outputs = {
            "Parquet": "file://" + str(parquet) + "#mode=nczarr,manifest",
            "JSON": "file://" + str(js) + "#mode=nczarr,manifest",
            "Icechunk": "file://" + str(ice) + "#mode=icechunk",
        }
        print("check:", check_outputs(files, outputs, containers), flush=True)
        others = {"JSON": outputs["JSON"], "Icechunk": outputs["Icechunk"]}
        if "distributed" in runs:
            others["distributed Parquet"] = "file://" + str(out / "dist.parq") + "#mode=nczarr,manifest"
        print("check:", same_references(outputs["Parquet"], others, containers), flush=True)

    n = f"{len(files)} files, {references:,} refs"

    def ratio(ours: dict, peer: dict | None) -> str:
        if not peer or "error" in peer or "error" in ours:
            return ""
        return f"{peer['seconds'] / ours['seconds']:.1f}× faster, {ours['peak'] / peer['peak']:.2f}× the RSS"

    show(f"{n}: nczmap → Parquet", runs["parquet"], ratio(runs["parquet"], peers.get("parquet")))
    show(
        f"{n}: nczmap → Icechunk (+ commit)", runs["icechunk"], ratio(runs["icechunk"], peers.get("icechunk"))
    )
    show(f"{n}: nczmap → JSON", runs["json"])
    if "distributed" in runs:
        show(f"{n}: nczmap → Parquet, LocalCluster of 2 workers", runs["distributed"])
    for name, label in (("parse", "parse alone"), ("parquet", "parse + to_kerchunk(parquet)"),
                        ("icechunk", "parse + to_icechunk + commit")):  # fmt: skip
        if name in peers:
            show(f"{n}: VirtualiZarr {label}", peers[name])
    for name in ("parquet", "icechunk"):
        ours, peer = runs[name], peers.get(name)
        if peer and "error" not in peer and "error" not in ours:
            speed = peer["seconds"] / ours["seconds"]
            target(f"→ {name}: ≥ 5× faster than VirtualiZarr ({speed:.1f}×)", speed >= 5)
            share = ours["peak"] / peer["peak"]
            target(f"→ {name}: peak RSS ≤ 1/3 of VirtualiZarr's ({share:.2f})", share <= 1 / 3)
    if "distributed" in runs and "error" not in runs["distributed"] and "error" not in runs["parquet"]:
        slower = runs["distributed"]["seconds"] / runs["parquet"]["seconds"]
        target(f"distributed no slower than local ({slower:.2f}× its time)", slower <= 1.0)


def bench_huge(args, work: Path) -> None:
    files = build_huge(work / f"huge-{args.huge_files}x{args.huge_chunks}", args.huge_files, args.huge_chunks)
    folder = str(Path(files[0]).parent)
    references = len(files) * args.huge_chunks
    out = work / "out"
    out.mkdir(exist_ok=True)
    n = f"{len(files)} names × {args.huge_chunks:,} chunks = {references:,} refs"
    for name, path in (("Parquet", out / "huge.parq"), ("Icechunk", out / "huge.icechunk")):
        target_url = fresh(path) + ("#mode=icechunk" if name == "Icechunk" else "")
        run = run_child(NCZMAP_CHILD, "local", folder, target_url, "new_dim")
        show(f"{n}: nczmap → {name}", run)
        if "error" in run:
            target(f"{name}: {references:,} references within 4 GB", False)
            if not run["error"].startswith("still running"):
                PROBLEMS.append(f"{name}: {run['error']}")
            continue
        target(f"{name}: within 4 GB of RSS ({run['peak'] / 2**30:.2f} GB)", run["peak"] <= 4 * 2**30)
        url = "file://" + str(path) + ("#mode=icechunk" if name == "Icechunk" else "#mode=nczarr,manifest")
        read = run_child(READ_CHILD, url, json.dumps(run["containers"]), "v")
        show(f"{n}: {name}: open + first and last chunk", read)
        if "error" in read:
            PROBLEMS.append(f"reading {name} back: {read['error']}")
        else:
            target(
                f"{name}: two chunks read back in under 1 s ({read['seconds']:.2f} s)", read["seconds"] < 1
            )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--side", type=int, default=500)
    parser.add_argument("--huge-files", type=int, default=1000)
    parser.add_argument("--huge-chunks", type=int, default=100_000)
    parser.add_argument("--workdir")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a case may take")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["huge", "peers", "distributed", "collection"]
    )
    parser.add_argument("--quick", action="store_true", help="20 files of 100², 20 names × 10,000 chunks")
    args = parser.parse_args()
    if args.quick:
        args.files, args.side, args.huge_files, args.huge_chunks = 20, 100, 20, 10_000
        args.skip = [*args.skip, "distributed", "peers"]  # their starts alone are most of a quick run
    CHILD_TIMEOUT[0] = args.timeout
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="nczmap-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if "collection" not in args.skip:
        bench_collection(args, work)
    if "huge" not in args.skip:
        bench_huge(args, work)
    print()
    print_rows()
    print(f"\n(whole run {time.perf_counter() - started:.0f} s; inputs under {work})")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    for problem in PROBLEMS:
        print(f"PROBLEM: {problem}")
    return 1 if PROBLEMS else 0  # targets missed are reported, not failures


if __name__ == "__main__":
    sys.exit(main())
