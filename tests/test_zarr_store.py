"""nczmap.ZarrStore: zarr-python's store contract over every zmap driver, and NCZarr read by zarr and xarray.

zarr's own ``StoreTests`` run on the memory, file, zip and S3 drivers (their async tests run on zarr's event
loop: the project has no asyncio pytest plugin). Conformance compares ``xr.open_zarr`` through the store
with ``xr.open_dataset(engine="netcdf4")`` of a netCDF-4 file holding the same data, written by
netCDF4-python or by real ``ncgen`` from the same CDL: expected values never come from nczmap.
"""

from __future__ import annotations

import functools
import inspect
import json
import pickle
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nczmap
from nczmap.zmap import MemoryMap

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")
netCDF4 = pytest.importorskip("netCDF4")

from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest  # noqa: E402
from zarr.core.buffer import cpu, default_buffer_prototype  # noqa: E402
from zarr.core.sync import sync  # noqa: E402
from zarr.testing.store import StoreTests  # noqa: E402

ZarrStore = nczmap.ZarrStore
NCGEN = shutil.which("ncgen")
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "conformance" / "netcdf-c"
needs_fixtures = pytest.mark.skipif(
    not FIXTURES.is_dir(), reason=f"netcdf-c's fixtures are not at {FIXTURES}"
)
needs_ncgen = pytest.mark.skipif(NCGEN is None, reason="netcdf-c ncgen is not on PATH")
# D0 stores hold .nczarr/.nczgroup/.nczattr objects, which zarr lists and warns about.
pytestmark = pytest.mark.filterwarnings("ignore:Object at .ncz:UserWarning")


def buffer(data: bytes) -> cpu.Buffer:
    return cpu.Buffer.from_bytes(data)


def get_bytes(store: ZarrStore, key: str, byte_range=None) -> bytes | None:
    found = sync(store.get(key, default_buffer_prototype(), byte_range))
    return None if found is None else found.to_bytes()


def collect(iterator) -> list[str]:
    async def run():
        return [item async for item in iterator]

    return sync(run())


# ------------------------------------------------------------------------- zarr's StoreTests
def _on_zarr_loop(function):
    @functools.wraps(function)
    def run(*args, **kwargs):
        return sync(function(*args, **kwargs))

    return run


class SyncStoreTests(StoreTests[ZarrStore, cpu.Buffer]):
    """zarr's StoreTests with every coroutine test and fixture run to completion on zarr's own loop."""

    store_cls = ZarrStore
    buffer_cls = cpu.Buffer
    driver = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            test = getattr(cls, name)
            if name.startswith("test_") and inspect.iscoroutinefunction(test):
                setattr(cls, name, _on_zarr_loop(test))

    @pytest.fixture
    def store(self, open_kwargs: dict[str, Any]):
        store = sync(self.store_cls.open(**open_kwargs))
        yield store
        store.close()

    @pytest.fixture
    def store_not_open(self, store_kwargs: dict[str, Any]):
        store = self.store_cls(**store_kwargs)
        yield store
        store.close()

    async def set(self, store: ZarrStore, key: str, value) -> None:
        store.zmap.write("/" + key, value.to_bytes())

    async def get(self, store: ZarrStore, key: str):
        return self.buffer_cls.from_bytes(store.zmap.read("/" + key))

    def test_store_repr(self, store: ZarrStore) -> None:
        assert repr(store).startswith("ZarrStore(") and f"driver={self.driver!r}" in repr(store)

    def test_store_supports_writes(self, store: ZarrStore) -> None:
        assert store.supports_writes and store.supports_deletes

    def test_store_supports_listing(self, store: ZarrStore) -> None:
        assert store.supports_listing


class TestMemoryStore(SyncStoreTests):
    driver = "memory"

    @pytest.fixture
    def store_kwargs(self) -> dict[str, Any]:
        return {"url_or_map": MemoryMap(), "read_only": False}


def _local_kwargs(path: Path, driver: str) -> dict[str, Any]:
    url = f"file://{path}#mode=nczarr,{driver}"
    nczmap.open_map(url, "w").close()  # an empty dataset, so that read-only stores open too
    return {"url_or_map": url, "read_only": False}


class TestFileStore(SyncStoreTests):
    driver = "file"

    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return _local_kwargs(tmp_path / "store.file", "file")


