"""The xarray engine ``"nczmap"``: ``xr.open_dataset(url, engine="nczmap")`` on nczmap's own reader.

Every dialect nczmap reads (NCZarr 4.8.0 to 4.9.3+, pure Zarr, the xarray convention) gives named
dimensions and typed netCDF attributes; variables come through the store as netCDF4-python gives them
(char arrays as ``S1``, strings as variable-length ``str``, ``_FillValue`` and ``scale_factor`` as
attributes), so xarray's CF decoding treats them as it treats netCDF files. Data is read lazily through
:class:`NCZmapArray`, which takes xarray's outer indexing (vectorised indexing is done by xarray on top).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, ClassVar

from xarray import Dataset as XDataset
from xarray import DataTree, Variable
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.backends.common import AbstractDataStore
from xarray.backends.store import StoreBackendEntrypoint
from xarray.coding.strings import create_vlen_dtype
from xarray.core import indexing
from xarray.core.utils import FrozenDict

from nczmap._lazy import numpy as np
from nczmap.api import open_dataset as open_nczmap
from nczmap.errors import URLError
from nczmap.format import Dataset, open_on
from nczmap.format.dialects import Dialect
from nczmap.format.model import Group
from nczmap.format.types import CHAR, STRING, ParsedDtype
from nczmap.format.variable import Variable as NCVariable
from nczmap.integrations.handles import DatasetHandle, find_group
from nczmap.url import ParsedURL, parse_url
from nczmap.zmap import ZMap

Source = str | os.PathLike | ParsedURL | ZMap | Dataset


def as_xarray_sees_it(variable: NCVariable) -> NCVariable:
    """The variable, except that text xarray wrote to pure Zarr as a char array (bytes with an
    ``_Encoding``) reads as that char array: netcdf-c reads ``|S1`` there as one-character strings, which
    would split multi-byte characters and leave xarray strings where it expects bytes to decode."""
    layout = variable.layout
    root = variable.group.root
    if (
        getattr(root, "dialect", None) is not Dialect.PURE_ZARR
        or variable.nctype is not STRING
        or layout.vlen
        or layout.dtype.storage.itemsize != 1
        or "_Encoding" not in variable.attrs
    ):
        return variable
    char = NCVariable(
        variable.group, variable.name, variable.dims, replace(layout, dtype=ParsedDtype(CHAR, "S1", False))
    )
    char.attrs = variable.attrs
    return char


class NCZmapArray(BackendArray):
    """One variable, read on demand (in a dask worker, from the dataset reopened by URL)."""

    def __init__(self, handle: DatasetHandle, variable: NCVariable) -> None:
        self.handle = handle
        self.path = variable.path
        self.shape = variable.shape
        self.dtype = create_vlen_dtype(str) if variable.nctype is STRING else variable.dtype

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER, self._read)

    def _read(self, key: tuple) -> np.ndarray:
        return as_xarray_sees_it(self.handle.variable(self.path)).read(key)


class NCZmapDataStore(AbstractDataStore):
    """One group of a dataset, as xarray's store protocol sees it."""

    def __init__(
        self, handle: DatasetHandle, group: str = "/", owned: bool = True, source: str | None = None
    ) -> None:
        self.handle = handle
        self.group_path = group
        self.owned = owned  # close the dataset when xarray closes the store
        self.source = source  # what encoding["source"] shows: the URL or path opened (netCDF4's filepath())

    @property
    def group(self) -> Group:
        return self.handle.group(self.group_path)

    def get_variables(self) -> FrozenDict:
        return FrozenDict((name, self._variable(v)) for name, v in self.group.variables.items())

    def _variable(self, variable: NCVariable) -> Variable:
        variable = as_xarray_sees_it(variable)
        array = NCZmapArray(self.handle, variable)
        data = indexing.LazilyIndexedArray(array)
        attributes = attributes_of(variable)
        encoding = self._encoding(variable)
        if "least_significant_digit" in attributes:  # as the netcdf4 engine: an encoding, not an attribute
            encoding["least_significant_digit"] = attributes.pop("least_significant_digit")
        if array.dtype.kind == "S" and "_FillValue" in attributes:  # the netcdf4 engine's bytes fill
            fill = attributes["_FillValue"]
            attributes["_FillValue"] = np.bytes_(fill.encode("latin-1") if isinstance(fill, str) else fill)
        return Variable(variable.dimensions, data, attributes, encoding)

    def _encoding(self, variable: NCVariable) -> dict[str, Any]:
        """The encoding the netcdf4 engine gives for the same variable of an NCZarr store (netCDF4-python's
        ``filters()`` and ``chunking()``: storage is always chunked, a scalar has chunks ``()``)."""
        encoding: dict[str, Any] = {"dtype": str if variable.nctype is STRING else variable.dtype}
        encoding.update(compression_encoding(variable))
        chunks = tuple(int(c) for c in variable.chunks) if variable.shape else ()
        encoding["contiguous"] = False
        encoding["chunksizes"] = chunks
        encoding["preferred_chunks"] = dict(zip(variable.dimensions, chunks, strict=True))
        encoding["source"] = self.source if self.source is not None else self.handle.dataset.zmap.location
        encoding["original_shape"] = variable.shape
        return encoding

    def get_attrs(self) -> FrozenDict:
        return FrozenDict(attributes_of(self.group))

    def get_dimensions(self) -> FrozenDict:
        return FrozenDict((name, dim.size) for name, dim in self.group.dimensions.items())

    def get_parent_dimensions(self) -> FrozenDict:
        dims: dict[str, int] = {}
        parent = self.group.parent
        while parent is not None:
            for name, dim in parent.dimensions.items():
                dims.setdefault(name, dim.size)
            parent = parent.parent
        return FrozenDict(dims)

    def get_encoding(self) -> dict[str, Any]:
        return {"unlimited_dims": {n for n, d in self.group.dimensions.items() if d.unlimited}}

    def close(self) -> None:
        if self.owned:
            self.handle.dataset.close()


