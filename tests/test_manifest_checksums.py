"""Per-reference content checksums (issue 16 item 4): ``virtualize(..., checksums=True)`` records the
crc32c of every referenced range under the manifest's ``"nczmap"`` key; a read compares it, so a source
rewritten in place with its size and modification time restored is detected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nczmap
from nczmap import StorageError
from nczmap.errors import FormatError

netCDF4 = pytest.importorskip("netCDF4")

from nczmap.integrations.virtualize import virtualize  # noqa: E402

VALUES = np.arange(64 * 50, dtype="<f8").reshape(64, 50)


def write_source(path: Path) -> None:
    """One chunked, uncompressed variable (8 chunks of 8 x 50 doubles), one contiguous."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", 64)
        ds.createDimension("x", 50)
        ds.createVariable("v", "f8", ("y", "x"), chunksizes=(8, 50))[:] = VALUES
        ds.createVariable("c", "f8", ("y", "x"), contiguous=True)[:] = VALUES + 1


def url(path: Path) -> str:
    return f"file://{path}#mode=nczarr,manifest"


def read_all(manifest: Path) -> dict[str, np.ndarray]:
    with nczmap.open_dataset(url(manifest)) as ds:
        return {name: ds.variables[name][...] for name in ("v", "c")}


def read_one_chunk(manifest: Path) -> np.ndarray:
    with nczmap.open_dataset(url(manifest)) as ds:
        return ds.variables["v"][8:16, :]


def rewrite_in_place(source: Path, offset: int) -> None:
    """Flip one byte at ``offset``, keeping the size and the modification time to the nanosecond."""
    info = source.stat()
    with open(source, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert source.stat().st_size == info.st_size and source.stat().st_mtime_ns == info.st_mtime_ns


def chunk_offset(manifest: Path, key: str) -> int:
    with nczmap.open_map(url(manifest), "r") as zmap:
        return zmap.reference(key).offset


@pytest.mark.parametrize("suffix", ["json", "parq"])
def test_checksums_are_recorded_and_reads_pass(tmp_path, suffix):
    source = tmp_path / "src.nc"
    write_source(source)
    manifest = tmp_path / f"refs.{suffix}"
    result = virtualize([source], manifest, checksums=True)
    assert result.references >= 9
    with nczmap.open_map(url(manifest), "r") as zmap:
        checksums = zmap.manifest.checksums
        assert len(checksums) == result.references
        assert "v/1.0" in checksums and all(0 <= value < 1 << 32 for value in checksums.values())
    values = read_all(manifest)
    assert np.array_equal(values["v"], VALUES) and np.array_equal(values["c"], VALUES + 1)


def test_json_stores_checksums_under_the_nczmap_key_other_readers_ignore(tmp_path):
    source = tmp_path / "src.nc"
    write_source(source)
    manifest = tmp_path / "refs.json"
    virtualize([source], manifest, checksums=True)
    document = json.loads(manifest.read_text())
    crc = document["nczmap"]["crc32c"]
    assert set(crc) >= {f"v/{i}.0" for i in range(8)}
    assert not any(key.startswith("nczmap") for key in document["refs"])
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("reference", fo=str(manifest), remote_protocol="file")
    assert len(fs.cat_file("v/1.0")) == 8 * 50 * 8


@pytest.mark.parametrize("suffix", ["json", "parq"])
@pytest.mark.parametrize("how", ["whole", "one chunk"])
def test_a_same_size_same_mtime_rewrite_is_detected_naming_the_key(tmp_path, suffix, how):
    source = tmp_path / "src.nc"
    write_source(source)
    manifest = tmp_path / f"refs.{suffix}"
    virtualize([source], manifest, checksums=True)
    rewrite_in_place(source, chunk_offset(manifest, "/v/1.0") + 17)
    with pytest.raises(StorageError, match=r"v/1\.0.*src\.nc.*rewritten"):
        read_all(manifest) if how == "whole" else read_one_chunk(manifest)
    with nczmap.open_map(url(manifest), "r") as zmap:  # an untouched chunk still reads
        assert len(zmap.read("/v/0.0")) == 8 * 50 * 8
        with pytest.raises(StorageError, match=r"v/1\.0"):
            zmap.read("/v/1.0", 0, 8)  # a part of the chunk: the whole reference is checked


def test_without_checksums_the_rewrite_goes_unnoticed_the_documented_limit(tmp_path):
    source = tmp_path / "src.nc"
    write_source(source)
    manifest = tmp_path / "refs.json"
    virtualize([source], manifest)
    assert "crc32c" not in json.loads(manifest.read_text()).get("nczmap", {})
    rewrite_in_place(source, chunk_offset(manifest, "/v/1.0") + 7)
    values = read_all(manifest)["v"]  # silently the new bytes: size and mtime prove nothing about content
    assert not np.array_equal(values[8:16], VALUES[8:16])
    assert np.array_equal(values[:8], VALUES[:8])


def test_the_command_line_option(tmp_path):
    source = tmp_path / "src.nc"
    write_source(source)
    manifest = tmp_path / "refs.json"
    done = subprocess.run(
        [sys.executable, "-m", "nczmap", "virtualize", "--checksums", str(source), str(manifest)],
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert "v/0.0" in json.loads(manifest.read_text())["nczmap"]["crc32c"]


@pytest.mark.parametrize("bad", [-1, 1 << 32, "12", 1.5, True])
def test_a_checksum_that_cannot_be_compared_is_refused(tmp_path, bad):
    document = {"version": 1, "refs": {".zgroup": '{"zarr_format": 2}'}, "nczmap": {"crc32c": {"v/0": bad}}}
    manifest = tmp_path / "refs.json"
    manifest.write_text(json.dumps(document))
    with pytest.raises(FormatError, match="crc32c"):
        nczmap.open_map(url(manifest), "r")


def test_a_key_changed_in_place_loses_its_stale_checksum(tmp_path):
    source = tmp_path / "src.nc"
    write_source(source)
    manifest = tmp_path / "refs.json"
    virtualize([source], manifest, checksums=True)
    with nczmap.open_map(url(manifest), "a") as zmap:
        other = zmap.reference("/v/2.0")
        zmap.set_reference("/v/1.0", other.url, other.offset, other.length)
        assert "v/1.0" not in zmap.manifest.checksums and "v/2.0" in zmap.manifest.checksums
    assert np.array_equal(read_all(manifest)["v"][8:16], VALUES[16:24])
    with nczmap.open_map(url(manifest), "a") as zmap:
        zmap.delete("/v")
    assert not any(key.startswith("v/") for key in json.loads(manifest.read_text())["nczmap"]["crc32c"])
