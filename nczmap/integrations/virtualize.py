"""Virtual NCZarr datasets over netCDF-4/HDF5 files: a manifest of references, no data copied.

:func:`virtualize` reads each source's netCDF model with h5py (groups, dimensions with their netCDF ids,
typed attributes, fill values, netCDF-C's hidden attributes left out, dimensions of any group resolved
through ``DIMENSION_LIST``) and its storage through HDF5's chunk index, writes the model as NCZarr
metadata through the format layer (``open_on`` on a :class:`~nczmap.zmap.manifest.ManifestMap`, with
``_copy_group`` of the copy tool), and makes every chunk key a reference ``(file, offset, length)`` to the
chunk's bytes in the source. HDF5 filters become the numcodecs chain that decodes the same bytes:
deflate -> ``zlib``, shuffle -> ``shuffle``, fletcher32 -> ``fletcher32``, and netcdf-c's plugins zstd
(32015) -> ``zstd``, bzip2 (307) -> ``bz2``, blosc (32001) -> ``blosc``.

- Contiguous data is one chunk (the whole variable) or, when large, chunks of whole rows along the first
  dimension; compact data and chunks under :data:`SMALL_CHUNK` bytes are stored in the manifest itself;
  unallocated chunks stay missing (they read as the fill value); the storage byte order is kept.
- What NCZarr cannot hold, or what is not a plain byte range, is refused variable by variable (the rest
  is still virtualized; :attr:`VirtualizeResult.refused` lists each with its reason): user-defined types
  (compound, enum, opaque, vlen), NC_STRING (kept in HDF5's global heap), filters numcodecs cannot undo
  (szip, nbit, scale-offset, any other plugin), chunks whose filter mask skips a filter.
- Several sources along one dimension (``concat``): the same groups, dimensions and variables in every
  file, that dimension growing; variables using it take their chunks from every file, shifted along it
  (its chunk size must divide every file's length but the last's), the others come from the first file.

Sources are local files or S3 objects (``s3://bucket/key.nc``, or an endpoint URL such as
``http://127.0.0.1:9000/bucket/key.nc#mode=s3``): h5py reads an object through a read-only file object
making ranged GETs (conditional on the ETag first seen) through a small block cache, so HDF5's many small
metadata reads cost a few requests; references then name ``s3://bucket/key.nc``.

Every source must lie in an authorised container of the manifest: its own directory (bucket prefix, with
the endpoint it was read from), or the ``allow`` prefixes when given; :attr:`VirtualizeResult.containers`
lists them, to pass as ``containers=`` when reading. The manifest records each source's size and
modification time (an object's size and ETag), so reading through it after a source changed is an error.
"""

from __future__ import annotations

import io
import math
import os
import posixpath
import warnings
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nczmap.api import format_options
from nczmap.errors import (
    AccessDenied,
    DatasetExists,
    DriverNotAvailable,
    FormatError,
    NCZError,
    StorageError,
    URLError,
)
from nczmap.format import Attribute, Dataset, Dimension, Group, Variable, open_on
from nczmap.format.codecs import CodecChain
from nczmap.format.types import CHAR, STRING, ParsedDtype, type_of_numpy
from nczmap.format.variable import ArrayLayout
from nczmap.format.writer import TARGET_CHUNK_BYTES
from nczmap.integrations.copy import HDF5_SIGNATURE, _copy_group, _counterpart
from nczmap.manifest.containers import Container, as_containers, authorize, normalize
from nczmap.registry import DEFAULT_DRIVER, DRIVERS, LOCAL, S3
from nczmap.url import ParsedURL, parse_url
from nczmap.zmap import byteranges, open_map

SMALL_CHUNK = 100  # chunks smaller than this are kept in the manifest: a reference would cost more
BLOCK = 256 << 10  # an S3 source is read in aligned blocks this large (HDF5's reads are mostly far smaller)
CACHED_BLOCKS = 32  # blocks kept per S3 source (8 MiB): metadata read twice is not fetched twice
Progress = Callable[[int, int], None]

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
BLOSC_NAMES = {0: "blosclz", 1: "lz4", 2: "lz4hc", 3: "snappy", 4: "zlib", 5: "zstd"}


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


class VirtualizeWarning(UserWarning):
    """Issued once per refused variable."""


@dataclass
class VirtualizeResult:
    manifest: str  # where the manifest was written
    variables: int = 0  # variables virtualized
    references: int = 0  # chunk keys referring to source bytes
    inline: int = 0  # chunk keys holding their bytes in the manifest
    refused: list[Refusal] = field(default_factory=list)
    # where the references point, with how to read there (S3 endpoint...): ``containers=`` for readers
    containers: list[Container] = field(default_factory=list)


