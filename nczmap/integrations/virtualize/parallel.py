"""Parsing many sources: the first in full, the others as its twins where they can be, on an executor.

A collection of files written alike (a COG series) has one model: the first file is parsed in full and
each other file's parser (``parse_twin``) only checks that its metadata equals the first's and reads where
its chunks are; a file unlike the first is parsed in full (and then checked against it by the combiner).
The first file is parsed before the others start (they need its fingerprint).

Where the parses run:

- local files, no executor: one after another (there is no waiting to overlap);
- files on web servers, no executor: their first reads made together from this thread (``concurrency``
  in flight, :data:`CONCURRENCY` by default), the first file and its twins parsed here as their first
  blocks come in (:class:`_Early`); what remains (files that need more reads, or no twins) as below;
- remote files (or some), no executor: on ``concurrency`` threads (a parse mostly waits on a request or
  two, so many in flight fit latency; connections are shared);
- a ``concurrent.futures.ThreadPoolExecutor``: on it, sharing this process's sources;
- any other executor (``ProcessPoolExecutor``, a dask ``distributed.Client``, anything with
  ``submit(fn, *args)`` returning a future with ``result()``): each source is made again where the task
  runs (with what is known of it: a listing's size and ETag, so its reads are conditional on them), and
  its parse comes back pickled, its references to that source bound to this process's, along with what
  was learnt of the source there (checked against what this process knows).

Each source is let go of once parsed (``SourceFile.release``: a local file's descriptor closed, a remote
one's bytes but its first block dropped), so a collection larger than the descriptor limit parses.

A failure stops the run (the parses not started are cancelled) and is raised naming its file, unless
``skipped`` is given: then a file that cannot be read (after the request retries) or is in no known format
is left out and listed there, ``(file, why)``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import pickle
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from nczmap.errors import AccessDenied, DataError, DriverNotAvailable, FormatError, NCZError, StorageError
from nczmap.integrations.virtualize.parsed import ColumnSpill, ParsedFile, ParseOptions
from nczmap.integrations.virtualize.sources import (
    HttpFile,
    LocalFile,
    NotHeld,
    RemoteFile,
    SourceFile,
    source_file,
    start_together,
)
from nczmap.progress import Progress
from nczmap.zmap.byteranges import RequestPolicy

CONCURRENCY = 128  # remote sources parsed at once by default
AHEAD = 1024  # first blocks fetched together ahead of parses on threads (64 MiB): the rest left to those


def parse_all(
    files: list[SourceFile],
    options: ParseOptions,
    parsers: Mapping[str, str],
    executor=None,
    reading: Progress | None = None,
    *,
    concurrency: int | None = None,
    skipped: list[tuple[SourceFile, str]] | None = None,
    spill: ColumnSpill | None = None,
) -> list[ParsedFile]:
    """Every file parsed, in order (``parsers``: format name -> parser module name, tried in order); on
    a failure the parses made are closed and it is raised, naming the file. With ``skipped`` (a list),
    unreadable files and files of no known format are left out of the result and appended there. With
    ``spill``, each parse's large chunk columns are moved there as it arrives."""
    parsers = dict(parsers)
    total = len(files)
    width = CONCURRENCY if concurrency is None else concurrency
    early = _Early(files, options, parsers, reading)
    if executor is None and width > 1 and any(isinstance(f, HttpFile) for f in files):
        early.run(width)
    first, at = early.first, 1
    while first is None:
        if at > total:
            names = ", ".join(file.shown for file, _ in (skipped or [])[-3:])
            raise FormatError(f"none of the {total} sources could be read (the last: {names})")
        file = files[at - 1]
        try:
            first = _released(file, parse_one, file, options, parsers)
        except Exception as exc:
            _skip_or_raise(file, exc, skipped)
        if reading is not None:
            reading(at, total)
        at += first is None
    parsed = early.parsed
    try:
        task = early.task or _task_like(first, options, parsers)[0]
        rest = [index for index in range(at, total) if index not in parsed]
        arrived = None
        if spill is not None:
            first.spill(spill)
            arrived = functools.partial(ParsedFile.spill, to=spill)
        chosen = [files[i] for i in rest]
        found = iter(_run(chosen, task, executor, concurrency, reading, total, skipped, arrived))
        others = [parsed[index] if index in parsed else next(found) for index in range(at, total)]
        for early_parse in parsed.values() if spill is not None else ():
            early_parse.spill(spill)
    except BaseException:
        for item in [first, *parsed.values()]:
            item.close()
        raise
    others = [other for other in others if other is not None]
    _bind_twins([other for other in others if other.root is None and other.like is None], first)
    return [first, *others]


