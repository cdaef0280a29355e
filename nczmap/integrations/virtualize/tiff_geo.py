"""GeoTIFF georeferencing: the affine transform (ModelTransformation, or ModelPixelScale with one
ModelTiepoint; PixelIsPoint moves the origin half a pixel, as GDAL does) and the CRS of the GeoKeys'
EPSG code as pyproj's CF grid-mapping attributes.

A rotated or sheared transform gives no 1-D x/y (``GeoTransform`` keeps it); a user-defined CRS (no EPSG
code) no grid mapping, with a refusal saying so.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from nczmap.errors import FormatError
from nczmap.integrations.virtualize.parsed import Refusal
from nczmap.integrations.virtualize.tiff_ifds import (
    GEO_ASCII_PARAMS,
    GEO_DOUBLE_PARAMS,
    GEO_KEY_DIRECTORY,
    MODEL_PIXEL_SCALE,
    MODEL_TIEPOINT,
    MODEL_TRANSFORMATION,
    Ifd,
    TiffReader,
)
from nczmap.integrations.virtualize.tiff_layout import Image

# GeoKeys
GT_MODEL_TYPE, GT_RASTER_TYPE, GEOGRAPHIC_TYPE, PROJECTED_CS_TYPE = 1024, 1025, 2048, 3072
PIXEL_IS_POINT = 2
USER_DEFINED = 32767


@dataclass
class Georeference:
    transform: tuple[float, ...] | None = None  # affine a, b, c, d, e, f (x = a*col + b*row + c)
    geographic: bool = False
    units: str | None = None
    crs_attributes: dict[str, object] | None = None

    @classmethod
    def read(cls, tiff: TiffReader, ifd: Ifd, refused: list[Refusal]) -> Georeference:
        geo = cls()
        keys = _geokeys(tiff, ifd)
        geo.transform = _transform(tiff, ifd, keys.get(GT_RASTER_TYPE) == PIXEL_IS_POINT)
        if keys:
            geo._crs(keys, tiff.name, refused)
        if geo.crs_attributes is not None and geo.transform is not None:
            a, b, c, d, e, f = geo.transform
            geo.crs_attributes["GeoTransform"] = " ".join(repr(float(v)) for v in (c, a, b, f, d, e))
        return geo

    def _crs(self, keys: dict[int, object], source: str, refused: list[Refusal]) -> None:
        model = keys.get(GT_MODEL_TYPE)
        code = keys.get(PROJECTED_CS_TYPE) if model != 2 else None
        if not isinstance(code, int) or not 0 < code < USER_DEFINED:
            code = keys.get(GEOGRAPHIC_TYPE)
            if model == 1 and keys.get(PROJECTED_CS_TYPE) is not None:
                code = None  # a user-defined projection: its geographic CRS alone would be wrong
        if not isinstance(code, int) or not 0 < code < USER_DEFINED:
            refused.append(
                Refusal("/spatial_ref", "its CRS is user-defined (no EPSG code), not translated", source)
            )
            return
        try:
            self.geographic, self.units, attributes = _epsg(code)
        except ImportError:
            refused.append(Refusal("/spatial_ref", "pyproj is not installed (nczmap[virtual])", source))
            return
        except ValueError as exc:
            refused.append(Refusal("/spatial_ref", f"EPSG:{code} is unknown to PROJ: {exc}", source))
            return
        self.crs_attributes = dict(attributes)  # a copy: GeoTransform is added per file

    def scaled(self, image: Image, full: Image) -> tuple[float, ...] | None:
        """The transform of an image whose extent is the full image's (overviews)."""
        if self.transform is None:
            return None
        a, b, c, d, e, f = self.transform
        sx, sy = full.width / image.width, full.height / image.height
        return (a * sx, b * sy, c, d * sx, e * sy, f)


@functools.lru_cache(maxsize=64)
def _epsg(code: int) -> tuple[bool, str | None, dict[str, object]]:
    """(geographic, axis units, CF attributes with ``crs_wkt`` and ``spatial_ref``) of an EPSG CRS, once
    per code: a collection's files share it, and PROJ takes milliseconds to describe one."""
    import pyproj

    try:
        crs = pyproj.CRS.from_epsg(code)
    except pyproj.exceptions.CRSError as exc:
        raise ValueError(str(exc)) from None
    unit = crs.axis_info[0].unit_name if crs.axis_info else None
    units = {"metre": "m", "meter": "m", "foot": "ft", "US survey foot": "US_survey_foot"}.get(unit, unit)
    attributes = dict(crs.to_cf())
    wkt = crs.to_wkt()
    attributes["crs_wkt"] = wkt
    attributes["spatial_ref"] = wkt
    return crs.is_geographic, units, attributes


def _geokeys(tiff: TiffReader, ifd: Ifd) -> dict[int, object]:
    directory = tiff.values(ifd, GEO_KEY_DIRECTORY, "GeoKeyDirectoryTag")
    if directory is None:
        return {}
    directory = directory.astype(np.int64).ravel()
    if directory.size < 4 or directory.size < 4 + 4 * int(directory[3]):
        raise FormatError(f"{tiff.name}: GeoKeyDirectoryTag is shorter than the keys it announces")
    doubles = tiff.doubles(ifd, GEO_DOUBLE_PARAMS, "GeoDoubleParamsTag")
    ascii_params = tiff.text(ifd, GEO_ASCII_PARAMS, "GeoAsciiParamsTag") or ""
    keys: dict[int, object] = {}
    for key, location, count, value in directory[4 : 4 + 4 * int(directory[3])].reshape(-1, 4).tolist():
        if location == 0:
            keys[key] = value
        elif location == GEO_DOUBLE_PARAMS and doubles is not None:
            keys[key] = doubles[value : value + count].tolist()
        elif location == GEO_ASCII_PARAMS:
            keys[key] = ascii_params[value : value + count].rstrip("|\x00")
    return keys


def _transform(tiff: TiffReader, ifd: Ifd, point: bool) -> tuple[float, ...] | None:
    matrix = tiff.doubles(ifd, MODEL_TRANSFORMATION, "ModelTransformationTag")
    scale = tiff.doubles(ifd, MODEL_PIXEL_SCALE, "ModelPixelScaleTag")
    tiepoints = tiff.doubles(ifd, MODEL_TIEPOINT, "ModelTiepointTag")
    if matrix is not None and matrix.size >= 16:
        a, b, c, d, e, f = (float(matrix[i]) for i in (0, 1, 3, 4, 5, 7))
    elif scale is not None and scale.size >= 2 and tiepoints is not None and tiepoints.size == 6:
        i, j, x, y = (float(tiepoints[k]) for k in (0, 1, 3, 4))
        a, e = float(scale[0]), -float(scale[1])
        b = d = 0.0
        c, f = x - i * a, y - j * e
    else:
        return None  # no georeferencing, or ground control points only
    if point:  # PixelIsPoint: GDAL moves the origin half a pixel, so pixel centres fall on the model points
        c, f = c - 0.5 * a - 0.5 * b, f - 0.5 * d - 0.5 * e
    return (a, b, c, d, e, f)
