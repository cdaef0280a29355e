"""The latency server (``latency_server.py``) behaves as it says: latency, answers, counts, each fault; and
the S3 proxy's optional latency. Quick: small files, latencies of tens of milliseconds."""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from latency_server import HUGE_LENGTH, LatencyServer, serving

DATA = bytes(range(256)) * 40  # 10,240 bytes


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.bin").write_bytes(DATA)
    (tmp_path / "data" / "b.bin").write_bytes(DATA[::-1])
    (tmp_path / "data" / "empty").mkdir()
    (tmp_path / "outside.bin").write_bytes(b"secret")
    return tmp_path / "data"


@pytest.fixture
def server(folder):
    with serving(folder, latency=0.0) as running:
        yield running


@contextlib.contextmanager
def connected(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        yield connection
    finally:
        connection.close()


def ask(server, method: str, path: str, headers: dict | None = None, connection=None, body=None):
    """``(status, headers, body)`` of one request (on ``connection`` if given, else a new one)."""
    with contextlib.ExitStack() as stack:
        if connection is None:
            connection = stack.enter_context(connected(server))
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        body = response.read()
        return response.status, dict(response.getheaders()), body


# ------------------------------------------------------------------------------------------ answers
def test_it_listens_on_the_loopback_address_only(server):
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert server._server.server_address[0] == "127.0.0.1"


def test_head_gives_size_etag_date_and_ranges_without_a_body(server, folder):
    status, headers, body = ask(server, "HEAD", "/a.bin")
    assert (status, body) == (200, b"")
    assert headers["Content-Length"] == str(len(DATA))
    assert headers["Accept-Ranges"] == "bytes"
    assert headers["ETag"].startswith('"') and headers["ETag"].endswith('"')
    modified = email.utils.parsedate_to_datetime(headers["Last-Modified"]).timestamp()
    assert modified == int(os.stat(folder / "a.bin").st_mtime)


@pytest.mark.parametrize(
    ("wanted", "start", "end"),
    [("bytes=0-9", 0, 10), ("bytes=100-199", 100, 200), ("bytes=10000-", 10000, len(DATA)),
     ("bytes=-40", len(DATA) - 40, len(DATA)), ("bytes=10200-99999", 10200, len(DATA))],
)  # fmt: skip
def test_a_single_range_is_answered_206_with_its_content_range(server, wanted, start, end):
    status, headers, body = ask(server, "GET", "/a.bin", {"Range": wanted})
    assert status == 206
    assert body == DATA[start:end]
    assert headers["Content-Range"] == f"bytes {start}-{end - 1}/{len(DATA)}"
    assert headers["Content-Length"] == str(end - start)
    assert "ETag" in headers and "Last-Modified" in headers


def test_a_get_without_range_is_the_whole_file(server):
    status, headers, body = ask(server, "GET", "/a.bin")
    assert (status, body) == (200, DATA)
    assert "Content-Range" not in headers


@pytest.mark.parametrize(
    "wanted", [f"bytes={len(DATA)}-", f"bytes={len(DATA) + 5}-{len(DATA) + 9}", "bytes=-0"]
)
def test_a_range_past_the_end_is_416(server, wanted):
    status, headers, body = ask(server, "GET", "/a.bin", {"Range": wanted})
    assert (status, body) == (416, b"")
    assert headers["Content-Range"] == f"bytes */{len(DATA)}"


def test_several_ranges_or_a_malformed_range_are_ignored(server):
    for wanted in ("bytes=0-1,5-6", "bytes=9-3", "items=0-1"):
        status, _, body = ask(server, "GET", "/a.bin", {"Range": wanted})
        assert (status, body) == (200, DATA), wanted


@pytest.mark.parametrize("path", ["/missing.bin", "/../outside.bin", "/%2e%2e/outside.bin", "/empty", "/"])
def test_anything_but_a_file_under_the_directory_is_404(server, path):
    status, _, body = ask(server, "GET", path)
    assert (status, body) == (404, b"")


def test_other_methods_are_405(server):
    status, headers, _ = ask(server, "PUT", "/a.bin", body=b"abc")
    assert status == 405
    assert headers["Allow"] == "GET, HEAD"


def test_conditional_requests(server, folder):
    _, headers, _ = ask(server, "HEAD", "/a.bin")
    etag, modified = headers["ETag"], headers["Last-Modified"]
    before = email.utils.formatdate(os.stat(folder / "a.bin").st_mtime - 3600, usegmt=True)
    later = email.utils.formatdate(os.stat(folder / "a.bin").st_mtime + 3600, usegmt=True)
    cases = [
        ({"If-Match": etag, "Range": "bytes=0-3"}, 206),
        ({"If-Match": '"another"', "Range": "bytes=0-3"}, 412),
        ({"If-Match": f'"x", {etag}'}, 200),
        ({"If-Match": "*"}, 200),
        ({"If-Unmodified-Since": before}, 412),
        ({"If-Unmodified-Since": later}, 200),
        ({"If-Unmodified-Since": modified}, 200),
        ({"If-None-Match": etag}, 304),
        ({"If-None-Match": '"another"'}, 200),
        ({"If-Modified-Since": modified}, 304),
        ({"If-Modified-Since": before}, 200),
        ({"If-Match": etag, "If-Unmodified-Since": before}, 200),  # If-Match decides (RFC 9110)
    ]
    for headers, expected in cases:
        status, answer, body = ask(server, "GET", "/a.bin", headers)
        assert status == expected, headers
        if status in (304, 412):
            assert body == b""
            assert answer["ETag"] == etag


def test_requests_share_a_kept_alive_connection(server):
    with connected(server) as connection:
        for offset in range(0, 100, 10):
            status, _, body = ask(
                server, "GET", "/a.bin", {"Range": f"bytes={offset}-{offset + 9}"}, connection
            )
            assert (status, body) == (206, DATA[offset : offset + 10])
    assert server.connections == 1


def test_an_idle_kept_alive_connection_is_closed_after_idle_timeout(folder):
    with serving(folder, latency=0.0, idle_timeout=0.3) as server, connected(server) as connection:
        assert ask(server, "HEAD", "/a.bin", connection=connection)[0] == 200
        time.sleep(0.1)
        assert ask(server, "HEAD", "/a.bin", connection=connection)[0] == 200, "not idle long enough"
        time.sleep(0.8)
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            ask(server, "HEAD", "/a.bin", connection=connection)
        assert server.counts == {"HEAD": 2}, "the request on the closed connection never arrived"


# ------------------------------------------------------------------------------------------ latency
def test_each_answer_waits_the_latency_and_requests_wait_together(folder):
    with serving(folder, latency=0.2) as server:
        start = time.perf_counter()
        ask(server, "HEAD", "/a.bin")
        assert 0.2 <= time.perf_counter() - start < 1.0
        start = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: ask(server, "GET", "/a.bin", {"Range": "bytes=0-9"}), range(8)))
        elapsed = time.perf_counter() - start
        assert all(status == 206 for status, _, _ in answers)
        assert 0.2 <= elapsed < 0.2 * 4, "the latency is waited concurrently, not in turn"
        assert server.max_in_flight == 8
        assert server.max_in_flight_by_method == {"HEAD": 1, "GET": 8}
        log = server.log
        assert all(0.2 <= e.answered - e.received < 0.2 * 4 for e in log)
        assert len({e.connection for e in log}) == 9
        server.latency = 0.0
        start = time.perf_counter()
        ask(server, "HEAD", "/a.bin")
        assert time.perf_counter() - start < 0.15


