"""The data section's fast paths print what ncdump prints: rows formatted in one C-level call, broken into
lines by regex, and (``nczmap ncdump``) formatted in worker processes. Checked against Debian's C
``ncdump`` of the same stores and, by hypothesis, against the value-by-value formatting."""

from __future__ import annotations

import filecmp
import io
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import nczmap
from nczmap import cdl, cdl_text

NCDUMP = shutil.which("ncdump")


def build(path) -> str:
    """Variables of rank 2 and 3 with fills, NaN, infinities, -0.0 and subnormals, in a group too."""
    url = path.as_uri() + "#mode=nczarr,file"
    rng = np.random.default_rng(7)
    with nczmap.create_dataset(url, netcdf_version="4.9.0") as ds:
        for name, size in (("t", 5), ("y", 7), ("x", 33)):
            ds.create_dimension(name, size)
        v = ds.create_variable("v", ("t", "y", "x"), "f4", chunks=(2, 7, 33), fill_value=np.float32(-999))
        values = rng.standard_normal((5, 7, 33)).astype("f4") * 10.0 ** rng.integers(-8, 8, (5, 7, 33))
        values[1, 2, 3:6] = [np.nan, np.inf, -np.inf]
        values[2, 0, :4] = [-0.0, 1e-45, -999, 3.4e38]
        values[4] = -999  # a row of fills only
        v[...] = values
        d = ds.create_variable("d", ("y", "x"), "f8")
        d[...] = rng.standard_normal((7, 33)) * 1e100
        i = ds.create_variable("i", ("t", "x"), "i4", fill_value=np.int32(-1))
        i[...] = rng.integers(-(2**31), 2**31 - 1, (5, 33), dtype=np.int64).astype("i4")
        i[3, :10] = -1
        group = ds.create_group("g")
        group.create_dimension("z", 40)
        w = group.create_variable("w", ("y", "z"), "f4")
        w[...] = rng.random((7, 40), dtype="f4")
    return url


def dumped(url: str, processes: bool) -> bytes:
    out = io.BytesIO()
    with nczmap.open_dataset(url) as ds:
        cdl.dump_cdl(ds, out, processes=processes, name="s")
    return out.getvalue()


@pytest.mark.skipif(NCDUMP is None, reason="netcdf-c's ncdump (netcdf-bin) is not installed")
def test_rows_formatted_in_worker_processes_are_c_ncdumps(tmp_path, monkeypatch):
    url = build(tmp_path / "s.file")
    expected = subprocess.run([NCDUMP, url], capture_output=True, check=True, timeout=60).stdout
    assert dumped(url, processes=False) == expected
    monkeypatch.setattr(cdl, "PARALLEL_VALUES", 1)  # every variable of rank 2 or more goes to the workers
    started = []
    original = cdl._Output.formatting_pool

    def pool(self):
        made = original(self)
        started.append(made)
        return made

    monkeypatch.setattr(cdl._Output, "formatting_pool", pool)
    assert dumped(url, processes=True) == expected
    assert any(made is not None for made in started), "the worker processes were not used"


@pytest.mark.skipif(NCDUMP is None, reason="netcdf-c's ncdump (netcdf-bin) is not installed")
def test_the_command_prints_a_large_variable_as_c_ncdump(tmp_path):
    """``nczmap ncdump`` itself, on a variable above the threshold (4 Mi values): worker processes."""
    url = (tmp_path / "big.file").as_uri() + "#mode=nczarr,file"
    rng = np.random.default_rng(1)
    with nczmap.create_dataset(url, netcdf_version="4.9.0") as ds:
        ds.create_dimension("y", 1024)
        ds.create_dimension("x", 4096)
        v = ds.create_variable("v", ("y", "x"), "f4", chunks=(256, 4096))
        v[...] = rng.random((1024, 4096), dtype="f4")
    # to files, not this process's memory (~50 MB of text each): a test process grown that large makes
    # later tests' children report its peak memory as theirs (ru_maxrss survives fork and exec)
    ours, theirs = tmp_path / "ours.cdl", tmp_path / "theirs.cdl"
    with ours.open("wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "nczmap", "ncdump", url], stdout=out, stderr=subprocess.PIPE, timeout=300
        )
    assert done.returncode == 0, done.stderr
    with theirs.open("wb") as out:
        subprocess.run([NCDUMP, url], stdout=out, check=True, timeout=300)
    assert ours.stat().st_size > 40 << 20
    assert filecmp.cmp(ours, theirs, shallow=False)


FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 1.17549435e-38, 3.4028235e38, 9.96921e36, 1e-5, 123456.75]),
)


def _slow(formatter: cdl_text.ValueFormatter, values: np.ndarray) -> bytes:
    return b", ".join(formatter(values))


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["float", "double", "int", "short"]),
    data=st.data(),
)
def test_a_row_formatted_at_once_is_the_values_formatted_one_by_one(kind, data):
    dtype = {"float": "f4", "double": "f8", "int": "i4", "short": "i2"}[kind]
    if kind in ("float", "double"):
        elements = FLOATS if kind == "float" else st.one_of(FLOATS, st.floats())
    else:
        elements = st.integers(np.iinfo(dtype).min, np.iinfo(dtype).max)
    values = data.draw(hnp.arrays(dtype, st.integers(1, 60), elements=elements))
    fill = data.draw(st.one_of(st.none(), st.sampled_from(values.tolist()) if values.size else st.none()))
    if fill is None and kind in ("float", "double"):
        fill = data.draw(st.sampled_from([None, cdl_text.BY_NAME[kind].fill]))
    formatter = cdl_text.ValueFormatter(kind, None if fill is None else np.asarray(fill, dtype)[()])
    fast = formatter.joined(values, b", ")
    if fast is not None:  # None: the caller formats value by value
        assert fast == _slow(formatter, values)


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(st.from_regex(rb"[-0-9.e+]{1,90}", fullmatch=True), min_size=1, max_size=80),
    linep=st.integers(0, 100),
    indent=st.sampled_from([0, 4, 8]),
)
def test_regex_line_breaking_is_lputs(texts, linep, indent):
    """:func:`cdl_text.wrapped` (used by the workers and by ``lput_row``) breaks where ``lput`` would."""
    reference = cdl._Output(io.BytesIO())
    reference.indent, reference.linep = indent, linep
    for text in texts:
        reference.lput(text + b", ")
    reference.flush()
    lines, after = cdl_text.wrapped(b"".join(t + b", " for t in texts), b", ", linep, indent)
    assert lines == reference._out.getvalue()
    assert after == reference.linep
