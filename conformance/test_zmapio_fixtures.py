"""``nczmap dump`` against netcdf-c's zmapio outputs, and a replay of the ut_map / ut_mapapi unit tests.

netcdf-c's scripts compare with ``diff -wb``; :func:`squash` does the same (runs of blanks collapse, line
ends are stripped). ``run_ut_map.sh`` dumps with ``zmapio -t int -x objdump`` (``dumpmap`` in
``test_nczarr.sh``); ``run_ut_mapapi.sh`` uses plain ``zmapio``, whose default type is ``ubyte``.
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from _fixtures import FIXTURES

from nczmap import DatasetNotFound, open_map

DRIVERS = ["file", "zip"]

# The texts ut_map.c / ut_mapapi.c write (netcdf-c nczarr_test sources; spec §7.2).
METADATA1 = b'{\n"foo": 42,\n"bar": "apples",\n"baz": [1, 2, 3, 4]}'
METADATA2 = b'{\n"foo": 42,\n"bar": "apples",\n"baz": [1, 2, 3, 4],\n"extra": 137}'
METAARRAY1 = b'{\n"shape": [1,2,3],\n"dtype": "<1"}'
DATA1LEN = 25
DATA1 = struct.pack(f"<{DATA1LEN}i", *range(DATA1LEN))


def fixture(name: str) -> Path:
    path = FIXTURES / name
    if not FIXTURES.is_dir():
        pytest.skip(f"netcdf-c fixtures not found at {FIXTURES} (set NCZMAP_NETCDF_FIXTURES)")
    if not path.is_file():
        pytest.skip(f"fixture {name} is missing from {FIXTURES}")
    return path


def squash(data: bytes) -> list[bytes]:
    """Lines compared the way ``diff -b`` compares them."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [re.sub(rb"[ \t]+", b" ", line).rstrip() for line in lines]


def assert_same_as_fixture(produced: bytes, name: str) -> None:
    expected = fixture(name).read_bytes()
    assert squash(produced) == squash(expected), (
        f"output differs from {name} (diff -b):\n--- expected\n{expected.decode('utf-8', 'replace')}"
        f"\n--- produced\n{produced.decode('utf-8', 'replace')}"
    )


def run_cli(*args: str) -> bytes:
    proc = subprocess.run(
        [sys.executable, "-m", "nczmap", *args], capture_output=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"nczmap {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()}"
    return proc.stdout


def dump(url: str, type_name: str) -> bytes:
    return run_cli("dump", "-t", type_name, url)


def dataset_url(tmp_path: Path, driver: str, stem: str) -> tuple[str, Path]:
    path = tmp_path / f"{stem}.{driver}"
    return f"{path.as_uri()}#mode=nczarr,{driver}", path


# ------------------------------------------------------------------------- ref_oldkeys.zmap
@pytest.fixture
def oldkeys(tmp_path) -> dict[str, str]:
    source = fixture("ref_oldkeys.file.zip")
    archive = tmp_path / "ref_oldkeys.file.zip"
    archive.write_bytes(source.read_bytes())
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp_path / "unzipped")
    tree = tmp_path / "unzipped" / "ref_oldkeys.file"
    assert tree.is_dir(), "ref_oldkeys.file.zip did not unzip to ref_oldkeys.file/"
    return {
        "zip-url": f"{archive.as_uri()}#mode=nczarr,zip",
        "zip-path": str(archive),
        "file-url": f"{tree.as_uri()}#mode=nczarr,file",
        "file-path": str(tree),
    }


@pytest.mark.parametrize("form", ["zip-url", "zip-path", "file-url", "file-path"])
def test_oldkeys_dump_matches_zmapio(oldkeys, form):
    assert_same_as_fixture(dump(oldkeys[form], "int"), "ref_oldkeys.zmap")


# ------------------------------------------------------------------------- ut_map replay
def ut_map_create(url: str) -> None:
    with open_map(url, "w") as zmap:  # nczmap_truncate + nczmap_create
        zmap.write("/.zgroup", b"")


def ut_map_delete(url: str) -> None:
    zmap = open_map(url, "r+")
    zmap.close(delete=True)


def ut_map_write(url: str, key: str, data: bytes) -> None:
    with open_map(url, "r+") as zmap:
        zmap.write(key, data)


def ut_map_readkey(url: str, key: str) -> bytes:
    with open_map(url, "r") as zmap:
        length = zmap.len(key)
        content = zmap.read(key, 0, length)
    return key.encode() + b": |" + content + b"|\n"


