"""Issue 11: the xarray engine ``"nczmap"`` reads every dialect as netCDF4-python reads the source file.

Each CDL of the corpus (``cdl/*.cdl`` and the netcdf-c fixture CDLs that ``ncgen`` builds) is compiled to
``x.nc`` by ``ncgen -4``; that file opened by xarray's ``netcdf4`` engine is the expected value. The same
CDL becomes NCZarr stores written by real netcdf-c (Debian ``ncgen`` 4.9.0, ``mode=nczarr`` and
``mode=zarr``; libnetcdf 4.10.1 through netCDF4-python) and by nczmap's copier in every dialect. Each
store opened with ``engine="nczmap"`` must be ``assert_identical`` to the expected dataset, with the same
variable dtypes and attribute types, once the expected dataset is changed by the differences of
:data:`DIFFERENCES` that apply: each names its reason (a netcdf-c bug the store really has, or something
the dialect cannot hold). Case-specific differences must still be needed, or the test fails.

netcdf-c's fixture zips are compared the same way with their CDL; for CDLs that hold no data (``ncdump
-h`` output) the values come from libnetcdf 4.10.1 reading the unzipped fixture.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from _engine_corpus import (
    CANNOT_WRITE,
    CORPUS,
    CORPUS_MARKS,
    KINDS,
    NCGEN,
    NO_ORACLE,
    Kind,
    Stores,
    group_paths,
    has_groups,
    run,
    url_of,
)
from _fixtures import FIXTURES

xr = pytest.importorskip("xarray")
pytest.importorskip("netCDF4")

from nczmap.api import open_dataset as open_nczmap  # noqa: E402
from nczmap.integrations.copy import copy as nczmap_copy  # noqa: E402

pytestmark = CORPUS_MARKS


# ------------------------------------------------------------------------------------------ differences
@dataclass(frozen=True)
class Difference:
    """What a store cannot hold of the .nc, as a change of netCDF4-python's reading."""

    reason: str
    change: Callable[[xr.Dataset], xr.Dataset]
    kinds: Callable[[Kind], bool]
    cases: frozenset[str] | None = None  # None: every case (then it may well change nothing)
    subgroups_only: bool = False

    def applies(self, case: str, kind: Kind, group: str = "/") -> bool:
        in_group = group != "/" or not self.subgroups_only
        return in_group and (self.cases is None or case in self.cases) and self.kinds(kind)


def on_attributes(ds: xr.Dataset, change: Callable[[str, object], object]) -> xr.Dataset:
    """``ds`` with every attribute (global and of variables) replaced by ``change(name, value)``."""
    ds = ds.copy()
    ds.attrs = {k: change(k, v) for k, v in ds.attrs.items()}
    for variable in ds.variables.values():
        variable.attrs = {k: change(k, v) for k, v in variable.attrs.items()}
    return ds


def on_variables(ds: xr.Dataset, change: Callable[[xr.Variable], xr.Variable]) -> xr.Dataset:
    return ds.assign({name: change(variable) for name, variable in ds.variables.items()})


def printed_g(name: str, value: object) -> object:
    """netcdf-c writes float and double attributes with ``%lg``: 6 significant digits (bug 19)."""
    array = np.asarray(value)
    if array.dtype.kind != "f" or name == "_FillValue":
        return value
    rounded = np.array([float(f"{v:g}") for v in array.ravel()], dtype=array.dtype).reshape(array.shape)
    return rounded[()] if np.ndim(value) == 0 else rounded


NC_FILL_DOUBLE = 9.969209968386869e36


def lossy_double_fill(variable: xr.Variable) -> xr.Variable:
    """Unwritten doubles read the ``fill_value`` netcdf-c wrote with ``%lg``: 9.96921e+36 (bug 19)."""
    if variable.dtype != np.float64 or "_FillValue" in variable.attrs or "_FillValue" in variable.encoding:
        return variable
    values = variable.values
    return variable.copy(data=np.where(values == NC_FILL_DOUBLE, float(f"{NC_FILL_DOUBLE:g}"), values))


