"""``nczmap copy``: netCDF-4 files and stores to file, zip and pure-Zarr stores, read by netCDF4-python."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
import warnings

import netCDF4
import numpy as np
import pytest
from test_file_driver import run_python

import nczmap
from nczmap.format.writer import UnfilteredWarning
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


# ---------------------------------------------------------------------------- a copy is whole or absent
def make_store(path, chunks: int, seed: int, chunk_length: int = 1024) -> None:
    """A directory store of one int32 variable in ``chunks`` chunks (written directly: fast to make)."""
    with nczmap.create_dataset(str(path)) as ds:
        ds.create_dimension("x", chunks * chunk_length)
        ds.create_variable("v", ("x",), "i4", chunks=(chunk_length,)).attrs["seed"] = seed
    values = np.random.default_rng(seed).integers(0, 2**31, chunks * chunk_length, dtype="<i4")
    for index in range(chunks):
        chunk = values[index * chunk_length : (index + 1) * chunk_length]
        (path / "v" / str(index)).write_bytes(chunk.tobytes())


def objects_of(path) -> dict[str, bytes]:
    """Every object of a store, key -> bytes."""
    return _snapshot(str(path))


@pytest.fixture(scope="module")
def big_source(tmp_path_factory):
    """2000 chunks (8 MiB): copying them takes about a second, long enough to be killed half way."""
    path = tmp_path_factory.mktemp("big") / "big.file"
    make_store(path, chunks=2000, seed=7)
    return path


def _copy_process(source, destination) -> subprocess.Popen:
    command = [sys.executable, "-m", "nczmap", "copy", str(source), str(destination)]
    return subprocess.Popen(command, stderr=subprocess.PIPE)


def _directory_state(directory) -> object:
    """What is in a directory, with modification times: it changes when a copy starts writing there."""
    try:
        with os.scandir(directory) as entries:
            return sorted((entry.name, entry.stat(follow_symlinks=False).st_mtime_ns) for entry in entries)
    except FileNotFoundError:
        return None if not os.path.exists(directory) else object()  # an entry went while being looked at


def _start_copy(source, destination) -> subprocess.Popen:
    """A copy process, returned once it has begun writing beside or into ``destination`` (at most 10 s)."""
    before = _directory_state(destination.parent)
    process = _copy_process(source, destination)
    deadline = time.monotonic() + 10
    while _directory_state(destination.parent) == before and process.poll() is None:
        assert time.monotonic() < deadline, "the copy never started"
        time.sleep(0.002)
    return process


def _copy_duration(source, destination) -> float:
    """Seconds a copy runs here once it has begun writing: the span to kill copies in."""
    process = _start_copy(source, destination)
    started = time.monotonic()
    assert process.wait(timeout=120) == 0, process.communicate()[1]
    process.communicate()
    return time.monotonic() - started


def _state(destination) -> dict[str, bytes] | None:
    """The destination's objects, or None when there is no dataset (and nczmap says so)."""
    if not destination.exists():
        with pytest.raises(nczmap.NCZError):
            nczmap.open_dataset(str(destination)).close()
        return None
    return objects_of(destination)


