"""Virtual NCZarr datasets over existing files: a manifest of references, the data left where it is.

:func:`virtualize` turns source files — netCDF-4/HDF5, netCDF-3 (classic, 64-bit offset, 64-bit data),
TIFF/GeoTIFF/COG — into one NCZarr dataset in a kerchunk manifest (JSON, or Parquet for ``*.parq``),
joined along an existing dimension or stacked along a new one. The package:

- :mod:`.sources`: the files (local, S3), their bytes and what the manifest records to recognise them;
- :mod:`.parsed`: what every parser yields, the netCDF model plus where each variable's data is;
- one module per source format (:mod:`.hdf5`, :mod:`.netcdf3`, :mod:`.tiff`), listed in :data:`PARSERS`;
  a new format is one module with ``sniff`` and ``parse`` plus one line there;
- :mod:`.combine`: joining files, and deciding per variable between references, loading and refusal;
- :mod:`.output`: writing the manifest.

Every variable of the sources is in the result: as references where the bytes allow, otherwise loaded
(read once and stored in the manifest, or in its chunk file beside it); a variable is refused, with a
warning, only when it cannot be represented at all (user-defined netCDF-4 types).

Every source must lie in an authorised container of the manifest: its own directory (bucket prefix, with
the endpoint it was read from), or the ``allow`` prefixes when given; :attr:`VirtualizeResult.containers`
lists them, to pass as ``containers=`` when reading. The manifest records each source's size and
modification time (an object's size and ETag), so reading through it after a source changed is an error;
with ``checksums=True`` also the crc32c of every referenced range, checked as it is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

from nczmap.collector import collector_paused
from nczmap.errors import FormatError, NCZError
from nczmap.format import Group
from nczmap.format.writer import check_name
from nczmap.integrations.virtualize import parallel
from nczmap.integrations.virtualize.append import (
    RECORD,
    Join,
    check_new_variables,
    check_order,
    digests,
    existing_file,
    options_for,
    reconcile,
)
from nczmap.integrations.virtualize.combine import DEFAULT_MAX_CHUNK_BYTES, CombineOptions, plan
from nczmap.integrations.virtualize.newdim import pattern_regex, times_from_names
from nczmap.integrations.virtualize.output import manifest_url, write
from nczmap.integrations.virtualize.parsed import (
    ColumnSpill,
    NotVirtualizable,
    ParsedFile,
    ParseOptions,
    Refusal,
)
from nczmap.integrations.virtualize.sources import SourceFile, grants, source_files
from nczmap.manifest.containers import Container, as_containers
from nczmap.progress import ProgressOption, progress_callback
from nczmap.zmap.byteranges import FAILURES, RequestPolicy

# Source formats, tried in this order: name -> module with ``sniff(read, size)`` and ``parse(file, options)``
PARSERS = {
    "netcdf4": "nczmap.integrations.virtualize.hdf5",
    "netcdf3": "nczmap.integrations.virtualize.netcdf3",
    "tiff": "nczmap.integrations.virtualize.tiff",
    "grib": "nczmap.integrations.virtualize.grib",
    "zarr": "nczmap.integrations.virtualize.stores",  # NCZarr and Zarr stores (zip archives sniffed)
}


class VirtualizeWarning(UserWarning):
    """Issued once per refused variable, and for gaps in a new dimension."""


@dataclass
class VirtualizeResult:
    manifest: str  # where the manifest was written
    variables: int = 0  # variables in the result
    references: int = 0  # chunk keys referring to source bytes
    inline: int = 0  # chunk keys of referenced variables holding their bytes in the manifest
    loaded: list[str] = field(default_factory=list)  # variables stored as data, not references
    refused: list[Refusal] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # sources left out (skip_mismatched)
    notes: list[str] = field(default_factory=list)  # gaps and the like
    formats: list[str] = field(default_factory=list)  # each source's format ("netcdf4", "netcdf3", "tiff")
    # where the references point, with how to read there (S3 endpoint...): ``containers=`` for readers
    containers: list[Container] = field(default_factory=list)


def virtualize(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    destination: str | os.PathLike[str],
    concat: str | None = None,
    allow: Sequence[str] = (),
    netcdf_version: str | None = None,
    progress: ProgressOption = None,
    *,
    new_dim: str | tuple[str, str] | None = None,
    load: Sequence[str] | str | None = None,
    skip_mismatched: bool = False,
    max_chunk_bytes: int | None = None,
    executor=None,
    checksums: bool | None = None,
    reading: ProgressOption = None,
    append: bool = False,
    concurrency: int | None = None,
    deadline: float | None = None,
    retry_budget: float | None = None,
    skip_unreadable: bool = False,
) -> VirtualizeResult:
    """Write a manifest at ``destination`` presenting ``sources`` as one NCZarr dataset.

    ``sources``: paths (globs expanded), ``file://`` URLs, http(s) URLs, S3 URLs and S3 prefixes
    (``s3://bucket/dir/`` or ``s3://bucket/dir/*.nc``, one listing) of netCDF-4/HDF5, netCDF-3 or TIFF
    files, and lists of them (``"@urls.txt"``: one source a line, blank lines and ``#`` comments ignored,
    relative paths taken from the list's directory). ``destination``: a path or URL (kerchunk JSON, or
    kerchunk's Parquet form when it ends ``.parq``; ``#mode=nczarr,manifest`` is implied;
    ``#mode=icechunk`` for an Icechunk repository).
    ``concat`` names the dimension (``time`` or ``/group/time``) several sources are joined along;
    ``new_dim`` (``"time=%Y%m%d"`` or ``("time", "%Y%m%d")``) stacks them along a new leading dimension
    whose coordinate comes from each file name. Files are joined only where every attribute that changes
    what the numbers mean agrees, or is made to (per-file time units re-encoded in one; a variable packed
    differently stored decoded, when small or named in ``load``); otherwise a FormatError names the file,
    the variable and the attribute. ``load`` names variables to store as data instead of references (the
    joined dimension's coordinate is loaded anyway). ``skip_mismatched`` leaves out (and lists) files that
    cannot be joined instead of failing. ``max_chunk_bytes`` (default 4 MiB) bounds the references made of
    contiguous data. ``allow`` lists the container prefixes references may point into (default: each
    source's directory or bucket prefix); ``netcdf_version`` is the netcdf-c release the metadata is
    written for; ``progress(done, total)`` is called as chunks are described, ``reading(done, total)`` as
    sources are parsed (``progress=True``: tqdm bars for both, a widget in a notebook). ``executor``
    parses the sources after the first: a ``concurrent.futures`` thread pool of this process, or a
    ``ProcessPoolExecutor`` or dask ``distributed.Client`` (each source is
    made again where its task runs, and its parse sent back); by default remote sources are parsed on
    ``concurrency`` threads (64; connections are reused per host), local ones one after another. The first
    file is always parsed first (the others are compared with it). ``checksums`` reads every referenced
    range once and records its crc32c in the manifest (the ``"nczmap"`` key), so that a read of a source
    rewritten in place, even with its size and modification time restored, is a StorageError naming the
    chunk.

    Remote sources cost no request before they are parsed (an S3 listing gives sizes and ETags; an HTTP
    source's first ranged GET gives its size, ETag and modification time: no HEAD) and usually one while
    parsed (the first 64 KiB hold a COG's or netCDF-3 file's metadata); later reads are conditional on the
    ETag first seen, so a source replaced while it is read is a StorageError naming it and nothing is
    written. Every request has an overall deadline of ``deadline`` seconds (default 30) plus one second a
    MB of its length, whatever the server does; failures worth another attempt (5xx, 408, 429, dropped
    connections, bodies cut short, timeouts) are retried with exponential back-off and jitter, honouring
    ``Retry-After``, up to 10 attempts within ``retry_budget`` seconds (default 120). With
    ``skip_unreadable`` a source that cannot be read (after those retries) or is in no known format is
    left out and listed in :attr:`VirtualizeResult.skipped` instead of failing the run; without it the
    error names the file.

    ``append``: add ``sources`` to the existing dataset at ``destination`` (a manifest or an Icechunk
    repository made by ``virtualize``), parsing only them: joined as the dataset was made (its recorded
    ``concat``/``new_dim``, ``load``, ``max_chunk_bytes`` and ``checksums``; giving another is an error),
    checked against what it holds, continuing its joined coordinate in order. One writer at a time; a
    refusal or failure changes nothing.
    """
    if isinstance(load, str):
        load = [name for name in load.split(",") if name]
    if max_chunk_bytes is not None and max_chunk_bytes < 1:
        raise FormatError(f"max_chunk_bytes must be a positive number of bytes, not {max_chunk_bytes}")
    reading = progress_callback(
        reading if reading is not None else progress is True, "reading sources", "files"
    )
    progress = progress_callback(progress, "virtualizing", "chunks")
    reads = _Reads(concurrency, _policy(deadline, retry_budget), skip_unreadable)
    FAILURES.forget()  # a run's sources have the whole retry budget, whatever an earlier run spent
    given = Join(
        concat,
        _new_dim(new_dim),
        tuple(load or ()),
        max_chunk_bytes or DEFAULT_MAX_CHUNK_BYTES,
        bool(checksums),
    )
    if append:
        named = {
            name
            for name, value in (
                ("concat", concat),
                ("new_dim", new_dim),
                ("load", load or None),
                ("max_chunk_bytes", max_chunk_bytes),
                ("checksums", checksums),
            )
            if value is not None
        }
        return _warned(
            _append(sources, destination, given, named, allow, skip_mismatched, executor, reading, reads)
        )
    options = options_for(given, skip_mismatched)
    files: list[SourceFile] = []
    parsed: list[ParsedFile] = []
    spill = ColumnSpill()
    try:
        with collector_paused():  # parses and the plan make many objects, freed by reference counts
            files = source_files(sources, reads.policy)
            if len(files) > 1 and concat is None and new_dim is None:
                raise FormatError(
                    f"{len(files)} sources need a dimension to join them along (concat=/--concat, or "
                    "new_dim=/--new-dim)"
                )
            files = _in_date_order(files, options)
            url = manifest_url(destination, files)
            parsed, unreadable = reads.parse(files, executor, reading, spill)
            files = [file for file in files if not any(file is bad for bad, _ in unreadable)]
            joined = plan(parsed, options)
            granted = grants(allow, files)
            result = VirtualizeResult(
                url.location, refused=list(joined.refused), containers=as_containers(granted)
            )
            result.skipped, result.notes = _listed(unreadable) + joined.skipped, joined.notes
            result.formats = [p.format for p in parsed]
            kept = [f for f in files if f.name in joined.sources]
            refused = [r.variable for r in joined.refused if r.attribute is None]
            record = dataclasses.replace(given, refused=refused, digests=digests(joined)).to_json()
            write(joined, url, granted, netcdf_version, progress, kept, result, bool(checksums), record)
    finally:
        for item in parsed:
            item.close()
        for file in files:
            file.close()
        spill.close()
    return _warned(result)


@dataclass(frozen=True)
class _Reads:
    """How sources are read: parses in flight, the requests' policy, whether unreadable ones are skipped."""

    concurrency: int | None
    policy: RequestPolicy
    skip_unreadable: bool

    def __post_init__(self) -> None:
        count = self.concurrency
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise FormatError(f"concurrency must be a positive whole number, not {count!r}")

    def parse(
        self, files: list[SourceFile], executor, reading, spill: ColumnSpill | None = None
    ) -> tuple[list[ParsedFile], list]:
        """The parses of the files that could be read, and the ``(file, why)`` of those that could not
        (always empty without ``skip_unreadable``); large chunk columns moved to ``spill``."""
        unreadable: list = []
        parsed = parallel.parse_all(
            files,
            ParseOptions(),
            PARSERS,
            executor,
            reading,
            concurrency=self.concurrency,
            skipped=unreadable if self.skip_unreadable else None,
            spill=spill,
        )
        return parsed, unreadable


def _policy(deadline: float | None, budget: float | None) -> RequestPolicy:
    """The requests' policy for ``deadline`` and ``retry_budget`` (the defaults when None)."""
    chosen = {"deadline": deadline, "budget": budget}
    try:
        return RequestPolicy(**{name: value for name, value in chosen.items() if value is not None})
    except ValueError as exc:
        raise FormatError(f"{str(exc).replace('budget', 'retry_budget')}") from None


def _listed(unreadable: list) -> list[tuple[str, str]]:
    return [(file.name, why) for file, why in unreadable]


def _in_date_order(files: list[SourceFile], options: CombineOptions) -> list[SourceFile]:
    """New-dimension sources in the order of the result (its first file is parsed in full)."""
    if options.new_dim is None:
        return files
    times = times_from_names([file.name for file in files], options.new_dim[1])
    return [file for _, file in sorted(zip(times, files, strict=True), key=lambda pair: pair[0])]


def _warned(result: VirtualizeResult) -> VirtualizeResult:
    for refusal in result.refused:
        warnings.warn(str(refusal), VirtualizeWarning, stacklevel=3)
    for source, why in result.skipped:
        warnings.warn(f"{source} left out: {why}", VirtualizeWarning, stacklevel=3)
    for note in result.notes:
        warnings.warn(note, VirtualizeWarning, stacklevel=3)
    return result


def _append(
    sources,
    destination,
    given: Join,
    named: set[str],
    allow,
    skip_mismatched: bool,
    executor,
    reading,
    reads: _Reads,
) -> VirtualizeResult:
    """:func:`virtualize` with ``append``: see :mod:`.append`."""
    from nczmap.format import open_on
    from nczmap.integrations.virtualize.output import write_appended
    from nczmap.zmap import open_map

    files: list[SourceFile] = []
    parsed: list[ParsedFile] = []
    try:
        files = source_files(sources, reads.policy)
        url = manifest_url(destination, files)
        if url.driver == "manifest" and url.on_s3:
            raise FormatError(
                f"cannot append to {url.original!r}: a manifest in S3 has no writer lock, so two appends "
                "could lose one; keep the archive in an Icechunk repository (#mode=icechunk) to append in S3"
            )
        granted = grants(allow, files)
        extra = {"virtual_containers": as_containers(granted)} if url.driver == "icechunk" else {}
        zmap = open_map(url, "r+", containers=granted, **extra)
        try:
            dataset = open_on(zmap, "r+")
            join = reconcile(_recorded(zmap), given, named, url.location)
            options = options_for(join, skip_mismatched)
            _refuse_known_sources(zmap, files, url.location)
            files = _in_date_order(files, options)
            parsed, unreadable = reads.parse(files, executor, reading)
            files = [file for file in files if not any(file is bad for bad, _ in unreadable)]
            existing = existing_file(dataset, url.location, join, parsed[0].model if parsed else None)
            joined = plan([existing, *parsed], options)
            check_new_variables(joined, existing, url.location)
            check_order(joined, join.concat or join.new_dim[0], url.location)
            result = VirtualizeResult(url.location, containers=as_containers(granted))
            result.skipped, result.notes = _listed(unreadable) + joined.skipped, joined.notes
            result.formats = [p.format for p in parsed]
            kept = [f for f in files if f.name in joined.sources]
            if not kept:
                raise FormatError(f"no file to append to {url.location}: every one was left out")
            write_appended(joined, dataset, url, granted, kept, result, join.checksums)
            _record(zmap, join)
            dataset.flush()
        except BaseException:
            zmap.abort()
            raise
        zmap.close()
    finally:
        for item in parsed:
            item.close()
        for file in files:
            file.close()
    return result


def _recorded(zmap) -> Join | None:
    from nczmap.zmap.icechunk import IcechunkMap

    if isinstance(zmap, IcechunkMap):
        found = zmap.latest_metadata("nczmap")
        record = found.get(RECORD) if isinstance(found, dict) else None
    else:
        record = zmap.manifest.virtualize
    return None if record is None else Join.from_json(record, zmap.location)


def _record(zmap, join: Join) -> None:
    from nczmap.zmap.icechunk import IcechunkMap

    if isinstance(zmap, IcechunkMap):
        zmap.commit_metadata = {"nczmap": {RECORD: join.to_json()}}
        zmap.rebase = False  # another commit since this one began: refused, never merged into
    else:
        zmap.manifest.virtualize = join.to_json()


def _refuse_known_sources(zmap, files: list[SourceFile], where: str) -> None:
    """A file the dataset already refers to is not appended again."""
    recorded = getattr(getattr(zmap, "manifest", None), "sources", {})
    for file in files:
        if file.url in recorded:
            raise FormatError(f"{file.shown} is already in {where}: it is not appended twice")


def is_source_file(path: str) -> bool:
    """Whether ``path`` is a local file in a format :func:`virtualize` reads (not a store, not a zip)."""
    from nczmap.integrations.virtualize.sources import LocalFile

    if not os.path.isfile(path):
        return False
    try:
        file = LocalFile(os.path.realpath(path), path)
    except NCZError:
        return False
    try:
        parser_for(file)
    except NCZError:  # not a source format, or unreadable (opened only now)
        return False
    finally:
        file.close()
    return True


@contextlib.contextmanager
def open_source_file(path: str):
    """A netCDF-4/HDF5, netCDF-3 or TIFF file opened read-only as an nczmap dataset: virtualized into a
    temporary manifest (nothing is copied), so it reads exactly as its manifest would."""
    from nczmap.api import open_dataset

    with tempfile.TemporaryDirectory(prefix="nczmap-") as folder:
        with warnings.catch_warnings(record=True) as refused:
            warnings.simplefilter("always", VirtualizeWarning)
            result = virtualize([path], os.path.join(folder, "refs.json"))
        for warning in refused:
            warnings.warn(str(warning.message), VirtualizeWarning, stacklevel=3)
        grants = [*result.containers, folder + "/"]
        with open_dataset(f"file://{result.manifest}#mode=nczarr,manifest", containers=grants) as dataset:
            dataset.source_format = result.formats[0]  # ncdump prints netCDF-3 files a little differently
            yield dataset


def _new_dim(value: str | tuple[str, str] | None) -> tuple[str, str] | None:
    """``(name, pattern)``, checked before any source is read: a name the format allows (no ``/``), a
    pattern of supported directives."""
    if value is None:
        return None
    if isinstance(value, tuple):
        name, pattern = value
    else:
        name, equals, pattern = value.partition("=")
        if not equals or not name or not pattern:
            raise FormatError(f"new_dim {value!r} must be NAME=PATTERN, such as time=%Y%m%d")
    check_name(name, "new dimension", Group("/", None))
    pattern_regex(pattern)
    return name, pattern


def parser_for(file: SourceFile):
    """The parser module whose format ``file`` is in; FormatError naming the file if none."""
    return parallel.parser_for(file, PARSERS)


__all__ = [
    "PARSERS",
    "NotVirtualizable",
    "Refusal",
    "VirtualizeResult",
    "VirtualizeWarning",
    "parser_for",
    "virtualize",
]
