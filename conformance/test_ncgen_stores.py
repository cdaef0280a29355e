"""nczmap on stores written on the spot by real netcdf-c (Debian netcdf-bin: ``ncgen``/``ncdump``).

The CDL is generated here from :data:`MODEL`, so every expectation (names, values) comes from what was
handed to ``ncgen``, from ``os.walk``/file bytes, or from what real ``ncdump``/``zip``/``unzip`` do, never
from nczmap's own output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from _fixtures import run_checked

from nczmap import open_map

NCGEN = shutil.which("ncgen")
NCDUMP = shutil.which("ncdump")
ZIP = shutil.which("zip")
UNZIP = shutil.which("unzip")
TIMEOUT = 120

pytestmark = pytest.mark.skipif(NCGEN is None or NCDUMP is None, reason="netcdf-c ncgen/ncdump not on PATH")

# ------------------------------------------------------------------------- the dataset handed to ncgen
INT_VALUES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -11, 2147483647]
FLOAT_VALUES = [0.5, 1.5, -2.25, 3.0]
CHAR_VALUE = "hello"
SUB_VALUES = [100, -100, 7]
ROOT_VARS = {"iv": ("int", ("x", "y"), (3, 4)), "fv": ("float", ("y",), (4,)), "cv": ("char", ("len",), (5,))}
SUB_VARS = {"sv": ("short", ("z",), (3,))}
GROUPS = ["sub"]

CDL = f"""netcdf x {{
dimensions:
\tx = 3 ;
\ty = 4 ;
\tlen = 5 ;
variables:
\tint iv(x, y) ;
\t\tiv:units = "m" ;
\t\tiv:_ChunkSizes = 3, 4 ;
\tfloat fv(y) ;
\t\tfv:_ChunkSizes = 4 ;
\tchar cv(len) ;
\t\tcv:_ChunkSizes = 5 ;

// global attributes:
\t\t:title = "nczmap conformance" ;
data:

 iv = {", ".join(map(str, INT_VALUES))} ;

 fv = {", ".join(map(str, FLOAT_VALUES))} ;

 cv = "{CHAR_VALUE}" ;

group: sub {{
  dimensions:
  \tz = 3 ;
  variables:
  \tshort sv(z) ;
  \t\tsv:long_name = "sub var" ;
  \t\tsv:_ChunkSizes = 3 ;

  // group attributes:
  \t\t:gattr = 7 ;
  data:

   sv = {", ".join(map(str, SUB_VALUES))} ;
  }} // group sub
}}
"""

MODES = ["nczarr", "zarr"]


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_checked(cmd, cwd, TIMEOUT)


def file_url(path: Path, mode: str) -> str:
    return f"file://{path}#mode={mode},file"


@pytest.fixture(params=MODES)
def store(request, tmp_path) -> tuple[Path, str]:
    """``tmp/x.file`` written by real ``ncgen -4 -lb`` in the given mode."""
    mode = request.param
    cdl = tmp_path / "x.cdl"
    cdl.write_text(CDL)
    path = tmp_path / "x.file"
    run([NCGEN, "-4", "-lb", "-o", file_url(path, mode), str(cdl)], cwd=tmp_path)
    assert path.is_dir(), f"ncgen did not create {path}"
    return path, mode


# ------------------------------------------------------------------------- oracles
def _segments(key: str) -> tuple[bytes, ...]:
    return tuple(s.encode("utf-8") for s in key[1:].split("/"))


def os_walk_tree(root: Path) -> tuple[list[str], dict[str, bytes]]:
    """Every directory and file below ``root`` as zmap keys (pre-order, sorted), and the files' bytes."""
    keys: list[str] = []
    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        relative = os.path.relpath(dirpath, root)
        base = "" if relative == "." else "/" + relative.replace(os.sep, "/")
        keys += [f"{base}/{name}" for name in dirnames]
        for name in filenames:
            keys.append(f"{base}/{name}")
            files[f"{base}/{name}"] = Path(dirpath, name).read_bytes()
    return sorted(keys, key=_segments), files


def ncdump(url: str) -> str:
    return run([NCDUMP, url]).stdout.decode()


# ------------------------------------------------------------------------- (a) walk and bytes
def test_walk_equals_os_walk(store):
    path, mode = store
    keys, files = os_walk_tree(path)
    with open_map(file_url(path, mode), "r") as zmap:
        assert list(zmap.walk()) == keys
        assert list(zmap.objects()) == [k for k in keys if k in files]
        for key, data in files.items():
            assert zmap.len(key) == len(data), key
            assert zmap.read(key) == data, key
            assert zmap.read(key, 1, 5) == data[1:6], key


