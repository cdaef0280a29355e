"""cfdecode against xarray's own CF decoding, never against values it produced itself.

Oracles: ``xarray.conventions.decode_cf_variable`` on the same raw values and attributes (a grid of
stored dtypes × packings, and a hypothesis property); ``xr.open_mfdataset`` over three real netCDF-4 files
written with netCDF4-python whose packing differs; xarray reading back what was stored decoded; and
xarray's concatenation for the joined dtype. Attributes are handed to xarray as netCDF4-python hands
them (a 1-element attribute is a numpy scalar), to nczmap as its model may hold them (1-element arrays too).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from xarray.conventions import decode_cf_variable

from nczmap.errors import FormatError
from nczmap.integrations.virtualize.cfdecode import (
    PACKING,
    decode,
    decoded_dtype,
    joined_dtype,
    stored_attributes,
)

netCDF4 = pytest.importorskip("netCDF4")

DTYPES = [np.dtype(name) for name in ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f4", "f8")]
WHERE = "'v' of test.nc"


# -- helpers ------------------------------------------------------------------------------------------------


def as_netcdf4(attrs: dict) -> dict:
    """``attrs`` as netCDF4-python gives them to xarray: a 1-element numeric attribute is a numpy scalar."""
    return {
        name: value.reshape(-1)[0] if isinstance(value, np.ndarray) and value.size == 1 else value
        for name, value in attrs.items()
    }


def xarray_decode(raw: np.ndarray, attrs: dict) -> tuple[np.dtype, np.ndarray]:
    """xarray's decoded dtype and values; its SerializationWarnings (and numpy's inside it) ignored."""
    variable = xr.Variable(("x",), raw.copy(), as_netcdf4(attrs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xr.SerializationWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        decoded = decode_cf_variable(
            "v", variable, mask_and_scale=True, decode_times=False, decode_timedelta=False
        )
        return decoded.dtype, decoded.values


def ours(raw: np.ndarray, attrs: dict) -> tuple[np.ndarray, np.dtype]:
    """decode and decoded_dtype, asserting they warn about nothing."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return decode(raw, attrs, WHERE), decoded_dtype(raw.dtype, attrs, WHERE)
        finally:
            assert [str(w.message) for w in caught] == []


def assert_identical(actual: np.ndarray, expected: np.ndarray) -> None:
    """Same dtype, shape, NaN positions and bits of every other value (the sign of zero included)."""
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if actual.dtype.kind in "fc":
        np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
        actual = np.where(np.isnan(actual), 0, actual)
        expected = np.where(np.isnan(expected), 0, expected)
    np.testing.assert_array_equal(actual, expected)
    assert actual.tobytes() == expected.tobytes()


def check_against_xarray(raw: np.ndarray, attrs: dict) -> Exception | None:
    """decode/decoded_dtype equal xarray's, or both refuse (ours with a FormatError naming WHERE)."""
    before = raw.copy()
    try:
        expected_dtype, expected = xarray_decode(raw, attrs)
    except Exception as exc:  # xarray refuses: so must we
        with pytest.raises(FormatError, match=re.escape(WHERE)):
            ours(raw, attrs)
        with pytest.raises(FormatError, match=re.escape(WHERE)):
            decoded_dtype(raw.dtype, attrs, WHERE)
        return exc
    actual, actual_dtype = ours(raw, attrs)
    assert actual_dtype == expected_dtype == expected.dtype
    assert_identical(actual, expected)
    assert_identical(raw, before)  # the raw values are left alone
    return None


def sample(dtype: np.dtype) -> np.ndarray:
    """Raw values with the extremes and every fill value the packings below use."""
    if dtype.kind == "f":
        info = np.finfo(dtype)
        values = [-np.inf, info.min, -1.5, -1, -0.0, 0, info.tiny, 1, 2, 2.5, 7, 99, info.max, np.inf, np.nan]
    else:
        info = np.iinfo(dtype)
        values = [info.min, info.min + 1, 0, 1, 2, 7, 99, 1000 % (int(info.max) + 1), info.max - 1, info.max]
        values += [-1, -2, -999 if dtype.itemsize > 1 else -99] if dtype.kind == "i" else []
    return np.array(values, dtype=dtype)


def _extreme(dtype: np.dtype) -> np.generic:
    """The fill value _Unsigned reinterprets: -1 of signed, the maximum of unsigned integers."""
    if dtype.kind == "i":
        return dtype.type(-1)
    return dtype.type(np.iinfo(dtype).max if dtype.kind == "u" else 7)


