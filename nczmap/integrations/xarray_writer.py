"""Writing xarray Datasets and DataTrees as NCZarr in any dialect, or as Zarr: :func:`to_nczarr`.

xarray's CF encoding (times, ``_FillValue``, ``scale_factor``, strings and char arrays) runs as it does for
``to_netcdf``; the store then creates netCDF dimensions, typed attributes and variables with the ``encoding``
asked for, in the netcdf4 engine's words and meanings (``chunksizes``, ``contiguous``,
``zlib``/``complevel``/``compression``, ``shuffle``, ``fletcher32``, ``least_significant_digit``,
``_FillValue``, ``dtype``; also ``chunks``, ``endian``, ``maxstrlen``), stored as netcdf-c stores them in
NCZarr. xarray's own validation of names, attributes and ``unlimited_dims`` runs first, as in ``to_netcdf``.
Metadata is written first, by this process; dask-backed data is then written chunk by chunk by dask's tasks
(threads, or worker processes that reopen the store by URL). Storage chunks must line up with dask's chunks so
that no two tasks write one chunk.
"""

from __future__ import annotations

import os
import pickle
import posixpath
import warnings
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from xarray import Dataset as XDataset
from xarray import DataTree
from xarray import Variable as XVariable
from xarray.backends.common import ArrayWriter, WritableCFDataStore, _encode_variable_name
from xarray.backends.netCDF4_ import _ensure_no_forward_slash_in_name, _extract_nc4_variable_encoding
from xarray.coding.strings import CharacterArrayCoder, EncodedStringCoder
from xarray.conventions import ensure_not_multiindex

from nczmap._lazy import numpy as np
from nczmap.api import open_dataset as open_nczmap
from nczmap.errors import EncodingError, NCZError
from nczmap.format import Dataset, Dialect
from nczmap.format.model import Group
from nczmap.format.writer import _BAD_NAME, DEFAULT_MAXSTRLEN
from nczmap.integrations.handles import DatasetHandle
from nczmap.integrations.xarray_backend import NCZmapDataStore
from nczmap.url import ParsedURL

try:
    from xarray.backends.writers import _validate_attrs, _validate_dataset_names, dump_to_store
except ImportError:  # xarray before 2025.10
    from xarray.backends.api import _validate_attrs, _validate_dataset_names, dump_to_store
try:
    from xarray.backends.writers import _sanitize_unlimited_dims
except ImportError:  # xarray before 2025.10
    try:
        from xarray.backends.api import _sanitize_unlimited_dims
    except ImportError:
        _sanitize_unlimited_dims = None

# The encodings the netcdf4 engine takes (xarray's _extract_nc4_variable_encoding), and nczmap's own.
NETCDF4_ENCODINGS = frozenset(
    [
        "zlib",
        "szip",
        "bzip2",
        "blosc",
        "zstd",
        "complevel",
        "fletcher32",
        "contiguous",
        "chunksizes",
        "shuffle",
        "_FillValue",
        "dtype",
        "compression",
        "significant_digits",
        "quantize_mode",
        "blosc_shuffle",
        "szip_coding",
        "szip_pixels_per_block",
        "endian",
        "least_significant_digit",
    ]
)
NCZMAP_ENCODINGS = frozenset(["chunks", "maxstrlen"])
_DESCRIPTIVE = frozenset(["source", "original_shape"])  # left by open_dataset; dropped, as netcdf4 does
_BLOSC_CNAMES = {
    "lz": "blosclz",
    "lz4": "lz4",
    "lz4hc": "lz4hc",
    "snappy": "snappy",
    "zlib": "zlib",
    "zstd": "zstd",
}


