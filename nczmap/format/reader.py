"""Reading every NCZarr dialect (D0-D3), pure Zarr and the xarray convention into the netCDF model.

Dialect detection follows nczarr-format.md §12: superblock in root ``.zattrs`` (D3), root ``.zgroup``
lower-case (D2) or upper-case (D1) keys, or ``/.nczarr`` (D0); none means pure Zarr. Unlike netcdf-c an
array that cannot be read is skipped with a warning naming it, instead of failing the whole open.

netcdf-c 4.8.0-4.9.2 wrote the chunks of big-endian (``>``) variables in host byte order (bug 18): in stores
whose ``_NCProperties`` names one of those releases such chunks are read as little-endian, as those releases
read them, and ``dataset.notes`` says so for each variable. Nothing else (no ``_NCProperties``: other Zarr
writers; nczmap; netcdf-c 4.9.3 and later) is reinterpreted.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import replace

from nczmap._lazy import LazyModule
from nczmap.collector import collector_paused
from nczmap.concurrency import run_bounded
from nczmap.errors import DatasetNotFound, EmptyError, FormatError, NCZError
from nczmap.format.codecs import CodecChain, check_codecs
from nczmap.format.dataset import Dataset, FormatOptions
from nczmap.format.dialects import Dialect, host_order_release
from nczmap.format.jsonutil import holds_plain_float, loads, loads_plain, netcdf_text
from nczmap.format.model import Attribute, Attributes, Dimension, Group
from nczmap.format.types import (
    BY_CODE,
    CHAR,
    FLOAT,
    STRING,
    NCType,
    check_rank,
    convert_value,
    infer_json_type,
    parse_dtype,
    to_float32,
)
from nczmap.format.variable import ArrayLayout, PendingFill, Variable
from nczmap.zmap import Latency, ZMap

zarr3 = LazyModule("nczmap.format.zarr3")  # Zarr v3 only: NCZarr and Zarr v2 stores never import it

_HIDDEN = frozenset(
    [
        "_ARRAY_DIMENSIONS",
        "_NCProperties",
        "CLASS",
        "DIMENSION_LIST",
        "NAME",
        "REFERENCE_LIST",
        "_Netcdf4Coordinates",
        "_Netcdf4Dimid",
    ]
)
_VISIBLE_NCZARR = frozenset(["_nczarr_maxstrlen", "_nczarr_default_maxstrlen"])
ANONYMOUS = "_Anonymous_Dim_{}"
# A dimension of length 0 is unlimited in netCDF (NC_UNLIMITED is 0), in every dialect, as netcdf-c reads it.


@functools.lru_cache(maxsize=1024)
def is_hidden(name: str) -> bool:
    return name in _HIDDEN or (name.lower().startswith("_nczarr") and name not in _VISIBLE_NCZARR)


class MetadataSource:
    """Metadata objects by key: from consolidated ``/.zmetadata`` when there is one, else one read each.

    Objects are parsed with plain floats (:func:`loads_plain`); :meth:`exact` parses one again keeping the
    source text of its numbers, for the rare value shown as JSON text."""

    def __init__(self, zmap: ZMap, consolidated: dict | None, consolidated_text: bytes | None = None) -> None:
        self.zmap = zmap
        self.consolidated = consolidated
        self._consolidated_text = consolidated_text
        self._fetched: dict[str, bytes | None] = {}
        self._texts: dict[str, bytes] = {}  # what each object parsed with plain floats was parsed from
        self._exact: dict[str, object] = {}
        # .zarray objects with the same text (arrays of one shape, type and dimensions) parsed once: the
        # reader only reads them
        self._same_arrays: dict[bytes, dict] = {}
        # Where every read is a round trip, fetch a group's metadata objects several at a time; where the
        # driver reads many small objects in one pass (the file driver), all of a group's at once.
        self._bulk = getattr(zmap, "read_objects", None) if zmap.latency is Latency.LOCAL else None
        self.prefetching = consolidated is None and (zmap.latency is Latency.REMOTE or self._bulk is not None)

    def prefetch(self, keys: list[str]) -> None:
        """Read these objects ahead: in one pass where the driver can, else concurrently where reads are
        round trips to a server. What is not read ahead is read when asked for."""
        if not self.prefetching:
            return
        wanted = [key for key in keys if key not in self._fetched]
        if self._bulk is not None:
            self._fetched.update(self._bulk(wanted))
            return
        for key, data in zip(
            wanted, run_bounded(lambda key=key: self._raw(key) for key in wanted), strict=True
        ):
            self._fetched[key] = data

    def _raw(self, key: str) -> bytes | None:
        try:
            return self.zmap.read(key)
        except EmptyError:
            return None

    def get(self, key: str, exact: bool = False) -> dict | None:
        """The object at ``key`` parsed (None if absent); ``exact`` keeps every number's source text."""
        if self._consolidates(key):
            value = (self._exact_consolidated() if exact else self.consolidated).get(key.lstrip("/"))
        else:
            data = self._fetched.pop(key) if key in self._fetched else self._raw(key)
            if data is None:
                return None
            if exact:
                value = loads(data, lambda: f"{key!r} of {self.zmap.location}")
            else:
                value = self._same_arrays.get(data) if key.endswith("/.zarray") else None
                if value is None:
                    value = loads_plain(data, lambda: f"{key!r} of {self.zmap.location}")
                    if key.endswith("/.zarray") and isinstance(value, dict):
                        self._same_arrays[data] = value
                self._texts[key] = data
        if value is not None and not isinstance(value, dict):
            raise FormatError(f"{key!r} of {self.zmap.location} must hold a JSON object")
        return value

    def exact(self, key: str) -> dict | None:
        """The object :meth:`get` gave for ``key``, parsed again keeping every number's source text
        (None if it was not parsed with plain floats)."""
        found = self._exact.get(key)
        if found is None:
            if self._consolidates(key):
                found = self._exact_consolidated().get(key.lstrip("/"))
            elif key in self._texts:
                found = loads(self._texts[key], lambda: f"{key!r} of {self.zmap.location}")
            self._exact[key] = found
        return found if isinstance(found, dict) else None

    def _consolidates(self, key: str) -> bool:
        return self.consolidated is not None and key.rsplit("/", 1)[-1] in (".zgroup", ".zattrs", ".zarray")

    def _exact_consolidated(self) -> dict:
        found = self._exact.get("/.zmetadata")
        if found is None:
            document = loads(self._consolidated_text or b"{}", f"'/.zmetadata' of {self.zmap.location}")
            found = self._exact["/.zmetadata"] = document["metadata"]
        return found

    def children(self, key: str) -> tuple[list[str], list[str]]:
        """Sorted (subgroup names, array names) of a group, as pure-Zarr readers find them."""
        base = key.rstrip("/")
        if self.consolidated is not None:
            names = {
                k[len(base) :].lstrip("/").split("/", 1)[0]
                for k in self.consolidated
                if ("/" + k).startswith(base + "/")
            }
        else:
            names = self.zmap.search(key)
        names = sorted(n for n in names if n and not n.startswith("."))
        groups = [n for n in names if self._has(f"{base}/{n}/.zgroup")]
        arrays = [n for n in names if self._has(f"{base}/{n}/.zarray")]
        return groups, arrays

    def _has(self, key: str) -> bool:
        if self.consolidated is not None:
            return key.lstrip("/") in self.consolidated
        return self.zmap.exists(key)


