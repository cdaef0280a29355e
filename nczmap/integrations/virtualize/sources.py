"""Byte sources of virtualization: the files a manifest will refer to, as parsers read them.

A :class:`SourceFile` is one local file, S3 object or HTTP(S) URL: ``read(offset, length)`` (exactly that
many bytes, or a StorageError), ``read_head`` (up to that many), ``read_ranges`` (many at once),
``cached`` (what is held, never a request), ``size``, ``name`` (for messages), ``url`` (canonical, what
references name), the container it lies in by default (:meth:`SourceFile.grant`) and what the manifest
records to recognise a changed source (:meth:`SourceFile.recorded`).

Making a source costs no request and holds no descriptor (:func:`source_files` of thousands of files is
a ``stat`` each for local ones, nothing for remote ones, and one LIST an S3 prefix, whose sizes and ETags
the objects keep). A local file is opened when it is first read and let go of once parsed
(:meth:`SourceFile.release`); a later read opens it again, checking that its size and modification time
are still those first seen, and at most :data:`.files.OPEN_FILES` are held open at once, so a collection
larger than the descriptor limit works.

A remote source makes its first request on its first read (or when its ``size`` is asked for): one GET
of at least :data:`FIRST_BLOCK` bytes from its start, whose answer also gives its size, ETag and
modification time (HTTP: ``Content-Range``, ``ETag``, ``Last-Modified``; S3: the GET's metadata) — no
HEAD. What was fetched is kept (:class:`_Extents`): reads inside it make no request, reads outside fetch
what they miss (a single read at least :data:`READ_AHEAD` bytes, ``read_ranges`` exactly what it asks,
neighbours merged and the rest fetched concurrently). Every later GET is conditional on the ETag (or the
modification time) first seen, so bytes of two versions are never mixed: a source replaced while it is
parsed is a StorageError naming it, "changed while it was being virtualized".
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import glob
import os
import posixpath
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from urllib.parse import urlsplit

from nczmap.errors import FormatError, NCZError, StorageError, URLError
from nczmap.integrations.virtualize.files import LocalFile, SeekableReader, SourceFile, uncovered
from nczmap.manifest.containers import Container, normalize
from nczmap.url import ParsedURL, parse_url
from nczmap.zmap import byteranges
from nczmap.zmap.byteranges import DEFAULT_POLICY, RequestPolicy

FIRST_BLOCK = 64 << 10  # a remote source's first read fetches at least this much from its start
READ_AHEAD = 16 << 10  # a read outside what is held fetches at least this much
RANGES_GAP = 16 << 10  # read_ranges fetches ranges closer than this in one request
SPANS_IN_FLIGHT = 16  # requests of one read_ranges call at once
HELD_BYTES = 8 << 20  # bytes a remote source keeps while it is parsed (its first block always)
RELEASED_BYTES = 1 << 20  # bytes it keeps once parsed (its first block, the most recently used others)
KEPT_BYTES = 256 << 20  # bytes all parsed remote sources keep together (the least recently parsed dropped)


# ------------------------------------------------------------------------------------------ arguments
def source_files(
    sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str], policy: RequestPolicy | None = None
) -> list[SourceFile]:
    """Every source, made (no request, no descriptor held): local paths (globs such as ``data/*.nc``
    expanded, in sorted order), ``file://`` URLs, http(s) URLs, S3 objects and prefixes, and lists of
    sources (``@urls.txt``: one a line, see :func:`listed_sources`); FormatError for a source given twice
    or a pattern matching nothing. ``policy`` bounds the requests of remote sources."""
    if isinstance(sources, str | os.PathLike):
        sources = [sources]
    named = [item for source in sources for item in _expand(source, policy)]
    if not named:
        raise FormatError("no source files to virtualize")
    files: list[SourceFile] = []
    seen: set[str] = set()
    for name, known in named:
        file = source_file(name, policy=policy, **known)
        files.append(file)
        if file.url in seen:  # a set: a glob may name thousands of files
            raise FormatError(f"{file.shown!r} is given twice")
        seen.add(file.url)
    return files


def listed_sources(path: str | os.PathLike[str]) -> list[str]:
    """The sources listed in the file at ``path``: one a line (a path, a glob, a URL or an S3 prefix),
    blank lines and lines starting with ``#`` ignored, relative paths taken from the list's directory."""
    text = os.fspath(path)
    try:
        with open(text, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise FormatError(f"cannot read the list of sources {text!r}: {exc}") from None
    folder = os.path.dirname(os.path.abspath(text))
    found = []
    for number, line in enumerate(lines, 1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        if entry.startswith("@"):
            raise FormatError(f"{text}, line {number}: a list of sources cannot name another ({entry!r})")
        if "://" not in entry and not os.path.isabs(entry):
            entry = os.path.join(folder, entry)
        found.append(entry)
    if not found:
        raise FormatError(f"the list of sources {text!r} names no source")
    return found


def _expand(source: str | os.PathLike[str], policy: RequestPolicy | None) -> list[tuple[object, dict]]:
    """``(source, what is known of it)`` for each source ``source`` names: a list file's entries, a local
    glob pattern's matches, or the objects under an S3 prefix (``s3://bucket/dir/``, or a pattern
    ``s3://bucket/dir/*.nc``) with the size and ETag the listing gave, sorted; anything else as it is."""
    if isinstance(source, os.PathLike):
        return [(source, {})]
    text = os.fspath(source)
    if text.startswith("@"):
        return [item for entry in listed_sources(text[1:]) for item in _expand(entry, policy)]
    if "://" not in text:
        if not glob.has_magic(text):
            return [(source, {})]
        matches = sorted(glob.glob(text))
        if not matches:
            raise FormatError(f"no file matches {text!r}")
        return [(match, {}) for match in matches]
    if _is_http(text):
        return [(source, {})]
    url = _parse(text)
    if url.driver in ("file", "zip") and glob.has_magic(url.path):
        _, sep, fragment = text.partition("#")
        matches = sorted(glob.glob(url.path))
        if not matches:
            raise FormatError(f"no file matches {text!r}")
        return [(f"file://{match}{sep}{fragment}", {}) for match in matches]
    from nczmap.integrations.virtualize.stores import names_a_store

    if names_a_store(text):  # a store: a pattern names stores, never the objects in them
        return _s3_stores(url, text, policy) if url.on_s3 and glob.has_magic(url.path) else [(source, {})]
    folder = text.partition("#")[0].endswith("/")
    if url.on_s3 and (folder or not url.path or glob.has_magic(url.path)):
        return _s3_matches(url, text, policy)
    return [(source, {})]


def _s3_matches(url: ParsedURL, text: str, policy: RequestPolicy | None) -> list[tuple[object, dict]]:
    """The objects matching an S3 prefix or pattern, from one listing: their size and ETag kept, so that
    no object needs a request before it is parsed."""
    import fnmatch

    folder, pattern = (url.path, "*") if not glob.has_magic(url.path) else posixpath.split(url.path)
    listing = _listing(url, folder.rstrip("/"), text, policy)
    objects = sorted(
        (o for o in listing["objects"] if fnmatch.fnmatchcase(posixpath.basename(o["path"]), pattern)),
        key=lambda o: o["path"],
    )
    if not objects:
        raise FormatError(f"no object matches {text!r}")
    return [
        (_object_url(text, url, o["path"]), {"size": int(o["size"]), "etag": o.get("e_tag") or None})
        for o in objects
    ]


def _s3_stores(url: ParsedURL, text: str, policy: RequestPolicy | None) -> list[tuple[object, dict]]:
    """The stores matching an S3 pattern (``s3://bucket/runs/2024-03-*#mode=nczarr,s3``), from one listing
    of the prefixes beside them, in name order."""
    import fnmatch

    folder, pattern = posixpath.split(url.path.rstrip("/"))
    listing = _listing(url, folder, text, policy)
    found = sorted(
        p.rstrip("/")
        for p in listing["common_prefixes"]
        if fnmatch.fnmatchcase(posixpath.basename(p.rstrip("/")), pattern)
    )
    if not found:
        raise FormatError(f"no store matches {text!r}")
    return [(_object_url(text, url, prefix), {}) for prefix in found]


def _listing(url: ParsedURL, folder: str, text: str, policy: RequestPolicy | None) -> dict:
    """One listing of ``folder`` of the bucket ``url`` names (its objects and the prefixes beside them)."""
    import obstore

    store = _store(url.bucket, _options(url), policy or DEFAULT_POLICY, byteranges.SMALL_SPAN)
    try:
        return obstore.list_with_delimiter(store, folder + "/" if folder else None)
    except Exception as exc:
        error = byteranges.store_error(exc, f"list {text}", url.bucket)
        raise error or StorageError(f"cannot list {text}") from exc


def _object_url(text: str, url: ParsedURL, key: str) -> str:
    """The source URL of object ``key`` spelled as the user spelled the prefix (endpoint, fragment)."""
    base, sep, fragment = text.partition("#")
    base = base.rstrip("/")
    head = base[: len(base) - len(url.path)] if url.path and base.endswith(url.path) else base
    if not head.endswith("/"):
        head += "/"
    return head + key + (sep + fragment if sep else "")


@functools.lru_cache(maxsize=1 << 14)
def _is_http(text: str) -> bool:
    """A plain web URL: http(s), no ``#mode=s3`` fragment, not an AWS S3 host (those are S3 objects)."""
    if not text.lower().startswith(("http://", "https://")) or "#" in text:
        return False
    host = (urlsplit(text).hostname or "").lower()
    return not (host == "amazonaws.com" or host.endswith(".amazonaws.com"))


def _parse(text: str) -> ParsedURL:
    try:
        return parse_url(text)
    except URLError as exc:
        raise FormatError(f"cannot virtualize {text!r}: {exc}") from None


def source_file(
    source: str | os.PathLike[str],
    *,
    size: int | None = None,
    etag: str | None = None,
    modified: str | None = None,
    policy: RequestPolicy | None = None,
    options: dict[str, str] | None = None,
) -> SourceFile:
    """One source, made without a request. ``size``, ``etag`` and ``modified`` (what a listing, or the
    process that read it first, knows of a remote source) make its reads conditional from the first;
    ``options`` are an S3 source's endpoint options (a container's) beyond its URL's."""
    text = os.fspath(source)
    from nczmap.integrations.virtualize.stores import store_source  # stores are sources of their own

    store = store_source(text, text)
    if store is not None:
        return store
    if isinstance(source, os.PathLike) or "://" not in text:
        return LocalFile(os.path.realpath(text), text)
    if text.startswith("file://"):
        return LocalFile(normalize(text, None)[len("file://") :], text)
    if _is_http(text):
        file: RemoteFile = HttpFile(text, policy)
    else:
        url = _parse(text)
        if not url.on_s3 or not url.path or url.path.endswith("/"):
            raise FormatError(
                f"cannot virtualize {text!r}: sources must be local files, S3 objects or http(s) URLs"
            )
        file = ObjectFile(url, policy=policy, options=options)
    file.adopt({"size": size, "etag": etag, "modified": modified})
    return file


def grants(allow: Sequence[str], files: list[SourceFile]) -> list[str | Container]:
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
        under = [f for f in files if isinstance(f, ObjectFile) and f.url.startswith(container.prefix)]
        found.append(Container(prefix, under[0].options) if under else prefix)
    return found


class NotHeld(BaseException):
    """A read of bytes a source does not hold, made where it may make no request
    (:meth:`RemoteFile.held_only`). Not an Exception: no parser's handling of a damaged file takes it."""


class RemoteFile(SourceFile):
    """A remote object: its first read fetches :data:`FIRST_BLOCK` bytes from its start and learns its
    size and validators; what is fetched is kept (:class:`_Extents`) and reads inside it make no request.
    Subclasses ``_get`` ranges (up to the end of the object, learning and checking its size)."""

    def __init__(self, policy: RequestPolicy | None) -> None:
        self.policy = policy or DEFAULT_POLICY
        self._size: int | None = None
        self.etag: str | None = None
        self.modified: str | None = None
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.RLock()
        self._held = _Extents()
        self._first = threading.Lock()  # one first read at a time
        self.started = False  # the first read was made
        self.released = False  # parsed: only the first block is kept
        self.requests = 0  # GETs made (retries not counted)
        self.fetched = 0  # bytes they brought
        self._reader: RangeReader | None = None
        self._offline = False  # reads may take only what is held (held_only)
        self._refusal: NCZError | None = None  # why a first read made elsewhere cannot succeed

    def __getstate__(self) -> dict:
        drop = (
            "_lock",
            "_held",
            "_first",
            "_reader",
            "started",
            "released",
            "requests",
            "fetched",
            "_offline",
        )
        return {key: value for key, value in self.__dict__.items() if key not in drop}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    # ---------------------------------------------------------------------------- what is known
    @property
    def size(self) -> int:
        if self._size is None:
            self._start()
        return self._size

    def known(self) -> dict:
        found = {"size": self._size, "etag": self.etag, "modified": self.modified}
        return {key: value for key, value in found.items() if value is not None}

    def adopt(self, known: dict) -> None:
        changes = []
        with self._lock:
            for name, attribute in (("size", "_size"), ("etag", "etag"), ("modified", "modified")):
                value = known.get(name)
                if value is None:
                    continue
                mine = getattr(self, attribute)
                if mine is None:
                    setattr(self, attribute, value)
                elif mine != value and name != "modified":
                    changes.append(f"{name} {mine} -> {value}")
        if changes:
            raise self._changed(", ".join(changes))

    def _changed(self, why: str) -> StorageError:
        return StorageError(
            f"the source {self.name} changed while it was being virtualized ({why}); run again"
        )

    def grant(self) -> str | Container:
        raise NotImplementedError

    def recorded(self) -> dict:
        return {"size": self.size, **({"etag": self.etag} if self.etag else {})}

    def check_unchanged(self) -> None:
        """No request: nothing more to check. Every read after the first was conditional on the ETag (or,
        without one, the modification time) the first answer gave, and each answer's size was compared
        with the first one's, so every byte the parse used is of the version :meth:`recorded` describes;
        a change after the last read is caught by whoever reads through the manifest, which compares the
        recorded ETag and size (or Icechunk's checksum) before reading. A HEAD here would only move the
        moment of that check, at the cost of a request a file."""

    # ---------------------------------------------------------------------------- reads
    @property
    def reader(self) -> RangeReader:
        if self._reader is None:
            self._reader = RangeReader(self)
        return self._reader

    @property
    def error(self) -> Exception | None:
        return None if self._reader is None else self._reader.error

    def open(self, h5py):
        reader = RangeReader(self)
        self._reader = reader
        try:
            return h5py.File(reader, "r")
        except OSError as exc:
            if reader.error is not None:
                raise reader.error from None
            raise FormatError(f"cannot open {self.name} as netCDF-4/HDF5: {exc}") from exc

    def read(self, offset: int, length: int) -> bytes:
        data = self.take([(offset, length)], READ_AHEAD)[0]
        if len(data) != length:
            raise StorageError(f"{self.name} ends before byte {offset + length} (it holds {self.size})")
        return data

    def read_head(self, offset: int, length: int) -> bytes:
        return self.take([(offset, length)], READ_AHEAD)[0]

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        found = self.take(ranges, 0)
        for (offset, length), data in zip(ranges, found, strict=True):
            if len(data) != length:
                raise StorageError(f"{self.name} ends before byte {offset + length} (it holds {self.size})")
        return found

    def cached(self, offset: int, length: int) -> bytes | None:
        if self._size is None:
            return None
        end = min(offset + max(0, length), self._size)
        if offset >= end:
            return b""
        with self._lock:
            return self._held.get(offset, end)

    def take(self, ranges: Sequence[tuple[int, int]], ahead: int) -> list[bytes]:
        """Up to ``length`` bytes at each ``offset`` (fewer at the end): what is held, the rest fetched
        (spans closer than :data:`RANGES_GAP` merged, each at least ``ahead`` long, concurrently)."""
        if self._offline and not self.started:
            raise NotHeld
        if not self.started:  # with what the ranges near the start need, in the same request
            self._start(max((o + n for o, n in ranges if n > 0 and o <= FIRST_BLOCK), default=0))
        size = self._size
        clipped = [(offset, min(offset + max(0, length), size)) for offset, length in ranges]
        with self._lock:
            missing = [gap for start, end in clipped if start < end for gap in self._held.missing(start, end)]
        fetched: dict[int, bytes] = {}
        if missing and self._offline:
            raise NotHeld
        if missing:
            spans = byteranges.merge_ranges([(a, b - a) for a, b in missing], RANGES_GAP)
            wanted = [(span.start, min(size, max(span.end, span.start + ahead))) for span in spans]
            datas = byteranges.run_concurrently(
                [lambda s=start, e=end: self._fetch(s, e) for start, end in wanted], SPANS_IN_FLIGHT
            )
            fetched = dict(zip([start for start, _ in wanted], datas, strict=True))
        with self._lock:
            for start, data in fetched.items():
                self._held.add(start, data)
            found = [self._held.get(start, end) if start < end else b"" for start, end in clipped]
            if any(data is None for data in found):  # pushed out again by another thread: from what came
                local = _Extents()
                for start, data in fetched.items():
                    local.add(start, data)
                found = [
                    data if data is not None else local.get(start, end) or self._held.get(start, end)
                    for data, (start, end) in zip(found, clipped, strict=True)
                ]
            self._held.trim(RELEASED_BYTES if self.released else HELD_BYTES)
            kept = self._held.total
        if self.released and fetched:
            _KEPT.keep(self, kept)
        if any(data is None for data in found):
            raise StorageError(f"{self.name}: bytes fetched were dropped before they were used; run again")
        return found

    def _start(self, needed: int = 0) -> None:
        """The first read: :data:`FIRST_BLOCK` bytes from the start in one request (more if the read that
        triggers it needs more), which also tells the size when it is not known."""
        with self._first:
            if self.started:
                return
            if self._refusal is not None:
                raise self._refusal
            length = max(FIRST_BLOCK, needed)
            if self._size is not None:
                length = min(length, self._size)
            data = self._fetch(0, length) if length or self._size is None else b""
            self._begin_with(data)

    @contextlib.contextmanager
    def held_only(self) -> Iterator[None]:
        """Within the block, a read of bytes the source does not hold raises :class:`NotHeld` instead of
        making a request."""
        self._offline = True
        try:
            yield
        finally:
            self._offline = False

    def _begin_with(self, data: bytes) -> None:
        """The first block is ``data`` (called holding ``_first``)."""
        with self._lock:
            self._held.add(0, data)
            self.started = True

    def _count(self, data: bytes) -> None:
        with self._lock:
            self.requests += 1
            self.fetched += len(data)

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` or up to the object's end, in one GET (counted); ``_size`` learnt."""
        data = self._get(start, end)
        self._count(data)
        return data

    def _get(self, start: int, end: int) -> bytes:
        raise NotImplementedError

    def sibling(self, suffix: str) -> RemoteFile:
        """The remote file whose name is this one's and ``suffix``, read the same way."""
        raise NotImplementedError

    def release(self) -> None:
        """Parsing is done: keep the first block and the most recently used of the other bytes fetched,
        :data:`RELEASED_BYTES` in all (what writing may want again: small variables' values, small
        chunks), and that only while all parsed sources keep less than :data:`KEPT_BYTES`; anything read
        later is fetched again, conditionally."""
        with self._lock:
            self._held.trim(RELEASED_BYTES)
            self.released = True
            kept = self._held.total
        _KEPT.keep(self, kept)

    def drop(self) -> None:
        with self._lock:
            self._held = _Extents()
            self._reader = None

    def close(self) -> None:
        self.drop()
        _KEPT.forget(self)


class _Kept:
    """The bytes released remote sources keep, together at most :data:`KEPT_BYTES` (oldest dropped)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.files: OrderedDict[int, tuple[RemoteFile, int]] = OrderedDict()
        self.total = 0

    def keep(self, file: RemoteFile, count: int) -> None:
        dropped = []
        with self.lock:
            old = self.files.pop(id(file), None)
            self.total -= old[1] if old else 0
            self.files[id(file)] = (file, count)
            self.total += count
            while self.total > KEPT_BYTES and len(self.files) > 1:
                _, (other, held) = self.files.popitem(last=False)
                self.total -= held
                dropped.append(other)
        for other in dropped:
            other.drop()

    def forget(self, file: RemoteFile) -> None:
        with self.lock:
            old = self.files.pop(id(file), None)
            self.total -= old[1] if old else 0


_KEPT = _Kept()


class ObjectFile(RemoteFile):
    """An S3 object: ranged GETs, the first one telling its size and ETag (no HEAD) unless a listing did
    (``size``, ``etag``), every one conditional on the ETag once known (``If-Match``)."""

    def __init__(
        self,
        url: ParsedURL,
        size: int | None = None,
        etag: str | None = None,
        policy: RequestPolicy | None = None,
        options: dict[str, str] | None = None,
    ) -> None:
        self.bucket, self.key = url.bucket, url.path
        self.url = self.name = normalize(f"s3://{url.bucket}/{url.path}", None)
        self.shown = url.original
        self.options = {**_options(url), **(options or {})}
        super().__init__(policy)
        self.adopt({"size": size, "etag": etag})

    @property
    def store(self):
        return _store(self.bucket, self.options, self.policy)

    def _store_for(self, length: int):
        """The store whose requests time out at the deadline of a read of ``length`` bytes: of a
        :data:`~nczmap.zmap.byteranges.SMALL_SPAN` read, or of a longer one."""
        if length <= byteranges.SMALL_SPAN:
            return _store(self.bucket, self.options, self.policy, byteranges.SMALL_SPAN)
        return self.store

    def sibling(self, suffix: str) -> ObjectFile:
        """The object whose key is this one's and ``suffix`` (an inventory beside it, say)."""
        return ObjectFile(_parse(self.url + suffix), policy=self.policy, options=self.options)

    def grant(self) -> Container:
        folder = posixpath.dirname(self.key)
        return Container(f"s3://{self.bucket}/{folder}/" if folder else f"s3://{self.bucket}/", self.options)

    def _get(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` (fewer at the end of the object) in one GET, refused (StorageError) if
        the object is no longer the one first seen."""
        import obstore
        from obstore.exceptions import PreconditionError

        if self._size is not None:
            end = min(end, self._size)
            if start >= end:
                return b""
        options: dict = {"range": (start, end)}
        if self.etag:
            options["if_match"] = self.etag
        failures, source = byteranges.FAILURES, self._failures_key()
        refusal = failures.refusal(source, self.policy)
        if refusal is not None:  # given up already: no request
            raise StorageError(refusal)
        began = time.monotonic()
        try:
            result = obstore.get(self._store_for(end - start), self.key, options=options)
            meta = result.meta
            self.adopt({"size": int(meta["size"]), "etag": meta.get("e_tag") or None})
            data = bytes(result.bytes())
        except PreconditionError:
            raise self._changed(f"its ETag is no longer {self.etag}") from None
        except NCZError:
            raise
        except Exception as exc:
            if byteranges.starts_past_end(exc):
                return self._past_end(start)
            error = byteranges.store_error(exc, f"read {self.name}", self.bucket)
            attempts, took = _attempts(exc), time.monotonic() - began
            if type(error) is StorageError and (attempts is not None or took >= self.policy.deadline):
                # retried by obstore within the budget, or timed out: the source is given up
                failures.failed(source, began, str(error), spent=True, attempts=attempts)
                raise StorageError(failures.refusal(source, self.policy) or str(error)) from exc
            raise error or StorageError(f"the source {self.name} does not exist") from exc
        failures.succeeded(source)
        if len(data) != min(end, self._size) - start:
            raise self._changed(
                f"{len(data)} bytes at {start} where {min(end, self._size) - start} were asked"
            )
        return data

    def _failures_key(self) -> str:
        """The source as :data:`~nczmap.zmap.byteranges.FAILURES` knows it (its endpoint included)."""
        return f"{self.url} at {self.options.get('endpoint') or 'AWS'}"

    def _past_end(self, start: int) -> bytes:
        """A range past the end (an empty object's first read): its size from a HEAD, then nothing."""
        import obstore

        if self._size is None:
            try:
                meta = obstore.head(self.store, self.key)
            except Exception as exc:
                error = byteranges.store_error(exc, f"read the source {self.name}", self.bucket)
                raise error or StorageError(f"the source {self.name} does not exist") from exc
            self.adopt({"size": int(meta["size"]), "etag": meta.get("e_tag") or None})
        if start < self._size:
            raise self._changed(f"a range at {start} of its {self._size} bytes was refused")
        return b""


class HttpFile(RemoteFile):
    """A file on a web server: ranged GETs (:meth:`nczmap.zmap.http.HttpReader.fetch`), the first one
    telling its size, ETag and ``Last-Modified`` (no HEAD), the next ones conditional on them; no redirect
    is followed (:mod:`nczmap.zmap.http`). References name its canonical URL."""

    def __init__(self, text: str, policy: RequestPolicy | None = None) -> None:
        self.url = self.name = normalize(text, None)  # AccessDenied for metadata hosts and the like
        self.shown = text
        super().__init__(policy)

    def sibling(self, suffix: str) -> HttpFile:
        """The file whose URL is this one's and ``suffix`` (an inventory beside it, say)."""
        return HttpFile(self.url + suffix, self.policy)

    @property
    def http(self):
        from nczmap.zmap.http import HttpReader

        with self._lock:
            reader = self.__dict__.get("_http")
            if reader is None:
                reader = self.__dict__["_http"] = HttpReader(self.url, policy=self.policy)
            return reader

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_http", None)
        return state

    def _get(self, start: int, end: int) -> bytes:
        from nczmap.zmap.http import SourceChanged

        if self._size is not None:
            end = min(end, self._size)
            if start >= end:
                return b""
        reader = self._synced()
        try:
            data = reader.fetch(start, end - start)
        except SourceChanged as exc:
            raise self._changed(str(exc)) from None
        self.adopt({"size": reader.size, "etag": reader.etag, "modified": reader.modified})
        return data

    def _synced(self):
        """The reader, told what is known of the object (its answers must agree)."""
        reader = self.http
        with self._lock:
            reader.size = self._size if reader.size is None else reader.size
            reader.etag = self.etag if reader.etag is None else reader.etag
            reader.modified = self.modified if reader.modified is None else reader.modified
        return reader

    def grant(self) -> str:
        return self.url.rsplit("/", 1)[0] + "/"


def start_together(
    files: Sequence[SourceFile], in_flight: int, arrived: Callable[[SourceFile], bool | None] | None = None
) -> None:
    """The first reads of the web sources among ``files`` not read yet, made together from this thread
    (:func:`nczmap.zmap.http.fetch_each`, ``in_flight`` at once) rather than each by its own parse: the
    same requests, with no thread waiting on each. ``arrived`` is called with each of those sources as
    its answer is in (on this thread, while the others' are on their way); when it returns False, the first
    reads not started yet are left to the parses. A first read that fails here is left to the parse
    (which makes it again, retried, and names the failure)."""
    from nczmap.zmap.http import SourceChanged, fetch_each

    waiting = [f for f in files if isinstance(f, HttpFile) and not f.started and f._size != 0]
    readers = [f._synced() for f in waiting]
    lengths = [FIRST_BLOCK if f._size is None else min(FIRST_BLOCK, f._size) for f in waiting]

    def answered(index: int, data: bytes | NCZError | None) -> bool | None:
        file, reader = waiting[index], readers[index]
        if isinstance(data, NCZError):  # another request would fail the same way
            file._refusal = file._changed(str(data)) if isinstance(data, SourceChanged) else data
        elif data is not None:
            file._count(data)
            with contextlib.suppress(StorageError):  # (changed between two answers: the parse says so)
                file.adopt({"size": reader.size, "etag": reader.etag, "modified": reader.modified})
                with file._first:
                    if not file.started:
                        file._begin_with(data)
        return None if arrived is None else arrived(file)

    fetch_each([(r, 0, n) for r, n in zip(readers, lengths, strict=True)], in_flight, answered)


class RangeReader(SeekableReader):
    """A read-only, seekable file over a remote source for h5py: reads through the source's held bytes
    (each miss fetched with :data:`READ_AHEAD`); ``error`` keeps why a read failed (h5py turns any
    exception into its own OSError)."""

    def __init__(self, source: RemoteFile) -> None:
        super().__init__()
        self.source = source
        self.position = 0
        self.error: Exception | None = None

    @property
    def size(self) -> int:
        return self.source.size

    @property
    def requests(self) -> int:
        return self.source.requests

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        try:
            data = self.source.read_head(self.position, len(view))
        except Exception as exc:
            self.error = exc
            raise
        view[: len(data)] = data
        self.position += len(data)
        return len(data)

    def pread(self, offset: int, length: int) -> bytes:
        return self.source.read_head(offset, length)

    def cached(self, offset: int, length: int) -> bytes | None:
        return self.source.cached(offset, length)


class _Extents:
    """Byte extents of one object: sorted, non-overlapping, each used one kept in order of use."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.datas: dict[int, bytes] = {}
        self.used: OrderedDict[int, None] = OrderedDict()
        self.total = 0

    def missing(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` not held."""
        starts = self.starts
        return uncovered(starts, lambda i: starts[i] + len(self.datas[starts[i]]), start, end)

    def add(self, start: int, data: bytes) -> None:
        """Hold ``data`` at ``start`` (only its parts not held already)."""
        for first, last in self.missing(start, start + len(data)):
            piece = (
                data if (first, last) == (start, start + len(data)) else data[first - start : last - start]
            )
            bisect.insort(self.starts, first)
            self.datas[first] = piece
            self.used[first] = None
            self.total += len(piece)

    def get(self, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` if every one is held, else None."""
        index = bisect.bisect_right(self.starts, start) - 1
        if index < 0:
            return None
        parts, at = [], start
        while at < end:
            if index >= len(self.starts):
                return None
            first = self.starts[index]
            data = self.datas[first]
            if not first <= at < first + len(data):
                return None
            parts.append(data[at - first : min(end, first + len(data)) - first])
            self.used.move_to_end(first)
            at = first + len(data)
            index += 1
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def trim(self, limit: int) -> None:
        """Drop the least recently used extents (never the one at 0) until at most ``limit`` bytes."""
        for start in list(self.used):
            if self.total <= limit:
                return
            if start:
                self._remove(start)

    def _remove(self, start: int) -> None:
        self.total -= len(self.datas.pop(start))
        del self.used[start]
        self.starts.pop(bisect.bisect_left(self.starts, start))


# ------------------------------------------------------------------------------------------ S3 stores
def _options(url: ParsedURL) -> dict[str, str]:
    options = {"endpoint": url.endpoint, "region": url.region, "profile": url.profile}
    return {k: v for k, v in options.items() if v}


_stores: dict[tuple, object] = {}
_stores_lock = threading.Lock()


def _after_fork() -> None:
    """Locks another thread of the parent may have held at the fork, made again in the child."""
    global _stores_lock
    _KEPT.lock = threading.Lock()
    _stores_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _attempts(exc: Exception) -> int | None:
    """The attempts obstore made of a request that failed, when its message says how many retries."""
    import re

    found = re.search(r"after (\d+) retr", str(exc))
    return 1 + int(found[1]) if found else None


def _store(bucket: str, options: dict, policy: RequestPolicy, span: int = byteranges.POLICY_SPAN):
    """One obstore store per bucket, endpoint options, policy and span (its requests' timeout), shared by
    every source of the process (its connections are reused across objects and threads)."""
    key = (bucket, tuple(sorted(options.items())), policy, span, os.getpid())
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = byteranges.s3_store(
                bucket,
                endpoint=options.get("endpoint"),
                region=options.get("region"),
                profile=options.get("profile"),
                policy=policy,
                span=span,
            )
        return store