# ------------------------------------------------------------------------------------------ counting
def test_requests_and_bytes_are_counted_by_method_and_file(server):
    ask(server, "HEAD", "/a.bin")
    ask(server, "GET", "/a.bin", {"Range": "bytes=0-99"})
    ask(server, "GET", "/b.bin")
    ask(server, "GET", "/missing.bin")
    assert server.counts == {"HEAD": 1, "GET": 3}
    assert server.per_file == {
        "/a.bin": {"HEAD": 1, "GET": 1},
        "/b.bin": {"GET": 1},
        "/missing.bin": {"GET": 1},
    }
    assert server.bytes_per_file == {"/a.bin": 100, "/b.bin": len(DATA)}
    assert server.bytes_sent == 100 + len(DATA)
    log = server.log
    assert [(e.method, e.path, e.range, e.status, e.sent) for e in log] == [
        ("HEAD", "/a.bin", None, 200, 0),
        ("GET", "/a.bin", "bytes=0-99", 206, 100),
        ("GET", "/b.bin", None, 200, len(DATA)),
        ("GET", "/missing.bin", None, 404, 0),
    ]
    stats = server.stats()
    assert stats["requests"] == 4 and stats["bytes_sent"] == 100 + len(DATA)
    server.reset()
    assert server.counts == {} and server.per_file == {} and server.bytes_sent == 0 and server.log == []


