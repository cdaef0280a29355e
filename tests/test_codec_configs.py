"""Malformed codec configurations in a store's metadata: an nczmap error naming the array and the codec,
through the xarray engine, ``nczmap.open_dataset``, the command line and the ZarrStore, never a bare
exception (issue 26: ``"compressor": {"id": "zlib", "level": "x"}`` gave ``ValueError: invalid literal``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nczmap
from nczmap.errors import NCZError

xr = pytest.importorskip("xarray")
zarr = pytest.importorskip("zarr")

CODECS = ["zlib", "gzip", "zstd", "bz2", "lz4", "blosc", "shuffle", "fletcher32", "delta", "nonesuch", ""]
OPTIONS = [
    "level",
    "clevel",
    "shuffle",
    "cname",
    "blocksize",
    "elementsize",
    "acceleration",
    "dtype",
    "typesize",
]
VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 4, 9, -1, 22, 100]),
    st.text(max_size=8),
    st.sampled_from(["lz4", "zstd", "blosclz", "<i4", "x"]),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
)
CONFIG = st.builds(
    lambda codec, options: {"id": codec, **options},
    st.sampled_from(CODECS),
    st.dictionaries(st.sampled_from(OPTIONS), VALUES, max_size=3),
)


def store_with(folder: Path, compressor: object, filters: object) -> str:
    """An NCZarr store (written by nczmap) whose variable's codecs are then replaced by ``compressor`` and
    ``filters``, its one chunk left as written (zlib)."""
    url = f"file://{folder}#mode=nczarr,file"
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", 8)
        ds.create_variable("v", ("x",), "i4", compression="zlib")[:] = np.arange(8)
    zarray = folder / "v" / ".zarray"
    meta = json.loads(zarray.read_text())
    meta.update(compressor=compressor, filters=filters)
    zarray.write_text(json.dumps(meta))
    return url


def read_with_engine(url: str) -> str | None:
    """Read the variable through the engine: None, or what kept it from being read (the warning or error,
    which must name the array)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with xr.open_dataset(url, engine="nczmap") as ds:
                if "v" in ds:
                    ds.load()
                    dict(ds["v"].encoding)
                    return None
        except NCZError as exc:
            return str(exc)
    return " ".join(str(w.message) for w in caught if "'/v'" in str(w.message)) or "v is missing, unnamed"


def read_with_nczmap(url: str) -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with nczmap.open_dataset(url) as ds:
                if "v" in ds.variables:
                    ds.variables["v"][...]
                    return None
                return " ".join(why for key, why in ds.problems if key == "/v") or "v is missing, unnamed"
    except NCZError as exc:
        return str(exc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(compressor=st.one_of(st.none(), CONFIG), filters=st.one_of(st.none(), st.lists(CONFIG, max_size=2)))
def test_any_codec_configuration_reads_or_is_an_error_naming_the_array(tmp_path_factory, compressor, filters):
    folder = tmp_path_factory.mktemp("store") / "s.file"
    url = store_with(folder, compressor, filters)
    for read in (read_with_engine, read_with_nczmap):
        why = read(url)
        assert why is None or "/v" in why, why  # the array, or its chunk
    try:  # zarr-python through the store: zarr's own errors, if any, are zarr's; nczmap adds none
        group = zarr.open_group(nczmap.ZarrStore(url), mode="r", zarr_format=2)
        group["v"][:]
    except NCZError as exc:
        pytest.fail(f"the ZarrStore raised {exc!r}")
    except Exception:
        pass


@pytest.mark.parametrize(
    "compressor, message",
    [
        ({"id": "zlib", "level": "x"}, r"codec zlib option level is 'x', not an integer from -1 to 9"),
        ({"id": "blosc", "cname": "nope", "clevel": 5}, r"codec blosc option cname is 'nope'"),
        ({"id": "zstd", "level": 2.5}, r"codec zstd option level is 2.5"),
        ({"id": "bz2", "level": True}, r"codec bz2 option level is True"),
        ({"id": 7}, r"a codec's id must be a name"),
    ],
)
def test_a_malformed_codec_is_named_by_every_reader(tmp_path, compressor, message):
    """The array is skipped with a warning naming it and its codec (the rest of the dataset reads)."""
    url = store_with(tmp_path / "s.file", compressor, None)
    assert re.search(message, read_with_engine(url) or "")
    assert re.search(message, read_with_nczmap(url) or "")
    done = subprocess.run(
        [sys.executable, "-m", "nczmap", "ncdump", url], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0 and b"Traceback" not in done.stderr and b"x = 8" in done.stdout
    assert re.search(message.encode(), done.stderr) and b"'/v'" in done.stderr
