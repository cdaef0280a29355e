"""Joining files whose encodings differ: open_mfdataset's values, or an error naming the attribute.

The oracle is xarray's ``open_mfdataset(files, combine="nested", concat_dim="time", engine="netcdf4")``:
each file decoded by netCDF4-python + xarray with its own units, scale factor and fill value, then
concatenated. The files are written by netCDF4-python the way real archives differ (per-file time units,
a scale factor or fill value that changed, units of another kind, chunking).
"""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_virtualize import manifest_url, nczmap_command

from nczmap import FormatError

netCDF4 = pytest.importorskip("netCDF4")
xr = pytest.importorskip("xarray")
pytest.importorskip("dask")

from nczmap.integrations.virtualize import VirtualizeWarning, virtualize  # noqa: E402

X = 4


def write(
    path: Path,
    times,
    units: str = "days since 2020-01-01",
    *,
    time_dtype: str = "f8",
    calendar: str | None = "standard",
    dtype: str = "i2",
    scale: float | None = None,
    offset: float | None = None,
    fill: int | float | None = None,
    missing: int | float | None = None,
    value_units: str = "K",
    history: str = "made by the tests",
    chunked: bool = True,
    lat_shift: float = 0.0,
    bounds: bool = False,
    seed: int = 0,
) -> Path:
    """One file of ``len(times)`` steps: ``time``, ``lat``, ``v(time, lat)`` packed as asked."""
    rng = np.random.default_rng(seed)
    with netCDF4.Dataset(path, "w") as ds:
        ds.history = history
        ds.createDimension("time", None)
        ds.createDimension("lat", X)
        time = ds.createVariable("time", time_dtype, ("time",))
        time.units = units
        if calendar is not None:
            time.calendar = calendar
        time[:] = np.asarray(times)
        if bounds:
            ds.createDimension("nv", 2)
            time.bounds = "time_bnds"
            bnds = ds.createVariable("time_bnds", time_dtype, ("time", "nv"))
            step = np.diff(np.asarray(times, dtype="f8")).min() if len(times) > 1 else 1
            bnds[:] = np.stack([np.asarray(times), np.asarray(times) + step], axis=1)
        lat = ds.createVariable("lat", "f4", ("lat",))
        lat.units = "degrees_north"
        lat[:] = np.arange(X, dtype="f4") * 10 + lat_shift
        options = {"zlib": True, "chunksizes": (1, X)} if chunked else {"chunksizes": (2, X)}
        variable = ds.createVariable("v", dtype, ("time", "lat"), fill_value=fill, **options)
        variable.units = value_units
        if scale is not None:
            variable.scale_factor = np.float32(scale) if dtype != "f8" else scale
        if offset is not None:
            variable.add_offset = np.float32(offset) if dtype != "f8" else offset
        if missing is not None:
            variable.missing_value = np.array(missing, dtype=dtype)
        variable.set_auto_maskandscale(False)
        info = np.iinfo(dtype) if dtype[0] in "iu" else None
        low, high = (max(info.min, -1000), min(info.max, 1000)) if info else (-1000, 1000)
        raw = rng.integers(low, high, size=(len(times), X)).astype(dtype)
        if fill is not None:
            raw[0, 0] = fill
        if missing is not None:
            raw[-1, -1] = missing
        variable[:] = raw
    return path


def mfdataset(files):
    return xr.open_mfdataset(
        files, combine="nested", concat_dim="time", engine="netcdf4", data_vars="minimal", coords="minimal",
        compat="override",
    )  # fmt: skip


def assert_values_of_mfdataset(refs: Path, files: list[Path]) -> xr.Dataset:
    """Every variable of the virtual dataset has open_mfdataset's decoded values (and dtype)."""
    with xr.open_dataset(manifest_url(refs), engine="nczmap") as ours, mfdataset(files) as theirs:
        ours, theirs = ours.load(), theirs.load()
        assert sorted(ours.variables) == sorted(theirs.variables)
        for name, variable in theirs.variables.items():
            mine = ours[name]
            assert mine.dtype == variable.dtype, (name, mine.dtype, variable.dtype)
            np.testing.assert_array_equal(mine.values, variable.values, err_msg=name)
        return ours


