"""GRIB2 files for the tests, written with ecCodes from its bundled samples (``codes_grib_new_from_samples``),
and cfgrib's reading of them (the reference the parser is held to)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("eccodes")
from nczmap.format.gribcodec import import_eccodes  # its libraries kept out of the global scope

eccodes = import_eccodes()


def message(sample: str = "regular_ll_pl_grib2", values=None, **keys) -> bytes:
    """One message from an ecCodes sample with ``keys`` set (in order), then ``values``."""
    handle = eccodes.codes_grib_new_from_samples(sample)
    try:
        for key, value in keys.items():
            if isinstance(value, list | np.ndarray):
                eccodes.codes_set_array(handle, key, value)
            else:
                eccodes.codes_set(handle, key, value)
        if values is None:
            count = eccodes.codes_get(handle, "numberOfValues")
            values = np.linspace(200.0, 300.0, count)
        eccodes.codes_set_values(handle, np.asarray(values, dtype=np.float64).ravel())
        return eccodes.codes_get_message(handle)
    finally:
        eccodes.codes_release(handle)


def points(sample: str = "regular_ll_pl_grib2", **keys) -> int:
    handle = eccodes.codes_grib_new_from_samples(sample)
    try:
        for key, value in keys.items():
            eccodes.codes_set(handle, key, value)
        return int(eccodes.codes_get(handle, "numberOfValues"))
    finally:
        eccodes.codes_release(handle)


def field(seed: int, count: int, scale: float = 10.0, base: float = 250.0) -> np.ndarray:
    return base + scale * np.random.default_rng(seed).standard_normal(count)


def write(path: Path, messages: list[bytes]) -> Path:
    path.write_bytes(b"".join(messages))
    return path


def pressure_levels(path: Path, steps=(0, 6), levels=(500, 850), names=("t", "u"), date=20240101) -> Path:
    """Temperature and wind on pressure levels, at several steps: one cfgrib dataset."""
    count = points()
    found = []
    for step in steps:
        for level in levels:
            for index, name in enumerate(names):
                values = field(step * 1000 + level + index, count)
                found.append(message(shortName=name, level=level, step=step, dataDate=date, dataTime=1200,
                                     values=values))  # fmt: skip
    return write(path, found)


LAMBERT = {
    "gridDefinitionTemplateNumber": 30,
    "Nx": 40,
    "Ny": 30,
    "latitudeOfFirstGridPointInDegrees": 21.138,
    "longitudeOfFirstGridPointInDegrees": 237.28,
    "LaDInDegrees": 38.5,
    "LoVInDegrees": 262.5,
    "Latin1InDegrees": 38.5,
    "Latin2InDegrees": 38.5,
    "DxInMetres": 3000,
    "DyInMetres": 3000,
    "shapeOfTheEarth": 6,
    "iScansNegatively": 0,
    "jScansPositively": 1,
}


def lambert(path: Path, names=("t", "2t"), date=20240101, time=600, step=1, seed=0) -> Path:
    """An HRRR-like Lambert conformal grid: a surface field and a 2 m field."""
    found = []
    for index, name in enumerate(names):
        keys = {**LAMBERT, "dataDate": date, "dataTime": time, "step": step}
        if name == "2t":
            keys.update(typeOfFirstFixedSurface=103, scaleFactorOfFirstFixedSurface=0,
                        scaledValueOfFirstFixedSurface=2)  # fmt: skip
        values = field(seed + index + date + time + step, 1200)
        found.append(message("GRIB2", values=values, shortName=name, **keys))
    return write(path, found)


def hrrr(path: Path, hour: int, levels=(850, 500)) -> Path:
    """An HRRR-like analysis of ``hour`` on the Lambert grid: temperature on pressure levels and surface
    pressure, so two groups (``/isobaricInhPa``, ``/surface``)."""
    common = {**LAMBERT, "dataDate": 20240101, "dataTime": hour * 100, "step": 0}
    found = [message("regular_ll_pl_grib2", field(hour + level, 1200), shortName="t", level=level, **common)
             for level in levels]  # fmt: skip
    found.append(message("GRIB2", field(hour, 1200, base=101325, scale=500), shortName="sp", **common))
    return write(path, found)


def surface_and_heights(path: Path, date=20240101, time=0, step=0) -> Path:
    """Fields on three level types and two heights: several cfgrib datasets."""
    common = {"dataDate": date, "dataTime": time, "step": step}
    count = points("regular_ll_sfc_grib2")
    found = [
        message(
            "regular_ll_sfc_grib2", values=field(1, count, base=101325, scale=500), shortName="sp", **common
        ),
        message("regular_ll_sfc_grib2", values=field(2, count), shortName="2t", **common),
        message("regular_ll_sfc_grib2", values=field(3, count, base=0), shortName="10u", **common),
        message("regular_ll_sfc_grib2", values=field(4, count, base=0), shortName="10v", **common),
        message(values=field(5, points()), shortName="t", level=850, **common),
    ]
    return write(path, found)


def cfgrib_dataset(path: Path, **backend):
    import xarray as xr

    return xr.open_dataset(path, engine="cfgrib", backend_kwargs={"indexpath": "", **backend})


def cfgrib_datasets(path: Path):
    import cfgrib

    return cfgrib.open_datasets(str(path), backend_kwargs={"indexpath": ""})
