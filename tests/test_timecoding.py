"""timecoding against xarray's and cftime's own time decoding, never against values it produced itself.

Oracles: ``xarray.coding.times.decode_cf_datetime`` (which falls back to ``cftime.num2date`` for other
calendars and ranges, as ``open_dataset`` does) applied to every part with its own units and calendar, and
to the joined result with the first part's calendar; ``xr.open_mfdataset`` over real netCDF-4 files written
with netCDF4-python; pandas (through xarray's ``_unpack_time_unit_and_ref_date``) and cftime for reference
dates. Decoded instants are compared as (year, month, day, hour, minute, second, microsecond, nanosecond)
tuples, whatever type xarray decoded them to.
"""

from __future__ import annotations

import re
import warnings

import cftime
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from xarray.coding.times import _unpack_time_unit_and_ref_date, decode_cf_datetime

from nczmap.errors import FormatError
from nczmap.integrations.virtualize.timecoding import (
    TimePart,
    TimeUnits,
    encode,
    is_time_units,
    join,
    offsets,
    parse_time_units,
    same_encoding,
)

netCDF4 = pytest.importorskip("netCDF4")

WHERE = "'time' of a.nc"
CALENDAR_ATTRIBUTES = {
    "standard": [None, "standard", "gregorian", "Gregorian"],
    "proleptic_gregorian": ["proleptic_gregorian"],
    "noleap": ["noleap", "365_day"],
    "all_leap": ["all_leap", "366_day"],
    "360_day": ["360_day"],
    "julian": ["julian"],
}
EVERY_CALENDAR = [attr for attrs in CALENDAR_ATTRIBUTES.values() for attr in attrs]


# -- helpers ------------------------------------------------------------------------------------------------


