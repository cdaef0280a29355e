"""Appending to a manifest: one writer at a time, Parquet saves that cost what changed and are atomic, readers
of the replaced version (real files and processes, no mocks; the kerchunk Parquet reader of fsspec + zarr
checks what nczmap writes)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("fsspec")
from manifest_append_child import (
    NEW,
    OLD,
    RECORD_SIZE,
    append,
    create,
    url_of,
    values,
    zarray,
)
from test_manifest_parquet import zarr_array

import nczmap
from nczmap.errors import DatasetExists, DatasetLocked, DatasetNotFound, StorageError
from nczmap.format import open_on
from nczmap.zmap import manifest_save

pytestmark = [  # pandas 3 deprecates the fastparquet engine that fsspec still defaults to
    pytest.mark.filterwarnings("ignore:The 'fastparquet' engine is deprecated"),
    pytest.mark.filterwarnings("ignore:The 'future.infer_string' option is deprecated"),
]

CHILD = Path(__file__).with_name("manifest_append_child.py")
TEMP = ".nczmap-tmp-"


def siblings(root) -> list[str]:
    """What writers left beside the manifest (reserved names)."""
    return sorted(name for name in os.listdir(root) if name.startswith(TEMP))


def kinds(root) -> list[str]:
    return [name[len(TEMP) :].split("-")[0] for name in siblings(root)]


def observed(root) -> str:
    """Which version a fresh reader finds, "old" or "new", every value compared, through nczmap and
    through fsspec's ReferenceFileSystem + zarr (which read kerchunk Parquet without nczmap); anything
    else fails."""
    with nczmap.open_dataset(url_of(root)) as ds:
        ours = {name: ds.variables[name][...] for name in ("v", "c")}
    theirs = {name: zarr_array(Path(root) / "refs.parq", name)[...] for name in ("v", "c")}
    for state, rows in (("old", OLD), ("new", NEW)):
        expected = values(rows)
        if all(np.array_equal(ours[name], expected[name]) for name in expected):
            for name in expected:
                np.testing.assert_array_equal(theirs[name], expected[name], err_msg=f"{state} {name}")
            return state
    pytest.fail(f"neither the old nor the new dataset: {ours}")


def records(root, array: str = "v") -> dict[str, os.stat_result]:
    directory = Path(root) / "refs.parq" / array
    return {path.name: path.stat() for path in directory.iterdir()}


# ============================================================================================ one writer
def manifest_with_chunks(root: Path, kind: str) -> str:
    """A manifest (JSON, or Parquet of record size 4) of one array ``v`` (400 x 4, a row a chunk) whose
    first ten rows are referenced in ``data.bin``: the others are for the writers to add."""
    data = np.arange(400 * 4, dtype="<i4").reshape(400, 4)
    (root / "data.bin").write_bytes(data.tobytes())
    url = f"file://{root}/refs.{'json' if kind == 'json' else 'parq'}#mode=zarr,manifest"
    with nczmap.open_map(url, "w") as zmap:
        zmap.manifest.record_size = RECORD_SIZE
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
        zmap.write("/v/.zarray", zarray((400, 4), (1, 4)))
        add_rows(zmap, range(10))
    return url


def add_rows(zmap, rows) -> None:
    rows = list(rows)
    zmap.set_chunk_references(
        "/v", [f"{r}.0" for r in rows], "data.bin", [r * 16 for r in rows], [16] * len(rows)
    )


def rows_held(url: str) -> list[int]:
    with nczmap.open_map(url, "r") as zmap:
        return sorted(int(name.split(".")[0]) for name in zmap.search("/v") if not name.startswith("."))


@pytest.mark.parametrize("kind", ["json", "parquet"])
def test_two_writer_threads_take_turns_and_both_keep_their_chunks(tmp_path, kind, monkeypatch):
    url = manifest_with_chunks(tmp_path, kind)
    monkeypatch.setenv("NCZMAP_LOCK_TIMEOUT", "30")
    spans: dict[str, tuple[float, float, bool]] = {}
    start = threading.Barrier(2)

    def writer(name: str, rows: range, others: range) -> None:
        start.wait()
        with nczmap.open_map(url, "r+") as zmap:
            opened = time.monotonic()
            saw = all(zmap.exists(f"/v/{row}.0") for row in others)  # what it loaded
            add_rows(zmap, rows)
            time.sleep(0.2)  # holding the lock: the other writer waits
            closing = time.monotonic()
        spans[name] = (opened, closing, saw)

    threads = [
        threading.Thread(target=writer, args=("a", range(100, 110), range(200, 210))),
        threading.Thread(target=writer, args=("b", range(200, 210), range(100, 110))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first, second = sorted(spans.values())
    assert second[0] > first[1], "the second writer opened before the first had saved"
    assert (first[2], second[2]) == (False, True)  # the second loaded what the first saved
    assert rows_held(url) == [*range(10), *range(100, 110), *range(200, 210)]


@pytest.mark.parametrize("kind", ["json", "parquet"])
def test_a_second_writer_is_refused_naming_the_holder_and_readers_go_on(tmp_path, kind, monkeypatch):
    url = manifest_with_chunks(tmp_path, kind)
    path = url.partition("#")[0][len("file://") :]
    monkeypatch.setenv("NCZMAP_LOCK_TIMEOUT", "0")
    holder = nczmap.open_map(url, "r+")
    add_rows(holder, [50])
    for mode in ("r+", "a", "w"):
        with pytest.raises(DatasetLocked, match=f"in this process \\(pid {os.getpid()}\\)") as refused:
            nczmap.open_map(url, mode)
        assert path in str(refused.value)
    with nczmap.open_map(url, "r") as reader:  # readers take no lock: they read the saved version
        assert reader.exists("/v/9.0") and not reader.exists("/v/50.0")
    holder.close()
    with nczmap.open_map(url, "r+") as zmap:
        add_rows(zmap, [60])
    assert rows_held(url) == [*range(10), 50, 60]
    assert [n for n in os.listdir(tmp_path) if "lock" in n] == []  # the lock file went with the writer


@pytest.mark.parametrize("kind", ["json", "parquet"])
def test_an_aborted_or_dropped_writer_releases_the_lock_and_saves_nothing(tmp_path, kind, monkeypatch):
    import gc

    url = manifest_with_chunks(tmp_path, kind)
    monkeypatch.setenv("NCZMAP_LOCK_TIMEOUT", "0")
    zmap = nczmap.open_map(url, "r+")
    add_rows(zmap, [80])
    zmap.abort()
    dropped = nczmap.open_map(url, "a")  # the lock was released
    add_rows(dropped, [81])
    del dropped
    gc.collect()
    with nczmap.open_map(url, "r+") as zmap:  # a writer dropped without closing gave it up too
        add_rows(zmap, [82])
    assert rows_held(url) == [*range(10), 82]
    assert kinds(tmp_path) == (["retired"] if kind == "parquet" else [])


HOLDER = """
    import sys
    import nczmap
    zmap = nczmap.open_map(sys.argv[1], "r+")
    print("ready", flush=True)
    sys.stdin.readline()
    zmap.close()
