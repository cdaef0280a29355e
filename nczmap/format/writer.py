"""Creating and updating datasets: new groups, dimensions, variables, and flushing changed metadata.

Only objects that changed are rewritten (netcdf-c rewrites everything at close and, opening for update,
loses attributes it never loaded — bug 0). Consolidated ``/.zmetadata`` is kept up to date on every flush
when the store has one or the URL asks for it (netcdf-c leaves it stale — bug 30).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence

from nczmap._lazy import numpy as np
from nczmap.errors import EmptyError, FormatError
from nczmap.format import metadata as objects_of
from nczmap.format import zarr3
from nczmap.format.codecs import CodecChain
from nczmap.format.dataset import Dataset
from nczmap.format.dialects import Dialect
from nczmap.format.jsonutil import loads
from nczmap.format.model import Attribute, Dimension, Group
from nczmap.format.selection import as_index, chunk_plan, normalize_selection, selector_length
from nczmap.format.types import BY_NAME, CHAR, STRING, NCType, ParsedDtype, type_of_numpy
from nczmap.format.variable import ArrayLayout, Variable

DEFAULT = object()  # "use netCDF's default fill value"


DEFAULT_MAXSTRLEN = 128  # netcdf-c's _nczarr_default_maxstrlen: the width of NCZarr strings by default


class UnfilteredWarning(UserWarning):
    """A variable's compression was dropped because the target netcdf-c release cannot decode it."""


TARGET_CHUNK_BYTES = 4 << 20
_BAD_NAME = re.compile(r"[/\x00-\x1f\x7f]")


class DatasetWriter:
    """Makes a dataset writable: builds new nodes, writes data, and flushes changed metadata objects.

    The model reaches it through ``Group.editor()``; :func:`nczmap.format.open_on` attaches it.
    """

    def __init__(self, dataset: Dataset, dialect: Dialect, xarray: bool, consolidated: bool) -> None:
        self.dataset = dataset
        # a new dataset of mode=zarr,v3 comes as pure Zarr; the Dataset knows it is Zarr v3
        self.dialect = dataset.dialect if dataset.dialect is Dialect.ZARR_V3 else dialect
        self.xarray = xarray
        self.consolidated = consolidated
        self.dirty: dict[int, Group | Variable] = {}

    # ----------------------------------------------------------------- change tracking
    def attach(self, node: Group | Variable) -> None:
        node.attrs.on_change = lambda: self.touch(node)

    def attach_all(self) -> None:
        for group in self.dataset.walk():
            self.attach(group)
            for variable in group.variables.values():
                self.attach(variable)

    def touch(self, node: Group | Variable) -> None:
        self.dirty[id(node)] = node

    def touch_dimension_users(self, dimension: Dimension) -> None:
        self.touch(dimension.group)
        for group in self.dataset.walk():
            for variable in group.variables.values():
                if any(d is dimension for d in variable.dims):
                    variable.layout.shape = tuple(d.size for d in variable.dims)
                    self.touch(variable)

    # ----------------------------------------------------------------- flushing
    def flush(self) -> None:
        if not self.dirty:
            return
        zmap = self.dataset.zmap
        v3 = self.dialect is Dialect.ZARR_V3
        if v3 and self.consolidated:
            self.touch(self.dataset)  # its zarr.json holds the consolidated metadata
        # The root group last: a store whose writing stops part-way has no root metadata, and so does not
        # open as a (wrong) dataset.
        if not self.dialect.reads_strings:
            for node in self.dirty.values():
                _strings_as_text(node)
        for node in sorted(self.dirty.values(), key=lambda node: node is self.dataset):
            objects = self._objects(node)
            if v3 and self.consolidated and node is self.dataset:
                objects["/" + zarr3.ZARR_JSON]["consolidated_metadata"] = self.consolidated_v3()
            for key, value in objects.items():
                if not _stored_equal(zmap, key, value):
                    zmap.write(key, objects_of.dumps(value))
        self.dirty.clear()
        if self.consolidated and not v3:
            zmap.write("/.zmetadata", objects_of.dumps(self.consolidated_document()))

    def _objects(self, node: Group | Variable) -> dict:
        if isinstance(node, Group):
            return objects_of.group_objects(node, self.dialect)
        return objects_of.array_objects(node, self.dialect, self.xarray)

    def consolidated_v3(self) -> dict:
        """The root ``zarr.json``'s ``consolidated_metadata``: every other node's zarr.json by path, as
        zarr-python writes it (subgroups with an empty one of their own)."""
        metadata: dict = {}
        for group in self.dataset.walk():
            nodes = (
                [group, *group.variables.values()] if group is not self.dataset else group.variables.values()
            )
            for node in nodes:
                for key, value in self._objects(node).items():
                    if isinstance(node, Group):
                        value = {
                            **value,
                            "consolidated_metadata": {**zarr3.CONSOLIDATED_KIND, "metadata": {}},
                        }
                    metadata[key.strip("/").rsplit("/", 1)[0]] = value
        return {**zarr3.CONSOLIDATED_KIND, "metadata": dict(sorted(metadata.items()))}

    # ----------------------------------------------------------------- building (called by the model)
    def create_group(self, parent: Group, name: str) -> Group:
        return create_group(self, parent, name)

    def create_dimension(self, group: Group, name: str, size: int | None) -> Dimension:
        return create_dimension(self, group, name, size)

    def create_variable(self, group: Group, name: str, dimensions, dtype: object, **options) -> Variable:
        return create_variable(self, group, name, dimensions, dtype, **options)

    def write_selection(self, variable: Variable, selection: object, values: object) -> None:
        write_selection(self, variable, selection, values)

    def consolidated_document(self) -> dict:
        metadata: dict = {}
        for group in self.dataset.walk():
            metadata.update(_zarr_objects(objects_of.group_objects(group, self.dialect)))
            for variable in group.variables.values():
                metadata.update(_zarr_objects(objects_of.array_objects(variable, self.dialect, self.xarray)))
        return {"metadata": metadata, "zarr_consolidated_format": 1}


