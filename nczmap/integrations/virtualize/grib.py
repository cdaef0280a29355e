"""GRIB2 sources (HRRR, GFS, ERA5...): every message one chunk reference, decoded by the ``grib`` codec.

Messages are grouped into variables by parameter, level type, kind of statistic (``stepType``), data type
and grid, and shown as cfgrib shows them: the variable named by ecCodes' ``cfVarName`` (else its
``shortName``) with cfgrib's ``GRIB_*`` attributes, ``long_name``, ``units`` and ``standard_name``; the
coordinates ``number`` (ensemble members), ``time`` (the reference time), ``step`` (hours),
the level (named by its type, ``isobaricInhPa``...), ``latitude``, ``longitude`` and ``valid_time``, with
cfgrib's CF attributes. Unlike cfgrib's default, ``time`` and ``step`` are always dimensions (of length 1
in a file of one reference time and step), so that files can be joined along either; a level or member
that is the same for every message is a scalar coordinate, as cfgrib squeezes it.

Each data variable is chunked one message a chunk, ``(1, ..., ny, nx)``: the chunk is the message's byte
range, decoded by ``{"id": "grib", "var": name, "dtype": "float32"}`` (kerchunk's codec id and
configuration; nczmap's own :mod:`~nczmap.format.gribcodec` reads it as cfgrib does, NaN where the bitmap
has no value). A combination of member, time, step and level no message holds is a missing chunk (NaN).

Grids: regular latitude/longitude (template 3.0) and regular Gaussian (3.40) with 1-D ``latitude`` and
``longitude``; Lambert conformal (3.30) with dimensions ``y``/``x``, 2-D ``latitude``/``longitude`` (a
reference to a message decoded by the codec as its grid's coordinates) and 1-D projection coordinates
``x``/``y``. Every grid has a CF grid mapping, ``spatial_ref``. What is refused, by name, leaving the
message's variable out (a file none of whose messages can be read is a FormatError): other grid
templates (rotated, polar stereographic, Mercator, reduced Gaussian, spherical harmonics...), product
templates but 4.0, 4.1, 4.2, 4.8, 4.11 and 4.12, data representations but 5.0, 5.2, 5.3, 5.4, 5.40, 5.41
and 5.42, predefined bitmaps, scanning with consecutive j points or alternating rows, and messages of
several fields. GRIB edition 1 is refused by name.

When the variables of a file do not all share one set of coordinates (a surface and a pressure-level
field, or 2 m and 10 m heights), each set is a group named by its level type (``/isobaricInhPa``) and,
where a level type has several sets, by what tells them apart: the step type and the level
(``/heightAboveGround/instant_level_2``); a file of one set has its variables in the root group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from nczmap.errors import FormatError, NCZError
from nczmap.format import Attribute, Dimension, Group
from nczmap.format.types import BY_NAME, type_of_numpy
from nczmap.integrations.virtualize import grib_geo
from nczmap.integrations.virtualize.grib_describe import Description, Grid, describe, grid
from nczmap.integrations.virtualize.grib_messages import (
    INDEX_LIMIT,
    INDEXED_HOP,
    MAGIC,
    Message,
    index_offsets,
    index_windows,
    walk,
)
from nczmap.integrations.virtualize.parsed import (
    Constant,
    ParsedFile,
    ParseOptions,
    Refusal,
    SourceVariable,
    Storage,
    native_dtype,
    source_layout,
)
from nczmap.integrations.virtualize.sources import RemoteFile

GRID_TEMPLATES = {
    0: "regular latitude/longitude",
    1: "rotated latitude/longitude",
    2: "stretched latitude/longitude",
    3: "rotated and stretched latitude/longitude",
    10: "Mercator",
    20: "polar stereographic",
    30: "Lambert conformal",
    31: "Albers equal area",
    40: "Gaussian",
    41: "rotated Gaussian",
    50: "spherical harmonics",
    90: "space view",
    101: "unstructured",
    140: "Lambert azimuthal equal area",
}
SUPPORTED_GRIDS = {0, 30, 40}
PRODUCT_TEMPLATES = {0, 1, 2, 8, 11, 12}
DATA_TEMPLATES = {
    0: "simple packing",
    2: "complex packing",
    3: "complex packing with spatial differencing",
    4: "IEEE floating point",
    40: "JPEG 2000",
    41: "PNG",
    42: "CCSDS",
}
NO_BITMAP, BITMAP = 255, 0
DECREASING = ("isobaricInhPa", "isobaricInPa")  # cfgrib's stored_direction "decreasing"
TIME_UNITS = "seconds since 1970-01-01T00:00:00"
COORD_ATTRS: dict[str, dict[str, str]] = {  # cfgrib's, per coordinate
    "latitude": {"units": "degrees_north", "standard_name": "latitude", "long_name": "latitude"},
    "longitude": {"units": "degrees_east", "standard_name": "longitude", "long_name": "longitude"},
    "depthBelowLand": {"units": "m", "positive": "down", "long_name": "soil depth", "standard_name": "depth"},
    "depthBelowLandLayer": {
        "units": "m",
        "positive": "down",
        "long_name": "soil depth",
        "standard_name": "depth",
    },
    "hybrid": {
        "units": "1",
        "positive": "down",
        "long_name": "hybrid level",
        "standard_name": "atmosphere_hybrid_sigma_pressure_coordinate",
    },
    "heightAboveGround": {
        "units": "m",
        "positive": "up",
        "long_name": "height above the surface",
        "standard_name": "height",
    },
    "isobaricInhPa": {
        "units": "hPa",
        "positive": "down",
        "stored_direction": "decreasing",
        "standard_name": "air_pressure",
        "long_name": "pressure",
    },
    "isobaricInPa": {
        "units": "Pa",
        "positive": "down",
        "stored_direction": "decreasing",
        "standard_name": "air_pressure",
        "long_name": "pressure",
    },
    "isobaricLayer": {
        "units": "Pa",
        "positive": "down",
        "standard_name": "air_pressure",
        "long_name": "pressure",
    },
    "number": {"units": "1", "standard_name": "realization", "long_name": "ensemble member numerical id"},
    "step": {
        "units": "hours",
        "standard_name": "forecast_period",
        "long_name": "time since forecast_reference_time",
        "dtype": "timedelta64[ns]",  # what makes xarray decode it as time deltas
    },
    "time": {
        "units": TIME_UNITS,
        "calendar": "proleptic_gregorian",
        "standard_name": "forecast_reference_time",
        "long_name": "initial time of forecast",
    },
    "valid_time": {
        "units": TIME_UNITS,
        "calendar": "proleptic_gregorian",
        "standard_name": "time",
        "long_name": "time",
    },
}
GRID_MAPPING = "spatial_ref"


def sniff(read: Callable[[int, int], bytes], size: int) -> bool:
    """Whether the file starts with a GRIB message (edition 2, or 1 to be refused by name)."""
    if size < 8:
        return False
    try:
        head = read(0, 8)
    except NCZError:
        return False
    return head[:4] == b"GRIB" and head[7] in (1, 2)


def parse(file, options: ParseOptions) -> ParsedFile:
    """The model of a GRIB2 file: its messages' variables, each message one chunk reference."""
    messages = _messages(file)
    fields, refused = _fields(messages, file.name)
    if not fields:
        reasons = sorted({r.reason for r in refused})
        raise FormatError(f"GRIB file {file.name}: no message can be virtualized: {'; '.join(reasons)}")
    variables = _variables(fields, file.name, refused)
    cubes = _cubes(variables)
    root = Group("/", None)
    shared = _global_attributes(fields)
    inherited = _root_time_dimensions(root, cubes, file.name)
    for path, cube in zip(_group_paths(cubes), cubes, strict=True):
        group = _group(root, path)
        _set_attributes(group, shared)  # each group opens as a dataset of cfgrib's, with its attributes
        _build_cube(group, cube, file, refused, inherited)
    _set_attributes(root, shared)
    return ParsedFile(file.name, root, _apart(refused, root), format="grib")


