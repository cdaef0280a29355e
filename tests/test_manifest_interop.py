"""Virtual datasets across tools: kerchunk references written by VirtualiZarr and kerchunk read by nczmap, and
manifests written by ``nczmap virtualize`` read by VirtualiZarr, fsspec and zarr (the real libraries).

Expected values always come from netCDF4-python reading the source file. What each side cannot read of the
other's output is checked here too: such a test ends as an expected failure naming the limitation while
the library still has it, and checks values as soon as it does not.

- VirtualiZarr 2.5.1 writes kerchunk references for one group at a time (``Dataset.vz.to_kerchunk``;
  a DataTree only goes to Icechunk), and writes Parquet through ``kerchunk.df``, which needs fastparquet.
- kerchunk spells the dimensions of a variable in a subgroup with the group's path (``_ARRAY_DIMENSIONS``
  ``["g/z", "x"]``), which nczmap keeps as the dimension's name.
- VirtualiZarr 2.5.1's kerchunk parsers cannot read a Zarr v2 ``compressor`` object (they spread the dict:
  ``TypeError: Expected codec config to be a dict``; fixed upstream by VirtualiZarr PR #1044, after 2.5.1)
  nor inline chunk data (``NotImplementedError``), and its Parquet parser reads through fsspec's
  LazyReferenceMapper with fastparquet (a fixed engine), which takes every directory in ``.zmetadata`` for
  an array (so no groups) and gives the offsets of a nullable column as floats (which it refuses).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from kerchunk_oracle import kerchunk_hdf_references

import nczmap

netCDF4 = pytest.importorskip("netCDF4")
pytest.importorskip("h5py")
pytest.importorskip("virtualizarr")
xr = pytest.importorskip("xarray")
zarr = pytest.importorskip("zarr")
fsspec = pytest.importorskip("fsspec")

from obspec_utils.registry import ObjectStoreRegistry  # noqa: E402
from obstore.store import LocalStore  # noqa: E402
from virtualizarr import open_virtual_dataset  # noqa: E402
from virtualizarr.parsers import HDFParser, KerchunkJSONParser, KerchunkParquetParser  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:Numcodecs codecs are not in the Zarr version 3 specification:UserWarning"
)

TIMEOUT = 120
COMPRESSED = ("temp", "shuffled")  # root variables with a zlib compressor (and /g/h)
INLINED = ("tiny",)  # chunks under 100 bytes: nczmap keeps them in the manifest


def write_source(path: Path) -> None:
    """netCDF-4 with coordinates, chunked (zlib, shuffle) and contiguous 2-D variables, a tiny variable
    and a group using a dimension of its own and one of the root."""
    rng = np.random.default_rng(11)
    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "interop"
        ds.createDimension("y", 30)
        ds.createDimension("x", 40)
        ds.createDimension("n", 5)
        ds.createVariable("y", "f8", ("y",))[:] = np.arange(30) * 0.5
        ds.createVariable("x", "f8", ("x",))[:] = np.arange(40) * 2.0
        temp = ds.createVariable("temp", "f4", ("y", "x"), zlib=True, complevel=4, chunksizes=(10, 16))
        temp.units = "K"
        temp[:] = rng.normal(size=(30, 40))
        ds.createVariable("plain", "i4", ("y", "x"), contiguous=True)[:] = rng.integers(-999, 999, (30, 40))
        shuffled = ds.createVariable(
            "shuffled", "i2", ("y", "x"), zlib=True, shuffle=True, chunksizes=(15, 20)
        )
        shuffled[:] = rng.integers(-300, 300, size=(30, 40))
        ds.createVariable("tiny", "i2", ("n",), contiguous=True)[:] = [3, 1, 4, 1, 5]
        group = ds.createGroup("g")
        group.createDimension("z", 12)
        group.createVariable("h", "f8", ("z", "x"), zlib=True, chunksizes=(4, 40))[:] = rng.normal(
            size=(12, 40)
        )
        group.createVariable("u", "i4", ("z", "x"), chunksizes=(6, 20))[:] = np.arange(480).reshape(12, 40)


def write_flat(path: Path) -> None:
    """No group, no compressor, no chunk small enough to be inlined."""
    rng = np.random.default_rng(12)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", 30)
        ds.createDimension("x", 40)
        ds.createVariable("y", "f8", ("y",))[:] = np.arange(30) * 0.5
        ds.createVariable("x", "f8", ("x",))[:] = np.arange(40) * 2.0
        ds.createVariable("plain", "i4", ("y", "x"), contiguous=True)[:] = rng.integers(-999, 999, (30, 40))
        ds.createVariable("raw", "f4", ("y", "x"), chunksizes=(10, 20))[:] = rng.normal(size=(30, 40))


def netcdf4_values(path: Path) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """``{"/g/v": (dimension names, values)}`` as netCDF4-python reads them (no masking or scaling)."""
    found = {}
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        groups = [ds]
        while groups:
            group = groups.pop()
            groups.extend(group.groups.values())
            for name, variable in group.variables.items():
                found[group.path.rstrip("/") + "/" + name] = (variable.dimensions, np.asarray(variable[...]))
    return found


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("interop")


@pytest.fixture(scope="module")
def source(folder) -> Path:
    path = folder / "source.nc"
    write_source(path)
    return path


@pytest.fixture(scope="module")
def expected(source):
    return netcdf4_values(source)


@pytest.fixture(scope="module")
def flat(folder) -> Path:
    path = folder / "flat.nc"
    write_flat(path)
    return path


def registry() -> ObjectStoreRegistry:
    return ObjectStoreRegistry({"file://": LocalStore()})


def nczmap_virtualize(source: Path, manifest: Path) -> Path:
    """``nczmap virtualize source manifest`` (the command line, as users run it)."""
    done = subprocess.run(
        [sys.executable, "-m", "nczmap", "virtualize", str(source), str(manifest)],
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return manifest


def assert_nczmap_reads(
    manifest: Path, expected: dict, names: dict[str, str], grant: Path, mode: str = "zarr,manifest"
) -> None:
    """nczmap opens ``manifest`` and finds exactly the variables ``names`` maps to keys of ``expected``,
    with their dimension names, dtypes and values."""
    url = manifest.as_uri() + "#mode=" + mode
    with nczmap.open_dataset(url, containers=[str(grant) + "/"]) as ds:
        ours = {v.key: v for g in ds.walk() for v in g.variables.values()}
        assert set(ours) == set(names)
        for key, theirs in names.items():
            dims, values = expected[theirs]
            got = ours[key][...]
            assert ours[key].dimensions == dims, key
            assert got.dtype == values.dtype and got.shape == values.shape, key
            assert np.array_equal(got, values), key


def assert_xarray_values(store, expected: dict, names: dict[str, str]) -> None:
    """The values xarray loads through VirtualiZarr's ManifestStore, with their dimension names."""
    ds = xr.open_zarr(store, zarr_format=3, consolidated=False, mask_and_scale=False, decode_times=False)
    try:
        assert set(ds.variables) == set(names)
        for name, key in names.items():
            dims, values = expected[key]
            assert ds[name].dims == dims, name
            assert np.array_equal(ds[name].values, values), name
    finally:
        ds.close()


