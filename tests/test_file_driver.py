"""File-driver specifics: netcdf-c's directory layout, atomic writes, refusing to clobber foreign data."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import nczmap
from nczmap import DatasetExists, DatasetNotFound, StorageError, open_map
from nczmap.errors import DatasetLocked
from nczmap.zmap.keys import TEMP_PREFIX


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def store(tmp_path):
    return tmp_path / "ds.file"


def test_layout_is_netcdf_c_directory_tree(store):
    with open_map(str(store), "w") as zmap:
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
        zmap.write("/g/v/0.0", b"\x01\x02")
    assert (store / ".zgroup").read_bytes() == b'{"zarr_format": 2}'
    assert (store / "g" / "v" / "0.0").read_bytes() == b"\x01\x02"
    assert sorted(os.listdir(store)) == [".zgroup", "g"]


def test_search_lists_every_directory_entry(store):
    # netcdf-c's observed listing (nczarr-format.md §1.2): foreign files and empty directories included
    (store / "a" / "b").mkdir(parents=True)
    (store / ".zgroup").write_text("{}")
    (store / "a" / "b" / ".zarray").write_text("{}")
    (store / "a" / "b" / "0.0").write_bytes(b"0")
    (store / "empty").write_bytes(b"")
    (store / "emptydir").mkdir()
    (store / "junk.txt").write_text("junk")
    with open_map(str(store), "r") as zmap:
        assert zmap.search("/") == [".zgroup", "a", "empty", "emptydir", "junk.txt"]
        assert zmap.search("/a") == ["b"]
        assert zmap.search("/a/b") == [".zarray", "0.0"]
        assert zmap.search("/a/b/0.0") == []
        assert zmap.exists("/empty") and not zmap.exists("/emptydir")


def test_stray_temporary_files_are_never_listed(store):
    store.mkdir()
    (store / ".zgroup").write_text("{}")
    (store / f"{TEMP_PREFIX}deadbeef").write_bytes(b"half a write")
    with open_map(str(store), "r") as zmap:
        assert zmap.search("/") == [".zgroup"]


def test_create_refuses_a_directory_that_is_not_a_store(tmp_path):
    # netcdf-c bug 2: creating over $HOME would empty it
    home = tmp_path / "home"
    (home / "sub").mkdir(parents=True)
    (home / "sub" / "keep.txt").write_text("precious")
    with pytest.raises(DatasetExists, match="not empty and holds no Zarr"):
        open_map(str(home), "w")
    assert (home / "sub" / "keep.txt").read_text() == "precious"


def test_create_over_a_regular_file_refuses(tmp_path):
    target = tmp_path / "x.file"
    target.write_text("data")
    with pytest.raises(DatasetExists):
        open_map(str(target), "w")
    assert target.read_text() == "data"


def test_create_empties_an_existing_store(store):
    with open_map(str(store), "w") as zmap:
        zmap.write("/.zgroup", b"{}")
        zmap.write("/old/.zarray", b"{}")
    with open_map(str(store), "w") as zmap:
        assert zmap.search("/") == []
    assert os.listdir(store) == []


def test_create_makes_missing_parents(tmp_path):
    # netcdf-c bug 5: create needs an existing parent directory
    deep = tmp_path / "a" / "b" / "ds.file"
    with open_map(str(deep), "w") as zmap:
        zmap.write("/.zgroup", b"{}")
    assert (deep / ".zgroup").exists()


def test_open_missing_dataset(tmp_path):
    with pytest.raises(DatasetNotFound, match="no dataset"):
        open_map(str(tmp_path / "absent.file"), "r")
    with pytest.raises(DatasetNotFound):
        open_map(str(tmp_path / "absent.file"), "r+")


def test_open_a_regular_file_points_at_the_zip_driver(tmp_path):
    target = tmp_path / "x.file"
    target.write_bytes(b"PK")
    with pytest.raises(StorageError, match="mode=zip"):
        open_map(str(target), "r")


def test_append_mode_creates_the_dataset(store):
    with open_map(str(store), "a") as zmap:
        zmap.write("/.zgroup", b"{}")
    assert (store / ".zgroup").exists()


def test_new_files_honour_the_umask(store):
    with open_map(str(store), "w") as zmap:
        zmap.write("/v/0", b"1")
    umask = os.umask(0)
    os.umask(umask)
    assert (store / "v" / "0").stat().st_mode & 0o777 == 0o666 & ~umask


def test_close_delete_removes_the_dataset(store):
    zmap = open_map(str(store), "w")
    zmap.write("/.zgroup", b"{}")
    zmap.close(delete=True)
    assert not store.exists()
    with pytest.raises(DatasetNotFound):
        open_map(str(store), "r")


def test_a_write_that_fails_half_way_keeps_the_old_object(store):
    # A real EFBIG: the file-size limit stops the write after 64 KiB of a 1 MiB object.
    with open_map(str(store), "w") as zmap:
        zmap.write("/v/0", b"old content")
    result = run_python(
        f"""
        import resource, signal
        import nczmap
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        zmap = nczmap.open_map({str(store)!r}, "a")
        try:
            zmap.write("/v/0", b"x" * (1 << 20))
        except nczmap.StorageError as exc:
            print("refused:", exc)
        """
    )
    assert "refused:" in result.stdout and "'/v/0'" in result.stdout, result.stderr
    with open_map(str(store), "r") as zmap:
        assert zmap.read("/v/0") == b"old content"
        assert zmap.search("/v") == ["0"]
    assert os.listdir(store / "v") == ["0"]


def test_a_killed_writer_leaves_a_complete_object(store):
    versions = [bytes([i]) * (4 << 20) for i in range(1, 4)]
    with open_map(str(store), "w") as zmap:
        zmap.write("/v/0", versions[0])
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import nczmap
                zmap = nczmap.open_map({str(store)!r}, "a")
                print("ready", flush=True)
                while True:
                    for fill in (2, 3):
                        zmap.write("/v/0", bytes([fill]) * (4 << 20))
                """
            ),
        ],
        stdout=subprocess.PIPE,
    )
    assert writer.stdout.readline() == b"ready\n"
    time.sleep(0.3)
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    writer.stdout.close()
    with open_map(str(store), "r") as zmap:
        assert zmap.read("/v/0") in versions
        assert zmap.search("/v") == ["0"]


