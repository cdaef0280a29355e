"""Zip-driver specifics: netcdf-c's layout, zarr-python ZipStore zips, no duplicates, atomic commit."""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import pytest
import zarr
from test_file_driver import run_python

from nczmap import DatasetExists, DatasetNotFound, KeyNameError, StorageError, open_map
from nczmap.zmap import zip as zip_driver
from nczmap.zmap.keys import TEMP_PREFIX
from nczmap.zmap.zip import find_layout


def names(path) -> list[str]:
    with zipfile.ZipFile(path) as archive:
        return archive.namelist()


def write_store(path, objects: dict[str, bytes], mode: str = "w") -> None:
    with open_map(str(path), mode) as zmap:
        for key, data in objects.items():
            zmap.write(key, data)


def test_writes_netcdf_c_layout(tmp_path):
    path = tmp_path / "ref_byte.zarr.zip"
    write_store(path, {"/.zgroup": b"{}", "/v/.zarray": b"{}", "/v/0.0": b"\x00" * 8})
    assert names(path) == [
        "ref_byte.zarr/",
        "ref_byte.zarr/.zgroup",
        "ref_byte.zarr/v/",
        "ref_byte.zarr/v/.zarray",
        "ref_byte.zarr/v/0.0",
    ]
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
        assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_STORED}
        assert archive.read("ref_byte.zarr/v/0.0") == b"\x00" * 8


def test_overwrite_and_delete_leave_no_duplicates(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}", "/v/.zarray": b"1", "/w/0": b"x"})
    for round_ in range(3):
        with open_map(str(path), "a") as zmap:
            zmap.write("/v/.zarray", str(round_).encode() * 10)
            zmap.delete("/w")
    entries = names(path)
    assert not [name for name, n in collections.Counter(entries).items() if n > 1]
    assert entries == ["ds/", "ds/.zgroup", "ds/v/", "ds/v/.zarray"]
    with open_map(str(path), "r") as zmap:
        assert zmap.read("/v/.zarray") == b"2" * 10


def test_unchanged_archive_is_not_rewritten(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}"})
    before = os.stat(path).st_ino
    with open_map(str(path), "a") as zmap:
        assert zmap.read("/.zgroup") == b"{}"
    assert os.stat(path).st_ino == before


def test_crash_before_close_keeps_the_previous_archive(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}", "/v/0": b"old"})
    original = path.read_bytes()
    result = run_python(
        f"""
        import os, nczmap
        zmap = nczmap.open_map({str(path)!r}, "a")
        zmap.write("/v/0", b"new")
        zmap.delete("/.zgroup")
        os._exit(0)
        """
    )
    assert result.returncode == 0, result.stderr
    assert path.read_bytes() == original
    # only the dead writer's lock file is left (no data, never listed); the next writer takes it over
    assert sorted(os.listdir(tmp_path)) == [".nczmap-tmp-lock-ds.zip", "ds.zip"]
    with open_map(str(path), "a"):
        pass
    assert os.listdir(tmp_path) == ["ds.zip"]


def test_a_commit_that_fails_keeps_the_previous_archive(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}", "/v/0": b"old"})
    original = path.read_bytes()
    result = run_python(
        f"""
        import resource, signal
        import nczmap
        zmap = nczmap.open_map({str(path)!r}, "a")
        zmap.write("/v/1", b"y" * (1 << 20))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))  # staging fits, the new zip does not
        zmap.write("/v/2", b"z" * (1 << 20))
        try:
            zmap.close()
        except nczmap.StorageError as exc:
            print("refused:", exc)
        """
    )
    assert "refused:" in result.stdout and "ds.zip" in result.stdout, result.stderr
    assert path.read_bytes() == original
    assert os.listdir(tmp_path) == ["ds.zip"]


def test_an_exception_in_the_with_block_discards_changes(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}"})
    with pytest.raises(RuntimeError), open_map(str(path), "a") as zmap:
        zmap.write("/v/0", b"half")
        raise RuntimeError("boom")
    with open_map(str(path), "r") as zmap:
        assert zmap.search("/") == [".zgroup"]