def read_consolidated(zmap: ZMap, required: bool) -> dict | None:
    found = _read_consolidated(zmap, required)
    return None if found is None else found[0]


def _read_consolidated(zmap: ZMap, required: bool) -> tuple[dict, bytes] | None:
    """The consolidated metadata (numbers as plain floats) and the text it was parsed from."""
    try:
        text = zmap.read("/.zmetadata")
    except EmptyError:
        return None
    document = loads_plain(text, f"'/.zmetadata' of {zmap.location}")
    metadata = document.get("metadata") if isinstance(document, dict) else None
    if not isinstance(metadata, dict) or document.get("zarr_consolidated_format") != 1:
        if required:
            raise FormatError(f"'/.zmetadata' of {zmap.location} is not valid consolidated metadata")
        return None
    return metadata, text


def no_dataset(zmap: ZMap) -> NCZError:
    """The error for a store whose root holds no Zarr group: say what is there instead."""
    if zmap.exists("/.zarray"):
        return FormatError(f"{zmap.location} holds a single Zarr array at its root, not a group (a dataset)")
    names = zmap.search("/") if zmap.listable else []
    if not names:  # nothing there at all: as missing as a directory that does not exist
        return DatasetNotFound(f"no dataset at {zmap.location}: nothing is there")
    more = ", ..." if len(names) > 5 else ""
    seen = f" (it holds {', '.join(names[:5])}{more})"
    return FormatError(
        f"no dataset at {zmap.location}: its root has no .zgroup, .zattrs or .zmetadata{seen}; "
        "an interrupted copy or write leaves such a store"
    )