def _strings_as_text(node: Group | Variable) -> None:
    """Releases before 4.9.1 read no string attributes: one string is stored as char text, more refused."""
    for attribute in node.attrs.all_typed():
        if attribute.nctype is not STRING:
            continue
        where = f"{node.path.rstrip('/')}:{attribute.name}" if isinstance(node, Variable) else attribute.name
        if len(attribute.value) != 1:
            raise FormatError(
                f"attribute {where!r}: netcdf-c before 4.9.1 cannot read string attributes, and "
                f"{list(attribute.value)!r} is not one text: join it, or write for 4.9.1 or later"
            )
        node.attrs.load({attribute.name: Attribute(attribute.name, CHAR, attribute.value[0])})


def _stored_equal(zmap, key: str, value: object) -> bool:
    """True when ``key`` already holds JSON equal to ``value`` (whatever its spacing): no rewrite needed."""
    try:
        stored = loads(zmap.read(key), key)
    except (EmptyError, FormatError):
        return False
    return _normalized(stored) == _normalized(loads(objects_of.dumps(value), key))


def _normalized(value: object) -> object:
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return float(value) if isinstance(value, float) else value


def _zarr_objects(objects: dict) -> dict:
    return {
        k.lstrip("/"): v
        for k, v in objects.items()
        if k.rsplit("/", 1)[-1] in (".zgroup", ".zattrs", ".zarray")
    }


def check_name(name: object, what: str, group: Group) -> str:
    if not isinstance(name, str) or not name or name.startswith(".") or _BAD_NAME.search(name):
        raise FormatError(
            f"illegal {what} name {name!r} in group {group.path!r}: names must be non-empty, "
            "not start with '.', and contain no '/' or control characters"
        )
    if name in group.variables or name in group.groups:
        raise FormatError(f"group {group.path!r} already has a variable or group named {name!r}")
    return name


def create_group(writer: DatasetWriter, parent: Group, name: str) -> Group:
    check_name(name, "group", parent)
    child = Group(name, parent)
    parent.groups[name] = child
    writer.attach(child)
    writer.touch(child)
    writer.touch(parent)
    return child


def create_dimension(writer: DatasetWriter, group: Group, name: str, size: int | None) -> Dimension:
    if not isinstance(name, str) or not name or _BAD_NAME.search(name) or name in group.dimensions:
        raise FormatError(f"cannot create dimension {name!r} in group {group.path!r}: bad or existing name")
    if size is not None and (not isinstance(size, (int, np.integer)) or size < 0):
        raise FormatError(f"dimension {name!r}: size must be a non-negative integer or None (unlimited)")
    if size is None and not writer.dialect.reads_unlimited:
        raise FormatError(f"dimension {name!r}: netcdf-c before 4.9.3 cannot read unlimited dimensions")
    dimension = Dimension(name, int(size or 0), size is None, group)
    group.dimensions[name] = dimension
    writer.touch(group)
    return dimension


