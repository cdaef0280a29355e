"""CF time coordinates joined across files, decoded and re-encoded exactly as xarray decodes them.

Files joined along time often encode their time coordinate differently: ``days since 2020-01-01`` in one
file, ``days since 2020-01-03`` in the next, ``hours since 2020-01-05`` as int64 in a third. The joined
coordinate is stored in ONE encoding such that xarray decodes it to exactly the instants that
``xr.open_mfdataset(files, combine="nested", concat_dim="time")`` gives, which decodes every file with its
own units and calendar. This module does that arithmetic with integers and numpy alone (no cftime, pandas
or xarray at run time); it reproduces what the installed xarray (``xarray.coding.times``) and cftime
(``cftime._cftime``) do, step for step:

- :func:`xarray.coding.times.decode_cf_datetime` (``use_cftime=None``, ``time_unit="ns"``, the defaults of
  ``open_dataset``) first tries ``_decode_datetime_with_pandas``. That path needs a standard calendar
  (``_is_standard_calendar``), a unit ``_netcdf_to_numpy_timeunit`` knows (``days``/``day``... after
  ``lower()`` and an added ``s``: no abbreviations), units text matching ``(.+) since (.+)``
  (``_unpack_netcdf_time_units``) and a reference date and decoded values inside the ``datetime64[ns]``
  range. Integers are then multiplied exactly (``flat_num * np.int64(ns_time_unit / ns_ref_date_unit)``
  in ``_numbers_to_timedelta``); floats are cast to float64, multiplied by the same ``np.int64`` as float64
  and truncated toward zero by ``astype(np.int64)``: ``trunc(float64(value) * float64(ns per unit))``.
- Anything else falls back (the ``except (KeyError, OutOfBoundsDatetime, OutOfBoundsTimedelta,
  OverflowError)`` of ``decode_cf_datetime``) to ``cftime.num2date(flat_num_dates.astype(float), ...)``:
  every value, integers included, becomes float64, then ``np.longdouble``, is multiplied by cftime's
  microseconds per unit (``UNIT_CONVERSION_FACTORS``), rounded half to even by ``np.rint`` and, for units
  other than milli/microseconds, nudged by ``cast_to_int``'s rule (a result ending in 000001 µs is floored,
  one ending in 999999 µs is ceiled) to whole microseconds added to the reference date in the calendar.

Reference dates are read by a grammar on which ``pandas.Timestamp`` (xarray's parser) and cftime's
``_parse_date`` agree; strings they read differently (``+5`` time-zone offsets, which pandas applies and
cftime ignores; fractions of a second that cftime's float arithmetic truncates; ``1-1-1 00:00:00.000000``,
which pandas reads as 2001) are refused by name, as are ``months since``/``years since`` and unknown
calendars. Calendars follow cftime, year zero included: ``standard`` (mixed Julian/Gregorian, 1582-10-05
to 1582-10-14 missing) and ``julian`` have no year zero (year -1 precedes year 1), ``proleptic_gregorian``
and the idealised calendars have one (``_year_zero_defaults``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from nczmap.errors import FormatError

__all__ = [
    "TimePart",
    "TimeUnits",
    "encode",
    "is_time_units",
    "join",
    "offsets",
    "parse_time_units",
    "same_encoding",
]

# ---------------------------------------------------------------------------------------------- units
_NS_PER_UNIT = {
    "days": 86_400_000_000_000,
    "hours": 3_600_000_000_000,
    "minutes": 60_000_000_000,
    "seconds": 1_000_000_000,
    "milliseconds": 1_000_000,
    "microseconds": 1_000,
    "nanoseconds": 1,
}
_UNITS_COARSE_TO_FINE = tuple(_NS_PER_UNIT)

_SPELLINGS = {
    "days": ("day", "days", "d"),
    "hours": ("hour", "hours", "hr", "hrs", "h"),
    "minutes": ("minute", "minutes", "min", "mins"),
    "seconds": ("second", "seconds", "sec", "secs", "s"),
    "milliseconds": ("millisecond", "milliseconds", "millisec", "millisecs", "msec", "msecs", "ms"),
    "microseconds": ("microsecond", "microseconds", "microsec", "microsecs", "usec", "usecs", "us"),
    "nanoseconds": ("nanosecond", "nanoseconds", "nanosec", "nanosecs", "nsec", "nsecs", "ns"),
}
_CANONICAL_UNIT = {spelling: unit for unit, spellings in _SPELLINGS.items() for spelling in spellings}

# xarray's _netcdf_to_numpy_timeunit: lower(), an "s" appended unless present, then the full names only
_PANDAS_SPELLINGS = frozenset(s for unit in _NS_PER_UNIT for s in (unit, unit[:-1]))  # day, days...

# cftime's UNIT_CONVERSION_FACTORS (microseconds per unit); nanoseconds, usec and us are not there
_CFTIME_US_PER_UNIT = {
    **dict.fromkeys(("microseconds", "microsecond", "microsec", "microsecs"), 1),
    **dict.fromkeys(("milliseconds", "millisecond", "millisec", "millisecs", "msec", "msecs", "ms"), 1000),
    **dict.fromkeys(("seconds", "second", "sec", "secs", "s"), 1_000_000),
    **dict.fromkeys(("minutes", "minute", "min", "mins"), 60_000_000),
    **dict.fromkeys(("hours", "hour", "hr", "hrs", "h"), 3_600_000_000),
    **dict.fromkeys(("days", "day", "d"), 86_400_000_000),
}
# cftime's cast_to_int leaves these alone (microsec_units + millisec_units); others get the 1/999999 nudge
_CFTIME_NO_NUDGE = frozenset(s for s, factor in _CFTIME_US_PER_UNIT.items() if factor <= 1000)

_REFUSED_UNITS = {
    **dict.fromkeys(("month", "months", "mon", "mons"), "months"),
    **dict.fromkeys(("year", "years", "yr", "yrs", "common_year", "common_years", "a"), "years"),
}

_UNITS_RE = re.compile(r"\s*(?P<unit>[A-Za-z_]+)\s+since\s+(?P<since>\S(?:.*\S)?)\s*", re.DOTALL)
_XARRAY_UNITS_RE = re.compile(r"(.+) since (.+)")  # xarray's _unpack_netcdf_time_units

# ------------------------------------------------------------------------------------------ calendars
_CALENDARS = {
    "standard": "standard",
    "gregorian": "standard",
    "proleptic_gregorian": "proleptic_gregorian",
    "noleap": "noleap",
    "365_day": "noleap",
    "all_leap": "all_leap",
    "366_day": "all_leap",
    "360_day": "360_day",
    "julian": "julian",
}
_STANDARD_LIKE = frozenset(("standard", "proleptic_gregorian"))
_NO_YEAR_ZERO = frozenset(("standard", "julian"))  # cftime's _year_zero_defaults

_CUMULATIVE_DAYS = (0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)
_CUMULATIVE_DAYS_LEAP = (0, 31, 60, 91, 121, 152, 182, 213, 244, 274, 305, 335)
_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

_DAY_NS = _NS_PER_UNIT["days"]
_INT64_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)
# pandas.Timestamp.min/max: the instants (ns since 1970-01-01) xarray's pandas path can represent
_PANDAS_LO = _INT64_MIN + 1
_PANDAS_HI = _INT64_MAX
_MAX_YEAR = 999_999

# Reference dates: the forms pandas.Timestamp and cftime's ISO8601_REGEX read alike (see the tests)
_DATE_RE = re.compile(
    r"(?P<year>-?\d+)-(?P<month>\d{1,2})-(?P<day>\d{1,2})"
    r"(?:[T ](?P<hour>\d{1,2}):(?P<minute>\d{1,2})(?::(?P<second>\d{1,2})(?:\.(?P<fraction>\d+))?)?"
    r"(?P<tz> ?(?:Z|UTC|(?P<sign>[+-])(?P<tzhour>\d{2})(?::?(?P<tzminute>\d{2}))?))?)?",
    re.ASCII,  # cftime reads ASCII digits only
)


def _fail(where: str, attribute: str, value: object, why: str) -> FormatError:
    shown = repr(value)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return FormatError(f"{where}: {attribute} {shown}: {why}")


@dataclass(frozen=True)
class TimeUnits:
    """A parsed CF ``units``/``calendar`` pair of a time variable.

    ``epoch`` is the reference date as nanoseconds since 1970-01-01T00:00 of the same calendar (so
    ``standard`` and ``proleptic_gregorian`` share their numbers from 1582-10-15 on), time-zone offset
    applied.
    """

    unit: str
    step: int
    calendar: str
    epoch: int
    since: str
    text: str


def is_time_units(units: object) -> bool:
    """True for CF time units ``"<unit> since <date>"`` (any case of the unit, any whitespace).

    The word ``since`` must be lower case, as xarray only decodes units containing ``"since"``.
    """
    return isinstance(units, str) and _UNITS_RE.fullmatch(units) is not None


def parse_time_units(units: str, calendar: str | None, where: str) -> TimeUnits:
    """Parse ``units`` and ``calendar`` (None: the attribute is missing, i.e. ``standard``).

    Raises FormatError naming ``where`` and the attribute for anything xarray/cftime would read otherwise
    or refuse.
    """
    canonical_calendar = _parse_calendar(calendar, where)
    if not isinstance(units, str):
        raise _fail(where, "units", units, "time units must be text")
    match = _UNITS_RE.fullmatch(units)
    if match is None:
        raise _fail(where, "units", units, 'not CF time units "<unit> since <reference date>"')
    spelling = match["unit"].lower()
    if spelling in _REFUSED_UNITS:
        raise _fail(
            where,
            "units",
            units,
            f'"{_REFUSED_UNITS[spelling]} since" is refused: {_REFUSED_UNITS[spelling]} have no fixed length '
            "(xarray refuses them but for cftime's 30-day months of 360_day and common_years of noleap)",
        )
    unit = _CANONICAL_UNIT.get(spelling)
    if unit is None:
        raise _fail(where, "units", units, f"unknown time unit {match['unit']!r}")
    since = match["since"]
    epoch = _parse_reference_date(since, canonical_calendar, where, units)
    return TimeUnits(unit, _NS_PER_UNIT[unit], canonical_calendar, epoch, since, units)


def same_encoding(a: TimeUnits, b: TimeUnits) -> bool:
    """Same unit, same calendar and the same reference instant (whatever the spelling)."""
    return a.unit == b.unit and a.calendar == b.calendar and a.epoch == b.epoch


def _parse_calendar(calendar: object, where: str) -> str:
    if calendar is None:
        return "standard"
    if not isinstance(calendar, str):
        raise _fail(where, "calendar", calendar, "the calendar must be text")
    found = _CALENDARS.get(calendar.lower())
    if found is None:
        raise _fail(where, "calendar", calendar, f"unknown calendar (known: {', '.join(_CALENDARS)})")
    return found


# -------------------------------------------------------------------------------------- reference date
def _parse_reference_date(since: str, calendar: str, where: str, units: str) -> int:
    """Nanoseconds since 1970-01-01 of ``calendar`` of the date after ``since``."""
    match = _DATE_RE.fullmatch(since)
    if match is None:
        raise _fail(where, "units", units, f"reference date {since[:80]!r} is not a date nczmap can read")
    year_text = match["year"]
    digits = year_text.lstrip("-")
    if len(digits) < 4 and re.search(r"\d{4}", since):
        # xarray pads a short year only when no 4-digit number is present; else pandas guesses (2001)
        raise _fail(where, "units", units, f"ambiguous year {year_text!r}: write it with four digits")
    if len(digits) > 4 and digits.startswith("0"):
        raise _fail(where, "units", units, f"year {year_text!r} has leading zeros beyond four digits")
    if len(digits) > len(str(_MAX_YEAR)) or int(digits) > _MAX_YEAR:
        raise _fail(where, "units", units, f"year {year_text[:12]!r} is out of the supported range")
    year = int(year_text)
    month, day = int(match["month"]), int(match["day"])
    hour, minute, second = (int(match[name] or 0) for name in ("hour", "minute", "second"))
    why = _invalid_date(year, month, day, calendar)
    if why:
        raise _fail(where, "units", units, why)
    if hour > 23 or minute > 59 or second > 59:
        raise _fail(where, "units", units, f"invalid time of day {hour}:{minute}:{second}")
    micro = _fraction_microseconds(match["fraction"])
    if micro is None:
        raise _fail(
            where,
            "units",
            units,
            f"fractional seconds .{match['fraction'][:12]} are not whole microseconds that cftime and "
            "pandas both read exactly",
        )
    offset_minutes = 0
    if match["sign"]:
        tz_hour, tz_minute = int(match["tzhour"]), int(match["tzminute"] or 0)
        if tz_hour > 23 or tz_minute > 59:
            raise _fail(where, "units", units, f"invalid time-zone offset {match['tz'].strip()!r}")
        offset_minutes = (tz_hour * 60 + tz_minute) * (-1 if match["sign"] == "-" else 1)
    seconds = ((hour * 60 + minute - offset_minutes) * 60) + second
    return _day_number(year, month, day, calendar) * _DAY_NS + seconds * 1_000_000_000 + micro * 1000


def _fraction_microseconds(fraction: str | None) -> int | None:
    """The microseconds of ``.fraction``, or None when not whole or when cftime reads them otherwise."""
    if not fraction:
        return 0
    significant = fraction.rstrip("0")
    if len(significant) > 6:
        return None
    numerator, denominator = int(significant or "0") * 1_000_000, 10 ** len(significant)
    if numerator % denominator:
        return None
    exact = numerator // denominator
    if int(float(f"0.{fraction}") * 1e6) != exact:  # cftime's _parse_date
        return None
    return exact


def _astronomical(year: int, calendar: str) -> int:
    return year + 1 if year < 0 and calendar in _NO_YEAR_ZERO else year


def _gregorian_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _is_leap(year: int, calendar: str) -> bool:
    """cftime's _is_leap (``year`` as written; ``standard`` switches rules in 1582)."""
    astro = _astronomical(year, calendar)
    if calendar == "proleptic_gregorian" or (calendar == "standard" and year > 1581):
        return _gregorian_leap(astro)
    if calendar in ("julian", "standard"):
        return astro % 4 == 0
    return calendar == "all_leap"


