"""Issue 11: zarr-python and xarray's zarr backend read every dialect through ``nczmap.ZarrStore``.

For every (CDL, store kind) of the engine conformance test (:mod:`_engine_corpus`: real ncgen 4.9.0,
libnetcdf 4.10.1 and nczmap's copier in every dialect), ``xr.open_zarr(nczmap.ZarrStore(url),
consolidated=False)`` (also with ``decode_cf=False``, and every group through ``group=``) must be
``assert_identical``, with the same variable dtypes and attribute types, to netCDF4-python's reading of the
source ``.nc`` once changed by the differences of :data:`DIFFERENCES` that apply.

The expected dataset is made from netCDF4-python's raw reading (``decode_cf=False``): the differences are
what the store holds or what zarr/xarray's zarr backend make of it, applied to the raw values; the decoded
comparison decodes that with ``xr.decode_cf`` (the netcdf4 engine decodes the same way, checked). Some
differences are the engine test's (what the store really holds: netcdf-c's bugs), the others are the
reading through Zarr (attribute types JSON cannot keep, zarr's ``fill_value`` taken as ``_FillValue``...).
Where xarray cannot open what a store holds, the test is an xfail naming the reason (:data:`XFAIL`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from _engine_corpus import (
    CANNOT_WRITE,
    COPY_FROM_D3,
    CORPUS,
    CORPUS_MARKS,
    KINDS,
    NO_ORACLE,
    Kind,
    Stores,
    group_paths,
    has_groups,
    open_oracle,
)

xr = pytest.importorskip("xarray")
netCDF4 = pytest.importorskip("netCDF4")
pytest.importorskip("zarr")

from test_engine_conformance import (  # noqa: E402
    UNREPRESENTABLE,
    anonymous_dims,
    assert_same,
    is_same,
    json_convention_unit,
    json_number,
    lossy_double_fill,
    nofill_zeros,
    on_attributes,
    on_variables,
    one_element,
    printed_g,
    truncated,
)

import nczmap  # noqa: E402

pytestmark = CORPUS_MARKS


# ------------------------------------------------------------------------------------------ differences
@dataclass(frozen=True)
class Difference:
    """What reading the store through ZarrStore + zarr + xarray makes of the .nc, as a change of
    netCDF4-python's raw reading."""

    reason: str
    change: Callable[[xr.Dataset, Kind], xr.Dataset]
    kinds: Callable[[Kind], bool]
    cases: frozenset[str] | None = None  # None: every case (then it may well change nothing)
    subgroups_only: bool = False

    def applies(self, case: str, kind: Kind, group: str | None = None) -> bool:
        in_group = group not in (None, "/") or not self.subgroups_only
        return in_group and (self.cases is None or case in self.cases) and self.kinds(kind)


def writer_of(kind: Kind) -> str:
    return (
        "netcdf-c 4.9.0"
        if kind.name.startswith("ncgen")
        else "netcdf-c 4.10"
        if kind.by_netcdf_c
        else "nczmap"
    )


def json_value(value: object, writer: str) -> object:
    """An attribute as zarr gives it: the JSON the writer wrote for it, parsed by Python's json."""
    if isinstance(value, str | bytes) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return value
    array = np.asarray(value)
    if array.dtype.kind not in "iuf":
        return value
    parsed = [json_number(v, writer) if array.dtype.kind == "f" else int(v) for v in array.ravel()]
    return parsed[0] if array.ndim == 0 else parsed


def json_attributes(ds: xr.Dataset, kind: Kind) -> xr.Dataset:
    return on_attributes(
        ds, lambda name, value: value if name == "_FillValue" else json_value(value, writer_of(kind))
    )


ORACLE_FILL = "oracle_fill"  # encoding keys: the variable's fill value and byte order as netCDF4-python says
ORACLE_ENDIAN = "oracle_endian"


def zarr_fill_as_mask(ds: xr.Dataset, kind: Kind) -> xr.Dataset:
    """Every variable that has a fill value (not no-fill) gets it as ``_FillValue``, typed as the array."""

    def change(variable: xr.Variable) -> xr.Variable:
        fill = variable.encoding.get(ORACLE_FILL)
        if fill is None or "_FillValue" in variable.attrs:
            return variable
        fill = np.asarray(fill, dtype=variable.dtype)[()]
        if kind.by_netcdf_c and variable.dtype == np.float64:
            fill = printed_g("fill", fill)
        variable = variable.copy()
        variable.attrs["_FillValue"] = fill
        return variable

    return on_variables(ds, change)