def xdecode(values, units: str, calendar: str | None) -> np.ndarray:
    """xarray's decoding, as open_dataset does it (use_cftime=None, time_unit="ns")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return decode_cf_datetime(np.asarray(values), units, calendar)


def instants(decoded) -> list[tuple[int, ...]]:
    """Decoded times (datetime64 or cftime objects) as comparable tuples."""
    flat = np.asarray(decoded).ravel()
    if flat.dtype.kind == "M":
        index = pd.DatetimeIndex(flat.astype("datetime64[ns]"))
        fields = ("year", "month", "day", "hour", "minute", "second", "microsecond", "nanosecond")
        return list(zip(*(getattr(index, name).tolist() for name in fields), strict=True))
    return [(t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond, 0) for t in flat]


def expected_instants(parts: list[TimePart]) -> list[tuple[int, ...]]:
    """Every part decoded with its own units and calendar, then concatenated (open_mfdataset's way)."""
    decoded = [xdecode(p.values, p.units, p.calendar) for p in parts if p.values.size]  # cftime: not empty
    return [moment for times in decoded for moment in instants(times)]


def check_join(parts: list[TimePart]) -> tuple[np.ndarray, str, np.dtype]:
    values, units, dtype = join(parts, "time")
    assert values.dtype == dtype
    assert instants(xdecode(values, units, parts[0].calendar)) == expected_instants(parts)
    return values, units, dtype


def part(units: str, dtype: str, values, calendar: str | None = None, source: str = "") -> TimePart:
    return TimePart(np.asarray(values, dtype=dtype), units, calendar, source or f"{units} {dtype}")


def cftime_epoch_ns(since: str, calendar: str | None) -> int:
    """cftime's reading of a reference date: ns since its calendar's 1970-01-01."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        date = cftime.num2date(0, f"microseconds since {since}", calendar or "standard")
        origin = cftime.datetime(1970, 1, 1, calendar=date.calendar, has_year_zero=date.has_year_zero)
    delta = date - origin
    return ((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds) * 1000


def pandas_epoch_ns(since: str) -> int:
    """xarray's pandas reading of a reference date (ns since 1970-01-01), as its pandas path uses it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, ref = _unpack_time_unit_and_ref_date(f"days since {since}")
    return ref.as_unit("ns").value


# -- joins of fixed collections, every calendar ----------------------------------------------------------

SCENARIOS = {
    "brief": [
        ("days since 2020-01-01", "int32", [0, 1]),
        ("days since 2020-01-03", "float64", [0, 1]),
        ("hours since 2020-01-05", "int64", [0, 24]),
    ],
    "fractions": [
        ("days since 1999-12-30 12:00:00", "float64", [0, 0.25, 1 / 3]),
        ("hours since 2000-01-02T06:30:00.5", "float32", [0.5, 1.75]),
        ("seconds since 2000-01-03 00:00:00 +05:30", "int64", [0, 86399]),
        ("Minutes since 2000-1-4 6:30", "float64", [0.1, 2 / 3, -7.3]),
    ],
    "abbreviations": [
        ("d since 2000-01-01", "float64", [0.1, 1 / 3]),
        ("hrs since 2000-01-01 00:00:00Z", "float64", [25.5, 1e-7]),
        ("min since 2000-01-02", "int16", [0, 1439]),
        ("ms since 2000-01-03 00:00:00 UTC", "int64", [1, 999]),
        ("  secs   since\t2000-01-04 00:00:00-0100 ", "float64", [0.25, 1.0000001]),
    ],
    "middle_ages": [
        ("days since 1000-03-01", "int32", [0, 59]),
        ("hours since 1000-05-01", "float64", [0.5, 48.1]),
        ("seconds since 999-5-3", "int64", [0, 3600]),
    ],
    "gregorian_reform": [
        ("days since 1582-10-01", "int32", [0, 1, 2, 3]),
        ("days since 1582-10-15", "int32", [0, 1]),
        ("hours since 1582-09-20", "float64", [600.5, 1000]),
    ],
    "year_zero": [
        ("days since 0001-01-01", "int64", [-800, -400, 0]),
        ("days since -0001-06-01", "float64", [0.5, 2]),
        ("hours since 0002-01-01", "int32", [-1, 10000]),
    ],
    "five_digit_years": [
        ("days since 10000-01-01", "int64", [0, 1]),
        ("hours since 10000-01-03", "int32", [0, 12]),
    ],
    "ns_range_edge": [
        ("days since 1677-01-01", "float64", [0.5, 1000.25]),
        ("days since 1700-01-01", "float64", [0.1, 0.2]),
        ("microseconds since 1700-01-02", "int64", [1, 2]),
    ],
}


@pytest.mark.parametrize("calendar", EVERY_CALENDAR)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_join_decodes_as_xarray_decodes_every_part(scenario, calendar):
    parts = [part(units, dtype, values, calendar) for units, dtype, values in SCENARIOS[scenario]]
    check_join(parts)


def test_join_of_the_brief_keeps_days_and_int32():
    parts = [part(units, dtype, values) for units, dtype, values in SCENARIOS["brief"]]
    values, units, dtype = check_join(parts)
    assert (units, dtype) == ("days since 2020-01-01", np.dtype("int32"))
    np.testing.assert_array_equal(values, np.arange(6))


def test_join_goes_finer_only_as_needed():
    parts = [
        part("days since 2020-01-01", "float64", [0, 1]),
        part("days since 2020-01-02", "float64", [1.5]),
    ]
    values, units, dtype = check_join(parts)
    assert (units, dtype) == ("hours since 2020-01-01", np.dtype("int64"))
    np.testing.assert_array_equal(values, [0, 24, 60])


def test_join_in_nanoseconds_where_xarray_decodes_nanoseconds():
    parts = [
        part("nanoseconds since 2000-01-01", "int64", [1, 2]),
        part("seconds since 2000-01-01 00:00:01", "float64", [3e-9, 0.1]),
    ]
    _, units, dtype = check_join(parts)
    assert (units, dtype) == ("nanoseconds since 2000-01-01", np.dtype("int64"))
    # the same instants cannot be written for xarray in a calendar it decodes with cftime (microseconds)
    noleap = [TimePart(p.values, p.units, "noleap", p.source) for p in parts]
    with pytest.raises(FormatError, match="nanoseconds"):
        join(noleap, "time")


def test_same_encoding_is_concatenated_untouched():
    parts = [
        part("days since 2020-01-01", "float32", [0.5, 1.5]),
        part("day since 2020-01-01 00:00:00Z", "float32", [2.5]),
    ]
    values, units, dtype = check_join(parts)
    assert units == "days since 2020-01-01" and dtype == np.dtype("float32")
    np.testing.assert_array_equal(values, np.array([0.5, 1.5, 2.5], dtype="float32"))
    # fill values pass through a plain concatenation (the caller masks them)
    nan = [
        part("days since 2020-01-01", "float64", [0, np.nan]),
        part("days since 2020-01-01", "float64", [2]),
    ]
    values, _, _ = join(nan, "time")
    assert np.isnan(values[1])


def test_same_encoding_decoded_otherwise_when_concatenated_is_not_kept():
    # alone, 1e-9 days decodes through pandas (86400 ns); next to a day beyond 2262 the whole array goes
    # through cftime (86 µs): the plain concatenation would change the first instant
    parts = [
        part("days since 2000-01-01", "float64", [1e-9]),
        part("days since 2000-01-01", "float64", [1e5]),
    ]
    apart = expected_instants(parts)
    together = instants(xdecode(np.array([1e-9, 1e5]), "days since 2000-01-01", None))
    assert apart != together
    with pytest.raises(FormatError, match="time"):
        join(parts, "time")


@pytest.mark.parametrize("last", [float(v) for v in np.arange(95, 106, 0.5)] + [1e-9, 300.0])
def test_join_near_the_end_of_datetime64_ns(last):
    # 2262-01-01 + 100 days is 2262-04-11, the last day of datetime64[ns]: xarray decodes these floats with
    # pandas (ns, truncated) below it and with cftime (µs, rounded) above; too close to tell is refused
    parts = [
        part("days since 2262-01-01", "float64", [1e-9, last]),
        part("hours since 2262-01-01", "int32", [1]),
    ]
    try:
        check_join(parts)
    except FormatError as error:
        assert "too close" in str(error) or "no CF encoding" in str(error)
        assert 97 <= last <= 104  # within three days (twice the unit and a day) of the limit


def test_join_with_an_empty_part():
    for calendar in (None, "360_day"):
        parts = [
            part("days since 2020-01-01", "int32", [], calendar),
            part("hours since 2020-01-03", "float64", [0.5], calendar),
            part("days since 2020-01-05", "int64", [], calendar),
        ]
        values, units, _ = check_join(parts)
        assert (units, values.tolist()) == ("minutes since 2020-01-01", [2910])


def test_time_bounds_join_along_their_first_axis():
    parts = [
        part("days since 2020-01-01", "int32", [[0, 1], [1, 2]]),
        part("hours since 2020-01-03", "int32", [[0, 24]]),
    ]
    values, units, dtype = check_join(parts)
    assert values.shape == (3, 2) and units == "days since 2020-01-01" and dtype == np.dtype("int32")


# -- encode ------------------------------------------------------------------------------------------------


def test_encode_keeps_the_reference_units_and_dtype_when_exact():
    ref = parse_time_units("hours since 2020-01-01", "noleap", WHERE)
    hour = 3_600_000_000_000
    values, units, dtype = encode(np.array([0, 5 * hour, -hour]), ref, np.dtype("int16"))
    assert (units, dtype, values.tolist()) == ("hours since 2020-01-01", np.dtype("int16"), [0, 5, -1])
    values, units, dtype = encode(np.array([0, 40_000 * hour]), ref, np.dtype("int16"))  # int16 overflows
    assert (units, dtype, values.tolist()) == ("hours since 2020-01-01", np.dtype("int64"), [0, 40_000])
    seconds = parse_time_units("seconds since 2020-01-01", "noleap", WHERE)
    values, units, dtype = encode(np.array([0, (2**24 + 1) * 10**9]), seconds, np.dtype("float32"))  # inexact
    assert (units, dtype, values.tolist()) == ("seconds since 2020-01-01", np.dtype("int64"), [0, 2**24 + 1])
    values, units, dtype = encode(np.array([0, 2**24 * 10**9]), seconds, np.dtype("float32"))  # exact
    assert (units, dtype, values.tolist()) == ("seconds since 2020-01-01", np.dtype("float32"), [0, 2**24])
    values, units, dtype = encode(np.array([1_000]), ref, np.dtype("float64"))
    assert (units, dtype, values.tolist()) == ("microseconds since 2020-01-01", np.dtype("int64"), [1])


def test_encode_refuses_what_xarray_cannot_decode():
    ref = parse_time_units("hours since 2020-01-01", "noleap", WHERE)
    with pytest.raises(FormatError, match="calendar 'noleap'"):
        encode(np.array([1]), ref, np.dtype("int64"))  # 1 ns: cftime decodes microseconds only


# -- offsets, bit for bit --------------------------------------------------------------------------------


def decoded_offsets_ns(values: np.ndarray, text: str, calendar: str | None) -> list[int]:
    """xarray's decoded instants as ns since the reference date, the difference taken by cftime."""
    since = text.split("since", 1)[1].strip()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        epoch = cftime.num2date(0, f"microseconds since {since}", calendar or "standard")
        result = []
        for *fields, nanosecond in instants(xdecode(values, text, calendar)):
            date = cftime.datetime(*fields, calendar=epoch.calendar, has_year_zero=epoch.has_year_zero)
            delta = date - epoch
            micro = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
            result.append(micro * 1000 + nanosecond)
    return result


FLOATS = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(-1e-3, 1e-3, allow_nan=False),
    st.builds(lambda n, d: n / d, st.integers(-100_000, 100_000), st.sampled_from([3, 7, 10, 1000, 86400])),
    st.builds(lambda n: n + 0.5, st.integers(-1000, 1000)),
    st.builds(lambda n: float(np.nextafter(n, np.inf)), st.integers(-1000, 1000)),
    st.builds(lambda n: float(np.nextafter(n, -np.inf)), st.integers(-1000, 1000)),
)


