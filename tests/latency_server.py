"""A distant web server on 127.0.0.1: the files of a directory, each answer after ``latency`` seconds.

Object stores and web servers answer a request after tens of milliseconds whatever its size; this server
gives that latency to a directory of local files, and counts what clients ask of it.

* HTTP/1.1 with keep-alive; ``HEAD`` and ``GET``, a GET with one ``Range: bytes=a-b`` (also ``a-`` and
  ``-n``) answered ``206`` with ``Content-Range``, a GET without one ``200``; every answer holding a file
  has ``ETag`` (strong, from size, modification time and inode, as nginx makes them), ``Last-Modified``
  and ``Accept-Ranges: bytes``. A range starting at or past the end is ``416`` (``Content-Range: bytes
  */size``); a Range naming several ranges is ignored (the whole file, as S3 answers). Conditional
  requests: ``If-Match`` and ``If-Unmodified-Since`` that fail are ``412``; ``If-None-Match`` and
  ``If-Modified-Since`` that fail are ``304`` for GET/HEAD (RFC 9110 §13.1). Other methods: ``405``.
  Paths outside the directory, and directories, are ``404``.
* Latency: each request waits ``latency`` seconds (changeable: ``server.latency = 0.02``) after it was
  received and before it is answered, concurrently with every other request. A kept-alive connection
  idle for ``idle_timeout`` seconds (120) is closed, as servers do (nginx: 75 s).
* Counting (thread-safe; read as copies): ``counts`` (requests by method), ``per_file`` (path -> requests
  by method), ``bytes_per_file`` (path -> body bytes sent), ``bytes_sent``, ``max_in_flight`` (the most
  requests being answered at once, latency included; ``max_in_flight_by_method`` per method),
  ``connections`` (TCP connections accepted), ``log`` (one :class:`Entry` per request: method, path,
  Range, status, bytes sent, fault injected, when it was received and answered, the connection's number).
  ``reset()`` forgets them (faults and latency stay); ``stats()`` gives all of them in one dict.
* Faults, switchable at any time with ``faults(...)`` (each call replaces the previous set; ``faults()``
  clears): ``error=0.15`` (that share of GETs answered ``503``, ``retry_after`` seconds optional),
  ``cut=0.075`` (that share of GETs announce their full ``Content-Length``, send half the body, then
  close), ``trickle=2.0`` (bodies sent one byte every that many seconds), ``ignore_range`` (``200`` and
  the whole file to a range request), ``wrong_range`` (``206`` with the bytes and ``Content-Range`` of the
  range one byte further on), ``changing_etag`` (a new ETag on every answer, so every ``If-Match`` fails),
  ``huge_length`` (``Content-Length: 2**62``: a HEAD claims that size; a GET sends its body under that
  length, then closes). ``methods`` and ``path`` (a regex searched in the path) restrict which requests
  faults hit; by default ``error`` and ``cut`` hit GETs, the others GETs and HEADs. Which requests are
  hit is deterministic: the fate of the n-th request for the same (method, path, Range) is drawn from
  ``seed`` and that key, whatever the order in which concurrent requests arrive, so a retry of a failed
  request is drawn afresh.

:func:`serving` runs one for a ``with`` block. ``process=True`` runs it in a child interpreter, so
a benchmark's client does not share its interpreter lock with the server, as a remote server would not:
the object yielded has the same attributes and methods, each answered over the child's stdin/stdout.

Used by ``tests/test_latency_server.py`` and ``bench/bench_remote.py``; never listens on another address.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import os
import pickle
import posixpath
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

HOST = "127.0.0.1"
HUGE_LENGTH = 2**62
PIECE = 1 << 20  # bodies are sent in pieces of this size
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_FAULTS = (
    "error",
    "error_status",
    "retry_after",
    "cut",
    "keep",
    "trickle",
    "ignore_range",
    "wrong_range",
    "changing_etag",
    "huge_length",
    "methods",
    "path",
    "seed",
)


@dataclass
class Entry:
    """One request: what was asked and how it was answered (``fault``: the fault injected, or "")."""

    method: str
    path: str
    range: str | None
    status: int = 0
    sent: int = 0
    fault: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    received: float = 0.0  # seconds since the server started
    answered: float = 0.0  # when its answer was sent (or abandoned)
    connection: int = 0  # which TCP connection (numbered from 1 as accepted) carried it


@dataclass
class Faults:
    error: float = 0.0  # share of matching requests answered error_status
    error_status: int = 503
    retry_after: float | None = None
    cut: float = 0.0  # share of matching GETs cut mid-body (after ``keep`` of it)
    keep: float = 0.5
    trickle: float | None = None  # seconds between the bytes of a body
    ignore_range: bool = False
    wrong_range: bool = False
    changing_etag: bool = False
    huge_length: bool = False
    methods: tuple[str, ...] | None = None  # None: error and cut hit GETs, the others GETs and HEADs
    path: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("error", "cut", "keep"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a share between 0 and 1, not {getattr(self, name)}")
        if self.methods is not None:
            self.methods = tuple(m.upper() for m in self.methods)
        self._path = re.compile(self.path) if self.path is not None else None

    def applies(self, method: str, path: str, rate: bool = False) -> bool:
        """Whether the faults hit this request (``rate``: for ``error`` and ``cut``)."""
        methods = self.methods or (("GET",) if rate else ("GET", "HEAD"))
        return method in methods and (self._path is None or self._path.search(path) is not None)

    @property
    def active(self) -> bool:
        return bool(
            self.error
            or self.cut
            or self.trickle
            or self.ignore_range
            or self.wrong_range
            or self.changing_etag
            or self.huge_length
        )


NO_FAULTS = Faults()


class LatencyServer:
    """A running server of the files under ``directory`` at ``url`` (``http://127.0.0.1:<port>``)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        latency: float = 0.04,
        seed: int = 0,
        idle_timeout: float = 120,
    ) -> None:
        self.directory = os.path.realpath(directory)
        if not os.path.isdir(self.directory):
            raise ValueError(f"{directory!r} is not a directory")
        self.latency = float(latency)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._faults = Faults(seed=seed)
        self._seed = seed
        self._seen: Counter[tuple[str, str, str | None]] = Counter()  # n-th request of the same key
        self._etags = 0
        self._sockets: set[socket.socket] = set()
        self._counts: Counter[str] = Counter()
        self._per_file: dict[str, Counter[str]] = {}
        self._bytes: Counter[str] = Counter()
        self._in_flight = 0
        self._max_in_flight = 0
        self._in_flight_by: Counter[str] = Counter()
        self._max_in_flight_by: Counter[str] = Counter()
        self._started = time.monotonic()
        self.idle_timeout = idle_timeout
        self._connections = 0
        self._accepted = 0
        self._log: list[Entry] = []
        self._server = _Server((HOST, 0), _handler_class(self))
        self.port = self._server.server_address[1]
        self.url = f"http://{HOST}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.name = "latency-server"
        self._thread.start()

    # ------------------------------------------------------------------------------------- addresses
    def url_of(self, path: str | os.PathLike[str]) -> str:
        """The URL of a file given by its path (absolute, under the directory, or relative to it)."""
        return _url_of(self.url, self.directory, path)

    # ------------------------------------------------------------------------------------- counting
    @property
    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self._counts)

    @property
    def per_file(self) -> dict[str, Counter[str]]:
        with self._lock:
            return {path: Counter(counts) for path, counts in self._per_file.items()}

    @property
    def bytes_per_file(self) -> Counter[str]:
        with self._lock:
            return Counter(self._bytes)

    @property
    def bytes_sent(self) -> int:
        with self._lock:
            return sum(self._bytes.values())

    @property
    def max_in_flight(self) -> int:
        with self._lock:
            return self._max_in_flight

    @property
    def max_in_flight_by_method(self) -> Counter[str]:
        with self._lock:
            return Counter(self._max_in_flight_by)

    @property
    def connections(self) -> int:
        with self._lock:
            return self._connections

    @property
    def log(self) -> list[Entry]:
        with self._lock:
            return list(self._log)

    def stats(self) -> dict:
        """Every count at once: ``counts``, ``per_file``, ``bytes_per_file``, ``bytes_sent``,
        ``max_in_flight``, ``max_in_flight_by_method``, ``connections``, ``requests``."""
        with self._lock:
            return {
                "counts": Counter(self._counts),
                "per_file": {path: Counter(counts) for path, counts in self._per_file.items()},
                "bytes_per_file": Counter(self._bytes),
                "bytes_sent": sum(self._bytes.values()),
                "max_in_flight": self._max_in_flight,
                "max_in_flight_by_method": Counter(self._max_in_flight_by),
                "connections": self._connections,
                "requests": sum(self._counts.values()),
            }

    def reset(self) -> None:
        """Forget the counts and the log (latency and faults stay; fault draws start again)."""
        with self._lock:
            self._counts.clear()
            self._per_file.clear()
            self._bytes.clear()
            self._max_in_flight = self._in_flight
            self._max_in_flight_by = Counter({m: n for m, n in self._in_flight_by.items() if n})
            self._connections = 0
            self._log.clear()
            self._seen.clear()

    def set_latency(self, seconds: float) -> None:
        self.latency = float(seconds)

    # ------------------------------------------------------------------------------------- faults
    def faults(self, **options) -> None:
        """Replace the faults (see the module's text); no argument clears them."""
        unknown = set(options) - set(_FAULTS)
        if unknown:
            raise TypeError(f"unknown faults: {', '.join(sorted(unknown))}")
        options.setdefault("seed", self._seed)
        if options.get("methods") is not None:
            options["methods"] = tuple(options["methods"])
        faults = Faults(**options)
        with self._lock:
            self._faults = faults
            self._seen.clear()

    def _draw(self, method: str, path: str, wanted: str | None) -> tuple[Faults, float, float]:
        """The faults in force and two numbers in [0, 1) for this request, from the seed and its key."""
        with self._lock:
            faults = self._faults
            key = (method, path, wanted)
            self._seen[key] += 1
            nth = self._seen[key]
        if not (faults.error or faults.cut):
            return faults, 1.0, 1.0
        digest = hashlib.blake2b(f"{faults.seed}|{method}|{path}|{wanted}|{nth}".encode(), digest_size=16)
        rng = random.Random(digest.digest())
        return faults, rng.random(), rng.random()

    def _etag(self, info: os.stat_result, faults: Faults) -> str:
        tag = f"{info.st_mtime_ns:x}-{info.st_size:x}-{info.st_ino:x}"
        if faults.changing_etag:
            with self._lock:
                self._etags += 1
                tag += f"-{self._etags}"
        return f'"{tag}"'

    # ------------------------------------------------------------------------------------- life cycle
    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:  # idle keep-alive connections: wake their handler threads
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    def __enter__(self) -> LatencyServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 1024  # many clients connect at once: the default backlog (5) drops their SYNs


