"""Large Icechunk writes committed in parts on a branch of their own, the target branch moved once.

``virtualize`` into Icechunk stages a write of more than ``output.STAGED_REFERENCES`` references: its parts
are committed on a branch ``<branch>.nczmap-...`` and the branch is moved to the last one when the write
ends (the thresholds are lowered here so that a few small files make several parts). Proved: the result
equals the single-commit one and xarray's reading of the files; readers of the branch never see a part
(a writer killed with SIGKILL mid-write leaves the branch as it was); a branch moved meanwhile is left as
it is, with an nczmap error naming the branch the write is on; an aborted write leaves no branch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import nczmap
from nczmap.errors import StorageError
from nczmap.integrations.virtualize import output, virtualize

ic = pytest.importorskip("icechunk")
xr = pytest.importorskip("xarray")
netCDF4 = pytest.importorskip("netCDF4")


def write_files(folder: Path, count: int, side: int = 6, start: int = 0) -> list[Path]:
    """``count`` netCDF-4 files of one record each, ``v(time, y, x)`` in chunks of 1×2×2."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for number in range(start, start + count):
        path = folder / f"f{number:03d}.nc"
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("time", None)
            ds.createDimension("y", side)
            ds.createDimension("x", side)
            times = ds.createVariable("time", "f8", ("time",))
            times.units = "days since 2000-01-01"
            times[:] = [number]
            v = ds.createVariable("v", "f4", ("time", "y", "x"), chunksizes=(1, 2, 2))
            v[0] = np.random.default_rng(number).random((side, side), dtype=np.float32)
        paths.append(path)
    return paths


def repo_url(path: Path) -> str:
    return f"{path.as_uri()}#mode=icechunk"


