"""The xarray engine "nczmap" and nczmap.to_nczarr, checked against netCDF4-python and netcdf-c reading the
same data (the netCDF4 wheel's libnetcdf 4.10 reads NCZarr directory stores; Debian's ncdump is 4.9.0)."""

from __future__ import annotations

import shutil
import subprocess
import uuid

import netCDF4
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import nczmap
from nczmap.errors import EncodingError, NCZError
from nczmap.integrations.copy import copy
from nczmap.zmap import MemoryMap


@pytest.fixture(scope="module")
def source_nc(tmp_path_factory):
    """A netCDF-4 file with what CF decoding acts on: times, packed integers with a fill, chars, strings."""
    path = tmp_path_factory.mktemp("source") / "source.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "engine test"
        ds.count = np.int32(3)
        ds.createDimension("time", None)
        ds.createDimension("x", 4)
        ds.createDimension("len", 5)
        time = ds.createVariable("time", "f8", ("time",))
        time.units = "days since 2000-01-01"
        time[:] = [0, 1, 2]
        packed = ds.createVariable("packed", "i2", ("time", "x"), fill_value=-99, chunksizes=(2, 2))
        packed.scale_factor = 0.5
        packed.add_offset = 1.0
        packed[:] = np.arange(12).reshape(3, 4)
        packed[1, 1] = np.ma.masked
        names = ds.createVariable("names", "S1", ("x", "len"))
        names[:] = netCDF4.stringtochar(np.array(["ab", "cde", "", "fghij"], "S5"))
        labels = ds.createVariable("labels", str, ("x",))
        labels[:] = np.array(["a", "bb", "", "dddd"], object)
        group = ds.createGroup("g")
        group.note = "inner"
        group.createDimension("y", 2)
        group.createVariable("w", "f4", ("x",))[:] = [1, 2, 3, 4]
        group.createVariable("m", "u1", ("y", "x"))[:] = np.arange(8).reshape(2, 4)
    return path


def _store(source_nc, tmp_path, kind: str, s3_server=None):
    if kind == "zip":
        url = f"{tmp_path}/store.zip#mode=nczarr,zip"
    elif kind == "s3":
        url = s3_server.url()
    else:
        url = f"file://{tmp_path}/store.file#mode=nczarr,file"
    copy(str(source_nc), url)
    return url


@pytest.mark.parametrize("kind", ["file", "zip", "s3"])
def test_engine_reads_what_netcdf4_reads(source_nc, tmp_path, kind, request):
    s3 = request.getfixturevalue("s3_server") if kind == "s3" else None
    url = _store(source_nc, tmp_path, kind, s3)
    expected = xr.open_dataset(source_nc, engine="netcdf4")
    with xr.open_dataset(url, engine="nczmap") as got:
        xr.testing.assert_identical(got, expected)
        assert got.encoding["unlimited_dims"] == {"time"}
        assert got.packed.encoding["chunksizes"] == (2, 2)
    for group in ("g", "/g"):
        with xr.open_dataset(url, engine="nczmap", group=group) as got:
            xr.testing.assert_identical(got, xr.open_dataset(source_nc, engine="netcdf4", group="g"))


def test_undecoded_values_are_the_stored_ones(source_nc, tmp_path):
    url = _store(source_nc, tmp_path, "file")
    expected = xr.open_dataset(source_nc, engine="netcdf4", decode_cf=False)
    with xr.open_dataset(url, engine="nczmap", decode_cf=False) as got:
        xr.testing.assert_identical(got, expected)
        assert got.packed.dtype == np.int16


def test_datatree_matches_netcdf4(source_nc, tmp_path):
    url = _store(source_nc, tmp_path, "file")
    expected = xr.open_datatree(source_nc, engine="netcdf4")
    with xr.open_datatree(url, engine="nczmap") as got:
        xr.testing.assert_identical(got, expected)
    assert set(xr.open_groups(url, engine="nczmap")) == {"/", "/g"}


def test_engine_takes_open_maps_and_datasets(source_nc, tmp_path):
    url = _store(source_nc, tmp_path, "file")
    expected = xr.open_dataset(source_nc, engine="netcdf4")
    memory = MemoryMap()
    with nczmap.open_map(url) as zmap:
        for key in zmap.objects():
            memory.write(key, zmap.read(key))
    memory.mode = "r"
    xr.testing.assert_identical(xr.open_dataset(memory, engine="nczmap"), expected)
    with nczmap.open_dataset(url) as dataset:
        xr.testing.assert_identical(xr.open_dataset(dataset, engine="nczmap").load(), expected)
        assert not dataset.zmap.closed  # the caller's dataset stays the caller's to close


