"""``nczmap ncdump`` against real netcdf-c ``ncdump``: byte-identical CDL.

Expected output always comes from a real program or from netcdf-c's own fixtures, never from nczmap:

(a) D1 stores written by Debian's ``ncgen`` 4.9.0 from ``cdl/*.cdl``: our CDL equals ``ncdump`` 4.9.0 of the
    same URL, plain, ``-h``, ``-s`` (nothing removed: both read the same ``_NCProperties`` text from the
    store and both report ``_SuperblockVersion = 2``) and with ``-v``.
(b) The netCDF-4/HDF5 oracle: ``ncgen -4 -o x.nc`` then ``ncdump x.nc``; our CDL of the D1 store equals it
    where netcdf-c's NCZarr representation is faithful. Each unfaithful case names its reason and the
    lines it affects; every other line must still match.
(c) D3 stores written by libnetcdf 4.10.1 (netCDF4-python) by copying ``x.nc``: our CDL equals ``ncdump
    x.nc`` the same way (4.9.0 cannot read D3, so the HDF5 dump is the reference). Their ``-s`` virtual
    attributes are checked against what libnetcdf 4.10.1 itself reports (``ctypes``), formatted by the
    rules of ncdump's ``pr_att_specials``.
Plus netcdf-c's fixtures (``ref_*.zip`` against ``ref_*.cdl``, whitespace-insensitive like ``diff -wb``).
"""

from __future__ import annotations

import ctypes
import functools
import io
import json
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from _fixtures import FIXTURES, needs_fixtures

from nczmap.api import open_dataset
from nczmap.cdl import NoSuchVariable, dump_cdl

NCGEN = shutil.which("ncgen")
NCDUMP = shutil.which("ncdump")
CDL_DIR = Path(__file__).resolve().parent / "cdl"
TIMEOUT = 60


# ------------------------------------------------------------------------------------------ the corpus
@dataclass(frozen=True)
class Case:
    """One ``cdl/<name>.cdl`` and what is known about netcdf-c's handling of it."""

    name: str
    d1: bool = True  # Debian ncgen 4.9.0 can write it as NCZarr (no strings, scalars, unlimited dims)
    d1_data: bool = True  # and writes its data correctly
    # reason -> regex of the CDL lines that legitimately differ from the HDF5 dump, for the D1 store (b)
    # and for the D3 store (c)
    unfaithful: dict[str, str] = field(default_factory=dict)
    unfaithful_d3: dict[str, str] = field(default_factory=dict)
    d3: bool = True  # netCDF4-python can copy it into a D3 store


LOSSY_ATTRIBUTES = (
    "netcdf-c's NCZarr writer stores float/double attributes with %lg (6 significant digits), and the "
    "never-written double reads back 9.96921e+36 (the lossy default fill), which is not NC_FILL_DOUBLE"
)
NOFILL_GARBAGE = "HDF5 returns uninitialised bytes for never-written data of a no-fill variable; NCZarr zeros"
FOREIGN_DIM = (
    "ncdump 4.9.x printed a dimension of a non-ancestor group as '/w' (searchgroupdim's NC_EBADDIM bug, "
    "fixed in 4.10.0); nczmap prints what ncdump 4.10 prints: '/g3/w'"
)
JSON_CONVENTION = (
    "libnetcdf 4.10.1's JSON convention rewrites a char attribute that its lenient parser accepts as JSON: "
    "'°C' (non-ASCII bytes skipped like blanks, then the bare word C) is stored as \"C\""
)

EMPTY_IS_NULL = (
    "netcdf-c's NCZarr reads an empty string back as NULL (NCZ_fixed2char), which ncdump prints NIL; the "
    'HDF5 file holds "", printed _ where it equals the fill value and "" where it does not'
)

CASES = [
    Case("types"),
    Case("precision"),
    Case("precision_atts", unfaithful={LOSSY_ATTRIBUTES: r"^\t\t\w*:(pi|small|third|big|e) = | d = "}),
    Case("fills"),
    Case("nofill", unfaithful={NOFILL_GARBAGE: r"^ ff = "}),
    Case("groups"),
    # netCDF4-python cannot even open a file whose variable uses a dimension of a non-ancestor group
    Case("foreign_dim", unfaithful={FOREIGN_DIM: r"^  \tint e\("}, d3=False),
    Case("chars"),
    Case("control_chars"),
    Case("wrap"),
    Case("names", unfaithful_d3={JSON_CONVENTION: r"^\t\tgröße:unité = "}),
    Case("bigendian", d1_data=False),
    Case("strings", d1=False),
    Case("empty_strings", d1=False, unfaithful_d3={EMPTY_IS_NULL: r"^ (names|filled|unwritten) = "}),
    Case("scalars", d1=False),
    Case("unlimited", d1=False),
    Case("compressed", d1=False),
]
BY_NAME = {case.name: case for case in CASES}
D1_CASES = [case for case in CASES if case.d1]