@settings(max_examples=250, deadline=None)
@given(
    values=st.lists(FLOATS, min_size=1, max_size=6),
    spelling=st.sampled_from(["days", "d", "hours", "h", "minutes", "seconds", "s", "milliseconds", "ms"]),
    since=st.sampled_from(
        ["2000-01-01", "1999-12-30T23:59:59.5", "1000-01-01", "2020-02-03 00:00:00 +05:30"]
    ),
    calendar=st.sampled_from([None, "proleptic_gregorian", "noleap", "360_day", "julian"]),
    dtype=st.sampled_from(["float64", "float32"]),
)
def test_offsets_round_floats_as_xarray_does(values, spelling, since, calendar, dtype):
    raw = np.array(values, dtype=dtype)
    text = f"{spelling} since {since}"
    units = parse_time_units(text, calendar, WHERE)
    try:
        mine = offsets(raw, units, units, WHERE).tolist()
    except FormatError as error:
        assert WHERE in str(error)
        event("refused")
        return
    assert mine == decoded_offsets_ns(raw, text, calendar)


@pytest.mark.parametrize("calendar", [None, "noleap"])
def test_offsets_of_large_integers_follow_xarrays_float_conversion(calendar):
    # past 2**53 xarray's cftime path turns integers into float64 first
    raw = np.array([2**53 + 1, 2**53 + 3], dtype="int64")
    units = parse_time_units("microseconds since 1000-01-01", calendar, WHERE)
    assert offsets(raw, units, units, WHERE).tolist() == decoded_offsets_ns(raw, units.text, calendar)


