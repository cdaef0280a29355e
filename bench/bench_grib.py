"""GRIB2 collections: ``virtualize()`` side by side with VirtualiZarr's GRIB parser (gribberish's
``GribberishParser``), on the same files, locally and over HTTP at 40 ms a request.

The files are HRRR-like: ``--files`` hourly analyses (``hrrr.t{HH}z.grib2``), each ``--fields`` messages
(temperature, wind, humidity and geopotential on pressure levels) on a Lambert conformal grid of
``--grid`` points (HRRR's own is 1799×1059), 12-bit simple packing, written with ecCodes. Cases:

- nczmap: ``virtualize(paths or urls, out.json, concat="time")`` (remote sources 128 in flight); over
  HTTP again with a wgrib2 inventory (``FILE.idx``) beside each file, as NOAA's archives keep them;
- VirtualiZarr: ``open_virtual_mfdataset(urls, parser=GribberishParser(collapse_groups=True),
  registry=<obstore LocalStore | HTTPStore>, combine="nested", concat_dim="time", coords="minimal",
  compat="override", parallel=ThreadPoolExecutor(8))`` and ``vds.vz.to_kerchunk(out.json,
  zarr_format=3)`` (the gribberish codec is a Zarr v3 codec).

Over HTTP the files are served by ``tests/latency_server.py`` in a child process (``--latency`` 40 ms a
request), which counts requests and bytes for exactly the measured run. Each result is checked before
its time counts: nczmap's manifest is opened and its first file's first field compared with cfgrib's
reading of that file; the peer's references must point at the files' messages. Times are medians of
``--rounds`` interleaved runs (1 by default) after a warm-up on two files.

    .venv/bin/python bench/bench_grib.py [--files 12] [--fields 40] [--grid 800x600] [--latency 0.04]
        [--rounds 1] [--workdir DIR] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from _common import fmt_ratio, fmt_time

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from grib_samples import LAMBERT
from latency_server import serving

PARAMETERS = ("t", "u", "v", "r", "gh")
LEVELS = (1000, 925, 850, 700, 500, 400, 300, 250, 200, 100)


def quiet() -> None:
    warnings.filterwarnings("ignore")


# ------------------------------------------------------------------------------------------ the files
def build(folder: Path, files: int, fields: int, grid: tuple[int, int]) -> list[Path]:
    """``files`` hourly files of ``fields`` messages (kept when already built with these sizes)."""
    from nczmap.format.gribcodec import import_eccodes  # after pyproj: see its docstring

    eccodes = import_eccodes()

    nx, ny = grid
    paths = [folder / f"hrrr.t{hour:02d}z.grib2" for hour in range(files)]
    stamp = folder / f"built-{files}-{fields}-{nx}x{ny}"
    if stamp.exists():
        return paths
    rng = np.random.default_rng(1)
    base = 250 + 20 * np.sin(np.linspace(0, 6, nx * ny))
    combos = [(p, level) for level in LEVELS for p in PARAMETERS][:fields]  # whole levels: one hypercube
    for hour, path in enumerate(paths):
        with open(path, "wb") as out:
            for name, level in combos:
                handle = eccodes.codes_grib_new_from_samples("regular_ll_pl_grib2")
                keys = {
                    **LAMBERT,  # the tests' HRRR-like grid, at this size
                    "Nx": nx,
                    "Ny": ny,
                    "shortName": name,
                    "level": level,
                    "dataDate": 20240101,
                    "dataTime": hour * 100,
                    "bitsPerValue": 12,
                }
                for key, value in keys.items():
                    eccodes.codes_set(handle, key, value)
                eccodes.codes_set_values(handle, base + rng.standard_normal(nx * ny))
                eccodes.codes_write(handle, out)
                eccodes.codes_release(handle)
    stamp.touch()
    return paths


def message_offsets(path: Path) -> set[int]:
    from nczmap.integrations.virtualize.grib_messages import walk

    data = path.read_bytes()
    return {m.offset for m in walk(lambda o, n: data[o : o + n], len(data), str(path))}


def write_inventories(paths: list[Path]) -> None:
    """``FILE.idx`` beside each file as wgrib2 writes them (``number:offset:d=date:var:level:...``)."""
    for path in paths:
        offsets = sorted(message_offsets(path))
        lines = [f"{n}:{offset}:d=2024010100:VAR:LEVEL:anl:" for n, offset in enumerate(offsets, 1)]
        path.with_name(path.name + ".idx").write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------------------ the cases
def nczmap_case(sources: list[str], out: Path):
    def run():
        from nczmap.integrations.virtualize import virtualize

        return virtualize(sources, out, concat="time")

    return run


def peer_case(urls: list[str], registry, out: Path, threads: int = 8):
    def run():
        from gribberish.virtualizarr import GribberishParser
        from virtualizarr import open_virtual_mfdataset

        with ThreadPoolExecutor(threads) as pool:
            vds = open_virtual_mfdataset(
                urls,
                parser=GribberishParser(collapse_groups=True),
                registry=registry,
                combine="nested",
                concat_dim="time",
                coords="minimal",
                compat="override",
                parallel=pool,
            )
        vds.vz.to_kerchunk(str(out), format="json", zarr_format=3)
        return vds

    return run


def local_registry():
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore

    return ObjectStoreRegistry({"file:///": LocalStore("/")})


def http_registry(base: str):
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import HTTPStore

    return ObjectStoreRegistry({base: HTTPStore.from_url(base, client_options={"allow_http": True})})


# ------------------------------------------------------------------------------------------ checks
def check_nczmap(result, out: Path, first: Path) -> None:
    import xarray as xr

    options = {"containers": result.containers}
    url = f"file://{out}#mode=nczarr,manifest"
    with xr.open_dataset(url, engine="nczmap", map_options=options) as ours:
        theirs = xr.open_dataset(first, engine="cfgrib", backend_kwargs={"indexpath": ""})
        got = ours["t"].isel(time=0, step=0).values
        np.testing.assert_array_equal(got, theirs["t"].values)


def check_peer(vds, path: Path) -> None:
    manifest = vds["tmp"].data.manifest
    offsets = {int(o) for o in np.asarray(manifest._offsets).ravel()}
    if not offsets <= message_offsets(path) | message_offsets_of_all(manifest):
        raise AssertionError("the peer's references are not at the files' messages")


def message_offsets_of_all(manifest) -> set[int]:
    found: set[int] = set()
    for path in {str(p) for p in np.asarray(manifest._paths).ravel()}:
        found |= message_offsets(Path(path.removeprefix("file://"))) if path.startswith("file://") else set()
    return found


# ------------------------------------------------------------------------------------------ running
def timed(cases: dict, rounds: int, server=None) -> dict[str, tuple[float, object, dict]]:
    samples: dict[str, list[float]] = {name: [] for name in cases}
    last: dict[str, tuple[object, dict]] = {}
    for _ in range(rounds):
        for name, case in cases.items():
            if server is not None:
                server.reset()
            start = time.perf_counter()
            value = case()
            samples[name].append(time.perf_counter() - start)
            last[name] = (value, server.stats() if server is not None else {})
    return {name: (statistics.median(samples[name]), *last[name]) for name in cases}


def report(title: str, results: dict, files: int, size: int) -> None:
    print(f"\n{title} ({files} files, {size / files / 2**20:.1f} MiB a file)")
    print(f"  {'':<34} {'time':>10} {'GET a file':>11} {'KiB a file':>11}")
    ours = results["nczmap"][0]
    for name, (seconds, _, stats) in results.items():
        counts = stats.get("counts", {}) if stats else {}
        gets = f"{counts.get('GET', 0) / files:.1f}" if stats else "-"
        kib = f"{stats.get('bytes_sent', 0) / files / 1024:,.0f}" if stats else "-"
        ratio = "" if name == "nczmap" else f"   nczmap {fmt_ratio(seconds / ours)} faster"
        print(f"  {name:<34} {fmt_time(seconds):>10} {gets:>11} {kib:>11}{ratio}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--fields", type=int, default=40)
    parser.add_argument("--grid", default="800x600")
    parser.add_argument("--latency", type=float, default=0.04)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workdir")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.files, args.fields, args.grid = 3, 10, "80x60"
    quiet()
    nx, ny = (int(n) for n in args.grid.split("x"))
    peer = importlib.util.find_spec("gribberish") is not None
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.workdir or scratch)
        data = work / "grib"
        data.mkdir(parents=True, exist_ok=True)
        paths = build(data, args.files, args.fields, (nx, ny))
        for stale in data.glob("*.idx"):  # the first runs are of files without inventories
            stale.unlink()
        size = sum(p.stat().st_size for p in paths)
        out = work / "out"
        out.mkdir(exist_ok=True)
        nczmap_case([str(p) for p in paths[:2]], out / "warm.json")()  # imports, and the warm-up
        local = {"nczmap": nczmap_case([str(p) for p in paths], out / "nczmap.json")}
        if peer:
            peer_case([p.as_uri() for p in paths[:2]], local_registry(), out / "warm-peer.json")()
            urls = [p.as_uri() for p in paths]
            local["VirtualiZarr + gribberish (8 thr)"] = peer_case(urls, local_registry(), out / "peer.json")
        results = timed(local, args.rounds)
        check_nczmap(results["nczmap"][1], out / "nczmap.json", paths[0])
        if peer:
            check_peer(results["VirtualiZarr + gribberish (8 thr)"][1], paths[0])
        report("Local files", results, args.files, size)
        with serving(data, latency=args.latency, process=True) as server:
            urls = [f"{server.url}/{p.name}" for p in paths]
            remote = {"nczmap": nczmap_case(urls, out / "nczmap-http.json")}
            if peer:
                registry = http_registry(server.url)
                remote["VirtualiZarr + gribberish (8 thr)"] = peer_case(
                    urls, registry, out / "peer-http.json"
                )
            results = timed(remote, args.rounds, server)
            check_nczmap(results["nczmap"][1], out / "nczmap-http.json", paths[0])
        report(f"Over HTTP, {args.latency * 1000:.0f} ms a request", results, args.files, size)
        write_inventories(paths)
        with serving(data, latency=args.latency, process=True) as server:
            urls = [f"{server.url}/{p.name}" for p in paths]
            indexed = timed({"nczmap": nczmap_case(urls, out / "nczmap-idx.json")}, args.rounds, server)
            check_nczmap(indexed["nczmap"][1], out / "nczmap-idx.json", paths[0])
        indexed.update((name, value) for name, value in results.items() if name != "nczmap")
        title = f"Over HTTP, {args.latency * 1000:.0f} ms a request, an inventory (.idx) beside each file"
        report(title + " (the peer reads none: its run above)", indexed, args.files, size)
    if not peer:
        print("\nTARGET NOT MEASURED: VirtualiZarr's GRIB parser (gribberish) is not installed (.[bench])")
    return 0


if __name__ == "__main__":
    sys.exit(main())