def to_nczarr(
    data: XDataset | DataTree,
    url: str | os.PathLike[str] | ParsedURL,
    netcdf_version: str | None = None,
    *,
    mode: str = "w",
    group: str | None = None,
    encoding: Mapping[str, Any] | None = None,
    unlimited_dims: Iterable[Hashable] | Mapping[str, Iterable[Hashable]] | None = None,
    compute: bool = True,
    keep_filters: bool = False,
    **map_options: object,
):
    """Write ``data`` (an xarray Dataset, or a DataTree as nested groups) to ``url``, as ``to_netcdf`` does.

    ``netcdf_version`` picks the NCZarr dialect (default: 4.9.3 and later); a URL with ``#mode=zarr``
    writes pure Zarr. ``mode``: ``w`` creates (replacing a dataset there), ``a`` adds groups and variables
    to an existing one (creating it if missing). ``group``: the group to write the Dataset into (created
    as needed; for a DataTree, where its root goes). ``encoding`` maps variable names (for a DataTree:
    group paths, then names) to netcdf4-engine encodings. ``unlimited_dims`` (for a DataTree: a mapping
    of group paths to dimensions) defaults to those the data was read with (``ds.encoding``), kept where
    the target release reads unlimited dimensions. With ``compute=False`` the metadata (and numpy data)
    is written and a dask object that writes the dask data is returned.

    xarray's own checks run before anything is written and raise what ``to_netcdf`` raises: names and
    attributes (``ValueError``/``TypeError``), encodings of variables that do not exist (``KeyError``),
    unlimited dimensions the data does not have (``ValueError``; a warning for those of ``ds.encoding``).
    """
    if mode not in ("w", "a", "r+"):
        raise ValueError(f"mode must be 'w' or 'a' (or 'r+'), not {mode!r}")
    if group is not None and not isinstance(group, str):
        raise ValueError("group must be a string or None")
    nodes = _nodes(data, encoding, unlimited_dims, group)
    target = open_nczmap(url, mode, netcdf_version, keep_filters=keep_filters, **map_options)
    if not compute and target.zmap.driver == "zip":
        target.zmap.abort()
        raise NCZError(f"{target.zmap.location}: compute=False needs a store written as it goes (file, s3)")
    handle = DatasetHandle(target)
    writer = ArrayWriter()
    try:
        for node in nodes:
            store = NCZmapWritableStore(handle, _ensure_group(target, node.path).path)
            unlimited = node.unlimited
            if node.recorded and not target.dialect.reads_unlimited:
                unlimited = set()  # read from a netCDF-4 file, kept only where the target release reads them
            dump_to_store(node.dataset, store, writer, encoding=node.encoding, unlimited_dims=unlimited)
        if compute and writer.sources:
            _check_travels(target, writer.sources)
        target.flush()  # every metadata object, before any task writes data
        delayed = writer.sync(compute=compute)
    except BaseException:
        target.zmap.abort()
        raise
    target.close()
    if compute:
        return None
    import dask

    return dask.delayed(_written)(delayed)  # one dask object, as xarray's to_netcdf returns


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


@dataclass
class _Node:
    """One group to write: its path, its own variables, their encoding, its unlimited dimensions."""

    path: str
    dataset: XDataset
    encoding: dict
    unlimited: set | None
    recorded: bool  # the unlimited dimensions come from ds.encoding, not from the caller