def _nan(dtype: np.dtype) -> np.generic:
    return dtype.type(np.nan) if dtype.kind == "f" else np.float32(np.nan)


PACKINGS = {
    "none": lambda t: {},
    "units only": lambda t: {"units": "K", "long_name": "x"},
    "_FillValue": lambda t: {"_FillValue": t.type(7)},
    "_FillValue max": lambda t: {"_FillValue": t.type(np.finfo(t).max if t.kind == "f" else np.iinfo(t).max)},
    "_FillValue 1-element array": lambda t: {"_FillValue": np.array([7], t)},
    "_FillValue NaN": lambda t: {"_FillValue": _nan(t)},
    "_FillValue other type": lambda t: {"_FillValue": np.float64(2.0)},
    "missing_value": lambda t: {"missing_value": t.type(99)},
    "missing_value vector": lambda t: {"missing_value": np.array([1, 99], t)},
    "missing_value vector with NaN": lambda t: {"missing_value": np.array([1, np.nan], "f8")},
    "both equal": lambda t: {"_FillValue": t.type(7), "missing_value": t.type(7)},
    "both differ": lambda t: {"_FillValue": t.type(7), "missing_value": t.type(2)},
    "both differ in type": lambda t: {"_FillValue": t.type(7), "missing_value": np.float64(2.0)},
    "_FillValue NaN, missing_value": lambda t: {"_FillValue": _nan(t), "missing_value": t.type(99)},
    "scale_factor float32": lambda t: {"scale_factor": np.float32(0.1)},
    "scale_factor float64": lambda t: {"scale_factor": np.float64(0.1)},
    "scale_factor 1-element array": lambda t: {"scale_factor": np.array([0.1], "f4")},
    "scale_factor int": lambda t: {"scale_factor": np.int16(3)},
    "add_offset float32": lambda t: {"add_offset": np.float32(1.5)},
    "add_offset float64": lambda t: {"add_offset": np.float64(-273.15)},
    "add_offset int": lambda t: {"add_offset": np.int32(10)},
    "scale, offset float32": lambda t: {"scale_factor": np.float32(0.01), "add_offset": np.float32(273.15)},
    "scale, offset float64": lambda t: {"scale_factor": np.float64(0.01), "add_offset": np.float64(273.15)},
    "scale float32, offset float64": lambda t: {
        "scale_factor": np.float32(0.01),
        "add_offset": np.float64(273.15),
    },
    "scale, _FillValue": lambda t: {"scale_factor": np.float32(0.5), "_FillValue": t.type(7)},
    "scale float64, offset, both fills": lambda t: {
        "scale_factor": np.float64(0.1),
        "add_offset": np.float64(5),
        "_FillValue": t.type(7),
        "missing_value": np.array([2, 99], t),
    },
    "scale int, _FillValue": lambda t: {"scale_factor": np.int16(3), "_FillValue": t.type(7)},
    "scale, _FillValue NaN": lambda t: {"scale_factor": np.float32(0.5), "_FillValue": _nan(t)},
    "_Unsigned true": lambda t: {"_Unsigned": "true"},
    "_Unsigned false": lambda t: {"_Unsigned": "false"},
    "_Unsigned TRUE (not xarray's)": lambda t: {"_Unsigned": "TRUE", "_FillValue": t.type(7)},
    "_Unsigned true, _FillValue": lambda t: {"_Unsigned": "true", "_FillValue": _extreme(t)},
    "_Unsigned false, _FillValue": lambda t: {"_Unsigned": "false", "_FillValue": _extreme(t)},
    "_Unsigned true, _FillValue, scale": lambda t: {
        "_Unsigned": "true",
        "_FillValue": _extreme(t),
        "scale_factor": np.float32(0.01),
    },
    "_Unsigned false, both fills": lambda t: {
        "_Unsigned": "false",
        "_FillValue": _extreme(t),
        "missing_value": t.type(2),
    },
    "_Unsigned true, missing_value only": lambda t: {"_Unsigned": "true", "missing_value": _extreme(t)},
}


# -- (1) a grid of stored dtypes × packings ------------------------------------------------------------------