INDEXED_MESSAGE = 64 << 10  # a remote file whose first message is larger is looked for an inventory
# heads fetched together at most: what a remote source holds while parsed (HELD_BYTES) takes them all, so
# an inventory of more (or a hostile one) is not used: the file is walked
MAX_INDEXED = 1024


def _messages(file) -> list[Message]:
    """The file's messages. A remote file whose messages are large (its first one is larger than
    :data:`INDEXED_MESSAGE`) with an inventory beside it has its messages' heads fetched together where
    the inventory says they are; without one it is walked (read through, or hopped over message by
    message)."""
    if not isinstance(file, RemoteFile):
        return walk(file.read, file.size, file.name)
    head = file.read_head(0, 16)
    first = int.from_bytes(head[8:16], "big") if len(head) == 16 and head[:4] == MAGIC else 0
    offsets = _indexed(file) if first > INDEXED_MESSAGE else None
    if offsets is None:
        return walk(file.read, file.size, file.name, remote=True)
    file.read_ranges(index_windows(offsets, file.size, INDEXED_HOP))  # held: the walk makes no request
    return walk(file.read, file.size, file.name, hop=INDEXED_HOP)


def _indexed(file: RemoteFile) -> list[int] | None:
    """Where the file's messages start by its inventory (``FILE.idx``), or None (none there, unreadable,
    unusable, or larger than :data:`INDEX_LIMIT`)."""
    try:
        index = file.sibling(".idx")
    except NCZError:
        return None
    try:
        text = index.read_head(0, INDEX_LIMIT)
    except NCZError:
        return None
    finally:
        index.close()
    if len(text) >= INDEX_LIMIT:
        return None
    offsets = index_offsets(text, file.size)
    usable = offsets is not None and len(offsets) <= MAX_INDEXED
    return offsets if usable and file.size >= INDEXED_MESSAGE * len(offsets) else None


