"""Issue 19 A1/A3: a reference reads only beneath its container, whatever happens to the paths on the way.

What is checked is what is opened: local references are opened component by component from the
container's directory descriptor, never by path, so a symbolic link created or swapped in after a check
cannot lead out. Only regular files are read: a FIFO never hangs a read, a directory or device is an
nczmap error naming the reference.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest
from races import can_exchange, swapper

import nczmap
from nczmap.errors import AccessDenied, NCZError, StorageError
from nczmap.zmap.beneath import Beneath, NotRegular

INSIDE = b"inside!!"
OUTSIDE = b"OUTSIDE!"


def write_manifest(path, refs: dict) -> str:
    document = {"version": 1, "refs": {".zgroup": '{"zarr_format": 2}', **refs}}
    path.write_text(json.dumps(document))
    return f"file://{path}#mode=zarr,manifest"


@pytest.fixture
def layout(tmp_path):
    """``container/`` (the manifest's directory) and ``outside/secret`` beside it."""
    container = tmp_path / "container"
    outside = tmp_path / "outside"
    container.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(OUTSIDE)
    return container, outside


def test_a_link_made_after_a_failed_read_does_not_lead_out(layout):
    container, outside = layout
    url = write_manifest(container / "refs.json", {"k": ["sub/secret", 0, 8]})
    with nczmap.open_map(url) as zmap:
        with pytest.raises(StorageError, match="does not exist"):
            zmap.read("/k")
        (container / "sub").symlink_to(outside)  # now sub/secret is the outside file, by path
        with pytest.raises(AccessDenied, match="outside"):
            zmap.read("/k")


@pytest.mark.parametrize(
    "target", ["../outside", "{outside}", "sub2/../../outside", "{container}/../outside"], ids=str
)
def test_links_leading_out_of_the_container_are_refused(layout, target):
    container, outside = layout
    (container / "sub2").mkdir()
    (container / "sub").symlink_to(target.format(outside=outside, container=container))
    url = write_manifest(container / "refs.json", {"k": ["sub/secret", 0, 8]})
    with nczmap.open_map(url) as zmap, pytest.raises(AccessDenied, match="outside"):
        zmap.read("/k")


def test_links_staying_inside_are_followed(layout):
    container, _ = layout
    (container / "data").mkdir()
    (container / "data" / "f").write_bytes(INSIDE)
    (container / "relative").symlink_to("data")
    (container / "absolute").symlink_to(container / "data")
    (container / "data" / "up").symlink_to("../data/f")
    refs = {"a": ["relative/f", 0, 8], "b": ["absolute/f", 0, 8], "c": ["data/up", 0, 8]}
    url = write_manifest(container / "refs.json", refs)
    with nczmap.open_map(url) as zmap:
        assert [zmap.read(f"/{k}") for k in "abc"] == [INSIDE] * 3


def test_a_link_loop_is_an_error_not_a_hang(layout):
    container, _ = layout
    (container / "a").symlink_to("b")
    (container / "b").symlink_to("a")
    url = write_manifest(container / "refs.json", {"k": ["a/f", 0, 8]})
    with nczmap.open_map(url) as zmap, pytest.raises(AccessDenied, match="too many symbolic links"):
        zmap.read("/k")


def test_a_fifo_source_is_refused_without_hanging(layout):
    container, _ = layout
    os.mkfifo(container / "fifo")
    url = write_manifest(container / "refs.json", {"k": ["fifo", 0, 8], "whole": ["fifo"]})
    started = time.monotonic()
    with nczmap.open_map(url) as zmap:
        for key in ("/k", "/whole"):
            with pytest.raises(StorageError, match="not a regular file"):
                zmap.read(key)
    assert time.monotonic() - started < 5


def test_a_directory_source_is_an_nczmap_error(layout):
    container, _ = layout
    (container / "dir").mkdir()
    url = write_manifest(container / "refs.json", {"k": ["dir", 0, 8], "dot": ["dir/sub/..", 0, 8]})
    with nczmap.open_map(url) as zmap:
        for key in ("/k", "/dot"):
            with pytest.raises(StorageError, match="directory"):
                zmap.read(key)


def test_a_device_behind_a_link_is_refused(layout):
    container, _ = layout
    (container / "zero").symlink_to("/dev/zero")
    url = write_manifest(container / "refs.json", {"k": ["zero"]})
    with nczmap.open_map(url) as zmap, pytest.raises(AccessDenied):
        zmap.read("/k")


@pytest.mark.parametrize("name", [".zmetadata", "v/refs.0.parq"])
@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_parquet_files_that_are_not_regular_files_are_refused(tmp_path, name, kind):
    pytest.importorskip("pyarrow")
    source = tmp_path / "src.zarr"
    with nczmap.create_dataset(f"file://{source}#mode=zarr,file") as ds:
        ds.create_dimension("x", 4)
        ds.create_variable("v", ("x",), "i4", chunks=(2,))[:] = [1, 2, 3, 4]
    refs = tmp_path / "refs.parq"
    from nczmap.integrations.copy import copy

    copy(f"file://{source}#mode=zarr,file", f"file://{refs}#mode=zarr,manifest")
    target = refs / name
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    started = time.monotonic()
    with pytest.raises(NCZError), nczmap.open_dataset(f"file://{refs}#mode=zarr,manifest") as ds:
        ds.variables["v"][:]
    assert time.monotonic() - started < 5


# ------------------------------------------------------------------------------------ races
@pytest.fixture
def swapping(layout, tmp_path):
    """``container/d/secret`` holds INSIDE; another process keeps exchanging ``container/d`` with a
    symlink to ``outside`` (which holds ``secret`` = OUTSIDE)."""
    if not can_exchange(tmp_path):
        pytest.skip("this kernel or libc has no renameat2(RENAME_EXCHANGE)")
    container, outside = layout
    (container / "d").mkdir()
    (container / "d" / "secret").write_bytes(INSIDE)
    (container / "swap").symlink_to(outside)
    process = multiprocessing.get_context("spawn").Process(
        target=swapper, args=(str(container / "d"), str(container / "swap"), 60.0), daemon=True
    )
    process.start()
    time.sleep(0.3)
    yield container
    process.terminate()
    process.join()


def test_a_directory_swapped_for_a_link_never_yields_outside_bytes(swapping):
    directory = Beneath(str(swapping), "the container")
    seen = {"inside": 0, "refused": 0}
    try:
        for _ in range(30_000):
            try:
                fd = directory.open_file(["d", "secret"], "d/secret")
            except (AccessDenied, FileNotFoundError, NotADirectoryError, NotRegular):
                seen["refused"] += 1
                continue
            try:
                data = os.pread(fd, 8, 0)
            finally:
                os.close(fd)
            assert data == INSIDE, "an outside byte was read"
            seen["inside"] += 1
    finally:
        directory.close()
    assert seen["inside"] and seen["refused"], seen  # the race really ran both ways


def test_fresh_maps_under_a_swap_read_inside_bytes_or_an_nczmap_error(swapping):
    url = write_manifest(swapping / "refs.json", {"k": ["d/secret", 0, 8]})
    outcomes = {"inside": 0, "error": 0}
    for _ in range(2_000):
        with nczmap.open_map(url) as zmap:
            try:
                data = zmap.read("/k")
            except NCZError:
                outcomes["error"] += 1
                continue
        assert data == INSIDE, "an outside byte was read"
        outcomes["inside"] += 1
    assert outcomes["inside"], outcomes
