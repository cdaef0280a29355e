"""Faults on the s3 driver: each one gives a clear nczmap error in bounded time, and no partial object.

Faults are injected by a counting proxy (``s3proxy.py``) between obstore and moto, by stopping a private
moto server, and by moto's own IAM check (``enable_iam_authentication``) for wrong credentials. Every
operation runs under :func:`bounded`, which fails the test instead of hanging it.
"""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest
from s3proxy import S3Proxy
from s3server import BUCKET, start_server

import nczmap
from nczmap import AccessDenied, DatasetNotFound, KeyNameError, NCZError, StorageError
from nczmap.zmap import byteranges

BOUND = 20.0  # seconds any failing operation may take (the driver: 2 retries within 10 s)
MISSING_BUCKET = "nosuchbucket-nczmap"
NEW_CONTENT = b"new content " * 10  # what writes put over the old /a
KEY_NAMED = {"GET": "'/a'", "LIST": "'/'", "PUT": "'/a'", "POST": "'/a'"}  # the key each error names
SERVER_ERRORS = [(500, "InternalError"), (503, "SlowDown")]
ERROR_KINDS = ["GET", "LIST", "PUT", "POST"]


# -------------------------------------------------------------------------------------------------- helpers
def bounded(function, limit: float = BOUND):
    """``(result, exception, seconds)`` of ``function()``; the test fails if it runs over ``limit``."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = function()
        except BaseException as exc:
            outcome["error"] = exc

    start = time.perf_counter()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(limit)
    elapsed = time.perf_counter() - start
    if worker.is_alive():
        pytest.fail(f"operation still running after {limit:.0f} s (a hang)")
    return outcome.get("result"), outcome.get("error"), elapsed


def fails(function, error: type[NCZError], *names: str, limit: float = BOUND) -> NCZError:
    """Run ``function``, expecting ``error`` within ``limit`` seconds with every one of ``names`` in it."""
    result, exc, elapsed = bounded(function, limit)
    assert exc is not None, f"expected {error.__name__}, got a result: {result!r:.200}"
    assert isinstance(exc, error), f"expected {error.__name__}, got {type(exc).__name__}: {exc}"
    for name in names:
        assert name in str(exc), f"{name!r} not in the message {str(exc)!r}"
    assert elapsed < limit
    return exc


def succeeds(function, limit: float = BOUND):
    result, exc, _ = bounded(function, limit)
    if exc is not None:
        raise exc
    return result


def s3_object(server, key: str) -> bytes | None:
    """The object's content as boto3 sees it directly on moto (None when there is none)."""
    client = server.client()
    try:
        return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None


def _s3_keys(server, root: str) -> list[str]:
    """Every object key under ``root`` as boto3 sees it directly on moto."""
    listing = server.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{root}/")
    return sorted(item["Key"] for item in listing.get("Contents", []))


def _operation(zmap, kind: str):
    """The map call on the ``root`` store whose request of ``kind`` the proxy answers."""
    return {
        "GET": lambda: zmap.read("/a"),
        "LIST": lambda: zmap.search("/"),
        "PUT": lambda: zmap.write("/a", NEW_CONTENT),
        "POST": lambda: zmap.delete("/a"),  # a LIST of what is under /a/, then the bulk delete
    }[kind]


def _statuses(proxy, kind: str) -> list[int]:
    return [entry.status for entry in proxy.log if entry.kind == kind]


# ------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def running_proxy(s3_server):
    proxy = S3Proxy(s3_server.endpoint)
    yield proxy
    proxy.stop()


@pytest.fixture
def proxy(running_proxy):
    running_proxy.clear()
    running_proxy.reset()
    yield running_proxy
    running_proxy.clear()


@pytest.fixture
def root(s3_server, proxy):
    """A small store written through the proxy: ``/.zgroup`` and ``/a`` (the proxy counters start at 0)."""
    name = uuid.uuid4().hex
    with nczmap.open_map(proxy.url(BUCKET, name), "w") as zmap:
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
        zmap.write("/a", b"0123456789" * 100)
    proxy.reset()
    return name


