"""``nczmap copy``: netCDF-4 files and stores to file, zip and pure-Zarr stores, read by netCDF4-python."""

from __future__ import annotations

import subprocess
import sys

import netCDF4
import numpy as np
import pytest

import nczmap
from nczmap.integrations.copy import copy


@pytest.fixture
def source_nc(tmp_path):
    """A netCDF-4 file written by netCDF4-python: the oracle every copy is compared with."""
    path = tmp_path / "source.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "copy test"
        ds.setncattr("count", np.int64(2**40))
        ds.createDimension("x", 4)
        ds.createDimension("y", 3)
        ds.createDimension("t", None)
        v = ds.createVariable(
            "v", "i4", ("x", "y"), fill_value=-1, zlib=True, shuffle=True, chunksizes=(2, 3)
        )
        v.units = "m"
        v[:2, :] = np.arange(6).reshape(2, 3)
        f = ds.createVariable("f", np.dtype(">f4"), ("t",), endian="big")
        f[0:3] = [1.5, np.nan, -2.25]
        ds.createVariable("c", "S1", ("y",))[:] = np.array([b"a", b"b", b"c"])
        ds.createVariable("s", str, ("x",))[:] = np.array(["a", "bb", "ccc", "dddd"], dtype=object)
        ds.createVariable("scalar", "f8", ())[...] = 3.25
        g = ds.createGroup("g")
        g.createDimension("z", 2)
        g.createVariable("w", "u8", ("z", "y"))[:] = np.arange(6, dtype="u8").reshape(2, 3) * 2**40
    return path


def snapshot(url: str) -> dict:
    """Everything libnetcdf 4.10 reports about a dataset: the comparison oracle."""
    result = {}
    with netCDF4.Dataset(url) as ds:
        for group in _walk(ds):
            group.set_auto_maskandscale(False)
            result[group.path] = {
                "attrs": {a: _plain(group.getncattr(a)) for a in group.ncattrs()},
                "dims": {n: (len(d), d.isunlimited()) for n, d in group.dimensions.items()},
                "vars": {
                    n: (
                        str(v.dtype),
                        v.dimensions,
                        {a: _plain(v.getncattr(a)) for a in v.ncattrs()},
                        _plain(v[...]),
                    )
                    for n, v in group.variables.items()
                },
            }
    return result


def _walk(group):
    yield group
    for child in group.groups.values():
        yield from _walk(child)


def _plain(value):
    if isinstance(value, np.ndarray):
        values = np.asarray(value).tolist()
        if value.dtype.kind == "f":
            values = np.where(np.isnan(value), "NaN", value.astype(str)).tolist()  # NaN == NaN here
        return (value.dtype.str if value.dtype != object else "O", values)
    if isinstance(value, np.generic):
        return (value.dtype.str, value.item())
    return value


@pytest.mark.parametrize("suffix", ["file", "zip"])
def test_netcdf4_file_to_store(source_nc, tmp_path, suffix):
    destination = tmp_path / f"out.{suffix}"
    copy(str(source_nc), str(destination))
    if suffix == "zip":  # libnetcdf here has no zip support: unpack it with nczmap's zip reading
        copy(str(destination), str(tmp_path / "unzipped.file"))
        destination = tmp_path / "unzipped.file"
    url = destination.as_uri() + "#mode=nczarr,file"
    expected, actual = snapshot(str(source_nc)), snapshot(url)
    assert actual == expected


def test_store_to_store_copies_chunk_bytes_and_keeps_missing_chunks(source_nc, tmp_path):
    first = tmp_path / "first.file"
    copy(str(source_nc), str(first))
    second = tmp_path / "second.zip"
    copy(str(first), str(second))
    with nczmap.open_map(str(first), "r") as a, nczmap.open_map(str(second), "r") as b:
        assert list(a.objects("/v")) == ["/v/.zarray", "/v/.zattrs", "/v/0.0"]  # chunk 1.0 never written
        assert list(b.objects("/v")) == list(a.objects("/v"))
        assert b.read("/v/0.0") == a.read("/v/0.0")