def virtualize(
    sources: Sequence[str | os.PathLike[str]],
    destination: str | os.PathLike[str],
    concat: str | None = None,
    allow: Sequence[str] = (),
    netcdf_version: str | None = None,
    progress: Progress | None = None,
) -> VirtualizeResult:
    """Write a manifest at ``destination`` presenting the netCDF-4/HDF5 ``sources`` as one NCZarr dataset.

    ``destination`` is a path or URL (kerchunk JSON, or kerchunk's Parquet form when it ends ``.parq``;
    ``#mode=nczarr,manifest`` is implied); ``sources`` are paths or ``file://`` URLs of local files, or
    S3 URLs (``s3://bucket/key.nc``, ``http://host:port/bucket/key.nc#mode=s3``); ``concat`` names the
    dimension (``time`` or ``/group/time``) several sources are joined along; ``allow`` lists the container
    prefixes references may point into (default: each source's directory or bucket prefix; an S3 prefix
    takes the endpoint options of the sources under it); ``netcdf_version`` is the netcdf-c release the
    metadata is written for; ``progress(done, total)`` is called as chunks are described. Refused variables
    are returned in ``refused`` (and warned about), the grants the references need in ``containers``.
    """
    files: list[_SourceFile] = []
    try:
        files = _source_files(sources)
        if len(files) > 1 and concat is None:
            raise FormatError(f"{len(files)} sources need a dimension to join them along (concat=, --concat)")
        url = _manifest_url(destination, files)
        try:
            import h5py
        except ImportError as exc:
            raise DriverNotAvailable(
                "virtualizing netCDF-4/HDF5 files needs h5py: pip install 'nczmap[virtual]'"
            ) from exc
        grants = _grants(allow, files)
        handles = []
        try:
            trees = []
            for file in files:
                handles.append(file.open(h5py))
                trees.append(_read_tree(handles[-1], file))
            plan = _plan(trees, concat)
            result = _write(plan, url, grants, netcdf_version, progress, files)
        except OSError as exc:  # h5py's error for a failed read of a file object: ours is more useful
            failed = next((f.error for f in files if f.error is not None), None)
            if failed is None or isinstance(exc, NCZError):
                raise
            raise failed from None
        finally:
            for handle in handles:
                handle.close()
    finally:
        for file in files:
            file.close()
    for refusal in result.refused:
        warnings.warn(str(refusal), VirtualizeWarning, stacklevel=2)
    return result


# ------------------------------------------------------------------------------------------ arguments
def _source_files(sources: Sequence[str | os.PathLike[str]]) -> list[_SourceFile]:
    if isinstance(sources, str | os.PathLike):
        sources = [sources]
    if not sources:
        raise FormatError("no source files to virtualize")
    files: list[_SourceFile] = []
    try:
        for source in sources:
            file = _source_file(source)
            files.append(file)
            if any(other.url == file.url for other in files[:-1]):
                raise FormatError(f"{file.shown!r} is given twice")
            if not file.is_hdf5():
                raise FormatError(
                    f"{file.shown!r} is not a netCDF-4/HDF5 file (netCDF-3 and others cannot be referenced)"
                )
    except BaseException:
        for file in files:
            file.close()
        raise
    return files


def _source_file(source: str | os.PathLike[str]) -> _SourceFile:
    text = os.fspath(source)
    if isinstance(source, os.PathLike) or "://" not in text:
        return _LocalFile(os.path.realpath(text), text)
    if text.startswith("file://"):
        return _LocalFile(normalize(text, None)[len("file://") :], text)
    try:
        url = parse_url(text)
    except URLError as exc:
        raise FormatError(f"cannot virtualize {text!r}: {exc}") from None
    if not url.on_s3 or not url.path or url.path.endswith("/"):
        raise FormatError(
            f"cannot virtualize {text!r}: sources must be local netCDF-4/HDF5 files or S3 objects"
        )
    return _ObjectFile(url)


def _grants(allow: Sequence[str], files: list[_SourceFile]) -> list[str | Container]:
    """The containers the manifest may refer into: ``allow`` (S3 prefixes with the endpoint options of the
    sources under them), else each source's own directory or bucket prefix."""
    if isinstance(allow, str):
        allow = [allow]
    if not allow:
        grants: dict[str, str | Container] = {}
        for file in files:
            grant = file.grant()
            grants.setdefault(grant if isinstance(grant, str) else grant.prefix, grant)
        return [grants[prefix] for prefix in sorted(grants)]
    found: list[str | Container] = []
    for prefix in allow:
        if "://" not in prefix:
            found.append(os.path.abspath(prefix) + "/")
            continue
        container = Container(prefix)
        under = [f for f in files if isinstance(f, _ObjectFile) and f.url.startswith(container.prefix)]
        found.append(Container(prefix, under[0].options) if under else prefix)
    return found


def _is_hdf5(read: Callable[[int, int], bytes], size: int) -> bool:
    """The HDF5 signature at 0 or, after a user block, at 512, 1024, 2048... (where HDF5 looks)."""
    at = 0
    while at + 8 <= size:
        if read(at, 8) == HDF5_SIGNATURE:
            return True
        at = 512 if at == 0 else at * 2
    return False


def _manifest_url(destination: str | os.PathLike[str], sources: list[_SourceFile]) -> ParsedURL:
    url = parse_url(destination)
    if url.driver != "manifest":
        if url.driver != DEFAULT_DRIVER[S3 if url.on_s3 else LOCAL]:
            raise FormatError(
                f"{url.original!r} names the {url.driver} driver; the destination is a manifest"
            )
        # spelled out again rather than with_modes("manifest"): that keeps "file" as the driver
        words = [w for w in url.modes if w not in DRIVERS] + ["manifest"]
        others = [f"{k}={v}" if v else k for k, v in url.fragment.items() if k != "mode"]
        url = parse_url(url.geturl().partition("#")[0] + "#" + "&".join(["mode=" + ",".join(words), *others]))
    if url.zarr:
        raise FormatError(
            f"{url.original!r}: a virtual dataset keeps its netCDF model (mode nczarr, not zarr)"
        )
    if url.on_s3:
        if any(normalize(url.location, None) == file.url for file in sources):
            raise DatasetExists(f"refusing to write the manifest over its source {url.original!r}")
        return url
    path = os.path.realpath(url.path)
    if any(file.url == "file://" + path for file in sources):
        raise DatasetExists(f"refusing to write the manifest over its source {url.original!r}")
    if os.path.isdir(path):
        raise DatasetExists(
            f"{url.original!r} is a directory; the manifest is one kerchunk JSON file (or a new .parq "
            "directory)"
        )
    if os.path.exists(path):
        try:
            with open(path, "rb") as handle:
                head = handle.read(64).lstrip()
        except OSError as exc:
            raise StorageError(f"cannot read {url.original!r}: {exc.strerror or exc}") from exc
        if head and not head.startswith(b"{"):
            raise DatasetExists(
                f"{url.original!r} exists and is not a kerchunk JSON manifest: not replacing it"
            )
    return url