def virtualized(files: list[Path], refs: Path, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VirtualizeWarning)
        return virtualize(files, refs, concat="time", **options)


# ==================================================================================== per-file time units
def test_per_file_time_units_join_as_open_mfdataset_decodes_them(tmp_path):
    files = [
        write(tmp_path / "a.nc", [0, 1], "days since 2020-01-01"),
        write(tmp_path / "b.nc", [0, 1], "days since 2020-01-03", time_dtype="i4"),
        write(tmp_path / "c.nc", [0, 24], "hours since 2020-01-05", time_dtype="i8"),
    ]
    refs = tmp_path / "refs.json"
    result = virtualized(files, refs)
    assert "/time" in result.loaded
    ours = assert_values_of_mfdataset(refs, files)
    expected = np.array([f"2020-01-0{day}" for day in range(1, 7)], dtype="datetime64[ns]")
    np.testing.assert_array_equal(ours["time"].values, expected)
    assert ours["time"].encoding["units"] == "days since 2020-01-01"  # every value a whole day: kept


def test_times_that_are_not_whole_units_of_the_first_file_get_a_finer_unit(tmp_path):
    files = [
        write(tmp_path / "a.nc", [0, 1], "days since 2020-01-01", time_dtype="i4"),
        write(tmp_path / "b.nc", [0, 6], "hours since 2020-01-03 06:00:00", time_dtype="i4"),
    ]
    refs = tmp_path / "refs.parq"
    virtualized(files, refs)
    ours = assert_values_of_mfdataset(refs, files)
    assert ours["time"].encoding["units"].startswith("hours since 2020-01-01")


def test_time_bounds_without_units_follow_their_coordinate(tmp_path):
    files = [
        write(tmp_path / "a.nc", [0, 1], "days since 2020-01-01", bounds=True),
        write(tmp_path / "b.nc", [0, 1], "days since 2020-01-03", bounds=True),
    ]
    refs = tmp_path / "refs.json"
    virtualized(files, refs)
    ours = assert_values_of_mfdataset(refs, files)
    assert ours["time_bnds"].values[-1, 1] == np.datetime64("2020-01-05", "ns")


def test_noleap_times_with_per_file_units(tmp_path):
    files = [
        write(tmp_path / "a.nc", [58, 59], "days since 2001-01-01", calendar="noleap"),
        write(tmp_path / "b.nc", [0, 1], "days since 2001-03-02", calendar="noleap"),
    ]
    refs = tmp_path / "refs.json"
    virtualized(files, refs)
    with xr.open_dataset(manifest_url(refs), engine="nczmap") as ours, mfdataset(files) as theirs:
        assert list(ours["time"].values) == list(theirs["time"].values)


def test_files_of_different_calendars_are_refused_by_name(tmp_path):
    files = [
        write(tmp_path / "a.nc", [0, 1], "days since 2001-01-01", calendar="noleap"),
        write(tmp_path / "b.nc", [0, 1], "days since 2001-01-03", calendar="360_day"),
    ]
    with pytest.raises(FormatError, match=r"b\.nc.*'/time'.*calendar"):
        virtualized(files, tmp_path / "refs.json")


