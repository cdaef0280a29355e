"""The format layer against real netcdf-c, both directions (spec §3-§5, §10-§11).

Oracles, never nczmap's own output:

* every corpus case (``_roundtrip_corpus.py``) is compiled by Debian ``ncgen -4`` into a netCDF-4/HDF5
  ``x.nc`` and read with netCDF4-python (attribute types through ``nc_inq_atttype``): that model is
  what every store must give back, up to the differences real netcdf-c is known to introduce, each
  spelled out below with its spec reference;
* real ``ncdump`` (Debian netcdf-bin 4.9.0) and real libnetcdf 4.10.1 (netCDF4-python) reading what
  nczmap wrote; zarr-python / xarray for pure Zarr;
* the fixture CDLs of netcdf-c's test-suite (compiled by ``ncgen``) and the fixtures' own bytes.

Stores: (1) written by real netcdf-c - Debian ``ncgen -4 -lb`` (dialect D1 and pure Zarr) and
libnetcdf 4.10.1 through netCDF4-python (D3, pure Zarr, noxarray, consolidated) - and read by nczmap;
(2) written by nczmap for each netcdf-c generation and read by netcdf-c; (3) updates in place;
(4) netcdf-c's fixtures; (5) broken metadata.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import shutil
import subprocess
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from _fixtures import FIXTURES, run_checked

netCDF4 = pytest.importorskip("netCDF4")

import _roundtrip_model as M  # noqa: E402  (needs netCDF4)
from _roundtrip_corpus import CASES, Case  # noqa: E402

import nczmap  # noqa: E402

NCGEN = shutil.which("ncgen")
NCDUMP = shutil.which("ncdump")
TIMEOUT = 60

pytestmark = pytest.mark.skipif(NCGEN is None or NCDUMP is None, reason="netcdf-c ncgen/ncdump not on PATH")

# ----------------------------------------------------------------------------------- stores
# kind -> (writer, URL mode). Writers: "4.9.0" Debian ncgen, "4.10.1" netCDF4-python, "nczmap".
KINDS = {
    "ncgen-nczarr": ("4.9.0", "nczarr,file"),
    "ncgen-zarr": ("4.9.0", "zarr,file"),
    "nc4-nczarr": ("4.10.1", "nczarr,file"),
    "nc4-zarr": ("4.10.1", "zarr,file"),
    "nc4-noxarray": ("4.10.1", "nczarr,noxarray,file"),
    "nc4-consolidated": ("4.10.1", "nczarr,file,consolidated"),
    "nczmap-4.8.0": ("nczmap", "nczarr,file"),
    "nczmap-4.9.0": ("nczmap", "nczarr,file"),
    "nczmap-4.9.2": ("nczmap", "nczarr,file"),
    "nczmap-default": ("nczmap", "nczarr,file"),
    "nczmap-zarr": ("nczmap", "zarr,file"),
    "nczmap-xarray": ("nczmap", "xarray,file"),
}
# What each kind holds (spec §3): netCDF4-python's mode=nczarr,noxarray is pure Zarr (§2.2 step 4).
DIALECT = {
    "ncgen-nczarr": "D1",
    "nc4-nczarr": "D3",
    "nc4-consolidated": "D3",
    "nczmap-4.8.0": "D0",
    "nczmap-4.9.0": "D1",
    "nczmap-4.9.2": "D2",
    "nczmap-default": "D3",
}
NETCDF_VERSION = {"nczmap-4.8.0": "4.8.0", "nczmap-4.9.0": "4.9.0", "nczmap-4.9.2": "4.9.2"}
NC4_KINDS = ["nc4-nczarr", "nc4-zarr", "nc4-noxarray", "nc4-consolidated"]
NCZMAP_KINDS = [k for k in KINDS if k.startswith("nczmap-")]


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_checked(cmd, cwd, TIMEOUT)


def url_of(path: Path, mode: str) -> str:
    return f"file://{path}#mode={mode}"


def is_pure(kind: str) -> bool:
    return kind not in DIALECT


def xarray_on(kind: str) -> bool:
    return "noxarray" not in KINDS[kind][1]


def open_quietly(url: str, mode: str = "r"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. nczmap warns about scalars for netcdf-c 4.9.0
        return nczmap.open_dataset(url, mode)


class Stores:
    """Every store of every case, built on first use and shared by the whole module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.built: dict[tuple[str, str], Path] = {}
        self.oracles: dict[str, M.Model] = {}

    def nc(self, case: Case) -> Path:
        key = (case.name, "nc")
        if key not in self.built:
            cdl = self.root / f"{case.name}.cdl"
            cdl.write_text(case.cdl, encoding="utf-8")
            path = self.root / f"{case.name}.nc"
            run([NCGEN, "-4", "-o", str(path), str(cdl)], cwd=self.root)
            self.built[key] = path
        return self.built[key]

    def oracle(self, case: Case) -> M.Model:
        """The x.nc model (shared: callers copy before changing it)."""
        if case.name not in self.oracles:
            self.oracles[case.name] = M.read_nc4(str(self.nc(case)))
        return self.oracles[case.name]

    def store(self, case: Case, kind: str) -> Path:
        key = (case.name, kind)
        if key in self.built:
            return self.built[key]
        mode = KINDS[kind][1]
        path = self.root / f"{case.name}-{kind}.file"
        nc = self.nc(case)
        if kind.startswith("ncgen-"):
            assert case.ncgen49, f"{case.name} is not for Debian ncgen 4.9.0"
            run([NCGEN, "-4", "-lb", "-o", url_of(path, mode), str(self.root / f"{case.name}.cdl")])
        elif kind.startswith("nc4-"):
            with netCDF4.Dataset(str(nc)) as src, netCDF4.Dataset(url_of(path, mode), "w") as dst:
                M.copy_nc4_to_nc4(src, dst, case)
        else:
            version = NETCDF_VERSION.get(kind)
            with netCDF4.Dataset(str(nc)) as src, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dataset = nczmap.create_dataset(url_of(path, mode), netcdf_version=version)
                # Debian's 4.9.0 build has no NCZarr filters (spec §6, bug 31): stores meant for
                # ``ncdump`` 4.9.0 are written uncompressed; the D3 and pure-Zarr ones keep zlib+shuffle.
                M.copy_nc4_to_nczmap(src, dataset, case, compress=version is None)
                dataset.close()
        assert path.is_dir(), f"{kind} did not create {path}"
        self.built[key] = path
        return path

    def url(self, case: Case, kind: str) -> str:
        return url_of(self.store(case, kind), KINDS[kind][1])


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Stores:
    built = Stores(tmp_path_factory.mktemp("roundtrip"))
    for case in CASES.values():
        built.nc(case)
    return built


def read_nczmap(url: str) -> tuple[str, M.Model]:
    dataset = open_quietly(url)
    try:
        assert dataset.problems == [], f"{url}: nczmap skipped {dataset.problems}"
        return dataset.dialect.code, M.nczmap_model(dataset)
    finally:
        dataset.close()


