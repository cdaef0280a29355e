"""S3-driver specifics against moto: listing past one page, multipart writes, key limits, URL forms."""

from __future__ import annotations

import http.server
import threading
from typing import ClassVar

import numpy as np
import pytest

import nczmap


def object_prefix(url: str) -> str:
    return url.split("/nczbucket/", 1)[1].split("#", 1)[0]


def test_search_pages_past_1000_keys(s3_server):
    url = s3_server.url()
    client = s3_server.client()
    prefix = object_prefix(url)
    for index in range(1500):
        client.put_object(Bucket="nczbucket", Key=f"{prefix}/v/{index}", Body=b"x")
    with nczmap.open_map(url, "r") as zmap:
        assert zmap.search("/v") == sorted(str(i) for i in range(1500))


def test_large_objects_are_written_in_parts_and_read_by_range(s3_server):
    url = s3_server.url()
    data = np.random.default_rng(1).bytes(40 << 20)
    with nczmap.open_map(url, "w") as zmap:
        zmap.write("/big", data)
    with nczmap.open_map(url, "r") as zmap:
        assert zmap.len("/big") == len(data)
        assert zmap.read("/big", (20 << 20) - 3, 7) == data[(20 << 20) - 3 : (20 << 20) + 4]
    head = s3_server.client().head_object(Bucket="nczbucket", Key=f"{object_prefix(url)}/big")
    assert "-" in head["ETag"]  # a multipart ETag: "<md5>-<parts>"


def test_keys_longer_than_s3_allows_are_refused(s3_server):
    with nczmap.open_map(s3_server.url(), "w") as zmap, pytest.raises(nczmap.KeyNameError, match="1024"):
        zmap.write("/" + "g" * 1030, b"x")


def test_objects_from_other_writers_are_seen_by_a_writable_map(s3_server):
    url = s3_server.url()
    s3_server.client().put_object(Bucket="nczbucket", Key=f"{object_prefix(url)}/.zgroup", Body=b"{}")
    with nczmap.open_map(url, "a") as zmap:
        assert zmap.read("/.zgroup") == b"{}"
        with pytest.raises(nczmap.errors.KeyConflictError):
            zmap.write("/.zgroup/x", b"1")


def test_create_refuses_a_prefix_holding_other_data(s3_server):
    url = s3_server.url()
    key = f"{object_prefix(url)}/photos/cat.jpg"
    s3_server.client().put_object(Bucket="nczbucket", Key=key, Body=b"\xff")
    with pytest.raises(nczmap.DatasetExists, match="refusing"):
        nczmap.open_map(url, "w")
    assert s3_server.client().get_object(Bucket="nczbucket", Key=key)["Body"].read() == b"\xff"


def test_credentials_from_a_profile_file(s3_server, tmp_path, monkeypatch):
    """No AWS_* keys in the environment: the named profile of the shared credentials file is used."""
    url = s3_server.url()
    with nczmap.open_map(url, "w") as zmap:
        zmap.write("/.zgroup", b"{}")
    credentials = tmp_path / "credentials"
    credentials.write_text("[nczmap]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent-config"))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with nczmap.open_map(url.replace("#mode=", "#aws.profile=nczmap&mode="), "r") as zmap:
        assert zmap.read("/.zgroup") == b"{}"


class _HeaderRecorder(http.server.BaseHTTPRequestHandler):
    """Answers every request 404 NoSuchKey and remembers whether it was signed."""

    signed: ClassVar[list[bool]] = []

    def do_GET(self) -> None:
        type(self).signed.append("Authorization" in self.headers)
        body = b"<Error><Code>NoSuchKey</Code></Error>"
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize(("fragment", "signed"), [("aws.profile=no&", False), ("", True)])
def test_anonymous_profile_sends_unsigned_requests(s3_server, fragment, signed):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HeaderRecorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _HeaderRecorder.signed = []
    try:
        url = f"http://127.0.0.1:{server.server_port}/nczbucket/ds#{fragment}mode=nczarr,s3"
        with nczmap.open_map(url, "r") as zmap, pytest.raises(nczmap.EmptyError):
            zmap.read("/.zgroup")
    finally:
        server.shutdown()
        server.server_close()
    assert _HeaderRecorder.signed == [signed]


def test_credentials_are_found_where_netcdf_c_looks(tmp_path, monkeypatch):
    """Without any, errors say so (instead of quoting the instance-metadata service's refusal)."""
    from nczmap.zmap import byteranges

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    assert not byteranges.credentials_found(None)
    assert byteranges.credentials_found("no")  # anonymous: unsigned requests need none
    (tmp_path / "credentials").write_text("[work]\naws_access_key_id = A\naws_secret_access_key = B\n")
    assert byteranges.credentials_found("work") and not byteranges.credentials_found(None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "A")
    assert byteranges.credentials_found(None)