def _invalid_date(year: int, month: int, day: int, calendar: str) -> str | None:
    if year == 0 and calendar in _NO_YEAR_ZERO:
        return f"year 0 does not exist in the {calendar} calendar (cftime refuses it)"
    if not 1 <= month <= 12:
        return f"invalid month {month}"
    if calendar == "360_day":
        length = 30
    else:
        length = _MONTH_DAYS[month - 1] + (month == 2 and _is_leap(year, calendar))
    if not 1 <= day <= length:
        return f"invalid day {year}-{month:02d}-{day:02d} in the {calendar} calendar"
    if calendar == "standard" and (year, month) == (1582, 10) and 4 < day < 15:
        return f"1582-10-{day:02d} does not exist in the standard (mixed Julian/Gregorian) calendar"
    return None


def _julian_day(year: int, month: int, day: int, gregorian: bool) -> int:
    """Julian day number of an astronomical-year date (proleptic Gregorian or Julian)."""
    a = (14 - month) // 12
    y = year + 4800 - a
    m = month + 12 * a - 3
    days = day + (153 * m + 2) // 5 + 365 * y + y // 4
    return days - y // 100 + y // 400 - 32045 if gregorian else days - 32083


_JD_1970 = _julian_day(1970, 1, 1, True)  # 2440588
_JULIAN_JD_1970 = _julian_day(1970, 1, 1, False)
_GREGORIAN_START_DAY = _julian_day(1582, 10, 15, True) - _JD_1970
_GREGORIAN_START_NS = _GREGORIAN_START_DAY * _DAY_NS


