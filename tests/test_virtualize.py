"""``nczmap virtualize``: manifests of references into netCDF-4/HDF5 files, checked against real programs.

Expected output always comes from something other than nczmap: real ``ncgen``/``ncdump`` (Debian
netcdf-bin) for the CDL, netCDF4-python (libnetcdf + HDF5 + netcdf-c's filter plugins) or h5py for values,
numpy for concatenations, kerchunk for chunk byte ranges.
"""

from __future__ import annotations

import base64
import json
import os
import pty
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from kerchunk_oracle import kerchunk_hdf_references

import nczmap
from nczmap import AccessDenied, FormatError, StorageError

h5py = pytest.importorskip("h5py")
netCDF4 = pytest.importorskip("netCDF4")

from nczmap.integrations.virtualize import VirtualizeWarning, virtualize  # noqa: E402

NCGEN = shutil.which("ncgen")
NCDUMP = shutil.which("ncdump")
CDL_DIR = Path(__file__).resolve().parents[1] / "conformance" / "cdl"
CORPUS = sorted(path.stem for path in CDL_DIR.glob("*.cdl"))
TIMEOUT = 120

# Corpus files with variables virtualize refuses: variable -> words the refusal must contain.
NC_STRING = ("NC_STRING", "global heap")
REFUSED: dict[str, dict[str, tuple[str, ...]]] = {}  # nothing of the corpus is refused (NC_STRING is loaded)
# Lines where real ncdump 4.9.0 of the HDF5 file legitimately differs (the conformance suite's reasons).
FOREIGN_DIM = (b"int e(/w, x)", b"int e(/g3/w, x)")  # ncdump 4.9's searchgroupdim bug, fixed in 4.10
NOFILL_GARBAGE = re.compile(rb"^ ff = .*\n", re.MULTILINE)  # never-written no-fill data: HDF5 gives garbage
UNREADABLE_BY_NETCDF4_PYTHON = {"foreign_dim"}  # it cannot open a file using a non-ancestor group's dimension


def nczmap_command(*args: str | Path, **options) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nczmap", *map(str, args)],
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
        **options,
    )


def run(*args: str | Path) -> bytes:
    done = subprocess.run(list(map(str, args)), capture_output=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, f"{args} failed: {done.stderr.decode(errors='replace')}"
    return done.stdout


def manifest_url(path: Path) -> str:
    return f"file://{path}#mode=nczarr,manifest"


def ncgen(name: str, folder: Path) -> Path:
    if NCGEN is None or NCDUMP is None:
        pytest.skip("netcdf-c ncgen/ncdump not on PATH")
    target = folder / f"{name}.nc"
    run(NCGEN, "-4", "-o", target, CDL_DIR / f"{name}.cdl")
    return target


def without_variables(cdl: bytes, names: set[str]) -> bytes:
    """Real ncdump output of a root group with the named variables (declarations, attributes, data
    entries with the blank line after each) taken out, and the ``variables:``/``data:`` headings when
    nothing is left under them."""
    kept: list[bytes] = []
    in_entry = drop_blank = False
    for line in cdl.splitlines(keepends=True):
        text = line.decode("utf-8", "surrogateescape")
        if in_entry:
            in_entry = not text.rstrip("\n").endswith(" ;")
            drop_blank = not in_entry
            continue
        if drop_blank and text == "\n":
            drop_blank = False
            continue
        drop_blank = False
        if any(re.match(rf"^\t[\w ]+ {re.escape(n)}[( ;]|^\t\t(\w+ )?{re.escape(n)}:", text) for n in names):
            continue
        if any(re.match(rf"^ {re.escape(n)} =[ \n]", text) for n in names):
            in_entry = not text.rstrip("\n").endswith(" ;")
            drop_blank = not in_entry
            continue
        kept.append(line)
    text = b"".join(kept)
    text = re.sub(rb"variables:\n(?=\n// global attributes:|}\n)", b"", text)
    return re.sub(rb"data:\n\n(?=}\n)", b"", text)


def values_by_netcdf4(path: Path) -> dict[str, np.ndarray]:
    """Every variable's values as netCDF4-python reads them (no masking, no char-to-string); where it
    cannot (a dimension shadowed by a nearer one of the same name confuses it), h5py's."""
    found: dict[str, np.ndarray] = {}
    with netCDF4.Dataset(path) as source, h5py.File(path, "r") as raw:
        source.set_auto_maskandscale(False)
        source.set_auto_chartostring(False)
        groups = [source]
        while groups:
            group = groups.pop()
            groups.extend(group.groups.values())
            for name, variable in group.variables.items():
                key = group.path.rstrip("/") + "/" + name
                try:
                    found[key] = np.asarray(variable[...])
                except (RuntimeError, IndexError):
                    found[key] = raw[key][...]
    return found


def values_by_h5py(path: Path) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as raw:

        def visit(name, item):
            if isinstance(item, h5py.Dataset) and not item.attrs.get("NAME", b"").startswith(b"This is a"):
                found["/" + name] = item[...]

        raw.visititems(visit)
    return found


def assert_same_values(
    manifest: Path, expected: dict[str, np.ndarray], refused: set[str] = frozenset(), unchecked=frozenset()
) -> None:
    """The manifest holds every expected variable but the refused ones, with the same values (but the
    ``unchecked`` ones), dtypes and shapes."""
    with nczmap.open_dataset(manifest_url(manifest)) as dataset:
        ours = {v.key: v for g in dataset.walk() for v in g.variables.values()}
        assert set(ours) == set(expected) - set(refused)
        for key, want in expected.items():
            if key in refused or key in unchecked:
                continue
            got = ours[key][...]
            assert got.shape == want.shape, key
            if want.dtype.kind == "U":  # netCDF4-python gives a scalar NC_STRING as <U, arrays as objects
                want = want.astype(object)
            assert got.dtype == want.dtype.newbyteorder("="), key
            assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), key


