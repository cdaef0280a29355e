"""nczmap under dask: lazy reads and ``to_nczarr`` writes on dask's threaded scheduler and on a real
``distributed.LocalCluster`` of two worker processes, which reopen the stores by URL.

Expected values come from numpy arrays built here, netCDF4-python (through xarray's netcdf4 engine) and
nczmap's eager paths (``chunks=None`` reads, writes of numpy-backed data); stores written by dask are
compared object by object, byte for byte, with the store an eager write of the same data makes. Real
``ncdump`` (Debian netcdf-bin) reads a store written by the workers for netcdf-c 4.9.0.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
netCDF4 = pytest.importorskip("netCDF4")

import dask.array as da  # noqa: E402
from distributed import Client, LocalCluster, get_task_stream  # noqa: E402
from s3server import BUCKET  # noqa: E402

import nczmap  # noqa: E402
from nczmap.integrations import handles  # noqa: E402
from nczmap.integrations.copy import copy  # noqa: E402
from nczmap.integrations.virtualize import virtualize  # noqa: E402

NCDUMP = shutil.which("ncdump")
WAIT = 60  # seconds any distributed computation may take before the test calls it a hang


# ------------------------------------------------------------------------------------------ the cluster
@pytest.fixture(scope="module")
def cluster(s3_server):
    """Two worker processes, one thread each, for the whole module. Started after the S3 server, whose
    credentials (set in the environment) the workers inherit."""
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.CRITICAL,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def module_client(cluster):
    with Client(cluster, set_as_default=False) as client:
        yield client


@pytest.fixture
def client(module_client):
    """The cluster's client as dask's scheduler for the test (every compute goes to the two workers)."""
    module_client.wait_for_workers(2, timeout=WAIT)  # a worker killed by an earlier test is back
    # by name, not the object: the nanny passes dask's config to a worker it restarts, and a client in
    # there does not pickle
    with module_client.as_current(), dask.config.set(scheduler="dask.distributed"):
        yield module_client


@pytest.fixture(params=["threads", "distributed"])
def scheduler(request):
    """dask's threaded scheduler, or the distributed client (then the fixture's value)."""
    if request.param == "threads":
        with dask.config.set(scheduler="threads"):
            yield None
    else:
        yield request.getfixturevalue("client")


def _opened_in_this_process() -> list[str]:
    """Runs in a worker: where the datasets this worker opened through handles are."""
    with handles._OPENED_LOCK:
        return [dataset.zmap.location for dataset in handles._OPENED.values()]


def workers_that_opened(client: Client, marker: str) -> set[str]:
    opened = client.run(_opened_in_this_process)
    return {worker for worker, locations in opened.items() if any(marker in loc for loc in locations)}


def assert_ran_in_workers(client: Client, tasks: list[dict], marker: str, prefix: str) -> None:
    """The tasks whose keys start with ``prefix`` ran in the worker processes, and every worker that ran
    one opened the store (its location contains ``marker``) itself, by URL."""
    names = [task["key"] if isinstance(task["key"], str) else task["key"][0] for task in tasks]
    ran = {task["worker"] for task, name in zip(tasks, names, strict=True) if name.startswith(prefix)}
    assert ran, f"no {prefix!r} task in the task stream: {sorted(set(names))}"
    assert ran <= set(client.scheduler_info()["workers"])
    assert workers_that_opened(client, marker) >= ran
    assert os.getpid() not in client.run(os.getpid).values()


# ------------------------------------------------------------------------------------------ reading
def write_source(path: Path) -> None:
    """A netCDF-4 file (netCDF4-python): an unlimited dimension, a 2-D chunked float variable with a
    partial edge chunk and missing values, a packed integer variable, a char variable and a subgroup."""
    rng = np.random.default_rng(4)
    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "dask reads"
        ds.createDimension("time", None)
        ds.createDimension("x", 10)
        ds.createDimension("len", 4)
        time = ds.createVariable("time", "f8", ("time",))
        time.units = "days since 2000-01-01"
        time[:] = np.arange(7) * 0.5
        v = ds.createVariable("v", "f4", ("time", "x"), fill_value=-999.0, chunksizes=(2, 5), zlib=True)
        values = rng.normal(size=(7, 10)).astype("f4")
        values[3, 2:6] = -999.0
        v[:] = values
        v.units = "K"
        packed = ds.createVariable("packed", "i2", ("time", "x"), chunksizes=(3, 4), fill_value=-1)
        packed.scale_factor = 0.25
        packed.add_offset = 10.0
        packed.set_auto_maskandscale(False)
        packed[:] = rng.integers(0, 1000, size=(7, 10)).astype("i2")
        code = ds.createVariable("code", "S1", ("time", "len"))
        code[:] = netCDF4.stringtochar(np.array(["ab", "cde", "", "f", "ghij", "kl", "m"], "S4"))
        group = ds.createGroup("g")
        group.createDimension("y", 6)
        w = group.createVariable("w", "i4", ("time", "y"), chunksizes=(4, 3))
        w[:] = np.arange(42, dtype="i4").reshape(7, 6)


def read_stores(tmp_path: Path, s3_server) -> tuple[dict[str, tuple[str, dict]], Path, str]:
    """The source file as a file, zip and s3 store (nczmap copy) and as a manifest referencing it."""
    source = tmp_path / "data" / "source.nc"
    source.parent.mkdir()
    write_source(source)
    tag = uuid.uuid4().hex
    stores = {
        "file": (f"file://{tmp_path}/{tag}.file#mode=nczarr,file", {}),
        "zip": (f"file://{tmp_path}/{tag}.zip#mode=nczarr,zip", {}),
        "s3": (s3_server.url(tag), {}),
    }
    for url, _ in stores.values():
        copy(str(source), url)
    refs = tmp_path / "manifests" / f"{tag}.json"  # not beside the source: it needs its container granted
    refs.parent.mkdir()
    result = virtualize([source], refs)
    assert result.refused == []
    stores["manifest"] = (f"file://{refs}#mode=nczarr,manifest", {"containers": result.containers})
    return stores, source, tag


@pytest.fixture(scope="module")
def sources(tmp_path_factory, s3_server):
    return read_stores(tmp_path_factory.mktemp("read"), s3_server)


def assert_values_equal(actual, expected) -> None:
    """Same variables, dimensions and values (NaN equal to NaN); attributes are the eager read's business."""
    assert set(actual.variables) == set(expected.variables)
    for name, variable in expected.variables.items():
        assert actual[name].dims == variable.dims, name
        np.testing.assert_array_equal(actual[name].values, variable.values, err_msg=str(name))