def test_pure_zarr_destination(source_nc, tmp_path):
    url = (tmp_path / "pz.file").as_uri() + "#mode=zarr,file"
    copy(str(source_nc), url)
    with netCDF4.Dataset(url) as ds:
        assert ds.variables["v"][:2, :].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert ds.variables["v"].dimensions == ("x", "y")
    with nczmap.open_dataset(url) as ds:
        assert ds.dialect is nczmap.Dialect.PURE_ZARR


def test_netcdf_version_selects_the_dialect(tmp_path):
    for version, dialect in (
        ("4.9.0", "nczarr-4.8.1"),
        ("4.9.2", "nczarr-4.9.1"),
        ("4.8.0", "nczarr-4.8.0"),
        (None, "nczarr-4.9.3"),
    ):
        destination = tmp_path / f"v{version}.file"
        with nczmap.open_dataset(str(tmp_path / "plain.file"), "w") as plain:
            plain.create_dimension("x", 2)
            plain.create_variable("v", ("x",), "i2", data=[1, 2])
        copy(str(tmp_path / "plain.file"), str(destination), version)
        with nczmap.open_dataset(str(destination)) as ds:
            assert ds.dialect == dialect
            assert ds.variables["v"][:].tolist() == [1, 2]


def test_cli_copy_and_errors(source_nc, tmp_path):
    run = [sys.executable, "-m", "nczmap", "copy"]
    ok = subprocess.run([*run, str(source_nc), str(tmp_path / "cli.zip")], capture_output=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "cli.zip").exists()
    missing = subprocess.run(
        [*run, str(tmp_path / "absent.file"), str(tmp_path / "x.zip")], capture_output=True, timeout=120
    )
    assert missing.returncode == 1 and b"absent.file" in missing.stderr
    assert not (tmp_path / "x.zip").exists()


def _snapshot(url: str) -> dict[str, bytes]:
    with nczmap.open_map(url) as zmap:
        return {key: zmap.read(key) for key in zmap.objects()}


@pytest.fixture
def directory_store(tmp_path):
    path = tmp_path / "data.file"
    with nczmap.create_dataset(str(path)) as ds:
        ds.create_dimension("x", 4)
        ds.create_variable("v", ("x",), "i4", chunks=(2,), data=[1, 2, 3, 4])
    (tmp_path / "link.file").symlink_to(path)
    return path


@pytest.mark.parametrize(
    "spell_destination",
    [
        lambda p: str(p),
        lambda p: p.as_uri() + "#mode=nczarr,file",
        lambda p: f"{p.parent}/./{p.name}/",
        lambda p: f"{p.parent}/sub/../{p.name}",
        lambda p: str(p.parent / "link.file"),
        lambda p: str(p / "inner.file"),
        lambda p: str(p.parent),
        lambda p: str(p / "v" / "copy.zip"),
    ],
    ids=["same", "file-url", "dot", "dotdot", "symlink", "inside", "around", "zip-inside"],
)
def test_copy_onto_its_own_source_is_refused(directory_store, spell_destination):
    before = _snapshot(str(directory_store))
    destination = spell_destination(directory_store)
    with pytest.raises(nczmap.DatasetExists, match=r"refusing to copy .* the destination"):
        copy(str(directory_store), destination)
    assert _snapshot(str(directory_store)) == before


def test_copy_onto_itself_from_the_command_line_exits_nonzero(directory_store):
    before = _snapshot(str(directory_store))
    spelled = directory_store.as_uri() + "#mode=nczarr,file"
    result = subprocess.run(
        [sys.executable, "-m", "nczmap", "copy", str(directory_store), spelled],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "refusing to copy" in result.stderr
    assert _snapshot(str(directory_store)) == before


def test_zip_copied_onto_itself_is_refused(tmp_path, directory_store):
    archive = tmp_path / "data.zip"
    copy(str(directory_store), str(archive))
    before = archive.read_bytes()
    with pytest.raises(nczmap.DatasetExists):
        copy(str(archive), archive.as_uri() + "#mode=nczarr,zip")
    assert archive.read_bytes() == before


def test_sibling_with_a_common_name_prefix_is_not_an_overlap(directory_store):
    copy(str(directory_store), str(directory_store) + "2")
    assert _snapshot(str(directory_store) + "2") == _snapshot(str(directory_store))
