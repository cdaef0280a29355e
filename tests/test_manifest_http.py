"""Manifests whose references are HTTP(S) URLs, read from a small server on 127.0.0.1 (nothing else is
ever contacted): granted prefixes only, every spelling canonical, few requests, integrity checked."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from kerchunk_refs import array_refs

import nczmap
from nczmap import AccessDenied, StorageError
from nczmap.manifest.containers import Container, authorize, normalize
from nczmap.zmap import http as http_reader

CHUNKS, CHUNK_BYTES = 256, 4 << 10
VALUES = np.arange(CHUNKS * CHUNK_BYTES // 8, dtype="<f8")
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


# ---------------------------------------------------------------------------------------------- the server
class Server:
    """A threaded HTTP/1.1 server of in-memory files: HEAD, GET with one ``Range: bytes=a-b`` (206), ETags,
    404 for missing files; it records every request it receives."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.short: set[str] = set()  # paths whose bodies stop early (Content-Length promises more)
        self.required: tuple[str, str] | None = None  # a header every request must carry (else 401)
        self.redirects: dict[str, tuple[int, str]] = {}  # path -> (3xx status, Location)
        self.redirect_methods = ("HEAD", "GET")  # the methods redirected
        self.ignore_range = False  # answer a range request with 200 and the whole file
        self.claimed_length: int | None = None  # a Content-Length sent whatever the body is
        self.extra = b""  # bytes after the body of a GET, sent without a Content-Length
        self.delay = 0.0  # seconds of silence before each answer
        self.failures: list[int] = []  # statuses answered (one each, in order) before anything else
        self.more_headers: dict[str, str] = {}  # sent with every answer holding a file
        self.requests: list[tuple[str, str, str | None, dict[str, str]]] = []
        self.lock = threading.Lock()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.root = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True)

    def methods(self) -> list[str]:
        with self.lock:
            return [method for method, *_ in self.requests]

    def paths(self) -> set[str]:
        with self.lock:
            return {path for _, path, *_ in self.requests}


