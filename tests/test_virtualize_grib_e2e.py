"""GRIB2 collections end to end: files joined along ``time`` (``--concat``), along ``step``, stacked along
a new dimension; written as kerchunk JSON and Icechunk; read back through nczmap
and, in a process that never imports nczmap, through fsspec, zarr-python and kerchunk's ``grib`` codec;
served over HTTP by the latency server, counting the requests. Expected values: cfgrib's reading of the
same files (``xr.open_mfdataset(engine="cfgrib")``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cfgrib")
xr = pytest.importorskip("xarray")
import grib_samples as gs  # noqa: E402

from nczmap.integrations.virtualize import grib_messages, virtualize  # noqa: E402


def open_manifest(path, group=None, containers=None):
    url = f"file://{path}#mode=nczarr,manifest"
    options = {"containers": containers} if containers else None
    return xr.open_dataset(url, engine="nczmap", group=group, map_options=options)


def cfgrib_joined(paths, dim, level_type):
    datasets = [gs.cfgrib_dataset(path, filter_by_keys={"typeOfLevel": level_type}) for path in paths]
    joined = [d.expand_dims(dim) if dim not in d.dims else d for d in datasets]
    return xr.concat(joined, dim=dim, coords="minimal", compat="override", join="exact")


def valid_times(paths):
    return [
        gs.cfgrib_dataset(p, filter_by_keys={"typeOfLevel": "surface"})["valid_time"].values for p in paths
    ]


@pytest.fixture
def cycles(tmp_path):
    """Four HRRR-like analyses six hours apart (one file each, one time and step per file)."""
    return [
        gs.lambert(tmp_path / f"hrrr.20240101.t{hour:02d}z.grib2", time=hour * 100) for hour in (0, 6, 12, 18)
    ]


def test_cycles_joined_along_time_equal_cfgrib_concatenated(tmp_path, cycles):
    refs = tmp_path / "refs.json"
    result = virtualize([str(p) for p in cycles], refs, concat="time")
    for group, name in (("surface", "t"), ("heightAboveGround", "t2m")):  # time and step are the root's
        theirs = cfgrib_joined(cycles, "time", group)
        with open_manifest(refs, group) as ours:
            assert dict(ours.sizes) == {"time": 4, "step": 1, "y": 30, "x": 40}
            np.testing.assert_array_equal(ours[name].isel(step=0).values, theirs[name].values)
            np.testing.assert_array_equal(ours["time"].values, theirs["time"].values)
            np.testing.assert_array_equal(ours["valid_time"].values[:, 0], valid_times(cycles))
            np.testing.assert_array_equal(ours["latitude"].values, theirs["latitude"].values)
    with open_manifest(refs) as root:
        assert dict(root.sizes) == {"time": 4, "step": 1}
    assert result.references == 4 * 2 + 2 * 2  # a message a field; each group's latitudes and longitudes


def test_forecast_hours_joined_along_step(tmp_path):
    paths = [gs.lambert(tmp_path / f"f{step:02d}.grib2", step=step) for step in (1, 2, 3)]
    refs = tmp_path / "refs.json"
    virtualize([str(p) for p in paths], refs, concat="step")
    theirs = cfgrib_joined(paths, "step", "heightAboveGround")
    with open_manifest(refs, "heightAboveGround") as ours:
        np.testing.assert_array_equal(ours["t2m"].isel(time=0).values, theirs["t2m"].values)
        np.testing.assert_array_equal(ours["step"].values, theirs["step"].values)
        np.testing.assert_array_equal(ours["valid_time"].values[0], valid_times(paths))


def test_files_stacked_along_a_new_dimension_from_their_names(tmp_path):
    paths = [gs.lambert(tmp_path / f"member_2024010{day}.grib2", seed=day) for day in (1, 2)]
    refs = tmp_path / "refs.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        virtualize([str(p) for p in paths], refs, new_dim="run=%Y%m%d")
    with open_manifest(refs, "surface") as ours:
        assert ours["t"].dims == ("run", "time", "step", "y", "x")
        for index, path in enumerate(paths):
            theirs = gs.cfgrib_dataset(path, filter_by_keys={"typeOfLevel": "surface"})
            np.testing.assert_array_equal(ours["t"].values[index, 0, 0], theirs["t"].values)


def test_an_icechunk_repository_reads_as_the_manifest(tmp_path, cycles):
    pytest.importorskip("icechunk")
    refs, repo = tmp_path / "refs.json", tmp_path / "repo"
    virtualize([str(p) for p in cycles], refs, concat="time")
    result = virtualize([str(p) for p in cycles], f"file://{repo}#mode=icechunk", concat="time")
    assert [c.prefix for c in result.containers] == [tmp_path.as_uri() + "/"]
    grants = {"containers": [str(tmp_path) + "/"]}
    for group in ("surface", "heightAboveGround"):
        url = f"file://{repo}#mode=icechunk"
        with (
            open_manifest(refs, group) as expected,
            xr.open_dataset(url, engine="nczmap", group=group, map_options=grants) as got,
        ):
            xr.testing.assert_equal(got.load(), expected.load())


def test_the_cli_virtualizes_grib(tmp_path, cycles):
    refs = tmp_path / "refs.json"
    command = [sys.executable, "-m", "nczmap", "virtualize", *map(str, cycles), str(refs), "--concat", "time"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with open_manifest(refs) as ours:
        assert ours.sizes["time"] == 4


READER = textwrap.dedent(
    """
    import json, sys
    import fsspec, numpy as np, zarr

    refs_path, out_path, group, name = sys.argv[1:5]
    fs = fsspec.filesystem("reference", fo=refs_path, remote_protocol="file")
    store = zarr.storage.FsspecStore(fs, read_only=True, path="")
    array = zarr.open_group(store, mode="r", zarr_format=2)[group][name]
    np.save(out_path, array[...])
    filters = [f.get_config() for f in array.metadata.filters or ()]
    print(json.dumps({"nczmap": any(m.startswith("nczmap") for m in sys.modules), "filters": filters}))
    """
)


def test_references_read_by_zarr_python_and_kerchunks_codec_without_nczmap(tmp_path):
    pytest.importorskip("kerchunk")
    source = gs.surface_and_heights(tmp_path / "sh.grib2")
    refs = tmp_path / "refs.json"
    virtualize([str(source)], refs)
    script = tmp_path / "read.py"
    script.write_text(READER)
    for theirs in gs.cfgrib_datasets(source):
        name = sorted(theirs.data_vars)[0]
        group = {"sp": "surface", "t": "isobaricInhPa", "t2m": "heightAboveGround/level_2"}.get(name)
        group = group or "heightAboveGround/level_10"
        out = tmp_path / f"{name}.npy"
        done = subprocess.run(
            [sys.executable, str(script), str(refs), str(out), group, name],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert not report["nczmap"]
        assert report["filters"][0]["id"] == "grib"
        np.testing.assert_array_equal(np.load(out)[0, 0], theirs[name].values)


# ------------------------------------------------------------------------------------------ over HTTP
@pytest.fixture
def no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "*")


def test_a_collection_over_http_is_the_collection_read_locally(tmp_path, cycles, no_proxy):
    import latency_server

    local, remote = tmp_path / "local.json", tmp_path / "remote.json"
    virtualize([str(p) for p in cycles], local, concat="time")
    with latency_server.serving(tmp_path, latency=0.005) as server:
        urls = [f"{server.url}/{p.name}" for p in cycles]
        result = virtualize(urls, remote, concat="time")
        stats = server.stats()
        got = open_manifest(remote, "surface", result.containers)
        with got, open_manifest(local, "surface") as expected:
            xr.testing.assert_identical(got.load(), expected.load())
    assert stats["counts"].get("HEAD", 0) == 0
    assert stats["counts"]["GET"] <= len(cycles) + 2, stats["counts"]  # the file; the grid's reference read


def test_large_messages_over_http_are_read_by_their_headers(tmp_path, no_proxy):
    import latency_server

    grid = {"Ni": 800, "Nj": 800, "iDirectionIncrementInDegrees": 0.05, "jDirectionIncrementInDegrees": 0.05,
            "latitudeOfLastGridPointInDegrees": 20.05, "longitudeOfLastGridPointInDegrees": 39.95,
            "numberOfDataPoints": 800 * 800}  # fmt: skip
    count = grid["numberOfDataPoints"]
    big = [
        gs.message(**grid, values=gs.field(i, count), bitsPerValue=32, level=100 * (i + 1)) for i in range(6)
    ]
    path = gs.write(tmp_path / "big.grib2", big)  # messages of 2.5 MB, beyond SMALL_MESSAGE: hopped over
    assert len(big[0]) > grib_messages.SMALL_MESSAGE
    with latency_server.serving(tmp_path, latency=0.002) as server:
        virtualize([f"{server.url}/big.grib2"], tmp_path / "refs.json")
        stats = server.stats()
    # the first block, then one read at each message's end: its 7777 and the next message's headers; and
    # the inventory asked for (none there)
    assert stats["per_file"]["/big.grib2"] == {"GET": len(big) + 1}, stats
    assert stats["per_file"]["/big.grib2.idx"] == {"GET": 1}, stats
    assert stats["bytes_per_file"]["/big.grib2"] < 0.2 * path.stat().st_size, stats


def inventory(path: Path, messages: list[bytes], shift: int = 0) -> Path:
    """``path.idx`` as wgrib2 writes one (``number:offset:d=date:var:level:forecast:`` a line), its offsets
    moved by ``shift`` bytes."""
    lines, offset = [], 0
    for number, data in enumerate(messages, 1):
        lines.append(f"{number}:{offset + shift}:d=2024010100:TMP:{number} mb:anl:")
        offset += len(data)
    target = path.with_name(path.name + ".idx")
    target.write_text("\n".join(lines) + "\n")
    return target


@pytest.fixture
def big_messages(tmp_path):
    grid = {"Ni": 400, "Nj": 400, "iDirectionIncrementInDegrees": 0.1, "jDirectionIncrementInDegrees": 0.1,
            "latitudeOfLastGridPointInDegrees": 20.1, "longitudeOfLastGridPointInDegrees": 39.9,
            "numberOfDataPoints": 400 * 400}  # fmt: skip
    count = grid["numberOfDataPoints"]
    messages = [
        gs.message(**grid, values=gs.field(i, count), bitsPerValue=16, level=50 * (i + 1)) for i in range(12)
    ]
    return gs.write(tmp_path / "big.grib2", messages), messages


def test_an_inventory_beside_a_remote_file_has_its_heads_fetched_together(tmp_path, big_messages, no_proxy):
    import latency_server

    path, messages = big_messages
    local = tmp_path / "local.json"
    virtualize([str(path)], local)
    inventory(path, messages)
    with latency_server.serving(tmp_path, latency=0.002) as server:
        result = virtualize([f"{server.url}/big.grib2"], tmp_path / "remote.json")
        stats = server.stats()
        got = open_manifest(tmp_path / "remote.json", None, result.containers)
        with got, open_manifest(local, None) as expected:
            xr.testing.assert_identical(got.load(), expected.load())
    # the first block and the inventory, then every head (and 7777) in one round of concurrent GETs
    assert stats["per_file"]["/big.grib2.idx"] == {"GET": 1}, stats
    assert stats["bytes_per_file"]["/big.grib2"] <= 64 * 1024 + len(messages) * 4096 + 4, stats
    assert stats["max_in_flight"] > 1, stats


@pytest.mark.parametrize(
    "damage",
    [
        lambda idx, messages: inventory(idx, messages, shift=7),  # every offset wrong
        lambda idx, messages: inventory(idx, messages[:5]),  # some messages missing from it
        lambda idx, messages: idx.with_name(idx.name + ".idx").write_bytes(b"1:x:garbage\n\xff\x00"),
        lambda idx, messages: idx.with_name(idx.name + ".idx").write_bytes(b""),
    ],
)
def test_a_wrong_inventory_gives_the_same_manifest(tmp_path, big_messages, no_proxy, damage):
    import latency_server

    path, messages = big_messages
    local = tmp_path / "local.json"
    virtualize([str(path)], local)
    damage(path, messages)
    with latency_server.serving(tmp_path, latency=0.001) as server:
        result = virtualize([f"{server.url}/big.grib2"], tmp_path / "remote.json")
        got = open_manifest(tmp_path / "remote.json", None, result.containers)
        with got, open_manifest(local, None) as expected:
            xr.testing.assert_identical(got.load(), expected.load())


def test_an_inventory_beside_an_s3_object_is_read_from_the_same_store(
    tmp_path, big_messages, s3_server, monkeypatch
):
    from s3server import BUCKET
    from test_virtualize import upload

    from nczmap.integrations.virtualize import grib

    path, messages = big_messages
    local = tmp_path / "local.json"
    virtualize([str(path)], local)
    key, _ = upload(s3_server, path)
    upload(s3_server, inventory(path, messages), key + ".idx")
    used = []
    monkeypatch.setattr(grib, "index_windows", lambda *a: used.append(a) or grib_messages.index_windows(*a))
    result = virtualize([f"{s3_server.endpoint}/{BUCKET}/{key}#mode=s3"], tmp_path / "remote.json")
    assert len(used) == 1 and used[0][0] == [sum(map(len, messages[:n])) for n in range(len(messages))]
    got = open_manifest(tmp_path / "remote.json", None, result.containers)
    with got, open_manifest(local, None) as expected:
        xr.testing.assert_identical(got.load(), expected.load())
