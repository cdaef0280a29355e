"""Big-endian variables as netcdf-c 4.8.0-4.9.2 wrote them: ``>`` in ``.zarray``, host-order chunk bytes.

netcdf-c only byte-swaps NCZarr chunks from 4.9.3 on (commit df3636b95: ``#define TRANSFERN`` turns on the
swapping copy in ``libnczarr/zwalk.c``; earlier releases copy with ``memcpy``/``nc_copy_data``). Stores are
written by real Debian ``ncgen`` 4.9.0, by libnetcdf 4.10.1 (netCDF4-python) and by zarr-python, and read
back by nczmap; ``nczmap ncdump`` is compared byte for byte with real ``ncdump`` 4.9.0.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nczmap
from nczmap.format.dialects import Dialect, host_order_release

NCGEN, NCDUMP = shutil.which("ncgen"), shutil.which("ncdump")

# name -> (CDL type, struct letter, _Endianness, values); every value differs when its bytes are swapped
VARIABLES = {
    "s": ("short", "h", "big", [-1, 2, 300, -32000]),
    "i": ("int", "i", "big", [1, -2, 70000, 2147483647]),
    "f": ("float", "f", "big", [1.5, -2.5, 1e30, 0.25]),
    "d": ("double", "d", "big", [1.25, -0.2, 1e300, -7.5]),
    "l": ("int64", "q", "big", [1, -2, 9000000000, -9000000000000000000]),
    "little": ("int", "i", "little", [7, 8, 9, -70000]),
    "b": ("byte", "b", "big", [1, -2, 3, 127]),
}
BIG = ["s", "i", "f", "d", "l"]  # multi-byte big-endian: the ones 4.9.0 wrote in host order
# a 2-d variable in 2x2 chunks over 3x4: whole chunks (read straight into the output) and padded edge chunks
GRID = np.arange(12, dtype="f8").reshape(3, 4) * 1.5 - 4


def cdl_number(value: float) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def cdl() -> str:
    lines = ["netcdf ds {", "dimensions:", "\tn = 4 ;", "\ty = 3 ;", "\tx = 4 ;", "variables:"]
    for name, (cdl_type, _, endian, _) in VARIABLES.items():
        lines += [f"\t{cdl_type} {name}(n) ;", f'\t\t{name}:_Endianness = "{endian}" ;']
    lines += ["\tdouble grid(y, x) ;", '\t\tgrid:_Endianness = "big" ;', "\t\tgrid:_ChunkSizes = 2, 2 ;"]
    lines.append("data:")
    for name, (_, _, _, values) in VARIABLES.items():
        lines.append(f" {name} = {', '.join(cdl_number(v) for v in values)} ;")
    lines.append(f" grid = {', '.join(cdl_number(float(v)) for v in GRID.ravel())} ;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def run(*command: object) -> bytes:
    done = subprocess.run([str(c) for c in command], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


def zjson(store: Path, key: str) -> dict:
    return json.loads((store / key).read_text())


def ncgen_store(folder: Path, mode: str = "nczarr") -> tuple[Path, str]:
    """The CDL above compiled by real ncgen into an NCZarr (or pure Zarr) directory store."""
    if NCGEN is None or NCDUMP is None:
        pytest.skip("netcdf-c ncgen/ncdump not on PATH")
    source = folder / "ds.cdl"
    source.write_text(cdl())
    store = folder / "ds.file"
    url = f"{store.as_uri()}#mode={mode},file"
    run(NCGEN, "-4", "-lb", "-o", url, source)
    release = host_order_release(zjson(store, ".zattrs").get("_NCProperties"))
    if release is None:
        pytest.skip(f"ncgen on PATH is not netcdf-c 4.8.0-4.9.2: {zjson(store, '.zattrs')}")
    return store, url


@pytest.fixture(scope="module")
def store_4_9_0(tmp_path_factory) -> tuple[Path, str]:
    return ncgen_store(tmp_path_factory.mktemp("ncgen"))


def test_ncgen_4_9_0_writes_big_endian_variables_in_host_order(store_4_9_0):
    """The precondition, read off disk: '>' declared, little-endian bytes (nczarr-format.md bug 18)."""
    store, _ = store_4_9_0
    assert zjson(store, ".zattrs")["_NCProperties"].startswith("version=2,netcdf=4.")
    for name, (_, letter, endian, values) in VARIABLES.items():
        assert zjson(store, f"{name}/.zarray")["dtype"][0] == (">" if endian == "big" else "<"), name
        assert (store / name / "0").read_bytes() == struct.pack(f"<{len(values)}{letter}", *values), name
    assert zjson(store, "grid/.zarray")["dtype"] == ">f8"
    assert (store / "grid" / "0.0").read_bytes() == GRID[:2, :2].astype("<f8").tobytes()


def test_values_of_a_4_9_0_store_are_the_cdl_values(store_4_9_0):
    _, url = store_4_9_0
    with nczmap.open_dataset(url) as ds:
        assert ds.problems == []
        for name, (_, letter, _, values) in VARIABLES.items():
            variable = ds.variables[name]
            expected = np.array(values, dtype=np.dtype(letter))
            np.testing.assert_array_equal(variable[...], expected, err_msg=name)
            np.testing.assert_array_equal(variable[1:3], expected[1:3], err_msg=name)
            np.testing.assert_array_equal(variable[::-2], expected[::-2], err_msg=name)
            assert variable[3] == expected[3], name
        grid = ds.variables["grid"]
        np.testing.assert_array_equal(grid[...], GRID)  # whole 2x2 chunks and padded edge chunks
        np.testing.assert_array_equal(grid[:2, :], GRID[:2, :])  # whole chunks read straight into the output
        np.testing.assert_array_equal(grid[1:, ::3], GRID[1:, ::3])
        assert grid.dtype == np.dtype("f8")


@pytest.mark.parametrize("flags", [(), ("-s",), ("-h",), ("-s", "-h")], ids=["plain", "s", "h", "s-h"])
def test_nczmap_ncdump_equals_real_ncdump_4_9_0(store_4_9_0, flags):
    """Values as 4.9.0 reads them, and ``_Endianness = "big"`` still shown by ``-s``."""
    _, url = store_4_9_0
    expected = run(NCDUMP, *flags, url)
    assert run(sys.executable, "-m", "nczmap", "ncdump", *flags, url) == expected
    if "-s" in flags:
        assert b'\t\td:_Endianness = "big" ;\n' in expected
        assert b'\t\tlittle:_Endianness = "little" ;\n' in expected


def test_the_notes_name_each_reinterpreted_variable_and_the_release(store_4_9_0):
    store, url = store_4_9_0
    release = host_order_release(zjson(store, ".zattrs")["_NCProperties"])
    with nczmap.open_dataset(url) as ds:
        assert ds.problems == []  # every array was read: problems stays for arrays that were not
        notes = dict(ds.notes)
        assert sorted(notes) == sorted(f"/{name}" for name in [*BIG, "grid"])  # not b (1 byte), not little
        for key, message in notes.items():
            assert f"netcdf-c {release} " in message, message
            assert repr(ds.variables[key[1:]].layout.dtype.spec) in message
            assert "host" in message and "4.9.3" in message


def test_ncgen_pure_zarr_mode_store_is_read_as_4_9_0_reads_it(tmp_path):
    """``mode=zarr``: no NCZarr metadata, but ``_NCProperties`` is there and the bytes are the same."""
    store, url = ncgen_store(tmp_path, "zarr")
    assert (store / "d" / "0").read_bytes() == struct.pack("<4d", *VARIABLES["d"][3])
    with nczmap.open_dataset(url) as ds:
        assert ds.dialect is Dialect.PURE_ZARR
        np.testing.assert_array_equal(ds.variables["d"][...], VARIABLES["d"][3])
        assert "/d" in dict(ds.notes)
    assert run(sys.executable, "-m", "nczmap", "ncdump", url) == run(NCDUMP, url)


def test_libnetcdf_4_10_1_big_endian_store_is_read_as_declared(tmp_path):
    netCDF4 = pytest.importorskip("netCDF4")
    url = f"{(tmp_path / 'nc4.file').as_uri()}#mode=nczarr,file"
    written = {name: VARIABLES[name] for name in [*BIG, "little"]}
    with netCDF4.Dataset(url, "w") as ds:
        ds.createDimension("n", 4)
        for name, (_, letter, endian, values) in written.items():
            dtype = np.dtype(letter).newbyteorder(">" if endian == "big" else "<")
            ds.createVariable(name, dtype, ("n",), endian=endian)[:] = values
    store = tmp_path / "nc4.file"
    provenance = zjson(store, ".zattrs")["_NCProperties"]
    assert host_order_release(provenance) is None, provenance  # 4.9.3 or later
    for name in BIG:  # correct: big-endian bytes
        _, letter, _, values = written[name]
        assert zjson(store, f"{name}/.zarray")["dtype"][0] == ">"
        assert (store / name / "0").read_bytes() == struct.pack(f">4{letter}", *values), name
    with nczmap.open_dataset(url) as ds:
        assert ds.problems == [] and ds.notes == []
        for name, (_, letter, _, values) in written.items():
            np.testing.assert_array_equal(ds.variables[name][...], np.array(values, np.dtype(letter)), name)


def test_zarr_python_big_endian_store_without_ncproperties_is_read_as_declared(tmp_path):
    zarr = pytest.importorskip("zarr")
    path = tmp_path / "zp.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    values = np.array([1.25, -0.2, 1e300, 4.0, 5.0])
    group.create_array("d", shape=(5,), dtype=">f8", chunks=(2,), compressors=None)[:] = values
    group.create_array("s", shape=(3,), dtype=">i2", chunks=(3,), compressors=None)[:] = [-1, 2, 300]
    assert "_NCProperties" not in zjson(path, ".zattrs")
    assert (path / "d" / "0").read_bytes() == values[:2].astype(">f8").tobytes()
    with nczmap.open_dataset(str(path)) as ds:
        assert ds.provenance is None and ds.notes == [] and ds.problems == []
        np.testing.assert_array_equal(ds.variables["d"][...], values)
        np.testing.assert_array_equal(ds.variables["d"][1:4], values[1:4])
        np.testing.assert_array_equal(ds.variables["s"][...], [-1, 2, 300])


def _relabelled_copy(store: Path, folder: Path, provenance: str | None) -> Path:
    """The ncgen store with another (or no) ``_NCProperties``: only the label decides."""
    copy = folder / f"{provenance or 'none'}.file"
    shutil.copytree(store, copy)
    zattrs = zjson(copy, ".zattrs")
    if provenance is None:
        del zattrs["_NCProperties"]
    else:
        zattrs["_NCProperties"] = provenance
    (copy / ".zattrs").write_text(json.dumps(zattrs))
    return copy


@pytest.mark.parametrize(
    "provenance, reinterpreted",
    [
        ("version=2,netcdf=4.8.0,nczarr=1.0.0", True),
        ("version=2,netcdf=4.8.1,nczarr=2.0.0", True),
        ("version=2,netcdf=4.9.1-rc1,nczarr=2.0.0", True),
        ("version=2,netcdf=4.9.2,nczarr=2.0.0", True),
        ("version=2,netcdf=4.9.3,nczarr=2.0.0", False),
        ("version=2,netcdf=4.9.3-rc1,nczarr=2.0.0", False),
        ("version=2,netcdf=4.9.3-development,nczarr=2.0.0", False),
        ("version=2,netcdf=4.10.1,nczarr=2.0.0", False),
        ("version=2,nczmap=0.1.0,nczarr=2.0.0", False),
        (None, False),
    ],
)
def test_only_the_ncproperties_of_an_affected_release_reinterpret(
    store_4_9_0, tmp_path, provenance, reinterpreted
):
    store, _ = store_4_9_0
    copy = _relabelled_copy(store, tmp_path, provenance)
    host = np.array(VARIABLES["d"][3])
    with nczmap.open_dataset(f"{copy.as_uri()}#mode=nczarr,file") as ds:
        got = ds.variables["d"][...]
        assert ds.problems == []
        if reinterpreted:
            np.testing.assert_array_equal(got, host)
            assert "/d" in dict(ds.notes)
        else:  # read as declared: the host-order bytes as big-endian
            np.testing.assert_array_equal(got, host.astype("<f8").view(">f8"))
            assert ds.notes == []


def test_host_order_release_reads_the_netcdf_entry():
    assert host_order_release("version=2,netcdf=4.9.0,nczarr=2.0.0") == "4.9.0"
    assert host_order_release("version=2,netcdf=4.8.0,hdf5=1.12.1") == "4.8.0"
    assert host_order_release("version=2, netcdf=4.9.2 ,nczarr=2.0.0") == "4.9.2"
    for other in (None, "", "garbage", "version=2,netcdf=4.7.4,nczarr=2.0.0", "version=2,netcdf=x.y"):
        assert host_order_release(other) is None, other


def test_nczmap_writes_big_endian_little_endian_for_every_affected_release(tmp_path):
    """Written for 4.8.0-4.9.2 a big-endian variable is stored '<' (those releases read '>' wrongly); for
    4.9.3 and later '>' with big-endian bytes. nczmap's own stores are never reinterpreted."""
    values = np.array([1.25, -0.2, 1e300])
    for version, order in (("4.8.0", "<"), ("4.9.0", "<"), ("4.9.2", "<"), ("4.9.3", ">"), (None, ">")):
        path = tmp_path / f"{version}.file"
        with nczmap.create_dataset(str(path), version) as ds:
            ds.create_dimension("n", 3)
            ds.create_variable("d", ("n",), "f8", endian="big")[...] = values
        assert zjson(path, "d/.zarray")["dtype"] == order + "f8", version
        assert (path / "d" / "0").read_bytes() == values.astype(order + "f8").tobytes(), version
        with nczmap.open_dataset(str(path)) as ds:
            assert ds.notes == []
            np.testing.assert_array_equal(ds.variables["d"][...], values)


def test_updating_a_store_of_an_affected_release_keeps_its_values(tmp_path):
    """A rewritten root keeps the store's _NCProperties, so its chunks are still read in host order."""
    _, url = ncgen_store(tmp_path)
    with nczmap.open_dataset(url) as before:
        expected = {name: v[...].tolist() for name, v in before.variables.items()}
        provenance = before.provenance
    with nczmap.open_dataset(url, "r+") as ds:
        ds.attrs["history"] = "touched by nczmap"
        first = next(name for name, v in ds.variables.items() if v.layout.dtype.host_order)
        ds.variables[first][0] = ds.variables[first][0]
    with nczmap.open_dataset(url) as after:
        assert after.provenance == provenance
        assert {name: v[...].tolist() for name, v in after.variables.items()} == expected