def resolve_dimension(group: Group, name: str | Dimension) -> Dimension:
    if isinstance(name, Dimension):
        return name
    if isinstance(name, str) and name.startswith("/"):
        found = group.find_dimension(name)
        if found is not None:
            return found
    found = group.lookup_dimension(name) if isinstance(name, str) else None
    if found is None:
        raise FormatError(f"dimension {name!r} is not defined in group {group.path!r} or its ancestors")
    return found


def create_variable(
    writer: DatasetWriter,
    group: Group,
    name: str,
    dimensions: Sequence[str | Dimension] = (),
    dtype: object = "f8",
    *,
    fill_value: object = DEFAULT,
    chunks: Sequence[int] | None = None,
    compression: str | None = None,
    compression_opts: int | None = None,
    shuffle: bool = False,
    endian: str = "little",
    maxstrlen: int | None = None,
    filters: list[dict] | None = None,
    compressor: dict | None = None,
    separator: str = ".",
) -> Variable:
    check_name(name, "variable", group)
    if isinstance(dimensions, str):
        dimensions = (dimensions,)
    dims = [resolve_dimension(group, d) for d in dimensions]
    nctype = dtype if isinstance(dtype, NCType) else _nctype_of(dtype)
    if nctype is STRING and not writer.dialect.reads_strings:
        raise FormatError(f"variable {name!r}: netcdf-c before 4.9.1 cannot read string variables")
    storage = _storage_dtype(nctype, endian, maxstrlen, group, name)
    if not writer.dialect.big_endian_safe and storage.byteorder == ">":
        storage = storage.newbyteorder("<")  # netcdf-c 4.9.0 reads and writes big-endian data wrongly
    shape = tuple(d.size for d in dims)
    unlimited = tuple(d.unlimited for d in dims)
    chunks = (
        _check_chunks(chunks, shape, name)
        if chunks is not None
        else default_chunks(shape, unlimited, storage.itemsize)
    )
    codecs = CodecChain(list(filters or []), compressor, storage.itemsize)
    if shuffle:
        codecs.filters.append({"id": "shuffle", "elementsize": storage.itemsize})
    if compression is not None:
        codecs.compressor = _compressor(compression, compression_opts)
    v3 = writer.dialect is Dialect.ZARR_V3
    if v3:
        codecs = _v3_codecs(codecs, storage.itemsize)
        separator = "/"
        if nctype is STRING:
            storage = np.dtype("|O8")  # vlen-utf8: any length
    if codecs.configs and not writer.dialect.decodes_filters and not writer.dataset.options.keep_filters:
        names = ", ".join(str(config.get("id")) for config in codecs.configs)
        warnings.warn(
            f"variable {group.path.rstrip('/')}/{name}: netcdf-c {writer.dialect.releases} as distributed "
            f"cannot decode compressed NCZarr chunks, so it is written without its filters ({names}); "
            "keep them with keep_filters=True (--keep-filters) for builds that have the codec plugins",
            UnfilteredWarning,
            stacklevel=3,
        )
        codecs = CodecChain(itemsize=storage.itemsize)
    parsed = ParsedDtype(
        nctype,
        storage,
        nctype.letter != "" and storage.itemsize > 1,
        storage.itemsize if nctype is STRING else 0,
    )
    fill = _fill(nctype, fill_value)
    layout = ArrayLayout(shape, tuple(chunks), parsed, fill, codecs, separator, "C", scalar=not dims)
    if v3:
        layout.key_prefix, layout.vlen = "c", nctype is STRING
    if not dims and writer.dialect is Dialect.NCZARR_UPPER_KEYS:
        warnings.warn(f"netcdf-c 4.9.0 crashes on scalar variables such as {name!r}", stacklevel=3)
    variable = Variable(group, name, dims, layout)
    if fill_value is not DEFAULT and fill_value is not None:
        variable.attrs.set("_FillValue", _fill_attribute(nctype, fill), nctype)
    group.variables[name] = variable
    writer.attach(variable)
    writer.touch(variable)
    writer.touch(group)
    return variable


def _v3_codecs(codecs: CodecChain, itemsize: int) -> CodecChain:
    """The chain as a Zarr v3 array stores it (zlib as gzip: v3 has no zlib codec)."""
    filters = [zarr3.v3_codec_config(config, itemsize) for config in codecs.filters]
    compressor = zarr3.v3_codec_config(codecs.compressor, itemsize) if codecs.compressor else None
    return CodecChain(filters, compressor, itemsize)


def _nctype_of(dtype: object) -> NCType:
    if isinstance(dtype, str) and dtype in BY_NAME:
        return BY_NAME[dtype]
    if dtype is str:
        return STRING
    try:
        return type_of_numpy(np.dtype(dtype))
    except TypeError as exc:
        raise FormatError(f"unknown variable type {dtype!r}") from exc


