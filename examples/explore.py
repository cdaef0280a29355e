"""The Python half of examples/run.sh: open the virtual datasets with xarray, compute, write NCZarr, plot.

    python examples/explore.py OUTDIR

OUTDIR holds what make_example.py and `nczmap virtualize` made (daily.json, cogs.parq). Every statement is
printed as you would type it at the Python prompt (`>>> `), then run, with what the prompt would show.
Writes OUTDIR/sst.zip and OUTDIR/sst.file (NCZarr for netcdf-c 4.9.0) and OUTDIR/sst.png.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path


def heading(text: str) -> None:
    print(f"\n== {text}", flush=True)


class Prompt:
    """Runs statements as the interactive interpreter does, echoing each one first."""

    def __init__(self) -> None:
        self.namespace: dict = {"__name__": "__example__"}
        self.seen: set[str] = set()

    def __call__(self, statement: str) -> None:
        first, *rest = statement.strip("\n").splitlines()
        print(">>> " + first)
        for line in rest:
            print("... " + line)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exec(compile(statement.strip("\n") + "\n", "<stdin>", "single"), self.namespace)
        for warning in caught:  # as one line each, once each
            text = f"{warning.category.__name__}: {warning.message}"
            if text not in self.seen:
                self.seen.add(text)
                print(text)
        sys.stdout.flush()


def main(outdir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    out = Path(outdir).resolve()
    run = Prompt()

    heading("3. Open the virtual datasets with xarray (engine='nczmap'), lazily with dask, and compute")
    run("import xarray as xr, nczmap")
    daily = f"file://{out}/daily.json#mode=nczarr,manifest"
    run(f'ds = xr.open_dataset("{daily}", engine="nczmap", chunks={{}})')
    run("ds")
    run('ds.sst.encoding["chunksizes"], ds.sst.encoding["zlib"]  # the netCDF-4 files\' own chunks and zlib')
    run("nino34 = ds.sst.sel(lat=slice(-5, 5), lon=slice(-170, -120)).mean(['lat', 'lon'])  # lazy (dask)")
    run("nino34.compute().to_series().astype(float).round(3)  # daily mean of the Nino 3.4 box, degC")
    cogs = f"file://{out}/cogs.parq#mode=nczarr,manifest"
    run(f'cube = xr.open_dataset("{cogs}", engine="nczmap", chunks={{}})')
    run("cube.band_data")
    run("cube.band_data.sel(x=-140.5, y=0.5).values  # one pixel of the 3 COGs, int16 * 0.01, in degC")

    heading("4. Write NCZarr that netcdf-c 4.9.0 reads: a zip, and a directory (Debian's 4.9.0 has no zip)")
    run(f'nczmap.to_nczarr(ds, "file://{out}/sst.zip#mode=nczarr,zip", netcdf_version="4.9.0")')
    run(f'nczmap.to_nczarr(ds, "file://{out}/sst.file#mode=nczarr,file", netcdf_version="4.9.0")')

    heading("5. Plot a field read back from the zip")
    run("import matplotlib.pyplot as plt")
    run(f'z = xr.open_dataset("file://{out}/sst.zip#mode=nczarr,zip", engine="nczmap")')
    run("fig, ax = plt.subplots(figsize=(10, 5), layout='constrained')")
    run("ax.set_facecolor('0.75')  # land (the fill value, NaN) in grey")
    run("mesh = z.sst.isel(time=-1).plot(ax=ax, cmap='RdYlBu_r', vmin=-2, vmax=32)")
    run("title = ax.set_title('Sea surface temperature, 2024-01-05 (from sst.zip, NCZarr)')")
    run(f'fig.savefig("{out}/sst.png", dpi=100)')
    print(f"wrote {out}/sst.png")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "example")
