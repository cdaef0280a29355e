"""Copy any dataset nczmap reads (or a netCDF-4/HDF5 file, through netCDF4-python) to any URL it writes.

Chunk by chunk in bounded memory: when source and destination store an array identically (same dtype,
chunks, codecs, separator), chunk bytes are copied as they are, without decoding; otherwise each
destination chunk is read from the source as a region and encoded once. Missing chunks stay missing.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from nczmap.api import create_dataset, format_options, open_dataset
from nczmap.concurrency import run_each
from nczmap.errors import DatasetExists, FormatError, NCZError, from_os_error
from nczmap.format import Dataset, FormatOptions, Group, Variable, open_on
from nczmap.format.writer import DEFAULT_MAXSTRLEN
from nczmap.progress import Progress, ProgressOption, progress_callback
from nczmap.url import ParsedURL, parse_url
from nczmap.zmap import locking, open_map
from nczmap.zmap.file import check_replaceable

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def copy(
    source: str,
    destination: str,
    netcdf_version: str | None = None,
    progress: ProgressOption = None,
    *,
    keep_filters: bool = False,
    containers: object = None,
) -> None:
    """Copy ``source`` (a URL or a netCDF-4 file) to a new dataset at ``destination``.

    A destination that is the source, lies inside it or contains it (however spelled) is refused before
    anything is written: creating it would empty the source. The copy appears whole or not at all where
    the storage allows it: a directory store is built beside the destination and moved into place when
    complete, a zip archive is committed by rename at close. Elsewhere (S3) the root group's metadata is
    written last (as every flush does), so a copy cut short has none and does not open.
    ``containers`` grants a manifest source more places to read from; ``keep_filters`` keeps compression
    that the target release cannot decode as distributed (``UnfilteredWarning`` otherwise).
    """
    check_distinct(source, destination)
    url = parse_url(destination)
    progress = progress_callback(progress, "copying", "B")
    if _is_hdf5(source):
        from nczmap.integrations.netcdf4 import open_netcdf4

        reader = open_netcdf4(source)
    else:
        reader = open_dataset(source, "r", **({"containers": containers} if containers else {}))
    try:
        _refuse_unreadable(reader, source)
        if url.driver == "file":
            _copy_staged(reader, url, format_options(url, netcdf_version, keep_filters), progress)
        elif url.driver == "icechunk" and _is_manifest(reader):
            _copy_references(reader, url, format_options(url, netcdf_version, keep_filters), progress)
        elif url.driver == "manifest" and _is_repository(reader):
            _export_references(reader, url, format_options(url, netcdf_version, keep_filters), progress)
        else:
            with create_dataset(url, netcdf_version, keep_filters=keep_filters) as target:
                _copy_into(reader, target, progress)
    finally:
        reader.close()


def open_target(zmap, options: FormatOptions) -> Dataset:
    """The format layer's new dataset on ``zmap``; the map abandoned (nothing written) if it cannot be
    made."""
    try:
        return open_on(zmap, "w", options)
    except BaseException:
        zmap.abort()
        raise


def _is_manifest(reader: Group) -> bool:
    from nczmap.zmap.manifest import ManifestMap

    return isinstance(getattr(reader, "zmap", None), ManifestMap)


def _copy_references(
    reader: Dataset, url: ParsedURL, options: FormatOptions, progress: Progress | None
) -> None:
    """A manifest into an Icechunk repository: its references to sources become virtual chunks (see
    ``IcechunkMap.copy_from``), the repository's virtual chunk containers the manifest's grants; its arrays
    keep their codecs (the chunks are the sources' bytes). Nothing is committed if anything fails."""
    containers = reader.zmap.containers
    zmap = open_map(url, "w", containers=containers, virtual_containers=containers)
    with open_target(zmap, options) as target:
        _copy_group(reader, target)
        keep_codecs(target, [v for g in reader.walk() for v in g.variables.values()])
        target.flush()  # Icechunk takes a chunk only once its array exists
        _copy_into(reader, target, progress, model=False)


def _is_repository(reader: Group) -> bool:
    from nczmap.zmap.icechunk import IcechunkMap

    return isinstance(getattr(reader, "zmap", None), IcechunkMap)


def _export_references(
    reader: Dataset, url: ParsedURL, options: FormatOptions, progress: Progress | None
) -> None:
    """An Icechunk repository into a manifest: its virtual chunks become references (authorised by the
    grants the repository was opened with), its native and inline chunks data (in the manifest, or in
    its chunk file beside it); arrays keep their codecs where the manifest's format holds them."""
    source = reader.zmap
    zmap = open_map(url, "w", containers=source.grants)
    if not url.on_s3:
        zmap.keep_large_chunks_beside()
    with open_target(zmap, options) as target:
        variables = [v for g in reader.walk() for v in g.variables.values()]
        _copy_group(reader, target)
        keep_codecs(target, variables)
        for variable in variables:  # kerchunk's chunk names (Parquet references know no other)
            dest = _counterpart(target, variable)
            if dest.layout.separator != ".":
                dest.layout.separator = "."
                target.writer.touch(dest)
        total = sum(_chunk_count(v) * _chunk_bytes(v) for v in variables)
        done = 0
        witnesses: dict[str, str] = {}  # each source referred to -> a chunk key of it in the repository
        for variable in variables:
            dest = _counterpart(target, variable)
            same = _same_storage(variable, dest)  # else the data is copied, decoded and encoded again
            referenced = _export_virtual(variable, dest, witnesses) if same else set()
            rest = [index for index in chunk_grid(dest) if index not in referenced]
            copy = functools.partial(_copy_raw if same else _copy_region, variable, dest)
            for _ in run_each(functools.partial(copy, index) for index in rest):
                done += _chunk_bytes(dest)
                if progress is not None:
                    progress(done, total)
            done += len(referenced) * _chunk_bytes(dest)
        _record_exported_sources(source, zmap, witnesses)


def _record_exported_sources(repository, manifest, witnesses: dict[str, str]) -> None:
    """Record each source the manifest refers to (size and modification time, or size and ETag), as a
    manifest made by ``virtualize`` records it, so that reads through it detect a changed source.

    What the repository knows of a source (the ETag or last-modified time each virtual chunk carries) is
    not readable through icechunk's API, but icechunk compares it with the source on every read: one chunk
    of each source is read through the repository first (a source changed since is a StorageError and
    nothing is written), then the source is looked at as it is now, which is what gets recorded."""
    from nczmap.integrations.virtualize.sources import source_file
    from nczmap.manifest.containers import locate

    recorded: dict[str, dict] = {}

    def vouch(url: str, key: str) -> None:
        repository.read(key)
        _, container, _ = locate(url, None, manifest.containers, key)
        found = source_file(url, options=dict(container.options))
        try:
            recorded[url] = found.recorded()
        finally:
            found.close()

    for _ in run_each(functools.partial(vouch, url, key) for url, key in witnesses.items()):
        pass
    for url in sorted(recorded):
        manifest.manifest.sources[url] = recorded[url]


def _export_virtual(variable: Variable, dest: Variable, witnesses: dict[str, str]) -> set[tuple[int, ...]]:
    """The virtual chunks of ``variable`` (in a repository) as references of ``dest`` (in a manifest);
    the chunk indices set. ``witnesses`` gets a chunk key of each source not yet in it."""
    from icechunk import ChunkType

    manifest = dest.group.root.zmap
    done: set[tuple[int, ...]] = set()
    for coords, kinds, paths, offsets, lengths, _ in variable.group.root.zmap.chunk_references(variable.key):
        rows = np.flatnonzero(kinds == int(ChunkType.virtual)).tolist()
        indices = [tuple(coords[row].tolist()) for row in rows]
        keys = [dest.chunk_key(index) for index in indices]
        names = [key[len(dest.key) + 1 :] for key in keys]
        urls = [paths[row] for row in rows]
        for url, index in zip(urls, indices, strict=True):
            if url not in witnesses:
                witnesses[url] = variable.chunk_key(index)
        offsets, lengths = offsets[rows].tolist(), lengths[rows].tolist()
        if all("/" not in name for name in names):
            manifest.set_chunk_references(dest.key, names, urls, offsets, lengths)
        else:  # nested chunk keys: one at a time
            for key, url, offset, length in zip(keys, urls, offsets, lengths, strict=True):
                manifest.set_reference(key, url, offset, length)
        done.update(indices)
    return done


def keep_codecs(target: Dataset, variables: list[Variable]) -> None:
    """Arrays of ``target`` whose chunks are (or refer to) ``variables``' bytes keep the source's own
    codecs (zlib as ``numcodecs.zlib``, not the gzip a new Zarr v3 array gets)."""
    for variable in variables:
        dest = _counterpart(target, variable)
        if dest.layout.codecs.configs != variable.layout.codecs.configs:
            dest.layout.codecs = variable.layout.codecs
            target.writer.touch(dest)


def _copy_into(reader: Group, target: Dataset, progress: Progress | None, model: bool = True) -> None:
    """Copy everything (the data only, unless ``model``); ``progress(done, total)`` counts bytes of values
    (decoded chunk sizes)."""
    if model:
        _copy_group(reader, target)
    total = sum(_chunk_count(v) * _chunk_bytes(v) for g in target.walk() for v in g.variables.values())
    done = 0
    for group in reader.walk():
        for variable in group.variables.values():
            dest = _counterpart(target, variable)
            step = _chunk_bytes(dest)
            for _ in _copy_data(variable, dest):
                done += step
                if progress is not None:
                    progress(done, total)


def _chunk_bytes(variable: Variable) -> int:
    return math.prod(variable.layout.chunks or (1,)) * variable.layout.dtype.itemsize


def _copy_staged(reader: Group, url: ParsedURL, options: FormatOptions, progress: Progress | None) -> None:
    """Copy into a directory store built beside the destination, then moved into place whole.

    The destination's writer lock is held throughout, so a second copy (or writer) is refused or waits. A
    killed copy leaves only its staging directory, which the next holder of the lock removes.
    """
    lock = locking.acquire(url.path)
    try:
        final = lock.dataset
        check_replaceable(final)  # refuse before copying anything, not after
        staging = locking.sibling_path(final, "copy")
        zmap = open_map(replace(url, path=staging), "w", lock=False)
        with open_target(zmap, options) as target:
            _copy_into(reader, target, progress)
        try:
            _move_into_place(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    finally:
        lock.release()


def _move_into_place(staging: str, final: str) -> None:
    """Rename the complete copy to ``final``; a store already there is moved aside first, then removed."""
    try:
        if not check_replaceable(final):
            os.rename(staging, final)
            return
        old = locking.sibling_path(final, "old")
        os.rename(final, old)
        os.rename(staging, final)  # a crash before this leaves ``old``, which the next lock holder restores
        shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        if isinstance(exc, NCZError):
            raise
        raise from_os_error(exc, f"cannot move the copy into place at {final!r}") from exc


def check_distinct(source: str, destination: str) -> None:
    """Refuse a copy whose destination overlaps its source: same place, inside it, or around it."""
    here, there = _place(parse_url(source)), _place(parse_url(destination))
    if here[0] != there[0]:
        return
    a, b = here[1], there[1]
    if a == b or b.startswith(a + "/") or a.startswith(b + "/"):
        how = "is" if a == b else ("is inside" if b.startswith(a + "/") else "contains")
        raise DatasetExists(
            f"refusing to copy {source!r} to {destination!r}: the destination {how} the source, "
            "and creating it would destroy the data being copied"
        )


def _place(url: ParsedURL) -> tuple[tuple, str]:
    """(storage, path) with every spelling resolved: symlinks and ``..`` locally, bucket + key on S3."""
    if url.on_s3:
        return ("s3", url.endpoint, url.bucket), url.path.strip("/")
    return ("local",), os.path.realpath(url.path).rstrip("/") or "/"


def _is_hdf5(source: str) -> bool:
    if "://" in source or "#" in source:
        return False
    try:
        with open(source, "rb") as handle:
            return handle.read(8) == HDF5_SIGNATURE
    except OSError:
        return False


def _copy_group(source: Group, target: Group) -> None:
    for attribute in source.attrs.all_typed():
        target.attrs.set(attribute.name, attribute)
    for dim in source.dimensions.values():
        created = target.create_dimension(dim.name, None if dim.unlimited else dim.size)
        created.size = dim.size  # an unlimited dimension starts at its current length
    for name, variable in source.variables.items():
        _create_like(target, name, variable)
    for name, child in source.groups.items():
        _copy_group(child, target.create_group(name))


def _create_like(target: Group, name: str, variable: Variable) -> None:
    layout = variable.layout
    storage = layout.dtype.storage
    options = dict(
        fill_value=layout.fill_value,
        chunks=None if layout.scalar else layout.chunks,
        filters=list(layout.codecs.filters) or None,
        compressor=layout.codecs.compressor,
        separator=layout.separator,
    )
    if variable.nctype.name == "string":
        # a Zarr v3 vlen string has no width: the longest value's, if the destination's default is short
        options["maxstrlen"] = _longest_string(variable) if layout.vlen else storage.itemsize
    elif storage.itemsize > 1 and storage.byteorder in "<>":
        options["endian"] = "big" if storage.byteorder == ">" else "little"
    dims = [dim.path for dim in variable.dims]
    created = target.create_variable(name, dims, variable.nctype, **options)
    for implicit in list(created.attrs):
        del created.attrs[implicit]  # the source's own attributes, _FillValue included, follow
    for attribute in variable.attrs.all_typed():
        created.attrs.set(attribute.name, attribute)


def _longest_string(variable: Variable) -> int | None:
    values = variable.read().ravel()
    longest = max((len(str(v).encode()) for v in values), default=0)
    return longest if longest > DEFAULT_MAXSTRLEN else None


def _counterpart(target: Dataset, variable: Variable) -> Variable:
    group: Group = target
    for name in variable.group.path.strip("/").split("/"):
        if name:
            group = group.groups[name]
    return group.variables[variable.name]


def _chunk_count(variable: Variable) -> int:
    layout = variable.layout
    if layout.scalar:
        return 1
    return math.prod(math.ceil(s / c) for s, c in zip(layout.shape, layout.chunks, strict=True))


def _refuse_unreadable(reader, source: str) -> None:
    """A copy holds every array of its source: arrays the reader skipped (damaged metadata, a type it
    cannot read) make it refuse, before anything is written, rather than leave them out."""
    problems = getattr(reader, "problems", None) or []
    if problems:
        named = "; ".join(f"{key!r}: {why}" for key, why in problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise FormatError(
            f"cannot copy {source!r}: {len(problems)} of its arrays cannot be read, and a copy without "
            f"them would lose them: {named}{more}"
        )


def chunk_grid(variable: Variable) -> Iterator[tuple[int, ...]]:
    layout = variable.layout
    if layout.scalar:
        yield ()
        return
    counts = [math.ceil(s / c) for s, c in zip(layout.shape, layout.chunks, strict=True)]
    if 0 in counts:
        return
    index = [0] * len(counts)  # an odometer: itertools.product would hold every axis's range at once
    while True:
        yield tuple(index)
        axis = len(counts) - 1
        while axis >= 0 and index[axis] == counts[axis] - 1:
            index[axis] = 0
            axis -= 1
        if axis < 0:
            return
        index[axis] += 1


def _same_storage(source: Variable, dest: Variable) -> bool:
    a, b = source.layout, dest.layout
    return (
        getattr(source.group.root, "zmap", None) is not None
        and a.dtype.storage == b.dtype.storage
        and a.dtype.chunk == b.dtype.chunk  # the bytes, not only the declaration (netcdf-c bug 18)
        and a.chunks == b.chunks
        and a.codecs.configs == b.codecs.configs
        and a.order == b.order
        and (a.transpose, a.vlen) == (b.transpose, b.vlen)
        and a.shards is None  # a key holds a whole shard, not one chunk
        and b.shards is None
    )


def _copy_data(source: Variable, dest: Variable) -> Iterator[None]:
    """Copy every chunk (a few at a time), yielding once per chunk done."""
    copy_chunk = _copy_raw if _same_storage(source, dest) else _copy_region
    yield from run_each(lambda index=index: copy_chunk(source, dest, index) for index in chunk_grid(dest))


def _copy_raw(source: Variable, dest: Variable, index: tuple[int, ...]) -> None:
    dest.group.root.zmap.copy_from(source.group.root.zmap, source.chunk_key(index), dest.chunk_key(index))


def _copy_region(source: Variable, dest: Variable, index: tuple[int, ...]) -> None:
    if dest.layout.scalar:
        dest[...] = source[...]
        return
    region = tuple(
        slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(index, dest.chunks, dest.shape, strict=True)
    )
    empty = source.region_is_empty(region)
    if empty:
        return
    values = source[region]
    if empty is None and _all_fill(values, dest.fill_value):
        return  # the source cannot say whether this chunk exists: an all-fill chunk need not
    dest[region] = values


def _all_fill(values: np.ndarray, fill: object) -> bool:
    if fill is None or values.dtype == object:
        return False
    if values.dtype.kind == "f" and np.isnan(fill):
        return bool(np.isnan(values).all())
    return bool((values == fill).all())
