"""TIFF, BigTIFF, GeoTIFF and Cloud-Optimized GeoTIFF sources: the image's tiles or strips as chunks.

The IFDs are read here (both byte orders, classic and BigTIFF; every count and offset checked against the
file's size before anything is read or allocated, IFD loops refused), never through libtiff or GDAL.

The model (names as rioxarray's, so ``xarray.open_dataset`` gives what ``rioxarray.open_rasterio`` gives):

- ``band_data``: the first full-resolution image, dims ``(y, x)`` for one band, ``(y, x, band)`` for
  pixel-interleaved bands (PlanarConfiguration 1, chunks ``(ty, tx, nbands)``) and ``(band, y, x)`` for
  planar bands (chunks ``(1, ty, tx)``), with a ``band`` coordinate 1..n. Tiles are chunks; strips are
  chunks of RowsPerStrip whole rows. Sparse tiles or strips (offset or byte count 0) are missing chunks,
  read as the fill value.
- Codecs are the ids tifffile's ``write_fsspec`` and kerchunk write, so any reader with
  imagecodecs-numcodecs decodes them (nczmap without it uses :mod:`nczmap.format.tiffcodecs`): deflate
  -> ``zlib``, zstd -> ``zstd``, LZMA -> ``lzma``, LZW -> ``imagecodecs_lzw``, PackBits ->
  ``imagecodecs_packbits``; predictor 2 -> ``imagecodecs_delta``, 3 -> ``imagecodecs_floatpred`` (axis -2
  for pixel-interleaved bands). JPEG and every other compression are refused (NotVirtualizable).
- A last strip shorter than RowsPerStrip holds fewer bytes than a chunk: the filter ``nczmap.pad``
  (nczmap's own, registered through the ``numcodecs.codecs`` entry point) pads the decompressed bytes to
  a whole chunk before the predictor filter runs. It is only there when the height is not a multiple of
  RowsPerStrip.
- GeoTIFF: ``x``/``y`` coordinates at pixel centres (PixelIsPoint shifts the origin half a pixel, as
  GDAL does), and the scalar grid mapping ``spatial_ref`` (pyproj's ``to_cf()`` attributes, ``crs_wkt``,
  ``spatial_ref`` and GDAL's ``GeoTransform``) from the EPSG code of ProjectedCSTypeGeoKey or
  GeographicTypeGeoKey; data variables get ``grid_mapping = "spatial_ref"``. A rotated or sheared
  transform has no 1-D x/y (``GeoTransform`` on ``spatial_ref`` keeps it); a user-defined CRS (no EPSG
  code) has no ``spatial_ref`` (a refusal says so). A TIFF without georeferencing has no x/y variables.
- GDAL_NODATA -> ``_FillValue`` (and the fill of missing chunks). GDAL_METADATA: dataset items become
  global attributes; band descriptions ``long_name`` (a list for several bands); unit types ``units``;
  per-band SCALE/OFFSET ``scale_factor``/``add_offset``. Bands whose scale, offset, units or other band
  items differ are never collapsed: planar images become one variable per band (``band_1``, ``band_2``,
  ..., dims ``(y, x)``, each its own chunks); pixel-interleaved ones keep ``band_data`` with the values per
  band as ``band_scale_factor``/``band_add_offset`` (and a refusal of ``scale_factor``/``add_offset``).
- Overviews (NewSubfileType bit 0) become groups ``overview_1`` (the largest), ``overview_2``, ... with
  their own ``y``/``x`` dimensions and coordinates and the same variable names (``band`` and
  ``spatial_ref`` are the root's). Transparency masks (bit 2) are refused as ``/mask`` (and
  ``/overview_N/mask``); full-resolution pages after the first as ``/image_2``, ``/image_3``, ...
  SubIFDs are not followed.

The module is one idea a file: :mod:`.tiff_ifds` reads the header and IFDs (and decides what is read
when), :mod:`.tiff_layout` makes an image's tiles or strips a chunked storage, :mod:`.tiff_geo` the
georeferencing, :mod:`.tiff_twins` the fast path of a series; this one the netCDF model (and GDAL's
per-band metadata).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from nczmap.errors import FormatError
from nczmap.format import Attribute, Dimension, Group
from nczmap.format.types import BY_NAME, CHAR, DOUBLE, INT, STRING, NCType, type_of_numpy
from nczmap.format.variable import ArrayLayout
from nczmap.integrations.virtualize.parsed import (
    Constant,
    NotVirtualizable,
    ParsedFile,
    ParseOptions,
    Refusal,
    SourceVariable,
    Storage,
    native_dtype,
    source_layout,
)
from nczmap.integrations.virtualize.tiff_geo import Georeference
from nczmap.integrations.virtualize.tiff_ifds import (
    GDAL_METADATA,
    GDAL_NODATA,
    MAGICS,
    MAX_IFDS,
    Ifd,
    TiffReader,
)
from nczmap.integrations.virtualize.tiff_layout import Image, data_storage, image_codecs, read_image
from nczmap.integrations.virtualize.tiff_twins import parse_twin, take_fingerprint

__all__ = ["FORMAT", "MAX_IFDS", "parse", "parse_twin", "sniff"]
FORMAT = "TIFF"  # how messages name the format


def sniff(read: Callable[[int, int], bytes], size: int) -> bool:
    """Whether the bytes are a classic TIFF or a BigTIFF (either byte order)."""
    return size >= 8 and bytes(read(0, 4)) in MAGICS


def parse(file, options: ParseOptions) -> ParsedFile:
    """The netCDF model of a TIFF's first full-resolution image, its overviews and georeferencing."""
    tiff = TiffReader(file)
    pages = tiff.ifds()
    full = [ifd for ifd in pages if not ifd.subfile & 5]
    if not full:
        raise FormatError(f"{tiff.name}: no full-resolution image (every IFD is an overview or mask)")
    main = full[0]
    # every tag value the parse and the fingerprint read, at once: the image's and overviews' chunk
    # tables, every other tag of every IFD (a COG's lie in the first block: nothing to fetch)
    tiff.fetch(
        (where, nbytes)
        for ifd in pages
        for _, where, nbytes in tiff.value_ranges(ifd, tables=ifd is main or ifd.subfile & 5 == 1)
    )
    root = Group("/", None)
    parsed = ParsedFile(tiff.name, root, [], "tiff")
    try:
        image = read_image(tiff, main)
    except NotVirtualizable as exc:  # the whole source is refused: say which
        raise NotVirtualizable(f"{tiff.name}: {exc}") from None
    bands = _BandInfo.read(tiff, main, image, parsed.refused)
    geo = Georeference.read(tiff, main, parsed.refused)
    _global_attributes(root, bands)
    if geo.crs_attributes is not None:
        _scalar_variable(root, "spatial_ref", tiff.name, geo.crs_attributes)
    if image.samples > 1:
        band = Dimension("band", image.samples, False, root)
        root.dimensions["band"] = band
        _coordinate(root, "band", band, np.arange(1, image.samples + 1, dtype=np.int32), tiff.name, {})
    _add_image(root, tiff, image, bands, geo, geo.transform, parsed.refused)
    overviews = 0
    for number, ifd in enumerate(pages, 1):
        if ifd is main:
            continue
        if not ifd.subfile & 5:
            parsed.refused.append(
                Refusal(
                    f"/image_{full.index(ifd) + 1}",
                    "only the first full-resolution image of a multi-page TIFF is virtualized",
                    tiff.name,
                )
            )
        elif ifd.subfile & 4:
            where = "/mask" if not ifd.subfile & 1 else f"/overview_{overviews}/mask"
            parsed.refused.append(
                Refusal(where, f"IFD {number} is a transparency mask, which is not virtualized", tiff.name)
            )
        else:
            overviews += 1
            _add_overview(root, tiff, ifd, overviews, image, bands, geo, parsed.refused)
    parsed.fingerprint = take_fingerprint(tiff, pages, parsed)
    return parsed


