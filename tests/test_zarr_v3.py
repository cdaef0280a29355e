"""Zarr v3: stores written by zarr-python 3 and xarray read by nczmap, and nczmap's v3 read by them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nczmap
from nczmap.errors import FormatError, ModeError, NCZError, URLError
from nczmap.format import Dialect

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")
netCDF4 = pytest.importorskip("netCDF4")
codecs = pytest.importorskip("zarr.codecs")

pytestmark = pytest.mark.filterwarnings(
    "ignore::zarr.errors.ZarrUserWarning", "ignore::zarr.errors.UnstableSpecificationWarning"
)


def _group(path, **kwargs):
    return zarr.open_group(str(path), mode="w", zarr_format=3, **kwargs)


def _values(path, name):
    return zarr.open_group(str(path), mode="r")[name][...]


# ============================================================================ reading what zarr writes
CODEC_CASES = {
    "gzip": dict(compressors=[codecs.GzipCodec(level=6)]),
    "zstd": dict(compressors=[codecs.ZstdCodec(level=3, checksum=True)]),
    "blosc": dict(compressors=[codecs.BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")]),
    "crc32c": dict(compressors=[codecs.Crc32cCodec()]),
    "gzip+crc32c": dict(compressors=[codecs.GzipCodec(), codecs.Crc32cCodec()]),
    "big-endian": dict(serializer=codecs.BytesCodec(endian="big"), compressors=None),
    "big-endian+zstd": dict(serializer=codecs.BytesCodec(endian="big"), compressors=[codecs.ZstdCodec()]),
    "raw": dict(compressors=None),
    "transpose-F": dict(filters=[codecs.TransposeCodec(order=(2, 1, 0))], compressors=None),
    "transpose-perm": dict(
        filters=[codecs.TransposeCodec(order=(1, 2, 0))], compressors=[codecs.GzipCodec()]
    ),
    "sharded": dict(shards=(4, 6, 4), compressors=[codecs.ZstdCodec()]),
    "sharded-raw": dict(shards=(4, 6, 4), compressors=None),
    "v2-keys": dict(chunk_key_encoding={"name": "v2", "separator": "."}),
    "v2-keys-slash": dict(chunk_key_encoding={"name": "v2", "separator": "/"}),
    "dot-keys": dict(chunk_key_encoding={"name": "default", "separator": "."}),
}


@pytest.mark.parametrize("dtype", ["i2", "u8", "f4", "f8", "i1", "u1"])
@pytest.mark.parametrize("case", list(CODEC_CASES))
def test_arrays_zarr_writes_read_the_same(tmp_path, case, dtype):
    path = tmp_path / "s.zarr"
    group = _group(path)
    data = (np.arange(5 * 6 * 7) % 120).astype(dtype).reshape(5, 6, 7)
    array = group.create_array(
        "v",
        shape=data.shape,
        chunks=(2, 3, 2),
        dtype=dtype,
        dimension_names=["t", "y", "x"],
        **CODEC_CASES[case],
    )
    array[...] = data
    with nczmap.open_dataset(str(path)) as ds:
        assert ds.dialect is Dialect.ZARR_V3 and not ds.problems
        v = ds.variables["v"]
        assert v.dimensions == ("t", "y", "x") and v.dtype == np.dtype(dtype)
        assert {k: d.size for k, d in ds.dimensions.items()} == {"t": 5, "y": 6, "x": 7}
        np.testing.assert_array_equal(v[...], _values(path, "v"))
        np.testing.assert_array_equal(v[1:4, ::2, 5], _values(path, "v")[1:4, ::2, 5])


def test_bool_string_fixed_width_and_scalar_types(tmp_path):
    path = tmp_path / "s.zarr"
    group = _group(path)
    group.create_array("flag", shape=(3,), dtype=bool, dimension_names=["n"])[...] = [True, False, True]
    group.create_array("words", shape=(3,), dtype=str, dimension_names=["n"])[...] = ["a", "ünï", ""]
    group.create_array("u", shape=(3,), dtype="<U4", dimension_names=["n"])[...] = ["ab", "abcd", "é"]
    group.create_array("b", shape=(3,), dtype="S3", dimension_names=["n"])[...] = [b"ab", b"abc", b""]
    group.create_array("c", shape=(3,), dtype="S1", dimension_names=["n"])[...] = [b"x", b"y", b"z"]
    group.create_array("scalar", shape=(), dtype="f8", fill_value=np.nan)[()] = 2.5
    group.create_array("scalar_v2", shape=(), dtype="i4", chunk_key_encoding={"name": "v2"})[()] = 7
    group.create_array("empty_scalar", shape=(), dtype="f4", fill_value=np.nan)
    with nczmap.open_dataset(str(path)) as ds:
        v = ds.variables
        assert v["flag"].nctype.name == "ubyte" and v["flag"][...].tolist() == [1, 0, 1]
        assert v["words"].nctype.name == "string" and v["words"][...].tolist() == ["a", "ünï", ""]
        assert v["u"].nctype.name == "string" and v["u"][...].tolist() == ["ab", "abcd", "é"]
        assert v["b"].nctype.name == "string" and v["b"][...].tolist() == ["ab", "abc", ""]
        assert v["c"].nctype.name == "char" and v["c"][...].tolist() == [b"x", b"y", b"z"]
        assert v["scalar"].shape == () and v["scalar"][...] == 2.5
        assert v["scalar_v2"][...] == 7
        assert np.isnan(v["empty_scalar"][...]) and np.isnan(v["empty_scalar"].fill_value)


@pytest.mark.parametrize(
    ("fill", "dtype", "check"),
    [
        (np.nan, "f4", np.isnan),
        (np.inf, "f8", lambda x: x == np.inf),
        (-np.inf, "f4", lambda x: x == -np.inf),
        (-7, "i2", lambda x: x == -7),
        (2**64 - 2, "u8", lambda x: x == 2**64 - 2),
    ],
)
def test_missing_chunks_read_as_the_fill_value(tmp_path, fill, dtype, check):
    path = tmp_path / "s.zarr"
    array = _group(path).create_array("v", shape=(6,), chunks=(2,), dtype=dtype, fill_value=fill)
    array[2:4] = 1
    with nczmap.open_dataset(str(path)) as ds:
        values = ds.variables["v"][...]
        assert check(ds.variables["v"].fill_value)
        assert all(check(values[i]) for i in (0, 1, 4, 5)) and values[2] == values[3] == 1


@pytest.mark.parametrize(
    ("spelling", "dtype", "expected"),
    [
        ("0x7fc00000", "float32", "nan"),
        ("0x3ff0000000000000", "float64", 1.0),
        ("-Infinity", "float64", -np.inf),
    ],
)
def test_hex_and_named_float_fill_values(tmp_path, spelling, dtype, expected):
    path = tmp_path / "s.zarr"
    _group(path).create_array("v", shape=(2,), dtype=dtype)
    meta = json.loads((path / "v" / "zarr.json").read_text())
    meta["fill_value"] = spelling
    (path / "v" / "zarr.json").write_text(json.dumps(meta))
    theirs = zarr.open_group(str(path), mode="r")["v"][...]
    with nczmap.open_dataset(str(path)) as ds:
        ours = ds.variables["v"][...]
    np.testing.assert_array_equal(ours, theirs)
    assert np.isnan(ours[0]) if expected == "nan" else ours[0] == expected


@pytest.mark.parametrize("consolidate", [False, True])
def test_nested_groups_and_attributes(tmp_path, consolidate):
    path = tmp_path / "s.zarr"
    root = _group(path)
    root.attrs.update({"title": "nested", "n": 3, "scale": [1.5, 2.5], "flag": True})
    sub = root.create_group("sub")
    sub.attrs["level"] = 1
    deep = sub.create_group("deep")
    deep.create_array("a", shape=(4,), dtype="i4", dimension_names=["x"], attributes={"units": "m"})[...] = 1
    sub.create_array("b", shape=(4, 2), dtype="f8", dimension_names=["x", None])[...] = 2.0
    if consolidate:
        zarr.consolidate_metadata(str(path))
    with nczmap.open_dataset(str(path)) as ds:
        assert ds.consolidated is consolidate
        assert ds.attrs["title"] == "nested" and int(ds.attrs["n"]) == 3
        assert list(ds.attrs["scale"]) == [1.5, 2.5]
        assert ds.groups["sub"].attrs["level"] == 1
        a = ds.groups["sub"].groups["deep"].variables["a"]
        assert a.attrs["units"] == "m" and a.dimensions == ("x",) and a[...].tolist() == [1, 1, 1, 1]
        b = ds.groups["sub"].variables["b"]
        assert b.dimensions == ("x", "_Anonymous_Dim_2") and (b[...] == 2.0).all()


def test_consolidated_metadata_replaces_listing(tmp_path):
    path = tmp_path / "s.zarr"
    root = _group(path)
    root.create_group("g").create_array("a", shape=(2,), dtype="i4")[...] = 5
    zarr.consolidate_metadata(str(path))
    url = nczmap.parse_url(str(path))
    zmap = nczmap.open_map(url)
    listed = []
    original = zmap.search
    zmap.search = lambda prefix="/": listed.append(prefix) or original(prefix)
    from nczmap.api import format_options
    from nczmap.format import open_on

    ds = open_on(zmap, "r", format_options(url))
    assert ds.groups["g"].variables["a"][...].tolist() == [5, 5] and listed == []
    zmap.close()


def test_xarray_v3_store_reads_as_xarray_sees_it(tmp_path):
    path = tmp_path / "x.zarr"
    source = xr.Dataset(
        {
            "temp": (
                ("time", "lat"),
                np.arange(6, dtype="f4").reshape(3, 2),
                {"units": "K", "valid": [0, 10]},
            ),
            "count": (("lat",), np.array([3, 4], dtype="i8")),
            "name": (("time",), np.array(["ab", "c", "déf"], dtype=object)),
        },
        coords={"lat": [1.5, 2.5], "time": [0, 1, 2]},
        attrs={"history": "made by xarray", "version": 2},
    )
    source.to_zarr(path, zarr_format=3, mode="w")
    theirs = xr.open_zarr(path, zarr_format=3, mask_and_scale=False)
    with nczmap.open_dataset(str(path)) as ds:
        assert {k: d.size for k, d in ds.dimensions.items()} == dict(theirs.sizes)
        assert ds.attrs["history"] == theirs.attrs["history"]
        for name, var in theirs.variables.items():
            ours = ds.variables[name]
            assert ours.dimensions == var.dims
            np.testing.assert_array_equal(ours[...], var.values)
        assert ds.variables["temp"].attrs["units"] == "K"
        assert list(ds.variables["temp"].attrs["valid"]) == [0, 10]
        assert np.isnan(ds.variables["temp"].attrs["_FillValue"])  # xarray's base64 double, decoded
        assert ds.variables["temp"].attrs.typed("_FillValue").nctype.name == "float"


# ============================================================================ sharding
def test_reading_one_inner_chunk_reads_the_index_and_that_chunk_only(tmp_path):
    path = tmp_path / "s.zarr"
    array = _group(path).create_array(
        "v", shape=(16, 16), chunks=(4, 4), shards=(8, 8), dtype="f8", compressors=[codecs.GzipCodec()]
    )
    data = np.arange(256.0).reshape(16, 16)
    array[...] = data
    with nczmap.open_dataset(str(path)) as ds:
        zmap = ds.zmap
        calls = []
        original = zmap.read
        zmap.read = lambda key, start=0, count=None: (
            calls.append((key, start, count)) or original(key, start, count)
        )
        assert (ds.variables["v"][9:11, 13] == data[9:11, 13]).all()
        size = (path / "v" / "c" / "1" / "1").stat().st_size
        index_bytes = 4 * 16 + 4
        assert [c[0] for c in calls] == ["/v/c/1/1", "/v/c/1/1"]
        assert calls[0][1:] == (size - index_bytes, index_bytes)
        assert calls[1][2] < size - index_bytes
        np.testing.assert_array_equal(ds.variables["v"][...], data)


@pytest.mark.parametrize("location", ["start", "end"])
def test_shards_with_missing_inner_chunks_and_missing_shards(tmp_path, location):
    path = tmp_path / "s.zarr"
    array = _group(path).create_array(  # the shards are the chunks: sharding is the serializer
        "v",
        shape=(8, 8),
        chunks=(4, 4),
        dtype="i4",
        fill_value=-1,
        serializer=codecs.ShardingCodec(chunk_shape=(2, 2), index_location=location),
        compressors=None,
    )
    array[0:2, 0:2] = 5
    array[6:8, 4:6] = 9
    with nczmap.open_dataset(str(path)) as ds:
        np.testing.assert_array_equal(ds.variables["v"][...], _values(path, "v"))


def test_a_sharded_array_is_not_written(tmp_path):
    path = tmp_path / "s.zarr"
    _group(path).create_array("v", shape=(4,), chunks=(2,), shards=(4,), dtype="i4")
    with nczmap.open_dataset(str(path), "r+") as ds, pytest.raises(FormatError, match="sharded"):
        ds.variables["v"][0] = 1


# ============================================================================ damaged and hostile stores
def test_a_corrupted_crc32c_is_an_error_naming_the_chunk(tmp_path):
    path = tmp_path / "s.zarr"
    _group(path).create_array("v", shape=(4,), dtype="i4", compressors=[codecs.Crc32cCodec()])[...] = 1
    chunk = path / "v" / "c" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[0] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with nczmap.open_dataset(str(path)) as ds, pytest.raises(FormatError, match=r"/v/c/0.*crc32c"):
        ds.variables["v"][...]


def test_a_corrupted_shard_index_checksum_is_an_error(tmp_path):
    path = tmp_path / "s.zarr"
    _group(path).create_array("v", shape=(4,), chunks=(2,), shards=(4,), dtype="i4")[...] = 1
    shard = path / "v" / "c" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with nczmap.open_dataset(str(path)) as ds, pytest.raises(FormatError, match=r"/v/c/0.*crc32c"):
        ds.variables["v"][...]


def _rewrite(path, name, change):
    meta_path = path / name / "zarr.json"
    meta = json.loads(meta_path.read_text())
    change(meta)
    meta_path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m["codecs"].append({"name": "lz5000"}), "codec 'lz5000'"),
        (lambda m: m.update(data_type="complex128"), "complex128"),
        (lambda m: m.update(data_type="float16"), "float16"),
        (lambda m: m.update(chunk_grid={"name": "rectilinear", "configuration": {}}), "rectilinear"),
        (lambda m: m.update(shape="big"), "bad shape"),
        (lambda m: m.update(codecs=[]), "codecs"),
        (lambda m: m.update(codecs=[{"name": "gzip"}]), "array-to-bytes"),
        (lambda m: m.update(fill_value="oops"), "fill_value"),
        (lambda m: m.update(dimension_names=["a", "b"]), "dimension_names"),
        (lambda m: m.update(chunk_key_encoding={"name": "weird"}), "weird"),
        (lambda m: m.update(storage_transformers=[{"name": "x"}]), "storage transformers"),
        (lambda m: m.update(attributes=[1]), "attributes"),
        (lambda m: m["codecs"][0].update(configuration={"endian": "middle"}), "endian"),
    ],
)
def test_arrays_that_cannot_be_read_are_skipped_with_a_warning_naming_them(tmp_path, change, message):
    path = tmp_path / "s.zarr"
    group = _group(path)
    group.create_array("good", shape=(2,), dtype="i4")[...] = 3
    group.create_array("bad", shape=(2,), dtype="i4", compressors=None)[...] = 4
    _rewrite(path, "bad", change)
    with pytest.warns(UserWarning, match="skipping array '/bad'") as caught:
        ds = nczmap.open_dataset(str(path))
    assert any(message in str(w.message) for w in caught)
    assert list(ds.variables) == ["good"] and ds.variables["good"][...].tolist() == [3, 3]
    assert [key for key, _ in ds.problems] == ["/bad"]
    ds.close()


def test_a_root_array_or_a_broken_root_is_a_format_error(tmp_path):
    path = tmp_path / "a.zarr"
    zarr.create_array(str(path), shape=(2,), dtype="i4", zarr_format=3)
    with pytest.raises(FormatError, match="single Zarr v3 array"):
        nczmap.open_dataset(str(path))
    (path / "zarr.json").write_text('{"zarr_format": 3, "node_type": "tree"}')
    with pytest.raises(FormatError, match="node_type"):
        nczmap.open_dataset(str(path))
    (path / "zarr.json").write_text("[1, 2]")
    with pytest.raises(FormatError, match="JSON object"):
        nczmap.open_dataset(str(path))


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_FIELDS = [
    "shape",
    "data_type",
    "chunk_grid",
    "chunk_key_encoding",
    "fill_value",
    "codecs",
    "dimension_names",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from([*_FIELDS, "attributes", "node_type"]), _json, max_size=4), st.data())
def test_fuzzed_array_metadata_gives_only_nczmap_errors(tmp_path_factory, replaced, data):
    path = tmp_path_factory.mktemp("fuzz") / "s.zarr"
    base = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [3, 2],
        "data_type": data.draw(st.sampled_from(["int16", "float32", "string", "bool", "uint64"])),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "attributes": {},
    }
    base.update(replaced)
    (path / "v" / "c" / "0").mkdir(parents=True)
    (path / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    (path / "v" / "zarr.json").write_text(json.dumps(base))
    (path / "v" / "c" / "0" / "0").write_bytes(data.draw(st.binary(max_size=40)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with nczmap.open_dataset(str(path)) as ds:
                for variable in ds.variables.values():
                    variable[...]
        except NCZError:
            pass


# ============================================================================ writing v3
def _write_v3(url, consolidated=False):
    ds = nczmap.create_dataset(url)
    ds.attrs["title"] = "written by nczmap"
    ds.attrs["answer"] = np.int32(42)
    ds.create_dimension("time", 3)
    ds.create_dimension("x", 4)
    temp = ds.create_variable(
        "temp", ("time", "x"), "f4", fill_value=np.nan, chunks=(2, 3), compression="zlib"
    )
    temp[...] = np.arange(12, dtype="f4").reshape(3, 4)
    temp.attrs["units"] = "K"
    ds.create_variable("big", ("x",), "i4", endian="big", compression="zstd")[...] = [1, -2, 3, -4]
    ds.create_variable("packed", ("x",), "u2", compression="blosc", fill_value=7)[:2] = [10, 20]
    ds.create_variable("shuffled", ("x",), "f8", shuffle=True, compression="zlib")[...] = [0.5, 1, 2, 4]
    ds.create_variable("name", ("x",), str)[...] = ["a", "bb", "ccc", "ünï"]
    ds.create_variable("letter", ("x",), "S1")[...] = np.array([b"w", b"x", b"y", b"z"])
    ds.create_variable("scalar", (), "f8")[...] = 6.25
    sub = ds.create_group("sub")
    sub.attrs["level"] = "one"
    sub.create_variable("depth", ("time",), "i8")[...] = [1, 2, 3]
    ds.close()


@pytest.mark.parametrize("consolidated", [False, True])
def test_nczmap_v3_opens_in_zarr_python(tmp_path, consolidated):
    path = tmp_path / "out.zarr"
    _write_v3(f"file://{path}#mode=zarr,v3" + (",consolidated" if consolidated else ""))
    root = json.loads((path / "zarr.json").read_text())
    assert root["zarr_format"] == 3 and ("consolidated_metadata" in root) is consolidated
    assert not (path / ".zgroup").exists() and not (path / ".zmetadata").exists()
    group = zarr.open_group(str(path), mode="r", zarr_format=3, use_consolidated=consolidated or None)
    assert group.attrs["title"] == "written by nczmap" and group.attrs["answer"] == 42
    temp = group["temp"]
    assert temp.metadata.dimension_names == ("time", "x") and temp.attrs["units"] == "K"
    np.testing.assert_array_equal(temp[...], np.arange(12, dtype="f4").reshape(3, 4))
    assert group["big"].dtype == np.dtype("i4") and group["big"][...].tolist() == [1, -2, 3, -4]
    endian = group["big"].metadata.codecs[0].endian
    assert getattr(endian, "value", endian) == "big"  # an enum before zarr 3.4, a str since
    assert group["packed"][...].tolist() == [10, 20, 7, 7]
    assert group["shuffled"][...].tolist() == [0.5, 1, 2, 4]
    assert list(group["name"][...]) == ["a", "bb", "ccc", "ünï"]
    assert group["letter"][...].tolist() == [b"w", b"x", b"y", b"z"]
    assert group["scalar"][()] == 6.25 and group["scalar"].shape == ()
    assert group["sub"].attrs["level"] == "one" and group["sub/depth"][...].tolist() == [1, 2, 3]


def test_nczmap_v3_opens_in_xarray(tmp_path):
    path = tmp_path / "out.zarr"
    _write_v3(f"file://{path}#mode=xarray,v3,consolidated")
    for theirs in (
        xr.open_zarr(path, zarr_format=3),
        xr.open_dataset(path, engine="zarr"),
    ):
        assert dict(theirs.sizes) == {"time": 3, "x": 4}
        assert theirs.attrs["title"] == "written by nczmap"
        temp = theirs["temp"]
        assert temp.dims == ("time", "x") and temp.attrs["units"] == "K"
        np.testing.assert_array_equal(temp.values, np.arange(12, dtype="f4").reshape(3, 4))
        assert theirs["name"].values.tolist() == ["a", "bb", "ccc", "ünï"]
        assert float(theirs["scalar"]) == 6.25
    sub = xr.open_zarr(path, group="sub", zarr_format=3)
    assert sub.attrs["level"] == "one" and sub["depth"].values.tolist() == [1, 2, 3]


def test_nczmap_reads_its_own_v3_back(tmp_path):
    path = tmp_path / "out.zarr"
    _write_v3(f"file://{path}#mode=zarr,v3")
    with nczmap.open_dataset(str(path)) as ds:
        assert ds.dialect is Dialect.ZARR_V3 and ds.dialect.code == "PZ3"
        assert ds.variables["temp"].dimensions == ("time", "x")
        assert np.isnan(ds.variables["temp"].attrs["_FillValue"])
        assert ds.variables["name"][...].tolist() == ["a", "bb", "ccc", "ünï"]
        assert ds.variables["letter"].nctype.name == "char"
        assert ds.groups["sub"].variables["depth"][...].tolist() == [1, 2, 3]
    with nczmap.open_dataset(str(path), "r+") as ds:  # updates keep it Zarr v3
        ds.variables["big"][1] = 99
        ds.variables["name"][0] = "changed"
        ds.attrs["more"] = "yes"
    group = zarr.open_group(str(path), mode="r")
    assert group["big"][...].tolist() == [1, 99, 3, -4] and group["name"][0] == "changed"
    assert group.attrs["more"] == "yes"


def test_updating_a_zarr_written_store_keeps_its_codecs_and_keys(tmp_path):
    path = tmp_path / "s.zarr"
    group = _group(path)
    group.create_array(
        "v",
        shape=(4, 3),
        chunks=(2, 3),
        dtype="i2",
        serializer=codecs.BytesCodec(endian="big"),
        filters=[codecs.TransposeCodec(order=(1, 0))],
        compressors=[codecs.GzipCodec(), codecs.Crc32cCodec()],
        chunk_key_encoding={"name": "v2", "separator": "."},
    )[...] = 1
    before = json.loads((path / "v" / "zarr.json").read_text())
    with nczmap.open_dataset(str(path), "r+") as ds:
        ds.variables["v"][1:3, :] = np.arange(6).reshape(2, 3)
        ds.variables["v"].attrs["note"] = "updated"
    after = json.loads((path / "v" / "zarr.json").read_text())
    assert after["codecs"] == before["codecs"] and after["chunk_key_encoding"] == before["chunk_key_encoding"]
    expected = np.ones((4, 3), dtype="i2")
    expected[1:3] = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(_values(path, "v"), expected)
    assert zarr.open_group(str(path), mode="r")["v"].attrs["note"] == "updated"


# ============================================================================ URLs
def test_v3_mode_words():
    assert nczmap.parse_url("/d/x.zarr#mode=zarr,v3").zarr_format == 3
    assert nczmap.parse_url("/d/x.zarr#mode=xarray,v3").zarr_format == 3
    assert nczmap.parse_url("/d/x.zarr#mode=zarr").zarr_format == 2
    for bad in ("/d/x#mode=nczarr,v3", "/d/x#mode=v3", "/d/x#mode=zarr,v2,v3"):
        with pytest.raises(URLError, match="v3"):
            nczmap.parse_url(bad)
    with pytest.raises(ModeError, match="pure Zarr"):
        nczmap.format.FormatOptions(zarr_format=3)


def test_a_v2_store_opened_with_v3_words_stays_v2(tmp_path):
    path = tmp_path / "v2.zarr"
    nczmap.create_dataset(f"file://{path}#mode=zarr").close()
    with nczmap.open_dataset(f"file://{path}#mode=zarr,v3", "r+") as ds:
        ds.attrs["x"] = 1
        assert ds.dialect is Dialect.PURE_ZARR
    assert (path / ".zattrs").exists() and not (path / "zarr.json").exists()


# ============================================================================ CLI: ncdump and copy
def _same_data_as_netcdf(tmp_path):
    """The same dataset as a Zarr v3 store (zarr-python) and a netCDF-4 file (netCDF4-python)."""
    temp = (np.arange(12, dtype="f4") / 4).reshape(3, 4)
    temp[0, 0] = np.nan
    counts = np.array([1, -2, 300, -400], dtype="i2")
    names = ["a", "bb", "c", "dé"]  # an empty one prints NIL, as in every NCZarr store (see nczmap.cdl)
    store = tmp_path / "same.zarr"
    root = _group(store)
    root.attrs.update({"title": "same", "version": 3, "ratio": 0.25})
    t = root.create_array("temp", shape=(3, 4), chunks=(2, 2), dtype="f4", dimension_names=["time", "x"])
    t.attrs.update({"units": "K"})
    t[...] = temp
    c = root.create_array(
        "counts", shape=(4,), dtype="i2", dimension_names=["x"], serializer=codecs.BytesCodec(endian="big")
    )
    c[...] = counts
    root.create_array("names", shape=(4,), dtype=str, dimension_names=["x"])[...] = names
    root.create_array("scalar", shape=(), dtype="f8")[()] = 1.5
    sub = root.create_group("sub")
    sub.attrs["level"] = "deep"
    sub.create_array("depth", shape=(3,), dtype="i8", dimension_names=["time"])[...] = [10, 20, 30]
    nc = tmp_path / "same.nc"
    with netCDF4.Dataset(nc, "w") as ds:
        ds.setncatts({"title": "same", "version": np.int32(3), "ratio": 0.25})
        ds.createDimension("x", 4)
        ds.createDimension("time", 3)
        ds.createVariable("counts", ">i2", ("x",), fill_value=False, endian="big")[...] = counts
        ds.createVariable("names", str, ("x",))[...] = np.array(names, dtype=object)
        ds.createVariable("scalar", "f8", (), fill_value=False)[...] = 1.5
        v = ds.createVariable("temp", "f4", ("time", "x"), fill_value=False)
        v.units = "K"
        v[...] = temp
        g = ds.createGroup("sub")
        g.level = "deep"
        g.createDimension("time", 3)  # dimension_names name dimensions of the array's own group
        g.createVariable("depth", "i8", ("time",), fill_value=False)[...] = [10, 20, 30]
    return store, nc


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "nczmap", *args], capture_output=True, check=True).stdout


@pytest.mark.skipif(
    shutil.which("ncdump") is None, reason="netcdf-c's ncdump (Debian netcdf-bin) is not installed"
)
def test_ncdump_of_a_v3_store_equals_ncdump_of_the_same_netcdf_file(tmp_path):
    store, nc = _same_data_as_netcdf(tmp_path)
    theirs = subprocess.run(["ncdump", str(nc)], capture_output=True, check=True).stdout
    assert _cli("ncdump", str(store)) == theirs
    theirs_header = subprocess.run(["ncdump", "-h", str(nc)], capture_output=True, check=True).stdout
    assert _cli("ncdump", "-h", str(store)) == theirs_header


def test_dump_shows_the_v3_key_tree(tmp_path):
    store, _ = _same_data_as_netcdf(tmp_path)
    out = _cli("dump", str(store)).decode()
    assert "/zarr.json" in out and "/temp/c/0/0" in out


@pytest.mark.parametrize("consolidated", ["", ",consolidated"])
def test_copy_v3_to_nczarr_and_back(tmp_path, consolidated):
    store, _ = _same_data_as_netcdf(tmp_path)
    sharded = zarr.open_group(str(store), mode="a")
    sharded.create_array(
        "tiles", shape=(4, 4), chunks=(2, 2), shards=(4, 4), dtype="u2", dimension_names=["x", "y"]
    )[...] = np.arange(16).reshape(4, 4)
    nczarr = tmp_path / "copy.file"
    back = tmp_path / "back.zarr"
    _cli("copy", str(store), str(nczarr))
    _cli("copy", str(nczarr), f"file://{back}#mode=zarr,v3{consolidated}")
    with nczmap.open_dataset(str(nczarr)) as ds:
        assert ds.dialect is Dialect.NCZARR_ATTRIBUTES
    assert _cli("ncdump", str(back)).replace(b"netcdf back", b"netcdf same") == _cli("ncdump", str(store))
    theirs = zarr.open_group(str(back), mode="r")
    np.testing.assert_array_equal(theirs["tiles"][...], np.arange(16).reshape(4, 4))
    assert list(theirs["names"][...]) == ["a", "bb", "c", "dé"]
    np.testing.assert_array_equal(theirs["counts"][...], [1, -2, 300, -400])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_copying_long_vlen_strings_into_nczarr_widens_them(tmp_path):
    zarr = pytest.importorskip("zarr")
    from nczmap.integrations.copy import copy

    values = np.array(["é" * 150, "short", ""])
    group = zarr.open_group(str(tmp_path / "v3.zarr"), mode="w", zarr_format=3)
    group.create_array("s", shape=(3,), dtype=str, dimension_names=["x"])[:] = values
    copy(f"file://{tmp_path}/v3.zarr#mode=zarr,file", f"file://{tmp_path}/out.file#mode=nczarr,file")
    with nczmap.open_dataset(f"file://{tmp_path}/out.file#mode=nczarr,file") as ds:
        assert ds.variables["s"][...].tolist() == values.tolist()