def _arrive(arrived: Callable[[ParsedFile], None] | None, parsed: ParsedFile | None) -> None:
    if arrived is not None and parsed is not None:
        arrived(parsed)


def _task_like(first: ParsedFile, options: ParseOptions, parsers: dict[str, str]) -> tuple:
    """The parse of the other files (as twins of ``first`` where its parser makes them), and whether it
    makes twins."""
    module = parsers[first.format]
    twins = first.fingerprint is not None and hasattr(importlib.import_module(module), "parse_twin")
    task = functools.partial(
        _parse_like,
        options=options,
        parsers=parsers,
        fingerprint=first.fingerprint if twins else None,
        module=module,
    )
    return task, twins


class _Early:
    """Web sources parsed as their first blocks come in, on this thread: the first reads are made together
    (``start_together``), the first file is parsed as soon as its block is in (with requests if it needs
    more), and the files its parser makes twins of are parsed from the bytes they hold as theirs arrive,
    while the others' are on their way: no thread a file, no request more. A twin that needs bytes beyond
    its first block (``NotHeld``) or whose parse fails is left to the usual paths, as is everything when the
    first file fails (then no more first reads are made together) or makes no twins (then the first reads go
    on together up to :data:`AHEAD` files, their parses made on threads with the blocks held; the rest make
    their own, so that a catalogue's first blocks are not all held at once)."""

    def __init__(
        self, files: list[SourceFile], options: ParseOptions, parsers: dict[str, str], reading
    ) -> None:
        self.files, self.options, self.parsers, self.reading = files, options, parsers, reading
        self.first: ParsedFile | None = None
        self.task = None  # the twins' parse, once the first makes twins
        self.parsed: dict[int, ParsedFile] = {}
        self.waiting: list[SourceFile] = []  # arrived before the first was parsed
        self.arrivals = 0
        self.failed = False  # the first file's parse failed here
        self.position = {id(file): index for index, file in enumerate(files)}

    def run(self, width: int) -> None:
        try:
            start_together(self.files, width, self.arrived)
        except BaseException:
            for item in [self.first, *self.parsed.values()]:
                if item is not None:
                    item.close()
            raise

    def arrived(self, file: SourceFile) -> bool:
        """Parse what can be parsed now; False when no more first reads should be made together (the first
        file failed, or makes no twins and :data:`AHEAD` first blocks wait for their parses)."""
        self.arrivals += 1
        if self.failed:
            return False
        if self.position[id(file)] != 0:
            if self.task is not None:
                self._twin(file)
            elif self.first is None:
                self.waiting.append(file)
            return self.task is not None or self.arrivals < AHEAD
        try:
            self.first = _released(file, parse_one, file, self.options, self.parsers)
            task, twins = _task_like(self.first, self.options, self.parsers)
        except Exception:  # parsed again, and reported, the usual way
            self.failed = True
            return False
        self._report()
        waiting, self.waiting = self.waiting, []
        if twins:
            self.task = task
            for other in waiting:
                self._twin(other)
        return self.task is not None or self.arrivals < AHEAD

    def _twin(self, file: SourceFile) -> None:
        if not file.started:
            return
        try:
            with file.held_only():
                result = self.task(file)
        except (NotHeld, Exception):
            return
        file.release()
        if result.root is None:
            _bind_twins([result], self.first)
        self.parsed[self.position[id(file)]] = result
        self._report()

    def _report(self) -> None:
        if self.reading is not None:
            self.reading(len(self.parsed) + 1, len(self.files))


