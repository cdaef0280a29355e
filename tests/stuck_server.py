"""A web server on 127.0.0.1 that gets stuck: it serves the files of a directory, or forwards every request
to an upstream server on 127.0.0.1 (moto's S3, signatures untouched), except the requests it is told to
hold up, which it answers in one of two ways:

* ``trickle``: the real status line and headers at once, then the body one byte every ``interval`` seconds
  (the answer a client's deadline must end, as no read ever waits long);
* ``silent``: the request is read and never answered (the connection stays open until the server stops).

``spare(method, target, range)`` (the target: path and query) chooses the requests served normally (by
default none); ``log`` lists ``(method, path, range, held)`` of every request, ``held`` counts those held
up. HTTP/1.1, keep-alive,
``HEAD`` and ``GET`` with one ``Range: bytes=a-b`` (``206``, ``Content-Range``), strong ETags. Used by
``tests/test_stuck_servers.py``; never listens on another address.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import os
import posixpath
import re
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

HOST = "127.0.0.1"
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
HOP_BY_HOP = ("connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection")


class StuckServer:
    def __init__(
        self,
        mode: str,
        *,
        directory: str | os.PathLike[str] | None = None,
        upstream: str | None = None,
        interval: float = 2.0,
        spare: Callable[[str, str, str | None], bool] | None = None,
    ) -> None:
        if mode not in ("trickle", "silent"):
            raise ValueError(f"mode {mode!r}")
        if (directory is None) == (upstream is None):
            raise ValueError("a directory or an upstream server, not both")
        if upstream is not None:
            parts = urlsplit(upstream)
            if parts.hostname != HOST or parts.scheme != "http":
                raise ValueError(f"only http://{HOST} is forwarded to, not {upstream!r}")
            self.upstream: tuple[str, int] | None = (HOST, parts.port or 80)
        else:
            self.upstream = None
        self.mode, self.interval = mode, interval
        self.directory = Path(directory).resolve() if directory is not None else None
        self.spare = spare or (lambda method, path, wanted: False)
        self.log: list[tuple[str, str, str | None, bool]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.sockets: set[socket.socket] = set()
        self._server = ThreadingHTTPServer((HOST, 0), _handler(self))
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self.url = f"http://{HOST}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="stuck-server", daemon=True)
        self._thread.start()

    @property
    def held(self) -> int:
        with self.lock:
            return sum(1 for entry in self.log if entry[3])

    def url_of(self, path: str | os.PathLike[str]) -> str:
        assert self.directory is not None
        return f"{self.url}/{Path(path).resolve().relative_to(self.directory).as_posix()}"

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        with self.lock:
            open_sockets = list(self.sockets)
        for conn in open_sockets:  # handlers waiting on a kept-alive or held connection wake up
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    def __enter__(self) -> StuckServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(server: StuckServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.server_state = server
    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_state: StuckServer
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.server_state.lock:
            self.server_state.sockets.add(self.connection)

    def finish(self) -> None:
        with self.server_state.lock:
            self.server_state.sockets.discard(self.connection)
        if self._upstream is not None:
            self._upstream.close()
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        state = self.server_state
        wanted = self.headers.get("Range")
        path = urlsplit(self.path).path
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        held = not state.spare(self.command, self.path, wanted)
        with state.lock:
            state.log.append((self.command, path, wanted, held))
        if held and state.mode == "silent":
            state.stopping.wait()
            self.close_connection = True
            return
        if state.upstream is not None:
            status, reason, headers, payload = self._forward(body)
        else:
            status, reason, headers, payload = self._file(path, wanted)
        self.send_response(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        if not any(name.lower() == "content-length" for name, _ in headers):
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if not held:
            self.wfile.write(payload)
            return
        self.close_connection = True
        try:
            for byte in range(len(payload)):  # trickle
                self.wfile.write(payload[byte : byte + 1])
                self.wfile.flush()
                if state.stopping.wait(state.interval):
                    return
        except OSError:  # the client gave up
            return

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _file(self, path: str, wanted: str | None) -> tuple[int, str, list, bytes]:
        assert self.server_state.directory is not None
        relative = posixpath.normpath(unquote(path)).lstrip("/")
        file = (self.server_state.directory / relative).resolve()
        if not file.is_relative_to(self.server_state.directory) or not file.is_file():
            return 404, "Not Found", [], b""
        info = file.stat()
        headers = [
            ("ETag", f'"{info.st_size:x}-{info.st_mtime_ns:x}"'),
            ("Last-Modified", email.utils.formatdate(info.st_mtime, usegmt=True)),
            ("Accept-Ranges", "bytes"),
        ]
        data = file.read_bytes()
        match = _RANGE.fullmatch((wanted or "").strip())
        if match is None:
            return 200, "OK", headers, data
        start = int(match[1])
        end = min(int(match[2]) if match[2] else len(data) - 1, len(data) - 1)
        if start >= len(data):
            return 416, "Range Not Satisfiable", [*headers, ("Content-Range", f"bytes */{len(data)}")], b""
        headers.append(("Content-Range", f"bytes {start}-{end}/{len(data)}"))
        return 206, "Partial Content", headers, data[start : end + 1]

    def _forward(self, body: bytes) -> tuple[int, str, list, bytes]:
        assert self.server_state.upstream is not None
        for attempt in range(2):  # a kept-alive upstream connection may have been closed meanwhile
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(*self.server_state.upstream, timeout=60)
            try:
                self._upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                        self._upstream.putheader(name, value)
                if body or self.command in ("PUT", "POST"):
                    self._upstream.putheader("Content-Length", str(len(body)))
                self._upstream.endheaders(body or None)
                response = self._upstream.getresponse()
                payload = response.read()
                break
            except (ConnectionError, http.client.HTTPException, OSError):
                self._upstream.close()
                self._upstream = None
                if attempt:
                    raise
        if response.will_close:
            self._upstream.close()
            self._upstream = None
        skip = (*HOP_BY_HOP, "content-length", "date", "server")
        headers = [(name, value) for name, value in response.getheaders() if name.lower() not in skip]
        if self.command == "HEAD":
            length = response.getheader("Content-Length", "0")
            return response.status, response.reason, [*headers, ("Content-Length", length)], b""
        return response.status, response.reason, headers, payload