@pytest.fixture
def dataset_root(proxy):
    """A dataset written through the proxy: ``v``, 40 int32 in 4 chunks of 10 (the counters start at 0)."""
    name = uuid.uuid4().hex
    with nczmap.create_dataset(proxy.url(BUCKET, name)) as ds:
        ds.create_dimension("x", 40)
        ds.create_variable("v", ("x",), "i4", data=np.arange(40, dtype="i4"), chunks=(10,))
    proxy.reset()
    return name


@pytest.fixture
def short_timeout(monkeypatch):
    """Client timeouts of 1 s (the driver's 15 s would make stall tests slow); retries stay as shipped."""
    monkeypatch.setattr(byteranges, "CLIENT_OPTIONS", {"timeout": "1s", "connect_timeout": "1s"})


@pytest.fixture
def wrong_credentials(monkeypatch):
    """moto checking signatures (it accepts anything by default) and a key it has never issued."""
    from moto.core.authorization import enable_iam_authentication

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with enable_iam_authentication():
        yield


# ------------------------------------------------------------------------------------------- server stopped
def test_server_stopped_mid_run():
    server = start_server()
    stopped = False
    try:
        name = uuid.uuid4().hex
        url = server.url(name)
        with nczmap.create_dataset(url) as ds:
            ds.create_dimension("x", 40)
            ds.create_variable("v", ("x",), "i4", data=np.arange(40, dtype="i4"), chunks=(10,))
        reader = nczmap.open_dataset(url)
        writer = nczmap.open_map(url, "a")
        assert list(reader.variables["v"][:5]) == [0, 1, 2, 3, 4]
        server.stop()
        stopped = True

        location = f"s3://{BUCKET}/{name}"
        fails(lambda: reader.variables["v"][...], StorageError, "/v/", location)
        fails(lambda: writer.write("/v/9", b"\0" * 40), StorageError, "/v/9", location)
        fails(lambda: writer.search("/"), StorageError, location)
        fails(lambda: nczmap.open_dataset(url), StorageError, location)
        fails(lambda: nczmap.create_dataset(url), StorageError, location)
        reader.close()
        writer.close()
    finally:
        if not stopped:
            server.stop()


def test_server_stopped_while_a_dataset_is_being_written():
    server = start_server()
    stopped = False
    try:
        url = server.url()
        ds = nczmap.create_dataset(url)
        ds.create_dimension("x", 10)
        var = ds.create_variable("v", ("x",), "f8", chunks=(5,))
        server.stop()
        stopped = True

        def write() -> None:
            var[...] = np.arange(10.0)

        fails(write, StorageError, "/v/")
        fails(ds.close, StorageError, "/.z")  # the metadata cannot be flushed either
        assert ds.zmap.closed
    finally:
        if not stopped:
            server.stop()


# ------------------------------------------------------------------------------------------- missing bucket
@pytest.mark.parametrize("mode", ["w", "a", "r+"])
def test_missing_bucket_is_an_error_and_is_not_created(s3_server, proxy, mode):
    url = proxy.url(MISSING_BUCKET, "ds")
    fails(lambda: nczmap.open_map(url, mode), DatasetNotFound, repr(MISSING_BUCKET))
    assert proxy.counts["PUT"] == 0  # no CreateBucket
    assert MISSING_BUCKET not in {b["Name"] for b in s3_server.client().list_buckets()["Buckets"]}


def test_missing_bucket_for_datasets(s3_server, proxy):
    url = proxy.url(MISSING_BUCKET, "ds")
    fails(lambda: nczmap.create_dataset(url), DatasetNotFound, MISSING_BUCKET)
    fails(lambda: nczmap.open_dataset(url), DatasetNotFound, MISSING_BUCKET)
    fails(lambda: nczmap.open_dataset(url, "a"), DatasetNotFound, MISSING_BUCKET)
    assert proxy.counts["PUT"] == 0
    assert MISSING_BUCKET not in {b["Name"] for b in s3_server.client().list_buckets()["Buckets"]}


def test_read_in_missing_bucket_names_the_bucket(proxy):
    zmap = nczmap.open_map(proxy.url(MISSING_BUCKET, "ds"), "r")
    fails(lambda: zmap.read("/.zgroup"), DatasetNotFound, MISSING_BUCKET)