def test_forgotten_close_warns_and_discards(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}"})
    zmap = open_map(str(path), "a")
    zmap.write("/v/0", b"lost")
    with pytest.warns(ResourceWarning, match="not closed"):
        del zmap
    assert names(path) == ["ds/", "ds/.zgroup"]


def test_reads_staged_and_committed_objects_in_one_session(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/a": b"committed"})
    with open_map(str(path), "a") as zmap:
        zmap.write("/b", b"staged")
        assert zmap.read("/a", 3, 3) == b"mit"
        assert zmap.read("/b", 2) == b"aged"
        assert zmap.search("/") == ["a", "b"]


def test_reads_zips_made_by_zip_dash_r(tmp_path):
    tree = tmp_path / "src" / "x.file"
    (tree / "v").mkdir(parents=True)
    (tree / ".zgroup").write_bytes(b'{"zarr_format": 2}')
    (tree / "v" / "0.0").write_bytes(bytes(range(200)) * 50)
    archive = shutil.make_archive(str(tmp_path / "made"), "zip", root_dir=tmp_path / "src", base_dir="x.file")
    with zipfile.ZipFile(archive) as made:
        assert any(info.compress_type == zipfile.ZIP_DEFLATED for info in made.infolist())
    with open_map(archive, "r") as zmap:
        assert zmap.search("/") == [".zgroup", "v"]
        assert zmap.read("/v/0.0", 190, 20) == (bytes(range(200)) * 50)[190:210]
        assert zmap.read("/v/0.0") == (tree / "v" / "0.0").read_bytes()


def test_reads_zarr_python_zipstore_zips(tmp_path):
    path = tmp_path / "zarr.zip"
    store = zarr.storage.ZipStore(path, mode="w")
    group = zarr.open_group(store, mode="w", zarr_format=2)
    group.create_array("temp", shape=(4,), chunks=(2,), dtype="<i4", compressors=None)[:] = np.arange(4)
    store.close()
    entries = names(path)
    with zipfile.ZipFile(path) as archive, open_map(str(path), "r") as zmap:
        assert zmap.search("/") == sorted({name.split("/")[0] for name in entries})
        assert zmap.read("/temp/.zarray") == archive.read("temp/.zarray")
        assert np.frombuffer(zmap.read("/temp/1"), "<i4").tolist() == [2, 3]


def test_zarr_python_reads_what_we_write(tmp_path):
    path = tmp_path / "ds.zip"
    zarray = b'{"zarr_format": 2, "shape": [3], "chunks": [3], "dtype": "<f8", "compressor": null, '
    zarray += b'"fill_value": null, "filters": null, "order": "C"}'
    values = np.array([1.5, 2.5, 3.5])
    write_store(path, {"/.zgroup": b'{"zarr_format": 2}', "/d/.zarray": zarray, "/d/0": values.tobytes()})
    store = zarr.storage.ZipStore(path, mode="r")
    group = zarr.open_group(store, mode="r", path="ds", zarr_format=2)
    assert group["d"][:].tolist() == values.tolist()
    store.close()


def test_duplicate_members_from_other_writers_are_compacted(tmp_path):
    path = tmp_path / "dup.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(".zgroup", b"{}")
        archive.writestr("v/0", b"first")
        with pytest.warns(UserWarning, match="Duplicate"):
            archive.writestr("v/0", b"second")
    with open_map(str(path), "a") as zmap:
        assert zmap.read("/v/0") == b"second"
        zmap.write("/v/1", b"x")
    assert sorted(names(path)) == [".zgroup", "v/", "v/0", "v/1"]


def test_zip_slip_entries_are_skipped(tmp_path):
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("evil/.zgroup", b"{}")
        archive.writestr("evil/../../etc/passwd", b"root")
        archive.writestr("evil/a//b", b"x")
    with open_map(str(path), "r") as zmap:
        assert zmap.search("/") == [".zgroup"]
        assert zmap.skipped == ["evil/../../etc/passwd", "evil/a//b"]


def test_create_refuses_foreign_files(tmp_path):
    text = tmp_path / "notes.zip"
    text.write_text("not a zip")
    with pytest.raises(DatasetExists, match="not a zip"):
        open_map(str(text), "w")
    assert text.read_text() == "not a zip"
    other = tmp_path / "photos.zip"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("photos/cat.jpg", b"\xff\xd8")
    with pytest.raises(DatasetExists, match="no Zarr"):
        open_map(str(other), "w")
    assert names(other) == ["photos/cat.jpg"]


def test_create_replaces_an_existing_store(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}", "/old": b"1"})
    write_store(path, {"/.zgroup": b"{}"})
    assert names(path) == ["ds/", "ds/.zgroup"]


def test_missing_and_corrupt_archives(tmp_path):
    with pytest.raises(DatasetNotFound, match=r"absent\.zip"):
        open_map(str(tmp_path / "absent.zip"), "r")
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}", "/v/0": b"x" * 1000})
    data = path.read_bytes()
    (tmp_path / "cut.zip").write_bytes(data[: len(data) // 2])
    with pytest.raises(StorageError, match=r"cut\.zip"):
        open_map(str(tmp_path / "cut.zip"), "r")
    flipped = bytearray(data)
    offset = data.index(b"x" * 1000)
    flipped[offset] = ord("y")
    (tmp_path / "flip.zip").write_bytes(bytes(flipped))
    with open_map(str(tmp_path / "flip.zip"), "r") as zmap, pytest.raises(StorageError, match="CRC"):
        zmap.read("/v/0")


def test_close_delete_removes_the_archive(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}"})
    zmap = open_map(str(path), "a")
    zmap.close(delete=True)
    assert not path.exists()


@pytest.mark.parametrize(
    ("entries", "dataset", "prefix"),
    [
        (["ds/", "ds/.zgroup"], "ds", "ds/"),  # netcdf-c, named after the archive
        (["x.file/", "x.file/.zgroup", "x.file/v/0"], "ds", "x.file/"),  # zip -r of a directory
        (["p/", "p/.zgroup", ".zgroup"], "p_orig", "p/"),  # ref_power_901_constants_orig.zip
        ([".zgroup", "v/.zarray", "v/0"], "ds", ""),  # zarr-python ZipStore
        (["v/.zarray", "v/0", ".zgroup"], "ds", ""),  # ZipStore whose first member is an array
        (["empty/"], "other", "empty/"),  # ref_notzarr's empty.zip
        (["x/", "x/.zgroup", "__MACOSX/x/._.zgroup"], "x", "x/"),  # macOS Finder's resource forks
        (["ds/", "ds/.zgroup", "other/x"], "ds", "ds/"),  # netcdf-c ignores everything outside entry 0
        (["b/", "b/.zgroup", "a2/.zgroup"], "a2", "b/"),  # entry 0 decides, not the archive's name
        (["r/.zattrs", ".zgroup"], "ds", "r/"),  # a root group with attributes only
        (["v/.zattrs", "v/.zarray", ".zgroup"], "ds", ""),  # ZipStore: entry 0 belongs to an array
        (["g/.zgroup", ".zgroup", "v/.zarray"], "ds", ""),  # ZipStore: a subgroup beside an array
        ([], "ds", "ds/"),
    ],
)
def test_layout_detection(entries, dataset, prefix):
    assert find_layout(entries, dataset) == prefix


def test_search_index_is_consistent_with_zipstore_listing(tmp_path):
    path = tmp_path / "wide.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(".zgroup", b"{}")
        for i in range(500):
            archive.writestr(f"v/{i}", b"")
    store = zarr.storage.ZipStore(path, mode="r")

    async def listing() -> list[str]:
        await store._ensure_open()
        return [name async for name in store.list_dir("v")]

    expected = sorted(asyncio.run(listing()))
    store.close()
    with open_map(str(path), "r") as zmap:
        assert zmap.search("/v") == sorted(expected, key=lambda s: s.encode())


def test_writes_from_many_threads_all_land_once(tmp_path):
    """Chunk copies write from the pool's threads at once: every object ends up whole, exactly once."""
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "ds.zip"
    contents = {f"/v/{i}": bytes([i % 251]) * (1000 + 37 * i) for i in range(200)}
    with open_map(str(path), "w") as zmap:
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda item: zmap.write(*item), contents.items()))
            # and the same keys again with new content, concurrently
            contents = {key: data[::-1] + b"!" for key, data in contents.items()}
            list(pool.map(lambda item: zmap.write(*item), contents.items()))
        assert all(zmap.read(key) == data for key, data in contents.items())
    listed = names(path)
    assert len(listed) == len(set(listed))
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
    with open_map(str(path), "r") as zmap:
        assert zmap.search("/v") == sorted(k[3:] for k in contents)
        assert all(zmap.read(key) == data for key, data in contents.items())


