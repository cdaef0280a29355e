"""The manifest driver: kerchunk references read as a zmap, only under authorised containers."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

import nczmap
from nczmap import AccessDenied, StorageError
from nczmap.testing import ReadContract, WriteContract
from nczmap.zmap.byteranges import merge_ranges

BLOB = "data.bin"


def write_manifest(directory, objects: dict[str, bytes], references: dict[str, list] | None = None) -> str:
    """A kerchunk v1 manifest in ``directory``: keys starting with '.' inline, the others as references
    into one blob file (so the read contract goes through references), plus extra raw references."""
    blob = directory / BLOB
    refs: dict[str, object] = {}
    offset, chunks = 0, []
    for key, data in objects.items():
        name = key.lstrip("/")
        if name.rsplit("/", 1)[-1].startswith("."):
            refs[name] = (
                data.decode("utf-8")
                if data.isascii()
                else "base64:" + __import__("base64").b64encode(data).decode()
            )
        else:
            chunks.append(data)
            refs[name] = [BLOB, offset, len(data)]
            offset += len(data)
    blob.write_bytes(b"".join(chunks))
    refs.update(references or {})
    path = directory / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path.as_uri() + "#mode=nczarr,manifest"


class TestManifestContract(ReadContract, WriteContract):
    @pytest.fixture(autouse=True)
    def _places(self, tmp_path):
        self.places = (tmp_path / f"m{n}" for n in itertools.count())

    def open_seeded(self, objects):
        place = next(self.places)
        place.mkdir()
        return nczmap.open_map(write_manifest(place, objects), "r")

    def open_writable(self, mode="w"):
        place = next(self.places)
        place.mkdir()
        return nczmap.open_map((place / "refs.json").as_uri() + "#mode=nczarr,manifest", mode)

    def reopen(self, zmap, mode):
        zmap.close()
        return nczmap.open_map(zmap.url, mode)


# ---------------------------------------------------------------------------------------------- security
@pytest.fixture
def secret(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "id_rsa"
    path.write_bytes(b"-----BEGIN PRIVATE KEY----- secret")
    return path


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "manifests"
    home.mkdir()
    return home


def hostile(home, url: str) -> str:
    return write_manifest(home, {"/.zgroup": b"{}"}, {"stolen": [url, 0, 10], "whole": [url]})


@pytest.mark.parametrize(
    "spell",
    [
        lambda s, h: str(s),
        lambda s, h: s.as_uri(),
        lambda s, h: f"file://localhost{s}",
        lambda s, h: f"../outside/{s.name}",
        lambda s, h: f"{h}/../outside/{s.name}",
        lambda s, h: f"{h}/./../outside//{s.name}",
        lambda s, h: f"file://{h}/%2e%2e/outside/{s.name}",
        lambda s, h: "/etc/passwd",
    ],
    ids=[
        "path",
        "file-url",
        "localhost",
        "relative-dotdot",
        "dotdot",
        "dots-and-slashes",
        "percent",
        "passwd",
    ],
)
def test_references_outside_the_containers_are_refused_before_any_read(home, secret, spell):
    url = hostile(home, spell(secret, home))
    with nczmap.open_map(url, "r") as zmap:
        for key in ("/stolen", "/whole"):
            with pytest.raises(AccessDenied, match="outside every authorised container") as info:
                zmap.read(key)
            assert "--allow" in str(info.value) and "containers=" in str(info.value)
            with pytest.raises(AccessDenied):
                zmap.read_many_into([(key, memoryview(bytearray(10)))])


def test_a_symlink_inside_the_container_that_leaves_it_is_refused(home, secret):
    (home / "innocent.bin").symlink_to(secret)
    with nczmap.open_map(hostile(home, "innocent.bin"), "r") as zmap, pytest.raises(AccessDenied):
        zmap.read("/stolen")


def test_a_granted_container_is_readable(home, secret):
    url = hostile(home, str(secret))
    with nczmap.open_map(url, "r", containers=[str(secret.parent)]) as zmap:
        assert zmap.read("/stolen") == secret.read_bytes()[:10]
        assert zmap.read("/whole") == secret.read_bytes()
    with (
        nczmap.open_map(url, "r", containers=[str(secret.parent) + "x"]) as zmap,
        pytest.raises(AccessDenied),
    ):
        zmap.read("/stolen")  # a prefix matches whole segments only: /outsidex is not /outside


@pytest.mark.parametrize(
    "grants",
    [
        lambda d: [d],
        lambda d: {d: {}},
        lambda d: ["/nowhere/else/", {d: {}}],  # the README's form: prefixes and {prefix: options} mixed
        lambda d: [{d: None}, "s3://bucket/nc/"],
    ],
)
def test_every_form_of_grant_is_taken(home, secret, grants):
    url = hostile(home, str(secret))
    with nczmap.open_map(url, "r", containers=grants(str(secret.parent) + "/")) as zmap:
        assert zmap.read("/stolen") == secret.read_bytes()[:10]


def test_a_grant_that_is_neither_a_prefix_nor_a_mapping_is_refused_by_name(home):
    with pytest.raises(AccessDenied, match=r"cannot grant 42"):
        nczmap.open_map(hostile(home, "x"), "r", containers=["/tmp/", 42])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"endpoint": ...}, r"option endpoint must be text, not Ellipsis"),
        ({"headers": {"A": 1}}, r"option headers must be a dict of text"),
        ({"endpoitn": "http://127.0.0.1:9000"}, r"has option 'endpoitn'"),
        ("http://127.0.0.1:9000", r"must be a dict, not str"),
    ],
)
def test_grant_options_are_checked_when_granted(home, options, message):
    with pytest.raises(AccessDenied, match=rf"s3://bucket/nc/.*{message}|{message}"):
        nczmap.open_map(hostile(home, "x"), "r", containers=[{"s3://bucket/nc/": options}])


def test_unsupported_schemes_are_refused(home):
    url = hostile(home, "http://169.254.169.254/latest/meta-data")
    with nczmap.open_map(url, "r") as zmap, pytest.raises(AccessDenied, match="scheme"):
        zmap.read("/stolen")


def test_s3_bucket_not_granted_is_refused(home):
    url = hostile(home, "s3://someone-elses-bucket/data.nc")
    with nczmap.open_map(url, "r") as zmap, pytest.raises(AccessDenied, match=r"s3://someone-elses-bucket/"):
        zmap.read("/stolen")


def test_set_reference_outside_the_containers_is_refused(home, secret):
    with nczmap.open_map((home / "refs.json").as_uri() + "#mode=nczarr,manifest", "w") as zmap:
        with pytest.raises(AccessDenied):
            zmap.set_reference("/v/0", str(secret), 0, 4)
        (home / "inside.bin").write_bytes(b"0123456789")
        zmap.set_reference("/v/0", "inside.bin", 2, 4)
        assert zmap.read("/v/0") == b"2345"


def test_set_references_checks_as_set_reference_does(home, secret):
    from nczmap.errors import KeyConflictError

    (home / "inside.bin").write_bytes(b"0123456789")
    with nczmap.open_map((home / "refs.json").as_uri() + "#mode=nczarr,manifest", "w") as zmap:
        with pytest.raises(AccessDenied):
            zmap.set_references(str(secret), [("/v/0", 0, 4)])
        zmap.write("/obj", b"x")
        with pytest.raises(KeyConflictError):
            zmap.set_references("inside.bin", [("/obj/0", 0, 4)])  # under an object
        assert zmap.set_references("inside.bin", [(f"/v/{i}", 2 * i, 2) for i in range(5)]) == 5
        assert [zmap.read(f"/v/{i}") for i in range(5)] == [b"01", b"23", b"45", b"67", b"89"]
        with pytest.raises(KeyConflictError):
            zmap.set_references("inside.bin", [("/v/5", 0, 1), ("/v", 0, 1)])  # over a directory


# ---------------------------------------------------------------------------------------------- integrity
def test_a_source_shorter_than_its_reference_is_an_error(home):
    url = write_manifest(home, {"/.zgroup": b"{}", "/v/0": b"abcdef"})
    (home / BLOB).write_bytes(b"abc")
    with nczmap.open_map(url, "r") as zmap:
        with pytest.raises(StorageError, match="truncated or replaced"):
            zmap.read("/v/0")
        with pytest.raises(StorageError):
            zmap.read_many_into([("/v/0", memoryview(bytearray(6)))])


def test_a_source_changed_since_the_manifest_was_made_is_an_error(home):
    write_manifest(home, {"/.zgroup": b"{}", "/v/0": b"abcdef"})
    document = json.loads((home / "refs.json").read_text())
    stat = (home / BLOB).stat()
    document["nczmap"] = {"sources": {BLOB: {"size": stat.st_size, "mtime": stat.st_mtime_ns}}}
    (home / "refs.json").write_text(json.dumps(document))
    url = (home / "refs.json").as_uri() + "#mode=nczarr,manifest"
    with nczmap.open_map(url, "r") as zmap:
        assert zmap.read("/v/0") == b"abcdef"
    (home / BLOB).write_bytes(b"ABCDEF")  # same size, new content
    os.utime(home / BLOB, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with nczmap.open_map(url, "r") as zmap, pytest.raises(StorageError, match="changed since the manifest"):
        zmap.read("/v/0")


def test_chunks_too_large_to_inline_point_to_copy(home):
    with nczmap.open_map((home / "refs.json").as_uri() + "#mode=nczarr,manifest", "w") as zmap:
        with pytest.raises(nczmap.errors.DataError, match="nczmap copy"):
            zmap.write("/v/0", bytes(1 << 20))
        zmap.write("/v/.zarray", b"{}" + b" " * (1 << 20))  # metadata is always inline


# ---------------------------------------------------------------------------------------------- reading data
@pytest.mark.parametrize("order", ["sequential", "shuffled", "with-gaps"])
def test_a_variable_of_many_references_reads_exactly(tmp_path, order):
    """1,000 chunks of one array, references in any order into one file, through the format layer."""
    source = tmp_path / "store.file"
    values = np.arange(1000 * 16, dtype="<f8").reshape(1000, 16)
    with nczmap.create_dataset(str(source)) as ds:
        ds.create_dimension("t", 1000)
        ds.create_dimension("x", 16)
        ds.create_variable("v", ("t", "x"), "f8", chunks=(1, 16), fill_value=None)
    rng = random.Random(7)
    names = [f"{i}.0" for i in range(1000)]
    if order == "shuffled":
        rng.shuffle(names)
    blob, refs = bytearray(), {}
    for name in names:
        if order == "with-gaps":
            blob += b"\xff" * rng.randrange(0, 200)
        data = values[int(name.split(".")[0])].tobytes()
        refs[f"v/{name}"] = [BLOB, len(blob), len(data)]
        blob += data
    (tmp_path / BLOB).write_bytes(bytes(blob))
    with nczmap.open_map(str(source), "r") as store:
        for key in store.objects():
            if key.rsplit("/", 1)[-1].startswith("."):
                refs[key[1:]] = store.read(key).decode()
    (tmp_path / "refs.json").write_text(json.dumps({"version": 1, "refs": refs}))
    url = (tmp_path / "refs.json").as_uri() + "#mode=nczarr,manifest"
    with nczmap.open_dataset(url) as ds:
        assert np.array_equal(ds.variables["v"][...], values)
        assert np.array_equal(ds.variables["v"][10:20, 3], values[10:20, 3])


def test_merging_groups_neighbours_within_the_gap():
    ranges = [(100, 10), (0, 10), (10, 10), (200, 5), (115, 5)]
    spans = merge_ranges(ranges, gap=0)
    assert [(s.start, s.end, sorted(s.members)) for s in spans] == [
        (0, 20, [1, 2]),
        (100, 110, [0]),
        (115, 120, [4]),
        (200, 205, [3]),
    ]
    spans = merge_ranges(ranges, gap=100)
    assert [(s.start, s.end) for s in spans] == [(0, 205)]


@pytest.mark.skipif(
    shutil.which("ncdump") is None, reason="netcdf-c's ncdump (Debian netcdf-bin) is not installed"
)
def test_ncdump_of_a_manifest_equals_real_ncdump_of_the_store_it_points_into(tmp_path):
    store = tmp_path / "obs.file"
    with nczmap.create_dataset(str(store), netcdf_version="4.9.0") as ds:
        ds.create_dimension("x", 6)
        v = ds.create_variable("v", ("x",), "i4", chunks=(2,), fill_value=-1)
        v.attrs["units"] = "m"
        v[:5] = [1, 2, 3, 4, 5]
    refs = {}
    with nczmap.open_map(str(store), "r") as zmap:
        for key in zmap.objects():
            name = key[1:]
            refs[name] = (
                zmap.read(key).decode() if name.rsplit("/", 1)[-1].startswith(".") else [f"obs.file/{name}"]
            )
    (tmp_path / "obs.json").write_text(json.dumps(refs))
    ours = subprocess.run(
        [
            sys.executable,
            "-m",
            "nczmap",
            "ncdump",
            (tmp_path / "obs.json").as_uri() + "#mode=nczarr,manifest",
        ],
        capture_output=True,
        check=True,
    ).stdout
    theirs = subprocess.run(
        ["ncdump", store.as_uri() + "#mode=nczarr,file"], capture_output=True, check=True
    ).stdout
    assert ours == theirs


def test_kerchunk_references_read_by_fsspec_and_ours_read_by_us(tmp_path):
    """nczmap writes kerchunk v1 that fsspec's ReferenceFileSystem reads, key for key."""
    fsspec = pytest.importorskip("fsspec")
    (tmp_path / "blob").write_bytes(b"0123456789abcdef")
    url = (tmp_path / "refs.json").as_uri() + "#mode=zarr,manifest"
    with nczmap.open_map(url, "w") as zmap:
        zmap.write("/.zgroup", b'{"zarr_format": 2}')
        zmap.write("/small", b"\x00\x01\xff")
        zmap.set_reference("/ranged", "blob", 4, 6)
        zmap.set_reference("/whole", str(tmp_path / "blob"))
    fs = fsspec.filesystem("reference", fo=str(tmp_path / "refs.json"))
    assert fs.cat_file(".zgroup") == b'{"zarr_format": 2}'
    assert fs.cat_file("small") == b"\x00\x01\xff"
    assert fs.cat_file("ranged") == b"456789"
    assert fs.cat_file("whole") == b"0123456789abcdef"