def ut_map_readdata(url: str) -> bytes:
    chunklen = 4 * ((DATA1LEN + 2) // 3)
    total = 4 * DATA1LEN
    reads = [(i * chunklen, min((i + 1) * chunklen, total) - i * chunklen) for i in range(3)]
    assert reads == [(0, 36), (36, 36), (72, 28)]  # spec §7.2
    pieces = []
    with open_map(url, "r") as zmap:
        assert zmap.exists("/data1/0")
        for start, count in reads:
            piece = zmap.read("/data1/0", start, count)
            assert len(piece) == count, f"ranged read {start},{count} returned {len(piece)} bytes"
            pieces.append(piece)
    return b"".join(pieces)


def search_listing(url: str) -> bytes:
    """ut_map's ``search``: the prefix and every key below it, recursively, sorted bytewise."""
    found: list[str] = []
    with open_map(url, "r") as zmap:

        def recurse(prefix: str) -> None:
            found.append(prefix)
            for name in zmap.search(prefix):
                recurse(prefix.rstrip("/") + "/" + name)

        recurse("/")
    found.sort(key=lambda key: key.encode("utf-8"))
    return b"".join(f"[{i}] {key}\n".encode() for i, key in enumerate(found))


UT_MAP_STEPS = ("create", "writemeta", "writemeta2", "writedata")


def replay_ut_map(url: str, upto: str) -> None:
    """run_ut_map.sh's sequence of ``ut_map -x <cmd>`` invocations, up to and including ``upto``."""
    ut_map_create(url)
    if upto == "create":
        return
    ut_map_write(url, "/meta1/.zarray", METADATA1)
    if upto == "writemeta":
        return
    ut_map_write(url, "/meta2/.zarray", METADATA2)
    if upto == "writemeta2":
        return
    ut_map_write(url, "/data1/0", DATA1)
    assert upto == "writedata"


def test_ut_texts_have_the_sizes_netcdf_c_prints():
    # ref_ut_map_writemeta2.cdl prints (50) and (64); ref_ut_mapapi_meta.cdl prints (34)
    assert (len(METADATA1), len(METADATA2), len(METAARRAY1), len(DATA1)) == (50, 64, 34, 100)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("step", "reference"),
    [
        ("create", "ref_ut_map_create.cdl"),
        ("writemeta", "ref_ut_map_writemeta.cdl"),
        ("writemeta2", "ref_ut_map_writemeta2.cdl"),
        ("writedata", "ref_ut_map_writedata.cdl"),
    ],
)
def test_ut_map_dump(driver, step, reference, tmp_path):
    fixture(reference)
    url, _ = dataset_url(tmp_path, driver, "testmap")
    replay_ut_map(url, step)
    assert_same_as_fixture(dump(url, "int"), reference)


@pytest.mark.parametrize("driver", DRIVERS)
def test_ut_map_create_writes_zero_byte_object(driver, tmp_path):
    url, _ = dataset_url(tmp_path, driver, "testmap")
    ut_map_create(url)
    with open_map(url, "r") as zmap:
        assert zmap.exists("/.zgroup")  # a 0-byte object is content-bearing (spec §1.1)
        assert zmap.len("/.zgroup") == 0
        assert zmap.read("/.zgroup") == b""


@pytest.mark.parametrize("driver", DRIVERS)
def test_ut_map_delete(driver, tmp_path):
    url, path = dataset_url(tmp_path, driver, "testmap")
    ut_map_create(url)
    assert path.exists()
    ut_map_delete(url)
    assert not path.exists(), f"delete did not delete {path}"  # run_ut_map.sh: test -f $output
    with pytest.raises(DatasetNotFound):
        open_map(url, "r")
    ut_map_create(url)  # run_ut_map.sh re-creates the test file
    assert_same_as_fixture(dump(url, "int"), "ref_ut_map_create.cdl")


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("key", "reference"),
    [("/meta1/.zarray", "ref_ut_map_readmeta.txt"), ("/meta2/.zarray", "ref_ut_map_readmeta2.txt")],
)
def test_ut_map_readmeta(driver, key, reference, tmp_path):
    fixture(reference)
    url, _ = dataset_url(tmp_path, driver, "testmap")
    replay_ut_map(url, "writemeta2")
    assert_same_as_fixture(ut_map_readkey(url, key), reference)


@pytest.mark.parametrize("driver", DRIVERS)
def test_ut_map_readdata(driver, tmp_path):
    url, _ = dataset_url(tmp_path, driver, "testmap")
    replay_ut_map(url, "writedata")
    data = ut_map_readdata(url)
    assert list(struct.unpack(f"<{DATA1LEN}i", data)) == list(range(DATA1LEN))


@pytest.mark.parametrize("driver", DRIVERS)
def test_ut_map_search(driver, tmp_path):
    fixture("ref_ut_map_search.txt")
    url, _ = dataset_url(tmp_path, driver, "testmap")
    replay_ut_map(url, "writedata")
    assert_same_as_fixture(search_listing(url), "ref_ut_map_search.txt")


