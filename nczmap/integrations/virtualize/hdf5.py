"""netCDF-4/HDF5 sources: the netCDF model as netCDF-C presents it, read with h5py, and HDF5's chunk index.

Groups, dimensions with their netCDF ids, typed attributes, fill values, netCDF-C's hidden attributes left
out, dimensions of any group resolved through ``DIMENSION_LIST``. Storage: chunked datasets are their
chunks (HDF5 filters become the numcodecs chain that decodes the same bytes: deflate -> ``zlib``, shuffle
-> ``shuffle``, fletcher32 -> ``fletcher32``, and netcdf-c's plugins zstd (32015) -> ``zstd``, bzip2 (307)
-> ``bz2``, blosc (32001) -> ``blosc``); contiguous data is one byte range; compact data, NC_STRING
(variable-length strings live in HDF5's global heap, not in byte ranges) and datasets whose bytes cannot
be referenced (filters numcodecs cannot undo, chunks whose filter mask skips a filter, virtual or external
storage) are read as values, to be stored in the manifest. User-defined types (compound, enum, opaque,
vlen) are refused: NCZarr cannot hold them.

What netCDF-C makes of HDF5 that no netCDF library wrote (h5py's, HDF-EOS5's, ICESat-2's files): a
fixed-length string of more than one byte is NC_STRING (its values loaded, each up to its first NUL), of
one byte NC_CHAR; a fixed-length string attribute is char text when scalar (all its bytes, padding
included), else NC_STRING. Soft links are followed (a link to a dataset is a variable of the link's name,
its chunks referenced; to a group, a group), external links too, into the file they name beside the
source: their data is loaded (a manifest refers only into the files virtualized and records only those),
up to :data:`LINKED_BYTES`. A link that leads nowhere, or to a group containing it, is refused by name
(netCDF-C cannot open such a file, or never ends). An axis with no dimension scale attached (or one not
a dimension of its group or a group above) gets a ``phony_dim_N`` as in a plain dataset, and so does every
axis of a dataset with no scale on its first (netCDF-C then takes it for a plain dataset).

A local file is read by h5py directly. A remote one is parsed in rounds (:mod:`.hdf5_prefetch`): h5py
reads only bytes already held, a part of the walk that misses bytes is passed over (``_Tolerant``) so
that one round finds every range missing at its level, those are fetched together with h5py's
process-wide lock released, and the walk starts again; the first round that misses nothing gives the
model, exactly as the direct parse would.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Callable

import numpy as np

from nczmap.errors import FormatError, NCZError, StorageError
from nczmap.format import Attribute, Dimension, Group
from nczmap.format.types import CHAR, STRING, ParsedDtype, type_of_numpy
from nczmap.format.variable import check_plausible
from nczmap.integrations.virtualize.hdf5_guard import SIGNATURE as HDF5_SIGNATURE
from nczmap.integrations.virtualize.hdf5_guard import GuardedFile
from nczmap.integrations.virtualize.hdf5_prefetch import Exhausted, HeldFile, Missing, Rounds
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
from nczmap.integrations.virtualize.sources import LocalFile, SourceFile

# Attributes netCDF-C keeps for itself (never visible through the netCDF API).
HIDDEN_ATTRIBUTES = frozenset(
    {
        "CLASS",
        "NAME",
        "REFERENCE_LIST",
        "DIMENSION_LIST",
        "_Netcdf4Dimid",
        "_Netcdf4Coordinates",
        "_nc3_strict",
        "_NCProperties",
    }
)
DIMENSION_ONLY = b"This is a netCDF dimension but not a netCDF variable"
NON_COORD_PREFIX = "_nc4_non_coord_"
FORMAT = "netCDF-4/HDF5"  # how messages name the format
BLOSC_NAMES = {0: "blosclz", 1: "lz4", 2: "lz4hc", 3: "snappy", 4: "zlib", 5: "zstd"}


def sniff(read: Callable[[int, int], bytes], size: int) -> bool:
    """The HDF5 signature at 0 or, after a user block, at 512, 1024, 2048... (where HDF5 looks)."""
    at = 0
    while at + 8 <= size:
        if read(at, 8) == HDF5_SIGNATURE:
            return True
        at = 512 if at == 0 else at * 2
    return False


EAGER_BYTES = 64 << 10  # variables this small have their values read while parsing (coordinates, mostly)
LINKED_BYTES = 16 << 20  # an external link's data this large at most is loaded (from the other file)
LINK_HOPS = 16  # links followed in a row at most, as HDF5 does (H5L_NUM_LINKS): past it, a loop


def parse(file: SourceFile, options: ParseOptions) -> ParsedFile:
    """The netCDF model of a netCDF-4/HDF5 file. h5py's handle is closed before returning (many open
    HDF5 files make every close slower): small variables' values are read now, larger ones by opening
    the file again if they are loaded. A remote file is parsed in rounds (:func:`parse_remote`)."""
    if isinstance(file, LocalFile):
        return parse_direct(file, options)
    return parse_remote(file, options)


def _h5py():
    try:
        import h5py
    except ImportError as exc:
        from nczmap.errors import DriverNotAvailable

        raise DriverNotAvailable(
            "virtualizing netCDF-4/HDF5 files needs h5py: pip install 'nczmap[virtual]'"
        ) from exc
    return h5py


def parse_direct(file: SourceFile, options: ParseOptions) -> ParsedFile:
    """The model read through h5py reading the source itself (a local file: no read waits long)."""
    opener = _Opener(file, _h5py())
    try:
        parsed = _read_tree(opener, file, _STRICT)
        _read_small_values(parsed, _STRICT)
    except Exception as exc:
        _raise_failure(file, exc)
    finally:
        opener.close()
    parsed.closers.append(opener.close)
    return parsed


def check_file(path: str) -> None:
    """Raise the error a parse of the local HDF5 file at ``path`` would meet (a FormatError naming the file
    and the object, for damage): its groups, variables, attributes and chunk indexes read as a parse
    reads them, behind the guard against damage HDF5 cannot survive, and nothing kept. What reads such a
    file with another HDF5 reader (netCDF4-python) asks this first."""
    file = LocalFile(os.path.realpath(path), path)
    try:
        parse_direct(file, ParseOptions()).close()
    finally:
        file.close()


def parse_remote(file: SourceFile, options: ParseOptions, rounds: Rounds | None = None) -> ParsedFile:
    """The model read in rounds (:mod:`.hdf5_prefetch`): h5py reads only bytes already held, every range
    a round misses is fetched at once with h5py's lock released, and the file parsed again, until a
    round misses nothing; past the rounds' bounds, read as :func:`parse_direct` does."""
    h5py = _h5py()
    rounds = rounds or Rounds(file)

    def attempt(fileobj: HeldFile) -> ParsedFile:
        opener = _Opener(file, h5py, fileobj)
        tolerant = _Tolerant(fileobj)
        try:
            parsed = _read_tree(opener, file, tolerant)
            _read_small_values(parsed, tolerant)
        except BaseException:
            with contextlib.suppress(Exception):  # the round's own failure is what matters
                opener.close()
            raise
        opener.close()
        opener.fileobj = None  # values read later come through the source itself
        parsed.closers.append(opener.close)
        return parsed

    try:
        return rounds.run(attempt, ParsedFile.close, functools.partial(_probe, h5py))
    except Exhausted:
        return parse_direct(file, options)
    except Exception as exc:
        _raise_failure(file, exc)