def _apart(refused: list[Refusal], root: Group) -> list[Refusal]:
    """Refusals of messages named apart from a variable of the same path that is kept (a refusal of a path
    leaves that variable out)."""
    kept = {_path(g, name) for g in root.walk() for name in g.variables}
    return [
        Refusal(f"{r.variable} (other messages)", r.reason, r.source) if r.variable in kept else r
        for r in refused
    ]


# ------------------------------------------------------------------------------------------ messages
@dataclass
class _Field:
    message: Message
    description: Description
    time: int
    step: float
    grid: Grid


def _fields(messages: list[Message], name: str) -> tuple[list[_Field], list[Refusal]]:
    """The messages that can be referenced, described; refusals naming the others' variables and why."""
    fields: list[_Field] = []
    refused: dict[tuple[str, str], int] = defaultdict(int)
    for message in messages:
        why = _unsupported(message)
        if why is None:
            description, time, step = describe(message, name)
            found = grid(message, name)
            why = _unsupported_grid(found)
            if why is None:
                fields.append(_Field(message, description, time, step, found))
                continue
        refused[(_name_of(message, name), why)] += 1
    refusals = [
        Refusal("/" + variable, f"{why} ({count} message{'s' if count > 1 else ''})", name)
        for (variable, why), count in refused.items()
    ]
    return fields, refusals


def _unsupported(message: Message) -> str | None:
    """Why the message's templates cannot be read, by name; None if they can."""
    grid_template = message.grid_template
    if grid_template not in SUPPORTED_GRIDS:
        what = GRID_TEMPLATES.get(grid_template, "unknown")
        return f"grid definition template 3.{grid_template} ({what}) is not supported"
    if message.sections[3][10] != 0:
        return f"a reduced grid (template 3.{grid_template} with a number of points per row) is not supported"
    if message.product_template not in PRODUCT_TEMPLATES:
        return f"product definition template 4.{message.product_template} is not supported"
    if message.data_template not in DATA_TEMPLATES:
        return f"data representation template 5.{message.data_template} is not supported"
    if message.bitmap not in (NO_BITMAP, BITMAP):
        return f"a predefined bitmap (bitmap indicator {message.bitmap}) is not supported"
    return None


def _unsupported_grid(found: Grid) -> str | None:
    if found.grid_type not in ("regular_ll", "regular_gg", "lambert"):
        return f"grid type {found.grid_type} is not supported"
    if found.flags["jPointsAreConsecutive"] or found.flags["alternativeRowScanning"]:
        return "scanning with consecutive j points or alternating row directions is not supported"
    if found.shape[0] * found.shape[1] != found.points or not found.points:
        return f"its grid of {found.shape[0]} by {found.shape[1]} does not hold its {found.points} points"
    return None


def _name_of(message: Message, name: str) -> str:
    """The variable a refused message would have been (its message's offset if ecCodes cannot say)."""
    try:
        return describe(message, name)[0].name
    except FormatError:
        return f"message_at_{message.offset}"


# ------------------------------------------------------------------------------------------ variables
@dataclass
class _Variable:
    name: str
    fields: list[_Field] = field(default_factory=list)
    levels: tuple = ()  # sorted as cfgrib sorts them; () if the messages have no level
    numbers: tuple = ()  # () if no member
    times: tuple = ()
    steps: tuple = ()

    @property
    def first(self) -> _Field:
        return self.fields[0]

    def signature(self) -> tuple:
        first = self.first
        return (
            first.message.sections[3],
            first.description.type_of_level,
            self.levels,
            self.numbers,
            self.times,
            self.steps,
        )


