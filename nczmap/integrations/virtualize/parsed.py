"""What a parser yields: the netCDF model of one source file and, per variable, where its data is.

Every source format (netCDF-4/HDF5, netCDF-3, TIFF) is one parser module with two functions:

- ``sniff(read, size) -> bool``: whether the bytes (``read(offset, length)``, ``size`` bytes in all) are
  this format;
- ``parse(file, options) -> ParsedFile``: the model. ``file`` is a :class:`~.sources.SourceFile` (``name``,
  ``url``, ``size``, ``read(offset, length)``); ``options`` a :class:`ParseOptions`.

and, optionally, a fast path for collections whose files share one layout (a COG series):

- ``parse_twin(file, fingerprint, options) -> ParsedFile | None``: ``fingerprint`` is what ``parse`` left
  in :attr:`ParsedFile.fingerprint` for the first file. When ``file``'s model would be exactly the first
  file's but for where its chunks are, the result is a *twin*: ``root`` None, its storages in
  ``storages`` by variable path, its model the first file's (``like``, set by the caller). Otherwise None,
  and the file is parsed in full: the fast path never accepts what the full parse would refuse.

The model is the format layer's (:class:`~nczmap.format.Group`, :class:`~nczmap.format.Dimension`, typed
attributes) with :class:`SourceVariable` variables, each holding one :class:`Storage` per source file.
A storage is one of three kinds:

- ``chunked``: a regular grid of chunks of ``chunks`` elements, each allocated chunk a byte range
  (``corners`` / ``offsets`` / ``sizes`` flat columns; unallocated chunks are simply absent and read as
  the fill value), decoded by ``codecs`` (numcodecs configs in encode order, compressor last);
- ``contiguous``: the whole variable's raw bytes from ``offset`` (C order, the storage dtype), which the
  combiner splits into chunks of whole rows (``offset`` None: never written, every value is the fill);
- ``values``: no byte range describes the data (NC_STRING, computed coordinates, chunks the manifest
  cannot express): ``values()`` returns the whole array as the netCDF API reads it, and the data is stored
  inline or as native chunks;
- ``existing``: the data already in the virtual dataset being appended to (``values()`` reads it back);
  only the first "file" of an append, whose model is the dataset's own (format ``"existing"``).

``problem`` on a ``chunked``/``contiguous`` storage says why its bytes cannot be referenced; the variable
is then loaded through ``values()`` when the parser gives one, refused otherwise.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import threading
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from nczmap.errors import FormatError
from nczmap.format import Dimension, Group, Variable
from nczmap.format.codecs import CodecChain
from nczmap.format.types import NCType, ParsedDtype
from nczmap.format.variable import ArrayLayout


class NotVirtualizable(FormatError):
    """A variable (or a whole source) whose data cannot be described as references a manifest holds."""


@dataclass(frozen=True)
class Refusal:
    """A variable (or one attribute of a variable or group) left out of the manifest, and why."""

    variable: str  # its path in the dataset, e.g. "/g/v" (a group's path for a group attribute)
    reason: str
    source: str  # the file whose storage or type is the problem
    attribute: str | None = None  # only this attribute was left out

    def __str__(self) -> str:
        if self.attribute is not None:
            return (
                f"attribute {self.attribute!r} of {self.variable!r} in {self.source} left out: {self.reason}"
            )
        return f"variable {self.variable!r} of {self.source} not virtualized: {self.reason}"


@dataclass
class ParseOptions:
    """What the user asked for that a parser must know while reading: nothing yet (how contiguous data is
    split into references is the combiner's :class:`~.combine.CombineOptions`), kept so that a parser
    option is one field here, not a change to every parser's signature."""


SPILL_CHUNKS = 4096  # a storage of this many chunks or more has its columns spilled once parsed


class ColumnSpill:
    """A temporary file the chunk columns of parsed sources are moved to until they are written out."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="nczmap-columns-")  # noqa: SIM115 (closed by close)
        self._lock = threading.Lock()
        self._end = 0

    def put(self, *columns: array) -> list[tuple[int, int]]:
        """Each column appended to the file: its ``(offset, count)`` there."""
        places = []
        with self._lock:
            for column in columns:
                data = memoryview(column).cast("B")
                os.pwrite(self._file.fileno(), data, self._end)
                places.append((self._end, len(column)))
                self._end += len(data)
        return places

    def get(self, offset: int, count: int) -> array:
        data = os.pread(self._file.fileno(), count * 8, offset)
        if len(data) != count * 8:
            raise OSError(f"the spilled chunk columns were cut short ({len(data)} of {count * 8} bytes)")
        return array("q", data)

    def close(self) -> None:
        self._file.close()


@dataclass
class Storage:
    """Where one file keeps one variable's data."""

    source: str  # the file's name (messages and refusals): its real path or URL
    kind: str  # "chunked", "contiguous", "values" or "existing"
    shape: tuple[int, ...]
    chunks: tuple[int, ...] = ()  # chunked: the chunk shape, in elements
    codecs: list[dict] = field(default_factory=list)  # numcodecs configs, encode order
    offset: int | None = None  # contiguous: where the bytes start (None: never written)
    problem: str | None = None  # why the bytes cannot be referenced
    # chunked: every allocated chunk as flat columns (corner element per axis, byte offset, byte size)
    corners: array = field(default_factory=lambda: array("q"))
    offsets: array = field(default_factory=lambda: array("q"))
    sizes: array = field(default_factory=lambda: array("q"))
    read: Callable[[int, int], bytes] | None = None  # the source's bytes (small chunks are inlined)
    # chunked, a store's: the file or object each chunk lies in (else all in ``source``), and chunk
    # ``number``'s bytes (small chunks inlined, checksums)
    locations: list[str] | None = None
    read_chunk: Callable[[int], bytes] | None = None
    values: Callable[[], object] | None = None  # the whole array as a numpy array (loading)
    digest: str | None = None  # existing: the recorded digest of its values (see encodings.digest)

    def named(self, source: str) -> Storage:
        """A copy for the same data in another file (a twin's values computed from metadata)."""
        copy = object.__new__(Storage)
        copy.__dict__.update(self.__dict__)
        copy.source = source
        return copy

    def add_chunk(self, corner: tuple[int, ...], offset: int, size: int) -> None:
        self.corners.extend(corner)
        self.offsets.append(offset)
        self.sizes.append(size)

    def set_columns(self, corners: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> None:
        """Every allocated chunk at once: ``corners`` (one row a chunk), ``offsets`` and ``sizes``."""
        self.corners = array("q", np.ascontiguousarray(corners, dtype=np.int64).tobytes())
        self.offsets = array("q", np.ascontiguousarray(offsets, dtype=np.int64).tobytes())
        self.sizes = array("q", np.ascontiguousarray(sizes, dtype=np.int64).tobytes())

    def release_columns(self) -> None:
        """Let the chunk columns go (written out: a large collection's would otherwise be held twice)."""
        self.__dict__.pop("_spilled", None)
        self.corners, self.offsets, self.sizes = array("q"), array("q"), array("q")

    def spill(self, to: ColumnSpill) -> None:
        """Move the chunk columns to ``to`` (a temporary file) when there are many: they are read back
        when first used again (when the references are written), so that the columns of a collection
        parsed are not all held at once."""
        if "corners" not in self.__dict__ or len(self.offsets) < SPILL_CHUNKS:
            return
        self.__dict__["_spilled"] = (to, to.put(self.corners, self.offsets, self.sizes))
        del self.corners, self.offsets, self.sizes

    @property
    def spill_file(self) -> ColumnSpill | None:
        """Where the columns were spilled (None: held)."""
        spilled = self.__dict__.get("_spilled")
        return None if spilled is None else spilled[0]

    def __getattr__(self, name: str):
        spilled = self.__dict__.get("_spilled")
        if name not in ("corners", "offsets", "sizes") or spilled is None:
            raise AttributeError(name)
        to, places = self.__dict__.pop("_spilled")
        self.corners, self.offsets, self.sizes = (to.get(*place) for place in places)
        return self.__dict__[name]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if "_spilled" in state:  # sent to another process: the columns themselves
            del state["_spilled"]
            state["corners"], state["offsets"], state["sizes"] = self.corners, self.offsets, self.sizes
        return state

    def chunk_bytes(self, number: int) -> bytes:
        """The bytes of chunk ``number``."""
        if self.locations is not None:
            assert self.read_chunk is not None, "located chunks without a reader"
            return self.read_chunk(number)
        return self.read(self.offsets[number], self.sizes[number])

    @property
    def chunk_count(self) -> int:
        """How many chunks are recorded (spilled columns are not read back for it)."""
        spilled = self.__dict__.get("_spilled")
        return spilled[1][1][1] if spilled is not None else len(self.offsets)


class SourceVariable(Variable):
    """A variable read from a source file: the model plus where each source keeps its data."""

    def __init__(self, group: Group, name: str, dims, layout: ArrayLayout, storage: Storage) -> None:
        super().__init__(group, name, dims, layout)
        self.storages = [storage]
        self.shifts = [0]  # where each storage starts along the joined axis (elements, then chunks)
        self.axis: int | None = None  # the joined dimension's axis, when the variable uses it
        self.load = False  # stored as data (inline or native chunks), not references
        self.twins: list[SourceVariable] = []  # the same variable in the other files joined (in order)
        self.split = 0  # contiguous data: the axis its chunks split (chunks 1 before it, whole after)
        self.coding: str | None = None  # "retimed" or "decoded": files' encodings made to agree
        self.rewrite = False  # appending: every value written again (else only the new files' values)
        self.untyped = False  # its attributes' types are not known (read from pure Zarr: JSON numbers)
        self.source_attrs: dict | None = None  # its first file's attributes, once a join changed them
        # pure Zarr v2: its fill value is what xarray takes as its _FillValue (no attribute says so)
        self.fill_is_missing = False


@dataclass
class ParsedFile:
    """One source's netCDF model (variables are :class:`SourceVariable`) and what was left out."""

    source: str
    root: Group | None  # None for a twin: its model is ``like``'s
    refused: list[Refusal] = field(default_factory=list)
    format: str = ""  # the parser's name: "netcdf4", "netcdf3", "tiff"
    closers: list[Callable[[], None]] = field(default_factory=list)  # what ``close`` releases
    fingerprint: object = None  # what ``parse_twin`` compares other files with (picklable); None: no twins
    like: ParsedFile | None = None  # a twin's first file, whose model it shares
    storages: dict[str, Storage] = field(default_factory=dict)  # a twin's: variable path -> its storage
    notes: list[str] = field(default_factory=list)  # what the result should say of this source

    @property
    def model(self) -> Group:
        """The root of this file's model (a twin's is its first file's)."""
        if self.root is not None:
            return self.root
        assert self.like is not None and self.like.root is not None, "a twin bound to no parsed file"
        return self.like.root

    def spill(self, to: ColumnSpill) -> None:
        """Every storage's chunk columns spilled to ``to`` (see :meth:`Storage.spill`)."""
        for storage in self.all_storages():
            storage.spill(to)

    def all_storages(self) -> list[Storage]:
        if self.root is None:
            return list(self.storages.values())
        found = []
        for group in self.root.walk():
            for variable in group.variables.values():
                found.extend(getattr(variable, "storages", ()))
        return found

    def close(self) -> None:
        """Release what the parser keeps open for reading values and small chunks later."""
        while self.closers:
            self.closers.pop()()


def model_of(
    dataset: Group, storage_of: Callable[[Variable, tuple[int, ...]], Storage], untyped: bool
) -> Group:
    """The model of a dataset nczmap reads (a store, or the virtual dataset appended to): its groups,
    dimensions and attributes copied, each variable a :class:`SourceVariable` of its own layout whose one
    storage is ``storage_of(variable, shape)``. ``untyped``: its attributes' types are not known."""
    root = Group("/", None)
    _copy_groups(dataset, root)
    _copy_variables(dataset, root, storage_of, untyped)
    return root


def _copy_groups(source: Group, target: Group) -> None:
    target.attrs.load({attribute.name: attribute for attribute in source.attrs.all_typed()})
    for name, dimension in source.dimensions.items():
        target.dimensions[name] = Dimension(name, dimension.size, dimension.unlimited, target)
    for name, child in source.groups.items():
        copy = target.groups[name] = Group(name, target)
        _copy_groups(child, copy)


def _copy_variables(source: Group, target: Group, storage_of, untyped: bool) -> None:
    for name, variable in source.variables.items():
        dims = [target.root.find_dimension(dim.path) for dim in variable.dims]
        storage = storage_of(variable, tuple(d.size for d in dims))
        copy = SourceVariable(target, name, dims, dataclasses.replace(variable.layout), storage)
        copy.attrs.load({attribute.name: attribute for attribute in variable.attrs.all_typed()})
        copy.untyped = untyped
        target.variables[name] = copy
    for name, child in source.groups.items():
        _copy_variables(child, target.groups[name], storage_of, untyped)


def find_group(root: Group, path: str) -> Group | None:
    """The group at ``path`` (``/g/h``) below ``root``, or None."""
    group = root
    for part in [p for p in path.strip("/").split("/") if p]:
        group = group.groups.get(part)
        if group is None:
            return None
    return group


class Constant:
    """``values`` of data known when parsing (coordinates computed from metadata): picklable, unlike a
    lambda, so a parse can run in another process."""

    def __init__(self, values: object) -> None:
        self.values = values

    def __call__(self) -> object:
        return self.values


def element_count(shape: tuple[int, ...]) -> int:
    return math.prod(shape) if shape else 1


def native_dtype(nctype: NCType, dtype: np.dtype) -> ParsedDtype:
    """``nctype`` stored as ``dtype`` (its byte order explicit unless it has none)."""
    return ParsedDtype(nctype, dtype, dtype.byteorder in "<>")


def source_layout(
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    dtype: ParsedDtype,
    fill: object = None,
    filters: list[dict] | None = None,
    compressor: dict | None = None,
    *,
    scalar: bool = False,
) -> ArrayLayout:
    """The layout of a variable read from a source file: C order, ``.`` separated keys, ``filters`` then
    ``compressor`` (numcodecs configs) over elements of ``dtype``."""
    codecs = CodecChain(list(filters or ()), compressor, dtype.storage.itemsize)
    return ArrayLayout(tuple(shape), tuple(chunks), dtype, fill, codecs, ".", "C", scalar=scalar)