class TestZipStore(SyncStoreTests):
    driver = "zip"

    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return _local_kwargs(tmp_path / "store.zip", "zip")

    @pytest.mark.xfail(
        raises=nczmap.StorageError,
        strict=True,
        reason="nczmap's zip driver refuses to pickle an archive open for writing: every process would "
        "rewrite the whole archive at close and all but the last one's writes would be lost",
    )
    def test_serializable_store(self, store: ZarrStore) -> None:
        sync(super().test_serializable_store(store))

    @pytest.mark.filterwarnings("ignore:.*was not closed. its changes are discarded:ResourceWarning")
    def test_with_read_only_store(self, open_kwargs: dict[str, Any]) -> None:
        # StoreTests leaves its writable copy unclosed: the zip driver discards (and warns about) its
        # staged writes, which the test deletes again anyway.
        sync(super().test_with_read_only_store(open_kwargs))


class TestS3Store(SyncStoreTests):
    driver = "s3"

    @pytest.fixture
    def store_kwargs(self, s3_server) -> dict[str, Any]:
        return {"url_or_map": s3_server.url(), "read_only": False}


# ------------------------------------------------------------------------- one dataset, two writers
V = np.array([[1, 2, 3], [4, 5, -1]], dtype="i4")
D = np.array([1.5, 2.5, 3.5])
Z = np.array([10, 20], dtype="i2")


def write_netcdf4(path: Path, scalar: bool = True) -> None:
    with netCDF4.Dataset(path, "w") as nc:
        nc.title = "zarr store conformance"
        nc.createDimension("x", 2)
        nc.createDimension("y", 3)
        v = nc.createVariable("v", "i4", ("x", "y"), fill_value=-1)
        v.units = "m"
        v[:] = np.ma.masked_equal(V, -1)
        if scalar:
            nc.createVariable("s", "f4", ())[...] = 3.5
        g = nc.createGroup("g")
        g.gattr = 7
        g.createDimension("z", 2)
        g.createVariable("d", "f8", ("y",))[:] = D
        g.createVariable("w", "i2", ("z",))[:] = Z


def write_nczmap(url: str, version: str | None, scalar: bool = True) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "netcdf-c 4.9.0 crashes on scalar variables"
        with nczmap.create_dataset(url, netcdf_version=version) as ds:
            ds.attrs["title"] = "zarr store conformance"
            ds.create_dimension("x", 2)
            ds.create_dimension("y", 3)
            v = ds.create_variable("v", ("x", "y"), "i4", fill_value=-1)
            v.attrs["units"] = "m"
            v[...] = V
            if scalar:
                ds.create_variable("s", (), "f4", data=np.float32(3.5))
            g = ds.create_group("g")
            g.attrs["gattr"] = np.int32(7)
            g.create_dimension("z", 2)
            g.create_variable("d", ("y",), "f8", data=D)
            g.create_variable("w", ("z",), "i2", data=Z)


def zarr_view(store: ZarrStore, group: str | None = None, consolidated: bool = False) -> xr.Dataset:
    with xr.open_zarr(store, consolidated=consolidated, group=group) as ds:
        loaded = ds.load()
    if "_scalar_" in loaded.dims:  # netCDF scalars are [1]-shaped arrays over netcdf-c's "_scalar_"
        loaded = loaded.isel(_scalar_=0)
    return loaded


def netcdf_view(path: Path, group: str | None = None) -> xr.Dataset:
    with xr.open_dataset(path, engine="netcdf4", group=group) as ds:
        return ds.load()


def assert_same_data(store: ZarrStore, source: Path, groups=(None, "g")) -> None:
    for group in groups:
        xr.testing.assert_identical(zarr_view(store, group), netcdf_view(source, group))


VERSIONS = ["4.8.0", "4.8.1", "4.9.1", None]


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"netcdf-{v or 'current'}")
def test_every_dialect_nczmap_writes_reads_like_netcdf4(tmp_path, version):
    source = tmp_path / "source.nc"
    write_netcdf4(source)
    url = f"file://{tmp_path}/ds.file#mode=nczarr,file"
    write_nczmap(url, version)
    assert_same_data(ZarrStore(url), source)


