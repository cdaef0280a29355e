"""Zarr and NCZarr stores as virtualize sources: stores written by zarr-python (Zarr v2 and v3), xarray and
nczmap itself, in directories, zip archives and S3, virtualized alone and joined; the manifests read by
nczmap, xarray and fsspec + zarr-python equal the stores as xarray reads them, and refer into the stores."""

from __future__ import annotations

import json
import os
import warnings
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from store_zip import zip_store
from test_virtualize import manifest_url

import nczmap
from nczmap.errors import NCZError, StorageError
from nczmap.integrations.virtualize import virtualize
from nczmap.integrations.virtualize.stores import chunk_index

DAYS = 3
PACKINGS = [(0.01, 270.0, -999), (0.02, 250.0, -32768), (0.01, 270.0, 7)]  # a day: scale, offset, fill


def day_dataset(day: int) -> xr.Dataset:
    """One day of a model run: a time coordinate in units of its own day, a field chunked in tiles with
    missing values, a grid."""
    rng = np.random.default_rng(day)
    field = rng.normal(280, 5, (2, 40, 60)).astype("f4")
    field[0, :3, :3] = np.nan
    dataset = xr.Dataset(
        {"temp": (("time", "y", "x"), field, {"units": "K", "long_name": "temperature"})},
        coords={
            "time": (
                "time",
                np.array([0.0, 1.0]),
                {"units": f"hours since 2024-03-{day + 1:02d}"},
            ),
            "y": ("y", np.linspace(40, 50, 40)),
            "x": ("x", np.linspace(0, 15, 60)),
        },
        attrs={"title": "run"},
    )
    dataset["temp"].encoding = {"chunks": (1, 20, 30), "_FillValue": np.float32(-999)}
    return dataset


def write_days(folder: Path, zarr_format: int) -> list[Path]:
    paths = []
    for day in range(DAYS):
        path = folder / f"run-{day}.zarr"
        day_dataset(day).to_zarr(path, zarr_format=zarr_format, consolidated=False)
        paths.append(path)
    return paths


def joined(stores: list[Path], **options) -> xr.Dataset:
    """The oracle: the stores read one by one by xarray (``options``: its engine), joined along time."""
    return xr.concat([xr.open_dataset(path, **options).load() for path in stores], dim="time")


def open_manifest(refs: Path, result) -> xr.Dataset:
    return xr.open_dataset(
        manifest_url(refs), engine="nczmap", backend_kwargs={"map_options": {"containers": result.containers}}
    )


def open_with_fsspec(refs: Path) -> xr.Dataset:
    """The manifest as xarray's own zarr backend reads it through fsspec (no nczmap)."""
    import fsspec

    mapper = fsspec.filesystem("reference", fo=str(refs)).get_mapper("")
    return xr.open_dataset(mapper, engine="zarr", consolidated=False, zarr_format=2)


def referenced(refs: Path) -> list[str]:
    if refs.suffix == ".json":
        return [v[0] for v in json.loads(refs.read_text())["refs"].values() if isinstance(v, list)]
    with nczmap.open_map(manifest_url(refs)) as zmap:
        return [zmap.reference(f"/temp/{i}.0.0").url for i in range(2 * DAYS)]


