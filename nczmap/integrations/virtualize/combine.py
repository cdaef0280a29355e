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

import functools
import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nczmap.errors import FormatError
from nczmap.format import Dimension, Group
from nczmap.format.codecs import CodecChain
from nczmap.format.types import STRING, ParsedDtype
from nczmap.format.writer import TARGET_CHUNK_BYTES
from nczmap.integrations.virtualize import encodings, newdim
from nczmap.integrations.virtualize.parsed import ParsedFile, Refusal, SourceVariable, Storage, find_group

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
        parsed, times = newdim.stack(parsed, name, pattern)
        dates = {id(file): time for file, time in zip(parsed, times, strict=True)}
        concat = name
    if len(parsed) > 1 and concat is None:
        raise FormatError(f"{len(parsed)} sources need a dimension to join them along (concat=, --concat)")
    first = parsed[0]
    skipped: list[tuple[str, str]] = []
    if concat is not None:
        dimension = _concat_dimension(first, concat)
        kept = [first]
        kept_first: list[str] = []  # variables not joined whose files differ: the first file's kept
        for other in parsed[1:]:
            like = other.like
            if like is not None:  # a twin: its model is that of a file checked already (or the first)
                if like is first or any(file is like for file in kept):
                    kept.append(other)
                else:
                    skipped.append((other.source, f"it is like {like.source}, which is left out"))
                continue
            try:
                _check_same_structure(first, other, dimension)
                kept_first += _check_same_meaning(first, other, dimension, options, len(parsed))
            except FormatError as exc:
                if not options.skip_mismatched:
                    raise
                skipped.append((other.source, str(exc)))
                continue
            kept.append(other)
        parsed = kept
    if options.new_dim is not None:  # gaps among the files kept (a skipped file may leave one)
        notes = newdim.gaps([dates[id(file)] for file in parsed if dates[id(file)] is not None])
    if concat is not None and kept_first:
        counts = Counter(note.partition(" (")[0] for note in kept_first)
        listed = ", ".join(f"{key} (in {count} files)" for key, count in counts.items())
        notes.append(f"variables not along the joined dimension differ; the first file's are kept: {listed}")
    typed = not any(v.untyped for g in first.root.walk() for v in g.variables.values())
    others = [(p.source, p.model) for p in parsed[1:] if p.like is not first]
    notes += encodings.notes(first.root, others, typed)
    notes += [note for file in parsed for note in file.notes]
    result = Plan(first.root, [], list(first.refused), [p.source for p in parsed], skipped, notes)
    variables = [v for g in first.root.walk() for v in g.variables.values()]
    if concat is not None:
        _join(parsed, dimension, variables, result)
    wanted = set(options.load)
    for variable in variables:
        if variable.key in _refused_variables(result.refused):
            continue
        reason = None
        if variable.axis is not None and variable.twins:
            _ensure_values(variable)
            reason = encodings.settle(variable)
        reason = reason or _reference_problem(variable, parsed, options)
        if variable.name in wanted or variable.key in wanted:
            reason = reason or "asked for"
        if reason is None and concat is not None and is_joined_coordinate(variable):
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
        lengths.append(other.model.find_dimension(dimension.path).size)
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
            if other.root is None:  # a twin: the model of a file before it, its own storages
                variable.storages.append(other.storages[variable.key])
                variable.twins.append(_find_variable(other.model, variable.key) or variable)
                continue
            theirs = _find_variable(other.root, variable.key)
            if theirs is not None:
                variable.storages.append(theirs.storages[0])
                variable.twins.append(theirs)
        variable.shifts = starts
        variable.layout.shape = tuple(d.size for d in variable.dims)


def is_joined_coordinate(variable: SourceVariable) -> bool:
    """Whether ``variable`` is the coordinate variable of the joined dimension."""
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