# ----------------------------------------------------------------------------------------- the corpus
@pytest.mark.parametrize("name", CORPUS)
def test_corpus_virtualizes_to_the_real_ncdump(tmp_path, name):
    source = ncgen(name, tmp_path)
    refs = tmp_path / "refs.json"
    done = nczmap_command("virtualize", source, refs)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.decode().splitlines()
    refused = REFUSED.get(name, {})
    assert len(lines) == len(refused), lines
    for variable, words in refused.items():
        line = next(w for w in lines if f"variable {variable!r}" in w)
        assert str(source) in line and all(word in line for word in words), line

    listing = nczmap_command("ncdump", "-n", name, manifest_url(refs))
    assert listing.returncode == 0, listing.stderr
    expected = run(NCDUMP, source)
    assert expected.startswith(f"netcdf {name} {{".encode())
    actual = listing.stdout
    if refused:
        expected = without_variables(expected, {v.rsplit("/", 1)[1] for v in refused})
    if name == "foreign_dim":
        assert FOREIGN_DIM[0] in expected
        expected = expected.replace(*FOREIGN_DIM)
    if name == "nofill":
        actual, expected = NOFILL_GARBAGE.sub(b"", actual), NOFILL_GARBAGE.sub(b"", expected)
    assert actual.decode(errors="replace") == expected.decode(errors="replace")


@pytest.mark.parametrize("name", CORPUS)
def test_corpus_values_equal_netcdf4_python(tmp_path, name):
    source = ncgen(name, tmp_path)
    refs = tmp_path / "refs.json"
    if name in REFUSED:
        with pytest.warns(VirtualizeWarning):
            result = virtualize([source], refs)
    else:
        result = virtualize([source], refs)
    assert {r.variable for r in result.refused} == set(REFUSED.get(name, {}))
    try:
        expected = values_by_netcdf4(source)
    except AttributeError:
        assert name in UNREADABLE_BY_NETCDF4_PYTHON
        expected = values_by_h5py(source)
    # never written, no fill: HDF5 leaves the reader's buffer as it was
    unchecked = {"/ff"} if name == "nofill" else set()
    assert_same_values(refs, expected, set(REFUSED.get(name, {})), unchecked)


# -------------------------------------------------------------------------------- codecs and layouts
def write_compressed(path: Path) -> dict[str, np.ndarray]:
    """Chunked and contiguous variables, zlib/shuffle/fletcher32, an unlimited dimension with chunks
    never written, big-endian data; returns what was written."""
    rng = np.random.default_rng(7)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("y", 30)
        ds.createDimension("x", 40)
        specs = {
            "deflate": ("f4", ("y", "x"), dict(zlib=True, complevel=6, chunksizes=(10, 16))),
            "shuffled": ("i4", ("y", "x"), dict(zlib=True, shuffle=True, chunksizes=(7, 40))),
            "checked": ("i2", ("y", "x"), dict(zlib=True, shuffle=True, fletcher32=True, chunksizes=(8, 8))),
            "checked_only": ("f8", ("y", "x"), dict(fletcher32=True, chunksizes=(15, 20))),
            "big_chunked": (
                ">f8",
                ("y", "x"),
                dict(zlib=True, shuffle=True, endian="big", chunksizes=(5, 5)),
            ),
            "big_plain": (">i4", ("y", "x"), dict(contiguous=True, endian="big")),
            "plain": ("u2", ("y", "x"), dict(contiguous=True)),
            "records": ("f4", ("time", "x"), dict(zlib=True, chunksizes=(2, 16), fill_value=-1.5)),
            "series": ("i8", ("time",), dict(chunksizes=(4,))),
        }
        variables = {
            name: ds.createVariable(name, kind, dims, **options)
            for name, (kind, dims, options) in specs.items()
        }
        written = {}
        for name in ("deflate", "checked_only", "big_chunked"):
            written[name] = rng.normal(size=(30, 40)).astype(variables[name].dtype)
        for name in ("shuffled", "checked", "big_plain", "plain"):
            kind = np.dtype(variables[name].dtype).newbyteorder("=")
            written[name] = rng.integers(np.iinfo(kind).min, np.iinfo(kind).max, size=(30, 40), dtype=kind)
        for name, values in written.items():
            variables[name][:] = values
        variables["series"][:] = np.arange(10) * 3
        variables["records"][0:2, :] = 1.0  # records 2..9 of columns 16..39 and others stay unwritten
        variables["records"][8, 0:16] = 2.0
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        return {f"/{name}": ds[name][...] for name in ds.variables}


