"""The metadata objects each dialect writes, as netcdf-c's releases write them (nczarr-format.md §3-§5).

Pure functions from the model to ``{key: JSON value}``; the writer serialises and stores them. Unlike
netcdf-c: floats keep full precision, 64-bit attributes keep their type, char attributes are written as
JSON strings (never reinterpreted), shuffle records its real element size.
"""

from __future__ import annotations

import base64
import json
import math
import struct

from nczmap._lazy import numpy as np
from nczmap._version import __version__
from nczmap.format import zarr3
from nczmap.format.dialects import Dialect
from nczmap.format.model import Attribute, Group
from nczmap.format.types import CHAR, STRING, NCType, dtype_string, infer_json_type
from nczmap.format.variable import Variable

SUPERBLOCK = {"version": "2.0.0"}
JSON_TYPE = "|J0"
D0, D1, D2, D3, PURE = (
    Dialect.NCZARR_OBJECTS,
    Dialect.NCZARR_UPPER_KEYS,
    Dialect.NCZARR_LOWER_KEYS,
    Dialect.NCZARR_ATTRIBUTES,
    Dialect.PURE_ZARR,
)


def dumps(value: object) -> bytes:
    """Compact one-line JSON in netcdf-c's spacing; NaN/Infinity become strings as 4.9.3+ writes them. Text
    read from a source file that is not UTF-8 (held as surrogate escapes) is written as its own bytes, as
    netcdf-c writes such a char attribute (and the reader reads them back the same way)."""
    text = json.dumps(_jsonable(value), separators=(", ", ": "), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8", "surrogateescape")


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def json_values(array: np.ndarray) -> list:
    """Plain Python values; a float32 becomes the double of its shortest spelling (0.1, not 0.100000001...),
    which converts back to the same float32."""
    if array.dtype.kind == "f" and array.dtype.itemsize == 4:
        return [float(str(v)) if np.isfinite(v) else float(v) for v in array]
    return array.tolist()


def attribute_json(attribute: Attribute) -> object:
    if attribute.nctype is CHAR:
        return attribute.value
    if attribute.nctype is STRING:
        values = list(attribute.value)
        return values[0] if len(values) == 1 else values
    values = json_values(attribute.value)
    return values[0] if len(values) == 1 else values


def attribute_type(attribute: Attribute, dialect: Dialect) -> str:
    if dialect is D0:
        return str(attribute.nctype.code)
    strings = attribute.value if attribute.nctype is STRING else ()
    maxlen = max((len(v.encode("utf-8", "surrogateescape")) for v in strings), default=1)
    return dtype_string(attribute.nctype, "<", max(maxlen, 1), dialect.char_dtype)


def fill_json(variable: Variable, base64_text: bool = False) -> object:
    """The ``.zarray`` ``fill_value``. Text (char, string) is its ``_FillValue``'s, as netcdf-c writes it
    (kept consistent with the attribute); ``base64_text``: as Zarr v2 spells a fixed-width bytes value
    (pure Zarr, read by zarr-python), else as the text itself (NCZarr, as netcdf-c writes it)."""
    fill = variable.layout.fill_value
    if fill is None:
        return None
    if variable.nctype.is_text:
        if "_FillValue" in variable.attrs and isinstance(variable.attrs["_FillValue"], str | bytes):
            fill = variable.attrs["_FillValue"]
        raw = fill if isinstance(fill, bytes) else str(fill).encode("utf-8", "surrogateescape")
        raw = raw.rstrip(b"\x00")
        if base64_text:
            import base64

            return base64.b64encode(raw).decode("ascii")
        return raw.decode("utf-8", "surrogateescape")
    return json_values(np.array([fill], dtype=variable.nctype.numpy))[0]


def _codec_json(variable: Variable) -> tuple[object, object]:
    codecs = variable.layout.codecs
    return (codecs.compressor or None), (list(codecs.filters) or None)


def array_dtype(variable: Variable, dialect: Dialect) -> str:
    nctype: NCType = variable.nctype
    if nctype is STRING:
        return f"|S{variable.layout.dtype.storage.itemsize}"
    order = variable.layout.dtype.storage.byteorder
    if nctype.letter and variable.layout.dtype.storage.itemsize == 1 and dialect in (D3, PURE):
        return "|" + nctype.letter  # zarr-python 3 (and so xarray) refuses "<u1"; netcdf-c reads "|u1"
    order = "<" if order in ("=", "|") else order
    return dtype_string(nctype, order if order in "<>" else "<", 1, dialect.char_dtype)


def zarray_json(variable: Variable, dialect: Dialect) -> dict:
    layout = variable.layout
    shape = [1] if layout.scalar else list(layout.shape)
    chunks = [1] if layout.scalar else list(layout.chunks)
    compressor, filters = _codec_json(variable)
    meta = {"zarr_format": 2, "shape": shape, "dtype": array_dtype(variable, dialect), "chunks": chunks}
    if not (dialect is D0 and layout.fill_value is None):
        meta["fill_value"] = fill_json(variable, base64_text=dialect is PURE)
    meta.update(order=layout.order, compressor=compressor, filters=filters)
    if layout.separator != ".":
        meta["dimension_separator"] = layout.separator
    return meta


def _user_attrs(attrs: list[Attribute]) -> dict:
    return {a.name: attribute_json(a) for a in attrs}


def _types(attrs: list[Attribute], dialect: Dialect) -> dict:
    return {a.name: attribute_type(a, dialect) for a in attrs}


def _xarray_dims(variable: Variable, dialect: Dialect) -> list[str]:
    if variable.layout.scalar:
        return [] if dialect is D1 else ["_scalar_"]
    return list(variable.dimensions)


def array_objects(variable: Variable, dialect: Dialect, xarray: bool) -> dict[str, object]:
    """``{key: JSON}`` for one array in ``dialect``."""
    key = variable.key
    if dialect is Dialect.ZARR_V3:
        return {f"{key}/{zarr3.ZARR_JSON}": zarr3_array_json(variable)}
    attrs = variable.attrs.all_typed()
    zarray = zarray_json(variable, dialect)
    zattrs = _user_attrs(attrs)
    if xarray and dialect is not D0:
        zattrs["_ARRAY_DIMENSIONS"] = _xarray_dims(variable, dialect)
    objects: dict[str, object] = {f"{key}/.zarray": zarray}
    refs = [dim.path for dim in variable.dims]
    if dialect is D3:
        info: dict = {"dimension_references": refs}
        if variable.layout.scalar:
            info["scalar"] = 1
        info["storage"] = "chunked"
        zattrs["_nczarr_array"] = info
        zattrs["_nczarr_attr"] = {
            "types": {**_types(attrs, dialect), "_nczarr_array": JSON_TYPE, "_nczarr_attr": JSON_TYPE}
        }
    elif dialect.keys_in_zarr_objects:
        upper = dialect is D1
        storage = "scalar" if variable.layout.scalar else "chunked"
        zarray["_NCZARR_ARRAY" if upper else "_nczarr_array"] = {"dimrefs": refs, "storage": storage}
        if attrs:
            zattrs["_NCZARR_ATTR" if upper else "_nczarr_attr"] = {"types": _types(attrs, dialect)}
    elif dialect is D0:
        storage = "scalar" if variable.layout.scalar else "chunked"
        objects[f"{key}/.nczvar"] = {"dimrefs": refs, "storage": storage}
        objects[f"{key}/.nczarray"] = {"dimrefs": refs, "storage": storage}
        if attrs:
            objects[f"{key}/.nczattr"] = {"types": _types(attrs, dialect)}
    if zattrs or dialect in (D3, PURE):
        objects[f"{key}/.zattrs"] = zattrs
    return objects


def provenance(dialect: Dialect) -> str:
    nczarr = "1.0.0" if dialect is D0 else "2.0.0"
    return f"version=2,nczmap={__version__},nczarr={nczarr}"


def _dimension_json(group: Group, dialect: Dialect) -> dict:
    dims = {}
    for dim in group.dimensions.values():
        dims[dim.name] = {"size": dim.size, "unlimited": 1} if dim.unlimited and dialect is D3 else dim.size
    return dims


def group_objects(group: Group, dialect: Dialect) -> dict[str, object]:
    """``{key: JSON}`` for one group's own objects (not its arrays or subgroups)."""
    base = group.path.rstrip("/")
    is_root = group.parent is None
    attrs = group.attrs.all_typed()
    zattrs = _user_attrs(attrs)
    if dialect is Dialect.ZARR_V3:
        if is_root:
            zattrs = {"_NCProperties": getattr(group, "provenance", None) or provenance(dialect), **zattrs}
        return {f"{base}/{zarr3.ZARR_JSON}": zarr3.group_json(zattrs)}
    types = _types(attrs, dialect)
    zgroup: dict = {"zarr_format": 2}
    if is_root:
        # An updated store keeps saying who wrote it: readers depend on it (netcdf-c 4.8-4.9.2's byte order)
        written_by = getattr(group, "provenance", None) or provenance(dialect)
        zattrs = {"_NCProperties": written_by, **zattrs}
        types = {"_NCProperties": dialect.char_dtype if dialect is not D0 else "2", **types}
    objects: dict[str, object] = {f"{base}/.zgroup": zgroup}
    arrays, groups = list(group.variables), list(group.groups)
    dims = _dimension_json(group, dialect)
    if dialect is D3:
        zattrs["_nczarr_group"] = {"dimensions": dims, "arrays": arrays, "groups": groups}
        extra = {"_nczarr_group": JSON_TYPE}
        if is_root:
            zattrs["_nczarr_superblock"] = SUPERBLOCK
            extra["_nczarr_superblock"] = JSON_TYPE
        zattrs["_nczarr_attr"] = {"types": {**types, **extra, "_nczarr_attr": JSON_TYPE}}
    elif dialect.keys_in_zarr_objects:
        upper = dialect is D1
        if is_root:
            zgroup["_NCZARR_SUPERBLOCK" if upper else "_nczarr_superblock"] = SUPERBLOCK
        zgroup["_NCZARR_GROUP" if upper else "_nczarr_group"] = {
            "dims": dims,
            "vars": arrays,
            "groups": groups,
        }
        if types:
            zattrs["_NCZARR_ATTR" if upper else "_nczarr_attr"] = {"types": types}
    elif dialect is D0:
        objects[f"{base}/.nczgroup"] = {"dims": dims, "vars": arrays, "groups": groups}
        if is_root:
            objects["/.nczarr"] = {"zarr_format": 2, "nczarr_version": "1.0.0"}
        if types:
            objects[f"{base}/.nczattr"] = {"types": types}
    if zattrs or dialect in (D3, PURE):
        objects[f"{base}/.zattrs"] = zattrs
    return objects


# attributes whose type decides how values decode (a float32 scale_factor decodes to float32, a float64
# one to float64): Zarr v3 JSON numbers read back as float64 or int64, so their types are recorded
TYPED_IN_V3 = frozenset(
    ("scale_factor", "add_offset", "missing_value", "valid_min", "valid_max", "valid_range")
)


def zarr3_array_json(variable: Variable) -> dict:
    """An array's ``zarr.json``: a read one keeps its codecs and chunk keys, a new one gets nczmap's. The
    types of the attributes of :data:`TYPED_IN_V3` that JSON numbers do not keep are recorded under
    ``_nczarr_attr`` (as 4.9.3+ NCZarr records attribute types), which nczmap's v3 reader honours."""
    layout = variable.layout
    typed = variable.attrs.all_typed()
    attrs = {a.name: _zarr3_attribute(a, variable.nctype) for a in typed}
    attrs = {name: value for name, value in attrs.items() if value is not None}
    types = {
        a.name: dtype_string(a.nctype, "<")
        for a in typed
        if a.name in TYPED_IN_V3 and a.name in attrs and infer_json_type(attrs[a.name]) is not a.nctype
    }
    if types:
        attrs["_nczarr_attr"] = {"types": types}
    dims = list(variable.dimensions)
    if layout.zarr3 is not None:
        return zarr3.updated_json(layout.zarr3, layout, attrs, dims)
    fill = zarr3.fill_json(variable.nctype, layout.fill_value, fill_json(variable) or 0)
    return zarr3.array_json(layout, variable.nctype, fill, attrs, dims)


def _zarr3_attribute(attribute: Attribute, var_type: NCType) -> object:
    """An attribute's JSON; ``_FillValue`` as xarray writes it to v3 (floats as base64 of a little-endian
    double; none for text variables, whose fill value the array's ``fill_value`` holds)."""
    value = attribute_json(attribute)
    if attribute.name != "_FillValue":
        return value
    if var_type.is_text:
        return None
    if var_type.letter[:1] == "f" and isinstance(value, (int, float)):
        return base64.b64encode(struct.pack("<d", float(value))).decode()
    return value
