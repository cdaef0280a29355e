"""A netCDF-4/HDF5 file read through netCDF4-python, presented as nczmap's model (for ``nczmap copy``).

netCDF4-python is an optional dependency (``pip install 'nczmap[netcdf4]'``). It cannot tell a
one-valued NC_STRING attribute from a char attribute; such attributes are copied as char.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from nczmap.errors import DriverNotAvailable, FormatError, NCZError
from nczmap.format.codecs import CodecChain
from nczmap.format.model import Dimension, Group
from nczmap.format.selection import normalize_selection
from nczmap.format.types import CHAR, STRING, NCType, ParsedDtype, type_of_numpy
from nczmap.format.variable import ArrayLayout, Variable, check_plausible
from nczmap.format.writer import default_chunks

_HDF5_LOCK = threading.Lock()


class NetCDF4Variable(Variable):
    def __init__(self, group: Group, name: str, dims, layout: ArrayLayout, source) -> None:
        super().__init__(group, name, dims, layout)
        self.source = source

    def read(self, selection: object = Ellipsis) -> np.ndarray:
        explicit, squeeze = self._explicit(selection)
        with _HDF5_LOCK:  # libhdf5 is not thread-safe; copy reads chunks from several threads
            path = self.source.group().filepath()
            with _reading(path, f"variable {self.key} {selection!r}"):
                values = self.source[explicit]
        if any(squeeze):
            values = values[tuple(0 if s else slice(None) for s in squeeze)]
        if self.nctype is STRING:
            return np.asarray(values, dtype=object)
        return np.asarray(values)

    def _explicit(self, selection: object) -> tuple[object, list[bool]]:
        """The selection with every bound spelled out: netCDF4-python sizes a variable's dimensions by
        name from the variable's own group, so a dimension shadowed there (``/g/y`` hiding ``/y``) would
        give ``...`` and open slices the wrong length."""
        if self.layout.scalar:
            return selection, []
        indices, squeeze = normalize_selection(selection, self.shape, self.key)
        explicit = tuple(
            slice(ix.start, ix.stop, ix.step) if isinstance(ix, range) and ix.step > 0 else np.asarray(ix)
            for ix in indices
        )
        return explicit, squeeze

    def region_is_empty(self, region: tuple[slice, ...]) -> bool | None:
        return None  # HDF5 does not say which chunks are allocated


class NetCDF4File(Group):
    def __init__(self, handle) -> None:
        super().__init__("/", None)
        self.handle = handle

    def close(self) -> None:
        self.handle.close()


def open_netcdf4(path: str) -> NetCDF4File:
    try:
        import netCDF4
    except ImportError as exc:
        raise DriverNotAvailable(
            f"reading {path!r} needs netCDF4-python: pip install 'nczmap[netcdf4]'"
        ) from exc
    _check_with_h5py(path)
    with _reading(path, "its root group"):
        handle = netCDF4.Dataset(path, "r")
    root = NetCDF4File(handle)
    try:
        _load_group(handle, root, {}, path)
    except BaseException:
        handle.close()
        raise
    return root


def _check_with_h5py(path: str) -> None:
    """A damaged file refused (a FormatError naming it and the object) before netcdf-c opens it: libhdf5
    crashes or loops forever on some damage, which nczmap's own reading of the file (through h5py, with
    what HDF5 cannot survive refused first) reports instead. Skipped without h5py."""
    try:
        from nczmap.integrations.virtualize import hdf5
    except ImportError:
        return
    with contextlib.suppress(DriverNotAvailable):
        hdf5.check_file(path)


@contextlib.contextmanager
def _reading(path: str, what: str) -> Iterator[None]:
    """Whatever netCDF4-python (or netcdf-c and HDF5 below it) raises for damaged bytes while ``what`` is
    read: a FormatError naming the file and it. nczmap's own errors, and running out of memory, pass."""
    try:
        yield
    except (NCZError, MemoryError):
        raise
    except Exception as exc:
        raise FormatError(f"cannot read {path!r} as netCDF-4 ({what}): {exc}") from exc


def _load_group(source, group: Group, by_id: dict[int, Dimension], path: str) -> None:
    with _reading(path, f"group {group.path}"):
        source.set_auto_maskandscale(False)
        source.set_auto_chartostring(False)
        for name in source.ncattrs():
            with _reading(path, f"attribute {name!r} of group {group.path}"):
                group.attrs[name] = source.getncattr(name)
        for name, dim in source.dimensions.items():
            group.dimensions[name] = by_id[dim._dimid] = Dimension(name, len(dim), dim.isunlimited(), group)
        variables = source.variables.items()
        children = source.groups.items()
    for name, variable in variables:
        with _reading(path, f"variable {_join(group.path, name)}"):
            group.variables[name] = _variable(group, name, variable, by_id)
    for name, child in children:
        sub = Group(name, group)
        group.groups[name] = sub
        _load_group(child, sub, by_id, path)