def test_counts_are_exact_under_concurrent_clients(folder):
    with serving(folder, latency=0.01) as server:

        def client(index: int) -> None:
            with connected(server) as connection:
                for offset in range(10):
                    ask(server, "GET", "/a.bin", {"Range": f"bytes={offset}-{offset + index}"}, connection)

        with ThreadPoolExecutor(32) as pool:
            list(pool.map(client, range(32)))
        assert server.counts == {"GET": 320}
        assert server.bytes_sent == sum(10 * (index + 1) for index in range(32))
        assert server.connections == 32
        assert 1 < server.max_in_flight <= 32


# ------------------------------------------------------------------------------------------ faults
def test_error_answers_503_with_retry_after(server):
    server.faults(error=1.0, retry_after=2)
    status, headers, body = ask(server, "GET", "/a.bin", {"Range": "bytes=0-9"})
    assert (status, body) == (503, b"")
    assert headers["Retry-After"] == "2"
    assert ask(server, "HEAD", "/a.bin")[0] == 200, "error hits GETs only by default"
    assert server.log[0].fault == "error"
    server.faults()
    assert ask(server, "GET", "/a.bin", {"Range": "bytes=0-9"})[0] == 206


def test_error_rate_is_a_share_drawn_deterministically_from_the_seed(folder):
    def fates(seed: int) -> list[int]:
        with serving(folder, latency=0.0, seed=seed, error=0.3) as server, connected(server) as connection:
            return [
                ask(server, "GET", "/a.bin", {"Range": f"bytes={n}-{n}"}, connection)[0] for n in range(400)
            ]

    first = fates(1)
    assert fates(1) == first
    assert fates(2) != first
    share = first.count(503) / len(first)
    assert 0.2 < share < 0.4
    assert set(first) == {206, 503}


def test_a_retried_request_is_drawn_afresh_and_reset_starts_the_draws_again(server):
    server.faults(error=0.5, seed=7)
    statuses = [ask(server, "GET", "/a.bin", {"Range": "bytes=0-9"})[0] for _ in range(40)]
    assert {503, 206} == set(statuses), "the same request does not always get the same fate"
    server.reset()
    again = [ask(server, "GET", "/a.bin", {"Range": "bytes=0-9"})[0] for _ in range(40)]
    assert again == statuses


def test_cut_sends_part_of_the_body_under_the_full_length_then_closes(server):
    server.faults(cut=1.0)
    with connected(server) as connection:
        connection.request("GET", "/a.bin", headers={"Range": "bytes=0-999"})
        response = connection.getresponse()
        assert response.status == 206
        assert response.getheader("Content-Length") == "1000"
        with pytest.raises(http.client.IncompleteRead) as caught:
            response.read()
        assert caught.value.partial == DATA[:500]
    assert server.log[0].fault == "cut" and server.log[0].sent == 500
    assert server.bytes_per_file["/a.bin"] == 500


def test_trickle_sends_one_byte_at_a_time(server):
    server.faults(trickle=0.05)
    start = time.perf_counter()
    status, _, body = ask(server, "GET", "/a.bin", {"Range": "bytes=0-5"})
    assert (status, body) == (206, DATA[:6])
    assert time.perf_counter() - start >= 0.05 * 5
    assert server.log[0].fault == "trickle"


def test_trickle_does_not_keep_the_server_from_stopping(folder):
    server = LatencyServer(folder, latency=0.0)
    server.faults(trickle=5.0)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("GET", "/a.bin", headers={"Range": "bytes=0-99"})
        response = connection.getresponse()
        assert response.read(1) == DATA[:1]
        start = time.perf_counter()
        server.stop()
        assert time.perf_counter() - start < 3
    finally:
        connection.close()


def test_ignore_range_answers_200_with_the_whole_file(server):
    server.faults(ignore_range=True)
    status, headers, body = ask(server, "GET", "/a.bin", {"Range": "bytes=0-9"})
    assert (status, body) == (200, DATA)
    assert "Content-Range" not in headers
    assert server.log[0].fault == "ignore_range"


def test_wrong_range_answers_another_range(server):
    server.faults(wrong_range=True)
    status, headers, body = ask(server, "GET", "/a.bin", {"Range": "bytes=10-19"})
    assert status == 206
    assert headers["Content-Range"] == f"bytes 11-20/{len(DATA)}"
    assert body == DATA[11:21]


