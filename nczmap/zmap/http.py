"""Reading byte ranges of one HTTP(S) URL, on the standard library, without ever leaving that URL.

The manifest driver reads ``http(s)://`` references through :class:`HttpReader`: one HEAD (size, ETag,
whether ranges are accepted), then ``Range: bytes=a-b`` GETs, answered by 206 with the matching
``Content-Range`` (or by 200 with exactly the object, when the whole object was asked for). Neighbouring
ranges go out as one request (:meth:`HttpReader.read_ranges`, merged by ``byteranges.merge_ranges``).

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
Connection failures and 5xx answers are retried :data:`MAX_RETRIES` times while less than
:data:`RETRY_SECONDS` have passed. A socket waits at most :data:`CONNECT_TIMEOUT` to connect and
:data:`READ_TIMEOUT` for each read (no progress that long is an error); each thread keeps one persistent
connection, since the driver reads concurrently. Bodies are read into a buffer of the requested length: a
``Content-Length`` other than that is refused before anything is read, and a body without one that runs
past it is an error after one byte too many.

References are fetched directly: ``HTTP(S)_PROXY`` variables are not used. ``https`` verifies the server
with the system's certificate authorities (``ssl.create_default_context()``).
"""

from __future__ import annotations

import contextlib
import http.client
import re
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, TypeVar
from urllib.parse import urljoin, urlsplit

from nczmap._version import __version__
from nczmap.errors import AccessDenied, NCZError, StorageError
from nczmap.zmap.byteranges import merge_ranges

CONNECT_TIMEOUT = 5.0  # seconds, as byteranges.CLIENT_OPTIONS
READ_TIMEOUT = 15.0
RETRY_SECONDS = 10.0  # no retry starts later than this after the first attempt
MAX_RETRIES = 2
PIECE = 1 << 20  # bodies are read in pieces of this size
RESERVED_HEADERS = ("host", "range", "content-length", "transfer-encoding", "connection", "accept-encoding")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 header name
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
T = TypeVar("T")
Parse = Callable[[http.client.HTTPResponse], T]


class Head(NamedTuple):
    """What a HEAD tells: the size, the ETag (None without one), whether ranges may be asked for."""

    size: int
    etag: str | None
    ranges: bool


class _Transient(StorageError):
    """A failure worth another attempt (5xx, a dropped connection)."""