def test_d0_arrays_have_no_zattrs_but_present_one_consistently(tmp_path):
    url = f"file://{tmp_path}/ds.file#mode=nczarr,file"
    write_nczmap(url, "4.8.0")
    assert not (tmp_path / "ds.file" / "g" / "d" / ".zattrs").exists()
    store = ZarrStore(url)
    presented = get_bytes(store, "g/d/.zattrs")
    assert json.loads(presented) == {"_ARRAY_DIMENSIONS": ["y"]}
    assert sync(store.exists("g/d/.zattrs"))
    assert sync(store.getsize("g/d/.zattrs")) == len(presented)
    assert get_bytes(store, "g/d/.zattrs", RangeByteRequest(2, 9)) == presented[2:9]
    assert get_bytes(store, "g/d/.zattrs", SuffixByteRequest(4)) == presented[-4:]
    assert get_bytes(store, "g/d/.zattrs", OffsetByteRequest(3)) == presented[3:]
    assert ".zattrs" in collect(store.list_dir("g/d"))
    assert "g/d/.zattrs" in collect(store.list())
    assert "g/d/.zattrs" in collect(store.list_prefix("g/"))
    partial = sync(store.get_partial_values(None, [("g/d/.zattrs", RangeByteRequest(0, 5))]))
    assert partial[0].to_bytes() == presented[:5]
    # the scalar's [1] shape gets netcdf-c's dimension name
    assert json.loads(get_bytes(store, "s/.zattrs"))["_ARRAY_DIMENSIONS"] == ["_scalar_"]


def test_unusable_stored_array_dimensions_are_replaced(tmp_path):
    """netcdf-c 4.8.1-4.9.0 (D1) write ``[]`` for a scalar, whose array has shape [1]: xarray refuses that."""
    url = f"file://{tmp_path}/ds.file#mode=nczarr,file"
    write_nczmap(url, "4.8.1")
    stored = json.loads((tmp_path / "ds.file" / "s" / ".zattrs").read_text())
    assert stored["_ARRAY_DIMENSIONS"] == []
    presented = json.loads(get_bytes(ZarrStore(url), "s/.zattrs"))
    assert presented == {**stored, "_ARRAY_DIMENSIONS": ["_scalar_"]}


def test_presented_attributes_keep_everything_stored(tmp_path):
    url = f"file://{tmp_path}/ds.file#mode=nczarr,noxarray,file"
    write_nczmap(url, None)
    stored = json.loads((tmp_path / "ds.file" / "v" / ".zattrs").read_text())
    assert "_ARRAY_DIMENSIONS" not in stored
    presented = json.loads(get_bytes(ZarrStore(url), "v/.zattrs"))
    assert presented == {**stored, "_ARRAY_DIMENSIONS": ["x", "y"]}


def test_user_written_array_dimensions_are_kept(tmp_path):
    source = tmp_path / "source.nc"
    write_netcdf4(source)
    url = f"file://{tmp_path}/ds.file#mode=nczarr,file"
    write_nczmap(url, "4.8.1")  # D1: subgroup arrays carry no _ARRAY_DIMENSIONS
    zattrs = tmp_path / "ds.file" / "g" / "d" / ".zattrs"
    attrs = json.loads(zattrs.read_text()) if zattrs.exists() else {}
    zattrs.write_text(json.dumps({**attrs, "_ARRAY_DIMENSIONS": ["mine"]}))
    store = ZarrStore(url)
    assert zarr.open_group(store, mode="r")["g/d"].attrs["_ARRAY_DIMENSIONS"] == ["mine"]
    expected = netcdf_view(source, "g").rename_dims(y="mine")
    xr.testing.assert_identical(zarr_view(store, "g"), expected)


def test_consolidated_metadata_shows_the_presented_attributes(tmp_path):
    source = tmp_path / "source.nc"
    write_netcdf4(source)
    url = f"file://{tmp_path}/ds.file#mode=nczarr,noxarray,consolidated,file"
    write_nczmap(url, None)
    stored = json.loads((tmp_path / "ds.file" / ".zmetadata").read_text())["metadata"]
    assert "_ARRAY_DIMENSIONS" not in stored["g/d/.zattrs"]
    store = ZarrStore(url)
    presented = json.loads(get_bytes(store, ".zmetadata"))["metadata"]
    assert presented["g/d/.zattrs"]["_ARRAY_DIMENSIONS"] == ["y"]
    assert presented["g/d/.zattrs"] == json.loads(get_bytes(store, "g/d/.zattrs"))
    for group in (None, "g"):
        xr.testing.assert_identical(zarr_view(store, group, consolidated=True), netcdf_view(source, group))


def test_zip_written_by_nczmap_opens_at_its_root(tmp_path):
    source = tmp_path / "source.nc"
    write_netcdf4(source)
    url = f"{tmp_path}/x.zip#mode=nczarr,zip"
    write_nczmap(url, None)
    assert all(name.startswith("x/") for name in _zip_names(tmp_path / "x.zip"))  # netcdf-c's layout
    store = ZarrStore(url)
    assert sorted(zarr.open_group(store, mode="r").keys()) == ["g", "s", "v"]
    assert_same_data(store, source)