def test_a_staged_write_that_fails_keeps_the_previous_content(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}", "/v/0": b"old content"})
    result = run_python(
        f"""
        import resource, signal
        import nczmap
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        zmap = nczmap.open_map({str(path)!r}, "a")
        zmap.write("/v/1", b"small")  # staging starts under the limit
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, hard))
        try:
            zmap.write("/v/0", b"x" * (1 << 20))
        except nczmap.StorageError as exc:
            print("refused:", exc)
        print("reads:", zmap.read("/v/0"))
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        zmap.close()
        """
    )
    assert "refused:" in result.stdout and "'/v/0'" in result.stdout, result.stderr
    assert "reads: b'old content'" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 0, result.stderr
    with open_map(str(path), "r") as zmap:
        assert zmap.read("/v/0") == b"old content"
        assert zmap.read("/v/1") == b"small"


# ---------------------------------------------------------------------------- members that are not keys
def _members(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
        return {info.filename: archive.read(info) for info in archive.infolist()}


@pytest.fixture
def archive_with_foreign_members(tmp_path):
    """netcdf-c's layout plus what people's tools add: a README, macOS metadata, a backslash name."""
    path = tmp_path / "ds.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ds/", b"")
        archive.writestr("ds/.zgroup", b'{"zarr_format": 2}')
        archive.writestr("ds/v/0", b"\x01\x02", compress_type=zipfile.ZIP_DEFLATED)
        archive.writestr("README.txt", b"read me " * 100, compress_type=zipfile.ZIP_DEFLATED)
        archive.writestr("__MACOSX/ds/._v", b"\x00\x05\x16\x07 apple double")
        archive.writestr("ds/a\\..\\..\\evil", b"windows escape")
    return path