def quiet(*args, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return virtualize(*args, **options)


def opened(path: Path, folder: Path) -> xr.Dataset:
    return xr.open_dataset(
        repo_url(path), engine="nczmap", map_options={"containers": [folder.as_uri() + "/"]}
    )


def branches(path: Path) -> set[str]:
    return set(ic.Repository.open(ic.local_filesystem_storage(str(path))).list_branches())


def messages(path: Path, branch: str = "main") -> list[str]:
    repo = ic.Repository.open(ic.local_filesystem_storage(str(path)))
    return [snapshot.message for snapshot in repo.ancestry(branch=branch)]


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of 40 references: a file of 9 chunks of v, so a part every 4 or 5 files."""
    monkeypatch.setattr(output, "STAGED_REFERENCES", 40)
    monkeypatch.setattr(output, "PART_REFERENCES", 40)


def test_a_staged_write_equals_one_commit_and_the_files(tmp_path, small_parts, monkeypatch):
    files = write_files(tmp_path / "src", 12)
    staged = tmp_path / "staged"
    quiet([str(f) for f in files], repo_url(staged), concat="time")
    history = messages(staged)
    assert sum("in progress" in message for message in history) >= 2, history
    assert "in progress" not in history[0]  # the branch's head is the whole write
    assert branches(staged) == {"main"}
    monkeypatch.setattr(output, "STAGED_REFERENCES", 1 << 40)
    single = tmp_path / "single"
    quiet([str(f) for f in files], repo_url(single), concat="time")
    assert not any("in progress" in message for message in messages(single))
    with xr.open_mfdataset(files, combine="nested", concat_dim="time", engine="netcdf4") as expected:
        expected = expected.load()
    for path in (staged, single):
        with opened(path, tmp_path / "src") as got:
            xr.testing.assert_identical(got.load(), expected)
    staged_refs = _references(staged, tmp_path / "src")
    assert staged_refs == _references(single, tmp_path / "src")
    assert len(staged_refs) == 12 * 9


def _references(path: Path, folder: Path) -> dict:
    from nczmap.url import parse_url
    from nczmap.zmap import open_map

    zmap = open_map(parse_url(repo_url(path)), "r", containers=[folder.as_uri() + "/"])
    try:
        found = {}
        for coords, _kinds, locations, offsets, lengths, _inline in zmap.chunk_references("/v"):
            for index, location, offset, length in zip(
                np.asarray(coords).tolist(), locations, list(offsets), list(lengths), strict=True
            ):
                found[tuple(index)] = (str(location), int(offset), int(length))
        return found
    finally:
        zmap.close()


def test_a_staged_append_adds_the_files_once(tmp_path, small_parts):
    first = write_files(tmp_path / "src", 5)
    rest = write_files(tmp_path / "src", 11, start=5)
    path = tmp_path / "repo"
    quiet([str(f) for f in first], repo_url(path), concat="time")
    quiet([str(f) for f in rest], repo_url(path), append=True)
    assert branches(path) == {"main"}
    with xr.open_mfdataset(first + rest, combine="nested", concat_dim="time", engine="netcdf4") as expected:
        expected = expected.load()
    with opened(path, tmp_path / "src") as got:
        xr.testing.assert_identical(got.load(), expected)


KILLED_CHILD = r"""
import sys, time, warnings
from nczmap.integrations.virtualize import output, virtualize
from nczmap.zmap.icechunk import IcechunkMap
output.STAGED_REFERENCES = output.PART_REFERENCES = 40
checkpoint = IcechunkMap.checkpoint
def slow(self):
    checkpoint(self)
    print("part", flush=True)
    time.sleep(0.5)  # parts slowed, so that the parent's kill lands between two of them
IcechunkMap.checkpoint = slow
warnings.simplefilter("ignore")
virtualize(sys.argv[2:], sys.argv[1], concat="time")
"""


@pytest.mark.parametrize("after_parts", [1, 2])
def test_a_writer_killed_between_parts_leaves_the_branch_as_it_was(tmp_path, after_parts):
    files = write_files(tmp_path / "src", 16)
    path = tmp_path / "repo"
    quiet([str(f) for f in files[:3]], repo_url(path), concat="time")  # what readers see before
    before = ic.Repository.open(ic.local_filesystem_storage(str(path))).lookup_branch("main")
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_CHILD, repo_url(path), *map(str, files)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for _ in range(after_parts):
            assert child.stdout.readline().strip() == "part"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=60)
        child.stdout.close()
    repo = ic.Repository.open(ic.local_filesystem_storage(str(path)))
    assert repo.lookup_branch("main") == before
    staging = [name for name in repo.list_branches() if name != "main"]
    assert len(staging) == 1 and staging[0].startswith("main.nczmap-")  # its parts, never on main
    with opened(path, tmp_path / "src") as got:
        assert got.sizes["time"] == 3
        with xr.open_mfdataset(files[:3], combine="nested", concat_dim="time", engine="netcdf4") as expected:
            xr.testing.assert_identical(got.load(), expected.load())


def test_a_branch_moved_during_a_staged_write_is_left_as_it_is(tmp_path):
    path = tmp_path / "repo"
    url = repo_url(path)
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", 4)
        ds.create_variable("v", ("x",), "i4", fill_value=-1)[:] = [1, 2, 3, 4]
    dataset = nczmap.open_dataset(url, mode="r+")
    zmap = dataset.zmap
    zmap.stage((0, 2))
    dataset.variables["v"][:] = [5, 6, 7, 8]
    zmap.checkpoint()
    with nczmap.open_dataset(url, mode="r+") as other:  # someone else commits to main meanwhile
        other.variables["v"][:] = [9, 9, 9, 9]
    with pytest.raises(StorageError) as raised:
        dataset.close()
    staging = [name for name in branches(path) if name != "main"]
    assert len(staging) == 1 and staging[0] in str(raised.value) and "'main' was moved" in str(raised.value)
    with nczmap.open_dataset(url) as ds:
        assert ds.variables["v"][:].tolist() == [9, 9, 9, 9]


def test_an_aborted_staged_write_leaves_no_branch(tmp_path):
    path = tmp_path / "repo"
    url = repo_url(path)
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", 2)
        ds.create_variable("v", ("x",), "i4", fill_value=-1)[:] = [1, 2]
    dataset = nczmap.open_dataset(url, mode="r+")
    dataset.zmap.stage((0, 1))
    dataset.variables["v"][:] = [3, 4]
    dataset.zmap.checkpoint()
    dataset.variables["v"][:] = [5, 6]
    dataset.zmap.abort()
    assert branches(path) == {"main"}
    with nczmap.open_dataset(url) as ds:
        assert ds.variables["v"][:].tolist() == [1, 2]


def test_staging_a_tag_is_refused_by_name(tmp_path):
    path = tmp_path / "repo"
    url = repo_url(path)
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", 2)
        ds.create_variable("v", ("x",), "i4", fill_value=-1)[:] = [1, 2]
    with nczmap.open_dataset(url) as ds, pytest.raises(StorageError, match="cannot stage"):
        ds.zmap.stage((0, 1))


def test_kill_test_waits_for_real_parts(tmp_path):
    """The kill test's child prints one line a part committed (its parts really are commits)."""
    files = write_files(tmp_path / "src", 10)
    path = tmp_path / "repo"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", KILLED_CHILD, repo_url(path), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    parts = done.stdout.split().count("part")
    assert parts >= 2, done.stdout
    assert sum("in progress" in m for m in messages(path)) == parts
    assert time.monotonic() - started < 120