def _storage_dtype(nctype: NCType, endian: str, maxstrlen: int | None, group: Group, name: str) -> np.dtype:
    if nctype is CHAR:
        return np.dtype("S1")
    if nctype is STRING:
        default = group.root.attrs.get("_nczarr_default_maxstrlen", DEFAULT_MAXSTRLEN)
        return np.dtype(f"S{int(maxstrlen or default)}")
    order = {"little": "<", "big": ">", "native": "="}.get(endian)
    if order is None:
        raise FormatError(f"variable {name!r}: endian must be 'little', 'big' or 'native', not {endian!r}")
    return np.dtype(nctype.letter).newbyteorder(order)


def _fill(nctype: NCType, fill_value: object) -> object:
    if fill_value is None:
        return None
    if fill_value is DEFAULT:
        fill_value = nctype.fill
    if nctype is CHAR:
        return fill_value.encode() if isinstance(fill_value, str) else bytes(fill_value)[:1] or b"\x00"
    if nctype is STRING:
        return str(fill_value)
    return np.array(fill_value).astype(nctype.numpy)[()]


def _fill_attribute(nctype: NCType, fill: object) -> object:
    if nctype is CHAR:
        return fill.decode("latin-1")
    return [fill] if nctype is STRING else np.array([fill])


def _compressor(name: str, level: int | None) -> dict:
    if name in ("zlib", "gzip", "deflate"):
        return {"id": "zlib", "level": 4 if level is None else int(level)}
    if name == "zstd":
        return {"id": "zstd", "level": 3 if level is None else int(level)}
    if name == "blosc":
        return {
            "id": "blosc",
            "cname": "lz4",
            "clevel": 5 if level is None else int(level),
            "shuffle": 1,
            "blocksize": 0,
        }
    raise FormatError(f"unknown compression {name!r}: use zlib, zstd or blosc")


def _check_chunks(chunks: Sequence[int], shape: tuple[int, ...], name: str) -> tuple[int, ...]:
    chunks = tuple(int(c) for c in chunks)
    if len(chunks) != len(shape) or any(c < 1 for c in chunks):
        raise FormatError(f"variable {name!r}: chunks {chunks} do not fit shape {shape}")
    return chunks


