"""The netCDF-3 parser of ``nczmap virtualize``: classic (CDF-1), 64-bit offset (CDF-2), 64-bit data (CDF-5).

Expected values come from netCDF4-python (libnetcdf) reading the same files, and byte offsets from a
brute-force search of the file for each variable's big-endian bytes. Hostile headers are built by a small
encoder here (independent of the parser) and by mutating real files.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nczmap.errors import FormatError, NCZError, StorageError
from nczmap.format.types import CHAR
from nczmap.integrations.virtualize import netcdf3, parsed

netCDF4 = pytest.importorskip("netCDF4")


FORMATS = {"NETCDF3_CLASSIC": 1, "NETCDF3_64BIT_OFFSET": 2, "NETCDF3_64BIT_DATA": 5}
CLASSIC_TYPES = ["i1", "i2", "i4", "f4", "f8"]
CDF5_TYPES = [*CLASSIC_TYPES, "u1", "u2", "u4", "i8", "u8"]
RECORDS = 3


class BytesFile:
    """A source file over bytes, reading as ``SourceFile.read`` does (a short read is an error)."""

    def __init__(self, data: bytes, name: str = "test.nc") -> None:
        self.name = name
        self.data = data
        self.size = len(data)
        self.reads = 0

    @classmethod
    def of(cls, path: Path) -> BytesFile:
        return cls(path.read_bytes(), str(path))

    def read(self, offset: int, length: int) -> bytes:
        self.reads += 1
        if offset < 0 or length < 0 or offset + length > self.size:
            raise StorageError(f"{self.name}: cannot read {length} bytes at {offset}")
        return self.data[offset : offset + length]


def parse(source: Path | bytes):
    file = BytesFile.of(source) if isinstance(source, Path) else BytesFile(source)
    return netcdf3.parse(file, parsed.ParseOptions())


def types_of(fmt: str) -> list[str]:
    return CDF5_TYPES if fmt == "NETCDF3_64BIT_DATA" else CLASSIC_TYPES


def sample(rng: np.random.Generator, letter: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = np.dtype(letter)
    if dtype.kind == "f":
        return rng.normal(0, 1e3, shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def attributes_of_every_type(target, types: list[str], rng: np.random.Generator) -> None:
    for letter in types:
        target.setncattr(f"a_{letter}", sample(rng, letter, (3,)))
        target.setncattr(f"one_{letter}", sample(rng, letter, (1,)))
    target.setncattr("text", "a char attribute")
    target.setncattr("unicode", "h\u00e9llo \u2603")
    target.setncattr("empty", "")


def write_everything(path: Path, fmt: str, records: int = RECORDS, seed: int = 0) -> None:
    """Fixed, record and scalar variables of every type the format has, char arrays, variables with
    and without _FillValue, record values partly left to the fill, attributes of every type."""
    rng = np.random.default_rng(seed)
    types = types_of(fmt)
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("time", None)
        ds.createDimension("x", 3)
        ds.createDimension("y", 2)
        ds.createDimension("n", 5)
        attributes_of_every_type(ds, types, rng)
        time = ds.createVariable("time", "f8", ("time",))
        time.units = "days since 2000-01-01"
        time[:] = np.arange(records) + 0.5
        for letter in types:
            fixed = ds.createVariable(f"fixed_{letter}", letter, ("x", "y"))
            fixed[:] = sample(rng, letter, (3, 2))
            filled = ds.createVariable(
                f"rec_{letter}", letter, ("time", "x"), fill_value=sample(rng, letter, ())
            )
            attributes_of_every_type(filled, types, rng)
            if records:
                filled[: records - 1, :2] = sample(rng, letter, (records - 1, 2))
            scalar = ds.createVariable(f"scalar_{letter}", letter, ())
            scalar.assignValue(sample(rng, letter, ()))
        names = ds.createVariable("names", "S1", ("x", "n"))
        names[:] = netCDF4.stringtochar(np.array(["alpha", "be", "gamma"], dtype="S5"))
        names.long_name = "station names"
        labels = ds.createVariable("labels", "S1", ("time", "n"), fill_value=b"?")
        if records:
            labels[:] = netCDF4.stringtochar(np.array([f"r{i}" for i in range(records)], dtype="S5"))
        ds.createVariable("unwritten", "i4", ("x",))  # netCDF-3 fills it on enddef
        ds.createVariable("initial", "S1", ())


def expected_values(path: Path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        ds.set_auto_chartostring(False)
        return {name: np.asarray(var[...]) for name, var in ds.variables.items()}


def from_references(variable, file: BytesFile) -> np.ndarray:
    """The variable's values read only through its storage's byte ranges, decoded with the storage dtype."""
    storage = variable.storages[0]
    dtype = variable.layout.dtype.storage
    if storage.kind == "contiguous":
        count = int(np.prod(storage.shape)) if storage.shape else 1
        raw = storage.read(storage.offset, count * dtype.itemsize) if count else b""
        return np.frombuffer(raw, dtype).reshape(storage.shape)
    assert storage.kind == "chunked"
    out = np.full(storage.shape, variable.layout.fill_value, dtype=dtype)
    ndim = len(storage.shape)
    for index in range(storage.chunk_count):
        corner = storage.corners[index * ndim : (index + 1) * ndim]
        raw = storage.read(storage.offsets[index], storage.sizes[index])
        region = tuple(slice(c, c + n) for c, n in zip(corner, storage.chunks, strict=True))
        out[region] = np.frombuffer(raw, dtype).reshape(storage.chunks)
    return out


# ------------------------------------------------------------------------------------ sniffing
@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"CDF\x01", True),
        (b"CDF\x02\x00\x00", True),
        (b"CDF\x05", True),
        (b"CDF\x03", False),
        (b"\x89HDF\r\n\x1a\n", False),
        (b"CD", False),
        (b"", False),
    ],
)
def test_sniff_knows_the_three_signatures(head, expected):
    file = BytesFile(head)
    assert netcdf3.sniff(file.read, file.size) is expected


# --------------------------------------------------------------------------- the model and values
@pytest.fixture(scope="module", params=list(FORMATS))
def everything(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("nc3") / f"{request.param}.nc"
    write_everything(path, request.param)
    return request.param, path


def test_the_model_is_what_netcdf4_python_reports(everything):
    fmt, path = everything
    result = parse(path)
    assert result.format == "netcdf3" and result.source == str(path) and not result.refused
    root = result.root
    assert root.groups == {}
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        assert ds.data_model == fmt
        assert [(d.name, len(d), d.isunlimited()) for d in ds.dimensions.values()] == [
            (d.name, d.size, d.unlimited) for d in root.dimensions.values()
        ]
        assert_same_attributes(root.attrs, ds)
        assert list(root.variables) == list(ds.variables)
        for name, expected in ds.variables.items():
            ours = root.variables[name]
            assert ours.dimensions == expected.dimensions, name
            assert ours.dims == tuple(root.dimensions[d] for d in expected.dimensions)
            assert ours.shape == expected.shape, name
            assert ours.dtype == expected.dtype, name
            storage_dtype = ours.layout.dtype.storage
            assert storage_dtype == (
                expected.dtype.newbyteorder(">") if expected.dtype.itemsize > 1 else expected.dtype
            )
            assert ours.layout.scalar == (expected.ndim == 0)
            assert_same_attributes(ours.attrs, expected)
            assert not ours.load and ours.storages[0].source == str(path)


def assert_same_attributes(ours, theirs) -> None:
    assert list(ours) == theirs.ncattrs()
    for name in theirs.ncattrs():
        value = theirs.getncattr(name)
        typed = ours.typed(name)
        if isinstance(value, str):
            assert typed.nctype is CHAR and typed.value == value, name
            continue
        value = np.atleast_1d(value)
        if value.dtype.kind == "S":  # a char variable's _FillValue comes back as bytes
            assert typed.nctype is CHAR and typed.value.encode() == value.tobytes(), name
            continue
        assert typed.value.dtype == value.dtype and typed.value.dtype.isnative, name
        assert np.array_equal(typed.value, value), name


def test_values_through_the_references_and_values_equal_netcdf4_python(everything):
    _, path = everything
    file = BytesFile.of(path)
    root = netcdf3.parse(file, parsed.ParseOptions()).root
    for name, want in expected_values(path).items():
        variable = root.variables[name]
        got = from_references(variable, file)
        assert got.shape == want.shape and np.array_equal(got, want), name
        loaded = variable.storages[0].values()
        assert loaded.dtype == want.dtype and loaded.dtype.isnative, name
        assert np.array_equal(loaded, want), name


def test_fill_values_are_the_attribute_else_netcdfs_default(everything):
    fmt, path = everything
    root = parse(path).root
    with netCDF4.Dataset(path) as ds:
        for letter in types_of(fmt):
            explicit = root.variables[f"rec_{letter}"]
            assert explicit.fill_value == ds[f"rec_{letter}"].getncattr("_FillValue")
            assert explicit.fill_value.dtype == np.dtype(letter)
            default = root.variables[f"fixed_{letter}"]
            assert "_FillValue" not in default.attrs
            assert default.fill_value == netCDF4.default_fillvals[letter]
            assert default.fill_value.dtype == np.dtype(letter)
    assert root.variables["labels"].fill_value == b"?"
    assert root.variables["names"].fill_value == b"\x00"
    assert root.variables["unwritten"].storages[0].values().tolist() == [netCDF4.default_fillvals["i4"]] * 3


def test_offsets_are_where_the_bytes_are(everything):
    """Each fixed variable's big-endian bytes are found (once) at its ``begin``, each record's at its
    chunk offset: a brute-force search of the file, independent of the header."""
    _, path = everything
    data = path.read_bytes()
    root = parse(path).root
    for name, want in expected_values(path).items():
        variable = root.variables[name]
        storage = variable.storages[0]
        big = want.astype(variable.layout.dtype.storage)
        if storage.kind == "contiguous":
            needle = big.tobytes()
            if len(needle) >= 6:
                assert data.find(needle) == data.rfind(needle) == storage.offset, name
            continue
        assert storage.chunk_count == want.shape[0] == RECORDS
        for record in range(RECORDS):
            needle = big[record : record + 1].tobytes()
            assert storage.sizes[record] == len(needle)
            assert data[storage.offsets[record] : storage.offsets[record] + len(needle)] == needle
            if len(needle) >= 8:
                assert data.find(needle) == data.rfind(needle) == storage.offsets[record], (name, record)


def test_begin_offsets_grow_with_the_header_of_each_format(tmp_path):
    """The same definitions: CDF-2's header has 4 more bytes per variable (64-bit begin) than CDF-1's;
    CDF-5's counts and sizes are all 64-bit."""
    begins = {}
    for fmt in FORMATS:
        path = tmp_path / f"{fmt}.nc"
        with netCDF4.Dataset(path, "w", format=fmt) as ds:
            ds.createDimension("x", 4)
            for index in range(5):
                ds.createVariable(f"v{index}", "i4", ("x",))[:] = np.arange(4) + 100 * index
        root = parse(path).root
        begins[fmt] = [v.storages[0].offset for v in root.variables.values()]
        assert [b - begins[fmt][0] for b in begins[fmt]] == [16 * i for i in range(5)]
    assert begins["NETCDF3_64BIT_OFFSET"][0] - begins["NETCDF3_CLASSIC"][0] == 4 * 5
    # CDF-5: numrecs, the three list counts, the dimension's name length and length, and each variable's
    # name length, dimension count, dimension id, attribute count and vsize are 4 bytes longer each
    assert begins["NETCDF3_64BIT_DATA"][0] - begins["NETCDF3_64BIT_OFFSET"][0] == 4 * (6 + 5 * 5)