def _nodes(
    data: XDataset | DataTree, encoding: Mapping[str, Any] | None, unlimited_dims: object, group: str | None
) -> list[_Node]:
    """The groups to write, each checked as ``to_netcdf`` checks a dataset before writing anything."""
    encoding = dict(encoding or {})
    base = "/" + (group or "").strip("/")
    if isinstance(data, XDataset):
        parts = [(base, data, encoding, unlimited_dims)]
    elif isinstance(data, DataTree):
        if set(encoding) - set(data.groups):
            raise ValueError(
                f"unexpected encoding group name(s) provided: {set(encoding) - set(data.groups)}"
            )
        if unlimited_dims is not None and not isinstance(unlimited_dims, Mapping):
            unlimited_dims = _per_group(data, unlimited_dims)
        parts = [
            (
                posixpath.join(base, node.path.lstrip("/")).rstrip("/") or "/",
                node.to_dataset(inherit=False),
                dict(encoding.get(node.path) or {}),
                (unlimited_dims or {}).get(node.path),
            )
            for node in data.subtree
        ]
    else:
        raise NCZError(f"to_nczarr writes an xarray Dataset or DataTree, not {type(data).__name__}")
    nodes = []
    for path, dataset, node_encoding, node_unlimited in parts:
        _validate_dataset_names(dataset)
        _validate_attrs(dataset, "netcdf4")
        _check_names(dataset)
        for name, variable in dataset.variables.items():
            ensure_not_multiindex(variable, name)  # xarray's NotImplementedError, as to_netcdf raises it
            asked = _mapping(node_encoding.get(name) or {}).get("dtype", variable.encoding.get("dtype"))
            _check_storable(name, variable, asked)
        for name in node_encoding:
            if name not in dataset.variables:
                raise KeyError(name)  # as dump_to_store's, but before the target is opened
        recorded = node_unlimited is None
        unlimited = _unlimited(dataset, node_unlimited)
        nodes.append(_Node(path, dataset, node_encoding, unlimited, recorded))
    return nodes


def _mapping(encoding: object) -> dict:
    """A variable's encoding as ``to_netcdf`` takes it: a mapping, or xarray's ValueError."""
    try:
        return dict(encoding)  # type: ignore[call-overload]
    except (TypeError, ValueError) as err:
        raise ValueError("encoding must be castable to a dictionary") from err


def _per_group(tree: DataTree, unlimited_dims: object) -> dict[str, set]:
    """One set of dimensions for a whole DataTree (nczmap's shorthand; to_netcdf takes a mapping): each
    group makes unlimited those it has; a dimension no group has is refused, as to_netcdf refuses it."""
    wanted = {unlimited_dims} if isinstance(unlimited_dims, str) else set(unlimited_dims)
    per_group = {node.path: wanted & set(node.to_dataset(inherit=False).dims) for node in tree.subtree}
    missing = wanted - set().union(*per_group.values())
    if missing:
        raise ValueError(
            f"Unlimited dimension(s) {missing!r} declared in 'unlimited_dims-kwarg', but not part of "
            "any group's dimensions."
        )
    return per_group


def _unlimited(dataset: XDataset, unlimited_dims: object) -> set | None:
    if _sanitize_unlimited_dims is not None:
        return _sanitize_unlimited_dims(dataset, unlimited_dims)
    if unlimited_dims is None:
        unlimited_dims = dataset.encoding.get("unlimited_dims")
    if unlimited_dims is None:
        return None
    if isinstance(unlimited_dims, str) or not isinstance(unlimited_dims, Iterable):
        unlimited_dims = [unlimited_dims]
    return set(unlimited_dims)