def attributes_of(variable: NCVariable | Group) -> dict[str, object]:
    """Attributes as netCDF4-python returns them: numpy scalars and arrays, ``str``, lists of ``str``; as it
    does, NUL characters are removed from char text and end string values (C strings), and bytes that are
    not UTF-8 are U+FFFD."""
    attributes = {}
    for attribute in variable.attrs.all_typed():
        value = attribute.python_value()
        if attribute.nctype is CHAR and attribute.name != "_FillValue":
            value = _decoded(value).replace("\x00", "")
        elif attribute.nctype is STRING:
            value = (
                [_decoded(v).split("\x00", 1)[0] for v in value]
                if isinstance(value, list)
                else _decoded(value).split("\x00", 1)[0]
            )
        attributes[attribute.name] = value
    return attributes


def _decoded(text: str) -> str:
    """Text as netCDF4-python decodes it: bytes that are not UTF-8 (kept as surrogate escapes) are U+FFFD."""
    if text.isascii():
        return text
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a lone surrogate written as a JSON escape: no byte of a file
        return text


# netCDF4-python's names of blosc's compressors (its _blosc_dict_inv), by numcodecs' cname
BLOSC_NAMES = {
    "blosclz": "blosc_lz",
    "lz4": "blosc_lz4",
    "lz4hc": "blosc_lz4hc",
    "snappy": "blosc_snappy",
    "zlib": "blosc_zlib",
    "zstd": "blosc_zstd",
}


def compression_encoding(variable: NCVariable) -> dict[str, Any]:
    """The variable's codecs as netCDF4-python's ``filters()`` reports them for NCZarr: ``zlib``, ``szip``,
    ``zstd``, ``bzip2``, ``blosc``, ``shuffle``, ``complevel``, ``fletcher32``, every key always there."""
    encoding: dict[str, Any] = {
        "zlib": False,
        "szip": False,
        "zstd": False,
        "bzip2": False,
        "blosc": False,
        "shuffle": False,
        "complevel": 0,
        "fletcher32": False,
    }
    for config in variable.layout.codecs.configs:
        name = str(config.get("id", "")).removeprefix("numcodecs.")
        if name == "shuffle":
            encoding["shuffle"] = True
        elif name == "fletcher32":
            encoding["fletcher32"] = True
        elif name in ("zlib", "gzip"):
            encoding.update(zlib=True, complevel=int(config.get("level", 4)))
        elif name == "zstd":
            encoding.update(zstd=True, complevel=int(config.get("level", 0)))
        elif name == "bz2":
            encoding.update(bzip2=True, complevel=int(config.get("level", 9)))
        elif name == "blosc":
            compressor = BLOSC_NAMES.get(str(config.get("cname", "blosclz")), f"blosc_{config.get('cname')}")
            encoding["blosc"] = {"compressor": compressor, "shuffle": int(config.get("shuffle", 1))}
            encoding["complevel"] = int(config.get("clevel", 5))
        elif name == "szip":
            coding = "ec" if int(config.get("mask", 0)) & 4 else "nn"
            encoding["szip"] = {"coding": coding, "pixels_per_block": int(config.get("pixels-per-block", 0))}
    return encoding