# -- reference dates --------------------------------------------------------------------------------------


@st.composite
def reference_dates(draw, calendar: str, years: tuple[int, int]) -> str:
    """Reference dates of nczmap's grammar (years sometimes unpadded, as xarray pads them)."""
    year = draw(st.integers(*years))
    if year == 0 and calendar in ("standard", "julian"):
        year = 1
    month = draw(st.integers(1, 12))
    day = draw(st.integers(1, 30 if calendar == "360_day" else 28))
    if calendar == "standard" and (year, month) == (1582, 10) and 4 < day < 15:
        day = 15
    digits = f"{abs(year):04d}" if draw(st.integers(0, 3)) else str(abs(year))
    text = ("-" if year < 0 else "") + digits + "-"
    text += draw(st.sampled_from([f"{month:02d}-{day:02d}", f"{month}-{day}"]))
    if draw(st.booleans()):
        hour, minute, second = draw(st.integers(0, 23)), draw(st.integers(0, 59)), draw(st.integers(0, 59))
        text += draw(st.sampled_from(["T", " "])) + draw(
            st.sampled_from([f"{hour:02d}:{minute:02d}", f"{hour}:{minute}"])
        )
        if draw(st.booleans()):
            text += f":{second:02d}" + draw(
                st.sampled_from(["", ".5", ".25", ".000001", ".999999", ".1", ".0"])
            )
        text += draw(st.sampled_from(["", "Z", " Z", " UTC", "UTC", "+05:00", " -0530", "+01", " -12:00"]))
    return text