def _handler(server: Server):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 5

        def log_message(self, *args) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            with server.lock:
                server.requests.append(
                    (self.command, self.path, self.headers.get("Range"), dict(self.headers))
                )
            if server.delay:
                time.sleep(server.delay)
            with server.lock:
                failure = server.failures.pop(0) if server.failures else None
            if failure:
                return self._empty(failure)
            if server.required and self.headers.get(server.required[0]) != server.required[1]:
                return self._empty(401)
            if self.path in server.redirects and self.command in server.redirect_methods:
                status, location = server.redirects[self.path]
                return self._empty(status, {"Location": location})
            data = server.files.get(self.path)
            if data is None:
                return self._empty(404)
            etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
            wanted = self.headers.get("Range")
            if wanted is None or server.ignore_range:
                status, part, extra = 200, data, {}
            else:
                first, _, last = wanted.removeprefix("bytes=").partition("-")
                start, end = int(first), min(int(last), len(data) - 1)
                if start >= len(data):
                    return self._empty(416, {"Content-Range": f"bytes */{len(data)}"})
                status, part = 206, data[start : end + 1]
                extra = {"Content-Range": f"bytes {start}-{end}/{len(data)}"}
            self.send_response(status)
            claimed, extra_bytes = (server.claimed_length, server.extra) if body else (None, b"")
            length = {} if extra_bytes else {"Content-Length": str(claimed or len(part))}
            for name, value in {**length, "ETag": etag, **extra, **server.more_headers}.items():
                self.send_header(name, value)
            self.end_headers()
            if extra_bytes or claimed:
                self.close_connection = True
            if body:
                if self.path in server.short:
                    part = part[: len(part) // 2]
                    self.close_connection = True
                with contextlib.suppress(ConnectionError):  # a client refusing the answer hangs up
                    self.wfile.write(part + extra_bytes)

        def _empty(self, status: int, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in {"Content-Length": "0", **(headers or {})}.items():
                self.send_header(name, value)
            self.end_headers()

    return Handler


@contextlib.contextmanager
def serving() -> Iterator[Server]:
    """A running server holding ``/data/data.bin`` (the test array) and ``/secret/data.bin``."""
    running = Server()
    running.files["/data/data.bin"] = VALUES.tobytes()
    running.files["/secret/data.bin"] = b"secret" * 1000
    running.thread.start()
    try:
        yield running
    finally:
        running.httpd.shutdown()
        running.httpd.server_close()
        running.thread.join(5)


@pytest.fixture
def server(monkeypatch):
    for name in PROXY_VARIABLES:  # a client honouring them would send everything to a proxy named there
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "*")
    with serving() as running:
        yield running


# ---------------------------------------------------------------------------------------------- manifests
def _array_refs(data_url: str | list[str], shuffle: bool = True) -> dict:
    return array_refs(data_url, CHUNKS, CHUNK_BYTES, 5 if shuffle else None)


def _manifest(tmp_path, refs: dict, sources: dict | None = None) -> str:
    document: dict[str, object] = {"version": 1, "refs": refs}
    if sources:
        document["nczmap"] = {"sources": sources}
    (tmp_path / "refs.json").write_text(json.dumps(document))
    return (tmp_path / "refs.json").as_uri() + "#mode=zarr,manifest"


def _grant(server: Server, **options) -> dict:
    return {f"{server.root}/data/": options}


# ---------------------------------------------------------------------------------------------- reading
def test_references_over_http_read_exactly_in_few_requests(server, tmp_path):
    url = _manifest(tmp_path, _array_refs(f"{server.root}/data/data.bin"))
    with nczmap.open_dataset(url, containers=_grant(server)) as ds:
        assert np.array_equal(ds.variables["v"][...], VALUES)
        assert np.array_equal(ds.variables["v"][1000:1010], VALUES[1000:1010])
    methods = server.methods()
    assert methods.count("HEAD") == 1, methods
    assert len(methods) * 20 <= CHUNKS, f"{len(methods)} requests for {CHUNKS} chunks"
    assert server.paths() == {"/data/data.bin"}


def test_every_spelling_of_a_granted_url_is_one_source(server, tmp_path):
    root = f"127.0.0.1:{server.port}"
    spellings = [
        f"HTTP://{root}/data/data.bin",
        f"http://{root}//data/./x/../data.bin",
        f"http://{root}/%64ata/data%2Ebin",
        f"http://0x7f.1:{server.port}/data/data.bin",
        f"http://2130706433:{server.port}/data/data.bin",
    ]
    url = _manifest(tmp_path, _array_refs(spellings, shuffle=False))
    with nczmap.open_dataset(url, containers=_grant(server)) as ds:
        assert np.array_equal(ds.variables["v"][...], VALUES)
    assert server.methods().count("HEAD") == 1
    assert server.paths() == {"/data/data.bin"}


def test_container_headers_go_with_every_request(server, tmp_path):
    server.required = ("Authorization", "Bearer letmein")
    url = _manifest(tmp_path, _array_refs(f"{server.root}/data/data.bin"))
    with nczmap.open_dataset(url, containers=_grant(server)) as ds, pytest.raises(AccessDenied):
        ds.variables["v"][...]
    grant = _grant(server, headers={"Authorization": "Bearer letmein"})
    with nczmap.open_dataset(url, containers=grant) as ds:
        assert np.array_equal(ds.variables["v"][...], VALUES)


def test_proxy_variables_are_not_used(server, tmp_path, monkeypatch):
    """A proxy named in the environment never sees a request: references are fetched directly."""
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen(8)
        proxy.setblocking(False)
        address = f"http://127.0.0.1:{proxy.getsockname()[1]}"
        monkeypatch.delenv("NO_PROXY")
        for name in PROXY_VARIABLES:
            monkeypatch.setenv(name, address)
        url = _manifest(tmp_path, _array_refs(f"{server.root}/data/data.bin"))
        with nczmap.open_dataset(url, containers=_grant(server)) as ds:
            assert np.array_equal(ds.variables["v"][...], VALUES)
        with pytest.raises(BlockingIOError):
            proxy.accept()
    assert server.requests


def test_a_header_with_an_empty_value_is_sent_empty(server, tmp_path):
    url = _manifest(tmp_path, _array_refs(f"{server.root}/data/data.bin"))
    with nczmap.open_dataset(url, containers=_grant(server, headers={"X-Empty": "", "X-Two": "a b"})) as ds:
        assert np.array_equal(ds.variables["v"][...], VALUES)
    for *_, headers in server.requests:
        assert headers["X-Empty"] == "" and headers["X-Two"] == "a b", headers


@pytest.fixture
def tls_server(tmp_path):
    """A file served over HTTPS by 127.0.0.1 with a self-signed certificate (its PEM path, the URL)."""
    import datetime
    import ipaddress
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    address = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(address, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    pem = tmp_path / "cert.pem"
    pem.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    private = tmp_path / "key.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "data.bin").write_bytes(VALUES.tobytes())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "www"))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem, private)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield pem, f"https://127.0.0.1:{httpd.server_address[1]}/data.bin"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_https_servers_are_verified_with_the_systems_authorities(tls_server, monkeypatch):
    """A certificate no authority signed is a StorageError naming the URL, not retried; the same server
    is read once its certificate is among the authorities Python's ssl finds (SSL_CERT_FILE)."""
    pem, url = tls_server
    http_reader.close_connections()
    http_reader._authorities.cache_clear()
    began = time.monotonic()
    with pytest.raises(StorageError, match="certificate") as info:
        http_reader.HttpReader(url).read(0, 10)
    assert url in str(info.value) and "attempts" not in str(info.value)
    assert time.monotonic() - began < 5
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))
    http_reader.close_connections()
    http_reader._authorities.cache_clear()
    try:
        assert http_reader.HttpReader(url).fetch(8, 16) == VALUES.tobytes()[8:24]  # (a server without ranges)
    finally:
        monkeypatch.delenv("SSL_CERT_FILE")
        http_reader.close_connections()
        http_reader._authorities.cache_clear()


