"""Parity with xarray's netcdf4 engine: each scenario runs through ``engine="netcdf4"``/``to_netcdf`` (a
netCDF-4 file, or an NCZarr store libnetcdf writes) and through ``engine="nczmap"``/``nczmap.to_nczarr``,
and the two are compared: datasets, encodings, errors (type and message), warnings.

What still differs, and why, is listed in the README ("xarray and dask") and pinned by the tests named
``test_difference_*``."""

from __future__ import annotations

import warnings

import dask
import netCDF4
import numpy as np
import pytest
import xarray as xr
from dask.delayed import Delayed

import nczmap
from nczmap.errors import EncodingError

pytestmark = pytest.mark.filterwarnings("ignore:.*will be stored as:UserWarning")

FILTERS = ("zlib", "szip", "zstd", "bzip2", "blosc", "shuffle", "complevel", "fletcher32")
LAYOUT = ("dtype", "chunksizes", "original_shape", "_FillValue", "least_significant_digit", *FILTERS)


class Targets:
    """One netCDF-4 file and one NCZarr store per name, written and read by the two engines."""

    def __init__(self, root) -> None:
        self.root = root

    def nc(self, name: str = "data") -> str:
        return str(self.root / f"{name}.nc")

    def store(self, name: str = "data", mode: str = "nczarr") -> str:
        return f"file://{self.root}/{name}.file#mode={mode},file"

    def write(self, data, name: str = "data", **kwargs):
        """``to_netcdf`` and ``to_nczarr`` of the same data with the same arguments: their results."""
        return data.to_netcdf(self.nc(name), engine="netcdf4", **kwargs), nczmap.to_nczarr(
            data, self.store(name), **kwargs
        )

    def read(self, name: str = "data", **kwargs) -> tuple[xr.Dataset, xr.Dataset]:
        netcdf = xr.open_dataset(self.nc(name), engine="netcdf4", **kwargs).load()
        ours = xr.open_dataset(self.store(name), engine="nczmap", **kwargs).load()
        return netcdf, ours

    def groups(self, name: str = "data") -> tuple[dict, dict]:
        netcdf = {k: v.load() for k, v in xr.open_groups(self.nc(name), engine="netcdf4").items()}
        ours = {k: v.load() for k, v in xr.open_groups(self.store(name), engine="nczmap").items()}
        return netcdf, ours

    def tree(self, name: str = "data") -> tuple[xr.DataTree, xr.DataTree]:
        netcdf = xr.open_datatree(self.nc(name), engine="netcdf4").load()
        ours = xr.open_datatree(self.store(name), engine="nczmap").load()
        return netcdf, ours


@pytest.fixture
def both(tmp_path):
    return Targets(tmp_path)


def comparable(value: object) -> object:
    """NaN (a float fill value) equal to NaN, numpy scalars as Python values."""
    if isinstance(value, dict):
        return {key: comparable(v) for key, v in value.items()}
    if isinstance(value, float | np.floating) and np.isnan(value):
        return "NaN"
    return value.item() if isinstance(value, np.generic) else value


def layout(variable: xr.Variable | xr.DataArray, keys=LAYOUT) -> dict:
    return comparable({key: variable.encoding.get(key) for key in keys})


def same_error(call_netcdf, call_ours):
    """Both calls fail; the exceptions (type and message) are returned for comparison."""
    errors = []
    for call in (call_netcdf, call_ours):
        with pytest.raises(Exception) as info:
            call()
        errors.append(info.value)
    return errors


@pytest.fixture
def dataset():
    values = np.arange(24.0).reshape(6, 4)
    values[1, 1] = np.nan
    return xr.Dataset(
        {
            "v": (("time", "x"), values, {"units": "K"}),
            "counts": (("x",), np.array([1, 2, 3, 4], "i4")),
            "labels": (("x",), np.array(["a", "bb", "", "dddd"], object)),
        },
        coords={"time": np.arange(6.0), "x": [10, 20, 30, 40]},
        attrs={"title": "parity"},
    )