@pytest.mark.parametrize("suffix", ["file", "zip"])
def test_a_killed_copy_leaves_the_destination_as_it_was_and_the_next_copy_completes(
    tmp_path, big_source, directory_store, suffix
):
    rng = random.Random(f"kill a copy into a {suffix}")  # seeded: the same kill moments every run
    parent = tmp_path / "out"
    destination = parent / f"out.{suffix}"
    expected = objects_of(big_source)
    span = min(1.5, _copy_duration(big_source, tmp_path / "timing" / destination.name))  # bounded test time
    for round_number in range(4):
        # the first two rounds start with no dataset there, the last two with another dataset to replace
        if round_number < 2:
            if suffix == "file":
                shutil.rmtree(destination, ignore_errors=True)
            else:
                destination.unlink(missing_ok=True)
            before = None
        else:
            copy(str(directory_store), str(destination))
            before = objects_of(destination)
        process = _start_copy(big_source, destination)
        time.sleep(rng.uniform(0, span))
        process.kill()
        process.communicate()
        state = _state(destination)
        assert state in (before, expected), f"round {round_number}: a partial copy is visible"
    done = subprocess.run(
        [sys.executable, "-m", "nczmap", "copy", str(big_source), str(destination)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert objects_of(destination) == expected
    assert os.listdir(parent) == [destination.name]  # staging, commit and lock files of the dead are gone


def test_a_copy_that_died_between_its_two_renames_gets_the_old_dataset_back(tmp_path, directory_store):
    destination = tmp_path / "out" / "out.file"
    copy(str(directory_store), str(destination))
    before = objects_of(destination)
    # A process dies holding the lock where a copy replacing a store is most fragile: the old store moved
    # aside, the new one (here half built) not yet moved in.
    died = run_python(
        f"""
        import os
        from nczmap.zmap import locking
        lock = locking.acquire({str(destination)!r})
        os.mkdir(locking.sibling_path(lock.dataset, "copy"))
        os.rename(lock.dataset, locking.sibling_path(lock.dataset, "old"))
        os._exit(0)
        """
    )
    assert died.returncode == 0, died.stderr
    assert not destination.exists()
    with nczmap.open_map(str(destination), "a"):  # the next writer puts the old store back
        pass
    assert objects_of(destination) == before
    assert os.listdir(destination.parent) == ["out.file"]


@pytest.fixture
def compressed_nc(tmp_path):
    path = tmp_path / "compressed.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", 50)
        v = ds.createVariable("v", "f8", ("x",), zlib=True, shuffle=True, chunksizes=(10,))
        v[:] = np.linspace(0, 1, 50)
        ds.createVariable("plain", "i2", ("x",))[:] = np.arange(50)
    return path


@pytest.mark.skipif(
    shutil.which("ncdump") is None, reason="netcdf-c's ncdump (Debian netcdf-bin) is not installed"
)
def test_copies_for_4_9_0_drop_filters_it_cannot_decode_so_its_ncdump_prints_the_values(
    tmp_path, compressed_nc
):
    destination = tmp_path / "for-4.9.0.file"
    with pytest.warns(UnfilteredWarning, match=r"/v: .*4\.8\.1-4\.9\.0.*\(shuffle, zlib\).*--keep-filters"):
        copy(str(compressed_nc), str(destination), "4.9.0")
    zarray = json.loads((destination / "v" / ".zarray").read_text())
    assert zarray["compressor"] is None and not zarray["filters"]
    ours = subprocess.run(
        ["ncdump", "-v", "v", f"file://{destination}#mode=nczarr,file"], capture_output=True
    )
    theirs = subprocess.run(["ncdump", "-v", "v", str(compressed_nc)], capture_output=True)
    assert ours.returncode == 0 and theirs.returncode == 0
    assert ours.stdout.split(b"data:")[1] == theirs.stdout.split(b"data:")[1]


def test_keep_filters_keeps_them_for_builds_with_the_plugins(tmp_path, compressed_nc):
    destination = tmp_path / "kept.file"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnfilteredWarning)
        copy(str(compressed_nc), str(destination), "4.9.0", keep_filters=True)
        copy(str(compressed_nc), str(tmp_path / "default.file"))  # 4.9.3 and later decode them
    assert json.loads((destination / "v" / ".zarray").read_text())["compressor"]["id"] == "zlib"
    with nczmap.open_dataset(str(destination)) as ds:
        assert np.array_equal(ds.variables["v"][...], np.linspace(0, 1, 50))


def test_big_endian_variables_keep_the_default_fill_value(tmp_path):
    """netCDF4-python gives a big-endian variable's default fill byte-swapped; a copy has the true one."""
    source = tmp_path / "big.nc"
    with netCDF4.Dataset(source, "w") as ds:
        ds.createDimension("x", 2)
        ds.createVariable("d", "f8", ("x",), endian="big")[:] = [1.5, 2.5]
        ds.createVariable("i", "i4", ("x",), endian="big")[:] = [1, 2]
    copy(str(source), f"file://{tmp_path}/big.file#mode=nczarr,file")
    for name, expected in (("d", netCDF4.default_fillvals["f8"]), ("i", netCDF4.default_fillvals["i4"])):
        assert json.loads((tmp_path / "big.file" / name / ".zarray").read_text())["fill_value"] == expected


@pytest.mark.parametrize("target", ["out.file#mode=nczarr,file", "out.zip#mode=nczarr,zip"])
def test_a_source_with_an_array_that_cannot_be_read_is_refused_and_nothing_written(tmp_path, target):
    """Reading skips such an array with a warning; a copy without it would lose it (the source deleted
    afterwards): the copy is refused by name, before anything is written."""
    import zarr

    store = tmp_path / "damaged.zarr"
    group = zarr.open_group(store, mode="w", zarr_format=2)
    for name in ("good", "bad"):
        group.create_array(name, shape=(4,), chunks=(2,), dtype="i4")[...] = np.arange(4, dtype="i4")
    zarray = store / "bad" / ".zarray"
    zarray.write_bytes(zarray.read_bytes()[:23])
    destination = f"file://{tmp_path}/{target}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(nczmap.FormatError, match=r"cannot copy .*lose them: '/bad'"):
            copy(f"file://{store}#mode=zarr,file", destination)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged.zarr"]