def json_number(value: float, writer: str) -> object:
    """The JSON a writer puts for one float in a pure-Zarr attribute, as a JSON reader parses it."""
    if not np.isfinite(value):
        # 4.9.0 writes bare NaN/Infinity (read back as numbers); 4.10 and nczmap write JSON strings
        return (
            float(value)
            if writer == "netcdf-c 4.9.0"
            else {np.inf: "Infinity", -np.inf: "-Infinity"}.get(value, "NaN")
        )
    text = f"{value:g}" if writer.startswith("netcdf-c") else str(value)  # nczmap: shortest repr
    return json.loads(text)


def untyped(value: object, writer: str) -> object:
    """A pure-Zarr attribute as netcdf-c's reading rules type it (spec §4.3): integers as the smallest of
    int, uint, int64, uint64 holding them, other numbers double, one string char text, several strings
    the JSON text of the list."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    array = np.atleast_1d(value)
    parsed = [json_number(v, writer) if array.dtype.kind == "f" else int(v) for v in array]
    if any(isinstance(v, str) for v in parsed):
        return parsed[0] if len(parsed) == 1 else json.dumps(parsed, separators=(",", ":"))
    if all(isinstance(v, int) for v in parsed):
        dtype = next(t for t in (np.int32, np.uint32, np.int64, np.uint64) if _holds(t, parsed))
    else:
        dtype = np.float64
    typed = np.array(parsed, dtype=dtype)
    return typed[0] if np.ndim(value) == 0 else typed


def _holds(dtype: type, values: list[int]) -> bool:
    info = np.iinfo(dtype)
    return all(info.min <= v <= info.max for v in values)


def pure_zarr_attributes(writer: str) -> Callable[[xr.Dataset], xr.Dataset]:
    def change(ds: xr.Dataset) -> xr.Dataset:
        return on_attributes(
            ds, lambda name, value: value if name == "_FillValue" else untyped(value, writer)
        )

    return change


def char_as_strings(variable: xr.Variable) -> xr.Variable:
    """A ``>S1`` array read as pure Zarr holds strings of one byte each (spec §4.2), decoded one by one."""
    if variable.dtype.kind != "S":
        return variable
    values, dims = variable.values, variable.dims
    if "char_dim_name" in variable.encoding:  # xarray joined the char dimension into strings: split it
        values = np.ascontiguousarray(values).view("S1").reshape(*values.shape, values.dtype.itemsize)
        dims = (*dims, variable.encoding["char_dim_name"])
    return xr.Variable(dims, np.char.decode(values, "utf-8", "replace"), variable.attrs)


def one_element(dim: str) -> Callable[[xr.Dataset], xr.Dataset]:
    """netcdf-c's pure Zarr has no scalars: shape [1] arrays that netcdf-c 4.10 reads 1-d (spec §4.7)."""

    def change(ds: xr.Dataset) -> xr.Dataset:
        return on_variables(ds, lambda v: v.set_dims({dim: 1}) if is_scalar(v) else v)

    return change


def is_scalar(variable: xr.Variable) -> bool:
    return variable.ndim == 0 and "char_dim_name" not in variable.encoding  # not a joined char array


def truncated(ds: xr.Dataset) -> xr.Dataset:
    if "truncated" not in ds:
        return ds
    return ds.assign(truncated=ds["truncated"].copy(data=np.array("0123")))


def json_convention_unit(ds: xr.Dataset) -> xr.Dataset:
    if "größe" not in ds:
        return ds
    ds = ds.copy()
    ds["größe"].attrs["unité"] = "C"
    return ds


def nofill_zeros(ds: xr.Dataset) -> xr.Dataset:
    if "ff" not in ds:
        return ds
    return ds.assign(ff=ds["ff"].copy(data=np.zeros_like(ds["ff"].values)))


