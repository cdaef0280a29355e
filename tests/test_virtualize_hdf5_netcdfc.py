"""HDF5 that no netCDF library wrote (h5py's, as HDF-EOS5 and ICESat-2 products are), virtualized as netCDF-C
reads it: fixed-length strings, soft and external links, dimension scales attached on some axes only.

Expected output comes from netCDF-C: Debian's ``ncdump`` (4.9.0) for the CDL, netCDF4-python (its own
libnetcdf, 4.10) for values and dimensions. ncdump 4.9.0 reads arrays of fixed-length strings wrongly
(``NIL`` for all but the first value, or a crash), and crashes on datasets whose first axis has a scale
and another none: there, only netCDF4-python is compared.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nczmap

h5py = pytest.importorskip("h5py")
netCDF4 = pytest.importorskip("netCDF4")
xr = pytest.importorskip("xarray")

from nczmap.integrations.virtualize import virtualize  # noqa: E402
from nczmap.integrations.virtualize.hdf5 import LINKED_BYTES  # noqa: E402

NCDUMP = shutil.which("ncdump")
TIMEOUT = 120
needs_ncdump = pytest.mark.skipif(NCDUMP is None, reason="netcdf-c ncdump (Debian netcdf-bin) not on PATH")


def manifest_url(path: Path) -> str:
    return f"file://{path}#mode=nczarr,manifest"


def fixed_type(size: int, *, utf8: bool = False, space: bool = False):
    """An HDF5 fixed-length string type of ``size`` bytes, NUL- or space-padded, ASCII or UTF-8."""
    kind = h5py.h5t.C_S1.copy()
    kind.set_size(size)
    kind.set_strpad(h5py.h5t.STR_SPACEPAD if space else h5py.h5t.STR_NULLPAD)
    if utf8:
        kind.set_cset(h5py.h5t.CSET_UTF8)
    return kind


def _space(values: np.ndarray):
    return h5py.h5s.create(h5py.h5s.SCALAR) if values.ndim == 0 else h5py.h5s.create_simple(values.shape)


def string_dataset(group, name: str, values, kind, chunks: tuple[int, ...] | None = None) -> None:
    """A fixed-length string dataset holding ``values`` (bytes) exactly, in its own type's padding."""
    raw = np.array(values, dtype=f"S{kind.get_size()}")
    plist = None
    if chunks:
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_chunk(chunks)
    dataset = h5py.h5d.create(group.id, name.encode(), kind, _space(raw), dcpl=plist)
    dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, raw, mtype=kind)


def string_attribute(item, name: str, values, kind) -> None:
    raw = np.array(values, dtype=f"S{kind.get_size()}")
    attribute = h5py.h5a.create(item.id, name.encode(), kind, _space(raw))
    attribute.write(raw, mtype=kind)