def ambiguous_year(since: str) -> bool:
    """A year of fewer than 4 digits that xarray does not pad (another 4-digit number is present)."""
    return len(re.match(r"-?(\d+)", since)[1]) < 4 and re.search(r"\d{4}", since) is not None


@settings(max_examples=300, deadline=None)
@given(data=st.data(), calendar=st.sampled_from(sorted(CALENDAR_ATTRIBUTES)))
def test_reference_dates_read_as_cftime_and_pandas_read_them(data, calendar):
    years = data.draw(st.sampled_from([(1678, 2261), (-3000, 3000), (1500, 1700), (-20, 20), (9000, 12000)]))
    since = data.draw(reference_dates(calendar, years))
    if ambiguous_year(since):
        with pytest.raises(FormatError, match="ambiguous year"):
            parse_time_units(f"days since {since}", calendar, WHERE)
        return
    units = parse_time_units(f"days since {since}", calendar, WHERE)
    assert units.epoch == cftime_epoch_ns(since, calendar)
    if calendar in ("standard", "proleptic_gregorian") and 1678 <= int(re.match(r"-?\d+", since)[0]) <= 2261:
        assert units.epoch == pandas_epoch_ns(since)


@pytest.mark.parametrize(
    "since",
    [
        "2020-01-01 00:00:00 +5",  # pandas applies +5 h, cftime ignores it
        "2020-01-01 00:00:00 -6:00",
        "2020-01-01 00:00:00 UTC+05:00",
        "2020-01-01 00:00:00.000249",  # cftime's float arithmetic reads 248 µs
        "2020-01-01 00:00:00.1234567",  # below a microsecond: pandas keeps it, cftime drops it
        "1-1-1 00:00:00.000000",  # pandas reads 2001-01-01
        "2020-01-01T06",  # pandas reads 06:00, cftime midnight
        "2020-01-01  06:00:00",  # two spaces: cftime ignores the time
    ],
)
def test_reference_dates_pandas_and_cftime_disagree_on_are_refused(since):
    try:
        theirs = pandas_epoch_ns(since)
    except ValueError:
        theirs = None
    assert theirs != cftime_epoch_ns(since, "proleptic_gregorian")
    with pytest.raises(FormatError, match="units") as error:
        parse_time_units(f"days since {since}", None, WHERE)
    assert WHERE in str(error.value)


def test_parse_time_units_fields():
    units = parse_time_units("Hours since 2020-01-01T06:30:00.5 +01:00", "365_day", WHERE)
    assert units == TimeUnits(
        "hours",
        3_600_000_000_000,
        "noleap",
        cftime_epoch_ns("2020-01-01T06:30:00.5 +01:00", "noleap"),
        "2020-01-01T06:30:00.5 +01:00",
        "Hours since 2020-01-01T06:30:00.5 +01:00",
    )
    spellings = {"d": "days", "hr": "hours", "h": "hours", "min": "minutes", "sec": "seconds", "s": "seconds"}
    spellings |= {"msec": "milliseconds", "ms": "milliseconds", "usec": "microseconds", "us": "microseconds"}
    spellings |= {
        "ns": "nanoseconds",
        "NANOSECOND": "nanoseconds",
        "Day": "days",
        "MICROSECONDS": "microseconds",
    }
    for spelling, unit in spellings.items():
        assert parse_time_units(f"{spelling} since 2000-01-01", None, WHERE).unit == unit


def test_same_encoding():
    a = parse_time_units("days since 2020-01-01", "noleap", WHERE)
    assert same_encoding(a, parse_time_units("day  since 2020-1-1 00:00:00Z", "365_day", WHERE))
    assert same_encoding(a, parse_time_units("d since 2020-01-01 05:00:00 +05:00", "noleap", WHERE))
    assert not same_encoding(a, parse_time_units("hours since 2020-01-01", "noleap", WHERE))
    assert not same_encoding(a, parse_time_units("days since 2020-01-01", "all_leap", WHERE))
    assert not same_encoding(a, parse_time_units("days since 2020-01-01 00:00 +05:00", "noleap", WHERE))