def _probe(h5py, fileobj: HeldFile) -> None:
    """The first rounds of a remote parse: the walk most of a parse's reads depend on (groups, objects,
    attribute lists, chunk indexes), the bytes of small variables' values asked for (``want``), no
    model built (through h5py's low-level API: a third of a parse's time), so that a file's missing
    metadata is found before its first full parse. Whatever fails is passed over (what it missed is
    recorded)."""
    with h5py.File(fileobj, "r") as root:
        _probe_group(h5py, root.id, fileobj)


def _probe_attributes(h5py, item) -> None:
    """Attribute lists (dense ones are in heaps elsewhere) and the values of variable-length ones (in
    the global heap, wherever it was written)."""
    names: list[bytes] = []
    with contextlib.suppress(Exception):
        h5py.h5a.iterate(item, names.append)
    for name in names:
        with contextlib.suppress(Exception):
            attribute = h5py.h5a.open(item, name)
            kind = attribute.get_type()
            if kind.get_class() == h5py.h5t.VLEN or (
                kind.get_class() == h5py.h5t.STRING and kind.is_variable_str()
            ):
                attribute.read(np.empty(attribute.shape, dtype=attribute.dtype))


def _probe_group(h5py, group, fileobj: HeldFile) -> None:
    names: list[bytes] = []
    _probe_attributes(h5py, group)
    with contextlib.suppress(Exception):
        group.links.iterate(names.append)
    for name in names:
        with contextlib.suppress(Exception):
            if group.links.get_info(name).type != h5py.h5l.TYPE_HARD:
                continue
            item = h5py.h5o.open(group, name)
            if isinstance(item, h5py.h5g.GroupID):
                _probe_group(h5py, item, fileobj)
            elif isinstance(item, h5py.h5d.DatasetID):
                _probe_dataset(h5py, item, fileobj)


def _probe_dataset(h5py, dataset, fileobj: HeldFile) -> None:
    _probe_attributes(h5py, dataset)
    layout = dataset.get_create_plist().get_layout()
    shape = dataset.shape or ()
    small = math.prod(shape) * dataset.dtype.itemsize <= EAGER_BYTES  # read while parsing
    if layout == h5py.h5d.CONTIGUOUS and small:
        offset = dataset.get_offset()
        if offset is not None:
            fileobj.want(offset, dataset.get_storage_size())
    elif layout == h5py.h5d.CHUNKED and 0 not in shape:

        def visit(info) -> None:  # a small variable's chunks, unless one is large (HDF5 reads a part)
            if small and info.size <= EAGER_BYTES:
                fileobj.want(info.byte_offset, info.size)

        if hasattr(dataset, "chunk_iter"):
            dataset.chunk_iter(visit)
        else:  # HDF5 before 1.12.3: the index read through its count, chunk by chunk if small
            count = dataset.get_num_chunks()
            for index in range(count if small else 0):
                visit(dataset.get_chunk_info(index))


H5PY_ERRORS = (OSError, KeyError, RuntimeError, ValueError)  # what h5py raises for a file it cannot read


def _raise_failure(file: SourceFile, exc: Exception, what: str = ""):
    """Raise what a failed parse raises: nczmap's own errors as they are (and a round's miss, and running
    out of memory), the source's read error behind an h5py error, else a FormatError naming the file and
    ``what`` was being read: whatever h5py raises for damaged bytes (its own errors, and the TypeErrors
    and the like its conversions meet)."""
    if isinstance(exc, NCZError | Missing | MemoryError):
        raise exc
    if file.error is not None:
        raise file.error from None
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    if not isinstance(exc, H5PY_ERRORS):
        text = f"{type(exc).__name__}: {text}"
    where = f" ({what})" if what else ""
    raise FormatError(f"cannot read {file.name} as netCDF-4/HDF5{where}: {text}") from exc


@contextlib.contextmanager
def _reading(file: SourceFile, what: str):
    """A failure while ``what`` (a group's members, a variable, an attribute) is read: a FormatError
    naming the file and it (:func:`_raise_failure`)."""
    try:
        yield
    except Exception as exc:
        _raise_failure(file, exc, what)