def parse_one(file: SourceFile, options: ParseOptions, parsers: Mapping[str, str]) -> ParsedFile:
    module = parser_for(file, parsers)
    with parsing(file, module):
        return module.parse(file, options)


@contextlib.contextmanager
def parsing(file: SourceFile, module) -> Iterator[None]:
    """What a parser (``module``) raises, as nczmap reports it: nczmap's errors (and running out of memory)
    as they are; an OSError behind which a read of the source failed (h5py's error for a failed read of a
    file object), that failure; anything else the format library or the bytes raised, a FormatError naming
    the file (the parsers name the object they were reading where they can)."""
    try:
        yield
    except (NCZError, MemoryError):
        raise
    except Exception as exc:
        if isinstance(exc, OSError) and file.error is not None:
            raise file.error from None
        kind = getattr(module, "FORMAT", module.__name__.rpartition(".")[2])
        raise FormatError(f"cannot read {file.shown} as {kind}: {type(exc).__name__}: {exc}") from exc


class _NotHeld(Exception):
    """A sniffer asked for bytes a remote source does not hold (never an NCZError: sniffers catch those)."""


def parser_for(file: SourceFile, parsers: Mapping[str, str]):
    """The parser module whose format ``file`` is in; FormatError naming the file if none.

    A remote source is first sniffed in the bytes its first read brought (no request): a format
    recognised there wins over one whose sniffer would need bytes beyond them (HDF5 looks for its
    signature at 512, 1024... up to the end of the file, 8 requests for a 30 MB COG); only when none is
    recognised are the sniffers run again with reads."""
    from nczmap.integrations.virtualize.stores import StoreSource

    if isinstance(file, StoreSource):  # a directory or prefix: read as a store, never sniffed
        return importlib.import_module(parsers["zarr"])
    modules = [importlib.import_module(name) for name in parsers.values()]
    if isinstance(file, RemoteFile):
        file.read_head(0, 8)  # the first read

        def held(offset: int, length: int) -> bytes:
            data = file.cached(offset, length)
            if data is None:
                raise _NotHeld
            return data

        for module in modules:
            try:
                if module.sniff(held, file.size):
                    return module
            except _NotHeld:
                continue
    for module in modules:
        if module.sniff(file.read_head, file.size):
            return module
    raise FormatError(f"{file.shown!r} is not a file nczmap can virtualize (netCDF-4/HDF5, netCDF-3 or TIFF)")


def _parse_like(
    file: SourceFile, options: ParseOptions, parsers: dict[str, str], fingerprint: object, module: str
) -> ParsedFile:
    """``file`` as a twin of the first file (whose parser is ``module``) when it is one, else parsed in
    full."""
    if fingerprint is not None:
        parser = importlib.import_module(module)
        with parsing(file, parser):
            twin = parser.parse_twin(file, fingerprint, options)
        if twin is not None:
            return twin
    return parse_one(file, options, parsers)


def _released(file: SourceFile, function, *args) -> ParsedFile:
    """``function(*args)``, then ``file`` let go of (a failure is named after it: :func:`_named`)."""
    try:
        return function(*args)
    except Exception as exc:
        raise _named(exc, file) from exc.__cause__
    finally:
        file.release()


def _named(exc: Exception, file: SourceFile) -> Exception:
    """``exc``, or the same error with the file named in front when its message does not name it."""
    text = str(exc)
    if any(name and name in text for name in (file.name, file.shown, file.url)):
        return exc
    if type(exc) in (StorageError, FormatError, AccessDenied, DataError):
        named = type(exc)(f"{file.shown}: {text}")
        named.__traceback__ = exc.__traceback__
        return named
    return exc


