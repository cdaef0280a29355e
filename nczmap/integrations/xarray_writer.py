"""Writing xarray Datasets and DataTrees as NCZarr in any dialect, or as Zarr: :func:`to_nczarr`.

xarray's CF encoding (times, ``_FillValue``, ``scale_factor``, strings and char arrays) runs as it does for
``to_netcdf``; the store then creates netCDF dimensions, typed attributes and variables with the
``encoding`` asked for (``chunksizes``/``chunks``, ``zlib``/``complevel``/``compression``, ``shuffle``,
``endian``, ``_FillValue``). Metadata is written first, by this process; dask-backed data is then written
chunk by chunk by dask's tasks (threads, or worker processes that reopen the store by URL). Storage chunks
must line up with dask's chunks so that no two tasks write one chunk.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Hashable, Mapping
from typing import Any

from xarray import Dataset as XDataset
from xarray import DataTree
from xarray import Variable as XVariable
from xarray.backends.common import ArrayWriter, WritableCFDataStore
from xarray.coding.strings import CharacterArrayCoder, EncodedStringCoder

from nczmap._lazy import numpy as np
from nczmap.api import open_dataset as open_nczmap
from nczmap.errors import EncodingError, NCZError
from nczmap.format import Dataset, Dialect
from nczmap.format.model import Group
from nczmap.format.writer import DEFAULT_MAXSTRLEN
from nczmap.integrations.handles import DatasetHandle
from nczmap.integrations.xarray_backend import NCZmapDataStore
from nczmap.url import ParsedURL

try:
    from xarray.backends.writers import dump_to_store
except ImportError:  # xarray before 2025.10
    from xarray.backends.api import dump_to_store

# Encoding entries that describe a source (left by open_dataset) and are not instructions for the writer.
_DESCRIPTIVE = frozenset(
    ["source", "original_shape", "preferred_chunks", "dtype", "contiguous", "szip", "bzip2", "fletcher32"]
)
_WRITABLE = frozenset(
    [
        "chunksizes",
        "chunks",
        "zlib",
        "complevel",
        "compression",
        "shuffle",
        "endian",
        "_FillValue",
        "maxstrlen",
    ]
)


def to_nczarr(
    data: XDataset | DataTree,
    url: str | os.PathLike[str] | ParsedURL,
    netcdf_version: str | None = None,
    *,
    mode: str = "w",
    encoding: Mapping[str, Any] | None = None,
    unlimited_dims: set[str] | None = None,
    compute: bool = True,
    keep_filters: bool = False,
    **map_options: object,
):
    """Write ``data`` (an xarray Dataset, or a DataTree as nested groups) to ``url``.

    ``netcdf_version`` picks the NCZarr dialect (default: 4.9.3 and later); a URL with ``#mode=zarr``
    writes pure Zarr. ``mode``: ``w`` creates (replacing a dataset there), ``a`` adds to an existing one.
    ``encoding`` maps variable names (for a DataTree: group paths, then names) to netCDF4-style
    encodings. ``unlimited_dims`` defaults to those the data was read with (``ds.encoding``), kept where
    the target release reads unlimited dimensions. With dask-backed data and ``compute=False`` the
    metadata is written and a dask object that writes the data is returned.
    """
    nodes = _nodes(data, encoding)
    target = open_nczmap(url, mode, netcdf_version, keep_filters=keep_filters, **map_options)
    if not compute and target.zmap.driver == "zip":
        target.zmap.abort()
        raise NCZError(f"{target.zmap.location}: compute=False needs a store written as it goes (file, s3)")
    handle = DatasetHandle(target)
    writer = ArrayWriter()
    try:
        for path, dataset, node_encoding in nodes:
            store = NCZmapWritableStore(handle, _ensure_group(target, path).path)
            unlimited = unlimited_dims if unlimited_dims is not None else _recorded_unlimited(dataset, target)
            dump_to_store(dataset, store, writer, encoding=node_encoding, unlimited_dims=unlimited)
        if compute and writer.sources:
            _check_travels(target, writer.sources)
        target.flush()  # every metadata object, before any task writes data
        delayed = writer.sync(compute=compute)
    except BaseException:
        target.zmap.abort()
        raise
    target.close()
    if delayed is None:
        return None
    import dask

    return dask.delayed(_written)(delayed)  # one dask object, as xarray's to_netcdf returns


def _recorded_unlimited(dataset: XDataset, target: Dataset) -> set[str]:
    """The unlimited dimensions the data was read with (as ``to_netcdf`` keeps them), where the target
    release can read unlimited dimensions (4.9.3 and later); asked for explicitly, they are refused."""
    if not target.dialect.reads_unlimited:
        return set()
    return set(dataset.encoding.get("unlimited_dims") or ())


def _written(stores: object) -> None:
    """The end of a ``compute=False`` write: computing it ran every task that stores a chunk."""


def _check_travels(target: Dataset, sources: list) -> None:
    """The store must reach dask's tasks: refused before any of them runs if they run in other processes
    (distributed, processes) and the store cannot go there (a zip archive open for writing)."""
    import dask.base
    import dask.local
    import dask.threaded

    scheduler = dask.base.get_scheduler(collections=sources)
    if scheduler in (None, dask.threaded.get, dask.local.get_sync):
        return
    try:
        pickle.dumps(target.zmap)
    except NCZError as exc:
        raise NCZError(
            f"{exc}; dask's scheduler here runs the write tasks in other processes: "
            "write with dask's threaded scheduler (dask.config.set(scheduler='threads'))"
        ) from None


def _nodes(data: XDataset | DataTree, encoding: Mapping[str, Any] | None):
    """(group path, Dataset of that group's own variables, its encoding) for each group to write."""
    encoding = dict(encoding or {})
    if isinstance(data, XDataset):
        return [("/", data, encoding)]
    if not isinstance(data, DataTree):
        raise NCZError(f"to_nczarr writes an xarray Dataset or DataTree, not {type(data).__name__}")
    return [(node.path, node.to_dataset(inherit=False), encoding.get(node.path, {})) for node in data.subtree]


def _ensure_group(dataset: Dataset, path: str) -> Group:
    group: Group = dataset
    for name in path.strip("/").split("/"):
        if name:
            group = group.groups.get(name) or group.create_group(name)
    return group


class NCZmapWritableStore(NCZmapDataStore, WritableCFDataStore):
    """One group of a writable dataset, as xarray's writing protocol sees it."""

    def __init__(self, handle: DatasetHandle, group: str = "/") -> None:
        super().__init__(handle, group, owned=False)

    def encode_variable(self, variable: XVariable, name: Hashable | None = None) -> XVariable:
        dialect = self.handle.dataset.dialect
        if variable.dtype.kind in "OU" and (not dialect.reads_strings or dialect is Dialect.PURE_ZARR):
            # netcdf-c before 4.9.1 reads text as char arrays only; so do Zarr readers (fixed-width bytes
            # read back as bytes, "" as missing), which decode char arrays with their _Encoding
            variable = variable.copy(deep=False)
            variable.encoding.setdefault("dtype", "S1")
        for coder in (EncodedStringCoder(allows_unicode=True), CharacterArrayCoder()):
            variable = coder.encode(variable, name=name)
        return variable

    def set_dimension(self, name: str, length: int, is_unlimited: bool = False) -> None:
        if not is_unlimited:
            self.group.create_dimension(name, length)
            return
        dimension = self.group.create_dimension(name, None)
        if length:  # the full length now, so that tasks writing data never change metadata
            dimension.size = length
            self.group.editor().touch_dimension_users(dimension)

    def set_attribute(self, name: str, value: object) -> None:
        self.group.attrs.set(name, self.attribute_value(name, value))

    def attribute_value(self, name: str, value: object) -> object:
        try:
            value = attribute_value(value)
        except EncodingError as exc:
            raise EncodingError(f"attribute {name!r}: {exc}") from None
        return value  # string attributes for releases that cannot read them: the dataset writer decides

    def prepare_variable(
        self, name: str, variable: XVariable, check_encoding: bool = False, unlimited_dims=None
    ):
        group = self.group
        attrs = dict(variable.attrs)
        options = variable_options(name, variable, attrs.pop("_FillValue", None), check_encoding)
        existing = group.variables.get(name)
        if existing is None:
            existing = group.create_variable(name, variable.dims, _nc_dtype(variable), **options)
        for key, value in attrs.items():
            existing.attrs.set(key, self.attribute_value(f"{name}:{key}", value))
        return ChunkTarget(self.handle, existing.path), variable.data

    def sync(self) -> None:
        pass


class ChunkTarget:
    """Where dask's tasks put one variable's values (``target[region] = values``), in any process."""

    def __init__(self, handle: DatasetHandle, path: str) -> None:
        self.handle = handle
        self.path = path

    def __setitem__(self, region: object, values: object) -> None:
        self.handle.variable(self.path)[region] = np.asarray(values)


def attribute_value(value: object) -> object:
    """Python numbers as netCDF4-python stores them (64-bit), booleans as bytes; the rest unchanged."""
    if isinstance(value, bool | np.bool_):
        return np.int8(value)
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return np.int64(value)
        if 0 <= value < 2**64:
            return np.uint64(value)
        raise EncodingError(f"{value} does not fit a 64-bit integer")
    if isinstance(value, float):
        return np.float64(value)
    if isinstance(value, np.ndarray) and value.dtype == bool:
        return value.astype(np.int8)
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, str) for v in value):
            return list(value)
        try:
            array = np.asarray(value)
        except (OverflowError, ValueError) as exc:
            raise EncodingError(f"{value!r} is no netCDF attribute value: {exc}") from None
        if array.dtype.kind in "OUS" or array.ndim != 1:  # mixed types, nested lists
            raise EncodingError(f"{value!r} is no netCDF attribute value (one type, one dimension)")
        return attribute_value(array)
    return value