def test_is_time_units():
    assert is_time_units("days since 2000-01-01")
    assert is_time_units("  HOURS\tsince\n2000-01-01 ")
    assert is_time_units("months since 2000-01-01")  # a time unit, refused when parsed
    for other in [
        "days",
        "days since",
        "K",
        "days SINCE 2000-01-01",
        "since 2000",
        None,
        3,
        b"days since 2000",
    ]:
        assert not is_time_units(other)


# -- refusals name the attribute and where ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("units", "calendar", "attribute", "words"),
    [
        ("months since 2000-01-01", "360_day", "units", "months since"),
        ("years since 2000-01-01", None, "units", "years since"),
        ("common_years since 2000-01-01", "noleap", "units", "years since"),
        ("fortnights since 2000-01-01", None, "units", "unknown time unit"),
        ("days since 2000-01-01", "lunar", "calendar", "unknown calendar"),
        ("days since 2000-01-01", "", "calendar", "unknown calendar"),
        ("days since 2000-01-01", 365, "calendar", "must be text"),
        ("days since yesterday", None, "units", "not a date"),
        ("days since 2000", None, "units", "not a date"),
        ("days since 1582-10-10", None, "units", "does not exist"),
        ("days since 0000-01-01", "julian", "units", "year 0"),
        ("days since 2001-02-29", None, "units", "invalid day"),
        ("days since 2000-02-29", "noleap", "units", "invalid day"),
        ("days since 2000-02-31", "360_day", "units", "invalid day"),
        ("days since 2000-01-01 24:00:00", None, "units", "time of day"),
        ("days since 2000-01-01 00:00:00 +25:00", None, "units", "time-zone"),
        ("days since +2000-01-01", None, "units", "not a date"),
        ("days since 02000-01-01", None, "units", "leading zeros"),
        ("days since 1000000-01-01", None, "units", "out of the supported range"),
        ("days since 2000-01-01", "tai", "calendar", "unknown calendar"),
        (b"days since 2000-01-01", None, "units", "must be text"),
    ],
)
def test_parse_refusals_name_attribute_and_where(units, calendar, attribute, words):
    with pytest.raises(FormatError) as error:
        parse_time_units(units, calendar, WHERE)
    message = str(error.value)
    assert WHERE in message and f"{attribute} " in message and words in message


def test_join_refuses_calendars_it_would_have_to_convert():
    parts = [
        part("days since 2000-01-01", "int32", [0], None, "a.nc"),
        part("days since 2000-01-02", "int32", [0]),
    ]
    parts[1] = TimePart(parts[1].values, parts[1].units, "julian", "'time' of b.nc")
    with pytest.raises(FormatError) as error:
        join(parts, "time")
    message = str(error.value)
    assert "'time' of b.nc" in message and "calendar 'julian'" in message and "part 1" in message


def test_standard_and_proleptic_gregorian_agree_only_after_the_reform():
    modern = [
        part("days since 2000-01-01", "int32", [0, 1]),
        part("days since 2000-01-03", "int32", [0], "proleptic_gregorian", "'time' of b.nc"),
    ]
    check_join(modern)
    old = [
        part("days since 1500-01-01", "int32", [0, 1]),
        part("days since 1500-01-03", "int32", [0], "proleptic_gregorian", "'time' of b.nc"),
    ]
    with pytest.raises(FormatError, match=r"'time' of b\.nc.*calendar 'proleptic_gregorian'.*1582-10-15"):
        join(old, "time")
    reaching_back = [
        part("days since 1600-01-01", "int32", [0], "proleptic_gregorian"),
        part("days since 1600-01-01", "int32", [-10_000], None, "'time' of b.nc"),
    ]
    with pytest.raises(FormatError, match=r"'time' of b\.nc.*calendar 'standard'"):
        join(reaching_back, "time")


