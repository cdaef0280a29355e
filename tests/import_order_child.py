"""One case of ``test_import_order.py``: steps run in order in this fresh interpreter, each using a library
that loads compiled code of its own (ecCodes, cfgrib, GDAL, netCDF-C, HDF5, PROJ, Icechunk, obstore,
fsspec's aiohttp, matplotlib) or nczmap's HTTP client, and checking what it read.

Run as ``python import_order_child.py PLAN`` (PLAN: JSON with ``steps``, ``data``, ``server``, ``out``),
never through pytest: tests/conftest.py loads ecCodes into its own scope, which hides what a user's
process does. Prints one JSON line a step (``{"step", "seconds", ...}``, or ``{"step", "skipped"}`` when
its library is not installed: the case ends there when it is the first step, with exit status 77); exit
status 1 (and the traceback) when a step fails.

Imports are made by the steps themselves, in the plan's order: nothing but the standard library and
numpy is loaded before the first step.
"""

from __future__ import annotations

import ctypes
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

SKIP = 77


class Missing(Exception):
    """A step's library is not installed."""


def main(plan: dict) -> int:
    data, server, out = Path(plan["data"]), plan["server"], Path(plan["out"])
    for number, step in enumerate(plan["steps"]):
        began = time.perf_counter()
        try:
            told = run(step, data, server, out) or {}
        except Missing as exc:
            print(json.dumps({"step": step, "skipped": str(exc)}), flush=True)
            if number == 0:
                return SKIP  # the case is about that library
            continue
        took = round(time.perf_counter() - began, 3)
        print(json.dumps({"step": step, "seconds": took, **told}), flush=True)
    return 0


def run(step: str, data: Path, server: str, out: Path) -> dict | None:
    """One step: a name of :data:`STEPS`, or ``import:MODULE`` (imported, its libraries loaded, and not
    used yet)."""
    if step.startswith("import:"):
        _need(step.removeprefix("import:"))
        return None
    return STEPS[step](data, server, out)


def _need(name: str):
    try:
        return __import__(name)
    except ImportError as exc:
        raise Missing(f"{name} is not installed ({exc})") from None


def global_libcurl() -> str | None:
    """``curl_version()`` of the libcurl in the process's global scope (what a library loaded without
    RTLD_DEEPBIND binds ``curl_*`` to), or None."""
    try:
        function = ctypes.CDLL(None).curl_version
    except AttributeError:
        return None
    function.restype = ctypes.c_char_p
    return function().decode()


# ------------------------------------------------------------------------------------------ the peers
def eccodes_decodes(data: Path, server: str, out: Path) -> dict:
    """ecCodes imported as users do (its libraries made global by findlibs), one message decoded."""
    eccodes = _need("eccodes")
    with open(data / "grib" / "forecast.grib2", "rb") as file:
        handle = eccodes.codes_grib_new_from_file(file)
        try:
            values = eccodes.codes_get_values(handle)
        finally:
            eccodes.codes_release(handle)
    assert np.allclose(values, np.load(data / "grib_values.npy")), "ecCodes decoded other values"
    return {"global_libcurl": global_libcurl()}


def cfgrib_opens(data: Path, server: str, out: Path) -> dict:
    """xarray's cfgrib engine opens the GRIB file (loading ecCodes through cfgrib)."""
    _need("cfgrib")
    import xarray as xr

    path = data / "grib" / "forecast.grib2"
    with xr.open_dataset(path, engine="cfgrib", backend_kwargs={"indexpath": ""}) as ds:
        values = ds["t"].values.ravel()
    assert np.allclose(values, np.load(data / "grib_values.npy")), "cfgrib read other values"
    return {"global_libcurl": global_libcurl()}


def engines_listed(data: Path, server: str, out: Path) -> dict:
    """xarray's engines listed: every installed backend's module imported (cfgrib's loads ecCodes)."""
    import xarray as xr

    engines = xr.backends.list_engines()
    assert "nczmap" in engines, sorted(engines)
    return {"engines": sorted(engines), "global_libcurl": global_libcurl()}


