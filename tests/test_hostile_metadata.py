"""Hostile metadata and chunks: clear nczmap errors in bounded time and memory, never other exceptions."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

import nczmap
from nczmap import FormatError
from nczmap.errors import SelectionError


def store(tmp_path, array: dict, chunk: bytes | None = None, root_attrs: str = "{}"):
    path = tmp_path / "ds.file"
    (path / "v").mkdir(parents=True)
    (path / ".zgroup").write_text('{"zarr_format": 2}')
    (path / ".zattrs").write_text(root_attrs)
    zarray = {"zarr_format": 2, "fill_value": None, "order": "C", "compressor": None, "filters": None}
    (path / "v" / ".zarray").write_text(json.dumps({**zarray, **array}))
    (path / "v" / ".zattrs").write_text('{"_ARRAY_DIMENSIONS": ["x"]}')
    if chunk is not None:
        (path / "v" / "0").write_bytes(chunk)
    return path


def ncdump(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nczmap", "ncdump", *map(str, args)], capture_output=True, text=True
    )


def test_an_attribute_nested_too_deeply_is_a_clear_error(tmp_path):
    deep = "[" * 400 + "1" + "]" * 400
    path = store(tmp_path, {"shape": [2], "chunks": [2], "dtype": "<i4"}, root_attrs=f'{{"a": {deep}}}')
    result = ncdump("-h", path)
    assert (
        result.returncode == 1 and "nested too deeply" in result.stderr and "Traceback" not in result.stderr
    )


def test_char_data_that_is_not_a_character_is_a_clear_error(tmp_path):
    path = store(tmp_path, {"shape": [2], "chunks": [2], "dtype": "<U1"}, b"\xff\xff\xff\xff\x00\x00\x11\x00")
    with nczmap.open_dataset(str(path)) as ds, pytest.raises(FormatError, match=r"'/v'.*no netCDF char"):
        ds.variables["v"][...]


def test_sizes_past_2_63_skip_the_array_with_a_warning(tmp_path):
    path = store(tmp_path, {"shape": [2**64], "chunks": [4], "dtype": "<i4"})
    with pytest.warns(UserWarning, match=r"skipping array '/v'.*bad shape"):
        ds = nczmap.open_dataset(str(path))
    with ds:
        assert "v" not in ds.variables and ds.problems[0][0] == "/v"
    result = ncdump(path)
    assert result.returncode == 0 and result.stdout.startswith("netcdf ds {")


def test_a_selection_larger_than_memory_is_refused_before_allocating(tmp_path):
    path = store(tmp_path, {"shape": [10**13], "chunks": [10**6], "dtype": "<f8"})
    with nczmap.open_dataset(str(path)) as ds:
        with pytest.raises(SelectionError, match="GiB, more than this machine's"):
            ds.variables["v"][...]
        assert ds.variables["v"][:4].tolist() == [0, 0, 0, 0]


def test_a_compressed_chunk_that_inflates_past_its_size_stops_there(tmp_path):
    bomb = zlib.compress(b"\0" * (512 << 20), 9)  # half a GiB of zeros in about half a MiB
    compressor = {"id": "zlib", "level": 9}
    path = store(tmp_path, {"shape": [10], "chunks": [10], "dtype": "<i4", "compressor": compressor}, bomb)
    start = time.perf_counter()
    with (
        nczmap.open_dataset(str(path)) as ds,
        pytest.raises(FormatError, match=r"inflates beyond the chunk's \d+ bytes"),
    ):
        ds.variables["v"][...]
    assert time.perf_counter() - start < 5


def test_an_invalid_blosc_configuration_is_a_clear_error(tmp_path):
    compressor = {"id": "blosc", "cname": "nope", "clevel": 99, "shuffle": 7}
    array = {"shape": [2], "chunks": [2], "dtype": "<i4", "compressor": compressor}
    path = store(tmp_path, array, b"junkjunkjunkjunkjunk")
    with pytest.warns(UserWarning, match=r"'/v'.*codec blosc option"), nczmap.open_dataset(str(path)) as ds:
        assert "v" not in ds.variables  # refused where its metadata is read, not at its first chunk
        assert [key for key, why in ds.problems if "blosc" in why] == ["/v"]
    result = ncdump(path)
    assert "Traceback" not in result.stderr and "codec blosc option" in result.stderr


def test_well_formed_chunks_still_decode_with_every_compressor(tmp_path):
    import numcodecs

    values = np.arange(1000, dtype="<f8")
    for config in ({"id": "zlib", "level": 1}, {"id": "gzip", "level": 1}, {"id": "zstd", "level": 1}):
        chunk = numcodecs.get_codec(config).encode(values.tobytes())
        path = store(
            tmp_path / config["id"],
            {"shape": [1000], "chunks": [1000], "dtype": "<f8", "compressor": config},
            chunk,
        )
        with nczmap.open_dataset(str(path)) as ds:
            assert np.array_equal(ds.variables["v"][...], values), config