def anonymous_dims(variable: xr.Variable) -> xr.Variable:
    """No ``_ARRAY_DIMENSIONS``: pure Zarr names the dimensions ``_Anonymous_Dim_<length>``."""
    dims = tuple(f"_Anonymous_Dim_{n}" for n in variable.shape)
    return xr.Variable(dims, variable.values, variable.attrs, variable.encoding)


def json_objects_reserialised(ds: xr.Dataset) -> xr.Dataset:
    def change(name: str, value: object) -> object:
        if isinstance(value, str) and value.startswith("{"):
            return json.dumps(json.loads(value))
        return value

    return on_attributes(ds, change)


def written_by_netcdf_c(kind: Kind) -> bool:
    return kind.by_netcdf_c


def pure(writer: Callable[[Kind], bool]) -> Callable[[Kind], bool]:
    return lambda kind: not kind.dialect.is_nczarr and writer(kind)


def libnetcdf(kind: Kind) -> bool:
    return kind.name == "libnetcdf-4.10.1"


DIFFERENCES: list[Difference] = [
    Difference(
        "netcdf-c's JSON convention stores a char attribute holding a JSON object as that object, read "
        'back as its re-serialised text: \'{"a": 2,"b": 1}\' becomes \'{"a": 2, "b": 1}\' (bug 20)',
        json_objects_reserialised,
        written_by_netcdf_c,
        frozenset({"ref_t_meta_dim1", "ref_t_meta_var1", "ref_ut_testmap_create"}),
    ),
    Difference(
        "netcdf-c 4.9.0 writes no _ARRAY_DIMENSIONS for arrays in subgroups (bug 14): in pure Zarr their "
        "dimensions are anonymous, _Anonymous_Dim_<length>",
        lambda ds: on_variables(ds, anonymous_dims),
        pure(written_by_netcdf_c),
        subgroups_only=True,
    ),
    Difference(
        "netcdf-c writes float/double attributes with %lg, 6 significant digits (nczarr-format.md bug 19)",
        lambda ds: on_attributes(ds, printed_g),
        written_by_netcdf_c,
    ),
    Difference(
        "netcdf-c writes the default double fill_value as 9.96921e+36 (%lg, bug 19): never-written doubles "
        "read that, not NC_FILL_DOUBLE",
        lambda ds: on_variables(ds, lossy_double_fill),
        written_by_netcdf_c,
    ),
    Difference(
        "pure Zarr holds no attribute types; what netcdf-c 4.9.0 wrote as JSON is typed by the reading rules "
        "of spec §4.3 (1.0 is written 1 and reads as int, bug 19)",
        pure_zarr_attributes("netcdf-c 4.9.0"),
        pure(written_by_netcdf_c),
    ),
    Difference(
        "pure Zarr holds no attribute types; what nczmap wrote as JSON is typed by the reading rules of "
        "spec §4.3 (NaN/Infinity are JSON strings, read as text)",
        pure_zarr_attributes("nczmap"),
        pure(lambda kind: not kind.by_netcdf_c),
    ),
    Difference(
        "pure Zarr has no char type: nczmap writes char arrays >S1, which read as strings of length 1 "
        "(spec §4.2; netcdf-c 4.9.0 writes <U1, which reads as char)",
        lambda ds: on_variables(ds, char_as_strings),
        pure(lambda kind: not kind.by_netcdf_c),
    ),
    Difference(
        "pure Zarr has no scalars: netcdf-c 4.9.0 writes shape [1] with _ARRAY_DIMENSIONS [], read with "
        "the anonymous dimension _Anonymous_Dim_1 (spec §4.7)",
        one_element("_Anonymous_Dim_1"),
        pure(written_by_netcdf_c),
    ),
    Difference(
        "pure Zarr has no scalars: nczmap (as netcdf-c 4.10) writes shape [1] with _ARRAY_DIMENSIONS "
        '["_scalar_"], read 1-d as netcdf-c 4.10.1 reads it (spec §4.7)',
        one_element("_scalar_"),
        pure(lambda kind: not kind.by_netcdf_c),
    ),
    Difference(
        "no-fill: never-written elements are zeros in NCZarr, uninitialised memory in HDF5 (which may "
        "happen to be zeros)",
        nofill_zeros,
        lambda kind: True,
        frozenset({"nofill"}),
    ),
    Difference(
        "netcdf-c silently truncates strings to _nczarr_maxstrlen = 4 (bug 26): '0123456789' is "
        "stored '0123'",
        truncated,
        libnetcdf,
        frozenset({"ref_string"}),
    ),
    Difference(
        "libnetcdf 4.10.1's JSON convention stores the char attribute '°C' as the JSON word C (bug 20)",
        json_convention_unit,
        libnetcdf,
        frozenset({"names"}),
    ),
]


