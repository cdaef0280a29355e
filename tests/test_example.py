"""examples/run.sh without its setup: the same steps, in a temporary directory, and a check of each output.

run.sh runs make_example.py, two `nczmap virtualize` commands, explore.py, then ncdump; so does this
module (once, in a module fixture), then checks the manifests, the zip and directory stores (netcdf-c's
ncdump reading the one written for 4.9.0) and the PNG.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("rasterio")
netCDF4 = pytest.importorskip("netCDF4")
xr = pytest.importorskip("xarray")

import nczmap  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(*command: str | Path, cwd: Path) -> str:
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [str(word) for word in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> tuple[Path, str]:
    """run.sh's steps (its Python and nczmap commands, not setup.sh) in a temporary directory; its output."""
    work = tmp_path_factory.mktemp("run")
    out = work / "example"
    printed = run(sys.executable, EXAMPLES / "make_example.py", "example", cwd=work)
    nczmap_virtualize = (sys.executable, "-m", "nczmap", "virtualize")
    printed += run(
        *nczmap_virtualize, "example/daily/*.nc", "example/daily.json", "--concat", "time", cwd=work
    )
    printed += run(
        *nczmap_virtualize, "example/cog/*.tif", "example/cogs.parq", "--new-dim", "time=%Y%m%d", cwd=work
    )
    printed += run(sys.executable, EXAMPLES / "explore.py", "example", cwd=work)
    return out, printed


def url(path: Path, mode: str) -> str:
    return f"file://{path}#mode=nczarr,{mode}"


def netcdf_sst(out: Path) -> np.ndarray:
    """The daily files' sst, joined along time, land as NaN."""
    days = []
    for path in sorted((out / "daily").glob("sst_*.nc")):
        with netCDF4.Dataset(path) as nc:
            days.append(np.ma.filled(nc["sst"][:].astype("f4"), np.nan))
    return np.concatenate(days)


def test_run_sh_is_valid_bash_and_runs_these_steps():
    script = (EXAMPLES / "run.sh").read_text()
    assert subprocess.run(["bash", "-n", EXAMPLES / "run.sh"]).returncode == 0
    steps = ["examples/make_example.py", "daily/*.nc", "--concat time", "cog/*.tif", "--new-dim time=%Y%m%d"]
    for step in [*steps, "examples/explore.py", "ncdump -h", "nczmap ncdump -h"]:
        assert step in script.replace('"$out/', "").replace('"', ""), step


def test_the_collection(example):
    out, _ = example
    assert sorted(p.name for p in (out / "daily").iterdir()) == [f"sst_2024010{d}.nc" for d in range(1, 6)]
    assert sorted(p.name for p in (out / "cog").iterdir()) == [f"sst_2024010{d}.tif" for d in range(1, 4)]
    import rasterio

    with rasterio.open(out / "cog" / "sst_20240101.tif") as cog:
        structure = cog.tags(ns="IMAGE_STRUCTURE")
        assert (structure["LAYOUT"], structure["COMPRESSION"], structure["PREDICTOR"]) == ("COG", "ZSTD", "2")
        assert cog.dtypes == ("int16",) and cog.crs.to_epsg() == 4326 and cog.nodata == -32768
    with netCDF4.Dataset(out / "daily" / "sst_20240101.nc") as nc:
        assert nc.dimensions["time"].isunlimited()
        assert nc["sst"].filters()["zlib"] and nc["sst"].units == "degC"


def test_the_manifests_open(example):
    out, _ = example
    with nczmap.open_dataset(url(out / "daily.json", "manifest")) as ds:
        assert ds.variables["sst"].shape == (5, 180, 360)
        np.testing.assert_array_equal(
            np.where(ds.variables["sst"][:] == -999, np.nan, ds.variables["sst"][:]), netcdf_sst(out)
        )
    cube = xr.open_dataset(url(out / "cogs.parq", "manifest"), engine="nczmap")
    assert cube.band_data.shape == (3, 180, 360)
    assert [str(t)[:10] for t in cube.time.values] == ["2024-01-01", "2024-01-02", "2024-01-03"]
    # the same field as the netCDF files, north up, in hundredths of a degree
    np.testing.assert_allclose(cube.band_data.values, netcdf_sst(out)[:3, ::-1], atol=0.0051)
    cube.close()


def test_the_python_steps_print_what_they_run(example):
    _, printed = example
    assert ">>> ds = xr.open_dataset(" in printed and 'engine="nczmap", chunks={})' in printed
    assert "dask.array<chunksize=(1, 90, 180)" in printed  # the dataset, lazily
    assert re.search(r"2024-01-05 12:00:00\s+2\d\.\d+", printed)  # the computed mean
    assert '>>> nczmap.to_nczarr(ds, "file://' in printed and "Traceback" not in printed
    assert len(printed.splitlines()) < 100


def test_the_zip_store_opens(example):
    out, _ = example
    with nczmap.open_dataset(url(out / "sst.zip", "zip")) as ds:
        assert ds.dialect.value == "nczarr-4.8.1"  # the keys netcdf-c 4.8.1-4.9.0 reads
    z = xr.open_dataset(url(out / "sst.zip", "zip"), engine="nczmap")
    np.testing.assert_array_equal(z.sst.values, netcdf_sst(out))
    assert z.sst.attrs["units"] == "degC" and str(z.time.values[0])[:19] == "2024-01-01T12:00:00"
    z.close()


def test_netcdf_c_reads_the_store_written_for_it(example):
    out, _ = example
    if shutil.which("ncdump") is None:
        pytest.skip("netcdf-c's ncdump is not on PATH (scripts/setup.sh installs Debian's netcdf-bin)")
    dumped = run("ncdump", "-v", "time,sst", url(out / "sst.file", "file"), cwd=out)
    assert "float sst(time, lat, lon) ;" in dumped and 'sst:units = "degC" ;' in dumped
    assert re.search(r"time = 0\.5, 1\.5, 2\.5, 3\.5, 4\.5 ;", dumped)
    text = dumped.split(" sst =", 1)[1].split(";", 1)[0]
    values = np.array([np.nan if v.strip() == "_" else float(v) for v in text.split(",")], "f4")
    np.testing.assert_allclose(values.reshape(5, 180, 360), netcdf_sst(out), rtol=1e-6)


def test_the_plot(example):
    out, _ = example
    png = (out / "sst.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (1000, 500)
    assert len(png) > 30_000  # a field, not a blank canvas
    import matplotlib.image

    pixels = matplotlib.image.imread(out / "sst.png")
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 100  # many colours
