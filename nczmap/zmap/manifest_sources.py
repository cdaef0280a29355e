"""The files and objects a manifest's references point into: local files (read with ``preadv`` straight into
the chunks' buffers), S3 objects and web servers (range GETs conditional on the ETag checked once), each
compared with what the manifest recorded of it (size, modification time, ETag) before its first read."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from nczmap._lazy import numpy as np
from nczmap.checksum import crc32c
from nczmap.errors import DataError, NCZError, StorageError, URLError
from nczmap.manifest.containers import Container
from nczmap.url import ParsedURL
from nczmap.zmap import byteranges
from nczmap.zmap.manifest_columns import ColumnSpan, Targets, runs

LOCAL_GAP = 64 << 10  # merge local ranges closer than this: a short extra read beats another syscall
REMOTE_GAP = 1 << 20  # merge S3 ranges closer than this: a round trip costs more than a MiB
# One GET per merged span, however long: fill() streams it into the chunks' buffers, so nothing of its size
# is held; each request costs a round trip (and, on servers such as moto, a read of the whole object).
REMOTE_MAX_SPAN = 1 << 30
STREAM_PIECE = 1 << 20  # an S3 span's body is scattered into the chunks' buffers in pieces of this size
MAX_IOVECS = 1000  # below the kernel's IOV_MAX for one preadv


class Source:
    """One file or object references point into."""

    name: str
    size: int
    gap: int
    max_span = 64 << 20  # the longest merged read (its bytes are held at once, unless fill() streams)
    remote = True  # reads wait on requests (many in flight), not on the local disk

    def read(self, offset: int, length: int) -> bytes:
        raise NotImplementedError

    def fill_columns(self, span: ColumnSpan, targets: Targets) -> None:
        """Read ``span`` into the targets of its references."""
        offsets, lengths = span.offsets.tolist(), span.lengths.tolist()
        views = map(targets.view, span.positions.tolist(), lengths)
        wanted = list(zip(range(len(offsets)), offsets, lengths, views, strict=True))
        self.fill(byteranges.Span(span.start, span.end, list(range(len(wanted)))), wanted)

    def fill(self, span: byteranges.Span, wanted: list[tuple[int, int, int, memoryview]]) -> None:
        """Read ``span`` and place each member range in its buffer."""
        block = memoryview(self.read(span.start, span.end - span.start))
        for member in span.members:
            _, offset, length, buffer = wanted[member]
            buffer[:length] = block[offset - span.start : offset - span.start + length]

    def close(self) -> None:
        pass


class LocalSource(Source):
    """A regular local file, already opened beneath its container (see ``ManifestMap._open_local``)."""

    gap = LOCAL_GAP
    remote = False

    def __init__(self, path: str, fd: int, recorded: dict | None) -> None:
        self.name = path
        self.fd = fd
        try:
            info = os.fstat(self.fd)
            self.size = info.st_size
            check_recorded(path, recorded, self.size, mtime=info.st_mtime_ns)
        except BaseException:
            os.close(fd)
            raise

    def read(self, offset: int, length: int) -> bytes:
        return byteranges.read_exact(self.fd, length, offset, self.name)

    def fill_columns(self, span: ColumnSpan, targets: Targets) -> None:
        """One positional read scattered straight into the targets (a vector per run of references
        contiguous in both, gaps read into scratch space); a reference overlapping one before it is read
        on its own afterwards."""
        offsets, lengths, positions = span.offsets, span.lengths, span.positions
        if len(offsets) == 1:
            self._read_vectors([targets.view(int(positions[0]), int(lengths[0]))], span.start)
            return
        after = np.ones(len(offsets), dtype=bool)  # begins after every reference before it has ended
        after[1:] = offsets[1:] >= np.maximum.accumulate(offsets + lengths)[:-1]
        chosen = positions[after]
        contiguous = runs(offsets[after], lengths[after], targets.which[chosen], targets.starts[chosen])
        self._read_runs(span.start, *contiguous, targets.buffers)
        for at in np.flatnonzero(~after).tolist():
            offset, length = int(offsets[at]), int(lengths[at])
            targets.view(int(positions[at]), length)[:] = self.read(offset, length)

    def _read_runs(self, start: int, before, which, starts, sizes, buffers: list[memoryview]) -> None:
        scratch = memoryview(bytearray(int(before.max()))) if before.any() else None  # gaps: read, dropped
        vectors: list[memoryview] = []
        for gap, number, at, size in zip(
            before.tolist(), which.tolist(), starts.tolist(), sizes.tolist(), strict=True
        ):
            if gap:
                vectors.append(scratch[:gap])
            vectors.append(buffers[number][at : at + size])
            if len(vectors) >= MAX_IOVECS - 1:
                start = self._read_vectors(vectors, start)
                vectors = []
        if vectors:
            self._read_vectors(vectors, start)

    def _read_vectors(self, vectors: list[memoryview], start: int) -> int:
        """Fill ``vectors`` from ``start`` on (one ``preadv``); where the next read begins."""
        expected = sum(map(len, vectors))
        if os.preadv(self.fd, vectors, start) != expected:
            raise StorageError(f"{self.name!r} is shorter than its references say: it changed")
        return start + expected

    def close(self) -> None:
        os.close(self.fd)


class ObjectSource(Source):
    """An S3 object (``s3://bucket/key``): its size and ETag from one HEAD (compared with what the manifest
    recorded), spans as range GETs conditional on that ETag (``If-Match``: an object replaced while it is
    read is an error, never bytes of two versions)."""

    gap = REMOTE_GAP
    max_span = REMOTE_MAX_SPAN
    bucket: str | None = None

    def __init__(self, url: str, options: dict, recorded: dict | None) -> None:
        self.name = url
        bucket, _, self.path = url[len("s3://") :].partition("/")
        self.bucket = bucket
        self.store = bucket_store(bucket, options)
        self._head(recorded)

    def _head(self, recorded: dict | None) -> None:
        import obstore

        try:
            meta = obstore.head(self.store, self.path)
        except Exception as exc:
            error = byteranges.store_error(exc, f"read the source {self.name}", self.bucket)
            raise error or StorageError(f"the source {self.name} of a reference does not exist") from exc
        self.size = meta["size"]
        self.etag = meta.get("e_tag")
        check_recorded(self.name, recorded, self.size, etag=self.etag or "(none)")

    def _options(self, start: int, end: int) -> dict:
        return {"range": (start, end), **({"if_match": self.etag} if self.etag else {})}

    def _failure(self, exc: Exception) -> NCZError:
        from obstore.exceptions import PreconditionError

        if isinstance(exc, PreconditionError):
            return StorageError(
                f"the source {self.name} changed while it was read (its ETag is no longer {self.etag})"
            )
        error = byteranges.store_error(exc, f"read {self.name}", self.bucket)
        return error or StorageError(f"the source {self.name} disappeared")

    def read(self, offset: int, length: int) -> bytes:
        import obstore

        if not length:
            return b""
        try:
            data = bytes(
                obstore.get(self.store, self.path, options=self._options(offset, offset + length)).bytes()
            )
        except Exception as exc:
            raise self._failure(exc) from exc
        if len(data) != length:
            raise StorageError(
                f"{self.name} is shorter than its references say ({len(data)} of {length} bytes at "
                f"offset {offset}): it changed"
            )
        return data

    def fill(self, span: byteranges.Span, wanted: list[tuple[int, int, int, memoryview]]) -> None:
        """One range GET for the span, its body scattered into the members' buffers as it arrives: no
        buffer of the span's size, one copy of each byte (a span of a whole 256 MiB object reads as fast
        as one GET of the object)."""
        import obstore

        if span.end == span.start:  # empty references only: nothing to ask for
            return
        members = sorted(span.members, key=lambda m: wanted[m][1])
        waiting = 0  # members[waiting:] have not started yet
        active: list[int] = []  # started, not yet complete (several only where references overlap)
        at = span.start
        try:
            result = obstore.get(self.store, self.path, options=self._options(span.start, span.end))
            for piece in result.stream(min_chunk_size=STREAM_PIECE):
                view = memoryview(piece)
                end = min(at + len(view), span.end)
                while waiting < len(members) and wanted[members[waiting]][1] < end:
                    active.append(members[waiting])
                    waiting += 1
                still = []
                for member in active:
                    _, offset, length, buffer = wanted[member]
                    low, high = max(offset, at), min(offset + length, end)
                    if high > low:
                        buffer[low - offset : high - offset] = view[low - at : high - at]
                    if offset + length > end:
                        still.append(member)
                active = still
                at = end
                if at == span.end:
                    break
        except Exception as exc:
            raise self._failure(exc) from exc
        if at != span.end:
            raise StorageError(
                f"{self.name} is shorter than its references say ({at - span.start} of "
                f"{span.end - span.start} bytes at offset {span.start}): it changed"
            )


class HttpSource(Source):
    """A file served over HTTP(S): the canonical URL is requested as it is, one HEAD (size and ETag,
    compared with what the manifest recorded; whether ranges are served) then range GETs conditional on
    that ETag (``If-Match``: a file replaced while it is read is an error, never bytes of two versions),
    through ``nczmap.zmap.http``, which never follows a redirect (a 3xx is AccessDenied) and bounds every
    request by its deadline and retry budget.

    Merged spans are read as S3's are: one GET a span (up to :data:`REMOTE_MAX_SPAN`), its body scattered
    into the chunks' buffers as it arrives, many spans in flight (:data:`REMOTE_SPANS_IN_FLIGHT`).

    Container option ``headers`` (a dict, for example an ``Authorization``) goes with every request; it
    comes from the user's grant, never from the manifest.
    """

    gap = REMOTE_GAP
    max_span = REMOTE_MAX_SPAN

    def __init__(self, url: str, options: dict, recorded: dict | None) -> None:
        from nczmap.zmap.http import HttpReader

        self.name = url
        headers = options.get("headers") or {}
        if not isinstance(headers, Mapping):
            raise DataError(f"the container option 'headers' for {url} must be a dict of strings")
        try:
            self.reader = HttpReader(url, headers)
        except ValueError as exc:
            raise DataError(f"the container option 'headers' for {url}: {exc}") from None
        try:
            head = self.reader.head()
            check_recorded(url, recorded, head.size, etag=head.etag or "(none)")
        except BaseException:
            self.reader.close()
            raise
        self.size = head.size
        self.reader.conditional = True  # every GET: If-Match the ETag just checked

    def read(self, offset: int, length: int) -> bytes:
        return self.reader.read(offset, length)

    def fill(self, span: byteranges.Span, wanted: list[tuple[int, int, int, memoryview]]) -> None:
        if len(span.members) == 1:  # the usual case: straight into the caller's buffer, no copy
            _, offset, length, buffer = wanted[span.members[0]]
            self.reader.read_into(offset, buffer[:length])
        else:
            targets = [(wanted[m][1], wanted[m][3][: wanted[m][2]]) for m in span.members]
            self.reader.scatter(span.start, span.end, targets)

    def close(self) -> None:
        self.reader.close()


def verify_checksum(key: str, data, expected: int, source: str) -> None:
    """Refuse bytes whose crc32c is not the one recorded when the manifest was made (the source was
    rewritten, whatever its size and modification time say)."""
    found = crc32c(data)
    if found != expected:
        raise StorageError(
            f"chunk {key!r}: the bytes read from {source} have crc32c {found:#010x}, not the recorded "
            f"{expected:#010x}: the source was rewritten since the manifest was made"
        )


def open_remote_source(real: str, container: Container, info: dict | None) -> Source:
    if real.startswith(("http://", "https://")):
        return HttpSource(real, dict(container.options), info)
    return ObjectSource(real, dict(container.options), info)


def check_recorded(name: str, recorded: dict | None, size: int, mtime: int | None = None, etag=None) -> None:
    """Refuse a source that is not what the manifest recorded (checked once per source, not per chunk).

    Sizes and ETags must be equal. Modification times (ns) too, unless the map was opened with an
    ``mtime_tolerance`` (seconds, carried by the :class:`Recorded` entries), because copies keep them to
    different precisions: ``cp -p`` and ``rsync -t``/``-a`` (3.1 and later) keep nanoseconds between ext4,
    xfs, btrfs and tmpfs; tar keeps whole seconds (GNU tar ``--format=posix`` keeps nanoseconds); zip
    keeps 2 s (1 s with Info-ZIP's extended timestamp), as FAT does; a copy without ``-p``/``-t`` gets the
    time of the copy, which no tolerance meant for rounding accepts. S3 has no modification time: its
    ETag is compared instead, and is never relaxed. Neither is the size.
    """
    if not recorded:
        return
    changes = []
    if "size" in recorded and recorded["size"] != size:
        changes.append(f"size {recorded['size']} -> {size}")
    if mtime is not None and "mtime" in recorded:
        drift = abs(recorded["mtime"] - mtime)
        allowed = getattr(recorded, "mtime_tolerance", 0)
        if drift > allowed:
            within = f", more than the {allowed / 1e9:g} s allowed" if allowed else ""
            changes.append(f"modification time, {drift / 1e9:.9g} s apart{within}")
    if etag is not None and "etag" in recorded and recorded["etag"] != etag:
        changes.append(f"ETag {recorded['etag']} -> {etag}")
    if changes:
        raise StorageError(f"the source {name} changed since the manifest was made ({', '.join(changes)})")


def store_options(url: ParsedURL) -> dict[str, str]:
    if not url.on_s3:
        return {}
    options = {"endpoint": url.endpoint, "region": url.region, "profile": url.profile}
    return {k: v for k, v in options.items() if v}


def bucket_store(bucket: str, options: dict):
    return byteranges.s3_store(
        bucket, endpoint=options.get("endpoint"), region=options.get("region"), profile=options.get("profile")
    )


class Recorded(dict):
    """What the manifest recorded about one source, and by how many nanoseconds its modification time may
    differ (the map's ``mtime_tolerance``); saved as the plain object it is."""

    mtime_tolerance = 0


def tolerate(sources: dict[str, dict], seconds: float) -> None:
    for url, recorded in list(sources.items()):
        entry = sources[url] = Recorded(recorded)
        entry.mtime_tolerance = round(seconds * 1e9)


def parse_mtime_tolerance(url: ParsedURL, seconds: object) -> float:
    """The ``mtime_tolerance`` option, else the URL fragment's ``mtime_tolerance=``; 0 (exact) without."""
    error: type[URLError | DataError] = DataError
    if seconds is None:
        text = url.fragment.get("mtime_tolerance")
        if text is None:
            return 0.0
        error = URLError
        try:
            seconds = float(text)
        except ValueError:
            seconds = text
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < math.inf:
        raise error(f"mtime_tolerance {seconds!r} for {url.original!r} is not a number of seconds >= 0")
    return float(seconds)