def _nc_dtype(variable: XVariable) -> object:
    dtype = variable.dtype
    if dtype.kind in "OU":
        return str
    if dtype.kind == "S" and dtype.itemsize > 1:
        raise EncodingError(f"fixed-width bytes {dtype} have no netCDF type: give encoding dtype 'S1' or str")
    return dtype


def variable_options(name: str, variable: XVariable, fill: object, check: bool) -> dict[str, Any]:
    """create_variable's options from a variable's encoding; ``check``: the user gave the encoding."""
    encoding = dict(variable.encoding)
    unknown = set(encoding) - _WRITABLE - _DESCRIPTIVE - {"zstd", "blosc", "least_significant_digit"}
    if check and unknown:
        raise EncodingError(
            f"variable {name!r}: unexpected encoding {sorted(unknown)} (nczmap writes {sorted(_WRITABLE)})"
        )
    options: dict[str, Any] = {}
    if fill is not None:
        options["fill_value"] = fill
    chunks = _storage_chunks(name, variable, encoding, check)
    if chunks is not None:
        options["chunks"] = chunks
    compression = encoding.get("compression") or ("zlib" if encoding.get("zlib") else None)
    if compression:
        options["compression"] = compression
        if encoding.get("complevel") is not None:
            options["compression_opts"] = int(encoding["complevel"])
    if encoding.get("shuffle") and compression:
        options["shuffle"] = True
    if encoding.get("endian") in ("little", "big", "native"):
        options["endian"] = encoding["endian"]
    if encoding.get("maxstrlen"):
        options["maxstrlen"] = int(encoding["maxstrlen"])
    elif variable.dtype.kind in "OU" and variable.chunks is None:
        longest = _longest_utf8(variable.values)
        if longest > DEFAULT_MAXSTRLEN:  # NCZarr strings are fixed-width: widen to the longest
            options["maxstrlen"] = longest
    return options