def _utf8(file: SourceFile, name: str | bytes, what: str) -> str:
    """A name as h5py gives it (bytes when it is not UTF-8, which netCDF names always are): the text."""
    if isinstance(name, bytes):
        raise FormatError(
            f"cannot read {file.name} as netCDF-4/HDF5: the name of {what} is not UTF-8: {name[:64]!r}"
        )
    return name


class _Tolerant:
    """In a round of a remote parse: once a read missed, a failing part (a group's attributes, a link,
    a variable, a small variable's values) is passed over, so that the round finds what every other
    part misses too; such a round is discarded. Without a miss, nothing is passed over."""

    def __init__(self, fileobj: HeldFile | None) -> None:
        self.fileobj = fileobj

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        return self.fileobj is not None and isinstance(exc, Exception) and bool(self.fileobj.misses)


_STRICT = _Tolerant(None)


class _Unfollowed(Exception):
    """Why a soft or external link leads to nothing netCDF-C could read (a refusal's reason)."""


class _Opener:
    """The HDF5 file through h5py, opened when needed (again, after ``close``): through ``fileobj``
    while a round of a remote parse reads, a local file through a :class:`GuardedFile`, else through the
    source."""

    def __init__(self, file: SourceFile, h5py, fileobj: HeldFile | None = None) -> None:
        self.file, self.h5py, self.fileobj = file, h5py, fileobj
        self.handle = None
        self.guarded: GuardedFile | None = None
        self.linked: dict[str, _Opener] = {}  # the files external links lead to, by real path
        self.facts = None  # what reading its chunk indexes needs (hdf5_chunks.FileFacts), once known

    def __getstate__(self) -> dict:  # pickled (a parse sent from another process): not h5py's handle
        return {"file": self.file}

    def __setstate__(self, state: dict) -> None:
        import h5py

        self.file, self.h5py, self.fileobj, self.handle = state["file"], h5py, None, None
        self.guarded = None
        self.linked = {}
        self.facts = None

    def root(self):
        if self.handle is None:
            if self.fileobj is not None:
                self.fileobj.seek(0)
                self.handle = self.h5py.File(self.fileobj, "r")
            elif isinstance(self.file, LocalFile):
                self.handle = self._open_guarded()
            else:
                self.handle = self.file.open(self.h5py)
        return self.handle

    def _open_guarded(self):
        try:
            self.guarded = GuardedFile(self.file.name)
        except OSError as exc:
            raise StorageError(f"cannot read the source {self.file.name!r}: {exc.strerror or exc}") from exc
        try:
            return self.h5py.File(self.guarded, "r")
        except BaseException as exc:
            self.guarded.close()
            self.guarded = None
            if isinstance(exc, OSError) and not isinstance(exc, NCZError):
                raise FormatError(f"cannot open {self.file.name!r} as netCDF-4/HDF5: {exc}") from exc
            raise

    def values(self, name: str) -> np.ndarray:
        with _reading(self.file, f"the values of variable {name}"):
            return np.asarray(self.root()[name][()])

    def close(self) -> None:
        for linked in self.linked.values():  # kept: their values may open them again, closed with this
            linked.close()
        if self.handle is not None:
            handle, self.handle = self.handle, None
            handle.close()
        if self.guarded is not None:
            guarded, self.guarded = self.guarded, None
            guarded.close()

    def linked_file(self, name: str, beside: _Opener) -> _Opener:
        """The file an external link in ``beside``'s file names (``name``: absolute, or relative to that
        file's directory, where HDF5 looks when no prefix is set), opened as a local source is (guarded);
        this source itself when it names it. Never opened by HDF5 following the link: through a Python
        file object, HDF5 would take the linking file for the one named."""
        if not isinstance(beside.file, LocalFile):
            raise _Unfollowed("external links are followed only in local files")
        path = os.path.realpath(os.path.join(os.path.dirname(beside.file.name), name))
        if path == self.file.name:
            return self
        if path not in self.linked:
            if not os.path.isfile(path):
                raise _Unfollowed(f"the file {path} does not exist")
            self.linked[path] = _Opener(LocalFile(path, path), self.h5py)
        return self.linked[path]


def _read_small_values(parsed: ParsedFile, tolerant: _Tolerant) -> None:
    for group in parsed.root.walk():
        for variable in group.variables.values():
            storage = variable.storages[0]
            nbytes = math.prod(storage.shape) * variable.layout.dtype.storage.itemsize
            if storage.values is not None and nbytes <= EAGER_BYTES:
                with tolerant:
                    storage.values = Constant(storage.values())


def _read_tree(opener: _Opener, file: SourceFile, tolerant: _Tolerant) -> ParsedFile:
    """The netCDF model of an HDF5 file, as netCDF-C presents it."""
    reader = _TreeReader(file, opener, tolerant)
    root = Group("/", None)
    reader.read_group(opener.root()["/"], root, opener)
    reader.resolve_variables(root)
    reader.size_unlimited()
    return ParsedFile(file.name, root, reader.refused, "netcdf4")


