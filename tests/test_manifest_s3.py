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