# ------------------------------------------------------------------------------------ band metadata
@dataclass
class _BandInfo:
    """What GDAL records per band and for the dataset (GDAL_NODATA, GDAL_METADATA)."""

    samples: int
    fill: object = None
    fill_problem: str | None = None
    dataset_items: dict[str, str] = field(default_factory=dict)
    per_band: list[dict[str, object]] = field(default_factory=list)  # attribute name -> value, per band

    @classmethod
    def read(cls, tiff: TiffReader, ifd: Ifd, image: Image, refused: list[Refusal]) -> _BandInfo:
        info = cls(image.samples, per_band=[{} for _ in range(image.samples)])
        nodata = tiff.text(ifd, GDAL_NODATA, "GDAL_NODATA")
        if nodata is not None:
            info.fill, info.fill_problem = _nodata(nodata.strip(), image.dtype)
        xml = tiff.text(ifd, GDAL_METADATA, "GDAL_METADATA")
        if xml:
            info._metadata(xml, tiff.name, refused)
        return info

    def _metadata(self, xml: str, source: str, refused: list[Refusal]) -> None:
        import xml.etree.ElementTree as ElementTree

        try:
            items = ElementTree.fromstring(xml).iter("Item")
            items = list(items)
        except ElementTree.ParseError as exc:
            refused.append(Refusal("/", f"its GDAL_METADATA is not XML: {exc}", source, "GDAL_METADATA"))
            return
        for item in items:
            name, role, sample = item.get("name"), item.get("role"), item.get("sample")
            text = item.text or ""
            if sample is None:
                if name and not role:
                    self.dataset_items[name] = text
                continue
            if not sample.isdigit() or int(sample) >= self.samples:
                continue
            band = self.per_band[int(sample)]
            if role == "description":
                band["long_name"] = text
            elif role == "unittype":
                band["units"] = text
            elif role in ("scale", "offset"):
                try:
                    band["scale_factor" if role == "scale" else "add_offset"] = float(text)
                except ValueError:
                    refused.append(Refusal("/band_data", f"its {role} {text!r} is no number", source, role))
            elif name and not role:
                band[name] = text

    def uniform(self) -> bool:
        """Whether every band carries the same attributes (descriptions aside)."""

        def strip(band: dict) -> dict:
            return {k: v for k, v in band.items() if k != "long_name"}

        return all(strip(band) == strip(self.per_band[0]) for band in self.per_band)


