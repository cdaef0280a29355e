"""Datasets, ncdump, search, dump and copy on the s3 driver, against moto on 127.0.0.1 and real ncdump."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest

import nczmap
from nczmap.integrations.copy import copy


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nczmap", *args], capture_output=True, timeout=120, check=False
    )


@pytest.fixture
def source_nc(tmp_path):
    path = tmp_path / "source.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "s3 test"
        ds.createDimension("x", 3)
        ds.createDimension("y", 4)
        v = ds.createVariable("v", "i4", ("x", "y"), fill_value=-9, chunksizes=(2, 2))
        v.units = "K"
        v[:2, :] = np.arange(8).reshape(2, 4)
        g = ds.createGroup("g")
        g.createVariable("d", "f8", ("y",))[:] = [0.5, 1.5, 2.5, 3.5]
    return path


def test_dataset_round_trip(s3_server):
    url = s3_server.url()
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", 5)
        ds.create_variable("v", ("x",), "f4", data=np.arange(5, dtype="f4"), chunks=(2,))
    with nczmap.open_dataset(url) as ds:
        assert ds.dialect is nczmap.Dialect.NCZARR_ATTRIBUTES
        assert ds.variables["v"][1:4].tolist() == [1.0, 2.0, 3.0]
    with nczmap.open_dataset(url, "a") as ds:
        ds.variables["v"].attrs["units"] = "m"
    with nczmap.open_dataset(url) as ds:
        assert ds.variables["v"].attrs["units"] == "m"


def test_cli_commands_on_s3(s3_server, source_nc):
    url = s3_server.url()
    copied = run("copy", str(source_nc), url)
    assert copied.returncode == 0, copied.stderr
    assert run("search", url).stdout.decode().split() == [".zattrs", ".zgroup", "g", "v"]
    dump = run("dump", "-t", "int", url).stdout.decode()
    assert "/v/0.0 : (4) (int) |0, 1, 4, 5|" in dump  # the chunk (0:2, 0:2) of the CDL-free source above
    header = run("ncdump", "-h", url)
    assert header.returncode == 0 and b"int v(x, y) ;" in header.stdout


@pytest.mark.skipif(shutil.which("ncdump") is None, reason="netcdf-c ncdump not installed")
def test_s3_store_dumps_like_real_ncdump(s3_server, source_nc, tmp_path):
    """source -> s3 (for netcdf-c 4.9.0) -> file: real ncdump of the file store is the expected CDL."""
    url = s3_server.url()
    copy(str(source_nc), url, "4.9.0")
    local = tmp_path / "local.file"
    copy(url, str(local), "4.9.0")
    expected = subprocess.run(
        ["ncdump", "-n", "ds", local.as_uri() + "#mode=nczarr,file"],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    ours = run("ncdump", "-n", "ds", url)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == expected


def test_copy_between_zip_and_s3(s3_server, source_nc, tmp_path):
    archive = tmp_path / "a.zip"
    copy(str(source_nc), str(archive))
    url = s3_server.url()
    copy(str(archive), url)
    back = tmp_path / "back.zip"
    copy(url, str(back))
    with nczmap.open_map(str(archive)) as a, nczmap.open_map(str(back)) as b:
        assert list(a.objects()) == list(b.objects())
        assert all(a.read(key) == b.read(key) for key in a.objects() if not key.endswith(".zattrs"))


def test_missing_bucket_is_never_created(s3_server):
    url = s3_server.url(bucket="absent-bucket")
    with pytest.raises(nczmap.DatasetNotFound, match="absent-bucket"):
        nczmap.create_dataset(url)
    buckets = [b["Name"] for b in s3_server.client().list_buckets()["Buckets"]]
    assert "absent-bucket" not in buckets


CORPUS = sorted((Path(__file__).resolve().parents[1] / "conformance" / "cdl").glob("*.cdl"))
NOT_FOR_NETCDF_4_9_0 = {
    "strings",
    "empty_strings",
    "scalars",
    "unlimited",
    "compressed",
}  # ncgen 4.9.0 cannot write these


def netcdf_c_store(cdl: Path, tmp_path: Path) -> str:
    """The case as real netcdf-c writes it: Debian's ncgen straight to NCZarr, else (for what 4.9.0
    cannot do) an HDF5 file from ncgen."""
    if cdl.stem in NOT_FOR_NETCDF_4_9_0:
        target = tmp_path / "x.nc"
        subprocess.run(
            ["ncgen", "-4", "-o", str(target), str(cdl)], check=True, capture_output=True, timeout=60
        )
        return str(target)
    url = (tmp_path / "x.file").as_uri() + "#mode=nczarr,file"
    subprocess.run(["ncgen", "-4", "-lb", "-o", url, str(cdl)], check=True, capture_output=True, timeout=60)
    return url


@pytest.mark.skipif(shutil.which("ncgen") is None, reason="netcdf-c ncgen not installed")
@pytest.mark.parametrize("cdl", CORPUS, ids=lambda path: path.stem)
def test_conformance_corpus_round_trips_through_s3(s3_server, tmp_path, cdl):
    """Every conformance case (proven against real netcdf-c on the file driver) is stored on S3 object for
    object as on the file driver, and comes back from S3 unchanged."""
    source = netcdf_c_store(cdl, tmp_path)
    local, url, back = tmp_path / "local.file", s3_server.url(), tmp_path / "back.file"
    copy(source, str(local))
    copy(source, url)
    copy(url, str(back))
    with nczmap.open_map(str(local)) as a, nczmap.open_map(url) as s3, nczmap.open_map(str(back)) as b:
        keys = list(a.objects())
        assert list(s3.objects()) == keys == list(b.objects())
        for key in keys:
            assert s3.read(key) == a.read(key) == b.read(key), key


def test_a_missing_prefix_is_not_found_like_a_missing_directory(s3_server, tmp_path):
    with pytest.raises(nczmap.DatasetNotFound):
        nczmap.open_dataset(str(tmp_path / "absent.file"))
    with pytest.raises(nczmap.DatasetNotFound, match="nothing is there"):
        nczmap.open_dataset(s3_server.url())
