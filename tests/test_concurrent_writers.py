"""One writer at a time on a local dataset: real processes, real files, no acknowledged write lost."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import zipfile

import pytest
from test_copy import make_store, objects_of

import nczmap
from nczmap.errors import DatasetLocked


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


def seed_dataset(path) -> None:
    with nczmap.create_dataset(str(path)) as ds:
        ds.create_dimension("x", 3)
        ds.create_variable("v", ("x",), "i4", data=[1, 2, 3])


# ---------------------------------------------------------------------------- two writers, one zip
UPDATER = """
    import json, os, sys, time
    import nczmap
    path, name, go = sys.argv[1:]
    while not os.path.exists(go):
        time.sleep(0.001)
    acknowledged, refused = [], []
    for batch in range(10):
        keys = [f"/{name}/{batch}/{i}" for i in range(50)]
        try:
            with nczmap.open_map(path, "a") as zmap:
                for key in keys:
                    zmap.write(key, key.encode())
        except nczmap.NCZError as exc:  # the writes of this session are reported lost
            refused.append([keys, str(exc)])
        else:  # close committed them: acknowledged
            acknowledged.extend(keys)
    print(json.dumps({"acknowledged": acknowledged, "refused": refused}))
"""


def test_two_processes_updating_one_zip_lose_no_acknowledged_write(tmp_path):
    path = tmp_path / "ds.zip"
    with nczmap.open_map(str(path), "w") as zmap:
        zmap.write("/.zgroup", b"{}")
    go = tmp_path / "go"
    writers = [start_python(UPDATER, str(path), name, str(go)) for name in ("a", "b")]
    go.touch()
    results = []
    for writer in writers:
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
        results.append(json.loads(out))
    with nczmap.open_map(str(path), "r") as zmap:
        for result in results:
            lost = [key for key in result["acknowledged"] if not zmap.exists(key)]
            assert not lost, f"{len(lost)} acknowledged writes vanished"
            assert all(zmap.read(key) == key.encode() for key in result["acknowledged"])
    # each writer waited for the other's commit instead of failing
    assert [len(r["acknowledged"]) for r in results] == [500, 500], [r["refused"][:1] for r in results]


# ---------------------------------------------------------------------------- the second writer is told who
HOLDER = """
    import sys
    import nczmap
    zmap = nczmap.open_map(sys.argv[1], "a")
    zmap.write("/held", b"by the holder")
    print("ready", flush=True)
    sys.stdin.readline()
    zmap.close()
    print("closed", flush=True)
"""


@pytest.mark.parametrize("suffix", ["file", "zip"])
def test_a_second_writer_is_refused_naming_the_holder_and_readers_are_not_blocked(tmp_path, suffix):
    path = tmp_path / f"ds.{suffix}"
    seed_dataset(path)
    holder = start_python(HOLDER, str(path))
    try:
        assert holder.stdout.readline() == "ready\n", holder.stderr.read()
        started = time.monotonic()
        with pytest.raises(DatasetLocked) as refused:
            _open_waiting(path, "a", 0.3)
        assert time.monotonic() - started >= 0.3
        message = str(refused.value)
        assert str(path) in message and f"process {holder.pid} " in message
        assert socket.gethostname() in message and "NCZMAP_LOCK_TIMEOUT" in message
        assert isinstance(refused.value, nczmap.StorageError) and refused.value.nc_code == -37
        for mode in ("r+", "w"):
            with pytest.raises(DatasetLocked):
                _open_waiting(path, mode, 0)
        # readers take no lock and see the last committed state
        with nczmap.open_map(str(path), "r") as reader, nczmap.open_dataset(str(path)) as ds:
            assert ds.variables["v"][:].tolist() == [1, 2, 3]
            assert reader.exists("/held") is (suffix == "file")  # zip: not committed before close
        # a writer that waits long enough gets the lock when the holder closes
        threading.Timer(0.5, lambda: (holder.stdin.write("\n"), holder.stdin.flush())).start()
        started = time.monotonic()
        with _open_waiting(path, "a", 30) as zmap:
            assert time.monotonic() - started >= 0.4
            assert zmap.read("/held") == b"by the holder"
            zmap.write("/after", b"second writer")
        assert holder.stdout.readline() == "closed\n"
    finally:
        holder.kill()
        holder.communicate()
    with nczmap.open_map(str(path), "r") as zmap:
        assert zmap.read("/after") == b"second writer"
    assert sorted(os.listdir(tmp_path)) == [path.name]  # the lock file went with the last writer


def _open_waiting(path, mode: str, seconds: float) -> nczmap.ZMap:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NCZMAP_LOCK_TIMEOUT", str(seconds))
        return nczmap.open_map(str(path), mode)


@pytest.mark.parametrize("suffix", ["file", "zip"])
def test_a_second_writable_map_in_the_same_process_is_locked_out(tmp_path, suffix, monkeypatch):
    path = tmp_path / f"ds.{suffix}"
    monkeypatch.setenv("NCZMAP_LOCK_TIMEOUT", "0")
    first = nczmap.open_map(str(path), "w")
    first.write("/a", b"1")
    with pytest.raises(DatasetLocked, match=f"in this process \\(pid {os.getpid()}\\)"):
        nczmap.open_map(str(path), "a")
    first.close()
    with nczmap.open_map(str(path), "a") as second:
        assert second.read("/a") == b"1"


def test_the_lock_timeout_must_be_a_number(tmp_path, monkeypatch):
    monkeypatch.setenv("NCZMAP_LOCK_TIMEOUT", "soon")
    with pytest.raises(nczmap.NCZError, match="NCZMAP_LOCK_TIMEOUT='soon'"):
        nczmap.open_map(str(tmp_path / "ds.file"), "w")
    with nczmap.open_map(str(tmp_path), "r"):  # readers never look at it
        pass


# ---------------------------------------------------------------------------- zip: a commit never clobbers
FOREIGN_COMMIT = """
    import os, sys, zipfile
    path, how = sys.argv[1:]
    target = path + ".new" if how == "replaced" else path
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr("ds/", b"")
        archive.writestr("ds/.zgroup", b"{}")
        archive.writestr("ds/theirs", b"written by another tool")
    if how == "replaced":
        os.replace(target, path)