# ------------------------------------------------------------------------ VirtualiZarr and kerchunk -> nczmap
ROOT = {
    "/y": "/y",
    "/x": "/x",
    "/temp": "/temp",
    "/plain": "/plain",
    "/shuffled": "/shuffled",
    "/tiny": "/tiny",
}
GROUP = {"/h": "/g/h", "/u": "/g/u"}  # one group as the root of its own references


@pytest.mark.parametrize("loadable", ["coordinates", "nothing"])
def test_virtualizarr_json_references_read_by_nczmap(source, expected, tmp_path, loadable):
    """VirtualiZarr's HDF parser, its kerchunk JSON writer; nczmap reads every variable, one group per file
    (VirtualiZarr writes kerchunk references from a Dataset, so a group is a file of its own)."""
    loadable_variables = None if loadable == "coordinates" else []  # None: it loads and inlines y and x
    for group, names in ((None, ROOT), ("g", GROUP)):
        vds = open_virtual_dataset(
            source.as_uri(),
            parser=HDFParser(group=group),
            registry=registry(),
            loadable_variables=loadable_variables,
        )
        refs = tmp_path / f"{group or 'root'}.json"
        vds.vz.to_kerchunk(str(refs), format="json")
        document = json.loads(refs.read_text())
        if group is None:
            inline = isinstance(document["refs"]["y/0"], str)
            assert inline == (loadable == "coordinates")
        assert_nczmap_reads(refs, expected, names, source.parent)