@pytest.mark.parametrize("packing", list(PACKINGS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grid_equals_xarray(dtype: np.dtype, packing: str) -> None:
    check_against_xarray(sample(dtype), PACKINGS[packing](dtype))


@pytest.mark.parametrize("dtype", [">i2", ">u4", ">f4", ">f8", "f2"])
@pytest.mark.parametrize("packing", ["none", "_FillValue", "scale, _FillValue", "_Unsigned true, _FillValue"])
def test_byte_order_and_half_floats_equal_xarray(dtype: str, packing: str) -> None:
    raw = sample(np.dtype(dtype).newbyteorder("=")).astype(dtype)
    check_against_xarray(raw, PACKINGS[packing](np.dtype(dtype).newbyteorder("=")))


def test_no_decoding_keeps_the_integer_dtype() -> None:
    assert decoded_dtype(np.dtype("i2"), {}) == np.dtype("i2")
    assert decoded_dtype(np.dtype("i4"), {"units": "m", "valid_range": np.array([0, 9], "i4")}) == "i4"
    assert decoded_dtype(np.dtype("i1"), {"_Unsigned": "true"}) == "u1"
    # xarray drops an integer variable's NaN-only _FillValue: nothing is masked, it stays integer
    assert decoded_dtype(np.dtype("i2"), {"_FillValue": np.float32(np.nan)}) == "i2"


def test_boolean_attribute_equals_xarray() -> None:
    check_against_xarray(np.array([0, 1, 1, 0, -1], "i1"), {"dtype": "bool"})
    check_against_xarray(np.array([0, 1, 1, 0, -1], "i1"), {"dtype": "bool", "_FillValue": np.int8(-1)})


# -- refusals -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "attrs", "attribute"),
    [
        (np.arange(4, dtype="i2"), {"scale_factor": "2"}, "scale_factor"),
        (np.arange(4, dtype="i2"), {"add_offset": "1.5"}, "add_offset"),
        (np.arange(4, dtype="i2"), {"scale_factor": np.array([1.0, 2.0])}, "scale_factor"),
        (np.arange(4, dtype="i2"), {"scale_factor": np.int8(2), "_FillValue": np.int16(1)}, "scale_factor"),
        (np.arange(4, dtype="i2"), {"_FillValue": np.array([1, 2], "i2"), "_Unsigned": "true"}, "_FillValue"),
        (
            np.arange(4, dtype="u2"),
            {"_FillValue": np.array([1, 2], "u2"), "_Unsigned": "false"},
            "_FillValue",
        ),
    ],
)
def test_refused_as_xarray_refuses(raw: np.ndarray, attrs: dict, attribute: str) -> None:
    assert check_against_xarray(raw, attrs) is not None  # xarray raises too
    with pytest.raises(FormatError, match=attribute):
        decode(raw, attrs, WHERE)


@pytest.mark.parametrize(
    ("raw", "attrs", "attribute"),
    [
        (np.array([b"a", b"b"], "S1"), {"_FillValue": b"a"}, "_FillValue"),  # char data with packing
        (np.array(["ab", "cd"], object), {"missing_value": "ab"}, "missing_value"),  # string data
        (np.arange(4, dtype="i2"), {"missing_value": "1"}, "missing_value"),  # text fill on numbers
        (np.arange(4, dtype="i2"), {"_FillValue": b"\x01"}, "_FillValue"),
        (np.arange(4, dtype="i1"), {"_Unsigned": np.int8(1)}, "_Unsigned"),  # _Unsigned not text
        (np.arange(4, dtype="i1"), {"scale_factor": np.True_}, "scale_factor"),
        (np.arange(4, dtype="i1"), {"scale_factor": np.array([], "f4")}, "scale_factor"),
    ],
)
def test_refused_with_the_attribute_named(raw: np.ndarray, attrs: dict, attribute: str) -> None:
    with pytest.raises(FormatError, match=attribute) as caught:
        decode(raw, attrs, WHERE)
    assert WHERE in str(caught.value)
    with pytest.raises(FormatError, match=attribute):
        decoded_dtype(raw.dtype, attrs, WHERE)


def test_character_data_without_packing_is_left_alone() -> None:
    raw = np.array([b"a", b"b"], "S1")
    assert decode(raw, {"long_name": "flag"}, WHERE) is raw


# -- joined dtypes and stored attributes --------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtypes",
    [
        *[("f4", "f8"), ("f4", "f4"), ("u1", "f4"), ("i2", "f4"), ("i4", "f4"), ("i8", "u8"), ("u1", "i1")],
        *[
            ("f8",),
            ("i2", "i2", "f8"),
            ("f2", "i1"),
            ("u4", "f4", "f4"),
            ("S3", "S5"),
            ("S1", "U1"),
            ("f4", "S2"),
        ],
    ],
)
def test_joined_dtype_is_xarray_concatenation(dtypes: tuple[str, ...]) -> None:
    parts = [xr.Variable(("t",), np.zeros(1, dtype)) for dtype in dtypes]
    expected = xr.Variable.concat(parts, dim="t").dtype
    assert joined_dtype([np.dtype(dtype) for dtype in dtypes]) == expected