class HttpReader:
    """Ranges of the object at ``url`` (canonical: requested exactly as spelled), ``headers`` sent with
    every request. Usable from several threads at once; :meth:`close` closes every connection."""

    def __init__(self, url: str, headers: Mapping[str, str] | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL")
        self.url = url
        self.headers = _checked_headers(headers or {})
        if not any(name.lower() == "user-agent" for name in self.headers):
            self.headers["User-Agent"] = f"nczmap/{__version__}"
        self._target = (parts.hostname, parts.port, parts.path or "/")
        self._context = ssl.create_default_context() if parts.scheme == "https" else None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []
        self.size: int | None = None
        self._ranges = True

    def __enter__(self) -> HttpReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------- requests
    def head(self) -> Head:
        """Size, ETag and range support of the object (also kept for the reads that follow)."""
        head = self._exchange("HEAD", {}, self._parse_head, "read the size of")
        self.size, self._ranges = head.size, head.ranges
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
            {"Range": f"bytes={offset}-{end}"},
            lambda response: self._receive(response, offset, buffer, whole),
            f"read bytes {offset}-{end} of",
        )

    def read_ranges(self, ranges: Sequence[tuple[int, int]], gap: int = 0) -> list[bytes]:
        """Every ``(offset, length)`` range; ranges at most ``gap`` bytes apart are fetched together."""
        results = [b""] * len(ranges)
        for span in merge_ranges(ranges, gap):
            block = memoryview(self.read(span.start, span.end - span.start))
            for index in span.members:
                start, length = ranges[index]
                results[index] = bytes(block[start - span.start : start - span.start + length])
        return results

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        self._local = threading.local()

    # ------------------------------------------------------------------------------------- exchanges
    def _exchange(self, method: str, headers: dict[str, str], parse: Parse[T], what: str) -> T:
        """One request, answered and parsed, retried when that may help."""
        began, attempt = time.monotonic(), 0
        while True:
            connection = self._connection()
            try:
                return self._attempt(connection, method, headers, parse, what)
            except _Transient as exc:
                connection.close()
                failure: NCZError = exc
            except NCZError:
                connection.close()
                raise
            except ssl.SSLCertVerificationError as exc:
                connection.close()
                raise StorageError(f"cannot {what} {self.url}: {exc}") from exc
            except (OSError, http.client.HTTPException, ValueError) as exc:
                connection.close()
                failure = StorageError(f"cannot {what} {self.url}: {_describe(exc)}")
                failure.__cause__ = exc
            attempt += 1
            if attempt > MAX_RETRIES or time.monotonic() - began > RETRY_SECONDS:
                raise StorageError(str(failure)) from failure.__cause__
            time.sleep(0.05 * 2**attempt)

    def _attempt(
        self,
        connection: http.client.HTTPConnection,
        method: str,
        headers: dict[str, str],
        parse: Parse[T],
        what: str,
    ) -> T:
        if connection.sock is None:
            connection.connect()
            connection.sock.settimeout(READ_TIMEOUT)
        connection.request(method, self._target[2], headers={**self.headers, **headers})
        response = connection.getresponse()
        try:
            self._check_status(response, what)
            return parse(response)
        except BaseException:
            response.close()
            raise

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            host, port, _ = self._target
            if self._context is None:
                connection = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT)
            else:
                connection = http.client.HTTPSConnection(
                    host, port, timeout=CONNECT_TIMEOUT, context=self._context
                )
            with self._lock:
                self._connections.append(connection)
            self._local.connection = connection
        return connection

    def _check_status(self, response: http.client.HTTPResponse, what: str) -> None:
        status = response.status
        if 200 <= status < 300:
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
        error = _Transient if status >= 500 else StorageError
        raise error(f"cannot {what} {self.url}: the server answered {shown}")

    # ------------------------------------------------------------------------------------- answers
    def _parse_head(self, response: http.client.HTTPResponse) -> Head:
        response.read()  # a HEAD has no body: this only marks the answer complete
        size = _integer(response.getheader("Content-Length"))
        if size is None:
            raise StorageError(f"cannot read the size of {self.url}: its HEAD gives no valid Content-Length")
        ranges = (response.getheader("Accept-Ranges") or "bytes").strip().lower() != "none"
        return Head(size, response.getheader("ETag"), ranges)

    def _receive(
        self, response: http.client.HTTPResponse, offset: int, buffer: memoryview, whole: bool
    ) -> None:
        """Check the answer to a ranged GET, then read its body into ``buffer``."""
        where = f"bytes {offset}-{offset + len(buffer) - 1} of {self.url}"
        if response.status == 200 and not whole:
            raise StorageError(
                f"cannot read {where}: the server ignored the Range header (200 with the whole object "
                "instead of 206); references can only be read from servers that serve byte ranges"
            )
        if response.status not in (200, 206):
            raise StorageError(f"cannot read {where}: unexpected answer {response.status} to a range request")
        if response.status == 206:
            self._check_content_range(response.getheader("Content-Range"), offset, len(buffer), where)
        encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise StorageError(f"cannot read {where}: the server sent it {encoding}-encoded")
        claimed = response.getheader("Content-Length")
        if claimed is not None and _integer(claimed) != len(buffer):
            raise StorageError(
                f"cannot read {where}: the server announces {_printable(claimed, 40)} bytes for a range of "
                f"{len(buffer)}"
            )
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
        if claimed is None and response.read(1):
            raise StorageError(
                f"cannot read {where}: the server sent more than the {len(buffer)} bytes asked"
            )

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