def swapped_big_endian(variable: xr.Variable) -> xr.Variable:
    if variable.encoding.get(ORACLE_ENDIAN) != "big" or variable.dtype.itemsize == 1:
        return variable
    return variable.copy(data=variable.values.byteswap())


def json_convention(objects_only: bool) -> Callable[[xr.Dataset, Kind], xr.Dataset]:
    """netcdf-c's JSON convention (bug 20): a char attribute whose text parses as JSON is stored as that
    JSON value (netcdf-c 4.9.0: only JSON objects), which zarr gives as the parsed value."""

    def change(name: str, value: object) -> object:
        if not isinstance(value, str) or (objects_only and not value.startswith("{")):
            return value
        try:
            return json.loads(value)
        except ValueError:
            return value

    return lambda ds, kind: on_attributes(ds, change)


def fixed_bytes(ds: xr.Dataset, kind: Kind) -> xr.Dataset:
    """String variables as NCZarr stores them: UTF-8 in fixed-length bytes ``|S<maxstrlen>`` (netcdf-c:
    ``_nczarr_maxstrlen``, else ``_nczarr_default_maxstrlen``, else 128; nczmap: the longest string)."""
    default = int(ds.attrs.get("_nczarr_default_maxstrlen", 128))

    def change(variable: xr.Variable) -> xr.Variable:
        if variable.dtype.kind not in "OU":
            return variable
        encoded = np.char.encode(np.asarray(variable.values, dtype=str), "utf-8")
        if kind.by_netcdf_c:
            encoded = encoded.astype(f"S{int(variable.attrs.get('_nczarr_maxstrlen', default))}")
        return xr.Variable(variable.dims, encoded, variable.attrs, variable.encoding)

    return on_variables(ds, change)


def string_fill(ds: xr.Dataset, kind: Kind) -> xr.Dataset:
    def change(variable: xr.Variable) -> xr.Variable:
        if variable.dtype.kind not in "OU" or "_FillValue" in variable.attrs:
            return variable
        return xr.Variable(variable.dims, variable.values, {**variable.attrs, "_FillValue": b""})

    return on_variables(ds, change)


def bytes_fill(ds: xr.Dataset, kind: Kind) -> xr.Dataset:
    def change(variable: xr.Variable) -> xr.Variable:
        fill = variable.attrs.get("_FillValue")
        if not isinstance(fill, str) or variable.dtype.kind != "S":
            return variable
        attrs = {**variable.attrs, "_FillValue": np.bytes_(fill.encode("utf-8"))}
        return xr.Variable(variable.dims, variable.values, attrs, variable.encoding)

    return on_variables(ds, change)


def hidden_nc_attributes(ds: xr.Dataset, kind: Kind) -> xr.Dataset:
    ds = ds.copy()
    for attrs in [ds.attrs] + [v.attrs for v in ds.variables.values()]:
        for name in [n for n in attrs if n.lower().startswith("_nc")]:
            del attrs[name]
    return ds


def scalar_dimension(ds: xr.Dataset, kind: Kind) -> xr.Dataset:
    return on_variables(ds, lambda v: v.set_dims({"_scalar_": 1}) if v.ndim == 0 else v)


def _content(change: Callable[[xr.Dataset], xr.Dataset]) -> Callable[[xr.Dataset, Kind], xr.Dataset]:
    return lambda ds, kind: change(ds)


def netcdf_c(kind: Kind) -> bool:
    return kind.by_netcdf_c


def every(kind: Kind) -> bool:
    return True