def _day_number(year: int, month: int, day: int, calendar: str) -> int:
    """Days since 1970-01-01 of ``calendar`` (a valid date, ``year`` as cftime numbers it)."""
    if calendar == "360_day":
        return (year - 1970) * 360 + (month - 1) * 30 + day - 1
    if calendar in ("noleap", "all_leap"):
        length, cumulative = (365, _CUMULATIVE_DAYS) if calendar == "noleap" else (366, _CUMULATIVE_DAYS_LEAP)
        return (year - 1970) * length + cumulative[month - 1] + day - 1
    astro = _astronomical(year, calendar)
    if calendar == "julian":
        return _julian_day(astro, month, day, False) - _JULIAN_JD_1970
    gregorian = calendar == "proleptic_gregorian" or (year, month, day) >= (1582, 10, 15)
    return _julian_day(astro, month, day, gregorian) - _JD_1970


# ------------------------------------------------------------------------------------------- decoding
def _exact(value: object) -> Fraction:
    return Fraction(value.item() if isinstance(value, np.generic) else value)


def _numbers(values: object, where: str) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype.kind not in "iuf":
        raise FormatError(f"{where}: time values of type {array.dtype} are not numbers")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise FormatError(f"{where}: time values hold NaN or infinity (fill values must be handled first)")
    return array