def detect_dialect(source: MetadataSource, zgroup: dict, zattrs: dict) -> Dialect:
    if isinstance(zattrs.get("_nczarr_superblock"), dict):
        return Dialect.NCZARR_ATTRIBUTES
    if isinstance(zgroup.get("_nczarr_superblock"), dict):
        return Dialect.NCZARR_LOWER_KEYS
    if isinstance(zgroup.get("_NCZARR_SUPERBLOCK"), dict):
        return Dialect.NCZARR_UPPER_KEYS
    if source.consolidated is None and source.zmap.exists("/.nczarr"):  # 4.8.0 never consolidated
        return Dialect.NCZARR_OBJECTS
    return Dialect.PURE_ZARR


def read_dataset(zmap: ZMap, options: FormatOptions | None = None) -> Dataset:
    """Build the netCDF model of the dataset stored in ``zmap``."""
    options = options or FormatOptions()
    found = _read_consolidated(zmap, required=options.consolidated)
    consolidated = None if found is None else found[0]
    source = MetadataSource(zmap, consolidated, None if found is None else found[1])
    found_zattrs = source.get("/.zattrs")
    zattrs = found_zattrs or {}
    d3 = isinstance(zattrs.get("_nczarr_superblock"), dict) and not options.pure_zarr
    found_zgroup = None if d3 else source.get("/.zgroup")  # D3 keeps all it needs in .zattrs: one GET less
    zgroup = found_zgroup or {}
    dialect = detect_dialect(source, zgroup, zattrs)
    nothing = found_zattrs is None and found_zgroup is None and consolidated is None
    if nothing and dialect is Dialect.PURE_ZARR:
        root = source.get("/" + zarr3.ZARR_JSON, exact=True)
        if root is None:
            raise no_dataset(zmap)
        return _read_v3(zmap, options, source, root)
    dataset = Dataset(zmap, dialect, replace(options, zarr_format=2))
    dataset.consolidated = consolidated is not None
    provenance = zattrs.get("_NCProperties")
    dataset.provenance = provenance if isinstance(provenance, str) else None
    pure = dialect is Dialect.PURE_ZARR or options.pure_zarr
    reader = _Reader(dataset, source, pure, options.xarray)
    with collector_paused():  # thousands of small linked objects
        reader.group("/", dataset, zgroup, zattrs)
    return dataset


def _read_v3(zmap: ZMap, options: FormatOptions, source: MetadataSource, root: dict) -> Dataset:
    """A Zarr v3 store, read as pure Zarr (its ``dimension_names`` name the dimensions)."""
    if zarr3.node_type(root, "/zarr.json") != "group":
        raise FormatError(
            f"{zmap.location} holds a single Zarr v3 array at its root, not a group (a dataset)"
        )
    dataset = Dataset(zmap, Dialect.ZARR_V3, replace(options, pure_zarr=True, zarr_format=3))
    v3_source = Source3(source, zarr3.consolidated_entries(root))
    dataset.consolidated = v3_source.consolidated is not None
    reader = _Reader3(dataset, v3_source)
    with collector_paused():
        reader.group("/", dataset, root)
    return dataset