def test_offsets_refusals_name_where():
    ref = parse_time_units("days since 1700-01-01", None, "'time' of a.nc")
    far = parse_time_units("days since 2300-01-01", None, WHERE)
    with pytest.raises(FormatError, match=rf"{WHERE}: units 'days since 2300-01-01'.*int64"):
        offsets(np.array([0]), far, ref, WHERE)
    with pytest.raises(FormatError, match=rf"{WHERE}: .*NaN"):
        offsets(np.array([0.0, np.nan]), ref, ref, WHERE)
    with pytest.raises(FormatError, match=rf"{WHERE}: units 'days since 1700-01-01'.*overflow"):
        offsets(np.array([1e300]), ref, ref, WHERE)
    with pytest.raises(FormatError, match=rf"{WHERE}: .*type"):
        offsets(np.array(["a"]), ref, ref, WHERE)
    julian = parse_time_units("days since 1700-01-01", "julian", WHERE)
    with pytest.raises(FormatError, match=rf"{WHERE}: calendar 'julian': differs from the standard calendar"):
        offsets(np.array([0]), julian, ref, WHERE)
    us = parse_time_units("us since 1700-01-01", None, WHERE)  # udunits' spelling, unknown to xarray
    with pytest.raises(FormatError, match=rf"{WHERE}: units 'us since 1700-01-01'.*cftime"):
        offsets(np.array([1]), us, ref, WHERE)


def test_join_refusals_name_the_part():
    parts = [
        part("days since 2000-01-01", "int32", [0], None, "a.nc"),
        part("months since 2000-01-01", "i4", [1]),
    ]
    with pytest.raises(
        FormatError, match=r"^time: cannot join part 1 \(months since 2000-01-01 i4\).*months"
    ):
        join(parts, "time")
    with pytest.raises(FormatError, match="no time values"):
        join([], "time")
    with pytest.raises(FormatError, match="part 0"):
        join([part("days since 2000-01-01", "bool", [True])], "time")


# -- end to end: real netCDF-4 files and xr.open_mfdataset -----------------------------------------------


def write_time_file(path, units: str, dtype: str, values, calendar: str | None) -> None:
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("time", None)
        time = ds.createVariable("time", dtype, ("time",))
        time.units = units
        if calendar is not None:
            time.calendar = calendar
        time[:] = np.asarray(values, dtype=dtype)
        ds.createVariable("x", "f4", ("time",))[:] = np.arange(len(values), dtype="f4")


FILES = [
    ("days since 2020-01-01", "i4", [0, 1]),
    ("days since 2020-01-03", "f8", [0, 1]),
    ("hours since 2020-01-05", "i8", [0, 24]),
]
FRACTIONAL_FILES = [
    ("days since 2020-01-01", "f8", [0.1, 1 / 3]),
    ("hours since 2020-01-03 12:00:00 +05:30", "f4", [0.5, 7.25]),
    ("seconds since 2020-01-05", "i8", [1, 86_399]),
]


@pytest.mark.parametrize("calendar", [None, "noleap"])
@pytest.mark.parametrize("files", [FILES, FRACTIONAL_FILES], ids=["brief", "fractional"])
def test_join_matches_open_mfdataset(tmp_path, calendar, files):
    paths = []
    for index, (units, dtype, values) in enumerate(files):
        paths.append(tmp_path / f"t{index}.nc")
        write_time_file(paths[-1], units, dtype, values, calendar)
    parts = []
    for path in paths:
        with netCDF4.Dataset(path) as ds:
            time = ds["time"]
            time.set_auto_maskandscale(False)
            parts.append(
                TimePart(time[:], time.units, getattr(time, "calendar", None), f"'time' of {path.name}")
            )
    values, units, dtype = join(parts, "time")
    joined = tmp_path / "joined.nc"
    write_time_file(joined, units, np.dtype(dtype).str[1:], values, calendar)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with xr.open_mfdataset(paths, combine="nested", concat_dim="time", engine="netcdf4") as many:
            expected = many["time"].values
        with xr.open_dataset(joined, engine="netcdf4") as one:
            got = one["time"].values
    assert got.dtype == expected.dtype
    assert instants(got) == instants(expected)
    if calendar is None:
        np.testing.assert_array_equal(got, expected)


# -- properties ----------------------------------------------------------------------------------------------