def test_virtualizarr_parquet_references_read_by_nczmap(source, expected, tmp_path):
    for group, names in ((None, ROOT), ("g", GROUP)):
        vds = open_virtual_dataset(
            source.as_uri(), parser=HDFParser(group=group), registry=registry(), loadable_variables=[]
        )
        refs = tmp_path / f"{group or 'root'}.parq"
        vds.vz.to_kerchunk(str(refs), format="parquet")
        assert (refs / ".zmetadata").is_file()
        assert_nczmap_reads(refs, expected, names, source.parent)


def test_kerchunk_hdf_references_read_by_nczmap(source, expected, tmp_path):
    """kerchunk's own HDF5 scanner (small chunks inlined, filters as numcodecs configs, groups)."""
    pytest.importorskip("kerchunk.hdf")
    with open(source, "rb") as handle:
        refs = kerchunk_hdf_references(handle, str(source))
    assert any(
        isinstance(v, str) and v.startswith("base64:") for k, v in refs["refs"].items() if "/." not in k
    )
    manifest = tmp_path / "kerchunk.json"
    manifest.write_text(json.dumps(refs))
    assert json.loads(refs["refs"]["g/h/.zattrs"])["_ARRAY_DIMENSIONS"] == ["g/z", "x"]
    url = manifest.as_uri() + "#mode=zarr,manifest"
    with nczmap.open_dataset(url, containers=[str(source.parent) + "/"]) as ds:
        ours = {v.key: v for g in ds.walk() for v in g.variables.values()}
        assert set(ours) == set(expected)
        for key, (dims, values) in expected.items():
            # kerchunk names a subgroup's dimensions with the group's path ("g/z"), nczmap keeps that name
            names = tuple(d.rsplit("/", 1)[-1] for d in ours[key].dimensions)
            assert names == dims, (key, ours[key].dimensions)
            got = ours[key][...]
            assert got.dtype == values.dtype and np.array_equal(got, values), key


# ---------------------------------------------------------------- nczmap virtualize -> VirtualiZarr, fsspec
@pytest.fixture(scope="module")
def nczmap_json(source) -> Path:
    return nczmap_virtualize(source, source.parent / "nczmap.json")


@pytest.fixture(scope="module")
def nczmap_parquet(source) -> Path:
    return nczmap_virtualize(source, source.parent / "nczmap.parq")


def test_nczmap_virtualize_writes_nczarr_that_nczmap_reads_back(
    nczmap_json, nczmap_parquet, expected, source
):
    names = {key: key for key in expected}
    for manifest in (nczmap_json, nczmap_parquet):
        assert_nczmap_reads(manifest, expected, names, source.parent, mode="nczarr,manifest")


def test_virtualizarr_reads_nczmap_json_manifest(nczmap_json, expected):
    """The NCZarr dialect is no obstacle: VirtualiZarr takes ``_ARRAY_DIMENSIONS`` for dimension names and
    xarray hides the ``_nczarr_*`` attributes (so ``#mode=zarr`` is not needed, and virtualize refuses it:
    a virtual dataset keeps its netCDF model)."""
    skipped = [*COMPRESSED, *INLINED]
    store = KerchunkJSONParser(skip_variables=skipped)(nczmap_json.as_uri(), registry=registry())
    vds = store.to_virtual_dataset(loadable_variables=[])
    assert set(vds.variables) == {"y", "x", "plain"}
    assert vds.attrs["title"] == "interop"
    assert not [name for name in vds.attrs if name.startswith("_nczarr")]
    for name in vds.variables:
        assert vds[name].dims == expected[f"/{name}"][0]
    assert_xarray_values(store, expected, {"y": "/y", "x": "/x", "plain": "/plain"})
    group = KerchunkJSONParser(group="g", skip_variables=["h"])(nczmap_json.as_uri(), registry=registry())
    assert_xarray_values(group, expected, {"u": "/g/u"})