# ------------------------------------------------------------------------ zarr-python and xarray stores
@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("suffix", [".json", ".parq"])
def test_stores_xarray_wrote_joined_read_as_xarray_reads_them(tmp_path, zarr_format, suffix):
    stores = write_days(tmp_path, zarr_format)
    refs = tmp_path / f"month{suffix}"
    result = virtualize([str(p) for p in stores], refs, concat="time")
    assert not result.refused and result.formats == ["zarr"] * DAYS
    with open_manifest(refs, result) as ours:  # as nczmap reads the stores (as netcdf-c does)
        xr.testing.assert_identical(ours.load(), joined(stores, engine="nczmap"))
    if suffix == ".json":  # as xarray's zarr backend reads them: fill values masked, times decoded
        with open_with_fsspec(refs) as theirs:
            expected = joined(stores, engine="zarr", consolidated=False)
            xr.testing.assert_equal(theirs.load(), expected)
            assert theirs["temp"].attrs["units"] == "K" and np.isnan(theirs["temp"].values[0, 0, 0])
    assert all(url.startswith(tmp_path.as_uri() + "/run-") for url in referenced(refs))
    assert result.references >= DAYS * 2 * 4, "every chunk of temp is a reference"


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_stores_packed_with_their_own_scale_and_fill_join_to_xarrays_decoded_values(tmp_path, zarr_format):
    """Stores of one run whose packing differs (scale_factor, add_offset, _FillValue a day): the manifest
    reads as xarray decodes each store and joins them, or the join is refused naming the attribute; never
    the first store's packing applied to the others."""
    stores = []
    for day, (scale, offset, fill) in enumerate(PACKINGS):
        dataset = day_dataset(day)
        dataset["temp"].encoding = {"chunks": (1, 20, 30), "dtype": "i2", "_FillValue": fill}
        dataset["temp"].encoding.update(scale_factor=scale, add_offset=offset)
        path = tmp_path / f"packed-{day}.zarr"
        dataset.to_zarr(path, zarr_format=zarr_format, consolidated=False)
        stores.append(path)
    refs = tmp_path / "refs.json"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = virtualize([str(p) for p in stores], refs, concat="time")
    except NCZError as exc:
        assert any(name in str(exc) for name in ("scale_factor", "add_offset", "_FillValue")), exc
        return
    # the oracle: xarray's zarr backend decoding each store (a Zarr v2 fill_value is missing there), then
    # joining them; the manifest read by it through fsspec (no nczmap) and by nczmap's engine
    expected = joined(stores, engine="zarr", consolidated=False)
    for got in (open_with_fsspec(refs), open_manifest(refs, result)):
        with got:
            values, wanted = got["temp"].values, expected["temp"].values
            np.testing.assert_allclose(values, wanted, rtol=0, atol=1e-9)  # NaN where NaN
            np.testing.assert_array_equal(got["time"].values, expected["time"].values)