def test_joined_dtype_needs_a_dtype() -> None:
    with pytest.raises(ValueError):
        joined_dtype([])


def test_stored_attributes() -> None:
    attrs = {
        "units": "K",
        "long_name": "sea surface temperature",
        "valid_range": np.array([-5, 40], "i2"),
        "scale_factor": np.float32(0.01),
        "add_offset": np.float32(273.15),
        "_FillValue": np.int16(-999),
        "missing_value": np.int16(-998),
        "_Unsigned": "false",
    }
    stored = stored_attributes(attrs, np.dtype("f8"))
    assert list(stored) == ["units", "long_name", "valid_range", "_FillValue"]
    assert stored["valid_range"] is attrs["valid_range"]
    assert isinstance(stored["_FillValue"], np.float64) and np.isnan(stored["_FillValue"])
    assert stored_attributes(attrs, np.dtype("f4"))["_FillValue"].dtype == np.dtype("f4")
    assert stored_attributes({"_Unsigned": "true", "units": "1"}, np.dtype("u1")) == {"units": "1"}
    assert set(PACKING) == {"scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned"}


# -- (2) end to end: three netCDF-4 files, xarray's open_mfdataset ------------------------------------------

FILES = [
    {  # per file: variable -> (netCDF type, _FillValue or False for none, packing attributes)
        "sst": ("i2", np.int16(-999), {"scale_factor": np.float32(1.0), "add_offset": np.float32(273.15)}),
        "count": ("i1", np.int8(-1), {"_Unsigned": "true"}),
    },
    {
        "sst": ("i2", np.int16(-1), {"scale_factor": np.float32(0.5)}),
        "count": ("i1", np.int8(0), {"_Unsigned": "true"}),
    },
    {
        "sst": ("i2", np.int16(-32767), {"scale_factor": np.float64(2.0), "missing_value": np.int16(99)}),
        "count": ("i1", False, {"_Unsigned": "true"}),
    },
]
RAW = {  # each file's raw values hold its own fill values and the other files'
    "sst": [
        np.array([[0, 1, -999, -1, 99], [32767, -32767, 3000, -2, 7]], "i2"),
        np.array([[-1, 4, -999, 99, 5], [-32768, 32767, -1, 6, 0]], "i2"),
        np.array([[99, -32767, -1, -999, 8], [1, 2, 3, 99, -32768]], "i2"),
    ],
    "count": [np.array([[-128, -1, 0, 1, 127], [5, -1, 0, -2, 3]], "i1")] * 3,
}
COMMON = {
    "sst": {"units": "K", "long_name": "sea surface temperature", "valid_range": np.array([-5, 40], "i2")},
    "count": {"units": "1", "long_name": "number of observations"},
}


def _write_sources(directory) -> list:
    paths = []
    for index, variables in enumerate(FILES):
        path = directory / f"part{index}.nc"
        with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
            nc.createDimension("time", None)
            nc.createDimension("x", 5)
            for name, (nctype, fill, packing) in variables.items():
                var = nc.createVariable(name, nctype, ("time", "x"), fill_value=fill)
                var.set_auto_maskandscale(False)
                var.setncatts({**COMMON[name], **packing})
                var[:] = RAW[name][index]
        paths.append(path)
    return paths


def _model_attributes(var) -> dict[str, object]:
    """A netCDF4 variable's attributes as nczmap's model holds them: numbers as 1-D arrays, text as str."""
    return {
        name: value if isinstance(value, str) else np.atleast_1d(np.asarray(value))
        for name, value in ((name, var.getncattr(name)) for name in var.ncattrs())
    }