def test_changing_etag_changes_on_every_answer_so_if_match_fails(server):
    server.faults(changing_etag=True)
    tags = {ask(server, "HEAD", "/a.bin")[1]["ETag"] for _ in range(3)}
    assert len(tags) == 3
    last = ask(server, "GET", "/a.bin", {"Range": "bytes=0-9"})[1]["ETag"]
    assert ask(server, "GET", "/a.bin", {"Range": "bytes=0-9", "If-Match": last})[0] == 412


def test_huge_length_claims_2_to_the_62_bytes(server):
    server.faults(huge_length=True)
    status, headers, _ = ask(server, "HEAD", "/a.bin")
    assert (status, headers["Content-Length"]) == (200, str(HUGE_LENGTH))
    with connected(server) as connection:
        connection.request("GET", "/a.bin", headers={"Range": "bytes=0-9"})
        response = connection.getresponse()
        assert response.getheader("Content-Length") == str(HUGE_LENGTH)
        received = b""
        while piece := response.read(4):  # it promises 2**62 bytes, sends ten, then hangs up
            received += piece
        assert received == DATA[:10]
        assert response.length == HUGE_LENGTH - 10, "the answer ended unfinished"


def test_faults_hit_only_the_paths_and_methods_named(server):
    server.faults(error=1.0, path=r"/b\.bin$")
    assert ask(server, "GET", "/a.bin")[0] == 200
    assert ask(server, "GET", "/b.bin")[0] == 503
    server.faults(error=1.0, methods=["HEAD"])
    assert ask(server, "HEAD", "/a.bin")[0] == 503
    assert ask(server, "GET", "/a.bin")[0] == 200
    server.faults(changing_etag=True, methods=["GET"])
    heads = {ask(server, "HEAD", "/a.bin")[1]["ETag"] for _ in range(2)}
    assert len(heads) == 1


def test_unknown_or_impossible_faults_are_refused(server):
    with pytest.raises(TypeError, match="bogus"):
        server.faults(bogus=1)
    with pytest.raises(ValueError, match="error"):
        server.faults(error=1.5)


# ------------------------------------------------------------------------------------- in a child process
def test_in_a_child_process_it_answers_counts_and_injects_faults_the_same(folder):
    with serving(folder, latency=0.05, process=True) as server:
        assert server.url.startswith("http://127.0.0.1:")
        assert server.url_of(folder / "a.bin") == f"{server.url}/a.bin"
        start = time.perf_counter()
        status, _, body = ask(server, "GET", "/a.bin", {"Range": "bytes=5-14"})
        assert time.perf_counter() - start >= 0.05
        assert (status, body) == (206, DATA[5:15])
        assert server.counts == {"GET": 1}
        assert server.bytes_per_file == {"/a.bin": 10}
        assert server.log[0].range == "bytes=5-14"
        server.faults(error=1.0)
        assert ask(server, "GET", "/a.bin")[0] == 503
        with pytest.raises(TypeError):
            server.faults(bogus=True)
        server.faults()
        server.latency = 0.0
        assert server.latency == 0.0
        server.reset()
        assert server.stats()["requests"] == 0
        with connected(server) as connection:  # a log far larger than a pipe's buffer comes back whole
            for _ in range(600):
                ask(server, "GET", "/a.bin", {"Range": "bytes=0-0"}, connection)
        assert len(server.log) == 600


def test_url_of_names_files_under_the_directory_only(server, folder):
    assert server.url_of("a.bin") == f"{server.url}/a.bin"
    assert server.url_of(folder / "empty" / "x y.bin") == f"{server.url}/empty/x%20y.bin"
    with pytest.raises(ValueError):
        server.url_of(folder.parent / "outside.bin")


# ------------------------------------------------------------------------------------------ the S3 proxy
def test_the_s3_proxy_adds_latency_when_asked_and_none_by_default(s3_server):
    from s3proxy import S3Proxy

    for latency in (0.0, 0.2):
        with S3Proxy(s3_server.endpoint, latency=latency) as proxy:
            assert proxy.latency == latency
            port = int(proxy.endpoint.rsplit(":", 1)[1])
            start = time.perf_counter()
            with ThreadPoolExecutor(4) as pool:
                results = list(pool.map(lambda _, port=port: _list_one(port), range(4)))
            elapsed = time.perf_counter() - start
            assert results == [200] * 4
            assert proxy.counts["LIST"] == 4
            if latency:
                assert latency <= elapsed < latency * 3, "the requests waited together"
                assert proxy.max_in_flight["LIST"] == 4, "a request waiting out its latency is in flight"


def _list_one(port: int) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/nczbucket?list-type=2&max-keys=1")
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()
