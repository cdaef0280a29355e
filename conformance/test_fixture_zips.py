"""The zip driver against netcdf-c's zip fixtures (spec §1.6, §8).

Every ``*.zip`` fixture (and the zips inside ``ref_notzarr.tar.gz``) is read three ways and the three must
agree: nczmap's zip driver on the archive, nczmap's file driver on the tree that stdlib ``zipfile`` extracts,
and an oracle built here from ``ZipFile.namelist()``/``ZipFile.read()`` with netcdf-c's layout rule (the
dataset is the folder named by the first segment of entry 0; entries outside it are ignored).
"""

from __future__ import annotations

import json
import shutil
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from _fixtures import FIXTURES

from nczmap import EmptyError, open_map

NAMED_ZIPS = (
    "ref_oldkeys.file.zip",
    "ref_oldformat.zip",
    "ref_byte.zarr.zip",
    "ref_byte_fill_value_null.zarr.zip",
    "ref_noshape.file.zip",
    "ref_power_901_constants_orig.zip",
    "ref_quotes_orig.zip",
)
NOTZARR_TAR = "ref_notzarr.tar.gz"
NOTZARR_ZIPS = ("empty.zip", "notzarr.zip")


def _zip_case_ids() -> list[str]:
    found = sorted(p.name for p in FIXTURES.glob("*.zip")) if FIXTURES.is_dir() else []
    cases = sorted(set(NAMED_ZIPS) | set(found))
    inner = set(NOTZARR_ZIPS)
    tar_path = FIXTURES / NOTZARR_TAR
    if tar_path.is_file():
        with tarfile.open(tar_path) as tar:
            inner |= {Path(m.name).name for m in tar.getmembers() if m.isfile() and m.name.endswith(".zip")}
    cases += [f"{NOTZARR_TAR}:{name}" for name in sorted(inner)]
    return cases


ZIP_CASES = _zip_case_ids()


def materialize(case: str, tmp_path: Path) -> Path:
    """A private copy of the fixture zip in ``tmp_path`` (the shared fixtures stay untouched)."""
    if not FIXTURES.is_dir():
        pytest.skip(f"netcdf-c fixtures not found at {FIXTURES} (set NCZMAP_NETCDF_FIXTURES)")
    work = tmp_path / "archive"
    work.mkdir()
    if ":" in case:
        tar_name, inner = case.split(":", 1)
        tar_path = FIXTURES / tar_name
        if not tar_path.is_file():
            pytest.skip(f"fixture {tar_path} is missing")
        with tarfile.open(tar_path) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and Path(m.name).name == inner]
            if not members:
                pytest.skip(f"{inner} is not inside {tar_path}")
            source = tar.extractfile(members[0])
            target = work / inner
            with source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
        return target
    source = FIXTURES / case
    if not source.is_file():
        pytest.skip(f"fixture {source} is missing")
    target = work / case
    shutil.copyfile(source, target)
    return target


# ------------------------------------------------------------------------- the zipfile oracle
def _segments(key: str) -> tuple[bytes, ...]:
    return tuple(s.encode("utf-8") for s in key[1:].split("/"))


@dataclass
class Oracle:
    """What the dataset holds according to stdlib zipfile and netcdf-c's entry-0 rule."""

    top: str  # dataset folder ("" for an archive without entries)
    objects: dict[str, zipfile.ZipInfo]  # key -> entry
    keys: list[str]  # every key (objects and directories), pre-order = sort by byte segments

    def children(self, prefix: str) -> list[str]:
        want = () if prefix == "/" else _segments(prefix)
        names = set()
        for key in self.keys:
            parts = _segments(key)
            if len(parts) > len(want) and parts[: len(want)] == want:
                names.add(parts[len(want)])
        return [n.decode("utf-8") for n in sorted(names)]