def test_overlapping_and_repeated_references_fill_every_buffer(tmp_path):
    (tmp_path / BLOB).write_bytes(bytes(range(256)) * 4)
    refs = {
        "a": [BLOB, 0, 100],
        "b": [BLOB, 50, 100],
        "c": [BLOB, 0, 100],
        "d": [BLOB, 1000, 24],
        "e": [BLOB],
    }
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    data = (tmp_path / BLOB).read_bytes()
    with nczmap.open_map((tmp_path / "refs.json").as_uri() + "#mode=zarr,manifest", "r") as zmap:
        buffers = {key: bytearray(len(data) if key == "e" else 100) for key in ("e", "a", "b", "c", "d", "x")}
        got = zmap.read_many_into([(f"/{key}", memoryview(buffer)) for key, buffer in buffers.items()])
    assert got == [len(data), 100, 100, 100, 24, None]
    assert bytes(buffers["a"]) == data[:100] and bytes(buffers["c"]) == data[:100]
    assert bytes(buffers["b"]) == data[50:150] and bytes(buffers["d"][:24]) == data[1000:]
    assert bytes(buffers["e"]) == data


def _virtual_copy_of_a_store(tmp_path):
    """A directory store, and a manifest referring to each of its chunk files whole."""
    store = tmp_path / "obs.file"
    with nczmap.create_dataset(str(store)) as ds:
        ds.create_dimension("t", 40)
        ds.create_variable("v", ("t",), "f4", chunks=(8,), fill_value=-1.0, data=np.arange(40) / 4)
        ds.variables["v"].attrs["units"] = "K"
    refs = {}
    with nczmap.open_map(str(store), "r") as zmap:
        for key in zmap.objects():
            name = key[1:]
            is_metadata = name.rsplit("/", 1)[-1].startswith(".")
            refs[name] = zmap.read(key).decode() if is_metadata else [str(store) + key]
    (tmp_path / "obs.json").write_text(json.dumps(refs))
    return store, (tmp_path / "obs.json").as_uri() + "#mode=nczarr,manifest"


