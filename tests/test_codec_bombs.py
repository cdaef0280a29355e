"""Decompression bombs: every codec decodes into at most the chunk's size (issue 19, B5).

Each bomb is a chunk of a few kilobytes that inflates to 768 MiB of zeros, built with the codec's streaming
compressor (so the test itself never holds the 768 MiB); a 16-byte chunk must refuse it with a FormatError,
in a process whose peak memory stays under 400 MB.
"""

from __future__ import annotations

import bz2
import json
import lzma
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
import zstandard

import nczmap
from nczmap import FormatError

MiB = 1 << 20
BOMB = 768 * MiB
PEAK_LIMIT_MB = 400
CODECS = {
    "bz2": {"id": "bz2", "level": 1},
    "lzma": {"id": "lzma", "format": lzma.FORMAT_XZ, "check": -1, "preset": None, "filters": None},
    "zstd": {"id": "zstd", "level": 1},
    "zlib": {"id": "zlib", "level": 1},
    "gzip": {"id": "gzip", "level": 1},
}


def _streamed(compressor, total: int, flush) -> bytes:
    piece = bytes(MiB)
    return b"".join([*(compressor.compress(piece) for _ in range(total // MiB)), flush()])


def bomb(codec: str) -> bytes:
    """A chunk inflating to 768 MiB of zeros: bz2 and xz as 96 concatenated streams of 8 MiB (both decoders
    read on across streams), zstd as one frame without a content size, zlib and gzip as one stream."""
    if codec == "bz2":
        compressor = bz2.BZ2Compressor(9)
        return _streamed(compressor, 8 * MiB, compressor.flush) * (BOMB // (8 * MiB))
    if codec == "lzma":
        compressor = lzma.LZMACompressor(lzma.FORMAT_XZ)
        return _streamed(compressor, 8 * MiB, compressor.flush) * (BOMB // (8 * MiB))
    if codec == "zstd":
        compressor = zstandard.ZstdCompressor(write_content_size=False).compressobj()
        return _streamed(compressor, BOMB, compressor.flush)
    compressor = zlib.compressobj(9, wbits=31 if codec == "gzip" else 15)
    return _streamed(compressor, BOMB, compressor.flush)


def dataset(tmp_path, codec: str, chunk: bytes, config: dict | None = None):
    """A real store holding a 16-byte int8 chunk, its compressor set to ``codec`` and its chunk replaced."""
    path = tmp_path / f"{codec}.file"
    with nczmap.create_dataset(f"file://{path}#mode=zarr,file") as ds:
        ds.create_dimension("x", 16)
        ds.create_variable("v", ("x",), "i1")[:] = np.arange(16)
    zarray = json.loads((path / "v" / ".zarray").read_text())
    zarray["compressor"] = config or CODECS[codec]
    (path / "v" / ".zarray").write_text(json.dumps(zarray))
    (path / "v" / "0").write_bytes(chunk)
    return path


READER = textwrap.dedent(
    """
    import resource, sys
    import nczmap

    try:
        with nczmap.open_dataset(sys.argv[1]) as ds:
            ds.variables["v"][:]
        code = 0
    except nczmap.NCZError as exc:
        print(type(exc).__name__, exc, file=sys.stderr)
        code = 1
    # the peak of this process's own memory: VmHWM starts afresh at exec, while ru_maxrss keeps the
    # parent's peak when the parent forked (a pytest process grown large would fail every bomb)
    with open("/proc/self/status") as status:
        peak = [int(line.split()[1]) for line in status if line.startswith("VmHWM:")]
    print((peak[0] if peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) // 1024)  # MiB
    sys.exit(code)
    """
)


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_bomb_is_refused_within_bounded_memory(tmp_path, codec):
    chunk = bomb(codec)
    assert len(chunk) < 4 * MiB
    path = dataset(tmp_path, codec, chunk)
    result = subprocess.run(
        [sys.executable, "-c", READER, str(path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("FormatError") and f"/v/0 with {codec}" in result.stderr
    assert "Traceback" not in result.stderr
    assert int(result.stdout) < PEAK_LIMIT_MB, f"peak {result.stdout.strip()} MiB"


def read(path) -> np.ndarray:
    with nczmap.open_dataset(str(path)) as ds:
        return ds.variables["v"][:]


@pytest.mark.parametrize(
    "codec, encode",
    [
        ("bz2", lambda data: bz2.compress(data[:5]) + bz2.compress(data[5:])),
        ("lzma", lambda data: lzma.compress(data[:7]) + lzma.compress(data[7:])),
        ("zstd", lambda data: zstandard.ZstdCompressor(write_content_size=False).compress(data)),
        (
            "zstd",
            lambda data: (
                zstandard.ZstdCompressor(write_content_size=False).compress(data[:3])
                + zstandard.ZstdCompressor().compress(data[3:])
            ),
        ),
    ],
)
def test_streams_and_frames_that_fit_still_decode(tmp_path, codec, encode):
    values = np.arange(16, dtype="i1")
    path = dataset(tmp_path, codec, encode(values.tobytes()))
    np.testing.assert_array_equal(read(path), values)


@pytest.mark.parametrize(
    "codec, encode",
    [
        ("bz2", lambda data: bz2.compress(data)[:-6]),
        ("lzma", lambda data: lzma.compress(data)[:-12]),
        ("zstd", lambda data: zstandard.ZstdCompressor(write_content_size=False).compress(data)[:-3]),
    ],
)
def test_a_truncated_stream_is_a_format_error(tmp_path, codec, encode):
    path = dataset(tmp_path, codec, encode(np.arange(16, dtype="i1").tobytes()))
    # bz2 and lzma say the stream ended early; zstd's reader gives what it could decode, too few bytes
    with pytest.raises(FormatError, match=rf"/v/0 with {codec}" if codec != "zstd" else r"'/v/0' holds 13"):
        read(path)


@pytest.mark.parametrize(
    "codec, chunk",
    [
        ("lz4", BOMB.to_bytes(4, "little") + b"\x00" * 12),
        ("blosc", bytes([2, 1, 0x21, 1]) + BOMB.to_bytes(4, "little") + bytes(8)),
    ],
)
def test_a_size_claimed_in_a_header_beyond_the_chunk_is_refused_before_decoding(tmp_path, codec, chunk):
    path = dataset(tmp_path, codec, chunk, {"id": codec})
    with pytest.raises(FormatError, match=rf"/v/0 with {codec}: it claims {BOMB} bytes"):
        read(path)