def test_corpus_is_complete() -> None:
    assert sorted(p.stem for p in CDL_DIR.glob("*.cdl")) == sorted(BY_NAME)


# --------------------------------------------------------------------------------------- running tools
def run(*args: str | None) -> bytes:
    if args[0] is None:
        pytest.skip("netcdf-c ncgen/ncdump not on PATH")
    done = subprocess.run(args, capture_output=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, f"{args} failed: {done.stderr.decode(errors='replace')}"
    return done.stdout


def real_ncdump(target: str | Path, *flags: str) -> bytes:
    return run(NCDUMP, *flags, str(target))


def ours(url: str, **options) -> bytes:
    buffer = io.BytesIO()
    with open_dataset(url) as dataset:
        dump_cdl(dataset, buffer, **options)
    return buffer.getvalue()


def nczarr_url(path: Path, mode: str = "nczarr") -> str:
    return f"file://{path}#mode={mode},file"


class Store:
    """The files made from one CDL, each made when first needed: the HDF5 oracle, the D1 store (ncgen
    4.9.0) and the D3 store (libnetcdf 4.10.1 through netCDF4-python, copied from the HDF5 file)."""

    def __init__(self, root: Path, case: Case) -> None:
        self.case = case
        self.cdl = CDL_DIR / f"{case.name}.cdl"
        self.folder = root / case.name

    def _made(self, name: str) -> Path:
        path = self.folder / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @functools.cached_property
    def hdf5(self) -> Path:
        path = self._made("hdf5") / f"{self.case.name}.nc"
        run(NCGEN, "-4", "-o", str(path), str(self.cdl))
        return path

    @functools.cached_property
    def d1(self) -> str:
        assert self.case.d1
        url = nczarr_url(self._made("d1") / f"{self.case.name}.file")
        run(NCGEN, "-4", "-lb", "-o", url, str(self.cdl))
        return url

    @functools.cached_property
    def d3(self) -> str:
        assert self.case.d3
        url = nczarr_url(self._made("d3") / f"{self.case.name}.file")
        copy_to_nczarr(self.hdf5, url)
        return url


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Store]:
    root = tmp_path_factory.mktemp("ncdump")
    return {case.name: Store(root, case) for case in CASES}


def assert_same(actual: bytes, expected: bytes) -> None:
    if actual != expected:
        a, e = actual.decode(errors="replace").splitlines(), expected.decode(errors="replace").splitlines()
        first = next((i for i, (x, y) in enumerate(zip(a, e, strict=False)) if x != y), min(len(a), len(e)))
        pytest.fail(
            f"line {first + 1} differs:\n  ours: {a[first : first + 3]!r}\n  real: {e[first : first + 3]!r}"
        )


def without(text: bytes, patterns: dict[str, str]) -> bytes:
    lines = text.decode("utf-8", "surrogateescape").splitlines(keepends=True)
    kept = [line for line in lines if not any(re.search(p, line) for p in patterns.values())]
    return "".join(kept).encode("utf-8", "surrogateescape")


# ------------------------------------------------------------------------------------ (a) D1 vs ncdump
FLAG_SETS = {"plain": (), "header": ("-h",), "special": ("-s",), "special-header": ("-s", "-h")}
OPTIONS = {
    "plain": {},
    "header": {"header_only": True},
    "special": {"special": True},
    "special-header": {"special": True, "header_only": True},
}


def d1_params():
    for case in D1_CASES:
        for flags in FLAG_SETS:
            if not case.d1_data and "header" not in flags:
                continue  # 4.9.0 wrote little-endian bytes into big-endian arrays (checked with -h only)
            yield pytest.param(case.name, flags, id=f"{case.name}-{flags}")


@pytest.mark.parametrize(("name", "flags"), list(d1_params()))
def test_d1_store_matches_real_ncdump(stores, name: str, flags: str) -> None:
    store = stores[name]
    expected = real_ncdump(store.d1, *FLAG_SETS[flags])
    if name == "foreign_dim":  # the one line where ncdump 4.9 and 4.10 differ (see FOREIGN_DIM)
        expected = expected.replace(b"int e(/w, x)", b"int e(/g3/w, x)")
    assert_same(ours(store.d1, **OPTIONS[flags]), expected)


VARIABLE_LISTS = [
    ("groups", "rv"),
    ("groups", "a,g2/c,/g1/g2/g3/h"),
    ("groups", "g1/g2/d,sib/t,e"),
    ("groups", "f,s"),
    ("types", "i64,u64,c"),
    ("wrap", "grid"),
    ("names", "a b:c,data"),
]