# ---------------------------------------------------------------------------------------------- credentials
def test_wrong_credentials_on_read(proxy, root, wrong_credentials):
    url = proxy.url(BUCKET, root)
    zmap = nczmap.open_map(url, "r")
    fails(lambda: zmap.read("/a"), AccessDenied, "'/a'", root)
    fails(lambda: nczmap.open_dataset(url), AccessDenied, root)
    assert proxy.counts["GET"] == 2  # a refusal is not retried


@pytest.mark.parametrize("mode", ["w", "a", "r+"])
def test_wrong_credentials_on_writable_open(proxy, root, wrong_credentials, mode):
    fails(lambda: nczmap.open_map(proxy.url(BUCKET, root), mode), AccessDenied, root)


def test_wrong_credentials_on_search(proxy, root, wrong_credentials):
    zmap = nczmap.open_map(proxy.url(BUCKET, root), "r")
    fails(lambda: zmap.search("/"), AccessDenied, "'/'", root)
    assert proxy.counts["LIST"] == 1  # not retried either


@pytest.mark.parametrize("kind", ["GET", "LIST", "PUT"])
def test_access_denied_answer(s3_server, proxy, root, kind):
    zmap = nczmap.open_map(proxy.url(BUCKET, root), "a" if kind == "PUT" else "r")
    before = s3_object(s3_server, f"{root}/a")
    proxy.reset()
    proxy.fail(403, code="AccessDenied", kind=kind)
    fails(_operation(zmap, kind), AccessDenied, KEY_NAMED[kind], root, "AccessDenied")
    assert proxy.counts[kind] == 1
    proxy.clear()
    assert s3_object(s3_server, f"{root}/a") == before


# ------------------------------------------------------------------------------------- 500 and 503 answers
@pytest.mark.parametrize("kind", ERROR_KINDS)
@pytest.mark.parametrize(("status", "code"), SERVER_ERRORS)
def test_two_server_errors_are_retried_transparently(s3_server, proxy, root, status, code, kind):
    zmap = nczmap.open_map(proxy.url(BUCKET, root), "a" if kind in ("PUT", "POST") else "r")
    before = s3_object(s3_server, f"{root}/a")
    proxy.reset()
    proxy.fail(status, code=code, times=2, kind=kind)
    result = succeeds(_operation(zmap, kind))
    assert _statuses(proxy, kind) == [status, status, 200]
    expected = {"GET": before, "LIST": [".zgroup", "a"], "PUT": None, "POST": None}[kind]
    assert result == expected
    after = {"GET": before, "LIST": before, "PUT": NEW_CONTENT, "POST": None}[kind]
    assert s3_object(s3_server, f"{root}/a") == after


@pytest.mark.parametrize("kind", ERROR_KINDS)
@pytest.mark.parametrize(("status", "code"), SERVER_ERRORS)
def test_persistent_server_error_is_a_storage_error_after_three_attempts(
    s3_server, proxy, root, status, code, kind
):
    zmap = nczmap.open_map(proxy.url(BUCKET, root), "a" if kind in ("PUT", "POST") else "r")
    before = s3_object(s3_server, f"{root}/a")
    proxy.reset()
    proxy.fail(status, code=code, kind=kind)
    fails(_operation(zmap, kind), StorageError, KEY_NAMED[kind], root, code)
    assert _statuses(proxy, kind) == [status] * 3  # the first attempt and the driver's 2 retries
    proxy.clear()
    assert s3_object(s3_server, f"{root}/a") == before  # a failed write or delete changed nothing


@pytest.mark.parametrize(("start", "count"), [(0, None), (0, 10)])
def test_persistent_error_on_a_key_containing_416_is_not_read_as_empty(s3_server, proxy, root, start, count):
    s3_server.client().put_object(Bucket=BUCKET, Key=f"{root}/v416", Body=b"0123456789" * 3)
    zmap = nczmap.open_map(proxy.url(BUCKET, root), "r")
    proxy.fail(500, kind="GET")
    fails(lambda: zmap.read("/v416", start, count), StorageError, "'/v416'", root)


# ---------------------------------------------------------------------------------------- truncated answers
RANGES = [(0, None), (5, 500)]