def _check_names(dataset: XDataset) -> None:
    """Names netCDF cannot hold: '/' as the netcdf4 engine says; the rest (control characters, a leading
    '.') are NC_EBADNAME in netcdf-c (RuntimeError from netCDF4-python), an EncodingError here."""
    for name, variable in dataset.variables.items():
        names = [("variable", _encode_variable_name(name)), *(("dimension", dim) for dim in variable.dims)]
        for what, text in names:
            if not isinstance(text, str):
                raise TypeError(f"Invalid {what} name {text!r}: must be a string for serialization to netCDF")
            _ensure_no_forward_slash_in_name(text)
            if text.startswith(".") or _BAD_NAME.search(text):
                raise EncodingError(
                    f"illegal {what} name {text!r}: netCDF names do not start with '.' "
                    "or hold control characters"
                )


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
            if isinstance(value, str):
                value = self._text(value)
            elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                value = [self._text(v) for v in value]
        except EncodingError as exc:
            raise EncodingError(f"attribute {name!r}: {exc}") from None
        return value  # string attributes for releases that cannot read them: the dataset writer decides

    def _text(self, text: str) -> str:
        """Text as NCZarr can keep it. Pure Zarr keeps NUL characters (JSON escapes them; zarr-python and
        xarray read them back). netcdf-c reads NCZarr attributes as C strings: trailing NULs are dropped
        as netcdf-c drops them (netCDF4-python reads them without NULs anyway); a NUL inside the text is
        refused, netcdf-c would read the text cut there (or, from a JSON escape, as "u0000")."""
        if "\x00" not in text or self.handle.dataset.dialect in (Dialect.PURE_ZARR, Dialect.ZARR_V3):
            return text
        kept = text.rstrip("\x00")
        if "\x00" in kept:
            raise EncodingError(
                f"{text!r} holds a NUL character inside its text: netcdf-c reads NCZarr attributes as C "
                "strings and would not read what follows it (pure Zarr, mode=zarr, keeps it)"
            )
        return kept

    def prepare_variable(
        self, name: str, variable: XVariable, check_encoding: bool = False, unlimited_dims=None
    ):
        _ensure_no_forward_slash_in_name(name)
        group = self.group
        attrs = dict(variable.attrs)
        fill = attrs.pop("_FillValue", None)
        nc_dtype = _nc_dtype(name, variable)
        options, lsd = variable_options(name, variable, fill, check_encoding, unlimited_dims)
        data = variable.data
        if nc_dtype is str and variable.dtype.kind == "S":  # bytes written as strings: their UTF-8 text
            data = _decoded(data)
        if lsd is not None:
            if variable.dtype.kind == "f":  # quantized as netCDF4-python quantizes before writing
                data = _quantize(data, lsd)
            attrs["least_significant_digit"] = lsd
        existing = group.variables.get(name)
        if existing is None:
            existing = group.create_variable(name, variable.dims, nc_dtype, **options)
        for key, value in attrs.items():
            existing.attrs.set(key, self.attribute_value(f"{name}:{key}", value))
        return ChunkTarget(self.handle, existing.path), data

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
    """Python numbers as netCDF4-python stores them (64-bit), booleans as bytes, bytes and numpy text as
    netCDF4-python stores them (char text; several values: a string list); the rest unchanged."""
    if isinstance(value, bytes):
        return _utf8(value)
    if isinstance(value, str):
        return _storable_text(str(value))
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
    if isinstance(value, np.ndarray) and value.dtype.kind in "SU":
        texts = [_utf8(v) if isinstance(v, bytes) else _storable_text(str(v)) for v in value.ravel().tolist()]
        return texts[0] if len(texts) == 1 else texts
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, str | bytes) for v in value):
            return [_utf8(v) if isinstance(v, bytes) else _storable_text(str(v)) for v in value]
        try:
            array = np.asarray(value)
        except (OverflowError, ValueError) as exc:
            raise EncodingError(f"{value!r} is no netCDF attribute value: {exc}") from None
        if array.dtype.kind in "OUS" or array.ndim != 1:  # mixed types, nested lists
            raise EncodingError(f"{value!r} is no netCDF attribute value (one type, one dimension)")
        return attribute_value(array)
    return value


