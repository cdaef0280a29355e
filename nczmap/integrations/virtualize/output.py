"""Writing a planned virtual dataset: NCZarr metadata, references, inline and loaded data, in a manifest.

The model is written through the format layer (``open_on`` on a
:class:`~nczmap.zmap.manifest.ManifestMap`, with the copy tool's ``_copy_group``). A referenced variable's
chunk keys refer to ``(file, offset, length)`` byte ranges of its sources; chunks under
:data:`SMALL_CHUNK` bytes, and the last partial chunk of contiguous data split into pieces (padded with
the fill value to a whole chunk), are stored in the manifest. A loaded variable is written as data:
small chunks inline, larger ones in the manifest's chunk file beside it (:mod:`nczmap.zmap.sidecar`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import numpy as np

from nczmap.api import format_options
from nczmap.errors import AccessDenied, DatasetExists, FormatError, StorageError
from nczmap.format import Dataset
from nczmap.integrations.copy import _copy_group, _counterpart, keep_codecs, open_target
from nczmap.integrations.virtualize.combine import Plan, is_joined_coordinate, loaded_values
from nczmap.integrations.virtualize.parsed import Refusal, SourceVariable, Storage, find_group
from nczmap.integrations.virtualize.sources import RemoteFile, SourceFile
from nczmap.manifest.containers import Container, as_containers, authorize, normalize
from nczmap.progress import Progress
from nczmap.registry import DEFAULT_DRIVER, DRIVERS, LOCAL, S3
from nczmap.url import ParsedURL, parse_url
from nczmap.zmap import open_map
from nczmap.zmap.keys import normalize_key

SMALL_CHUNK = 100  # chunks smaller than this are kept in the manifest: a reference would cost more
# a byte range of the source (and the chunk's number in a chunked storage), or the chunk's bytes
Entry = tuple[int, int, int | None] | bytes


def manifest_url(destination: str | os.PathLike[str], sources: list[SourceFile]) -> ParsedURL:
    """The destination as a manifest URL; refused where it would overwrite a source or another file."""
    url = parse_url(destination)
    if url.driver == "icechunk":
        return url  # an Icechunk repository: write_icechunk
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
    if os.path.isdir(path) and not path.endswith((".parq", ".parquet")):
        raise DatasetExists(
            f"{url.original!r} is a directory; the manifest is one kerchunk JSON file (or a new .parq "
            "directory)"
        )
    if os.path.isfile(path):
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


def write(
    plan: Plan,
    url: ParsedURL,
    grants: list[str | Container],
    netcdf_version: str | None,
    progress: Progress | None,
    files: list[SourceFile],
    result,
    checksums: bool = False,
    record: dict | None = None,
) -> None:
    """Write ``plan`` as the manifest at ``url``; counts and refusals go to ``result``. ``checksums``:
    record the crc32c of every referenced range (each read once here), checked when it is read.
    ``record``: how the dataset was made (kept for appends: see :mod:`.append`)."""
    if url.driver == "icechunk":
        if checksums:
            raise FormatError(
                "checksums apply to manifests; an Icechunk repository checks each source by its ETag or "
                "modification time"
            )
        write_icechunk(plan, url, grants, netcdf_version, progress, files, result, record)
        return
    zmap = open_map(url, "w", containers=grants)
    try:
        urls = _authorize_sources(plan.sources, zmap.containers, "manifest")
        if not url.on_s3:
            zmap.keep_large_chunks_beside()
    except BaseException:
        zmap.abort()
        raise
    with _open_target(zmap, url, netcdf_version) as target:
        variables = _write_model(plan, target, result)
        total = sum(_entry_count(v) for v in variables if not v.load)
        done = 0
        for variable in variables:
            dest = _counterpart(target, variable)
            if variable.load:
                if is_joined_coordinate(variable):  # written again by each append: never in a chunk file
                    zmap.keep_inline(dest.key)
                _write_loaded(variable, dest, result)
                continue
            pairs = list(zip(variable.storages, variable.shifts, strict=True))
            count = _entry_count(variable)  # before the columns are let go
            _reference(variable, pairs, dest, zmap, urls, result, checksums, release=True)
            done += count
            if progress is not None:
                progress(min(done, total), total)
        for file in files:
            file.check_unchanged()  # raising here abandons the manifest unwritten
            zmap.manifest.sources.update(file.recorded_sources())
        if len(set(result.formats)) == 1:  # ncdump prints netCDF-3 text and netCDF-4 strings apart
            zmap.manifest.source_format = result.formats[0]
        zmap.manifest.virtualize = record
        result.variables = len(variables)


def _plain_keys(dest) -> bool:
    """Whether ``dest``'s chunk keys are its indices joined by its separator (no shards, no ``c/``)."""
    return dest.layout.shards is None and not dest.layout.key_prefix