def expected_for(
    case: str, kind: Kind, expected: xr.Dataset, group: str = "/", skip: Difference | None = None
) -> xr.Dataset:
    for difference in DIFFERENCES:
        if difference is not skip and difference.applies(case, kind, group):
            expected = difference.change(expected)
    return expected


# ------------------------------------------------------------------------------------------ comparing
def attribute_type(value: object) -> str:
    if isinstance(value, str):
        return "str"
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return f"str[{len(value)}]"
    array = np.asarray(value)
    return f"{array.dtype.str}{list(array.shape)}"


def types_of(ds: xr.Dataset) -> dict[str, object]:
    """Every variable's dtype and every attribute's type (``assert_identical`` compares values only)."""
    found: dict[str, object] = {f":{k}": attribute_type(v) for k, v in ds.attrs.items()}
    for name, variable in ds.variables.items():
        found[str(name)] = variable.dtype
        found |= {f"{name}:{k}": attribute_type(v) for k, v in variable.attrs.items()}
    return found


def assert_same(actual: xr.Dataset, expected: xr.Dataset) -> None:
    xr.testing.assert_identical(actual, expected)
    assert types_of(actual) == types_of(expected)


def is_same(actual: xr.Dataset, expected: xr.Dataset) -> bool:
    try:
        assert_same(actual, expected)
    except AssertionError:
        return False
    return True


def check(case: str, kind: Kind, actual: xr.Dataset, theirs: xr.Dataset, group: str = "/") -> None:
    """``actual`` equals netCDF4-python's reading after the differences, each of them needed."""
    assert_same(actual, expected_for(case, kind, theirs, group))
    expected = expected_for(case, kind, theirs, group)
    for difference in DIFFERENCES:
        if difference.cases is None or not difference.applies(case, kind, group):
            continue
        without = expected_for(case, kind, theirs, group, skip=difference)
        if not is_same(without, expected):  # it changes something here: it must be needed
            assert not is_same(actual, without), (
                f"documented difference no longer needed: {difference.reason}"
            )


def open_both(stores: Stores, case: str, kind_name: str, **options) -> tuple[xr.Dataset, xr.Dataset]:
    if case in NO_ORACLE:
        pytest.skip(NO_ORACLE[case])
    if (case, kind_name) in CANNOT_WRITE:
        pytest.skip(CANNOT_WRITE[case, kind_name])
    url = stores.store(case, kind_name)
    with open_nczmap(url) as dataset:
        assert dataset.dialect is KINDS[kind_name].dialect
    with (
        xr.open_dataset(url, engine="nczmap", **options) as actual,
        xr.open_dataset(stores.nc(case), engine="netcdf4", **options) as theirs,
    ):
        return actual.load(), theirs.load()


# ------------------------------------------------------------------------------------------ the tests
def params():
    for case in CORPUS:
        for kind in KINDS:
            yield pytest.param(case, kind, id=f"{case}-{kind}")


