"""The chunk files a manifest keeps beside itself (``<manifest>.<token>.chunks``: nczmap.zmap.sidecar)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

import nczmap
from nczmap.zmap.manifest import INLINE_LIMIT


def _open(path, mode):
    zmap = nczmap.open_map(f"file://{path}#mode=manifest", mode)
    if mode != "r":
        zmap.keep_large_chunks_beside()
    return zmap


def test_chunks_appended_after_a_read_are_readable(tmp_path):
    """Reading a chunk of the file being written, then writing another, must not keep the first size."""
    path = tmp_path / "refs.json"
    first, second, third = (os.urandom(INLINE_LIMIT + n) for n in (1, 2, 3))
    with _open(path, "w") as zmap:
        zmap.write("/a/.zarray", b"{}")
        zmap.write("/a/0", first)
        assert zmap.read("/a/0") == first
        zmap.write("/a/1", second)
        assert zmap.read("/a/1") == second
        assert zmap.read_many_into([("/a/1", memoryview(bytearray(len(second))))]) == [len(second)]
    with _open(path, "r+") as zmap:
        assert zmap.read("/a/0") == first  # the file in place, before anything is appended
        zmap.write("/a/2", third)
        assert zmap.read("/a/2") == third
        assert zmap.read("/a/0") == first
    with _open(path, "r") as zmap:
        assert [zmap.read(f"/a/{i}") for i in range(3)] == [first, second, third]


def chunk_files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "refs.json")


def test_aborted_writer_leaves_the_chunk_file_alone(tmp_path):
    path = tmp_path / "refs.json"
    first = os.urandom(INLINE_LIMIT + 1)
    with _open(path, "w") as zmap:
        zmap.write("/a/.zarray", b"{}")
        zmap.write("/a/0", first)
    [name] = chunk_files(tmp_path)
    before = (tmp_path / name).read_bytes()
    zmap = _open(path, "r+")
    zmap.write("/a/1", os.urandom(INLINE_LIMIT + 1))
    zmap.abort()
    assert chunk_files(tmp_path) == [name] and (tmp_path / name).read_bytes() == before
    with _open(path, "r") as zmap:
        assert zmap.read("/a/0") == first


def test_a_writer_failing_after_its_chunk_file_leaves_the_old_manifest_readable(tmp_path, monkeypatch):
    """The chunk file of a session gets a name of its own: the old manifest's files are never touched."""
    from nczmap.zmap.manifest import ManifestMap

    path = tmp_path / "refs.json"
    first = os.urandom(INLINE_LIMIT + 1)
    with _open(path, "w") as zmap:
        zmap.write("/a/.zarray", b"{}")
        zmap.write("/a/0", first)
    zmap = _open(path, "r+")
    zmap.write("/a/0", os.urandom(INLINE_LIMIT + 2))

    def crash(self):
        raise OSError("killed before the manifest was saved")

    monkeypatch.setattr(ManifestMap, "_save", crash)
    with pytest.raises(OSError):
        zmap.close()
    monkeypatch.undo()
    with _open(path, "r") as zmap:
        assert zmap.read("/a/0") == first
    with _open(path, "r+") as zmap:  # the next writer removes what no manifest names
        zmap.write("/a/1", os.urandom(INLINE_LIMIT + 3))
    assert len(chunk_files(tmp_path)) == 2  # the first file and this session's


WRITER = """
import os, sys
import nczmap
path = sys.argv[1]
for n in range(1000):
    zmap = nczmap.open_map(f"file://{path}#mode=manifest", "r+")
    zmap.keep_large_chunks_beside()
    zmap.write(f"/a/{n % 7}", bytes([n % 251]) * (70000 + n))
    zmap.close()
"""


def test_a_writer_killed_at_random_moments_never_breaks_the_manifest(tmp_path):
    path = tmp_path / "refs.json"
    with _open(path, "w") as zmap:
        zmap.write("/a/.zarray", b"{}")
        zmap.write("/a/0", os.urandom(INLINE_LIMIT + 1))
    rng = random.Random(5)
    for _ in range(6):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
        time.sleep(rng.uniform(0.3, 1.5))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        with _open(path, "r") as zmap:  # every chunk the saved manifest names reads whole
            for name in [n for n in zmap.search("/a") if n not in (".zarray", "0")]:
                data = zmap.read(f"/a/{name}")
                assert len(data) >= 70000 and data.count(data[:1]) == len(data), name
    with _open(path, "r") as zmap:
        assert len(zmap.search("/a")) > 2  # the writers did commit between the kills
