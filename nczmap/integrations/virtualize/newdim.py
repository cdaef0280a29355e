"""Stacking files along a new leading dimension whose coordinate comes from each file's name.

``--new-dim time=%Y%m%d``: each file is one step of the new dimension, its date taken from the file name by
a ``strftime`` pattern and written as CF time (days, or seconds where a date has a time of day, since the
first date); variables that are not coordinates or grid mappings gain the dimension. Files are ordered by
their dates; two files of one date are an error naming both; gaps are listed for a warning.
"""

from __future__ import annotations

import datetime
import itertools
import os
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from nczmap.errors import FormatError
from nczmap.format import Attribute, Dimension, Group
from nczmap.format.types import BY_NAME
from nczmap.integrations.virtualize.parsed import (
    Constant,
    ParsedFile,
    SourceVariable,
    Storage,
    native_dtype,
    source_layout,
)

_DIRECTIVES = {
    "Y": r"\d{4}",
    "m": r"\d{2}",
    "d": r"\d{2}",
    "H": r"\d{2}",
    "M": r"\d{2}",
    "S": r"\d{2}",
    "j": r"\d{3}",
    "y": r"\d{2}",
    "b": r"[A-Za-z]{3}",
    "B": r"[A-Za-z]+",
    "%": "%",
}


def times_from_names(names: Sequence[str], pattern: str) -> list[datetime.datetime]:
    """Each file name's date by a ``strftime`` pattern (``%Y%m%d``) found anywhere in its base name."""
    regex = re.compile(pattern_regex(pattern))
    found = []
    for name in names:
        base = os.path.basename(name.rstrip("/"))
        match = regex.search(base)
        if match is None:
            raise FormatError(f"{name}: its name holds no date of the form {pattern!r}")
        try:
            found.append(datetime.datetime.strptime(match.group(0), pattern))
        except ValueError as exc:
            raise FormatError(
                f"{name}: {match.group(0)!r} is not a date of the form {pattern!r}: {exc}"
            ) from None
    return found


def pattern_regex(pattern: str) -> str:
    parts, at = [], 0
    while at < len(pattern):
        if pattern[at] == "%" and at + 1 < len(pattern):
            directive = pattern[at + 1]
            if directive not in _DIRECTIVES:
                raise FormatError(f"the date pattern {pattern!r} uses %{directive}, which is not supported")
            parts.append(_DIRECTIVES[directive])
            at += 2
        else:
            parts.append(re.escape(pattern[at]))
            at += 1
    return "".join(parts)


def stack(parsed: list[ParsedFile], name: str, pattern: str):
    """Files ordered by the dates in their names, each given the new leading dimension ``name`` of
    length 1 and its step of the coordinate variable; each file's date, in that order. Duplicates are a
    FormatError naming the files. Appending, the dataset (the first, of format ``existing``) has the
    dimension and its coordinate already: only the files are stacked (its date is None)."""
    existing = parsed[0] if parsed and parsed[0].format == "existing" else None
    if existing is not None:
        if name not in existing.model.dimensions or name not in existing.model.variables:
            raise FormatError(f"{existing.source} has no dimension and coordinate {name!r} to append along")
        files, times = stack(parsed[1:], name, pattern)
        return [existing, *files], [None, *times]
    times = times_from_names([p.source for p in parsed], pattern)
    order = sorted(range(len(parsed)), key=lambda i: times[i])
    parsed = [parsed[i] for i in order]
    times = [times[i] for i in order]
    duplicates = [t for t, n in Counter(times).items() if n > 1]
    if duplicates:
        same = [p.source for p, t in zip(parsed, times, strict=True) if t == duplicates[0]]
        raise FormatError(f"files {same} have the same date {duplicates[0].isoformat()} ({pattern!r})")
    if parsed[0].root is None:
        raise FormatError(f"{parsed[0].source} is a twin of a file, not the first of the sources")
    for file in parsed:
        if file.root is not None and (name in file.root.dimensions or name in file.root.variables):
            raise FormatError(f"{file.source} already has a {name!r}: join along it with --concat")
    grown: list[str] = []  # the first file's variables given the dimension: its twins' too
    for file in parsed:
        if file.root is None:
            for key in grown:
                _prepend_storage(file.storages[key])
        elif file is parsed[0]:
            grown = _add_leading_dimension(file, name)
        else:
            _add_leading_dimension(file, name)
    step = _time_unit(times)[1]
    for file, when in zip(parsed, times, strict=True):  # every file its own step: joined like any other
        storage = _time_storage(when, times[0], step)
        if file.root is None:
            file.storages["/" + name] = storage
        else:
            _time_coordinate(file.root, name, storage, times)
    return parsed, times


