"""``nczmap ncdump FILE``: netCDF-4/HDF5 and netCDF-3 files dump as C ncdump dumps them.

C ncdump, the tool ``nczmap ncdump`` mirrors, reads netCDF files as well as stores; nczmap reads them
through the parsers ``virtualize`` uses (nothing is copied). Expected output is Debian's ncdump of the same
file, for every CDL of the conformance corpus that ncgen can write in each format.
"""

from __future__ import annotations

import subprocess

import pytest
from test_virtualize import (
    CDL_DIR,
    CORPUS,
    FOREIGN_DIM,
    NCDUMP,
    NCGEN,
    NOFILL_GARBAGE,
    TIMEOUT,
    nczmap_command,
)

KINDS = {"netcdf4": "nc4", "classic": "nc3", "64bit-offset": "nc6", "cdf5": "nc5"}


def write(name: str, kind: str, folder) -> str | None:
    """``name``.cdl written by ncgen as ``kind``; None when that format cannot hold it."""
    if NCGEN is None or NCDUMP is None:
        pytest.skip("netcdf-c ncgen/ncdump not on PATH")
    target = folder / f"{name}-{kind}.nc"
    done = subprocess.run(
        [NCGEN, "-k", KINDS[kind], "-o", str(target), str(CDL_DIR / f"{name}.cdl")],
        capture_output=True,
        timeout=TIMEOUT,
    )
    return str(target) if done.returncode == 0 and target.exists() else None  # ncgen 4.9 may exit 0


def expected_dump(path: str, *options: str) -> bytes:
    done = subprocess.run([NCDUMP, *options, path], capture_output=True, timeout=TIMEOUT, check=True)
    return done.stdout


def assert_dumps_alike(name: str, path: str) -> None:
    ours = nczmap_command("ncdump", "-n", name, path)
    assert ours.returncode == 0, ours.stderr
    assert b"warning" not in ours.stderr, ours.stderr
    theirs = expected_dump(path, "-n", name)
    actual = ours.stdout
    if name == "foreign_dim":  # ncdump 4.9's searchgroupdim bug, fixed in 4.10
        theirs = theirs.replace(*FOREIGN_DIM)
    if name == "nofill":  # never-written no-fill data: HDF5 gives garbage
        actual, theirs = NOFILL_GARBAGE.sub(b"", actual), NOFILL_GARBAGE.sub(b"", theirs)
    assert actual.decode(errors="replace") == theirs.decode(errors="replace"), (name, path)


@pytest.mark.parametrize("name", CORPUS)
def test_a_netcdf4_file_dumps_as_c_ncdump_dumps_it(tmp_path, name):
    assert_dumps_alike(name, write(name, "netcdf4", tmp_path))


@pytest.mark.parametrize("kind", ["classic", "64bit-offset", "cdf5"])
def test_every_corpus_file_netcdf3_can_hold_dumps_as_c_ncdump_dumps_it(tmp_path, kind):
    compared = []
    for name in CORPUS:
        path = write(name, kind, tmp_path)
        if path is not None:  # enhanced-model CDL (groups, strings, unsigned types in CDF-1/2)
            assert_dumps_alike(name, path)
            compared.append(name)
    assert len(compared) >= 4, compared  # chars, control_chars, precision, precision_atts at least


@pytest.mark.parametrize("options", [("-h",), ("-v", "v"), ("-h", "-n", "other")], ids=str)
def test_options_apply_to_files_too(tmp_path, options):
    path = write("types", "netcdf4", tmp_path)
    variables = [line for line in expected_dump(path, "-h").decode().splitlines() if "(" in line]
    if "-v" in options:
        first = variables[0].split()[1].split("(")[0]
        options = ("-v", first)
    ours = nczmap_command("ncdump", *options, path)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == expected_dump(path, *options)


def test_a_file_of_no_known_format_is_an_error_naming_it(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not netCDF\n")
    ours = nczmap_command("ncdump", path)
    assert ours.returncode == 1 and b"notes.txt" in ours.stderr and b"Traceback" not in ours.stderr
