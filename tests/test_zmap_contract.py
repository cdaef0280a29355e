"""The zmap contract (netcdf-c zmap.h semantics, nczarr-format.md §1), run on every driver."""

from __future__ import annotations

import numpy as np
import pytest

from nczmap import EmptyError, KeyNameError, ReadOnlyError, StorageError
from nczmap.errors import DataError, KeyConflictError, RangeError
from nczmap.zmap.keys import TEMP_PREFIX

BAD_KEYS = ["/a/../b", "..", "/./a", "/a//b", "a/", "/a\x00b", "/a\nb", "/\x7f", f"/{TEMP_PREFIX}x", "/a/."]


def test_empty_map_has_no_content(zmap):
    assert zmap.search("/") == []
    assert not zmap.exists("/.zgroup")
    with pytest.raises(EmptyError):
        zmap.len("/.zgroup")
    with pytest.raises(EmptyError):
        zmap.read("/.zgroup")


def test_zero_length_object_is_content_bearing(zmap):
    zmap.write("/.zgroup", b"")
    assert zmap.exists("/.zgroup")
    assert zmap.len("/.zgroup") == 0
    assert zmap.read("/.zgroup") == b""
    assert zmap.search("/") == [".zgroup"]


def test_write_read_len(zmap):
    zmap.write("/v/0.0", b"0123456789")
    assert zmap.read("/v/0.0") == b"0123456789"
    assert zmap.len("/v/0.0") == 10
    assert zmap.exists("/v/0.0")


def test_overwrite_with_shorter_content_truncates(zmap):
    # netcdf-c bug 1: '{"zarr_format": 2}' then '{}' left '{}zarr_format": 2}' on the file driver
    zmap.write("/.zgroup", b'{"zarr_format": 2}')
    zmap.write("/.zgroup", b"{}")
    assert zmap.read("/.zgroup") == b"{}"
    assert zmap.len("/.zgroup") == 2


@pytest.mark.parametrize(
    ("start", "count", "expected"),
    [(0, None, b"0123456789"), (3, 4, b"3456"), (8, 10, b"89"), (10, 5, b""), (25, None, b""), (0, 0, b"")],
)
def test_byte_ranges(zmap, start, count, expected):
    zmap.write("/data1/0", b"0123456789")
    assert zmap.read("/data1/0", start, count) == expected


@pytest.mark.parametrize(("start", "count"), [(-1, None), (0, -1)])
def test_negative_ranges_are_refused(zmap, start, count):
    zmap.write("/x", b"abc")
    with pytest.raises(RangeError, match="/x"):
        zmap.read("/x", start, count)


def test_directory_keys_have_no_content(zmap):
    zmap.write("/g/v/.zarray", b"{}")
    for key in ("/g", "/g/v", "/", "/nothing"):
        assert not zmap.exists(key)
        with pytest.raises(EmptyError):
            zmap.len(key)
        with pytest.raises(EmptyError):
            zmap.read(key)


def test_search_lists_immediate_children_bytewise_sorted(zmap):
    for key in ("/.zgroup", "/z/.zarray", "/é/.zarray", "/a/b/.zarray", "/a/b/0.0", "/B", "/_x"):
        zmap.write(key, b"x")
    assert zmap.search("/") == [".zgroup", "B", "_x", "a", "z", "é"]
    assert zmap.search("/a") == ["b"]
    assert zmap.search("/a/b") == [".zarray", "0.0"]
    assert zmap.search("/a/b/0.0") == []
    assert zmap.search("/absent") == []


@pytest.mark.parametrize(("left", "right"), [("", "/"), ("/a/", "/a"), ("a", "/a")])
def test_equivalent_prefixes(zmap, left, right):
    zmap.write("/a/b", b"1")
    assert zmap.search(left) == zmap.search(right)


def test_keys_without_leading_slash(zmap):
    zmap.write("v/.zarray", b"{}")
    assert zmap.read("/v/.zarray") == b"{}"
    assert zmap.exists("v/.zarray")


@pytest.mark.parametrize("key", BAD_KEYS)
def test_illegal_keys_are_refused_everywhere(zmap, key):
    for call in (
        lambda: zmap.write(key, b"x"),
        lambda: zmap.read(key),
        lambda: zmap.exists(key),
        lambda: zmap.len(key),
        lambda: zmap.delete(key),
    ):
        with pytest.raises(KeyNameError, match="illegal key"):
            call()


def test_search_refuses_escaping_prefix(zmap):
    with pytest.raises(KeyNameError):
        zmap.search("/../..")


def test_non_string_key(zmap):
    with pytest.raises(KeyNameError):
        zmap.read(b"/x")  # type: ignore[arg-type]