def _skippable(exc: BaseException) -> bool:
    """A source that cannot be read or is in no known format (a missing driver is not the source's)."""
    return isinstance(exc, NCZError | OSError) and not isinstance(exc, DriverNotAvailable)


def _skip_or_raise(file: SourceFile, exc: Exception, skipped: list | None) -> None:
    if skipped is None or not _skippable(exc):
        raise exc
    skipped.append((file, str(exc)))
    file.close()


def _bind_twins(twins: list[ParsedFile], first: ParsedFile) -> None:
    """Twins share ``first``'s model; the storages their parser did not make (values computed from the
    metadata, the same in all) are copies of ``first``'s, named for each twin."""
    shared = [
        (variable.key, variable.storages[0])
        for group in first.root.walk()
        for variable in group.variables.values()
    ]
    for twin in twins:
        twin.like = first
        storages = twin.storages
        for key, storage in shared:
            if key not in storages:
                storages[key] = storage.named(twin.source)


# ---------------------------------------------------------------------------------------- executors
def _run(
    files: list[SourceFile],
    task,
    executor,
    concurrency: int | None,
    reading: Progress | None,
    total: int,
    skipped: list | None,
    arrived: Callable[[ParsedFile], None] | None = None,
) -> list[ParsedFile | None]:
    """Every file's parse, in order (None for a file skipped); progress reported as parses end, and
    ``arrived`` called with each parse as it ends."""
    if not files:
        return []
    width = CONCURRENCY if concurrency is None else concurrency
    local = all(isinstance(f, LocalFile) for f in files)
    if executor is None and (local or width <= 1):
        return _one_by_one(files, task, reading, total, skipped, arrived)
    if executor is None:
        workers = min(width, len(files))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nczmap-parse") as pool:
            return _gathered(files, pool, task, reading, total, skipped, arrived)
    if isinstance(executor, ThreadPoolExecutor):
        return _gathered(files, executor, task, reading, total, skipped, arrived)
    extra = {"pure": False} if type(executor).__module__.startswith("distributed") else {}
    futures = [_Returned(executor.submit(_parse_elsewhere, _spec(f), task, **extra), f) for f in files]
    if extra:
        _gather_together(executor, futures)
    return _in_order(files, futures, reading, total, skipped, arrived)


def _gather_together(client, futures: list[_Returned]) -> None:
    """The results of a dask client's parses fetched in one call (one at a time, each is a round trip
    through the client's event loop, as long as a parse); failures are left to be raised in order."""
    try:
        results = iter(client.gather([returned.future for returned in futures], errors="skip"))
    except Exception:  # asked again one by one, each failure named
        return
    for returned in futures:
        if returned.future.status == "finished":
            returned.held = next(results)


def _one_by_one(files, task, reading, total, skipped, arrived=None) -> list[ParsedFile | None]:
    parsed: list[ParsedFile | None] = []
    try:
        for done, file in enumerate(files, total - len(files) + 1):
            try:
                parsed.append(_released(file, task, file))
                _arrive(arrived, parsed[-1])
            except Exception as exc:
                _skip_or_raise(file, exc, skipped)
                parsed.append(None)
            if reading is not None:
                reading(done, total)
    except BaseException:
        for item in parsed:
            if item is not None:
                item.close()
        raise
    return parsed