# --------------------------------------------------------------------------------------------- groups
def test_group_argument(both, dataset):
    assert both.write(dataset, group="g") == (None, None)
    netcdf, ours = both.read(group="g")
    xr.testing.assert_identical(ours, netcdf)
    xr.testing.assert_identical(*reversed(both.tree()))
    for name in ("/g", "g/"):
        xr.testing.assert_identical(xr.open_dataset(both.store(), engine="nczmap", group=name).load(), netcdf)


def test_groups_written_one_after_another_with_mode_a(both, dataset):
    child = xr.Dataset({"w": (("x",), np.arange(3.0))}, attrs={"note": "x is 3 long here"})
    grandchild = xr.Dataset({"u": (("x", "y"), np.ones((2, 5), "f4"))})
    both.write(dataset)
    both.write(child, group="g1", mode="a")
    both.write(grandchild, group="/g1/g2", mode="a")
    both.write(dataset[["counts"]].rename(counts="again"), group="g3", mode="a")  # same x as the root's
    netcdf, ours = both.groups()  # not a DataTree: x has three lengths
    assert list(ours) == list(netcdf) == ["/", "/g1", "/g1/g2", "/g3"]
    for path in netcdf:
        xr.testing.assert_identical(ours[path], netcdf[path])
    assert ours["/g1"].sizes["x"] == 3 and ours["/g1/g2"].sizes["x"] == 2
    with netCDF4.Dataset(both.store()) as nc, netCDF4.Dataset(both.nc()) as expected:
        for path in ("/g1", "/g1/g2", "/g3"):  # libnetcdf reads the store's groups as the file's
            assert {k: len(d) for k, d in nc[path].dimensions.items()} == {
                k: len(d) for k, d in expected[path].dimensions.items()
            }


def test_mode_a_adds_variables_to_an_existing_group(both, dataset):
    both.write(dataset[["v"]], group="g")
    both.write(dataset[["counts"]], group="g", mode="a")
    both.write(dataset[["labels"]].assign_attrs(more="added"), group="g", mode="a")
    netcdf, ours = both.read(group="g")
    xr.testing.assert_identical(ours, netcdf)
    assert set(ours.data_vars) == {"v", "counts", "labels"} and ours.attrs["more"] == "added"


def test_mode_a_refuses_another_size_for_an_existing_dimension(both, dataset):
    both.write(dataset)
    bigger = xr.Dataset({"z": (("x",), np.arange(7))})
    netcdf, ours = same_error(
        lambda: bigger.to_netcdf(both.nc(), mode="a", engine="netcdf4"),
        lambda: nczmap.to_nczarr(bigger, both.store(), mode="a"),
    )
    assert type(ours) is type(netcdf) is ValueError and str(ours) == str(netcdf)


def test_datatrees(both, dataset):
    tree = xr.DataTree.from_dict(
        {"/": dataset, "/a": xr.Dataset({"w": ("z", [1.5, 2.5])}), "/a/b": xr.Dataset({"q": ("y", [1, 2])})}
    )
    encoding = {"/a": {"w": {"zlib": True, "complevel": 2}}}
    tree.to_netcdf(both.nc(), engine="netcdf4", encoding=encoding, unlimited_dims={"/": ["time"]})
    nczmap.to_nczarr(tree, both.store(), encoding=encoding, unlimited_dims={"/": ["time"]})
    netcdf, ours = both.tree()
    xr.testing.assert_identical(ours, netcdf)
    assert layout(ours["a"]["w"], FILTERS) == layout(netcdf["a"]["w"], FILTERS)
    assert ours.encoding["unlimited_dims"] == netcdf.encoding["unlimited_dims"] == {"time"}
    bad = {"/nope": {}}
    netcdf_error, our_error = same_error(
        lambda: tree.to_netcdf(both.nc("bad"), engine="netcdf4", encoding=bad),
        lambda: nczmap.to_nczarr(tree, both.store("bad"), encoding=bad),
    )
    assert type(our_error) is type(netcdf_error) is ValueError and str(our_error) == str(netcdf_error)