def _variables(fields: list[_Field], name: str, refused: list[Refusal]) -> list[_Variable]:
    grouped: dict[tuple, _Variable] = {}
    for found in fields:
        d = found.description
        key = (str(d.param_id), d.type_of_level, d.step_type, d.data_type, found.message.sections[3])
        grouped.setdefault(key, _Variable(d.name)).fields.append(found)
    kept = []
    for variable in grouped.values():
        why = _axes(variable)
        if why is None:
            kept.append(variable)
        else:
            refused.append(Refusal("/" + variable.name, why, name))
    return kept


def _axes(variable: _Variable) -> str | None:
    """Set the variable's coordinate values; why they cannot be, if so."""
    levels = {f.description.level for f in variable.fields}
    numbers = {f.description.number for f in variable.fields}
    if None in levels and len(levels) > 1:
        return "some of its messages have a level and some do not"
    if None in numbers and len(numbers) > 1:
        return "some of its messages are ensemble members and some are not"
    decreasing = variable.first.description.type_of_level in DECREASING
    variable.levels = () if None in levels else tuple(sorted(levels, reverse=decreasing))
    variable.numbers = () if None in numbers else tuple(sorted(numbers))
    variable.times = tuple(sorted({f.time for f in variable.fields}))
    variable.steps = tuple(sorted({f.step for f in variable.fields}))
    return None


@dataclass
class _Cube:
    variables: list[_Variable]

    @property
    def first(self) -> _Variable:
        return self.variables[0]


def _cubes(variables: list[_Variable]) -> list[_Cube]:
    """Variables sharing one grid, level type and set of levels, members, times and steps."""
    cubes: dict[tuple, _Cube] = {}
    for variable in variables:
        cubes.setdefault(variable.signature(), _Cube([])).variables.append(variable)
    return list(cubes.values())


def _group_paths(cubes: list[_Cube]) -> list[str]:
    if len(cubes) == 1:
        return ["/"]
    by_level: dict[str, list[int]] = defaultdict(list)
    for index, cube in enumerate(cubes):
        by_level[cube.first.first.description.type_of_level].append(index)
    paths = [""] * len(cubes)
    for level_type, indices in by_level.items():
        if len(indices) == 1:
            paths[indices[0]] = "/" + level_type
            continue
        for index, label in zip(indices, _labels([cubes[i] for i in indices]), strict=True):
            paths[index] = f"/{level_type}/{label}"
    return paths


def _labels(cubes: list[_Cube]) -> list[str]:
    """Names telling apart cubes of one level type: their step types, levels, or both (numbered if even
    that is not enough)."""
    kinds = ["_".join(sorted({v.first.description.step_type for v in c.variables})) for c in cubes]
    levels = [_level_label(c.first.levels) for c in cubes]
    for labels in (kinds, levels, [f"{k}_{lv}" for k, lv in zip(kinds, levels, strict=True)]):
        if len(set(labels)) == len(labels):
            return labels
    return [f"{k}_{lv}_{i}" for i, (k, lv) in enumerate(zip(kinds, levels, strict=True))]


def _level_label(levels: tuple) -> str:
    if len(levels) == 1:
        return f"level_{levels[0]:g}"
    return f"levels_{len(levels)}" if levels else "no_level"


def _group(root: Group, path: str) -> Group:
    group = root
    for part in [p for p in path.split("/") if p]:
        if part not in group.groups:
            group.groups[part] = Group(part, group)
        group = group.groups[part]
    return group


def _global_attributes(fields: list[_Field]) -> dict[str, object]:
    """cfgrib's global attributes: those all messages agree on, the Conventions and the institution."""
    shared = dict(fields[0].description.globals)
    for found in fields[1:]:
        for key, value in found.description.globals.items():
            if shared.get(key) != value:
                shared.pop(key, None)
    shared["Conventions"] = "CF-1.7"
    if "GRIB_centreDescription" in shared:
        shared["institution"] = shared["GRIB_centreDescription"]
    return shared