def default_chunks(shape: tuple[int, ...], unlimited: tuple[bool, ...], itemsize: int) -> tuple[int, ...]:
    """Whole array up to 4 MiB; unlimited dimensions chunk by 1 (1-D: 4096 bytes), like netCDF-4."""
    if len(shape) == 1 and unlimited[0]:
        return (max(1, 4096 // itemsize),)
    chunks = [1 if u else max(1, s) for s, u in zip(shape, unlimited, strict=True)]
    while math.prod(chunks) * itemsize > TARGET_CHUNK_BYTES:
        largest = max(range(len(chunks)), key=chunks.__getitem__)
        chunks[largest] = (chunks[largest] + 1) // 2
    return tuple(chunks)


def write_selection(writer: DatasetWriter, variable: Variable, selection: object, values: object) -> None:
    """Store ``values`` at ``selection``; chunks only partly covered are read, modified and rewritten."""
    layout = variable.layout
    if layout.shards is not None:
        raise FormatError(
            f"{variable.key!r} is a sharded Zarr v3 array: nczmap reads such arrays, never writes"
        )
    _grow_unlimited(variable, selection, values, writer)
    indices, squeeze = normalize_selection(selection, variable.shape, variable.key)
    if layout.scalar:
        indices, squeeze = [range(1)], [True]
    kept = tuple(len(ix) for ix, sq in zip(indices, squeeze, strict=True) if not sq)
    data = _user_values(variable, values, kept).reshape(tuple(len(ix) for ix in indices))
    chunk_shape = layout.chunks or (1,)
    for chunk_index, (out_ix, in_ix) in chunk_plan(indices, layout.chunks):
        index = () if layout.scalar else chunk_index
        whole = all(selector_length(ix) == size for ix, size in zip(in_ix, chunk_shape, strict=True))
        existing = None if whole else variable.read_chunk(index)
        chunk = variable.filled(chunk_shape) if existing is None else existing.copy()
        chunk[as_index(in_ix)] = data[as_index(out_ix)]
        key = variable.chunk_key(index)
        variable.group.root.zmap.write(key, layout.codecs.encode(_storage_bytes(variable, chunk), key))


def _grow_unlimited(variable: Variable, selection: object, values: object, writer: DatasetWriter) -> None:
    """Lengthen unlimited dimensions that the selection (or an open-ended slice's values) reaches past."""
    items = list(selection) if isinstance(selection, tuple) else [selection]
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (len(variable.dims) - len(items) + 1)
    if len(items) != len(variable.dims):
        return
    value_shape = np.shape(values)
    axes = [i for i, item in enumerate(items) if not isinstance(item, (int, np.integer))]
    for position, (item, dim) in enumerate(zip(items, variable.dims, strict=True)):
        if dim.unlimited:
            needed = _needed_length(item, position, axes, value_shape)
            if needed is not None and needed > dim.size:
                dim.size = needed
                writer.touch_dimension_users(dim)


def _needed_length(item: object, position: int, axes: list[int], value_shape: tuple[int, ...]) -> int | None:
    if isinstance(item, (int, np.integer)):
        return int(item) + 1 if item >= 0 else None
    if not isinstance(item, slice) or item.step not in (None, 1):
        return None
    if item.stop is not None:
        return int(item.stop) if item.stop >= 0 else None
    if len(value_shape) == len(axes):  # an open-ended slice takes its length from the values
        return (item.start or 0) + value_shape[axes.index(position)]
    return None


def _user_values(variable: Variable, values: object, shape: tuple[int, ...]) -> np.ndarray:
    nctype = variable.nctype
    try:
        if nctype is CHAR:
            array = _char_array(values, shape)
        elif nctype is STRING:
            array = np.asarray(values, dtype=object)
        else:
            array = _numbers(values, nctype, variable.key)
        return np.broadcast_to(array, shape)
    except (ValueError, TypeError) as exc:
        raise FormatError(
            f"cannot write {type(values).__name__} into {variable.key!r} of shape {shape}: {exc}"
        ) from exc


def _numbers(values: object, nctype: NCType, key: str) -> np.ndarray:
    """``values`` as ``nctype``; integers out of its range are refused, never wrapped or rounded."""
    if nctype.is_integer and not isinstance(values, np.ndarray | np.generic):
        # Python ints straight to the type: through float64 (numpy's guess for 2**64-2) they would round
        try:
            return np.asarray(values, dtype=nctype.numpy)
        except OverflowError as exc:
            raise FormatError(f"values out of range for {nctype.name} variable {key!r}: {exc}") from None
    array = np.asarray(values)
    if array.dtype.kind in "iub" and nctype.is_integer:
        info = np.iinfo(nctype.numpy)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise FormatError(f"values out of range for {nctype.name} variable {key!r}")
    return array.astype(nctype.numpy)


def _char_array(values: object, shape: tuple[int, ...]) -> np.ndarray:
    if isinstance(values, (str, bytes)) or (
        isinstance(values, list) and values and isinstance(values[0], str)
    ):
        rows = [values] if isinstance(values, (str, bytes)) else values
        width = shape[-1] if shape else 1
        encoded = [(r.encode() if isinstance(r, str) else r)[:width].ljust(width, b"\x00") for r in rows]
        return (
            np.frombuffer(b"".join(encoded), dtype="S1")
            .reshape(-1, width)
            .reshape(shape if math.prod(shape) == len(encoded) * width else (-1, width))
        )
    return np.asarray(values, dtype="S1")


def _storage_bytes(variable: Variable, chunk: np.ndarray) -> bytes:
    storage = variable.layout.dtype.storage
    order = variable.layout.order
    if variable.layout.vlen:
        from nczmap.format.zarr3_vlen import encode_vlen_utf8

        return encode_vlen_utf8(chunk)
    if variable.layout.transpose is not None:
        chunk, order = np.transpose(chunk, variable.layout.transpose), "C"
    if variable.nctype is CHAR:  # one byte a character, "<U1" declared or not, as netcdf-c writes it
        return np.ascontiguousarray(chunk, dtype="S1").tobytes(order=order)
    if storage.kind == "U":  # a Zarr v3 fixed_length_utf32 array
        return np.asarray(chunk, dtype=storage).tobytes(order=order)
    if variable.nctype is STRING:
        encoded = [("" if v is None else str(v)).encode() for v in chunk.ravel(order=order)]
        too_long = max((len(e) for e in encoded), default=0)
        if too_long > storage.itemsize:
            raise FormatError(
                f"a string of {too_long} bytes does not fit {variable.key!r} "
                f"(maximum {storage.itemsize}; set maxstrlen or _nczarr_maxstrlen)"
            )
        return np.array(encoded, dtype=storage).tobytes()
    # in the byte order the chunks hold (a netcdf-c 4.8-4.9.2 store keeps host order under a ">" dtype)
    return np.ascontiguousarray(chunk.astype(variable.layout.dtype.chunk, copy=False)).tobytes(order=order)
