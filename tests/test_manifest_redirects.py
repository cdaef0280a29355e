"""HTTP(S) references cannot leave their grant: redirects are refused, never followed (nothing reaches the
place they point at, and the grant's headers go nowhere else), hostile or broken servers give nczmap errors,
and cloud metadata addresses are refused in every spelling. Servers run on 127.0.0.1 only."""

from __future__ import annotations

import socket
import time
import tracemalloc

import pytest
from test_manifest_http import (
    CHUNK_BYTES,
    CHUNKS,
    VALUES,
    Server,
    _array_refs,
    _grant,
    _manifest,
    serving,
)

import nczmap
from nczmap import AccessDenied, StorageError
from nczmap.manifest.containers import Container, normalize
from nczmap.zmap import http as http_reader

TOKEN = {"Authorization": "Bearer letmein"}
PART = (1000, 100)  # offset and length of the part reference


@pytest.fixture
def server():
    """The server holding the granted files (references are fetched directly: no proxy is involved)."""
    with serving() as running:
        yield running


@pytest.fixture
def other():
    """A second server, on another port of 127.0.0.1, which nothing may ever reach."""
    with serving() as running:
        yield running


def _refs(url: str) -> dict:
    return {".zgroup": "{}", "whole": [url], "part": [url, *PART], **_array_refs(url)}


def _open(server: Server, tmp_path, url: str | None = None, **options):
    url = url or f"{server.root}/data/data.bin"
    return nczmap.open_map(_manifest(tmp_path, _refs(url)), "r", containers=_grant(server, **options))


def _assert_authorization_stays_home(*servers: Server) -> None:
    for running in servers:
        for method, path, _, headers in running.requests:
            if "Authorization" in headers:
                assert (running is servers[0], path) == (True, "/data/data.bin"), (method, path)


# ---------------------------------------------------------------------------------------------- redirects
TARGETS = {
    "another-port": "{other}/data/data.bin",
    "outside-the-grant": "{root}/secret/data.bin",
    "inside-the-grant": "{root}/data/moved.bin",
}


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("target", list(TARGETS))
def test_a_redirect_is_refused_and_never_followed(server, other, tmp_path, status, target):
    location = TARGETS[target].format(other=other.root, root=server.root)
    server.files["/data/moved.bin"] = VALUES.tobytes()
    server.redirects["/data/data.bin"] = (status, location)
    with _open(server, tmp_path, headers=TOKEN) as zmap:
        for read in (
            lambda: zmap.read("/v/3"),
            lambda: zmap.read("/whole"),
            lambda: zmap.read_many_into([(f"/v/{i}", memoryview(bytearray(CHUNK_BYTES))) for i in range(9)]),
        ):
            with pytest.raises(AccessDenied) as info:
                read()
            message = str(info.value)
            assert location in message and f"{server.root}/data/data.bin" in message
            assert "not followed" in message and "granted container" in message
    assert other.requests == []
    assert server.paths() == {"/data/data.bin"}
    _assert_authorization_stays_home(server, other)


@pytest.mark.parametrize("status", [302, 307])
@pytest.mark.parametrize("target", list(TARGETS))
def test_a_redirect_of_the_range_requests_alone_is_refused(server, other, tmp_path, status, target):
    location = TARGETS[target].format(other=other.root, root=server.root)
    server.files["/data/moved.bin"] = VALUES.tobytes()
    server.redirects["/data/data.bin"] = (status, location)
    server.redirect_methods = ("GET",)
    with _open(server, tmp_path, headers=TOKEN) as zmap:
        with pytest.raises(AccessDenied, match="not followed") as info:
            zmap.read("/part")
        assert location in str(info.value)
        with pytest.raises(AccessDenied, match="not followed"):
            zmap.read_many_into([(f"/v/{i}", memoryview(bytearray(CHUNK_BYTES))) for i in range(CHUNKS)])
    assert "HEAD" in server.methods() and "GET" in server.methods()
    assert other.requests == []
    assert server.paths() == {"/data/data.bin"}
    _assert_authorization_stays_home(server, other)


def test_a_relative_redirect_is_named_as_the_url_it_points_at(server, tmp_path):
    server.redirects["/data/data.bin"] = (302, "/secret/data.bin")
    with _open(server, tmp_path) as zmap, pytest.raises(AccessDenied) as info:
        zmap.read("/part")
    assert f"{server.root}/secret/data.bin" in str(info.value)
    assert server.paths() == {"/data/data.bin"}


# ---------------------------------------------------------------------------------------------- servers
def test_a_server_ignoring_range_serves_whole_objects_only(server, tmp_path):
    server.ignore_range = True
    with _open(server, tmp_path) as zmap:
        assert zmap.read("/whole") == VALUES.tobytes()
        with pytest.raises(StorageError, match="Range") as info:
            zmap.read("/part")
        assert f"{server.root}/data/data.bin" in str(info.value)


def test_a_server_refusing_ranges_is_refused_before_a_range_request(server, tmp_path):
    server.more_headers["Accept-Ranges"] = "none"
    with _open(server, tmp_path) as zmap:
        with pytest.raises(StorageError, match="byte ranges"):
            zmap.read("/part")
        assert zmap.read("/whole") == VALUES.tobytes()
    assert server.methods() == ["HEAD", "GET"]


@pytest.mark.parametrize("ignore_range", [False, True], ids=["206", "200"])
def test_a_huge_content_length_is_an_error_without_allocating(server, tmp_path, ignore_range):
    server.claimed_length = 10 << 30
    server.ignore_range = ignore_range
    with _open(server, tmp_path) as zmap:
        tracemalloc.start()
        try:
            with pytest.raises(StorageError) as info:
                zmap.read("/part")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert f"{server.root}/data/data.bin" in str(info.value)
    assert peak < 4 << 20