@pytest.mark.parametrize("store", ["file", "zip", "s3", "manifest"])
@pytest.mark.parametrize("group", [None, "g"])
def test_chunked_read_equals_eager_read_and_netcdf4(sources, store, group, scheduler):
    stores, source, tag = sources
    url, options = stores[store]
    chunks = {"time": 3, "x": 4, "y": 5}  # not the storage chunks: tasks read parts of several chunks
    lazy = xr.open_dataset(url, engine="nczmap", chunks=chunks, group=group, map_options=options)
    with lazy:
        reading = [name for name, v in lazy.variables.items() if isinstance(v.data, da.Array)]
        assert reading and all(lazy[name].data.npartitions > 1 for name in reading if lazy[name].ndim == 2)
        if scheduler is None:
            loaded = lazy.compute()
        else:
            with get_task_stream(client=scheduler) as stream:
                loaded = lazy.compute()
            assert_ran_in_workers(scheduler, stream.data, tag, "open_dataset-")
    with xr.open_dataset(url, engine="nczmap", chunks=None, group=group, map_options=options) as eager:
        eager.load()
    xr.testing.assert_identical(loaded, eager)
    with xr.open_dataset(source, engine="netcdf4", group=group) as reference:
        assert_values_equal(loaded, reference.load())


# ------------------------------------------------------------------------------------------ writing
T, X, Y = 7, 10, 6
CHUNKS = {"time": 2, "x": 5, "y": 3}