def test_netcdf_c_stores_packed_differently_join_to_open_mfdatasets_values(tmp_path):
    """NCZarr stores libnetcdf wrote, packed with their own scale_factor, add_offset and _FillValue a
    day: the manifest reads as xarray's open_mfdataset with the netcdf4 engine (libnetcdf) reads them."""
    netCDF4 = pytest.importorskip("netCDF4")
    urls = []
    for day, (scale, offset, fill) in enumerate(
        [(0.01, 270.0, -999), (0.02, 250.0, -32768), (0.01, 270.0, 7)]
    ):
        url = f"file://{tmp_path}/run{day}.file#mode=nczarr,file"
        with netCDF4.Dataset(url, "w") as nc:
            nc.createDimension("time", 2)
            nc.createDimension("x", 6)
            time = nc.createVariable("time", "f8", ("time",))
            time.units, time[:] = f"hours since 2024-03-0{day + 1}", [0, 1]
            v = nc.createVariable("v", "i2", ("time", "x"), fill_value=fill)
            v.scale_factor, v.add_offset = scale, offset
            v.set_auto_maskandscale(False)
            raw = (np.arange(12).reshape(2, 6) * 7).astype("i2")
            raw[0, 0] = fill
            v[:] = raw
        urls.append(url)
    refs = tmp_path / "refs.json"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = virtualize(urls, refs, concat="time")
    except NCZError as exc:
        assert any(name in str(exc) for name in ("scale_factor", "add_offset", "_FillValue")), exc
        return
    expected = xr.open_mfdataset(urls, engine="netcdf4", combine="nested", concat_dim="time").load()
    with open_manifest(refs, result) as got:
        np.testing.assert_allclose(got["v"].values, expected["v"].values, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(got["time"].values, expected["time"].values)
    assert np.isnan(expected["v"].values[4, 1])  # day 3's 7 is its fill value: masked there only


def test_zarr_python_reads_the_manifest_without_nczmap(tmp_path):
    import fsspec

    stores = write_days(tmp_path, 3)
    refs = tmp_path / "month.json"
    virtualize([str(p) for p in stores], refs, concat="time")
    mapper = fsspec.filesystem("reference", fo=str(refs)).get_mapper("")
    group = zarr.open_group(mapper, mode="r", zarr_format=2)
    raw = xr.concat([xr.open_zarr(p, decode_cf=False, consolidated=False) for p in stores], dim="time")
    np.testing.assert_array_equal(group["temp"][...], raw["temp"].values)
    assert group["time"].attrs["units"] == "hours since 2024-03-01"
    np.testing.assert_array_equal(group["time"][...], [0, 1, 24, 25, 48, 49])  # re-encoded in one unit


def test_missing_chunks_stay_missing_and_read_as_the_fill_value(tmp_path):
    path = tmp_path / "sparse.zarr"
    group = zarr.open_group(path, mode="w", zarr_format=2)
    array = group.create_array("v", shape=(40, 40), chunks=(10, 10), dtype="i2", fill_value=-7)
    array.attrs["_ARRAY_DIMENSIONS"] = ["y", "x"]
    array[10:20, 20:30] = 5  # one chunk of sixteen written
    refs = tmp_path / "refs.json"
    result = virtualize([str(path)], refs)
    chunks = [key for key in json.loads(refs.read_text())["refs"] if key.startswith("v/") and "/." not in key]
    assert chunks == ["v/1.2"]
    expected = np.full((40, 40), -7, "i2")
    expected[10:20, 20:30] = 5
    with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds:
        np.testing.assert_array_equal(ds.variables["v"][...], expected)


def test_chunk_keys_are_read_in_every_encoding():
    from nczmap.format.variable import ArrayLayout

    def layout(separator: str, prefix: str = "", scalar: bool = False) -> ArrayLayout:
        return ArrayLayout((4, 6), (2, 3), None, None, None, separator, "C", scalar, prefix)

    assert chunk_index("1.1", layout("."), [2, 2]) == (1, 1)
    assert chunk_index("1/0", layout("/"), [2, 2]) == (1, 0)
    assert chunk_index("c/1/0", layout("/", "c"), [2, 2]) == (1, 0)
    assert chunk_index("c.1.0", layout(".", "c"), [2, 2]) == (1, 0)
    for name in ("2.0", "1", "1.1.1", "01.1", "-1.0", "+1.0", ".zarray", "zarr.json", "1/1", "c/1/0"):
        assert chunk_index(name, layout("."), [2, 2]) is None, name
    assert chunk_index("0", layout(".", scalar=True), []) == ()
    assert chunk_index("c", layout("/", "c", scalar=True), []) == ()
    assert chunk_index("1", layout(".", scalar=True), []) is None


# ----------------------------------------------------------------------------- nczmap's own stores, S3
def write_nczarr(url: str, day: int) -> np.ndarray:
    """An NCZarr store as nczmap (like netcdf-c) writes it: a day of a field, chunked by row."""
    values = (np.arange(24 * 30, dtype="i4").reshape(1, 24, 30) + 1000 * day).astype("i4")
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("time", 1)
        ds.create_dimension("y", 24)
        ds.create_dimension("x", 30)
        ds.create_variable("time", ("time",), "f8", data=[float(day)]).attrs["units"] = (
            "days since 2024-01-01"
        )
        ds.create_variable("v", ("time", "y", "x"), "i4", chunks=(1, 8, 30), data=values)
    return values


def test_stores_in_s3_are_referred_to_object_by_object(tmp_path, s3_server):
    urls = [s3_server.url() for _ in range(2)]
    expected = np.concatenate([write_nczarr(url, day) for day, url in enumerate(urls)])
    refs = tmp_path / "refs.json"
    result = virtualize(urls, refs, concat="time")
    with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds:
        np.testing.assert_array_equal(ds.variables["v"][...], expected)
    document = json.loads(refs.read_text())
    located = {v[0] for k, v in document["refs"].items() if k.startswith("v/") and isinstance(v, list)}
    prefixes = [url.split("#")[0].split("/", 3)[3] for url in urls]  # bucket/root
    assert len(located) == 6 and all(any(f"s3://{p}/v/" in u for p in prefixes) for u in located)
    recorded = document["nczmap"]["sources"]
    assert set(located) <= set(recorded) and all("etag" in recorded[u] for u in located)


def test_a_store_rewritten_after_it_was_virtualized_is_refused_by_reads(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    write_nczarr(f"file://{folder / 'day0.file'}#mode=nczarr,file", 0)
    refs = tmp_path / "refs.json"
    result = virtualize([str(folder / "day0.file")], refs)
    chunk = folder / "day0.file" / "v" / "0.1.0"
    chunk.write_bytes(chunk.read_bytes()[::-1])  # same size, new bytes and modification time
    with (
        nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds,
        pytest.raises(StorageError, match=r"0\.1\.0 changed since the manifest was made"),
    ):
        ds.variables["v"][...]


# -------------------------------------------------------------------------------------------- zip stores
def test_a_zip_store_is_referred_to_inside_the_archive(tmp_path):
    directory = tmp_path / "day.file"
    expected = write_nczarr(f"file://{directory}#mode=nczarr,file", 0)
    archive = zip_store(directory, tmp_path / "day.zip")
    refs = tmp_path / "refs.json"
    result = virtualize([f"file://{archive}#mode=nczarr,zip"], refs)
    references = [
        v for k, v in json.loads(refs.read_text())["refs"].items() if k.startswith("v/") and k[2] != "."
    ]
    assert references and all(isinstance(v, list) and v[0] == archive.as_uri() for v in references)
    with zipfile.ZipFile(archive) as opened:  # each reference is exactly the member's bytes
        first = json.loads(refs.read_text())["refs"]["v/0.0.0"]
        assert archive.read_bytes()[first[1] : first[1] + first[2]] == opened.read("v/0.0.0")
    with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds:
        np.testing.assert_array_equal(ds.variables["v"][...], expected)


def test_a_compressed_zip_member_is_loaded_never_referred_to(tmp_path):
    directory = tmp_path / "day.file"
    expected = write_nczarr(f"file://{directory}#mode=nczarr,file", 0)
    archive = zip_store(directory, tmp_path / "day.zip", zipfile.ZIP_DEFLATED)
    refs = tmp_path / "refs.json"
    result = virtualize([str(archive)], refs)
    assert "/v" in result.loaded
    assert not any(isinstance(v, list) for v in json.loads(refs.read_text())["refs"].values())
    with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds:
        np.testing.assert_array_equal(ds.variables["v"][...], expected)


# ---------------------------------------------------------------------- what a manifest cannot say
def test_inner_chunks_of_shards_are_referred_to_inside_their_shards(tmp_path):
    path = tmp_path / "sharded.zarr"
    group = zarr.open_group(path, mode="w", zarr_format=3)
    sharded = group.create_array(
        "s", shape=(10, 64), chunks=(2, 32), shards=(4, 64), dtype="i4", fill_value=-1, compressors=None
    )
    values = np.arange(640, dtype="i4").reshape(10, 64) * 1000
    values[0:2, 0:32] = -1  # an inner chunk of fill values: not stored in its shard
    sharded[...] = values
    sharded.attrs["_ARRAY_DIMENSIONS"] = ["y", "x"]
    refs = tmp_path / "refs.json"
    result = virtualize([str(path)], refs)
    assert "/s" not in result.loaded
    document = json.loads(refs.read_text())["refs"]
    inner = {k: v for k, v in document.items() if k.startswith("s/") and "/." not in k}
    assert "s/0.0" not in inner and len(inner) == 5 * 2 - 1
    shard = path / "s" / "c" / "0" / "0"  # rows 0-3 of every column
    assert inner["s/1.1"][0] == shard.as_uri()
    start, length = inner["s/1.1"][1:]
    held = np.frombuffer(shard.read_bytes()[start : start + length], "<i4")
    np.testing.assert_array_equal(held, values[2:4, 32:64].ravel())
    with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds:
        np.testing.assert_array_equal(ds.variables["s"][...], values)
    with open_with_fsspec(refs) as theirs:
        np.testing.assert_array_equal(theirs["s"].values, np.where(values == -1, np.nan, values))


def test_an_array_whose_metadata_is_damaged_is_refused_by_name_the_others_kept(tmp_path):
    store = tmp_path / "damaged.zarr"
    group = zarr.open_group(store, mode="w", zarr_format=2)
    for name in ("good", "bad"):
        array = group.create_array(name, shape=(4,), chunks=(2,), dtype="i4", fill_value=None)
        array[...] = np.arange(4, dtype="i4")
        array.attrs["_ARRAY_DIMENSIONS"] = ["x"]
    zarray = store / "bad" / ".zarray"
    zarray.write_bytes(zarray.read_bytes()[:23])  # cut short, as a transfer cut short leaves it
    refs = tmp_path / "refs.json"
    with pytest.warns(UserWarning) as caught:
        result = virtualize([str(store)], refs)
    assert [r.variable for r in result.refused] == ["/bad"]
    assert "cannot be read" in result.refused[0].reason and ".zarray" in result.refused[0].reason
    assert any("/bad" in str(w.message) and "not virtualized" in str(w.message) for w in caught), [
        str(w.message) for w in caught
    ]
    with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds:
        assert "bad" not in ds.variables
        np.testing.assert_array_equal(ds.variables["good"][...], np.arange(4))


def test_fortran_order_arrays_are_loaded_with_their_values(tmp_path):
    v2 = zarr.open_group(tmp_path / "fortran.zarr", mode="w", zarr_format=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fortran = v2.create_array("f", shape=(6, 4), chunks=(3, 2), dtype="f8", order="F")
    fortran[...] = np.arange(24.0).reshape(6, 4)
    refs = tmp_path / "f.json"
    result = virtualize([str(tmp_path / "fortran.zarr")], refs)
    assert "/f" in result.loaded, result
    with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds:
        np.testing.assert_array_equal(ds.variables["f"][...], np.arange(24.0).reshape(6, 4))


# ---------------------------------------------------------------------------- appends, Icechunk, CLI
def test_a_day_appended_equals_the_days_joined_at_once(tmp_path):
    stores = write_days(tmp_path, 3)
    refs = tmp_path / "month.parq"
    virtualize([str(p) for p in stores[:2]], refs, concat="time")
    result = virtualize([str(stores[2])], refs, append=True)
    with open_manifest(refs, result) as ours:
        xr.testing.assert_identical(ours.load(), joined(stores, engine="nczmap"))


def test_stores_into_an_icechunk_repository_read_by_icechunk_without_nczmap(tmp_path):
    ic = pytest.importorskip("icechunk")
    stores = write_days(tmp_path, 2)
    repo = tmp_path / "repo"
    result = virtualize([str(p) for p in stores], f"file://{repo}#mode=icechunk", concat="time")
    config = ic.RepositoryConfig.default()
    grant = tmp_path.as_uri() + "/"
    config.set_virtual_chunk_container(
        ic.VirtualChunkContainer(grant, ic.local_filesystem_store(str(tmp_path)))
    )
    repository = ic.Repository.open(
        ic.local_filesystem_storage(str(repo)), config, authorize_virtual_chunk_access={grant: None}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = xr.open_zarr(repository.readonly_session("main").store, consolidated=False).load()
    xr.testing.assert_equal(theirs, joined(stores, engine="zarr", consolidated=False))
    assert result.references > 0


def test_the_command_expands_a_url_pattern_of_stores(tmp_path):
    from test_virtualize import nczmap_command

    write_days(tmp_path, 2)
    refs = tmp_path / "month.json"
    done = nczmap_command(
        "virtualize", f"file://{tmp_path}/run-*.zarr#mode=zarr,file", refs, "--concat", "time"
    )
    assert done.returncode == 0, done.stderr.decode()
    with nczmap.open_dataset(manifest_url(refs), containers=[str(tmp_path) + "/"]) as ds:
        assert ds.variables["temp"].shape == (2 * DAYS, 40, 60)


def test_stores_parsed_in_other_processes_give_the_same_manifest(tmp_path):
    stores = write_days(tmp_path, 2)
    serial, pooled = tmp_path / "serial.json", tmp_path / "pooled.json"
    virtualize([str(p) for p in stores], serial, concat="time")
    with ProcessPoolExecutor(2) as pool:
        virtualize([str(p) for p in stores], pooled, concat="time", executor=pool)
    assert json.loads(serial.read_text())["refs"] == json.loads(pooled.read_text())["refs"]
    assert (
        json.loads(serial.read_text())["nczmap"]["sources"]
        == json.loads(pooled.read_text())["nczmap"]["sources"]
    )


def test_netcdf_c_stores_are_parsed_on_a_process_pool_as_in_this_process(tmp_path):
    """libnetcdf's NCZarr stores (fill values kept as written until first used) come back from worker
    processes pickled, equal to the serial parse."""
    netCDF4 = pytest.importorskip("netCDF4")
    stores = []
    for day in (1, 2):
        store = tmp_path / f"run{day}.file"
        with netCDF4.Dataset(f"file://{store}#mode=nczarr,file", "w") as root:
            root.createDimension("time", 2)
            root.createDimension("x", 6)
            t = root.createVariable("time", "f8", ("time",))
            t.units = "days since 2024-01-01"
            t[:] = [2 * day, 2 * day + 1]
            v = root.createVariable("v", "i2", ("time", "x"), fill_value=-99)
            v[:] = np.arange(12, dtype="i2").reshape(2, 6) * day
        stores.append(f"file://{store}#mode=nczarr,file")
    serial, pooled = tmp_path / "serial.json", tmp_path / "pooled.json"
    virtualize(stores, serial, concat="time")
    with ProcessPoolExecutor(2) as pool:
        virtualize(stores, pooled, concat="time", executor=pool)
    assert json.loads(serial.read_text())["refs"] == json.loads(pooled.read_text())["refs"]


def test_what_is_no_store_is_refused_by_name(tmp_path):
    with pytest.raises(NCZError, match="nowhere"):
        virtualize([f"file://{tmp_path}/nowhere.zarr#mode=zarr,file"], tmp_path / "refs.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NCZError, match="empty"):
        virtualize([str(tmp_path / "empty")], tmp_path / "refs.json")
    assert not (tmp_path / "refs.json").exists()


def test_checksums_of_store_chunks_catch_a_chunk_rewritten_with_its_stamp_restored(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    write_nczarr(f"file://{folder / 'day0.file'}#mode=nczarr,file", 0)
    refs = tmp_path / "refs.json"
    result = virtualize([str(folder / "day0.file")], refs, checksums=True)
    chunk = folder / "day0.file" / "v" / "0.1.0"
    info = chunk.stat()
    chunk.write_bytes(chunk.read_bytes()[::-1])
    os.utime(chunk, ns=(info.st_atime_ns, info.st_mtime_ns))  # size and modification time as they were
    with (
        nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds,
        pytest.raises(StorageError, match="crc32c"),
    ):
        ds.variables["v"][...]


def test_a_consolidated_store_is_virtualized_as_its_consolidated_metadata_says(tmp_path):
    path = tmp_path / "consolidated.zarr"
    day_dataset(0).to_zarr(path, zarr_format=2, consolidated=True)
    refs = tmp_path / "refs.json"
    result = virtualize([f"file://{path}#mode=zarr,consolidated,file"], refs)
    with open_manifest(refs, result) as ours:
        xr.testing.assert_identical(ours.load(), xr.open_dataset(path, engine="nczmap").load())


def test_a_pattern_of_s3_stores_names_the_stores_not_their_objects(tmp_path, s3_server):
    import uuid

    run = uuid.uuid4().hex
    expected = np.concatenate([write_nczarr(s3_server.url(f"{run}/day{day}"), day) for day in range(3)])
    write_nczarr(s3_server.url(f"{run}/other"), 9)  # beside them, not matched
    pattern = s3_server.url(f"{run}/day*")
    refs = tmp_path / "refs.json"
    result = virtualize([pattern], refs, concat="time")
    assert result.formats == ["zarr"] * 3
    with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds:
        np.testing.assert_array_equal(ds.variables["v"][...], expected)
    with pytest.raises(NCZError, match="no store matches"):
        virtualize([s3_server.url(f"{run}/none*")], tmp_path / "none.json")