"""


@pytest.mark.parametrize("how", ["replaced", "rewritten-in-place"])
def test_a_zip_commit_refuses_to_overwrite_an_archive_changed_since_it_was_opened(tmp_path, how):
    # Another program (no nczmap, so no lock) changes the archive while a map has it open for writing.
    path = tmp_path / "ds.zip"
    with nczmap.open_map(str(path), "w") as zmap:
        zmap.write("/.zgroup", b"{}")
    zmap = nczmap.open_map(str(path), "a")
    zmap.write("/mine", b"staged here")
    time.sleep(0.01)  # a rewrite in place within one mtime tick could still differ only by content
    other = start_python(FOREIGN_COMMIT, str(path), how)
    assert other.wait(timeout=60) == 0, other.stderr.read()
    other.communicate()
    theirs = path.read_bytes()
    with pytest.raises(nczmap.StorageError, match=r"changed by another writer.*discarded"):
        zmap.close()
    assert path.read_bytes() == theirs
    with zipfile.ZipFile(path) as archive:
        assert archive.read("ds/theirs") == b"written by another tool"
    assert sorted(os.listdir(tmp_path)) == ["ds.zip"]  # no commit file or lock file left


# ---------------------------------------------------------------------------- two copies, one destination
@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    where = tmp_path_factory.mktemp("sources")
    sources = [where / "one.file", where / "two.file"]
    for seed, source in enumerate(sources):
        make_store(source, chunks=1500, seed=seed)
    return sources


def _copy(source, destination, timeout: str) -> subprocess.Popen:
    env = {**os.environ, "NCZMAP_LOCK_TIMEOUT": timeout}
    return subprocess.Popen(
        [sys.executable, "-m", "nczmap", "copy", str(source), str(destination)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("timeout", ["0", "60"])
def test_two_copies_into_one_directory_give_exactly_one_source(tmp_path, two_sources, timeout):
    destination = tmp_path / "out.file"
    copies = [_copy(source, destination, timeout) for source in two_sources]
    outcomes = [(process.wait(timeout=120), process.communicate()[1]) for process in copies]
    succeeded = [source for source, (code, _) in zip(two_sources, outcomes, strict=True) if code == 0]
    for code, err in outcomes:
        if code:  # the loser is told why, and by whom
            assert code == 1 and "is open for writing by process" in err and str(destination) in err, err
    assert succeeded, outcomes
    if timeout == "60":
        assert len(succeeded) == 2, outcomes  # the second waited for the first
    result = objects_of(destination)
    assert result in [objects_of(source) for source in succeeded]
    assert os.listdir(tmp_path) == ["out.file"]


def test_a_copy_onto_a_dataset_being_written_is_refused_and_changes_nothing(tmp_path, two_sources):
    destination = tmp_path / "out.file"
    seed_dataset(destination)
    before = objects_of(destination)
    holder = start_python(HOLDER.replace('zmap.write("/held", b"by the holder")', ""), str(destination))
    try:
        assert holder.stdout.readline() == "ready\n", holder.stderr.read()
        copy = _copy(two_sources[0], destination, "0.2")
        _, err = copy.communicate(timeout=120)
        assert copy.returncode == 1
        assert f"{str(destination)!r} is open for writing by process {holder.pid} on host" in err
        assert objects_of(destination) == before
    finally:
        holder.kill()
        holder.communicate()


# ---------------------------------------------------------------------------- the lock itself
INCREMENTER = """
    import os, sys, time
    from nczmap.zmap import locking
    dataset, counter, go = sys.argv[1:]
    while not os.path.exists(go):
        time.sleep(0.001)
    for _ in range(100):
        lock = locking.acquire(dataset)
        with open(counter) as handle:
            value = int(handle.read())
        time.sleep(0.0005)  # a lost update, were two holders ever inside at once
        with open(counter, "w") as handle:
            handle.write(str(value + 1))
        lock.release()  # unlinks the lock file: waiters must not end up holding a file no longer there
"""


def test_the_lock_excludes_under_contention_while_its_file_comes_and_goes(tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("0")
    go = tmp_path / "go"
    dataset = str(tmp_path / "ds.file")
    processes = [start_python(INCREMENTER, dataset, str(counter), str(go)) for _ in range(4)]
    go.touch()
    for process in processes:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    assert counter.read_text() == "400"
    assert sorted(os.listdir(tmp_path)) == ["counter", "go"]