def sample_tree() -> xr.DataTree:
    """Numpy-backed data: an unlimited ``time``, a 2-D float variable, integers with a fill value,
    strings, a char variable, a subgroup whose variable uses the root's ``time``."""
    rng = np.random.default_rng(11)
    v = rng.normal(size=(T, X)).astype("f4")
    v[2, 3] = np.nan
    root = xr.Dataset(
        {
            "v": (("time", "x"), v, {"units": "K", "valid_range": np.array([-10, 10], "f4")}),
            "count": ("time", np.arange(T, dtype="i4") * 3),
            "name": ("time", np.array(["alpha", "be", "", "gamma", "d", "épsilon", "z"])),
            "code": ("time", np.array([b"ab", b"cde", b"", b"f", b"gh", b"k", b"mno"], "S3")),
        },
        coords={"time": np.arange(T) * 1.5, "x": np.arange(X, dtype="i2")},
        attrs={"title": "written by dask", "version": 3},
    )
    sub = xr.Dataset(
        {"w": (("time", "y"), np.arange(T * Y, dtype="f8").reshape(T, Y), {"long_name": "sub"})},
        attrs={"level": "g"},
    )
    return xr.DataTree.from_dict({"/": root, "/g": sub})


def with_encoding(tree: xr.DataTree) -> xr.DataTree:
    for node in tree.subtree:
        for variable in node.variables.values():
            if variable.dtype.kind == "S":
                variable.encoding["dtype"] = "S1"
        if "count" in node.variables:
            node["count"].encoding["_FillValue"] = np.int32(-7)
    return tree


def dask_tree() -> xr.DataTree:
    """The sample, every non-index variable a dask array of several chunks."""
    tree = sample_tree()
    tree = tree.map_over_datasets(lambda ds: ds.chunk({d: CHUNKS[d] for d in ds.dims if d in CHUNKS}))
    return with_encoding(tree)


def eager_encoding(tree: xr.DataTree) -> dict[str, dict]:
    """The storage chunks dask's chunks give, spelt out for the numpy-backed write."""
    encoding: dict[str, dict] = {}
    for node in tree.subtree:
        own = encoding.setdefault(node.path, {})
        for name, variable in node.to_dataset(inherit=False).data_vars.items():
            chunks = [CHUNKS[d] for d in variable.dims]
            if variable.dtype.kind == "S":
                chunks.append(variable.dtype.itemsize)  # the char dimension xarray adds
            own[name] = {**variable.encoding, "chunksizes": tuple(chunks)}  # replaces the variable's
    return encoding


def write_eager(url: str, tree: xr.DataTree | None = None, **options) -> None:
    tree = with_encoding(tree if tree is not None else sample_tree())
    nczmap.to_nczarr(tree, url, encoding=eager_encoding(tree), unlimited_dims={"time"}, **options)


def store_objects(url: str) -> dict[str, bytes]:
    with nczmap.open_map(url) as zmap:
        return {key: zmap.read(key) for key in zmap.objects()}


def assert_same_store(actual_url: str, expected_url: str) -> None:
    actual, expected = store_objects(actual_url), store_objects(expected_url)
    missing, extra = sorted(set(expected) - set(actual)), sorted(set(actual) - set(expected))
    assert not missing and not extra, f"missing {missing}, extra {extra}"
    differing = {key: (actual[key], expected[key]) for key in expected if actual[key] != expected[key]}
    assert not differing, f"objects differ: {differing}"


def data_keys(url: str, variable: str) -> list[str]:
    with nczmap.open_map(url) as zmap:
        return [key for key in zmap.search(variable) if not key.startswith(".")]


def new_url(kind: str, tmp_path: Path, s3_server, name: str) -> str:
    if kind == "s3":
        return s3_server.url(f"{name}-{uuid.uuid4().hex}")
    return f"file://{tmp_path}/{name}.file#mode=nczarr,file"


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_write_equals_eager_write(tmp_path, s3_server, kind, scheduler):
    eager_url = new_url(kind, tmp_path, s3_server, "eager")
    write_eager(eager_url)
    url = new_url(kind, tmp_path, s3_server, "dask")
    tree = dask_tree()
    assert tree["v"].data.npartitions == 8 and tree["g/w"].data.npartitions == 8
    if scheduler is None:
        nczmap.to_nczarr(tree, url, unlimited_dims={"time"})
    else:
        with get_task_stream(client=scheduler) as stream:
            nczmap.to_nczarr(tree, url, unlimited_dims={"time"})
        assert_ran_in_workers(scheduler, stream.data, url.split("#")[0].rsplit("/", 1)[-1], "store-")
    assert len(data_keys(url, "/v")) == 8
    assert_same_store(url, eager_url)
    with xr.open_datatree(url, engine="nczmap") as back:
        expected = sample_tree()
        for node in expected.subtree:
            for name, variable in node.variables.items():
                np.testing.assert_array_equal(back[node.path][name].values, variable.values, err_msg=name)