def source_name(source: Source) -> str | None:
    """The dataset's name in ``encoding["source"]``: the URL or path as given (a password hidden), as the
    netcdf4 engine shows the name it opened; None for open maps and datasets (their location is shown)."""
    if isinstance(source, ParsedURL):
        return source.original
    if isinstance(source, str | os.PathLike) and isinstance(os.fspath(source), str):
        try:
            return parse_url(source).original
        except URLError:
            return os.fspath(source)
    return None


def open_handle(source: Source, mode: str = "r", **map_options: object) -> tuple[DatasetHandle, bool]:
    """A handle on the dataset at ``source``, and whether closing the xarray dataset should close it."""
    if isinstance(source, Dataset):
        return DatasetHandle(source), False
    if isinstance(source, ZMap):
        return DatasetHandle(open_on(source, mode)), False
    return DatasetHandle(open_nczmap(source, mode, **map_options)), True


class NCZmapBackendEntrypoint(BackendEntrypoint):
    """NCZarr (every netcdf-c dialect), Zarr and xarray-convention stores on file, zip, S3 and manifests."""

    description = "Open NCZarr and Zarr stores (file, zip, S3, virtual manifests) with nczmap"
    supports_groups = True
    open_dataset_parameters: ClassVar[tuple[str, ...]] = (
        "filename_or_obj",
        "mask_and_scale",
        "decode_times",
        "concat_characters",
        "decode_coords",
        "drop_variables",
        "use_cftime",
        "decode_timedelta",
        "group",
        "map_options",
    )

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        if isinstance(filename_or_obj, ParsedURL | ZMap | Dataset):
            return True
        if not isinstance(filename_or_obj, str | os.PathLike):
            return False
        text = os.fspath(filename_or_obj)
        if not isinstance(text, str) or "#" not in text:
            return False
        try:
            return bool(parse_url(text).modes)
        except URLError:
            return False

    def open_dataset(
        self,
        filename_or_obj: Any,
        *,
        mask_and_scale: bool = True,
        decode_times: bool = True,
        concat_characters: bool = True,
        decode_coords: bool = True,
        drop_variables: str | Iterable[str] | None = None,
        use_cftime: bool | None = None,
        decode_timedelta: bool | None = None,
        group: str | None = None,
        map_options: dict | None = None,
    ) -> XDataset:
        handle, owned = open_handle(filename_or_obj, **(map_options or {}))
        try:
            group_path = find_group(handle.dataset, group).path
            store = NCZmapDataStore(handle, group_path, owned, source_name(filename_or_obj))
            return StoreBackendEntrypoint().open_dataset(
                store,
                mask_and_scale=mask_and_scale,
                decode_times=decode_times,
                concat_characters=concat_characters,
                decode_coords=decode_coords,
                drop_variables=drop_variables,
                use_cftime=use_cftime,
                decode_timedelta=decode_timedelta,
            )
        except BaseException:
            if owned:
                handle.dataset.close()
            raise

    def open_groups_as_dict(
        self, filename_or_obj: Any, *, group: str | None = None, map_options: dict | None = None, **decoding
    ) -> dict[str, XDataset]:
        handle, owned = open_handle(filename_or_obj, **(map_options or {}))
        try:
            top = find_group(handle.dataset, group)
            source = source_name(filename_or_obj)
            groups = {}
            for node in top.walk():
                store = NCZmapDataStore(handle, node.path, owned=False, source=source)
                relative = "/" + node.path[len(top.path) :].strip("/")
                groups[relative] = StoreBackendEntrypoint().open_dataset(store, **decoding)
        except BaseException:
            if owned:
                handle.dataset.close()
            raise
        if owned:
            root = groups["/"]
            root.set_close(handle.dataset.close)
        return groups

    def open_datatree(self, filename_or_obj: Any, **kwargs: Any) -> DataTree:
        groups = self.open_groups_as_dict(filename_or_obj, **kwargs)
        closer = groups["/"]._close
        tree = DataTree.from_dict(groups)
        tree.set_close(closer)
        return tree