class _TreeReader:
    def __init__(self, file: SourceFile, opener: _Opener, tolerant: _Tolerant) -> None:
        self.file = file
        self.opener = opener
        self.tolerant = tolerant
        self.source = file.name
        self.refused: list[Refusal] = []
        self.dims_by_scale: dict[tuple[int, int], list[Dimension]] = {}  # the scale's identity -> its dims
        self.dims_by_id: dict[int, Dimension] = {}
        # id(group) -> [(name, dataset, the file it lies in, the dimension it is the scale of)] in order
        self.pending: dict[int, list[tuple[str, object, _Opener, Dimension | None]]] = {}
        self.extents: dict[int, list[int]] = {}  # id(unlimited dim) -> lengths of its users
        self.dim_count = 0

    def read_group(self, h5group, group: Group, opener: _Opener, above: tuple = ()) -> None:
        """``group`` read from ``h5group`` (in ``opener``'s file; ``above``: the identities of the HDF5
        groups it was reached through, a link back to one of them refused)."""
        with self.tolerant:
            for attribute in self.attributes(h5group, group.path):
                group.attrs.load({attribute.name: attribute})
        dims: list[tuple[int | None, Dimension]] = []
        datasets: list[tuple[str, object, _Opener, Dimension | None]] = []
        children: list[tuple[str, object, _Opener]] = []
        with _reading(self.file, f"the members of group {group.path}"):
            names = [_utf8(self.file, name, f"a member of group {group.path}") for name in h5group]
        for name in names:
            with self.tolerant, _reading(self.file, f"object {_join(group.path, name)}"):
                self.read_link(h5group, name, group, opener, (dims, datasets, children))
        if dims and all(dimid is not None for dimid, _ in dims):
            dims.sort(key=lambda pair: pair[0])  # netCDF-C lists a group's dimensions by id
        for dimid, dimension in dims:
            group.dimensions[dimension.name] = dimension
            if dimid is not None:
                self.dims_by_id[dimid] = dimension
        self.pending[id(group)] = datasets
        with _reading(self.file, f"group {group.path}"):
            above = (*above, _identity(h5group))
        for name, item, linked in children:
            where = _join(group.path, name)
            with _reading(self.file, f"group {where}"):
                loop = _identity(item) in above
            if loop:
                reason = f"it leads to the HDF5 group {item.name}, which holds it: it would never end"
                self.refused.append(Refusal(where, reason, self.source))
                continue
            child = Group(name, group)
            group.groups[name] = child
            with self.tolerant:
                self.read_group(item, child, linked, above)

    def read_link(self, h5group, name: str, group: Group, opener: _Opener, found: tuple) -> None:
        """The object link ``name`` of ``h5group`` leads to, added to ``found`` (the group's dimensions,
        datasets and child groups); a link leading nowhere refused by name."""
        import h5py

        dims, datasets, children = found
        where = _join(group.path, name)
        try:
            item, opener = self.follow(h5group, name, opener, 0)
        except _Unfollowed as exc:
            self.refused.append(Refusal(where, f"it is {_describe(h5group, name)}: {exc}", self.source))
            return
        if isinstance(item, h5py.Group):
            children.append((name, item, opener))
        elif isinstance(item, h5py.Dataset):
            dimension = None
            if _is_scale(item):
                dimension = self.dimension(item, name, group)
                if dimension is not None:
                    dims.append((_int_attribute(item, "_Netcdf4Dimid"), dimension))
                if _dimension_only(item):
                    return
            datasets.append((name.removeprefix(NON_COORD_PREFIX), item, opener, dimension))
        # committed datatypes are netCDF user-defined types: variables using them are refused

    def follow(self, h5group, name: str, opener: _Opener, hops: int):
        """(the object link ``name`` of ``h5group`` leads to, the opened file it lies in): a soft link
        followed from its group or the root, an external link in the file it names (opened here, never
        through HDF5); only hard links are ever resolved by h5py. _Unfollowed when it leads nowhere."""
        import h5py

        link = h5group.get(name, getlink=True)
        if isinstance(link, h5py.HardLink):
            return h5group[name], opener
        if hops == LINK_HOPS:
            raise _Unfollowed(f"it is the {LINK_HOPS}th link in a row (a loop of links?)")
        if isinstance(link, h5py.SoftLink):
            start = h5group.file["/"] if link.path.startswith("/") else h5group
            return self.follow_path(start, link.path, opener, hops + 1)
        if isinstance(link, h5py.ExternalLink):
            target = self.opener.linked_file(link.filename, opener)
            try:
                root = target.root()["/"]
            except (NCZError, OSError) as exc:
                raise _Unfollowed(f"{target.file.name} cannot be read as HDF5 ({exc})") from None
            return self.follow_path(root, link.path, target, hops + 1)
        raise _Unfollowed("no netCDF library follows such a link")

    def follow_path(self, start, path: str, opener: _Opener, hops: int):
        """The object at ``path`` from the HDF5 group ``start``, each of its links followed in turn."""
        import h5py

        item = start
        for part in [p for p in path.split("/") if p and p != "."]:
            if not isinstance(item, h5py.Group) or item.get(part, getlink=True) is None:
                raise _Unfollowed(f"there is no object {path}")
            item, opener = self.follow(item, part, opener, hops)
        return item, opener

    def dimension(self, dataset, name: str, group: Group) -> Dimension | None:
        if not dataset.shape:
            return None
        self.dim_count += 1
        unlimited = dataset.maxshape[0] is None
        dimension = Dimension(name, int(dataset.shape[0]), unlimited, group)
        self.dims_by_scale.setdefault(_identity(dataset), []).append(dimension)
        if unlimited:
            self.extents[id(dimension)] = [dimension.size]
        return dimension

    def resolve_variables(self, group: Group) -> None:
        """Variables with their dimensions, child groups first (the order netCDF-C makes phony dims in)."""
        for child in group.groups.values():
            self.resolve_variables(child)
        for name, dataset, opener, scale_of in self.pending.pop(id(group), ()):
            where = _join(group.path, name)
            with self.tolerant:
                try:
                    with _reading(self.file, f"variable {where}"):
                        variable = self.variable(group, name, dataset, opener, scale_of)
                except NotVirtualizable as exc:
                    self.refused.append(Refusal(where, str(exc), self.source))
                    continue
                group.variables[name] = variable

    def variable(
        self, group: Group, name: str, dataset, opener: _Opener, scale_of: Dimension | None
    ) -> SourceVariable:
        if dataset.shape is None:
            raise NotVirtualizable("it has an empty (null) dataspace")
        dims = self.dimensions_of(dataset, group, scale_of)  # first: made even for refused types
        nctype, storage_dtype = _types(dataset)
        shape = tuple(int(n) for n in dataset.shape)
        check_plausible(shape, storage_dtype.itemsize, f"variable {_join(group.path, name)} of {self.source}")
        for dim, length in zip(dims, shape, strict=True):
            if dim.unlimited:
                self.extents[id(dim)].append(length)
        if opener is not self.opener:
            _check_linked(dataset, opener)
        if nctype is STRING:
            storage = _strings(dataset, self.file, opener)
            storage_dtype = np.dtype(f"S{max(1, _longest(storage))}")
        elif opener is not self.opener:  # another file's data: loaded
            storage = Storage(
                self.source, "values", shape, values=functools.partial(opener.values, dataset.name)
            )
        else:
            storage = _storage(dataset, self.file, storage_dtype.itemsize, self.opener)
        codecs = storage.codecs
        compressors = ("zlib", "zstd", "bz2", "blosc")
        compressor = codecs[-1] if codecs and codecs[-1]["id"] in compressors else None
        filters = codecs[:-1] if compressor else list(codecs)
        chunks = storage.chunks if storage.kind == "chunked" else tuple(max(1, n) for n in shape)
        layout = source_layout(
            shape,
            chunks,
            _parsed_dtype(nctype, storage_dtype),
            _fill(dataset, nctype),
            filters,
            compressor,
            scalar=not dims,
        )
        variable = SourceVariable(group, name, dims, layout, storage)
        for attribute in self.attributes(dataset, variable.key):
            variable.attrs.load({attribute.name: attribute})
        return variable

    def dimensions_of(self, dataset, group: Group, scale_of: Dimension | None) -> list[Dimension]:
        """The dimensions of ``dataset`` as netCDF-C gives them: the ids netCDF-C recorded (read first, as
        it does: they may name a dimension of a group that is not an ancestor), else the attached dimension
        scales, else its own dimension (a scale), else phony dimensions."""
        if not dataset.shape:
            return []
        coordinates = dataset.attrs.get("_Netcdf4Coordinates")
        if coordinates is not None:
            try:
                return [self.dims_by_id[int(dimid)] for dimid in np.atleast_1d(coordinates)]
            except KeyError as exc:
                raise NotVirtualizable(
                    f"its _Netcdf4Coordinates attribute names dimension id {exc}, which no dimension has"
                ) from None
        if "DIMENSION_LIST" in dataset.attrs:
            return self.attached_dimensions(dataset, group)
        if scale_of is not None and len(dataset.shape) == 1:
            return [scale_of]
        return self.phony_dimensions(dataset, group, [None] * len(dataset.shape))

    def attached_dimensions(self, dataset, group: Group) -> list[Dimension]:
        """Each axis's dimension scale (the last attached, the one netCDF-C keeps) as the dimension made
        from it in ``group`` or the nearest group above; phony dimensions for the other axes. With no
        scale on its first axis, a dataset is a plain one to netCDF-C (it counts the scales of axis 0
        only): its other axes' scales are not looked at, every axis gets a phony dimension."""
        scales = _attached_scales(dataset)
        if scales[0] is None:
            return self.phony_dimensions(dataset, group, [None] * len(scales))
        dims: list[Dimension | None] = []
        for axis, scale in enumerate(scales):
            found = None if scale is None else self.visible_dimension(scale, group)
            length = int(dataset.shape[axis])
            if found is not None and not found.unlimited and found.size != length:
                raise NotVirtualizable(
                    f"the dimension scale {found.path} attached to its axis {axis} has {found.size} values, "
                    f"the axis {length}"
                )
            dims.append(found)
        return self.phony_dimensions(dataset, group, dims)

    def visible_dimension(self, scale: tuple[int, int], group: Group) -> Dimension | None:
        """The dimension netCDF-C matches a scale to: the first made from that object (through any link)
        in ``group``, else in the nearest group above; None for a scale not seen from there."""
        made = self.dims_by_scale.get(scale)
        node = group
        while made and node is not None:
            here = [dimension for dimension in made if dimension.group is node]
            if here:
                order = list(node.dimensions.values())
                return min(here, key=order.index)
            node = node.parent
        return None

    def phony_dimensions(self, dataset, group: Group, known: list[Dimension | None]) -> list[Dimension]:
        """The axes without a dimension in ``known`` named as netCDF-C names a plain dataset's: a
        dimension of the group of the same length (and unlimitedness) that the dataset does not use yet,
        else a new ``phony_dim_<id>``."""
        dims = list(known)
        for axis, (length, maximum) in enumerate(zip(dataset.shape, dataset.maxshape, strict=True)):
            if dims[axis] is not None:
                continue
            unlimited = maximum is None
            found = next(
                (
                    d
                    for d in group.dimensions.values()
                    if d.size == length and d.unlimited == unlimited and d not in dims
                ),
                None,
            )
            if found is None:
                found = Dimension(f"phony_dim_{self.dim_count}", int(length), unlimited, group)
                group.dimensions[found.name] = found
                self.dim_count += 1
                if unlimited:
                    self.extents[id(found)] = [found.size]
            dims[axis] = found
        return dims

    def size_unlimited(self) -> None:
        """An unlimited dimension is as long as the longest variable using it (as netCDF-C reports it)."""
        for made in self.dims_by_scale.values():
            for dimension in made:
                if dimension.unlimited:
                    dimension.size = max(self.extents.get(id(dimension), [dimension.size]))

    def attributes(self, item, where: str) -> list[Attribute]:
        found = []
        with _reading(self.file, f"the attributes of {where}"):
            names = [_utf8(self.file, name, f"an attribute of {where}") for name in item.attrs]
        for name in names:
            if name in HIDDEN_ATTRIBUTES:
                continue
            try:
                with _reading(self.file, f"attribute {name!r} of {where}"):
                    found.append(_attribute(item, name))
            except NotVirtualizable as exc:
                self.refused.append(Refusal(where, str(exc), self.source, name))
        return found


