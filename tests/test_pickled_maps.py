"""Maps travel to other processes (dask workers) by URL: they reopen there, never emptying the dataset."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import nczmap
from nczmap.zmap import MemoryMap


def _dataset(url: str) -> None:
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", 4)
        ds.create_variable("v", ("x",), "i4", data=[1, 2, 3, 4])


def test_a_read_only_map_reopens_read_only(tmp_path):
    url = f"file://{tmp_path}/a#mode=nczarr,file"
    _dataset(url)
    with nczmap.open_map(url) as zmap:
        copy = pickle.loads(pickle.dumps(zmap))
    with copy:
        assert copy.mode == "r"
        assert copy.search("/") == [".zattrs", ".zgroup", "v"]


def test_a_writer_map_reopens_for_update_under_the_writers_lock(tmp_path):
    url = f"file://{tmp_path}/a#mode=nczarr,file"
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", 4)
        variable = ds.create_variable("v", ("x",), "i4", chunks=(2,))
        ds.flush()
        # The copy opens while the original holds the writer lock: "w" would have emptied the dataset.
        with pickle.loads(pickle.dumps(ds.zmap)) as copy:
            assert copy.mode == "r+"
            copy.write("/v/1", np.array([7, 8], "<i4").tobytes())
        variable[:2] = [5, 6]
    with nczmap.open_dataset(url) as ds:
        assert ds.variables["v"][...].tolist() == [5, 6, 7, 8]


def test_a_zip_open_for_writing_refuses_to_travel(tmp_path):
    url = f"{tmp_path}/a.zip#mode=nczarr,zip"
    _dataset(url)
    with nczmap.open_map(url, "r+") as zmap, pytest.raises(nczmap.StorageError, match=r"a\.zip.*zip archive"):
        pickle.dumps(zmap)
    with nczmap.open_map(url) as zmap, pickle.loads(pickle.dumps(zmap)) as copy:
        assert copy.read("/v/0") == zmap.read("/v/0")


def test_a_memory_map_travels_with_its_content():
    zmap = MemoryMap()
    zmap.write("/a/b", b"content")
    copy = pickle.loads(pickle.dumps(zmap))
    zmap.write("/a/b", b"changed")
    assert copy.read("/a/b") == b"content"
    assert copy.search("/a") == ["b"]


def test_an_s3_map_reopens_against_the_same_endpoint(s3_server):
    url = s3_server.url()
    _dataset(url)
    with nczmap.open_map(url) as zmap, pickle.loads(pickle.dumps(zmap)) as copy:
        assert copy.read("/v/0") == np.array([1, 2, 3, 4], "<i4").tobytes()
        assert copy.location == zmap.location


def test_a_manifest_map_keeps_its_authorised_containers(tmp_path):
    source = tmp_path / "data.bin"
    source.write_bytes(np.arange(4, dtype="<i4").tobytes())
    other = tmp_path / "other"
    other.mkdir()
    url = f"{other}/refs.json#mode=zarr,manifest"
    with nczmap.open_map(url, "w", containers=[f"file://{tmp_path}/"]) as zmap:
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
        zmap.set_reference("/raw", f"file://{source}", 4, 8)
    with nczmap.open_map(url, containers=[f"file://{tmp_path}/"]) as zmap:
        copy = pickle.loads(pickle.dumps(zmap))
    with copy:
        assert copy.read("/raw") == np.array([1, 2], "<i4").tobytes()


def test_errors_arrive_whole_from_other_processes():
    for error in (nczmap.EmptyError("/v/0", "/data/x.file"), nczmap.FormatError("bad /v/.zarray")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
    assert pickle.loads(pickle.dumps(nczmap.EmptyError("/v/0"))).key == "/v/0"