@pytest.mark.parametrize(("case", "kind"), list(params()))
def test_open_dataset_identical(stores, case: str, kind: str) -> None:
    actual, theirs = open_both(stores, case, kind)
    check(case, KINDS[kind], actual, theirs)


@pytest.mark.parametrize(("case", "kind"), list(params()))
def test_open_dataset_raw_identical(stores, case: str, kind: str) -> None:
    actual, theirs = open_both(stores, case, kind, decode_cf=False)
    check(case, KINDS[kind], actual, theirs)


# ------------------------------------------------------------------------------------------ groups
def tree_params():
    for case in (c for c in CORPUS if has_groups(c) and c not in NO_ORACLE):
        for kind in KINDS:
            yield pytest.param(case, kind, id=f"{case}-{kind}")


# CDLs with a subgroup dimension shadowing an ancestor's: xarray's DataTree refuses them
SHADOWING = {"groups", "ref_xarraygroup"}
# groups where a variable uses an ancestor's dimension that the group shadows (same name, other length):
# an xarray Dataset cannot hold both, so neither engine opens them (pure Zarr names dimensions otherwise)
UNREPRESENTABLE = {("groups", "/g1/g2"), ("groups", "/g1/g2/g3"), ("groups", "/sib")}


@pytest.mark.parametrize(("case", "kind"), list(tree_params()))
def test_groups_identical(stores, case: str, kind: str) -> None:
    """Each group by ``open_dataset(group=...)``, and the whole tree by ``open_datatree``."""
    if (case, kind) in CANNOT_WRITE:
        pytest.skip(CANNOT_WRITE[case, kind])
    url, nc = stores.store(case, kind), stores.nc(case)
    for path in group_paths(nc):
        if (case, path) in UNREPRESENTABLE:
            if KINDS[kind].dialect.is_nczarr:
                with pytest.raises(ValueError, match="conflicting sizes for dimension"):
                    xr.open_dataset(url, engine="nczmap", group=path)
            continue
        with (
            xr.open_dataset(url, engine="nczmap", group=path) as actual,
            xr.open_dataset(nc, engine="netcdf4", group=path) as theirs,
        ):
            check(case, KINDS[kind], actual.load(), theirs.load(), path)
    try:
        theirs_tree = xr.open_datatree(nc, engine="netcdf4")
    except ValueError:  # xarray refuses a tree whose subgroup shadows a dimension: no oracle tree
        assert case in SHADOWING, f"netCDF4-python's tree of {case} fails"
        return
    with theirs_tree, xr.open_datatree(url, engine="nczmap") as actual_tree:
        assert sorted(actual_tree.groups) == sorted(theirs_tree.groups)
        for path in theirs_tree.groups:
            ours = actual_tree[path].to_dataset(inherit=False).load()
            check(case, KINDS[kind], ours, theirs_tree[path].to_dataset(inherit=False).load(), path)


def test_copy_of_shadowed_dimension(stores, tmp_path) -> None:
    """nczmap's copier reads '/g1/g2/d(/y)' of groups.nc with the root's dimension, as libnetcdf does."""
    url = url_of(tmp_path / "groups.file", "nczarr")
    nczmap_copy(str(stores.nc("groups")), url)
    with xr.open_dataset(url, engine="nczmap", group="/g1") as ours:
        assert ours["b"].sizes == {"y": 3}


# ------------------------------------------------------------------------------------------ fixture zips
# zip -> (the CDL documenting it, URL mode); ncgen 4.9.0 rejects a variable called "byte": renamed for it
FIXTURE_ZIPS = {
    "ref_oldkeys.file.zip": ("ref_oldkeys.cdl", "nczarr"),
    "ref_oldformat.zip": ("ref_oldformat.cdl", "nczarr"),
    "ref_byte.zarr.zip": ("ref_byte.cdl", "zarr"),
    "ref_byte_fill_value_null.zarr.zip": ("ref_byte_fill_value_null.cdl", "zarr"),
    "ref_power_901_constants_orig.zip": ("ref_power_901_constants.cdl", "zarr"),
    "ref_quotes_orig.zip": ("ref_quotes.cdl", "zarr"),
}
RENAMED = {"ref_byte.cdl": ("byte", "byte_")}