def _join(path: str, name: str) -> str:
    return path.rstrip("/") + "/" + name


def _is_scale(dataset) -> bool:
    """Whether ``dataset`` is a dimension scale: its ``CLASS`` attribute says ``DIMENSION_SCALE``. Read
    here, as H5DSis_scale would (which frees memory twice for some damaged ``CLASS`` attributes)."""
    value = dataset.attrs.get("CLASS")
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    return isinstance(value, bytes) and value.rstrip(b"\x00") == b"DIMENSION_SCALE"


def _attached_scales(dataset) -> list[tuple[int, int] | None]:
    """The identity of the dimension scale netCDF-C takes for each axis of ``dataset`` (the last one its
    ``DIMENSION_LIST`` attaches there, as H5DSiterate_scales leaves it), None for an axis with none: the
    list (object references an axis) read and followed here, as HDF5's own H5DS functions would (which
    crash on some damaged lists); a list that is not one entry an axis is damage."""
    root = dataset.file
    lists = np.asarray(dataset.attrs["DIMENSION_LIST"], dtype=object).ravel()
    if len(lists) != len(dataset.shape):
        raise ValueError(f"its DIMENSION_LIST has {len(lists)} entries for {len(dataset.shape)} axes")
    scales = []
    for refs in lists:
        attached = [ref for ref in np.atleast_1d(refs).ravel() if ref]
        scales.append(_identity(root[attached[-1]]) if attached else None)
    return scales