def test_objects_are_leaves(zmap):
    zmap.write("/a", b"1")
    with pytest.raises(KeyConflictError, match="'/a' is an object"):
        zmap.write("/a/b", b"2")
    zmap.write("/d/e", b"3")
    with pytest.raises(KeyConflictError, match="directory"):
        zmap.write("/d", b"4")
    assert zmap.read("/a") == b"1"
    assert zmap.read("/d/e") == b"3"


def test_write_accepts_buffers(zmap):
    array = np.arange(6, dtype="<i4").reshape(2, 3)
    zmap.write("/v/0.0", array)
    zmap.write("/v/0.1", bytearray(b"ab"))
    zmap.write("/v/0.2", memoryview(b"cd"))
    assert zmap.read("/v/0.0") == array.tobytes()
    assert zmap.read("/v/0.1") == b"ab"
    assert zmap.read("/v/0.2") == b"cd"


@pytest.mark.parametrize("data", ["text", 42, None, np.arange(10)[::2]])
def test_write_refuses_non_buffers(zmap, data):
    with pytest.raises(DataError, match="/k"):
        zmap.write("/k", data)
    assert not zmap.exists("/k")


def test_root_cannot_be_written(zmap):
    with pytest.raises(DataError):
        zmap.write("/", b"x")


def test_delete_object_prunes_empty_directories(zmap):
    zmap.write("/g/v/.zarray", b"{}")
    zmap.write("/.zgroup", b"{}")
    zmap.delete("/g/v/.zarray")
    assert zmap.search("/") == [".zgroup"]
    assert zmap.search("/g") == []


def test_delete_subtree(zmap):
    for key in ("/g/v/.zarray", "/g/v/0", "/g/w/.zarray", "/h"):
        zmap.write(key, b"x")
    zmap.delete("/g/v")
    assert zmap.search("/g") == ["w"]
    zmap.delete("/g")
    assert zmap.search("/") == ["h"]


def test_delete_absent_key_is_a_no_op(zmap):
    zmap.write("/a", b"1")
    zmap.delete("/b/c")
    zmap.delete("/a/b")
    assert zmap.read("/a") == b"1"


def test_truncate_removes_everything(zmap):
    zmap.write("/.zgroup", b"{}")
    zmap.write("/v/0", b"1")
    zmap.truncate()
    assert zmap.search("/") == []
    zmap.write("/.zgroup", b"{}")
    assert zmap.search("/") == [".zgroup"]


def test_delete_root_is_truncate(zmap):
    zmap.write("/v/0", b"1")
    zmap.delete("/")
    assert zmap.search("/") == []


def test_walk_is_preorder_sorted(zmap):
    for key in ("/v/0.0", "/.zgroup", "/v/.zarray", "/a/b/c"):
        zmap.write(key, b"x")
    assert list(zmap.walk()) == ["/.zgroup", "/a", "/a/b", "/a/b/c", "/v", "/v/.zarray", "/v/0.0"]
    assert list(zmap.objects()) == ["/.zgroup", "/a/b/c", "/v/.zarray", "/v/0.0"]


def test_contents_survive_reopening(factory):
    zmap = factory.open("w")
    zmap.write("/.zgroup", b'{"zarr_format": 2}')
    zmap.write("/v/0.0", bytes(range(256)))
    zmap.write("/gone", b"x")
    zmap.delete("/gone")
    zmap = factory.reopen(zmap, "r")
    assert zmap.search("/") == [".zgroup", "v"]
    assert zmap.read("/v/0.0", 250) == bytes(range(250, 256))


def test_read_only_map_refuses_changes(factory):
    if not factory.persistent:
        pytest.skip("memory maps are opened writable")
    factory.open("w").close()
    zmap = factory.open("r")
    for call in (lambda: zmap.write("/x", b"1"), lambda: zmap.delete("/x"), zmap.truncate):
        with pytest.raises(ReadOnlyError, match="read-only"):
            call()


def test_closed_map_refuses_everything(zmap):
    zmap.close()
    with pytest.raises(StorageError, match="closed"):
        zmap.read("/x")
    with pytest.raises(StorageError, match="closed"):
        zmap.search("/")
    zmap.close()  # closing twice is harmless


def test_unicode_keys_round_trip(factory):
    zmap = factory.open("w")
    zmap.write("/température/.zarray", "°C".encode())
    zmap = factory.reopen(zmap, "r")
    assert zmap.search("/") == ["température"]
    assert zmap.read("/température/.zarray").decode() == "°C"


def test_copy_from_any_map(zmap):
    from nczmap.zmap import MemoryMap

    source = MemoryMap()
    source.write("/a/b", b"payload")
    assert zmap.copy_from(source, "/a/b", "/c")
    assert not zmap.copy_from(source, "/a/none", "/d")
    assert zmap.read("/c") == b"payload"
    assert not zmap.exists("/d")
