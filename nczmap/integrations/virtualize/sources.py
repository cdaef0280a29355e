"""Byte sources of virtualization: the files a manifest will refer to, as parsers read them.

A :class:`SourceFile` is one local file, S3 object or HTTP(S) URL: ``read(offset, length)`` (exactly that
many bytes, or a StorageError), ``size``, ``name`` (for messages), ``url`` (canonical, what references
name), the container it lies in by default (:meth:`SourceFile.grant`) and what the manifest records to
recognise a changed source (:meth:`SourceFile.recorded`, checked again by :meth:`check_unchanged` before
the manifest is written). S3 objects are read through a small block cache (:class:`RangeReader`, also a
file object for h5py), conditional on the ETag first seen.
"""

from __future__ import annotations

import glob
import io
import os
import posixpath
import stat
from collections import OrderedDict
from collections.abc import Sequence

from nczmap.errors import FormatError, StorageError, URLError
from nczmap.manifest.containers import Container, normalize
from nczmap.url import ParsedURL, parse_url
from nczmap.zmap import byteranges

BLOCK = 256 << 10  # an S3 source is read in aligned blocks this large (HDF5's reads are mostly far smaller)
CACHED_BLOCKS = 32  # blocks kept per S3 source (8 MiB): metadata read twice is not fetched twice


# ------------------------------------------------------------------------------------------ arguments
def source_files(sources: Sequence[str | os.PathLike[str]]) -> list[SourceFile]:
    """Every source, opened: local paths (globs such as ``data/*.nc`` expanded, in sorted order),
    ``file://`` URLs and S3 objects; FormatError for a source given twice or a pattern matching nothing."""
    if isinstance(sources, str | os.PathLike):
        sources = [sources]
    names = [name for source in sources for name in _expand(source)]
    if not names:
        raise FormatError("no source files to virtualize")
    files: list[SourceFile] = []
    seen: set[str] = set()
    try:
        for name in names:
            file = source_file(name)
            files.append(file)
            if file.url in seen:  # a set: a glob may name thousands of files
                raise FormatError(f"{file.shown!r} is given twice")
            seen.add(file.url)
    except BaseException:
        for file in files:
            file.close()
        raise
    return files


def _expand(source: str | os.PathLike[str]) -> list[str | os.PathLike[str]]:
    """A local glob pattern's matches, or the objects under an S3 prefix (``s3://bucket/dir/``, or a
    pattern ``s3://bucket/dir/*.nc``), sorted; anything else as it is."""
    text = os.fspath(source)
    if isinstance(source, os.PathLike):
        return [source]
    if "://" not in text:
        if not glob.has_magic(text):
            return [source]
        matches = sorted(glob.glob(text))
        if not matches:
            raise FormatError(f"no file matches {text!r}")
        return matches
    if _is_http(text):
        return [source]
    url = _parse(text)
    folder = text.partition("#")[0].endswith("/")
    if url.on_s3 and (folder or not url.path or glob.has_magic(url.path)):
        return _s3_matches(url, text)
    return [source]


def _s3_matches(url: ParsedURL, text: str) -> list[str]:
    import fnmatch

    import obstore

    folder, pattern = (url.path, "*") if not glob.has_magic(url.path) else posixpath.split(url.path)
    folder = folder.rstrip("/")
    store = byteranges.s3_store(url.bucket, endpoint=url.endpoint, region=url.region, profile=url.profile)
    try:
        listing = obstore.list_with_delimiter(store, folder + "/" if folder else None)
    except Exception as exc:
        error = byteranges.store_error(exc, f"list {text}", url.bucket)
        raise error or StorageError(f"cannot list {text}") from exc
    objects = listing["objects"]
    names = sorted(o["path"] for o in objects if fnmatch.fnmatchcase(posixpath.basename(o["path"]), pattern))
    if not names:
        raise FormatError(f"no object matches {text!r}")
    return [_object_url(text, url, name) for name in names]


def _object_url(text: str, url: ParsedURL, key: str) -> str:
    """The source URL of object ``key`` spelled as the user spelled the prefix (endpoint, fragment)."""
    base, sep, fragment = text.partition("#")
    base = base.rstrip("/")
    head = base[: len(base) - len(url.path)] if url.path and base.endswith(url.path) else base
    if not head.endswith("/"):
        head += "/"
    return head + key + (sep + fragment if sep else "")


def _is_http(text: str) -> bool:
    """A plain web URL: http(s), no ``#mode=s3`` fragment, not an AWS S3 host (those are S3 objects)."""
    from urllib.parse import urlsplit

    if not text.lower().startswith(("http://", "https://")) or "#" in text:
        return False
    host = (urlsplit(text).hostname or "").lower()
    return not (host == "amazonaws.com" or host.endswith(".amazonaws.com"))


def _parse(text: str) -> ParsedURL:
    try:
        return parse_url(text)
    except URLError as exc:
        raise FormatError(f"cannot virtualize {text!r}: {exc}") from None


def source_file(source: str | os.PathLike[str]) -> SourceFile:
    text = os.fspath(source)
    if isinstance(source, os.PathLike) or "://" not in text:
        return LocalFile(os.path.realpath(text), text)
    if text.startswith("file://"):
        return LocalFile(normalize(text, None)[len("file://") :], text)
    if _is_http(text):
        return HttpFile(text)
    url = _parse(text)
    if not url.on_s3 or not url.path or url.path.endswith("/"):
        raise FormatError(
            f"cannot virtualize {text!r}: sources must be local files, S3 objects or http(s) URLs"
        )
    return ObjectFile(url)


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


