"""The netCDF data model nczmap reads NCZarr into: groups, shared dimensions, variables, typed attributes.

The API follows h5netcdf: ``.dimensions``, ``.variables``, ``.groups``, ``.attrs`` mappings, numpy-style
indexing of variables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, KeysView, MutableMapping
from dataclasses import dataclass, field

from nczmap._lazy import numpy as np
from nczmap.errors import FormatError, ReadOnlyError
from nczmap.format.types import BY_NAME, CHAR, STRING, NCType, type_of_numpy


def _type_named(name: str) -> NCType:
    try:
        return BY_NAME[name]
    except KeyError:
        raise FormatError(f"unknown netCDF type {name!r}: one of {', '.join(BY_NAME)}") from None


class Attribute:
    """A typed attribute: numeric values as a 1-D numpy array, char as ``str``, string as ``list[str]``.

    Numbers read from storage stay a Python list (``numbers``) until ``value`` is first used, so reading
    and printing metadata never needs numpy.
    """

    __slots__ = ("_numbers", "_value", "name", "nctype")

    def __init__(
        self, name: str, nctype: NCType, value: object = None, *, numbers: list | None = None
    ) -> None:
        self.name = name
        self.nctype = nctype
        self._value = value
        self._numbers = numbers

    @property
    def value(self) -> np.ndarray | str | list[str]:
        if self._value is None:
            self._value = np.array(self._numbers, dtype=self.nctype.numpy)
        return self._value

    def numbers(self) -> list:
        """The values as Python numbers (float values exactly those of the attribute's type)."""
        if self._numbers is None:
            self._numbers = np.asarray(self._value, dtype=self.nctype.numpy).tolist()
        return self._numbers

    def __repr__(self) -> str:
        return f"Attribute({self.name!r}, {self.nctype.name}, {self.value!r})"

    def python_value(self) -> object:
        if self.nctype is CHAR:
            return self.value
        if self.nctype is STRING:
            return self.value[0] if len(self.value) == 1 else list(self.value)
        if self._value is None and self._numbers is not None and len(self._numbers) == 1:  # no array needed
            return self.nctype.numpy.type(self._numbers[0])
        return self.value[0] if len(self.value) == 1 else self.value

    @classmethod
    def from_python(cls, name: str, value: object, nctype: NCType | None = None) -> Attribute:
        """Type a user value: str -> char, list of str -> string, numpy/Python numbers by their type."""
        if isinstance(value, str) and nctype in (None, CHAR):
            return cls(name, CHAR, value)
        if nctype is STRING or (
            isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value)
        ):
            strings = [value] if isinstance(value, str) else [str(v) for v in value]
            return cls(name, STRING, strings)
        array = np.atleast_1d(np.asarray(value))
        if array.ndim != 1:
            raise FormatError(f"attribute {name!r} must be one-dimensional, not shape {array.shape}")
        if array.dtype.kind in "iu" and nctype is None and not isinstance(value, np.ndarray | np.generic):
            array = array.astype(
                np.int64 if array.min(initial=0) < -(2**31) or array.max(initial=0) >= 2**31 else np.int32
            )
        if array.dtype.kind == "f" and nctype is None and not isinstance(value, np.ndarray | np.generic):
            array = array.astype(np.float64)
        target = nctype or type_of_numpy(array.dtype)
        if target.is_text:
            raise FormatError(f"attribute {name!r}: cannot store {value!r} as {target.name}")
        return cls(name, target, array.astype(target.numpy))