def build_oracle(archive: zipfile.ZipFile) -> Oracle:
    names = archive.namelist()
    if not names:
        return Oracle("", {}, [])
    top = names[0].split("/", 1)[0]
    folder = top + "/"
    objects: dict[str, zipfile.ZipInfo] = {}
    keys: set[str] = set()
    for info in archive.infolist():
        if not info.filename.startswith(folder) or info.filename == folder:
            continue  # outside the dataset folder: netcdf-c ignores it
        relative = info.filename[len(folder) :]
        is_dir = relative.endswith("/")
        key = "/" + relative.rstrip("/")
        if not is_dir:
            objects[key] = info
        parts = key[1:].split("/")
        for i in range(1, len(parts) + 1):
            keys.add("/" + "/".join(parts[:i]))
    return Oracle(top, objects, sorted(keys, key=_segments))


@dataclass
class Opened:
    zip_path: Path
    tree: Path  # the extracted dataset folder
    oracle: Oracle
    contents: dict[str, bytes]  # key -> zipfile.read() of the entry


def prepare(case: str, tmp_path: Path) -> Opened:
    zip_path = materialize(case, tmp_path)
    extracted = tmp_path / "extracted"
    extracted.mkdir()
    with zipfile.ZipFile(zip_path) as archive:
        oracle = build_oracle(archive)
        contents = {key: archive.read(info) for key, info in oracle.objects.items()}
        archive.extractall(extracted)
    tree = extracted / oracle.top
    tree.mkdir(exist_ok=True)  # an archive without entries extracts to nothing
    return Opened(zip_path, tree, oracle, contents)