def test_copy_materialises_a_manifest_into_a_real_store(tmp_path):
    from nczmap.integrations.copy import copy

    store, manifest = _virtual_copy_of_a_store(tmp_path)
    copy(manifest, str(tmp_path / "real.file"))
    with (
        nczmap.open_dataset(str(tmp_path / "real.file")) as real,
        nczmap.open_dataset(str(store)) as original,
    ):
        assert np.array_equal(real.variables["v"][...], original.variables["v"][...])
        assert real.variables["v"].attrs["units"] == "K"


def test_copy_between_manifests_copies_references_not_bytes(tmp_path):
    from nczmap.integrations.copy import copy

    store, manifest = _virtual_copy_of_a_store(tmp_path)
    target = (tmp_path / "again.json").as_uri() + "#mode=nczarr,manifest"
    copy(manifest, target)
    document = json.loads((tmp_path / "again.json").read_text())
    chunk_refs = {k: v for k, v in document["refs"].items() if not k.rsplit("/", 1)[-1].startswith(".")}
    assert chunk_refs and all(isinstance(v, list) and v[0].endswith(k) for k, v in chunk_refs.items())
    with nczmap.open_dataset(target) as again, nczmap.open_dataset(str(store)) as original:
        assert np.array_equal(again.variables["v"][...], original.variables["v"][...])