# ------------------------------------------------------------------------------------------ the model
def _root_time_dimensions(root: Group, cubes: list[_Cube], source: str) -> dict[str, Dimension]:
    """``time`` and ``step`` as the root's dimensions, with their coordinates, when the file's groups all
    have the same times and steps (one model run's file): files then join along the root's ``time`` or
    ``step`` in every group at once. Each group has its own copies of the coordinates, on these dimensions,
    so that it opens alone as cfgrib's dataset."""
    axes = {(cube.first.times, cube.first.steps) for cube in cubes}
    if len(cubes) == 1 or len(axes) > 1:
        return {}
    times, steps = axes.pop()
    dims = {"time": _dimension(root, "time", len(times)), "step": _dimension(root, "step", len(steps))}
    _time_coordinates(root, dims, np.array(times, dtype=np.int64), np.array(steps, dtype=np.float64), source)
    return dims


def _time_coordinates(group: Group, dims: dict[str, Dimension], times, steps, source: str) -> None:
    for name, values in (("time", times), ("step", steps)):
        _values_variable(group, name, [dims[name]], values, source, _coordinate_attributes(name))
    valid = times[:, None] + steps[None, :] * 3600
    _values_variable(
        group, "valid_time", [dims["time"], dims["step"]], valid, source, COORD_ATTRS["valid_time"]
    )


def _coordinate_attributes(name: str) -> dict[str, object]:
    attrs: dict[str, object] = {"long_name": f"original GRIB coordinate for key: {_key(name)}({name})"}
    attrs["units"] = "1"
    attrs.update(COORD_ATTRS.get(name, {}))
    return attrs


def _build_cube(
    group: Group, cube: _Cube, file, refused: list[Refusal], inherited: dict[str, Dimension]
) -> None:
    first = cube.first
    level_type = first.first.description.type_of_level
    the_grid = first.first.grid
    header: list[tuple[str, np.ndarray]] = []  # (name, values) of each header coordinate, cfgrib's order
    if first.numbers:
        header.append(("number", np.array(first.numbers, dtype=np.int64)))
    header.append(("time", np.array(first.times, dtype=np.int64)))
    header.append(("step", np.array(first.steps, dtype=np.float64)))
    if first.levels:
        header.append((level_type, np.array(first.levels, dtype=np.float64)))
    on: dict[str, Dimension] = {}  # the header coordinates that are dimensions (time and step always)
    for name, values in header:
        if name in inherited:
            on[name] = inherited[name]
        elif len(values) > 1 or name in ("time", "step"):
            on[name] = _dimension(group, name, len(values))
    geo_names = ("latitude", "longitude") if the_grid.grid_type != "lambert" else ("y", "x")
    geo = [_dimension(group, name, size) for name, size in zip(geo_names, the_grid.shape, strict=True)]
    source = file.name
    for name, values in header:
        if name in ("time", "step"):
            continue
        dim = on.get(name)
        attrs = _coordinate_attributes(name)
        _values_variable(group, name, [dim] if dim else [], values if dim else values[0], source, attrs)
    times, steps = dict(header)["time"], dict(header)["step"]
    _time_coordinates(group, on, times, steps, source)
    _geography(group, the_grid, geo, first.first.message, file, refused)
    dims = list(on.values())
    coordinates = " ".join([name for name, _ in header] + ["latitude", "longitude", "valid_time"])
    for variable in cube.variables:
        if variable.name in group.variables:
            refused.append(Refusal(_path(group, variable.name), "another variable has its name", source))
            continue
        _data_variable(group, variable, [*dims, *geo], header, file, coordinates, the_grid)


def _key(name: str) -> str:
    return name if name in ("number", "time", "step") else "level"


def _dimension(group: Group, name: str, size: int) -> Dimension:
    dim = Dimension(name, size, name in ("time", "step"), group)  # unlimited: what files are joined along
    group.dimensions[name] = dim
    return dim


def _geography(
    group: Group, the_grid: Grid, geo: list[Dimension], message: Message, file, refused: list[Refusal]
) -> None:
    source, read = file.name, file.read
    if the_grid.grid_type == "lambert":
        for name in ("latitude", "longitude"):
            _grid_coordinate(group, name, geo, message, source, read)
    else:
        latitude = COORD_ATTRS["latitude"].copy()
        lat, lon = the_grid.latitudes, the_grid.longitudes
        if lat is not None and len(lat) > 1 and lat[0] > lat[-1]:
            latitude["stored_direction"] = "decreasing"
        if lat is None or lon is None or (len(lat), len(lon)) != the_grid.shape:
            raise FormatError(f"GRIB file {source}: ecCodes gives no latitudes and longitudes of its grid")
        _values_variable(group, "latitude", [geo[0]], lat, source, latitude)
        _values_variable(group, "longitude", [geo[1]], lon, source, COORD_ATTRS["longitude"])
    try:
        mapping = grib_geo.mapping(the_grid)
        if the_grid.grid_type == "lambert":
            x, y = grib_geo.projected_axes(the_grid, mapping)
            _values_variable(group, "x", [geo[1]], x, source, _projection_attributes("x"))
            _values_variable(group, "y", [geo[0]], y, source, _projection_attributes("y"))
    except grib_geo.NoGridMapping as exc:
        refused.append(Refusal(_path(group, GRID_MAPPING), f"no grid mapping: {exc}", source))
        return
    _values_variable(group, GRID_MAPPING, [], np.array(0, dtype=np.int32), source, mapping)


