"""A GRIB2 grid's CF grid mapping (``spatial_ref``, as for TIFF sources) and, for a Lambert conformal grid,
its 1-D projection coordinates ``x`` and ``y``.

The Earth is section 3's shape of the Earth (code table 3.2); the CRS is made with pyproj from CF
attributes and written back as pyproj's ``to_cf()`` attributes with ``crs_wkt`` and ``spatial_ref``. A
Lambert grid's x and y start at its first grid point projected, Dx and Dy apart, in its scanning
directions.
"""

from __future__ import annotations

import functools
import json

import numpy as np

from nczmap.integrations.virtualize.grib_describe import Grid

# code table 3.2: spheres (radius) and ellipsoids (semi-major axis, semi-minor axis), in metres
SPHERES = {0: 6367470.0, 6: 6371229.0, 8: 6371200.0}
ELLIPSOIDS = {
    2: (6378160.0, 6356775.0),  # IAU 1965
    4: (6378137.0, 6356752.314140356),  # IAG-GRS80
    5: (6378137.0, 6356752.314245179),  # WGS84
    9: (6377563.396, 6356256.909),  # Airy 1830 (OSGB 1936)
}


class NoGridMapping(ValueError):
    """Why a grid has no grid mapping (the variable ``spatial_ref`` is then refused, saying so)."""


def earth(grid: Grid) -> dict[str, float]:
    """The CF attributes of the grid's Earth."""
    keys = grid.earth
    shape = keys.get("shapeOfTheEarth")
    if shape in SPHERES:
        return {"earth_radius": SPHERES[shape]}
    if shape in ELLIPSOIDS:
        major, minor = ELLIPSOIDS[shape]
        return {"semi_major_axis": major, "semi_minor_axis": minor}
    if shape == 1:
        return {"earth_radius": _scaled(keys, "RadiusOfSphericalEarth")}
    if shape in (3, 7):
        factor = 1000.0 if shape == 3 else 1.0
        major, minor = _scaled(keys, "EarthMajorAxis"), _scaled(keys, "EarthMinorAxis")
        return {"semi_major_axis": major * factor, "semi_minor_axis": minor * factor}
    raise NoGridMapping(f"its shape of the Earth ({shape}, code table 3.2) is not supported")


def _scaled(keys: dict[str, int], what: str) -> float:
    factor, value = keys.get("scaleFactorOf" + what), keys.get("scaledValueOf" + what)
    if factor is None or value is None or not 0 <= factor <= 20 or not 0 < value < 1 << 32:
        raise NoGridMapping(f"its {what} is missing or out of range (scale factor {factor}, value {value})")
    return value / 10.0**factor


def mapping(grid: Grid) -> dict[str, object]:
    """The grid mapping's attributes (NoGridMapping if there is none)."""
    cf: dict[str, object] = dict(earth(grid))
    if grid.grid_type == "lambert":
        p = grid.projection
        parallels = [p["Latin1InDegrees"], p["Latin2InDegrees"]]
        cf.update(
            grid_mapping_name="lambert_conformal_conic",
            standard_parallel=parallels if parallels[0] != parallels[1] else parallels[0],
            longitude_of_central_meridian=p["LoVInDegrees"],
            latitude_of_projection_origin=p["LaDInDegrees"],
            false_easting=0.0,
            false_northing=0.0,
        )
    else:
        cf["grid_mapping_name"] = "latitude_longitude"
    return dict(_crs_attributes(json.dumps(cf, sort_keys=True)))


@functools.lru_cache(maxsize=64)
def _crs_attributes(cf_json: str) -> tuple[tuple[str, object], ...]:
    """pyproj's CF attributes of the CRS of ``cf_json``, once per distinct grid mapping."""
    try:
        import pyproj
    except ImportError:
        raise NoGridMapping("pyproj is not installed (nczmap[virtual])") from None
    try:
        crs = pyproj.CRS.from_cf(json.loads(cf_json))
    except pyproj.exceptions.CRSError as exc:
        raise NoGridMapping(f"PROJ cannot make its CRS: {exc}") from None
    attributes = dict(crs.to_cf())
    wkt = crs.to_wkt()
    attributes["crs_wkt"] = wkt
    attributes["spatial_ref"] = wkt
    return tuple(attributes.items())


def projected_axes(grid: Grid, attributes: dict[str, object]) -> tuple[np.ndarray, np.ndarray]:
    """A Lambert grid's x and y (metres), from its first grid point, Dx, Dy and scanning directions."""
    import pyproj

    p = grid.projection
    first = (p["longitudeOfFirstGridPointInDegrees"], p["latitudeOfFirstGridPointInDegrees"])
    try:
        crs = pyproj.CRS.from_wkt(str(attributes["crs_wkt"]))
        to_grid = pyproj.Transformer.from_crs(crs.geodetic_crs, crs, always_xy=True)
        x0, y0 = to_grid.transform(*first, errcheck=True)
    except pyproj.exceptions.ProjError as exc:
        raise NoGridMapping(f"PROJ cannot project its first grid point: {exc}") from None
    if not (np.isfinite(x0) and np.isfinite(y0)):
        raise NoGridMapping(f"its first grid point {first} projects to ({x0}, {y0})")
    ny, nx = grid.shape
    dx = -p["DxInMetres"] if grid.flags["iScansNegatively"] else p["DxInMetres"]
    dy = p["DyInMetres"] if grid.flags["jScansPositively"] else -p["DyInMetres"]
    return x0 + dx * np.arange(nx, dtype=np.float64), y0 + dy * np.arange(ny, dtype=np.float64)