class Source3:
    """Zarr v3 nodes (``zarr.json``) by path: from the root's consolidated metadata when it has some."""

    def __init__(self, source: MetadataSource, consolidated: dict | None) -> None:
        self.source = source
        self.consolidated = consolidated

    def node(self, key: str) -> dict | None:
        if self.consolidated is None:
            return self.source.get(_join(key, zarr3.ZARR_JSON), exact=True)  # v3 is read as written
        found = self.consolidated.get(key.strip("/"))
        if found is not None and not isinstance(found, dict):
            raise FormatError(f"consolidated metadata of {key!r} must be a JSON object")
        return found

    def children(self, key: str) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
        """Sorted (subgroups, arrays) of a group as (name, zarr.json); names without zarr.json are skipped."""
        base = key.strip("/")
        if self.consolidated is not None:
            depth = base.count("/") + 1 if base else 0
            names = {
                path.split("/")[depth]
                for path in self.consolidated
                if isinstance(path, str)
                and path.count("/") == depth
                and path.startswith(base + "/" if base else "")
            }
        else:
            names = set(self.source.zmap.search(key))
            self.source.prefetch([_join(_join(key, n), zarr3.ZARR_JSON) for n in sorted(names)])
        groups, arrays = [], []
        for name in sorted(n for n in names if n and not n.startswith(".") and n != zarr3.ZARR_JSON):
            child_key = _join(key, name)
            meta = self.node(child_key)
            if meta is None:
                continue
            kind = zarr3.node_type(meta, _join(child_key, zarr3.ZARR_JSON))
            (groups if kind == "group" else arrays).append((name, meta))
        return groups, arrays


class _Reader3:
    """Builds the netCDF model of a Zarr v3 store, as :class:`_Reader` does for pure Zarr v2."""

    def __init__(self, dataset: Dataset, source: Source3) -> None:
        self.dataset = dataset
        self.source = source
        self._nodes: dict[str, dict] = {}
        self._v2 = _Reader(dataset, source.source, True, True)

    def group(self, key: str, group: Group, meta: dict) -> None:
        where = _join(key, zarr3.ZARR_JSON)
        read_attributes(group.attrs, zarr3.attributes(meta, where), {}, None, True)
        subgroups, arrays = self.source.children(key)
        for name, array_meta in arrays:
            self._nodes[_join(key, name)] = array_meta
            self._v2.array_or_problem(group, name, self.array)
        for name, child_meta in subgroups:
            child = Group(name, group)
            group.groups[name] = child
            self.group(_join(key, name), child, child_meta)

    def array(self, group: Group, name: str, key: str) -> Variable:
        meta = self._nodes.pop(key)
        layout = zarr3.parse_array(meta, key)
        names = zarr3.dimension_names(meta, 0 if layout.scalar else len(layout.shape), key)
        dims = [self._v2.dimension(group, n, size) for n, size in zip(names, layout.shape, strict=False)]
        variable = Variable(group, name, dims, layout)
        attrs = dict(zarr3.attributes(meta, key))
        if "_FillValue" in attrs:
            attrs["_FillValue"] = zarr3.xarray_fill_attribute(attrs["_FillValue"], layout.dtype.nctype)
        read_attributes(variable.attrs, attrs, _v3_types(attrs), layout.dtype.nctype, True)
        return variable


def _v3_types(attrs: dict) -> dict:
    """The attribute types a v3 array's ``_nczarr_attr`` records (see ``metadata.zarr3_array_json``)."""
    record = attrs.get("_nczarr_attr")
    types = record.get("types") if isinstance(record, dict) else None
    if not isinstance(types, dict):
        return {}
    return {name: kind for name, kind in types.items() if isinstance(name, str) and isinstance(kind, str)}