def test_the_engine_is_chosen_for_mode_urls_only(source_nc, tmp_path):
    url = _store(source_nc, tmp_path, "file")
    entry = xr.backends.list_engines()["nczmap"]
    assert entry.guess_can_open(url)
    assert not entry.guess_can_open(str(source_nc))
    assert not entry.guess_can_open(f"{tmp_path}/plain.zarr")
    xr.testing.assert_identical(xr.open_dataset(url), xr.open_dataset(source_nc, engine="netcdf4"))


def test_missing_group_is_named(source_nc, tmp_path):
    url = _store(source_nc, tmp_path, "file")
    with pytest.raises(NCZError, match=r"no group '/nope'.*subgroups: g"):
        xr.open_dataset(url, engine="nczmap", group="/nope")


def test_outer_and_vectorised_indexing(source_nc, tmp_path):
    url = _store(source_nc, tmp_path, "file")
    expected = xr.open_dataset(source_nc, engine="netcdf4")
    got = xr.open_dataset(url, engine="nczmap")
    selections = [
        {"x": [3, 0, 2]},
        {"time": [2, 0], "x": slice(None, None, -1)},
        {"time": xr.DataArray([0, 2, 1], dims="p"), "x": xr.DataArray([3, 1, 0], dims="p")},
        {"time": xr.DataArray([[0, 1], [2, 2]], dims=("a", "b")), "x": 1},
    ]
    for selection in selections:
        xr.testing.assert_identical(got.packed.isel(selection), expected.packed.isel(selection))


def test_dask_chunks_follow_storage_chunks(source_nc, tmp_path):
    url = _store(source_nc, tmp_path, "file")
    with xr.open_dataset(url, engine="nczmap", chunks={}) as got:
        assert got.packed.chunks == ((2, 1), (2, 2))
        xr.testing.assert_identical(got.compute(), xr.open_dataset(source_nc, engine="netcdf4"))


# ----------------------------------------------------------------------------------------------- writing
@pytest.fixture
def dataset():
    values = np.arange(24.0).reshape(6, 4)
    values[1, 1] = np.nan
    return xr.Dataset(
        {
            "v": (("time", "x"), values, {"units": "K", "valid_range": [0.0, 30.0]}),
            "labels": (("x",), np.array(["a", "bb", "", "dddd"])),
            "counts": (("x",), np.array([1, 2, 3, 4], "i4"), {"flag": np.int8(1)}),
        },
        coords={"time": pd.date_range("2000-01-01", periods=6), "x": [10, 20, 30, 40]},
        attrs={"title": "written", "n": 3, "ratio": 1.5, "levels": [1, 2], "names": ["p", "q"]},
    )


@pytest.mark.parametrize("version", [None, "4.9.1", "4.9.0", "4.8.0"])
def test_written_datasets_read_back_identically(dataset, tmp_path, version):
    url = f"file://{tmp_path}/out.file#mode=nczarr,file"
    old = version in ("4.9.0", "4.8.0")  # no string attributes
    if old:
        with pytest.raises(nczmap.FormatError, match=r"attribute 'names': netcdf-c before 4\.9\.1"):
            nczmap.to_nczarr(dataset, url, version)
        dataset.attrs.pop("names")
    unlimited = {"time"} if version is None else set()  # netcdf-c reads unlimited NCZarr from 4.9.3
    nczmap.to_nczarr(dataset, url, version, unlimited_dims=unlimited)
    with xr.open_dataset(url, engine="nczmap") as got:
        xr.testing.assert_identical(got.load(), dataset)
        assert got.encoding["unlimited_dims"] == unlimited


def test_written_store_reads_in_libnetcdf_as_the_netcdf_file_does(dataset, tmp_path):
    url = f"file://{tmp_path}/out.file#mode=nczarr,file"
    nczmap.to_nczarr(dataset, url)
    dataset.to_netcdf(tmp_path / "out.nc", engine="netcdf4")
    expected = xr.open_dataset(tmp_path / "out.nc", engine="netcdf4", decode_cf=False)
    got = xr.open_dataset(url, engine="netcdf4", decode_cf=False)
    xr.testing.assert_identical(got.drop_encoding(), expected.drop_encoding())


@pytest.mark.skipif(shutil.which("ncdump") is None, reason="Debian's ncdump (netcdf-bin) is not installed")
def test_ncdump_490_prints_the_same_data(dataset, tmp_path):
    url = f"file://{tmp_path}/out.file#mode=nczarr,file"
    dataset.attrs.pop("names")
    dataset = dataset.drop_vars("labels")  # a string variable in the file; char in the 4.9.0 store
    nczmap.to_nczarr(dataset, url, "4.9.0")
    dataset.to_netcdf(tmp_path / "out.nc", engine="netcdf4")

    def data_section(target: str) -> str:
        text = subprocess.run(["ncdump", target], capture_output=True, text=True, check=True).stdout
        return text.split("data:", 1)[1]

    assert data_section(url) == data_section(str(tmp_path / "out.nc"))