def test_copy_from_another_directory_store(tmp_path):
    with open_map(str(tmp_path / "a.file"), "w") as source, open_map(str(tmp_path / "b.file"), "w") as target:
        source.write("/v/0.0", bytes(range(256)) * 1000)
        assert target.copy_from(source, "/v/0.0", "/w/0.0")
        assert not target.copy_from(source, "/v/absent", "/w/absent")
        assert target.read("/w/0.0") == bytes(range(256)) * 1000
        assert target.search("/w") == ["0.0"]
        assert os.listdir(tmp_path / "b.file" / "w") == ["0.0"]  # no temporary file left behind


# ---------------------------------------------------------------------------- symbolic links (issue: escapes)
@pytest.fixture
def linked_store(tmp_path):
    """A store whose /inner/link points at a file outside, /outdir at a directory outside, /alias inside."""
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret").write_bytes(b"private key")
    (outside / "sub" / "keep").write_bytes(b"keep me")
    store = tmp_path / "store.file"
    with nczmap.open_map(str(store), "w") as zmap:
        zmap.write("/.zgroup", b"{}")
        zmap.write("/inner/0", b"inside")
    (store / "inner" / "link").symlink_to(outside / "secret")
    (store / "outdir").symlink_to(outside)
    (store / "alias").symlink_to(store / "inner")
    return store, outside


def _outside_state(outside):
    return sorted(
        (str(p.relative_to(outside)), p.read_bytes() if p.is_file() else None) for p in outside.rglob("*")
    )


@pytest.mark.parametrize("key", ["/inner/link", "/outdir/secret", "/outdir/sub/keep"])
def test_reads_never_follow_a_link_out_of_the_store(linked_store, key):
    store, _ = linked_store
    with nczmap.open_map(str(store), "r") as zmap:
        for call in (lambda: zmap.read(key), lambda: zmap.len(key), lambda: zmap.exists(key)):
            with pytest.raises(nczmap.AccessDenied, match="outside the store"):
                call()
        buffer = bytearray(4)
        with pytest.raises(nczmap.AccessDenied):
            zmap.read_into(key, memoryview(buffer))