# ------------------------------------------------------------------------- (b) search names
def test_search_names_what_netcdf_c_wrote(store):
    path, mode = store
    with open_map(file_url(path, mode), "r") as zmap:
        assert zmap.search("/") == sorted([".zattrs", ".zgroup", *ROOT_VARS, *GROUPS])
        assert zmap.search("/sub") == sorted([".zattrs", ".zgroup", *SUB_VARS])
        for prefix, variables in (("", ROOT_VARS), ("/sub", SUB_VARS)):
            for name, (_, _, shape) in variables.items():
                # _ChunkSizes = the whole shape: one chunk named 0.0...0 (rank zeros)
                chunk = ".".join("0" * len(shape))
                assert zmap.search(f"{prefix}/{name}") == sorted([".zarray", ".zattrs", chunk]), name
        for key in ("/.zgroup", "/sub/.zgroup", "/iv/.zarray", "/sub/sv/.zarray"):
            assert zmap.exists(key), key
    if mode == "nczarr":
        # netcdf-c 4.9.0 (dialect D1) also lists the group's content in _NCZARR_GROUP; read it off disk
        for group, variables, groups in (("", ROOT_VARS, GROUPS), ("sub", SUB_VARS, [])):
            meta = json.loads((path / group / ".zgroup").read_bytes())["_NCZARR_GROUP"]
            assert sorted(meta["vars"]) == sorted(variables) and meta["groups"] == groups


# ------------------------------------------------------------------------- (c) the int chunk, dumped
def _dump(url: str, type_name: str) -> list[str]:
    proc = run([sys.executable, "-m", "nczmap", "dump", "-t", type_name, url])
    return proc.stdout.decode().splitlines()


def _record(lines: list[str], key: str, type_name: str) -> tuple[int, int, list[str]]:
    pattern = re.compile(rf"^\[(\d+)\] {re.escape(key)} : \((\d+)\) \({type_name}\) \|(.*)\|$")
    found = [m for m in map(pattern.match, lines) if m]
    assert len(found) == 1, f"no single {key} record in the dump:\n" + "\n".join(lines)
    index, count, values = found[0].groups()
    return int(index), int(count), values.split(", ")


def test_dump_shows_cdl_values(store):
    path, mode = store
    url = file_url(path, mode)
    keys, _ = os_walk_tree(path)

    index, count, values = _record(_dump(url, "int"), "/iv/0.0", "int")
    assert index == keys.index("/iv/0.0")  # zmapio numbers records by pre-order key position
    assert count == len(INT_VALUES)
    assert [int(v) for v in values] == INT_VALUES

    index, count, values = _record(_dump(url, "short"), "/sub/sv/0", "short")
    assert index == keys.index("/sub/sv/0")
    assert [int(v) for v in values] == SUB_VALUES

    _, _, values = _record(_dump(url, "float"), "/fv/0", "float")
    assert [float(v) for v in values] == FLOAT_VALUES

    _, _, values = _record(_dump(url, "char"), "/cv/0", "char")
    assert values == [f"'{c}'" for c in CHAR_VALUE]


# ------------------------------------------------------------------------- (d) real zip -r
@pytest.mark.skipif(ZIP is None, reason="the zip command is not on PATH")
def test_zip_of_store_agrees_with_directory(store):
    path, mode = store
    run([ZIP, "-qr", "x.zip", "x.file"], cwd=path.parent)
    archive = path.parent / "x.zip"
    with zipfile.ZipFile(archive) as zf:
        assert zf.namelist()[0] == "x.file/"  # netcdf-c takes the dataset folder from entry 0
    with (
        open_map(f"{archive.as_uri()}#mode={mode},zip", "r") as zmap,
        open_map(file_url(path, mode), "r") as fmap,
    ):
        keys = list(fmap.walk())
        assert list(zmap.walk()) == keys
        for key in ["/", *keys]:
            assert zmap.search(key) == fmap.search(key), key
        for key in keys:
            assert zmap.exists(key) == fmap.exists(key), key
            if fmap.exists(key):
                assert zmap.read(key) == fmap.read(key), key
                assert zmap.read(key, 2, 7) == fmap.read(key, 2, 7), key


# ------------------------------------------------------------------------- (e) copy into a new zip
@pytest.mark.skipif(UNZIP is None, reason="the unzip command is not on PATH")
def test_nczmap_zip_round_trips_to_netcdf_c(store, tmp_path):
    path, mode = store
    original = ncdump(file_url(path, mode))
    assert "iv =" in original and "group: sub" in original

    out = tmp_path / "out"
    out.mkdir()
    new_zip = out / "x.file.zip"  # dataset folder inside the archive: x.file/
    with open_map(file_url(path, mode), "r") as src, open_map(str(new_zip), "w") as dst:
        for key in src.objects():
            dst.write(key, src.read(key))

    assert ncdump(file_url(path, mode)) == original, "copying changed the source store"
    run([UNZIP, "-tq", str(new_zip)])  # archive integrity, by Info-ZIP

    unpacked = tmp_path / "unpacked"
    run([UNZIP, "-q", str(new_zip), "-d", str(unpacked)])
    assert sorted(os.listdir(unpacked)) == ["x.file"]
    copy = unpacked / "x.file"
    assert os_walk_tree(copy) == os_walk_tree(path), "unzipped tree differs from the ncgen store"
    assert ncdump(file_url(copy, mode)) == original
