"""nczmap reads over HTTP(S) whatever the process loaded before, and what it loads harms nothing loaded
after (issue 33): an import-order matrix, each case a fresh interpreter (tests/import_order_child.py, not
through this directory's conftest, which loads ecCodes into its own scope and so hides the bug).

ecCodes' wheels load eckit's libcurl 7.61.1 with RTLD_GLOBAL (``import eccodes``, cfgrib, or listing
xarray's engines): a pycurl imported after it was bound to that libcurl and refused to load. Every case
therefore has ecCodes (imported as users import it, one message decoded) loaded before nczmap's first
HTTP read, and checks that its libcurl was in the process's global scope: without that nothing here
would depend on how pycurl is loaded.

* used first: each library does its own job (ecCodes decodes, cfgrib opens a GRIB file, GDAL reads a
  GeoTIFF, netCDF-C and HDF5 read a netCDF-4 file, PROJ transforms, Icechunk commits, obstore and
  fsspec read from the local server, matplotlib draws), then ecCodes, then nczmap virtualizes a
  netCDF-4 file from a local server and xarray (engine ``nczmap``) reads HTTP-backed manifests;
* used after (one process for them all): ecCodes, nczmap's HTTP reads, then each library loaded and
  used (GDAL reading a COG through its own libcurl, ``/vsicurl/``), then nczmap reads again. GDAL and
  PROJ are imported before ecCodes there and used after: loaded after ecCodes they are bound to eckit's
  libcurl and PROJ whatever nczmap does (GDAL crashes in ``/vsicurl/``, the process at exit);
* the command line's virtualize run by a script that opened a GRIB file first;
* a pycurl imported by the user after ecCodes (bound to eckit's libcurl for good): nczmap's reads are
  nczmap errors naming the URL, the libcurl in the way and what to do, never a bare ImportError.

Cases run a few at once (the fixture starts those selected when the first test asks); servers listen
on 127.0.0.1 only and stop with the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from latency_server import LatencyServer
from test_manifest_http import PROXY_VARIABLES

netCDF4 = pytest.importorskip("netCDF4")
rasterio = pytest.importorskip("rasterio")
pytest.importorskip("eccodes")
pytest.importorskip("cfgrib")
pytest.importorskip("xarray")

CHILD = Path(__file__).with_name("import_order_child.py")
WORKERS = 3  # cases at once: each spends much of its time importing, or waiting for the server
CASE_TIMEOUT = 120.0  # seconds for one case, imports included
SKIPPED = 77  # the child's status when a case's library is not installed
PEERS = ["rasterio", "netcdf4", "h5py", "pyproj", "icechunk", "obstore", "fsspec", "matplotlib"]
FIRST = {
    "eccodes": ["eccodes", "nczmap"],
    "cfgrib": ["cfgrib", "nczmap_read", "nczmap"],  # the issue's own: the manifest read first
    "xarray-engines": ["engines", "nczmap"],
    "xarray-nczmap-engine": ["nczmap_read", "nczmap"],  # the engine's own listing loads cfgrib first
    **{peer: [peer, "eccodes", "nczmap"] for peer in PEERS},
}
AFTER = [
    "cfgrib",
    "netcdf4",
    "h5py",
    "pyproj",
    "icechunk",
    "obstore",
    "fsspec",
    "matplotlib",
    "rasterio_vsicurl",
]
CASES = {
    **{f"{name}-first": steps for name, steps in FIRST.items()},
    # GDAL and PROJ loaded before ecCodes (see the module's notes), used after nczmap's reads
    "peers-after": ["import:rasterio", "import:pyproj", "eccodes", "nczmap", *AFTER, "nczmap_read"],
    "cli-after-grib": ["cfgrib", "nczmap_cli"],
    "pycurl-imported-after-eccodes": ["eccodes", "pycurl_import_fails", "nczmap_refuses"],
}
CASE_OF = {f"{name}-first": f"{name}-first" for name in FIRST} | {
    "cli-after-grib": "cli-after-grib",
    "pycurl-imported-after-eccodes": "pycurl-imported-after-eccodes",
    **{f"{peer}-after": "peers-after" for peer in AFTER},
}


# ---------------------------------------------------------------------------------------------- inputs
def write_inputs(root: Path) -> None:
    """``nc/a.nc`` (netCDF-4, a zlib variable), ``grib/forecast.grib2`` (one GRIB2 message) and
    ``cog/a.tif`` (a COG of 32² tiles), with the values each holds as ``*_values.npy``."""
    import grib_samples  # ecCodes loaded into its own scope, as conftest did
    from rasterio.transform import from_origin

    for folder in ("nc", "grib", "cog"):
        (root / folder).mkdir()
    sst = np.random.default_rng(33).normal(290, 5, (2, 30, 40)).astype("f4")
    with netCDF4.Dataset(root / "nc" / "a.nc", "w", format="NETCDF4") as ds:
        for name, size in (("time", None), ("lat", 30), ("lon", 40)):
            ds.createDimension(name, size)
        ds.createVariable("time", "f8", ("time",))[:] = [0, 1]
        ds.createVariable("sst", "f4", ("time", "lat", "lon"), zlib=True, chunksizes=(1, 15, 20))[:] = sst
    np.save(root / "nc_values.npy", sst)

    message = grib_samples.message(
        shortName="t", level=500, values=grib_samples.field(33, grib_samples.points())
    )
    grib_samples.write(root / "grib" / "forecast.grib2", [message])
    eccodes = grib_samples.eccodes
    handle = eccodes.codes_new_from_message(message)
    try:
        np.save(root / "grib_values.npy", eccodes.codes_get_values(handle))
    finally:
        eccodes.codes_release(handle)

    band = np.random.default_rng(34).integers(-2000, 3500, (64, 96)).astype("i2")
    profile = {"driver": "COG", "width": 96, "height": 64, "count": 1, "dtype": "int16", "blocksize": 32}
    profile.update(compress="DEFLATE", crs="EPSG:4326", transform=from_origin(0, 64, 1, 1))
    with rasterio.open(root / "cog" / "a.tif", "w", **profile) as dataset:
        dataset.write(band, 1)
    np.save(root / "cog_values.npy", band)


# ---------------------------------------------------------------------------------------------- the runs
class Runs:
    """The selected cases, started a few at a time in fresh interpreters against one local server."""

    def __init__(self, root: Path, server: LatencyServer, names: list[str]) -> None:
        self.root, self.server = root, server
        self.env = {
            k: v for k, v in os.environ.items() if k not in PROXY_VARIABLES and not k.startswith("PYTEST")
        }
        self.env["MPLBACKEND"] = "Agg"
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="import-order")
        self.started: dict[str, Future] = {name: self.pool.submit(self._run, name) for name in names}

    def result(self, name: str) -> dict:
        """The case's steps as the child reported them (skipped when a library is missing); the child's
        output in the failure otherwise."""
        future = self.started.get(name) or self.pool.submit(self._run, name)
        process, took = future.result()
        lines = [json.loads(line) for line in process.stdout.splitlines() if line.startswith("{")]
        if process.returncode == SKIPPED:
            pytest.skip(lines[-1]["skipped"])
        assert process.returncode == 0, (
            f"case {name} ({' -> '.join(CASES[name])}) exited {process.returncode} after {took:.1f} s\n"
            f"stdout:\n{process.stdout}\nstderr:\n{process.stderr[-6000:]}"
        )
        steps = {line["step"]: line for line in lines}
        assert list(steps) == list(dict.fromkeys(CASES[name])), lines
        return steps

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, name: str) -> tuple[subprocess.CompletedProcess, float]:
        out = self.root / "out" / name
        out.mkdir(parents=True)
        plan = {
            "steps": CASES[name],
            "data": str(self.root / "data"),
            "server": self.server.url,
            "out": str(out),
        }
        began = time.monotonic()
        process = subprocess.run(
            [sys.executable, str(CHILD), json.dumps(plan)],
            capture_output=True,
            text=True,
            timeout=CASE_TIMEOUT,
            env=self.env,
            cwd=out,
            stdin=subprocess.DEVNULL,
        )
        return process, time.monotonic() - began


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """Inputs written, the server started on 127.0.0.1, the manifest the reading steps read made (over
    HTTP, in this process), and every case selected in this session started; stopped with the module."""
    from nczmap.integrations.virtualize import virtualize

    root = tmp_path_factory.mktemp("import-order")
    (root / "data").mkdir()
    write_inputs(root / "data")
    calls = [
        getattr(item, "callspec", None) for item in request.session.items if item.module is request.module
    ]
    names = list(
        dict.fromkeys(CASE_OF[call.params["case"]] for call in calls if call and "case" in call.params)
    )
    with LatencyServer(root / "data", latency=0.0) as server:
        virtualize([server.url_of("nc/a.nc")], root / "data" / "remote.json")
        running = Runs(root, server, names)
        try:
            yield running
        finally:
            running.close()


def check_reads(steps: dict) -> None:
    """nczmap read over HTTP with ecCodes' libcurl in the global scope (the hazard was there: ecCodes
    imported before, or loaded by xarray's listing of engines meanwhile), its pycurl bound to the libcurl it
    was built with, as in this process."""
    from nczmap.zmap import http

    first = next(steps[name] for name in steps if name.startswith("nczmap"))
    assert first["global_libcurl"], steps
    assert first["pycurl"] == http.pycurl.version, first


# ---------------------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("case", [f"{name}-first" for name in FIRST])
def test_nczmap_reads_over_http_whatever_was_used_first(runs, case):
    """The library used first (ecCodes made global after it), then nczmap virtualizes from the server and
    xarray reads HTTP-backed manifests."""
    check_reads(runs.result(case))


@pytest.mark.parametrize("case", [f"{step}-after" for step in AFTER])
def test_libraries_loaded_after_nczmap_read_over_http_still_work(runs, case):
    """ecCodes, nczmap's HTTP reads, then each library does its job, and nczmap reads again."""
    steps = runs.result(CASE_OF[case])
    step = steps[case.removesuffix("-after")]
    if "skipped" in step:
        pytest.skip(step["skipped"])
    check_reads(steps)
    assert np.isclose(steps["nczmap_read"]["mean"], steps["nczmap"]["mean"])


@pytest.mark.parametrize("case", ["cli-after-grib"])
def test_the_cli_virtualizes_over_http_in_a_script_that_opened_grib_first(runs, case):
    steps = runs.result(case)
    check_reads(steps)
    assert np.isclose(steps["nczmap_cli"]["mean"], np.load(runs.root / "data" / "nc_values.npy").mean())


@pytest.mark.parametrize("case", ["pycurl-imported-after-eccodes"])
def test_a_pycurl_bound_to_another_libcurl_is_refused_by_name(runs, case):
    """The user imported pycurl after ecCodes (its import failed, its bindings stay): nczmap's reads are
    nczmap errors naming the URL, the libcurl in the way and how to avoid it."""
    steps = runs.result(case)
    libcurl = steps["eccodes"]["global_libcurl"].split()[0]  # libcurl/7.61.1
    assert "link-time version" in steps["pycurl_import_fails"]["refused"]
    url = runs.server.url_of("nc/a.nc")
    for message in steps["nczmap_refuses"]["messages"]:
        assert url in message, message
        assert f"{libcurl} (" in message and "eckitlib" in message, message
        assert "import nczmap.zmap.http before ecCodes" in message, message