def _check_same_structure(first: ParsedFile, other: ParsedFile, concat: Dimension) -> None:
    """FormatError naming ``other`` unless it has ``first``'s groups, dimensions and variables."""

    def fail(what: str) -> None:
        raise FormatError(f"{other.source} cannot be joined to {first.source} along {concat.path!r}: {what}")

    refused = _refused_variables(first.refused) | _refused_variables(other.refused)
    for group in first.root.walk():
        twin = find_group(other.model, group.path)
        if twin is None:
            fail(f"it has no group {group.path!r}")
        if set(twin.groups) != set(group.groups):
            fail(f"group {group.path!r} has subgroups {sorted(twin.groups)}, not {sorted(group.groups)}")
        if set(twin.dimensions) != set(group.dimensions):
            fail(f"group {group.path!r} has dimensions {list(twin.dimensions)}, not {list(group.dimensions)}")
        for name, dim in group.dimensions.items():
            theirs = twin.dimensions[name]
            if dim is not concat and theirs.size != dim.size:
                fail(f"dimension {dim.path!r} has length {theirs.size}, not {dim.size}")
            if theirs.unlimited != dim.unlimited and first.format != "existing":  # a store may not say
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
            numbers = not (a.nctype.is_text or b.nctype.is_text)  # joined in the type holding both
            if a.nctype is not b.nctype and not numbers:
                fail(f"variable {a.key!r} is {b.nctype.name}, not {a.nctype.name}")
            for dim, x, y in zip(a.dims, a.shape, b.shape, strict=True):
                if dim is not concat and x != y:
                    fail(f"variable {a.key!r} has shape {b.shape}, not {a.shape}")


def _check_same_meaning(
    first: ParsedFile, other: ParsedFile, concat: Dimension, options: CombineOptions, count: int
) -> list[str]:
    """FormatError naming ``other``, the variable and the attribute unless every variable's numbers mean
    what they mean in ``first`` or can be made to (see :mod:`.encodings`); the variables not joined that
    differ (the first file's kept)."""
    differ: list[str] = []
    wanted = set(options.load)

    def may_decode(variable: SourceVariable, theirs: SourceVariable) -> bool:
        if first.format == "existing":  # the dataset's own values are never rewritten
            return encodings.holds_decoded(variable, theirs)
        if variable.name in wanted or variable.key in wanted:
            return True
        return math.prod(variable.storages[0].shape) * 8 * count <= options.max_chunk_bytes

    for group in first.root.walk():
        twin = find_group(other.model, group.path)
        if twin is None:
            continue
        for name, variable in group.variables.items():
            theirs = twin.variables.get(name)
            if theirs is None:
                continue
            joined = any(d is concat for d in variable.dims)
            note = encodings.check(variable, theirs, joined, other.source, first.source, may_decode)
            if note is not None:
                differ.append(note)
    return differ


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
    if variable.layout.dtype.nctype.name == "string":
        return "its strings are not stored as byte ranges"
    if first.kind == "existing":
        return _existing_layout(variable)
    for storage, twin in zip(storages[1:], variable.twins, strict=True):
        if twin is variable:
            continue  # a twin file's storage: the first file's layout, by construction
        why = _differences(variable, twin, first, storage)
        if why is not None:
            return why
    if first.kind == "chunked":
        return _chunked_layout(variable)
    return _contiguous_layout(variable, options.max_chunk_bytes)