def _identity(item) -> tuple[int, int]:
    """What tells HDF5 objects apart, however they are reached (netCDF-C matches scales by it): the file
    (as HDF5 numbers open files) and the object's address there."""
    from h5py import h5o

    return item.id.fileno, h5o.get_info(item.id).addr


def _describe(h5group, name: str) -> str:
    """The link ``name`` of ``h5group`` as a refusal names it."""
    import h5py

    link = h5group.get(name, getlink=True)
    if isinstance(link, h5py.SoftLink):
        return f"a soft link to {link.path}"
    if isinstance(link, h5py.ExternalLink):
        return f"an external link to {link.path} in {link.filename}"
    return f"an HDF5 {type(link).__name__}"


def _check_linked(dataset, opener: _Opener) -> None:
    """NotVirtualizable for data of another file (an external link's) too large to load."""
    nbytes = math.prod(int(n) for n in dataset.shape) * dataset.id.get_type().get_size()
    if nbytes > LINKED_BYTES:
        raise NotVirtualizable(
            f"its data ({nbytes} bytes) lies in {opener.file.name}, reached through an external link: "
            f"data of another file is loaded up to {LINKED_BYTES} bytes (a manifest refers only into "
            "the files virtualized)"
        )


def _c_string(raw: bytes) -> str:
    """A fixed-length string value as netCDF-C hands it out: up to its first NUL (padding spaces kept),
    bytes that are not UTF-8 kept as surrogate escapes."""
    return raw.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def _dimension_only(dataset) -> bool:
    """A dataset netCDF-C made only to hold a dimension (no variable of that name)."""
    name = dataset.attrs.get("NAME")
    if isinstance(name, str):
        name = name.encode("utf-8", "surrogateescape")
    return isinstance(name, bytes) and name.startswith(DIMENSION_ONLY)


def _int_attribute(item, name: str) -> int | None:
    value = item.attrs.get(name)
    return None if value is None else int(np.asarray(value).ravel()[0])


def _types(dataset):
    """(netCDF type, storage dtype) of a dataset; NotVirtualizable for what NCZarr cannot hold."""
    from h5py import h5t

    kind = dataset.id.get_type()
    cls = kind.get_class()
    names = {
        h5t.COMPOUND: "a user-defined compound type",
        h5t.ENUM: "a user-defined enum type",
        h5t.OPAQUE: "a user-defined opaque type",
        h5t.VLEN: "a user-defined variable-length (vlen) type",
        h5t.ARRAY: "an HDF5 array type",
        h5t.REFERENCE: "HDF5 object references",
        h5t.BITFIELD: "an HDF5 bitfield type",
        getattr(h5t, "COMPLEX", -1): "a complex type",
    }
    if cls in names:
        raise NotVirtualizable(f"its type is {names[cls]}, which NCZarr cannot hold")
    if cls == h5t.STRING:
        if kind.is_variable_str():
            return STRING, np.dtype(object)  # the width is the longest value's, once read
        if kind.get_size() != 1:
            return STRING, np.dtype(object)  # netCDF-C reads longer fixed-length strings as NC_STRING
        return CHAR, np.dtype("S1")
    dtype = np.dtype(dataset.dtype)
    if cls == h5t.INTEGER:
        plain = kind.get_precision() == 8 * kind.get_size() and kind.get_offset() == 0
    elif cls == h5t.FLOAT:
        plain = any(kind.equal(t) for t in (h5t.IEEE_F32LE, h5t.IEEE_F32BE, h5t.IEEE_F64LE, h5t.IEEE_F64BE))
    else:
        raise NotVirtualizable(f"its HDF5 type class {cls} has no netCDF type")
    if not plain or dtype.itemsize != kind.get_size():
        raise NotVirtualizable(
            f"its HDF5 type ({dtype}, {kind.get_size()} bytes) is not a netCDF number type"
        )
    try:
        return type_of_numpy(dtype), dtype
    except FormatError:
        raise NotVirtualizable(f"its type {dtype} has no netCDF type") from None