# ----------------------------------------------------------------------------------- expectations
def c_lg(type_name: str, values: tuple) -> tuple:
    """What netcdf-c's ``%lg`` (6 significant digits) leaves of float values (spec §3.7, bug 19)."""
    out = []
    for value in values:
        if value == "NaN" or math.isinf(value):
            out.append(value)
        else:
            out.append(M.number(np.array(float(f"{value:g}"), dtype=M.NUMPY_OF[type_name])[()]))
    return tuple(out)


class AsFloat32(tuple):
    """Numbers that must equal the actual ones once both are narrowed to float32.

    A float attribute written to pure Zarr comes back as a double (no type is stored, §5.1); the
    information it carries is the float32 value. How nczmap spells it is checked separately
    (``test_pure_zarr_float32_attribute_spelled_shortest``).
    """

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, tuple) or len(other) != len(self):
            return False
        return all(
            (a == "NaN" and b == "NaN") or (a != "NaN" and b != "NaN" and np.float32(a) == np.float32(b))
            for a, b in zip(self, other, strict=True)
        )

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = tuple.__hash__


def int_type(value: int) -> str:
    """netcdf-c 4.9.1+'s type for an untyped JSON integer (spec §4.3)."""
    if value < 0:
        return "int" if value >= -(2**31) else "int64"
    if value <= 2**31 - 1:
        return "int"
    if value <= 2**32 - 1:
        return "uint"
    return "uint64" if value >= 2**63 - 1 else "int64"


def json_text_list(strings) -> str:
    """netcdf-c's text for a JSON array of strings shown as a char attribute (§4.3 "complex JSON")."""
    return "[" + ",".join(json.dumps(s, ensure_ascii=False) for s in strings) + "]"


def pure_attr(writer: str, type_name: str, value) -> tuple[str, object]:
    """(type, value) a pure-Zarr reader infers from the JSON ``writer`` wrote (spec §4.3, §5.2)."""
    if type_name == "char":
        return "char", value
    if type_name == "string":  # JSON string(s): char, several of them complex JSON text
        return ("char", value[0]) if len(value) == 1 else ("char", json_text_list(value))
    if type_name in ("float", "double"):
        if any(v == "NaN" or math.isinf(v) for v in value):
            if writer == "4.9.0":  # bare NaN/Infinity (§3.4): numbers
                return "double", tuple(value)
            # 4.9.3+ (and nczmap, §3.7) write the strings "NaN", "Infinity", "-Infinity"
            words = ["NaN" if v == "NaN" else ("Infinity" if v > 0 else "-Infinity") for v in value]
            return ("char", words[0]) if len(words) == 1 else ("char", json_text_list(words))
        if writer == "nczmap":  # full precision, always a float in JSON
            return "double", AsFloat32(value) if type_name == "float" else tuple(value)
        texts = [f"{v:g}" for v in value]  # %lg: 1.0 is written "1" (bug 19) and read as an integer
        if all(t.lstrip("-").isdigit() for t in texts):
            return int_type(int(texts[0])), tuple(int(t) for t in texts)
        return "double", tuple(float(t) for t in texts)
    return int_type(value[0]), tuple(value)  # integers: the type of the first element