def test_a_forked_child_reads_on_connections_of_its_own(server, tmp_path):
    """The parent's pooled connections are not used by a forked child (nor closed by it): both go on
    reading."""
    url = _manifest(tmp_path, _array_refs(f"{server.root}/data/data.bin"))
    script = f"""
import os, sys
import numpy as np
import nczmap
def read():
    with nczmap.open_dataset({url!r}, containers=[{server.root + "/data/"!r}]) as ds:
        return ds.variables["v"][...].sum()
total = read()
pid = os.fork()
if pid == 0:
    os._exit(0 if read() == total else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert read() == total
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    assert len(server.requests) >= 3


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "spell",
    [
        "{root}/secret/data.bin",
        "{root}/data-x/data.bin",
        "{root}/data/../secret/data.bin",
        "{root}/data/%2e%2e/secret/data.bin",
        "{root}/data/%2E%2E%2Fsecret/data.bin",
        "{root}/data/..%2fsecret/data.bin",
        "{root}/data/%252e%252e/secret/data.bin",
        "{root}/data/..;/secret/data.bin",
        "{root}/data/..\\secret/data.bin",
        "{root}/data/%5c..%5csecret/data.bin",
        "{root}/../data/data.bin",
        "{root}/data/data.bin?download=1",
        "{root}/data/data.bin#v",
        "http://127.0.0.1:{other}/data/data.bin",
        "https://127.0.0.1:{port}/data/data.bin",
        "http://localhost:{port}/data/data.bin",
        "http://127.0.0.1:{port}@evil.example/data/data.bin",
        "http://user:password@127.0.0.1:{port}/data/data.bin",
        "http://127.0.0.1%3a{port}%40evil.example/data/data.bin",
        "http:/127.0.0.1:{port}/data/data.bin",
        "http://169.254.169.254/latest/meta-data",
    ],
)
def test_references_outside_the_grant_are_refused_before_any_request(server, tmp_path, spell):
    other = server.port + 1 if server.port < 65535 else server.port - 1
    reference = spell.format(root=server.root, port=server.port, other=other)
    refs = {".zgroup": "{}", "stolen": [reference, 0, 10], "whole": [reference]}
    url = _manifest(tmp_path, refs)
    with nczmap.open_map(url, "r", containers=_grant(server)) as zmap:
        for key in ("/stolen", "/whole"):
            with pytest.raises(AccessDenied):
                zmap.read(key)
            with pytest.raises(AccessDenied):
                zmap.read_many_into([(key, memoryview(bytearray(10)))])
    assert server.requests == []


@pytest.mark.parametrize(
    "host",
    [
        "169.254.169.254",
        "2852039166",
        "0xa9fea9fe",
        "0251.0376.0251.0376",
        "169.254.43518",
        "[::ffff:169.254.169.254]",
        "[fd00:ec2::254]",
        "[fe80::1]",
        "metadata.google.internal.",
        "%31%36%39.254.169.254",
    ],
)
def test_metadata_addresses_are_refused_even_when_granted(host):
    with pytest.raises(AccessDenied, match="metadata"):
        normalize(f"http://{host}/latest/meta-data/", None)
    with pytest.raises(AccessDenied, match="metadata"):
        Container(f"http://{host}/")


def test_a_metadata_reference_is_refused_by_default(tmp_path):
    refs = {".zgroup": "{}", "stolen": ["http://169.254.169.254/latest/meta-data/iam", 0, 10]}
    with nczmap.open_map(_manifest(tmp_path, refs), "r") as zmap, pytest.raises(AccessDenied):
        zmap.read("/stolen")


# ---------------------------------------------------------------------------------------------- canonical
@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("HTTPS://Data.Example.ORG:443/archive/a.nc", "https://data.example.org/archive/a.nc"),
        ("http://data.example.org:80/archive/a.nc", "http://data.example.org/archive/a.nc"),
        ("http://data.example.org:8080/archive/a.nc", "http://data.example.org:8080/archive/a.nc"),
        ("https://data.example.org./archive//./x/../a.nc", "https://data.example.org/archive/a.nc"),
        ("https://data.example.org/%61rchive/a%2enc", "https://data.example.org/archive/a.nc"),
        ("https://data.example.org/archive/a b+c%7e.nc", "https://data.example.org/archive/a%20b+c~.nc"),
        (
            "https://data.example.org/archive/%c3%a9t%C3%A9.nc",
            "https://data.example.org/archive/%C3%A9t%C3%A9.nc",
        ),
        (
            "https://data.example.org/archive/\u00e9t\u00e9.nc",
            "https://data.example.org/archive/%C3%A9t%C3%A9.nc",
        ),
        ("http://[0:0:0:0:0:0:0:1]:8000/a.nc", "http://[::1]:8000/a.nc"),
        ("http://0177.0.0.1/a.nc", "http://127.0.0.1/a.nc"),
    ],
)
def test_http_urls_are_made_canonical(spelling, canonical):
    assert normalize(spelling, None) == canonical


@pytest.mark.parametrize(
    ("reference", "allowed"),
    [
        ("https://data.example.org/archive/a.nc", True),
        ("https://data.example.org/archive/sub/../a.nc", True),
        ("https://DATA.EXAMPLE.ORG:443/archive/x/a.nc", True),
        ("https://data.example.org.evil.com/archive/a.nc", False),
        ("https://data.example.org/archive-x/a.nc", False),
        ("https://data.example.org/archivea.nc", False),
        ("https://data.example.org/archive/../a.nc", False),
        ("https://data.example.org:8443/archive/a.nc", False),
        ("http://data.example.org/archive/a.nc", False),
        ("https://evil.com/archive/a.nc", False),
    ],
)
def test_a_granted_http_prefix_matches_whole_segments_of_its_host_only(reference, allowed):
    grant = [Container("https://data.example.org/archive")]
    if allowed:
        assert authorize(reference, None, grant, "k")[1] is grant[0]
    else:
        with pytest.raises(AccessDenied):
            authorize(reference, None, grant, "k")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:0/a.nc",
        "http://127.0.0.1:65536/a.nc",
        "http://127.0.0.1:8x/a.nc",
        "http://256.0.0.1/a.nc",
        "http://1.2.3.4.5/a.nc",
        "http://09.0.0.1/a.nc",
        "http:///a.nc",
        "http://ex ample.org/a.nc",
        "http://\u00e9xample.org/a.nc",
        "http://[fe80::1%25eth0]/a.nc",
        "http://example.org/a%00.nc",
        "http://example.org/a%C0%AE%C0%AE/b.nc",
        "http://example.org/\uff0e\uff0e/b.nc",
        "http://example.org/a\n/b.nc",
        "http%3A%2F%2Fexample.org/a.nc",
    ],
)
def test_malformed_or_ambiguous_http_urls_are_refused(url):
    with pytest.raises(AccessDenied):
        normalize(url, "file:///somewhere/")


# ---------------------------------------------------------------------------------------------- integrity
@pytest.mark.parametrize(
    "recorded",
    [{"etag": '"0123456789abcdef"'}, {"size": CHUNKS * CHUNK_BYTES + 1}],
    ids=["etag", "size"],
)
def test_a_source_changed_since_the_manifest_was_made_is_an_error(server, tmp_path, recorded):
    data_url = f"{server.root}/data/data.bin"
    url = _manifest(tmp_path, _array_refs(data_url), {data_url: recorded})
    with (
        nczmap.open_dataset(url, containers=_grant(server)) as ds,
        pytest.raises(StorageError, match="changed since the manifest") as info,
    ):
        ds.variables["v"][...]
    assert data_url in str(info.value)
    assert "GET" not in server.methods()


def test_the_recorded_etag_and_size_are_accepted_when_unchanged(server, tmp_path):
    data_url = f"{server.root}/data/data.bin"
    etag = '"' + hashlib.sha256(VALUES.tobytes()).hexdigest()[:16] + '"'
    url = _manifest(tmp_path, _array_refs(data_url), {data_url: {"etag": etag, "size": VALUES.nbytes}})
    with nczmap.open_dataset(url, containers=_grant(server)) as ds:
        assert np.array_equal(ds.variables["v"][...], VALUES)


def test_a_missing_source_is_an_error_naming_it(server, tmp_path):
    data_url = f"{server.root}/data/gone.bin"
    url = _manifest(tmp_path, _array_refs(data_url))
    with (
        nczmap.open_dataset(url, containers=_grant(server)) as ds,
        pytest.raises(StorageError, match="does not exist") as info,
    ):
        ds.variables["v"][...]
    assert data_url in str(info.value)


def test_a_source_shorter_than_its_references_is_an_error_naming_it(server, tmp_path):
    data_url = f"{server.root}/data/data.bin"
    server.files["/data/data.bin"] = VALUES.tobytes()[: -CHUNK_BYTES // 2]
    url = _manifest(tmp_path, _array_refs(data_url))
    with (
        nczmap.open_dataset(url, containers=_grant(server)) as ds,
        pytest.raises(StorageError, match="truncated or replaced") as info,
    ):
        ds.variables["v"][...]
    assert data_url in str(info.value)


def test_a_short_body_is_an_error_naming_the_source(server, tmp_path):
    data_url = f"{server.root}/data/data.bin"
    server.short.add("/data/data.bin")
    url = _manifest(tmp_path, _array_refs(data_url))
    with nczmap.open_map(url, "r", containers=_grant(server)) as zmap:
        with pytest.raises(StorageError) as info:
            zmap.read("/v/3")
        assert data_url in str(info.value)
        with pytest.raises(StorageError) as info:
            zmap.read_many_into([(f"/v/{i}", memoryview(bytearray(CHUNK_BYTES))) for i in range(CHUNKS)])
        assert data_url in str(info.value)


def test_a_source_that_shrinks_while_open_is_an_error_naming_it(server, tmp_path):
    data_url = f"{server.root}/data/data.bin"
    url = _manifest(tmp_path, _array_refs(data_url))
    with nczmap.open_map(url, "r", containers=_grant(server)) as zmap:
        assert zmap.read("/v/0") == VALUES.tobytes()[:CHUNK_BYTES]
        server.files["/data/data.bin"] = VALUES.tobytes()[: CHUNK_BYTES * 10 + 7]
        with pytest.raises(StorageError) as info:
            zmap.read("/v/10")
        assert data_url in str(info.value)
        with pytest.raises(StorageError) as info:
            zmap.read("/v/200")
        assert data_url in str(info.value)


def test_http_is_refused_without_a_grant(server, tmp_path):
    url = _manifest(tmp_path, _array_refs(f"{server.root}/data/data.bin"))
    with nczmap.open_dataset(url) as ds, pytest.raises(AccessDenied, match=r"--allow http://127\.0\.0\.1"):
        ds.variables["v"][...]
    assert server.requests == []


@pytest.mark.parametrize("headers", [{"Bad Name": "v"}, {"X-Key": "a\nb"}])
def test_bad_header_options_are_refused(server, tmp_path, headers):
    url = _manifest(tmp_path, _array_refs(f"{server.root}/data/data.bin"))
    with (
        nczmap.open_dataset(url, containers=_grant(server, headers=headers)) as ds,
        pytest.raises(nczmap.errors.DataError, match="headers"),
    ):
        ds.variables["v"][...]
    assert server.requests == []


@pytest.mark.parametrize("headers", [{"X-Key": 1}, "X-Key: v"])
def test_header_options_that_are_not_text_are_refused_when_granted(server, tmp_path, headers):
    url = _manifest(tmp_path, _array_refs(f"{server.root}/data/data.bin"))
    with pytest.raises(AccessDenied, match="option headers must be a dict of text"):
        nczmap.open_dataset(url, containers=_grant(server, headers=headers))
    assert server.requests == []