class _Reader:
    def __init__(self, dataset: Dataset, source: MetadataSource, pure: bool, xarray: bool) -> None:
        self.dataset = dataset
        self.source = source
        self.pure = pure
        self.xarray = xarray
        self.dimensions_by_path: dict[str, Dimension] = {}
        self._d3 = dataset.dialect is Dialect.NCZARR_ATTRIBUTES and not pure
        self._host_order = host_order_release(dataset.provenance)  # the netcdf-c release, when bug 18
        self._layouts: dict[int, tuple[dict, ArrayLayout]] = {}  # id(.zarray) -> (it, its layout unused)

    # ----------------------------------------------------------------- groups
    def group(self, key: str, group: Group, zgroup: dict, zattrs: dict) -> None:
        info = None if self.pure else self._group_info(key, zgroup, zattrs)
        read_attributes(
            group.attrs, zattrs, self._types(key, zattrs), None, self.pure, self._exact(_join(key, ".zattrs"))
        )
        if info is None:
            subgroups, arrays = self.source.children(key)
        else:
            self._dimensions(group, info, key)
            subgroups, arrays = _names(info, ("groups",), key), _names(info, ("arrays", "vars"), key)
        self.source.prefetch(
            [f"{_join(key, name)}/{obj}" for name in arrays for obj in (".zarray", ".zattrs")]
            + [
                f"{_join(key, name)}/{obj}"
                for name in subgroups
                for obj in ((".zattrs",) if self._d3 else (".zgroup", ".zattrs"))
            ]
        )
        for name in arrays:
            self._array_or_problem(group, name)
        for name in subgroups:
            child = Group(name, group)
            group.groups[name] = child
            child_key = _join(key, name)
            zgroup = {} if self._d3 else self.source.get(child_key + "/.zgroup") or {}
            self.group(child_key, child, zgroup, self.source.get(child_key + "/.zattrs") or {})

    def _group_info(self, key: str, zgroup: dict, zattrs: dict) -> dict | None:
        for holder, name in ((zattrs, "_nczarr_group"), (zgroup, "_nczarr_group"), (zgroup, "_NCZARR_GROUP")):
            if isinstance(holder.get(name), dict):
                return holder[name]
        if self.dataset.dialect is Dialect.NCZARR_OBJECTS:
            return self.source.get(_join(key, ".nczgroup"))
        return None

    def _dimensions(self, group: Group, info: dict, key: str) -> None:
        declared = info.get("dimensions", info.get("dims", {}))
        if not isinstance(declared, dict):
            raise FormatError(f"dimensions of group {key!r} must be a JSON object, not {declared!r}")
        for name, spec in declared.items():
            size, unlimited = spec, False
            if isinstance(spec, dict):
                size, unlimited = spec.get("size"), bool(spec.get("unlimited", 0))
            if not isinstance(size, int) or size < 0:
                raise FormatError(f"dimension {name!r} of group {key!r} has no valid size: {spec!r}")
            dimension = group.dimensions[name] = Dimension(name, int(size), unlimited or not size, group)
            self.dimensions_by_path[dimension.path] = dimension

    def _types(self, key: str, zattrs: dict) -> dict:
        for name in ("_nczarr_attr", "_NCZARR_ATTR"):
            holder = zattrs.get(name)
            if isinstance(holder, dict) and isinstance(holder.get("types"), dict):
                return holder["types"]
        if self.dataset.dialect is Dialect.NCZARR_OBJECTS:
            for name in (".nczattr", ".nczattrs"):
                found = self.source.get(_join(key, name))
                if found and isinstance(found.get("types"), dict):
                    return found["types"]
        return {}

    # ----------------------------------------------------------------- arrays
    def _array_or_problem(self, group: Group, name: str) -> None:
        self.array_or_problem(group, name, self.array)

    def array_or_problem(self, group: Group, name: str, build) -> None:
        """Add the array ``build(group, name, key)`` makes, or record why it cannot be read and skip it."""
        key = _join(group.path, name)
        try:
            variable = build(group, name, key)
        except FormatError as exc:
            self.dataset.problems.append((key, str(exc)))
            warnings.warn(f"skipping array {key!r} of {self.source.zmap.location}: {exc}", stacklevel=5)
            return
        if variable is not None:
            group.variables[name] = variable

    def array(self, group: Group, name: str, key: str) -> Variable | None:
        zarray = self.source.get(key + "/.zarray")
        if zarray is None:
            raise FormatError(f"array {key!r} is listed but has no .zarray")
        zattrs = self.source.get(key + "/.zattrs") or {}
        info = None if self.pure else self._array_info(key, zarray, zattrs)
        layout = self._layout(zarray, key)
        if info is not None:
            dims, scalar = self._referenced_dims(group, info, layout, key)
        else:
            dims, scalar = self._pure_dims(group, zattrs, layout, key)
        layout.scalar = scalar
        if self._host_order is not None:
            self._in_host_order(layout, key)
        variable = Variable(group, name, dims, layout)
        read_attributes(
            variable.attrs,
            zattrs,
            self._types(key, zattrs),
            layout.dtype.nctype,
            self.pure,
            self._exact(key + "/.zattrs"),
        )
        return variable

    def _layout(self, zarray: dict, key: str) -> ArrayLayout:
        """The array's layout: parsed, or copied from that of an array with the same ``.zarray`` text."""
        known = self._layouts.get(id(zarray))
        if known is not None and known[0] is zarray:
            return _copied(known[1])
        layout = parse_layout(zarray, self.pure, key, lambda: self.source.exact(key + "/.zarray"))
        self._layouts[id(zarray)] = (zarray, _copied(layout))
        return layout

    def _exact(self, key: str) -> Callable[[str], object]:
        """The attribute ``name`` of the object at ``key`` with its numbers' source text."""
        return lambda name: (self.source.exact(key) or {}).get(name, _NOT_KEPT)

    def _in_host_order(self, layout: ArrayLayout, key: str) -> None:
        """A big-endian array of a store by netcdf-c 4.8.0-4.9.2: its chunks hold little-endian bytes."""
        dtype = layout.dtype.in_host_order()
        if dtype is layout.dtype:
            return
        layout.dtype = dtype
        self.dataset.notes.append(
            (
                key,
                f"dtype {dtype.spec!r} read as {dtype.chunk_spec!r}: written by netcdf-c {self._host_order} "
                "(_NCProperties), which stores big-endian variables in host (little-endian) byte order "
                "(netcdf-c 4.8.0-4.9.2, fixed in 4.9.3); values are read as that release reads them",
            )
        )

    def _array_info(self, key: str, zarray: dict, zattrs: dict) -> dict | None:
        for holder, name in ((zattrs, "_nczarr_array"), (zarray, "_nczarr_array"), (zarray, "_NCZARR_ARRAY")):
            if isinstance(holder.get(name), dict):
                return holder[name]
        if self.dataset.dialect is Dialect.NCZARR_OBJECTS:
            return self.source.get(key + "/.nczarray") or self.source.get(key + "/.nczvar")
        return None

    def _referenced_dims(self, group: Group, info: dict, layout: ArrayLayout, key: str):
        refs = info.get("dimension_references", info.get("dimrefs", []))
        scalar = "scalar" in info or info.get("storage") == "scalar"
        if scalar:
            return (), True
        if not isinstance(refs, list) or len(refs) != len(layout.shape):
            raise FormatError(
                f"array {key!r}: dimension references {refs!r} do not match shape {layout.shape}"
            )
        dims = []
        for ref, size in zip(refs, layout.shape, strict=True):
            dim = self.dimensions_by_path.get(ref) if isinstance(ref, str) else None
            if dim is None and isinstance(ref, str):
                dim = group.find_dimension(ref)  # spelled unusually (e.g. without the leading "/")
            if dim is None:
                raise FormatError(f"array {key!r} refers to dimension {ref!r}, which is not defined")
            if dim.size != size and not dim.unlimited:
                raise FormatError(f"array {key!r}: dimension {ref!r} has size {dim.size}, the array {size}")
            dims.append(dim)
        return dims, False

    def _pure_dims(self, group: Group, zattrs: dict, layout: ArrayLayout, key: str):
        names = zattrs.get("_ARRAY_DIMENSIONS") if self.xarray else None
        if not layout.shape:
            if names:
                raise FormatError(f"array {key!r} has shape [] but _ARRAY_DIMENSIONS {names!r}")
            return (), True
        if (
            isinstance(names, list)
            and len(names) == len(layout.shape)
            and all(isinstance(n, str) for n in names)
        ):
            dims = [self._named_dim(group, n, size) for n, size in zip(names, layout.shape, strict=True)]
            if None not in dims:
                return dims, False
        return [self._anonymous(size) for size in layout.shape], False

    def _anonymous(self, size: int) -> Dimension:
        root = self.dataset
        name = ANONYMOUS.format(size)
        return root.dimensions.setdefault(name, Dimension(name, size, not size, root))

    def dimension(self, group: Group, name: str | None, size: int) -> Dimension:
        """The named dimension (anonymous when unnamed or when the name has another size in ``group``)."""
        found = self._named_dim(group, name, size) if name is not None else None
        return found if found is not None else self._anonymous(size)

    @staticmethod
    def _named_dim(group: Group, name: str, size: int) -> Dimension | None:
        dim = group.dimensions.get(name)
        if dim is None:
            dim = group.dimensions[name] = Dimension(name, size, not size, group)
        return dim if dim.size == size else None