def _xarray_path(flat: np.ndarray, units: TimeUnits, where: str) -> str:
    """The path xarray's decode_cf_datetime takes for ``flat``: ``"pandas"`` or ``"cftime"``."""
    spelling = _UNITS_RE.fullmatch(units.text)["unit"].lower()
    xarray_match = _XARRAY_UNITS_RE.match(units.text)
    pandas_possible = (
        spelling in _PANDAS_SPELLINGS
        and units.calendar in _STANDARD_LIKE
        and xarray_match is not None
        and xarray_match.group(1).strip().lower() == spelling
        and xarray_match.group(2).strip() == units.since
    )
    if pandas_possible:
        path = _pandas_range(flat, units, where)
        if path == "pandas":
            return path
    if spelling not in _CFTIME_US_PER_UNIT:
        raise _fail(
            where,
            "units",
            units.text,
            "xarray cannot decode these values: cftime does not know the unit "
            f"{_UNITS_RE.fullmatch(units.text)['unit']!r}"
            + (" and they are outside the datetime64[ns] range" if pandas_possible else ""),
        )
    return "cftime"


def _pandas_range(flat: np.ndarray, units: TimeUnits, where: str) -> str:
    """Whether the reference date and the values lie inside pandas' datetime64[ns] range."""
    margin = 2 * units.step + _DAY_NS  # xarray checks the range with a value truncated to whole units
    epoch = units.epoch
    if not _PANDAS_LO - margin <= epoch <= _PANDAS_HI + margin:
        return "cftime"
    too_close = _fail(
        where,
        "units",
        units.text,
        "the reference date or values lie too close to the limits of datetime64[ns] "
        "(1677-09-21 / 2262-04-11) to tell how xarray decodes them",
    )
    if not _PANDAS_LO + margin <= epoch <= _PANDAS_HI - margin:
        raise too_close
    if flat.size == 0:
        return "pandas"
    first = epoch + _exact(flat.min()) * units.step
    last = epoch + _exact(flat.max()) * units.step
    if first < _PANDAS_LO - margin or last > _PANDAS_HI + margin:
        return "cftime"
    if first < _PANDAS_LO + margin or last > _PANDAS_HI - margin:
        raise too_close
    return "pandas"


