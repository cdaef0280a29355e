"""The chunk file a manifest keeps beside itself (``<manifest>.chunks``, :mod:`nczmap.zmap.sidecar`)."""

from __future__ import annotations

import os

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


def test_aborted_writer_leaves_the_chunk_file_alone(tmp_path):
    path = tmp_path / "refs.json"
    first = os.urandom(INLINE_LIMIT + 1)
    with _open(path, "w") as zmap:
        zmap.write("/a/.zarray", b"{}")
        zmap.write("/a/0", first)
    before = (tmp_path / "refs.json.chunks").read_bytes()
    zmap = _open(path, "r+")
    zmap.write("/a/1", os.urandom(INLINE_LIMIT + 1))
    zmap.abort()
    assert (tmp_path / "refs.json.chunks").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["refs.json", "refs.json.chunks"]
    with _open(path, "r") as zmap:
        assert zmap.read("/a/0") == first