def _gathered(
    files, pool: ThreadPoolExecutor, task, reading, total, skipped, arrived=None
) -> list[ParsedFile | None]:
    """The parses run on ``pool``, gathered as they end (progress then), in order (None for a file
    skipped); on a failure the parses not started are cancelled, those running waited for, and the
    failure of the earliest file raised."""
    futures: dict[Future, int] = {pool.submit(_released, f, task, f): i for i, f in enumerate(files)}
    results: list[ParsedFile | None] = [None] * len(files)
    failures: dict[int, BaseException] = {}
    done = total - len(files)
    pending = set(futures)
    try:
        while pending and not failures:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                index = futures[future]
                try:
                    results[index] = future.result()
                    _arrive(arrived, results[index])
                except Exception as exc:
                    try:
                        _skip_or_raise(files[index], exc, skipped)
                    except Exception as error:
                        failures[index] = error
                done += 1
                if reading is not None:
                    reading(done, total)
    except BaseException as exc:  # interrupted: stop like a failure
        failures[-1] = exc
    if failures:
        for future in pending:
            future.cancel()
        wait(pending)
        for future in pending:  # those that were running: their results closed, their failures weighed
            if future.cancelled():
                continue
            failure = future.exception()
            if failure is None:
                future.result().close()
            elif futures[future] < min(failures) and (skipped is None or not _skippable(failure)):
                failures[futures[future]] = failure
        for item in results:
            if item is not None:
                item.close()
        raise failures[min(failures)]
    if skipped is not None:  # listed in the files' order, whatever order they failed in
        positions = {id(file): i for i, file in enumerate(files)}
        mine = [entry for entry in skipped if id(entry[0]) in positions]
        others = [entry for entry in skipped if id(entry[0]) not in positions]
        skipped[:] = others + sorted(mine, key=lambda entry: positions[id(entry[0])])
    return results


def _in_order(files, futures, reading, total, skipped, arrived=None) -> list[ParsedFile | None]:
    """Each future's ParsedFile, in order (None for a file skipped); on the first failure the others are
    closed and it is raised."""
    parsed: list[ParsedFile | None] = []
    error: BaseException | None = None
    for done, (file, future) in enumerate(zip(files, futures, strict=True), total - len(files) + 1):
        parsed.append(None)
        try:
            parsed[-1] = future.result()
            _arrive(arrived, parsed[-1])
        except Exception as exc:  # keep the others' results to close them
            try:
                _skip_or_raise(file, _named(exc, file), skipped)
            except Exception as failure:
                error = error or failure
        except BaseException as exc:
            error = error or exc
        if reading is not None:
            reading(done, total)
    if error is not None:
        for item in parsed:
            if item is not None:
                item.close()
        raise error
    return parsed


def _spec(file: SourceFile) -> tuple[str, dict, RequestPolicy | None]:
    """How another process makes ``file`` again: its URL (``file://`` with the real path, or as given),
    what is known of it (a remote source's size and ETag) and its request policy."""
    opening = getattr(file, "opening", None)  # a store, as it was named (its fragment's modes)
    if opening:
        return opening, {}, None
    if isinstance(file, LocalFile):
        return file.url, {}, None
    return file.shown, file.known(), getattr(file, "policy", None)


def _parse_elsewhere(spec: tuple[str, dict, RequestPolicy | None] | str, task) -> tuple[bytes, dict]:
    """Run in another process or machine: the source made there, parsed, and the parse pickled with the
    source itself left out (the caller binds its own), with what was learnt of the source."""
    text, known, policy = (spec, {}, None) if isinstance(spec, str) else spec
    file = source_file(text, policy=policy, **known)
    try:
        parsed = task(file)
        try:
            buffer = io.BytesIO()
            try:
                _Pickler(buffer, file).dump(parsed)
            except (pickle.PicklingError, AttributeError, TypeError) as exc:  # a bug of nczmap's: named
                raise NCZError(
                    f"the parse of {file.shown} cannot be sent back from where it ran ({exc}); virtualize "
                    "it without an executor"
                ) from exc
            return buffer.getvalue(), file.known()
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
        self.held: tuple[bytes, dict] | None = None  # the result, once fetched with the others

    def result(self) -> ParsedFile:
        held, self.held = self.held, None
        data, known = held if held is not None else self.future.result()
        self.file.adopt(known)  # the size and ETag seen there: this process's reads conditional on them
        return _Unpickler(data, self.file).load()
