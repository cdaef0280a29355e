"""``nczmap virtualize`` of netCDF-3 files end to end: the manifest dumps as real ncdump dumps the source.

Expected output comes from Debian's ``ncdump`` (netcdf-bin) of the source itself, and values from
netCDF4-python; the comparison is the one tests/test_virtualize.py makes for netCDF-4 sources.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from test_virtualize import manifest_url, nczmap_command, run

import nczmap

netCDF4 = pytest.importorskip("netCDF4")

from nczmap.integrations.virtualize import virtualize  # noqa: E402

NCDUMP = shutil.which("ncdump")
FORMATS = ["NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET", "NETCDF3_64BIT_DATA"]
CLASSIC_TYPES = ["i1", "i2", "i4", "f4", "f8"]
CDF5_TYPES = [*CLASSIC_TYPES, "u1", "u2", "u4", "i8", "u8"]


def write_source(path: Path, fmt: str, records: int = 3) -> None:
    """Fixed, record and scalar variables of every type of the format, char arrays, with and without
    _FillValue, records partly left to the fill, attributes of every type."""
    rng = np.random.default_rng(7)
    types = CDF5_TYPES if fmt == "NETCDF3_64BIT_DATA" else CLASSIC_TYPES
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("time", None)
        ds.createDimension("x", 3)
        ds.createDimension("n", 4)
        ds.title = "netCDF-3 end to end"
        ds.empty = ""
        for letter in types:
            ds.setncattr(f"a_{letter}", np.arange(3, dtype=letter))
        time = ds.createVariable("time", "f8", ("time",))
        time.units = "hours since 2000-01-01"
        time[:] = np.arange(records)
        for letter in types:
            fixed = ds.createVariable(f"fixed_{letter}", letter, ("x",))
            fixed[:] = np.arange(3, dtype=letter) + 1
            rec = ds.createVariable(
                f"rec_{letter}", letter, ("time", "x"), fill_value=np.dtype(letter).type(7)
            )
            rec.setncattr("valid", np.array([0, 100], dtype=letter))
            if records:
                rec[: records - 1, :2] = rng.integers(0, 100, (records - 1, 2)).astype(letter)
            ds.createVariable(f"scalar_{letter}", letter, ()).assignValue(np.dtype(letter).type(42))
        names = ds.createVariable("names", "S1", ("x", "n"))
        names[:] = netCDF4.stringtochar(np.array(["ab", "cde", "f"], dtype="S4"))
        ds.createVariable("unwritten", "i2", ("x",))


def write_one_record_variable(path: Path, fmt: str) -> None:
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("time", None)
        ds.createDimension("x", 3)
        ds.createVariable("v", "i1", ("time", "x"))[:] = np.arange(15, dtype="i1").reshape(5, 3)


@pytest.fixture(params=FORMATS)
def fmt(request):
    return request.param


@pytest.mark.parametrize("writer", [write_source, write_one_record_variable])
def test_the_manifest_dumps_as_ncdump_dumps_the_source(tmp_path, fmt, writer):
    if NCDUMP is None:
        pytest.skip("netcdf-c ncdump not on PATH")
    source = tmp_path / f"{fmt.lower()}.nc"
    writer(source, fmt)
    refs = tmp_path / "refs.json"
    result = virtualize([source], refs)
    assert not result.refused
    listing = nczmap_command("ncdump", "-n", source.stem, manifest_url(refs))
    assert listing.returncode == 0, listing.stderr
    expected = run(NCDUMP, source)
    assert expected.startswith(f"netcdf {source.stem} {{".encode())
    assert listing.stdout.decode(errors="replace") == expected.decode(errors="replace")


def test_a_file_without_records_dumps_as_ncdump_dumps_it(tmp_path, fmt):
    if NCDUMP is None:
        pytest.skip("netcdf-c ncdump not on PATH")
    source = tmp_path / "norecords.nc"
    write_source(source, fmt, records=0)
    refs = tmp_path / "refs.json"
    virtualize([source], refs)
    listing = nczmap_command("ncdump", "-n", source.stem, manifest_url(refs))
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.decode(errors="replace") == run(NCDUMP, source).decode(errors="replace")


def test_values_through_the_manifest_equal_netcdf4_python(tmp_path, fmt):
    source = tmp_path / "values.nc"
    write_source(source, fmt)
    refs = tmp_path / "refs.json"
    virtualize([source], refs)
    with netCDF4.Dataset(source) as theirs, nczmap.open_dataset(manifest_url(refs)) as ours:
        theirs.set_auto_maskandscale(False)
        theirs.set_auto_chartostring(False)
        assert list(ours.variables) == list(theirs.variables)
        for name, variable in theirs.variables.items():
            want = np.asarray(variable[...])
            got = ours.variables[name][...]
            assert got.shape == want.shape and got.dtype == want.dtype, name
            assert np.array_equal(got, want), name
