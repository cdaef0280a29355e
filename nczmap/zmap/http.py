"""Reading byte ranges of one HTTP(S) URL, through libcurl, without ever leaving that URL.

The manifest driver reads ``http(s)://`` references through :class:`HttpReader`: one HEAD (size, ETag,
whether ranges are accepted), then ``Range: bytes=a-b`` GETs, answered by 206 with the matching
``Content-Range`` (or by 200 with exactly the object, when the whole object was asked for). Neighbouring
ranges go out as one request and the others at the same time (:meth:`HttpReader.read_ranges`, merged by
``byteranges.merge_ranges``). Sources of :func:`nczmap.virtualize` make no HEAD: :meth:`HttpReader.fetch`
learns the size, ETag and ``Last-Modified`` from the answer to the first ranged GET (its
``Content-Range`` total; a server ignoring ``Range`` has the needed part of its 200 read and the rest of
the connection dropped, the size taken from ``Content-Length``); :func:`fetch_each` makes many such first
reads at once from one thread.

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
deadline (30 s plus 1 s a MB of its length by default), whatever the server sends meanwhile (one byte
every two seconds included); a connection is waited for at most :data:`CONNECT_TIMEOUT`, and a transfer
that makes no progress for :data:`READ_TIMEOUT` ends. 5xx, 408 and 429 answers, refused or reset
connections, bodies cut short, timeouts and passed deadlines are retried (:data:`MAX_RETRIES` times by
default) with exponential back-off and jitter, or after the ``Retry-After`` the server asks for, within
the policy's budget; other 4xx answers are not retried. The budget is the URL's, not a request's
(:data:`~nczmap.zmap.byteranges.FAILURES`): it counts from the start of the URL's first failed attempt
since its last success, every request for it shares it (the first reads :func:`fetch_each` makes, the
parses' reads, a manifest's HEAD and GETs, whatever reader makes them), and once it is spent the URL's
requests fail at once, with the last failure, the attempts and the time spent: a URL that stops answering
fails within the budget plus one request's deadline. Bodies are read into a buffer of the requested
length: a ``Content-Length`` other than that is refused before any of the body is taken, and a body
without one that runs past it is an error at the first byte too many.

Requests go through libcurl (``pycurl``): requests are sent and answers received in compiled code, with
the interpreter's lock released (an answer's header lines are read once, when its body begins), which
is what lets a few hundred sources be read at once at the speed of the network. Only HTTP and HTTPS are
allowed, redirects are not followed, the path is sent exactly as spelled, and no content coding is asked
for or decoded. Handles
(and their connections) are kept in one pool for the process, shared by every reader and thread: an
idle handle is taken by the next request; at most :data:`POOL_SIZE` are kept, each with at most
:data:`CONNECTIONS_A_HANDLE` connections, none idle longer than :data:`IDLE_SECONDS`; libcurl replaces a
pooled connection the server closed. A forked child starts with an empty pool.

References are fetched directly: ``HTTP(S)_PROXY`` variables are not used. ``https`` verifies the server
with the system's certificate authorities (those Python's ``ssl`` finds, ``SSL_CERT_FILE`` included).

pycurl is loaded by :func:`nczmap.zmap.libcurl.load_pycurl`, bound to its own libcurl whatever the process
loaded before (ecCodes' wheels make eckit's libcurl 7.61.1 global, and a plain ``import pycurl`` after them
fails); where it cannot be (see that module), this module still imports, and every reader refuses with
:class:`~nczmap.zmap.libcurl.ClientUnavailable` naming its URL, the libcurl in the way and what to do.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import math
import os
import re
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import Generic, NamedTuple, TypeVar
from urllib.parse import urljoin, urlsplit, urlunsplit

from nczmap._version import __version__
from nczmap.errors import AccessDenied, NCZError, StorageError
from nczmap.zmap.byteranges import (
    DEFAULT_POLICY,
    FAILURES,
    RequestPolicy,
    merge_ranges,
    run_concurrently,
)
from nczmap.zmap.libcurl import ClientUnavailable, load_pycurl

try:
    pycurl = load_pycurl()
    _UNAVAILABLE: ClientUnavailable | None = None
except ClientUnavailable as exc:  # refused by each reader, naming its URL
    pycurl, _UNAVAILABLE = None, exc

CONNECT_TIMEOUT = 5.0  # seconds, as byteranges.CLIENT_OPTIONS
READ_TIMEOUT = 15.0  # the longest wait for any progress (the deadline bounds the whole request)
MAX_RETRIES = DEFAULT_POLICY.attempts - 1
POOL_SIZE = 128  # idle handles kept (as many as sources parsed at once)
CONNECTIONS_A_HANDLE = 2  # open connections a handle keeps (to as many hosts)
IDLE_MULTIS = 2  # multi handles kept (fetch_each calls at once), each with up to POOL_SIZE connections
IDLE_SECONDS = 20.0  # an idle connection older than this is closed, not reused
SPANS_IN_FLIGHT = 16  # spans of one read_ranges call requested at once
PIECE = 128 << 10  # bodies are received in pieces of at most this size
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
Parse = Callable[["_Transfer"], "_Receiver[T]"]


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
        if _UNAVAILABLE is not None:
            raise ClientUnavailable(f"cannot read {url}: {_UNAVAILABLE}")
        self.url = url
        self.headers = _checked_headers(headers or {})
        if not any(name.lower() == "user-agent" for name in self.headers):
            self.headers["User-Agent"] = f"nczmap/{__version__}"
        self.policy = policy or DEFAULT_POLICY
        self._target = urlunsplit((parts.scheme, parts.netloc, parts.path or "/", "", ""))
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
        (200 and the whole object) has only what is needed read, its size taken from ``Content-Length``.
        Many readers' fetches go out together through :func:`fetch_each`."""
        if length <= 0:
            return b""
        self.conditional = True
        return self._exchange(*self._fetch_request(offset, length))

    def _fetch_request(self, offset: int, length: int) -> tuple:
        end = offset + length - 1
        return (
            "GET",
            {"Range": f"bytes={offset}-{end}", **self._conditions()},
            lambda response: self._receive_some(response, offset, length),
            f"read bytes {offset}-{end} of",
            length,
        )

    def _start_fetch(self, curl: pycurl.Curl, offset: int, length: int) -> _Transfer:
        """``curl`` set for one attempt of :meth:`fetch` (counted), for a multi handle to perform."""
        self.conditional = True
        method, headers, parse, what, length = self._fetch_request(offset, length)
        with self._lock:
            self.requests += 1
        lines = self._lines(headers)
        return self._prepare(curl, method, lines, parse, what, self.policy.deadline_for(length))

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
        """One request, answered and parsed, retried when that may help (see the module's notes): up to
        the policy's attempts, within the source's retry budget (shared by all its requests:
        :data:`~nczmap.zmap.byteranges.FAILURES`)."""
        policy = self.policy
        lines = self._lines(headers)
        attempt, wait = 0, 0.0
        while True:
            refusal = FAILURES.refusal(self.url, policy, wait)
            if refusal is not None:
                raise StorageError(refusal)
            if wait:
                time.sleep(wait)
            limit = policy.deadline_for(length)
            curl = _HANDLES.take()
            began = time.monotonic()
            try:
                with self._lock:
                    self.requests += 1
                result = self._attempt(curl, method, lines, parse, what, limit)
            except _Transient as exc:
                failure = exc
            else:
                FAILURES.succeeded(self.url)
                return result
            finally:
                _HANDLES.give(curl)
            attempt += 1
            FAILURES.failed(self.url, began, str(failure))
            wait = policy.wait(attempt) if failure.retry_after is None else failure.retry_after
            if attempt >= policy.attempts:
                raise StorageError(FAILURES.summary(self.url, str(failure))) from failure.__cause__

    def _lines(self, headers: dict[str, str]) -> list[str]:
        """The request's header lines: the grant's, then the reader's own."""
        return [_header_line(name, value) for name, value in {**self.headers, **headers}.items()]

    def _late(self, what: str, limit: float) -> _Transient:
        return _Transient(f"cannot {what} {self.url}: no complete answer within its deadline of {limit:g} s")

    def _attempt(
        self, curl: pycurl.Curl, method: str, lines: list[str], parse: Parse[T], what: str, limit: float
    ) -> T:
        """One request sent and its answer parsed; a failure worth another attempt is :class:`_Transient`."""
        transfer = self._prepare(curl, method, lines, parse, what, limit)
        error = None
        try:
            curl.perform()
        except pycurl.error as exc:
            error = exc
        return self._complete(curl, transfer, error)

    def _prepare(
        self, curl: pycurl.Curl, method: str, lines: list[str], parse: Parse[T], what: str, limit: float
    ) -> _Transfer:
        """``curl`` set for one request, its answer to go to the :class:`_Transfer` returned (libcurl hands
        it the status and headers, then the body)."""
        transfer = _Transfer(lambda answer: self._begin(answer, what, parse), what, limit)
        curl.setopt(pycurl.URL, self._target)
        if method == "HEAD":
            curl.setopt(pycurl.NOBODY, 1)
        else:
            curl.setopt(pycurl.HTTPGET, 1)
        curl.setopt(pycurl.HTTPHEADER, lines)
        curl.setopt(pycurl.TIMEOUT_MS, _milliseconds(limit))
        curl.setopt(pycurl.CONNECTTIMEOUT_MS, _milliseconds(min(CONNECT_TIMEOUT, limit)))
        curl.setopt(pycurl.LOW_SPEED_TIME, max(1, math.ceil(READ_TIMEOUT)))
        curl.setopt(pycurl.HEADERFUNCTION, transfer.header)
        curl.setopt(pycurl.WRITEFUNCTION, transfer.write)
        return transfer

    def _complete(self, curl: pycurl.Curl, transfer: _Transfer, error: pycurl.error | None) -> T:
        """The result of the transfer ``curl`` made (``error``: how libcurl ended it, if it failed)."""
        curl.setopt(pycurl.HEADERFUNCTION, _ignore)  # the transfer's buffers are not kept with the handle
        curl.setopt(pycurl.WRITEFUNCTION, _ignore)
        if transfer.failure is not None:
            raise transfer.failure
        if error is not None and not transfer.enough:
            took = time.monotonic() - transfer.began
            raise self._failed(error, transfer, transfer.what, transfer.limit, took) from None
        return transfer.begun().finish()

    def _begin(self, answer: _Transfer, what: str, parse: Parse[T]) -> _Receiver[T]:
        try:
            answer.read_headers()
        except ValueError as exc:
            raise _Transient(f"cannot {what} {self.url}: {exc}") from None
        self._check_status(answer, what)
        return parse(answer)

    def _failed(
        self, exc: pycurl.error, transfer: _Transfer, what: str, limit: float, took: float
    ) -> NCZError:
        """The error for a transfer libcurl ended with ``exc``."""
        code, message = exc.args[0], _printable(str(exc.args[1]) if len(exc.args) > 1 else "", 200)
        if code == pycurl.E_OPERATION_TIMEDOUT:
            if took >= limit * 0.999:
                return self._late(what, limit)
            return _Transient(f"cannot {what} {self.url}: timed out ({message})")
        if code in _FATAL_CODES:
            return StorageError(f"cannot {what} {self.url}: {message}")
        if transfer.receiver is not None:  # the body was cut: say how much of it came
            try:
                transfer.receiver.finish()
            except _Transient as short:
                return short
            except NCZError:
                pass
        return _Transient(f"cannot {what} {self.url}: {message or f'libcurl error {code}'}")

    def _check_status(self, response: _Transfer, what: str) -> None:
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
    def _parse_head(self, answer: _Transfer) -> _Receiver[Head]:
        if answer.status == 416:
            raise StorageError(f"cannot read the size of {self.url}: the server answered 416 to a HEAD")
        size = _integer(answer.getheader("Content-Length"))
        if size is None:
            raise StorageError(f"cannot read the size of {self.url}: its HEAD gives no valid Content-Length")
        ranges = (answer.getheader("Accept-Ranges") or "bytes").strip().lower() != "none"
        if self.modified is None:
            self.modified = answer.getheader("Last-Modified")
        return _Known(Head(size, answer.getheader("ETag"), ranges))

    def _receive(self, answer: _Transfer, offset: int, buffer: memoryview, whole: bool) -> _Receiver[None]:
        """Check the answer to a ranged GET, then have its body read into ``buffer``."""
        where = f"bytes {offset}-{offset + len(buffer) - 1} of {self.url}"
        self._check_range_answer(answer, offset, len(buffer), where, whole)
        return _Fill(buffer, where, lambda: None)

    def _check_range_answer(
        self, answer: _Transfer, offset: int, length: int, where: str, whole: bool
    ) -> None:
        """Refuse an answer to a ranged GET of ``length`` bytes at ``offset`` that is not those bytes of
        the object first seen (a 200 unless ``whole`` was asked, another range, another ETag, an encoding,
        another length)."""
        if answer.status == 200 and not whole:
            raise StorageError(
                f"cannot read {where}: the server ignored the Range header (200 with the whole object "
                "instead of 206); references can only be read from servers that serve byte ranges"
            )
        if answer.status not in (200, 206):
            raise StorageError(f"cannot read {where}: unexpected answer {answer.status} to a range request")
        if answer.status == 206:
            self._check_content_range(answer.getheader("Content-Range"), offset, length, where)
        self._check_validators(answer, where)
        self._check_encoding(answer, where)
        claimed = answer.getheader("Content-Length")
        if claimed is not None and _integer(claimed) != length:
            raise StorageError(
                f"cannot read {where}: the server announces {_printable(claimed, 40)} bytes for a range of "
                f"{length}"
            )

    def _receive_scattered(
        self, answer: _Transfer, start: int, end: int, targets: list[tuple[int, memoryview]], whole: bool
    ) -> _Receiver[None]:
        """:meth:`_receive` of a span whose body goes, piece by piece, into the targets' buffers."""
        where = f"bytes {start}-{end - 1} of {self.url}"
        self._check_range_answer(answer, start, end - start, where, whole)
        return _Scatter(start, end, targets, where)

    def _receive_some(self, answer: _Transfer, offset: int, length: int) -> _Receiver[bytes]:
        """The answer to :meth:`fetch`: up to ``length`` bytes at ``offset``, the size learnt."""
        where = f"bytes {offset}-{offset + length - 1} of {self.url}"
        status = answer.status
        if status == 416:
            match = _UNSATISFIED.fullmatch((answer.getheader("Content-Range") or "").strip())
            if match is None:
                raise StorageError(f"cannot read {where}: 416 without the object's size (Content-Range)")
            self._learn_size(int(match[1]), where)
            if offset < int(match[1]):
                raise StorageError(f"cannot read {where}: the server refused a range inside the object")
            return _Known(b"")
        if status not in (200, 206):
            raise StorageError(f"cannot read {where}: unexpected answer {status} to a range request")
        self._check_validators(answer, where)
        self._check_encoding(answer, where)
        claimed = answer.getheader("Content-Length")
        if status == 206:
            header = answer.getheader("Content-Range")
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
            return _Fill(memoryview(buffer), where, lambda: bytes(buffer))
        # 200: the server ignored Range and sends the whole object: read what is needed, drop the rest
        size = _integer(claimed)
        if size is None:
            raise StorageError(
                f"cannot read {where}: the server ignores Range and gives no Content-Length (the object's "
                "size); it cannot be read in parts"
            )
        self._learn_size(size, where)
        buffer = bytearray(max(0, min(length, size - offset)))
        return _Fill(memoryview(buffer), where, lambda: bytes(buffer), skip=min(offset, size), rest=True)

    def _check_encoding(self, answer: _Transfer, where: str) -> None:
        encoding = (answer.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise StorageError(f"cannot read {where}: the server sent it {encoding}-encoded")

    def _check_validators(self, answer: _Transfer, where: str) -> None:
        """Keep the first ETag and Last-Modified seen; an answer with another ETag is of another object."""
        etag, modified = answer.getheader("ETag"), answer.getheader("Last-Modified")
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


def fetch_each(
    requests: Sequence[tuple[HttpReader, int, int]],
    in_flight: int,
    answered: Callable[[int, bytes | NCZError | None], bool | None] | None = None,
) -> list[bytes | NCZError | None]:
    """For each ``(reader, offset, length)``, what ``reader.fetch(offset, length)`` returns, the requests
    made from this thread by libcurl's multi interface, at most ``in_flight`` at once (no thread a
    request). One attempt each: the error it raises where another attempt would not help, None where it
    failed in a way that may pass (the caller reads that range again through :meth:`HttpReader.fetch`,
    which retries within what is left of the URL's budget, counted from this attempt, and names the
    failure); no request for a URL already given up (its error instead). ``answered(index, result)`` is
    called as each ends, while the others go on; when it returns False, no request is started after those
    under way (the others' results stay None)."""
    if not requests:
        return []
    results: list[bytes | NCZError | None] = [None] * len(requests)
    waiting = deque(enumerate(requests))
    running: dict[pycurl.Curl, tuple[int, HttpReader, _Transfer]] = {}
    multi = _HANDLES.take_multi()
    try:
        while waiting or running:
            while waiting and len(running) < in_flight:
                index, (reader, offset, length) = waiting.popleft()
                refusal = FAILURES.refusal(reader.url, reader.policy)
                if refusal is not None:  # given up already: no request
                    results[index] = StorageError(refusal)
                    if answered is not None and answered(index, results[index]) is False:
                        waiting.clear()
                    continue
                curl = _HANDLES.take()
                running[curl] = (index, reader, reader._start_fetch(curl, offset, length))
                multi.add_handle(curl)
            while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                pass
            while True:
                queued, done, failed = multi.info_read()
                ended = [(curl, None) for curl in done]
                ended += [(curl, pycurl.error(code, message)) for curl, code, message in failed]
                for curl, error in ended:
                    multi.remove_handle(curl)
                    index, reader, transfer = running.pop(curl)
                    try:
                        results[index] = reader._complete(curl, transfer, error)
                    except _Transient as exc:  # the budget of the source's retries counts from here
                        FAILURES.failed(reader.url, transfer.began, str(exc))
                    except NCZError as exc:
                        results[index] = exc
                    else:
                        FAILURES.succeeded(reader.url)
                    _HANDLES.give(curl)
                    if answered is not None and answered(index, results[index]) is False:
                        waiting.clear()  # the caller needs no more: no new request
                if not queued:
                    break
            if running:
                multi.select(1.0)
    finally:
        for curl in running:
            multi.remove_handle(curl)
            curl.setopt(pycurl.HEADERFUNCTION, _ignore)
            curl.setopt(pycurl.WRITEFUNCTION, _ignore)
            _HANDLES.give(curl)
        _HANDLES.give_multi(multi)
    return results


# ------------------------------------------------------------------------------------------ transfers
class _Transfer:
    """One attempt as libcurl hands it over: the header lines (kept as they come, read when the answer
    begins: the last block's, after any ``1xx``), then the body in pieces, given to the receiver ``begin``
    makes of the answer when the first piece comes (or after the transfer, when it has no body). A check
    failing in a callback is kept in ``failure`` and ends the transfer; ``enough`` is set when the
    receiver needs nothing more."""

    __slots__ = (
        "began",
        "begin",
        "enough",
        "failure",
        "header",
        "headers",
        "limit",
        "lines",
        "reason",
        "receiver",
        "status",
        "what",
    )

    def __init__(self, begin: Callable[[_Transfer], _Receiver], what: str, limit: float) -> None:
        self.begin, self.what, self.limit = begin, what, limit
        self.began = time.monotonic()
        self.lines: list[bytes] = []
        self.header = self.lines.append  # libcurl's header callback: no Python code a line
        self.status, self.reason = 0, ""
        self.headers: dict[str, str] = {}
        self.receiver: _Receiver | None = None
        self.failure: NCZError | None = None
        self.enough = False

    def getheader(self, name: str) -> str | None:
        """The header's value (repeated headers joined by ``, ``), or None."""
        return self.headers.get(name.lower())

    def write(self, data: bytes) -> int | None:
        try:
            if self.receiver is None:
                self.receiver = self._begin()
            if self.receiver.take(data):
                return None
            self.enough = True
        except NCZError as exc:
            self.failure = exc
        return 0  # ends the transfer (its connection is closed)

    def begun(self) -> _Receiver:
        if self.receiver is None:
            self.receiver = self._begin()
        return self.receiver

    def _begin(self) -> _Receiver:
        return self.begin(self)

    def read_headers(self) -> None:
        """The status and headers of the last block of header lines (those of the final answer); a
        ValueError if there is no valid status line."""
        lines = self.lines
        start = max((i for i, line in enumerate(lines) if line.startswith(b"HTTP/")), default=None)
        if start is None:
            raise ValueError("the answer has no status line")
        status = lines[start].decode("latin-1").strip()
        code, _, reason = status.partition(" ")[2].partition(" ")
        if not (code.isascii() and code.isdigit() and len(code) == 3):
            raise ValueError(f"malformed status line {_printable(status, 80)!r}")
        self.status, self.reason = int(code), reason.strip()
        headers = self.headers
        for line in lines[start + 1 :]:
            name, colon, value = line.partition(b":")
            if colon:
                key, text = name.decode("latin-1").strip().lower(), value.decode("latin-1").strip()
                known = headers.get(key)
                headers[key] = text if known is None else f"{known}, {text}"


class _Receiver(Generic[T]):
    """Where an answer's body goes: :meth:`take` is given each piece (False: nothing more is needed),
    :meth:`finish` the result once the transfer ended (an error if the body was cut short)."""

    def take(self, data: bytes) -> bool:
        return False

    def finish(self) -> T:
        raise NotImplementedError


class _Known(_Receiver[T]):
    """An answer whose result its headers gave: its body, if any, is not read."""

    def __init__(self, value: T) -> None:
        self.value = value

    def finish(self) -> T:
        return self.value


class _Fill(_Receiver[T]):
    """The body into ``buffer``, after ``skip`` bytes; more than fits is an error, unless the ``rest``
    of the body is not wanted (then the transfer ends when ``buffer`` is full)."""

    def __init__(
        self, buffer: memoryview, where: str, result: Callable[[], T], skip: int = 0, rest: bool = False
    ) -> None:
        self.buffer, self.where, self.result = buffer, where, result
        self.skip, self.rest, self.done = skip, rest, 0

    def take(self, data: bytes) -> bool:
        if self.skip:
            count = min(self.skip, len(data))
            self.skip -= count
            data = memoryview(data)[count:]
        room = len(self.buffer) - self.done
        if len(data) > room and not self.rest:
            raise StorageError(
                f"cannot read {self.where}: the server sent more than the {len(self.buffer)} bytes asked"
            )
        count = min(room, len(data))
        self.buffer[self.done : self.done + count] = data[:count]
        self.done += count
        return not (self.rest and self.skip == 0 and self.done == len(self.buffer))

    def finish(self) -> T:
        if self.skip:
            raise _Transient(f"cannot read {self.where}: the answer ended before its first byte")
        if self.done < len(self.buffer):
            raise _Transient(
                f"cannot read {self.where}: the answer ended after {self.done} of {len(self.buffer)} bytes"
            )
        return self.result()


class _Scatter(_Receiver[None]):
    """The body of the span ``[start, end)`` placed into each ``(offset, buffer)`` of ``targets`` (sorted
    by offset; inside the span, overlapping or with gaps between) as it arrives."""

    def __init__(self, start: int, end: int, targets: list[tuple[int, memoryview]], where: str) -> None:
        self.start, self.end, self.targets, self.where = start, end, targets, where
        self.at, self.waiting = start, 0  # targets[waiting:] not reached yet
        self.active: list[tuple[int, memoryview]] = []  # reached, not done

    def take(self, data: bytes) -> bool:
        at, top = self.at, self.at + len(data)
        if top > self.end:
            raise StorageError(
                f"cannot read {self.where}: the server sent more than the {self.end - self.start} bytes asked"
            )
        piece, targets = memoryview(data), self.targets
        while self.waiting < len(targets) and targets[self.waiting][0] < top:
            self.active.append(targets[self.waiting])
            self.waiting += 1
        still = []
        for offset, buffer in self.active:
            low, high = max(offset, at), min(offset + len(buffer), top)
            if high > low:
                buffer[low - offset : high - offset] = piece[low - at : high - at]
            if offset + len(buffer) > top:
                still.append((offset, buffer))
        self.active, self.at = still, top
        return True

    def finish(self) -> None:
        if self.at < self.end:
            raise _Transient(
                f"cannot read {self.where}: the answer ended after {self.at - self.start} of "
                f"{self.end - self.start} bytes"
            )


def _ignore(data: bytes) -> None:
    """A callback for an idle handle."""


# ------------------------------------------------------------------------------------------ connections
class _Handles:
    """Idle libcurl handles, shared by every reader and thread of the process: a request takes the one
    used last (its connections are the likeliest to be alive), else a new one. At most :data:`POOL_SIZE`
    are kept, each with at most :data:`CONNECTIONS_A_HANDLE` open connections, none idle longer than
    :data:`IDLE_SECONDS` (a handle idle that long is closed with its connections). Multi handles
    (:func:`fetch_each`) keep the connections their transfers opened: :data:`IDLE_MULTIS` are kept."""

    def __init__(self) -> None:
        self.idle: list[tuple[pycurl.Curl, float]] = []  # oldest first
        self.multis: list[pycurl.CurlMulti] = []  # idle multi handles, with the connections they opened
        self.lock = threading.Lock()
        self.share: pycurl.CurlShare | None = None  # made with the first handle (pycurl may be unavailable)

    def take(self) -> pycurl.Curl:
        with self.lock:
            stale = self._expired(time.monotonic())
            found = self.idle.pop()[0] if self.idle else None
        _close(stale)
        return found if found is not None else self._new()

    def give(self, curl: pycurl.Curl) -> None:
        now = time.monotonic()
        with self.lock:
            stale = self._expired(now)
            self.idle.append((curl, now))
            while len(self.idle) > POOL_SIZE:
                stale.append(self.idle.pop(0)[0])
        _close(stale)

    def take_multi(self) -> pycurl.CurlMulti:
        """A multi handle (its connections, kept from its last use, go to whatever it performs next)."""
        with self.lock:
            if self.multis:
                return self.multis.pop()
        multi = pycurl.CurlMulti()
        multi.setopt(pycurl.M_MAXCONNECTS, POOL_SIZE)
        return multi

    def give_multi(self, multi: pycurl.CurlMulti) -> None:
        with self.lock:
            if len(self.multis) < IDLE_MULTIS:
                self.multis.append(multi)
                return
        multi.close()

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
            multis, self.multis = self.multis, []
        _close([curl for curl, _ in idle])
        for multi in multis:
            multi.close()

    def _expired(self, now: float) -> list[pycurl.Curl]:
        """Remove and return the handles idle too long (called holding ``lock``)."""
        count = 0
        while count < len(self.idle) and now - self.idle[count][1] > IDLE_SECONDS:
            count += 1
        expired = [curl for curl, _ in self.idle[:count]]
        del self.idle[:count]
        return expired

    def _shared(self) -> pycurl.CurlShare:
        """Names resolved and TLS sessions, for every handle (not connections: libcurl's shared connection
        cache is not safe across threads, its known bug 11.11)."""
        with self.lock:
            if self.share is None:
                self.share = pycurl.CurlShare()
                self.share.setopt(pycurl.SH_SHARE, pycurl.LOCK_DATA_DNS)
                self.share.setopt(pycurl.SH_SHARE, pycurl.LOCK_DATA_SSL_SESSION)
            return self.share

    def _new(self) -> pycurl.Curl:
        curl = pycurl.Curl()
        curl.setopt(pycurl.SHARE, self._shared())
        curl.setopt(pycurl.NOSIGNAL, 1)  # threads: timeouts without SIGALRM
        curl.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        curl.setopt(pycurl.FOLLOWLOCATION, 0)  # redirects are refused (see the module's notes)
        curl.setopt(pycurl.PROXY, "")  # no proxy, whatever the environment says
        curl.setopt(pycurl.PATH_AS_IS, 1)  # the canonical path exactly as spelled
        curl.setopt(pycurl.LOW_SPEED_LIMIT, 1)  # with LOW_SPEED_TIME: READ_TIMEOUT without progress
        curl.setopt(pycurl.MAXCONNECTS, CONNECTIONS_A_HANDLE)
        curl.setopt(pycurl.MAXAGE_CONN, int(IDLE_SECONDS))
        curl.setopt(pycurl.BUFFERSIZE, PIECE)
        authorities = _authorities()
        if authorities.cafile:
            curl.setopt(pycurl.CAINFO, authorities.cafile)
        if authorities.capath:
            curl.setopt(pycurl.CAPATH, authorities.capath)
        return curl


def _close(handles: list[pycurl.Curl]) -> None:
    for curl in handles:
        curl.close()


@functools.cache
def _authorities() -> ssl.DefaultVerifyPaths:
    """The system's certificate authorities, as Python's ``ssl`` finds them (``SSL_CERT_FILE`` too)."""
    paths = ssl.get_default_verify_paths()
    return paths._replace(
        cafile=paths.cafile if paths.cafile and os.path.isfile(paths.cafile) else None,
        capath=paths.capath if paths.capath and os.path.isdir(paths.capath) else None,
    )


_HANDLES = _Handles()
_INHERITED: list[_Handles] = []


def close_connections() -> None:
    """Close every idle pooled connection (they are otherwise kept for the process's next requests)."""
    _HANDLES.close()


def _after_fork() -> None:
    """A forked child shares its parent's sockets: it must not use the parent's handles, nor close their
    connections (closing a TLS connection would tell the server the parent's is over): they are kept
    unused, and the child starts with its own."""
    global _HANDLES
    _INHERITED.append(_HANDLES)
    _HANDLES = _Handles()


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


def _header_line(name: str, value: str) -> str:
    """``name: value`` as libcurl sends it (``name;`` is its spelling of a header with an empty value)."""
    return f"{name}: {value}" if value.strip() else f"{name};"


def _milliseconds(seconds: float) -> int:
    return max(1, min(2**31 - 1, math.ceil(seconds * 1000)))


def _fatal_codes() -> frozenset[int]:
    """libcurl's failures that another attempt would not mend: the server's certificate, the URL, libcurl
    itself (none without pycurl: no reader is made)."""
    if pycurl is None:
        return frozenset()
    return frozenset(
        {
            pycurl.E_UNSUPPORTED_PROTOCOL,
            pycurl.E_URL_MALFORMAT,
            pycurl.E_NOT_BUILT_IN,
            pycurl.E_UNKNOWN_OPTION,
            pycurl.E_SSL_PEER_CERTIFICATE,
            pycurl.E_SSL_CERTPROBLEM,
            pycurl.E_SSL_CACERT_BADFILE,
            pycurl.E_SSL_ISSUER_ERROR,
            pycurl.E_SSL_PINNEDPUBKEYNOTMATCH,
            pycurl.E_SSL_INVALIDCERTSTATUS,
            pycurl.E_OUT_OF_MEMORY,
        }
    )


_FATAL_CODES = _fatal_codes()