@pytest.mark.parametrize(("start", "count"), RANGES)
def test_one_truncated_read_is_resumed(s3_server, proxy, root, start, count):
    content = s3_object(s3_server, f"{root}/a")
    zmap = nczmap.open_map(proxy.url(BUCKET, root), "r")
    proxy.truncate(times=1)
    data = succeeds(lambda: zmap.read("/a", start, count))
    assert data == content[start : None if count is None else start + count]
    statuses = _statuses(proxy, "GET")
    assert statuses[0] < 0 and statuses[-1] == 206  # cut short, then the rest asked for by range


@pytest.mark.parametrize(("start", "count"), RANGES)
def test_persistently_truncated_read_is_a_storage_error(proxy, root, start, count):
    zmap = nczmap.open_map(proxy.url(BUCKET, root), "r")
    proxy.truncate()
    fails(lambda: zmap.read("/a", start, count), StorageError, "'/a'", root)
    assert len(proxy.log) == 3 and all(entry.status < 0 for entry in proxy.log)


def test_truncated_listing_is_a_storage_error(proxy, root):
    url = proxy.url(BUCKET, root)
    zmap = nczmap.open_map(url, "r")
    proxy.truncate(kind="LIST")
    fails(lambda: zmap.search("/"), StorageError, "'/'", root)
    fails(lambda: nczmap.open_map(url, "a"), StorageError, root)  # the writable open's listing


def test_truncated_chunks_of_a_variable_read_are_a_storage_error(proxy, dataset_root):
    ds = succeeds(lambda: nczmap.open_dataset(proxy.url(BUCKET, dataset_root)))
    proxy.truncate(path=r"/v/\d+$")
    fails(lambda: ds.variables["v"][...], StorageError, "/v/", dataset_root)
    fails(lambda: ds.variables["v"][12:14], StorageError, "'/v/1'", dataset_root)
    proxy.clear()
    assert succeeds(lambda: ds.variables["v"][...]).tolist() == list(range(40))


def test_truncated_zarray_during_open_is_a_storage_error(proxy, dataset_root):
    proxy.truncate(path=r"/v/\.zarray$")
    fails(lambda: nczmap.open_dataset(proxy.url(BUCKET, dataset_root)), StorageError, "/v/.zarray")
    assert _statuses(proxy, "GET").count(-200) + _statuses(proxy, "GET").count(-206) == 3


# ------------------------------------------------------------------------------------------------- stalls
STALL = 3.0  # seconds the proxy holds a request: longer than the 1 s client timeout


@pytest.mark.parametrize("kind", ["GET", "LIST", "PUT"])
def test_one_stall_is_retried(s3_server, proxy, root, short_timeout, kind):
    zmap = nczmap.open_map(proxy.url(BUCKET, root), "a" if kind == "PUT" else "r")
    proxy.reset()
    proxy.stall(STALL, times=1, kind=kind)
    succeeds(_operation(zmap, kind))
    assert _statuses(proxy, kind) == [0, 200]
    if kind == "PUT":
        assert s3_object(s3_server, f"{root}/a") == NEW_CONTENT


@pytest.mark.parametrize("kind", ["GET", "LIST", "PUT"])
def test_persistent_stall_fails_quickly(s3_server, proxy, root, short_timeout, kind):
    zmap = nczmap.open_map(proxy.url(BUCKET, root), "a" if kind == "PUT" else "r")
    before = s3_object(s3_server, f"{root}/a")
    proxy.reset()
    proxy.stall(STALL, kind=kind)
    start = time.perf_counter()
    fails(_operation(zmap, kind), StorageError, KEY_NAMED[kind], root, limit=8.0)
    assert time.perf_counter() - start < 8.0  # 3 attempts of 1 s and the back-off, not the 15 s timeout
    assert _statuses(proxy, kind) == [0, 0, 0]
    proxy.clear()
    assert s3_object(s3_server, f"{root}/a") == before