# -------------------------------------------------------------------------------------------- compute
def test_compute_false(both, dataset):
    lazy = dataset.chunk({"time": 3})
    netcdf, ours = both.write(lazy, compute=False)
    assert isinstance(netcdf, Delayed) and isinstance(ours, Delayed)
    with xr.open_dataset(both.store(), engine="nczmap") as before:  # metadata now, the data once computed
        assert set(before.variables) == set(dataset.variables)
        assert np.isnan(before.v.values).all()
    dask.compute(netcdf, ours)
    netcdf, ours = both.read()
    xr.testing.assert_identical(ours, netcdf)


def test_compute_false_without_dask_data(both, dataset):
    netcdf, ours = both.write(dataset, compute=False)
    assert isinstance(netcdf, Delayed) and isinstance(ours, Delayed)
    dask.compute(netcdf, ours)
    xr.testing.assert_identical(*reversed(both.read()))


# ------------------------------------------------------------------------------------------- encoding
ENCODINGS = {
    "zlib": {"zlib": True, "complevel": 6, "shuffle": True, "chunksizes": (3, 2)},
    "zlib, shuffle by default": {"zlib": True, "chunksizes": (2, 4)},
    "zlib, no shuffle": {"compression": "zlib", "complevel": 1, "shuffle": False},
    "zstd": {"compression": "zstd", "complevel": 3, "chunksizes": (6, 1)},
    "bzip2": {"compression": "bzip2", "complevel": 2},
    "fletcher32": {"fletcher32": True, "chunksizes": (1, 4)},
    "zlib and fletcher32": {"zlib": True, "fletcher32": True, "shuffle": True},
    "fill and dtype": {"_FillValue": -1.0, "dtype": "f4"},
    "packed": {"dtype": "i2", "scale_factor": 0.5, "_FillValue": -99},
}


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_encodings_written_and_read_back(both, dataset, name):
    encoding = {"v": ENCODINGS[name]}
    both.write(dataset, encoding=encoding)
    netcdf, ours = both.read()
    xr.testing.assert_identical(ours, netcdf)
    keys = LAYOUT if "chunksizes" in encoding["v"] else tuple(k for k in LAYOUT if k != "chunksizes")
    assert layout(ours.v, keys) == layout(netcdf.v, keys)
    assert isinstance(ours.v.encoding["zlib"], bool)  # code reading encoding["zlib"] keeps working
    # libnetcdf (netCDF4-python) reads nczmap's store with the same filters: netcdf-c's layout, codecs
    with netCDF4.Dataset(both.store()) as nc, netCDF4.Dataset(both.nc()) as expected:
        assert nc["v"].filters() == expected["v"].filters()
        np.testing.assert_array_equal(nc["v"][:], expected["v"][:])


def test_the_engine_reports_what_the_netcdf4_engine_reports_for_the_same_store(both, dataset):
    """Both engines open one NCZarr store written by libnetcdf: every encoding entry is the same."""
    dataset["scalar"] = ((), 7.5)
    dataset["bytes"] = (("x",), np.array([b"ab", b"c", b"", b"def"]))
    encoding = {name: dict(value) for name, value in ENCODINGS.items() if name in ("zlib", "zstd")}
    url = both.store("libnetcdf")
    lsd = dataset.assign(w=dataset.v + 0.123456)
    lsd.to_netcdf(
        url,
        engine="netcdf4",
        encoding={
            "v": encoding["zlib"],
            "counts": {"compression": "bzip2", "complevel": 3},
            "w": {"fletcher32": True, "zlib": True, "least_significant_digit": 2},
        },
        unlimited_dims=["time"],
    )
    netcdf = xr.open_dataset(url, engine="netcdf4")
    ours = xr.open_dataset(url, engine="nczmap")
    xr.testing.assert_identical(ours.load(), netcdf.load())
    assert ours.encoding == netcdf.encoding
    for name in netcdf.variables:
        assert comparable(ours[name].encoding) == comparable(netcdf[name].encoding), name