def parse_layout(zarray: dict, pure: bool, key: str, exact: Callable[[], dict] | None = None) -> ArrayLayout:
    """The array's layout; ``exact()`` is ``zarray`` with its numbers' source text, for codecs that hold
    floats (``-s`` shows them as JSON text) when ``zarray`` was parsed with plain floats."""
    if zarray.get("zarr_format", 2) != 2:
        raise FormatError(f"array {key!r}: zarr_format {zarray.get('zarr_format')!r} is not 2")
    dtype = parse_dtype(zarray.get("dtype"), pure, f"array {key!r}")
    shape, chunks = zarray.get("shape"), zarray.get("chunks")
    if not _int_list(shape) or not _int_list(chunks) or len(shape) != len(chunks) or 0 in chunks:
        raise FormatError(f"array {key!r}: bad shape {shape!r} / chunks {chunks!r}")
    check_rank(shape, key)
    separator = zarray.get("dimension_separator", ".")
    order = zarray.get("order", "C")
    if separator not in (".", "/") or order not in ("C", "F"):
        raise FormatError(f"array {key!r}: bad dimension_separator {separator!r} or order {order!r}")
    filters, compressor = zarray.get("filters") or [], zarray.get("compressor")
    if not isinstance(filters, list) or not all(isinstance(f, dict) and "id" in f for f in filters):
        raise FormatError(f"array {key!r}: filters must be a list of codec objects, not {filters!r}")
    if compressor is not None and not (isinstance(compressor, dict) and "id" in compressor):
        raise FormatError(f"array {key!r}: compressor must be a codec object or null, not {compressor!r}")
    with_floats = exact is not None and (filters or compressor) and holds_plain_float([filters, compressor])
    exact_zarray = exact() if with_floats else None
    if exact_zarray is not None:
        filters, compressor = exact_zarray.get("filters") or [], exact_zarray.get("compressor")
    check_codecs([*filters, *([compressor] if compressor else [])], f"array {key!r}")
    codecs = CodecChain(list(filters), compressor, dtype.itemsize)
    fill = parse_fill(zarray.get("fill_value"), dtype.nctype, key, base64_text=pure)
    return ArrayLayout(tuple(shape), tuple(chunks), dtype, fill, codecs, separator, order)


