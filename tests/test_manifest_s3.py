"""Manifests and references on S3 (moto on 127.0.0.1): authorised buckets only, few requests."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
from kerchunk_refs import array_refs
from s3proxy import S3Proxy
from s3server import BUCKET

import nczmap
from nczmap import AccessDenied

CHUNKS, CHUNK_BYTES = 256, 16 << 10


@pytest.fixture
def proxy(s3_server):
    with S3Proxy(s3_server.endpoint) as running:
        yield running


def _array_refs(data_url: str) -> dict:
    return array_refs(data_url, CHUNKS, CHUNK_BYTES)


def _upload(s3_server, prefix: str) -> np.ndarray:
    values = np.arange(CHUNKS * CHUNK_BYTES // 8, dtype="<f8")
    s3_server.client().put_object(Bucket=BUCKET, Key=f"{prefix}/data.bin", Body=values.tobytes())
    return values


def test_references_into_an_s3_object_take_few_requests(s3_server, proxy, tmp_path):
    prefix = uuid.uuid4().hex
    values = _upload(s3_server, prefix)
    (tmp_path / "refs.json").write_text(json.dumps(_array_refs(f"s3://{BUCKET}/{prefix}/data.bin")))
    url = (tmp_path / "refs.json").as_uri() + "#mode=zarr,manifest"
    grant = {f"s3://{BUCKET}/{prefix}/": {"endpoint": proxy.endpoint, "region": "us-east-1"}}
    proxy.reset()
    with nczmap.open_dataset(url, containers=grant) as ds:
        assert np.array_equal(ds.variables["v"][...], values)
    requests = proxy.total()
    assert requests * 20 <= CHUNKS, f"{requests} requests for {CHUNKS} chunks: {proxy.snapshot()}"


def test_an_s3_bucket_prefix_not_granted_is_refused_before_any_request(s3_server, proxy, tmp_path):
    prefix = uuid.uuid4().hex
    _upload(s3_server, prefix)
    (tmp_path / "refs.json").write_text(json.dumps(_array_refs(f"s3://{BUCKET}/{prefix}/data.bin")))
    url = (tmp_path / "refs.json").as_uri() + "#mode=zarr,manifest"
    other = {f"s3://{BUCKET}/{prefix}-other/": {"endpoint": proxy.endpoint}}
    proxy.reset()
    with nczmap.open_dataset(url, containers=other) as ds, pytest.raises(AccessDenied, match="--allow"):
        ds.variables["v"][...]
    assert proxy.total() == 0


def test_a_manifest_stored_on_s3_reads_references_beside_it(s3_server, proxy):
    prefix = uuid.uuid4().hex
    values = _upload(s3_server, prefix)
    refs = _array_refs(f"s3://{BUCKET}/{prefix}/data.bin")
    s3_server.client().put_object(Bucket=BUCKET, Key=f"{prefix}/refs.json", Body=json.dumps(refs).encode())
    url = f"{proxy.endpoint}/{BUCKET}/{prefix}/refs.json#mode=zarr,manifest"
    with nczmap.open_dataset(url) as ds:
        assert np.array_equal(ds.variables["v"][...], values)
        assert ds.variables["v"].dimensions == ("x",)


# ------------------------------------------------------------------ coalesced reads of one object
def _raw_object(s3_server, prefix: str, size: int) -> bytes:
    data = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8).tobytes()
    s3_server.client().put_object(Bucket=BUCKET, Key=f"{prefix}/data.bin", Body=data)
    return data


def _read_many(tmp_path, proxy, prefix: str, refs: dict[str, list]) -> list[bytes]:
    """``read_many_into`` of every key of ``refs`` (``{key: [url, offset, length]}``), through the proxy."""
    (tmp_path / "refs.json").write_text(json.dumps({"version": 1, "refs": refs}))
    url = (tmp_path / "refs.json").as_uri() + "#mode=zarr,manifest"
    grant = {f"s3://{BUCKET}/{prefix}/": {"endpoint": proxy.endpoint, "region": "us-east-1"}}
    buffers = {key: bytearray(ref[2]) for key, ref in refs.items()}
    with nczmap.open_map(url, "r", containers=grant) as zmap:
        proxy.reset()
        got = zmap.read_many_into([(key, memoryview(buffer)) for key, buffer in buffers.items()])
    assert got == [ref[2] for ref in refs.values()]
    return [bytes(buffer) for buffer in buffers.values()]


def test_a_whole_array_read_of_one_object_is_one_get(s3_server, proxy, tmp_path):
    # 256 shuffled references, 4 MiB: one HEAD, one range GET streamed into the chunks, right values
    prefix = uuid.uuid4().hex
    values = _upload(s3_server, prefix)
    (tmp_path / "refs.json").write_text(json.dumps(_array_refs(f"s3://{BUCKET}/{prefix}/data.bin")))
    url = (tmp_path / "refs.json").as_uri() + "#mode=zarr,manifest"
    grant = {f"s3://{BUCKET}/{prefix}/": {"endpoint": proxy.endpoint, "region": "us-east-1"}}
    with nczmap.open_dataset(url, containers=grant) as ds:
        proxy.reset()
        assert np.array_equal(ds.variables["v"][...], values)
    assert proxy.snapshot() == {"HEAD": 1, "LIST": 0, "GET": 1, "PUT": 0, "POST": 0, "DELETE": 0}
    (entry,) = [e for e in proxy.log if e.kind == "GET"]
    assert entry.status == 206


def test_spans_longer_than_the_limit_are_split(s3_server, proxy, tmp_path, monkeypatch):
    from nczmap.zmap import manifest_sources

    monkeypatch.setattr(manifest_sources.ObjectSource, "max_span", 1 << 20)
    prefix = uuid.uuid4().hex
    data = _raw_object(s3_server, prefix, 4 << 20)
    source = f"s3://{BUCKET}/{prefix}/data.bin"
    refs = {f"v/{i}": [source, i << 16, 1 << 16] for i in range(64)}
    assert _read_many(tmp_path, proxy, prefix, refs) == [data[i << 16 : (i + 1) << 16] for i in range(64)]
    assert proxy.counts["GET"] == 4  # 1 MiB spans


@pytest.mark.parametrize("piece", [1, 4099, 1 << 20])
def test_a_streamed_span_fills_gaps_overlaps_and_odd_pieces(s3_server, proxy, tmp_path, monkeypatch, piece):
    # references with gaps between them, overlapping each other, nested, empty, in any order, and body
    # pieces that cut through them anywhere: every buffer gets exactly its bytes, from one GET
    from nczmap.zmap import manifest_sources

    monkeypatch.setattr(manifest_sources, "STREAM_PIECE", piece)
    prefix = uuid.uuid4().hex
    data = _raw_object(s3_server, prefix, 3 << 20)
    source = f"s3://{BUCKET}/{prefix}/data.bin"
    ranges = [(i * 7001 + (i % 5) * 333, 5000 + (i * 977) % 9000) for i in range(300)]  # gaps, overlaps
    ranges += [(10_000, 100_000), (10_500, 10), (2_000_000, 0), (len(data) - 1, 1), (0, 1)]
    order = np.random.default_rng(5).permutation(len(ranges))
    refs = {f"v/{int(i)}": [source, *ranges[int(i)]] for i in order}
    got = _read_many(tmp_path, proxy, prefix, refs)
    assert got == [data[ref[1] : ref[1] + ref[2]] for ref in refs.values()]
    assert proxy.counts["GET"] == 1


def test_empty_references_alone_ask_for_nothing(s3_server, proxy, tmp_path):
    prefix = uuid.uuid4().hex
    _raw_object(s3_server, prefix, 4 << 20)
    source = f"s3://{BUCKET}/{prefix}/data.bin"
    refs = {"v/0": [source, 1000, 0], "v/1": [source, 3 << 20, 0]}  # farther apart than REMOTE_GAP
    assert _read_many(tmp_path, proxy, prefix, refs) == [b"", b""]
    assert proxy.counts["GET"] == 0


def test_a_span_cut_short_is_an_error_never_short_chunks(s3_server, proxy, tmp_path):
    from nczmap import StorageError

    prefix = uuid.uuid4().hex
    _raw_object(s3_server, prefix, 2 << 20)
    source = f"s3://{BUCKET}/{prefix}/data.bin"
    refs = {f"v/{i}": [source, i << 15, 1 << 15] for i in range(64)}
    (tmp_path / "refs.json").write_text(json.dumps({"version": 1, "refs": refs}))
    url = (tmp_path / "refs.json").as_uri() + "#mode=zarr,manifest"
    grant = {f"s3://{BUCKET}/{prefix}/": {"endpoint": proxy.endpoint, "region": "us-east-1"}}
    with nczmap.open_map(url, "r", containers=grant) as zmap:
        zmap.exists("/v/0")
        proxy.truncate(kind="GET")  # every GET: half its body, then the connection closes
        buffers = [memoryview(bytearray(1 << 15)) for _ in refs]
        with pytest.raises(StorageError, match=r"data\.bin"):
            zmap.read_many_into(list(zip(refs, buffers, strict=True)))
    proxy.clear()


def test_an_object_larger_than_a_local_span_is_still_one_get(s3_server, proxy, tmp_path):
    # 72 MiB: past the 64 MiB a local (or non-streaming) span may hold, one request on S3
    prefix = uuid.uuid4().hex
    size, count = 72 << 20, 1152
    data = _raw_object(s3_server, prefix, size)
    source = f"s3://{BUCKET}/{prefix}/data.bin"
    step = size // count
    refs = {f"v/{i}": [source, i * step, step] for i in np.random.default_rng(1).permutation(count).tolist()}
    got = _read_many(tmp_path, proxy, prefix, refs)
    assert all(chunk == data[ref[1] : ref[1] + step] for chunk, ref in zip(got, refs.values(), strict=True))
    assert proxy.counts["GET"] == 1
