"""What ecCodes says of a GRIB2 message, as cfgrib presents it: the variable's name and ``GRIB_*``
attributes, its level type and level, ensemble member, reference time and step; and of its grid.

ecCodes reads a message with an empty data section (:meth:`.grib_messages.Message.header_only`): the
data is never read. Its parameter tables are slow to consult (milliseconds a message), so a description is
kept by the bytes that decide it: every byte of sections 1 to 4 but the reference time, forecast time and
end of interval, which nczmap reads itself. Where nczmap's reading of the times differs from ecCodes' (a
template or unit it does not know), that kind of message is always described by ecCodes.
"""

from __future__ import annotations

import datetime
import threading
from dataclasses import dataclass, field

import numpy as np

from nczmap.errors import FormatError
from nczmap.format.gribcodec import _LOCK as ECCODES_LOCK
from nczmap.format.gribcodec import MISSING, import_eccodes
from nczmap.integrations.virtualize.grib_messages import Message

EPOCH = datetime.datetime(1970, 1, 1)
# cfgrib's keys: the data variable's attributes (those of DATA_KEYS only when not undef/unknown)
DATA_KEYS = ("paramId", "dataType", "numberOfPoints", "typeOfLevel", "stepUnits", "stepType", "gridType")
DATA_KEYS += ("uvRelativeToGrid",)
EXTRA_KEYS = ("shortName", "units", "name", "cfName", "cfVarName", "missingValue", "totalNumber")
EXTRA_KEYS += ("numberOfDirections", "numberOfFrequencies", "NV", "gridDefinitionDescription")
GLOBAL_KEYS = ("edition", "centre", "centreDescription", "subCentre")
REGULAR_KEYS = ("iDirectionIncrementInDegrees", "iScansNegatively", "longitudeOfFirstGridPointInDegrees")
REGULAR_KEYS += ("longitudeOfLastGridPointInDegrees", "jDirectionIncrementInDegrees", "jPointsAreConsecutive")
REGULAR_KEYS += ("jScansPositively", "latitudeOfFirstGridPointInDegrees", "latitudeOfLastGridPointInDegrees")
GRID_KEYS = {
    "regular_ll": ("Nx", "Ny", *REGULAR_KEYS),
    "regular_gg": ("N", "Ni", "Nj", *REGULAR_KEYS),
    "lambert": (
        "LaDInDegrees",
        "LoVInDegrees",
        "iScansNegatively",
        "jPointsAreConsecutive",
        "jScansPositively",
        "latitudeOfFirstGridPointInDegrees",
        "latitudeOfSouthernPoleInDegrees",
        "longitudeOfFirstGridPointInDegrees",
        "longitudeOfSouthernPoleInDegrees",
        "DyInMetres",
        "DxInMetres",
        "Latin2InDegrees",
        "Latin1InDegrees",
        "Ny",
        "Nx",
    ),
}
LAMBERT_KEYS = ("LaDInDegrees", "LoVInDegrees", "Latin1InDegrees", "Latin2InDegrees", "DxInMetres")
LAMBERT_KEYS += ("DyInMetres", "latitudeOfFirstGridPointInDegrees", "longitudeOfFirstGridPointInDegrees")
EARTH_KEYS = ("shapeOfTheEarth", "scaleFactorOfRadiusOfSphericalEarth", "scaledValueOfRadiusOfSphericalEarth")
EARTH_KEYS += ("scaleFactorOfEarthMajorAxis", "scaledValueOfEarthMajorAxis", "scaleFactorOfEarthMinorAxis")
EARTH_KEYS += ("scaledValueOfEarthMinorAxis",)
FLAG_KEYS = ("iScansNegatively", "jScansPositively", "jPointsAreConsecutive", "alternativeRowScanning")
STEP_UNIT_SECONDS = {0: 60, 1: 3600, 2: 86400, 10: 10800, 11: 21600, 12: 43200, 13: 1, 14: 900, 15: 1800}
CACHE_SIZE = 50_000  # descriptions kept (each a few hundred bytes)