DIFFERENCES: list[Difference] = [
    # ---- what the store holds (the engine test's differences, the same netcdf-c bugs)
    Difference(
        "netcdf-c writes float/double attributes with %lg, 6 significant digits (bug 19; engine test)",
        _content(lambda ds: on_attributes(ds, printed_g)),
        netcdf_c,
    ),
    Difference(
        "netcdf-c writes the default double fill_value as 9.96921e+36 (%lg, bug 19; engine test)",
        _content(lambda ds: on_variables(ds, lossy_double_fill)),
        netcdf_c,
    ),
    Difference(
        "no-fill: never-written elements are zeros in NCZarr (engine test)",
        _content(nofill_zeros),
        every,
        frozenset({"nofill"}),
    ),
    Difference(
        "netcdf-c silently truncates strings to _nczarr_maxstrlen = 4 (bug 26; engine test)",
        _content(truncated),
        lambda kind: kind.name == "libnetcdf-4.10.1",
        frozenset({"ref_string"}),
    ),
    Difference(
        "libnetcdf 4.10.1's JSON convention stores the char attribute '°C' as the JSON word C (bug 20; "
        "engine test)",
        _content(json_convention_unit),
        lambda kind: kind.name == "libnetcdf-4.10.1",
        frozenset({"names"}),
    ),
    Difference(
        "netcdf-c 4.9.0 wrote big-endian arrays with little-endian bytes (bug 18): zarr reads them "
        "byte-swapped (nczmap's engine knows the bug, zarr cannot)",
        _content(lambda ds: on_variables(ds, swapped_big_endian)),
        lambda kind: kind.name.startswith("ncgen"),
        frozenset({"bigendian"}),
    ),
    Difference(
        "libnetcdf 4.10's JSON convention stores every char attribute whose text is JSON as that JSON "
        '("0" becomes 0; bug 20): zarr gives the parsed value',
        json_convention(objects_only=False),
        lambda kind: kind.name == "libnetcdf-4.10.1",
    ),
    Difference(
        "netcdf-c 4.9.0's JSON convention stores a char attribute holding a JSON object as that object "
        "(bug 20): zarr gives it as a dict",
        json_convention(objects_only=True),
        lambda kind: kind.name.startswith("ncgen"),
        frozenset({"ref_t_meta_dim1", "ref_t_meta_var1", "ref_ut_testmap_create", "ref_jsonconvention"}),
    ),
    # ---- what reading through zarr + xarray's zarr backend makes of it
    Difference(
        "zarr attributes are JSON: zarr-python gives Python ints, floats and lists where netCDF4-python "
        "gives typed numpy values (the types live in NCZarr's _nczarr_attr, which xarray hides)",
        json_attributes,
        every,
    ),
    Difference(
        "xarray's zarr backend takes a Zarr v2 array's fill_value as its _FillValue "
        "(use_zarr_fill_value_as_mask): a variable without _FillValue has netcdf-c's default fill there",
        zarr_fill_as_mask,
        every,
    ),
    Difference(
        "libnetcdf 4.10 writes fill_value \"\" for string variables: xarray takes b'' as their _FillValue",
        string_fill,
        lambda kind: kind.name == "libnetcdf-4.10.1",
    ),
    Difference(
        "NCZarr stores strings as fixed-length bytes |S<n>; zarr and xarray read them as bytes (nothing "
        "says they are UTF-8 text: NCZarr's types are in _nczarr_attr, which xarray hides)",
        fixed_bytes,
        every,
    ),
    Difference(
        "a string variable's _FillValue is zarr's fill_value, fixed-width bytes like its values: b'zz' "
        "where netCDF4-python gives 'zz'",
        bytes_fill,
        every,
        frozenset({"empty_strings"}),
    ),
    Difference(
        "xarray's zarr backend hides every attribute named _nc* (netCDF4-python shows ncgen's "
        "_nczarr_maxstrlen and _nczarr_default_maxstrlen as plain attributes of the .nc)",
        hidden_nc_attributes,
        every,
    ),
    Difference(
        "NCZarr stores a scalar as a shape [1] array: ZarrStore shows it with netcdf-c's dimension "
        "_scalar_ (nczmap's pure Zarr, as netcdf-c 4.10, writes that _ARRAY_DIMENSIONS itself)",
        scalar_dimension,
        lambda kind: kind.name != "ncgen-4.9.0-zarr",
    ),
    Difference(
        "netcdf-c 4.9.0's pure Zarr writes a scalar as shape [1] with _ARRAY_DIMENSIONS []: ZarrStore "
        "shows the dimension nczmap's reader (and its engine) gives it, _Anonymous_Dim_1 (spec §4.7)",
        _content(one_element("_Anonymous_Dim_1")),
        lambda kind: kind.name == "ncgen-4.9.0-zarr",
    ),
    Difference(
        "netcdf-c 4.9.0 writes no _ARRAY_DIMENSIONS in subgroups (bug 14): ZarrStore shows the names "
        "nczmap's reader (and its engine) gives, _Anonymous_Dim_<length>",
        _content(lambda ds: on_variables(ds, anonymous_dims)),
        lambda kind: kind.name == "ncgen-4.9.0-zarr",
        subgroups_only=True,
    ),
]


def expected_for(
    case: str,
    kind: Kind,
    raw: xr.Dataset,
    decode_cf: bool,
    skip: Difference | None = None,
    group: str | None = None,
) -> xr.Dataset:
    for difference in DIFFERENCES:
        if difference is not skip and difference.applies(case, kind, group):
            raw = difference.change(raw, kind)
    return xr.decode_cf(raw) if decode_cf else raw