def _copied(layout: ArrayLayout) -> ArrayLayout:
    """A new layout as :func:`parse_layout` made ``layout`` (nothing shared that a variable may change)."""
    codecs = layout.codecs
    compressor = dict(codecs.compressor) if codecs.compressor is not None else None
    return ArrayLayout(
        layout.shape,
        layout.chunks,
        layout.dtype,
        layout.fill,
        CodecChain([dict(f) for f in codecs.filters], compressor, codecs.itemsize),
        layout.separator,
        layout.order,
    )


def parse_fill(value: object, nctype: NCType, key: str, base64_text: bool = True) -> object:
    """The ``fill_value`` of an array of type ``nctype``. Text: netcdf-c writes NCZarr's as the text itself;
    pure Zarr's is base64 (Zarr v2, zarr-python), unless it is not (netcdf-c's pure Zarr: taken as text)."""
    if value is None:
        return None
    if nctype.is_text:
        import base64
        import binascii

        text = value if isinstance(value, str) else ""
        try:
            if not base64_text:
                raise ValueError("NCZarr's fill text")
            raw = base64.b64decode(text, validate=True) if text else b""
        except (binascii.Error, ValueError):
            raw = text.encode("utf-8", "surrogateescape")
        return raw[:1] or b"\x00" if nctype is CHAR else raw.split(b"\x00", 1)[0].decode("utf-8", "replace")
    number = convert_value(value, nctype, f"fill_value of {key!r}")  # checked now, a numpy scalar later
    return PendingFill(functools.partial(nctype.numpy.type, number))  # picklable: parsed elsewhere


