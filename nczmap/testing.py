"""The zmap contract as a reusable pytest suite, for driver authors (like ``zarr.testing.store.StoreTests``).

The contract is written at the top of :mod:`nczmap.zmap.base`; these classes check it on a real driver. They
are split so that a read-only driver runs the read half unchanged:

- :class:`ReadContract` checks everything a map opened read-only must do. A subclass implements
  :meth:`ReadContract.open_seeded`, which returns a map opened **read-only** holding exactly the objects it is
  given. How they get there is the subclass's choice: a writable driver writes them with itself (mode ``"w"``)
  and reopens with mode ``"r"``; a read-only driver writes its own source format. No read test writes to the
  map under test (except to check that writing is refused).
- :class:`WriteContract` checks writes, deletes, truncation and persistence. A subclass implements
  :meth:`WriteContract.open_writable` (a new, empty dataset) and :meth:`WriteContract.reopen` (close a map and
  open its dataset again, for persistence checks; a non-persistent map may return itself).

Both are plain classes whose names do not start with ``Test``, so pytest collects only the subclasses. A
writable driver subclasses both::

    import itertools

    import pytest

    from nczmap import open_map
    from nczmap.testing import ReadContract, WriteContract


    class TestMyDriver(ReadContract, WriteContract):
        @pytest.fixture(autouse=True)
        def _place(self, tmp_path):
            self.names = (tmp_path / f"ds{n}.my" for n in itertools.count())

        def new_url(self) -> str:
            return next(self.names).as_uri() + "#mode=nczarr,mydriver"

        def open_seeded(self, objects):
            url = self.new_url()
            with open_map(url, "w") as writer:
                for key, data in objects.items():
                    writer.write(key, data)
            return open_map(url, "r")

        def open_writable(self, mode="w"):
            return open_map(self.new_url(), mode)

        def reopen(self, zmap, mode):
            zmap.close()
            return open_map(zmap.url, mode)

Maps returned by these hooks are closed after each test (closing twice is harmless); the subclass closes
anything else it opens, such as a seeding writer. A driver whose class says ``listable = False`` has the
tests that need ``search`` (and ``walk``/``objects``) skipped. ``known_violations`` maps test names (or one
parametrised case, ``"test_name[id]"``) to the reason a driver is known to break that part of the contract:
those tests are expected to fail, strictly, so a fixed driver makes them fail until the entry is removed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import numpy as np
import pytest

from nczmap.errors import (
    DataError,
    DatasetNotFound,
    EmptyError,
    KeyConflictError,
    KeyNameError,
    RangeError,
    ReadOnlyError,
    StorageError,
)
from nczmap.zmap.base import Latency, ZMap
from nczmap.zmap.keys import TEMP_PREFIX
from nczmap.zmap.memory import MemoryMap

__all__ = ["BAD_KEYS", "ReadContract", "WriteContract"]

# Keys no driver may accept (netcdf-c zmap key rules, nczarr-format.md §1).
BAD_KEYS = ["/a/../b", "..", "/./a", "/a//b", "a/", "/a\x00b", "/a\nb", "/\x7f", f"/{TEMP_PREFIX}x", "/a/."]
# The same as prefixes for search, where one trailing "/" is allowed ("a/" means "/a").
BAD_PREFIXES = [key for key in BAD_KEYS if key != "a/"] + ["/../.."]
NON_STR_KEYS = [b"/x", None, 1]
TEN = b"0123456789"
# (start, count, expected) reading TEN: a range is cut short like a Python slice.
BYTE_RANGES = [(0, None, TEN), (3, 4, b"3456"), (8, 10, b"89"), (10, 5, b""), (25, None, b""), (0, 0, b"")]
# Keys without content once "/g/v/.zarray" exists: directories, the root, absent keys, keys under an object.
EMPTY_KEYS = ["/g", "/g/v", "/", "/nothing", "/g/v/.zarray/x"]
SEARCH_KEYS = ("/.zgroup", "/z/.zarray", "/é/.zarray", "/a/b/.zarray", "/a/b/0.0", "/B", "/_x")
WALK_KEYS = ("/v/0.0", "/.zgroup", "/v/.zarray", "/a/b/c")


def assert_no_content(zmap: ZMap, key: str) -> None:
    """``key`` names nothing with content: ``exists`` says so, ``len``/``read``/``read_into`` raise
    :class:`EmptyError` (netcdf-c's NC_EEMPTY)."""
    assert not zmap.exists(key)
    with pytest.raises(EmptyError):
        zmap.len(key)
    with pytest.raises(EmptyError):
        zmap.read(key)
    with pytest.raises(EmptyError):
        zmap.read_into(key, memoryview(bytearray(4)))


class _Contract:
    """What both halves share: closing the maps a test opened, listability, known violations."""

    known_violations: ClassVar[Mapping[str, str]] = {}

    @pytest.fixture(autouse=True)
    def _zmap_contract(self, request: pytest.FixtureRequest) -> None:
        self._opened: list[ZMap] = []
        request.addfinalizer(self._close_opened)
        unknown = [
            name for name in self.known_violations if not callable(getattr(self, name.split("[")[0], None))
        ]
        if unknown:
            pytest.fail(f"known_violations names tests that do not exist: {', '.join(unknown)}")
        reason = self.known_violations.get(
            request.node.name, self.known_violations.get(request.node.originalname)
        )
        if reason is not None:
            request.applymarker(pytest.mark.xfail(reason=reason, strict=True))

    def _close_opened(self) -> None:
        failure: BaseException | None = None
        for zmap in reversed(self._opened):
            try:
                zmap.close()
            except BaseException as exc:  # close the rest, then report the first failure
                failure = failure or exc
        self._opened.clear()
        if failure is not None:
            raise failure

    def _track(self, zmap: ZMap) -> ZMap:
        assert isinstance(zmap, ZMap), f"the contract hooks must return a ZMap, not {type(zmap).__name__}"
        self._opened.append(zmap)
        return zmap

    @staticmethod
    def require_listable(zmap: ZMap) -> None:
        """Skip the running test when the map's driver cannot list keys."""
        if not type(zmap).listable:
            pytest.skip(f"the {zmap.driver} driver declares listable = False: search is not available")


class ReadContract(_Contract):
    """Read tests for any driver; the subclass supplies :meth:`open_seeded`."""

    def open_seeded(self, objects: dict[str, bytes]) -> ZMap:
        """A map opened read-only holding exactly ``objects`` (keys with a leading ``/``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement open_seeded(objects)")

    def seeded(self, objects: Mapping[str, bytes] | None = None) -> ZMap:
        """:meth:`open_seeded`, closed after the test."""
        return self._track(self.open_seeded(dict(objects or {})))

    # ------------------------------------------------------------------ objects and their content
    def test_capabilities_are_declared(self) -> None:
        zmap = self.seeded()
        cls = type(zmap)
        assert isinstance(cls.driver, str) and cls.driver
        assert isinstance(cls.writable, bool)
        assert isinstance(cls.listable, bool)
        assert isinstance(cls.latency, Latency)
        assert isinstance(zmap.io_width, int) and zmap.io_width >= 1

    def test_map_is_read_only(self) -> None:
        zmap = self.seeded({"/.zgroup": b"{}"})
        assert zmap.readonly
        assert not zmap.closed

    def test_empty_store_has_no_content(self) -> None:
        zmap = self.seeded()
        assert not zmap.exists("/.zgroup")
        with pytest.raises(EmptyError):
            zmap.len("/.zgroup")
        with pytest.raises(EmptyError):
            zmap.read("/.zgroup")

    def test_empty_store_lists_nothing(self) -> None:
        zmap = self.seeded()
        self.require_listable(zmap)
        assert zmap.search("/") == []
        assert list(zmap.walk()) == []
        assert list(zmap.objects()) == []

    def test_zero_length_object_is_content_bearing(self) -> None:
        zmap = self.seeded({"/.zgroup": b""})
        assert zmap.exists("/.zgroup")
        assert zmap.len("/.zgroup") == 0
        assert zmap.read("/.zgroup") == b""
        assert zmap.read("/.zgroup", 0, 0) == b""
        assert zmap.read("/.zgroup", 5) == b""
        assert zmap.read_into("/.zgroup", memoryview(bytearray(4))) == 0

    def test_zero_length_object_is_listed(self) -> None:
        zmap = self.seeded({"/.zgroup": b""})
        self.require_listable(zmap)
        assert zmap.search("/") == [".zgroup"]

    def test_read_len_exists(self) -> None:
        zmap = self.seeded({"/v/0.0": TEN})
        assert zmap.read("/v/0.0") == TEN
        assert zmap.len("/v/0.0") == len(TEN)
        assert zmap.exists("/v/0.0")

    def test_binary_content_round_trips(self) -> None:
        data = bytes(range(256)) * 3
        zmap = self.seeded({"/v/0": data, "/v/1": b"\x00"})
        assert zmap.read("/v/0") == data
        assert zmap.len("/v/0") == len(data)
        assert zmap.read("/v/1") == b"\x00"

    @pytest.mark.parametrize(("start", "count", "expected"), BYTE_RANGES)
    def test_byte_ranges(self, start: int, count: int | None, expected: bytes) -> None:
        zmap = self.seeded({"/data1/0": TEN})
        assert zmap.read("/data1/0", start, count) == expected
        assert expected == TEN[start:][:count]  # a range is a Python slice

    @pytest.mark.parametrize(("start", "count"), [(-1, None), (0, -1)])
    def test_negative_ranges_are_refused(self, start: int, count: int | None) -> None:
        zmap = self.seeded({"/x": b"abc"})
        with pytest.raises(RangeError, match="/x"):
            zmap.read("/x", start, count)

    def test_read_into_refuses_a_negative_start(self) -> None:
        zmap = self.seeded({"/x": b"abc"})
        with pytest.raises(RangeError, match="/x"):
            zmap.read_into("/x", memoryview(bytearray(3)), -1)

    @pytest.mark.parametrize("key", EMPTY_KEYS)
    def test_keys_without_content(self, key: str) -> None:
        zmap = self.seeded({"/g/v/.zarray": b"{}"})
        assert_no_content(zmap, key)

    @pytest.mark.parametrize("key", EMPTY_KEYS)
    def test_byte_ranges_of_keys_without_content(self, key: str) -> None:
        zmap = self.seeded({"/g/v/.zarray": b"{}"})
        for start, count in ((0, 0), (3, 0), (1, 5), (100, None)):
            with pytest.raises(EmptyError):
                zmap.read(key, start, count)
        with pytest.raises(EmptyError):
            zmap.read_into(key, memoryview(bytearray(0)))

    def test_read_into_buffers(self) -> None:
        data = bytes(range(200))
        zmap = self.seeded({"/v/0": data})
        target = bytearray(10)
        assert zmap.read_into("/v/0", memoryview(target)) == 10
        assert target == data[:10]
        words = np.zeros(4, dtype="<u4")
        assert zmap.read_into("/v/0", memoryview(words).cast("B"), 8) == words.nbytes
        assert words.tobytes() == data[8 : 8 + words.nbytes]
        octets = np.zeros(7, dtype=np.uint8)
        assert zmap.read_into("/v/0", memoryview(octets), 100) == 7
        assert octets.tobytes() == data[100:107]

    def test_read_into_is_short_at_the_end(self) -> None:
        data = bytes(range(200))
        zmap = self.seeded({"/v/0": data})
        target = np.zeros(16, dtype=np.uint8)
        count = zmap.read_into("/v/0", memoryview(target), len(data) - 5)
        assert count == 5
        assert target[:count].tobytes() == data[-5:]
        assert zmap.read_into("/v/0", memoryview(target), len(data)) == 0
        assert zmap.read_into("/v/0", memoryview(target), len(data) + 50) == 0

    # ------------------------------------------------------------------ keys
    def test_keys_without_leading_slash(self) -> None:
        zmap = self.seeded({"/v/.zarray": b"{}"})
        assert zmap.read("v/.zarray") == b"{}"
        assert zmap.exists("v/.zarray")
        assert zmap.len("v/.zarray") == 2
        target = bytearray(2)
        assert zmap.read_into("v/.zarray", memoryview(target)) == 2
        assert target == b"{}"

    @pytest.mark.parametrize("key", BAD_KEYS)
    def test_illegal_keys_are_refused_for_reads(self, key: str) -> None:
        zmap = self.seeded({"/a/b": b"1"})
        calls: list[Callable[[], object]] = [
            lambda: zmap.read(key),
            lambda: zmap.read(key, 0, 1),
            lambda: zmap.exists(key),
            lambda: zmap.len(key),
            lambda: zmap.read_into(key, memoryview(bytearray(1))),
        ]
        for call in calls:
            with pytest.raises(KeyNameError, match="illegal key"):
                call()

    @pytest.mark.parametrize("prefix", BAD_PREFIXES)
    def test_illegal_prefixes_are_refused_by_search(self, prefix: str) -> None:
        zmap = self.seeded({"/a/b": b"1"})
        self.require_listable(zmap)
        with pytest.raises(KeyNameError):
            zmap.search(prefix)
        with pytest.raises(KeyNameError):
            list(zmap.walk(prefix))

    @pytest.mark.parametrize("key", NON_STR_KEYS, ids=repr)
    def test_non_string_key(self, key: object) -> None:
        zmap = self.seeded({"/x": b"1"})
        with pytest.raises(KeyNameError):
            zmap.read(key)  # type: ignore[arg-type]
        with pytest.raises(KeyNameError):
            zmap.exists(key)  # type: ignore[arg-type]
        with pytest.raises(KeyNameError):
            zmap.len(key)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ search, walk, objects
    def test_search_lists_immediate_children_bytewise_sorted(self) -> None:
        zmap = self.seeded(dict.fromkeys(SEARCH_KEYS, b"x"))
        self.require_listable(zmap)
        assert zmap.search("/") == [".zgroup", "B", "_x", "a", "z", "é"]
        assert zmap.search("/a") == ["b"]
        assert zmap.search("/a/b") == [".zarray", "0.0"]
        assert zmap.search("/a/b/0.0") == []
        assert zmap.search("/absent") == []
        assert zmap.search("/a/b/0.0/deeper") == []

    def test_search_orders_by_code_point_not_utf16(self) -> None:
        # U+FF5A sorts before U+1F600 by code point and UTF-8 bytes, after it in UTF-16 (a surrogate pair)
        names = ["😀", "ｚ", "é", "z"]
        zmap = self.seeded({f"/{name}": name.encode() for name in names})
        self.require_listable(zmap)
        listed = zmap.search("/")
        assert listed == ["z", "é", "ｚ", "😀"]
        assert listed == sorted(names, key=lambda name: name.encode())
        for name in names:
            assert zmap.read(f"/{name}") == name.encode()

    @pytest.mark.parametrize(("left", "right"), [("", "/"), ("/a/", "/a"), ("a", "/a"), ("a/", "/a")])
    def test_equivalent_prefixes(self, left: str, right: str) -> None:
        zmap = self.seeded({"/a/b": b"1"})
        self.require_listable(zmap)
        assert zmap.search(left) == zmap.search(right)
        assert zmap.search(right)  # both list something

    def test_walk_is_preorder_sorted(self) -> None:
        zmap = self.seeded(dict.fromkeys(WALK_KEYS, b"x"))
        self.require_listable(zmap)
        assert list(zmap.walk()) == ["/.zgroup", "/a", "/a/b", "/a/b/c", "/v", "/v/.zarray", "/v/0.0"]
        assert list(zmap.objects()) == ["/.zgroup", "/a/b/c", "/v/.zarray", "/v/0.0"]
        assert list(zmap.walk("/v")) == ["/v/.zarray", "/v/0.0"]
        assert list(zmap.objects("a")) == ["/a/b/c"]
        assert list(zmap.walk("/v/0.0")) == []

    # ------------------------------------------------------------------ concurrency, closing, refusals
    def test_concurrent_reads(self) -> None:
        objects = {f"/v/{index}": bytes([index]) * (100 + index) for index in range(16)}
        zmap = self.seeded(objects)
        jobs = [(key, start) for key in objects for start in (0, 7, 99)]

        def read(job: tuple[str, int]) -> bytes:
            key, start = job
            return zmap.read(key, start, 50)

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(read, jobs))
        assert results == [objects[key][start : start + 50] for key, start in jobs]

    def test_closed_map_refuses_reads(self) -> None:
        zmap = self.seeded({"/x": b"1"})
        zmap.close()
        assert zmap.closed
        calls: list[Callable[[], object]] = [
            lambda: zmap.read("/x"),
            lambda: zmap.exists("/x"),
            lambda: zmap.len("/x"),
            lambda: zmap.read_into("/x", memoryview(bytearray(1))),
            lambda: zmap.search("/"),
        ]
        for call in calls:
            with pytest.raises(StorageError, match="closed"):
                call()
        zmap.close()  # closing twice is harmless

    def test_read_only_map_refuses_changes(self) -> None:
        objects = {"/.zgroup": b"{}", "/v/.zarray": b"[]", "/v/0": TEN}
        zmap = self.seeded(objects)
        source = MemoryMap()
        source.write("/s", b"payload")
        calls: list[Callable[[], object]] = [
            lambda: zmap.write("/x", b"1"),
            lambda: zmap.write("/v/0", b"changed"),
            lambda: zmap.delete("/v/0"),
            lambda: zmap.delete("/v"),
            lambda: zmap.delete("/x"),
            lambda: zmap.delete("/"),
            zmap.truncate,
            lambda: zmap.close(delete=True),
            lambda: zmap.copy_from(source, "/s", "/copied"),
        ]
        for call in calls:
            with pytest.raises(ReadOnlyError, match="read-only"):
                call()
        assert zmap.readonly
        assert not zmap.closed
        for key, data in objects.items():
            assert zmap.read(key) == data
        assert not zmap.exists("/x")
        assert not zmap.exists("/copied")
        if type(zmap).listable:
            assert sorted(zmap.objects()) == sorted(objects)


class WriteContract(_Contract):
    """Write tests for writable drivers; the subclass supplies :meth:`open_writable` and :meth:`reopen`."""

    # False for storage that does not outlive its map (memory): tests needing a new session are skipped.
    persistent: ClassVar[bool] = True

    def open_writable(self, mode: str = "w") -> ZMap:
        """A map opened with ``mode`` on a new dataset of its own (empty)."""
        raise NotImplementedError(f"{type(self).__name__} must implement open_writable(mode)")

    def reopen(self, zmap: ZMap, mode: str) -> ZMap:
        """Close ``zmap`` and open its dataset again with ``mode`` (a non-persistent map may be itself)."""
        raise NotImplementedError(f"{type(self).__name__} must implement reopen(zmap, mode)")

    def writable(self, mode: str = "w") -> ZMap:
        """:meth:`open_writable`, closed after the test."""
        return self._track(self.open_writable(mode))

    def reopened(self, zmap: ZMap, mode: str) -> ZMap:
        """:meth:`reopen`, closed after the test."""
        return self._track(self.reopen(zmap, mode))

    def require_persistent(self) -> None:
        if not self.persistent:
            pytest.skip("the storage does not outlive its map (persistent = False)")

    # ------------------------------------------------------------------ writing objects
    def test_writable_map_is_writable(self) -> None:
        zmap = self.writable()
        assert type(zmap).writable
        assert not zmap.readonly

    @pytest.mark.parametrize("data", [TEN, b""], ids=["ten", "empty"])
    def test_write_read_len(self, data: bytes) -> None:
        zmap = self.writable()
        assert zmap.write("/v/0.0", data) is None
        assert zmap.read("/v/0.0") == data
        assert zmap.len("/v/0.0") == len(data)
        assert zmap.exists("/v/0.0")

    def test_overwrite_with_shorter_content_truncates(self) -> None:
        # netcdf-c bug 1: '{"zarr_format": 2}' then '{}' left '{}zarr_format": 2}' on the file driver
        zmap = self.writable()
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
        zmap.write("/.zgroup", b"{}")
        assert zmap.read("/.zgroup") == b"{}"
        assert zmap.len("/.zgroup") == 2

    def test_overwrite_with_longer_content(self) -> None:
        zmap = self.writable()
        zmap.write("/v/0", b"ab")
        zmap.write("/v/0", TEN)
        assert zmap.read("/v/0") == TEN
        assert zmap.len("/v/0") == len(TEN)
        assert zmap.read("/v/0", 8) == TEN[8:]

    # The read tests again on the map that wrote the objects (zip reads its staging file, s3 its own index).
    @pytest.mark.parametrize(("start", "count", "expected"), BYTE_RANGES)
    def test_byte_ranges_in_the_writing_session(self, start: int, count: int | None, expected: bytes) -> None:
        zmap = self.writable()
        zmap.write("/data1/0", TEN)
        assert zmap.read("/data1/0", start, count) == expected
        target = bytearray(len(expected) if count is None else count)
        assert zmap.read_into("/data1/0", memoryview(target), start) == len(expected)
        assert target[: len(expected)] == expected

    @pytest.mark.parametrize("key", EMPTY_KEYS)
    def test_keys_without_content_in_the_writing_session(self, key: str) -> None:
        zmap = self.writable()
        zmap.write("/g/v/.zarray", b"{}")
        assert_no_content(zmap, key)

    def test_search_and_walk_in_the_writing_session(self) -> None:
        zmap = self.writable()
        self.require_listable(zmap)
        for key in SEARCH_KEYS:
            zmap.write(key, b"x")
        assert zmap.search("/") == [".zgroup", "B", "_x", "a", "z", "é"]
        assert zmap.search("/a") == ["b"]
        assert zmap.search("/a/b") == [".zarray", "0.0"]
        assert zmap.search("/a/b/0.0") == []
        assert zmap.search("/absent") == []
        zmap.truncate()
        for key in WALK_KEYS:
            zmap.write(key, b"x")
        assert list(zmap.walk()) == ["/.zgroup", "/a", "/a/b", "/a/b/c", "/v", "/v/.zarray", "/v/0.0"]
        assert list(zmap.objects()) == ["/.zgroup", "/a/b/c", "/v/.zarray", "/v/0.0"]

    def test_keys_without_leading_slash_when_writing(self) -> None:
        zmap = self.writable()
        zmap.write("v/.zarray", b"{}")
        assert zmap.read("/v/.zarray") == b"{}"
        assert zmap.exists("v/.zarray")

    @pytest.mark.parametrize("below", ["b", "b/c"], ids=["child", "deep"])
    def test_objects_are_leaves(self, below: str) -> None:
        zmap = self.writable()
        zmap.write("/a", b"1")
        with pytest.raises(KeyConflictError, match="'/a' is an object"):
            zmap.write(f"/a/{below}", b"2")
        zmap.write(f"/d/{below}", b"3")
        with pytest.raises(KeyConflictError, match="directory"):
            zmap.write("/d", b"4")
        assert zmap.read("/a") == b"1"
        assert zmap.read(f"/d/{below}") == b"3"
        assert not zmap.exists(f"/a/{below}")
        assert not zmap.exists("/d")

    def test_write_accepts_buffers(self) -> None:
        zmap = self.writable()
        array = np.arange(6, dtype="<i4").reshape(2, 3)
        zmap.write("/v/0.0", array)
        zmap.write("/v/0.1", bytearray(b"ab"))
        zmap.write("/v/0.2", memoryview(b"cd"))
        assert zmap.read("/v/0.0") == array.tobytes()
        assert zmap.read("/v/0.1") == b"ab"
        assert zmap.read("/v/0.2") == b"cd"
        assert zmap.len("/v/0.0") == array.nbytes

    @pytest.mark.parametrize("data", ["text", 42, None, np.arange(10)[::2]], ids=repr)
    def test_write_refuses_non_buffers(self, data: object) -> None:
        zmap = self.writable()
        with pytest.raises(DataError, match="/k"):
            zmap.write("/k", data)
        assert not zmap.exists("/k")

    def test_failed_write_keeps_the_old_content(self) -> None:
        zmap = self.writable()
        zmap.write("/k", b"old")
        with pytest.raises(DataError):
            zmap.write("/k", "new")
        with pytest.raises(KeyConflictError):
            zmap.write("/k/x", b"new")
        assert zmap.read("/k") == b"old"

    @pytest.mark.parametrize("key", ["/", ""])
    def test_root_cannot_be_written(self, key: str) -> None:
        zmap = self.writable()
        with pytest.raises(DataError):
            zmap.write(key, b"x")

    @pytest.mark.parametrize("key", BAD_KEYS)
    def test_illegal_keys_are_refused_for_writes(self, key: str) -> None:
        zmap = self.writable()
        zmap.write("/a/b", b"1")
        for call in (lambda: zmap.write(key, b"x"), lambda: zmap.delete(key)):
            with pytest.raises(KeyNameError, match="illegal key"):
                call()
        assert zmap.read("/a/b") == b"1"

    def test_concurrent_writes_of_different_keys(self) -> None:
        zmap = self.writable()
        objects = {f"/v/{index}": bytes([index]) * (1000 + index) for index in range(32)}
        start = threading.Barrier(8)

        def write(key: str) -> None:
            if int(key.rsplit("/", 1)[1]) < 8:
                start.wait(timeout=30)  # the first eight begin together
            zmap.write(key, objects[key])

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(write, objects))
        for key, data in objects.items():
            assert zmap.read(key) == data
        if type(zmap).listable:
            assert zmap.search("/v") == sorted(key.rsplit("/", 1)[1] for key in objects)

    def test_copy_from_any_map(self) -> None:
        zmap = self.writable()
        source = MemoryMap()
        source.write("/a/b", b"payload")
        assert zmap.copy_from(source, "/a/b", "/c")
        assert not zmap.copy_from(source, "/a/none", "/d")
        assert zmap.read("/c") == b"payload"
        assert not zmap.exists("/d")

    # ------------------------------------------------------------------ deleting
    def test_delete_object(self) -> None:
        zmap = self.writable()
        zmap.write("/v/0", b"1")
        zmap.write("/v/1", b"2")
        zmap.delete("/v/0")
        assert not zmap.exists("/v/0")
        with pytest.raises(EmptyError):
            zmap.read("/v/0")
        assert zmap.read("/v/1") == b"2"

    def test_delete_object_prunes_empty_directories(self) -> None:
        zmap = self.writable()
        self.require_listable(zmap)
        zmap.write("/g/v/.zarray", b"{}")
        zmap.write("/.zgroup", b"{}")
        zmap.delete("/g/v/.zarray")
        assert zmap.search("/") == [".zgroup"]
        assert zmap.search("/g") == []

    def test_delete_subtree(self) -> None:
        zmap = self.writable()
        self.require_listable(zmap)
        for key in ("/g/v/.zarray", "/g/v/0", "/g/w/.zarray", "/h"):
            zmap.write(key, b"x")
        zmap.delete("/g/v")
        assert zmap.search("/g") == ["w"]
        assert not zmap.exists("/g/v/0")
        zmap.delete("/g")
        assert zmap.search("/") == ["h"]
        assert not zmap.exists("/g/w/.zarray")
        assert zmap.read("/h") == b"x"

    def test_delete_absent_key_is_a_no_op(self) -> None:
        zmap = self.writable()
        zmap.write("/a", b"1")
        zmap.delete("/b/c")
        zmap.delete("/a/b")
        assert zmap.read("/a") == b"1"

    def test_deleted_key_can_be_written_again(self) -> None:
        zmap = self.writable()
        zmap.write("/a/b", b"1")
        zmap.delete("/a")
        zmap.write("/a", b"2")  # no longer a directory
        assert zmap.read("/a") == b"2"

    def test_truncate_removes_everything(self) -> None:
        zmap = self.writable()
        self.require_listable(zmap)
        zmap.write("/.zgroup", b"{}")
        zmap.write("/v/0", b"1")
        zmap.truncate()
        assert zmap.search("/") == []
        assert not zmap.exists("/v/0")
        zmap.write("/.zgroup", b"{}")
        assert zmap.search("/") == [".zgroup"]

    def test_delete_root_is_truncate(self) -> None:
        zmap = self.writable()
        self.require_listable(zmap)
        zmap.write("/v/0", b"1")
        zmap.delete("/")
        assert zmap.search("/") == []

    # ------------------------------------------------------------------ sessions
    def test_contents_survive_reopening(self) -> None:
        zmap = self.writable("w")
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
        zmap.write("/v/0.0", bytes(range(256)))
        zmap.write("/gone", b"x")
        zmap.delete("/gone")
        zmap = self.reopened(zmap, "r")
        self.require_listable(zmap)
        assert zmap.search("/") == [".zgroup", "v"]
        assert zmap.read("/v/0.0", 250) == bytes(range(250, 256))
        assert zmap.read("/.zgroup") == b'{"zarr_format": 2}'
        assert not zmap.exists("/gone")

    def test_unicode_keys_round_trip(self) -> None:
        zmap = self.writable("w")
        zmap.write("/température/.zarray", "°C".encode())
        zmap = self.reopened(zmap, "r")
        self.require_listable(zmap)
        assert zmap.search("/") == ["température"]
        assert zmap.read("/température/.zarray").decode() == "°C"

    def test_reopening_to_append_keeps_and_extends(self) -> None:
        zmap = self.writable("w")
        zmap.write("/.zgroup", b"{}")
        zmap = self.reopened(zmap, "a")
        assert zmap.read("/.zgroup") == b"{}"
        zmap.write("/v/0", b"1")
        zmap = self.reopened(zmap, "r+")
        zmap.write("/v/1", b"2")
        zmap = self.reopened(zmap, "r")
        assert [zmap.read(key) for key in ("/.zgroup", "/v/0", "/v/1")] == [b"{}", b"1", b"2"]

    def test_reopening_to_create_empties_the_store(self) -> None:
        self.require_persistent()
        zmap = self.writable("w")
        zmap.write("/.zgroup", b"{}")
        zmap.write("/v/0", b"1")
        zmap = self.reopened(zmap, "w")
        assert not zmap.exists("/.zgroup")
        assert not zmap.exists("/v/0")
        if type(zmap).listable:
            assert zmap.search("/") == []

    def test_close_delete_removes_the_dataset(self) -> None:
        zmap = self.writable("w")
        zmap.write("/.zgroup", b"{}")
        zmap.write("/v/0", b"1")
        zmap.close(delete=True)
        assert zmap.closed
        if self.persistent:
            with pytest.raises(DatasetNotFound):
                self.reopened(zmap, "r+")

    def test_deleted_dataset_is_not_found_read_only(self) -> None:
        self.require_persistent()
        zmap = self.writable("w")
        zmap.write("/.zgroup", b"{}")
        zmap.close(delete=True)
        with pytest.raises(DatasetNotFound):
            self.reopened(zmap, "r")

    def test_closed_map_refuses_everything(self) -> None:
        zmap = self.writable()
        zmap.write("/x", b"1")
        zmap.close()
        calls: list[Callable[[], object]] = [
            lambda: zmap.read("/x"),
            lambda: zmap.search("/"),
            lambda: zmap.write("/x", b"2"),
            lambda: zmap.write("/y", b"2"),
            lambda: zmap.delete("/x"),
            zmap.truncate,
        ]
        for call in calls:
            with pytest.raises(StorageError, match="closed"):
                call()
        zmap.close()  # closing twice is harmless
