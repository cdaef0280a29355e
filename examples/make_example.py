"""Write a small, realistic collection of files to virtualize: daily netCDF-4 files and daily COGs.

    python examples/make_example.py OUTDIR

- OUTDIR/daily/sst_20240101.nc ... sst_20240105.nc: netCDF-4 (netCDF4-python), one day each: an unlimited
  `time` with CF units, `lat`/`lon` on a global 1-degree grid, `sst(time, lat, lon)` float32 in degC,
  zlib-compressed in 4 chunks a day, land as `_FillValue`, CF attributes.
- OUTDIR/cog/sst_20240101.tif ... sst_20240103.tif: Cloud Optimized GeoTIFFs (rasterio, GDAL's COG driver)
  of the same field: int16 hundredths of a degree (scale 0.01), ZSTD with PREDICTOR=2, EPSG:4326, nodata
  -32768 over land, 64x64 tiles and overviews; the date is in the file name only.

The field is synthetic but shaped like sea surface temperature: warm tropics (a western Pacific warm pool,
a cold tongue off South America), cold poles, ocean eddies drifting east day by day, a few continents.
"""

from __future__ import annotations

import sys
from datetime import date, timedelta
from pathlib import Path

import numpy as np

NC_DAYS = 5
COG_DAYS = 3
START = date(2024, 1, 1)
NODATA = -32768
LAT = np.arange(-89.5, 90, 1.0)  # cell centres, south to north
LON = np.arange(-179.5, 180, 1.0)


def land_mask() -> np.ndarray:
    """Crude continents: a few ellipses (lat centre, lon centre, lat radius, lon radius) and Antarctica."""
    lat, lon = np.meshgrid(LAT, LON, indexing="ij")
    blobs = [
        (50, -100, 22, 35),  # North America
        (-15, -60, 25, 17),  # South America
        (5, 20, 30, 22),  # Africa
        (50, 80, 22, 65),  # Eurasia
        (-25, 134, 12, 18),  # Australia
        (73, -40, 10, 20),  # Greenland
    ]
    land = lat < -70
    for clat, clon, rlat, rlon in blobs:
        land |= ((lat - clat) / rlat) ** 2 + ((lon - clon) / rlon) ** 2 < 1
    return land


def sst(day: int, land: np.ndarray) -> np.ndarray:
    """Sea surface temperature (degC) of day `day`, NaN over land."""
    lat, lon = np.meshgrid(np.radians(LAT), np.radians(LON), indexing="ij")
    field = 29.0 * np.cos(lat) ** 2 - 1.8  # warm equator, -1.8 degC (sea ice) near the poles
    field += 2.0 * np.exp(-((np.degrees(lat) / 15) ** 2) - ((np.degrees(lon) - 150) / 40) ** 2)  # warm pool
    field -= 3.0 * np.exp(-((np.degrees(lat) / 6) ** 2) - ((np.degrees(lon) + 100) / 30) ** 2)  # cold tongue
    field += 0.8 * np.sin(3 * lon + 0.15 * day) * np.sin(5 * lat) ** 2  # eddies drifting east
    field += np.random.default_rng(day).normal(0, 0.15, field.shape)  # day-to-day noise
    field = np.maximum(field, -1.8)
    return np.where(land, np.nan, field).astype("float32")


def write_netcdf(path: Path, day: int, land: np.ndarray) -> None:
    import netCDF4

    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        nc.title = "Daily sea surface temperature (synthetic example)"
        nc.institution = "nczmap example"
        nc.Conventions = "CF-1.8"
        nc.createDimension("time", None)
        nc.createDimension("lat", LAT.size)
        nc.createDimension("lon", LON.size)
        time = nc.createVariable("time", "f8", ("time",))
        time.standard_name = "time"
        time.units = "days since 2024-01-01 00:00:00"
        time.calendar = "standard"
        time[:] = [day + 0.5]  # noon
        lat = nc.createVariable("lat", "f4", ("lat",))
        lat.standard_name, lat.long_name, lat.units = "latitude", "latitude", "degrees_north"
        lat[:] = LAT
        lon = nc.createVariable("lon", "f4", ("lon",))
        lon.standard_name, lon.long_name, lon.units = "longitude", "longitude", "degrees_east"
        lon[:] = LON
        v = nc.createVariable(
            "sst", "f4", ("time", "lat", "lon"), zlib=True, complevel=4, shuffle=True,
            chunksizes=(1, 90, 180), fill_value=np.float32(-999.0),
        )  # fmt: skip
        v.standard_name = "sea_surface_temperature"
        v.long_name = "sea surface temperature"
        v.units = "degC"
        v.valid_range = np.array([-2.0, 40.0], "f4")
        v[0] = np.ma.masked_invalid(sst(day, land))


def write_cog(path: Path, day: int, land: np.ndarray) -> None:
    import rasterio
    from rasterio.transform import from_origin

    field = sst(day, land)
    data = np.where(np.isnan(field), NODATA, np.round(np.nan_to_num(field) * 100)).astype("int16")
    profile = {
        "driver": "COG",
        "width": LON.size,
        "height": LAT.size,
        "count": 1,
        "dtype": "int16",
        "crs": "EPSG:4326",
        "transform": from_origin(-180.0, 90.0, 1.0, 1.0),
        "nodata": NODATA,
        "compress": "ZSTD",
        "predictor": 2,
        "blocksize": 64,
    }
    with rasterio.open(path, "w", **profile) as dataset:
        dataset.write(data[::-1][np.newaxis])  # north up
        dataset.scales, dataset.offsets, dataset.units = (0.01,), (0.0,), ("degC",)
        dataset.set_band_description(1, "sea surface temperature")


def main(outdir: str) -> None:
    land = land_mask()
    for folder, count, suffix, write in (
        ("daily", NC_DAYS, "nc", write_netcdf),
        ("cog", COG_DAYS, "tif", write_cog),
    ):
        Path(outdir, folder).mkdir(parents=True, exist_ok=True)
        for day in range(count):
            write(Path(outdir, folder, f"sst_{START + timedelta(day):%Y%m%d}.{suffix}"), day, land)
        print(f"wrote {count} files to {Path(outdir, folder)}/")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "example")