# ------------------------------------------------------------------------------- record corner cases
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize(("letter", "extent"), [("i1", ()), ("i2", (3,)), ("S1", (5,)), ("f8", (2,))])
def test_a_single_record_variable_has_unpadded_records(tmp_path, fmt, letter, extent):
    path = tmp_path / "one.nc"
    rng = np.random.default_rng(1)
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("time", None)
        dims = ["time"]
        for axis, size in enumerate(extent):
            ds.createDimension(f"d{axis}", size)
            dims.append(f"d{axis}")
        ds.createDimension("z", 3)
        ds.createVariable("fixed", "i2", ("z",))[:] = [1, 2, 3]
        var = ds.createVariable("only", letter, dims)
        if letter == "S1":
            var[:] = np.frombuffer(rng.bytes(7 * 5), "S1").reshape(7, 5)
        else:
            var[:] = sample(rng, letter, (7, *extent))
    file = BytesFile.of(path)
    variable = netcdf3.parse(file, parsed.ParseOptions()).root.variables["only"]
    storage = variable.storages[0]
    record = int(np.prod(extent)) * np.dtype(letter).itemsize
    assert storage.chunks == (1, *extent)
    assert list(storage.sizes) == [record] * 7
    assert [b - a for a, b in zip(storage.offsets, storage.offsets[1:], strict=False)] == [record] * 6
    assert storage.offsets[-1] + record == file.size  # no padding after the last record either
    want = expected_values(path)["only"]
    assert np.array_equal(from_references(variable, file), want)
    assert np.array_equal(storage.values(), want)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_several_record_variables_have_padded_records(tmp_path, fmt):
    path = tmp_path / "padded.nc"
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("time", None)
        ds.createDimension("x", 3)
        ds.createVariable("a", "i1", ("time", "x"))[:] = np.arange(12).reshape(4, 3)  # 3 bytes, padded to 4
        ds.createVariable("b", "i2", ("time",))[:] = np.arange(4) - 9  # 2 bytes, padded to 4
        ds.createVariable("c", "f8", ("time", "x"))[:] = np.arange(12).reshape(4, 3) / 4  # 24 bytes
    file = BytesFile.of(path)
    root = netcdf3.parse(file, parsed.ParseOptions()).root
    recsize = 4 + 4 + 24
    for name, size in {"a": 3, "b": 2, "c": 24}.items():
        storage = root.variables[name].storages[0]
        assert list(storage.sizes) == [size] * 4
        assert [o - storage.offsets[0] for o in storage.offsets] == [r * recsize for r in range(4)]
    for name, want in expected_values(path).items():
        assert np.array_equal(from_references(root.variables[name], file), want), name


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_file_without_records_has_empty_record_variables(tmp_path, fmt):
    path = tmp_path / "empty.nc"
    write_everything(path, fmt, records=0)
    file = BytesFile.of(path)
    root = netcdf3.parse(file, parsed.ParseOptions()).root
    assert root.dimensions["time"].size == 0 and root.dimensions["time"].unlimited
    for name, want in expected_values(path).items():
        variable = root.variables[name]
        storage = variable.storages[0]
        if variable.dims and variable.dims[0].unlimited:
            assert storage.kind == "chunked" and storage.chunk_count == 0
            assert variable.shape == want.shape and want.shape[0] == 0
        assert np.array_equal(storage.values(), want), name
        assert np.array_equal(from_references(variable, file), want), name


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_streaming_numrecs_is_counted_from_the_file_size(tmp_path, fmt):
    """numrecs all ones: as many whole records as the file holds after the first record variable's begin
    (a streaming writer leaves no slack after the last record; a partial record does not count)."""
    path = tmp_path / "stream.nc"
    write_everything(path, fmt, records=4)
    time = parse(path).root.variables["time"].storages[0]
    start, recsize = time.offsets[0], time.offsets[1] - time.offsets[0]
    data = bytearray(path.read_bytes()[: start + 4 * recsize])  # CDF-5 files have slack: cut it off
    width = 8 if FORMATS[fmt] == 5 else 4
    assert int.from_bytes(data[4 : 4 + width], "big") == 4
    data[4 : 4 + width] = b"\xff" * width
    want = expected_values(path)
    for cut, records in [(0, 4), (1, 3), (recsize, 3), (recsize + 1, 2)]:
        root = parse(bytes(data[: len(data) - cut])).root
        assert root.dimensions["time"].size == records
        for name, variable in root.variables.items():
            expected = want[name][:records] if variable.dims and variable.dims[0].unlimited else want[name]
            assert np.array_equal(variable.storages[0].values(), expected), name