def _longest_utf8(values: np.ndarray) -> int:
    if not values.size:
        return 0
    return int(max(len(str(v).encode()) for v in values.ravel()))


def _storage_chunks(name: str, variable: XVariable, encoding: dict, check: bool) -> tuple[int, ...] | None:
    """The chunk shape to store: the encoding's, else dask's; it must divide every dask chunk boundary."""
    asked = encoding.get("chunksizes") or encoding.get("chunks")
    if isinstance(asked, Mapping):
        asked = tuple(asked.get(dim, size) for dim, size in zip(variable.dims, variable.shape, strict=True))
    if asked and len(asked) == variable.ndim - 1 and variable.dtype == "S1":
        asked = (*asked, variable.shape[-1])  # text made a char array: its new character dimension whole
    dask_chunks = variable.chunks if variable.chunks is not None else None
    if not variable.dims:
        return None
    if dask_chunks is None:
        return tuple(int(c) for c in asked) if asked else None
    own = tuple(max(1, sizes[0]) for sizes in dask_chunks)
    if asked is None or _aligned(dask_chunks, tuple(int(c) for c in asked)):
        return own if asked is None else tuple(int(c) for c in asked)
    if not check:  # chunks recorded by open_dataset, not asked for: dask's own chunks are safe
        return own
    raise EncodingError(
        f"variable {name!r}: storage chunks {tuple(asked)} do not line up with dask's chunks "
        f"{dask_chunks}: two tasks would write one chunk and one would lose its values; "
        "rechunk with .chunk() or leave chunksizes out of the encoding"
    )


def _aligned(dask_chunks: tuple[tuple[int, ...], ...], chunks: tuple[int, ...]) -> bool:
    for sizes, size in zip(dask_chunks, chunks, strict=True):
        boundaries = np.cumsum(sizes)[:-1]
        if (boundaries % size).any():
            return False
    return True
