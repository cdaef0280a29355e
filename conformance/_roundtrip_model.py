"""The netCDF data model as plain Python values, read from netCDF4-python (the oracle) or from nczmap.

A model is ``{group path: Grp}``. Attribute values are normalised so that equal netCDF values compare
equal: numbers as a tuple of Python numbers (NaN as the string ``"NaN"``), char as ``str``, string as a
tuple of ``str``. netCDF4-python does not tell char from string attributes (both come back as ``str``),
so attribute types come from ``nc_inq_atttype`` of the very libnetcdf netCDF4-python runs on (ctypes).

Also here: the two copiers (netCDF4-python -> netCDF4-python store, netCDF4-python -> nczmap store).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field

import netCDF4
import numpy as np

from nczmap.integrations.netcdf4 import libnetcdf

TYPE_NAMES = {
    1: "byte",
    2: "char",
    3: "short",
    4: "int",
    5: "float",
    6: "double",
    7: "ubyte",
    8: "ushort",
    9: "uint",
    10: "int64",
    11: "uint64",
    12: "string",
}
NUMPY_OF = {
    "byte": "i1",
    "ubyte": "u1",
    "short": "i2",
    "ushort": "u2",
    "int": "i4",
    "uint": "u4",
    "int64": "i8",
    "uint64": "u8",
    "float": "f4",
    "double": "f8",
}
# netCDF default fill values (netcdf.h, spec §4.1)
DEFAULT_FILL = {name: netCDF4.default_fillvals[code] for name, code in NUMPY_OF.items()}
DEFAULT_FILL["char"] = b"\x00"
DEFAULT_FILL["string"] = ""
NC_GLOBAL = -1


def _libnetcdf() -> ctypes.CDLL:
    """The libnetcdf netCDF4-python is linked with (dlopen of the same file returns the same handle)."""
    found = libnetcdf()
    if found is None:
        raise RuntimeError("cannot load the libnetcdf netCDF4-python runs on")
    return found


LIB = _libnetcdf()


def _ids(obj) -> tuple[int, int]:
    if isinstance(obj, netCDF4.Variable):
        return obj.group()._grpid, obj._varid
    return obj._grpid, NC_GLOBAL


def attribute_type(obj, name: str) -> str:
    xtype = ctypes.c_int()
    grpid, varid = _ids(obj)
    status = LIB.nc_inq_atttype(grpid, varid, name.encode(), ctypes.byref(xtype))
    assert status == 0, f"nc_inq_atttype({name!r}) failed: {status}"
    return TYPE_NAMES[xtype.value]


def has_no_fill(variable: netCDF4.Variable) -> bool:
    no_fill = ctypes.c_int()
    grpid, varid = _ids(variable)
    status = LIB.nc_inq_var_fill(grpid, varid, ctypes.byref(no_fill), None)
    assert status == 0, f"nc_inq_var_fill({variable.name!r}) failed: {status}"
    return bool(no_fill.value)


# ----------------------------------------------------------------------------------- normalised values
def number(value) -> object:
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def attr_value(type_name: str, value) -> object:
    if type_name == "char":
        return value.decode() if isinstance(value, bytes) else str(value)
    if type_name == "string":
        return (value,) if isinstance(value, str) else tuple(value)
    array = np.atleast_1d(np.asarray(value)).astype(NUMPY_OF[type_name])
    return tuple(number(v) for v in array)


def fill_value(type_name: str, value) -> object:
    if value is None:
        return None
    if type_name == "char":
        return value.encode() if isinstance(value, str) else bytes(value)[:1]
    if type_name == "string":
        return str(value)
    return number(np.asarray(value).astype(NUMPY_OF[type_name])[()])


@dataclass
class Var:
    dims: tuple[str, ...]
    type: str
    shape: tuple[int, ...]
    attrs: list[tuple[str, str, object]]  # (name, type, value), in order
    fill: object  # None: no fill
    data: np.ndarray | None = field(default=None, repr=False, compare=False)


@dataclass
class Grp:
    dims: dict[str, tuple[int, bool]]
    attrs: list[tuple[str, str, object]]
    vars: dict[str, Var]
    groups: list[str]


Model = dict[str, Grp]


def _join(path: str, name: str) -> str:
    return path.rstrip("/") + "/" + name


# ----------------------------------------------------------------------------------- netCDF4-python
def nc4_type(variable: netCDF4.Variable) -> str:
    if variable.datatype is str or getattr(variable.datatype, "dtype", None) is str:
        return "string"
    dtype = np.dtype(variable.dtype)
    if dtype.kind == "S":
        return "char"
    return {np.dtype(v).str[1:]: k for k, v in NUMPY_OF.items()}[dtype.str[1:]]


def nc4_data(variable: netCDF4.Variable, type_name: str) -> np.ndarray:
    variable.set_auto_maskandscale(False)
    variable.set_auto_chartostring(False)
    data = variable[...]
    if type_name == "string":
        return np.asarray(data, dtype=object).reshape(variable.shape)
    data = np.asarray(data)
    return data if type_name == "char" else data.astype(NUMPY_OF[type_name])


def nc4_attrs(obj) -> list[tuple[str, str, object]]:
    out = []
    for name in obj.ncattrs():
        type_name = attribute_type(obj, name)
        out.append((name, type_name, attr_value(type_name, obj.getncattr(name))))
    return out


def nc4_fill(variable: netCDF4.Variable, type_name: str) -> object:
    if "_FillValue" in variable.ncattrs():
        return fill_value(type_name, variable.getncattr("_FillValue"))
    if has_no_fill(variable):
        return None
    return fill_value(type_name, DEFAULT_FILL[type_name])


def nc4_model(dataset: netCDF4.Dataset, data: bool = True, skip_data: frozenset[str] = frozenset()) -> Model:
    """``skip_data``: variables (full paths) whose data is not read (left ``None``)."""
    model: Model = {}

    def visit(group, path: str) -> None:
        variables = {}
        for name, variable in group.variables.items():
            type_name = nc4_type(variable)
            variables[name] = Var(
                tuple(variable.dimensions),
                type_name,
                tuple(variable.shape),
                nc4_attrs(variable),
                nc4_fill(variable, type_name),
                nc4_data(variable, type_name) if data and _join(path, name) not in skip_data else None,
            )
        model[path] = Grp(
            {name: (len(dim), dim.isunlimited()) for name, dim in group.dimensions.items()},
            nc4_attrs(group),
            variables,
            list(group.groups),
        )
        for name, child in group.groups.items():
            visit(child, _join(path, name))

    visit(dataset, "/")
    return model


def read_nc4(url: str, data: bool = True, skip_data: frozenset[str] = frozenset()) -> Model:
    with netCDF4.Dataset(url) as dataset:
        return nc4_model(dataset, data, skip_data)


# ----------------------------------------------------------------------------------- nczmap
def nczmap_attrs(attrs) -> list[tuple[str, str, object]]:
    out = []
    for name in attrs:
        typed = attrs.typed(name)
        out.append((name, typed.nctype.name, attr_value(typed.nctype.name, typed.value)))
    return out


def nczmap_data(variable) -> np.ndarray:
    data = np.asarray(variable[...])
    if variable.nctype.name == "string":
        return data.astype(object)
    return data


def nczmap_model(dataset, data: bool = True) -> Model:
    model: Model = {}
    for group in dataset.walk():
        variables = {}
        for name, variable in group.variables.items():
            type_name = variable.nctype.name
            variables[name] = Var(
                tuple(variable.dimensions),
                type_name,
                tuple(variable.shape),
                nczmap_attrs(variable.attrs),
                fill_value(type_name, variable.fill_value),
                nczmap_data(variable) if data else None,
            )
        model[group.path] = Grp(
            {name: (dim.size, dim.unlimited) for name, dim in group.dimensions.items()},
            nczmap_attrs(group.attrs),
            variables,
            list(group.groups),
        )
    return model


# ----------------------------------------------------------------------------------- comparing
def assert_same_data(actual: np.ndarray, expected: np.ndarray, where: str) -> None:
    assert actual.shape == expected.shape, f"{where}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind == "f":
        # bit-exact, NaN equal to NaN (a 6-digit fill would slip through an approximate comparison)
        same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
        assert same.all(), f"{where}: data differ\nactual   {actual.tolist()}\nexpected {expected.tolist()}"
    else:
        assert actual.tolist() == expected.tolist(), f"{where}: data differ"


def assert_models_equal(actual: Model, expected: Model, where: str, data: bool = True) -> None:
    """Equal models; data is compared for every variable both sides read (``None``: not read)."""
    assert list(actual) == list(expected), f"{where}: group tree"
    for path, group in expected.items():
        got = actual[path]
        assert got.groups == group.groups, f"{where} {path}: subgroups"
        assert got.dims == group.dims, f"{where} {path}: dimensions"
        assert got.attrs == group.attrs, f"{where} {path}: group attributes"
        assert list(got.vars) == list(group.vars), f"{where} {path}: variables"
        for name, variable in group.vars.items():
            at = f"{where} {_join(path, name)}"
            assert got.vars[name] == variable, f"{at}: metadata"
            if data and got.vars[name].data is not None and variable.data is not None:
                assert_same_data(got.vars[name].data, variable.data, at)


# ----------------------------------------------------------------------------------- copiers
def _set_nc4_attr(target, name: str, type_name: str, value) -> None:
    if type_name == "string":
        target.setncattr_string(name, list(value) if len(value) > 1 else value[0])
    elif type_name == "char":
        target.setncattr(name, value.encode())  # bytes: NC_CHAR even when the text is not ASCII
    else:
        target.setncattr(name, numeric_array(type_name, value))


def write_regions(target, source_data: np.ndarray, regions: tuple[slice, ...] | None) -> None:
    if regions is None:
        # explicit slices, so that unlimited dimensions grow (nczmap grows them only for slices/ints)
        regions = (tuple(slice(0, n) for n in source_data.shape) if source_data.ndim else ...,)
    for region in regions:
        target[region] = source_data[region]


def copy_nc4_to_nc4(src: netCDF4.Dataset, dst: netCDF4.Dataset, case) -> None:
    """Rebuild the x.nc dataset through netCDF4-python (libnetcdf 4.10.1) in an NCZarr URL."""

    def visit(source, target, path: str) -> None:
        for name, dim in source.dimensions.items():
            target.createDimension(name, None if dim.isunlimited() else len(dim))
        for name, type_name, value in nc4_attrs(source):
            _set_nc4_attr(target, name, type_name, value)
        for name, variable in source.variables.items():
            type_name = nc4_type(variable)
            filters = variable.filters() or {}
            chunking = variable.chunking()
            fill = nc4_fill(variable, type_name)
            options = dict(
                zlib=bool(filters.get("zlib")),
                complevel=filters.get("complevel") or 4,
                shuffle=bool(filters.get("shuffle")),
                endian=variable.endian(),
                fill_value=False if fill is None else None,
            )
            if "_FillValue" in variable.ncattrs():
                options["fill_value"] = variable.getncattr("_FillValue")
            if chunking != "contiguous" and variable.dimensions:
                options["chunksizes"] = chunking
            datatype = str if type_name == "string" else ("S1" if type_name == "char" else variable.dtype)
            new = target.createVariable(name, datatype, variable.dimensions, **options)
            for attr, attr_type, value in nc4_attrs(variable):
                if attr != "_FillValue":
                    _set_nc4_attr(new, attr, attr_type, value)
            key = _join(path, name)
            if key not in case.unwritten:
                new.set_auto_maskandscale(False)
                new.set_auto_chartostring(False)
                write_regions(new, nc4_data(variable, type_name), case.regions.get(key))
        for name, child in source.groups.items():
            visit(child, target.createGroup(name), _join(path, name))

    visit(src, dst, "/")


def copy_nc4_to_nczmap(src: netCDF4.Dataset, dst, case, compress: bool = True) -> None:
    """Rebuild the x.nc dataset through the nczmap API, keeping every netCDF type.

    ``compress=False`` drops zlib/shuffle (for readers built without NCZarr filters).
    """

    def visit(source, target, path: str) -> None:
        for name, dim in source.dimensions.items():
            target.create_dimension(name, None if dim.isunlimited() else len(dim))
        for name, type_name, value in nc4_attrs(source):
            target.attrs.set(name, _nczmap_attr(type_name, value), type_name)
        for name, variable in source.variables.items():
            type_name = nc4_type(variable)
            filters = variable.filters() or {}
            chunking = variable.chunking()
            options: dict = {}
            if "_FillValue" in variable.ncattrs():
                options["fill_value"] = variable.getncattr("_FillValue")
            elif has_no_fill(variable):
                options["fill_value"] = None
            if chunking != "contiguous" and variable.dimensions:
                options["chunks"] = tuple(chunking)
            if compress and filters.get("zlib"):
                options.update(compression="zlib", compression_opts=filters.get("complevel"))
            if compress and filters.get("shuffle"):
                options["shuffle"] = True
            if variable.endian() in ("little", "big"):
                options["endian"] = variable.endian()
            new = target.create_variable(name, variable.dimensions, type_name, **options)
            for attr, attr_type, value in nc4_attrs(variable):
                new.attrs.set(attr, _nczmap_attr(attr_type, value), attr_type)
            key = _join(path, name)
            if key not in case.unwritten:
                write_regions(new, nc4_data(variable, type_name), case.regions.get(key))
        for name, child in source.groups.items():
            visit(child, target.create_group(name), _join(path, name))

    visit(src, dst, "/")


def numeric_array(type_name: str, values: tuple) -> np.ndarray:
    """A normalised numeric attribute value back as a numpy array of its netCDF type."""
    return np.array([math.nan if v == "NaN" else v for v in values], dtype=NUMPY_OF[type_name])


def _nczmap_attr(type_name: str, value):
    if type_name in ("char", "string"):
        return list(value) if type_name == "string" else value
    return numeric_array(type_name, value)