def ncdump(*args: str | Path) -> str:
    done = subprocess.run([NCDUMP, *map(str, args)], capture_output=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode("utf-8", "surrogateescape")


def nczmap_ncdump(refs: Path, name: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "nczmap", "ncdump", "-n", name, *args, manifest_url(refs)],
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode("utf-8", "surrogateescape")


def netcdf4_variables(path: Path) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """Every variable's dimension names and values as netCDF4-python reads them (no masking)."""
    found = {}
    with netCDF4.Dataset(path) as source:
        source.set_auto_maskandscale(False)
        source.set_auto_chartostring(False)
        groups = [source]
        while groups:
            group = groups.pop()
            groups.extend(group.groups.values())
            for name, variable in group.variables.items():
                key = group.path.rstrip("/") + "/" + name
                found[key] = (variable.dimensions, np.asarray(variable[...]))
    return found


def assert_variables_as_netcdf4_reads(refs: Path, source: Path) -> None:
    """The manifest's variables: the names, dimensions and values netCDF4-python reads in ``source``."""
    expected = netcdf4_variables(source)
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        got = {}
        for group in ds.walk():
            for name, variable in group.variables.items():
                got[group.path.rstrip("/") + "/" + name] = variable
        assert sorted(got) == sorted(expected)
        for key, (dims, values) in expected.items():
            assert got[key].dimensions == dims, key
            ours = np.asarray(got[key][...])
            assert ours.shape == values.shape, key
            assert ours.tolist() == values.tolist(), key


def dimensions_as_netcdf4_reads(path: Path) -> dict[str, dict[str, tuple[int, bool]]]:
    found = {}
    with netCDF4.Dataset(path) as source:
        groups = [source]
        while groups:
            group = groups.pop()
            groups.extend(group.groups.values())
            found[group.path] = {n: (len(d), d.isunlimited()) for n, d in group.dimensions.items()}
    return found


def dimensions_of_manifest(refs: Path) -> dict[str, dict[str, tuple[int, bool]]]:
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        return {g.path: {n: (d.size, d.unlimited) for n, d in g.dimensions.items()} for g in ds.walk()}


# ------------------------------------------------------------------------------- fixed-length strings
def write_granule_strings(path: Path) -> None:
    """Strings as HDF-EOS5 and ICESat-2 products keep them: StructMetadata.0 a scalar fixed-length string,
    ancillary strings NUL- and space-padded, ASCII and UTF-8, chunked, 2-D; a one-byte char array."""
    with h5py.File(path, "w") as raw:
        info = raw.create_group("HDFEOS INFORMATION")
        string_dataset(
            info, "StructMetadata.0", b'GROUP=SwathStructure\n\tSwathName="L2"\nEND\n', fixed_type(80)
        )
        ancillary = raw.create_group("ancillary_data")
        string_dataset(ancillary, "atlas_sdp_gps_epoch_units", b"seconds since 1980-01-06", fixed_type(32))
        string_dataset(ancillary, "release", [b"006", b"05", b""], fixed_type(3))
        string_dataset(ancillary, "padded", [b"ab    ", b"cdefgh", b"      "], fixed_type(6, space=True))
        string_dataset(ancillary, "utf8", ["é".encode(), "Zürich".encode(), b"x"], fixed_type(8, utf8=True))
        string_dataset(ancillary, "cut", [b"ab\x00cd", b"abcdef"], fixed_type(6))
        string_dataset(ancillary, "grid", [[b"a", b"bb"], [b"ccc", b"dddd"]], fixed_type(4), chunks=(1, 2))
        string_dataset(ancillary, "flags", [b"y", b"n", b"y"], fixed_type(1))


@needs_ncdump
def test_fixed_length_string_datasets_are_nc_string_variables_with_netcdf_cs_values(tmp_path):
    source = tmp_path / "granule.h5"
    write_granule_strings(source)
    refs = tmp_path / "refs.json"
    result = virtualize([source], refs)
    assert result.refused == []
    strings = {"release", "padded", "utf8", "cut", "grid", "atlas_sdp_gps_epoch_units"}
    assert set(result.loaded) == {f"/ancillary_data/{n}" for n in strings} | {
        "/HDFEOS INFORMATION/StructMetadata.0"
    }
    assert nczmap_ncdump(refs, "granule", "-h") == ncdump("-h", source)
    # a scalar one ncdump 4.9.0 reads right: the whole CDL with its data
    assert nczmap_ncdump(refs, "granule", "-v", "StructMetadata.0") == ncdump(
        "-v", "StructMetadata.0", source
    )
    assert_variables_as_netcdf4_reads(refs, source)
    with netCDF4.Dataset(source) as theirs, xr.open_dataset(manifest_url(refs), engine="nczmap") as ours:
        assert theirs["HDFEOS INFORMATION"]["StructMetadata.0"].dtype is str
        assert theirs["ancillary_data"]["padded"][...].tolist() == ["ab    ", "cdefgh", "      "]
        assert theirs["ancillary_data"]["cut"][...].tolist() == ["ab", "abcdef"]
    with (
        xr.open_dataset(manifest_url(refs), engine="nczmap", group="ancillary_data") as ours,
        netCDF4.Dataset(source) as theirs,
    ):
        for name in ("release", "padded", "utf8", "cut", "grid"):
            assert ours[name].values.tolist() == theirs["ancillary_data"][name][...].tolist(), name


def write_string_attributes(path: Path) -> None:
    """Fixed-length string attributes of the root, a group and a variable, created in name order (netCDF-C
    lists h5py's attributes in creation order, nczmap in name order: the same here)."""
    with h5py.File(path, "w") as raw:
        for item in (
            raw,
            raw.create_group("METADATA"),
            raw.create_dataset("v", data=np.arange(3, dtype="i2")),
        ):
            string_attribute(item, "a_ascii", b"Level 2 product", fixed_type(24))
            string_attribute(item, "b_utf8", "Zürich".encode(), fixed_type(12, utf8=True))
            string_attribute(item, "c_spaces", b"ab      ", fixed_type(8, space=True))
            string_attribute(item, "d_exact", b"exact", fixed_type(5))
            string_attribute(item, "e_empty", b"", fixed_type(4))
            string_attribute(item, "f_nul_inside", b"ab\x00cd", fixed_type(8))
            string_attribute(item, "g_list", [b"ab", b"cde"], fixed_type(4))
            string_attribute(item, "h_list_full", [b"abcd", b"efgh"], fixed_type(4))
            string_attribute(item, "i_list_spaces", [b"ab  ", b"c   "], fixed_type(4, space=True))
            string_attribute(item, "j_one", [b"alone"], fixed_type(8))
            string_attribute(item, "k_chars", [b"y", b"n"], fixed_type(1))
            string_attribute(item, "l_utf8_list", ["é".encode(), b"x"], fixed_type(4, utf8=True))


def netcdf4_attributes(item) -> dict[str, object]:
    return {name: item.getncattr(name) for name in item.ncattrs()}


@needs_ncdump
def test_fixed_length_string_attributes_are_text_or_strings_as_netcdf_c_reads_them(tmp_path):
    """A scalar one is char text of all its bytes (ncdump stops at the trailing NULs, netCDF4-python drops
    every NUL); an array is NC_STRING, each value up to its first NUL, padding spaces kept."""
    source = tmp_path / "attributes.h5"
    write_string_attributes(source)
    refs = tmp_path / "refs.json"
    assert virtualize([source], refs).refused == []
    assert nczmap_ncdump(refs, "attributes", "-h") == ncdump("-h", source)
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        assert ds.attrs.typed("a_ascii").nctype.name == "char"
        assert ds.attrs["a_ascii"] == "Level 2 product" + "\x00" * 9  # nc_inq_attlen: all 24 bytes
        assert ds.attrs.typed("k_chars").nctype.name == "string"
    with netCDF4.Dataset(source) as theirs:
        expected = {
            "/": netcdf4_attributes(theirs),
            "METADATA": netcdf4_attributes(theirs["METADATA"]),
            "v": netcdf4_attributes(theirs["v"]),
        }
    assert expected["/"]["c_spaces"] == "ab      " and expected["/"]["f_nul_inside"] == "abcd"
    assert expected["/"]["g_list"] == ["ab", "cde"] and expected["/"]["j_one"] == "alone"
    with xr.open_dataset(manifest_url(refs), engine="nczmap") as ours:
        assert ours.attrs == expected["/"]
        assert ours["v"].attrs == expected["v"]
    with xr.open_dataset(manifest_url(refs), engine="nczmap", group="METADATA") as ours:
        assert ours.attrs == expected["METADATA"]


# ------------------------------------------------------------------------------------------------ links
def write_linked(folder: Path) -> Path:
    """A file of soft links (to a chunked dataset, a group, a dimension scale) and external links (to
    datasets and a group of a file beside it, one chunked and compressed); ncdump reads it whole."""
    with h5py.File(folder / "ancillary.h5", "w") as other:
        other.create_dataset(
            "gain", data=np.arange(6, dtype="f4").reshape(2, 3), chunks=(1, 3), compression="gzip"
        )
        other.create_dataset("offsets", data=np.arange(4, dtype="i4"))
        calibration = other.create_group("calibration")
        calibration.create_dataset("table", data=np.arange(5, dtype="i2"))
        calibration.attrs["title"] = "calibration"
    path = folder / "linked.h5"
    with h5py.File(path, "w") as raw:
        raw.create_dataset("temp", data=np.arange(48, dtype="f8").reshape(3, 16), chunks=(1, 16))
        raw["x"] = np.arange(4, dtype="f4")
        raw["x"].make_scale("x")
        raw["v"] = np.arange(4, dtype="f4") * 2
        raw["v"].dims[0].attach_scale(raw["x"])
        raw["a_alias"] = h5py.SoftLink("/x")  # a second name for the scale: netCDF-C's first dimension
        raw["soft_temp"] = h5py.SoftLink("/temp")
        raw["relative"] = h5py.SoftLink("temp")
        beam = raw.create_group("gt1l")
        beam.create_dataset("h_ph", data=np.arange(3, dtype="i4"))
        raw["soft_beam"] = h5py.SoftLink("/gt1l")
        raw["ext_gain"] = h5py.ExternalLink("ancillary.h5", "/gain")
        raw["ext_offsets"] = h5py.ExternalLink("ancillary.h5", "/offsets")
        raw["ext_calibration"] = h5py.ExternalLink("ancillary.h5", "/calibration")
    return path


@needs_ncdump
def test_soft_and_external_links_are_followed_as_netcdf_c_follows_them(tmp_path):
    source = write_linked(tmp_path)
    refs = tmp_path / "refs.json"
    result = virtualize([source], refs)
    assert result.refused == []
    # another file's data is loaded; a soft link's is referenced, as its target's is
    assert sorted(result.loaded) == ["/ext_calibration/table", "/ext_gain", "/ext_offsets"]
    assert nczmap_ncdump(refs, "linked") == ncdump(source)
    assert_variables_as_netcdf4_reads(refs, source)
    with xr.open_dataset(manifest_url(refs), engine="nczmap", group="ext_calibration") as ours:
        assert ours.attrs == {"title": "calibration"}
    import json

    references = json.loads(refs.read_text())["refs"]
    for key in ("temp/0.0", "temp/2.0"):
        assert references[key] == references["soft_" + key] == references["relative/" + key.split("/")[1]]
        assert references[key][0] == source.as_uri()
    assert not any(key.startswith("ext_") and isinstance(v, list) for key, v in references.items())


def test_links_leading_nowhere_or_round_are_refused_by_name(tmp_path):
    """ncdump cannot open such a file (a dangling link) or never ends (a loop): the link is left out,
    saying where it leads and why, and the rest virtualized."""
    with h5py.File(tmp_path / "ancillary.h5", "w") as other:
        other.create_dataset("gain", data=np.arange(3, dtype="f4"))
    source = tmp_path / "broken.h5"
    with h5py.File(source, "w") as raw:
        raw.create_dataset("temp", data=np.arange(4, dtype="f8"))
        raw["dangling"] = h5py.SoftLink("/nowhere")
        raw["no_file"] = h5py.ExternalLink("missing.h5", "/gain")
        raw["no_object"] = h5py.ExternalLink("ancillary.h5", "/nothing")
        raw["not_hdf5"] = h5py.ExternalLink("notes.txt", "/gain")
        group = raw.create_group("g")
        group["loop"] = h5py.SoftLink("/g")
        raw["ping"] = h5py.SoftLink("/pong")
        raw["pong"] = h5py.SoftLink("/ping")
    (tmp_path / "notes.txt").write_text("not HDF5\n" * 100)
    refs = tmp_path / "refs.json"
    with pytest.warns(Warning):
        result = virtualize([source], refs)
    reasons = {refusal.variable: refusal.reason for refusal in result.refused}
    assert sorted(reasons) == [
        "/dangling",
        "/g/loop",
        "/no_file",
        "/no_object",
        "/not_hdf5",
        "/ping",
        "/pong",
    ]
    assert "soft link to /nowhere" in reasons["/dangling"] and "no object /nowhere" in reasons["/dangling"]
    assert "missing.h5" in reasons["/no_file"] and "does not exist" in reasons["/no_file"]
    assert "no object /nothing" in reasons["/no_object"] and "ancillary.h5" in reasons["/no_object"]
    assert "notes.txt" in reasons["/not_hdf5"] and "cannot be read as HDF5" in reasons["/not_hdf5"]
    assert "/g" in reasons["/g/loop"] and "never end" in reasons["/g/loop"]
    assert "loop" in reasons["/ping"]
    assert all(refusal.source == str(source) for refusal in result.refused)
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        assert list(ds.variables) == ["temp"] and list(ds.groups) == ["g"]
        assert ds.variables["temp"][...].tolist() == [0, 1, 2, 3]


def test_external_data_too_large_to_load_is_refused_naming_its_file(tmp_path):
    count = LINKED_BYTES // 4 + 1
    with h5py.File(tmp_path / "big.h5", "w") as other:
        other.create_dataset("zeros", shape=(count,), dtype="f4", chunks=(1 << 20,), compression="gzip")
        other.create_dataset("small", data=np.arange(5, dtype="i8"))
    source = tmp_path / "links.h5"
    with h5py.File(source, "w") as raw:
        raw["zeros"] = h5py.ExternalLink("big.h5", "/zeros")
        raw["small"] = h5py.ExternalLink(str(tmp_path / "big.h5"), "/small")  # an absolute name
    refs = tmp_path / "refs.json"
    with pytest.warns(Warning):
        result = virtualize([source], refs)
    [refusal] = result.refused
    assert refusal.variable == "/zeros"
    assert str(tmp_path / "big.h5") in refusal.reason and "external link" in refusal.reason
    assert str(count * 4) in refusal.reason
    assert result.loaded == ["/small"]
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        assert ds.variables["small"][...].tolist() == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------------------ partly attached scales
def write_partly_attached(path: Path) -> None:
    """Datasets with scales on some axes; axis 0 never has one (netCDF-C then takes the dataset for a
    plain one, its other axes' scales not looked at, the way ncdump 4.9.0 and netCDF4-python agree on)."""
    with h5py.File(path, "w") as raw:
        for name, size in (("a", 4), ("x", 4), ("y", 3)):
            raw[name] = np.arange(size, dtype="f4")
            raw[name].make_scale(name)
        raw["u"] = np.zeros((3, 4, 3), "i2")
        raw["u"].dims[1].attach_scale(raw["x"])
        raw["v"] = np.ones((5, 4), "f4")  # its axis 1 has x, netCDF-C names it a (the first of length 4)
        raw["v"].dims[1].attach_scale(raw["x"])
        raw["w"] = np.full((4, 4), 2, "f4")
        raw["w"].dims[1].attach_scale(raw["x"])
        raw.create_dataset("z", shape=(2, 3), maxshape=(None, 3), dtype="f8")
        raw["z"].dims[1].attach_scale(raw["y"])


@needs_ncdump
def test_axes_without_scales_get_netcdf_cs_phony_dimensions(tmp_path):
    source = tmp_path / "partly.h5"
    write_partly_attached(source)
    refs = tmp_path / "refs.json"
    assert virtualize([source], refs).refused == []
    assert nczmap_ncdump(refs, "partly") == ncdump(source)
    assert dimensions_of_manifest(refs) == dimensions_as_netcdf4_reads(source)
    assert_variables_as_netcdf4_reads(refs, source)
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        assert ds.variables["v"].dimensions == ("phony_dim_4", "a")
        assert ds.dimensions["phony_dim_5"].unlimited


def test_a_first_axis_with_a_scale_and_others_without_get_the_scale_and_phony_dimensions(tmp_path):
    """netCDF-C reads uninitialized memory for the axes without a scale of such a dataset: ncdump 4.9.0
    stops ("Invalid dimension ID"), netCDF4-python (4.10) crashes or gives some axes a dimension of
    another length, from one run to the next. The manifest gives the scale to its axis and the others the
    plain rule's dimension (the group's of that length that the dataset does not use yet, else a new
    phony one), as netCDF4-python does when it gets through; the values are h5py's."""
    source = tmp_path / "first.h5"
    with h5py.File(source, "w") as raw:
        for name, size in (("x", 4), ("y", 3)):
            raw[name] = np.arange(size, dtype="f4")
            raw[name].make_scale(name)
        raw["a"] = np.zeros((4,), "f4")  # plain: the dimension of its length, x
        raw["c"] = np.zeros((2,), "f4")
        raw["v"] = np.arange(12, dtype="f4").reshape(3, 4)
        raw["v"].dims[0].attach_scale(raw["y"])
        raw["w"] = np.arange(8, dtype="i4").reshape(4, 2)
        raw["w"].dims[0].attach_scale(raw["x"])
    refs = tmp_path / "refs.json"
    assert virtualize([source], refs).refused == []
    with nczmap.open_dataset(manifest_url(refs)) as ours, h5py.File(source, "r") as raw:
        assert {n: d.size for n, d in ours.dimensions.items()} == {"x": 4, "y": 3, "phony_dim_2": 2}
        dims = {name: variable.dimensions for name, variable in ours.variables.items()}
        assert dims == {
            "a": ("x",),
            "c": ("phony_dim_2",),
            "v": ("y", "x"),
            "w": ("x", "phony_dim_2"),
            "x": ("x",),
            "y": ("y",),
        }
        for name, variable in ours.variables.items():
            assert np.array_equal(variable[...], raw[name][...]), name


def test_a_scale_of_another_length_than_its_axis_is_refused_saying_so(tmp_path):
    source = tmp_path / "mismatch.h5"
    with h5py.File(source, "w") as raw:
        raw["x"] = np.arange(5, dtype="f4")
        raw["x"].make_scale("x")
        raw["v"] = np.zeros((3, 2), "f4")
        raw["v"].dims[0].attach_scale(raw["x"])
    refs = tmp_path / "refs.json"
    with pytest.warns(Warning):
        result = virtualize([source], refs)
    [refusal] = result.refused
    assert refusal.variable == "/v"
    assert refusal.reason == "the dimension scale /x attached to its axis 0 has 5 values, the axis 3"