def _stat(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns


# ---------------------------------------------------------------------------------------------- sources
class _SourceFile:
    """One source as virtualize reads it (h5py, a few byte ranges) and as the manifest refers to it."""

    name: str  # in messages and refusals: the real path, or s3://bucket/key
    url: str  # in references: file:///real/path or s3://bucket/key
    shown: str  # as the user gave it
    error: Exception | None = None  # why a read through h5py failed (h5py reports only an OSError)

    def is_hdf5(self) -> bool:
        raise NotImplementedError

    def open(self, h5py):
        raise NotImplementedError

    def read(self, offset: int, length: int) -> bytes:
        raise NotImplementedError

    def grant(self) -> str | Container:
        """The container it lies in by default (its directory or bucket prefix)."""
        raise NotImplementedError

    def recorded(self) -> dict:
        """What the manifest records to recognise a changed source."""
        raise NotImplementedError

    def check_unchanged(self) -> None:
        """StorageError if the source changed while it was read."""

    def close(self) -> None:
        pass


class _LocalFile(_SourceFile):
    def __init__(self, path: str, shown: str) -> None:
        self.name = path
        self.url = normalize(path, None)
        self.shown = shown
        self.stat: tuple[int, int] | None = None

    def is_hdf5(self) -> bool:
        try:
            with open(self.name, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size

                def read(offset: int, length: int) -> bytes:
                    handle.seek(offset)
                    return handle.read(length)

                found = _is_hdf5(read, size)
            self.stat = _stat(self.name)  # before h5py reads anything
        except OSError as exc:
            raise StorageError(f"cannot read the source {self.shown!r}: {exc.strerror or exc}") from exc
        return found

    def open(self, h5py):
        try:
            return h5py.File(self.name, "r")
        except OSError as exc:
            raise FormatError(f"cannot open {self.name!r} as netCDF-4/HDF5: {exc}") from exc

    def read(self, offset: int, length: int) -> bytes:
        return _read_bytes(self.name, offset, length)

    def grant(self) -> str:
        return os.path.dirname(self.name) + "/"

    def recorded(self) -> dict:
        size, mtime = self.stat
        return {"size": size, "mtime": mtime}

    def check_unchanged(self) -> None:
        if _stat(self.name) != self.stat:  # raising here abandons the manifest unwritten
            raise StorageError(f"the source {self.name} changed while it was being virtualized; run again")


class _ObjectFile(_SourceFile):
    """An S3 object: one HEAD (size, ETag), then ranged GETs conditional on that ETag."""

    def __init__(self, url: ParsedURL) -> None:
        import obstore

        self.bucket, self.key = url.bucket, url.path
        self.url = self.name = normalize(f"s3://{url.bucket}/{url.path}", None)
        self.shown = url.original
        options = {"endpoint": url.endpoint, "region": url.region, "profile": url.profile}
        self.options = {k: v for k, v in options.items() if v}
        self.store = byteranges.s3_store(
            self.bucket, endpoint=url.endpoint, region=url.region, profile=url.profile
        )
        try:
            meta = obstore.head(self.store, self.key)
        except Exception as exc:
            error = byteranges.store_error(exc, f"read the source {self.name}", self.bucket)
            raise error or StorageError(f"the source {self.name} does not exist") from exc
        self.size = int(meta["size"])
        self.etag = meta.get("e_tag")
        self.reader = _RangeReader(self)

    @property
    def error(self) -> Exception | None:
        return self.reader.error

    def is_hdf5(self) -> bool:
        return _is_hdf5(self.read, self.size)

    def open(self, h5py):
        self.reader.seek(0)
        try:
            return h5py.File(self.reader, "r")
        except OSError as exc:
            if self.reader.error is not None:
                raise self.reader.error from None
            raise FormatError(f"cannot open {self.name} as netCDF-4/HDF5: {exc}") from exc

    def read(self, offset: int, length: int) -> bytes:
        data = self.reader.pread(offset, length)
        if len(data) != length:
            raise StorageError(f"{self.name} ends before byte {offset + length}: it changed")
        return data

    def grant(self) -> Container:
        folder = posixpath.dirname(self.key)
        return Container(f"s3://{self.bucket}/{folder}/" if folder else f"s3://{self.bucket}/", self.options)

    def recorded(self) -> dict:
        found = {"size": self.size}
        if self.etag:
            found["etag"] = self.etag
        return found

    def get(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` in one GET, refused (StorageError) if the object is no longer the one
        first seen."""
        import obstore
        from obstore.exceptions import PreconditionError

        options: dict = {"range": (start, end)}
        if self.etag:
            options["if_match"] = self.etag
        try:
            data = bytes(obstore.get(self.store, self.key, options=options).bytes())
        except PreconditionError:
            raise StorageError(
                f"the source {self.name} changed while it was being virtualized (its ETag is no longer "
                f"{self.etag}); run again"
            ) from None
        except Exception as exc:
            error = byteranges.store_error(exc, f"read {self.name}", self.bucket)
            raise error or StorageError(f"the source {self.name} disappeared while it was read") from exc
        if len(data) != end - start:
            raise StorageError(f"{self.name} is shorter than the {self.size} bytes it had: it changed")
        return data

    def close(self) -> None:
        self.reader.close()


class _RangeReader(io.RawIOBase):
    """A read-only, seekable file over an S3 object for h5py: aligned blocks of :data:`BLOCK` bytes, the
    missing ones of a read fetched in one GET, the last :data:`CACHED_BLOCKS` kept; reads larger than half
    the cache go straight through. ``requests`` counts the GETs."""

    def __init__(self, source: _ObjectFile) -> None:
        super().__init__()
        self.source = source
        self.size = source.size
        self.position = 0
        self.requests = 0
        self.error: Exception | None = None
        self._blocks: OrderedDict[int, bytes] = OrderedDict()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        try:
            data = self.pread(self.position, len(view))
        except Exception as exc:
            self.error = exc  # h5py turns any exception into its own OSError
            raise
        view[: len(data)] = data
        self.position += len(data)
        return len(data)

    def pread(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        first, last = offset // BLOCK, (end - 1) // BLOCK
        if last - first >= CACHED_BLOCKS // 2:
            return self._get(offset, end)
        missing = [n for n in range(first, last + 1) if n not in self._blocks]
        if missing:
            start = missing[0] * BLOCK
            data = self._get(start, min((missing[-1] + 1) * BLOCK, self.size))
            for n in range(missing[0], missing[-1] + 1):
                self._blocks[n] = data[(n - missing[0]) * BLOCK : (n - missing[0] + 1) * BLOCK]
        parts = []
        for n in range(first, last + 1):
            self._blocks.move_to_end(n)
            parts.append(self._blocks[n])
        while len(self._blocks) > CACHED_BLOCKS:
            self._blocks.popitem(last=False)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        return data[offset - first * BLOCK : end - first * BLOCK]

    def _get(self, start: int, end: int) -> bytes:
        self.requests += 1
        return self.source.get(start, end)

    def close(self) -> None:
        self._blocks.clear()
        super().close()


# ------------------------------------------------------------------------------------ reading a source
@dataclass
class _Storage:
    """Where one file keeps one variable's data."""

    source: str  # the file's real path, or s3://bucket/key
    dataset: object  # the h5py Dataset
    kind: str  # "chunked", "contiguous", "compact" (or "virtual"/"external", refused)
    shape: tuple[int, ...]
    chunks: tuple[int, ...] = ()  # HDF5 chunk shape (chunked)
    codecs: list[dict] = field(default_factory=list)  # HDF5 filters as numcodecs configs, encode order
    offset: int | None = None  # contiguous data: where it starts (None: never written)
    problem: str | None = None
    # chunked: the allocated chunks, as flat columns (chunk_offset per axis, byte offset, size)
    corners: array = field(default_factory=lambda: array("q"))
    offsets: array = field(default_factory=lambda: array("q"))
    sizes: array = field(default_factory=lambda: array("q"))
    file: _SourceFile | None = None  # where small chunks are read from


class _SourceVariable(Variable):
    """A variable read from an HDF5 file: the model plus where each source keeps its data."""

    def __init__(self, group: Group, name: str, dims, layout: ArrayLayout, storage: _Storage) -> None:
        super().__init__(group, name, dims, layout)
        self.storages = [storage]
        self.shifts = [0]  # where each storage starts along the concat axis (elements, then chunks)
        self.axis: int | None = None  # the concat dimension's axis, when the variable uses it


@dataclass
class _Tree:
    source: str
    root: Group
    refused: list[Refusal]


def _read_tree(handle, file: _SourceFile) -> _Tree:
    """The netCDF model of an open HDF5 file, as netCDF-C presents it."""
    reader = _TreeReader(file)
    root = Group("/", None)
    reader.read_group(handle["/"], root)
    reader.resolve_variables(root)
    reader.size_unlimited()
    return _Tree(file.name, root, reader.refused)


class _TreeReader:
    def __init__(self, file: _SourceFile) -> None:
        self.file = file
        self.source = file.name
        self.refused: list[Refusal] = []
        self.dims_by_path: dict[str, Dimension] = {}
        self.dims_by_id: dict[int, Dimension] = {}
        self.pending: dict[int, list[tuple[str, object]]] = {}  # id(group) -> [(name, dataset)] in order
        self.extents: dict[int, list[int]] = {}  # id(unlimited dim) -> lengths of its users
        self.dim_count = 0

    def read_group(self, h5group, group: Group) -> None:
        import h5py

        for attribute in self.attributes(h5group, group.path):
            group.attrs.load({attribute.name: attribute})
        dims: list[tuple[int, Dimension]] = []
        datasets: list[tuple[str, object]] = []
        children: list[tuple[str, object]] = []
        for name in h5group:
            link = h5group.get(name, getlink=True)
            where = _join(group.path, name)
            if not isinstance(link, h5py.HardLink):
                self.refused.append(Refusal(where, f"it is an HDF5 {type(link).__name__}", self.source))
                continue
            item = h5group[name]
            if isinstance(item, h5py.Group):
                children.append((name, item))
            elif isinstance(item, h5py.Dataset):
                if h5py.h5ds.is_scale(item.id):
                    dimension = self.dimension(item, name, group)
                    if dimension is not None:
                        dims.append((_int_attribute(item, "_Netcdf4Dimid"), dimension))
                    if _dimension_only(item):
                        continue
                datasets.append((name.removeprefix(NON_COORD_PREFIX), item))
            # committed datatypes are netCDF user-defined types: variables using them are refused
        if dims and all(dimid is not None for dimid, _ in dims):
            dims.sort(key=lambda pair: pair[0])  # netCDF-C lists a group's dimensions by id
        for dimid, dimension in dims:
            group.dimensions[dimension.name] = dimension
            if dimid is not None:
                self.dims_by_id[dimid] = dimension
        self.pending[id(group)] = datasets
        for name, item in children:
            child = Group(name, group)
            group.groups[name] = child
            self.read_group(item, child)

    def dimension(self, dataset, name: str, group: Group) -> Dimension | None:
        if not dataset.shape:
            return None
        self.dim_count += 1
        unlimited = dataset.maxshape[0] is None
        dimension = Dimension(name, int(dataset.shape[0]), unlimited, group)
        self.dims_by_path[dataset.name] = dimension
        if unlimited:
            self.extents[id(dimension)] = [dimension.size]
        return dimension

    def resolve_variables(self, group: Group) -> None:
        """Variables with their dimensions, child groups first (the order netCDF-C makes phony dims in)."""
        for child in group.groups.values():
            self.resolve_variables(child)
        for name, dataset in self.pending.pop(id(group)):
            where = _join(group.path, name)
            try:
                variable = self.variable(group, name, dataset)
            except NotVirtualizable as exc:
                self.refused.append(Refusal(where, str(exc), self.source))
                continue
            group.variables[name] = variable

    def variable(self, group: Group, name: str, dataset) -> _SourceVariable:
        if dataset.shape is None:
            raise NotVirtualizable("it has an empty (null) dataspace")
        dims = self.dimensions_of(dataset, group)  # first: netCDF-C makes them even for refused types
        nctype, storage_dtype = _types(dataset)
        shape = tuple(int(n) for n in dataset.shape)
        for dim, length in zip(dims, shape, strict=True):
            if dim.unlimited:
                self.extents[id(dim)].append(length)
        storage = _storage(dataset, self.file, storage_dtype.itemsize)
        codecs = storage.codecs
        compressors = ("zlib", "zstd", "bz2", "blosc")
        compressor = codecs[-1] if codecs and codecs[-1]["id"] in compressors else None
        filters = codecs[:-1] if compressor else list(codecs)
        chunks = storage.chunks if storage.kind == "chunked" else tuple(max(1, n) for n in shape)
        layout = ArrayLayout(
            shape,
            chunks,
            ParsedDtype(nctype, storage_dtype, storage_dtype.byteorder in "<>"),
            _fill(dataset, nctype),
            CodecChain(filters, compressor, storage_dtype.itemsize),
            ".",
            "C",
            scalar=not dims,
        )
        variable = _SourceVariable(group, name, dims, layout, storage)
        for attribute in self.attributes(dataset, variable.key):
            variable.attrs.load({attribute.name: attribute})
        return variable

    def dimensions_of(self, dataset, group: Group) -> list[Dimension]:
        import h5py

        if not dataset.shape:
            return []
        if "DIMENSION_LIST" in dataset.attrs:
            dims = []
            for axis, scales in enumerate(dataset.dims):
                names = [scale.name for scale in scales.values()]
                found = next((self.dims_by_path[n] for n in names if n in self.dims_by_path), None)
                if found is None:
                    raise NotVirtualizable(
                        f"the dimension scale of its axis {axis} is not a netCDF dimension"
                    )
                dims.append(found)
            return dims
        coordinates = dataset.attrs.get("_Netcdf4Coordinates")
        if coordinates is not None:
            try:
                return [self.dims_by_id[int(dimid)] for dimid in np.atleast_1d(coordinates)]
            except KeyError as exc:
                raise NotVirtualizable(f"its dimension id {exc} is not defined") from None
        if h5py.h5ds.is_scale(dataset.id) and len(dataset.shape) == 1:
            return [self.dims_by_path[dataset.name]]
        return self.phony_dimensions(dataset, group)

    def phony_dimensions(self, dataset, group: Group) -> list[Dimension]:
        """A plain HDF5 dataset's dimensions as netCDF-C names them: a dimension of the group of the same
        length (and unlimitedness) that the dataset does not use yet, else a new ``phony_dim_<id>``."""
        dims = []
        for length, maximum in zip(dataset.shape, dataset.maxshape, strict=True):
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
            dims.append(found)
        return dims

    def size_unlimited(self) -> None:
        """An unlimited dimension is as long as the longest variable using it (as netCDF-C reports it)."""
        for dimension in self.dims_by_path.values():
            if dimension.unlimited:
                dimension.size = max(self.extents.get(id(dimension), [dimension.size]))

    def attributes(self, item, where: str) -> list[Attribute]:
        found = []
        for name in item.attrs:
            if name in HIDDEN_ATTRIBUTES:
                continue
            try:
                found.append(_attribute(item, name))
            except NotVirtualizable as exc:
                self.refused.append(Refusal(where, str(exc), self.source, name))
        return found


def _join(path: str, name: str) -> str:
    return path.rstrip("/") + "/" + name


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
            raise NotVirtualizable(
                "its type is NC_STRING: variable-length strings live in HDF5's global heap, not in byte "
                "ranges a manifest can refer to (nczmap copy stores them)"
            )
        if kind.get_size() != 1:
            raise NotVirtualizable(
                f"its type is a fixed-length string of {kind.get_size()} bytes, no netCDF type"
            )
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
        attr.read(raw)
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


def _storage(dataset, file: _SourceFile, itemsize: int) -> _Storage:
    from h5py import h5d

    source = file.name

    plist = dataset.id.get_create_plist()
    layout = plist.get_layout()
    shape = tuple(int(n) for n in dataset.shape)
    if layout == getattr(h5d, "VIRTUAL", 3):
        return _Storage(source, dataset, "virtual", shape, problem="it is an HDF5 virtual dataset", file=file)
    if plist.get_external_count():
        return _Storage(
            source, dataset, "external", shape, problem="its data is in external raw files", file=file
        )
    if layout == h5d.COMPACT:
        return _Storage(source, dataset, "compact", shape, file=file)
    if layout == h5d.CONTIGUOUS:
        storage = _Storage(source, dataset, "contiguous", shape, offset=dataset.id.get_offset(), file=file)
        needed = math.prod(shape) * itemsize
        if storage.offset is not None and dataset.id.get_storage_size() < needed:
            storage.problem = (
                f"its contiguous storage holds {dataset.id.get_storage_size()} of {needed} bytes"
            )
        return storage
    chunks = tuple(int(n) for n in dataset.chunks)
    storage = _Storage(source, dataset, "chunked", shape, chunks, file=file)
    storage.codecs, storage.problem = _codecs(plist, itemsize, math.prod(chunks) * itemsize)
    if storage.problem is None:
        storage.problem = _read_chunk_index(storage)
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


def _read_chunk_index(storage: _Storage) -> str | None:
    """Record every allocated chunk (corner, byte offset, size); the reason to refuse, if any."""
    dataset_id = storage.dataset.id
    skipped: list[tuple] = []

    def visit(info) -> None:
        if info.filter_mask:
            skipped.append((info.chunk_offset, info.filter_mask))
        storage.corners.extend(info.chunk_offset)
        storage.offsets.append(info.byte_offset)
        storage.sizes.append(info.size)

    if 0 in storage.shape:
        return None
    if hasattr(dataset_id, "chunk_iter"):
        try:
            dataset_id.chunk_iter(visit)
        except (RuntimeError, ValueError, OSError):  # chunk_iter needs HDF5 1.14
            del storage.corners[:], storage.offsets[:], storage.sizes[:]
            skipped.clear()
            for index in range(dataset_id.get_num_chunks()):
                visit(dataset_id.get_chunk_info(index))
    else:
        for index in range(dataset_id.get_num_chunks()):
            visit(dataset_id.get_chunk_info(index))
    if skipped:
        corner, mask = skipped[0]
        return (
            f"its chunk at {tuple(corner)} skips filters (filter mask {mask:#x}): one Zarr codec chain "
            "cannot decode chunks filtered differently"
        )
    return None


# ------------------------------------------------------------------------------------------- planning
@dataclass
class _Plan:
    root: Group
    variables: list[_SourceVariable]
    refused: list[Refusal]
    sources: list[str]


def _plan(trees: list[_Tree], concat: str | None) -> _Plan:
    first = trees[0]
    refused = list(first.refused)
    variables = [v for g in first.root.walk() for v in g.variables.values()]
    if concat is not None:
        dimension = _concat_dimension(first, concat)
        lengths = [dimension.size]
        for tree in trees[1:]:
            _check_same_structure(first, tree, dimension)
            other = tree.root.find_dimension(dimension.path)
            lengths.append(other.size)
            known = _refused_variables(refused)
            refused.extend(r for r in tree.refused if r.attribute is None and r.variable not in known)
        dimension.size = sum(lengths)
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        for variable in variables:
            axes = [i for i, d in enumerate(variable.dims) if d is dimension]
            if len(axes) > 1:
                refused.append(Refusal(variable.key, f"it uses {concat!r} twice", first.source))
                continue
            if not axes:
                continue
            variable.axis = axes[0]
            for tree in trees[1:]:
                other = _find_variable(tree.root, variable.key)
                if other is not None:
                    variable.storages.append(other.storages[0])
            variable.shifts = starts
            variable.layout.shape = tuple(d.size for d in variable.dims)
    kept = []
    refused_names = _refused_variables(refused)
    for variable in variables:
        if variable.key in refused_names:
            continue
        problem = _choose_chunks(variable, trees)
        if problem is not None:
            refused.append(problem)
            continue
        kept.append(variable)
    return _Plan(first.root, kept, refused, [t.source for t in trees])


def _refused_variables(refusals: list[Refusal]) -> set[str]:
    return {r.variable for r in refusals if r.attribute is None}


def _concat_dimension(tree: _Tree, name: str) -> Dimension:
    found = tree.root.find_dimension(name) if name.startswith("/") else tree.root.dimensions.get(name)
    if found is None:
        raise FormatError(f"{tree.source} has no dimension {name!r} to join the sources along")
    return found


def _find_variable(root: Group, path: str) -> _SourceVariable | None:
    *groups, name = path.strip("/").split("/")
    group = root
    for part in groups:
        group = group.groups.get(part)
        if group is None:
            return None
    return group.variables.get(name)


def _check_same_structure(first: _Tree, other: _Tree, concat: Dimension) -> None:
    """FormatError naming ``other`` unless it has ``first``'s groups, dimensions and variables."""

    def fail(what: str) -> None:
        raise FormatError(f"{other.source} cannot be joined to {first.source} along {concat.path!r}: {what}")

    refused = _refused_variables(first.refused) | _refused_variables(other.refused)
    for group in first.root.walk():
        twin = _find_group(other.root, group.path)
        if twin is None:
            fail(f"it has no group {group.path!r}")
        if set(twin.groups) != set(group.groups):
            fail(f"group {group.path!r} has subgroups {sorted(twin.groups)}, not {sorted(group.groups)}")
        if list(twin.dimensions) != list(group.dimensions):
            fail(f"group {group.path!r} has dimensions {list(twin.dimensions)}, not {list(group.dimensions)}")
        for name, dim in group.dimensions.items():
            theirs = twin.dimensions[name]
            if dim is not concat and theirs.size != dim.size:
                fail(f"dimension {dim.path!r} has length {theirs.size}, not {dim.size}")
            if theirs.unlimited != dim.unlimited:
                fail(f"dimension {dim.path!r} is {'' if theirs.unlimited else 'not '}unlimited")
        mine = [n for n in group.variables if _join(group.path, n) not in refused]
        theirs_names = [n for n in twin.variables if _join(group.path, n) not in refused]
        if set(mine) != set(theirs_names):
            missing = sorted(set(mine) - set(theirs_names))
            extra = sorted(set(theirs_names) - set(mine))
            fail(f"variables of {group.path!r} differ (missing {missing}, extra {extra})")
        for name in mine:
            a, b = group.variables[name], twin.variables[name]
            if [d.path for d in a.dims] != [d.path for d in b.dims]:
                fail(f"variable {a.key!r} has dimensions {b.dimensions}, not {a.dimensions}")
            if a.nctype is not b.nctype:
                fail(f"variable {a.key!r} is {b.nctype.name}, not {a.nctype.name}")
            for dim, x, y in zip(a.dims, a.shape, b.shape, strict=True):
                if dim is not concat and x != y:
                    fail(f"variable {a.key!r} has shape {b.shape}, not {a.shape}")


def _find_group(root: Group, path: str) -> Group | None:
    group = root
    for part in [p for p in path.strip("/").split("/") if p]:
        group = group.groups.get(part)
        if group is None:
            return None
    return group


def _choose_chunks(variable: _SourceVariable, trees: list[_Tree]) -> Refusal | None:
    """Fix the variable's Zarr chunk shape from all its storages; a Refusal when there is none."""
    storages = variable.storages
    first = storages[0]
    for storage in storages:
        if storage.problem is not None:
            return Refusal(variable.key, storage.problem, storage.source)
    if len(storages) > 1:
        for storage in storages[1:]:
            theirs = _find_variable(_tree_of(trees, storage.source).root, variable.key)
            why = _differences(variable, theirs, first, storage)
            if why is not None:
                return Refusal(variable.key, why, storage.source)
    axis = variable.axis
    lengths = [s.shape[axis] for s in storages] if axis is not None else []
    if first.kind == "chunked":
        if axis is not None:
            step = first.chunks[axis]
            for storage, length in zip(storages[:-1], lengths[:-1], strict=True):
                if length % step:
                    return Refusal(
                        variable.key,
                        f"its chunk length {step} along the joined dimension does not divide this file's "
                        f"length {length} (only the last file may end with a partial chunk)",
                        storage.source,
                    )
            variable.shifts = [start // step for start in variable.shifts]
        return None
    # contiguous or compact: chunks of whole rows along the first axis
    shape = first.shape
    if not shape:
        variable.layout.chunks = ()
        return None
    row = math.prod(shape[1:]) * variable.layout.dtype.storage.itemsize
    if axis is None:
        rows = _rows(shape[0], row, whole=True)
    elif axis == 0:
        rows = _rows(math.gcd(*lengths), row, whole=False)
    else:
        for storage, length in zip(storages, lengths, strict=True):
            if length != lengths[0]:
                return Refusal(
                    variable.key,
                    f"it is stored contiguously and joined along its axis {axis}, so every file needs the "
                    f"same length along it ({lengths[0]}, not {length})",
                    storage.source,
                )
        rows = _rows(shape[0], row, whole=True)
    chunks = (max(1, rows), *(max(1, n) for n in shape[1:]))
    variable.layout.chunks = chunks
    if axis is not None:
        variable.shifts = [start // chunks[axis] for start in variable.shifts]
    return None


def _tree_of(trees: list[_Tree], source: str) -> _Tree:
    return next(t for t in trees if t.source == source)


def _differences(variable: _SourceVariable, other: _SourceVariable, mine: _Storage, theirs: _Storage):
    if theirs.kind != mine.kind and {theirs.kind, mine.kind} != {"contiguous", "compact"}:
        return f"it is stored {theirs.kind} there but {mine.kind} in {mine.source}"
    if theirs.kind == "chunked" and theirs.chunks != mine.chunks:
        return f"its chunks are {theirs.chunks} there but {mine.chunks} in {mine.source}"
    if theirs.codecs != mine.codecs:
        return f"its filters {theirs.codecs} there differ from {mine.codecs} in {mine.source}"
    theirs_dtype, mine_dtype = other.layout.dtype.storage, variable.layout.dtype.storage
    if theirs_dtype != mine_dtype:
        return f"it is stored as {theirs_dtype} there but {mine_dtype} in {mine.source}"
    theirs_fill, mine_fill = other.layout.fill_value, variable.layout.fill_value
    if not _same_fill(theirs_fill, mine_fill):
        return f"its fill value {theirs_fill!r} differs from {mine_fill!r} in {mine.source}"
    return None


def _same_fill(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, bytes) or isinstance(b, bytes):
        return a == b
    return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


def _rows(count: int, row_bytes: int, whole: bool) -> int:
    """Rows per chunk: all of them when small; else the largest divisor of ``count`` that keeps a chunk
    under TARGET_CHUNK_BYTES, unless ``whole`` allows one chunk and the divisor would make chunks tiny."""
    if count <= 0:
        return 1
    if count * row_bytes <= TARGET_CHUNK_BYTES:
        return count
    best = 1
    for low in range(1, math.isqrt(count) + 1):
        if count % low == 0:
            for divisor in (low, count // low):
                if divisor * row_bytes <= TARGET_CHUNK_BYTES:
                    best = max(best, divisor)
    if whole and best * row_bytes < TARGET_CHUNK_BYTES // 16:
        return count  # one chunk: fewer, larger reads beat a multitude of tiny ones
    return best


# -------------------------------------------------------------------------------------------- writing
def _write(
    plan: _Plan,
    url: ParsedURL,
    grants: list[str],
    netcdf_version: str | None,
    progress: Progress | None,
    files: list[_SourceFile],
) -> VirtualizeResult:
    zmap = open_map(url, "w", containers=grants)
    try:
        for source in plan.sources:
            try:
                authorize(normalize(source, None), None, zmap.containers, source)
            except AccessDenied as exc:
                raise AccessDenied(f"the manifest may not refer to {source}: {exc}") from None
        target = open_on(zmap, "w", format_options(url, netcdf_version))
    except BaseException:
        zmap.abort()
        raise
    result = VirtualizeResult(zmap.location, refused=list(plan.refused), containers=as_containers(grants))
    with target:
        variables = _keep_writable(plan, target, result)
        _copy_group(plan.root, target)
        total = sum(_entry_count(v) for v in variables)
        done = 0
        for variable in variables:
            dest = _counterpart(target, variable)
            for storage, shift in zip(variable.storages, variable.shifts, strict=True):
                source = normalize(storage.source, None)
                for index, entry in _entries(variable, storage, shift):
                    key = dest.chunk_key(index)
                    if isinstance(entry, bytes):
                        zmap.write(key, entry)
                        result.inline += 1
                    else:
                        zmap.set_reference(key, source, *entry)
                        result.references += 1
                    done += 1
                    if progress is not None and (done == total or done % max(1, total // 200) == 0):
                        progress(done, total)
        for file in files:
            file.check_unchanged()  # raising here abandons the manifest unwritten
            zmap.manifest.sources[file.url] = file.recorded()
        result.variables = len(variables)
    return result


def _keep_writable(plan: _Plan, target: Dataset, result: VirtualizeResult) -> list[_SourceVariable]:
    """Take refused variables out of the model (so ``_copy_group`` leaves them out), and refuse what the
    chosen dialect cannot hold."""
    kept = []
    for variable in plan.variables:
        storage = variable.layout.dtype.storage
        if storage.byteorder == ">" and storage.itemsize > 1 and not target.dialect.big_endian_safe:
            result.refused.append(
                Refusal(
                    variable.key,
                    f"it is big-endian, which netcdf-c {target.dialect.releases} reads wrongly (choose a "
                    "later --netcdf-version)",
                    variable.storages[0].source,
                )
            )
            continue
        kept.append(variable)
    keep = {id(v) for v in kept}
    for group in plan.root.walk():
        for name in [n for n, v in group.variables.items() if id(v) not in keep]:
            del group.variables[name]
    return kept


def _entry_count(variable: _SourceVariable) -> int:
    return sum(sum(1 for _ in _entries(variable, s, 0, count_only=True)) for s in variable.storages)


def _entries(variable: _SourceVariable, storage: _Storage, shift: int, count_only: bool = False):
    """``(chunk index, entry)`` for every chunk of ``storage`` holding data: an entry is inline bytes or
    ``(offset, length)`` in the source. Indices are shifted by ``shift`` chunks along the concat axis."""
    axis = variable.axis
    chunks = variable.layout.chunks
    if storage.kind == "chunked":
        yield from _chunked_entries(storage, chunks, axis, shift, count_only)
        return
    if storage.kind == "contiguous" and storage.offset is None:
        return  # never written: every value is the fill value
    if 0 in storage.shape:
        return
    rows = chunks[0] if chunks else 1
    row_bytes = math.prod(storage.shape[1:]) * variable.layout.dtype.storage.itemsize
    count = storage.shape[0] // rows if storage.shape else 1
    values = None
    for number in range(count):
        index = [number] + [0] * (len(chunks) - 1) if chunks else []
        if axis is not None:
            index[axis] += shift
        if count_only:
            yield tuple(index), None
            continue
        length = rows * row_bytes if storage.shape else variable.layout.dtype.storage.itemsize
        if storage.kind == "compact":
            if values is None:
                values = np.ascontiguousarray(storage.dataset[()])
            flat = values.reshape(-1).view(np.uint8) if values.ndim else values.reshape(1).view(np.uint8)
            yield tuple(index), bytes(flat[number * length : (number + 1) * length])
        elif length < SMALL_CHUNK:
            yield tuple(index), storage.file.read(storage.offset + number * length, length)
        else:
            yield tuple(index), (storage.offset + number * length, length)


def _chunked_entries(storage: _Storage, chunks, axis, shift: int, count_only: bool):
    ndim = len(storage.chunks)
    shape = storage.shape
    for number in range(len(storage.offsets)):
        corner = storage.corners[number * ndim : (number + 1) * ndim]
        if any(c >= n for c, n in zip(corner, shape, strict=True)):
            continue  # beyond the current extent (the dataset was shrunk): HDF5 never reads it
        index = [c // k for c, k in zip(corner, chunks, strict=True)]
        if axis is not None:
            index[axis] += shift
        if count_only:
            yield tuple(index), None
            continue
        size = storage.sizes[number]
        if size < SMALL_CHUNK:
            _, data = storage.dataset.id.read_direct_chunk(tuple(corner))
            yield tuple(index), bytes(data)
        else:
            yield tuple(index), (storage.offsets[number], size)


def _read_bytes(path: str, offset: int, length: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(length)
    except OSError as exc:
        raise StorageError(
            f"cannot read {length} bytes at {offset} of {path}: {exc.strerror or exc}"
        ) from exc
    if len(data) != length:
        raise StorageError(f"{path} ends before byte {offset + length}: it changed")
    return data


__all__ = ["NotVirtualizable", "Refusal", "VirtualizeResult", "VirtualizeWarning", "virtualize"]