def fixture_oracle(cdl_name: str, archive: Path, mode: str, tmp_path: Path) -> xr.Dataset:
    """The fixture's CDL compiled by ncgen; a CDL without data (``ncdump -h``) takes its values from
    libnetcdf 4.10.1 reading the unzipped fixture."""
    text = (FIXTURES / cdl_name).read_text()
    old, new = RENAMED.get(cdl_name, (None, None))
    if old:
        text = (
            text.replace(f" {old}(", f" {new}(")
            .replace(f"\t\t{old}:", f"\t\t{new}:")
            .replace(f" {old} =", f" {new} =")
        )
    (tmp_path / cdl_name).write_text(text)
    nc = tmp_path / "oracle.nc"
    run(NCGEN, "-4", "-o", str(nc), str(tmp_path / cdl_name))
    with xr.open_dataset(nc, engine="netcdf4") as theirs:
        expected = theirs.load().rename({new: old}) if old else theirs.load()
    if "\ndata:" not in text:
        with zipfile.ZipFile(archive) as zf:
            folder = zf.namelist()[0].split("/", 1)[0]
            zf.extractall(tmp_path / "unzipped")
        with xr.open_dataset(url_of(tmp_path / "unzipped" / folder, mode), engine="netcdf4") as values:
            expected = expected.assign(
                {name: expected[name].copy(data=values[name].values) for name in expected.data_vars}
            )
    return expected


@pytest.mark.parametrize("name", list(FIXTURE_ZIPS))
def test_fixture_zip_identical(tmp_path, name: str) -> None:
    archive = FIXTURES / name
    if not archive.is_file():
        pytest.skip(f"netcdf-c fixture {archive} not found (set NCZMAP_NETCDF_FIXTURES)")
    cdl_name, mode = FIXTURE_ZIPS[name]
    expected = fixture_oracle(cdl_name, archive, mode, tmp_path)
    with xr.open_dataset(f"file://{archive}#mode={mode},zip", engine="nczmap") as actual:
        assert_same(actual.load(), expected)


# ------------------------------------------------------------------------------------------ dask
DASK_STORES = [("types", "ncgen-4.9.0"), ("compressed", "libnetcdf-4.10.1"), ("wrap", "nczmap-4.8.0"),
               ("unlimited", "nczmap-4.9.3"), ("chars", "nczmap-4.9.1")]  # fmt: skip


@pytest.mark.parametrize(("case", "kind"), DASK_STORES)
def test_dask_open_identical(stores, case: str, kind: str) -> None:
    """``chunks={}``: dask arrays in the storage chunks, computed to the same dataset."""
    pytest.importorskip("dask")
    url = stores.store(case, kind)
    with (
        xr.open_dataset(url, engine="nczmap", chunks={}) as lazy,
        xr.open_dataset(stores.nc(case), engine="netcdf4") as theirs,
    ):
        for variable in lazy.variables.values():
            if variable.chunks:  # (an index coordinate is loaded by xarray)
                preferred = variable.encoding["preferred_chunks"]
                assert variable.chunks == tuple(
                    _split(variable.sizes[d], preferred[d]) for d in variable.dims
                )
        check(case, KINDS[kind], lazy.compute(), theirs.load())


def _split(size: int, chunk: int) -> tuple[int, ...]:
    if size == 0:
        return (0,)  # dask's one empty chunk
    chunk = min(chunk, size)
    return (chunk,) * (size // chunk) + ((size % chunk,) if size % chunk else ())
