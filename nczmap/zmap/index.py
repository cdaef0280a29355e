"""An in-memory tree of keys answering ``search`` in one dictionary lookup.

Used by the memory and zip drivers. A node exists while it is an object, has children, or was added as an
explicit directory (zip directory entries); deleting prunes ancestors left without children.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator

from nczmap.errors import KeyConflictError
from nczmap.zmap.keys import ROOT, ancestors, join, parent_and_name


class KeyIndex:
    def __init__(self) -> None:
        self._children: dict[str, set[str]] = {ROOT: set()}
        self._sorted: dict[str, list[str]] = {}

    def add(self, key: str) -> None:
        """Record ``key`` (an object or a directory) and every ancestor of it."""
        while key != ROOT:
            parent, name = parent_and_name(key)
            kids = self._children.setdefault(parent, set())
            if name in kids:
                return
            kids.add(name)
            self._sorted.pop(parent, None)
            key = parent

    def add_children(self, key: str, names: Iterable[str]) -> None:
        """Record ``key`` and the objects ``key/name`` for every name (one key segment each)."""
        self.add(key)
        self._children.setdefault(key, set()).update(names)
        self._sorted.pop(key, None)

    def present(self, key: str, names: Iterable[str]) -> list[str]:
        """Those of ``names`` recorded as children of ``key``."""
        kids = self._children.get(key, ())
        return [name for name in names if name in kids]

    def add_directory(self, key: str) -> None:
        self._children.setdefault(key, set())
        self.add(key)

    def children(self, key: str) -> list[str]:
        """Sorted child names of ``key``; ``[]`` for leaves and unknown keys."""
        cached = self._sorted.get(key)
        if cached is None:
            kids = self._children.get(key)
            if not kids:
                return []
            cached = self._sorted[key] = sorted(kids)
        return list(cached)

    def contains(self, key: str) -> bool:
        """True if ``key`` is a node: an object, or a directory with something recorded under it."""
        if key == ROOT:
            return True
        parent, name = parent_and_name(key)
        return name in self._children.get(parent, ())

    def check_leaf(self, key: str, objects: Container[str], location: str) -> None:
        """Objects are leaves: refuse to write ``key`` if it has children or lies under one of ``objects``."""
        if key not in objects and self.contains(key):
            raise KeyConflictError(f"cannot write {key!r} in {location}: it is a directory")
        for ancestor in ancestors(key):
            if ancestor in objects:
                raise KeyConflictError(f"cannot write {key!r} in {location}: {ancestor!r} is an object")

    def subtree(self, key: str) -> Iterator[str]:
        """``key`` (if present) and every node below it, parents before children, in sorted order."""
        if not self.contains(key):
            return
        stack = [key]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(join(node, name) for name in reversed(self.children(node)))

    def remove(self, key: str, is_object: Callable[[str], bool] = lambda _key: False) -> list[str]:
        """Remove ``key`` and its subtree, then prune ancestors left empty unless ``is_object`` says they
        are objects themselves. Returns the removed nodes."""
        removed = list(self.subtree(key))
        for node in removed:
            self._children.pop(node, None)
            self._sorted.pop(node, None)
        if key == ROOT:
            self._children[ROOT] = set()
            return removed
        self._unlink(key)
        for ancestor in ancestors(key):
            if ancestor == ROOT or self._children.get(ancestor) or is_object(ancestor):
                break
            self._children.pop(ancestor, None)
            self._unlink(ancestor)
        return removed

    def _unlink(self, key: str) -> None:
        parent, name = parent_and_name(key)
        kids = self._children.get(parent)
        if kids is not None and name in kids:
            kids.discard(name)
            self._sorted.pop(parent, None)