def test_rewrites_keep_members_that_are_not_keys_byte_for_byte(archive_with_foreign_members):
    path = archive_with_foreign_members
    before = _members(path)
    with open_map(str(path), "a") as zmap:
        assert zmap.search("/") == [".zgroup", "v"]  # the backslash name is no key: never listed or read
        zmap.write("/v/1", b"new")
        zmap.delete("/v/0")
    after = _members(path)
    for name in ("README.txt", "__MACOSX/ds/._v", "ds/a\\..\\..\\evil", "ds/.zgroup"):
        assert after[name] == before[name]
    assert after["ds/v/1"] == b"new" and "ds/v/0" not in after
    assert sorted(n for n in after if n.startswith("ds/")) == sorted(
        ["ds/", "ds/.zgroup", "ds/v/", "ds/v/1", "ds/a\\..\\..\\evil"]
    )


def test_an_undecodable_foreign_member_does_not_block_updates(tmp_path):
    path = tmp_path / "ds.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ds/.zgroup", b"{}")
        archive.writestr("junk.bin", b"x" * 1000, compress_type=zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("junk.bin")
        data_start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    with open(path, "r+b") as handle:  # damage the deflated stream of the foreign member
        handle.seek(data_start)
        handle.write(b"\xff\xff\xff\xff")
    for round_number in range(2):
        with open_map(str(path), "a") as zmap:
            zmap.write(f"/k{round_number}", b"ok")
    with open_map(str(path), "r") as zmap:
        assert zmap.read("/k0") == b"ok" and zmap.read("/k1") == b"ok"


@pytest.mark.parametrize("key", ["/a\\b", "/v/..\\..\\x", "\\"])
def test_backslash_keys_are_refused(tmp_path, key):
    with open_map(str(tmp_path / "ds.zip"), "w") as zmap, pytest.raises(KeyNameError, match="backslash"):
        zmap.write(key, b"x")


# ---------------------------------------------------------------------------- one archive per open map
def _replace_archive(path) -> None:
    with open_map(str(path), "a") as writer:  # commits a new archive under the same path
        writer.delete("/a")
        writer.write("/0", b"0" * 50)
        writer.write("/b", b"b" * 30)


def test_an_archive_replaced_while_it_is_being_opened_is_read_consistently(tmp_path, monkeypatch):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}", "/a": b"A" * 100, "/b": b"B" * 100})
    original = zip_driver._open_zip

    def open_then_replace(*args):
        opened = original(*args)  # the central directory is read here...
        monkeypatch.setattr(zip_driver, "_open_zip", original)
        _replace_archive(path)  # ...and another process commits before any member is read
        return opened

    monkeypatch.setattr(zip_driver, "_open_zip", open_then_replace)
    with open_map(str(path), "r") as reader:
        assert reader.read("/b", 10, 20) == b"B" * 20
        assert reader.read("/a") == b"A" * 100