def test_a_body_longer_than_asked_is_an_error(server, tmp_path):
    server.extra = b"x" * (64 << 10)  # no Content-Length: the body runs to the end of the connection
    with _open(server, tmp_path) as zmap, pytest.raises(StorageError, match="more") as info:
        zmap.read("/part")
    assert f"{server.root}/data/data.bin" in str(info.value)


def test_a_refused_connection_is_a_storage_error(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    data_url = f"http://127.0.0.1:{port}/data/data.bin"
    refs = {".zgroup": "{}", "part": [data_url, *PART]}
    grant = {f"http://127.0.0.1:{port}/data/": {}}
    with (
        nczmap.open_map(_manifest(tmp_path, refs), "r", containers=grant) as zmap,
        pytest.raises(StorageError) as info,
    ):
        zmap.read("/part")
    assert data_url in str(info.value)
    assert type(info.value).__module__ == "nczmap.errors"


def test_a_silent_server_times_out(server, tmp_path, monkeypatch):
    monkeypatch.setattr(http_reader, "READ_TIMEOUT", 0.3)
    server.delay = 2
    began = time.monotonic()
    with _open(server, tmp_path) as zmap, pytest.raises(StorageError, match="timed out") as info:
        zmap.read("/part")
    assert time.monotonic() - began < 20
    assert f"{server.root}/data/data.bin" in str(info.value)


def test_a_passing_server_error_is_retried(server, tmp_path):
    server.failures = [503, 502]
    with _open(server, tmp_path) as zmap:
        assert zmap.read("/part") == VALUES.tobytes()[PART[0] : sum(PART)]


def test_a_lasting_server_error_names_the_url_and_status(server, tmp_path):
    server.failures = [503] * 10
    with _open(server, tmp_path) as zmap, pytest.raises(StorageError, match="503") as info:
        zmap.read("/part")
    assert f"{server.root}/data/data.bin" in str(info.value)
    assert len(server.requests) == 1 + http_reader.MAX_RETRIES


def test_forbidden_is_access_denied(server, tmp_path):
    server.failures = [403]
    with _open(server, tmp_path) as zmap, pytest.raises(AccessDenied, match="403"):
        zmap.read("/part")


def test_neighbouring_ranges_are_one_request(server):
    url = f"{server.root}/data/data.bin"
    with http_reader.HttpReader(url, TOKEN) as reader:
        assert reader.head().size == VALUES.nbytes
        ranges = [(8000, 10), (0, 100), (150, 50), (100_000, 8)]
        parts = reader.read_ranges(ranges, gap=100)
    data = VALUES.tobytes()
    assert parts == [data[offset : offset + length] for offset, length in ranges]
    assert sorted(r for _, _, r, _ in server.requests if r) == [
        "bytes=0-199",
        "bytes=100000-100007",
        "bytes=8000-8009",
    ]
    assert all(headers.get("Authorization") == TOKEN["Authorization"] for *_, headers in server.requests)


# ---------------------------------------------------------------------------------------------- metadata
@pytest.mark.parametrize(
    "host",
    [
        "169.254.169.254",
        "[::ffff:169.254.169.254]",
        "[::ffff:a9fe:a9fe]",
        "[64:ff9b::a9fe:a9fe]",
        "[64:ff9b::169.254.169.254]",
        "[::a9fe:a9fe]",
        "[::169.254.169.254]",
        "[2002:a9fe:a9fe::]",
        "[2002:a9fe:a9fe:1::1]",
        "[64:ff9b:1::a9fe:a9fe]",
        "[64:ff9b:1:a9fe:a9:fe00::]",
        "100.100.100.200",
        "0x646464c8",
        "[::ffff:100.100.100.200]",
        "[::6464:64c8]",
        "[64:ff9b::6464:64c8]",
        "[2002:6464:64c8::]",
        "168.63.129.16",
        "[::ffff:168.63.129.16]",
        "[fd00:ec2::254]",
        "[fe80::a9fe:a9fe]",
        "metadata.google.internal",
        "METADATA.Google.Internal.",
        "metadata.goog",
        "metadata",
    ],
)
def test_cloud_metadata_hosts_are_refused_in_every_spelling(host):
    with pytest.raises(AccessDenied, match="metadata"):
        normalize(f"http://{host}/latest/meta-data/", None)
    with pytest.raises(AccessDenied, match="metadata"):
        Container(f"http://{host}/")  # so it can never be granted


def test_a_granted_host_cannot_redirect_to_metadata(server, tmp_path):
    server.redirects["/data/data.bin"] = (307, "http://169.254.169.254/latest/meta-data/iam")
    with _open(server, tmp_path) as zmap, pytest.raises(AccessDenied, match="not followed"):
        zmap.read("/part")


@pytest.mark.parametrize(
    ("host", "canonical"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]", "[::1]"),
        ("100.100.100.201", "100.100.100.201"),
        ("169.253.255.255", "169.253.255.255"),
        ("[64:ff9b::7f00:1]", "[64:ff9b::7f00:1]"),
        ("[::ffff:127.0.0.1]", "[::ffff:7f00:1]"),
        ("[2002:7f00:1::]", "[2002:7f00:1::]"),
        ("[2001:db8::a9fe:a9fe]", "[2001:db8::a9fe:a9fe]"),
        ("[64:ff9b:2::a9fe:a9fe]", "[64:ff9b:2::a9fe:a9fe]"),
        ("metadata.example.org", "metadata.example.org"),
    ],
)
def test_ordinary_addresses_are_not_taken_for_metadata(host, canonical):
    assert normalize(f"http://{host}/data/a.nc", None) == f"http://{canonical}/data/a.nc"