def _storable_text(text: str) -> str:
    """``text`` if netCDF can store it: UTF-8 text, or bytes that were not UTF-8 held as surrogate escapes
    (written back as those bytes); another lone surrogate (``"\\ud800"``) has no bytes."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise EncodingError(
            f"{text[:40]!r} holds {text[exc.start]!r} at {exc.start}, a lone surrogate: not text netCDF can "
            "store (UTF-8)"
        ) from None
    return text


def _utf8(value: bytes) -> str:
    """Bytes as the text netCDF4-python reads back from the char attribute the netcdf4 engine writes: UTF-8,
    what is not UTF-8 replaced (U+FFFD); NULs are then treated as in any text (``_text``)."""
    return bytes(value).decode("utf-8", errors="replace")


def _nc_dtype(name: str, variable: XVariable) -> object:
    """The netCDF type to create, or an error naming the variable where NCZarr has none."""
    asked = variable.encoding.pop("dtype", None)
    _check_storable(name, variable, asked)
    dtype = variable.dtype
    if dtype.kind in "OU" or (dtype.kind == "S" and _is_str(asked)):
        return str  # bytes asked for as dtype=str: strings, as the netcdf4 engine writes them
    if dtype.kind == "S" and dtype.itemsize > 1:  # CharacterArrayCoder made other bytes char arrays
        raise EncodingError(f"variable {name!r}: fixed-width bytes {dtype} have no netCDF type")
    if dtype.kind not in "iufbS":
        raise EncodingError(f"variable {name!r}: numpy dtype {dtype} has no netCDF type")
    return dtype


def _decoded(data: object) -> object:
    """Bytes values as text (numpy or dask)."""
    if hasattr(data, "map_blocks"):
        return data.map_blocks(np.char.decode, "utf-8", dtype=np.dtype(str))
    return np.char.decode(np.asarray(data), "utf-8")


def _is_str(dtype: object) -> bool:
    try:
        return dtype is str or np.dtype(dtype).kind == "U"
    except TypeError:
        return False


def _check_storable(name: str, variable: XVariable, asked: object = None) -> None:
    """An error naming the variable where it needs what netCDF-4 has and NCZarr has not: enums, compounds,
    variable-length (vlen) arrays, complex numbers (netCDF4-python stores them as compounds)."""
    dtype = variable.dtype
    for candidate in (asked, dtype):
        metadata = candidate.metadata if isinstance(candidate, np.dtype) else None
        if metadata and metadata.get("enum") is not None:
            raise EncodingError(
                f"variable {name!r}: NCZarr has no enum types (netCDF-4 enum {metadata.get('enum_name')!r}: "
                f"{dict(metadata['enum'])}); store its integers by dropping the enum from the encoding "
                f"(ds[{name!r}].encoding['dtype'] = np.dtype({dtype.str!r}))"
            )
    if dtype.kind == "V":
        raise EncodingError(
            f"variable {name!r}: NCZarr has no compound types (numpy dtype {dtype}); "
            "write each field as its own variable"
        )
    if dtype.kind == "c":
        raise EncodingError(
            f"variable {name!r}: NCZarr has no complex type (netCDF-4 stores {dtype} as a compound); "
            "write the real and imaginary parts as two variables"
        )
    if dtype.kind == "O" and variable.chunks is None and variable.size:
        first = next((v for v in np.asarray(variable.values).ravel() if v is not None), None)
        if isinstance(first, np.ndarray | list | tuple):
            raise EncodingError(
                f"variable {name!r}: NCZarr has no variable-length (vlen) types, only strings; "
                f"its values are {type(first).__name__}s (netCDF-4 vlen of {np.asarray(first).dtype})"
            )


def _quantize(data: object, least_significant_digit: int) -> object:
    """netCDF4-python's ``_quantize``: keep ``least_significant_digit`` decimal digits, in binary."""
    precision = 10.0**-least_significant_digit
    exp = np.log10(precision)
    exp = int(np.floor(exp)) if exp < 0 else int(np.ceil(exp))
    scale = 2.0 ** np.ceil(np.log2(10.0**-exp))
    return np.around(scale * data) / scale