@pytest.mark.filterwarnings("ignore:variable 'sst' has multiple fill values:xarray.SerializationWarning")
def test_joined_files_equal_open_mfdataset(tmp_path) -> None:
    paths = _write_sources(tmp_path)
    joined: dict[str, tuple[np.ndarray, dict]] = {}
    for name in ("sst", "count"):
        parts, dtypes, first_attrs = [], [], None
        for path in paths:
            with netCDF4.Dataset(path) as nc:
                var = nc[name]
                var.set_auto_maskandscale(False)
                raw = np.asarray(var[:])
                attrs = _model_attributes(var)
            assert raw.dtype == np.dtype(FILES[0][name][0])
            first_attrs = attrs if first_attrs is None else first_attrs
            parts.append(ours(raw, attrs)[0])
            dtypes.append(decoded_dtype(raw.dtype, attrs))
            assert parts[-1].dtype == dtypes[-1]
        dtype = joined_dtype(dtypes)
        values = np.concatenate([part.astype(dtype) for part in parts], axis=0)
        with xr.open_mfdataset(paths, combine="nested", concat_dim="time", engine="netcdf4") as ds:
            expected = ds[name].values
        assert_identical(values, expected)
        joined[name] = (values, stored_attributes(first_attrs, dtype))

    # the decode really happened: each file's fill values are NaN in its own rows only
    sst, count = joined["sst"][0], joined["count"][0]
    assert sst.dtype == np.float64 and count.dtype == np.float32  # float32 + float32 + float64; uint8
    assert np.isnan(sst[0, 2]) and np.isnan(sst[2, 0]) and np.isnan(sst[3, 2])
    assert np.isnan(sst[4, 0]) and np.isnan(sst[4, 1]) and np.isnan(sst[5, 3])  # missing_value, _FillValue
    assert sst[0, 3] == np.float32(273.15) - 1 and sst[2, 2] == -499.5 and sst[4, 2] == -2.0
    assert np.isnan(count[0, 1]) and count[0, 0] == 128 and np.isnan(count[2, 2]) and count[4, 1] == 255

    # stored decoded, xarray reads back exactly the same values
    out = tmp_path / "decoded.nc"
    with netCDF4.Dataset(out, "w", format="NETCDF4") as nc:
        nc.createDimension("time", None)
        nc.createDimension("x", 5)
        for name, (values, attrs) in joined.items():
            attrs = dict(attrs)
            assert not set(attrs) & {"scale_factor", "add_offset", "missing_value", "_Unsigned"}
            var = nc.createVariable(name, values.dtype, ("time", "x"), fill_value=attrs.pop("_FillValue"))
            var.set_auto_maskandscale(False)
            var.setncatts(attrs)
            var[:] = values
    with xr.open_dataset(out, engine="netcdf4") as ds:
        for name, (values, attrs) in joined.items():
            assert_identical(ds[name].values, values)
            assert ds[name].attrs["units"] == attrs["units"]
        np.testing.assert_array_equal(ds["sst"].attrs["valid_range"], [-5, 40])


# -- (3) property: random dtype, values and packing ---------------------------------------------------------


@st.composite
def _number(draw, dtype: np.dtype, raw: np.ndarray, *, vector: bool):
    """A fill value: often one of the raw values, sometimes of another type, NaN, or as an array."""
    source = draw(st.sampled_from(["raw", "raw", "same", "other", "nan"]))
    if source == "raw" and raw.size:
        value = raw.reshape(-1)[draw(st.integers(0, raw.size - 1))]
        value = np.dtype(dtype).newbyteorder("=").type(value)
    elif source == "other":
        other = draw(st.sampled_from(DTYPES))
        value = other.type(draw(hnp.from_dtype(other)))
    elif source == "nan":
        value = draw(st.sampled_from([np.float32, np.float64]))(np.nan)
    else:
        plain = np.dtype(dtype).newbyteorder("=")
        value = plain.type(draw(hnp.from_dtype(plain)))
    shape = draw(st.sampled_from(["scalar", "array1", "vector"] if vector else ["scalar", "array1"]))
    if shape == "array1":
        return np.array([value])
    if shape == "vector":
        extra = draw(st.lists(hnp.from_dtype(np.dtype(value.dtype)), min_size=1, max_size=2))
        return np.array([value, *extra], dtype=value.dtype)
    return value


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from([*DTYPES, np.dtype(">i2"), np.dtype(">f8")]))
    plain = dtype.newbyteorder("=")
    raw = draw(hnp.arrays(plain, st.integers(0, 12), elements=hnp.from_dtype(plain))).astype(dtype)
    attrs: dict[str, object] = {}
    for name in ("_FillValue", "missing_value"):
        if draw(st.booleans()):
            attrs[name] = draw(_number(dtype, raw, vector=True))
    for name in ("scale_factor", "add_offset"):
        if draw(st.integers(0, 2)) == 0:
            continue
        kind = draw(st.sampled_from(["f4", "f8", "f4", "f8", "i2", "u1"]))
        value = np.dtype(kind).type(draw(hnp.from_dtype(np.dtype(kind))))
        attrs[name] = np.array([value]) if draw(st.booleans()) else value
    unsigned = draw(st.sampled_from([None, None, "true", "false"]))
    if unsigned is not None:
        attrs["_Unsigned"] = unsigned
    return raw, attrs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_property_equals_xarray(case) -> None:
    raw, attrs = case
    check_against_xarray(raw, attrs)