def test_reading_writing_keeps_the_layout_and_compression(both, dataset):
    encoding = {"v": ENCODINGS["zlib"], "counts": {"compression": "zstd", "complevel": 5, "chunksizes": (2,)}}
    both.write(dataset, encoding=encoding, unlimited_dims=["time"])
    netcdf, ours = both.read()
    netcdf.to_netcdf(both.nc("copy"), engine="netcdf4")
    nczmap.to_nczarr(ours, both.store("copy"))
    netcdf_copy, ours_copy = both.read("copy")
    xr.testing.assert_identical(ours_copy, netcdf_copy)
    assert ours_copy.encoding["unlimited_dims"] == netcdf_copy.encoding["unlimited_dims"] == {"time"}
    for name in ("v", "counts"):
        assert layout(ours_copy[name]) == layout(ours[name]) == layout(netcdf_copy[name])
    # and from a netCDF-4 file read by the netcdf4 engine: its compression and chunks are kept
    nczmap.to_nczarr(netcdf, both.store("from-nc"))
    with xr.open_dataset(both.store("from-nc"), engine="nczmap") as from_nc:
        for name in ("v", "counts"):
            assert layout(from_nc[name]) == layout(netcdf[name])


def test_chunksizes_left_by_open_dataset_are_dropped_where_they_no_longer_fit(both, dataset):
    both.write(dataset, encoding={"v": {"chunksizes": (6, 4)}})
    netcdf, ours = both.read()
    netcdf.isel(time=slice(0, 2)).to_netcdf(both.nc("part"), engine="netcdf4")
    nczmap.to_nczarr(ours.isel(time=slice(0, 2)), both.store("part"))
    netcdf, ours = both.read("part")
    xr.testing.assert_identical(ours, netcdf)
    assert ours.v.encoding["chunksizes"] == (2, 4)  # not (6, 4): xarray's rule, as for the netcdf4 engine


def test_least_significant_digit(both):
    data = xr.Dataset({"t": (("x",), np.array([1.23456, 2.34567, 3.45678]))})
    both.write(data, encoding={"t": {"least_significant_digit": 1}})
    netcdf, ours = both.read()
    xr.testing.assert_identical(ours, netcdf)
    assert ours.t.encoding["least_significant_digit"] == netcdf.t.encoding["least_significant_digit"] == 1
    assert not np.array_equal(ours.t.values, data.t.values)  # quantized, as netCDF4-python does


@pytest.mark.parametrize(
    "encoding",
    [
        {"v": {"bogus": 1}},
        {"v": {"preferred_chunks": {"x": 2}}},
        {"v": {"chunksizes": (1,)}},
        {"v": {"compression": "lzma"}},
        {"v": {"contiguous": True, "chunksizes": (6, 4)}},
    ],
    ids=["unknown", "preferred_chunks", "chunk rank", "compression", "contiguous with chunks"],
)
def test_bad_encodings_are_value_errors(both, dataset, encoding):
    netcdf_error, our_error = same_error(
        lambda: dataset.to_netcdf(both.nc("bad"), engine="netcdf4", encoding=encoding),
        lambda: nczmap.to_nczarr(dataset, both.store("bad"), encoding=encoding),
    )
    assert isinstance(netcdf_error, ValueError) and isinstance(our_error, ValueError)
    assert "'v'" in str(our_error) or "'bogus'" in str(our_error)


def test_encoding_of_a_variable_that_is_not_there(both, dataset):
    netcdf, ours = same_error(
        lambda: dataset.to_netcdf(both.nc(), engine="netcdf4", encoding={"nope": {}}),
        lambda: nczmap.to_nczarr(dataset, both.store(), encoding={"nope": {}}),
    )
    assert type(ours) is type(netcdf) is KeyError and str(ours) == str(netcdf)


def test_contiguous(both, dataset):
    both.write(dataset, encoding={"v": {"contiguous": True}})
    netcdf, ours = both.read()
    xr.testing.assert_identical(ours, netcdf)
    assert netcdf.v.encoding["contiguous"] is True
    # NCZarr has no contiguous storage: netcdf-c stores one chunk, and reports it as chunked
    assert ours.v.encoding["chunksizes"] == (6, 4) and ours.v.encoding["contiguous"] is False
    with xr.open_dataset(both.store(), engine="netcdf4") as libnetcdf:
        assert libnetcdf.v.encoding["chunksizes"] == (6, 4) and libnetcdf.v.encoding["contiguous"] is False