def _join(path: str, name: str) -> str:
    return path.rstrip("/") + "/" + name


@functools.cache
def libnetcdf() -> ctypes.CDLL | None:
    """The libnetcdf netCDF4-python runs on (the wheel's own copy, or the system's), or None."""
    import netCDF4

    package = Path(netCDF4.__file__).resolve().parent
    found = sorted(package.parent.glob("[nN]et[cC][dD][fF]4.libs/libnetcdf*"))
    name = str(found[0]) if found else ctypes.util.find_library("netcdf")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _dimensions_of(group: Group, source, by_id: dict[int, Dimension]) -> list[Dimension]:
    """A variable's dimensions by their ids, as libnetcdf knows them: netCDF4-python's ``get_dims`` looks
    them up by name from the variable's group, so a shadowing dimension (``/g/y`` over ``/y``) wins."""
    lib = libnetcdf()
    ids = (ctypes.c_int * source.ndim)()
    found = lib is not None and lib.nc_inq_vardimid(source._grpid, source._varid, ids) == 0
    if found and all(i in by_id for i in ids):
        return [by_id[i] for i in ids]
    return [_dimension_of(group, d) for d in source.get_dims()]


def _dimension_of(group: Group, dimension) -> Dimension:
    path = dimension.group().path.rstrip("/") + "/" + dimension.name
    found = group.find_dimension(path)
    if found is None:
        raise FormatError(f"dimension {path!r} used in group {group.path!r} not found")
    return found


def _variable(group: Group, name: str, source, by_id: dict[int, Dimension]) -> NetCDF4Variable:
    nctype = _nctype(source)
    dims = _dimensions_of(group, source, by_id)
    shape = tuple(d.size for d in dims)
    storage = _storage(source, nctype)
    check_plausible(shape, storage.itemsize, f"variable {_join(group.path, name)}")
    chunking = source.chunking()
    if not dims:
        chunks: tuple[int, ...] = ()
    elif chunking == "contiguous" or chunking is None:
        chunks = default_chunks(shape, tuple(d.unlimited for d in dims), storage.itemsize)
    else:
        chunks = tuple(int(c) for c in chunking)
    layout = ArrayLayout(
        shape,
        chunks,
        ParsedDtype(nctype, storage, storage.byteorder in "<>"),
        _fill(source, nctype),
        _codecs(source, storage.itemsize),
        ".",
        "C",
        scalar=not dims,
    )
    variable = NetCDF4Variable(group, name, dims, layout, source)
    for attribute in source.ncattrs():
        variable.attrs.set(
            attribute, source.getncattr(attribute), nctype if attribute == "_FillValue" else None
        )
    return variable


def _nctype(source) -> NCType:
    if source.dtype is str:
        return STRING
    dtype = np.dtype(source.dtype)
    if dtype.kind == "S" and dtype.itemsize == 1:
        return CHAR
    return type_of_numpy(dtype)


def _storage(source, nctype: NCType) -> np.dtype:
    if nctype is CHAR:
        return np.dtype("S1")
    if nctype is STRING:
        width = int(getattr(source, "_nczarr_maxstrlen", 0) or 0)
        if not width:
            values = np.asarray(source[...], dtype=object).ravel()
            width = max((len(str(v).encode()) for v in values), default=1)
        return np.dtype(f"S{max(width, 1)}")
    order = {"little": "<", "big": ">"}.get(source.endian(), "<")
    return np.dtype(nctype.letter).newbyteorder(order)


def _fill(source, nctype: NCType) -> object:
    fill = source.get_fill_value() if hasattr(source, "get_fill_value") else None
    if "_FillValue" in source.ncattrs():
        fill = source.getncattr("_FillValue")
    elif fill is not None and not nctype.is_text:
        fill = nctype.fill  # the type's default: netCDF4-python byte-swaps it for big-endian variables
    if fill is None or nctype.is_text:
        return None if fill is None else (b"\x00" if nctype is CHAR else "")
    return np.array(fill).astype(nctype.numpy)[()]


def _codecs(source, itemsize: int) -> CodecChain:
    settings = source.filters() or {}
    chain = CodecChain(itemsize=itemsize)
    if settings.get("shuffle"):
        chain.filters.append({"id": "shuffle", "elementsize": itemsize})
    if settings.get("zlib"):
        chain.compressor = {"id": "zlib", "level": int(settings.get("complevel") or 4)}
    elif settings.get("zstd"):
        chain.compressor = {"id": "zstd", "level": int(settings.get("complevel") or 3)}
    return chain