def _attribute(item, name: str) -> Attribute:
    from h5py import h5a, h5s, h5t

    attr = h5a.open(item.id, name.encode("utf-8", "surrogateescape"))
    kind = attr.get_type()
    cls = kind.get_class()
    null = attr.get_space().get_simple_extent_type() == h5s.NULL
    if cls == h5t.STRING and kind.is_variable_str():
        values = [] if null else np.asarray(item.attrs[name], dtype=object).ravel().tolist()
        text = [v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else (v or "") for v in values]
        return Attribute(name, STRING, text)
    if cls == h5t.STRING:
        if null:
            return Attribute(name, CHAR, "")
        raw = np.empty(attr.shape, dtype=attr.dtype)
        attr.read(raw, mtype=kind)  # its own padding (h5py's default type would strip spaces)
        if attr.shape:  # an array of fixed-length strings: NC_STRING for netCDF-C, each value a C string
            return Attribute(name, STRING, [_c_string(value) for value in raw.ravel().tolist()])
        data = raw.tobytes()
        if data == b"\x00" and not attr.shape:
            data = b""  # netCDF-C stores an empty char attribute as one NUL
        return Attribute(name, CHAR, data.decode("utf-8", "surrogateescape"))
    if cls not in (h5t.INTEGER, h5t.FLOAT):
        raise NotVirtualizable(f"its HDF5 type class {cls} is a user-defined or non-netCDF type")
    dtype = np.dtype(attr.dtype)
    try:
        nctype = type_of_numpy(dtype)
    except FormatError:
        raise NotVirtualizable(f"its type {dtype} has no netCDF type") from None
    if null:
        return Attribute(name, nctype, np.zeros(0, dtype=nctype.numpy))
    raw = np.empty(attr.shape, dtype=dtype)
    attr.read(raw)
    return Attribute(name, nctype, raw.ravel().astype(nctype.numpy))


def _fill(dataset, nctype) -> object:
    """What HDF5 gives for never-written data: the fill value, or None for no fill (netCDF's NoFill)."""
    from h5py import h5d

    plist = dataset.id.get_create_plist()
    if plist.get_fill_time() == h5d.FILL_TIME_NEVER or plist.fill_value_defined() == h5d.FILL_VALUE_UNDEFINED:
        return None
    value = dataset.fillvalue
    if nctype is CHAR:
        return bytes(np.asarray(value, dtype="S1").tobytes()[:1]) or b"\x00"
    return np.asarray(value).astype(nctype.numpy)[()]


def _parsed_dtype(nctype, storage_dtype: np.dtype) -> ParsedDtype:
    if nctype is STRING:
        return ParsedDtype(STRING, storage_dtype, False, storage_dtype.itemsize)
    return native_dtype(nctype, storage_dtype)


def _strings(dataset, file: SourceFile, opener: _Opener) -> Storage:
    """NC_STRING data: values only (HDF5 keeps each string in its global heap), read once."""
    shape = tuple(int(n) for n in dataset.shape)
    return Storage(file.name, "values", shape, values=_Strings(opener, dataset.name, shape))


class _Strings:
    """An NC_STRING variable's values, read when first asked for (picklable: by its name)."""

    def __init__(self, opener: _Opener, name: str, shape: tuple[int, ...]) -> None:
        self.opener, self.name, self.shape = opener, name, shape
        self.text: np.ndarray | None = None

    def __call__(self) -> np.ndarray:
        if self.text is None:
            with _reading(self.opener.file, f"the strings of variable {self.name}"):
                dataset = self.opener.root()[self.name]
                if dataset.id.get_type().is_variable_str():
                    text = np.asarray(dataset.asstr(errors="surrogateescape")[()], dtype=object)
                else:
                    text = _fixed_strings(dataset)
                text = text.reshape(self.shape)
            text[text == None] = ""  # noqa: E711 (element-wise): netCDF-C's unwritten strings
            self.text = text
        return self.text


def _fixed_strings(dataset) -> np.ndarray:
    """A fixed-length string dataset's values as netCDF-C reads them: its bytes in its own type (h5py's
    default type would strip padding spaces), each value up to its first NUL."""
    from h5py import h5s

    kind = dataset.id.get_type()
    raw = np.empty(dataset.shape, dtype=f"S{kind.get_size()}")
    if raw.size:
        dataset.id.read(h5s.ALL, h5s.ALL, raw, mtype=kind)
    return np.asarray([_c_string(value) for value in raw.ravel().tolist()], dtype=object)


def _longest(storage: Storage) -> int:
    """The longest string's UTF-8 length in bytes (the stored width)."""
    flat = np.asarray(storage.values(), dtype=object).ravel()
    return max((len(str(v).encode("utf-8", "surrogateescape")) for v in flat), default=1)


def _storage(dataset, file: SourceFile, itemsize: int, opener: _Opener) -> Storage:
    from h5py import h5d

    source = file.name
    plist = dataset.id.get_create_plist()
    layout = plist.get_layout()
    shape = tuple(int(n) for n in dataset.shape)

    name = dataset.name
    # chunks are read as the file's bytes (file.read): read_direct_chunk gives the same, through h5py
    common = {"read": file.read, "values": functools.partial(opener.values, name)}
    if layout == getattr(h5d, "VIRTUAL", 3):
        return Storage(source, "contiguous", shape, problem="it is an HDF5 virtual dataset", **common)
    if plist.get_external_count():
        return Storage(source, "contiguous", shape, problem="its data is in external raw files", **common)
    if layout == h5d.COMPACT:
        return Storage(source, "values", shape, **common)
    if layout == h5d.CONTIGUOUS:
        storage = Storage(source, "contiguous", shape, offset=dataset.id.get_offset(), **common)
        needed = math.prod(shape) * itemsize
        if storage.offset is not None and dataset.id.get_storage_size() < needed:
            storage.problem = (
                f"its contiguous storage holds {dataset.id.get_storage_size()} of {needed} bytes"
            )
        return storage
    chunks = tuple(int(n) for n in dataset.chunks)
    storage = Storage(source, "chunked", shape, chunks, **common)
    storage.codecs, storage.problem = _codecs(plist, itemsize, math.prod(chunks) * itemsize)
    if storage.problem is None:
        storage.problem = _read_chunk_index(storage, dataset, opener)
    return storage


