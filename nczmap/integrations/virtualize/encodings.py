"""What a variable's stored numbers mean in each file, compared across the files joined.

Files of one collection often store a variable differently: per-file time units (``days since`` each
file's own date), a ``scale_factor`` or ``_FillValue`` that changed with a product version, ``K`` in one
file and ``degC`` in the next. Joining their bytes as they are would give silently wrong numbers, so
every attribute that changes what the numbers mean (:data:`MEANING`) is compared with the first file's:

- a time-valued variable along the joined dimension whose units (or reference date) differ is decoded
  with each file's units and stored in one encoding (:func:`settle`; :mod:`.timecoding`);
- a variable along the joined dimension whose packing differs (:data:`PACKING`) is stored decoded, as
  xarray decodes each file (:mod:`.cfdecode`), when it is small (``max_chunk_bytes``) or the user asked
  to load it; otherwise the file is refused (:func:`check`) naming the variable and the attribute;
- other differences (a variable's ``units``, ``valid_*``, a calendar) are refused by name;
- a variable not along the joined dimension has the first file's values: a coordinate variable (the grid)
  whose values or meaning differ is refused by name; any other is kept as the first file has it, and what
  differed is listed for a warning (values compared up to :data:`COMPARED_VALUES` bytes a file).

Attributes that do not change the numbers (``history``...) keep the first file's value: :func:`notes`
lists what differed, for one warning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from nczmap.errors import FormatError
from nczmap.format import Attribute, Group
from nczmap.format.types import type_of_numpy
from nczmap.integrations.virtualize import cfdecode, timecoding
from nczmap.integrations.virtualize.parsed import (
    Constant,
    SourceVariable,
    Storage,
    find_group,
    native_dtype,
)

PACKING = tuple(cfdecode.PACKING)  # made to agree by storing decoded values
FIXED = ("units", "calendar", "valid_min", "valid_max", "valid_range")  # refused when they differ
MEANING = (*PACKING, *FIXED)
COMPARED_VALUES = 64 << 10  # values of variables not joined are compared up to this size a file


# ------------------------------------------------------------------------------------------ comparing
def attributes(variable: SourceVariable) -> dict[str, object]:
    """``variable``'s attributes as xarray decodes them: a bounds variable takes the ``units`` and
    ``calendar`` it lacks from its time coordinate (CF; xarray's ``_update_bounds_attributes``, each
    separately), as that coordinate was in its file (before a join re-encoded it); a pure Zarr v2 store's
    ``fill_value`` is its ``_FillValue``."""
    found = dict(variable.attrs)
    fill = variable.layout.fill_value
    if variable.fill_is_missing and "_FillValue" not in found and fill is not None:
        # a pure Zarr v2 store's fill_value is what xarray masks: compared and decoded as its _FillValue
        found["_FillValue"] = np.asarray(fill, dtype=variable.layout.dtype.storage)
    for other in variable.group.variables.values():
        if other is variable:
            continue
        theirs = other.source_attrs if other.source_attrs is not None else other.attrs
        names = [theirs.get("bounds"), theirs.get("climatology")]
        units = theirs.get("units")
        if variable.name in names and timecoding.is_time_units(units):
            found.setdefault("units", units)
            if "calendar" in theirs:
                found.setdefault("calendar", theirs["calendar"])
    return found


def differing(
    mine: Mapping[str, object], theirs: Mapping[str, object], names=MEANING, typed: bool = True
) -> list[str]:
    """The attributes of ``names`` whose values (and types, if ``mine``'s are known) differ."""
    return [name for name in names if not same_value(mine.get(name), theirs.get(name), typed)]


def same_value(a: object, b: object, typed: bool = True) -> bool:
    """Equal values of the same type (NaN equal to NaN): float32 0.5 is not float64 0.5, which xarray
    decodes to another dtype. Untyped (``a`` read from pure Zarr, whose attributes are JSON numbers):
    ``a`` taken as ``b``'s type, if it is that type's number."""
    if a is None or b is None:
        return a is b
    if isinstance(a, str) or isinstance(b, str) or isinstance(a, list) or isinstance(b, list):
        return type(a) is type(b) and a == b
    x, y = np.asarray(a), np.asarray(b)
    if not typed and x.dtype.kind in "iuf" and y.dtype.kind in "iuf" and x.shape == y.shape:
        with np.errstate(all="ignore"):
            x = x.astype(y.dtype)
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    if x.dtype.kind in "SUO":
        return bool(np.array_equal(x, y))
    return bool(np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"))


def is_time_valued(attrs: Mapping[str, object]) -> bool:
    return timecoding.is_time_units(attrs.get("units"))


def check(
    mine: SourceVariable,
    theirs: SourceVariable,
    joined: bool,
    source: str,
    first: str,
    may_decode: Callable[[SourceVariable, SourceVariable], bool],
) -> str | None:
    """FormatError unless ``theirs`` (in ``source``) can be joined to ``mine`` (in ``first``): the error
    names the variable, the attribute and both files, and says how to go on. A variable not along the
    joined dimension takes the first file's values: a coordinate (the grid) that differs is refused, any
    other variable is kept as the first file has it, and what differs is returned (for a warning)."""
    a, b = attributes(mine), attributes(theirs)
    names = differing(a, b, typed=not mine.untyped) + _packed_types(mine, theirs, a, b)
    if "dtype" in names:  # for the message
        a = {**a, "dtype": str(mine.layout.dtype.storage)}
        b = {**b, "dtype": str(theirs.layout.dtype.storage)}
    if not joined:
        grid = len(mine.dims) == 1 and mine.dims[0].name == mine.name
        same = _same_small_values(mine, theirs)
        if grid and names:
            _refuse(mine, names[0], a, b, source, first, "it is a coordinate: the files' grids differ")
        if grid and not same:
            raise FormatError(
                f"{source} cannot be joined to {first}: the values of the coordinate {mine.key!r} differ "
                "(the files' grids differ; or leave such files out with --skip-mismatched)"
            )
        if names or not same:
            return f"{mine.key} ({names[0] if names else 'values'} in {source})"
        return None
    if not names:
        return None
    if is_time_valued(a) and is_time_valued(b) and set(names) <= {"units", "calendar"}:
        _check_times(mine, a, b, source, first)
        return None
    fixed = [name for name in names if name in FIXED]
    if fixed:
        _refuse(mine, fixed[0], a, b, source, first, "nczmap does not convert between them")
    if not may_decode(mine, theirs):
        if mine.storages[0].kind == "existing":
            why = "an append adds values in the dataset's own encoding and never rewrites those it holds"
        else:
            why = "its values can be joined decoded: name it in --load/load= to store them so"
        _refuse(mine, names[0], a, b, source, first, why)
    return None


def _packed_types(mine: SourceVariable, theirs: SourceVariable, a, b) -> list[str]:
    """``["dtype"]`` when two files store a packed variable as different types: xarray decodes each into
    its own float type, which no single stored type and packing reproduces."""
    x, y = mine.layout.dtype.storage, theirs.layout.dtype.storage
    if x.newbyteorder("=") == y.newbyteorder("=") or mine.nctype.is_text or theirs.nctype.is_text:
        return []
    packed = any(name in a or name in b for name in PACKING)
    return ["dtype"] if packed else []


def holds_decoded(existing: SourceVariable, new: SourceVariable) -> bool:
    """Appending: whether the dataset stores a variable decoded (floats, no packing), so that a new file's
    values decoded with their own packing can join it, in its type."""
    attrs = attributes(existing)
    stored = existing.layout.dtype.storage
    if stored.kind != "f" or any(name in attrs for name in PACKING if name != "_FillValue"):
        return False
    theirs = attributes(new)
    decoded = cfdecode.decoded_dtype(np.dtype(new.layout.dtype.storage.newbyteorder("=")), theirs)
    return np.result_type(stored.newbyteorder("="), decoded) == stored.newbyteorder("=")


def _check_times(mine: SourceVariable, a, b, source: str, first: str) -> None:
    where = f"{mine.key!r} of {source}"
    ours = timecoding.parse_time_units(str(a["units"]), _text(a.get("calendar")), f"{mine.key!r} of {first}")
    their = timecoding.parse_time_units(str(b["units"]), _text(b.get("calendar")), where)
    gregorian = {"standard", "proleptic_gregorian"}  # alike from 1582-10-15 on: timecoding checks that
    if ours.calendar != their.calendar and {ours.calendar, their.calendar} != gregorian:
        _refuse(mine, "calendar", a, b, source, first, "nczmap does not convert between calendars")


def _refuse(mine: SourceVariable, name: str, a, b, source: str, first: str, why: str) -> None:
    raise FormatError(
        f"{source} cannot be joined to {first}: variable {mine.key!r} has {name} {_shown(b.get(name))} "
        f"there but {_shown(a.get(name))} in {first}; {why} (or leave such files out with --skip-mismatched)"
    )


def _shown(value: object) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _same_small_values(mine: SourceVariable, theirs: SourceVariable) -> bool:
    """Whether two small variables' values agree (True where they are too large to compare here). A
    dataset appended to gives the digest recorded when it was made, if it has one: then its values are
    not read back."""
    a, b = mine.storages[0], theirs.storages[0]
    if a.values is None or b.values is None or a.shape != b.shape:
        return a.shape == b.shape
    if a.digest is not None:
        found = digest(theirs)
        return found is None or found == a.digest
    itemsize = mine.layout.dtype.storage.itemsize
    cheap = isinstance(a.values, Constant) and isinstance(b.values, Constant)
    if not cheap and math.prod(a.shape) * itemsize > COMPARED_VALUES:
        return True
    x, y = np.asarray(a.values()), np.asarray(b.values())
    if x.dtype.kind in "fc" and y.dtype.kind in "fc":
        return bool(np.array_equal(x, y, equal_nan=True))
    return bool(np.array_equal(x, y))


def digest(variable: SourceVariable) -> str | None:
    """A digest of the values of a small variable of one file (None when too large to read here): what
    an append compares a new file's values with, instead of reading back the dataset's. Numbers are hashed
    as float64 or int64, so the same values stored in another width give the same digest."""
    storage = variable.storages[0]
    if storage.values is None or storage.kind == "existing":
        return None
    size = math.prod(storage.shape) * variable.layout.dtype.storage.itemsize
    if not isinstance(storage.values, Constant) and size > COMPARED_VALUES:
        return None
    values = np.asarray(storage.values())
    if values.dtype.kind == "f":
        values = values.astype("<f8")
    elif values.dtype.kind in "iub":
        values = values.astype("<i8") if values.dtype.kind != "u" or values.dtype.itemsize < 8 else values
    elif values.dtype.kind in "OU":
        values = np.char.encode(values.astype(str), "utf-8", "surrogateescape")
    import hashlib

    text = f"{values.dtype.kind}{values.shape}".encode()
    return hashlib.sha256(text + np.ascontiguousarray(values).tobytes()).hexdigest()[:32]


def notes(first: Group, others: list[tuple[str, Group]], typed: bool = True) -> list[str]:
    """One note listing the attributes that do not change the numbers but differ from the first file's
    (which are kept), if any (``typed``: the first's attribute types are known)."""
    differ: dict[str, set[str]] = {}
    for _, root in others:
        for group in first.walk():
            twin = find_group(root, group.path)
            if twin is None:
                continue
            names = _names(group.attrs, twin.attrs)
            for name in differing(dict(group.attrs), dict(twin.attrs), names, typed):
                differ.setdefault(group.path, set()).add(name)
            for key, variable in group.variables.items():
                theirs = twin.variables.get(key)
                if theirs is None:
                    continue
                names = [n for n in _names(variable.attrs, theirs.attrs) if n not in MEANING]
                for name in differing(dict(variable.attrs), dict(theirs.attrs), names, typed):
                    differ.setdefault(variable.key, set()).add(name)
    if not differ:
        return []
    listed = "; ".join(f"{path}: {', '.join(sorted(names))}" for path, names in sorted(differ.items()))
    return [f"attributes that differ between the files keep the first file's values ({listed})"]


def _names(a, b) -> list[str]:
    return list(dict.fromkeys([*a, *b]))


# ------------------------------------------------------------------------------------------ settling
def settle(variable: SourceVariable) -> str | None:
    """Make a joined variable whose meaning differs between files right (``variable.twins`` are the other
    files' variables, in the order of its storages; a twin that is the variable itself shares the first
    file's attributes): time-valued variables re-encoded in one encoding, others stored decoded. Returns
    why the variable must be loaded, or None when its files agree."""
    mine = attributes(variable)
    theirs = [mine if twin is variable else attributes(twin) for twin in variable.twins]
    typed = not variable.untyped
    pairs = zip(variable.twins, theirs, strict=True)
    others = [(twin, other) for twin, other in pairs if twin is not variable]  # a twin shares my attributes
    names = sorted({name for _, other in others for name in differing(mine, other, typed=typed)})
    for twin, other in others:
        names += [name for name in _packed_types(variable, twin, mine, other) if name not in names]
    if not names:
        return None
    variable.source_attrs = dict(variable.attrs)
    if is_time_valued(mine) and set(names) <= {"units", "calendar"}:
        _retime(variable, [mine, *theirs])
        return f"its time units differ between files ({names[0]}): re-encoded in one"
    _decode(variable, [mine, *theirs])
    return f"its {names[0]} differs between files: stored decoded"


def _retime(variable: SourceVariable, every: list[Mapping[str, object]]) -> None:
    parts = [
        timecoding.TimePart(
            np.asarray(storage.values()), str(attrs["units"]), _text(attrs.get("calendar")), storage.source
        )
        for storage, attrs in zip(variable.storages, every, strict=True)
    ]
    for part, attrs in zip(parts, every, strict=True):
        if part.values.dtype.kind not in "iuf":
            raise FormatError(f"{variable.key!r} of {part.source}: time values of type {part.values.dtype}")
        _refuse_fills(variable, part, attrs)
    values, units, dtype = timecoding.join(parts, variable.key)
    _replace_values(variable, values, np.dtype(dtype))
    variable.attrs.set("units", units)
    variable.coding = "retimed"


def _refuse_fills(variable: SourceVariable, part, attrs: Mapping[str, object]) -> None:
    """Masked times cannot be re-encoded here: refused by name rather than shifted."""
    values = part.values
    fills = [attrs.get(name) for name in ("_FillValue", "missing_value") if attrs.get(name) is not None]
    masked = np.isnan(values).any() if values.dtype.kind == "f" else False
    for fill in fills:
        masked = masked or bool(np.isin(values, np.asarray(fill, dtype=values.dtype)).any())
    if masked:
        raise FormatError(
            f"{variable.key!r} of {part.source} holds fill values among times whose units differ from the "
            "first file's: nczmap cannot re-encode them"
        )


def _replace_values(variable: SourceVariable, values: np.ndarray, dtype: np.dtype) -> None:
    """The joined ``values`` in place of the storages' own, each storage its slice along the joined axis."""
    axis = variable.axis or 0
    start = 0
    for storage in variable.storages:
        length = storage.shape[axis] if storage.shape else 1
        piece = np.take(values, range(start, start + length), axis=axis) if values.ndim else values
        storage.values = Constant(np.ascontiguousarray(piece.astype(dtype, copy=False)))
        start += length
    set_dtype(variable, dtype)


def set_dtype(variable: SourceVariable, dtype: np.dtype) -> None:
    """Store ``variable`` as ``dtype`` (little-endian), its fill value (and ``_FillValue``) with it: the
    new type's default where it was the old type's default, the same value where the new type holds it
    exactly, else the new type's default (the values were checked to hold no fill)."""
    dtype = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)
    old_type, new_type = variable.layout.dtype.nctype, type_of_numpy(dtype)
    fill = variable.layout.fill_value
    variable.layout.dtype = native_dtype(new_type, dtype)
    if fill is not None and not new_type.is_text:
        variable.layout.fill = _refilled(fill, old_type, new_type)
    if "_FillValue" in variable.attrs and not new_type.is_text:
        held = _exactly(variable.attrs["_FillValue"], new_type.numpy)
        if held is None:
            del variable.attrs["_FillValue"]
        else:
            variable.attrs.set("_FillValue", held)


def _refilled(fill: object, old_type, new_type) -> object:
    if not old_type.is_text and _same_number(fill, old_type.fill):
        return new_type.numpy.type(new_type.fill)
    held = _exactly(fill, new_type.numpy)
    return held if held is not None else new_type.numpy.type(new_type.fill)


def _same_number(a: object, b: object) -> bool:
    with np.errstate(all="ignore"):
        return bool(np.asarray(a, dtype="f8") == np.asarray(b, dtype="f8"))


def _exactly(value: object, dtype: np.dtype) -> object | None:
    """``value`` as a ``dtype`` scalar if that holds it exactly, else None."""
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "iuf":
        return None
    number = array.ravel()[0]
    with np.errstate(all="ignore"):
        if np.dtype(dtype).kind in "iu":
            if not np.isfinite(number) or number != np.floor(number):
                return None
            info = np.iinfo(dtype)
            if not info.min <= int(number) <= info.max:
                return None
            return np.dtype(dtype).type(int(number))
        converted = np.dtype(dtype).type(number)
        return converted if float(converted) == float(number) or np.isnan(number) else None


def _decode(variable: SourceVariable, every: list[Mapping[str, object]]) -> None:
    dtypes = []
    stored = [variable.layout.dtype.storage] + [twin.layout.dtype.storage for twin in variable.twins]
    for storage, attrs, storage_dtype in zip(variable.storages, every, stored, strict=True):
        dtypes.append(cfdecode.decoded_dtype(np.dtype(storage_dtype.newbyteorder("=")), attrs))
        storage.values = Decoded(storage, dict(attrs), f"{variable.key!r} of {storage.source}")
    dtype = np.dtype(cfdecode.joined_dtype(dtypes))
    if dtype.kind not in "iuf":
        raise FormatError(f"{variable.key!r}: its values decode to {dtype}, which cannot be stored")
    kept = cfdecode.stored_attributes(every[0], dtype)
    for name in list(variable.attrs):
        if name not in kept:
            del variable.attrs[name]
    for name, value in kept.items():
        variable.attrs.set(name, value if name != "_FillValue" else Attribute.from_python(name, value))
    set_dtype(variable, dtype)
    variable.layout.fill = np.array(np.nan, dtype=dtype)[()] if dtype.kind == "f" else None
    variable.coding = "decoded"


class Decoded:
    """One file's values of a variable, decoded with that file's attributes (a storage's ``values``)."""

    def __init__(self, storage: Storage, attrs: dict[str, object], where: str) -> None:
        self.raw = storage.values
        self.attrs = attrs
        self.where = where

    def __call__(self) -> np.ndarray:
        if self.raw is None:
            raise FormatError(f"{self.where}: its values cannot be read")
        return cfdecode.decode(np.asarray(self.raw()), self.attrs, self.where)