def read_attributes(
    target: Attributes,
    zattrs: dict,
    types: dict,
    var_type: NCType | None,
    pure: bool,
    exact: Callable[[str], object] | None = None,
) -> None:
    """``exact(name)``: the attribute's value with its numbers' source text, when ``zattrs`` was parsed
    with plain floats (a value shown as JSON text is printed as it was written)."""
    loaded = {}
    for name, value in zattrs.items():
        if is_hidden(name):
            continue
        declared = types.get(name)
        nctype = _declared_type(declared, pure) if isinstance(declared, str) else None
        if nctype is None and name == "_FillValue" and var_type is not None:
            nctype = var_type
        if nctype is None and name not in types:
            nctype = infer_json_type(value)
        loaded[name] = make_attribute(name, value, nctype, exact)
    target.load(loaded)


@functools.lru_cache(maxsize=256)
def _declared_type(declared: str, pure: bool) -> NCType | None:
    if declared == "|J0":
        return None
    if declared.isdigit():
        return BY_CODE.get(int(declared))
    try:
        return parse_dtype(declared, pure).nctype
    except FormatError:
        return None


def make_attribute(
    name: str, value: object, nctype: NCType | None, exact: Callable[[str], object] | None = None
) -> Attribute:
    """The attribute a JSON value stands for; a value that is not of the declared type is kept as text
    (``exact(name)``: the value with its numbers' source text, when ``value`` has plain floats)."""
    if nctype is None or nctype is CHAR:
        if isinstance(value, str):
            return Attribute(name, CHAR, value)
        return Attribute(name, CHAR, netcdf_text(_with_text(name, value, exact)))
    if nctype is STRING:
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in values):
            value = _with_text(name, value, exact)
            values = value if isinstance(value, list) else [value]
        return Attribute(name, STRING, [v if isinstance(v, str) else netcdf_text(v) for v in values])
    if type(value) is float and nctype.letter[:1] == "f":  # the common case: one number, as convert_value
        return Attribute(name, nctype, numbers=[to_float32(value) if nctype is FLOAT else value])
    values = value if isinstance(value, list) else [value]
    try:
        converted = [convert_value(v, nctype, name) for v in values]
    except FormatError:
        return Attribute(name, CHAR, netcdf_text(_with_text(name, value, exact)))
    if nctype is FLOAT:
        converted = [to_float32(v) for v in converted]
    return Attribute(name, nctype, numbers=converted)


def _with_text(name: str, value: object, exact: Callable[[str], object] | None) -> object:
    """``value`` as written: numbers keep their source text (for showing it as JSON text)."""
    if exact is None or not holds_plain_float(value):
        return value
    found = exact(name)
    return value if found is _NOT_KEPT else found


_NOT_KEPT = object()  # no text kept for the attribute: shown as parsed


def _names(info: dict, keys: tuple[str, ...], where: str) -> list[str]:
    for key in keys:
        if key in info:
            names = info[key]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise FormatError(f"group {where!r}: {key} must be a list of names, not {names!r}")
            return names
    return []


def _int_list(value: object) -> bool:
    """A list of sizes numpy can index (netCDF's are size_t, but nothing past 2**63 can be read); JSON's
    ``true`` is no size, though Python's bool is an int."""
    return isinstance(value, list) and all(type(v) is int and 0 <= v < 2**63 for v in value)


def _join(key: str, name: str) -> str:
    return key.rstrip("/") + "/" + name