"""

UPDATER = """
    import json, os, sys, time
    import nczmap
    url, first, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    while not os.path.exists(go):
        time.sleep(0.001)
    acknowledged, refused = [], []
    for session in range(8):
        rows = list(range(first + session * 5, first + session * 5 + 5))
        try:
            with nczmap.open_map(url, "r+") as zmap:
                zmap.set_chunk_references(
                    "/v", [f"{r}.0" for r in rows], "data.bin", [r * 16 for r in rows], [16] * 5
                )
        except nczmap.NCZError as exc:
            refused.append(str(exc))
        else:
            acknowledged.extend(rows)
    print(json.dumps({"acknowledged": acknowledged, "refused": refused}))
"""


def start_python(code: str, *args: str, timeout: str = "60") -> subprocess.Popen:
    env = {**os.environ, "NCZMAP_LOCK_TIMEOUT": timeout}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("kind", ["json", "parquet"])
def test_two_writer_processes_lose_no_acknowledged_chunk(tmp_path, kind, monkeypatch):
    url = manifest_with_chunks(tmp_path, kind)
    # a writer in another process holds the manifest: refused, naming it
    holder = start_python(HOLDER, url)
    try:
        assert holder.stdout.readline() == "ready\n", holder.stderr.read()
        monkeypatch.setenv("NCZMAP_LOCK_TIMEOUT", "0.2")
        with pytest.raises(DatasetLocked, match=f"process {holder.pid} on host"):
            nczmap.open_map(url, "r+")
    finally:
        holder.communicate("\n", timeout=60)
    # two processes appending at once, eight sessions each: every acknowledged chunk is there
    go = tmp_path / "go"
    writers = [start_python(UPDATER, url, str(first), str(go)) for first in (100, 200)]
    go.touch()
    acknowledged = []
    for writer in writers:
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
        result = json.loads(out)
        assert not result["refused"], result["refused"][:1]  # each waited for the other
        acknowledged.extend(result["acknowledged"])
    assert len(acknowledged) == 80
    assert rows_held(url) == sorted([*range(10), *acknowledged])
    with nczmap.open_dataset(url) as ds:
        v = ds.variables["v"][...]
        expected = np.arange(400 * 4, dtype="<i4").reshape(400, 4)
        held = sorted([*range(10), *acknowledged])
        np.testing.assert_array_equal(v[held], expected[held])


# ======================================================================================= what a save costs
def test_an_append_rewrites_only_the_last_record_and_adds_new_ones(tmp_path):
    create(tmp_path)
    before = records(tmp_path)
    last = f"refs.{(OLD - 1) // RECORD_SIZE}.parq"  # 42 rows of 4 chunks a record: refs.10 holds 2
    assert len(before) == 11 and last in before
    # every other record file becomes garbage, in place: a save that read one would fail
    kept = sorted(name for name in before if name != last)
    originals = {}
    for name in kept:
        path = tmp_path / "refs.parq" / "v" / name
        originals[name] = path.read_bytes()
        with open(path, "r+b") as handle:
            handle.write(b"not parquet at all " * 4)
            handle.truncate()
    append(tmp_path)
    after = records(tmp_path)
    assert sorted(after) == sorted([*before, "refs.11.parq"])
    for name in kept:  # the very same files, linked into the new version, unread and unwritten
        assert (after[name].st_dev, after[name].st_ino) == (before[name].st_dev, before[name].st_ino), name
        assert (tmp_path / "refs.parq" / "v" / name).read_bytes().startswith(b"not parquet at all")
    assert after[last].st_ino != before[last].st_ino  # rewritten: its padding rows are chunks now
    assert kinds(tmp_path) == ["retired"]  # the replaced version, kept for its readers
    # the original bytes back in the same inodes: the new version reads the old chunks and the new ones
    for name, data in originals.items():
        (tmp_path / "refs.parq" / "v" / name).write_bytes(data)
    assert observed(tmp_path) == "new"


def test_an_append_through_the_format_layer_reads_no_unchanged_record(tmp_path):
    url = f"file://{tmp_path}/refs.parq#mode=nczarr,manifest"
    with nczmap.create_dataset(url) as ds:
        ds.zmap.manifest.record_size = 3
        ds.create_dimension("time", 12)
        ds.create_dimension("x", 2)
        v = ds.create_variable("v", ("time", "x"), "i4", chunks=(1, 2), fill_value=-9)
        t = ds.create_variable("time", ("time",), "f8", chunks=(4,))
        v[...] = np.arange(24).reshape(12, 2)
        t[...] = np.arange(12.0)
    garbage = sorted(records(tmp_path))  # 12 chunks, 4 full records: none changes in the append
    for name in garbage:
        (tmp_path / "refs.parq" / "v" / name).write_bytes(b"garbage")
    zmap = nczmap.open_map(url, "r+")
    try:
        dataset = open_on(zmap, "r+")
        dimension = dataset.dimensions["time"]
        dimension.size = 14
        dataset.writer.touch_dimension_users(dimension)
        dataset.variables["v"][12:] = [[24, 25], [26, 27]]
        dataset.variables["time"][...] = np.arange(14.0)  # rewritten whole, one chunk more
        dataset.flush()
    except BaseException:
        zmap.abort()
        raise
    zmap.close()
    assert sorted(records(tmp_path)) == sorted([*garbage, "refs.4.parq"])
    assert all((tmp_path / "refs.parq" / "v" / name).read_bytes() == b"garbage" for name in garbage)
    with nczmap.open_dataset(url) as ds:
        np.testing.assert_array_equal(ds.variables["time"][...], np.arange(14.0))
        np.testing.assert_array_equal(ds.variables["v"][12:], [[24, 25], [26, 27]])


@pytest.mark.parametrize("shape", [(5, 5), (3, 7), (5, 7), (2, 5), (3, 3)])
def test_a_grid_changed_along_any_axis_gives_the_right_chunks(tmp_path, shape):
    """(5, 5) grows along the first axis only (records kept); the others lay the table out again."""
    data = np.arange(5 * 7, dtype="<i4").reshape(5, 7) * 3 + 1
    (tmp_path / "data.bin").write_bytes(data.tobytes())
    url = f"file://{tmp_path}/refs.parq#mode=zarr,manifest"

    def reference(zmap, rows, columns) -> None:  # chunk (i, j) of 1 x 2: the row's bytes at columns 2j..
        for i in range(rows):
            for j in range(-(-columns // 2)):
                width = min(2, columns - 2 * j)
                if width == 2:
                    zmap.set_reference(f"/m/{i}.{j}", "data.bin", (i * 7 + 2 * j) * 4, 8)
                else:  # an edge chunk of one value: inline, padded with the fill value
                    zmap.write(f"/m/{i}.{j}", np.array([data[i, 2 * j], -1], "<i4").tobytes())

    with nczmap.open_map(url, "w") as zmap:
        zmap.manifest.record_size = 2
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
        zmap.write("/m/.zarray", zarray((3, 5), (1, 2)))
        zmap.write("/m/.zattrs", b'{"_ARRAY_DIMENSIONS": ["y", "x"]}')
        reference(zmap, 3, 5)
    with nczmap.open_map(url, "r+") as zmap:
        zmap.write("/m/.zarray", zarray(shape, (1, 2)))
        for i in range(shape[0]):  # every chunk of the new grid set again (edge chunks change)
            for j in range(-(-shape[1] // 2)):
                zmap.delete(f"/m/{i}.{j}")
        reference(zmap, *shape)
    expected = data[: shape[0], : shape[1]]
    with nczmap.open_dataset(url) as ds:
        np.testing.assert_array_equal(ds.variables["m"][...], expected)
    np.testing.assert_array_equal(zarr_array(tmp_path / "refs.parq", "m")[...], expected)


def test_an_unchanged_record_is_copied_where_the_file_system_cannot_link(tmp_path, monkeypatch):
    create(tmp_path)
    before = records(tmp_path)

    def cannot_link(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", cannot_link)
    append(tmp_path)
    monkeypatch.undo()
    after = records(tmp_path)
    assert after["refs.0.parq"].st_ino != before["refs.0.parq"].st_ino
    assert observed(tmp_path) == "new"


def test_the_swap_falls_back_to_two_renames_where_names_cannot_be_exchanged(tmp_path, monkeypatch):
    create(tmp_path)
    monkeypatch.setattr(manifest_save, "_exchange", lambda a, b: False)
    append(tmp_path)
    assert kinds(tmp_path) == ["retired"]
    assert observed(tmp_path) == "new"


# ============================================================================================ killed writers
def start_child(root, stop: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "NCZMAP_TEST_STOP": stop or ""}
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def recover(root) -> None:
    """The next writer: opening the manifest for writing (and saving nothing) cleans up what the killed
    one left, putting back a version moved aside."""
    with nczmap.open_map(url_of(root), "r+"):
        pass
    assert siblings(root) == []


@pytest.mark.parametrize(
    "stop, state",
    [("writing", "old"), ("linking", "old"), ("staged", "old"), ("exchanged", "new"), ("aside", "old")],
)
def test_a_writer_killed_at_each_step_leaves_the_old_or_the_new_dataset(tmp_path, stop, state):
    create(tmp_path)
    child = start_child(tmp_path, stop)
    out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, err
    assert out == "ready\n"
    left = kinds(tmp_path)
    assert "lock" in left  # the dead writer's lock file, still naming it
    if stop == "aside":  # between the two renames of the fallback: the old version is aside
        assert "old" in left and not (tmp_path / "refs.parq").exists()
        with pytest.raises(DatasetNotFound):
            nczmap.open_dataset(url_of(tmp_path))
    else:
        assert observed(tmp_path) == state
    recover(tmp_path)
    assert observed(tmp_path) == state
    append(tmp_path)  # and the next append succeeds
    assert observed(tmp_path) == "new"
    assert kinds(tmp_path) == ["retired"]


def test_a_writer_killed_at_random_moments_leaves_the_old_or_the_new_dataset(tmp_path):
    """30 writers killed at random moments of their append (open, lock, load, changes, save, swap)."""
    calibration = tmp_path / "calibration"
    create(calibration)
    child = start_child(calibration)
    assert child.stdout.readline() == "ready\n"
    started = time.monotonic()
    assert child.stdout.readline() == "done\n"
    duration = time.monotonic() - started  # of the append alone
    child.communicate(timeout=60)
    seen = []
    generator = random.Random(20260101)
    for run in range(30):
        root = tmp_path / f"run{run}"
        create(root)
        child = start_child(root)
        assert child.stdout.readline() == "ready\n", child.stderr.read()
        time.sleep(generator.uniform(0, duration * 1.1))
        child.kill()
        child.communicate(timeout=60)
        state = observed(root)
        seen.append(state if child.returncode == -signal.SIGKILL else "finished")
        assert set(kinds(root)) <= {"lock", "copy", "retired"}
        recover(root)
        assert observed(root) == state
        append(root)
        assert observed(root) == "new"
    assert "old" in seen and len(seen) == 30, seen  # some were killed before their swap


# ============================================================================================ readers
def test_a_reader_opened_before_a_save_reads_the_version_it_opened(tmp_path):
    create(tmp_path)
    early = nczmap.open_dataset(url_of(tmp_path))  # reads .zmetadata only, no record yet
    idle = nczmap.open_map(url_of(tmp_path), "r")
    try:
        append(tmp_path)  # rewrites the last record of v, and c whole
        # the reader reads its own version, from the directory it holds (now retired): old values
        expected = values(OLD)
        np.testing.assert_array_equal(early.variables["v"][...], expected["v"])
        np.testing.assert_array_equal(early.variables["c"][...], expected["c"])
        assert observed(tmp_path) == "new"
        # the next writer removes that version: a reader still holding it is told so, never served fills
        with nczmap.open_map(url_of(tmp_path), "r+"):
            pass
        assert kinds(tmp_path) == []
        with pytest.raises(StorageError, match="replaced while open"):
            idle.read("/v/9.0")
        with pytest.raises(StorageError, match="replaced while open"):
            idle.exists("/v/30.0")
        with pytest.raises(StorageError, match="replaced while open"):
            idle.search("/v")
        np.testing.assert_array_equal(early.variables["v"][...], expected["v"])  # all of it was cached
    finally:
        early.close()
        idle.close()


def test_a_record_found_missing_in_a_manifest_being_removed_is_an_error(tmp_path):
    """The next writer removes a replaced version's .zmetadata first: a reader finding a record missing
    then knows it was removed, not absent (an absent record would read as fill values)."""
    create(tmp_path)
    reader = nczmap.open_map(url_of(tmp_path), "r")
    try:
        append(tmp_path)
        (retired,) = siblings(tmp_path)
        assert reader.read("/v/0.0") == values(OLD)["v"][0].tobytes()
        (tmp_path / retired / "v" / "refs.3.parq").unlink()  # as the removal goes on ...
        assert reader.read("/v/20.0") == values(OLD)["v"][20].tobytes()  # ... before .zmetadata: read
        (tmp_path / retired / ".zmetadata").unlink()  # the removal as the next writer does it
        (tmp_path / retired / "v" / "refs.4.parq").unlink()
        with pytest.raises(StorageError, match="replaced while open"):
            reader.read("/v/17.0")
    finally:
        reader.close()


# ============================================================================================ odds and ends
def test_creating_a_parquet_manifest_over_another_directory_is_refused(tmp_path):
    target = tmp_path / "refs.parq"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    for mode in ("w", "a"):
        with pytest.raises(DatasetExists, match="refusing to create a Parquet manifest"):
            nczmap.open_map(f"file://{target}#mode=zarr,manifest", mode)
    assert (target / "notes.txt").read_text() == "mine" and siblings(tmp_path) == []


def test_what_a_killed_json_writer_left_is_removed_by_the_next_writer(tmp_path):
    url = manifest_with_chunks(tmp_path, "json")
    left = tmp_path / f"{TEMP}commit-0123456789abcdef-refs.json"
    left.write_text("{half a manifest")
    (tmp_path / f"{TEMP}lock-refs.json").write_text("12345 elsewhere 2026-01-01T00:00:00\n")
    with nczmap.open_map(url, "r+") as zmap:
        add_rows(zmap, [70])
    assert siblings(tmp_path) == [] and rows_held(url) == [*range(10), 70]


def test_a_manifest_open_for_writing_refuses_to_travel(tmp_path):
    import pickle

    url = manifest_with_chunks(tmp_path, "parquet")
    with nczmap.open_map(url, "r+") as zmap, pytest.raises(StorageError, match="open for writing"):
        pickle.dumps(zmap)
    with nczmap.open_map(url) as zmap, pickle.loads(pickle.dumps(zmap)) as copy:
        assert copy.read("/v/3.0") == zmap.read("/v/3.0")