def test_a_file_with_nothing_in_it(tmp_path):
    path = tmp_path / "nothing.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC"):
        pass
    root = parse(path).root
    assert (root.dimensions, root.variables, dict(root.attrs)) == ({}, {}, {})


def test_header_reads_are_few_and_bounded(everything):
    _, path = everything
    file = BytesFile.of(path)
    netcdf3.parse(file, parsed.ParseOptions())
    assert file.reads <= 2  # the signature, then one block holding the whole header


# -------------------------------------------------------------------------------------- hostile input
class Header:
    """A netCDF-3 header written field by field (an encoder independent of the parser)."""

    def __init__(self, version: int = 1) -> None:
        self.version = version
        self.count = 8 if version == 5 else 4
        self.offset = 4 if version == 1 else 8
        self.parts = [b"CDF" + bytes([version])]

    def raw(self, data: bytes) -> Header:
        self.parts.append(data)
        return self

    def n(self, value: int) -> Header:
        return self.raw(value.to_bytes(self.count, "big"))

    def u32(self, value: int) -> Header:
        return self.raw(value.to_bytes(4, "big"))

    def begin(self, value: int) -> Header:
        return self.raw(value.to_bytes(self.offset, "big"))

    def name(self, text: str | bytes) -> Header:
        raw = text.encode() if isinstance(text, str) else text
        return self.n(len(raw)).raw(raw + b"\x00" * (-len(raw) % 4))

    def absent(self) -> Header:
        return self.u32(0).n(0)

    def bytes(self, tail: bytes = b"") -> bytes:
        return b"".join(self.parts) + tail


