"""Joining parsed sources into one dataset: which variable is referenced, which is loaded, which refused.

Every file is checked against the first: the same groups, dimensions (but the joined one), variables,
netCDF types and shapes; a mismatch is a FormatError naming the file and what differs, or, with
``skip_mismatched``, the file is left out and listed. Sources are joined

- along an existing dimension (``concat``): variables using it take their chunks from every file,
  shifted along it; the others come from the first file;
- or stacked along a new leading dimension (``new_dim``): each file is one step of it, its coordinate
  taken from the file name by a ``strftime`` pattern and written as CF time; variables that are not
  coordinates or grid mappings gain the dimension.

A variable is **loaded** (its values read once and stored in the manifest, or beside it) rather than
referenced when the user names it (``load``), when it is the coordinate of the joined dimension, when
its bytes are not byte ranges (NC_STRING, computed coordinates, compact data) or cannot be decoded by
one codec chain (filters numcodecs lacks, chunks skipping filters), and when its chunks do not line up
with the files along the joined dimension. Only what cannot be represented at all is refused.
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nczmap.errors import FormatError
from nczmap.format import Attribute, Dimension, Group
from nczmap.format.codecs import CodecChain
from nczmap.format.types import BY_NAME
from nczmap.format.writer import TARGET_CHUNK_BYTES
from nczmap.integrations.virtualize.parsed import (
    Constant,
    ParsedFile,
    Refusal,
    SourceVariable,
    Storage,
    native_dtype,
    source_layout,
)

DEFAULT_MAX_CHUNK_BYTES = TARGET_CHUNK_BYTES  # contiguous data is referenced in pieces no larger than this
DEFAULT_MAX_LOAD_BYTES = 2 << 30  # a variable larger than this is refused rather than loaded into memory


@dataclass
class CombineOptions:
    concat: str | None = None  # the dimension the sources are joined along
    new_dim: tuple[str, str] | None = None  # (name, strftime pattern): stack along a new dimension
    load: Sequence[str] = ()  # variables (names or paths) to load rather than reference
    skip_mismatched: bool = False
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    max_load_bytes: int = DEFAULT_MAX_LOAD_BYTES


@dataclass
class Plan:
    root: Group
    variables: list[SourceVariable]  # in the result: referenced, or loaded (``variable.load``)
    refused: list[Refusal]
    sources: list[str]  # the files joined, in order
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why) left out
    notes: list[str] = field(default_factory=list)  # gaps in a new dimension, and the like


def plan(parsed: list[ParsedFile], options: CombineOptions) -> Plan:
    """The joined dataset of ``parsed`` (the first file's model, grown along the joined dimension)."""
    notes: list[str] = []
    concat = options.concat
    if options.new_dim is not None:
        if concat is not None:
            raise FormatError("join the sources along an existing dimension (concat) or a new one, not both")
        name, pattern = options.new_dim
        parsed, times = _stack(parsed, name, pattern)
        dates = {id(file): time for file, time in zip(parsed, times, strict=True)}
        concat = name
    if len(parsed) > 1 and concat is None:
        raise FormatError(f"{len(parsed)} sources need a dimension to join them along (concat=, --concat)")
    first = parsed[0]
    skipped: list[tuple[str, str]] = []
    if concat is not None:
        dimension = _concat_dimension(first, concat)
        kept = [first]
        for other in parsed[1:]:
            try:
                if other.like is not first:  # a twin of the first has its model, by construction
                    _check_same_structure(first, other, dimension)
            except FormatError as exc:
                if not options.skip_mismatched:
                    raise
                skipped.append((other.source, str(exc)))
                continue
            kept.append(other)
        parsed = kept
    if options.new_dim is not None:  # gaps among the files kept (a skipped file may leave one)
        notes = _gaps([dates[id(file)] for file in parsed])
    result = Plan(first.root, [], list(first.refused), [p.source for p in parsed], skipped, notes)
    variables = [v for g in first.root.walk() for v in g.variables.values()]
    if concat is not None:
        _join(parsed, dimension, variables, result)
    wanted = set(options.load)
    for variable in variables:
        if variable.key in _refused_variables(result.refused):
            continue
        reason = _reference_problem(variable, parsed, options)
        if variable.name in wanted or variable.key in wanted:
            reason = reason or "asked for"
        if reason is None and concat is not None and _is_joined_coordinate(variable):
            reason = "the coordinate of the joined dimension"
        if reason is not None:
            refusal = _load(variable, options)
            if refusal is not None:
                result.refused.append(
                    Refusal(
                        variable.key,
                        f"{refusal} (it could not be referenced: {reason})",
                        variable.storages[0].source,
                    )
                )
                continue
        result.variables.append(variable)
    unknown = wanted - {v.name for v in variables} - {v.key for v in variables}
    if unknown:
        raise FormatError(f"no variable {sorted(unknown)} to load in {first.source}")
    return result


# ------------------------------------------------------------------------------------- joining
def _join(
    parsed: list[ParsedFile], dimension: Dimension, variables: list[SourceVariable], result: Plan
) -> None:
    lengths = [dimension.size]
    for other in parsed[1:]:
        lengths.append(lengths[0] if other.root is None else other.root.find_dimension(dimension.path).size)
        known = _refused_variables(result.refused)
        result.refused.extend(r for r in other.refused if r.attribute is None and r.variable not in known)
    dimension.size = sum(lengths)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    for variable in variables:
        axes = [i for i, d in enumerate(variable.dims) if d is dimension]
        if len(axes) > 1:
            result.refused.append(
                Refusal(variable.key, f"it uses {dimension.name!r} twice", parsed[0].source)
            )
            continue
        if not axes:
            continue
        variable.axis = axes[0]
        for other in parsed[1:]:
            if other.root is None:  # a twin: the first file's model, its own storages
                variable.storages.append(other.storages[variable.key])
                variable.twins.append(variable)
                continue
            theirs = _find_variable(other.root, variable.key)
            if theirs is not None:
                variable.storages.append(theirs.storages[0])
                variable.twins.append(theirs)
        variable.shifts = starts
        variable.layout.shape = tuple(d.size for d in variable.dims)


def _is_joined_coordinate(variable: SourceVariable) -> bool:
    return variable.axis is not None and len(variable.dims) == 1 and variable.dims[0].name == variable.name


def _refused_variables(refusals: list[Refusal]) -> set[str]:
    return {r.variable for r in refusals if r.attribute is None}


def _concat_dimension(parsed: ParsedFile, name: str) -> Dimension:
    root = parsed.root
    found = root.find_dimension(name) if name.startswith("/") else root.dimensions.get(name)
    if found is None:
        raise FormatError(f"{parsed.source} has no dimension {name!r} to join the sources along")
    return found


def _find_variable(root: Group, path: str) -> SourceVariable | None:
    *groups, name = path.strip("/").split("/")
    group = root
    for part in groups:
        group = group.groups.get(part)
        if group is None:
            return None
    return group.variables.get(name)


def _find_group(root: Group, path: str) -> Group | None:
    group = root
    for part in [p for p in path.strip("/").split("/") if p]:
        group = group.groups.get(part)
        if group is None:
            return None
    return group


def _check_same_structure(first: ParsedFile, other: ParsedFile, concat: Dimension) -> None:
    """FormatError naming ``other`` unless it has ``first``'s groups, dimensions and variables."""

    def fail(what: str) -> None:
        raise FormatError(f"{other.source} cannot be joined to {first.source} along {concat.path!r}: {what}")

    refused = _refused_variables(first.refused) | _refused_variables(other.refused)
    for group in first.root.walk():
        twin = _find_group(other.root, group.path)
        if twin is None:
            fail(f"it has no group {group.path!r}")
        if set(twin.groups) != set(group.groups):
            fail(f"group {group.path!r} has subgroups {sorted(twin.groups)}, not {sorted(group.groups)}")
        if list(twin.dimensions) != list(group.dimensions):
            fail(f"group {group.path!r} has dimensions {list(twin.dimensions)}, not {list(group.dimensions)}")
        for name, dim in group.dimensions.items():
            theirs = twin.dimensions[name]
            if dim is not concat and theirs.size != dim.size:
                fail(f"dimension {dim.path!r} has length {theirs.size}, not {dim.size}")
            if theirs.unlimited != dim.unlimited:
                fail(f"dimension {dim.path!r} is {'' if theirs.unlimited else 'not '}unlimited")
        mine = [n for n in group.variables if _path(group, n) not in refused]
        theirs_names = [n for n in twin.variables if _path(group, n) not in refused]
        if set(mine) != set(theirs_names):
            missing = sorted(set(mine) - set(theirs_names))
            extra = sorted(set(theirs_names) - set(mine))
            fail(f"variables of {group.path!r} differ (missing {missing}, extra {extra})")
        for name in mine:
            a, b = group.variables[name], twin.variables[name]
            if [d.path for d in a.dims] != [d.path for d in b.dims]:
                fail(f"variable {a.key!r} has dimensions {b.dimensions}, not {a.dimensions}")
            if a.nctype is not b.nctype:
                fail(f"variable {a.key!r} is {b.nctype.name}, not {a.nctype.name}")
            for dim, x, y in zip(a.dims, a.shape, b.shape, strict=True):
                if dim is not concat and x != y:
                    fail(f"variable {a.key!r} has shape {b.shape}, not {a.shape}")


def _path(group: Group, name: str) -> str:
    return group.path.rstrip("/") + "/" + name


# ------------------------------------------------------------------------------------- referencing
def _reference_problem(
    variable: SourceVariable, parsed: list[ParsedFile], options: CombineOptions
) -> str | None:
    """Why ``variable`` cannot be references (None: it can; its chunk layout is then fixed)."""
    storages = variable.storages
    for storage in storages:
        if storage.kind == "values":
            return "its data is not stored as byte ranges"
        if storage.problem is not None:
            return storage.problem
    first = storages[0]
    for storage, twin in zip(storages[1:], variable.twins, strict=True):
        if twin is variable:
            continue  # a twin file's storage: the first file's layout, by construction
        why = _differences(variable, twin, first, storage)
        if why is not None:
            return why
    if variable.layout.dtype.nctype.name == "string":
        return "its strings are not stored as byte ranges"
    if first.kind == "chunked":
        return _chunked_layout(variable)
    return _contiguous_layout(variable, options.max_chunk_bytes)


def _chunked_layout(variable: SourceVariable) -> str | None:
    axis, storages = variable.axis, variable.storages
    if axis is None:
        return None
    step = storages[0].chunks[axis]
    for storage in storages[:-1]:
        if storage.shape[axis] % step:
            return (
                f"its chunk length {step} along the joined dimension does not divide the length "
                f"{storage.shape[axis]} of {storage.source} (only the last file may end with a partial chunk)"
            )
    variable.shifts = [start // step for start in variable.shifts]
    return None


def _contiguous_layout(variable: SourceVariable, max_bytes: int) -> str | None:
    """Chunks of whole rows (``(1, ..., 1, k, full...)``: each one byte range of the contiguous data)."""
    storages, axis = variable.storages, variable.axis
    shape = storages[0].shape
    if not shape:
        variable.layout.chunks = ()
        return None
    itemsize = variable.layout.dtype.storage.itemsize
    lengths = [s.shape[axis] for s in storages] if axis is not None else []
    split = _split_axis(shape, itemsize, max_bytes)
    tail = math.prod(shape[split + 1 :]) * itemsize
    if axis is None or axis < split:
        rows = _rows(shape[split], tail, max_bytes)
    elif axis == split:
        rows = _rows(math.gcd(*lengths[:-1]) if len(lengths) > 1 else lengths[0], tail, max_bytes)
        if len(lengths) > 1:
            rows = _largest_divisor(math.gcd(*lengths[:-1]), rows)
    else:
        if len(set(lengths)) > 1:
            return (
                f"it is stored contiguously and joined along its axis {axis}, so every file needs the same "
                f"length along it (not {sorted(set(lengths))})"
            )
        rows = _rows(shape[split], tail, max_bytes)
    chunks = (*tuple(1 for _ in shape[:split]), max(1, rows), *tuple(max(1, n) for n in shape[split + 1 :]))
    variable.layout.chunks = chunks
    variable.split = split
    if axis is not None:
        variable.shifts = [start // chunks[axis] for start in variable.shifts]
    return None


def _split_axis(shape: tuple[int, ...], itemsize: int, max_bytes: int) -> int:
    """The first axis whose rows (everything after it) fit in ``max_bytes``."""
    for axis in range(len(shape)):
        if math.prod(shape[axis + 1 :]) * itemsize <= max_bytes:
            return axis
    return len(shape) - 1


def _rows(count: int, row_bytes: int, max_bytes: int) -> int:
    """Rows per chunk: all of them when they fit; else the largest divisor of ``count`` that fits, unless
    that makes chunks tiny: then as many as fit, the last chunk partial (it is then stored, not
    referenced, so a divisor is preferred while it keeps chunks at a quarter of the bound or more)."""
    if count <= 0:
        return 1
    fit = max(1, min(count, max_bytes // max(1, row_bytes)))
    divisor = _largest_divisor(count, fit)
    return divisor if divisor * 4 >= fit else fit


def _largest_divisor(count: int, at_most: int) -> int:
    best = 1
    for low in range(1, math.isqrt(count) + 1):
        if count % low == 0:
            for divisor in (low, count // low):
                if divisor <= at_most:
                    best = max(best, divisor)
    return best


def _differences(
    variable: SourceVariable, other: SourceVariable, mine: Storage, theirs: Storage
) -> str | None:
    if theirs.kind != mine.kind:
        return f"it is stored {theirs.kind} in {theirs.source} but {mine.kind} in {mine.source}"
    if theirs.kind == "chunked" and theirs.chunks != mine.chunks:
        return f"its chunks are {theirs.chunks} in {theirs.source} but {mine.chunks} in {mine.source}"
    if theirs.codecs != mine.codecs:
        return f"its filters {theirs.codecs} in {theirs.source} differ from {mine.codecs} in {mine.source}"
    theirs_dtype, mine_dtype = other.layout.dtype.storage, variable.layout.dtype.storage
    if theirs_dtype != mine_dtype:
        return f"it is stored as {theirs_dtype} in {theirs.source} but {mine_dtype} in {mine.source}"
    if not _same_fill(other.layout.fill_value, variable.layout.fill_value):
        return f"its fill value differs in {theirs.source}"
    return None


def _same_fill(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, bytes) or isinstance(b, bytes):
        return a == b
    return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


# ------------------------------------------------------------------------------------- loading
def _load(variable: SourceVariable, options: CombineOptions) -> str | None:
    """Mark ``variable`` to be loaded, with chunks of at most ``max_chunk_bytes``; why not, if it cannot."""
    for storage in variable.storages:
        if storage.values is None:  # a parser giving no values (TIFF): decode its referenceable chunks
            storage.values = _decoded_chunks(variable, storage)
    if any(storage.values is None for storage in variable.storages):
        return "its values cannot be read"
    layout = variable.layout
    itemsize = max(1, layout.dtype.storage.itemsize)
    nbytes = math.prod(layout.shape) * itemsize if layout.shape else itemsize
    if nbytes > options.max_load_bytes:
        return f"it holds {nbytes} bytes, more than the {options.max_load_bytes} loaded into memory"
    variable.load = True
    if layout.shape:
        split = _split_axis(layout.shape, itemsize, options.max_chunk_bytes)
        rows = _rows(
            layout.shape[split], math.prod(layout.shape[split + 1 :]) * itemsize, options.max_chunk_bytes
        )
        layout.chunks = (
            *(1 for _ in layout.shape[:split]),
            rows,
            *(max(1, n) for n in layout.shape[split + 1 :]),
        )
    if not _encodable(layout.codecs):
        layout.codecs = CodecChain([], None, itemsize)
    return None


def _decoded_chunks(variable: SourceVariable, storage: Storage) -> Callable[[], np.ndarray] | None:
    """``storage``'s whole array read from its chunks and decoded by its own codecs (missing chunks are the
    fill value), for a storage whose bytes could be references; None where they could not."""
    if storage.kind != "chunked" or storage.problem is not None or storage.read is None:
        return None
    dtype = variable.layout.dtype.storage
    chain = CodecChain(list(storage.codecs), None, dtype.itemsize)
    where = f"{variable.key!r} in {storage.source}"
    try:
        chain._instances(where)
    except FormatError:
        return None

    def values() -> np.ndarray:
        fill = variable.layout.fill_value
        shape, chunks, ndim = storage.shape, storage.chunks, len(storage.chunks)
        out = np.full(shape, 0 if fill is None else fill, dtype=dtype)
        count = math.prod(chunks)
        nbytes = count * dtype.itemsize
        for number in range(len(storage.offsets)):
            corner = tuple(storage.corners[number * ndim : (number + 1) * ndim])
            if any(c >= n for c, n in zip(corner, shape, strict=True)):
                continue
            raw = storage.read(storage.offsets[number], storage.sizes[number])
            data = chain.decode(raw, f"a chunk of {where}", nbytes)
            flat = np.frombuffer(data if isinstance(data, bytes) else memoryview(data).cast("B"), np.uint8)
            if flat.size != nbytes:
                raise FormatError(f"a chunk of {where} decodes to {flat.size} bytes, not {nbytes}")
            chunk = flat.view(dtype).reshape(chunks)
            within = tuple(slice(0, min(k, n - c)) for c, k, n in zip(corner, chunks, shape, strict=True))
            out[tuple(slice(c, c + w.stop) for c, w in zip(corner, within, strict=True))] = chunk[within]
        return out

    return values


def _encodable(codecs: CodecChain) -> bool:
    try:
        codecs.encode(b"", "a loaded variable")
    except Exception:
        return False
    return True


def loaded_values(variable: SourceVariable) -> np.ndarray:
    """A loaded variable's whole array: its sources' values, joined along its joined axis."""
    parts = [np.asarray(storage.values()) for storage in variable.storages]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts, axis=variable.axis)


# ------------------------------------------------------------------------------------- a new dimension
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


def _stack(parsed: list[ParsedFile], name: str, pattern: str):
    """Files ordered by the dates in their names, each given the new leading dimension ``name`` of
    length 1 and its step of the coordinate variable; each file's date, in that order. Duplicates are a
    FormatError naming the files."""
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


def _gaps(times: list[datetime.datetime]) -> list[str]:
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
    ndim = len(storage.shape)
    storage.shape = (1, *storage.shape)
    if storage.kind == "chunked":
        storage.chunks = (1, *storage.chunks)
        old = np.frombuffer(storage.corners, dtype=np.int64).reshape(-1, ndim) if ndim else None
        grown = np.zeros((len(storage.offsets), ndim + 1), dtype=np.int64)
        if old is not None:
            grown[:, 1:] = old
        storage.corners = type(storage.corners)(storage.corners.typecode, grown.tobytes())
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