def test_zip_written_by_threads_equals_eager_write(tmp_path):
    eager_url = f"file://{tmp_path}/eager.zip#mode=nczarr,zip"
    write_eager(eager_url)
    url = f"file://{tmp_path}/threads.zip#mode=nczarr,zip"
    with dask.config.set(scheduler="threads"):
        nczmap.to_nczarr(dask_tree(), url, unlimited_dims={"time"})
    assert_same_store(url, eager_url)


def test_compute_false_writes_when_computed(tmp_path, client):
    eager_url = f"file://{tmp_path}/eager.file#mode=nczarr,file"
    write_eager(eager_url)
    url = f"file://{tmp_path}/later.file#mode=nczarr,file"
    delayed = nczmap.to_nczarr(dask_tree(), url, unlimited_dims={"time"}, compute=False)
    assert dask.is_dask_collection(delayed)
    assert data_keys(url, "/v") == [] and data_keys(url, "/g/w") == []  # the metadata only, so far
    with xr.open_dataset(url, engine="nczmap") as unwritten:
        assert np.isnan(unwritten["v"].values).all()
    client.compute(delayed).result(timeout=WAIT)
    assert_same_store(url, eager_url)


def test_misaligned_storage_chunks_are_refused(tmp_path, client):
    url = f"file://{tmp_path}/misaligned.file#mode=nczarr,file"
    tree = dask_tree()
    with pytest.raises(nczmap.errors.EncodingError, match=r"'v'.*\(3, 5\)"):
        nczmap.to_nczarr(tree, url, encoding={"/": {"v": {"chunksizes": (3, 5)}}}, unlimited_dims={"time"})
    # the store is not left locked: the same data with aligned chunks goes in
    eager_url = f"file://{tmp_path}/eager.file#mode=nczarr,file"
    write_eager(eager_url)
    nczmap.to_nczarr(tree, url, unlimited_dims={"time"})
    assert_same_store(url, eager_url)


def test_zip_target_with_distributed_client_names_the_zip(tmp_path, client):
    url = f"file://{tmp_path}/shared.zip#mode=nczarr,zip"
    with pytest.raises(nczmap.NCZError, match=r"shared\.zip") as raised:
        nczmap.to_nczarr(dask_tree(), url, unlimited_dims={"time"})
    assert "serialize" not in str(raised.value)
    assert not Path(tmp_path / "shared.zip").exists()  # nothing half written


# ------------------------------------------------------------------------------------------ ncdump
def data_section(cdl: bytes) -> bytes:
    _, found, data = cdl.partition(b"\ndata:\n")
    assert found, cdl
    return data