def _nodata(text: str, dtype: np.dtype) -> tuple[object, str | None]:
    try:
        value = int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text)
    except ValueError:
        return None, f"GDAL_NODATA {text!r} is no number"
    if dtype.kind == "f":
        return np.array(value, dtype=dtype.newbyteorder("="))[()], None
    if isinstance(value, float):
        if not value.is_integer():
            return None, f"GDAL_NODATA {text!r} is not an integer of the image's type {dtype}"
        value = int(value)
    info = np.iinfo(dtype)
    if not info.min <= value <= info.max:
        return None, f"GDAL_NODATA {text!r} is outside the range of the image's type {dtype}"
    return np.array(value, dtype=dtype.newbyteorder("="))[()], None


# ---------------------------------------------------------------------------------- georeferencing
# ------------------------------------------------------------------------------------------- model
def _global_attributes(root: Group, bands: _BandInfo) -> None:
    for name, text in bands.dataset_items.items():
        if _valid_name(name):
            root.attrs.load({name: Attribute(name, CHAR, text)})


def _add_overview(
    root: Group,
    tiff: TiffReader,
    ifd: Ifd,
    number: int,
    full: Image,
    bands: _BandInfo,
    geo: Georeference,
    refused: list[Refusal],
) -> None:
    where = f"/overview_{number}"
    try:
        image = read_image(tiff, ifd)
    except NotVirtualizable as exc:
        refused.append(Refusal(where, str(exc), tiff.name))
        return
    if image.samples != full.samples or image.dtype != full.dtype or image.planar != full.planar:
        refused.append(Refusal(where, "its bands differ from the full-resolution image's", tiff.name))
        return
    group = Group(f"overview_{number}", root)
    root.groups[group.name] = group
    # dimensions of their own names: xarray's DataTree cannot align a group's x with its parent's
    _add_image(group, tiff, image, bands, geo, geo.scaled(image, full), refused, f"_overview_{number}")


def _add_image(
    group: Group,
    tiff: TiffReader,
    image: Image,
    bands: _BandInfo,
    geo: Georeference,
    transform: tuple[float, ...] | None,
    refused: list[Refusal],
    suffix: str = "",
) -> None:
    y = Dimension("y" + suffix, image.height, False, group)
    x = Dimension("x" + suffix, image.width, False, group)
    group.dimensions[y.name], group.dimensions[x.name] = y, x
    _xy(group, tiff.name, x, y, transform, geo)
    band_dim = group.root.dimensions.get("band")
    georeferenced = geo.crs_attributes is not None
    if image.samples > 1 and image.planar and not bands.uniform():
        for plane in range(image.samples):
            variable = _data_variable(group, f"band_{plane + 1}", (y, x), image, plane, tiff)
            _band_attributes(variable, bands, [plane], georeferenced, refused)
        return
    dims = (y, x) if image.samples == 1 else ((band_dim, y, x) if image.planar else (y, x, band_dim))
    variable = _data_variable(group, "band_data", dims, image, None, tiff)
    _band_attributes(variable, bands, list(range(image.samples)), georeferenced, refused)


def _xy(group: Group, source: str, x: Dimension, y: Dimension, transform, geo: Georeference) -> None:
    if transform is None:
        return
    a, b, c, d, e, f = transform
    if b != 0 or d != 0:
        return  # rotated or sheared: no 1-D coordinates (GeoTransform on spatial_ref keeps it)
    for dim, start, step, axis in ((x, c, a, "X"), (y, f, e, "Y")):
        values = start + (np.arange(dim.size, dtype=np.float64) + 0.5) * step
        attrs: dict[str, object] = {"axis": axis}
        if geo.crs_attributes is not None:
            if geo.geographic:
                standard = "longitude" if axis == "X" else "latitude"
                attrs.update(
                    standard_name=standard,
                    long_name=standard,
                    units="degrees_east" if axis == "X" else "degrees_north",
                )
            else:
                attrs.update(
                    standard_name=f"projection_{axis.lower()}_coordinate",
                    long_name=f"{axis.lower()} coordinate of projection",
                )
                if geo.units:
                    attrs["units"] = geo.units
        _coordinate(group, dim.name, dim, values, source, attrs)