def one_variable(version=1, *, numrecs=0, dims=(("x", 2),), dimids=(0,), nctype=4, begin=None, tail=8):
    """A valid-looking file with one variable of ``dims``; ``begin`` None: right after the header."""
    head = Header(version).n(numrecs)
    head.u32(10).n(len(dims))
    for dim_name, length in dims:
        head.name(dim_name).n(length)
    head.absent()
    head.u32(11).n(1).name("v").n(len(dimids))
    for dimid in dimids:
        head.n(dimid)
    head.absent().u32(nctype).n(8)
    size = len(head.bytes()) + head.offset
    return head.begin(size if begin is None else begin).bytes(b"\x00" * tail)


def test_the_encoder_makes_a_file_the_parser_reads():
    for version in (1, 2, 5):
        root = parse(one_variable(version)).root
        assert root.variables["v"].storages[0].values().tolist() == [0, 0]


def assert_refused(data: bytes, *words: str) -> FormatError:
    with pytest.raises(FormatError) as caught:
        parse(data)
    message = str(caught.value)
    assert "test.nc" in message and all(word in message for word in words), message
    return caught.value


@pytest.mark.parametrize("version", [1, 2, 5])
def test_crafted_headers_are_refused_naming_the_problem(version):
    big = 2**62 if version == 5 else 2**31 - 1
    h = Header
    assert_refused(b"CDF\x07" + b"\x00" * 40, "signature")
    assert_refused(b"CDF", "signature")
    assert_refused(h(version).n(0).bytes(), "truncated", "tag of dimensions")
    assert_refused(h(version).n(0).u32(10).n(big).bytes(b"\x00" * 64), f"{big} dimensions claimed")
    assert_refused(h(version).n(0).u32(10).n(1).n(2**31).bytes(b"x" * 64), "name length", str(2**31))
    assert_refused(h(version).n(0).u32(10).n(1).n(0).n(3).bytes(b"\x00" * 64), "empty name")
    assert_refused(h(version).n(0).u32(10).n(1).name(b"\xff\xfe").n(3).bytes(b"\x00" * 64), "not UTF-8")
    assert_refused(h(version).n(0).u32(10).n(1).name("a/b").n(3).bytes(b"\x00" * 64), "'/'")
    assert_refused(h(version).n(0).u32(99).n(1).name("x").n(3).bytes(b"\x00" * 64), "tag")
    two = h(version).n(0).u32(10).n(2).name("x").n(3).name("x").n(4)
    assert_refused(two.absent().absent().bytes(), "two dimensions are named 'x'")
    unlimited = h(version).n(0).u32(10).n(2).name("t").n(0).name("u").n(0)
    assert_refused(unlimited.absent().absent().bytes(), "more than one dimension is unlimited")
    attribute = h(version).n(0).absent().u32(12).n(1).name("a").u32(6).n(big).bytes(b"\x00" * 64)
    assert_refused(attribute, "attribute 'a'", f"claims {big} values of double")
    assert_refused(h(version).n(0).absent().u32(12).n(1).name("a").u32(13).n(0).bytes(), "nc_type 13")
    assert_refused(one_variable(version, dimids=(7,)), "variable 'v'", "dimension id 7", "out of range")
    assert_refused(one_variable(version, begin=10**6), "variable 'v'", "begin offset 1000000", "past its end")
    assert_refused(one_variable(version, tail=4), "variable 'v'", "past its end")
    assert_refused(one_variable(version, nctype=0), "nc_type 0")
    assert_refused(one_variable(version, nctype=12), "nc_type 12")
    grid = (("t", 0), ("x", 2))
    assert_refused(one_variable(version, dims=grid, dimids=(1, 0)), "unlimited dimension other than first")
    records = one_variable(version, numrecs=10**6, dims=grid, dimids=(0, 1))
    assert_refused(records, "variable 'v'", "past its end")