def missing_chunks(store: Path, key: str, shape: tuple[int, ...]) -> np.ndarray:
    """Which elements of the array at ``key`` lie in chunks absent from the store (read off disk)."""
    meta = json.loads((store / key.lstrip("/") / ".zarray").read_text())
    chunks = meta["chunks"] or [1]
    separator = meta.get("dimension_separator", ".")
    mask = np.zeros(shape or (1,), dtype=bool)
    for index in np.ndindex(mask.shape):
        name = separator.join(str(i // c) for i, c in zip(index, chunks, strict=True)) if shape else "0"
        mask[index] = not (store / key.lstrip("/") / name).exists()
    return mask.reshape(shape)


def expected_model(oracle: M.Model, case: Case, kind: str, store: Path) -> M.Model:
    """The x.nc model as the store written by ``kind`` must give it back.

    netcdf-c writers (spec §11): floats in attributes and fill values keep 6 significant digits
    (bug 19), so missing chunks read back as that fill; char attributes that are JSON are written as
    parsed JSON (bug 20; 4.9.0 did it only for JSON objects [obs: Debian ``ncdump`` of its own store]).
    nczmap writes floats exactly and char attributes as JSON strings (§12). Pure Zarr (§5): no
    attribute types (inferred, §4.3), ``>S1`` read as a 1-character string (§4.2), variables and groups
    in sorted order, dimensions from ``_ARRAY_DIMENSIONS`` in the array's own group - written by 4.9.0
    only for root-group arrays over root dimensions, by 4.10 and nczmap for every array unless
    ``noxarray`` (§3.2) - else ``/_Anonymous_Dim_<n>`` (netcdf-c 4.9.3+ name, §5.2), no unlimited
    dimensions, scalars as 1-element arrays over ``_scalar_`` (§4.7).
    """
    writer = KINDS[kind][0]
    pure = is_pure(kind)
    model = copy.deepcopy(oracle)

    def attr(type_name: str, name: str, value, var_type: str | None) -> tuple[str, object]:
        if writer != "nczmap" and type_name in ("float", "double"):
            value = c_lg(type_name, value)
        if writer != "nczmap" and type_name == "char" and name in case.json_char:
            nczarr_text, pure_typed = case.json_char[name]
            if writer == "4.10.1" or value.startswith("{"):
                return pure_typed if pure else ("char", nczarr_text)
        if not pure:
            return type_name, value
        if name == "_FillValue" and var_type is not None:  # typed by the variable (§4.3)
            return type_name, value
        return pure_attr(writer, type_name, value)

    for path, group in model.items():
        group.attrs = [(n, *attr(t, n, v, None)) for n, t, v in group.attrs]
        for name, var in group.vars.items():
            var.attrs = [(n, *attr(t, n, v, var.type)) for n, t, v in var.attrs]
            if writer != "nczmap" and var.type in ("float", "double") and var.fill is not None:
                var.fill = c_lg(var.type, (var.fill,))[0]
            key = M._join(path, name)
            missing = missing_chunks(store, key, var.shape)
            if missing.any():
                fill = var.fill if var.fill is not None else 0
                var.data = var.data.copy()
                var.data[missing] = math.nan if fill == "NaN" else fill
    return pure_model(model, kind) if pure else model


def pure_model(model: M.Model, kind: str) -> M.Model:
    writer = KINDS[kind][0]
    with_names = xarray_on(kind)
    root_dims = model["/"].dims
    dims: dict[str, dict[str, tuple[int, bool]]] = {path: {} for path in model}
    for path, group in model.items():
        for name in sorted(group.vars):
            var = group.vars[name]
            names, shape = var.dims, var.shape
            if not shape:
                names, shape = ("_scalar_",), (1,)
                var.data = np.asarray(var.data).reshape(1)
            named = with_names and (writer != "4.9.0" or (path == "/" and all(d in root_dims for d in names)))
            if not named:
                names = tuple(f"_Anonymous_Dim_{n}" for n in shape)
            home = path if named else "/"
            for dim_name, size in zip(names, shape, strict=True):
                dims[home][dim_name] = (size, False)
            var.dims, var.shape = tuple(names), tuple(shape)
            if var.type == "char" and writer != "4.9.0":  # >S1 in pure Zarr is a string (§4.2)
                var.type, var.fill = "string", ""
                var.data = np.array(
                    [b.decode("utf-8", "replace") for b in var.data.astype("S1").ravel()], dtype=object
                ).reshape(var.shape)
        group.vars = {name: group.vars[name] for name in sorted(group.vars)}
        group.groups = sorted(group.groups)
    for path, group in model.items():
        group.dims = dims[path]
    ordered: M.Model = {}

    def visit(path: str) -> None:
        ordered[path] = model[path]
        for child in model[path].groups:
            visit(M._join(path, child))

    visit("/")
    return ordered


# =================================================================================== 1. reading
NCGEN49_CASES = [name for name, case in CASES.items() if case.ncgen49]


@pytest.mark.parametrize("kind", ["ncgen-nczarr", "ncgen-zarr"])
@pytest.mark.parametrize("case_name", NCGEN49_CASES)
def test_read_store_written_by_ncgen_4_9_0(stores, case_name, kind):
    case = CASES[case_name]
    dialect, model = read_nczmap(stores.url(case, kind))
    assert dialect == DIALECT.get(kind, "PZ")
    expected = expected_model(stores.oracle(case), case, kind, stores.store(case, kind))
    M.assert_models_equal(model, expected, f"{case_name} {kind}")


@pytest.mark.parametrize("kind", NC4_KINDS)
@pytest.mark.parametrize("case_name", list(CASES))
def test_read_store_written_by_libnetcdf_4_10_1(stores, case_name, kind):
    case = CASES[case_name]
    dialect, model = read_nczmap(stores.url(case, kind))
    assert dialect == DIALECT.get(kind, "PZ")
    expected = expected_model(stores.oracle(case), case, kind, stores.store(case, kind))
    M.assert_models_equal(model, expected, f"{case_name} {kind}")


def undecodable(model: M.Model) -> frozenset[str]:
    """Char variables holding non-ASCII bytes: read from pure Zarr, ``>S1`` is a 1-byte *string* (§4.2)
    and netCDF4-python fails to decode such a byte (UnicodeDecodeError), so their data is not read
    through it (nczmap's reading of them is checked against the x.nc model)."""
    return frozenset(
        M._join(path, name)
        for path, group in model.items()
        for name, var in group.vars.items()
        if var.type == "char" and any(b >= 0x80 for b in var.data.astype("S1").tobytes())
    )


@pytest.mark.parametrize("kind", NC4_KINDS)
@pytest.mark.parametrize("case_name", list(CASES))
def test_libnetcdf_4_10_1_reads_its_store_like_nczmap(stores, case_name, kind):
    """The same store through libnetcdf 4.10.1 itself: structure, variable types and all data agree.

    Attributes are left to the test above: 4.10.1 truncates char attributes it wrote as JSON numbers or
    booleans to one character (``"42"`` -> ``"4"``, spec §4.3, bug 20).
    """
    case = CASES[case_name]
    url = stores.url(case, kind)
    _, ours = read_nczmap(url)
    theirs = M.read_nc4(url, skip_data=undecodable(stores.oracle(case)) if is_pure(kind) else frozenset())
    assert list(ours) == list(theirs)
    for path, group in theirs.items():
        assert ours[path].dims == group.dims, path
        assert ours[path].groups == group.groups, path
        assert list(ours[path].vars) == list(group.vars), path
        for name, var in group.vars.items():
            mine = ours[path].vars[name]
            assert (mine.dims, mine.type, mine.shape) == (var.dims, var.type, var.shape), name
            if var.data is not None:
                M.assert_same_data(mine.data, var.data, f"{path} {name}")


def zjson(store: Path, key: str) -> dict:
    return json.loads((store / key).read_text())


def test_libnetcdf_4_10_1_stores_hold_what_the_tests_claim(stores):
    """Preconditions, read off disk: the 4.10.1 stores really have the features read back above."""
    store = stores.store(CASES["strings"], "nc4-nczarr")
    temp = zjson(store, "temp/.zarray")
    assert temp["compressor"] == {"id": "zlib", "level": 4}
    assert temp["filters"] == [{"id": "shuffle", "elementsize": 0}]  # §6: 4.10.1 writes elementsize 0
    assert zjson(store, "be_f/.zarray")["dtype"] == ">f4"
    assert zjson(store, "names/.zarray")["dtype"] == "|S128"
    assert zjson(store, "scal/.zattrs")["_nczarr_array"]["scalar"] == 1
    root = zjson(store, ".zattrs")
    assert root["_nczarr_group"]["dimensions"]["t"] == {"size": 3, "unlimited": 1}
    assert root["_nczarr_attr"]["types"]["gmulti"].startswith("|S")
    # the JSON convention (bug 20): 4.10.1 parses every JSON-looking char attribute, 4.9.0 only objects
    assert zjson(stores.store(CASES["atomic"], "nc4-nczarr"), ".zattrs")["json_arr"] == [1, 2, 3]
    d1_root = zjson(stores.store(CASES["atomic"], "ncgen-nczarr"), ".zattrs")
    assert (d1_root["json_arr"], d1_root["json_obj"]) == ("[1, 2, 3]", {"a": 1})
    for kind in ("nc4-zarr", "nc4-noxarray"):
        pure = stores.store(CASES["strings"], kind)
        assert "_nczarr_superblock" not in zjson(pure, ".zattrs")
        assert ("_ARRAY_DIMENSIONS" in zjson(pure, "temp/.zattrs")) == (kind == "nc4-zarr")
    consolidated = stores.store(CASES["strings"], "nc4-consolidated")
    assert zjson(consolidated, ".zmetadata")["metadata"]["temp/.zarray"]["filters"][0]["elementsize"] == 0
    # and what nczmap wrote for the default (D3) target
    ours = stores.store(CASES["strings"], "nczmap-default")
    assert zjson(ours, "temp/.zarray")["filters"] == [{"id": "shuffle", "elementsize": 8}]
    assert zjson(ours, "temp/.zarray")["compressor"]["id"] == "zlib"
    assert zjson(ours, "be_f/.zarray")["dtype"] == ">f4"


def test_consolidated_store_is_read_from_zmetadata(stores, tmp_path):
    """With ``consolidated`` in the URL every metadata object comes from ``/.zmetadata`` (§3.8)."""
    case = CASES["atomic"]
    path, url = private_copy(stores, "atomic", "nc4-consolidated", tmp_path)
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            if name in (".zgroup", ".zattrs", ".zarray"):
                Path(dirpath, name).unlink()
    dataset = open_quietly(url)
    assert dataset.consolidated is True
    model = M.nczmap_model(dataset)
    dataset.close()
    original = stores.store(case, "nc4-consolidated")
    expected = expected_model(stores.oracle(case), case, "nc4-consolidated", original)
    M.assert_models_equal(model, expected, "atomic consolidated, .zmetadata only")


def test_libnetcdf_4_10_1_reads_d1_as_pure_zarr(stores):
    """What nczmap does better than current netcdf-c on 4.9.0's D1 (§3.9, bug 12): 4.10.1 reads it as
    pure Zarr, shows ``_NCZARR_ATTR`` as a char attribute and infers attribute types."""
    case = CASES["groups"]  # no char variables: 4.10.1 fails the whole open on "<U1" (§3.9)
    url = stores.url(case, "ncgen-nczarr")
    theirs = M.read_nc4(url)
    assert any(name == "_NCZARR_ATTR" for name, _, _ in theirs["/"].attrs)
    level = dict((n, t) for n, t, _ in theirs["/g1/g2"].attrs)
    assert level["level"] == "int"  # a short attribute, typed by its JSON value
    assert "z" not in theirs["/g1"].dims  # no NCZarr dimensions either
    _, ours = read_nczmap(url)
    assert [a[0] for a in ours["/"].attrs] == ["gattr"]
    assert ours["/g1/g2"].attrs == [("level", "short", (2,))]
    assert ours["/g1"].dims == {"z": (4, False)}


# =================================================================================== 2. writing
D0_D2_CASES = [name for name, case in CASES.items() if case.d0_d2]


def ncdump(target: str, name: str, *options: str) -> str:
    return run([NCDUMP, *options, "-n", name, target]).stdout.decode()


@pytest.mark.parametrize("kind", ["nczmap-4.9.0", "nczmap-4.8.0"])
@pytest.mark.parametrize("case_name", D0_D2_CASES)
def test_ncdump_4_9_0_reads_nczmap_store_like_the_nc_file(stores, case_name, kind):
    """Debian ``ncdump`` 4.9.0 on nczmap's D1 (and D0, read through ``/.nczarr``, §3.9) store.

    Excluded from these cases because 4.9.0 cannot do them (§3.4): strings, unlimited dimensions and
    scalar variables (the ``strings`` case); nczmap stores big-endian data little-endian for 4.9.0
    (which writes and reads big-endian data wrongly, bug 18), invisible without ``-s``.
    """
    case = CASES[case_name]
    expected = ncdump(str(stores.nc(case)), case.name)
    assert ncdump(stores.url(case, kind), case.name) == expected


def test_ncdump_4_9_0_reads_d2_as_pure_zarr(stores):
    """4.9.0 knows neither lower-case key (§3.9: D2 is read as pure Zarr, "PZ*")."""
    case = CASES["groups"]  # no char arrays: 4.9.0 segfaults on >S1 arrays read as pure Zarr (§3.9)
    dump = ncdump(stores.url(case, "nczmap-4.9.2"), case.name)
    lines = [line.strip() for line in dump.splitlines()]
    assert dump != ncdump(str(stores.nc(case)), case.name)
    # _nczarr_attr sits in .zattrs: an ordinary char attribute holding JSON text, on every object
    # that has attributes (4.9.0 hides only _NCZARR_ATTR)
    for owner in ("rv", "", "gv", "deep"):
        assert any(line.startswith(f'{owner}:_nczarr_attr = "{{\\"types\\": ') for line in lines), owner
    # type information is ignored: 4.9's smallest-integer rule, so the fill attribute is a byte and the
    # unwritten element prints as a number instead of "_"
    assert "rv:_FillValue = -99b ;" in lines
    assert "4, 5, -99 ;" in lines
    assert ":level = 2b ;" in lines  # a short group attribute, typed from its value
    # dimensions come from _ARRAY_DIMENSIONS and 4.9.x creates them in the root group
    assert dump.count("dimensions:") == 1
    assert {"x = 2 ;", "y = 3 ;", "z = 4 ;", "w = 2 ;"} <= set(lines)
    # and nczmap itself reads the very same store exactly
    dialect, model = read_nczmap(stores.url(case, "nczmap-4.9.2"))
    assert dialect == "D2"
    M.assert_models_equal(model, stores.oracle(case), "groups nczmap-4.9.2")


@pytest.mark.parametrize("kind", NCZMAP_KINDS)
@pytest.mark.parametrize("case_name", list(CASES))
def test_nczmap_reads_back_what_it_wrote(stores, case_name, kind):
    case = CASES[case_name]
    if kind in NETCDF_VERSION and not case.d0_d2:
        pytest.skip(f"netcdf-c {NETCDF_VERSION[kind]} cannot read strings, unlimited dims or scalars")
    dialect, model = read_nczmap(stores.url(case, kind))
    assert dialect == DIALECT.get(kind, "PZ")
    expected = expected_model(stores.oracle(case), case, kind, stores.store(case, kind))
    M.assert_models_equal(model, expected, f"{case_name} {kind}")


@pytest.mark.parametrize("case_name", list(CASES))
def test_libnetcdf_4_10_1_reads_nczmap_d3_exactly(stores, case_name):
    """Groups, dimensions, types, attribute types and values at full precision, data and fill."""
    case = CASES[case_name]
    model = M.read_nc4(stores.url(case, "nczmap-default"))
    M.assert_models_equal(model, stores.oracle(case), f"{case_name} nczmap-default via netCDF4")


@pytest.mark.parametrize("case_name", ["groups", "strings"])
def test_nczmap_zip_store_unzipped_reads_in_libnetcdf_4_10_1(stores, tmp_path, case_name):
    """A ``.zip`` path selects the zip driver (netcdf-c's one-folder layout, §1.6); this libnetcdf has no
    zip driver, so the archive is unpacked by ``zipfile`` and read with the file driver."""
    case = CASES[case_name]
    archive = tmp_path / f"{case_name}.file.zip"
    with netCDF4.Dataset(str(stores.nc(case))) as src:
        dataset = nczmap.create_dataset(str(archive))
        M.copy_nc4_to_nczmap(src, dataset, case)
        dataset.close()
    folder = unzip(archive, tmp_path)
    assert folder.name == f"{case_name}.file"
    M.assert_models_equal(M.read_nc4(url_of(folder, "nczarr,file")), stores.oracle(case), f"{case_name}.zip")
    dialect, model = read_nczmap(str(archive))
    assert dialect == "D3"
    M.assert_models_equal(model, stores.oracle(case), f"{case_name}.zip via nczmap")


@pytest.mark.parametrize("kind", ["nczmap-zarr", "nczmap-xarray"])
@pytest.mark.parametrize("case_name", list(CASES))
def test_libnetcdf_4_10_1_reads_nczmap_pure_zarr(stores, case_name, kind):
    case = CASES[case_name]
    oracle = stores.oracle(case)
    url = stores.url(case, kind)
    expected = expected_model(oracle, case, kind, stores.store(case, kind))
    theirs = M.read_nc4(url, skip_data=undecodable(oracle))
    M.assert_models_equal(theirs, expected, f"{case_name} {kind} via netCDF4")


def _zarr_arrays(store: Path) -> dict[str, dict]:
    found = {}
    for dirpath, _, filenames in os.walk(store):
        if ".zarray" in filenames:
            key = "/" + os.path.relpath(dirpath, store).replace(os.sep, "/")
            found[key] = json.loads(Path(dirpath, ".zarray").read_text())
    return found


def _zarr_python_can_read(meta: dict) -> bool:
    # zarr-python 3 rejects ">S1" (spec §4.1 note, bug 25: NCZarr char arrays) and "<i1"/"<u1"
    # (test_pure_zarr_one_byte_types_readable_by_zarr_python)
    return meta["dtype"] not in (">S1", "<i1", "<u1", ">i1", ">u1")


def _oracle_var(oracle: M.Model, key: str) -> M.Var:
    path, name = key.rsplit("/", 1)
    return oracle[path or "/"].vars[name]


def _as_stored(var: M.Var) -> np.ndarray:
    data = np.asarray(var.data)
    if var.type == "string":
        return np.array([s.encode() for s in data.ravel()], dtype=object).reshape(data.shape)
    return data


@pytest.mark.parametrize("kind", ["nczmap-zarr", "nczmap-xarray"])
@pytest.mark.parametrize("case_name", list(CASES))
def test_zarr_python_reads_nczmap_pure_zarr(stores, case_name, kind):
    zarr = pytest.importorskip("zarr")
    case = CASES[case_name]
    oracle = stores.oracle(case)
    store = stores.store(case, kind)
    arrays = _zarr_arrays(store)
    assert sorted(arrays) == sorted(
        M._join(path, name) for path, group in oracle.items() for name in group.vars
    )
    checked = 0
    for key, meta in arrays.items():
        if not _zarr_python_can_read(meta):
            continue
        var = _oracle_var(oracle, key)
        array = zarr.open_array(store=str(store), path=key.lstrip("/"), mode="r", zarr_format=2)
        assert array.attrs["_ARRAY_DIMENSIONS"] == (list(var.dims) or ["_scalar_"]), key
        assert array.shape == (var.shape or (1,)), key
        values = array[...]
        expected = _as_stored(var).reshape(array.shape)
        if var.type == "string":
            values = np.array([bytes(v) for v in values.ravel()], dtype=object).reshape(values.shape)
        M.assert_same_data(np.asarray(values), expected, key)
        checked += 1
    assert checked, "no array was checked"


@pytest.mark.parametrize("kind", ["nczmap-zarr", "nczmap-xarray"])
@pytest.mark.parametrize("case_name", list(CASES))
def test_xarray_reads_nczmap_pure_zarr(stores, case_name, kind):
    xarray = pytest.importorskip("xarray")
    case = CASES[case_name]
    oracle = stores.oracle(case)
    store = stores.store(case, kind)
    arrays = _zarr_arrays(store)
    opened = 0
    for path, group in oracle.items():
        keys = [M._join(path, name) for name in group.vars]
        if not keys or not all(_zarr_python_can_read(arrays[k]) for k in keys):
            continue  # xarray opens a whole group through zarr-python (see _zarr_python_can_read)
        with xarray.open_zarr(
            str(store),
            group=None if path == "/" else path.lstrip("/"),
            consolidated=False,
            mask_and_scale=False,
            decode_times=False,
        ) as ds:
            assert sorted(ds.variables) == sorted(group.vars)
            for name, var in group.vars.items():
                da = ds[name]
                assert da.dims == (var.dims or ("_scalar_",)), name
                expected = _as_stored(var).reshape(da.shape)
                values = da.values
                if var.type == "string":
                    values = np.array([bytes(v) for v in values.ravel()], dtype=object).reshape(da.shape)
                M.assert_same_data(np.asarray(values), expected, f"{path} {name}")
        opened += 1
    if not opened:
        pytest.skip("every group holds a char or 1-byte array (see _zarr_python_can_read)")


def test_pure_zarr_one_byte_types_readable_by_zarr_python(stores):
    zarr = pytest.importorskip("zarr")
    case = CASES["groups"]
    store = stores.store(case, "nczmap-xarray")
    array = zarr.open_array(store=str(store), path="g1/g2/u", mode="r", zarr_format=2)
    assert array[...].tolist() == stores.oracle(case)["/g1/g2"].vars["u"].data.tolist()


def test_pure_zarr_float32_attribute_spelled_shortest(stores):
    case = CASES["atomic"]
    store = stores.store(case, "nczmap-zarr")
    af = json.loads((store / "vf" / ".zattrs").read_text())["af"]
    assert af == [0.1, -1e30, 3.4028235e38]  # the CDL's spelling of the float values


def test_netcdf_version_4_9_0_refuses_what_4_9_0_cannot_read(tmp_path):
    """No string variables before 4.9.1, no unlimited dimensions before 4.9.3, 4.9.0 crashes on scalars."""
    dataset = nczmap.create_dataset(url_of(tmp_path / "x.file", "nczarr,file"), netcdf_version="4.9.0")
    dataset.create_dimension("x", 2)
    with pytest.raises(nczmap.FormatError, match="string"):
        dataset.create_variable("s", ("x",), "string")
    with pytest.raises(nczmap.FormatError, match="unlimited"):
        dataset.create_dimension("t", None)
    with pytest.warns(UserWarning, match="scalar"):
        dataset.create_variable("scalar", (), "int")
    dataset.close()


# =================================================================================== 3. updates
def snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            stat = path.stat()
            out[str(path.relative_to(root))] = (stat.st_mtime_ns, stat.st_ino, path.read_bytes())
    return out


def changed(before: dict, after: dict) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def private_copy(stores: Stores, case_name: str, kind: str, tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "copy.file"
    shutil.copytree(stores.store(CASES[case_name], kind), path)
    time.sleep(0.01)  # any rewrite shows in st_mtime_ns
    return path, url_of(path, KINDS[kind][1])


UPDATE_TARGETS = {"root": ("/", ""), "group": ("/g1", "g1/"), "variable": ("/g1/gv", "g1/gv/")}


def _target(dataset, path: str):
    node = dataset
    for part in [p for p in path.split("/") if p]:
        node = node.groups[part] if part in node.groups else node.variables[part]
    return node


def _change_one_attribute(url: str, target: str) -> None:
    dataset = nczmap.open_dataset(url, "a")
    _target(dataset, target).attrs["history"] = "changed by nczmap"
    dataset.close()


@pytest.mark.parametrize("kind", ["nc4-nczarr", "ncgen-nczarr"])
@pytest.mark.parametrize("target", list(UPDATE_TARGETS))
def test_update_keeps_every_other_object_and_attribute(stores, tmp_path, target, kind):
    """netcdf-c bugs 0/1 (§10, §11): open a D3 (4.10.1) or D1 (4.9.0) store for update, change one
    attribute, close; the writer's own netcdf-c still reads everything, plus the new attribute."""
    path, url = private_copy(stores, "groups", kind, tmp_path)
    node_path, directory = UPDATE_TARGETS[target]
    read_back = M.read_nc4 if kind == "nc4-nczarr" else (lambda u: ncdump(u, "groups"))
    before_dataset = read_back(url)
    before = snapshot(path)
    _change_one_attribute(url, node_path)
    touched = changed(before, snapshot(path))
    assert f"{directory}.zattrs" in touched
    own_metadata = {f"{directory}{name}" for name in (".zattrs", ".zgroup", ".zarray")}
    assert touched <= own_metadata, f"files outside {node_path}'s own metadata changed: {touched}"

    after_dataset = read_back(url)
    if kind == "nc4-nczarr":  # libnetcdf 4.10.1
        holder = after_dataset["/g1"].vars["gv"] if target == "variable" else after_dataset[node_path]
        assert holder.attrs[-1] == ("history", "char", "changed by nczmap")
        holder.attrs.pop()
        M.assert_models_equal(after_dataset, before_dataset, "after the update")
    else:  # Debian ncdump 4.9.0
        owner = "gv" if target == "variable" else ""
        added = [line for line in after_dataset.splitlines() if "changed by nczmap" in line]
        assert [line.strip() for line in added] == [f'{owner}:history = "changed by nczmap" ;']
        kept = [line for line in after_dataset.splitlines() if line not in added]
        assert kept == before_dataset.splitlines()


@pytest.mark.parametrize("target", list(UPDATE_TARGETS))
def test_update_rewrites_only_the_changed_zattrs(stores, tmp_path, target):
    path, url = private_copy(stores, "groups", "nc4-nczarr", tmp_path)
    node_path, directory = UPDATE_TARGETS[target]
    before = snapshot(path)
    _change_one_attribute(url, node_path)
    assert changed(before, snapshot(path)) == {f"{directory}.zattrs"}


def test_update_deleting_an_attribute_leaves_valid_json(stores, tmp_path):
    """netcdf-c bug 1: shorter rewrites left the old tail in the file and the dataset no longer opened."""
    path, url = private_copy(stores, "groups", "nc4-nczarr", tmp_path)
    before_model = M.read_nc4(url)
    dataset = nczmap.open_dataset(url, "a")
    del dataset.variables["rv"].attrs["long_name"]
    dataset.close()
    json.loads((path / "rv" / ".zattrs").read_text())  # strict JSON, nothing after it
    after_model = M.read_nc4(url)
    before_model["/"].vars["rv"].attrs = [
        a for a in before_model["/"].vars["rv"].attrs if a[0] != "long_name"
    ]
    M.assert_models_equal(after_model, before_model, "after deleting rv:long_name")


def test_update_data_rewrites_only_its_chunk(stores, tmp_path):
    path, url = private_copy(stores, "groups", "nc4-nczarr", tmp_path)
    before_model = M.read_nc4(url)
    before = snapshot(path)
    dataset = nczmap.open_dataset(url, "a")
    dataset.variables["rv"][0, 0] = 99
    dataset.groups["g1"].groups["g2"].variables["deep"][1, 3, 1] = -5
    dataset.close()
    assert changed(before, snapshot(path)) == {"rv/0.0", "g1/g2/deep/0.0.0"}
    after_model = M.read_nc4(url)
    before_model["/"].vars["rv"].data[0, 0] = 99
    before_model["/g1/g2"].vars["deep"].data[1, 3, 1] = -5
    M.assert_models_equal(after_model, before_model, "after writing two elements")


def test_update_appending_along_an_unlimited_dimension(stores, tmp_path):
    """Writing past the end of ``t`` grows it for every variable on it (§4.8); libnetcdf 4.10.1 agrees."""
    path, url = private_copy(stores, "strings", "nc4-nczarr", tmp_path)
    before_model = M.read_nc4(url)
    before = snapshot(path)
    dataset = nczmap.open_dataset(url, "a")
    dataset.variables["count"][3:5] = [4, 5]
    dataset.close()
    on_t = {"count", "temp", "be_f", "nodata_t"}
    touched = changed(before, snapshot(path))
    allowed = {".zattrs", ".zgroup", "count/0"} | {f"{n}/{o}" for n in on_t for o in (".zarray", ".zattrs")}
    assert {".zattrs", "count/0", "temp/.zarray"} <= touched <= allowed

    after_model = M.read_nc4(url)
    expected = before_model
    expected["/"].dims["t"] = (5, True)
    for name in on_t:
        var = expected["/"].vars[name]
        var.shape = (5, *var.shape[1:])
        grown = np.empty(var.shape, dtype=var.data.dtype)
        grown[:3] = var.data
        # new records: from a chunk netcdf-c completed with the fill value when it wrote the first records,
        # or from missing chunks, which read as the .zarray fill_value written with 6 digits (bug 19).
        # [obs] 4.10.1 pads a *big-endian* chunk with the fill's little-endian bytes (a netcdf-c bug
        # outside spec §11): both libnetcdf and nczmap then read those bytes as a tiny denormal.
        missing = missing_chunks(path, f"/{name}", var.shape)
        exact = M.fill_value(var.type, M.DEFAULT_FILL[var.type])
        padded = exact
        if name == "be_f":
            padded = M.number(np.frombuffer(np.array(exact, "<f4").tobytes(), ">f4")[0])
        lossy = c_lg(var.type, (exact,))[0] if var.type in ("float", "double") else exact
        grown[3:] = np.where(missing[3:], lossy, padded)
        var.data = grown
    expected["/"].vars["count"].data[3:] = [4, 5]
    M.assert_models_equal(after_model, expected, "after appending")
    _, ours = read_nczmap(url)
    assert ours["/"].dims["t"] == (5, True)
    for name in on_t:
        M.assert_same_data(ours["/"].vars[name].data, after_model["/"].vars[name].data, name)


@pytest.mark.parametrize(
    "kind", ["nc4-nczarr", "nc4-consolidated", "nc4-zarr", "ncgen-nczarr", "nczmap-4.9.2", "nczmap-4.8.0"]
)
def test_open_for_update_and_close_rewrites_nothing(stores, tmp_path, kind):
    path, url = private_copy(stores, "groups", kind, tmp_path)
    before = snapshot(path)
    nczmap.open_dataset(url, "a").close()
    nczmap.open_dataset(url, "r+").close()
    assert changed(before, snapshot(path)) == set()


def test_reading_missing_chunks_for_update_creates_none(stores, tmp_path):
    """netcdf-c bug 27: reading a missing chunk while open for writing materialises it on close."""
    path, url = private_copy(stores, "atomic", "nc4-nczarr", tmp_path)
    before = snapshot(path)
    assert missing_chunks(path, "/nodata_d", (3,)).all()
    dataset = nczmap.open_dataset(url, "a")
    for name in ("nodata_d", "nodata_f", "nodata_i", "part_d", "part_s"):
        dataset.variables[name][...]
    dataset.close()
    assert changed(before, snapshot(path)) == set()


def test_consolidated_update_refreshes_zmetadata(stores, tmp_path):
    """netcdf-c bug 30: after an update ``/.zmetadata`` must show it to consolidated readers."""
    path, url = private_copy(stores, "groups", "nc4-consolidated", tmp_path)
    before = snapshot(path)
    _change_one_attribute(url, "/g1/gv")
    touched = changed(before, snapshot(path))
    assert {".zmetadata", "g1/gv/.zattrs"} <= touched
    metadata = json.loads((path / ".zmetadata").read_text())["metadata"]
    assert metadata["g1/gv/.zattrs"]["history"] == "changed by nczmap"
    assert metadata["g1/gv/.zattrs"]["units"] == "K"
    with netCDF4.Dataset(url) as dataset:  # mode=nczarr,file,consolidated: reads /.zmetadata
        assert dataset["g1/gv"].getncattr("history") == "changed by nczmap"
        assert dataset["g1/gv"].getncattr("units") == "K"
    # what libnetcdf wrote there at creation is otherwise the same
    for key in ("rv/.zattrs", "g1/.zattrs", "g1/g2/deep/.zarray"):
        assert metadata[key] == json.loads((path / key).read_text()), key


# =================================================================================== 4. fixtures
# fixture -> (CDL it is documented by, dialect, URL mode, renames needed by Debian ncgen 4.9.0)
FIXTURE_ZIPS = {
    "ref_oldkeys.file.zip": ("ref_oldkeys.cdl", "D2", "nczarr"),
    "ref_oldformat.zip": ("ref_oldformat.cdl", "D3", "nczarr"),
    "ref_byte.zarr.zip": ("ref_byte.cdl", "PZ", "zarr"),
    "ref_byte_fill_value_null.zarr.zip": ("ref_byte_fill_value_null.cdl", "PZ", "zarr"),
    "ref_power_901_constants_orig.zip": ("ref_power_901_constants.cdl", "PZ", "xarray"),
    "ref_quotes_orig.zip": ("ref_quotes.cdl", "PZ", "zarr"),
}
# ncgen 4.9.0 rejects a variable called "byte" (a CDL keyword): compile it renamed, rename back
CDL_RENAMES = {"ref_byte.cdl": ("byte", "byte_")}


def fixture(name: str) -> Path:
    path = FIXTURES / name
    if not path.exists():
        pytest.skip(f"netcdf-c fixture {name} not found under {FIXTURES} (set NCZMAP_NETCDF_FIXTURES)")
    return path


def cdl_oracle(cdl_name: str, tmp_path: Path) -> tuple[M.Model, bool]:
    """The fixture CDL compiled by ncgen, and whether the CDL states data."""
    text = fixture(cdl_name).read_text()
    old, new = CDL_RENAMES.get(cdl_name, (None, None))
    if old:
        text = text.replace(f" {old}(", f" {new}(").replace(f"\t\t{old}:", f"\t\t{new}:")
        text = text.replace(f" {old} =", f" {new} =")
    source = tmp_path / cdl_name
    source.write_text(text)
    run([NCGEN, "-4", "-o", str(tmp_path / "oracle.nc"), str(source)])
    model = M.read_nc4(str(tmp_path / "oracle.nc"))
    if old:
        for group in model.values():
            group.vars = {(old if n == new else n): v for n, v in group.vars.items()}
    return model, "\ndata:" in text


def unzip(archive: Path, tmp_path: Path) -> Path:
    """The dataset folder of a netcdf-c zip (first segment of entry 0, spec §1.6) on disk."""
    with zipfile.ZipFile(archive) as zf:
        folder = zf.namelist()[0].split("/", 1)[0]
        zf.extractall(tmp_path / "unzipped")
    return tmp_path / "unzipped" / folder


def fixture_fill(dataset_dir: Path, key: str) -> object:
    """The ``fill_value`` the fixture's .zarray states (the CDLs omit it unless ``_NoFill``)."""
    value = json.loads((dataset_dir / key.lstrip("/") / ".zarray").read_text())["fill_value"]
    return "NaN" if value == "NaN" else value


@pytest.mark.parametrize("driver", ["zip", "file"])
@pytest.mark.parametrize("name", list(FIXTURE_ZIPS))
def test_fixture_matches_its_cdl(tmp_path, name, driver):
    cdl_name, dialect, mode = FIXTURE_ZIPS[name]
    archive = fixture(name)
    unzipped = unzip(archive, tmp_path)
    url = f"file://{archive}#mode={mode},zip" if driver == "zip" else url_of(unzipped, f"{mode},file")
    found_dialect, model = read_nczmap(url)
    assert found_dialect == dialect

    expected, has_data = cdl_oracle(cdl_name, tmp_path)
    if not has_data:  # header-only CDL (ncdump -h): libnetcdf 4.10.1 reading the fixture gives the data
        theirs = M.read_nc4(url_of(unzipped, f"{mode},file"))
        for path, group in expected.items():
            for var_name, var in group.vars.items():
                var.data = theirs[path].vars[var_name].data
    for path, group in expected.items():
        for var_name, var in group.vars.items():
            var.fill = fixture_fill(unzipped, M._join(path, var_name))
    M.assert_models_equal(model, expected, name)


@pytest.mark.parametrize("mode", ["zarr,file", "zarr,file,consolidated", "nczarr,file"])
def test_ref_data_zarr(mode):
    """Pure Zarr from zarr-python: consolidated metadata, int64, blosc (no CDL: libnetcdf 4.10.1 reads it)."""
    store = fixture("ref_data.zarr")
    dialect, model = read_nczmap(url_of(store, mode))
    assert dialect == "PZ"
    expected = M.read_nc4(url_of(store, "zarr,file"))
    expected["/"].vars["data"].fill = fixture_fill(store, "/data")  # 0 (the model's fill is _FillValue's)
    M.assert_models_equal(model, expected, "ref_data.zarr")
    dataset = nczmap.open_dataset(url_of(store, mode))
    assert dataset.consolidated is True  # /.zmetadata is there and valid
    assert dataset.variables["data"].nctype.name == "int64"
    dataset.close()


def test_noshape_fixture_skips_v(tmp_path):
    """``v`` has ``shape: []`` but ``_ARRAY_DIMENSIONS ["d0"]`` (§5.3): the dataset opens without it."""
    for url in (
        f"file://{fixture('ref_noshape.file.zip')}#mode=zarr,zip",
        url_of(unzip(fixture("ref_noshape.file.zip"), tmp_path), "zarr,file"),
    ):
        with pytest.warns(UserWarning, match="'/v'"):
            dataset = nczmap.open_dataset(url)
        assert "v" not in dataset.variables
        assert [key for key, _ in dataset.problems] == ["/v"]
        dataset.close()


def copy_tree(source: Path, target: Path) -> None:
    """Copy without the fixture's read-only modes."""
    for dirpath, _, filenames in os.walk(source):
        folder = target / Path(dirpath).relative_to(source)
        folder.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            (folder / name).write_bytes(Path(dirpath, name).read_bytes())


@pytest.mark.parametrize("mode", ["zarr,file", "zarr,file,consolidated"])
def test_unknown_codec_fails_only_data_access(tmp_path, mode):
    """``run_filter_errors.sh``: the codec id replaced by ``faultycodecname`` (§6)."""
    store = tmp_path / "ref_data.zarr"
    copy_tree(fixture("ref_data.zarr"), store)
    for key in ("data/.zarray", ".zmetadata"):
        text = (store / key).read_text()
        assert '"blosc"' in text
        (store / key).write_text(text.replace('"blosc"', '"faultycodecname"'))
    dataset = nczmap.open_dataset(url_of(store, mode))
    variable = dataset.variables["data"]
    assert (variable.shape, variable.nctype.name) == ((10,), "int64")
    with pytest.raises(nczmap.FormatError, match=r"unsupported codec: \(faultycodecname\)"):
        variable[...]
    dataset.close()


# =================================================================================== 5. broken metadata
def _set_json(path: Path, update) -> None:
    document = json.loads(path.read_text())
    update(document)
    path.write_text(json.dumps(document))


BREAKAGES = {
    "invalid-json": lambda d: (d / "vi/.zarray").write_text('{"zarr_format": 2, "shape": [3,'),
    "dtype-bool": lambda d: _set_json(d / "vi/.zarray", lambda j: j.update(dtype="|b1")),
    "dtype-unicode": lambda d: _set_json(d / "vi/.zarray", lambda j: j.update(dtype="<U7")),
    "dtype-complex": lambda d: _set_json(d / "vi/.zarray", lambda j: j.update(dtype="<c8")),
    "zarray-not-object": lambda d: (d / "vi/.zarray").write_text("[3, 4]"),
    "missing-dimension": lambda d: _set_json(
        d / "vi/.zattrs", lambda j: j["_nczarr_array"].update(dimension_references=["/x", "/nope"])
    ),
    "size-mismatch": lambda d: _set_json(d / "vi/.zarray", lambda j: j.update(shape=[3, 5])),
}
NCZARR_ONLY = {"missing-dimension", "size-mismatch"}


@pytest.mark.parametrize("kind", ["nc4-nczarr", "nc4-zarr"])
@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_broken_array_is_skipped_alone(stores, tmp_path, breakage, kind):
    if breakage in NCZARR_ONLY and is_pure(kind):
        pytest.skip("pure Zarr has no dimension references")
    case = CASES["atomic"]
    path, url = private_copy(stores, "atomic", kind, tmp_path)
    BREAKAGES[breakage](path)
    with pytest.warns(UserWarning, match="'/vi'") as caught:
        dataset = nczmap.open_dataset(url)
    assert len([w for w in caught if issubclass(w.category, UserWarning)]) == 1
    assert [key for key, _ in dataset.problems] == ["/vi"]
    assert "vi" not in dataset.variables
    model = M.nczmap_model(dataset)
    dataset.close()
    expected = expected_model(stores.oracle(case), case, kind, stores.store(case, kind))
    del expected["/"].vars["vi"]
    M.assert_models_equal(model, expected, f"atomic {kind} without vi")


@pytest.mark.parametrize("kind", ["nc4-nczarr", "nc4-zarr"])
@pytest.mark.parametrize("content", ["[1, 2]", '"zarr"', "42", '{"zarr_format": 2,'])
def test_root_zgroup_not_an_object(stores, tmp_path, kind, content):
    path, url = private_copy(stores, "groups", kind, tmp_path)
    (path / ".zgroup").write_text(content)
    if kind == "nc4-nczarr":
        # 4.9.3+ (D3) keeps everything in .zattrs: nczmap does not spend a request on .zgroup there
        with nczmap.open_dataset(url) as dataset:
            assert dataset.dialect.code == "D3"
        (path / ".zattrs").write_text(content)
        with pytest.raises(nczmap.FormatError, match=r"'/\.zattrs'"):
            nczmap.open_dataset(url)
        return
    with pytest.raises(nczmap.FormatError, match=r"'/\.zgroup'"):
        nczmap.open_dataset(url)


@pytest.mark.parametrize(
    "codecs", [{"compressor": "zlib"}, {"filters": ["shuffle"]}, {"filters": {"id": "zlib"}}]
)
def test_malformed_codec_config_is_a_format_error(stores, tmp_path, codecs):
    path, url = private_copy(stores, "atomic", "nc4-nczarr", tmp_path)
    _set_json(path / "vi/.zarray", lambda j: j.update(codecs))
    with pytest.warns(UserWarning, match="skipping array '/vi'"):
        dataset = nczmap.open_dataset(url)  # the array is refused at open time, the dataset opens
    with dataset:
        assert "vi" not in dataset.variables
        assert [key for key, _ in dataset.problems] == ["/vi"]


MORE_BREAKAGES = {
    "fill-not-a-number": ("vi/.zarray", lambda j: j.update(fill_value="abc")),
    "fill-object": ("vi/.zarray", lambda j: j.update(fill_value={})),
    "fill-out-of-range": ("vb/.zarray", lambda j: j.update(fill_value=1000)),
    "fill-list": ("vf/.zarray", lambda j: j.update(fill_value=[1])),
    "chunks-zero": ("vi/.zarray", lambda j: j.update(chunks=[0, 4])),
    "shape-negative": ("vi/.zarray", lambda j: j.update(shape=[-3, 4])),
    "shape-string": ("vi/.zarray", lambda j: j.update(shape="3")),
    "separator": ("vi/.zarray", lambda j: j.update(dimension_separator=5)),
    "order": ("vi/.zarray", lambda j: j.update(order="X")),
    "zarr-format-3": ("vi/.zarray", lambda j: j.update(zarr_format=3)),
    "dtype-number": ("vi/.zarray", lambda j: j.update(dtype=5)),
    "dtype-record": ("vi/.zarray", lambda j: j.update(dtype=[["a", "<i4"]])),
    "codec-unknown": ("vi/.zarray", lambda j: j.update(compressor={"id": "faultycodecname"})),
    "codec-no-id": ("vi/.zarray", lambda j: j.update(compressor={"level": 1})),
    "codec-bad-level": ("vi/.zarray", lambda j: j.update(compressor={"id": "zlib", "level": "x"})),
    "dimrefs-string": ("vi/.zattrs", lambda j: j["_nczarr_array"].update(dimension_references="/x")),
    "dimrefs-numbers": ("vi/.zattrs", lambda j: j["_nczarr_array"].update(dimension_references=[1, 2])),
    "types-list": ("vi/.zattrs", lambda j: j.update(_nczarr_attr={"types": [1]})),
    "type-number": ("vi/.zattrs", lambda j: j["_nczarr_attr"]["types"].update(units=5)),
    "attr-mixed-list": ("vi/.zattrs", lambda j: j.update(mixed=[1, "a"])),
    "attr-empty-list": ("vi/.zattrs", lambda j: j.update(empty=[])),
    "attr-nested-list": ("vi/.zattrs", lambda j: j.update(nested=[[1], [2]])),
    "attr-out-of-range": (
        "vi/.zattrs",
        lambda j: (j.update(x=1000), j["_nczarr_attr"]["types"].update(x="<i1")),
    ),
    "group-dims-list": (".zattrs", lambda j: j["_nczarr_group"].update(dimensions=[1])),
    "group-dim-negative": (".zattrs", lambda j: j["_nczarr_group"]["dimensions"].update(x=-1)),
    "group-dim-no-size": (".zattrs", lambda j: j["_nczarr_group"]["dimensions"].update(x={"unlimited": 1})),
    "group-arrays-string": (".zattrs", lambda j: j["_nczarr_group"].update(arrays="vi")),
    "group-info-list": (".zattrs", lambda j: j.update(_nczarr_group=[1])),
    "superblock-string": (".zattrs", lambda j: j.update(_nczarr_superblock="2.0.0")),
    "ncproperties-number": (".zattrs", lambda j: j.update(_NCProperties=5)),
}


@pytest.mark.parametrize("breakage", list(MORE_BREAKAGES))
def test_broken_metadata_raises_only_nczmap_errors(stores, tmp_path, breakage):
    """Whatever the damage, nczmap fails with its own errors (or copes), never a bare Python one."""
    path, url = private_copy(stores, "atomic", "nc4-nczarr", tmp_path)
    key, update = MORE_BREAKAGES[breakage]
    _set_json(path / key, update)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            dataset = nczmap.open_dataset(url)
        except nczmap.NCZError:
            return
    try:
        for group in dataset.walk():
            for variable in group.variables.values():
                with contextlib.suppress(nczmap.NCZError):
                    variable[...]
            for name in group.attrs:
                group.attrs.typed(name)
    finally:
        dataset.close()