# ==================================================================================== packing
@pytest.mark.parametrize(
    "first, second, attribute",
    [
        ({"scale": 1.0}, {"scale": 0.5}, "scale_factor"),
        ({"scale": 0.1, "offset": 0.0}, {"scale": 0.1, "offset": 273.15}, "add_offset"),
        ({"fill": -1}, {"fill": -2}, "_FillValue"),
        ({"fill": -1}, {"fill": -1, "missing": -5}, "missing_value"),
    ],
)
def test_packing_that_differs_is_decoded_when_small_and_refused_by_name_when_not(
    tmp_path, first, second, attribute
):
    files = [
        write(tmp_path / "a.nc", [0, 1], **first, seed=1),
        write(tmp_path / "b.nc", [2, 3], **second, seed=2),
        write(tmp_path / "c.nc", [4, 5], **first, seed=3),
    ]
    small = tmp_path / "small.json"
    result = virtualized(files, small)
    assert "/v" in result.loaded
    assert_values_of_mfdataset(small, files)  # stored decoded: exactly xarray's values

    big = tmp_path / "big.json"
    with pytest.raises(FormatError, match=rf"b\.nc.*variable '/v' has {attribute}.*--load"):
        virtualized(files, big, max_chunk_bytes=16)
    assert not big.exists()

    asked = tmp_path / "asked.json"
    virtualized(files, asked, max_chunk_bytes=16, load=["v"])
    assert_values_of_mfdataset(asked, files)

    skipped = tmp_path / "skipped.json"
    with pytest.warns(VirtualizeWarning, match=rf"b\.nc left out.*{attribute}"):
        result = virtualize(files, skipped, concat="time", max_chunk_bytes=16, skip_mismatched=True)
    assert [source for source, _ in result.skipped] == [str(files[1])]
    assert_values_of_mfdataset(skipped, [files[0], files[2]])


def test_the_same_packing_stays_references(tmp_path):
    files = [write(tmp_path / f"{i}.nc", [2 * i, 2 * i + 1], scale=0.5, fill=-1, seed=i) for i in range(3)]
    refs = tmp_path / "refs.json"
    result = virtualized(files, refs)
    assert "/v" not in result.loaded and result.references + result.inline >= 6  # kept as stored
    assert_values_of_mfdataset(refs, files)


def test_a_type_that_differs_is_joined_in_the_type_holding_both(tmp_path):
    files = [
        write(tmp_path / "a.nc", [0, 1], dtype="i2", seed=1),
        write(tmp_path / "b.nc", [2, 3], dtype="i4", seed=2),
    ]
    refs = tmp_path / "refs.json"
    virtualized(files, refs)
    ours = assert_values_of_mfdataset(refs, files)
    assert ours["v"].dtype == np.int32


# ==================================================================================== refused by name
def test_units_of_another_kind_are_refused_naming_the_file_and_attribute(tmp_path):
    files = [
        write(tmp_path / "a.nc", [0, 1]),
        write(tmp_path / "b.nc", [2, 3], value_units="degC"),
        write(tmp_path / "c.nc", [4, 5]),
    ]
    refs = tmp_path / "refs.json"
    with pytest.raises(FormatError, match=r"b\.nc.*'/v' has units 'degC' there but 'K'"):
        virtualized(files, refs)
    assert not refs.exists()
    result = virtualized(files, refs, skip_mismatched=True)
    assert [source for source, _ in result.skipped] == [str(files[1])]
    assert_values_of_mfdataset(refs, [files[0], files[2]])


def test_a_coordinate_not_joined_that_differs_is_refused(tmp_path):
    files = [write(tmp_path / "a.nc", [0, 1]), write(tmp_path / "b.nc", [2, 3], lat_shift=0.5)]
    with pytest.raises(FormatError, match=r"b\.nc.*coordinate '/lat' differ"):
        virtualized(files, tmp_path / "refs.json")
    result = virtualized(files, tmp_path / "refs.json", skip_mismatched=True)
    assert [source for source, _ in result.skipped] == [str(files[1])]


def test_another_variable_not_joined_that_differs_keeps_the_first_and_warns(tmp_path):
    files = [write(tmp_path / f"{i}.nc", [i], seed=i) for i in range(3)]
    for number, path in enumerate(files):
        with netCDF4.Dataset(path, "a") as ds:
            ds.createVariable("mask", "i1", ("lat",))[:] = np.arange(X) % (2 + number)
    refs = tmp_path / "refs.json"
    with pytest.warns(VirtualizeWarning, match=r"the first file's are kept: /mask \(in 2 files\)"):
        virtualize(files, refs, concat="time")
    with xr.open_dataset(manifest_url(refs), engine="nczmap") as ours, netCDF4.Dataset(files[0]) as first:
        np.testing.assert_array_equal(ours["mask"].values, first["mask"][:])