def test_64_bit_header_values_that_are_negative_are_refused():
    assert_refused(Header(5).raw(b"\xff" * 7 + b"\xfe").bytes(b"\x00" * 32), "numrecs is negative")
    assert_refused(one_variable(5, dims=(("x", 2**64 - 5),)), "length of dimension 'x' is negative")
    negative_begin = one_variable(5, begin=2**64 - 16)
    assert_refused(negative_begin, "begin offset of variable 'v' is negative")


def test_types_of_cdf5_are_refused_in_classic_files():
    assert_refused(one_variable(1, nctype=7), "nc_type 7", "CDF-1")
    assert_refused(one_variable(2, nctype=11), "nc_type 11", "CDF-2")
    assert parse(one_variable(5, nctype=11, tail=16)).root.variables["v"].dtype == np.dtype("u8")


def test_a_trillion_dimensions_fail_at_once_in_little_memory():
    data = Header(5).n(0).u32(10).n(10**12).bytes(b"\x00" * 1024)
    tracemalloc.start()
    try:
        assert_refused(data, "1000000000000 dimensions claimed")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_records_that_would_need_a_huge_chunk_index_are_refused():
    """1000 axes of length 1 and 10000 one-byte records: 80 MB of chunk corners from a 14 kB file."""
    ones = [(f"d{i}", 1) for i in range(1000)]
    dims = [("t", 0), *ones]
    data = one_variable(1, numrecs=10000, dims=dims, dimids=range(1001), nctype=1, tail=10000)
    assert_refused(data, "chunk index")