def file_stat(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns


# ---------------------------------------------------------------------------------------------- sources
class SourceFile:
    """One source as parsers read it and as the manifest refers to it."""

    name: str  # in messages and refusals: the real path, or s3://bucket/key
    url: str  # in references: file:///real/path or s3://bucket/key
    shown: str  # as the user gave it
    size: int
    error: Exception | None = None  # why a read through h5py failed (h5py reports only an OSError)

    def open(self, h5py):
        """The source opened by h5py (netCDF-4/HDF5 sources)."""
        raise NotImplementedError

    def read(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (StorageError if the source ends before)."""
        raise NotImplementedError

    def read_head(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer at the end): what parsers sniff formats from."""
        return self.read(offset, max(0, min(length, self.size - offset)))

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Exactly the bytes of each ``(offset, length)``, fetched together (a remote source merges
        neighbours and fetches the rest concurrently); StorageError if the source ends before one."""
        return [self.read(offset, length) for offset, length in ranges]

    def cached(self, offset: int, length: int) -> bytes | None:
        """The bytes at ``offset`` if they can be had without waiting on a request (a local file: always;
        a remote one: what it has fetched already), else None. Fewer at the end of the source."""
        return self.read_head(offset, length)

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


class LocalFile(SourceFile):
    """A local file, held open from the start: every read is one positional read of the same file."""

    def __init__(self, path: str, shown: str) -> None:
        self.name = path
        self.url = normalize(path, None, links=False)  # ``path`` is real already: links resolved
        self.shown = shown
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise StorageError(f"cannot read the source {shown!r}: {exc.strerror or exc}") from exc
        info = os.fstat(self.fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(self.fd)
            raise FormatError(f"the source {shown!r} is not a regular file")
        self.size = info.st_size
        self.stat = (info.st_size, info.st_mtime_ns)

    def open(self, h5py):
        try:
            return h5py.File(self.name, "r")
        except OSError as exc:
            raise FormatError(f"cannot open {self.name!r} as netCDF-4/HDF5: {exc}") from exc

    def read(self, offset: int, length: int) -> bytes:
        try:
            return byteranges.read_exact(self.fd, length, offset, self.name)
        except OSError as exc:
            raise StorageError(f"cannot read {length} bytes at {offset} of {self.name}: {exc}") from exc

    def grant(self) -> str:
        return os.path.dirname(self.name) + "/"

    def recorded(self) -> dict:
        size, mtime = self.stat
        return {"size": size, "mtime": mtime}

    def check_unchanged(self) -> None:
        if file_stat(self.name) != self.stat:  # raising here abandons the manifest unwritten
            raise StorageError(f"the source {self.name} changed while it was being virtualized; run again")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RemoteFile(SourceFile):
    """A remote object read through a :class:`RangeReader` (blocks cached); subclasses ``get`` ranges."""

    reader: RangeReader

    @property
    def error(self) -> Exception | None:
        return self.reader.error

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

    def cached(self, offset: int, length: int) -> bytes | None:
        return self.reader.cached(offset, length)

    def get(self, start: int, end: int) -> bytes:
        raise NotImplementedError


class ObjectFile(RemoteFile):
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
        self.reader = RangeReader(self)

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


class HttpFile(RemoteFile):
    """A file on a web server: one HEAD (size, ETag), then range GETs (no redirect is followed:
    :mod:`nczmap.zmap.http`). References name its canonical URL."""

    def __init__(self, text: str) -> None:
        from nczmap.zmap.http import HttpReader

        self.url = self.name = normalize(text, None)  # AccessDenied for metadata hosts and the like
        self.shown = text
        self.http = HttpReader(self.url)
        try:
            head = self.http.head()
        except BaseException:
            self.http.close()
            raise
        self.size, self.etag = head.size, head.etag
        self.reader = RangeReader(self)

    def get(self, start: int, end: int) -> bytes:
        return self.http.read(start, end - start)

    def grant(self) -> str:
        return self.url.rsplit("/", 1)[0] + "/"

    def recorded(self) -> dict:
        return {"size": self.size, **({"etag": self.etag} if self.etag else {})}

    def check_unchanged(self) -> None:
        head = self.http.head()
        if (head.size, head.etag) != (self.size, self.etag):
            raise StorageError(f"the source {self.name} changed while it was being virtualized; run again")

    def close(self) -> None:
        self.reader.close()
        self.http.close()


class RangeReader(io.RawIOBase):
    """A read-only, seekable file over an S3 object for h5py: aligned blocks of :data:`BLOCK` bytes, the
    missing ones of a read fetched in one GET, the last :data:`CACHED_BLOCKS` kept; reads larger than half
    the cache go straight through. ``requests`` counts the GETs."""

    def __init__(self, source: RemoteFile) -> None:
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

    def cached(self, offset: int, length: int) -> bytes | None:
        """The bytes at ``offset`` if every block they lie in is held, else None (no request)."""
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        first, last = offset // BLOCK, (end - 1) // BLOCK
        if any(n not in self._blocks for n in range(first, last + 1)):
            return None
        data = b"".join(self._blocks[n] for n in range(first, last + 1))
        return data[offset - first * BLOCK : end - first * BLOCK]

    def _get(self, start: int, end: int) -> bytes:
        self.requests += 1
        return self.source.get(start, end)

    def close(self) -> None:
        self._blocks.clear()
        super().close()
