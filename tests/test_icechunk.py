"""The ``icechunk`` driver: Icechunk repositories as zmaps, read and written through the icechunk library.

Local repositories (tmp_path) and one on moto's S3 server; versions (branch, tag, snapshot); commits at
close and none on abort; virtual chunks only under granted containers; repositories written by xarray
read by nczmap, and repositories written by ``nczmap virtualize`` read by plain icechunk + xarray in a
process that never imports nczmap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import nczmap
from nczmap.errors import AccessDenied, DatasetNotFound, EmptyError, KeyNameError, ModeError, ReadOnlyError

ic = pytest.importorskip("icechunk")
xr = pytest.importorskip("xarray")

LOCAL = ic.credentials.LocalFileSystemAccess
ARRAY = {
    "zarr_format": 3,
    "node_type": "array",
    "shape": [4],
    "data_type": "int32",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
    "fill_value": 0,
    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
    "attributes": {},
    "dimension_names": ["x"],
}
GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {}}


def repo_url(path, **fragment: str) -> str:
    extra = "".join(f"&{k}={v}" for k, v in fragment.items())
    return f"{path.as_uri()}#mode=icechunk{extra}"


def write_small(url: str, values=(1, 2, 3)) -> None:
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", len(values))
        v = ds.create_variable("v", ("x",), "i4", fill_value=-1)
        v.attrs["units"] = "m"
        v[:] = list(values)


def history(path) -> list[str]:
    repo = ic.Repository.open(ic.local_filesystem_storage(str(path)))
    return [snapshot.message for snapshot in repo.ancestry(branch="main")]


# ---------------------------------------------------------------------------------------------- the map
def test_urls_select_the_driver_and_zarr_v3():
    url = nczmap.parse_url("file:///data/repo#mode=icechunk&tag=v1")
    assert (url.driver, url.zarr, url.zarr_format, url.fragment["tag"]) == ("icechunk", True, 3, "v1")
    assert nczmap.parse_url("http://127.0.0.1:9000/bkt/p#mode=icechunk").endpoint == "http://127.0.0.1:9000"
    with pytest.raises(ModeError):
        nczmap.parse_url("file:///data/repo#mode=icechunk,v2")


def test_a_new_dataset_is_pure_zarr_v3_read_identically_by_xarray(tmp_path):
    url = repo_url(tmp_path / "repo")
    write_small(url)
    with nczmap.open_dataset(url) as ds:
        assert ds.dialect.value == "zarr-v3"
        assert ds.variables["v"][:].tolist() == [1, 2, 3]
    with nczmap.open_map(url) as zmap:
        meta = json.loads(zmap.read("/v/zarr.json"))
        assert meta["dimension_names"] == ["x"]
        assert zmap.search("/") == ["v", "zarr.json"]
        assert zmap.read("/v/zarr.json", 2, 4) == zmap.read("/v/zarr.json")[2:6]
        assert zmap.read("/v/zarr.json", 10**6) == b""
        for key in ("/v", "/nothing", "/v/c/9", "/v/zarr.json/x"):
            assert not zmap.exists(key)
            with pytest.raises(EmptyError):
                zmap.read(key)
    repo = ic.Repository.open(ic.local_filesystem_storage(str(tmp_path / "repo")))
    theirs = xr.open_zarr(repo.readonly_session("main").store, consolidated=False)
    ours = xr.open_dataset(url, engine="nczmap")
    xr.testing.assert_identical(theirs.load(), ours.load())


def test_writes_are_committed_at_close_with_the_message(tmp_path):
    url = repo_url(tmp_path / "repo")
    with nczmap.open_map(url, "w", message="first version") as zmap:
        zmap.write("/zarr.json", json.dumps(GROUP).encode())
        zmap.write("/v/c/0", b"\1\0\0\0\2\0\0\0")  # before its zarr.json: held until it comes
        assert zmap.read("/v/c/0") == b"\1\0\0\0\2\0\0\0"
        assert zmap.search("/") == ["v", "zarr.json"]
        zmap.write("/v/zarr.json", json.dumps(ARRAY).encode())
    assert history(tmp_path / "repo")[0] == "first version"
    with nczmap.open_map(url) as zmap:
        assert zmap.read("/v/c/0") == b"\1\0\0\0\2\0\0\0"
        assert zmap.len("/v/c/0") == 8


def test_nothing_is_committed_on_abort_or_error(tmp_path):
    url = repo_url(tmp_path / "repo")
    write_small(url)
    before = history(tmp_path / "repo")
    zmap = nczmap.open_map(url, "r+")
    zmap.write("/v/c/0", np.array([7, 7, 7], "<i4").tobytes())
    zmap.abort()
    with pytest.raises(RuntimeError), nczmap.open_dataset(url, "r+") as ds:
        ds.variables["v"][:] = [9, 9, 9]
        raise RuntimeError("the writer fails")
    assert history(tmp_path / "repo") == before
    with nczmap.open_dataset(url) as ds:
        assert ds.variables["v"][:].tolist() == [1, 2, 3]


def test_only_zarr_v3_keys_can_be_written(tmp_path):
    with nczmap.open_map(repo_url(tmp_path / "repo"), "w") as zmap:
        with pytest.raises(KeyNameError, match="Zarr v3"):
            zmap.write("/.zgroup", b"{}")
        with pytest.raises(KeyNameError, match="Zarr v3"):
            zmap.write("/foo", b"x")
        zmap.abort()


def test_tags_and_snapshots_are_read_only_versions(tmp_path):
    path = tmp_path / "repo"
    write_small(repo_url(path), (1, 2, 3))
    repo = ic.Repository.open(ic.local_filesystem_storage(str(path)))
    first = repo.lookup_branch("main")
    repo.create_tag("v1", first)
    with nczmap.open_dataset(repo_url(path), "r+") as ds:
        ds.variables["v"][:] = [4, 5, 6]
    for version in ({"tag": "v1"}, {"snapshot": first}):
        with nczmap.open_dataset(repo_url(path, **version)) as ds:
            assert ds.variables["v"][:].tolist() == [1, 2, 3]
        with pytest.raises(ModeError, match="read-only"):
            nczmap.open_map(repo_url(path, **version), "r+")
    with nczmap.open_dataset(repo_url(path)) as ds:
        assert ds.variables["v"][:].tolist() == [4, 5, 6]
    with nczmap.open_map(repo_url(path)) as zmap, pytest.raises(ReadOnlyError):
        zmap.write("/v/c/0", b"\0" * 12)
    with pytest.raises(DatasetNotFound, match="tag nope"):
        nczmap.open_map(repo_url(path, tag="nope"))


def test_branches(tmp_path):
    path = tmp_path / "repo"
    write_small(repo_url(path), (1, 2, 3))
    with nczmap.open_dataset(repo_url(path, branch="dev"), "a") as ds:  # made from main's head
        ds.variables["v"][:] = [0, 0, 0]
    with (
        nczmap.open_dataset(repo_url(path)) as main,
        nczmap.open_dataset(repo_url(path, branch="dev")) as dev,
    ):
        assert main.variables["v"][:].tolist() == [1, 2, 3]
        assert dev.variables["v"][:].tolist() == [0, 0, 0]
    with pytest.raises(DatasetNotFound, match="no branch 'other'"):
        nczmap.open_map(repo_url(path, branch="other"), "r+")


def test_missing_repositories_and_non_repositories(tmp_path):
    with pytest.raises(DatasetNotFound, match="no Icechunk repository"):
        nczmap.open_dataset(repo_url(tmp_path / "none"))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "data.txt").write_text("mine")
    with pytest.raises(nczmap.errors.DatasetExists):
        nczmap.open_map(repo_url(tmp_path / "busy"), "w")
    assert (tmp_path / "busy" / "data.txt").read_text() == "mine"


def test_w_empties_the_branch(tmp_path):
    path = tmp_path / "repo"
    write_small(repo_url(path))
    with nczmap.create_dataset(repo_url(path)) as ds:
        ds.create_dimension("y", 2)
    with nczmap.open_dataset(repo_url(path)) as ds:
        assert not ds.variables  # the old variable is gone (a pure Zarr dimension alone is not stored)


def test_zarr_store_over_a_repository(tmp_path):
    zarr = pytest.importorskip("zarr")
    url = repo_url(tmp_path / "repo")
    write_small(url)
    with nczmap.ZarrStore(url) as store:
        assert zarr.open_group(store, mode="r")["v"][:].tolist() == [1, 2, 3]


# ------------------------------------------------------------------------ repositories written by xarray
def xarray_repository(path) -> xr.Dataset:
    ds = xr.Dataset(
        {
            "t": (("time", "lat"), np.arange(12, dtype="f4").reshape(3, 4), {"units": "K"}),
            "n": (("lat",), np.array([1, 2, 3, 4], "i2")),
        },
        coords={"lat": [10.0, 20.0, 30.0, 40.0], "time": [0, 1, 2]},
        attrs={"title": "written by xarray"},
    )
    repo = ic.Repository.create(ic.local_filesystem_storage(str(path)))
    session = repo.writable_session("main")
    ds.to_zarr(session.store, zarr_format=3, consolidated=False)
    session.commit("xarray")
    return ds


def test_a_repository_written_by_xarray_reads_as_xarray_reads_it(tmp_path, capsys):
    path = tmp_path / "repo"
    xarray_repository(path)
    repo = ic.Repository.open(ic.local_filesystem_storage(str(path)))
    theirs = xr.open_zarr(repo.readonly_session("main").store, consolidated=False).load()
    ours = xr.open_dataset(repo_url(path), engine="nczmap").load()
    xr.testing.assert_identical(theirs, ours)
    from nczmap.cli import main

    main(["ncdump", repo_url(path)])
    cdl = capsys.readouterr().out
    assert "float t(time, lat) ;" in cdl and ':title = "written by xarray" ;' in cdl
    assert " t =\n  0, 1, 2, 3,\n  4, 5, 6, 7,\n  8, 9, 10, 11 ;" in cdl


def test_copy_a_repository_to_nczarr(tmp_path):
    path = tmp_path / "repo"
    original = xarray_repository(path)
    target = (tmp_path / "copy.file").as_uri() + "#mode=nczarr,file"
    from nczmap.integrations.copy import copy

    copy(repo_url(path), target)
    copied = xr.open_dataset(target, engine="nczmap").load()
    np.testing.assert_array_equal(copied["t"].values, original["t"].values)


# -------------------------------------------------------------------------------------- virtual chunks
@pytest.fixture
def virtual_repo(tmp_path):
    """A repository written by icechunk with virtual chunks in two containers: ``src/`` and ``other/``."""
    src, other = tmp_path / "src", tmp_path / "other"
    (src / "sub").mkdir(parents=True)
    other.mkdir()
    (src / "sub" / "a.bin").write_bytes(np.array([1, 2, 3, 4], "<i4").tobytes())
    (other / "b.bin").write_bytes(np.array([0, 0, 5, 6, 7, 8], "<i4").tobytes())
    config = ic.RepositoryConfig.default()
    for folder in (src, other):
        config.set_virtual_chunk_container(container(folder))
    repo = ic.Repository.create(ic.local_filesystem_storage(str(tmp_path / "repo")), config=config)
    repo.save_config()
    session = repo.writable_session("main")
    store = session.store
    group = {**GROUP, "attributes": {}}
    session.store._sync(store.set("zarr.json", _buffer(json.dumps(group).encode())))
    for name in ("a", "b"):
        session.store._sync(store.set(f"{name}/zarr.json", _buffer(json.dumps(ARRAY).encode())))
    store.set_virtual_ref("a/c/0", (src / "sub" / "a.bin").as_uri(), offset=0, length=8)
    store.set_virtual_ref("a/c/1", (src / "sub" / "a.bin").as_uri(), offset=8, length=8)
    store.set_virtual_ref("b/c/0", (other / "b.bin").as_uri(), offset=8, length=8)
    store.set_virtual_ref("b/c/1", (other / "b.bin").as_uri(), offset=16, length=8)
    session.commit("virtual")
    return tmp_path


def container(folder):
    return ic.VirtualChunkContainer(folder.as_uri() + "/", ic.local_filesystem_store(str(folder)))


def _buffer(data: bytes):
    from zarr.core.buffer import default_buffer_prototype

    return default_buffer_prototype().buffer.from_bytes(data)


def test_virtual_chunks_are_read_under_the_grant_only(virtual_repo):
    url = repo_url(virtual_repo / "repo")
    src = str(virtual_repo / "src") + "/"
    with nczmap.open_map(url, containers=[src]) as zmap:
        assert zmap.read("/a/c/1") == np.array([3, 4], "<i4").tobytes()
        with pytest.raises(AccessDenied, match="other/") as denied:
            zmap.read("/b/c/0")
        assert "--allow" in str(denied.value) and "'/b/c/0'" in str(denied.value)
    with nczmap.open_map(url) as zmap, pytest.raises(AccessDenied, match="not granted"):
        zmap.read("/a/c/0")  # nothing granted by default
    grants = [src, str(virtual_repo / "other")]
    ours = xr.open_dataset(url, engine="nczmap", map_options={"containers": grants}).load()
    repo = ic.Repository.open(
        ic.local_filesystem_storage(str(virtual_repo / "repo")),
        authorize_virtual_chunk_access={
            (virtual_repo / "src").as_uri() + "/": LOCAL,
            (virtual_repo / "other").as_uri() + "/": LOCAL,
        },
    )
    theirs = xr.open_zarr(repo.readonly_session("main").store, consolidated=False).load()
    xr.testing.assert_identical(theirs, ours)
    assert ours["b"].values.tolist() == [5, 6, 7, 8]


def test_a_narrower_grant_refuses_a_repository_with_chunks_outside_it(virtual_repo):
    url = repo_url(virtual_repo / "repo")
    with pytest.raises(AccessDenied, match=r"a\.bin"):  # before any chunk is read
        nczmap.open_map(url, containers=[str(virtual_repo / "src" / "elsewhere") + "/"])
    with nczmap.open_map(url, containers=[str(virtual_repo / "src" / "sub") + "/"]) as zmap:
        assert zmap.read("/a/c/0") == np.array([1, 2], "<i4").tobytes()


def test_a_symbolic_link_out_of_the_grant_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\1" * 16)
    (src / "link.bin").symlink_to(secret)
    config = ic.RepositoryConfig.default()
    config.set_virtual_chunk_container(container(src))
    repo = ic.Repository.create(ic.local_filesystem_storage(str(tmp_path / "repo")), config=config)
    repo.save_config()
    session = repo.writable_session("main")
    session.store._sync(session.store.set("zarr.json", _buffer(json.dumps(GROUP).encode())))
    session.store._sync(session.store.set("a/zarr.json", _buffer(json.dumps(ARRAY).encode())))
    session.store.set_virtual_ref("a/c/0", (src / "link.bin").as_uri(), offset=0, length=8)
    session.commit("link")
    with pytest.raises(AccessDenied, match=r"secret\.bin"):
        nczmap.open_map(repo_url(tmp_path / "repo"), containers=[str(src) + "/"])


# ------------------------------------------------------------------------------ nczmap virtualize -> repo
netCDF4 = pytest.importorskip("netCDF4")


def make_source(path) -> None:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("x", 400)
        t = ds.createVariable("time", "f8", ("time",))
        t[:] = [0, 1, 2]
        t.units = "days since 2000-01-01"
        v = ds.createVariable("v", "f4", ("time", "x"), zlib=True, shuffle=True, chunksizes=(1, 400))
        v[:] = np.random.default_rng(0).random((3, 400), dtype="f4")
        v.units = "K"
        c = ds.createVariable("c", "i2", ("x",), contiguous=True)
        c[:] = np.arange(400)
        with warnings.catch_warnings():  # netCDF4-python warns of the byte order it was asked for
            warnings.simplefilter("ignore")
            s = ds.createVariable("s", "i4", ("x",), endian="big")
        s[:] = np.arange(400) * 3
        ds.title = "virtual"


def test_virtualize_into_a_repository_reads_in_plain_icechunk(tmp_path):
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "a.nc"
    make_source(source)
    from nczmap.cli import main

    repo = tmp_path / "repo"
    assert main(["virtualize", str(source), repo_url(repo)]) in (0, None)
    assert history(repo)[0] == "nczmap"
    code = textwrap.dedent(
        f"""
        import json, sys
        import icechunk as ic, xarray as xr
        repo = ic.Repository.open(
            ic.local_filesystem_storage({str(repo)!r}),
            authorize_virtual_chunk_access=ic.containers_credentials(
                {{{(tmp_path / "src").as_uri() + "/"!r}: ic.credentials.LocalFileSystemAccess}}
            ),
        )
        session = repo.readonly_session("main")
        assert session.all_virtual_chunk_locations()
        ds = xr.open_zarr(session.store, consolidated=False, decode_cf=False)
        assert "nczmap" not in sys.modules
        print(json.dumps({{name: ds[name].values.tolist() for name in ds.variables}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)
    with netCDF4.Dataset(source) as ds:
        ds.set_auto_maskandscale(False)
        for name in ("time", "v", "c", "s"):
            np.testing.assert_array_equal(np.array(theirs[name]), ds[name][:], err_msg=name)
    grant = [str(tmp_path / "src") + "/"]
    with nczmap.open_dataset(repo_url(repo), containers=grant) as ours, netCDF4.Dataset(source) as ds:
        np.testing.assert_array_equal(ours.variables["v"][:], ds["v"][:])
        assert ours.attrs["title"] == "virtual"


def test_ncdump_follows_allow(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "a.nc"
    make_source(source)
    from nczmap.cli import main

    main(["virtualize", str(source), repo_url(tmp_path / "repo")])
    main(["ncdump", "-v", "c", "--allow", str(tmp_path / "src"), repo_url(tmp_path / "repo")])
    assert " c = 0, 1, 2, 3," in capsys.readouterr().out
    assert main(["ncdump", "-v", "v", repo_url(tmp_path / "repo")]) not in (0, None)
    assert "--allow" in capsys.readouterr().err


def test_a_changed_source_is_refused(tmp_path):
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "a.nc"
    make_source(source)
    from nczmap.integrations.virtualize import virtualize

    virtualize([str(source)], repo_url(tmp_path / "repo"))
    later = os.stat(source).st_mtime + 10
    os.utime(source, (later, later))
    with (
        nczmap.open_dataset(repo_url(tmp_path / "repo"), containers=[str(tmp_path / "src") + "/"]) as ds,
        pytest.raises(nczmap.errors.StorageError, match="changed"),
    ):
        ds.variables["v"][:]


# ---------------------------------------------------------------------------------------------------- S3
def test_a_repository_on_s3(s3_server):
    url = s3_server.url(mode="icechunk")
    write_small(url, (5, 6, 7))
    with nczmap.open_dataset(url) as ds:
        assert ds.variables["v"][:].tolist() == [5, 6, 7]
    bucket_url = url.partition("#")[0]
    prefix = bucket_url.split("/", 4)[4]
    storage = ic.s3_storage(
        bucket="nczbucket",
        prefix=prefix,
        endpoint_url=s3_server.endpoint,
        allow_http=True,
        force_path_style=True,
        region="us-east-1",
        from_env=True,
    )
    theirs = xr.open_zarr(ic.Repository.open(storage).readonly_session("main").store, consolidated=False)
    assert theirs["v"].values.tolist() == [5, 6, 7]
    with pytest.raises(DatasetNotFound):
        nczmap.open_map(s3_server.url(mode="icechunk"))


def test_manifest_checksums_are_refused_for_a_repository(tmp_path):
    """A repository checks its sources by ETag or modification time: asking for crc32c is an error, not
    silently ignored."""
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "a.nc"
    make_source(source)
    from nczmap.integrations.virtualize import virtualize

    with pytest.raises(nczmap.errors.FormatError, match="checksums"):
        virtualize([str(source)], repo_url(tmp_path / "repo"), checksums=True)


# ------------------------------------------------------------------------ nczmap copy MANIFEST REPO
def _plain_icechunk_values(repo, grant: str) -> dict:
    """What plain icechunk + xarray read from ``repo`` (authorising ``grant``), in a process that never
    imports nczmap, with the repository's virtual chunk locations."""
    code = textwrap.dedent(
        f"""
        import json, sys
        import icechunk as ic, xarray as xr
        repo = ic.Repository.open(
            ic.local_filesystem_storage({str(repo)!r}),
            authorize_virtual_chunk_access=ic.containers_credentials(
                {{{grant!r}: ic.credentials.LocalFileSystemAccess}}
            ),
        )
        session = repo.readonly_session("main")
        ds = xr.open_zarr(session.store, consolidated=False, decode_cf=False)
        assert "nczmap" not in sys.modules
        values = {{name: ds[name].values.tolist() for name in ds.variables}}
        locations = sorted(set(session.all_virtual_chunk_locations()))
        print(json.dumps({{"values": values, "locations": locations}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _tree_bytes(path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.mark.parametrize("manifest", ["refs.json", "refs.parq"])
def test_copy_a_manifest_into_a_repository_writes_virtual_chunks(tmp_path, manifest):
    """``nczmap copy MANIFEST REPO``: the references become virtual chunks (with the sources' modification
    times as their checksums), not copies of the data; plain icechunk + xarray read netCDF4-python's
    values; data the manifest keeps beside it (loaded variables) is copied."""
    from nczmap.cli import main

    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "a.nc"
    make_source(source)
    refs = tmp_path / "src" / manifest
    assert main(["virtualize", str(source), str(refs), "--load", "c"]) in (0, None)
    repo = tmp_path / "repo"
    assert main(["copy", refs.as_uri() + "#mode=nczarr,manifest", repo_url(repo)]) in (0, None)
    assert history(repo)[0] == "nczmap"
    read = _plain_icechunk_values(repo, (tmp_path / "src").as_uri() + "/")
    assert read["locations"] == [source.as_uri()], "the references are virtual chunks of the source"
    with netCDF4.Dataset(source) as ds:
        ds.set_auto_maskandscale(False)
        for name in ("time", "v", "c", "s"):
            np.testing.assert_array_equal(np.array(read["values"][name]), ds[name][:], err_msg=name)
    assert _tree_bytes(repo) < os.path.getsize(source), "the repository holds no copy of the referenced data"
    later = os.stat(source).st_mtime + 10  # the checksum recorded: a source touched since is refused
    os.utime(source, (later, later))
    with (
        nczmap.open_dataset(repo_url(repo), containers=[str(tmp_path / "src") + "/"]) as ds,
        pytest.raises(nczmap.errors.StorageError, match="changed"),
    ):
        ds.variables["v"][:]


def test_copy_a_manifest_refers_only_where_the_manifest_may(tmp_path):
    """A manifest whose references lie outside its grants is refused, nothing committed; granted, it
    copies."""
    from nczmap.cli import main

    (tmp_path / "src").mkdir()
    (tmp_path / "elsewhere").mkdir()
    source = tmp_path / "src" / "a.nc"
    make_source(source)
    refs = tmp_path / "elsewhere" / "refs.json"
    assert main(["virtualize", str(source), str(refs), "--allow", str(tmp_path / "src")]) in (0, None)
    manifest = refs.as_uri() + "#mode=nczarr,manifest"
    assert main(["copy", manifest, repo_url(tmp_path / "repo")]) not in (0, None)
    assert "nczmap" not in history(tmp_path / "repo"), "nothing is committed"
    assert main(["copy", "--allow", str(tmp_path / "src"), manifest, repo_url(tmp_path / "repo")]) in (
        0,
        None,
    )
    read = _plain_icechunk_values(tmp_path / "repo", (tmp_path / "src").as_uri() + "/")
    assert read["locations"] == [source.as_uri()]


# ------------------------------------------------------------------------ nczmap copy REPO MANIFEST
def _fsspec_zarr_values(manifest, names) -> dict:
    """What fsspec's ReferenceFileSystem + zarr-python read from a kerchunk manifest (JSON or Parquet)."""
    import fsspec
    import zarr
    from fsspec.implementations.reference import LazyReferenceMapper
    from zarr.storage import FsspecStore

    if manifest.suffix == ".json":
        mapper = fsspec.filesystem("reference", fo=str(manifest)).get_mapper("")
        group = zarr.open_group(mapper, mode="r", zarr_format=2)
        return {name: group[name][...] for name in names}
    references = LazyReferenceMapper(str(manifest), fs=fsspec.filesystem("file"))
    fs = fsspec.filesystem("reference", fo=references, remote_protocol="file", asynchronous=True)
    found = {}
    for name in names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            found[name] = zarr.open_array(
                FsspecStore(fs, path=name, read_only=True), mode="r", zarr_format=2
            )[...]
    return found


@pytest.mark.parametrize("suffix", [".json", ".parq"])
def test_copy_a_repository_to_a_manifest_exports_its_virtual_chunks(tmp_path, suffix):
    """``nczmap copy REPO refs.json|refs.parq``: the repository's virtual chunks become kerchunk references
    to the source (read back by fsspec + zarr-python as netCDF4-python reads the source), its native
    chunks data in the manifest; without a grant of the sources the repository is refused."""
    from nczmap.cli import main

    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "a.nc"
    make_source(source)
    repo = tmp_path / "repo"
    assert main(["virtualize", str(source), repo_url(repo), "--load", "c"]) in (0, None)
    (tmp_path / "out").mkdir()
    refs = tmp_path / "out" / f"refs{suffix}"
    manifest = refs.as_uri() + "#mode=nczarr,manifest"
    assert main(["copy", repo_url(repo), manifest]) not in (0, None)  # the sources are not granted
    assert main(["copy", "--allow", str(tmp_path / "src"), repo_url(repo), manifest]) in (0, None)
    with nczmap.open_map(manifest, containers=[str(tmp_path / "src") + "/"]) as exported:
        referenced = {exported.reference(f"/v/{i}.0") for i in range(3)}
        assert {r.url for r in referenced} == {source.as_uri()}, "v's chunks refer to the source"
        assert exported.reference("/c/0") is None, "c was loaded: its chunk is data"
    got = _fsspec_zarr_values(refs, ["time", "v", "c", "s"])
    with netCDF4.Dataset(source) as ds:
        ds.set_auto_maskandscale(False)
        for name, values in got.items():
            np.testing.assert_array_equal(values, ds[name][:], err_msg=name)


def test_a_repository_written_by_icechunk_exports_to_references(virtual_repo):
    """Virtual chunks icechunk itself wrote (two containers) export as references nczmap reads back."""
    from nczmap.integrations.copy import copy

    grants = [str(virtual_repo / "src") + "/", str(virtual_repo / "other") + "/"]
    refs = virtual_repo / "refs.json"
    copy(repo_url(virtual_repo / "repo"), refs.as_uri() + "#mode=nczarr,manifest", containers=grants)
    document = json.loads(refs.read_text())["refs"]
    assert document["a/0"] == [(virtual_repo / "src" / "sub" / "a.bin").as_uri(), 0, 8]
    assert document["b/1"] == [(virtual_repo / "other" / "b.bin").as_uri(), 16, 8]
    with nczmap.open_dataset(refs.as_uri() + "#mode=zarr,manifest", containers=grants) as ds:
        assert ds.variables["a"][...].tolist() == [1, 2, 3, 4]
        assert ds.variables["b"][...].tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize("suffix", [".json", ".parq"])
def test_an_exported_manifest_records_its_sources_and_refuses_them_changed(tmp_path, suffix):
    """A manifest exported from a repository records each source as ``virtualize`` does (size and
    modification time), so a source rewritten after the export is refused by the manifest's reads, not
    read as if it were the one referred to."""
    from nczmap.integrations.copy import copy

    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "a.nc"
    make_source(source)
    grant = [str(tmp_path / "src") + "/"]
    nczmap.virtualize([str(source)], repo_url(tmp_path / "repo"))
    manifest = (tmp_path / f"refs{suffix}").as_uri() + "#mode=nczarr,manifest"
    copy(repo_url(tmp_path / "repo"), manifest, containers=grant)
    with nczmap.open_map(manifest, containers=grant) as exported:
        info = os.stat(source)
        assert exported.manifest.sources == {
            source.as_uri(): {"size": info.st_size, "mtime": info.st_mtime_ns}
        }
    with netCDF4.Dataset(source, "r+") as ds:  # rewritten in place: same size, new values
        ds["v"][0, :] = 0
    with (
        nczmap.open_dataset(manifest, containers=grant) as ds,
        pytest.raises(nczmap.errors.StorageError, match=r"a\.nc changed since the manifest was made"),
    ):
        ds.variables["v"][...]


def test_a_source_changed_before_the_export_fails_it_writing_nothing(tmp_path):
    """The repository vouches for its sources (icechunk compares each chunk's recorded modification time):
    a source changed since the repository was written fails the export, naming the source, and no
    manifest is written that would vouch for the changed file instead."""
    from nczmap.integrations.copy import copy

    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "a.nc"
    make_source(source)
    nczmap.virtualize([str(source)], repo_url(tmp_path / "repo"))
    later = os.stat(source).st_mtime + 10
    os.utime(source, (later, later))
    refs = tmp_path / "refs.json"
    with pytest.raises(nczmap.errors.StorageError, match=r"a\.nc"):
        copy(
            repo_url(tmp_path / "repo"),
            refs.as_uri() + "#mode=nczarr,manifest",
            containers=[str(tmp_path / "src") + "/"],
        )
    assert not refs.exists()


def test_an_exported_manifest_records_s3_sources_by_etag(tmp_path, s3_server):
    """S3 sources (on moto's server, reached through the grant's endpoint) are recorded by size and
    ETag; an object replaced after the export is refused by the manifest's reads."""
    from s3server import BUCKET
    from test_virtualize import upload

    from nczmap.integrations.copy import copy

    make_source(tmp_path / "a.nc")
    key, etag = upload(s3_server, tmp_path / "a.nc")
    source = f"{s3_server.endpoint}/{BUCKET}/{key}#mode=s3"
    result = nczmap.virtualize([source], repo_url(tmp_path / "repo"))
    refs = tmp_path / "refs.json"
    copy(repo_url(tmp_path / "repo"), refs.as_uri() + "#mode=nczarr,manifest", containers=result.containers)
    with nczmap.open_map(refs.as_uri() + "#mode=nczarr,manifest", containers=result.containers) as exported:
        assert exported.manifest.sources == {
            f"s3://{BUCKET}/{key}": {"size": (tmp_path / "a.nc").stat().st_size, "etag": etag}
        }
    with netCDF4.Dataset(tmp_path / "a.nc", "r+") as ds:
        ds["v"][0, :] = 0
    upload(s3_server, tmp_path / "a.nc", key)  # replaced: same size, another ETag
    with (
        nczmap.open_dataset(refs.as_uri() + "#mode=nczarr,manifest", containers=result.containers) as ds,
        pytest.raises(nczmap.errors.StorageError, match="changed since the manifest was made"),
    ):
        ds.variables["v"][...]