def _pandas_deltas(flat: np.ndarray, units: TimeUnits, where: str) -> np.ndarray:
    """Nanoseconds since the reference date, as xarray's _decode_datetime_with_pandas computes them."""
    step = np.int64(units.step)
    if flat.size == 0:
        return np.zeros(0, dtype=np.int64)
    if flat.dtype.kind in "iu":
        low, high = int(flat.min()) * units.step, int(flat.max()) * units.step
        if low <= _INT64_MIN or high > _INT64_MAX:
            raise _fail(where, "units", units.text, "the values overflow xarray's int64 nanoseconds")
        return flat.astype(np.int64) * step
    product = flat.astype(np.float64) * step if units.step > 1 else flat.astype(np.float64)
    if not (np.abs(product) < 2.0**63).all():
        raise _fail(where, "units", units.text, "the values overflow xarray's int64 nanoseconds")
    return product.astype(np.int64)


def _cftime_deltas(flat: np.ndarray, units: TimeUnits, where: str) -> np.ndarray:
    """Microseconds since the reference date, as cftime.num2date(values.astype(float)) computes them."""
    spelling = _UNITS_RE.fullmatch(units.text)["unit"].lower()
    factor = _CFTIME_US_PER_UNIT[spelling]
    scaled = factor * flat.astype(np.float64).astype(np.longdouble)  # xarray's astype(float), upcast_times
    if not (np.abs(scaled) < np.longdouble(2.0**62)).all():
        raise _fail(where, "units", units.text, "the values overflow cftime's int64 microseconds")
    micro = np.rint(scaled).astype(np.int64)
    if spelling not in _CFTIME_NO_NUDGE:  # cftime's cast_to_int (issue #187)
        micro = np.where(micro % 1_000_000 == 1, np.floor(scaled).astype(np.int64), micro)
        micro = np.where(micro % 1_000_000 == 999_999, np.ceil(scaled).astype(np.int64), micro)
    return micro