def _handler_class(server: LatencyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.server_state = server
    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else small answers wait for the client's delayed ACK
    server_state: LatencyServer
    number = 0  # this connection's, from 1

    def log_message(self, format, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        self.timeout = self.server_state.idle_timeout  # an idle kept-alive connection is closed then
        super().setup()
        state = self.server_state
        with state._lock:
            state._sockets.add(self.connection)
            state._connections += 1
            state._accepted += 1
            self.number = state._accepted

    def finish(self) -> None:
        with self.server_state._lock:
            self.server_state._sockets.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._serve()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    # ------------------------------------------------------------------------------------- one request
    def _serve(self) -> None:
        state = self.server_state
        method = self.command
        path = urlsplit(self.path).path
        wanted = self.headers.get("Range")
        entry = Entry(method, path, wanted, headers=dict(self.headers.items()), connection=self.number)
        entry.received = time.monotonic() - state._started
        with state._lock:
            state._log.append(entry)
            state._counts[method] += 1
            state._per_file.setdefault(path, Counter())[method] += 1
            state._in_flight += 1
            state._max_in_flight = max(state._max_in_flight, state._in_flight)
            state._in_flight_by[method] += 1
            state._max_in_flight_by[method] = max(
                state._max_in_flight_by[method], state._in_flight_by[method]
            )
        try:
            if self.headers.get("Content-Length"):  # a body nobody asked for: read it, keep in step
                self.rfile.read(int(self.headers["Content-Length"]))
            if state.latency > 0:
                state._stopping.wait(state.latency)
            self._answer(entry, method, path, wanted)
        except (ConnectionError, TimeoutError):  # the client went away
            self.close_connection = True
        finally:
            entry.answered = time.monotonic() - state._started
            with state._lock:
                state._in_flight -= 1
                state._in_flight_by[method] -= 1

    def _answer(self, entry: Entry, method: str, path: str, wanted: str | None) -> None:
        state = self.server_state
        if method not in ("GET", "HEAD"):
            return self._empty(entry, 405, {"Allow": "GET, HEAD"})
        file = self._file(path)
        if file is None:
            return self._empty(entry, 404)
        faults, first, second = state._draw(method, path, wanted)
        hit = faults.active and faults.applies(method, path)
        rated = faults.active and faults.applies(method, path, rate=True)
        if rated and first < faults.error:
            entry.fault = "error"
            extra = {} if faults.retry_after is None else {"Retry-After": f"{faults.retry_after:g}"}
            return self._empty(entry, faults.error_status, extra)
        with open(file, "rb") as handle:
            info = os.fstat(handle.fileno())
            size = info.st_size
            etag = state._etag(info, faults if hit else NO_FAULTS)
            modified = email.utils.formatdate(info.st_mtime, usegmt=True)
            headers = {"ETag": etag, "Last-Modified": modified, "Accept-Ranges": "bytes"}
            status = self._conditions(etag, int(info.st_mtime))
            if status:
                return self._empty(entry, status, {"ETag": etag, "Last-Modified": modified})
            start, end, code = 0, size, 200
            single = _single_range(wanted, size) if wanted is not None and method == "GET" else None
            if wanted is not None and method == "GET" and not (hit and faults.ignore_range):
                if single == "unsatisfiable":
                    return self._empty(entry, 416, {"Content-Range": f"bytes */{size}"})
                if single is not None:
                    start, end = single
                    if hit and faults.wrong_range:
                        entry.fault = "wrong_range"
                        start, end = min(start + 1, size - 1), min(end + 1, size)
                    code = 206
                    headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
            elif hit and faults.ignore_range and wanted is not None and method == "GET":
                entry.fault = "ignore_range"
            length = end - start
            claimed = length if method == "GET" else size
            cut = method == "GET" and rated and second < faults.cut and length > 0
            if hit and faults.huge_length:
                entry.fault, claimed = "huge_length", HUGE_LENGTH
            elif cut:
                entry.fault = "cut"
            entry.status = code
            self.send_response(code)
            for name, value in {"Content-Length": str(claimed), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            if method == "HEAD":
                return None
            send = length
            if cut:
                send = int(length * faults.keep)
            self._send_body(entry, handle, start, send, faults.trickle if hit else None)
            if entry.sent != claimed:  # the promise was not kept (cut, huge, shrunk, stopped): hang up
                self._hang_up()
        return None

    def _file(self, path: str) -> str | None:
        """The file the path names, under the directory; None for anything else."""
        relative = posixpath.normpath(unquote(path)).lstrip("/")
        if not relative or relative.startswith("..") or "\0" in relative:
            return None
        root = self.server_state.directory
        found = os.path.realpath(os.path.join(root, relative))
        if not found.startswith(root + os.sep) or not os.path.isfile(found):
            return None
        return found

    def _conditions(self, etag: str, modified: int) -> int:
        """412 or 304 when a condition of the request fails (RFC 9110 §13.2.2's order), else 0."""
        match = self.headers.get("If-Match")
        if match is not None:
            if not _etag_matches(match, etag, weak=False):
                return 412
        else:
            since = _http_date(self.headers.get("If-Unmodified-Since"))
            if since is not None and modified > since:
                return 412
        none_match = self.headers.get("If-None-Match")
        if none_match is not None:
            if _etag_matches(none_match, etag, weak=True):
                return 304
        else:
            since = _http_date(self.headers.get("If-Modified-Since"))
            if since is not None and modified <= since:
                return 304
        return 0

    def _send_body(self, entry: Entry, handle, start: int, length: int, trickle: float | None) -> None:
        state = self.server_state
        if trickle:
            entry.fault = entry.fault or "trickle"
            for offset in range(start, start + length):
                if state._stopping.is_set():
                    break
                self._write(entry, os.pread(handle.fileno(), 1, offset))
                self.wfile.flush()
                if offset + 1 < start + length and state._stopping.wait(trickle):
                    break
            return
        done = 0
        while done < length:
            piece = os.pread(handle.fileno(), min(PIECE, length - done), start + done)
            if not piece:  # the file shrank under us
                break
            self._write(entry, piece)
            done += len(piece)

    def _write(self, entry: Entry, piece: bytes) -> None:
        """Send ``piece``, counted first (so a client that has the bytes finds them counted)."""
        state = self.server_state
        with state._lock:
            entry.sent += len(piece)
            state._bytes[entry.path] += len(piece)
        self.wfile.write(piece)

    def _hang_up(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)

    def _empty(self, entry: Entry, status: int, headers: dict[str, str] | None = None) -> None:
        entry.status = status
        self.send_response(status)
        for name, value in {"Content-Length": "0", **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()


def _single_range(header: str, size: int) -> tuple[int, int] | str | None:
    """``(start, end)`` (end exclusive) of a one-range ``Range`` header, ``"unsatisfiable"``, or None when
    the header is ignored (malformed, several ranges, another unit)."""
    match = _RANGE.fullmatch(header.strip())
    if match is None or match[1] == match[2] == "":
        return None
    if match[1] == "":  # the last n bytes
        count = int(match[2])
        if count == 0:
            return "unsatisfiable"
        return max(0, size - count), size
    start = int(match[1])
    end = size if match[2] == "" else int(match[2]) + 1
    if match[2] != "" and end <= start:
        return None  # invalid: ignored, as RFC 9110 asks
    if start >= size:
        return "unsatisfiable"
    return start, min(end, size)


def _etag_matches(header: str, etag: str, weak: bool) -> bool:
    tags = [tag.strip() for tag in header.split(",")]
    if "*" in tags:
        return True
    if weak:
        return etag.removeprefix("W/") in {tag.removeprefix("W/") for tag in tags}
    return etag in tags and not etag.startswith("W/")


def _http_date(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(email.utils.parsedate_to_datetime(text).timestamp())
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------------- in a child process
class InChild:
    """An object made by ``module.factory(*args, **kwargs)`` in a child interpreter (with this directory
    on its path): ``get(name)`` reads one of its attributes, ``call(name, ...)`` calls one of its methods,
    over the child's standard input and output (pickled); ``stop()`` calls its ``stop()`` and ends the
    child (``stderr``: where the child's goes, as for ``subprocess.Popen``). Used to keep a server's work
    off the interpreter lock of the client being measured."""

    def __init__(self, module: str, factory: str, *args, stderr=None, **kwargs) -> None:
        code = (
            f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            "import latency_server; latency_server._child()"
        )
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )  # buffered pipes: pickle needs reads of exactly the length it asks for
        try:
            self._send("start", module, factory, args, kwargs)
        except BaseException:
            self._kill()
            raise

    def _send(self, *message):
        with self._lock:
            try:
                pickle.dump(message, self._process.stdin)
                self._process.stdin.flush()
                status, value = pickle.load(self._process.stdout)
            except (OSError, EOFError, pickle.UnpicklingError) as exc:
                raise RuntimeError(f"the child process is gone ({exc!r})") from exc
        if status != "ok":
            raise value
        return value

    def get(self, name: str):
        return self._send("get", name)

    def call(self, name: str, *args, **kwargs):
        return self._send("call", name, args, kwargs)

    def stop(self) -> None:
        if self._process.poll() is None:
            with contextlib.suppress(RuntimeError):
                self._send("stop")
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._kill()
        self._close_pipes()

    def _kill(self) -> None:
        self._process.kill()
        self._process.wait(5)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self._process.stdin, self._process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _child() -> None:
    """The child's side of :class:`InChild`: messages read from stdin, answers written to stdout."""
    import importlib

    commands, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write on the answers' pipe
    made = None
    try:
        while True:
            try:
                message = pickle.load(commands)
            except EOFError:  # the parent is gone
                break
            kind = message[0]
            try:
                if kind == "start":
                    _, module, factory, args, kwargs = message
                    made = getattr(importlib.import_module(module), factory)(*args, **kwargs)
                    value = None
                elif kind == "get":
                    value = getattr(made, message[1])
                elif kind == "call":
                    _, name, args, kwargs = message
                    value = getattr(made, name)(*args, **kwargs)
                else:  # stop
                    if made is not None and hasattr(made, "stop"):
                        made.stop()
                    made, value = None, None
                answer = ("ok", value)
            except Exception as exc:
                answer = ("error", exc)
            pickle.dump(answer, answers)
            answers.flush()
            if kind == "stop":
                break
    finally:
        if made is not None and hasattr(made, "stop"):
            made.stop()


class ServerProcess(InChild):
    """A :class:`LatencyServer` in a child interpreter, with the same attributes and methods."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        latency: float = 0.04,
        seed: int = 0,
        idle_timeout: float = 120,
    ) -> None:
        super().__init__("latency_server", "LatencyServer", os.fspath(directory), latency, seed, idle_timeout)
        self.url, self.port, self.directory = self.get("url"), self.get("port"), self.get("directory")
        self._latency = float(latency)

    def url_of(self, path: str | os.PathLike[str]) -> str:
        return _url_of(self.url, self.directory, path)

    @property
    def latency(self) -> float:
        return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        self.set_latency(seconds)

    def set_latency(self, seconds: float) -> None:
        self.call("set_latency", seconds)
        self._latency = float(seconds)

    counts = property(lambda self: self.get("counts"))
    per_file = property(lambda self: self.get("per_file"))
    bytes_per_file = property(lambda self: self.get("bytes_per_file"))
    bytes_sent = property(lambda self: self.get("bytes_sent"))
    max_in_flight = property(lambda self: self.get("max_in_flight"))
    max_in_flight_by_method = property(lambda self: self.get("max_in_flight_by_method"))
    connections = property(lambda self: self.get("connections"))
    log = property(lambda self: self.get("log"))

    def stats(self) -> dict:
        return self.call("stats")

    def reset(self) -> None:
        self.call("reset")

    def faults(self, **options) -> None:
        self.call("faults", **options)


def _url_of(url: str, directory: str, path: str | os.PathLike[str]) -> str:
    text = os.fspath(path)
    if os.path.isabs(text):
        text = os.path.relpath(os.path.realpath(text), directory)
    if text == ".." or text.startswith("../"):
        raise ValueError(f"{path!r} is not under {directory}")
    return f"{url}/{quote(Path(text).as_posix())}"


# ------------------------------------------------------------------------------------- the context manager
@contextlib.contextmanager
def serving(
    directory: str | os.PathLike[str],
    latency: float = 0.04,
    *,
    seed: int = 0,
    process: bool = False,
    idle_timeout: float = 120,
    **faults,
) -> Iterator[LatencyServer | ServerProcess]:
    """A running server of ``directory`` answering after ``latency`` seconds (faults as keywords, or
    later through ``.faults(...)``); stopped when the block ends. ``process=True``: in a child process."""
    kind = ServerProcess if process else LatencyServer
    running = kind(directory, latency, seed, idle_timeout)
    try:
        if faults:
            running.faults(**faults)
        yield running
    finally:
        running.stop()


def wait_until_listening(url: str, limit: float = 10.0) -> None:
    """Return once ``url``'s host accepts connections (for servers started elsewhere)."""
    parts = urlsplit(url)
    deadline = time.monotonic() + limit
    while True:
        try:
            socket.create_connection((parts.hostname, parts.port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