def rasterio_reads(data: Path, server: str, out: Path) -> None:
    """GDAL reads the GeoTIFF from its file."""
    rasterio = _need("rasterio")
    with rasterio.open(data / "cog" / "a.tif") as source:
        assert np.array_equal(source.read(1), np.load(data / "cog_values.npy")), "GDAL read other values"


def rasterio_reads_over_vsicurl(data: Path, server: str, out: Path) -> None:
    """GDAL reads the COG from the local server through its own libcurl (``/vsicurl/``)."""
    rasterio = _need("rasterio")
    options = {"GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR", "GDAL_HTTP_MAX_RETRY": "0"}
    with rasterio.Env(**options), rasterio.open(f"/vsicurl/{server}/cog/a.tif") as source:
        values = source.read(1)
    assert np.array_equal(values, np.load(data / "cog_values.npy")), "/vsicurl/ read other values"


def netcdf4_opens(data: Path, server: str, out: Path) -> None:
    """netCDF-C (netCDF4-python's wheel, with a libcurl of its own) opens the netCDF-4 file."""
    netCDF4 = _need("netCDF4")
    with netCDF4.Dataset(data / "nc" / "a.nc") as ds:
        values = ds["sst"][:].filled(np.nan)
    assert np.array_equal(values, np.load(data / "nc_values.npy")), "netCDF4 read other values"


def h5py_reads(data: Path, server: str, out: Path) -> None:
    """HDF5 (h5py's wheel) reads the netCDF-4 file's variable."""
    h5py = _need("h5py")
    with h5py.File(data / "nc" / "a.nc", "r") as file:
        values = file["sst"][...]
    assert np.array_equal(values, np.load(data / "nc_values.npy")), "h5py read other values"


def pyproj_transforms(data: Path, server: str, out: Path) -> None:
    """PROJ (pyproj's wheel; eckit bundles another) transforms a point to Web Mercator."""
    pyproj = _need("pyproj")
    transformer = pyproj.Transformer.from_crs("EPSG:4326", "EPSG:3857", always_xy=True)
    x, y = transformer.transform(10.0, 50.0)
    assert np.allclose((x, y), (1113194.9079327357, 6446275.841017158)), (x, y)


def icechunk_commits(data: Path, server: str, out: Path) -> None:
    """An Icechunk repository (in memory) written, committed and read back."""
    icechunk = _need("icechunk")
    import zarr

    repo = icechunk.Repository.create(icechunk.in_memory_storage())
    session = repo.writable_session("main")
    zarr.create_array(session.store, name="a", shape=(6,), chunks=(3,), dtype="i4")[:] = np.arange(6)
    session.commit("six numbers")
    read = repo.readonly_session(branch="main")
    assert zarr.open_array(read.store, path="a", mode="r")[:].tolist() == list(range(6))


def obstore_gets(data: Path, server: str, out: Path) -> None:
    """obstore (Rust's HTTP client) reads a range of the netCDF-4 file from the local server."""
    _need("obstore")
    import obstore
    from obstore.store import HTTPStore

    store = HTTPStore.from_url(f"{server}/nc", client_options={"allow_http": True})
    got = bytes(obstore.get_range(store, "a.nc", start=0, end=64))
    assert got == (data / "nc" / "a.nc").read_bytes()[:64], "obstore read other bytes"


def fsspec_http_cats(data: Path, server: str, out: Path) -> None:
    """fsspec's HTTP filesystem (aiohttp) reads a range of the netCDF-4 file from the local server."""
    _need("aiohttp")
    import fsspec

    got = fsspec.filesystem("http").cat_file(f"{server}/nc/a.nc", start=0, end=64)
    assert got == (data / "nc" / "a.nc").read_bytes()[:64], "fsspec read other bytes"