def _shift(deltas: np.ndarray, scale: int, base: int, where: str, units: TimeUnits) -> np.ndarray:
    """``deltas * scale + base`` as int64, refusing overflow."""
    if deltas.size == 0:
        return np.zeros(0, dtype=np.int64)
    low = int(deltas.min()) * scale + base
    high = int(deltas.max()) * scale + base
    if low <= _INT64_MIN or high > _INT64_MAX:
        raise _fail(
            where,
            "units",
            units.text,
            "the instants are too far from the first file's reference date for int64 nanoseconds",
        )
    if base % scale == 0 and _INT64_MIN < base // scale <= _INT64_MAX:
        # deltas + base // scale is the result / scale: it fits because the result does
        return (deltas + np.int64(base // scale)) * np.int64(scale)
    return np.array([int(d) * scale + base for d in deltas.tolist()], dtype=np.int64)


def _decode(values: object, units: TimeUnits, where: str) -> tuple[np.ndarray, int, tuple[int, ...]]:
    """xarray's decoding of ``values``: (int64 deltas, their unit in ns, the values' shape)."""
    array = _numbers(values, where)
    flat = array.reshape(-1)
    if _xarray_path(flat, units, where) == "pandas":
        return _pandas_deltas(flat, units, where), 1, array.shape
    return _cftime_deltas(flat, units, where), 1000, array.shape


def offsets(values: np.ndarray, units: TimeUnits, reference: TimeUnits, where: str) -> np.ndarray:
    """int64 nanoseconds from ``reference``'s date to each instant xarray decodes ``values`` with ``units``.

    The calendars must agree (``standard`` and ``proleptic_gregorian`` only where every instant, reference
    dates included, is on or after 1582-10-15). NaN, overflow, undecodable values: FormatError.
    """
    mixed = units.calendar != reference.calendar
    if mixed and {units.calendar, reference.calendar} != _STANDARD_LIKE:
        raise _fail(
            where,
            "calendar",
            units.calendar,
            f"differs from the {reference.calendar} calendar of the first file; calendars are not converted",
        )
    deltas, scale, shape = _decode(values, units, where)
    result = _shift(deltas, scale, units.epoch - reference.epoch, where, units)
    if mixed:
        earliest = min(units.epoch, reference.epoch)
        if result.size:
            earliest = min(earliest, int(result.min()) + reference.epoch)
        if earliest < _GREGORIAN_START_NS:
            raise _fail(
                where,
                "calendar",
                units.calendar,
                f"differs from the {reference.calendar} calendar of the first file, and they differ before "
                "1582-10-15, which these times reach",
            )
    return result.reshape(shape)


# ------------------------------------------------------------------------------------------- encoding
def _exactly_as(quotients: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """``quotients`` (int64) as ``dtype`` when every one is exactly representable, else None."""
    if quotients.size == 0:
        return quotients.astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if int(quotients.min()) < info.min or int(quotients.max()) > info.max:
            return None
        return quotients.astype(dtype)
    if dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            converted = quotients.astype(dtype)
            wide = converted.astype(np.float64)
            if not (np.isfinite(wide) & (np.abs(wide) < 2.0**63)).all():
                return None
            if not (wide.astype(np.int64) == quotients).all():
                return None
        return converted
    return None


def _candidates(off: np.ndarray, reference: TimeUnits, dtype: np.dtype):
    if dtype.kind in "iuf" and (off % reference.step == 0).all():
        kept = _exactly_as(off // reference.step, dtype)
        if kept is not None:
            yield kept, reference.text, dtype
    for unit in _UNITS_COARSE_TO_FINE[_UNITS_COARSE_TO_FINE.index(reference.unit) :]:
        step = _NS_PER_UNIT[unit]
        if (off % step == 0).all():
            yield off // step, f"{unit} since {reference.since}", np.dtype(np.int64)


def encode(offsets_ns: np.ndarray, reference: TimeUnits, dtype: np.dtype) -> tuple[np.ndarray, str, np.dtype]:
    """The values to store, their units text and dtype for instants ``reference.epoch + offsets_ns``.

    ``reference``'s own units text and ``dtype`` when every offset is a whole number of its unit exactly
    representable in ``dtype``; otherwise the coarsest unit (no coarser than ``reference``'s) in which every
    offset is whole, ``"<unit> since <reference.since>"``, as int64. Every candidate is decoded as xarray
    would before it is returned; none decoding exactly: FormatError.
    """
    off = np.asarray(offsets_ns)
    if off.dtype.kind not in "iu":
        raise FormatError(
            f"units {reference.text!r}: offsets of type {off.dtype} are not integer nanoseconds"
        )
    off = off.astype(np.int64)
    dtype = np.dtype(dtype)
    where = f"the joined times in {reference.text!r}"
    for values, text, kind in _candidates(off, reference, dtype):
        units = reference if text == reference.text else parse_time_units(text, reference.calendar, where)
        try:
            decoded = offsets(values, units, reference, where)
        except FormatError:
            continue
        if np.array_equal(decoded, off):
            return values, text, kind
    raise FormatError(
        f"{where}: calendar {reference.calendar!r}: no CF encoding of these instants decodes exactly with "
        "xarray (too far from the reference date, or finer than its decoding in this calendar)"
    )


# ---------------------------------------------------------------------------------------------- joining
@dataclass
class TimePart:
    """One file's time variable: raw stored values, its ``units`` and ``calendar`` attributes."""

    values: np.ndarray
    units: str
    calendar: str | None
    source: str


def _joining(where: str, index: int, part: TimePart, error: FormatError) -> FormatError:
    return FormatError(f"{where}: cannot join part {index} ({part.source}): {error}")


def join(parts: Sequence[TimePart], where: str, *, axis: int = 0) -> tuple[np.ndarray, str, np.dtype]:
    """The joined time variable: (values, units text, dtype).

    When every part has the same encoding and dtype, their plain concatenation with the first part's
    units, unless xarray would decode the concatenation differently from the parts (floats crossing the
    datetime64[ns] range, another unit spelling...); otherwise every part's instants relative to the first
    part's reference date, encoded by :func:`encode` with the first part's dtype. Errors name the first
    part that cannot be joined and why.
    """
    if not parts:
        raise FormatError(f"{where}: no time values to join")
    arrays, units = [], []
    for index, part in enumerate(parts):
        try:
            array = np.asarray(part.values)
            if array.dtype.kind not in "iuf":
                raise FormatError(f"{part.source}: time values of type {array.dtype} are not numbers")
            if array.ndim == 0 or not -array.ndim <= axis < array.ndim:
                raise FormatError(f"{part.source}: time values of shape {array.shape} have no axis {axis}")
            parsed = parse_time_units(part.units, part.calendar, part.source)
        except FormatError as error:
            raise _joining(where, index, part, error) from error
        arrays.append(array)
        units.append(parsed)
    first, dtype = units[0], arrays[0].dtype
    if all(same_encoding(first, u) and a.dtype == dtype for u, a in zip(units, arrays, strict=True)):
        joined = np.concatenate(arrays, axis=axis)
        if _decodes_alike(arrays, units, joined, axis):
            return joined, first.text, dtype
    shifted = []
    for index, (part, array, parsed) in enumerate(zip(parts, arrays, units, strict=True)):
        try:
            shifted.append(offsets(array, parsed, first, part.source))
        except FormatError as error:
            raise _joining(where, index, part, error) from error
    try:
        return encode(np.concatenate(shifted, axis=axis), first, dtype)
    except FormatError as error:
        raise FormatError(f"{where}: {error}") from error


def _decodes_alike(arrays: list[np.ndarray], units: list[TimeUnits], joined: np.ndarray, axis: int) -> bool:
    """False when xarray decodes the concatenation differently from the parts (as far as known)."""
    try:
        apart = [offsets(a, u, units[0], "part") for a, u in zip(arrays, units, strict=True)]
    except FormatError:
        return True  # undecodable parts (fill values...): nothing re-encoded, as the caller asked
    try:
        together = offsets(joined, units[0], units[0], "joined")
    except FormatError:
        return False
    return bool(np.array_equal(np.concatenate(apart, axis=axis), together))