def ranges(length: int) -> list[tuple[int, int | None]]:
    candidates = [
        (0, None),
        (0, 0),
        (0, 1),
        (0, length),
        (1, None),
        (1, 3),
        (length // 3, length // 3 + 1),
        (length // 2, None),
        (max(length - 1, 0), 1),
        (max(length - 1, 0), 10),
        (length, None),
        (length, 1),
        (length + 7, 3),
    ]
    return list(dict.fromkeys(candidates))


def expected_slice(data: bytes, start: int, count: int | None) -> bytes:
    return data[start:] if count is None else data[start : start + count]


# ------------------------------------------------------------------------- tests
@pytest.mark.parametrize("case", ZIP_CASES)
def test_walk_keys_agree_with_zipfile_namelist(case, tmp_path):
    opened = prepare(case, tmp_path)
    with open_map(str(opened.zip_path), "r") as zmap, open_map(str(opened.tree), "r") as fmap:
        zip_keys = list(zmap.walk())
        file_keys = list(fmap.walk())
    top = opened.oracle.top
    assert zip_keys == opened.oracle.keys, f"zip driver keys differ from zipfile's namelist under {top}/"
    assert file_keys == opened.oracle.keys, "file driver keys on the extracted tree differ from the namelist"


@pytest.mark.parametrize("case", ZIP_CASES)
def test_search_agrees_for_every_key(case, tmp_path):
    opened = prepare(case, tmp_path)
    with open_map(str(opened.zip_path), "r") as zmap, open_map(str(opened.tree), "r") as fmap:
        for prefix in ["/", *opened.oracle.keys]:
            expected = opened.oracle.children(prefix)
            assert zmap.search(prefix) == expected, f"zip search({prefix!r})"
            assert fmap.search(prefix) == expected, f"file search({prefix!r})"


@pytest.mark.parametrize("case", ZIP_CASES)
def test_objects_and_bytes_agree(case, tmp_path):
    opened = prepare(case, tmp_path)
    with open_map(str(opened.zip_path), "r") as zmap, open_map(str(opened.tree), "r") as fmap:
        assert list(zmap.objects()) == [k for k in opened.oracle.keys if k in opened.oracle.objects]
        assert list(fmap.objects()) == list(zmap.objects())
        for key in opened.oracle.keys:
            if key in opened.oracle.objects:
                data = opened.contents[key]
                assert zmap.exists(key) and fmap.exists(key), key
                size = opened.oracle.objects[key].file_size
                assert zmap.len(key) == fmap.len(key) == size == len(data), key
                assert zmap.read(key) == data, f"zip driver bytes of {key}"
                assert fmap.read(key) == data, f"file driver bytes of {key}"
            else:  # a directory: no content on either driver
                assert not zmap.exists(key) and not fmap.exists(key), key
                for zm in (zmap, fmap):
                    with pytest.raises(EmptyError):
                        zm.len(key)
                    with pytest.raises(EmptyError):
                        zm.read(key)


@pytest.mark.parametrize("case", ZIP_CASES)
def test_ranged_reads_match_zipfile_slices(case, tmp_path):
    opened = prepare(case, tmp_path)
    with open_map(str(opened.zip_path), "r") as zmap, open_map(str(opened.tree), "r") as fmap:
        for key, data in opened.contents.items():
            for start, count in ranges(len(data)):
                want = expected_slice(data, start, count)
                assert zmap.read(key, start, count) == want, f"zip read({key!r}, {start}, {count})"
                assert fmap.read(key, start, count) == want, f"file read({key!r}, {start}, {count})"


def test_fixture_set_is_complete():
    if not FIXTURES.is_dir():
        pytest.skip(f"netcdf-c fixtures not found at {FIXTURES} (set NCZMAP_NETCDF_FIXTURES)")
    missing = [name for name in (*NAMED_ZIPS, NOTZARR_TAR) if not (FIXTURES / name).is_file()]
    assert not missing, f"expected netcdf-c zip fixtures are missing: {missing}"


# ------------------------------------------------------------------------- spec §7.1/§8 expectations
def _named(names: list[str]) -> set[str]:
    """Children that are groups, arrays or chunks (not Zarr metadata objects)."""
    return {n for n in names if not n.startswith(".")}


def check_oldkeys(zmap):
    # §7.1: the zmapio key walk of ref_oldkeys.file.zip
    assert list(zmap.walk()) == ["/.zattrs", "/.zgroup", "/v", "/v/.zarray", "/v/.zattrs", "/v/0.0.0"]
    assert zmap.search("/") == [".zattrs", ".zgroup", "v"]
    assert zmap.len("/v/0.0.0") == 48 * 4  # v(2,4,6) int, one chunk


def check_oldformat(zmap):
    # §8: root array lat, group g1 holding pos
    assert _named(zmap.search("/")) == {"g1", "lat"}
    assert _named(zmap.search("/g1")) == {"pos"}
    assert ".zgroup" in zmap.search("/g1")
    assert {".zarray", ".zattrs"} <= set(zmap.search("/g1/pos"))


def check_noshape(zmap):
    # §8: v with a 24-byte chunk 0
    assert _named(zmap.search("/")) == {"v"}
    assert _named(zmap.search("/v")) == {"0"}
    assert zmap.len("/v/0") == 24
    assert json.loads(zmap.read("/v/.zarray"))["shape"] == []


def check_byte(zmap):
    # §8: array `byte`, no chunks, .zattrs {}
    assert _named(zmap.search("/")) == {"byte"}
    assert zmap.search("/byte") == [".zarray", ".zattrs"]
    assert json.loads(zmap.read("/byte/.zattrs")) == {}


def check_byte_fill_value_null(zmap):
    # §8: byt, chunk 0.0 = 400 x 0xFF, root .zattrs, junk byt/.zattrs.~1~ is an ordinary key at this level
    assert zmap.search("/") == [".zattrs", ".zgroup", "byt"]
    assert zmap.search("/byt") == [".zarray", ".zattrs", ".zattrs.~1~", "0.0"]
    assert zmap.exists("/byt/.zattrs.~1~")
    assert zmap.read("/byt/0.0") == b"\xff" * 400
    assert "_NCProperties" in json.loads(zmap.read("/.zattrs"))


def check_power(zmap):
    # §8: 4 float arrays, no chunks; the stray top-level .zgroup is outside the dataset
    assert zmap.search("/") == [".zgroup", "FRLAKE", "FRLAND", "FRLANDICE", "FROCEAN"]
    for name in ("FRLAKE", "FRLAND", "FRLANDICE", "FROCEAN"):
        assert zmap.search(f"/{name}") == [".zarray", ".zattrs"]


def check_quotes(zmap):
    # ref_quotes.cdl: a single variable fractional_snow_cover
    assert _named(zmap.search("/")) == {"fractional_snow_cover"}
    assert ".zgroup" in zmap.search("/")


def check_notzarr(zmap):
    # §8: notzarr.zip holds notzarr/notzarr.txt
    assert zmap.search("/") == ["notzarr.txt"]
    assert list(zmap.objects()) == ["/notzarr.txt"]


def check_empty(zmap):
    # §8: empty.zip holds only the folder entry empty/
    assert zmap.search("/") == []
    assert list(zmap.walk()) == []


SPEC_CHECKS = {
    "ref_oldkeys.file.zip": check_oldkeys,
    "ref_oldformat.zip": check_oldformat,
    "ref_noshape.file.zip": check_noshape,
    "ref_byte.zarr.zip": check_byte,
    "ref_byte_fill_value_null.zarr.zip": check_byte_fill_value_null,
    "ref_power_901_constants_orig.zip": check_power,
    "ref_quotes_orig.zip": check_quotes,
    f"{NOTZARR_TAR}:notzarr.zip": check_notzarr,
    f"{NOTZARR_TAR}:empty.zip": check_empty,
}


@pytest.mark.parametrize("driver", ["zip", "file"])
@pytest.mark.parametrize("case", sorted(SPEC_CHECKS))
def test_spec_listed_structure(case, driver, tmp_path):
    opened = prepare(case, tmp_path)
    if driver == "zip":
        url = opened.zip_path.as_uri() + "#mode=nczarr,zip"
    else:
        url = opened.tree.as_uri() + "#mode=nczarr,file"
    with open_map(url, "r") as zmap:
        SPEC_CHECKS[case](zmap)


# ------------------------------------------------------------------------- entries outside the folder
def _rewrite_zip(source: Path, target: Path, replace: dict[str, bytes], extra: list[tuple[str, bytes]]):
    """Copy ``source`` entry by entry (same order), replacing some contents and appending entries."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as out:
        for info in src.infolist():
            out.writestr(info, replace.get(info.filename, src.read(info)))
        for name, data in extra:
            out.writestr(name, data)


def test_stray_entries_outside_dataset_folder_are_ignored(tmp_path):
    """ref_power's stray top-level ``.zgroup`` has the same bytes as the folder's; make it differ so that
    reading the wrong one would be visible, and add more stray top-level files."""
    source = materialize("ref_power_901_constants_orig.zip", tmp_path)
    variant = tmp_path / "variant.zip"
    _rewrite_zip(source, variant, {".zgroup": b'{"stray": true}'}, [("junk.txt", b"junk"), ("FRLAKE", b"x")])
    with zipfile.ZipFile(variant) as archive:
        oracle = build_oracle(archive)
        inner = archive.read("ref_power_901_constants/.zgroup")
    assert inner != b'{"stray": true}'
    with open_map(str(variant), "r") as zmap:
        assert list(zmap.walk()) == oracle.keys
        assert zmap.read("/.zgroup") == inner
        assert "junk.txt" not in zmap.search("/")


def test_extra_top_level_folder_is_ignored(tmp_path):
    source = materialize("ref_oldkeys.file.zip", tmp_path)
    variant = tmp_path / "finder.zip"
    _rewrite_zip(source, variant, {}, [("__MACOSX/ref_oldkeys.file/._.zgroup", b"\x00\x05\x16\x07")])
    with zipfile.ZipFile(variant) as archive:
        oracle = build_oracle(archive)
    assert oracle.top == "ref_oldkeys.file"
    with open_map(str(variant), "r") as zmap:
        assert list(zmap.walk()) == oracle.keys