@pytest.mark.parametrize(
    "action",
    [
        lambda z: z.write("/outdir/secret", b"overwritten"),
        lambda z: z.write("/outdir/new/0", b"planted"),
        lambda z: z.write("/outdir/sub/keep", b"overwritten"),
        lambda z: z.delete("/outdir/sub/keep"),
        lambda z: z.delete("/outdir/sub"),
        lambda z: z.search("/outdir"),
    ],
    ids=["overwrite", "plant", "overwrite-deep", "delete", "delete-dir", "list"],
)
def test_writes_deletes_and_listings_never_follow_a_link_out(linked_store, action):
    store, outside = linked_store
    before = _outside_state(outside)
    with nczmap.open_map(str(store), "a") as zmap, pytest.raises(nczmap.AccessDenied, match="outside"):
        action(zmap)
    assert _outside_state(outside) == before


def test_links_that_stay_inside_are_followed_and_unlinking_a_link_leaves_its_target(linked_store):
    store, outside = linked_store
    before = _outside_state(outside)
    with nczmap.open_map(str(store), "a") as zmap:
        assert zmap.read("/alias/0") == b"inside"
        zmap.write("/alias/1", b"through the alias")
        assert zmap.read("/inner/1") == b"through the alias"
        zmap.delete("/inner/link")  # removes the link itself, never what it points at
        zmap.delete("/outdir")
    assert _outside_state(outside) == before
    assert not (store / "outdir").exists()


# ---------------------------------------------------------------------------- one writer at a time
def test_a_writer_holds_a_lock_file_beside_the_store_and_readers_take_none(store, monkeypatch):
    lock_file = store.parent / f"{TEMP_PREFIX}lock-ds.file"
    with open_map(str(store), "w") as zmap:
        zmap.write("/.zgroup", b"{}")
        assert lock_file.read_text().startswith(f"{os.getpid()} {socket.gethostname()} ")
        assert zmap.search("/") == [".zgroup"]
        monkeypatch.setenv("NCZMAP_LOCK_TIMEOUT", "0")
        with pytest.raises(DatasetLocked, match=r"ds\.file"):
            open_map(str(store), "w")  # refused before it empties anything
        assert zmap.read("/.zgroup") == b"{}"
    assert not lock_file.exists()
    with open_map(str(store), "r") as reader:
        assert reader.read("/.zgroup") == b"{}"
        assert not lock_file.exists()
    assert sorted(os.listdir(store.parent)) == ["ds.file"]


KEEPS_WRITING = """
    import nczmap
    zmap = nczmap.open_map({store!r}, "a")
    while True:
        for fill in (2, 3):
            zmap.write("/v/0", bytes([fill]) * (16 << 20))
"""


def test_temporary_files_of_a_killed_writer_are_removed_by_the_next_writer(store):
    with open_map(str(store), "w") as zmap:
        zmap.write("/v/0", b"\x01" * (16 << 20))
    for _attempt in range(5):  # until the kill lands while a temporary file is being written
        writer = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(KEEPS_WRITING.format(store=str(store)))]
        )
        deadline = time.monotonic() + 30
        while not any(name.startswith(TEMP_PREFIX) for name in os.listdir(store / "v")):
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.001)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        if any(name.startswith(TEMP_PREFIX) for name in os.listdir(store / "v")):
            break
    temporaries = [name for name in os.listdir(store / "v") if name.startswith(TEMP_PREFIX)]
    assert temporaries
    with open_map(str(store), "r") as reader:  # readers ignore them and leave them
        assert reader.search("/v") == ["0"]
        assert reader.read("/v/0", 0, 1) in (b"\x01", b"\x02", b"\x03")
    assert sorted(os.listdir(store / "v")) == sorted(["0", *temporaries])
    with open_map(str(store), "a"):
        pass
    assert os.listdir(store / "v") == ["0"]
    assert sorted(os.listdir(store.parent)) == ["ds.file"]  # the dead writer's lock file too


def test_a_store_removed_while_open_is_an_error_not_fill_values(tmp_path):
    url = f"file://{tmp_path}/gone.file#mode=nczarr,file"
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", 4)
        ds.create_variable("v", ("x",), "i4", chunks=(2,), data=[1, 2, 3, 4])
    with nczmap.open_dataset(url) as ds:
        shutil.rmtree(tmp_path / "gone.file")
        with pytest.raises(nczmap.DatasetNotFound, match=r"gone\.file.*removed while open"):
            ds.variables["v"][...]
        with pytest.raises(nczmap.DatasetNotFound):
            ds.zmap.read("/v/0")