class Attributes(MutableMapping[str, object]):
    """Ordered attributes; values come back as Python/numpy values, :meth:`typed` gives the netCDF type."""

    def __init__(self) -> None:
        self._items: dict[str, Attribute] = {}
        self.on_change: Callable[[], None] | None = None  # set by a writable dataset
        self.read_only_in: str | None = None  # where the read-only dataset is: changes are refused

    def __getitem__(self, name: str) -> object:
        return self._items[name].python_value()

    def __setitem__(self, name: str, value: object) -> None:
        self.set(name, value)

    def set(self, name: str, value: object, nctype: NCType | str | None = None) -> None:
        """Set an attribute, optionally forcing its netCDF type (``"int64"``, ``"string"``...)."""
        if isinstance(nctype, str):
            nctype = _type_named(nctype)
        attribute = value if isinstance(value, Attribute) else Attribute.from_python(name, value, nctype)
        self._changing(name)
        self._items[name] = attribute

    def load(self, attributes: dict[str, Attribute]) -> None:
        """Take attributes as read from storage (not a change to write back)."""
        self._items.update(attributes)

    def __delitem__(self, name: str) -> None:
        self._changing(name)
        del self._items[name]

    def _changing(self, name: str) -> None:
        if self.read_only_in is not None:
            raise ReadOnlyError(f"cannot change attribute {name!r}: {self.read_only_in} is open read-only")
        if self.on_change is not None:
            self.on_change()

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def keys(self) -> KeysView[str]:
        return self._items.keys()  # what Mapping.keys gives, iterated without Python-level generators

    def __len__(self) -> int:
        return len(self._items)

    def typed(self, name: str) -> Attribute:
        return self._items[name]

    def all_typed(self) -> list[Attribute]:
        return list(self._items.values())

    def __repr__(self) -> str:
        return f"Attributes({dict(self)!r})"


@dataclass(eq=False)
class Dimension:
    name: str
    size: int
    unlimited: bool = False
    group: Group | None = field(default=None, repr=False)

    @property
    def path(self) -> str:
        prefix = self.group.path if self.group is not None else "/"
        return prefix.rstrip("/") + "/" + self.name

    def __len__(self) -> int:
        return self.size


class Group:
    """A netCDF group: its dimensions, variables, subgroups and attributes."""

    def __init__(self, name: str, parent: Group | None) -> None:
        self.name = name
        self.parent = parent
        self.dimensions: dict[str, Dimension] = {}
        self.variables: dict[str, object] = {}
        self.groups: dict[str, Group] = {}
        self.attrs = Attributes()

    @property
    def path(self) -> str:
        if self.parent is None:
            return "/"
        return self.parent.path.rstrip("/") + "/" + self.name

    @property
    def root(self) -> Group:
        group = self
        while group.parent is not None:
            group = group.parent
        return group

    def lookup_dimension(self, name: str) -> Dimension | None:
        """The dimension a variable of this group means by ``name``: its own, else the nearest ancestor's."""
        scope: Group | None = self
        while scope is not None:
            if name in scope.dimensions:
                return scope.dimensions[name]
            scope = scope.parent
        return None

    def find_dimension(self, path: str) -> Dimension | None:
        """The dimension named by a fully qualified name such as ``/g/y``."""
        *group_names, name = path.strip("/").split("/")
        group = self.root
        for group_name in group_names:
            group = group.groups.get(group_name)
            if group is None:
                return None
        return group.dimensions.get(name)

    # ----------------------------------------------------------------- building (writable datasets)
    def editor(self):
        """The writer of this group's dataset (``nczmap.format.writer.DatasetWriter``, attached by
        ``open_on``); ReadOnlyError when the dataset was opened read-only."""
        root = self.root
        writer = getattr(root, "writer", None)
        if writer is None:
            where = getattr(getattr(root, "zmap", None), "location", root.name)
            raise ReadOnlyError(f"cannot modify group {self.path!r}: {where} is open read-only")
        return writer

    def create_group(self, name: str) -> Group:
        return self.editor().create_group(self, name)

    def create_dimension(self, name: str, size: int | None = None) -> Dimension:
        """A new dimension; ``size=None`` makes it unlimited."""
        return self.editor().create_dimension(self, name, size)

    def create_variable(self, name: str, dimensions=(), dtype: object = "f8", *, data=None, **options):
        """A new variable over named dimensions (searched in this group, then its ancestors).

        Options: ``fill_value`` (None: no fill), ``chunks``, ``compression`` (zlib, zstd, blosc),
        ``compression_opts``, ``shuffle``, ``endian`` (little, big, native), ``maxstrlen`` (string width).
        """
        variable = self.editor().create_variable(self, name, dimensions, dtype, **options)
        if data is not None:
            variable[...] = data
        return variable

    def walk(self) -> Iterator[Group]:
        yield self
        for child in self.groups.values():
            yield from child.walk()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.path!r}: {len(self.dimensions)} dims, {len(self.variables)} vars>"
        )