def test_ut_map_zip_layout_is_netcdf_c_layout(tmp_path):
    """Spec §1.6: one folder named after the archive, entry 0 is that folder, explicit directory entries
    for every intermediate key, objects stored uncompressed."""
    url, path = dataset_url(tmp_path, "zip", "testmap")
    replay_ut_map(url, "writedata")
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        names = [info.filename for info in infos]
        assert names[0] == "testmap/"
        assert set(names) == {
            "testmap/",
            "testmap/.zgroup",
            "testmap/meta1/",
            "testmap/meta1/.zarray",
            "testmap/meta2/",
            "testmap/meta2/.zarray",
            "testmap/data1/",
            "testmap/data1/0",
        }
        assert len(names) == len(set(names)), f"duplicate entries: {names}"
        for info in infos:
            if not info.is_dir():
                assert info.compress_type == zipfile.ZIP_STORED, info.filename
        assert archive.read("testmap/meta2/.zarray") == METADATA2
        assert archive.read("testmap/data1/0") == DATA1
        assert archive.testzip() is None


# ------------------------------------------------------------------------- ut_mapapi replay
def mapapi_create(url: str) -> None:
    with open_map(url, "w") as zmap:
        zmap.write("/.zgroup", b"")  # nczmap_defineobj
    with open_map(url, "r") as zmap:
        assert zmap.exists("/.zgroup")


def mapapi_simplemeta(url: str) -> None:
    with open_map(url, "r+") as zmap:
        zmap.write("/.zgroup", b"")  # defineobj
        zmap.write("/meta1/.zarray", b"")  # defineobj
        zmap.write("/.zgroup", METADATA1)
        zmap.write("/meta1/.zarray", METAARRAY1)
    with open_map(url, "r") as zmap:
        for key, text in (("/.zgroup", METADATA1), ("/meta1/.zarray", METAARRAY1)):
            assert zmap.exists(key)
            assert zmap.len(key) == len(text)
            assert zmap.read(key, 0, len(text)) == text


def mapapi_simpledata(url: str) -> None:
    third = (len(DATA1) + 2) // 3
    slices = [DATA1[i * third : min((i + 1) * third, len(DATA1))] for i in range(3)]
    with open_map(url, "r+") as zmap:
        zmap.write("/data1", b"")  # defineobj
        # ut_mapapi writes 3 slices at offsets; nczmap writes whole objects, so write their concatenation
        zmap.write("/data1", b"".join(slices))
    with open_map(url, "r") as zmap:
        assert zmap.exists("/data1")
        assert zmap.len("/data1") == len(DATA1)
        assert zmap.read("/data1", 0, len(DATA1)) == DATA1


def replay_ut_mapapi(url: str, upto: str) -> None:
    mapapi_create(url)
    if upto == "create":
        return
    mapapi_simplemeta(url)
    if upto == "meta":
        return
    mapapi_simpledata(url)
    assert upto == "data"


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("step", "reference"),
    [
        ("create", "ref_ut_mapapi_create.cdl"),
        ("meta", "ref_ut_mapapi_meta.cdl"),
        ("data", "ref_ut_mapapi_data.cdl"),
    ],
)
def test_ut_mapapi_dump(driver, step, reference, tmp_path):
    fixture(reference)
    url, _ = dataset_url(tmp_path, driver, "testmapapi")
    replay_ut_mapapi(url, step)
    assert_same_as_fixture(dump(url, "ubyte"), reference)  # zmapio's default type


@pytest.mark.parametrize("driver", DRIVERS)
def test_ut_mapapi_search(driver, tmp_path):
    fixture("ref_ut_mapapi_search.txt")
    url, _ = dataset_url(tmp_path, driver, "testmapapi")
    replay_ut_mapapi(url, "data")
    assert_same_as_fixture(search_listing(url), "ref_ut_mapapi_search.txt")


@pytest.mark.parametrize("driver", DRIVERS)
def test_ut_mapapi_reopen_after_delete_fails(driver, tmp_path):
    url, path = dataset_url(tmp_path, driver, "testmapapi")
    replay_ut_mapapi(url, "create")
    zmap = open_map(url, "r+")
    zmap.close(delete=True)
    assert not path.exists()
    for mode in ("r", "r+"):
        with pytest.raises(DatasetNotFound):
            open_map(url, mode)
    replay_ut_mapapi(url, "create")  # run_ut_mapapi.sh re-creates it
    assert_same_as_fixture(dump(url, "ubyte"), "ref_ut_mapapi_create.cdl")