# -------------------------------------------------------------------------------------- unlimited_dims
def test_unlimited_dims(both, dataset):
    both.write(dataset, unlimited_dims=["time"])
    netcdf, ours = both.read()
    xr.testing.assert_identical(ours, netcdf)
    assert ours.encoding["unlimited_dims"] == netcdf.encoding["unlimited_dims"] == {"time"}
    netcdf_error, our_error = same_error(
        lambda: dataset.to_netcdf(both.nc("bad"), engine="netcdf4", unlimited_dims=["nope"]),
        lambda: nczmap.to_nczarr(dataset, both.store("bad"), unlimited_dims=["nope"]),
    )
    assert type(our_error) is type(netcdf_error) is ValueError and str(our_error) == str(netcdf_error)


def test_unlimited_dims_in_the_datasets_encoding_warn_as_to_netcdf_does(both, dataset):
    dataset.encoding["unlimited_dims"] = {"time", "gone"}
    caught = []
    for write in (
        lambda: dataset.to_netcdf(both.nc(), engine="netcdf4"),
        lambda: nczmap.to_nczarr(dataset, both.store()),
    ):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            write()
        caught.append([(w.category, str(w.message)) for w in record if "Unlimited" in str(w.message)])
    assert caught[0] == caught[1] and len(caught[0]) == 1
    netcdf, ours = both.read()
    assert ours.encoding["unlimited_dims"] == netcdf.encoding["unlimited_dims"] == {"time"}


# ---------------------------------------------------------------------------------------------- names
@pytest.mark.parametrize(
    "data",
    [
        xr.Dataset({0: ("x", [1])}),
        xr.Dataset({"": ("x", [1])}),
        xr.Dataset({"PASS/FAIL": ("x", [1])}),
        xr.Dataset({"v": ("a/b", [1])}),
        xr.Dataset({"v": ("x", [1], {1: "one"})}),
        xr.Dataset({"v": ("x", [1], {"": "empty"})}),
        xr.Dataset({"v": ("x", [1])}, attrs={"a": None}),
        xr.Dataset({"v": ("x", [1])}, attrs={"a": {"no": "dicts"}}),
        xr.Dataset({"v": ("x", [1])}, attrs={"a": np.True_}),
    ],
    ids=["int", "empty", "slash", "slash in dim", "int attr", "empty attr", "None", "dict", "numpy bool"],
)
def test_names_and_attributes_are_validated_before_anything_is_written(tmp_path, data):
    both = Targets(tmp_path)
    netcdf, ours = same_error(
        lambda: data.to_netcdf(both.nc(), engine="netcdf4"), lambda: nczmap.to_nczarr(data, both.store())
    )
    assert type(ours) is type(netcdf) and type(ours) in (ValueError, TypeError)
    assert str(ours) == str(netcdf)
    assert not (tmp_path / "data.file").exists()  # (the netcdf4 engine creates its file before the '/' check)


def test_a_bad_name_leaves_an_existing_store_untouched(both, dataset):
    both.write(dataset)
    with pytest.raises(TypeError):
        nczmap.to_nczarr(xr.Dataset({0: ("x", [1])}), both.store())  # mode="w" would replace it
    xr.testing.assert_identical(*reversed(both.read()))


def test_group_must_be_a_string(both, dataset):
    netcdf, ours = same_error(
        lambda: dataset.to_netcdf(both.nc(), engine="netcdf4", group=5),
        lambda: nczmap.to_nczarr(dataset, both.store(), group=5),
    )
    assert type(ours) is type(netcdf) is ValueError and str(ours) == str(netcdf)


# ---------------------------------------------------------------------------------------------- bytes
BYTES = {
    "fixed width": ({}, {}),
    "fill in encoding": ({}, {"_FillValue": b"X"}),
    "fill in attributes": ({"_FillValue": b"X"}, {}),
    "S1 with a fill": (None, {"_FillValue": b"X"}),
    "dtype S1": ({}, {"dtype": "S1"}),
}


