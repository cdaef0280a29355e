"""Reading byte ranges of one HTTP(S) URL, on the standard library, without ever leaving that URL.

The manifest driver reads ``http(s)://`` references through :class:`HttpReader`: one HEAD (size, ETag,
whether ranges are accepted), then ``Range: bytes=a-b`` GETs, answered by 206 with the matching
``Content-Range`` (or by 200 with exactly the object, when the whole object was asked for). Neighbouring
ranges go out as one request and the others at the same time (:meth:`HttpReader.read_ranges`, merged by
``byteranges.merge_ranges``). Sources of :func:`nczmap.virtualize` make no HEAD: :meth:`HttpReader.fetch`
learns the size, ETag and ``Last-Modified`` from the answer to the first ranged GET (its
``Content-Range`` total; a server ignoring ``Range`` has the needed part of its 200 read and the rest of
the connection dropped, the size taken from ``Content-Length``).

Once an ETag (or, without one, a ``Last-Modified``) is known, every GET is conditional on it
(``If-Match``, or ``If-Unmodified-Since``): an object replaced between two reads answers 412, and an
answer whose ETag or ``Content-Range`` total is not the one first seen is refused too (for servers that
ignore the condition). Either is :class:`SourceChanged`, never bytes of two versions mixed.

Redirects are never followed: any 3xx answer is :class:`AccessDenied` naming the reference, the
``Location`` it points at, and what to do (reference the final location, under a granted container). A
reference is authorised by the canonical URL it names (``nczmap.manifest.containers``); a server's
``Location`` is a second, unauthorised URL. Following it safely would mean normalising and authorising
every hop, refusing metadata hosts again, deciding which hops may receive the grant's headers, and
bounding the chain; refusing is simpler, leaves nothing to get wrong, and costs nothing for data that is
published at a stable URL. The grant's ``headers`` therefore go with every request to the granted URL
and nowhere else.

Errors are nczmap errors naming the URL: 401/403 are AccessDenied, 404/410 "does not exist", anything
else (other statuses, refused connections, timeouts, TLS failures, malformed answers) StorageError.
Time is bounded by a :class:`~nczmap.zmap.byteranges.RequestPolicy`: every request has an overall
deadline (30 s plus 1 s a MB of its length by default) enforced by a watchdog that shuts its connection
down when it passes, whatever the server sends meanwhile (one byte every two seconds included); a socket
also waits at most :data:`CONNECT_TIMEOUT` to connect and :data:`READ_TIMEOUT` for each read. 5xx, 408
and 429 answers, refused or reset connections, bodies cut short, timeouts and passed deadlines are retried
(:data:`MAX_RETRIES` times by default) with exponential back-off and jitter, or after the ``Retry-After``
the server asks for, within the policy's budget; other 4xx answers are not retried. Bodies are read into
a buffer of the requested length: a ``Content-Length`` other than that is refused before anything is
read, and a body without one that runs past it is an error after one byte too many.

Connections are kept in one pool per host (scheme, host, port), shared by every reader and thread of the
process: an idle connection is taken by the next request to that host; at most :data:`POOL_SIZE` idle
ones are kept a host and :data:`MAX_IDLE` in all, none longer than :data:`IDLE_SECONDS` (the connections
in use are bounded by the threads using them). A connection the server closed while idle is replaced at
once (not counted as an attempt). A forked child starts with an empty pool.

References are fetched directly: ``HTTP(S)_PROXY`` variables are not used. ``https`` verifies the server
with the system's certificate authorities (``ssl.create_default_context()``).
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import http.client
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import NamedTuple, TypeVar
from urllib.parse import urljoin, urlsplit

from nczmap._version import __version__
from nczmap.errors import AccessDenied, NCZError, StorageError
from nczmap.zmap.byteranges import DEFAULT_POLICY, RequestPolicy, merge_ranges, run_concurrently

CONNECT_TIMEOUT = 5.0  # seconds, as byteranges.CLIENT_OPTIONS
READ_TIMEOUT = 15.0  # the longest wait for any progress (the deadline bounds the whole request)
MAX_RETRIES = DEFAULT_POLICY.attempts - 1
POOL_SIZE = 128  # idle connections kept per host (as many as sources parsed at once)
MAX_IDLE = 256  # idle connections kept in all
IDLE_SECONDS = 20.0  # an idle connection older than this is closed, not reused
SPANS_IN_FLIGHT = 16  # spans of one read_ranges call requested at once
PIECE = 1 << 20  # bodies are read in pieces of this size
RESERVED_HEADERS = (
    "host",
    "range",
    "content-length",
    "transfer-encoding",
    "connection",
    "accept-encoding",
    "if-match",
    "if-unmodified-since",
)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 header name
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED = re.compile(r"bytes \*/(\d+)")
T = TypeVar("T")
Parse = Callable[[http.client.HTTPResponse], T]


class Head(NamedTuple):
    """What a HEAD tells: the size, the ETag (None without one), whether ranges may be asked for."""

    size: int
    etag: str | None
    ranges: bool


class SourceChanged(StorageError):
    """The object is no longer the one first seen (412 to a conditional GET, another ETag or size)."""


class _Transient(StorageError):
    """A failure worth another attempt (5xx, 408, 429, a dropped connection, a body cut short)."""

    retry_after: float | None = None


class _Stale(Exception):
    """An idle pooled connection the server had closed: replaced at once, not counted as an attempt."""


class HttpReader:
    """Ranges of the object at ``url`` (canonical: requested exactly as spelled), ``headers`` sent with
    every request, time bounded and failures retried by ``policy``. Usable from several threads at once.

    ``size``, ``etag`` and ``modified`` (``Last-Modified``) are what the first answer told (or what the
    caller set beforehand, from a manifest): later answers must agree, and once ``conditional`` is set
    (:meth:`fetch` sets it) every GET carries ``If-Match`` (a strong ETag) or ``If-Unmodified-Since``.
    """

    def __init__(
        self, url: str, headers: Mapping[str, str] | None = None, policy: RequestPolicy | None = None
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL")
        self.url = url
        self.headers = _checked_headers(headers or {})
        if not any(name.lower() == "user-agent" for name in self.headers):
            self.headers["User-Agent"] = f"nczmap/{__version__}"
        self.policy = policy or DEFAULT_POLICY
        self._host = (parts.scheme, parts.hostname, parts.port)
        self._path = parts.path or "/"
        self.size: int | None = None
        self.etag: str | None = None
        self.modified: str | None = None
        self.conditional = False
        self.requests = 0  # attempts sent, retries included
        self._ranges = True
        self._lock = threading.Lock()

    def __enter__(self) -> HttpReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------- requests
    def head(self) -> Head:
        """Size, ETag and range support of the object (also kept for the reads that follow)."""
        head = self._exchange("HEAD", {}, self._parse_head, "read the size of", 0)
        self.size, self._ranges = head.size, head.ranges
        if self.etag is None:
            self.etag = head.etag
        return head

    def read(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``; anything else is an error naming the URL."""
        buffer = bytearray(length)
        self.read_into(offset, memoryview(buffer))
        return bytes(buffer)

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` with the bytes at ``offset`` (one ranged GET)."""
        if not buffer:
            return
        end = offset + len(buffer) - 1
        whole = offset == 0 and self.size == len(buffer)
        if not (whole or self._ranges):
            raise StorageError(
                f"cannot read bytes {offset}-{end} of {self.url}: the server does not accept byte ranges "
                "(Accept-Ranges: none)"
            )
        self._exchange(
            "GET",
            {"Range": f"bytes={offset}-{end}", **self._conditions()},
            lambda response: self._receive(response, offset, buffer, whole),
            f"read bytes {offset}-{end} of",
            len(buffer),
        )

    def fetch(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer at the end of the object, none past it) in one GET,
        learning the object's size, ETag and ``Last-Modified`` from the answer (no HEAD), or checking them
        against those already known; later GETs are conditional on them. A server ignoring ``Range``
        (200 and the whole object) has only what is needed read, its size taken from ``Content-Length``."""
        if length <= 0:
            return b""
        end = offset + length - 1
        self.conditional = True
        return self._exchange(
            "GET",
            {"Range": f"bytes={offset}-{end}", **self._conditions()},
            lambda response: self._receive_some(response, offset, length),
            f"read bytes {offset}-{end} of",
            length,
        )

    def scatter(self, start: int, end: int, targets: Sequence[tuple[int, memoryview]]) -> None:
        """One GET of bytes ``[start, end)``, its body placed into each ``(offset, buffer)`` of
        ``targets`` (ranges inside it, in any order, overlapping or with gaps between) as it arrives: no
        buffer of the span's size, one copy of each byte."""
        if end <= start:
            return
        whole = start == 0 and self.size == end
        if not (whole or self._ranges):
            raise StorageError(
                f"cannot read bytes {start}-{end - 1} of {self.url}: the server does not accept byte ranges "
                "(Accept-Ranges: none)"
            )
        ordered = sorted(targets, key=lambda target: target[0])
        self._exchange(
            "GET",
            {"Range": f"bytes={start}-{end - 1}", **self._conditions()},
            lambda response: self._receive_scattered(response, start, end, ordered, whole),
            f"read bytes {start}-{end - 1} of",
            end - start,
        )

    def read_ranges(self, ranges: Sequence[tuple[int, int]], gap: int = 0) -> list[bytes]:
        """Every ``(offset, length)`` range exactly; ranges at most ``gap`` bytes apart are fetched
        together, the spans that remain at the same time (:data:`SPANS_IN_FLIGHT` at once)."""
        results = [b""] * len(ranges)
        spans = merge_ranges(ranges, gap)

        def one(span) -> None:
            block = memoryview(self.read(span.start, span.end - span.start))
            for index in span.members:
                start, length = ranges[index]
                results[index] = bytes(block[start - span.start : start - span.start + length])

        run_concurrently([lambda s=span: one(s) for span in spans], SPANS_IN_FLIGHT)
        return results

    def close(self) -> None:
        """Nothing to release: connections belong to the process's pool (kept for other readers)."""

    # ------------------------------------------------------------------------------------- exchanges
    def _conditions(self) -> dict[str, str]:
        if not self.conditional:
            return {}
        if self.etag and not self.etag.startswith("W/"):  # weak validators never match If-Match
            return {"If-Match": self.etag}
        if self.modified:
            return {"If-Unmodified-Since": self.modified}
        return {}

    def _exchange(self, method: str, headers: dict[str, str], parse: Parse[T], what: str, length: int) -> T:
        """One request, answered and parsed, retried when that may help (see the module's notes)."""
        policy = self.policy
        began, attempt, stale = time.monotonic(), 0, 0
        pool = _pool(self._host)
        while True:
            connection, reused = pool.take()
            limit = policy.deadline_for(length)
            guard = _WATCHDOG.arm(time.monotonic() + limit, connection)
            keep = False
            failure: NCZError | None = None
            try:
                with self._lock:
                    self.requests += 1
                result, keep = self._attempt(connection, method, headers, parse, what, reused, guard)
                return result
            except _Stale:
                stale += 1
                if stale <= POOL_SIZE:  # every idle connection of the pool may have been closed
                    continue
                failure = StorageError(f"cannot {what} {self.url}: the server keeps closing connections")
            except _Transient as exc:
                failure = self._late(what, limit) if guard.expired else exc
            except NCZError:
                raise
            except ssl.SSLCertVerificationError as exc:
                raise StorageError(f"cannot {what} {self.url}: {exc}") from exc
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if guard.expired:
                    failure = self._late(what, limit)
                else:
                    failure = _Transient(f"cannot {what} {self.url}: {_describe(exc)}")
                failure.__cause__ = exc
            finally:
                expired = _WATCHDOG.disarm(guard)
                if keep and not expired:
                    pool.give(connection)
                else:
                    connection.close()
            attempt += 1
            wait = policy.wait(attempt)
            after = getattr(failure, "retry_after", None)
            if after is not None:
                wait = after
            spent = time.monotonic() - began
            if attempt >= policy.attempts or spent + wait > policy.budget:
                tried = f" ({attempt} attempts in {spent:.1f} s)" if attempt > 1 else ""
                raise StorageError(f"{failure}{tried}") from failure.__cause__
            time.sleep(wait)

    def _late(self, what: str, limit: float) -> _Transient:
        return _Transient(f"cannot {what} {self.url}: no complete answer within its deadline of {limit:g} s")

    def _attempt(
        self,
        connection: http.client.HTTPConnection,
        method: str,
        headers: dict[str, str],
        parse: Parse[T],
        what: str,
        reused: bool,
        guard: _Guard,
    ) -> tuple[T, bool]:
        """The answer parsed, and whether the connection may serve another request."""
        if connection.sock is None:
            connection.timeout = max(0.001, min(CONNECT_TIMEOUT, guard.deadline - time.monotonic()))
            connection.connect()
            reused = False
        connection.sock.settimeout(READ_TIMEOUT)
        try:
            connection.request(method, self._path, headers={**self.headers, **headers})
            response = connection.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            if reused and not guard.expired:
                raise _Stale() from exc
            raise
        try:
            self._check_status(response, what)
            result = parse(response)
        except BaseException:
            response.close()
            raise
        return result, response.isclosed()

    def _check_status(self, response: http.client.HTTPResponse, what: str) -> None:
        status = response.status
        if 200 <= status < 300 or status == 416:
            return
        shown = f"{status} {_printable(response.reason)}".strip()
        if 300 <= status < 400:
            target = _location(self.url, response.getheader("Location"))
            raise AccessDenied(
                f"cannot {what} {self.url}: the server redirects ({shown}) to {target}, and redirects are "
                "not followed; the manifest should reference the final location, under a granted container"
            )
        if status in (401, 403):
            raise AccessDenied(
                f"cannot {what} {self.url}: access denied ({shown}); credentials go in the granted "
                "container's 'headers' option"
            )
        if status in (404, 410):
            raise StorageError(f"the source {self.url} of a reference does not exist ({shown})")
        if status == 412:
            was = f"its ETag is no longer {self.etag}" if self.etag else f"modified after {self.modified}"
            raise SourceChanged(f"{self.url} changed while it was read ({shown}: {was})")
        if status >= 500 or status in (408, 429):
            error = _Transient(f"cannot {what} {self.url}: the server answered {shown}")
            error.retry_after = _retry_after(response.getheader("Retry-After"), self.policy)
            raise error
        raise StorageError(f"cannot {what} {self.url}: the server answered {shown}")

    # ------------------------------------------------------------------------------------- answers
    def _parse_head(self, response: http.client.HTTPResponse) -> Head:
        response.read()  # a HEAD has no body: this only marks the answer complete
        if response.status == 416:
            raise StorageError(f"cannot read the size of {self.url}: the server answered 416 to a HEAD")
        size = _integer(response.getheader("Content-Length"))
        if size is None:
            raise StorageError(f"cannot read the size of {self.url}: its HEAD gives no valid Content-Length")
        ranges = (response.getheader("Accept-Ranges") or "bytes").strip().lower() != "none"
        if self.modified is None:
            self.modified = response.getheader("Last-Modified")
        return Head(size, response.getheader("ETag"), ranges)

    def _receive(
        self, response: http.client.HTTPResponse, offset: int, buffer: memoryview, whole: bool
    ) -> None:
        """Check the answer to a ranged GET, then read its body into ``buffer``."""
        where = f"bytes {offset}-{offset + len(buffer) - 1} of {self.url}"
        claimed = self._check_range_answer(response, offset, len(buffer), where, whole)
        self._read_body(response, buffer, where)
        if claimed is None and response.read(1):
            raise StorageError(
                f"cannot read {where}: the server sent more than the {len(buffer)} bytes asked"
            )

    def _check_range_answer(
        self, response: http.client.HTTPResponse, offset: int, length: int, where: str, whole: bool
    ) -> str | None:
        """Refuse an answer to a ranged GET of ``length`` bytes at ``offset`` that is not those bytes of
        the object first seen (a 200 unless ``whole`` was asked, another range, another ETag, an encoding,
        another length); its Content-Length, if it gave one."""
        if response.status == 200 and not whole:
            raise StorageError(
                f"cannot read {where}: the server ignored the Range header (200 with the whole object "
                "instead of 206); references can only be read from servers that serve byte ranges"
            )
        if response.status not in (200, 206):
            raise StorageError(f"cannot read {where}: unexpected answer {response.status} to a range request")
        if response.status == 206:
            self._check_content_range(response.getheader("Content-Range"), offset, length, where)
        self._check_validators(response, where)
        self._check_encoding(response, where)
        claimed = response.getheader("Content-Length")
        if claimed is not None and _integer(claimed) != length:
            raise StorageError(
                f"cannot read {where}: the server announces {_printable(claimed, 40)} bytes for a range of "
                f"{length}"
            )
        return claimed

    def _receive_scattered(
        self,
        response: http.client.HTTPResponse,
        start: int,
        end: int,
        targets: list[tuple[int, memoryview]],
        whole: bool,
    ) -> None:
        """:meth:`_receive` of a span whose body goes, piece by piece, into the targets' buffers."""
        where = f"bytes {start}-{end - 1} of {self.url}"
        claimed = self._check_range_answer(response, start, end - start, where, whole)
        piece = memoryview(bytearray(min(PIECE, end - start)))
        at, waiting, active = start, 0, []  # targets[waiting:] not reached yet; active: reached, not done
        while at < end:
            count = 0
            with contextlib.suppress(http.client.IncompleteRead):
                count = response.readinto(piece[: min(PIECE, end - at)])
            if not count:
                raise _Transient(
                    f"cannot read {where}: the answer ended after {at - start} of {end - start} bytes"
                )
            top = at + count
            while waiting < len(targets) and targets[waiting][0] < top:
                active.append(targets[waiting])
                waiting += 1
            still = []
            for offset, buffer in active:
                low, high = max(offset, at), min(offset + len(buffer), top)
                if high > low:
                    buffer[low - offset : high - offset] = piece[low - at : high - at]
                if offset + len(buffer) > top:
                    still.append((offset, buffer))
            active, at = still, top
        if claimed is None and response.read(1):
            raise StorageError(
                f"cannot read {where}: the server sent more than the {end - start} bytes asked"
            )

    def _receive_some(self, response: http.client.HTTPResponse, offset: int, length: int) -> bytes:
        """The answer to :meth:`fetch`: up to ``length`` bytes at ``offset``, the size learnt."""
        where = f"bytes {offset}-{offset + length - 1} of {self.url}"
        status = response.status
        if status == 416:
            match = _UNSATISFIED.fullmatch((response.getheader("Content-Range") or "").strip())
            if match is None:
                raise StorageError(f"cannot read {where}: 416 without the object's size (Content-Range)")
            self._learn_size(int(match[1]), where)
            if offset < int(match[1]):
                raise StorageError(f"cannot read {where}: the server refused a range inside the object")
            return b""
        if status not in (200, 206):
            raise StorageError(f"cannot read {where}: unexpected answer {status} to a range request")
        self._check_validators(response, where)
        self._check_encoding(response, where)
        claimed = response.getheader("Content-Length")
        if status == 206:
            header = response.getheader("Content-Range")
            match = _CONTENT_RANGE.fullmatch((header or "").strip())
            if match is None or match[3] == "*":
                raise StorageError(
                    f"cannot read {where}: the answer gives no range and size of the object (Content-Range: "
                    f"{_printable(header or '', 80)!r})"
                )
            first, last, total = int(match[1]), int(match[2]), int(match[3])
            whole = last == offset + length - 1 or (last < offset + length - 1 and last == total - 1)
            if first != offset or last < first or last >= total or not whole:  # (or the object ends first)
                raise SourceChanged(
                    f"cannot read {where}: the server answered with another range "
                    f"(Content-Range: {_printable(header or '', 80)!r}); the source may have changed"
                )
            self._learn_size(total, where)
            count = last - first + 1
            if claimed is not None and _integer(claimed) != count:
                raise StorageError(
                    f"cannot read {where}: the server announces {_printable(claimed, 40)} bytes for a range "
                    f"of {count}"
                )
            buffer = bytearray(count)
            self._read_body(response, memoryview(buffer), where)
            if claimed is None and response.read(1):
                raise StorageError(f"cannot read {where}: the server sent more than the {count} bytes asked")
            return bytes(buffer)
        # 200: the server ignored Range and sends the whole object: read what is needed, drop the rest
        size = _integer(claimed)
        if size is None:
            raise StorageError(
                f"cannot read {where}: the server ignores Range and gives no Content-Length (the object's "
                "size); it cannot be read in parts"
            )
        self._learn_size(size, where)
        skip = min(offset, size)
        scratch = memoryview(bytearray(min(PIECE, skip)))
        while skip:
            count = response.readinto(scratch[: min(PIECE, skip)])
            if not count:
                raise _Transient(f"cannot read {where}: the answer ended before byte {offset}")
            skip -= count
        buffer = bytearray(max(0, min(length, size - offset)))
        self._read_body(response, memoryview(buffer), where)
        return bytes(buffer)  # a body not read to its end closes its connection (see _attempt)

    def _read_body(self, response: http.client.HTTPResponse, buffer: memoryview, where: str) -> None:
        done = 0
        try:
            while done < len(buffer):
                count = response.readinto(buffer[done : done + PIECE])
                if not count:
                    break
                done += count
        except http.client.IncompleteRead:
            pass
        if done < len(buffer):
            raise _Transient(f"cannot read {where}: the answer ended after {done} of {len(buffer)} bytes")

    def _check_encoding(self, response: http.client.HTTPResponse, where: str) -> None:
        encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise StorageError(f"cannot read {where}: the server sent it {encoding}-encoded")

    def _check_validators(self, response: http.client.HTTPResponse, where: str) -> None:
        """Keep the first ETag and Last-Modified seen; an answer with another ETag is of another object."""
        etag, modified = response.getheader("ETag"), response.getheader("Last-Modified")
        with self._lock:
            known = self.etag
            if known is None and etag:
                self.etag = etag
            if self.modified is None and modified:
                self.modified = modified
        if etag and known and etag != known:
            raise SourceChanged(
                f"cannot read {where}: its ETag changed from {_printable(known, 80)} to "
                f"{_printable(etag, 80)} while it was read"
            )

    def _learn_size(self, size: int, where: str) -> None:
        with self._lock:
            if self.size is None:
                self.size = size
                return
        if size != self.size:
            raise SourceChanged(f"cannot read {where}: its size changed from {self.size} to {size} bytes")

    def _check_content_range(self, header: str | None, offset: int, length: int, where: str) -> None:
        match = _CONTENT_RANGE.fullmatch((header or "").strip())
        if match is None or (int(match[1]), int(match[2])) != (offset, offset + length - 1):
            raise StorageError(
                f"cannot read {where}: the server answered with another range "
                f"(Content-Range: {_printable(header or '', 80)!r}); the source may have changed"
            )
        if self.size is not None and match[3] != "*" and int(match[3]) != self.size:
            raise StorageError(
                f"cannot read {where}: its size changed from {self.size} to {match[3]} bytes while open"
            )


# ------------------------------------------------------------------------------------------ connections
class _HostPool:
    """Idle connections to one (scheme, host, port), shared by every reader and thread: at most
    :data:`POOL_SIZE`, none idle longer than :data:`IDLE_SECONDS` (servers close them by then)."""

    def __init__(self, scheme: str, host: str, port: int | None) -> None:
        self.scheme, self.host, self.port = scheme, host, port
        self.idle: list[tuple[http.client.HTTPConnection, float]] = []  # oldest first
        self.lock = threading.Lock()

    def take(self) -> tuple[http.client.HTTPConnection, bool]:
        """A connection (an idle one, most recently used first, else a new one) and whether it was idle."""
        with self.lock:
            stale = self._expired(time.monotonic())
            found = self.idle.pop()[0] if self.idle else None
        _close(stale)
        if found is not None:
            return found, True
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, context=_tls()), False
        return http.client.HTTPConnection(self.host, self.port), False

    def give(self, connection: http.client.HTTPConnection) -> None:
        now = time.monotonic()
        with self.lock:
            stale = self._expired(now)
            self.idle.append((connection, now))
            while len(self.idle) > POOL_SIZE:
                stale.append(self.idle.pop(0)[0])
        _close(stale)
        _trim_pools()

    def _expired(self, now: float) -> list[http.client.HTTPConnection]:
        """Remove and return the connections idle too long (called holding ``lock``)."""
        count = 0
        while count < len(self.idle) and now - self.idle[count][1] > IDLE_SECONDS:
            count += 1
        expired = [connection for connection, _ in self.idle[:count]]
        del self.idle[:count]
        return expired

    def oldest(self) -> float:
        with self.lock:
            return self.idle[0][1] if self.idle else float("inf")

    def drop_oldest(self) -> None:
        with self.lock:
            dropped = [self.idle.pop(0)[0]] if self.idle else []
        _close(dropped)

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        _close([connection for connection, _ in idle])


def _close(connections: list[http.client.HTTPConnection]) -> None:
    for connection in connections:
        with contextlib.suppress(OSError):
            connection.close()


def _trim_pools() -> None:
    """At most :data:`MAX_IDLE` idle connections in the process, whatever the number of hosts: the
    longest idle closed first."""
    with _pools_lock:
        pools = list(_pools.values())
    if len(pools) < 2:
        return
    while sum(len(pool.idle) for pool in pools) > MAX_IDLE:
        min(pools, key=_HostPool.oldest).drop_oldest()


_pools: dict[tuple[str, str, int | None], _HostPool] = {}
_pools_lock = threading.Lock()
_context: ssl.SSLContext | None = None


def _pool(host: tuple[str, str, int | None]) -> _HostPool:
    with _pools_lock:
        pool = _pools.get(host)
        if pool is None:
            pool = _pools[host] = _HostPool(*host)
        return pool


def _tls() -> ssl.SSLContext:
    global _context
    if _context is None:
        _context = ssl.create_default_context()
    return _context


def close_connections() -> None:
    """Close every idle pooled connection (they are otherwise kept for the process's next requests)."""
    with _pools_lock:
        pools = list(_pools.values())
    for pool in pools:
        pool.close()


# ------------------------------------------------------------------------------------------ deadlines
class _Guard:
    """One request's deadline: when it passes, the watchdog shuts the connection's socket down."""

    __slots__ = ("armed", "connection", "deadline", "expired")

    def __init__(self, deadline: float, connection) -> None:
        self.deadline, self.connection = deadline, connection
        self.armed, self.expired = True, False

    def __lt__(self, other: _Guard) -> bool:
        return self.deadline < other.deadline


class _Watchdog:
    """One thread for the process, waking at the earliest armed deadline."""

    def __init__(self) -> None:
        self.heap: list[_Guard] = []
        self.disarmed = 0  # guards in the heap no longer armed (dropped when they reach its top)
        self.condition = threading.Condition()
        self.thread: threading.Thread | None = None

    def arm(self, deadline: float, connection) -> _Guard:
        guard = _Guard(deadline, connection)
        with self.condition:
            heapq.heappush(self.heap, guard)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="nczmap-http-deadlines", daemon=True)
                self.thread.start()
            if self.heap[0] is guard:
                self.condition.notify()
        return guard

    def disarm(self, guard: _Guard) -> bool:
        """Disarm ``guard``; whether its deadline had passed (its connection is then unusable)."""
        with self.condition:
            if guard.armed and not guard.expired:
                self.disarmed += 1
                if self.disarmed > 1024 and self.disarmed > len(self.heap) // 2:  # one long request at the
                    self.heap = [g for g in self.heap if g.armed and g is not guard]  # top: keep it small
                    heapq.heapify(self.heap)
                    self.disarmed = 0
            guard.armed = False
            guard.connection = None
            return guard.expired

    def _run(self) -> None:
        with self.condition:
            while True:
                while self.heap and not self.heap[0].armed:
                    heapq.heappop(self.heap)
                    self.disarmed = max(0, self.disarmed - 1)
                if not self.heap:
                    self.condition.wait()
                    continue
                wait = self.heap[0].deadline - time.monotonic()
                if wait > 0:
                    self.condition.wait(wait)
                    continue
                guard = heapq.heappop(self.heap)
                guard.expired = True
                sock = getattr(guard.connection, "sock", None)
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns at once


_WATCHDOG = _Watchdog()


def _after_fork() -> None:
    """A forked child shares its parent's sockets: it must not use the parent's pooled connections (its
    copies of their descriptors are closed: the parent's connections stay open), nor locks another thread
    of the parent may have held."""
    global _pools, _pools_lock, _WATCHDOG
    inherited = list(_pools.values())
    _pools, _pools_lock, _WATCHDOG = {}, threading.Lock(), _Watchdog()
    for pool in inherited:
        _close([connection for connection, _ in pool.idle])


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
atexit.register(close_connections)  # idle connections closed, not left to the collector at exit


# ------------------------------------------------------------------------------------------ helpers
def _checked_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The grant's headers, refused (ValueError) when not plain ``name: value`` strings or when they would
    replace one the reader sets itself."""
    checked = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValueError(f"header {name!r}: names and values must be strings")
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"{name!r} is not a valid header name")
        if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F or ord(c) > 0xFF for c in value):
            raise ValueError(f"the value of header {name!r} holds a control or non-Latin-1 character")
        if name.lower() in RESERVED_HEADERS:
            raise ValueError(f"header {name!r} is set by the reader itself")
        checked[name] = value
    return checked


def _retry_after(text: str | None, policy: RequestPolicy) -> float | None:
    """The wait a ``Retry-After`` asks for (seconds, or an HTTP date), at most the policy's budget."""
    text = (text or "").strip()
    if not text:
        return None
    if re.fullmatch(r"\d+(\.\d*)?", text):  # delay-seconds (fractions accepted too)
        seconds = float(text)
    else:
        try:
            seconds = parsedate_to_datetime(text).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return max(0.0, min(seconds, policy.budget))


def _integer(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isascii() and text.isdigit() else None


def _location(url: str, location: str | None) -> str:
    """Where a redirect points, absolute, for a message."""
    if not location:
        return "nowhere (no Location)"
    with contextlib.suppress(ValueError):  # a malformed Location is shown as it is
        location = urljoin(url, location)
    return repr(_printable(location, 300))


def _printable(text: str, limit: int = 100) -> str:
    """Server-supplied text fit for a message: printable characters only, and not too much of it."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return clean if len(clean) <= limit else clean[:limit] + "..."


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