def test_compressed_chunked_contiguous_and_big_endian_values(tmp_path):
    source = tmp_path / "compressed.nc"
    expected = write_compressed(source)
    refs = tmp_path / "refs.json"
    result = virtualize([source], refs)
    assert result.refused == [] and result.references > 0
    assert_same_values(refs, expected)
    with h5py.File(source) as raw:
        allocated = raw["records"].id.get_num_chunks()
    grid = (10 // 2) * (40 // 16 + 1)
    assert 0 < allocated < grid  # the unwritten records really are missing chunks
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        records = ds.variables["records"]
        assert records.fill_value == np.float32(-1.5)
        present = [k for k in ds.zmap.search("/records") if not k.startswith(".")]
        assert len(present) == allocated
        assert ds.variables["big_plain"].layout.dtype.storage == np.dtype(">i4")
        assert ds.variables["big_chunked"].layout.dtype.storage == np.dtype(">f8")
        assert ds.variables["checked"].layout.codecs.configs == [
            {"id": "fletcher32"},
            {"id": "shuffle", "elementsize": 2},
            {"id": "zlib", "level": 4},
        ]
        assert ds.dimensions["time"].unlimited and ds.dimensions["time"].size == 10


def test_references_are_the_byte_ranges_kerchunk_finds(tmp_path):
    """kerchunk reads HDF5's chunk index on its own: every reference must be one of its ranges."""
    pytest.importorskip("kerchunk.hdf")
    source = tmp_path / "compressed.nc"
    write_compressed(source)
    refs = tmp_path / "refs.json"
    virtualize([source], refs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kerchunk leaves fletcher32 variables out, with a warning each
        theirs = kerchunk_hdf_references(str(source), inline_threshold=0)["refs"]
    ours = json.loads(refs.read_text())["refs"]
    checked = 0
    for key, value in ours.items():
        if isinstance(value, list) and key.split("/")[0] not in ("checked", "checked_only"):
            url, offset, length = value
            assert url == source.resolve().as_uri()
            assert theirs[key][1:] == [offset, length], key
            checked += 1
    assert checked > 20


def test_fsspec_and_zarr_read_the_manifest_as_it_is(tmp_path):
    """The manifest is plain kerchunk JSON: fsspec's reference filesystem and zarr-python read it alone."""
    fsspec = pytest.importorskip("fsspec")
    zarr = pytest.importorskip("zarr")
    source = tmp_path / "compressed.nc"
    expected = write_compressed(source)
    refs = tmp_path / "refs.json"
    virtualize([source], refs)
    mapper = fsspec.filesystem("reference", fo=str(refs)).get_mapper("")
    group = zarr.open_group(mapper, mode="r", zarr_format=2)
    for name in ("deflate", "checked", "big_chunked", "plain", "records"):
        assert np.array_equal(group[name][...], expected[f"/{name}"]), name


def test_a_large_contiguous_variable_is_split_into_whole_rows(tmp_path):
    source = tmp_path / "large.nc"
    values = np.arange(1024 * 1024 * 1.5, dtype="f8").reshape(1536, 1024)  # 12 MiB
    with netCDF4.Dataset(source, "w") as ds:
        ds.createDimension("y", 1536)
        ds.createDimension("x", 1024)
        ds.createVariable("v", "f8", ("y", "x"), contiguous=True)[:] = values
    refs = tmp_path / "refs.json"
    virtualize([source], refs)
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        variable = ds.variables["v"]
        assert variable.chunks == (512, 1024)  # 4 MiB of whole rows; 512 divides 1536
        assert np.array_equal(variable[...], values)
        assert np.array_equal(variable[700:705, 3:9], values[700:705, 3:9])


@pytest.mark.parametrize(
    ("compression", "support"),
    [("zstd", "__has_zstandard_support__"), ("bzip2", "__has_bzip2_support__"),
     ("blosc_lz4", "__has_blosc_support__"), ("blosc_zstd", "__has_blosc_support__")],
)  # fmt: skip
def test_netcdf_c_plugin_filters_decode_identically(tmp_path, compression, support):
    """netcdf-c's HDF5 plugins for zstd, bzip2 and blosc write what numcodecs decodes (checked value by
    value against netCDF4-python, which decodes through the plugins themselves)."""
    if not getattr(netCDF4, support, False):
        pytest.skip(f"netCDF4-python was built without {compression}")
    source = tmp_path / f"{compression}.nc"
    values = (np.arange(6000, dtype="f8").reshape(60, 100) * 1.37) % 97
    with netCDF4.Dataset(source, "w") as ds:
        ds.createDimension("y", 60)
        ds.createDimension("x", 100)
        ds.createVariable("v", "f8", ("y", "x"), chunksizes=(20, 50), compression=compression)[:] = values
    refs = tmp_path / "refs.json"
    assert virtualize([source], refs).refused == []
    assert_same_values(refs, values_by_netcdf4(source))


def test_what_nczarr_cannot_hold_is_refused_by_name_and_reason_the_rest_loaded(tmp_path):
    source = tmp_path / "awkward.nc"
    with netCDF4.Dataset(source, "w") as ds:
        ds.createDimension("n", 3)
        ds.createVariable("fine", "i4", ("n",))[:] = [1, 2, 3]
        pair = ds.createCompoundType(np.dtype([("a", "i4"), ("b", "f8")]), "pair")
        ds.createVariable("compound", pair, ("n",))
        colour = ds.createEnumType("u1", "colour", {"red": 0, "green": 1})
        ds.createVariable("enum", colour, ("n",), fill_value=0)
        ds.createVariable("vlen", ds.createVLType("i4", "ragged"), ("n",))
        ds.createVariable("text", str, ("n",))[:] = np.array(["a", "bb", "ccc"], dtype=object)
        ds.createVariable("checked8", "f8", ("n",), shuffle=True, fletcher32=True, zlib=True)[:] = [1, 2, 3]
    with h5py.File(source, "a") as raw:
        raw.create_dataset("lzf", data=np.arange(100, dtype="i4"), chunks=(10,), compression="lzf")
        masked = raw.create_dataset(
            "masked", data=np.arange(100, dtype="i4"), chunks=(10,), compression="gzip"
        )
        masked.id.write_direct_chunk((10,), np.arange(10, 20, dtype="i4").tobytes(), filter_mask=1)
        raw["fine"].attrs["odd"] = np.zeros(1, dtype=[("a", "i4"), ("b", "f4")])
    refs = tmp_path / "refs.json"
    with pytest.warns(VirtualizeWarning) as caught:
        result = virtualize([source], refs)
    [odd] = [r for r in result.refused if r.attribute is not None]
    assert (odd.variable, odd.attribute) == ("/fine", "odd") and "user-defined" in odd.reason
    reasons = {r.variable: r.reason for r in result.refused if r.attribute is None}
    assert "compound" in reasons["/compound"]
    assert "enum" in reasons["/enum"]
    assert "vlen" in reasons["/vlen"]
    assert set(reasons) == {"/compound", "/enum", "/vlen"}
    # what is not byte ranges one codec chain decodes is loaded, not refused
    assert sorted(result.loaded) == ["/checked8", "/lzf", "/masked", "/text"]
    assert len(caught) == len(reasons) + 1
    assert all(str(source) in str(w.message) for w in caught)
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        assert set(ds.variables) == {"fine", "text", "checked8", "lzf", "masked"}
        assert ds.variables["fine"][...].tolist() == [1, 2, 3]
        assert ds.variables["text"][...].tolist() == ["a", "bb", "ccc"]
        assert ds.variables["checked8"][...].tolist() == [1, 2, 3]
        assert ds.variables["lzf"][...].tolist() == list(range(100))
        assert ds.variables["masked"][...].tolist() == list(range(100))
        assert "odd" not in ds.variables["fine"].attrs


def test_a_plain_hdf5_file_gets_netcdf_cs_phony_dimensions(tmp_path):
    """A file h5py wrote (no dimension scales, a user block): dimensions named as netCDF-C names them."""
    source = tmp_path / "plain.h5"
    with h5py.File(source, "w", userblock_size=512) as raw:
        raw.create_dataset("a", data=np.arange(12, dtype="i4").reshape(3, 4))
        raw.create_dataset("square", data=np.arange(9.0).reshape(3, 3))
        raw.create_dataset("big", data=np.arange(300000, dtype=">f8"))
        raw.attrs["title"] = "plain"
    refs = tmp_path / "refs.json"
    virtualize([source], refs)
    expected = values_by_netcdf4(source)
    assert_same_values(refs, expected)
    with netCDF4.Dataset(source) as theirs, nczmap.open_dataset(manifest_url(refs)) as ours:
        assert list(ours.dimensions) == list(theirs.dimensions)
        for name, variable in theirs.variables.items():
            assert ours.variables[name].dimensions == variable.dimensions
        assert ours.attrs["title"] == theirs.title


# ------------------------------------------------------------------------------------------- concat
def write_part(path: Path, start: int, count: int, ny: int = 3) -> None:
    rng = np.random.default_rng(start)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("y", ny)
        ds.createDimension("x", 5)
        ds.title = f"part from {start:04d}"
        ds.createVariable("time", "f8", ("time",), chunksizes=(4,))[:] = np.arange(start, start + count)
        field = ds.createVariable("field", "f4", ("time", "y", "x"), zlib=True, chunksizes=(2, ny, 5))
        field[:] = rng.random((count, ny, 5), dtype="f4")
        columns = ds.createVariable("columns", "i4", ("y", "time"), chunksizes=(ny, 2))
        columns[:] = rng.integers(0, 99, (ny, count))
        static = ds.createVariable("static", "i2", ("y", "x"), contiguous=True)
        static[:] = np.arange(ny * 5).reshape(ny, 5) + start


def assert_joined_as_netcdf4_reads(ds, parts) -> None:
    """``ds`` holds the parts' time, field and columns joined along time, as netCDF4-python reads them."""
    sources = [netCDF4.Dataset(p) for p in parts]
    try:
        for name, axis in (("time", 0), ("field", 0), ("columns", 1)):
            expected = np.concatenate([np.ma.getdata(s[name][...]) for s in sources], axis=axis)
            assert np.array_equal(ds.variables[name][...], expected), name
    finally:
        for source in sources:
            source.close()


def test_concat_along_time_equals_numpy_concatenation(tmp_path):
    parts = [tmp_path / f"part{i}.nc" for i in range(3)]
    for path, (start, count) in zip(parts, [(0, 4), (4, 8), (12, 3)], strict=True):
        write_part(path, start, count)
    refs = tmp_path / "refs.json"
    result = virtualize(parts, refs, concat="time")
    assert result.refused == []
    with nczmap.open_dataset(manifest_url(refs)) as ds, netCDF4.Dataset(parts[0]) as first:
        assert ds.dimensions["time"].size == 15 and ds.dimensions["time"].unlimited
        assert_joined_as_netcdf4_reads(ds, parts)
        assert np.array_equal(ds.variables["static"][...], first["static"][...])
        assert ds.attrs["title"] == "part from 0000"
    urls = {v[0] for v in json.loads(refs.read_text())["refs"].values() if isinstance(v, list)}
    assert urls == {p.as_uri() for p in parts}


def test_concat_refuses_a_file_of_another_shape_naming_it(tmp_path):
    parts = [tmp_path / "a.nc", tmp_path / "b.nc", tmp_path / "c.nc"]
    write_part(parts[0], 0, 4)
    write_part(parts[1], 4, 4, ny=4)
    write_part(parts[2], 8, 4)
    with pytest.raises(FormatError, match=r"b\.nc.*'/y' has length 4, not 3"):
        virtualize(parts, tmp_path / "refs.json", concat="time")
    assert not (tmp_path / "refs.json").exists()
    done = nczmap_command("virtualize", *parts, tmp_path / "refs.json", "--concat", "time")
    assert done.returncode == 1 and b"b.nc" in done.stderr and b"Traceback" not in done.stderr


def test_concat_loads_a_variable_whose_chunks_do_not_fit_a_file(tmp_path):
    parts = [tmp_path / "a.nc", tmp_path / "b.nc"]
    write_part(parts[0], 0, 5)  # time is chunked by 4 and field by 2: 5 records end mid-chunk
    write_part(parts[1], 5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VirtualizeWarning)  # nothing is left out, so nothing to warn about
        warnings.filterwarnings("ignore", "variables not along the joined dimension differ.*/static")
        warnings.filterwarnings("ignore", r"attributes that differ .*\(/: title\)")  # each part its own
        result = virtualize(parts, tmp_path / "refs.json", concat="time")
    assert result.refused == [] and sorted(result.loaded) == ["/columns", "/field", "/time"]
    with nczmap.open_dataset(manifest_url(tmp_path / "refs.json")) as ds:
        assert_joined_as_netcdf4_reads(ds, parts)


def test_concat_of_contiguous_variables_along_a_fixed_dimension(tmp_path):
    """Contiguous data is cut into chunks of whole rows that divide every file's length (4, 6, 2: rows of
    2); joined along another axis than the first, files of different lengths along it are loaded."""
    parts, rows = [], []
    for i, count in enumerate((4, 6, 2)):
        path = tmp_path / f"part{i}.nc"
        rows.append(np.arange(count * 3, dtype="f4").reshape(count, 3) + 100 * i)
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("time", count)
            ds.createDimension("x", 3)
            ds.createVariable("rows", ">f4", ("time", "x"), contiguous=True, endian="big")[:] = rows[-1]
            ds.createVariable("across", "i2", ("x", "time"), contiguous=True)[:] = rows[-1].T
        parts.append(path)
    result = virtualize(parts, tmp_path / "refs.json", concat="time")
    assert result.refused == [] and result.loaded == ["/across"]  # its files differ along time
    with nczmap.open_dataset(manifest_url(tmp_path / "refs.json")) as ds:
        assert ds.variables["rows"].chunks == (2, 3)
        assert np.array_equal(ds.variables["rows"][...], np.concatenate(rows))
        assert np.array_equal(ds.variables["across"][...], np.concatenate(rows).T)


def test_a_release_that_cannot_read_big_endian_data_gets_those_variables_refused(tmp_path):
    source = ncgen("bigendian", tmp_path)
    refs = tmp_path / "refs.json"
    done = nczmap_command("virtualize", "--netcdf-version", "4.9.0", source, refs)
    assert done.returncode == 0, done.stderr
    refused = sorted(re.findall(r"variable '(/\w+)'", done.stderr.decode()))
    assert refused == ["/d", "/f", "/i", "/s", "/u"]  # the one-byte b and little-endian little stay
    assert b"big-endian" in done.stderr and b"4.9.0" in done.stderr
    with nczmap.open_dataset(manifest_url(refs)) as ds:
        assert ds.dialect.value == "nczarr-4.8.1"
        assert ds.variables["little"][...].tolist() == [7, 8, 9]
        assert ds.variables["b"][...].tolist() == [1, -2, 3]


# ------------------------------------------------------------------------------- sources and grants
def write_uncompressed(path: Path, values: np.ndarray) -> None:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", values.shape[0])
        ds.createDimension("x", values.shape[1])
        ds.createVariable("chunked", "f8", ("y", "x"), chunksizes=(10, 10))[:] = values
        ds.createVariable("plain", "f8", ("y", "x"), contiguous=True)[:] = values


def test_a_source_changed_afterwards_is_an_error_naming_it(tmp_path):
    source = tmp_path / "data.nc"
    write_uncompressed(source, np.zeros((40, 30)))
    refs = tmp_path / "refs.json"
    virtualize([source], refs)
    size, before = source.stat().st_size, source.stat().st_mtime_ns
    write_uncompressed(source, np.ones((40, 30)))  # other values, the same size
    assert source.stat().st_size == size
    if source.stat().st_mtime_ns == before:  # a coarse clock: make the rewrite visible
        os.utime(source, ns=(before + 10**9, before + 10**9))
    for name in ("chunked", "plain"):
        with nczmap.open_dataset(manifest_url(refs)) as ds, pytest.raises(StorageError, match=str(source)):
            ds.variables[name][...]


def test_a_moved_manifest_reads_only_with_its_sources_granted(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    source = data / "data.nc"
    write_part(source, 0, 4)
    refs = data / "refs.json"
    assert nczmap_command("virtualize", source, refs).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = elsewhere / "refs.json"
    shutil.move(refs, moved)
    with nczmap.open_dataset(manifest_url(moved)) as ds, pytest.raises(AccessDenied, match="--allow"):
        ds.variables["field"][...]
    denied = nczmap_command("ncdump", manifest_url(moved))
    assert denied.returncode == 1 and b"--allow" in denied.stderr
    granted = nczmap_command("ncdump", "--allow", "data", manifest_url(moved), cwd=tmp_path)
    assert granted.returncode == 0, granted.stderr
    if NCDUMP is not None:
        assert granted.stdout.replace(b"netcdf refs", b"netcdf data") == run(NCDUMP, source)
    copied = tmp_path / "copied.file"
    for command in (
        ["search", manifest_url(moved), "/field"],
        ["dump", "-H", manifest_url(moved)],
        ["copy", manifest_url(moved), copied],
    ):
        assert nczmap_command(*command, "--allow", f"file://{data}/").returncode == 0
    with (
        nczmap.open_dataset(str(copied)) as real,
        nczmap.open_dataset(manifest_url(moved), containers=[data]) as v,
    ):
        assert np.array_equal(real.variables["field"][...], v.variables["field"][...])
    not_a_manifest = nczmap_command("ncdump", "--allow", data, source)
    assert not_a_manifest.returncode == 1 and b"--allow" in not_a_manifest.stderr


def test_sources_outside_the_allowed_prefixes_are_refused_before_writing(tmp_path):
    source = tmp_path / "data.nc"
    write_part(source, 0, 4)
    refs = tmp_path / "out" / "refs.json"
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(AccessDenied, match=r"data\.nc"):
        virtualize([source], refs, allow=[str(other)])
    assert not refs.exists()


def test_the_destination_is_never_a_source_or_another_file(tmp_path):
    source = tmp_path / "data.nc"
    write_part(source, 0, 4)
    other = tmp_path / "other.nc"
    write_part(other, 4, 4)
    before = other.read_bytes()
    done = nczmap_command("virtualize", source, other)  # forgot the destination
    assert done.returncode == 1 and b"not a kerchunk JSON manifest" in done.stderr
    assert other.read_bytes() == before


# ----------------------------------------------------------------------------------------- the command
def test_cli_exits_zero_without_progress_on_pipes(tmp_path):
    source = tmp_path / "data.nc"
    write_part(source, 0, 4)
    refs = tmp_path / "refs.json"
    done = nczmap_command("virtualize", source, refs)
    assert done.returncode == 0
    assert done.stdout == b"" and done.stderr == b""
    recorded = json.loads(refs.read_text())["nczmap"]["sources"][source.resolve().as_uri()]
    assert recorded == {"size": source.stat().st_size, "mtime": source.stat().st_mtime_ns}


def test_cli_shows_progress_on_a_terminal(tmp_path):
    source = tmp_path / "data.nc"
    write_part(source, 0, 8)
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "nczmap", "virtualize", source, tmp_path / "refs.json"],
            stdout=subprocess.PIPE,
            stderr=follower,
            timeout=TIMEOUT,
            check=False,
        )
        os.close(follower)
        follower = None
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            shown += chunk
    finally:
        if follower is not None:
            os.close(follower)
        os.close(leader)
    assert done.returncode == 0
    assert b"\r" in shown and b"chunks" in shown


# ------------------------------------------------------------------------------------- sources on S3
@pytest.fixture
def s3_proxy(s3_server):
    """The counting proxy in front of moto (tests/s3proxy.py): what virtualizing an object costs."""
    from s3proxy import S3Proxy

    with S3Proxy(s3_server.endpoint) as running:
        yield running


def write_spread(path: Path, records: int) -> None:
    """A netCDF-4 file whose chunk indexes HDF5 spreads over the whole file as it grows: three zlib
    variables of ``records`` records of 6 chunks, a contiguous one, a tiny one, a group."""
    rng = np.random.default_rng(records)
    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "on S3"
        ds.createDimension("time", None)
        ds.createDimension("y", 200)
        ds.createDimension("x", 300)
        ds.createVariable("time", "f8", ("time",))[:] = np.arange(records) * 6.0
        for name in ("a", "b", "c"):
            variable = ds.createVariable(name, "f4", ("time", "y", "x"), zlib=True, chunksizes=(1, 50, 100))
            variable[:] = rng.normal(size=(records, 200, 300))
        ds.createVariable("plain", "i4", ("y", "x"), contiguous=True)[:] = rng.integers(0, 99, (200, 300))
        ds.createVariable("tiny", "i2", ("time",), contiguous=False)[:] = np.arange(records)
        group = ds.createGroup("g")
        group.createVariable("h", "f8", ("y",), zlib=True, chunksizes=(50,))[:] = np.arange(200) / 4


def upload(s3_server, path: Path, key: str | None = None) -> tuple[str, str]:
    """Put ``path`` in the test bucket (under a new prefix unless ``key`` is given): (key, its ETag)."""
    import uuid

    from s3server import BUCKET

    key = key or f"{uuid.uuid4().hex}/{path.name}"
    client = s3_server.client()
    client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
    return key, client.head_object(Bucket=BUCKET, Key=key)["ETag"]


def assert_values(refs: Path, expected: dict[str, np.ndarray], **options) -> None:
    with nczmap.open_dataset(manifest_url(refs), **options) as ds:
        ours = {v.key: v for g in ds.walk() for v in g.variables.values()}
        assert set(ours) == set(expected)
        for key, values in expected.items():
            assert np.array_equal(ours[key][...], values), key


def test_an_s3_object_virtualizes_in_a_few_requests_to_the_references_of_the_file(
    tmp_path, s3_server, s3_proxy
):
    from s3server import BUCKET

    from nczmap.manifest.containers import Container

    source = tmp_path / "spread.nc"
    write_spread(source, 12)  # 8 MB, 435 chunks
    key, etag = upload(s3_server, source)
    refs = tmp_path / "refs.json"
    s3_proxy.reset()
    result = virtualize([f"{s3_proxy.endpoint}/{BUCKET}/{key}#mode=s3"], refs)
    counts = s3_proxy.snapshot()
    print(f"virtualizing {source.stat().st_size} bytes, {result.references} references: {counts}")
    assert counts["HEAD"] == 0 and 1 <= counts["GET"] <= 16, counts  # size and ETag from the first GET
    assert s3_proxy.total() == counts["HEAD"] + counts["GET"]
    assert result.refused == [] and result.references > 400

    # the same manifest as the local file's, referring to the object
    local = tmp_path / "local.json"
    virtualize([source], local)
    ours, theirs = json.loads(refs.read_text()), json.loads(local.read_text())
    assert set(ours["refs"]) == set(theirs["refs"])
    raw = source.read_bytes()
    for name, value in theirs["refs"].items():
        mine = ours["refs"][name]
        if isinstance(value, list):
            assert mine == [f"s3://{BUCKET}/{key}", *value[1:]], name
        elif isinstance(mine, list):
            # a tiny chunk, kept in the local manifest, is referenced remotely (fetching it costs a request)
            url, offset, length = mine
            held = base64.b64decode(value[7:]) if value.startswith("base64:") else value.encode("utf-8")
            assert url == f"s3://{BUCKET}/{key}" and raw[offset : offset + length] == held, name
        else:
            assert mine == value, name
    assert ours["nczmap"]["sources"] == {
        f"s3://{BUCKET}/{key}": {"size": source.stat().st_size, "etag": etag}
    }
    prefix = key.rsplit("/", 1)[0]
    assert result.containers == [Container(f"s3://{BUCKET}/{prefix}/", {"endpoint": s3_proxy.endpoint})]

    expected = values_by_netcdf4(source)
    s3_proxy.reset()
    assert_values(refs, expected, containers=result.containers)  # the grant virtualize used
    assert s3_proxy.snapshot()["GET"] > 0 and s3_proxy.snapshot()["PUT"] == 0
    grant = {f"s3://{BUCKET}/{prefix}/": {"endpoint": s3_server.endpoint}}  # spelled by hand, no proxy
    assert_values(refs, expected, containers=grant)
    with nczmap.open_dataset(manifest_url(refs)) as ds, pytest.raises(AccessDenied, match=prefix):
        ds.variables["a"][...]


def test_an_s3_source_replaced_after_virtualizing_is_an_error_naming_its_etag(tmp_path, s3_server):
    from s3server import BUCKET

    first, second = tmp_path / "first.nc", tmp_path / "second.nc"
    write_part(first, 0, 4)
    write_part(second, 100, 4)
    key, etag = upload(s3_server, first)
    refs = tmp_path / "refs.json"
    result = virtualize([f"{s3_server.endpoint}/{BUCKET}/{key}#mode=s3"], refs)
    assert_values(refs, values_by_netcdf4(first), containers=result.containers)
    upload(s3_server, second, key)
    changed = pytest.raises(
        StorageError, match=re.escape(f"s3://{BUCKET}/{key}") + ".*" + re.escape(f"ETag {etag}")
    )
    with nczmap.open_dataset(manifest_url(refs), containers=result.containers) as ds, changed:
        ds.variables["field"][...]


def test_an_s3_source_replaced_while_it_is_read_is_an_error(tmp_path, s3_server):
    """Every range GET is conditional on the ETag first seen: bytes of another version are never mixed in."""
    from s3server import BUCKET

    from nczmap.integrations.virtualize import hdf5
    from nczmap.integrations.virtualize.sources import ObjectFile
    from nczmap.url import parse_url

    first, second = tmp_path / "first.nc", tmp_path / "second.nc"
    write_spread(first, 2)  # larger than the first block
    write_spread(second, 3)
    key, _ = upload(s3_server, first)
    source = ObjectFile(parse_url(f"{s3_server.endpoint}/{BUCKET}/{key}#mode=s3"))
    try:
        assert hdf5.sniff(source.read_head, source.size)  # the first block is cached: no request below
        upload(s3_server, second, key)
        assert source.read(0, 8) == first.read_bytes()[:8]
        with pytest.raises(StorageError, match="changed while it was being virtualized"):
            source.read(source.size - 8, 8)
    finally:
        source.close()


def test_cli_virtualizes_s3_objects_along_time(tmp_path, s3_server):
    import uuid

    from s3server import BUCKET

    parts = [tmp_path / f"part{i}.nc" for i in range(3)]
    prefix = uuid.uuid4().hex
    urls = []
    for path, (start, count) in zip(parts, [(0, 4), (4, 8), (12, 3)], strict=True):
        write_part(path, start, count)
        key, _ = upload(s3_server, path, f"{prefix}/{path.name}")
        urls.append(f"{s3_server.endpoint}/{BUCKET}/{key}#mode=s3")
    refs = tmp_path / "refs.json"
    done = nczmap_command("virtualize", *urls, refs, "--concat", "time")  # credentials from the environment
    assert done.returncode == 0, done.stderr
    grant = {f"s3://{BUCKET}/{prefix}/": {"endpoint": s3_server.endpoint}}
    with nczmap.open_dataset(manifest_url(refs), containers=grant) as ds:
        assert_joined_as_netcdf4_reads(ds, parts)
    document = json.loads(refs.read_text())
    assert set(document["nczmap"]["sources"]) == {f"s3://{BUCKET}/{prefix}/{p.name}" for p in parts}


def test_an_allowed_s3_prefix_takes_the_endpoint_of_its_sources(tmp_path, s3_server):
    from s3server import BUCKET

    source = tmp_path / "data.nc"
    write_part(source, 0, 4)
    key, _ = upload(s3_server, source)
    prefix = key.split("/")[0]
    url = f"{s3_server.endpoint}/{BUCKET}/{key}#mode=s3"
    result = virtualize([url], tmp_path / "refs.json", allow=[f"s3://{BUCKET}/"])
    assert [(c.prefix, dict(c.options)) for c in result.containers] == [
        (f"s3://{BUCKET}/", {"endpoint": s3_server.endpoint})
    ]
    assert_values(tmp_path / "refs.json", values_by_netcdf4(source), containers=result.containers)
    with pytest.raises(AccessDenied, match=f"s3://{BUCKET}/{prefix}"):
        virtualize([url], tmp_path / "other.json", allow=[f"s3://{BUCKET}/{prefix}-other/"])
    assert not (tmp_path / "other.json").exists()


def test_s3_sources_that_are_missing_or_of_no_known_format_are_refused_by_name(tmp_path, s3_server):
    from s3server import BUCKET

    text = tmp_path / "notes.nc"
    text.write_bytes(b"some notes, not data\n" * 10)
    key, _ = upload(s3_server, text)
    with pytest.raises(FormatError, match=re.escape(key) + ".*not a file nczmap can virtualize"):
        virtualize([f"{s3_server.endpoint}/{BUCKET}/{key}#mode=s3"], tmp_path / "refs.json")
    with pytest.raises(StorageError, match=re.escape(f"s3://{BUCKET}/{key}-gone does not exist")):
        virtualize([f"{s3_server.endpoint}/{BUCKET}/{key}-gone#mode=s3"], tmp_path / "refs.json")
    with pytest.raises(StorageError, match=re.escape("http://127.0.0.1:9/data.nc")):
        virtualize(["http://127.0.0.1:9/data.nc"], tmp_path / "refs.json")  # a web server nobody runs
    with pytest.raises(FormatError, match=re.escape("cannot virtualize 'gs://bucket/data.nc'")):
        virtualize(["gs://bucket/data.nc"], tmp_path / "refs.json")
    assert not (tmp_path / "refs.json").exists()


def test_reading_progress_counts_the_sources_parsed(tmp_path):
    parts = [tmp_path / f"part{i}.nc" for i in range(3)]
    for i, path in enumerate(parts):
        write_part(path, 4 * i, 4)
    seen: list[tuple[int, int]] = []
    virtualize(
        parts, tmp_path / "refs.json", concat="time", reading=lambda done, total: seen.append((done, total))
    )
    assert seen == [(1, 3), (2, 3), (3, 3)]
