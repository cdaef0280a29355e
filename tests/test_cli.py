"""The ``nczmap search`` and ``nczmap dump`` commands, run as real processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from nczmap import open_map


def nczmap(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nczmap", *args], capture_output=True, timeout=60, check=False
    )


@pytest.fixture(params=["file", "zip"])
def store_url(request, tmp_path) -> str:
    path = tmp_path / ("ds.zip" if request.param == "zip" else "ds.file")
    values = np.arange(6, dtype=">i4")
    zarray = {"zarr_format": 2, "shape": [6], "chunks": [6], "dtype": ">i4", "fill_value": None}
    with open_map(str(path), "w") as zmap:
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
        zmap.write("/v/.zarray", json.dumps(zarray).encode())
        zmap.write("/v/0", values.tobytes())
        zmap.write("/g/.zgroup", b"{\n}")
    return path.as_uri() + f"#mode=nczarr,{request.param}"


def test_search_prints_one_name_a_line(store_url):
    result = nczmap("search", store_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().splitlines() == [".zgroup", "g", "v"]
    assert nczmap("search", store_url, "/v").stdout.decode().splitlines() == [".zarray", "0"]
    assert nczmap("search", store_url, "/v/0").stdout == b""


def test_dump_prints_metadata_and_sizes(store_url):
    result = nczmap("dump", store_url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0] == '[0] /.zgroup : (18) |{"zarr_format": 2}|'
    assert lines[1:3] == ["[2] /g/.zgroup : (3) |{", "}|"]  # multi-line JSON stays verbatim
    assert lines[-1] == "[5] /v/0 : (24) (ubyte) |...|"


def test_dump_values_follow_the_arrays_byte_order(store_url):
    result = nczmap("dump", "-t", "int", store_url)
    assert result.stdout.decode().splitlines()[-1] == "[5] /v/0 : (6) (int) |0, 1, 2, 3, 4, 5|"
    header = nczmap("dump", "-t", "int", "-H", store_url)
    assert header.stdout.decode().splitlines()[-1] == "[5] /v/0 : (6) (int) |...|"


def test_errors_name_the_culprit(tmp_path):
    missing = nczmap("search", str(tmp_path / "absent.file"))
    assert missing.returncode == 1
    assert b"absent.file" in missing.stderr and b"Traceback" not in missing.stderr
    bad_mode = nczmap("search", f"{(tmp_path / 'x').as_uri()}#mode=nczarr,bogus")
    assert bad_mode.returncode == 1 and b"bogus" in bad_mode.stderr
    bad_key = nczmap("search", str(tmp_path), "/../etc")
    assert bad_key.returncode == 1 and b"'/../etc'" in bad_key.stderr
    bad_type = nczmap("dump", "-t", "complex", str(tmp_path))
    assert bad_type.returncode == 1 and b"complex" in bad_type.stderr


def test_closed_pipe_is_not_an_error(tmp_path):
    path = tmp_path / "wide.file"
    with open_map(str(path), "w") as zmap:
        for i in range(20000):
            zmap.write(f"/k{i:05d}", b"")
    pipeline = subprocess.run(
        f"{sys.executable} -m nczmap search {path} | head -n 1",
        shell=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert pipeline.stdout == b"k00000\n"
    assert b"Traceback" not in pipeline.stderr


def header_store(path, version: str | None) -> str:
    import nczmap

    url = path.as_uri() + "#mode=nczarr,file"
    with nczmap.create_dataset(url, netcdf_version=version) as ds:
        ds.create_dimension("x", 3)
        var = ds.create_variable("v", ("x",), "f4", fill_value=np.float32(0.1))
        var.attrs["scale"] = np.float32(0.1)
        var.attrs["offsets"] = np.array([1.5, -0.0, np.nan], dtype="f8")
        var.attrs["count"] = np.int64(2**40)
        var[:] = [1, 2, 3]
    return url


@pytest.mark.skipif(shutil.which("ncdump") is None, reason="netcdf-c ncdump not installed")
def test_ncdump_header_never_imports_numpy(tmp_path):
    """Start-up is most of a header dump's time: metadata alone must not load numpy (about 60 ms).

    The header still equals real ncdump's: of the 4.9.0 store (which that ncdump reads), and of the
    default (4.9.3+) store holding the same attributes.
    """
    (tmp_path / "d1").mkdir()
    (tmp_path / "d3").mkdir()
    for_c = header_store(tmp_path / "d1" / "ds.file", "4.9.0")
    default = header_store(tmp_path / "d3" / "ds.file", None)
    expected = subprocess.run(["ncdump", "-h", for_c], capture_output=True, timeout=60, check=True).stdout
    for url in (for_c, default):
        result = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "nczmap", "ncdump", "-h", url],
            capture_output=True,
            timeout=60,
            check=True,
        )
        imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.decode().splitlines()]
        assert "numpy" not in imported
        assert result.stdout == expected


def test_version():
    import nczmap

    result = subprocess.run([sys.executable, "-m", "nczmap", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == f"nczmap {nczmap.__version__}"


def test_warnings_are_one_clean_line(tmp_path):
    """A skipped array warns without a Python source path or line."""
    store = tmp_path / "ds.file"
    (store / "v").mkdir(parents=True)
    (store / ".zgroup").write_text('{"zarr_format": 2}')
    (store / "v" / ".zarray").write_text('{"zarr_format": 2, "shape": [2], "chunks": [2], "dtype": "<c16"}')
    result = subprocess.run(
        [sys.executable, "-m", "nczmap", "ncdump", "-h", str(store)], capture_output=True, text=True
    )
    assert result.returncode == 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nczmap: warning: skipping array '/v'"), lines
    assert ".py" not in result.stderr


def test_copy_progress_on_a_terminal_shows_bytes_rate_and_time_left(tmp_path):
    import pty

    store = tmp_path / "ds.file"
    import nczmap

    with nczmap.create_dataset(str(store)) as ds:
        ds.create_dimension("x", 4096)
        ds.create_variable("v", ("x",), "f8", chunks=(256,), data=range(4096))
    leader, follower = pty.openpty()
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "nczmap", "copy", str(store), str(tmp_path / "copy.file")],
            stderr=follower,
            stdout=subprocess.DEVNULL,
        )
        os.close(follower)  # the child holds its own copy: reading ends when it exits
        shown = b""
        while True:  # read while it runs: a full terminal buffer would block the child
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            shown += chunk
        returncode = child.wait(timeout=60)
    finally:
        os.close(leader)
    assert returncode == 0
    last = shown.decode().replace("\r\n", "\n").split("\r")[-1]
    # tqdm's bar: amount done/total (KiB as "k"), elapsed<left, rate
    assert "copying: 100%" in last and "32.0k/32.0k" in last and "B/s" in last and "<00:00" in last


def test_ncdump_called_in_a_process_that_goes_on_leaves_its_objects_collectable(store_url, capfdbinary):
    """The command's own process freezes the dumped model away from the collector (it ends next); main()
    called again and again in one process (tests, notebooks, the fuzz suite) must not: every call's
    objects would stay for good."""
    import gc

    from nczmap import cli

    before = gc.get_freeze_count()
    for _ in range(3):
        assert cli.main(["ncdump", store_url]) == 0
        assert cli.main(["ncdump", store_url + "-missing"]) == 1
    assert gc.get_freeze_count() == before
    assert b"v = 0, 1, 2, 3, 4, 5" in capfdbinary.readouterr().out