def test_attributes_that_do_not_change_numbers_keep_the_first_and_warn_once(tmp_path):
    files = [write(tmp_path / f"{i}.nc", [i], history=f"run {i}", seed=i) for i in range(3)]
    refs = tmp_path / "refs.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        virtualize(files, refs, concat="time")
    notes = [str(w.message) for w in caught if issubclass(w.category, VirtualizeWarning)]
    assert len(notes) == 1 and "history" in notes[0], notes
    with xr.open_dataset(manifest_url(refs), engine="nczmap") as ours:
        assert ours.attrs["history"] == "run 0"


def test_the_cli_names_the_attribute_and_writes_nothing(tmp_path):
    files = [write(tmp_path / "a.nc", [0, 1]), write(tmp_path / "b.nc", [2, 3], value_units="degC")]
    refs = tmp_path / "refs.json"
    done = nczmap_command("virtualize", *files, refs, "--concat", "time")
    assert done.returncode == 1
    assert b"units" in done.stderr and b"b.nc" in done.stderr and b"Traceback" not in done.stderr
    assert not refs.exists()


# ==================================================================================== the property
CASES = itertools.count()
ENCODINGS = st.fixed_dictionaries(
    {
        "units": st.sampled_from(
            ["days since 2020-01-01", "days since 2019-12-30", "hours since 2020-01-02"]
        ),
        "time_dtype": st.sampled_from(["f8", "i4", "i8"]),
        "dtype": st.sampled_from(["i2", "i4", "f4"]),
        "scale": st.sampled_from([None, 1.0, 0.5, 2.0]),
        "offset": st.sampled_from([None, 0.0, 10.0]),
        "fill": st.sampled_from([None, -1, -99]),
        "missing": st.sampled_from([None, None, -7]),
        "calendar": st.sampled_from(["standard", "gregorian", "proleptic_gregorian", None]),
        "value_units": st.sampled_from(["K", "K", "K", "degC"]),
        "chunked": st.booleans(),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(encodings=st.lists(ENCODINGS, min_size=2, max_size=3), small=st.booleans())
def test_any_collection_joins_to_open_mfdataset_or_an_error_naming_an_attribute(tmp_path, encodings, small):
    folder = tmp_path / f"case{next(CASES)}"
    folder.mkdir()
    files = []
    day = 0
    for number, encoding in enumerate(encodings):
        steps = np.array([day, day + 1])
        unit, _, since = encoding["units"].partition(" since ")
        epoch = np.datetime64(since.replace(" ", "T"), "h")
        base = np.datetime64("2020-01-01T00", "h")
        offset_hours = (base - epoch).astype(int) + steps * 24
        raw = offset_hours if unit == "hours" else offset_hours // 24
        files.append(write(folder / f"f{number}.nc", raw, seed=number, **encoding))
        day += 2
    refs = folder / "refs.json"
    try:
        virtualized(files, refs, max_chunk_bytes=1 << 20 if small else 8)
    except FormatError as exc:
        named = ("units", "scale_factor", "add_offset", "_FillValue", "missing_value", "calendar", "dtype")
        assert any(f"has {name}" in str(exc) for name in named), str(exc)
        event("refused")
        return
    event("joined")
    assert_values_of_mfdataset(refs, files)


def test_a_time_coordinate_re_encoded_in_another_type_gets_that_types_fill(tmp_path):
    """float64 times of half days re-encoded as int64 hours: the fill value becomes int64's default, not a
    float cast to an integer (which numpy warns of and platforms disagree on)."""
    files = [
        write(tmp_path / "a.nc", [0.5], "days since 2026-03-12"),
        write(tmp_path / "b.nc", [0.5], "days since 2026-03-13"),
    ]
    refs = tmp_path / "refs.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", VirtualizeWarning)
        virtualize(files, refs, concat="time")
    zarray = json.loads(json.loads(refs.read_text())["refs"]["time/.zarray"])
    assert zarray["dtype"] == "<i8" and zarray["fill_value"] == netCDF4.default_fillvals["i8"]
    assert_values_of_mfdataset(refs, files)