def variable_options(
    name: str, variable: XVariable, fill: object, check: bool, unlimited_dims: object = None
) -> tuple[dict[str, Any], int | None]:
    """create_variable's options from a variable's encoding, read as the netcdf4 engine reads it (xarray's
    ``_extract_nc4_variable_encoding``: ``check``, the user gave the encoding, refuses unknown keys; an
    encoding left by open_dataset is dropped where it no longer fits), and ``least_significant_digit``."""
    raw = dict(variable.encoding)
    raw.pop("dtype", None)
    own = {key: raw.pop(key) for key in NCZMAP_ENCODINGS if key in raw}
    if check:
        unknown = set(raw) - NETCDF4_ENCODINGS - _DESCRIPTIVE
        if unknown:
            raise EncodingError(
                f"variable {name!r}: unexpected encoding {sorted(unknown)} "
                f"(nczmap writes {sorted(NETCDF4_ENCODINGS | NCZMAP_ENCODINGS)})"
            )
    if own.get("chunks") is not None and raw.get("chunksizes") is None:
        raw["chunksizes"] = _chunk_tuple(own["chunks"], variable)
    elif isinstance(raw.get("chunksizes"), Mapping):
        raw["chunksizes"] = _chunk_tuple(raw["chunksizes"], variable)
    if raw.get("chunksizes") and len(raw["chunksizes"]) == variable.ndim - 1 and variable.dtype == "S1":
        raw["chunksizes"] = (*raw["chunksizes"], variable.shape[-1])  # text made a char array: whole strings
    blosc = raw.get("blosc")
    shell = variable.copy(deep=False)  # the same dims and shape, with the encoding to read
    shell.encoding = raw
    encoding = _extract_nc4_variable_encoding(
        shell, raise_on_invalid=check, unlimited_dims=unlimited_dims, backend="nczmap"
    )
    unlimited = set(unlimited_dims or ())
    options: dict[str, Any] = {}
    if fill is not None:
        options["fill_value"] = fill
    for unsupported in ("significant_digits", "quantize_mode"):
        if encoding.get(unsupported) is not None:
            _cannot(name, f"{unsupported}: nczmap does not quantize as netcdf-c does", check)
    chunks = _storage_chunks(name, variable, encoding, check, unlimited)
    if chunks is not None:
        options["chunks"] = chunks
    filters, compressor = _codecs(name, variable, encoding, blosc, check)
    if filters:
        options["filters"] = filters
    if compressor:
        options["compressor"] = compressor
    if encoding.get("endian") in ("little", "big", "native"):
        options["endian"] = encoding["endian"]
    if own.get("maxstrlen"):
        options["maxstrlen"] = int(own["maxstrlen"])
    elif variable.dtype.kind in "OU" and variable.chunks is None:
        longest = _longest_utf8(variable.values)
        if longest > DEFAULT_MAXSTRLEN:  # NCZarr strings are fixed-width: widen to the longest
            options["maxstrlen"] = longest
    lsd = encoding.get("least_significant_digit")
    return options, (None if lsd is None else int(lsd))


def _cannot(name: str, what: str, check: bool) -> None:
    """Something netCDF-4 stores and nczmap cannot: refused if asked for, else dropped with a warning."""
    message = f"variable {name!r}: {what}"
    if check:
        raise EncodingError(message)
    warnings.warn(f"{message}; the encoding read with the data is dropped", UserWarning, stacklevel=6)


def _chunk_tuple(chunks: object, variable: XVariable) -> tuple[int, ...]:
    if isinstance(chunks, Mapping):
        return tuple(
            int(chunks.get(dim, size)) for dim, size in zip(variable.dims, variable.shape, strict=True)
        )
    if isinstance(chunks, int):
        return (chunks,) * variable.ndim
    return tuple(int(c) for c in chunks)