def _existing_layout(variable: SourceVariable) -> str | None:
    """Appending: whether the new files' storages are references in the dataset's own layout (its chunks,
    codecs, type and fill, which never change); why not, if so (their values are then written)."""
    layout, axis = variable.layout, variable.axis
    existing, *new = variable.storages
    if axis is None:
        return None  # not joined: the dataset keeps its own
    step = layout.chunks[axis] if layout.chunks else 1
    if existing.shape[axis] % step:
        return (
            f"the dataset's length {existing.shape[axis]} along the joined dimension is not a multiple of "
            f"its chunk length {step}"
        )
    for storage, twin in zip(new, variable.twins, strict=True):
        if twin.layout.dtype.storage != layout.dtype.storage:
            return (
                f"it is stored as {twin.layout.dtype.storage} in {storage.source}, not {layout.dtype.storage}"
            )
        if not _same_fill(twin.layout.fill_value, layout.fill_value):
            return f"its fill value differs in {storage.source}"
        why = _fits_layout(storage, layout, axis)
        if why is not None:
            return why
    for storage in new[:-1]:
        if storage.shape[axis] % step:
            return f"{storage.source} ends inside a chunk of it (only the last file may)"
    if new and new[0].kind == "contiguous":
        variable.split = _contiguous_split(layout.chunks, new[0].shape) or 0
    variable.shifts = [start // step for start in variable.shifts]
    return None


def same_codecs(first: list[dict], second: list[dict]) -> bool:
    """Whether two numcodecs chains decode alike: their configurations compared as numcodecs spells them
    in full (a Zarr v3 ``zstd`` read back says ``checksum: false``, the source's parser leaves it out)."""
    return len(first) == len(second) and all(
        _canonical(json.dumps(a, sort_keys=True)) == _canonical(json.dumps(b, sort_keys=True))
        for a, b in zip(first, second, strict=True)
    )


@functools.lru_cache(maxsize=256)
def _canonical(config: str) -> str:
    import numcodecs

    try:
        return json.dumps(numcodecs.get_codec(json.loads(config)).get_config(), sort_keys=True)
    except (ValueError, KeyError, TypeError):
        return config


def _fits_layout(storage: Storage, layout, axis: int) -> str | None:
    """Why ``storage`` (a new file's) cannot be references in ``layout`` (the dataset's), or None."""
    if storage.kind == "chunked":
        if tuple(storage.chunks) != tuple(layout.chunks):
            return f"its chunks are {tuple(storage.chunks)} in {storage.source}, not {tuple(layout.chunks)}"
        if not same_codecs(storage.codecs, layout.codecs.configs):
            return f"its filters {storage.codecs} in {storage.source} differ from {layout.codecs.configs}"
        return None
    if storage.kind != "contiguous" or layout.codecs.configs:
        return f"it is stored {storage.kind} in {storage.source}"
    chunks, shape = tuple(layout.chunks), tuple(storage.shape)
    if not chunks:
        return None
    split = _contiguous_split(chunks, shape)
    if split is None:
        return f"its contiguous bytes in {storage.source} do not fall into chunks {chunks}"
    if axis > split and shape[axis] != chunks[axis]:
        return f"its length along the joined dimension in {storage.source} is not its chunk's, {chunks[axis]}"
    return None


def _contiguous_split(chunks: tuple[int, ...], shape: tuple[int, ...]) -> int | None:
    """The axis chunks ``(1, ..., 1, k, full...)`` of C-order contiguous data of ``shape`` split (each chunk
    then one byte range), or None if they are not of that form."""
    for split in range(len(chunks)):
        before, after = chunks[:split], chunks[split + 1 :]
        if all(c == 1 for c in before) and all(
            c >= n for c, n in zip(after, shape[split + 1 :], strict=True)
        ):
            return split
    return None


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
    if not same_codecs(theirs.codecs, mine.codecs):
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
def _load_new(variable: SourceVariable, options: CombineOptions) -> str | None:
    """Appending: mark the new files' values of ``variable`` to be written into the dataset's layout."""
    layout = variable.layout
    new = variable.storages[1:]
    _ensure_values(variable)
    if any(storage.values is None for storage in new):
        return "its values cannot be read"
    if variable.coding != "decoded" and layout.dtype.nctype.name not in ("char", "string"):
        mine = layout.dtype.storage.newbyteorder("=")
        theirs = [twin.layout.dtype.storage.newbyteorder("=") for twin in variable.twins]
        if np.result_type(mine, *theirs) != mine:
            return f"the new files store it as {sorted(set(map(str, theirs)))}, which {mine} cannot hold"
    if not _encodable(layout.codecs):
        return f"its codecs {layout.codecs.configs} cannot be written here, so no new values can be added"
    itemsize = max(1, layout.dtype.storage.itemsize)
    nbytes = sum(math.prod(storage.shape) for storage in new) * itemsize
    if nbytes > options.max_load_bytes:
        return f"the new files hold {nbytes} bytes of it, more than the {options.max_load_bytes} loaded"
    variable.load = True
    return None


def _ensure_values(variable: SourceVariable) -> None:
    """Give storages whose parser reads no values (TIFF) values decoded from their chunks, where it can."""
    fills = [variable.layout.fill_value] + [twin.layout.fill_value for twin in variable.twins]
    for storage, fill in zip(variable.storages, fills, strict=False):
        if storage.values is None:
            storage.values = _decoded_chunks(variable, storage, fill)


def _load(variable: SourceVariable, options: CombineOptions) -> str | None:
    """Mark ``variable`` to be loaded, with chunks of at most ``max_chunk_bytes``; why not, if it cannot.

    Appending, only the new files' values are written, in the dataset's own layout; but the coordinate of
    the joined dimension and variables re-encoded (retimed) are written again whole, as ``virtualize`` of
    every file would write them."""
    if variable.storages[0].kind == "existing":
        variable.rewrite = (
            variable.rewrite
            or is_joined_coordinate(variable)
            or variable.coding == "retimed"
            or _outgrown_strings(variable)
            or _outgrown_type(variable)
        )
        if not variable.rewrite:
            return _load_new(variable, options)
    _ensure_values(variable)
    if any(storage.values is None for storage in variable.storages):
        return "its values cannot be read"
    _promote_dtype(variable)
    _widen_strings(variable)
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


def _string_width(storages: list[Storage]) -> int:
    """The longest string's UTF-8 length in bytes among ``storages``' values (0 when none)."""
    longest = 0
    for storage in storages:
        if storage.values is None:
            continue
        flat = np.asarray(storage.values(), dtype=object).ravel()
        lengths = (len(str(v).encode("utf-8", "surrogateescape")) for v in flat)
        longest = max(longest, max(lengths, default=0))
    return longest


def _outgrown_strings(variable: SourceVariable) -> bool:
    """Appending: whether the new files hold a string longer than the dataset's string width."""
    dtype = variable.layout.dtype
    return dtype.nctype is STRING and _string_width(variable.storages[1:]) > dtype.maxstrlen


def _outgrown_type(variable: SourceVariable) -> bool:
    """Appending: whether the new files store a number variable in a type the dataset's cannot hold (it is
    then written again whole in the type holding both, as joining every file at once stores it)."""
    if variable.coding is not None or variable.layout.dtype.nctype.is_text:
        return False
    mine = variable.layout.dtype.storage.newbyteorder("=")
    theirs = [twin.layout.dtype.storage.newbyteorder("=") for twin in variable.twins]
    kinds = {mine.kind, *(dtype.kind for dtype in theirs)}
    return kinds <= set("iuf") and np.result_type(mine, *theirs) != mine


def _widen_strings(variable: SourceVariable) -> None:
    """A string variable stored as wide as the longest string of any file (the first file's width is that
    of its own longest)."""
    dtype = variable.layout.dtype
    if dtype.nctype is not STRING:
        return
    width = max(dtype.maxstrlen, _string_width(variable.storages), 1)
    if width > dtype.maxstrlen:
        variable.layout.dtype = ParsedDtype(STRING, np.dtype(f"S{width}"), False, width)


def _promote_dtype(variable: SourceVariable) -> None:
    """Files storing a number variable in different types are joined in the type holding all of them
    (as numpy and xarray concatenate them), never cast to the first file's."""
    if variable.coding is not None:
        return  # re-encoded or decoded in one type already
    dtypes = {variable.layout.dtype.storage.newbyteorder("=")}
    dtypes.update(twin.layout.dtype.storage.newbyteorder("=") for twin in variable.twins)
    if len(dtypes) < 2 or any(dtype.kind not in "iuf" for dtype in dtypes):
        return
    joined = np.result_type(*dtypes)
    if joined != variable.layout.dtype.storage.newbyteorder("="):
        encodings.set_dtype(variable, joined)


_DECODABLE: set[tuple[str, int]] = set()  # chains numcodecs made here (a failure is asked again: a codec
# registered since may make it)


def _decodable(codecs: str, itemsize: int) -> bool:
    """Whether numcodecs makes the codecs of ``codecs`` (JSON) here: asked once a chain, not once a file."""
    if (codecs, itemsize) in _DECODABLE:
        return True
    if not _instanced(CodecChain(json.loads(codecs), None, itemsize), "a chain of codecs"):
        return False
    _DECODABLE.add((codecs, itemsize))
    return True


def _instanced(chain: CodecChain, where: str) -> bool:
    try:
        chain._instances(where)
    except FormatError:
        return False
    return True


def _decoded_chunks(
    variable: SourceVariable, storage: Storage, fill: object = None
) -> Callable[[], np.ndarray] | None:
    """``storage``'s whole array read from its chunks and decoded by its own codecs (missing chunks are the
    fill value), for a storage whose bytes could be references; None where they could not."""
    if storage.kind != "chunked" or storage.problem is not None or storage.read is None:
        return None
    dtype = variable.layout.dtype.storage
    chain = CodecChain(list(storage.codecs), None, dtype.itemsize)
    where = f"{variable.key!r} in {storage.source}"
    try:
        known = _decodable(json.dumps(storage.codecs, sort_keys=True), dtype.itemsize)
    except TypeError:  # a configuration JSON cannot hold: asked of this chain itself
        known = _instanced(chain, where)
    if not known:
        return None

    def values() -> np.ndarray:
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