def test_encoding_is_honoured(dataset, tmp_path):
    url = f"file://{tmp_path}/out.file#mode=nczarr,file"
    encoding = {
        "v": {"chunksizes": (3, 2), "zlib": True, "complevel": 6, "shuffle": True, "_FillValue": -1.0},
        "counts": {"dtype": "i2", "_FillValue": None},
    }
    nczmap.to_nczarr(dataset, url, encoding=encoding)
    with netCDF4.Dataset(url) as nc:
        v = nc.variables["v"]
        assert v.chunking() == [3, 2]
        assert v.filters()["zlib"] and v.filters()["complevel"] == 6 and v.filters()["shuffle"]
        assert v.getncattr("_FillValue") == -1.0
        assert nc.variables["counts"].dtype == np.int16
        assert "_FillValue" not in nc.variables["counts"].ncattrs()
    with xr.open_dataset(url, engine="nczmap") as got:
        xr.testing.assert_identical(got.load(), dataset)
        assert got.v.encoding["complevel"] == 6


def test_unknown_encoding_is_refused(dataset, tmp_path):
    url = f"file://{tmp_path}/out.file#mode=nczarr,file"
    with pytest.raises(EncodingError, match=r"'v'.*unexpected encoding \['bogus'\]"):
        nczmap.to_nczarr(dataset, url, encoding={"v": {"bogus": 1}})


def test_datatrees_write_as_groups(dataset, tmp_path):
    tree = xr.DataTree.from_dict({"/": dataset, "/inner": xr.Dataset({"w": ("y", [1.5, 2.5])})})
    url = f"file://{tmp_path}/tree.file#mode=nczarr,file"
    nczmap.to_nczarr(tree, url)
    with xr.open_datatree(url, engine="nczmap") as got:
        xr.testing.assert_identical(got.load(), tree)
    with netCDF4.Dataset(url) as nc:
        assert list(nc.groups["inner"].variables["w"][:]) == [1.5, 2.5]


def test_append_mode_adds_variables(dataset, tmp_path):
    url = f"file://{tmp_path}/out.file#mode=nczarr,file"
    nczmap.to_nczarr(dataset[["v"]], url)
    nczmap.to_nczarr(dataset[["counts"]], url, mode="a")
    with xr.open_dataset(url, engine="nczmap") as got:
        xr.testing.assert_identical(got.load(), dataset[["v", "counts"]])


def test_pure_zarr_output_opens_in_xarrays_zarr_engine(dataset, tmp_path):
    dataset["labels"] = ("x", np.array(["é", "bb", "", "été"]))  # text as utf-8 char arrays
    url = f"file://{tmp_path}/out.zarr#mode=zarr,file"
    nczmap.to_nczarr(dataset, url)
    with xr.open_zarr(tmp_path / "out.zarr", consolidated=False) as got:
        xr.testing.assert_identical(got.load(), dataset)
    with xr.open_dataset(url, engine="nczmap") as got:
        assert got.attrs["names"] == '["p","q"]'  # JSON text in pure Zarr, as netcdf-c reads it
        xr.testing.assert_identical(got.load(), dataset.assign_attrs(names='["p","q"]'))


def test_only_datasets_and_trees_are_written(tmp_path):
    with pytest.raises(NCZError, match="Dataset or DataTree, not DataArray"):
        nczmap.to_nczarr(xr.DataArray([1]), f"file://{tmp_path}/x.file#mode=nczarr,file")


@pytest.mark.filterwarnings("ignore::UserWarning")  # zarr-python's warnings about v3 extensions
def test_zarr_v3_both_ways(dataset, tmp_path):
    nczmap.to_nczarr(dataset, f"file://{tmp_path}/ours.zarr#mode=zarr,v3,file")
    with xr.open_zarr(tmp_path / "ours.zarr", consolidated=False, zarr_format=3) as got:
        xr.testing.assert_identical(got.load(), dataset)
    dataset.to_zarr(tmp_path / "theirs.zarr", zarr_format=3)
    with xr.open_dataset(f"file://{tmp_path}/theirs.zarr#mode=zarr,file", engine="nczmap") as got:
        # a JSON list of strings in pure Zarr is char text, as netcdf-c (4.10 too) reads it
        assert got.attrs.pop("names") == '["p","q"]'
        xr.testing.assert_identical(
            got.load(),
            dataset.drop_attrs(deep=False).assign_attrs(
                {k: v for k, v in dataset.attrs.items() if k != "names"}
            ),
        )


