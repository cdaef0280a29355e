"""A small virtual dataset in a kerchunk Parquet manifest, and a writer appending to it (tests/
test_manifest_append.py); run as a script, the writer is a process the tests kill.

    python manifest_append_child.py ROOT [STOP]

appends to ``ROOT/refs.parq`` (its references into ``ROOT/src/data.bin``), printing ``ready`` once
imported. ``STOP`` (or the environment variable ``NCZMAP_TEST_STOP``) names a point of the save where the
writer kills itself (SIGKILL), as a crash there would:

- ``writing``: the new version half written (after its second record file);
- ``linking``: after the first unchanged record file was linked into it;
- ``staged``: the new version complete and on disk, just before the swap;
- ``exchanged``: just after the swap, before the replaced version is renamed ``retired``;
- ``aside``: the swap done as where names cannot be exchanged, killed between moving the old version
  aside and moving the new one in.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np

RECORD_SIZE = 4
OLD, NEW = 42, 45  # rows of ``v`` (and values of ``c``) before and after the append
WIDTH = 4
STOPS = ("writing", "linking", "staged", "exchanged", "aside")


def zarray(shape, chunks, dtype="<i4", fill=-1) -> bytes:
    document = {
        "shape": list(shape),
        "chunks": list(chunks),
        "dtype": dtype,
        "compressor": None,
        "fill_value": fill,
        "filters": None,
        "order": "C",
        "zarr_format": 2,
    }
    return json.dumps(document).encode()


def url_of(root) -> str:
    return f"file://{root}/refs.parq#mode=zarr,manifest"


def source_of(root) -> str:
    return f"{root}/src/data.bin"


def values(rows: int) -> dict[str, np.ndarray]:
    """What the dataset holds with ``rows`` rows: ``v`` referenced in ``src/data.bin``, ``c`` inline."""
    v = np.arange(NEW * WIDTH, dtype="<i4").reshape(NEW, WIDTH)[:rows] * 7 + 3
    c = np.arange(rows, dtype="<i4") * 10 + (rows == NEW)  # every value differs between the versions
    return {"v": v, "c": c}


def create(root) -> None:
    """The dataset before the append: ``v`` (42 x 4, a row a chunk: 11 records of 4 chunks, the last
    partial) referenced in ``src/data.bin``, ``c`` (42, chunks of 8) inline."""
    import nczmap

    os.makedirs(f"{root}/src", exist_ok=True)
    with open(source_of(root), "wb") as handle:
        handle.write(values(NEW)["v"].tobytes())
    old = values(OLD)
    with nczmap.open_map(url_of(root), "w") as zmap:
        zmap.manifest.record_size = RECORD_SIZE
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
        zmap.write("/.zattrs", b'{"title": "append test"}')
        zmap.write("/v/.zarray", zarray((OLD, WIDTH), (1, WIDTH)))
        zmap.write("/v/.zattrs", b'{"_ARRAY_DIMENSIONS": ["t", "x"]}')
        rows = range(OLD)
        offsets = [row * WIDTH * 4 for row in rows]
        zmap.set_chunk_references("/v", [f"{row}.0" for row in rows], "src/data.bin", offsets, [16] * OLD)
        zmap.write("/c/.zarray", zarray((OLD,), (8,)))
        zmap.write("/c/.zattrs", b'{"_ARRAY_DIMENSIONS": ["t"]}')
        for index in range(-(-OLD // 8)):
            chunk = np.full(8, -1, "<i4")
            part = old["c"][index * 8 : (index + 1) * 8]
            chunk[: len(part)] = part
            zmap.write(f"/c/{index}", chunk.tobytes())


def append(root, containers=None) -> None:
    """The append: ``v`` grows along its first axis by three rows (references to the source), ``c`` is
    rewritten whole with a new chunk shape (one chunk of 45, inline)."""
    import nczmap

    new = values(NEW)
    with nczmap.open_map(url_of(root), "r+", containers=containers) as zmap:
        zmap.write("/v/.zarray", zarray((NEW, WIDTH), (1, WIDTH)))
        rows = range(OLD, NEW)
        offsets = [row * WIDTH * 4 for row in rows]
        zmap.set_chunk_references("/v", [f"{row}.0" for row in rows], source_of(root), offsets, [16] * 3)
        zmap.write("/c/.zarray", zarray((NEW,), (NEW,)))
        zmap.write("/c/0", new["c"].tobytes())


def _kill() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def stop_at(point: str) -> None:
    """Make this process kill itself at ``point`` of the next save (see the module's documentation)."""
    from nczmap.zmap import manifest_save

    if point not in STOPS:
        raise SystemExit(f"unknown stop {point!r}")
    if point in ("writing", "linking"):
        method = "write" if point == "writing" else "keep"
        original = getattr(manifest_save._Staging, method)
        calls = []

        def counted(self, name, *args):
            original(self, name, *args)
            calls.append(name)
            if len(calls) == (2 if point == "writing" else 1):
                _kill()

        setattr(manifest_save._Staging, method, counted)
    elif point == "staged":
        manifest_save.put_in_place = lambda staging, real: _kill()
    elif point == "exchanged":
        manifest_save._retire = lambda path, real: _kill()
    else:
        manifest_save._exchange = lambda a, b: False
        manifest_save.move_in = lambda staging, real: _kill()


if __name__ == "__main__":
    # imported before "ready": the kill's delay then covers the append alone
    import pyarrow.parquet  # noqa: F401

    import nczmap  # noqa: F401

    point = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("NCZMAP_TEST_STOP")
    if point:
        stop_at(point)
    print("ready", flush=True)
    append(sys.argv[1])
    print("done", flush=True)