@dataclass(frozen=True)
class Description:
    """A message's variable (name, attributes, identity), level and member; its times are ``time`` (s
    since 1970) and ``step`` (hours) of the message ecCodes read."""

    name: str
    attributes: dict[str, object]
    param_id: object
    type_of_level: str
    step_type: str
    data_type: str
    level: float | None
    number: int | None
    time: int
    step: float
    globals: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Grid:
    """A grid (section 3) as ecCodes reads it."""

    grid_type: str
    points: int
    shape: tuple[int, ...]  # (Ny, Nx)
    flags: dict[str, int]
    latitudes: np.ndarray | None = None  # regular grids: ecCodes' distinctLatitudes
    longitudes: np.ndarray | None = None
    projection: dict[str, float] = field(default_factory=dict)  # Lambert: LAMBERT_KEYS
    earth: dict[str, int] = field(default_factory=dict)  # EARTH_KEYS present


class _Cache:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: dict[bytes, object] = {}

    def get(self, key: bytes) -> object:
        with self.lock:
            return self.items.get(key)

    def put(self, key: bytes, value: object) -> None:
        with self.lock:
            if len(self.items) >= CACHE_SIZE:
                self.items.clear()
            self.items[key] = value


_DESCRIPTIONS = _Cache()
_GRIDS = _Cache()
_ECCODES_TIMES = object()  # a description key whose times nczmap does not read as ecCodes does


def describe(message: Message, name: str) -> tuple[Description, int, float]:
    """The message's description, and its time (s since 1970) and step (hours)."""
    key = message.description_key()
    cached = _DESCRIPTIONS.get(key)
    if isinstance(cached, Description):
        return cached, *_own_times(message, name)
    if cached is _ECCODES_TIMES:
        full = message.full_key()
        found = _DESCRIPTIONS.get(full)
        if not isinstance(found, Description):
            found = _read_description(message, name)
            _DESCRIPTIONS.put(full, found)
        return found, found.time, found.step
    description = _read_description(message, name)
    own = _own_times(message, name) if message.end_seconds() is not None else None
    if own is not None and own == (description.time, description.step):
        _DESCRIPTIONS.put(key, description)
    else:
        _DESCRIPTIONS.put(key, _ECCODES_TIMES)
        _DESCRIPTIONS.put(message.full_key(), description)
    return description, description.time, description.step


def _own_times(message: Message, name: str) -> tuple[int, float]:
    when = message.reference_time()
    end = message.end_seconds()
    if when is None or end is None:
        raise FormatError(
            f"GRIB file {name}: its reference time is no date (the message at byte {message.offset})"
        )
    return int((when - EPOCH).total_seconds()), end / 3600.0


def grid(message: Message, name: str) -> Grid:
    """The message's grid, read once per distinct section 3."""
    key = message.sections[3]
    found = _GRIDS.get(key)
    if isinstance(found, Grid):
        return found
    made = _read_grid(message, name)
    _GRIDS.put(key, made)
    return made


# ------------------------------------------------------------------------------------------ ecCodes
class _Handle:
    """An ecCodes handle on a message's headers, its keys read as cfgrib reads them (one value, or an
    array when the key has several)."""

    def __init__(self, message: Message, name: str) -> None:
        eccodes = import_eccodes()
        self.eccodes = eccodes
        self.message = message
        self.name = name
        try:
            self.handle = eccodes.codes_new_from_message(message.header_only())
        except eccodes.GribInternalError as exc:
            raise self.error(f"ecCodes cannot read it: {exc}") from None

    def error(self, text: str) -> FormatError:
        return FormatError(f"GRIB file {self.name}: {text} (the message at byte {self.message.offset})")

    def get(self, key: str, kind: type | None = None) -> object:
        """The key's value; None if the message has no such key."""
        eccodes = self.eccodes
        try:
            if eccodes.codes_get_size(self.handle, key) > 1:
                return eccodes.codes_get_array(self.handle, key, kind)
            return eccodes.codes_get(self.handle, key, kind)
        except eccodes.KeyValueNotFoundError:
            return None
        except eccodes.GribInternalError as exc:
            raise self.error(f"ecCodes cannot read its key {key}: {exc}") from None

    def release(self) -> None:
        self.eccodes.codes_release(self.handle)


