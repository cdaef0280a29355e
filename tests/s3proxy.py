"""A small counting and fault-injecting HTTP proxy on 127.0.0.1, in front of a local S3 server (moto).

Clients talk to ``proxy.endpoint`` instead of the server's; every request is forwarded unchanged (its
``Host`` header too, so signatures still match) over one upstream connection per client connection.

* Counting: ``proxy.counts`` holds requests by kind -- ``HEAD``, ``LIST`` (a GET with ``list-type`` in the
  query), ``GET``, ``PUT``, ``POST``, ``DELETE`` -- and ``proxy.max_in_flight`` the most requests of each
  kind that were being served at once. ``proxy.log`` lists ``(kind, path, status)`` of every request,
  injected faults included (a client's retry shows up as a second entry).
* Faults, switchable at any time: ``proxy.fail(500)``, ``proxy.fail(503, code="SlowDown", times=2)``,
  ``proxy.fail(403, code="AccessDenied", path=r"\\.zarray$")``, ``proxy.truncate(kind="GET")`` (a
  ``Content-Length`` larger than what is sent, then the connection is closed), ``proxy.stall(seconds)``
  (no answer for that long, then the connection is closed) and ``proxy.drop()`` (close without answering).
  ``times=None`` keeps a fault on until ``proxy.clear()``; ``kind``/``method``/``path`` (a regex searched in
  the request path) restrict which requests it hits. ``proxy.injected`` counts the faults served.
* Latency: ``S3Proxy(upstream, latency=0.04)`` (or ``proxy.latency = 0.04`` at any time) holds every
  request that many seconds before it is forwarded, as a distant server would; ``max_in_flight`` counts
  the requests waiting so.

Used by ``tests/test_s3_faults.py`` and ``bench/bench_s3_requests.py``; never listens on another address.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

KINDS = ("HEAD", "LIST", "GET", "PUT", "POST", "DELETE")
HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    )
)
ERROR_TEXT = {
    403: "Access Denied",
    500: "We encountered an internal error. Please try again.",
    503: "Please reduce your request rate.",
}
UPSTREAM_TIMEOUT = 120


def request_kind(method: str, target: str) -> str:
    if method == "GET" and "list-type" in parse_qs(urlsplit(target).query, keep_blank_values=True):
        return "LIST"
    return method


@dataclass
class Entry:
    kind: str
    path: str  # the request target: path and query
    status: int = 0


@dataclass
class Fault:
    action: str  # "status", "truncate", "stall" or "drop"
    times: int | None  # how many more requests it hits; None: until cleared
    kind: str | None = None
    method: str | None = None
    path: re.Pattern | None = None
    status: int = 500
    code: str = "InternalError"
    seconds: float = 0.0
    keep: float = 0.5  # the share of the body a truncated answer sends

    def matches(self, method: str, kind: str, path: str) -> bool:
        return (
            (self.kind is None or self.kind == kind)
            and (self.method is None or self.method == method)
            and (self.path is None or self.path.search(path) is not None)
        )


class S3Proxy:
    """A running proxy forwarding ``127.0.0.1:<port>`` to ``upstream`` (``http://127.0.0.1:<port>``)."""

    def __init__(self, upstream: str, latency: float = 0.0) -> None:
        parts = urlsplit(upstream)
        if parts.hostname != "127.0.0.1" or parts.scheme != "http":
            raise ValueError(f"the proxy only forwards to http://127.0.0.1, not {upstream!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self.counts: Counter[str] = Counter()
        self.max_in_flight: Counter[str] = Counter()
        self._in_flight: Counter[str] = Counter()
        self.injected = 0
        self.log: list[Entry] = []
        self.latency = latency  # seconds added to every request, as a distant server would (changeable)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3proxy", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- counting
    def reset(self) -> None:
        """Forget the counts and the log (faults stay)."""
        with self._lock:
            self.counts.clear()
            self.max_in_flight.clear()
            self.log.clear()
            self.injected = 0

    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {kind: self.counts.get(kind, 0) for kind in KINDS}

    def url(self, bucket: str, root: str, mode: str = "nczarr,s3") -> str:
        return f"{self.endpoint}/{bucket}/{root}#mode={mode}"

    # ----------------------------------------------------------------- faults
    def _add(self, fault: Fault, path: str | None) -> Fault:
        fault.path = re.compile(path) if path is not None else None
        with self._lock:
            self._faults.append(fault)
        return fault

    def fail(
        self,
        status: int = 500,
        code: str | None = None,
        times: int | None = None,
        kind: str | None = None,
        method: str | None = None,
        path: str | None = None,
    ) -> Fault:
        """Answer matching requests with an S3 error document of HTTP ``status`` instead of forwarding."""
        if code is None:
            code = {403: "AccessDenied", 503: "SlowDown"}.get(status, "InternalError")
        return self._add(Fault("status", times, kind, method, None, status, code), path)

    def truncate(
        self, times: int | None = None, kind: str | None = "GET", path: str | None = None, keep: float = 0.5
    ) -> Fault:
        """Forward, then send only ``keep`` of the body under the full ``Content-Length`` and close."""
        return self._add(Fault("truncate", times, kind, None, None, keep=keep), path)

    def stall(
        self, seconds: float, times: int | None = None, kind: str | None = None, path: str | None = None
    ) -> Fault:
        """Hold matching requests ``seconds`` without answering, then close their connection."""
        return self._add(Fault("stall", times, kind, None, None, seconds=seconds), path)

    def drop(self, times: int | None = None, kind: str | None = None, path: str | None = None) -> Fault:
        """Close the connection of matching requests without answering."""
        return self._add(Fault("drop", times, kind), path)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_fault(self, method: str, kind: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, kind, path):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    self.injected += 1
                    return fault
        return None

    # ----------------------------------------------------------------- life cycle
    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:  # idle keep-alive connections: wake their handler threads
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    def __enter__(self) -> S3Proxy:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _handler_class(proxy: S3Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.proxy = proxy
    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else small answers wait for the client's delayed ACK (40 ms each)
    proxy: S3Proxy
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.proxy._lock:
            self.proxy._connections.add(self.connection)

    def finish(self) -> None:
        with self.proxy._lock:
            self.proxy._connections.discard(self.connection)
        if self._upstream is not None:
            self._upstream.close()
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._proxy()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    # ----------------------------------------------------------------- one request
    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _proxy(self) -> None:
        proxy = self.proxy
        method = self.command
        kind = request_kind(method, self.path)
        path = urlsplit(self.path).path
        body = self._read_body()
        entry = Entry(kind, self.path)
        with proxy._lock:
            proxy.log.append(entry)
            proxy.counts[kind] += 1
            proxy._in_flight[kind] += 1
            proxy.max_in_flight[kind] = max(proxy.max_in_flight[kind], proxy._in_flight[kind])
        try:
            if proxy.latency:  # in flight while it waits, as at a distant server
                proxy._stopping.wait(proxy.latency)
            fault = proxy._take_fault(method, kind, path)
            if fault is None or fault.action == "truncate":
                entry.status = self._forward(method, body, fault, entry)
            elif fault.action == "status":
                entry.status = fault.status
                self._answer_error(fault, path)
            else:  # stall or drop: no answer at all
                if fault.action == "stall":
                    proxy._stopping.wait(fault.seconds)
                self._abort()
        finally:
            with proxy._lock:
                proxy._in_flight[kind] -= 1

    def _abort(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)

    def _answer_error(self, fault: Fault, path: str) -> None:
        message = ERROR_TEXT.get(fault.status, "Injected fault")
        document = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{fault.code}</Code><Message>{message}</Message>"
            f"<Resource>{path}</Resource><RequestId>s3proxy-{time.monotonic_ns()}</RequestId></Error>"
        ).encode()
        self.send_response(fault.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(document)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(document)

    def _send_upstream(self, method: str, body: bytes) -> http.client.HTTPResponse:
        for attempt in range(2):  # a kept-alive upstream connection may have been closed meanwhile
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(*self.proxy.upstream, timeout=UPSTREAM_TIMEOUT)
            try:
                self._upstream.putrequest(method, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                        self._upstream.putheader(name, value)
                if body or method in ("PUT", "POST"):
                    self._upstream.putheader("Content-Length", str(len(body)))
                self._upstream.endheaders(body or None)
                return self._upstream.getresponse()
            except (ConnectionError, http.client.HTTPException, OSError):
                self._upstream.close()
                self._upstream = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _forward(self, method: str, body: bytes, fault: Fault | None, entry: Entry) -> int:
        try:
            response = self._send_upstream(method, body)
            payload = response.read()
        except OSError:  # the server is gone: answer as a gateway would
            entry.status = 502
            self.send_error(502, "upstream S3 server unreachable")
            return 502
        # the status is logged before the client can see the answer, so a test never races it
        entry.status = -response.status if fault is not None and payload else response.status
        if response.will_close:
            self._upstream.close()
            self._upstream = None
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP and name.lower() not in ("content-length", "date", "server"):
                self.send_header(name, value)
        if method == "HEAD":
            self.send_header("Content-Length", response.getheader("Content-Length", "0"))
            self.end_headers()
            return response.status
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if fault is not None and payload:  # truncate: part of the promised body, then hang up
            self.wfile.write(payload[: int(len(payload) * fault.keep)])
            self._abort()
            return -response.status
        self.wfile.write(payload)
        return response.status