def ncdump(target: str) -> bytes:
    done = subprocess.run([NCDUMP, target], capture_output=True, timeout=WAIT, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


@pytest.mark.skipif(NCDUMP is None, reason="netcdf-c ncdump not on PATH")
@pytest.mark.parametrize("names", [["v", "count"], ["code"]])
def test_ncdump_reads_a_store_written_by_the_workers(tmp_path, client, names):
    root = with_encoding(sample_tree()).to_dataset()[names]  # 4.9.0 has no strings to compare
    nc = tmp_path / "reference.nc"
    with dask.config.set(scheduler="sync"):  # xarray's netCDF4 lock for a client that is not the default
        root.to_netcdf(nc, engine="netcdf4")
    url = f"file://{tmp_path}/for490.file#mode=nczarr,file"
    dask_root = root.chunk({d: CHUNKS[d] for d in root.dims if d in CHUNKS})
    assert all(root[name].encoding == dask_root[name].encoding for name in names)
    nczmap.to_nczarr(dask_root, url, netcdf_version="4.9.0")  # 4.9.0 reads no unlimited dimension
    assert data_section(ncdump(url)) == data_section(ncdump(str(nc)))


# ------------------------------------------------------------------------------------------ failures
def _field(shape: tuple[int, ...]) -> np.ndarray:
    return np.arange(np.prod(shape), dtype="i4").reshape(shape) * 7 - 5


def _block_slow_once(folder: str, slow: tuple[int, ...], block_info=None) -> np.ndarray:
    """A block of ``_field``; the block at ``slow`` records its worker's pid and hangs on its first
    attempt (the test kills that worker), the retry returns at once."""
    info = block_info[None]
    values = _field(info["shape"])[tuple(slice(*bounds) for bounds in info["array-location"])]
    if tuple(info["chunk-location"]) == slow:
        try:
            marker = os.open(os.path.join(folder, "started"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return values
        os.write(marker, str(os.getpid()).encode())
        os.close(marker)
        time.sleep(WAIT * 2)
    return values


def test_a_worker_killed_mid_write_leaves_a_store_equal_to_the_eager_one(tmp_path, client):
    shape, chunks = (12, 8), (3, 4)
    eager_url = f"file://{tmp_path}/eager.file#mode=nczarr,file"
    nczmap.to_nczarr(
        xr.Dataset({"f": (("t", "x"), _field(shape))}),
        eager_url,
        encoding={"f": {"chunksizes": chunks}},
        unlimited_dims={"t"},
    )
    grid = tuple((size,) * (whole // size) for whole, size in zip(shape, chunks, strict=True))
    slow = (2, 1)
    source = da.map_blocks(_block_slow_once, str(tmp_path), slow, chunks=grid, dtype="i4", meta=np.array(()))
    url = f"file://{tmp_path}/killed.file#mode=nczarr,file"
    delayed = nczmap.to_nczarr(
        xr.Dataset({"f": (("t", "x"), source)}), url, unlimited_dims={"t"}, compute=False
    )
    future = client.compute(delayed)
    marker = tmp_path / "started"
    others = {".".join(map(str, (i, j))) for i in range(4) for j in range(2)} - {"2.1"}
    deadline = time.monotonic() + WAIT
    while not (marker.exists() and marker.read_text() and set(data_keys(url, "/f")) >= others):
        assert time.monotonic() < deadline, "the write did not get to the slow chunk"
        assert not future.done(), future
        time.sleep(0.05)
    assert "2.1" not in data_keys(url, "/f")  # in the middle of the write: every chunk but one is there
    victim = int(marker.read_text())
    assert victim in client.run(os.getpid).values()
    os.kill(victim, signal.SIGKILL)
    future.result(timeout=WAIT)  # dask runs the task again, on a live worker
    assert victim not in client.run(os.getpid).values()
    assert_same_store(url, eager_url)


def test_a_handle_travels_without_opening_its_store(tmp_path):
    """Only the process that reads opens the store (dask's scheduler unpickles every task it is given)."""
    path = tmp_path / "store.file"
    url = f"file://{path}#mode=nczarr,file"
    write_eager(url)
    with nczmap.open_dataset(url) as opened:
        travelling = pickle.dumps(handles.DatasetHandle(opened))
    shutil.rmtree(path)
    handle = pickle.loads(travelling)  # nothing to open yet: no error
    with pytest.raises(nczmap.errors.DatasetNotFound, match=str(path)):
        handle.variable("/v")


def remove_store(kind: str, path: Path, s3_server) -> None:
    if kind == "file":
        shutil.rmtree(path)
        return
    s3 = s3_server.client()
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{path.name}/")["Contents"]
    s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": o["Key"]} for o in listed]})


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_a_store_removed_before_reading_is_an_error_in_the_worker(tmp_path, s3_server, kind, client):
    name = f"gone-{uuid.uuid4().hex}"
    url = new_url(kind, tmp_path, s3_server, name)
    path = tmp_path / f"{name}.file" if kind == "file" else Path(url.split("#")[0].rsplit("/", 1)[-1])
    write_eager(url)
    with xr.open_dataset(url, engine="nczmap", chunks={"time": 2}) as lazy:
        remove_store(kind, path, s3_server)
        future = client.compute(lazy["v"].data)
        with pytest.raises(nczmap.NCZError, match=path.name):
            future.result(timeout=WAIT)


def test_a_store_removed_before_writing_is_an_error_in_the_worker(tmp_path, client):
    path = tmp_path / "gone.file"
    url = f"file://{path}#mode=nczarr,file"
    delayed = nczmap.to_nczarr(dask_tree(), url, unlimited_dims={"time"}, compute=False)
    shutil.rmtree(path)
    with pytest.raises(nczmap.NCZError, match=str(path)):
        client.compute(delayed).result(timeout=WAIT)
    assert not path.exists()  # not recreated, half empty, by the tasks