# ------------------------------------------------------------------------------------------ xfails
# (case, kind) -> why xarray cannot open what that store holds through zarr
NCZMAP_KINDS = [kind for kind in KINDS if not KINDS[kind].by_netcdf_c]
INVALID_JSON = (
    "libnetcdf 4.10's JSON convention (bug 20) writes the char attribute '[0.,0.,1.]' as that text, which "
    "ZarrStore shows as the list nczmap reads from it, and the int attribute varjson2 as a nested list: "
    "zarr gives both as parsed JSON, netCDF4-python text and a flat array"
)
XFAIL: dict[tuple[str, str], str] = {
    ("ref_jsonconvention", "libnetcdf-4.10.1"): INVALID_JSON,
}  # fmt: skip


# ------------------------------------------------------------------------------------------ comparing
def oracle(stores: Stores, case: str, group: str | None) -> xr.Dataset:
    """netCDF4-python's raw reading, each variable's fill value (``get_fill_value``) in its encoding."""
    raw = open_oracle(stores, case, group, decode_cf=False)
    with netCDF4.Dataset(stores.nc(case)) as nc:
        where = nc[group] if group not in (None, "/") else nc
        for name, variable in raw.variables.items():
            if name in where.variables:
                variable.encoding[ORACLE_FILL] = fill_of(where.variables[name])
                variable.encoding[ORACLE_ENDIAN] = where.variables[name].endian()
    return raw


def fill_of(variable) -> object:
    """The fill value netCDF4-python says the variable has: its _FillValue, netCDF's default, or None
    (no-fill). ``get_fill_value`` is only asked whether there is one: it byte-swaps big-endian ones."""
    if variable.get_fill_value() is None:
        return None
    if "_FillValue" in variable.ncattrs():
        return variable.getncattr("_FillValue")
    if variable.dtype is str:
        return ""
    return netCDF4.default_fillvals[np.dtype(variable.dtype).newbyteorder("=").str[1:]]


def check(stores: Stores, case: str, kind_name: str, decode_cf: bool, group: str | None = None) -> None:
    kind = KINDS[kind_name]
    url = stores.store(case, kind_name)
    raw = oracle(stores, case, group)
    if decode_cf and case not in COPY_FROM_D3:  # decoding the raw reading is what the netcdf4 engine does
        # (not for no-fill data: HDF5's never-written elements differ at each read)
        assert_same(xr.decode_cf(raw), open_oracle(stores, case, group))
    with xr.open_zarr(nczmap.ZarrStore(url), consolidated=False, decode_cf=decode_cf, group=group) as actual:
        actual = actual.load()
    expected = expected_for(case, kind, raw, decode_cf, group=group)
    assert_same(actual, expected)
    for difference in DIFFERENCES:  # a difference for some cases only must be needed where it applies
        if difference.cases is None or not difference.applies(case, kind, group):
            continue
        without = expected_for(case, kind, raw, decode_cf, skip=difference, group=group)
        if not is_same(without, expected):
            assert not is_same(actual, without), (
                f"documented difference no longer needed: {difference.reason}"
            )


def skip_unbuilt(case: str, kind: str) -> None:
    if case in NO_ORACLE:
        pytest.skip(NO_ORACLE[case])
    if (case, kind) in CANNOT_WRITE:
        pytest.skip(CANNOT_WRITE[case, kind])


def params():
    for case in CORPUS:
        for kind in KINDS:
            marks = (
                [pytest.mark.xfail(strict=True, reason=XFAIL[case, kind])] if (case, kind) in XFAIL else []
            )
            yield pytest.param(case, kind, id=f"{case}-{kind}", marks=marks)


# ------------------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize(("case", "kind"), list(params()))
@pytest.mark.parametrize("decode_cf", [True, False], ids=["decoded", "raw"])
def test_open_zarr_identical(stores, case: str, kind: str, decode_cf: bool) -> None:
    skip_unbuilt(case, kind)
    check(stores, case, kind, decode_cf)


def tree_params():
    for case in (c for c in CORPUS if has_groups(c) and c not in NO_ORACLE):
        for kind in KINDS:
            yield pytest.param(case, kind, id=f"{case}-{kind}")


@pytest.mark.parametrize(("case", "kind"), list(tree_params()))
def test_groups_identical(stores, case: str, kind: str) -> None:
    """Each subgroup through ``xr.open_zarr(..., group=path)``."""
    skip_unbuilt(case, kind)
    for path in group_paths(stores.nc(case))[1:]:
        if (case, path) in UNREPRESENTABLE:  # the engine test: an xarray Dataset cannot hold that group
            continue
        check(stores, case, kind, True, path.lstrip("/"))