@pytest.mark.parametrize(("name", "variables"), VARIABLE_LISTS)
def test_d1_variable_selection_matches_real_ncdump(stores, name: str, variables: str) -> None:
    store = stores[name]
    expected = real_ncdump(store.d1, "-v", variables)
    assert_same(ours(store.d1, variables=variables.split(",")), expected)


def test_root_variable_by_absolute_name_is_missing_like_ncdump(stores) -> None:
    """``ncdump -v /rv`` fails: nc_inq_gvarid compares the root's name "/" with "" (the text before "/rv")."""
    store = stores["groups"]
    if NCDUMP is None:
        pytest.skip("netcdf-c ncdump not on PATH")
    done = subprocess.run([NCDUMP, "-v", "/rv", store.d1], capture_output=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 1 and b"/rv: No such variable" in done.stderr
    with pytest.raises(NoSuchVariable, match="/rv: No such variable"):
        ours(store.d1, variables=["/rv"])


def test_rename_matches_real_ncdump(stores) -> None:
    store = stores["types"]
    assert_same(
        ours(store.d1, name="other name", header_only=True), real_ncdump(store.d1, "-h", "-n", "other name")
    )


# -------------------------------------------------------------------------------------- (b) D1 vs HDF5
@pytest.mark.parametrize("name", [c.name for c in D1_CASES if c.d1_data])
def test_d1_store_matches_hdf5_oracle(stores, name: str) -> None:
    store = stores[name]
    case = store.case
    expected = real_ncdump(store.hdf5, "-n", name)
    actual = ours(store.d1, name=name)
    if case.unfaithful:
        assert actual != expected, "the documented difference has disappeared"
        actual, expected = without(actual, case.unfaithful), without(expected, case.unfaithful)
    assert_same(actual, expected)


def test_d1_big_endian_header_matches_hdf5_oracle(stores) -> None:
    store = stores["bigendian"]
    assert_same(ours(store.d1, header_only=True), real_ncdump(store.hdf5, "-h"))


# -------------------------------------------------------------------------------------- (c) D3 vs HDF5
def d3_params():
    for case in (c for c in CASES if c.d3):
        for flags in ("plain", "header"):
            yield pytest.param(case.name, flags, id=f"{case.name}-{flags}")


@pytest.mark.parametrize(("name", "flags"), list(d3_params()))
def test_d3_store_matches_hdf5_oracle(stores, name: str, flags: str) -> None:
    store = stores[name]
    expected = real_ncdump(store.hdf5, *FLAG_SETS[flags])
    actual = ours(store.d3, **OPTIONS[flags])
    unfaithful = {**store.case.unfaithful, **store.case.unfaithful_d3}
    if unfaithful and actual != expected:
        actual, expected = without(actual, unfaithful), without(expected, unfaithful)
    assert_same(actual, expected)


@pytest.mark.parametrize("name", [c.name for c in CASES if c.d3 and c.name not in ("names", "control_chars")])
def test_d3_special_attributes_match_libnetcdf(stores, name: str) -> None:
    store = stores[name]
    assert special_lines(ours(store.d3, special=True, header_only=True)) == libnetcdf_specials(store.d3)


CODEC_CHAINS = {
    "deflate": ([{"id": "shuffle", "elementsize": 4}], {"id": "zlib", "level": 5}),
    "bzip2": ([], {"id": "bz2", "level": 9}),
    "blosc": ([], {"id": "blosc", "clevel": 5, "blocksize": 0, "cname": "lz4", "shuffle": 1}),
    "zstd": ([{"id": "fletcher32"}], {"id": "zstd", "level": 3}),
    "szip": ([], {"id": "szip", "mask": 32, "pixels-per-block": 16}),
    "big": ([], None),
}


def write_codec_store(folder: Path, chains: dict) -> str:
    """A pure-Zarr store (written by hand) with one 32-element array per codec chain."""
    folder.mkdir()
    (folder / ".zgroup").write_text('{"zarr_format": 2}')
    for name, (filters, compressor) in chains.items():
        (folder / name).mkdir()
        zarray = {"zarr_format": 2, "shape": [32], "chunks": [32], "dtype": ">f8" if name == "big" else "<i4",
                  "fill_value": None if name == "big" else 0, "order": "C", "compressor": compressor,
                  "filters": filters or None}  # fmt: skip
        (folder / name / ".zarray").write_text(json.dumps(zarray))
    return nczarr_url(folder, "zarr")


def test_codec_special_attributes_match_libnetcdf(tmp_path) -> None:
    """_Shuffle, _DeflateLevel, _Fletcher32, _Filter (HDF5 id and visible parameters of netcdf-c's plugins)
    and _Codecs as libnetcdf 4.10.1 reports them for a pure-Zarr store."""
    url = write_codec_store(tmp_path / "codecs.file", CODEC_CHAINS)
    assert special_lines(ours(url, special=True, header_only=True)) == libnetcdf_specials(url)


def test_unknown_codec_is_listed_in_codecs_only(tmp_path) -> None:
    """libnetcdf 4.10.1 lists an unknown codec as filter id 0 whose nc_inq_var_filter_info fails
    (NC_ENOFILTER), so real ncdump -s stops with an error there; nczmap leaves it out of _Filter."""
    chains = {"odd": ([{"id": "faultycodec", "x": 1.50}], {"id": "zlib", "level": 1})}
    url = write_codec_store(tmp_path / "odd.file", chains)
    zarray = tmp_path / "odd.file" / "odd" / ".zarray"
    zarray.write_text(zarray.read_text().replace('"x": 1.5', '"x": 1.50'))  # netcdf-c keeps the source text
    text = ours(url, special=True, header_only=True)
    assert b"\t\todd:_DeflateLevel = 1 ;\n" in text
    codecs = b'[{\\"id\\": \\"faultycodec\\", \\"x\\": 1.50},{\\"id\\": \\"zlib\\", \\"level\\": 1}]'
    assert b'\t\todd:_Codecs = "' + codecs + b'" ;\n' in text
    assert b"_Filter" not in text


def test_empty_strings_print_nil_like_ncdump_on_nczarr(tmp_path) -> None:
    """NCZarr hands ncdump a NULL pointer for a string whose first byte is NUL (``NCZ_fixed2char``), and
    ncdump prints NULL as ``NIL`` (it never equals the default fill ""); an HDF5 file prints ``_``."""
    netCDF4 = pytest.importorskip("netCDF4")

    url = nczarr_url(tmp_path / "s.file")
    with netCDF4.Dataset(url, "w") as ds:
        ds.createDimension("n", 3)
        ds.createVariable("s", str, ("n",))[0] = "a"
    assert read_strings_with_libnetcdf(url, "s", 3) == [b"a", None, None]
    assert b' s = "a", NIL, NIL ;\n' in ours(url)


# -------------------------------------------------------------------------------------------- fixtures
def unzip(name: str, target: Path) -> Path:
    with zipfile.ZipFile(FIXTURES / name) as archive:
        archive.extractall(target)
    return target


def squeeze(text: bytes) -> list[bytes]:
    """``diff -wb``: ignore all white space within lines (blank lines still count)."""
    return [re.sub(rb"\s+", b"", line) for line in text.splitlines()]


def assert_fixture(text: bytes, name: str) -> None:
    """netcdf-c's scripts compare with ``diff -wb``; nczmap's output is in fact byte-identical."""
    expected = (FIXTURES / name).read_bytes()
    assert squeeze(text) == squeeze(expected)
    assert text == expected


PLATFORM_LINES = re.compile(rb"_IsNetcdf4|_Endianness|_NCProperties|_SuperblockVersion")


@needs_fixtures
def test_fixture_oldkeys(tmp_path) -> None:
    folder = unzip("ref_oldkeys.file.zip", tmp_path) / "ref_oldkeys.file"
    assert_fixture(ours(nczarr_url(folder)), "ref_oldkeys.cdl")


@pytest.mark.parametrize("name", ["ref_byte", "ref_byte_fill_value_null"])
@needs_fixtures
def test_fixture_byte_special(tmp_path, name: str) -> None:
    """run_nczarr_fill.sh: ``ncdump -s`` with the platform-dependent lines removed (spec §8)."""
    folder = unzip(f"{name}.zarr.zip", tmp_path) / f"{name}.zarr"
    text = ours(nczarr_url(folder, "zarr"), special=True)
    kept = b"".join(line for line in text.splitlines(keepends=True) if not PLATFORM_LINES.search(line))
    assert_fixture(kept, f"{name}.cdl")


@needs_fixtures
def test_fixture_power_901_constants(tmp_path) -> None:
    """run_interop.sh: unzip, rename the folder to ``.file``, ``ncdump -h ...#mode=zarr,file``."""
    folder = unzip("ref_power_901_constants_orig.zip", tmp_path) / "ref_power_901_constants"
    folder = folder.rename(folder.with_suffix(".file"))
    assert_fixture(ours(nczarr_url(folder, "zarr"), header_only=True), "ref_power_901_constants.cdl")


@needs_fixtures
def test_fixture_quotes(tmp_path) -> None:
    folder = unzip("ref_quotes_orig.zip", tmp_path) / "ref_quotes"
    assert_fixture(ours(nczarr_url(folder, "zarr"), header_only=True), "ref_quotes.cdl")


@needs_fixtures
def test_fixture_oldformat(tmp_path) -> None:
    folder = unzip("ref_oldformat.zip", tmp_path) / "ref_oldformat"
    assert_fixture(ours(nczarr_url(folder), name="ref_oldformat"), "ref_oldformat.cdl")


@pytest.mark.parametrize(
    ("archive", "mode", "options", "expected"),
    [
        ("ref_oldformat.zip", "nczarr", {}, "ref_oldformat.cdl"),  # run_newformat.sh
        ("ref_quotes_orig.zip", "zarr", {"header_only": True}, "ref_quotes.cdl"),  # run_interop.sh
    ],
)
@needs_fixtures
def test_fixture_read_through_the_zip_driver(
    tmp_path, archive: str, mode: str, options: dict, expected: str
) -> None:
    """The zip itself, named after its top-level folder as netcdf-c requires (the name ncdump prints)."""
    folder = expected.removesuffix(".cdl")
    target = tmp_path / f"{folder}.zip"
    shutil.copyfile(FIXTURES / archive, target)
    assert_fixture(ours(f"file://{target}#mode={mode},zip", **options), expected)


# ----------------------------------------------------------------------------------------- the command
def test_cli_matches_real_ncdump(stores) -> None:
    store = stores["groups"]
    done = subprocess.run(
        [sys.executable, "-m", "nczmap", "ncdump", "-s", store.d1],
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert_same(done.stdout, real_ncdump(store.d1, "-s"))


def test_cli_reports_missing_variable(stores) -> None:
    store = stores["groups"]
    done = subprocess.run(
        [sys.executable, "-m", "nczmap", "ncdump", "-v", "nosuch", store.d1],
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == b""
    assert done.stderr == b"nczmap: error: nosuch: No such variable\n"


# ------------------------------------------------------------------------------------ libnetcdf 4.10.1
def libnetcdf() -> ctypes.CDLL:
    pytest.importorskip("netCDF4")
    from nczmap.integrations.netcdf4 import libnetcdf as find

    found = find()
    if found is None:
        pytest.skip("cannot load the libnetcdf netCDF4-python runs on")
    return found


class NC:
    """The few netCDF C calls these tests need, through netCDF4-python's bundled libnetcdf 4.10.1."""

    GLOBAL = -1

    def __init__(self, path: str | Path) -> None:
        self.lib = libnetcdf()
        ncid = ctypes.c_int()
        self.check(self.lib.nc_open(str(path).encode(), 0, ctypes.byref(ncid)), path)
        self.ncid = ncid.value

    def check(self, status: int, what: object) -> None:
        if status != 0:
            raise RuntimeError(f"netCDF error {status} ({what})")

    def close(self) -> None:
        self.lib.nc_close(self.ncid)

    def group(self, path: str) -> int:
        if path == "/":
            return self.ncid
        gid = ctypes.c_int()
        self.check(self.lib.nc_inq_grp_full_ncid(self.ncid, path.encode(), ctypes.byref(gid)), path)
        return gid.value

    def varid(self, gid: int, name: str) -> int:
        varid = ctypes.c_int()
        self.check(self.lib.nc_inq_varid(gid, name.encode(), ctypes.byref(varid)), name)
        return varid.value

    def att_type(self, gid: int, varid: int, name: str) -> int:
        nctype = ctypes.c_int()
        self.check(self.lib.nc_inq_atttype(gid, varid, name.encode(), ctypes.byref(nctype)), name)
        return nctype.value

    def dimid(self, gid: int, name: str) -> int:
        dimid = ctypes.c_int()
        self.check(self.lib.nc_inq_dimid(gid, name.encode(), ctypes.byref(dimid)), name)
        return dimid.value

    def dim_length(self, gid: int, dimid: int) -> int:
        length = ctypes.c_size_t()
        self.check(self.lib.nc_inq_dimlen(gid, dimid, ctypes.byref(length)), dimid)
        return length.value

    def var_dimids(self, gid: int, varid: int) -> list[int]:
        ndims = ctypes.c_int()
        self.check(self.lib.nc_inq_varndims(gid, varid, ctypes.byref(ndims)), varid)
        dimids = (ctypes.c_int * max(ndims.value, 1))()
        self.check(self.lib.nc_inq_vardimid(gid, varid, dimids), varid)
        return list(dimids)[: ndims.value]

    def var_type(self, gid: int, varid: int) -> int:
        nctype = ctypes.c_int()
        self.check(self.lib.nc_inq_vartype(gid, varid, ctypes.byref(nctype)), varid)
        return nctype.value

    def get_vara(self, gid: int, varid: int, nctype: int, start: list[int], count: list[int]):
        """Values as a numpy array (strings: a list of bytes or None)."""
        cstart, ccount = (
            (ctypes.c_size_t * max(len(start), 1))(*start),
            (ctypes.c_size_t * max(len(count), 1))(*count),
        )
        size = int(np.prod(count)) if count else 1
        if nctype == NC_STRING:
            strings = (ctypes.c_char_p * size)()
            self.check(self.lib.nc_get_vara_string(gid, varid, cstart, ccount, strings), varid)
            values = list(strings)
            self.lib.nc_free_string(ctypes.c_size_t(size), strings)
            return values
        values = np.zeros(size, dtype=NUMPY_TYPES[nctype])
        self.check(
            self.lib.nc_get_vara(gid, varid, cstart, ccount, values.ctypes.data_as(ctypes.c_void_p)), varid
        )
        return values

    def put_vara(self, gid: int, varid: int, nctype: int, start: list[int], count: list[int], values) -> None:
        cstart, ccount = (
            (ctypes.c_size_t * max(len(start), 1))(*start),
            (ctypes.c_size_t * max(len(count), 1))(*count),
        )
        if nctype == NC_STRING:
            strings = (ctypes.c_char_p * len(values))(*[v or b"" for v in values])
            self.check(self.lib.nc_put_vara_string(gid, varid, cstart, ccount, strings), varid)
            return
        self.check(
            self.lib.nc_put_vara(gid, varid, cstart, ccount, values.ctypes.data_as(ctypes.c_void_p)), varid
        )

    def no_fill(self, gid: int, varid: int) -> bool:
        no_fill = ctypes.c_int()
        self.check(self.lib.nc_inq_var_fill(gid, varid, ctypes.byref(no_fill), None), varid)
        return bool(no_fill.value)


NC_CHAR, NC_INT, NC_STRING = 2, 4, 12
NUMPY_TYPES = {
    1: "i1",
    2: "S1",
    3: "i2",
    4: "i4",
    5: "f4",
    6: "f8",
    7: "u1",
    8: "u2",
    9: "u4",
    10: "i8",
    11: "u8",
}


# -------------------------------------------------------------------------------------- (c) the copier
def copy_to_nczarr(source: Path, url: str) -> None:
    """Copy an HDF5 netCDF-4 file into an NCZarr (D3) store with libnetcdf 4.10.1 (netCDF4-python):
    attribute types and order kept, chunks that hold only fill values left unwritten.

    Data goes through the C API (``nc_get_vara``/``nc_put_vara``) because netCDF4-python resolves a
    variable's dimensions by name, which gives the wrong shape when a nearer dimension shadows one of
    an ancestor group (``int d(/y)`` in ``groups.cdl``)."""
    netcdf4 = pytest.importorskip("netCDF4")
    nc = NC(source)
    try:
        with netcdf4.Dataset(source) as src, netcdf4.Dataset(url, "w") as dst:
            _copy_group(nc, src, dst, "/", {})
    finally:
        nc.close()


def _copy_group(nc: NC, src, dst, path: str, dims: dict) -> None:
    """``dims`` maps every source dimension id to the new Dimension."""
    gid = nc.group(path)
    for name, dim in src.dimensions.items():
        dims[nc.dimid(gid, name)] = dst.createDimension(name, None if dim.isunlimited() else len(dim))
    _copy_attributes(nc, gid, NC.GLOBAL, src, dst)
    for var in src.variables.values():
        _copy_variable(nc, gid, var, dst, dims)
    for name, child in src.groups.items():
        _copy_group(nc, child, dst.createGroup(name), path.rstrip("/") + "/" + name, dims)


def _copy_attributes(nc: NC, gid: int, varid: int, src, dst) -> None:
    for name in src.ncattrs():
        if name == "_FillValue":
            continue  # set when the variable is created
        value = src.getncattr(name)
        nctype = nc.att_type(gid, varid, name)
        if nctype == NC_STRING:
            dst.setncattr_string(name, value)
        elif nctype == NC_CHAR:
            dst.setncattr(name, value.encode("utf-8") if isinstance(value, str) else value)
        else:
            dst.setncattr(name, value)


def _copy_variable(nc: NC, gid: int, var, dst, dims: dict) -> None:
    varid = nc.varid(gid, var.name)
    dimids = nc.var_dimids(gid, varid)
    shape = tuple(nc.dim_length(gid, d) for d in dimids)
    options: dict = {"endian": var.endian()}
    if nc.no_fill(gid, varid):
        options["fill_value"] = False
    elif "_FillValue" in var.ncattrs():
        options["fill_value"] = var.getncattr("_FillValue")
    filters = var.filters() or {}
    if filters.get("zlib"):
        options.update(zlib=True, complevel=filters["complevel"], shuffle=filters.get("shuffle", False))
    chunking = var.chunking()
    if shape and chunking != "contiguous":
        options["chunksizes"] = chunking
    elif shape and all(shape):
        options["chunksizes"] = shape
    datatype = str if var.datatype is str else var.dtype
    out = dst.createVariable(var.name, datatype, tuple(dims[d] for d in dimids), **options)
    _copy_attributes(nc, gid, varid, var, out)
    unlimited = any(dims[d].isunlimited() for d in dimids)
    chunks = out.chunking() if shape and not unlimited else list(shape) or [1]
    _copy_data(nc, (gid, varid), (out.group()._grpid, out._varid), shape, chunks, options.get("fill_value"))


def _copy_data(nc: NC, source: tuple[int, int], target: tuple[int, int], shape, chunks, fill) -> None:
    """Chunk by chunk (the whole variable when it has an unlimited dimension: an unwritten tail would
    shorten it), skipping chunks that hold only the fill value."""
    if not all(shape):
        return
    nctype = nc.var_type(*source)
    for corner in np.ndindex(*[-(-n // c) for n, c in zip(shape, chunks, strict=False)]):
        start = [i * c for i, c in zip(corner, chunks, strict=False)]
        count = [min(c, n - s) for c, n, s in zip(chunks, shape, start, strict=False)]
        values = nc.get_vara(*source, nctype, start, count)
        if fill is False or not _all_fill(values, nctype, fill):
            nc.put_vara(*target, nctype, start, count, values)


def _all_fill(values: list | np.ndarray, nctype: int, fill) -> bool:
    import netCDF4

    if nctype == NC_STRING:
        return all(v in (b"", None) for v in values)
    if nctype == NC_CHAR:
        return not values.any()
    if fill is None:
        fill = netCDF4.default_fillvals[values.dtype.str[1:]]
    fill = np.asarray(fill, dtype=values.dtype)
    if values.dtype.kind == "f" and np.isnan(fill):
        return bool(np.isnan(values).all())
    return bool((values == fill).all())


def read_strings_with_libnetcdf(url: str, name: str, count: int) -> list[bytes | None]:
    nc = NC(url)
    try:
        values = (ctypes.c_char_p * count)()
        nc.check(nc.lib.nc_get_var_string(nc.ncid, nc.varid(nc.ncid, name), values), name)
        return list(values)
    finally:
        nc.close()


# ------------------------------------------------------------------------------------------- -s oracle
SPECIAL = re.compile(
    rb"^ *\t\t[^\t]*:_(Storage|ChunkSizes|Fletcher32|Shuffle|DeflateLevel|Filter|Codecs|Endianness|NoFill"
    rb"|NCProperties|SuperblockVersion|IsNetcdf4|Format) = "
)


def special_lines(text: bytes) -> list[bytes]:
    """The ``-s`` lines of a dump; what follows the value-less ``_ChunkSizes = `` of a scalar (ncdump prints
    no values and no newline there) is cut off onto a line of its own."""
    text = re.sub(rb"(:_ChunkSizes = )(?=[^\d\n])", rb"\1\n", text)
    return [line for line in text.splitlines() if SPECIAL.match(line)]


def libnetcdf_specials(url: str) -> list[bytes]:
    """The ``-s`` lines ncdump would print, from libnetcdf 4.10.1's answers (ncdump.c pr_att_specials)."""
    nc = NC(url)
    try:
        out = io.BytesIO()
        _group_specials(nc, nc.ncid, 0, out)
        return out.getvalue().splitlines()
    finally:
        nc.close()


def _group_specials(nc: NC, gid: int, indent: int, out: io.BytesIO) -> None:
    lib, pad = nc.lib, b" " * indent
    nvars = ctypes.c_int()
    lib.nc_inq_nvars(gid, ctypes.byref(nvars))
    for varid in range(nvars.value):
        _variable_specials(nc, gid, varid, pad, out)
    if indent == 0:
        _global_specials(nc, pad, out)
    ngroups = ctypes.c_int()
    lib.nc_inq_grps(gid, ctypes.byref(ngroups), None)
    ids = (ctypes.c_int * max(ngroups.value, 1))()
    lib.nc_inq_grps(gid, None, ids)
    for child in list(ids)[: ngroups.value]:
        _group_specials(nc, child, indent + 2, out)


def _variable_specials(nc: NC, gid: int, varid: int, pad: bytes, out: io.BytesIO) -> None:
    lib = nc.lib
    name, ndims, nctype = ctypes.create_string_buffer(512), ctypes.c_int(), ctypes.c_int()
    lib.nc_inq_varname(gid, varid, name)
    lib.nc_inq_varndims(gid, varid, ctypes.byref(ndims))
    lib.nc_inq_vartype(gid, varid, ctypes.byref(nctype))
    prefix = pad + b"\t\t" + name.value + b":"
    storage, chunks = ctypes.c_int(), (ctypes.c_size_t * max(ndims.value, 1))()
    lib.nc_inq_var_chunking(gid, varid, ctypes.byref(storage), chunks)
    assert storage.value == 0, "NCZarr variables are always chunked"
    out.write(prefix + b'_Storage = "chunked" ;\n' + prefix + b"_ChunkSizes = ")
    out.write(
        b", ".join(b"%d" % c for c in list(chunks)[: ndims.value]) + (b" ;\n" if ndims.value else b"\n")
    )
    fletcher, shuffle, deflate, level = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    lib.nc_inq_var_fletcher32(gid, varid, ctypes.byref(fletcher))
    lib.nc_inq_var_deflate(gid, varid, ctypes.byref(shuffle), ctypes.byref(deflate), ctypes.byref(level))
    if fletcher.value:
        out.write(prefix + b'_Fletcher32 = "true" ;\n')
    if shuffle.value:
        out.write(prefix + b'_Shuffle = "true" ;\n')
    if deflate.value:
        out.write(prefix + b"_DeflateLevel = %d ;\n" % level.value)
    _filter_specials(nc, gid, varid, prefix, out)
    _codecs_special(nc, gid, varid, prefix, out)
    sizes = {1: 1, 2: 1, 3: 2, 4: 4, 5: 4, 6: 8, 7: 1, 8: 2, 9: 4, 10: 8, 11: 8, 12: 8}
    endian = ctypes.c_int()
    lib.nc_inq_var_endian(gid, varid, ctypes.byref(endian))
    if sizes[nctype.value] > 1 and endian.value:
        out.write(prefix + b'_Endianness = "%s" ;\n' % (b"little" if endian.value == 1 else b"big"))
    if nc.no_fill(gid, varid):
        out.write(prefix + b'_NoFill = "true" ;\n')


def _filter_specials(nc: NC, gid: int, varid: int, prefix: bytes, out: io.BytesIO) -> None:
    lib, count = nc.lib, ctypes.c_size_t()
    lib.nc_inq_var_filter_ids(gid, varid, ctypes.byref(count), None)
    ids = (ctypes.c_uint * max(count.value, 1))()
    lib.nc_inq_var_filter_ids(gid, varid, ctypes.byref(count), ids)
    texts = []
    for fid in list(ids)[: count.value]:
        if fid in (1, 2, 3):
            continue  # deflate, shuffle, fletcher32 have their own attributes
        nparams = ctypes.c_size_t()
        lib.nc_inq_var_filter_info(gid, varid, fid, ctypes.byref(nparams), None)
        params = (ctypes.c_uint * max(nparams.value, 1))()
        lib.nc_inq_var_filter_info(gid, varid, fid, ctypes.byref(nparams), params)
        texts.append(b",".join(b"%d" % p for p in [fid, *list(params)[: nparams.value]]))
    if texts:
        out.write(prefix + b'_Filter = "' + b"|".join(texts) + b'" ;\n')


def _codecs_special(nc: NC, gid: int, varid: int, prefix: bytes, out: io.BytesIO) -> None:
    length, nctype = ctypes.c_size_t(), ctypes.c_int()
    if (
        nc.lib.nc_inq_att(gid, varid, b"_Codecs", ctypes.byref(nctype), ctypes.byref(length))
        or not length.value
    ):
        return
    text = ctypes.create_string_buffer(length.value + 1)
    nc.lib.nc_get_att_text(gid, varid, b"_Codecs", text)
    out.write(prefix + b'_Codecs = "' + text.value.replace(b'"', b'\\"') + b'" ;\n')


def _global_specials(nc: NC, pad: bytes, out: io.BytesIO) -> None:
    lib, length = nc.lib, ctypes.c_size_t()
    if lib.nc_inq_att(nc.ncid, NC.GLOBAL, b"_NCProperties", None, ctypes.byref(length)) == 0:
        text = ctypes.create_string_buffer(length.value + 1)
        lib.nc_get_att_text(nc.ncid, NC.GLOBAL, b"_NCProperties", text)
        out.write(pad + b'\t\t:_NCProperties = "' + text.value + b'" ;\n')
    for name in (b"_SuperblockVersion", b"_IsNetcdf4"):
        value = ctypes.c_int()
        if lib.nc_get_att_int(nc.ncid, NC.GLOBAL, name, ctypes.byref(value)) == 0:
            out.write(pad + b"\t\t:" + name + b" = %d ;\n" % value.value)
    out.write(pad + b'\t\t:_Format = "netCDF-4" ;\n')