def _read_description(message: Message, name: str) -> Description:
    with ECCODES_LOCK:
        handle = _Handle(message, name)
        try:
            return _description(handle)
        finally:
            handle.release()


def _description(handle: _Handle) -> Description:
    attributes: dict[str, object] = {}
    for key in DATA_KEYS:
        value = 1 if key == "stepUnits" else handle.get(key)  # cfgrib always indexes steps in hours
        if value is not None and value not in ("undef", "unknown"):
            attributes["GRIB_" + key] = value
    grid_type = handle.get("gridType")
    for key in sorted(EXTRA_KEYS + GRID_KEYS.get(str(grid_type), ())):
        value = MISSING if key == "missingValue" else handle.get(key)
        if value is not None:
            attributes["GRIB_" + key] = value.tolist() if isinstance(value, np.ndarray) else value
    _encode_parameter(attributes)
    short = attributes.get("GRIB_shortName", f"paramId_{attributes.get('GRIB_paramId')}")
    variable = attributes.get("GRIB_cfVarName", "unknown")
    return Description(
        name=str(variable if variable not in ("undef", "unknown") else short),
        attributes=attributes,
        param_id=handle.get("paramId"),
        type_of_level=str(handle.get("typeOfLevel")),
        step_type=str(handle.get("stepType")),
        data_type=str(handle.get("dataType")),
        level=handle.get("level", float),
        number=handle.get("number"),
        time=_time(handle),
        step=_step(handle),
        globals={"GRIB_" + key: handle.get(key) for key in GLOBAL_KEYS if handle.get(key) is not None},
    )


def _encode_parameter(attributes: dict[str, object]) -> None:
    """cfgrib's long_name, units and standard_name (its ``parameter`` CF encoding)."""
    attributes["long_name"] = f"original GRIB paramId: {attributes.get('GRIB_paramId', 'undef')}"
    attributes["units"] = "1"
    if "GRIB_cfName" in attributes:
        attributes["standard_name"] = attributes["GRIB_cfName"]
    if "GRIB_name" in attributes:
        attributes["long_name"] = attributes["GRIB_name"]
    if "GRIB_units" in attributes:
        attributes["units"] = attributes["GRIB_units"]


def _time(handle: _Handle) -> int:
    date, time = handle.get("dataDate"), handle.get("dataTime")
    if not isinstance(date, int) or not isinstance(time, int):
        raise handle.error(f"its reference date {date!r} and time {time!r} are no numbers")
    try:
        when = datetime.datetime(date // 10000, date // 100 % 100, date % 100, time // 100, time % 100)
    except ValueError as exc:
        raise handle.error(f"its reference time {date} {time:04d} is no time: {exc}") from None
    return int((when - EPOCH).total_seconds())


def _step(handle: _Handle) -> float:
    unit, end = handle.get("stepUnits", int), handle.get("endStep", int)
    seconds = STEP_UNIT_SECONDS.get(unit) if isinstance(unit, int) else None
    if seconds is None or not isinstance(end, int):
        raise handle.error(f"its step unit {unit!r} (code table 4.4) is not supported")
    return end * seconds / 3600.0


def _read_grid(message: Message, name: str) -> Grid:
    with ECCODES_LOCK:
        handle = _Handle(message, name)
        try:
            grid_type = str(handle.get("gridType"))
            flags = {key: int(handle.get(key) or 0) for key in FLAG_KEYS}
            shape = (int(handle.get("Ny") or 0), int(handle.get("Nx") or 0))
            made = Grid(grid_type, int(handle.get("numberOfPoints") or 0), shape, flags)
            for key in EARTH_KEYS:
                value = handle.get(key)
                if isinstance(value, int):
                    made.earth[key] = value
            if grid_type in ("regular_ll", "regular_gg"):
                lat = np.array(handle.get("distinctLatitudes"), dtype=np.float64, ndmin=1)
                lon = np.array(handle.get("distinctLongitudes"), dtype=np.float64, ndmin=1)
                made = Grid(grid_type, made.points, made.shape, flags, lat, lon, {}, made.earth)
            elif grid_type == "lambert":
                made.projection.update({key: float(handle.get(key, float)) for key in LAMBERT_KEYS})
            return made
        finally:
            handle.release()