def test_virtualizarr_reads_compressed_variables_of_nczmap_manifest(nczmap_json, expected):
    parser = KerchunkJSONParser(skip_variables=list(INLINED))
    try:
        store = parser(nczmap_json.as_uri(), registry=registry())
    except TypeError as exc:
        if "Expected codec config to be a dict" not in str(exc):
            raise
        pytest.xfail(
            "VirtualiZarr's kerchunk translator spreads a Zarr v2 compressor object into its keys "
            f"(TypeError: {exc}); netcdf-c and nczmap write zlib as the compressor, kerchunk as a filter"
        )
    names = {"y": "/y", "x": "/x", "plain": "/plain", "temp": "/temp", "shuffled": "/shuffled"}
    assert_xarray_values(store, expected, names)


def test_virtualizarr_reads_inline_chunks_of_nczmap_manifest(nczmap_json, expected):
    parser = KerchunkJSONParser(skip_variables=list(COMPRESSED))
    try:
        store = parser(nczmap_json.as_uri(), registry=registry())
    except NotImplementedError as exc:
        if "inlined reference data" not in str(exc):
            raise
        pytest.xfail(f"VirtualiZarr's kerchunk parsers cannot read inline chunk data: {exc}")
    assert_xarray_values(store, expected, {"y": "/y", "x": "/x", "plain": "/plain", "tiny": "/tiny"})


def test_virtualizarr_reads_nczmap_parquet_manifest(flat, tmp_path):
    """A manifest VirtualiZarr's Parquet parser could read: no group, no compressor, nothing inline."""
    expected = netcdf4_values(flat)
    manifest = nczmap_virtualize(flat, tmp_path / "flat.parq")
    store = KerchunkParquetParser()(manifest.as_uri(), registry=registry())
    assert_xarray_values(store, expected, {key.lstrip("/"): key for key in expected})


