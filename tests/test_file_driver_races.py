"""Issue 19 A1 (file driver) and C10: what is checked is what is opened, whatever happens to the paths.

The file driver reaches every object and directory from a descriptor of the store held for the map's
lifetime, a component at a time without letting the kernel follow a link, so a link created or swapped in
after a check cannot lead out of the store. Keys too deep or too long for the file system are nczmap errors
naming the key, never a ``RecursionError`` or a bare ``OSError``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from races import can_exchange, swapper

import nczmap
from nczmap import AccessDenied, EmptyError, NCZError, open_map
from nczmap.zmap import beneath

INSIDE = b"inside!!"
OUTSIDE = b"OUTSIDE!"


@pytest.fixture(params=["openat2", "walk"])
def resolution(request, monkeypatch):
    """Files opened with openat2(RESOLVE_BENEATH) where the kernel has it, or walked a component at a time."""
    if request.param == "walk":
        monkeypatch.setattr(beneath, "_openat2", ())
    elif not beneath._find_openat2():
        pytest.skip("no openat2 here")
    return request.param


@pytest.fixture
def layout(tmp_path):
    """A store ``store.file`` (``/.zgroup``) and ``outside/secret`` beside it."""
    store = tmp_path / "store.file"
    outside = tmp_path / "outside"
    with open_map(str(store), "w") as zmap:
        zmap.write("/.zgroup", b"{}")
    outside.mkdir()
    (outside / "secret").write_bytes(OUTSIDE)
    return store, outside


def outside_state(outside) -> list[tuple[str, bytes | None]]:
    return sorted(
        (str(p.relative_to(outside)), p.read_bytes() if p.is_file() else None) for p in outside.rglob("*")
    )


def test_a_link_made_after_a_failed_read_leads_nowhere(layout, resolution):
    store, outside = layout
    before = outside_state(outside)
    with open_map(str(store), "a") as zmap:
        assert not zmap.exists("/sub/secret")
        with pytest.raises(EmptyError):
            zmap.read("/sub/secret")
        assert zmap.search("/sub") == []
        (store / "sub").symlink_to(outside)  # now sub/secret is the outside file, by path
        calls = [
            lambda: zmap.read("/sub/secret"),
            lambda: zmap.read_into("/sub/secret", memoryview(bytearray(8))),
            lambda: zmap.len("/sub/secret"),
            lambda: zmap.exists("/sub/secret"),
            lambda: zmap.search("/sub"),
            lambda: zmap.write("/sub/planted", b"planted"),
            lambda: zmap.write("/sub/deeper/planted", b"planted"),
            lambda: zmap.delete("/sub/secret"),
        ]
        for call in calls:
            with pytest.raises(AccessDenied, match="outside the store"):
                call()
    assert outside_state(outside) == before


# ------------------------------------------------------------------------------------ races
@pytest.fixture
def swapping(layout, tmp_path):
    """``store.file/d/secret`` holds INSIDE; another process keeps exchanging ``store.file/d`` with a
    symlink to ``outside`` (which holds ``secret`` = OUTSIDE). Yields the store and the outside."""
    if not can_exchange(tmp_path):
        pytest.skip("this kernel or libc has no renameat2(RENAME_EXCHANGE)")
    store, outside = layout
    (store / "d").mkdir()
    (store / "d" / "secret").write_bytes(INSIDE)
    (store / "swap").symlink_to(outside)
    process = multiprocessing.get_context("spawn").Process(
        target=swapper, args=(str(store / "d"), str(store / "swap"), 120.0), daemon=True
    )
    process.start()
    time.sleep(0.3)
    yield store, outside
    process.terminate()
    process.join()


def _read_or_error(zmap, outcomes: dict[str, int]) -> None:
    """One read of ``/d/secret``: the inside bytes or an nczmap error (anything else fails the test)."""
    try:
        data = zmap.read("/d/secret")
    except NCZError:
        outcomes["error"] += 1
        return
    assert data == INSIDE, "an outside byte was read"
    outcomes["inside"] += 1


def test_fresh_maps_under_a_swap_read_inside_bytes_or_an_nczmap_error(swapping, resolution):
    store, _ = swapping
    outcomes = {"inside": 0, "error": 0}
    for _ in range(2_000):
        with open_map(str(store), "r") as zmap:
            _read_or_error(zmap, outcomes)
    assert outcomes["inside"], outcomes


def test_one_map_under_a_swap_reads_inside_bytes_or_an_nczmap_error(swapping, resolution):
    store, _ = swapping
    outcomes = {"inside": 0, "error": 0}
    with open_map(str(store), "r") as zmap:
        for _ in range(30_000):
            _read_or_error(zmap, outcomes)
            with contextlib.suppress(NCZError):
                assert zmap.len("/d/secret") == len(INSIDE)
    assert outcomes["inside"], outcomes


def _write_or_error(zmap, key: str, data: bytes, outcomes: dict[str, int]) -> None:
    try:
        zmap.write(key, data)
        outcomes["written"] += 1
    except NCZError:
        outcomes["error"] += 1


def test_writes_under_a_swap_never_create_a_file_outside(swapping):
    store, outside = swapping
    before = outside_state(outside)
    outcomes = {"written": 0, "error": 0}
    with open_map(str(store), "a") as zmap:
        for i in range(1_000):
            _write_or_error(zmap, "/d/secret", INSIDE, outcomes)
            _write_or_error(zmap, f"/d/new/{i % 7}", b"new", outcomes)
            with contextlib.suppress(NCZError):
                zmap.delete(f"/d/new/{(i + 3) % 7}")
    for i in range(100):
        with open_map(str(store), "a", lock=False) as zmap:
            _write_or_error(zmap, f"/d/fresh{i}", b"fresh", outcomes)
            _write_or_error(zmap, f"/d/sub{i}/x", b"fresh", outcomes)
    assert outcomes["written"], outcomes
    assert outside_state(outside) == before


# ------------------------------------------------------------------------------------ C10: long keys
@pytest.fixture
def store(tmp_path):
    return tmp_path / "ds.file"


def test_keys_longer_than_the_path_limit_are_nczmap_errors(store):
    path_max = os.pathconf(store.parent, "PC_PATH_MAX")
    deep = ("ab/" * 2000).rstrip("/")
    assert len(deep) > path_max
    with open_map(str(store), "w") as zmap:
        zmap.write("/.zgroup", b"{}")
        with pytest.raises(NCZError, match=r"'/ab/ab/ab"):
            zmap.write(deep, b"x")
        assert not zmap.exists(deep)
        with pytest.raises(EmptyError):
            zmap.len(deep)
        with pytest.raises(NCZError, match=r"'/ab/ab/ab"):
            zmap.read(deep)
        assert zmap.search("ab/" * 2000) == []
        zmap.delete(deep)  # nothing can be there: nothing to do
        assert zmap.search("/") == [".zgroup"]


def test_a_name_longer_than_the_name_limit_is_an_nczmap_error(store):
    name_max = os.pathconf(store.parent, "PC_NAME_MAX")
    key = "/v/" + "x" * (name_max + 1)
    with open_map(str(store), "w") as zmap:
        with pytest.raises(NCZError, match="xxxx"):
            zmap.write(key, b"x")
        assert not zmap.exists(key)
        with pytest.raises(NCZError, match="xxxx"):
            zmap.read(key)
        assert zmap.search(key) == []
        assert zmap.search("/") == []


def test_a_very_deep_key_is_written_read_and_removed_without_recursion(store):
    levels = 1_100  # more than Python's recursion limit; within PATH_MAX
    key = "/" + "/".join(["a"] * levels) + "/0"
    with open_map(str(store), "w") as zmap:
        zmap.write(key, b"deep")
        assert zmap.read(key) == b"deep"
        assert zmap.len(key) == 4
        assert zmap.search(key.rpartition("/")[0]) == ["0"]
        zmap.delete(key)  # prunes every level left empty
        assert zmap.search("/") == []
        zmap.write(key, b"deep")
        zmap.write("/.zgroup", b"{}")
    with open_map(str(store), "r") as zmap:
        assert zmap.read(key) == b"deep"
    with open_map(str(store), "a") as zmap:
        zmap.delete("/a")
        assert zmap.search("/") == [".zgroup"]
        zmap.write(key, b"deep")
    zmap = open_map(str(store), "a")
    zmap.close(delete=True)
    assert not store.exists()


# ------------------------------------------------------------------------------------ the store itself
def test_a_store_replaced_while_open_is_read_anew(tmp_path):
    url = f"file://{tmp_path}/ds.file#mode=nczarr,file"
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", 2)
        ds.create_variable("old", ("x",), "i4", data=[1, 2])
    with open_map(str(tmp_path / "ds.file"), "r") as zmap:
        assert zmap.exists("/old/.zarray")
        shutil.rmtree(tmp_path / "ds.file")
        with nczmap.create_dataset(url) as ds:  # as nczmap copy does: a new directory
            ds.create_dimension("x", 2)
            ds.create_variable("new", ("x",), "i4", data=[3, 4])
        assert zmap.exists("/new/.zarray")
        assert "new" in zmap.search("/")
        assert not zmap.exists("/old/.zarray")


def test_a_store_replaced_again_and_again_keeps_no_descriptors_of_the_old_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(beneath, "_openat2", ())  # walked: the directories on the way are cached
    store = tmp_path / "ds.file"

    def make(value: bytes) -> None:
        with open_map(str(store), "w") as writer:
            for i in range(20):
                writer.write(f"/v{i}/w/0", value)

    make(b"0")
    with open_map(str(store), "r") as zmap:
        assert zmap.read("/v0/w/0") == b"0"
        descriptors = len(os.listdir("/proc/self/fd"))
        for round in range(1, 6):
            shutil.rmtree(store)
            make(b"%d" % round)
            assert [zmap.read(f"/v{i}/w/0") for i in range(20)] == [b"%d" % round] * 20
        # the stores replaced are held until close (their root only), not the directories cached in them:
        # those of the current store (40) and the 5 old roots, not 40 more for each old store
        assert len(os.listdir("/proc/self/fd")) <= descriptors + 40 + 5 + 5


def test_a_directory_removed_by_another_program_is_walked_again(tmp_path):
    store = tmp_path / "ds.file"
    with open_map(str(store), "w") as writer:
        writer.write("/v/0", b"first")
    with open_map(str(store), "r") as zmap:
        assert zmap.read("/v/0") == b"first"  # /v is now a cached directory
        shutil.rmtree(store / "v")
        (store / "v").mkdir()
        (store / "v" / "0").write_bytes(b"second")
        assert zmap.read("/v/0") == b"second"
        assert zmap.search("/v") == ["0"]


def test_threads_listing_one_directory_each_see_all_of_it(tmp_path, resolution):
    store = tmp_path / "ds.file"
    names = sorted(f"v{i:03d}" for i in range(300))
    with open_map(str(store), "w") as zmap:
        for name in names:
            zmap.write(f"/g/{name}", b"1")
    with open_map(str(store), "r") as zmap, ThreadPoolExecutor(8) as pool:
        assert zmap.read("/g/v000") == b"1"  # walked: /g is now held in the map's cache of directories
        listings = list(pool.map(lambda _: (zmap.search("/g"), zmap.search("/")), range(400)))
    assert all(listing == (names, ["g"]) for listing in listings)


def test_a_link_climbing_out_of_a_very_deep_walk_is_resolved_beneath(tmp_path, resolution):
    # The walk keeps a bounded number of directories open: those it closed on the way down are opened
    # again when a link's target climbs back up through them.
    top = tmp_path / "top"
    deep = top.joinpath(*["a"] * 40)
    deep.mkdir(parents=True)
    top.joinpath(*["a"] * 5, "f").write_bytes(INSIDE)
    (deep / "up").symlink_to("/".join([".."] * 35) + "/f")
    (deep / "out").symlink_to("/".join([".."] * 41) + "/f")
    directory = beneath.Beneath(str(top), "the directory")
    try:
        fd = directory.open_file(["a"] * 40 + ["up"], "up")
        try:
            assert os.pread(fd, 8, 0) == INSIDE
        finally:
            os.close(fd)
        with pytest.raises(AccessDenied):
            directory.open_file(["a"] * 40 + ["out"], "out")
    finally:
        directory.close()