@pytest.mark.parametrize("name", list(BYTES))
def test_bytes(both, name):
    attrs, encoding = BYTES[name]
    values = np.array([b"a", b"X", b"c", b""]) if attrs is None else np.array([b"abc", b"", b"de", b"X"])
    data = xr.Dataset({"b": (("x",), values, attrs or {}), "m": (("y", "x"), np.array([values] * 2))})
    both.write(data, encoding={"b": encoding})
    netcdf, ours = both.read()
    xr.testing.assert_identical(ours, netcdf)
    assert layout(ours.b, ("dtype", "_FillValue", "char_dim_name")) == layout(
        netcdf.b, ("dtype", "_FillValue", "char_dim_name")
    )
    # the store as libnetcdf reads it: a char variable over string<n>, as in the netCDF-4 file
    with netCDF4.Dataset(both.store()) as nc, netCDF4.Dataset(both.nc()) as expected:
        assert nc["b"].dimensions == expected["b"].dimensions and nc["b"].dtype == expected["b"].dtype
        assert nc["m"].dimensions == expected["m"].dimensions
    assert xr.open_dataset(both.store(), engine="netcdf4").load().identical(netcdf)


@pytest.mark.parametrize(
    "attrs",
    [
        {"a": b"\x00"},
        {"a": b"abc\x00\x00", "b": "text\x00"},
        {"a": b"bytes", "n": np.bytes_(b"xy"), "u": np.array(["one"]), "l": np.array(["p", "qq"])},
        {"l": [b"a", b"bc"], "s": ["x\x00", "y"]},
    ],
    ids=["NUL", "trailing NULs", "bytes and numpy text", "lists"],
)
def test_text_attributes(both, attrs):
    data = xr.Dataset({"v": (("x",), [1, 2], attrs)}, attrs=attrs)
    both.write(data)
    netcdf, ours = both.read()
    xr.testing.assert_identical(ours, netcdf)
    assert xr.open_dataset(both.store(), engine="netcdf4").identical(netcdf)  # libnetcdf reads it so too


def test_nul_inside_char_text_is_kept_in_pure_zarr_and_refused_by_name_in_nczarr(both):
    data = xr.Dataset({"v": (("x",), [1, 2], {"flags": b"a\x00b"})})
    with pytest.raises(EncodingError, match=r"attribute 'v:flags': .* NUL character inside") as info:
        nczmap.to_nczarr(data, both.store())
    assert isinstance(info.value, ValueError)
    nczmap.to_nczarr(data, both.store("pure", "zarr"))
    with xr.open_zarr(both.root / "pure.file", consolidated=False) as zarr:
        assert zarr.v.attrs["flags"] == "a\x00b"  # JSON holds the NUL
    data.to_netcdf(both.nc(), engine="netcdf4")
    netcdf = xr.open_dataset(both.nc(), engine="netcdf4")
    with xr.open_dataset(both.store("pure", "zarr"), engine="nczmap") as ours:
        assert ours.v.attrs["flags"] == netcdf.v.attrs["flags"] == "ab"  # netCDF4-python drops NULs


def test_attributes_that_are_not_utf8_read_back_as_netcdf4_reads_them(both):
    data = xr.Dataset(attrs={"raw": b"\xff\xfeok", "nul": b"\x00", "text": b"caf\xc3\xa9"})
    data.to_netcdf(both.nc(), engine="netcdf4")
    store = both.store()
    nczmap.to_nczarr(data, store)
    with (
        xr.open_dataset(both.nc(), engine="netcdf4") as theirs,
        xr.open_dataset(store, engine="nczmap") as ours,
    ):
        assert ours.attrs == theirs.attrs == {"raw": "\ufffd\ufffdok", "nul": "", "text": "café"}