def test_unlimited_dimensions_the_data_was_read_with_are_kept_where_they_can_be(source_nc, tmp_path):
    source = xr.open_dataset(source_nc, engine="netcdf4")
    assert source.encoding["unlimited_dims"] == {"time"}
    for version, unlimited in ((None, {"time"}), ("4.9.0", set())):
        url = f"file://{tmp_path}/{version}.file#mode=nczarr,file"
        nczmap.to_nczarr(source[["packed", "time"]], url, version)
        with xr.open_dataset(url, engine="nczmap") as got:
            assert got.encoding["unlimited_dims"] == unlimited
            xr.testing.assert_identical(got.load(), source[["packed", "time"]].load())


NUMERIC = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f4", "f8"]
# netcdf-c reads NCZarr attributes as C strings: NULs are dropped or refused (see test_xarray_parity.py);
# text is UTF-8, which holds no lone surrogate (refused by name: test_lone_surrogates_are_refused_by_name)
NO_NUL = st.characters(codec="utf-8", exclude_characters="\x00")


@st.composite
def datasets(draw):
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=2))
    dims = [f"d{i}" for i in range(len(sizes))]
    variables, encoding = {}, {}
    for index in range(draw(st.integers(1, 3))):
        rank = draw(st.integers(0, len(dims)))
        shape = tuple(sizes[:rank])
        kind = draw(st.sampled_from([*NUMERIC, "str"]))
        if kind == "str":
            text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)
            values = np.array(draw(st.lists(text, min_size=max(1, int(np.prod(shape))))), dtype=object)
            values = values[: int(np.prod(shape))].reshape(shape).astype(str)
        else:
            values = draw(hnp.arrays(kind, shape))
        name = f"v{index}"
        variables[name] = (
            dims[:rank],
            values,
            {"note": draw(st.text(NO_NUL, max_size=5)), "n": draw(st.integers(-(2**63), 2**64 - 1))},
        )
        if rank and draw(st.booleans()):
            encoding[name] = {"chunksizes": tuple(draw(st.integers(1, s)) for s in shape)}
    # finite: pure Zarr keeps NaN and Infinity attributes as text, as netcdf-c reads them
    attrs = {
        "title": draw(st.text(NO_NUL, max_size=8)),
        "scale": draw(st.floats(allow_nan=False, allow_infinity=False)),
    }
    return xr.Dataset(variables, attrs=attrs), encoding


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(datasets(), st.sampled_from([None, "4.9.1", "4.9.0", "4.8.0", "zarr"]))
def test_any_dataset_round_trips(tmp_path, case, version):
    dataset, encoding = case
    mode = "zarr" if version == "zarr" else "nczarr"
    if mode == "zarr":  # pure Zarr has no scalars (netcdf-c's [1]-shaped "_scalar_" convention)
        dataset = dataset.drop_vars([name for name, v in dataset.variables.items() if not v.dims])
    version = None if version == "zarr" else version
    url = f"file://{tmp_path}/{uuid.uuid4().hex}.file#mode={mode},file"
    nczmap.to_nczarr(dataset, url, version, encoding=encoding)
    with xr.open_dataset(url, engine="nczmap") as got:
        xr.testing.assert_identical(got.load(), dataset)


def test_attribute_values_netcdf_cannot_hold_are_named(dataset, tmp_path):
    url = f"file://{tmp_path}/out.file#mode=nczarr,file"
    for value, message in ((2**64, "does not fit a 64-bit integer"), ([1, "a"], "no netCDF attribute value")):
        dataset.attrs["bad"] = value
        with pytest.raises(EncodingError, match=rf"attribute 'bad': .*{message}"):
            nczmap.to_nczarr(dataset, url)


@pytest.mark.parametrize("value", ["a\ud800", ["ok", "\udfff"], np.array(["x\ud801"])])
def test_lone_surrogates_are_refused_by_name(tmp_path, value):
    url = f"file://{tmp_path}/out.file#mode=nczarr,file"
    dataset = xr.Dataset({"v": (("x",), np.arange(2.0), {"note": value})})
    with pytest.raises(EncodingError, match=r"attribute 'v:note': .*a lone surrogate"):
        nczmap.to_nczarr(dataset, url)
    dataset = xr.Dataset(attrs={"title": value})
    with pytest.raises(EncodingError, match=r"attribute 'title': .*a lone surrogate"):
        nczmap.to_nczarr(dataset, url)


def test_strings_longer_than_the_default_width_get_room(tmp_path):
    dataset = xr.Dataset({"s": (("x",), np.array(["é" * 200, "b"]))})
    url = f"file://{tmp_path}/long.file#mode=nczarr,file"
    nczmap.to_nczarr(dataset, url)
    with xr.open_dataset(url, engine="nczmap") as got:
        xr.testing.assert_identical(got.load(), dataset)
    with netCDF4.Dataset(url) as nc:  # libnetcdf reads the width nczmap declared
        assert nc.variables["s"][0] == "é" * 200