def _data_variable(group: Group, name: str, dims, image: Image, plane: int | None, tiff: TiffReader):
    storage = data_storage(tiff, image, plane)
    filters, compressor = image_codecs(image, storage.chunks)
    dtype = native_dtype(image.nctype, image.dtype)
    layout = source_layout(storage.shape, storage.chunks, dtype, None, filters, compressor)
    variable = SourceVariable(group, name, dims, layout, storage)
    group.variables[name] = variable
    tiff.slots.append((variable.key, dataclasses.replace(image, offsets=None, counts=None), plane))
    return variable


def _band_attributes(variable, bands: _BandInfo, planes: list[int], georeferenced: bool, refused) -> None:
    attrs: dict[str, Attribute] = {}
    nctype = variable.layout.dtype.nctype
    source = variable.storages[0].source
    if bands.fill is not None:
        variable.layout.fill = bands.fill
        attrs["_FillValue"] = Attribute("_FillValue", nctype, np.array([bands.fill], dtype=nctype.numpy))
    elif bands.fill_problem:
        refused.append(Refusal(variable.key, bands.fill_problem, source, "_FillValue"))
    if georeferenced:
        attrs["grid_mapping"] = Attribute("grid_mapping", CHAR, "spatial_ref")
    selected = [bands.per_band[p] for p in planes]
    descriptions = [band.get("long_name") for band in selected]
    if any(descriptions):
        text = [d or "" for d in descriptions]
        attrs["long_name"] = (
            Attribute("long_name", CHAR, text[0]) if len(text) == 1 else _strings("long_name", text)
        )
    names = sorted({k for band in selected for k in band} - {"long_name"})
    for name in names:
        values = [band.get(name) for band in selected]
        if all(v == values[0] for v in values):
            if _valid_name(name):
                attrs[name] = _attribute(name, values[0])
            continue
        if name in ("scale_factor", "add_offset"):
            default = 1.0 if name == "scale_factor" else 0.0
            filled = [default if v is None else v for v in values]
            attrs[f"band_{name}"] = Attribute(f"band_{name}", DOUBLE, np.array(filled, dtype=np.float64))
        reason = f"its bands differ in {name} ({values}) and share their chunks (pixel-interleaved)"
        refused.append(Refusal(variable.key, reason, source, name))
    variable.attrs.load(attrs)


# ---------------------------------------------------------------------------------------- helpers
def _attribute(name: str, value: object) -> Attribute:
    if isinstance(value, str):
        return Attribute(name, CHAR, value)
    if isinstance(value, bool | int | np.integer) and not isinstance(value, bool):
        kind = INT if -(1 << 31) < int(value) < (1 << 31) else BY_NAME["int64"]
        return Attribute(name, kind, np.array([value], dtype=kind.numpy))
    if isinstance(value, list | tuple):
        return Attribute(name, DOUBLE, np.array(value, dtype=np.float64))
    return Attribute(name, DOUBLE, np.array([float(value)], dtype=np.float64))


def _strings(name: str, values: list[str]) -> Attribute:
    return Attribute(name, STRING, list(values))


def _valid_name(name: str) -> bool:
    return bool(name) and "/" not in name and not name.startswith(("_", ".")) and name.isprintable()


def _values_layout(values: np.ndarray, nctype: NCType) -> ArrayLayout:
    shape = values.shape
    return source_layout(
        shape, tuple(max(1, n) for n in shape), native_dtype(nctype, values.dtype), scalar=not shape
    )


def _coordinate(
    group: Group, name: str, dim: Dimension, values: np.ndarray, source: str, attrs: dict
) -> None:
    nctype = type_of_numpy(values.dtype)
    storage = Storage(source, "values", values.shape, values=Constant(values))
    variable = SourceVariable(group, name, [dim], _values_layout(values, nctype), storage)
    variable.attrs.load({k: _attribute(k, v) for k, v in attrs.items()})
    group.variables[name] = variable


def _scalar_variable(group: Group, name: str, source: str, attrs: dict[str, object]) -> None:
    values = np.array(0, dtype=np.int32)
    storage = Storage(source, "values", (), values=Constant(values))
    variable = SourceVariable(group, name, [], _values_layout(values, INT), storage)
    variable.attrs.load({k: _attribute(k, v) for k, v in attrs.items()})
    group.variables[name] = variable