def gaps(times: list[datetime.datetime]) -> list[str]:
    if len(times) < 3:
        return []
    steps = Counter(b - a for a, b in itertools.pairwise(times))
    usual = steps.most_common(1)[0][0]
    return [
        f"a gap in time: {a.isoformat()} is followed by {b.isoformat()} (the usual step is {usual})"
        for a, b in itertools.pairwise(times)
        if b - a != usual
    ]


def _add_leading_dimension(file: ParsedFile, name: str) -> list[str]:
    """The dimension added to ``file``'s model and to its variables (but coordinates and grid
    mappings); the paths of the variables given it."""
    root = file.root
    dimension = Dimension(name, 1, False, root)
    root.dimensions = {name: dimension, **root.dimensions}
    skip = _grid_mappings(root)
    grown = []
    for group in root.walk():
        for variable in group.variables.values():
            is_coordinate = len(variable.dims) == 1 and variable.dims[0].name == variable.name
            if is_coordinate or variable.key in skip or variable.name in skip:
                continue
            _prepend(variable, dimension)
            grown.append(variable.key)
    return grown


def _grid_mappings(root: Group) -> set[str]:
    names = set()
    for group in root.walk():
        for variable in group.variables.values():
            value = variable.attrs.get("grid_mapping")
            if isinstance(value, str):
                names.add(value.split(":")[0].strip())
    return names


def _prepend(variable: SourceVariable, dimension: Dimension) -> None:
    variable.dims = (dimension, *variable.dims)
    layout = variable.layout
    layout.shape = (1, *layout.shape)
    layout.chunks = (1, *layout.chunks) if layout.chunks or not layout.scalar else (1,)
    layout.scalar = False
    for storage in variable.storages:
        _prepend_storage(storage)


def _prepend_storage(storage: Storage) -> None:
    spill = storage.spill_file  # the columns spilled are read, grown and spilled again
    ndim = len(storage.shape)
    storage.shape = (1, *storage.shape)
    if storage.kind == "chunked":
        storage.chunks = (1, *storage.chunks)
        old = np.frombuffer(storage.corners, dtype=np.int64).reshape(-1, ndim) if ndim else None
        grown = np.zeros((len(storage.offsets), ndim + 1), dtype=np.int64)
        if old is not None:
            grown[:, 1:] = old
        storage.corners = type(storage.corners)(storage.corners.typecode, grown.tobytes())
        if spill is not None:
            storage.spill(spill)
    values = storage.values
    if values is not None:
        storage.values = lambda values=values: np.asarray(values())[np.newaxis]


def _time_unit(every: list[datetime.datetime]) -> tuple[str, datetime.timedelta]:
    """Whole days if every date is midnight, else seconds."""
    if all(t.hour == t.minute == t.second == t.microsecond == 0 for t in every):
        return "days", datetime.timedelta(days=1)
    return "seconds", datetime.timedelta(seconds=1)


def _time_storage(when: datetime.datetime, start: datetime.datetime, step: datetime.timedelta) -> Storage:
    """``when`` as CF time: a number of ``step`` since ``start``."""
    values = np.array([(when - start) // step], dtype="<i8")
    return Storage("the file names", "values", values.shape, values=Constant(values))


def _time_coordinate(root: Group, name: str, storage: Storage, every: list[datetime.datetime]) -> None:
    """The variable ``name(name)`` of ``storage``'s times (:func:`_time_storage` of ``every`` date)."""
    unit, start = _time_unit(every)[0], every[0]
    dimension = root.dimensions[name]
    shape = storage.shape
    layout = source_layout(shape, shape, native_dtype(BY_NAME["int64"], np.dtype("<i8")))
    variable = SourceVariable(root, name, [dimension], layout, storage)
    stamp = start.strftime("%Y-%m-%d %H:%M:%S")
    for key, value in (
        ("standard_name", "time"),
        ("units", f"{unit} since {stamp}"),
        ("calendar", "proleptic_gregorian"),
        ("axis", "T"),
    ):
        variable.attrs.load({key: Attribute.from_python(key, value, None)})
    root.variables = {name: variable, **root.variables}