# ------------------------------------------------------------------------------------- no partial objects
@pytest.mark.parametrize("fault", ["500", "drop"])
def test_failed_put_leaves_the_old_object_and_no_new_key(s3_server, proxy, root, fault):
    zmap = nczmap.open_map(proxy.url(BUCKET, root), "a")
    before = s3_object(s3_server, f"{root}/a")
    keys = _s3_keys(s3_server, root)
    proxy.reset()
    if fault == "drop":
        proxy.drop(kind="PUT")  # the proxy has read the whole body when it hangs up
    else:
        proxy.fail(500, kind="PUT")
    fails(lambda: zmap.write("/a", NEW_CONTENT), StorageError, "'/a'", root)
    fails(lambda: zmap.write("/b", NEW_CONTENT), StorageError, "'/b'", root)
    assert _statuses(proxy, "PUT") == [0 if fault == "drop" else 500] * 6
    proxy.clear()
    assert s3_object(s3_server, f"{root}/a") == before
    assert _s3_keys(s3_server, root) == keys
    assert not zmap.exists("/b") and zmap.len("/a") == len(before)  # the map's own view agrees


def test_failed_chunk_write_leaves_every_chunk_whole(s3_server, proxy, dataset_root):
    url = proxy.url(BUCKET, dataset_root)
    old = np.arange(40, dtype="<i4").reshape(4, 10)
    new = old + 100
    ds = succeeds(lambda: nczmap.open_dataset(url, "a"))
    proxy.fail(500, method="PUT", path=r"/v/2$")

    def write() -> None:
        ds.variables["v"][...] = new.ravel()

    fails(write, StorageError, "'/v/2'", dataset_root)
    proxy.clear()
    succeeds(ds.close)
    for index in range(4):
        chunk = np.frombuffer(s3_object(s3_server, f"{dataset_root}/v/{index}"), "<i4")
        assert chunk.tolist() in (old[index].tolist(), new[index].tolist()), f"chunk {index}: {chunk}"
    assert s3_object(s3_server, f"{dataset_root}/v/2") == old[2].tobytes()
    values = succeeds(lambda: nczmap.open_dataset(url).variables["v"][...]).reshape(4, 10)
    for index in range(4):
        assert values[index].tolist() in (old[index].tolist(), new[index].tolist())


# ------------------------------------------------------------------------------------------- key lengths
def _long_key(root: str, nbytes: int, fill: str = "k") -> str:
    """A zmap key whose S3 object key (``root`` + key) is exactly ``nbytes`` UTF-8 bytes, mostly ``fill``."""
    budget = nbytes - len(root.encode()) - 1  # the key's leading "/" follows the root
    body = fill * (budget // len(fill.encode()))
    body += "k" * (budget - len(body.encode()))
    key = "/" + body
    assert len((root + key).encode()) == nbytes
    return key


@pytest.mark.parametrize("fill", ["k", "é", "水"])
def test_keys_of_1024_bytes_are_accepted_and_1025_refused_before_any_request(s3_server, proxy, root, fill):
    zmap = nczmap.open_map(proxy.url(BUCKET, root), "a")
    longest = _long_key(root, 1024, fill)
    succeeds(lambda: zmap.write(longest, b"x"))
    assert succeeds(lambda: zmap.read(longest)) == b"x"
    assert s3_object(s3_server, root + longest) == b"x"
    assert longest[1:] in succeeds(lambda: zmap.search("/"))

    proxy.reset()
    too_long = _long_key(root, 1025, fill)
    for call in (
        lambda: zmap.write(too_long, b"x"),
        lambda: zmap.read(too_long),
        lambda: zmap.len(too_long),
        lambda: zmap.exists(too_long),
        lambda: zmap.search(too_long),
        lambda: zmap.delete(too_long),
    ):
        fails(call, KeyNameError, "1024", "1025")
    assert proxy.total() == 0


@pytest.mark.parametrize(
    ("mode", "method"), [("r", "len"), ("r", "exists"), ("a", "read"), ("a", "len"), ("a", "exists")]
)
def test_every_access_refuses_long_keys_with_key_name_error(proxy, root, mode, method):
    zmap = nczmap.open_map(proxy.url(BUCKET, root), mode)
    proxy.reset()
    fails(lambda: getattr(zmap, method)(_long_key(root, 1025)), KeyNameError, "1024")
    assert proxy.total() == 0