def _projection_attributes(axis: str) -> dict[str, str]:
    return {
        "standard_name": f"projection_{axis}_coordinate",
        "long_name": f"{axis} coordinate of projection",
        "units": "m",
        "axis": axis.upper(),
    }


def _grid_coordinate(
    group: Group, name: str, geo: list[Dimension], message: Message, source: str, read: Callable
) -> None:
    """2-D latitude or longitude: a reference to a message, decoded by the codec as its grid's."""
    shape = tuple(d.size for d in geo)
    codec = {"id": "grib", "var": name, "dtype": "float64"}
    storage = Storage(source, "chunked", shape, shape, codecs=[codec], read=read)
    storage.add_chunk((0, 0), message.offset, message.length)
    layout = source_layout(shape, shape, native_dtype(BY_NAME["double"], np.dtype("<f8")), filters=[codec])
    variable = SourceVariable(group, name, geo, layout, storage)
    _set_attributes(variable, COORD_ATTRS[name])
    group.variables[name] = variable


def _data_variable(
    group: Group,
    variable: _Variable,
    dims: list[Dimension],
    header: list[tuple[str, np.ndarray]],
    file,
    coordinates: str,
    the_grid: Grid,
) -> None:
    shape = tuple(d.size for d in dims)
    chunks = (*(1 for _ in dims[:-2]), *the_grid.shape)
    var = variable.name if variable.name not in ("latitude", "longitude") else "values"
    codec = {"id": "grib", "var": var, "dtype": "float32"}
    storage = Storage(file.name, "chunked", shape, chunks, codecs=[codec], read=file.read)
    positions = {name: {value: i for i, value in enumerate(values.tolist())} for name, values in header}
    on_axis = [d.name for d in dims[:-2]]
    taken: set[tuple[int, ...]] = set()
    for found in variable.fields:  # the first message of a combination is read, as cfgrib reads it
        values = {
            "number": found.description.number,
            "time": found.time,
            "step": found.step,
            "level": found.description.level,
        }
        corner = (*(positions[name][values[_key(name)]] for name in on_axis), 0, 0)
        if corner not in taken:
            taken.add(corner)
            storage.add_chunk(corner, found.message.offset, found.message.length)
    dtype = native_dtype(BY_NAME["float"], np.dtype("<f4"))
    layout = source_layout(shape, chunks, dtype, np.float32(np.nan), filters=[codec])
    made = SourceVariable(group, variable.name, dims, layout, storage)
    attributes = dict(variable.first.description.attributes)
    attributes["coordinates"] = coordinates
    if GRID_MAPPING in group.variables:
        attributes["grid_mapping"] = GRID_MAPPING
    _set_attributes(made, attributes)
    group.variables[variable.name] = made


def _values_variable(
    group: Group, name: str, dims: list[Dimension], values, source: str, attrs: dict[str, object]
) -> None:
    values = np.asarray(values)
    shape = values.shape
    dtype = values.dtype.newbyteorder("<") if values.dtype.itemsize > 1 else values.dtype
    values = values.astype(dtype)
    storage = Storage(source, "values", shape, values=Constant(values))
    layout = source_layout(
        shape, tuple(max(1, n) for n in shape), native_dtype(type_of_numpy(dtype), dtype), scalar=not shape
    )
    variable = SourceVariable(group, name, dims, layout, storage)
    _set_attributes(variable, attrs)
    group.variables[name] = variable


def _set_attributes(target, attributes: dict[str, object]) -> None:
    target.attrs.load({key: Attribute.from_python(key, value) for key, value in attributes.items()})


def _path(group: Group, name: str) -> str:
    return group.path.rstrip("/") + "/" + name