def test_a_reader_keeps_reading_the_archive_it_opened_while_a_writer_replaces_it(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}", "/a": b"A" * 100, "/b": b"B" * 100})
    with open_map(str(path), "r") as reader:
        _replace_archive(path)
        assert reader.read("/b", 10, 20) == b"B" * 20
        assert reader.read("/a") == b"A" * 100
        assert reader.read("/b") == b"B" * 100
    with open_map(str(path), "r") as fresh:
        assert fresh.read("/b") == b"b" * 30 and not fresh.exists("/a")


def test_a_local_header_naming_another_member_is_an_error(tmp_path):
    path = tmp_path / "ds.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ds/.zgroup", b"{}")
        archive.writestr("ds/aa", b"first")
        archive.writestr("ds/bb", b"other")
    data = path.read_bytes()
    # rename the member in the central directory only: its local header still says ds/aa
    central = data.rindex(b"ds/aa")
    path.write_bytes(data[:central] + b"ds/cc" + data[central + 5 :])
    with open_map(str(path), "r") as zmap:
        assert zmap.search("/") == [".zgroup", "bb", "cc"]
        with pytest.raises(StorageError, match="local header does not match"):
            zmap.read("/cc", 0, 2)


# ---------------------------------------------------------------------------- killed writers
COMMITS_SLOWLY = """
    import nczmap
    zmap = nczmap.open_map({path!r}, "a")
    for i in range(96):
        zmap.write(f"/v/{{i}}", bytes([i]) * (1 << 20))
    zmap.close()  # killed while this writes the new archive
"""


def test_a_killed_commit_keeps_the_archive_and_the_next_writer_removes_its_partial_file(tmp_path):
    path = tmp_path / "ds.zip"
    write_store(path, {"/.zgroup": b"{}", "/v/old": b"old"})
    original = path.read_bytes()
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(COMMITS_SLOWLY.format(path=str(path)))])
    deadline = time.monotonic() + 60
    while not _partial_archives(tmp_path):
        assert time.monotonic() < deadline and writer.poll() is None, "the commit was never seen"
        time.sleep(0.001)
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    partial = _partial_archives(tmp_path)
    assert partial, "the kill came after the commit"
    assert path.read_bytes() == original
    with open_map(str(path), "r") as reader:  # readers neither see nor touch it
        assert reader.search("/v") == ["old"]
    assert partial[0] in os.listdir(tmp_path)
    with open_map(str(path), "a") as zmap:
        assert zmap.read("/v/old") == b"old"
    assert os.listdir(tmp_path) == ["ds.zip"]


def _partial_archives(directory) -> list[str]:
    return [name for name in os.listdir(directory) if name.startswith(TEMP_PREFIX) and "-lock-" not in name]
