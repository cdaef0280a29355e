"""The in-memory driver: the reference model of the zmap contract (netcdf-c has none)."""

from __future__ import annotations

from nczmap.errors import EmptyError
from nczmap.zmap.base import ZMap
from nczmap.zmap.index import KeyIndex


class MemoryMap(ZMap):
    driver = "memory"

    def __init__(self, mode: str = "w") -> None:
        super().__init__(None, mode)
        self._objects: dict[str, bytes] = {}
        self._index = KeyIndex()

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

    def _write(self, key: str, data: memoryview) -> None:
        self._index.check_leaf(key, self._objects, self.location)
        self._objects[key] = bytes(data)
        self._index.add(key)

    def _search(self, prefix: str) -> list[str]:
        return self._index.children(prefix)

    def _delete(self, key: str) -> None:
        for node in self._index.remove(key, self._objects.__contains__):
            self._objects.pop(node, None)

    def _truncate(self) -> None:
        self._objects.clear()
        self._index = KeyIndex()

    def _close(self, delete: bool) -> None:
        if delete:
            self._truncate()
