"""Zip format limits a key can hit: a member name holds at most 65,535 bytes (issue 19, C11)."""

from __future__ import annotations

import zipfile

import pytest

from nczmap import KeyNameError, open_map
from nczmap.zmap.zip import MAX_NAME_BYTES

EARLIER = {"/.zgroup": b'{"zarr_format": 2}', "/v/.zarray": b"{}", "/v/0": b"\x01" * 100}


def test_a_key_too_long_for_a_member_name_is_refused_and_loses_nothing(tmp_path):
    path = tmp_path / "ds.zip"
    with open_map(str(path), "w") as zmap:
        for key, data in EARLIER.items():
            zmap.write(key, data)
        long_key = "/" + "k" * 70_000
        with pytest.raises(KeyNameError, match=r"'/kkk.*70001 characters.*at most 65535"):
            zmap.write(long_key, b"lost")
        assert not zmap.exists(long_key)
    with open_map(str(path), "r") as zmap:
        assert {key: zmap.read(key) for key in EARLIER} == EARLIER
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None and all(len(n) < 100 for n in archive.namelist())


def test_the_limit_counts_utf8_bytes_and_the_dataset_folder(tmp_path):
    path = tmp_path / "ds.zip"
    prefix = len("ds/")
    fits = "/" + "é" * ((MAX_NAME_BYTES - prefix) // 2)  # two bytes each: exactly at the limit, or one under
    too_long = "/" + "é" * ((MAX_NAME_BYTES - prefix) // 2 + 1)
    with open_map(str(path), "w") as zmap:
        zmap.write("/.zgroup", b"{}")
        zmap.write(fits, b"fits")
        with pytest.raises(KeyNameError, match="UTF-8"):
            zmap.write(too_long, b"no")
    with open_map(str(path), "r") as zmap:
        assert zmap.read(fits) == b"fits"


def test_updating_an_archive_keeps_it_whole_after_a_refused_key(tmp_path):
    path = tmp_path / "ds.zip"
    with open_map(str(path), "w") as zmap:
        zmap.write("/.zgroup", b"{}")
    with open_map(str(path), "a") as zmap:
        zmap.write("/a", b"new")
        with pytest.raises(KeyNameError):
            zmap.write("/g/" + "x" * 65_531, b"no")  # "ds/g/x...": one byte over
        zmap.write("/b", b"later")
    with open_map(str(path), "r") as zmap:
        assert (zmap.read("/.zgroup"), zmap.read("/a"), zmap.read("/b")) == (b"{}", b"new", b"later")
        assert zmap.search("/") == [".zgroup", "a", "b"]