SPELLINGS = [
    "days",
    "day",
    "d",
    "Days",
    "hours",
    "hour",
    "h",
    "hr",
    "minutes",
    "min",
    "seconds",
    "second",
    "s",
]
SPELLINGS += ["sec", "milliseconds", "ms", "msec", "microseconds", "microsec", "nanoseconds"]
ERAS = [(-30, 30), (1000, 1500), (1578, 1586), (1700, 2200), (2250, 2275), (1670, 1685), (9995, 10005)]
DTYPES = ["int16", "int32", "int64", "uint16", "uint32", "float32", "float64"]


def numbers(dtype: str) -> st.SearchStrategy:
    kind = np.dtype(dtype).kind
    if kind in "iu":
        info = np.iinfo(dtype)
        small = st.integers(max(info.min, -3000), min(info.max, 3000))
        return st.one_of(small, st.integers(max(info.min, -(2**45)), min(info.max, 2**45)))
    return st.one_of(
        st.integers(-3000, 3000).map(float),
        st.builds(lambda n, d: n / d, st.integers(-30_000, 30_000), st.sampled_from([2, 3, 4, 7, 10, 1000])),
        st.floats(-3000, 3000, allow_nan=False, width=32 if dtype == "float32" else 64),
        st.sampled_from([1e15, -1e15, 2.0**45]),
    )


@st.composite
def parts_to_join(draw) -> list[TimePart]:
    """2-4 parts of one calendar (standard and proleptic_gregorian sometimes mixed), reference dates a few
    years apart in one era; sometimes every part in the same encoding."""
    calendar = draw(st.sampled_from(sorted(CALENDAR_ATTRIBUTES)))
    base = draw(st.integers(*draw(st.sampled_from(ERAS))))
    same = draw(st.integers(0, 3)) == 0
    parts: list[TimePart] = []
    for index in range(draw(st.integers(2, 4))):
        if same and parts:
            units, attribute, dtype = parts[0].units, parts[0].calendar, parts[0].values.dtype.name
        else:
            kind = calendar
            if calendar in ("standard", "proleptic_gregorian") and draw(st.integers(0, 4)) == 0:
                kind = "proleptic_gregorian" if calendar == "standard" else "standard"
            attribute = draw(st.sampled_from(CALENDAR_ATTRIBUTES[kind]))
            year = base + draw(st.integers(-2, 2))
            units = f"{draw(st.sampled_from(SPELLINGS))} since {draw(reference_dates(kind, (year, year)))}"
            dtype = draw(st.sampled_from(DTYPES))
        values = draw(st.lists(numbers(dtype), min_size=1, max_size=4))
        parts.append(TimePart(np.array(values).astype(dtype), units, attribute, f"p{index}"))
    return parts


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=parts_to_join())
def test_join_decodes_as_xarray_or_refuses(parts):
    try:
        values, units, dtype = join(parts, "time")
    except FormatError as error:
        assert str(error).startswith("time: ")
        event("refused")
        return
    event("joined")
    assert values.dtype == dtype
    try:
        expected = expected_instants(parts)
    except Exception:
        # xarray cannot decode some part: only an untouched concatenation may be returned
        event("undecodable parts")
        assert units == parts[0].units
        np.testing.assert_array_equal(values, np.concatenate([p.values for p in parts]))
        return
    assert instants(xdecode(values, units, parts[0].calendar)) == expected


@settings(max_examples=300, deadline=None)
@given(
    units=st.one_of(
        st.text(max_size=40),
        st.builds(
            "{}{}since{}{}".format,
            st.sampled_from([*SPELLINGS, "months", "", "x", "us", "ns"]),
            st.sampled_from([" ", "\t", "  ", ""]),
            st.sampled_from([" ", "\n", ""]),
            st.text(alphabet="0123456789-:T .Z+UTC", max_size=30),
        ),
    ),
    calendar=st.one_of(st.none(), st.text(max_size=12), st.sampled_from(EVERY_CALENDAR)),
)
def test_parse_time_units_raises_only_format_error(units, calendar):
    assert isinstance(is_time_units(units), bool)
    try:
        parsed = parse_time_units(units, calendar, WHERE)
    except FormatError as error:
        assert WHERE in str(error)
        return
    assert is_time_units(units) and parsed.text == units
    values = np.array([0, 1], dtype="int32")
    try:
        assert offsets(values, parsed, parsed, WHERE)[0] == 0
    except FormatError as error:
        assert WHERE in str(error)