def test_too_many_dimensions_for_one_variable_are_refused():
    dims = [(f"d{i}", 1) for i in range(1025)]
    assert_refused(one_variable(1, dims=dims, dimids=range(1025)), "1025 dimensions", "1024")


def test_a_variable_numpy_cannot_hold_is_described_but_not_loaded():
    dims = [(f"d{i}", 1) for i in range(65)]
    variable = parse(one_variable(1, dims=dims, dimids=range(65), nctype=1)).root.variables["v"]
    assert variable.shape == (1,) * 65 and variable.storages[0].offset is not None
    with pytest.raises(FormatError, match="65 dimensions: numpy loads at most 64"):
        variable.storages[0].values()


# ---------------------------------------------------------------------------------------- fuzzing
@pytest.fixture(scope="module")
def valid_files(tmp_path_factory) -> list[bytes]:
    folder = tmp_path_factory.mktemp("fuzz")
    found = []
    for fmt in FORMATS:
        path = folder / f"{fmt}.nc"
        with netCDF4.Dataset(path, "w", format=fmt) as ds:
            ds.createDimension("time", None)
            ds.createDimension("x", 2)
            ds.title = "fuzz"
            ds.setncattr("numbers", np.array([1, 2], "i2"))
            ds.createVariable("v", "f4", ("time", "x"))[:] = np.ones((2, 2))
            ds.createVariable("w", "i1", ("time",), fill_value=3)[:] = [1, 2]
            ds.createVariable("c", "S1", ("x",))[:] = [b"a", b"b"]
            ds.createVariable("s", "f8", ())
        found.append(path.read_bytes())
    return found


def parse_anything(data: bytes) -> None:
    """Parse, and load every variable: only nczmap errors may come out."""
    try:
        result = parse(data)
        for variable in result.root.variables.values():
            variable.storages[0].values()
    except NCZError:
        pass


@settings(max_examples=120, deadline=None)
@given(
    choice=st.integers(0, 2),
    edits=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=6),
    cut=st.none() | st.integers(0, 600),
    word=st.none()
    | st.tuples(st.integers(0, 100), st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1])),
)
def test_mutated_headers_raise_only_nczmap_errors(valid_files, choice, edits, cut, word):
    data = bytearray(valid_files[choice])
    for position, value in edits:
        if position < len(data):
            data[position] = value
    if word is not None:
        position, value = word
        width = 8 if value >= 2**32 else 4
        data[4 * position : 4 * position + width] = value.to_bytes(width, "big")
    if cut is not None:
        del data[cut:]
    parse_anything(bytes(data))


# 4-byte words a header is made of (tags, small counts, types, name text, STREAMING), to get past the lists
WORDS = st.sampled_from(
    [b"\x00" * 4, *(bytes([0, 0, 0, n]) for n in (1, 2, 3, 5, 10, 11, 12)), b"abcd", b"\xff" * 4]
)
BODIES = st.binary(max_size=300) | st.lists(WORDS | st.binary(min_size=1, max_size=4), max_size=80).map(
    b"".join
)


@settings(max_examples=80, deadline=None)
@given(version=st.sampled_from([b"\x01", b"\x02", b"\x05"]), body=BODIES)
def test_random_bytes_after_the_signature_raise_only_nczmap_errors(version, body):
    parse_anything(b"CDF" + version + body)