def _codecs(plist, itemsize: int, nbytes: int) -> tuple[list[dict], str | None]:
    """The HDF5 filter pipeline as numcodecs configs (encode order), or why it has none."""
    import numcodecs

    configs: list[dict] = []
    size: int | None = nbytes  # the buffer size each filter sees, while it is known
    for position in range(plist.get_nfilters()):
        code, _, values, name = plist.get_filter(position)
        values = tuple(int(v) for v in values)
        label = name.decode("latin-1", "replace") or f"id {code}"
        if code == 1:
            config = {"id": "zlib", "level": values[0] if values else 6}
        elif code == 2:
            element = values[0] if values else itemsize
            if size is None:
                return [], "its shuffle filter follows a compressor, which numcodecs cannot undo"
            if size % element:
                return [], (
                    f"HDF5 shuffles a {size}-byte buffer of {element}-byte elements (fletcher32's checksum "
                    "comes first), which numcodecs' shuffle cannot undo"
                )
            config = {"id": "shuffle", "elementsize": element}
        elif code == 3:
            config = {"id": "fletcher32"}
            size = None if size is None else size + 4
        elif code == 32015:
            config = {"id": "zstd", "level": values[0] if values else 3}
        elif code == 307:
            config = {"id": "bz2", "level": values[0] if values else 9}
        elif code == 32001:
            level, shuffle, compressor = (values + (0,) * 7)[4:7] if len(values) >= 5 else (5, 1, 0)
            cname = BLOSC_NAMES.get(compressor)
            if cname is None:
                return [], f"its blosc filter uses compressor {compressor}, unknown to numcodecs"
            config = {"id": "blosc", "cname": cname, "clevel": level, "shuffle": shuffle, "blocksize": 0}
        else:
            return [], f"HDF5 filter {label!r} (id {code}) has no numcodecs codec decoding it"
        if config["id"] in ("zlib", "zstd", "bz2", "blosc"):
            size = None
        try:
            numcodecs.get_codec(dict(config))
        except (ValueError, KeyError, TypeError) as exc:
            return [], f"numcodecs here cannot decode HDF5 filter {label!r}: {exc}"
        configs.append(config)
    return configs, None


def _read_chunk_index(storage: Storage, dataset, opener: _Opener) -> str | None:
    """Record every allocated chunk (corner, byte offset, size) as columns; why they cannot be referenced,
    if so. The index is read from the file's bytes (:mod:`.hdf5_chunks`) where its form is known, else
    through h5py's ``chunk_iter``."""
    if 0 in storage.shape:
        return None
    chunk_bytes = math.prod(storage.chunks) * dataset.dtype.itemsize
    columns = _direct_columns(dataset, opener, storage.shape, chunk_bytes)
    if columns is None:
        columns = _iterated_columns(dataset, len(storage.shape))
    corners, offsets, sizes, masks = columns
    storage.set_columns(corners, offsets, sizes)
    skipped = np.flatnonzero(masks)
    if len(skipped):
        at = int(skipped[0])
        return (
            f"its chunk at {tuple(corners[at].tolist())} skips filters (filter mask {int(masks[at]):#x}): "
            "one Zarr codec chain cannot decode chunks filtered differently"
        )
    return None


def _direct_columns(dataset, opener: _Opener, shape: tuple[int, ...], chunk_bytes: int):
    """The chunk index read from the file's bytes, through the file object h5py reads (in a round of a
    remote parse, a miss is recorded as h5py's are); None where h5py must be asked."""
    from nczmap.integrations.virtualize.hdf5_chunks import chunk_columns, file_facts

    h5py = opener.h5py
    fileobj = opener.fileobj
    if fileobj is not None:

        def read(offset: int, length: int) -> bytes:
            fileobj.seek(offset)
            return fileobj.read(length)

    elif opener.guarded is not None:  # no heap guard: HDF5 decodes nothing read here
        descriptor = opener.guarded.fd

        def read(offset: int, length: int) -> bytes:
            return os.pread(descriptor, length, offset)

    else:
        read = opener.file.read
    facts = opener.facts
    if facts is None:
        facts = opener.facts = file_facts(dataset.file, read, opener.file.size)
    header = _header_address(h5py, dataset)
    columns = chunk_columns(read, facts, header, shape, chunk_bytes, dataset.maxshape)
    if columns is None:
        return None
    return columns.corners, columns.offsets, columns.sizes, columns.masks


def _header_address(h5py, dataset) -> int:
    """Where the dataset's object header is. ``H5Gget_objinfo`` reads nothing for it; ``H5Oget_info``
    walks the whole chunk index to count the metadata's size (hundreds of reads of a large one)."""
    try:
        return int(h5py.h5g.get_objinfo(dataset.id).objno[0])
    except (AttributeError, RuntimeError, ValueError, OSError):
        return int(h5py.h5o.get_info(dataset.id).addr)


def _iterated_columns(dataset, rank: int):
    """The chunk index through h5py (one Python call a chunk: extensible arrays, version-2 B-trees)."""
    dataset_id = dataset.id
    found: list = []
    try:
        dataset_id.chunk_iter(found.append)
    except (AttributeError, RuntimeError, ValueError, OSError):  # chunk_iter needs HDF5 1.14
        found = [dataset_id.get_chunk_info(index) for index in range(dataset_id.get_num_chunks())]
    count = len(found)
    corners = np.fromiter(
        (n for info in found for n in info.chunk_offset), dtype=np.int64, count=count * rank
    ).reshape(count, rank)
    offsets = np.fromiter((info.byte_offset for info in found), dtype=np.int64, count=count)
    sizes = np.fromiter((info.size for info in found), dtype=np.int64, count=count)
    masks = np.fromiter((info.filter_mask for info in found), dtype=np.uint32, count=count)
    return corners, offsets, sizes, masks