def test_fsspec_and_zarr_read_nczmap_manifests(nczmap_json, nczmap_parquet, expected):
    """fsspec's ReferenceFileSystem and zarr-python read both forms as they are: every variable, the group
    and the inline chunks included."""
    from fsspec.implementations.reference import LazyReferenceMapper
    from zarr.storage import FsspecStore

    mapper = fsspec.filesystem("reference", fo=str(nczmap_json)).get_mapper("")
    group = zarr.open_group(mapper, mode="r", zarr_format=2)
    for key, (_, values) in expected.items():
        assert np.array_equal(group[key.lstrip("/")][...], values), key

    for engine in ("fastparquet", "pyarrow"):  # fastparquet: fsspec's default (and kerchunk's)
        references = LazyReferenceMapper(str(nczmap_parquet), fs=fsspec.filesystem("file"), engine=engine)
        fs = fsspec.filesystem("reference", fo=references, remote_protocol="file", asynchronous=True)
        for key, (_, values) in expected.items():
            store = FsspecStore(fs, path=key.lstrip("/"), read_only=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                array = zarr.open_array(store, mode="r", zarr_format=2)
            assert np.array_equal(array[...], values), (engine, key)


# ---------------------------------------------------------------- kerchunk's own Parquet, both directions
def kerchunk_parquet(source: Path, destination: Path) -> Path:
    """kerchunk's HDF5 scanner, then kerchunk's own Parquet writer (``kerchunk.df``, fastparquet)."""
    from kerchunk.df import refs_to_dataframe

    with open(source, "rb") as handle:
        refs = kerchunk_hdf_references(handle, str(source))
    refs_to_dataframe(refs, str(destination), record_size=5)
    return destination


def record_layout(path: Path) -> tuple:
    """What readers depend on in a record file: the Parquet schema (types, nullability), the pandas
    metadata's columns and whether there is an Arrow schema."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    schema = parquet.schema_arrow
    fields = [(f.name, str(f.type), f.nullable) for f in schema]
    physical = [(c.name, c.physical_type, c.logical_type.type) for c in parquet.schema]
    metadata = parquet.metadata.metadata or {}
    pandas = json.loads(metadata[b"pandas"])
    columns = [(c["name"], c["numpy_type"], c["pandas_type"]) for c in pandas["columns"]]
    return fields, physical, columns, pandas["index_columns"], b"ARROW:schema" in metadata


def test_nczmap_parquet_records_are_laid_out_as_kerchunks(flat, folder):
    """Record files and .zmetadata as kerchunk.df writes them (kerchunk's references copied by nczmap):
    every reader that reads kerchunk's reads ours."""
    theirs = kerchunk_parquet(flat, folder / "layout-kerchunk.parq")  # beside the source: its container
    ours = folder / "layout-nczmap.parq"
    copied = subprocess.run(
        [sys.executable, "-m", "nczmap", "copy", theirs.as_uri() + "#mode=zarr,manifest",
         ours.as_uri() + "#mode=zarr,manifest"],
        capture_output=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert copied.returncode == 0, copied.stderr.decode(errors="replace")
    for array in ("raw", "x"):
        assert record_layout(ours / array / "refs.0.parq") == record_layout(theirs / array / "refs.0.parq")
    mine, kerchunks = (json.loads((d / ".zmetadata").read_bytes()) for d in (ours, theirs))
    assert set(mine) - set(kerchunks) <= {"nczmap"} and set(kerchunks) == {"metadata", "record_size"}
    for field in ("shape", "chunks", "dtype"):  # the grid the records are laid out over
        assert mine["metadata"]["raw/.zarray"][field] == kerchunks["metadata"]["raw/.zarray"][field]
    for directory, document in ((ours, mine), (theirs, kerchunks)):  # the last record padded too
        assert {pq_rows(p) for p in (directory / "raw").iterdir()} == {document["record_size"]}


def pq_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def test_kerchunk_parquet_references_read_by_nczmap(source, expected, tmp_path):
    refs = kerchunk_parquet(source, tmp_path / "kerchunk.parq")
    url = refs.as_uri() + "#mode=zarr,manifest"
    with nczmap.open_dataset(url, containers=[str(source.parent) + "/"]) as ds:
        ours = {v.key: v for g in ds.walk() for v in g.variables.values()}
        assert set(ours) == set(expected)
        for key, (_, values) in expected.items():
            got = ours[key][...]
            assert got.dtype == values.dtype and np.array_equal(got, values), key


@pytest.mark.parametrize("engine", ["fastparquet", "pyarrow"])
def test_nczmap_copy_to_parquet_read_by_fsspec_xarray_and_virtualizarr(nczmap_json, source, flat, engine):
    """``nczmap copy refs.json refs.parq``: kerchunk's recipe (xarray over ``reference://``) and zarr through
    fsspec with either engine read every variable; VirtualiZarr reads what it can (see the module notes)."""
    from fsspec.implementations.reference import LazyReferenceMapper

    expected = netcdf4_values(source)
    copy = source.parent / f"copy-{engine}.parq"  # beside the sources: its container
    done = subprocess.run(
        [sys.executable, "-m", "nczmap", "copy", nczmap_json.as_uri() + "#mode=nczarr,manifest",
         copy.as_uri() + "#mode=nczarr,manifest"],
        capture_output=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    mapper = LazyReferenceMapper(str(copy), fs=fsspec.filesystem("file"), engine=engine)
    options = {"fo": mapper, "remote_protocol": "file"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ds = xr.open_dataset(
            "reference://", engine="zarr", mask_and_scale=False, decode_times=False,
            backend_kwargs={"consolidated": False, "zarr_format": 2, "storage_options": options},
        )  # fmt: skip
    try:
        for name in ("y", "x", "temp", "plain", "shuffled", "tiny"):
            dims, values = expected[f"/{name}"]
            assert ds[name].dims == dims and np.array_equal(ds[name].values, values), name
    finally:
        ds.close()

    flat_json = nczmap_virtualize(flat, flat.parent / f"flat-{engine}.json")
    flat_copy = flat.parent / f"flat-copy-{engine}.parq"
    done = subprocess.run(
        [sys.executable, "-m", "nczmap", "copy", flat_json.as_uri() + "#mode=nczarr,manifest",
         flat_copy.as_uri() + "#mode=nczarr,manifest"],
        capture_output=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    store = KerchunkParquetParser()(flat_copy.as_uri(), registry=registry())
    flat_values = netcdf4_values(flat)
    assert_xarray_values(store, flat_values, {key.lstrip("/"): key for key in flat_values})