def _codecs(
    name: str, variable: XVariable, encoding: dict, blosc: object, check: bool
) -> tuple[list, dict | None]:
    """The codec chain netcdf-c writes for these netCDF-4 filters: the last filter of HDF5's pipeline
    (shuffle, compression, fletcher32) is the ``compressor``, the others ``filters``."""
    level = encoding.get("complevel")
    level = 4 if level is None else int(level)  # the netcdf4 engine's default complevel
    compression = encoding.get("compression")
    chain: list[dict] = []
    if compression in ("zlib", "gzip", "deflate") or compression is True:
        if level > 0:  # complevel 0: netCDF-4 stores the data as it is, without shuffle
            if encoding.get("shuffle", True):  # netCDF4-python shuffles before zlib unless told not to
                # the type's size, as zarr-python's readers need it (netcdf-c 4.10 writes 0, meaning it)
                size = 1 if variable.dtype.kind in "OSU" else variable.dtype.itemsize
                chain.append({"id": "shuffle", "elementsize": size})
            chain.append({"id": "zlib", "level": level})
    elif compression == "zstd":
        chain.append({"id": "zstd", "level": level})
    elif compression == "bzip2":
        chain.append({"id": "bz2", "level": level})
    elif isinstance(compression, str) and compression.startswith("blosc"):
        cname = compression.removeprefix("blosc").lstrip("_")
        shuffle = encoding.get("blosc_shuffle")
        if isinstance(blosc, Mapping):  # as read from a store: {"compressor": "blosc_lz4", "shuffle": 1}
            cname = cname or str(blosc.get("compressor", "")).removeprefix("blosc_")
            shuffle = blosc.get("shuffle") if shuffle is None else shuffle
        if (cname or "lz") not in _BLOSC_CNAMES:
            raise EncodingError(f"variable {name!r}: unknown blosc compressor {compression!r}")
        config = {"id": "blosc", "cname": _BLOSC_CNAMES[cname or "lz"], "clevel": level}
        chain.append({**config, "shuffle": 1 if shuffle is None else int(shuffle), "blocksize": 0})
    elif compression == "szip":
        _cannot(name, "szip compression: nczmap has no szip codec", check)
    elif compression:
        raise EncodingError(
            f"variable {name!r}: unsupported compression {compression!r} "
            "(zlib, zstd, bzip2, blosc_lz, blosc_lz4, blosc_lz4hc, blosc_zlib, blosc_zstd)"
        )
    if encoding.get("fletcher32"):
        chain.append({"id": "fletcher32"})
    if not chain:
        return [], None
    return chain[:-1], chain[-1]


def _longest_utf8(values: np.ndarray) -> int:
    if not values.size:
        return 0
    return int(max(len(str(v).encode()) for v in values.ravel()))


def _storage_chunks(
    name: str, variable: XVariable, encoding: dict, check: bool, unlimited: set
) -> tuple[int, ...] | None:
    """The chunk shape to store: the encoding's (``contiguous``: one chunk, as netcdf-c stores it in NCZarr),
    else dask's; it must divide every dask chunk boundary."""
    asked = encoding.get("chunksizes")
    if encoding.get("contiguous"):
        if not check:  # a netCDF-4 file's layout, not a request: NCZarr's default chunks are better
            asked = None
        elif asked:
            raise EncodingError(f"variable {name!r}: cannot specify chunksizes for a contiguous dataset")
        elif any(dim in unlimited for dim in variable.dims):
            raise EncodingError(
                f"variable {name!r}: a variable over an unlimited dimension cannot be contiguous"
            )
        else:
            asked = tuple(max(1, size) for size in variable.shape)
    if not variable.dims:
        return None
    if asked is not None:
        asked = tuple(int(c) for c in asked)
        if len(asked) != variable.ndim or min(asked) < 1:
            raise EncodingError(
                f"variable {name!r}: chunksizes {asked} must give a positive size for each of its "
                f"dimensions {variable.dims}"
            )
    dask_chunks = variable.chunks
    if dask_chunks is None:
        return asked or None
    own = tuple(max(1, sizes[0]) for sizes in dask_chunks)
    if not asked or _aligned(dask_chunks, asked):
        return asked or own
    if not check:  # chunks recorded by open_dataset, not asked for: dask's own chunks are safe
        return own
    raise EncodingError(
        f"variable {name!r}: storage chunks {asked} do not line up with dask's chunks "
        f"{dask_chunks}: two tasks would write one chunk and one would lose its values; "
        "rechunk with .chunk() or leave chunksizes out of the encoding"
    )


def _aligned(dask_chunks: tuple[tuple[int, ...], ...], chunks: tuple[int, ...]) -> bool:
    for sizes, size in zip(dask_chunks, chunks, strict=True):
        boundaries = np.cumsum(sizes)[:-1]
        if (boundaries % size).any():
            return False
    return True
