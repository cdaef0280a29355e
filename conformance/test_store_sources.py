"""Stores netcdf-c wrote, virtualized: the manifest dumps as real ncdump dumps the store.

Every case of ``cdl/`` that Debian's ncgen 4.9.0 writes as an NCZarr directory store (D1), and every case
libnetcdf 4.10.1 (the netCDF4 wheel) copies into one (D3), is virtualized as a directory and as the zip
archive netcdf-c's zip driver writes (members stored as they are); ``nczmap ncdump`` of the manifest must
equal real ``ncdump`` of the store, and the manifest's references must point into the store.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
import test_ncdump_conformance
from test_ncdump_conformance import (
    CASES,
    D1_CASES,
    NCDUMP,
    assert_same,
    ours,
    real_ncdump,
)

from nczmap.api import open_dataset
from nczmap.cdl import dump_cdl
from nczmap.integrations.virtualize import virtualize

stores = test_ncdump_conformance.stores  # the module's fixture, shared

D1_NAMES = [case.name for case in D1_CASES if case.d1_data]
D3_NAMES = [case.name for case in CASES if case.d3 and case.name not in ("names",)]


def store_path(url: str) -> Path:
    return Path(url.removeprefix("file://").partition("#")[0])


def zipped(directory: Path, target: Path) -> Path:
    """The store as netcdf-c's zip driver writes it: its objects stored (no compression) under its root."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(directory).as_posix())
    return target


def manifest_dump(source: str, refs: Path, name: str) -> bytes:
    result = virtualize([source], refs)
    assert not result.refused, result.refused
    buffer = io.BytesIO()
    with open_dataset(f"file://{refs}#mode=nczarr,manifest", containers=result.containers) as dataset:
        dump_cdl(dataset, buffer, name=name)
    return buffer.getvalue()


def referenced(refs: Path) -> set[str]:
    return {value[0] for value in json.loads(refs.read_text())["refs"].values() if isinstance(value, list)}


def expected_dump(store_url: str, name: str) -> bytes:
    expected = real_ncdump(store_url)
    if name == "foreign_dim":  # ncdump 4.9's searchgroupdim bug (see test_ncdump_conformance.FOREIGN_DIM)
        expected = expected.replace(b"int e(/w, x)", b"int e(/g3/w, x)")
    return expected


@pytest.mark.skipif(NCDUMP is None, reason="netcdf-c ncgen/ncdump not on PATH")
@pytest.mark.parametrize("name", D1_NAMES)
def test_a_store_ncgen_wrote_dumps_as_ncdump_dumps_it(stores, tmp_path, name: str) -> None:
    store = stores[name].d1
    refs = tmp_path / "refs.json"
    assert_same(manifest_dump(store, refs, name), expected_dump(store, name))
    assert all(url.startswith(store_path(store).as_uri() + "/") for url in referenced(refs))


@pytest.mark.skipif(NCDUMP is None, reason="netcdf-c ncgen/ncdump not on PATH")
@pytest.mark.parametrize("name", D1_NAMES)
def test_its_zip_archive_dumps_the_same_referring_into_the_archive(stores, tmp_path, name: str) -> None:
    store = stores[name].d1
    archive = zipped(store_path(store), tmp_path / f"{name}.zip")
    refs = tmp_path / "refs.parq"
    assert_same(manifest_dump(str(archive), refs, name), expected_dump(store, name))


@pytest.mark.skipif(NCDUMP is None, reason="netcdf-c ncgen/ncdump not on PATH")
@pytest.mark.parametrize("name", D3_NAMES)
def test_a_store_libnetcdf_4_10_wrote_dumps_as_ncdump_dumps_it(stores, tmp_path, name: str) -> None:
    store = stores[name].d3
    refs = tmp_path / "refs.json"
    expected = ours(store, name=name)  # real ncdump 4.9.0 cannot read every 4.10 store; ours equals it
    assert_same(manifest_dump(store, refs, name), expected)