# ------------------------------------------------------------------------ what NCZarr cannot hold
def test_enums_are_refused_by_variable_name(both):
    enum = np.dtype("u1", metadata={"enum": {"clear": 0, "cloudy": 1}, "enum_name": "sky_t"})
    data = xr.Dataset({"sky": (("x",), np.array([0, 1, 1], "u1"))})
    data.to_netcdf(both.nc(), engine="netcdf4", encoding={"sky": {"dtype": enum}})
    from_file = xr.open_dataset(both.nc(), engine="netcdf4")
    assert from_file.sky.encoding["dtype"].metadata["enum_name"] == "sky_t"
    for attempt in (
        lambda: nczmap.to_nczarr(data, both.store(), encoding={"sky": {"dtype": enum}}),
        lambda: nczmap.to_nczarr(from_file, both.store()),
    ):
        with pytest.raises(EncodingError, match=r"variable 'sky': NCZarr has no enum types.*'sky_t'") as info:
            attempt()
        assert isinstance(info.value, ValueError)
    from_file.sky.encoding["dtype"] = np.dtype("u1")  # what the message says to do
    nczmap.to_nczarr(from_file, both.store())
    with xr.open_dataset(both.store(), engine="nczmap") as ours:
        xr.testing.assert_identical(ours.load(), from_file.load())


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (np.zeros(2, dtype=[("a", "i4"), ("b", "f4")]), "no compound types"),
        (np.array([1 + 2j, 3j]), "no complex type"),
    ],
    ids=["compound", "complex"],
)
def test_compounds_and_complex_numbers_are_refused_by_variable_name(both, values, message):
    data = xr.Dataset({"c": (("x",), values)})
    with pytest.raises(ValueError):
        data.to_netcdf(both.nc(), engine="netcdf4")
    with pytest.raises(EncodingError, match=rf"variable 'c': NCZarr has {message}"):
        nczmap.to_nczarr(data, both.store())


def test_vlen_variables_are_refused_by_name(both):
    with netCDF4.Dataset(both.nc(), "w") as nc:
        nc.createDimension("x", 2)
        vlen = nc.createVLType(np.int32, "ragged")
        variable = nc.createVariable("r", vlen, ("x",))
        variable[0] = np.array([1, 2], "i4")
        variable[1] = np.array([3], "i4")
    from_file = xr.open_dataset(both.nc(), engine="netcdf4").load()
    with pytest.raises(EncodingError, match=r"variable 'r': NCZarr has no variable-length \(vlen\) types"):
        nczmap.to_nczarr(from_file, both.store())
    with pytest.raises(ValueError):
        from_file.to_netcdf(both.nc("copy"), engine="netcdf4")


def test_what_nczarr_cannot_hold_is_refused_before_anything_is_written(both, dataset):
    both.write(dataset)
    with pytest.raises(EncodingError, match="variable 'c'"):
        nczmap.to_nczarr(dataset.assign(c=("x", np.zeros(4, complex))), both.store())  # mode="w"
    xr.testing.assert_identical(*reversed(both.read()))


# ------------------------------------------------------------------------------------ the differences
def test_difference_nul_inside_char_attributes(both):
    """netCDF-4 keeps "a\\x00b" (netCDF4-python reads "ab"); netcdf-c cuts NCZarr attributes at a NUL."""
    data = xr.Dataset(attrs={"m": "a\x00b"})
    data.to_netcdf(both.nc(), engine="netcdf4")
    assert xr.open_dataset(both.nc(), engine="netcdf4").attrs["m"] == "ab"
    with pytest.raises(EncodingError, match="NUL"):
        nczmap.to_nczarr(data, both.store())


def test_difference_non_native_endian_and_python_bools_are_written(both):
    """The netcdf4 engine refuses these (NotImplementedError, TypeError); NCZarr holds them."""
    data = xr.Dataset({"v": (("x",), np.array([1.5, 2.5], ">f8"), {"flag": True})})
    nczmap.to_nczarr(data, both.store(), encoding={"v": {"endian": "big"}})
    with xr.open_dataset(both.store(), engine="nczmap") as ours:
        assert ours.v.attrs["flag"] == 1 and list(ours.v.values) == [1.5, 2.5]
    with pytest.raises(TypeError):
        data.to_netcdf(both.nc(), engine="netcdf4")


def test_difference_szip_and_quantize_are_refused_by_name(both, dataset):
    for encoding, message in (
        ({"compression": "szip"}, "szip"),
        ({"significant_digits": 3}, "significant_digits"),
    ):
        with pytest.raises(EncodingError, match=rf"variable 'v': {message}"):
            nczmap.to_nczarr(dataset, both.store(), encoding={"v": encoding})