def _reference_chunked(
    variable: SourceVariable,
    storages: list[tuple[Storage, int]],
    dest,
    zmap,
    urls,
    result,
    checksums: bool,
    release: bool = False,
) -> None:
    """The chunks of ``variable``'s chunked ``storages`` (with their shifts along the joined axis) in the
    manifest: as references, or written into it when smaller than SMALL_CHUNK. Described a batch of
    sources at a time (``release``: each source's columns let go once described, so that memory follows
    the references kept, not twice them); a new array's references become its chunk table as columns
    (nothing made a chunk), others are set by name."""
    if not storages:
        return
    separator = dest.layout.separator
    grid = tuple(-(-n // c) for n, c in zip(dest.shape, dest.layout.chunks, strict=True))
    tabled = separator == "." and bool(grid) and not checksums and math.prod(grid) < 1 << 62
    builder = zmap.chunk_table(dest.key, grid) if tabled else None
    located: dict[str, int] = {}
    for batch in _batches(storages):
        indices, offsets, sizes, owners, numbers = _inlined_small(variable, batch, dest, zmap, result)
        where = _chunk_locations(batch, owners, numbers, urls, located)
        if builder is not None:
            flats = np.ravel_multi_index(tuple(indices.T), grid)
            builder.add(flats, where, offsets, sizes, list(located))
        else:
            names = [_chunk_name(row, separator) for row in indices]
            _set_by_name(dest, zmap, names, list(located), where, offsets, sizes, result)
            if checksums:
                _record_checksums(zmap, dest, names, batch, owners, numbers)
        if release:
            for storage, _ in batch:
                storage.release_columns()
    if builder is not None:
        result.references += builder.finish()


BATCH_CHUNKS = 1 << 18  # chunks described at once


def _batches(storages: list[tuple[Storage, int]]) -> Iterator[list[tuple[Storage, int]]]:
    """``storages`` in runs of about BATCH_CHUNKS chunks (a source's never split)."""
    batch: list[tuple[Storage, int]] = []
    count = 0
    for pair in storages:
        batch.append(pair)
        count += pair[0].chunk_count
        if count >= BATCH_CHUNKS:
            yield batch
            batch, count = [], 0
    if batch:
        yield batch


def _inlined_small(variable: SourceVariable, batch: list[tuple[Storage, int]], dest, zmap, result):
    """The chunk columns of ``batch`` (:func:`_chunk_columns`) less the chunks smaller than SMALL_CHUNK
    held here, which are written into the manifest."""
    indices, offsets, sizes, owners, numbers = _chunk_columns(variable, batch)
    small = sizes < SMALL_CHUNK
    for at in np.flatnonzero(small).tolist():
        data = _held(batch[owners[at]][0], int(numbers[at]))
        if data is None:  # a remote source's bytes not fetched yet: a reference costs no request
            small[at] = False
            continue
        zmap.write(f"{dest.key}/{_chunk_name(indices[at], dest.layout.separator)}", data)
        result.inline += 1
    if not small.any():
        return indices, offsets, sizes, owners, numbers
    kept = ~small
    return indices[kept], offsets[kept], sizes[kept], owners[kept], numbers[kept]


def _set_by_name(dest, zmap, names: list[str], located: list[str], where, offsets, sizes, result) -> None:
    result.references += zmap.set_chunk_references(
        dest.key, names, [located[w] for w in where.tolist()], offsets.tolist(), sizes.tolist()
    )


def _record_checksums(zmap, dest, names: list[str], batch, owners: np.ndarray, numbers: np.ndarray) -> None:
    """The crc32c of every chunk ``names`` refers to, in the manifest."""
    from nczmap.checksum import crc32c

    for name, owner, number in zip(names, owners.tolist(), numbers.tolist(), strict=True):
        key = normalize_key(f"{dest.key}/{name}")[1:]
        zmap.manifest.checksums[key] = crc32c(batch[owner][0].chunk_bytes(number))


def _chunk_name(index: np.ndarray, separator: str) -> str:
    """A chunk's key below its array: its indices joined (a scalar's: ``0``)."""
    return separator.join(map(str, index.tolist())) if len(index) else "0"


def _chunk_locations(
    storages: list[tuple[Storage, int]],
    owners: np.ndarray,
    numbers: np.ndarray,
    urls: dict[str, str],
    located: dict[str, int],
) -> np.ndarray:
    """Where each chunk lies, as its number among the distinct URLs of ``located`` (added to): its
    storage's source, or the file or object a store keeps that chunk in."""
    numbered = [
        -1 if storage.locations is not None else located.setdefault(urls[storage.source], len(located))
        for storage, _ in storages
    ]
    where = np.asarray(numbered, dtype=np.int32)[owners]
    for at in np.flatnonzero(where < 0).tolist():
        url = _chunk_url(storages[owners[at]][0], int(numbers[at]), urls)
        where[at] = located.setdefault(url, len(located))
    return where


def _chunk_url(storage: Storage, number: int, urls: dict[str, str]) -> str:
    """Where chunk ``number`` of ``storage`` lies: its own file or object (a store's), else the source."""
    return storage.locations[number] if storage.locations is not None else urls[storage.source]


def _chunk_columns(variable: SourceVariable, storages: list[tuple[Storage, int]]):
    """The chunks of chunked ``storages`` (with their shifts along the joined axis) inside their shapes,
    all at once: (chunk indices in the result, offsets, sizes, the number of each one's storage, each
    one's number in its storage)."""
    ndim = len(storages[0][0].chunks)
    counts = [len(storage.offsets) for storage, _ in storages]
    corners = np.frombuffer(b"".join(storage.corners for storage, _ in storages), dtype=np.int64)
    corners = corners.reshape(sum(counts), ndim)
    offsets = np.frombuffer(b"".join(storage.offsets for storage, _ in storages), dtype=np.int64)
    sizes = np.frombuffer(b"".join(storage.sizes for storage, _ in storages), dtype=np.int64)
    owners = np.repeat(np.arange(len(storages)), counts)
    numbers = np.arange(sum(counts)) - np.repeat(np.cumsum([0, *counts[:-1]]), counts)
    shapes = np.asarray([storage.shape for storage, _ in storages], dtype=np.int64)
    shapes = shapes.reshape(len(storages), ndim)
    inside = (corners < shapes[owners]).all(axis=1)  # beyond a shrunk dataset's extent: never read
    if not inside.all():
        corners, offsets, sizes = corners[inside], offsets[inside], sizes[inside]
        owners, numbers = owners[inside], numbers[inside]
    indices = corners // np.asarray(variable.layout.chunks, dtype=np.int64)
    if variable.axis is not None:
        indices[:, variable.axis] += np.asarray([shift for _, shift in storages], dtype=np.int64)[owners]
    return indices, offsets, sizes, owners, numbers


def _entries_written(
    variable: SourceVariable, storage: Storage, shift: int, dest, zmap, result, url: str, checksums=None
) -> list[tuple[str, int, int, str]]:
    """Every chunk of ``storage`` (in the source at ``url``): small ones written into the manifest, the
    others' references ``(key, offset, length, url)`` returned (a store's chunks each in its own file);
    with ``checksums`` (a manifest's), the crc32c of each referenced range recorded there."""
    references = []
    for index, entry in _entries(variable, storage, shift):
        key = dest.chunk_key(index)
        if isinstance(entry, bytes):
            zmap.write(key, entry)
            result.inline += 1
            continue
        offset, length, number = entry
        located = storage.locations is not None and number is not None
        references.append((key, offset, length, storage.locations[number] if located else url))
        if checksums is not None:
            from nczmap.checksum import crc32c

            data = storage.chunk_bytes(number) if located else storage.read(offset, length)
            checksums[normalize_key(key)[1:]] = crc32c(data)
    return references


def _authorize_sources(sources: list[str], containers, what: str) -> dict[str, str]:
    """Every source's canonical URL (its local links resolved once, not once per variable); AccessDenied
    unless each lies in a container the result will grant."""
    urls = {}
    for source in sources:
        urls[source] = normalize(source, None, links=False)  # a real path (or a URL) already
        try:
            authorize(urls[source], None, containers, source)
        except AccessDenied as exc:
            raise AccessDenied(f"the {what} may not refer to {source}: {exc}") from None
    return urls


def _open_target(zmap, url: ParsedURL, netcdf_version: str | None) -> Dataset:
    """The format layer's new dataset on ``zmap``; the map abandoned if it cannot be made."""
    return open_target(zmap, format_options(url, netcdf_version))


def _write_model(plan: Plan, target: Dataset, result) -> list[SourceVariable]:
    """The model written to ``target``, less what is refused; the variables kept."""
    variables = _keep_writable(plan, target, result)
    _copy_group(plan.root, target)
    return variables


def _write_loaded(variable: SourceVariable, dest, result, values: np.ndarray | None = None) -> None:
    values = loaded_values(variable) if values is None else values
    if values.shape != tuple(dest.shape):  # never grow a dimension by writing more than it holds
        raise FormatError(
            f"{variable.key!r}: its joined values of shape {values.shape} do not match its shape "
            f"{tuple(dest.shape)} in the destination"
        )
    if variable.layout.dtype.nctype.name == "char" and values.dtype.kind == "U":
        values = np.char.encode(values, "utf-8")
    dest[...] = values
    result.loaded.append(variable.key)


def _keep_writable(plan: Plan, target: Dataset, result) -> list[SourceVariable]:
    """Take refused variables out of the model (so ``_copy_group`` leaves them out), and refuse what the
    chosen dialect cannot hold."""
    kept = []
    for variable in plan.variables:
        storage = variable.layout.dtype.storage
        big_endian = storage.byteorder == ">" and storage.itemsize > 1
        if big_endian and not target.dialect.big_endian_safe and not variable.load:
            result.refused.append(
                Refusal(
                    variable.key,
                    f"it is big-endian, which netcdf-c {target.dialect.releases} reads wrongly (choose a "
                    "later --netcdf-version)",
                    variable.storages[0].source,
                )
            )
            continue
        if big_endian and not target.dialect.big_endian_safe:
            variable.layout.dtype = type(variable.layout.dtype)(
                variable.layout.dtype.nctype, storage.newbyteorder("<"), True
            )
        kept.append(variable)
    keep = {id(v) for v in kept}
    for group in plan.root.walk():
        for name in [n for n, v in group.variables.items() if id(v) not in keep]:
            del group.variables[name]
    return kept


def _entry_count(variable: SourceVariable) -> int:
    """How many entries :func:`_entries` gives (for the progress bar), without making them."""
    return sum(_chunks_of(storage, variable) for storage in variable.storages)


def _chunks_of(storage: Storage, variable: SourceVariable) -> int:
    """How many chunks of ``variable`` ``storage`` holds."""
    if storage.kind == "chunked":
        return storage.chunk_count
    if storage.offset is None or 0 in storage.shape:
        return 0
    if not storage.shape:
        return 1
    split = variable.split
    return math.prod(storage.shape[:split]) * math.ceil(storage.shape[split] / variable.layout.chunks[split])


def _entries(
    variable: SourceVariable, storage: Storage, shift: int
) -> Iterator[tuple[tuple[int, ...], Entry]]:
    """``(chunk index, entry)`` for every chunk of ``storage`` holding data. Indices are shifted by
    ``shift`` chunks along the joined axis."""
    if storage.kind == "chunked":
        yield from _chunked_entries(variable, storage, shift)
    elif storage.offset is not None and 0 not in storage.shape:  # None: never written, all fill
        yield from _contiguous_entries(variable, storage, shift)


def _held(storage: Storage, number: int) -> bytes | None:
    """The bytes of small chunk ``number``, to keep in the manifest: read from a local source; None for a
    remote one, whose chunk is then referenced (fetching it would be a request a file more; and whether
    its bytes happen to be held by then depends on a cache, which would make the manifest depend on it)."""
    reader = storage.read_chunk if storage.locations is not None else storage.read
    if reader is None or getattr(reader, "remote", False):
        return None
    if isinstance(getattr(reader, "__self__", None), RemoteFile):  # the parser gave its source's read
        return None
    return storage.chunk_bytes(number)


def _chunked_entries(variable: SourceVariable, storage: Storage, shift: int):
    chunks, axis = variable.layout.chunks, variable.axis
    ndim = len(storage.chunks)
    shape = storage.shape
    for number in range(len(storage.offsets)):
        corner = tuple(storage.corners[number * ndim : (number + 1) * ndim])
        if any(c >= n for c, n in zip(corner, shape, strict=True)):
            continue  # beyond the current extent (the dataset was shrunk): never read
        index = [c // k for c, k in zip(corner, chunks, strict=True)]
        if axis is not None:
            index[axis] += shift
        size, offset = storage.sizes[number], storage.offsets[number]
        data = _held(storage, number) if size < SMALL_CHUNK else None
        yield tuple(index), (data if data is not None else (offset, size, number))


def _contiguous_entries(variable: SourceVariable, storage: Storage, shift: int):
    """Chunks ``(1, ..., 1, k, full...)`` of contiguous C-order bytes: each a byte range, but a last,
    partial one along the split axis, read and padded with the fill value to a whole chunk."""
    layout, axis = variable.layout, variable.axis
    shape = storage.shape
    itemsize = layout.dtype.storage.itemsize
    if not shape:
        yield from _scalar_entry(storage, itemsize)
        return
    split, rows_per_chunk = variable.split, layout.chunks[variable.split]
    counts = [*shape[:split], math.ceil(shape[split] / rows_per_chunk)]
    tail = math.prod(shape[split + 1 :]) * itemsize  # the bytes of one row along the split axis
    whole = rows_per_chunk * tail
    for flat in range(math.prod(counts)):
        where = [int(i) for i in np.unravel_index(flat, counts)]
        index = [*where, *(0 for _ in shape[split + 1 :])]
        if axis is not None:
            index[axis] += shift
        lead = int(np.ravel_multi_index(where[:split], shape[:split])) if split else 0
        first_row = where[split] * rows_per_chunk
        start = storage.offset + (lead * shape[split] + first_row) * tail
        length = min(rows_per_chunk, shape[split] - first_row) * tail
        if length < whole or length < SMALL_CHUNK:
            yield (
                tuple(index),
                storage.read(start, length) + _fill_bytes(variable, (whole - length) // itemsize),
            )
        else:
            yield tuple(index), (start, length, None)


def _scalar_entry(storage: Storage, itemsize: int):
    if itemsize < SMALL_CHUNK:
        yield (), storage.read(storage.offset, itemsize)
    else:
        yield (), (storage.offset, itemsize, None)


def _fill_bytes(variable: SourceVariable, count: int) -> bytes:
    if count <= 0:
        return b""
    dtype = variable.layout.dtype.storage
    fill = variable.layout.fill_value
    values = np.zeros(count, dtype=dtype) if fill is None else np.full(count, fill, dtype=dtype)
    return values.tobytes()


# ------------------------------------------------------------------------------------ Icechunk repositories
def write_icechunk(
    plan: Plan,
    url: ParsedURL,
    grants: list[str | Container],
    netcdf_version: str | None,
    progress: Progress | None,
    files: list[SourceFile],
    result,
    record: dict | None = None,
) -> None:
    """Write ``plan`` into the Icechunk repository at ``url`` (its branch, emptied first), committed at the
    end: the grants become the repository's virtual chunk containers, the model Zarr v3 metadata, references
    virtual chunks with the sources' checksums (ETag, or last-modified time), small and loaded data native
    chunks. Nothing is committed if anything fails."""
    from nczmap.zmap.icechunk import checksum

    containers = as_containers(grants)
    urls = _authorize_sources(plan.sources, containers, "repository")
    checksums = {url: checksum(stamp) for file in files for url, stamp in file.recorded_sources().items()}
    zmap = open_map(url, "w", containers=containers, virtual_containers=containers)
    _fill_attributes(plan.variables)
    with _open_target(zmap, url, netcdf_version) as target:
        variables = _write_model(plan, target, result)
        keep_codecs(target, [variable for variable in variables if not variable.load])
        parts = _Parts(zmap, [variable for variable in variables if not variable.load])
        target.flush()  # Icechunk takes a chunk only once its array exists
        for variable in variables:
            dest = _counterpart(target, variable)
            if variable.load:
                _write_loaded(variable, dest, result)
                continue
            for storage, shift in zip(variable.storages, variable.shifts, strict=True):
                url_of = urls[storage.source]
                _reference_icechunk(variable, storage, shift, dest, zmap, result, url_of, checksums)
                parts.written(variable, storage, shift)
                storage.release_columns()
            if progress is not None:
                progress(result.references + result.inline, result.references + result.inline)
        for file in files:
            file.check_unchanged()  # raising here discards the session: nothing is committed
        zmap.commit_metadata = _commit_metadata(record)
        result.variables = len(variables)


STAGED_REFERENCES = 1 << 18  # an Icechunk write of more references is committed in parts (Icechunk
PART_REFERENCES = 1 << 18  # holds a commit's changes in memory, ~700 bytes a reference at its peak)


def _grid_of(variable: SourceVariable) -> list[int]:
    """How many chunks ``variable`` has along each axis."""
    return [-(-n // c) for n, c in zip(variable.shape, variable.layout.chunks, strict=True)]


class _Parts:
    """A large Icechunk write staged on a branch of its own (see :meth:`IcechunkMap.stage`): its
    manifests split along the joined axis of its largest variable every about PART_REFERENCES
    references, and a part committed as that variable's references fill each split (so that a part's
    commit writes its own manifests only); other variables' every PART_REFERENCES references."""

    def __init__(self, zmap, variables: list[SourceVariable]) -> None:
        self.zmap, self.since, self.largest, self.boundary = zmap, 0, None, 0
        storages = [storage for variable in variables for storage in variable.storages]
        total = sum(storage.chunk_count for storage in storages if storage.kind == "chunked")
        joined = [v for v in variables if v.axis is not None and len(v.storages) > 1]
        if total <= STAGED_REFERENCES or not joined:
            return
        self.largest = max(joined, key=lambda variable: math.prod(_grid_of(variable)))
        grid = _grid_of(self.largest)
        per_step = max(1, math.prod(grid) // max(1, grid[self.largest.axis]))
        self.split = self.boundary = max(1, PART_REFERENCES // per_step)
        zmap.stage((self.largest.axis, self.split))

    def written(self, variable: SourceVariable, storage: Storage, shift: int) -> None:
        """``storage`` (from chunk ``shift`` along the joined axis) had its references set."""
        if self.largest is None or storage.kind != "chunked":
            return
        if variable is self.largest:
            steps = -(-storage.shape[variable.axis] // variable.layout.chunks[variable.axis])
            if shift + steps < self.boundary:
                return
            self.boundary = (-(-(shift + steps) // self.split) or 1) * self.split
            if self.boundary == shift + steps:
                self.boundary += self.split
        else:
            self.since += storage.chunk_count
            if self.since < PART_REFERENCES:
                return
        self.zmap.checkpoint()
        self.since = 0


def _reference_icechunk(
    variable: SourceVariable, storage: Storage, shift: int, dest, zmap, result, url: str, stamps: dict
) -> None:
    """The chunks of one source's ``storage`` as virtual chunks of ``dest``: a chunked storage's set at
    once, as the block of the chunk grid they fill (small chunks written as native ones); others (and a
    store's chunks, each in its own object, or chunks sparse in their block) one at a time."""
    indices = None
    if storage.kind == "chunked" and storage.locations is None and len(storage.offsets):
        indices, offsets, sizes, _, numbers = _chunk_columns(variable, [(storage, shift)])
    if indices is None or not indices.shape[1]:
        written = _entries_written(variable, storage, shift, dest, zmap, result, url)
        for key, offset, length, at in written:
            zmap.set_virtual_ref(key, at, offset, length, checksum=stamps.get(at))
            result.references += 1
        return
    small = sizes < SMALL_CHUNK
    for at in np.flatnonzero(small).tolist():
        data = _held(storage, int(numbers[at]))
        if data is None:
            small[at] = False
            continue
        zmap.write(dest.chunk_key(tuple(indices[at].tolist())), data)
        result.inline += 1
    kept = ~small
    indices, offsets, sizes = indices[kept], offsets[kept], sizes[kept]
    if not len(offsets):
        return
    origin = indices.min(axis=0)
    block = indices.max(axis=0) - origin + 1
    cells = math.prod(block.tolist())
    if cells > 4 * len(offsets) + 1024:  # sparse: a dense block would cost more than the chunks
        for index, offset, size in zip(indices.tolist(), offsets.tolist(), sizes.tolist(), strict=True):
            zmap.set_virtual_ref(dest.chunk_key(tuple(index)), url, offset, size, checksum=stamps.get(url))
        result.references += len(offsets)
        return
    flats = np.ravel_multi_index(tuple((indices - origin).T), tuple(block.tolist()))
    locations = np.full(cells, "", dtype=object)
    locations[flats] = url
    block_offsets = np.zeros(cells, dtype=np.uint64)
    block_lengths = np.zeros(cells, dtype=np.uint64)
    block_offsets[flats], block_lengths[flats] = offsets, sizes
    zmap.set_virtual_block(
        dest.key,
        tuple(block.tolist()),
        tuple(origin.tolist()),
        locations.tolist(),
        block_offsets,
        block_lengths,
        checksum=stamps.get(url),
    )
    result.references += len(offsets)


def _fill_attributes(variables: list[SourceVariable]) -> None:
    """A ``_FillValue`` attribute for the variables of pure Zarr v2 sources that mean their fill value as
    one: Zarr v3 readers (xarray) take only the attribute as the value meaning "missing"."""
    for variable in variables:
        fill = variable.layout.fill_value
        if variable.fill_is_missing and "_FillValue" not in variable.attrs and fill is not None:
            variable.attrs.set("_FillValue", np.asarray([fill], dtype=variable.layout.dtype.storage))


def _commit_metadata(record: dict | None) -> dict | None:
    from nczmap.integrations.virtualize.append import RECORD

    return None if record is None else {"nczmap": {RECORD: record}}


# ------------------------------------------------------------------------------------------- appending
def write_appended(
    plan: Plan,
    dataset: Dataset,
    url: ParsedURL,
    grants: list[str | Container],
    files: list[SourceFile],
    result,
    checksums: bool,
) -> None:
    """Add what ``plan`` joins to ``dataset`` (open for update; the plan's first "file" is the dataset,
    of kind ``existing``): its dimensions grown, the joined coordinate (and re-encoded variables) written
    again whole, the new files' chunks as references or, where they do not fit the dataset's layout, their
    values written into it. Nothing is saved here: the caller closes the map (or aborts it)."""
    zmap = dataset.zmap
    icechunk = url.driver == "icechunk"
    sources = [source for source in plan.sources[1:]]
    containers = as_containers(grants) if icechunk else zmap.containers
    urls = _authorize_sources(sources, containers, "repository" if icechunk else "manifest")
    if not icechunk and not url.on_s3:
        zmap.keep_large_chunks_beside()
    # what is written again whole is read (the dataset's part included) before anything changes
    rewritten = {id(v): loaded_values(v) for v in plan.variables if v.rewrite and v.load}
    _grow(plan, dataset)
    for variable in plan.variables:
        if variable.rewrite:
            _relayout(variable, _counterpart(dataset, variable), zmap)
    dataset.flush()  # the arrays grown first: Icechunk takes a chunk only inside its array
    stamps = {}
    if icechunk:
        from nczmap.zmap.icechunk import checksum

        stamps = {url: checksum(stamp) for file in files for url, stamp in file.recorded_sources().items()}
    for variable in plan.variables:
        dest = _counterpart(dataset, variable)
        pairs = [
            (storage, shift)
            for storage, shift in zip(variable.storages, variable.shifts, strict=True)
            if storage.kind != "existing"
        ]
        if variable.load:
            if variable.rewrite:
                if not icechunk:
                    zmap.keep_inline(dest.key)
                _write_loaded(variable, dest, result, rewritten[id(variable)])
            else:
                _write_new_values(variable, dest, result)
        elif icechunk:
            for storage, shift in pairs:
                url_of = urls[storage.source]
                _reference_icechunk(variable, storage, shift, dest, zmap, result, url_of, stamps)
        else:
            _reference(variable, pairs, dest, zmap, urls, result, checksums)
    for file in files:
        file.check_unchanged()  # raising here abandons the append: nothing is saved or committed
        if not icechunk:
            zmap.manifest.sources.update(file.recorded_sources())
    result.variables = len(plan.variables)


def _reference(
    variable: SourceVariable, pairs, dest, zmap, urls, result, checksums: bool, release: bool = False
) -> None:
    """The chunks of ``pairs`` (storages with their shifts along the joined axis) as references in the
    manifest (small ones written into it); chunked storages with plain chunk keys all set at once
    (``release``: their columns let go once set)."""
    if _plain_keys(dest):
        chunked = [(storage, shift) for storage, shift in pairs if storage.kind == "chunked"]
        _reference_chunked(variable, chunked, dest, zmap, urls, result, checksums, release)
        pairs = [(storage, shift) for storage, shift in pairs if storage.kind != "chunked"]
    for storage, shift in pairs:
        sums: dict[str, int] | None = {} if checksums else None
        written = _entries_written(variable, storage, shift, dest, zmap, result, urls[storage.source], sums)
        by_url: dict[str, list[tuple[str, int, int]]] = {}
        for key, offset, length, at in written:
            by_url.setdefault(at, []).append((key, offset, length))
        for at, references in by_url.items():
            result.references += zmap.set_references(at, references)
        if sums:  # after the references, which drop what was recorded for their keys
            zmap.manifest.checksums.update(sums)


def _grow(plan: Plan, dataset: Dataset) -> None:
    """The dataset's dimensions as long as the plan's (the joined one grows). A dimension of the dataset
    is the plan's that its name means in its group (pure Zarr defines one where an array uses it)."""
    for group in dataset.walk():
        planned = find_group(plan.root, group.path)
        for held in group.dimensions.values():
            dimension = planned.lookup_dimension(held.name) if planned is not None else None
            if dimension is not None and held.size != dimension.size:
                held.size = dimension.size
                dataset.writer.touch_dimension_users(held)


def _relayout(variable: SourceVariable, dest, zmap) -> None:
    """``dest`` to be written again whole in ``variable``'s layout and attributes: its chunks removed."""
    for name in zmap.search(dest.key):
        if not name.startswith(".") and name != "zarr.json":
            zmap.delete(f"{dest.key}/{name}")
    layout = variable.layout
    dest.layout.chunks = tuple(layout.chunks)
    dest.layout.dtype = layout.dtype
    dest.layout.fill = layout.fill_value
    dest.layout.codecs = layout.codecs
    dest.layout.zarr3 = None  # a Zarr v3 array's zarr.json made anew from the layout, not only reshaped
    for name in [name for name in dest.attrs if name not in variable.attrs]:
        del dest.attrs[name]
    for attribute in variable.attrs.all_typed():
        if name_differs(dest.attrs, attribute):
            dest.attrs.set(attribute.name, attribute)
    dataset_writer = dest.group.root.writer
    dataset_writer.touch(dest)


def name_differs(attrs, attribute) -> bool:
    """Whether ``attrs`` lacks ``attribute`` or holds another value or type under its name."""
    if attribute.name not in attrs:
        return True
    held = attrs.typed(attribute.name)
    if held is attribute:
        return False
    if held.nctype is not attribute.nctype:
        return True
    a, b = held.value, attribute.value
    if isinstance(a, str | list) or isinstance(b, str | list):
        return a != b
    return not np.array_equal(np.asarray(a), np.asarray(b), equal_nan=np.asarray(a).dtype.kind == "f")


def _write_new_values(variable: SourceVariable, dest, result) -> None:
    """The new files' values of a loaded variable, each into its place along the joined axis."""
    axis = variable.axis
    if axis is None:
        return
    start = variable.storages[0].shape[axis]
    for storage in variable.storages[1:]:
        values = np.asarray(storage.values())
        if variable.layout.dtype.nctype.name == "char" and values.dtype.kind == "U":
            values = np.char.encode(values, "utf-8")
        length = values.shape[axis]
        region = [slice(None)] * values.ndim
        region[axis] = slice(start, start + length)
        try:
            if start + length > dest.shape[axis]:
                raise ValueError(f"{length} steps from {start} along axis {axis}")
            dest[tuple(region)] = values
        except ValueError as error:  # never a bare numpy error, never a dimension grown by a write
            raise FormatError(
                f"{storage.source} cannot be appended: its {variable.key!r} of shape {values.shape} does not "
                f"fit the dataset's {tuple(dest.shape)} ({error})"
            ) from None
        start += length
    result.loaded.append(variable.key)