def _zip_names(path: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return archive.namelist()


def test_s3_store_reads_like_netcdf4(tmp_path, s3_server):
    source = tmp_path / "source.nc"
    write_netcdf4(source)
    url = s3_server.url()
    write_nczmap(url, "4.9.1")
    assert_same_data(ZarrStore(url), source)


def test_other_writers_pure_zarr_is_passed_through(tmp_path):
    zarr = pytest.importorskip("zarr")
    group = zarr.open_group(str(tmp_path / "ds.zarr"), mode="w", zarr_format=2)
    group.create_array("v", shape=(2,), dtype="<i4", attributes={"units": "m"})[:] = [1, 2]
    store = ZarrStore(f"file://{tmp_path}/ds.zarr#mode=zarr,file")
    assert get_bytes(store, "v/.zattrs") == (tmp_path / "ds.zarr" / "v" / ".zattrs").read_bytes()


def test_netcdf_c_pure_zarr_without_dimension_names_gets_the_readers(tmp_path):
    """netcdf-c's pure Zarr (its _NCProperties says so) without _ARRAY_DIMENSIONS (mode=noxarray, or
    4.9.0's subgroups) gets the names nczmap's reader gives, as its engine shows them."""
    url = f"file://{tmp_path}/ds.file#mode=zarr,noxarray,file"
    write_nczmap(url, None, scalar=False)
    stored = json.loads((tmp_path / "ds.file" / "v" / ".zattrs").read_bytes())
    assert "_ARRAY_DIMENSIONS" not in stored
    presented = json.loads(get_bytes(ZarrStore(url), "v/.zattrs"))
    with nczmap.open_dataset(url) as ds:
        assert presented == {**stored, "_ARRAY_DIMENSIONS": list(ds.variables["v"].dimensions)}


def test_lenient_json_netcdf_c_wrote_is_shown_strict():
    zmap = MemoryMap("w")
    zmap.write("/.zgroup", b'{"zarr_format": 2}')
    zmap.write("/.zattrs", b'{"raw": "x' + b"\t" + b'y", "n": 1.}')  # a raw tab (bug 21), "1." (bug 20)
    with pytest.raises(ValueError):
        json.loads(zmap.read("/.zattrs"))
    assert json.loads(get_bytes(ZarrStore(zmap), ".zattrs")) == {"raw": "x\ty", "n": 1.0}


# ------------------------------------------------------------------------- real netcdf-c
CDL = """netcdf x {
dimensions:
\tx = 2 ;
\ty = 3 ;
variables:
\tint v(x, y) ;
\t\tv:_FillValue = -1 ;
\t\tv:units = "m" ;
\tdouble t(y) ;

// global attributes:
\t\t:title = "ncgen conformance" ;
data:

 v = 1, 2, 3, 4, 5, _ ;

 t = 0.5, 1.5, 2.5 ;

group: g {
  dimensions:
  \tz = 2 ;
  variables:
  \tshort w(z) ;
  \tdouble d(y) ;
  \t\td:long_name = "in a group" ;

  // group attributes:
  \t\t:gattr = 7 ;
  data:

   w = 10, 20 ;

   d = 1.5, 2.5, 3.5 ;
  } // group g
}
"""


def ncgen(cdl: Path, output: str) -> None:
    done = subprocess.run([NCGEN, "-4", "-lb", "-o", output, str(cdl)], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")


@needs_ncgen
@pytest.mark.parametrize("modes", ["nczarr", "nczarr,noxarray", "zarr"])
def test_stores_written_by_ncgen(tmp_path, modes):
    """Char arrays too: 4.9.0 declares them "<U1" but stores a byte a character, and writes "<u1"; both
    are shown to zarr-python 3 as what they hold ("|S1", "|u1")."""
    cdl = tmp_path / "x.cdl"
    cdl.write_text(CDL)
    source = tmp_path / "x.nc"
    ncgen(cdl, str(source))
    url = f"file://{tmp_path}/x.file#mode={modes},file"
    ncgen(cdl, url)
    groups = (None,) if modes == "zarr" else (None, "g")  # ncgen 4.9.0 writes no subgroup in pure Zarr
    assert_same_data(ZarrStore(url), source, groups)


@needs_fixtures
@needs_ncgen
@pytest.mark.parametrize(
    ("archive", "groups"),
    [("ref_oldformat.zip", (None, "g1")), ("ref_oldkeys.file.zip", (None,))],
)
def test_netcdf_c_fixture_zips(tmp_path, archive, groups):
    """netcdf-c's own zips (one top folder; D3 from 4.9.3-development, D2 from 4.9.2) against their CDL."""
    name = archive.split(".")[0]
    source = tmp_path / f"{name}.nc"
    ncgen(FIXTURES / f"{name}.cdl", str(source))
    copy = tmp_path / archive
    shutil.copy(FIXTURES / archive, copy)
    assert_same_data(ZarrStore(f"{copy}#mode=nczarr,zip"), source, groups)


# ------------------------------------------------------------------------- writing through the store
def test_writes_go_through_unchanged_and_refresh_the_presentation(tmp_path):
    url = f"file://{tmp_path}/ds.file#mode=nczarr,file"
    write_nczmap(url, "4.8.0")
    store = ZarrStore(url, mode="r+")
    assert json.loads(get_bytes(store, "v/.zattrs"))["_ARRAY_DIMENSIONS"] == ["x", "y"]
    written = b'{"note": "mine"}'
    sync(store.set("v/.zattrs", buffer(written)))
    assert (tmp_path / "ds.file" / "v" / ".zattrs").read_bytes() == written
    assert json.loads(get_bytes(store, "v/.zattrs")) == {"note": "mine", "_ARRAY_DIMENSIONS": ["x", "y"]}
    store.close()


def test_zarr_v3_written_through_the_store(tmp_path):
    url = f"file://{tmp_path}/v3.file#mode=zarr,file"
    with ZarrStore(url, mode="w") as store:
        root = zarr.open_group(store, mode="w", zarr_format=3, attributes={"title": "v3"})
        array = root.create_array("a", shape=(4, 3), chunks=(2, 3), dtype="i4", dimension_names=["p", "q"])
        array[...] = np.arange(12).reshape(4, 3)
        written = store.zmap.read("/a/zarr.json")
    assert (tmp_path / "v3.file" / "a" / "zarr.json").read_bytes() == written
    reader = ZarrStore(url)
    assert get_bytes(reader, "a/zarr.json") == written
    np.testing.assert_array_equal(zarr.open_group(reader, mode="r")["a"][...], np.arange(12).reshape(4, 3))
    with xr.open_zarr(reader, consolidated=False) as ds:
        assert ds["a"].dims == ("p", "q")


def test_zarr_v2_written_to_a_zip_commits_at_close(tmp_path):
    url = f"{tmp_path}/w.zip#mode=zarr,zip"
    with ZarrStore(url, mode="w") as store:
        root = zarr.open_group(store, mode="w", zarr_format=2)
        root.create_array("a", shape=(5,), chunks=(2,), dtype="f8")[...] = np.arange(5.0)
        root["a"][0] = 9.0  # an overwrite: no duplicate member in the archive
    names = _zip_names(tmp_path / "w.zip")
    assert len(names) == len(set(names))
    np.testing.assert_array_equal(zarr.open_group(ZarrStore(url), mode="r")["a"][...], [9, 1, 2, 3, 4])


# ------------------------------------------------------------------------- reads: ranges, threads
class CountingMap(MemoryMap):
    def __init__(self) -> None:
        super().__init__("w")
        self.reads: list[tuple[str, int, int | None]] = []
        self.threads: set[int] = set()

    def _read(self, key: str, start: int, count: int | None) -> bytes:
        self.reads.append((key, start, count))
        self.threads.add(threading.get_ident())
        return super()._read(key, start, count)


def test_byte_ranges_are_zmap_range_reads_off_the_event_loop():
    zmap = CountingMap()
    zmap.write("/c/0", bytes(range(10)))
    store = ZarrStore(zmap)
    assert get_bytes(store, "c/0", RangeByteRequest(2, 5)) == bytes([2, 3, 4])
    assert get_bytes(store, "c/0", OffsetByteRequest(7)) == bytes([7, 8, 9])
    assert get_bytes(store, "c/0", SuffixByteRequest(3)) == bytes([7, 8, 9])
    assert zmap.reads == [("/c/0", 2, 3), ("/c/0", 7, None), ("/c/0", 7, None)]
    loop_thread = sync(_loop_thread())
    assert loop_thread not in zmap.threads


def test_pure_zarr_metadata_is_passed_on_without_reading_the_model():
    zmap = CountingMap()
    zmap.write("/.zgroup", b'{"zarr_format": 2}')
    for index in range(20):
        zmap.write(f"/v{index}/.zarray", b'{"zarr_format": 2, "shape": [1], "chunks": [1], "dtype": "<f8"}')
        zmap.write(f"/v{index}/.zattrs", b'{"_ARRAY_DIMENSIONS": ["x"]}')
    store = ZarrStore(zmap)
    assert get_bytes(store, "v3/.zattrs") == b'{"_ARRAY_DIMENSIONS": ["x"]}'
    # the root's two objects, to see it is not NCZarr, and the one asked for: not the other 39
    assert sorted(key for key, _, _ in zmap.reads) == ["/.zattrs", "/.zgroup", "/v3/.zattrs"]


async def _loop_thread() -> int:
    return threading.get_ident()


def test_get_without_prototype_as_xarray_calls_it():
    zmap = MemoryMap()
    zmap.write("/k", b"abc")
    assert sync(ZarrStore(zmap).get("k")).to_bytes() == b"abc"


def test_capabilities_follow_the_driver(tmp_path):
    url = f"file://{tmp_path}/ds.file#mode=nczarr,file"
    write_nczmap(url, None)
    store = ZarrStore(url)
    assert store.read_only and store.supports_writes and store.supports_listing
    assert not ZarrStore(url, mode="r+").read_only
    assert not ZarrStore(MemoryMap()).read_only
    assert ZarrStore(MemoryMap("r")).read_only


# ------------------------------------------------------------------------- pickling, read-only, equality
def _pickled_store(kind: str, tmp_path: Path, s3_server=None) -> tuple[ZarrStore, str | None]:
    if kind == "memory":
        zmap = MemoryMap()
        zmap.write("/c/0", b"data")
        return ZarrStore(zmap), None
    url = {
        "file": f"file://{tmp_path}/p.file#mode=nczarr,file",
        "zip": f"{tmp_path}/p.zip#mode=nczarr,zip",
        "s3": s3_server.url() if s3_server else None,
    }[kind]
    with nczmap.open_map(url, "w") as zmap:
        zmap.write("/c/0", b"data")
    return ZarrStore(url, read_only=kind == "zip"), url


@pytest.mark.parametrize("kind", ["memory", "file", "zip", "s3"])
def test_pickle_round_trip(tmp_path, kind, request):
    s3_server = request.getfixturevalue("s3_server") if kind == "s3" else None
    store, url = _pickled_store(kind, tmp_path, s3_server)
    assert get_bytes(store, "c/0") == b"data"  # the map is open when pickled
    copy = pickle.loads(pickle.dumps(store))
    assert copy == store and copy.read_only == store.read_only
    assert get_bytes(copy, "c/0") == b"data"
    if not store.read_only:
        sync(copy.set("c/1", buffer(b"more")))
        assert get_bytes(copy, "c/1") == b"more"
        if kind != "memory":  # the copy wrote to the same storage
            assert get_bytes(ZarrStore(url), "c/1") == b"more"
    copy.close()
    store.close()


def test_a_writable_store_unpickles_as_r_plus_never_w(tmp_path):
    url = f"file://{tmp_path}/p.file#mode=nczarr,file"
    store = ZarrStore(url, mode="w")  # not opened yet: pickled by URL
    sync(store.set("c/0", buffer(b"kept")))
    store.close()
    copy = pickle.loads(pickle.dumps(store))
    assert get_bytes(copy, "c/0") == b"kept"
    assert copy.zmap.mode == "r+"
    copy.close()


def test_with_read_only_refuses_writes_with_zarrs_error():
    zmap = MemoryMap()
    store = ZarrStore(zmap)
    reader = store.with_read_only(True)
    assert reader.read_only and reader != store and reader == ZarrStore(zmap, read_only=True)
    with pytest.raises(ValueError, match="read-only mode"):
        sync(reader.set("k", buffer(b"x")))
    with pytest.raises(ValueError, match="read-only mode"):
        sync(reader.delete("k"))
    with pytest.raises(nczmap.ReadOnlyError):
        ZarrStore(MemoryMap("r")).with_read_only(False)


def test_xarray_opens_a_writable_store_read_only(tmp_path):
    url = f"file://{tmp_path}/ds.file#mode=nczarr,file"
    write_nczmap(url, None)
    store = ZarrStore(url, mode="r+")
    assert zarr_view(store)["v"].dims == ("x", "y")
    store.close()


def test_equality(tmp_path):
    zmap = MemoryMap()
    assert ZarrStore(zmap) == ZarrStore(zmap)
    assert ZarrStore(zmap) != ZarrStore(zmap, read_only=True)
    a, b = tmp_path / "a.file", tmp_path / "b.file"
    assert ZarrStore(f"{a}#mode=nczarr,file") == ZarrStore(f"{a.as_uri()}#mode=zarr,file")
    assert ZarrStore(f"{a}#mode=nczarr,file") != ZarrStore(f"{b}#mode=nczarr,file")
    assert ZarrStore(zmap) != "not a store"


# ------------------------------------------------------------------------- hostile input
@pytest.mark.parametrize("key", ["a/../b", "a//b", "./a", "a/", "/a", "a\\b", ".nczmap-tmp-x", "a\x00b"])
def test_keys_nczmap_cannot_store_are_named(key):
    store = ZarrStore(MemoryMap())
    with pytest.raises(nczmap.KeyNameError, match="zarr key"):
        sync(store.set(key, buffer(b"x")))
    with pytest.raises(nczmap.KeyNameError):
        get_bytes(store, key)


def test_missing_keys():
    store = ZarrStore(MemoryMap())
    assert get_bytes(store, "missing") is None
    assert get_bytes(store, "missing", RangeByteRequest(0, 4)) is None
    assert not sync(store.exists("missing"))
    with pytest.raises(FileNotFoundError, match="missing"):
        sync(store.getsize("missing"))
    assert sync(store.get_partial_values(None, [("missing", None)])) == [None]
    sync(store.delete("missing"))


def test_ranges_past_the_end_and_negative_ranges():
    zmap = MemoryMap()
    zmap.write("/k", b"0123")
    store = ZarrStore(zmap)
    assert get_bytes(store, "k", RangeByteRequest(2, 100)) == b"23"
    assert get_bytes(store, "k", RangeByteRequest(10, 20)) == b""
    assert get_bytes(store, "k", SuffixByteRequest(100)) == b"0123"
    for bad in (
        SuffixByteRequest(-1),
        OffsetByteRequest(-2),
        RangeByteRequest(3, 1),
        RangeByteRequest(-1, 2),
    ):
        with pytest.raises(nczmap.NCZError, match="bad byte range") as info:
            get_bytes(store, "k", bad)
        assert isinstance(info.value, ValueError)
    with pytest.raises(TypeError, match="Unexpected byte_range"):
        get_bytes(store, "k", (0, 2))


def test_bad_arguments(tmp_path):
    with pytest.raises(nczmap.ModeError, match="contradicts"):
        ZarrStore(f"{tmp_path}/a.file#mode=nczarr,file", read_only=True, mode="a")
    with pytest.raises(nczmap.ModeError, match="already open"):
        ZarrStore(MemoryMap(), mode="r")
    with pytest.raises(nczmap.ReadOnlyError):
        ZarrStore(MemoryMap("r"), read_only=False)
    with pytest.raises(nczmap.errors.DataError, match="Buffer"):
        sync(ZarrStore(MemoryMap()).set("k", b"raw bytes"))


def test_zarr_is_imported_only_when_zarr_store_is_used():
    script = "import sys, nczmap; nczmap.open_map; print('zarr' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_manifest_store_reads_like_netcdf4(tmp_path):
    from test_manifest import write_manifest

    source = tmp_path / "source.nc"
    write_netcdf4(source)
    url = f"file://{tmp_path}/ds.file#mode=nczarr,file"
    write_nczmap(url, "4.8.0")
    with nczmap.open_map(url) as zmap:
        objects = {key: zmap.read(key) for key in zmap.objects()}
    (tmp_path / "refs").mkdir()
    with ZarrStore(write_manifest(tmp_path / "refs", objects)) as store:
        assert store.read_only and "driver='manifest'" in repr(store)
        assert_same_data(store, source)


def test_partial_values_of_many_presented_objects_on_s3(s3_server, monkeypatch):
    """The model is read once, before the batch spreads over nczmap's I/O pool (whose workers the model's
    own prefetching needs), not by every worker at once."""
    from nczmap.integrations import zarr_store

    url = s3_server.url()
    with nczmap.create_dataset(url, netcdf_version="4.8.0") as ds:
        ds.create_dimension("x", 2)
        for index in range(12):
            ds.create_variable(f"v{index}", ("x",), "i4", data=[index, index])
    builds = []
    build = zarr_store._presentation_of
    monkeypatch.setattr(zarr_store, "_presentation_of", lambda zmap: builds.append(1) or build(zmap))
    store = ZarrStore(url)
    requests = [(f"v{index}/.zattrs", RangeByteRequest(0, 1000)) for index in range(12)]
    found: list = []
    worker = threading.Thread(target=lambda: found.extend(sync(store.get_partial_values(None, requests))))
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "get_partial_values hung"
    assert [json.loads(b.to_bytes())["_ARRAY_DIMENSIONS"] for b in found] == [["x"]] * 12
    assert len(builds) == 1


def _zarray(path: Path, **changes: Any) -> None:
    """Rewrite ``path`` (a ``.zarray``) as another writer wrote it; a value of None drops the key."""
    array = json.loads(path.read_text())
    array.update({k: v for k, v in changes.items() if v is not None})
    for key in [k for k, v in changes.items() if v is None]:
        del array[key]
    path.write_text(json.dumps(array))


def test_zarrays_zarr_python_cannot_read_as_written_are_presented_readable(tmp_path):
    """netcdf-c 4.10.1's shuffle ``elementsize: 0`` (the type's size; numcodecs mis-decodes it), 4.8.0's
    no-fill arrays without a ``fill_value`` key, 4.8.0-4.9.0's never-written ``<U1`` char arrays."""
    import netCDF4

    from nczmap.integrations.copy import copy as nczmap_copy

    source = tmp_path / "source.nc"
    with netCDF4.Dataset(source, "w") as nc:
        nc.createDimension("n", 8)
        nc.createDimension("k", 3)
        nc.createVariable("z", "i4", ("n",), zlib=True, shuffle=True)[:] = np.arange(8) * 70000
        nofill = nc.createVariable("nf", "i2", ("n",), fill_value=False)
        nofill[:] = np.arange(8)
        nc.createVariable("never", "S1", ("n", "k"))
    url = f"file://{tmp_path}/ds.file#mode=nczarr,file"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nczmap_copy(str(source), url, netcdf_version="4.9.0")  # char as <U1
        nczmap_copy(str(source), url.replace("ds.file", "d3.file"))  # with the shuffle 4.9.0 cannot write
    root = tmp_path / "ds.file"
    shutil.rmtree(root / "z")
    shutil.copytree(tmp_path / "d3.file" / "z", root / "z")
    assert json.loads((root / "z" / ".zarray").read_text())["filters"][0]["id"] == "shuffle"
    _zarray(root / "z" / ".zarray", filters=[{"id": "shuffle", "elementsize": 0}])
    _zarray(root / "nf" / ".zarray", fill_value=None)
    assert json.loads((root / "never" / ".zarray").read_text())["dtype"] == "<U1"
    assert not [p for p in (root / "never").iterdir() if not p.name.startswith(".")]
    store = ZarrStore(url)
    assert json.loads(get_bytes(store, "z/.zarray"))["filters"] == [{"id": "shuffle", "elementsize": 4}]
    assert json.loads(get_bytes(store, "nf/.zarray"))["fill_value"] is None
    assert json.loads(get_bytes(store, "never/.zarray"))["dtype"] == "|S1"
    with xr.open_zarr(store, consolidated=False) as ours:
        np.testing.assert_array_equal(ours["z"].values, np.arange(8) * 70000)
        np.testing.assert_array_equal(ours["nf"].values, np.arange(8))
        assert "_FillValue" not in ours["nf"].attrs
    never = zarr.open_group(store, mode="r")["never"]
    assert never.dtype == np.dtype("S1")
    assert never[:].tolist() == [[b""] * 3] * 8


def test_a_string_fill_value_reads_the_same_in_netcdf_c_zarr_and_nczmap(tmp_path):
    """netcdf-c writes a string array's fill_value as its text; Zarr v2 wants base64 for fixed-width bytes:
    NCZarr keeps netcdf-c's text (shown to zarr as base64), pure Zarr is written as zarr-python reads it.
    A never-written chunk reads as the fill value everywhere."""
    import zarr

    for mode, name in (("nczarr", "s.file"), ("zarr", "s.zarr")):
        url = f"file://{tmp_path / name}#mode={mode},file"
        with nczmap.create_dataset(url) as ds:
            ds.create_dimension("n", 4)
            v = ds.create_variable("v", ("n",), "string", chunks=(2,), fill_value="zz")
            v[:2] = ["a", ""]
        stored = json.loads((tmp_path / name / "v" / ".zarray").read_text())["fill_value"]
        assert stored == ("zz" if mode == "nczarr" else "eno=")
        with nczmap.open_dataset(url) as ds:
            assert list(ds.variables["v"][:]) == ["a", "", "zz", "zz"]
        group = zarr.open_group(nczmap.ZarrStore(url), mode="r", zarr_format=2)
        assert group["v"].fill_value == b"zz" and list(group["v"][:]) == [b"a", b"", b"zz", b"zz"]
        if mode == "zarr":  # zarr-python alone, nczmap not in the way
            plain = zarr.open_group(str(tmp_path / name), mode="r", zarr_format=2)
            assert plain["v"].fill_value == b"zz"
