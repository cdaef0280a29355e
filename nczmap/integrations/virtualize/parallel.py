"""Parsing many sources: the first in full, the others as its twins where they can be, on an executor.

A collection of files written alike (a COG series) has one model: the first file is parsed in full and
each other file's parser (``parse_twin``) only checks that its metadata equals the first's and reads where
its chunks are; a file unlike the first is parsed in full (and then checked against it by the combiner).

Where the parses run:

- local files, no executor: one after another (there is no waiting to overlap);
- remote files, no executor: on up to eight threads;
- a ``concurrent.futures.ThreadPoolExecutor``: on it, sharing this process's open sources;
- any other executor (``ProcessPoolExecutor``, a dask ``distributed.Client``, anything with
  ``submit(fn, *args)`` returning a future with ``result()``): each source is opened again where the task
  runs, and its parse comes back pickled, its references to that source bound to this process's.
"""

from __future__ import annotations

import functools
import importlib
import io
import pickle
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from nczmap.errors import FormatError, NCZError
from nczmap.integrations.virtualize.parsed import ParsedFile, ParseOptions
from nczmap.integrations.virtualize.sources import LocalFile, SourceFile, source_file

Progress = Callable[[int, int], None]


def parse_all(
    files: list[SourceFile],
    options: ParseOptions,
    parsers: Mapping[str, str],
    executor=None,
    reading: Progress | None = None,
) -> list[ParsedFile]:
    """Every file parsed, in order (``parsers``: format name -> parser module name, tried in order); on
    a failure the parses made are closed and it is raised."""
    parsers = dict(parsers)
    first = parse_one(files[0], options, parsers)
    if reading is not None:
        reading(1, len(files))
    try:
        module = parsers[first.format]
        twins = first.fingerprint is not None and hasattr(importlib.import_module(module), "parse_twin")
        task = functools.partial(
            _parse_like,
            options=options,
            parsers=parsers,
            fingerprint=first.fingerprint if twins else None,
            module=module,
        )
        rest = files[1:]
        others = _collect(rest, _futures(rest, task, executor), reading, len(files))
    except BaseException:
        first.close()
        raise
    for other in others:
        if other.root is None:
            _bind_twin(other, first)
    return [first, *others]


def parse_one(file: SourceFile, options: ParseOptions, parsers: Mapping[str, str]) -> ParsedFile:
    module = parser_for(file, parsers)
    try:
        return module.parse(file, options)
    except OSError as exc:  # h5py's error for a failed read of a file object: ours is more useful
        if isinstance(exc, NCZError) or file.error is None:
            raise
        raise file.error from None


def parser_for(file: SourceFile, parsers: Mapping[str, str]):
    """The parser module whose format ``file`` is in; FormatError naming the file if none."""
    for module_name in parsers.values():
        module = importlib.import_module(module_name)
        if module.sniff(file.read_head, file.size):
            return module
    raise FormatError(f"{file.shown!r} is not a file nczmap can virtualize (netCDF-4/HDF5, netCDF-3 or TIFF)")


def _parse_like(
    file: SourceFile, options: ParseOptions, parsers: dict[str, str], fingerprint: object, module: str
) -> ParsedFile:
    """``file`` as a twin of the first file (whose parser is ``module``) when it is one, else parsed in
    full."""
    if fingerprint is not None:
        twin = importlib.import_module(module).parse_twin(file, fingerprint, options)
        if twin is not None:
            return twin
    return parse_one(file, options, parsers)


def _bind_twin(twin: ParsedFile, first: ParsedFile) -> None:
    """A twin shares ``first``'s model; the storages its parser did not make (values computed from the
    metadata, the same in both) are copies of ``first``'s, named for the twin."""
    twin.like = first
    for group in first.root.walk():
        for variable in group.variables.values():
            if variable.key not in twin.storages:
                twin.storages[variable.key] = variable.storages[0].named(twin.source)


# ---------------------------------------------------------------------------------------- executors
def _futures(files: list[SourceFile], task, executor) -> list:
    if executor is None and all(isinstance(f, LocalFile) for f in files):
        return [_Later(task, f) for f in files]  # local: one by one
    if executor is None:
        pool = ThreadPoolExecutor(max_workers=min(8, len(files)) or 1)
        try:
            return [pool.submit(task, f) for f in files]
        finally:
            pool.shutdown(wait=False)
    if isinstance(executor, ThreadPoolExecutor):
        return [executor.submit(task, f) for f in files]
    extra = {"pure": False} if type(executor).__module__.startswith("distributed") else {}
    return [_Returned(executor.submit(_parse_elsewhere, _spec(f), task, **extra), f) for f in files]


def _spec(file: SourceFile) -> str:
    """How another process opens ``file``: its URL (``file://`` with the real path, or as given)."""
    return file.url if isinstance(file, LocalFile) else file.shown


def _parse_elsewhere(spec: str, task) -> bytes:
    """Run in another process or machine: the source opened there, parsed, and the parse pickled with
    the source itself left out (the caller binds its own)."""
    file = source_file(spec)
    try:
        parsed = task(file)
        try:
            buffer = io.BytesIO()
            _Pickler(buffer, file).dump(parsed)
            return buffer.getvalue()
        finally:
            parsed.close()
    finally:
        file.close()


class _Pickler(pickle.Pickler):
    def __init__(self, buffer, source: SourceFile) -> None:
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self.source = source

    def persistent_id(self, obj):
        return "source" if obj is self.source else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, source: SourceFile) -> None:
        super().__init__(io.BytesIO(data))
        self.source = source

    def persistent_load(self, pid):
        if pid != "source":
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self.source


class _Returned:
    """A parse made elsewhere, bound to this process's ``file`` when its result is asked for."""

    def __init__(self, future, file: SourceFile) -> None:
        self.future, self.file = future, file

    def result(self) -> ParsedFile:
        return _Unpickler(self.future.result(), self.file).load()


class _Later:
    """A parse run when its result is asked for, as ``future.result()``."""

    def __init__(self, function, *args) -> None:
        self.function, self.args = function, args

    def result(self) -> ParsedFile:
        return self.function(*self.args)


def _collect(files: list[SourceFile], futures, reading: Progress | None, total: int) -> list[ParsedFile]:
    """Each future's ParsedFile, in order; on the first failure the others are closed and it is raised
    (local files: the rest are not parsed)."""
    parsed: list[ParsedFile] = []
    error: BaseException | None = None
    for done, future in enumerate(futures, total - len(files) + 1):
        try:
            parsed.append(future.result())
        except BaseException as exc:  # keep the others' results to close them
            error = error or exc
            if isinstance(future, _Later):
                break
        if reading is not None:
            reading(done, total)
    if error is not None:
        for item in parsed:
            item.close()
        raise error
    return parsed