def matplotlib_draws(data: Path, server: str, out: Path) -> None:
    """matplotlib (Agg, its compiled extensions) draws a figure into a PNG."""
    matplotlib = _need("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots()
    axes.plot(np.arange(10), np.arange(10) ** 2)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    assert buffer.getvalue().startswith(b"\x89PNG"), "matplotlib wrote no PNG"


# ------------------------------------------------------------------------------------------ nczmap
def nczmap_virtualizes_and_reads(data: Path, server: str, out: Path) -> dict:
    """nczmap virtualizes the netCDF-4 file from the local server, then xarray reads the manifest it
    wrote and the one the test wrote beforehand, both HTTP-backed, through the engine."""
    from nczmap.integrations.virtualize import virtualize

    refs = out / f"refs-{len(list(out.glob('refs-*.json')))}.json"
    result = virtualize([f"{server}/nc/a.nc"], refs)
    assert [c.prefix for c in result.containers] == [f"{server}/nc/"], result.containers
    return nczmap_reads(data, server, out, refs)


def nczmap_reads(data: Path, server: str, out: Path, manifest: Path | None = None) -> dict:
    """xarray reads the HTTP-backed manifest (``manifest``, or the one the test wrote); also told: the
    libcurl in the global scope by then, and the libcurl of pycurl as nczmap loaded it."""
    import xarray as xr

    expected = np.load(data / "nc_values.npy")
    url = f"file://{manifest or data / 'remote.json'}#mode=nczarr,manifest"
    with xr.open_dataset(url, engine="nczmap", map_options={"containers": [f"{server}/nc/"]}) as ds:
        assert np.array_equal(ds["sst"].values, expected), "nczmap read other values"
        mean = float(ds.sst.mean().values)
    assert np.isclose(mean, expected.mean(dtype="f8"), rtol=1e-6), mean
    return {"mean": mean, "global_libcurl": global_libcurl(), "pycurl": sys.modules["pycurl"].version}


def nczmap_cli_virtualizes(data: Path, server: str, out: Path) -> dict:
    """``nczmap virtualize http://.../a.nc out.json`` through ``nczmap.cli.main``, then the manifest read."""
    from nczmap.cli import main as cli

    refs = out / "cli.json"
    status = cli(["virtualize", f"{server}/nc/a.nc", str(refs)])
    assert status == 0, f"nczmap virtualize exited {status}"
    return nczmap_reads(data, server, out, refs)


def pycurl_import_fails(data: Path, server: str, out: Path) -> dict:
    """pycurl imported by the user after ecCodes, without nczmap's care: its libcurl calls are bound to
    eckit's libcurl, and it refuses to load."""
    try:
        import pycurl  # noqa: F401
    except ImportError as exc:
        return {"refused": str(exc)}
    raise AssertionError("pycurl imported after ecCodes loaded: the case this step is for did not occur")


def nczmap_refuses(data: Path, server: str, out: Path) -> dict:
    """nczmap cannot use that pycurl: virtualizing and reading are nczmap errors naming the URL."""
    import xarray as xr

    from nczmap.errors import NCZError
    from nczmap.integrations.virtualize import virtualize

    url = f"{server}/nc/a.nc"
    messages = []
    try:
        virtualize([url], out / "refused.json")
    except NCZError as exc:
        messages.append(str(exc))
    manifest = f"file://{data / 'remote.json'}#mode=nczarr,manifest"
    try:
        with xr.open_dataset(manifest, engine="nczmap", map_options={"containers": [f"{server}/nc/"]}) as ds:
            ds["sst"].values  # noqa: B018
    except NCZError as exc:
        messages.append(str(exc))
    assert len(messages) == 2, messages
    return {"messages": messages}


STEPS = {
    "eccodes": eccodes_decodes,
    "cfgrib": cfgrib_opens,
    "engines": engines_listed,
    "rasterio": rasterio_reads,
    "rasterio_vsicurl": rasterio_reads_over_vsicurl,
    "netcdf4": netcdf4_opens,
    "h5py": h5py_reads,
    "pyproj": pyproj_transforms,
    "icechunk": icechunk_commits,
    "obstore": obstore_gets,
    "fsspec": fsspec_http_cats,
    "matplotlib": matplotlib_draws,
    "nczmap": nczmap_virtualizes_and_reads,
    "nczmap_read": nczmap_reads,
    "nczmap_cli": nczmap_cli_virtualizes,
    "pycurl_import_fails": pycurl_import_fails,
    "nczmap_refuses": nczmap_refuses,
}


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
