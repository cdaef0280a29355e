"""The read half of the contract runs unchanged on a read-only driver, added with one registry line.

``DictionaryMap`` is a complete read-only driver in a few lines: it serves the objects of a module-level
table (its "source format", keyed by the dataset path) and implements only the read primitives.
"""

from __future__ import annotations

import itertools

import pytest

import nczmap
import nczmap.registry
from nczmap.errors import DatasetNotFound, EmptyError
from nczmap.registry import LOCAL, DriverEntry
from nczmap.testing import ReadContract
from nczmap.url import ParsedURL
from nczmap.zmap.base import ZMap
from nczmap.zmap.index import KeyIndex

# The datasets DictionaryMap serves: dataset path -> {key: content}.
TABLES: dict[str, dict[str, bytes]] = {}
ENTRY = DriverEntry("dictionary", f"{__name__}:DictionaryMap", (LOCAL,))


class DictionaryMap(ZMap):
    """A read-only driver over ``TABLES[url.path]``."""

    driver = "dictionary"
    writable = False

    def __init__(self, url: ParsedURL, mode: str) -> None:
        super().__init__(url, mode)
        try:
            table = TABLES[url.path]
        except KeyError:
            raise DatasetNotFound(f"no dictionary dataset at {url.path!r}") from None
        self._objects = dict(table)
        self._index = KeyIndex()
        for key in self._objects:
            self._index.add(key)

    def _exists(self, key: str) -> bool:
        return key in self._objects

    def _content(self, key: str) -> bytes:
        try:
            return self._objects[key]
        except KeyError:
            raise EmptyError(key, self.location) from None

    def _len(self, key: str) -> int:
        return len(self._content(key))

    def _read(self, key: str, start: int, count: int | None) -> bytes:
        data = self._content(key)
        return data[start:] if count is None else data[start : start + count]

    def _search(self, prefix: str) -> list[str]:
        return self._index.children(prefix)

    def _close(self, delete: bool) -> None:
        self._objects = {}


@pytest.fixture
def dictionary_driver(monkeypatch: pytest.MonkeyPatch) -> DriverEntry:
    """The dictionary driver registered for one test (the registry is restored afterwards)."""
    monkeypatch.setitem(nczmap.registry.DRIVERS, ENTRY.name, ENTRY)
    return ENTRY


def dictionary_url(monkeypatch: pytest.MonkeyPatch, path, objects: dict[str, bytes]) -> str:
    """Store ``objects`` as the dataset at ``path`` (removed after the test) and return its URL."""
    monkeypatch.setitem(TABLES, str(path), dict(objects))
    return path.as_uri() + "#mode=nczarr,dictionary"


class TestDictionaryReadContract(ReadContract):
    """The read half, unchanged: seeding writes the driver's own source format (the table)."""

    @pytest.fixture(autouse=True)
    def _registered(self, dictionary_driver: DriverEntry, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
        self.monkeypatch = monkeypatch
        self.paths = (tmp_path / f"ds{number}" for number in itertools.count())

    def open_seeded(self, objects: dict[str, bytes]) -> ZMap:
        url = dictionary_url(self.monkeypatch, next(self.paths), objects)
        return nczmap.open_map(url, "r")

    def test_seeded_maps_are_dictionary_maps(self) -> None:
        zmap = self.seeded({"/a": b"1"})
        assert isinstance(zmap, DictionaryMap)
        assert not type(zmap).writable


@pytest.mark.usefixtures("dictionary_driver")
def test_writing_to_a_read_only_driver_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    url = dictionary_url(monkeypatch, tmp_path / "ds", {"/.zgroup": b"{}"})
    with nczmap.open_map(url, "r") as zmap:
        for call in (
            lambda: zmap.write("/x", b"1"),
            lambda: zmap.write("/.zgroup", b"[]"),
            lambda: zmap.delete("/.zgroup"),
            zmap.truncate,
            lambda: zmap.close(delete=True),
        ):
            with pytest.raises(nczmap.ReadOnlyError, match="the dictionary driver is read-only"):
                call()
        assert zmap.read("/.zgroup") == b"{}"


@pytest.mark.usefixtures("dictionary_driver")
def test_read_only_driver_refuses_writes_whatever_its_mode(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # Built directly (open_map refuses any mode but "r"): the class's capability decides, not the mode.
    url = nczmap.parse_url(dictionary_url(monkeypatch, tmp_path / "ds", {}))
    with DictionaryMap(url, "a") as zmap:
        assert zmap.readonly
        with pytest.raises(nczmap.ReadOnlyError, match="the dictionary driver is read-only"):
            zmap.write("/x", b"1")


def test_writable_driver_without_write_primitives_is_refused_at_class_creation() -> None:
    with pytest.raises(TypeError, match="lacks _write, _delete, _truncate"):

        class Careless(DictionaryMap):
            writable = True

    with pytest.raises(TypeError, match="lacks _truncate"):

        class Partial(DictionaryMap):
            writable = True

            def _write(self, key: str, data: memoryview) -> None:
                self._objects[key] = bytes(data)

            def _delete(self, key: str) -> None:
                self._objects.pop(key, None)


def test_read_only_driver_needs_no_write_primitives() -> None:
    class Reader(ZMap):  # only the read primitives, as DictionaryMap
        driver = "reader"
        writable = False
        _exists = DictionaryMap._exists
        _len = DictionaryMap._len
        _read = DictionaryMap._read
        _search = DictionaryMap._search
        _close = DictionaryMap._close

    assert not Reader.writable
    assert Reader._write is ZMap._write


def test_a_driver_is_added_with_one_registry_line(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    assert "dictionary" not in nczmap.registry.DRIVERS
    monkeypatch.setitem(
        nczmap.registry.DRIVERS,
        "dictionary",
        DriverEntry("dictionary", f"{__name__}:DictionaryMap", (LOCAL,)),
    )
    url = dictionary_url(monkeypatch, tmp_path / "x", {"/.zgroup": b"{}", "/v/0": b"12"})
    assert nczmap.parse_url(url).driver == "dictionary"
    assert nczmap.registry.DRIVERS["dictionary"].load() is DictionaryMap
    with nczmap.open_map(url, "r") as zmap:
        assert isinstance(zmap, DictionaryMap)
        assert zmap.search("/") == [".zgroup", "v"]
        assert zmap.read("/v/0") == b"12"
    for mode in ("w", "a", "r+"):
        with pytest.raises(nczmap.ReadOnlyError, match="dictionary"):
            nczmap.open_map(url, mode)
    with pytest.raises(DatasetNotFound):
        nczmap.open_map((tmp_path / "absent").as_uri() + "#mode=nczarr,dictionary", "r")


def test_the_registry_is_restored() -> None:
    # whatever ran before, monkeypatch undid its registration
    assert "dictionary" not in nczmap.registry.DRIVERS
    with pytest.raises(nczmap.URLError):
        nczmap.parse_url("file:///tmp-anything/x#mode=nczarr,dictionary")
