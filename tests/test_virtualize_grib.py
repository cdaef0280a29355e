"""The GRIB2 parser of ``nczmap virtualize``: files written here with ecCodes, read through the manifest and
compared with cfgrib's reading of the same files (values, coordinates, attributes); refusals by name;
damaged files, mutated and random, raising only nczmap's errors.

cfgrib squeezes ``time`` and ``step`` of one value to scalars; nczmap keeps them as dimensions of length 1
(so that files join along either): the comparisons expand cfgrib's to match.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("cfgrib")
xr = pytest.importorskip("xarray")
import grib_samples as gs  # noqa: E402

from nczmap.errors import FormatError, NCZError  # noqa: E402
from nczmap.integrations.virtualize import grib, grib_messages, parsed, virtualize  # noqa: E402


class BytesFile:
    """A source over bytes, reading as ``SourceFile.read`` does (a short read is an error)."""

    def __init__(self, data: bytes, name: str = "test.grib2") -> None:
        self.name = name
        self.data = data
        self.size = len(data)
        self.reads = 0

    def read(self, offset: int, length: int) -> bytes:
        self.reads += 1
        if offset < 0 or length < 0 or offset + length > self.size:
            raise FormatError(f"{self.name} ends before byte {offset + length}")
        return self.data[offset : offset + length]


def manifest_dataset(tmp_path, sources, group=None, **options):
    refs = tmp_path / "refs.json"
    result = virtualize([str(s) for s in sources], refs, **options)
    url = f"file://{refs}#mode=nczarr,manifest"
    return result, xr.open_dataset(url, engine="nczmap", group=group)


def as_cfgrib_shows(ours, theirs):
    """Our dataset with cfgrib's scalar time and step squeezed as cfgrib squeezes them."""
    squeeze = [d for d in ("time", "step") if d in ours.dims and d not in theirs.dims]
    return ours.isel({d: 0 for d in squeeze})


def assert_same_as_cfgrib(ours, theirs):
    ours = as_cfgrib_shows(ours, theirs)
    for name, expected in theirs.data_vars.items():
        got = ours[name]
        assert got.dims == expected.dims, name
        assert got.dtype == expected.dtype == np.float32
        np.testing.assert_array_equal(got.values, expected.values, err_msg=name)
        attrs = {k: v for k, v in got.attrs.items() if k != "grid_mapping"}
        assert attrs == expected.attrs, name
        assert got.encoding["coordinates"].split() == expected.encoding["coordinates"].split()
    for name, expected in theirs.coords.items():
        got = ours[name]
        assert got.dims == expected.dims, name
        np.testing.assert_array_equal(got.values, expected.values, err_msg=name)
        assert {k: v for k, v in got.attrs.items()} == expected.attrs, name
    for key in ("GRIB_edition", "GRIB_centre", "GRIB_centreDescription", "GRIB_subCentre", "institution"):
        assert ours.attrs[key] == theirs.attrs[key]


# ------------------------------------------------------------------------------------------ sniffing
@pytest.mark.parametrize(
    ("head", "expected"),
    [(b"GRIB\x00\x00\x00\x02", True), (b"GRIB\x00\x00\x00\x01", True), (b"GRIB\x00\x00\x00\x03", False),
     (b"CDF\x01\x00\x00\x00\x00", False), (b"GRI", False)],
)  # fmt: skip
def test_sniff_knows_grib_editions_1_and_2(head, expected):
    assert grib.sniff(lambda offset, length: head[offset : offset + length], len(head)) is expected


# ------------------------------------------------------------------------------------------ against cfgrib
def test_pressure_levels_and_steps_equal_cfgrib(tmp_path):
    source = gs.pressure_levels(tmp_path / "pl.grib2", steps=(0, 6, 12), levels=(500, 850, 1000))
    result, ours = manifest_dataset(tmp_path, [source])
    theirs = gs.cfgrib_dataset(source)
    assert result.formats == ["grib"] and not result.refused
    assert dict(ours.sizes) == {"time": 1, "step": 3, "isobaricInhPa": 3, "latitude": 31, "longitude": 16}
    assert result.references == 2 * 3 * 3  # one a message
    assert_same_as_cfgrib(ours, theirs)
    assert ours["t"].attrs["grid_mapping"] == "spatial_ref"
    assert ours["spatial_ref"].attrs["grid_mapping_name"] == "latitude_longitude"


def test_the_chunks_are_the_messages(tmp_path):
    source = gs.pressure_levels(tmp_path / "pl.grib2")
    data = source.read_bytes()
    model = grib.parse(BytesFile(data), parsed.ParseOptions())
    offsets = [m.offset for m in grib_messages.walk(lambda o, n: data[o : o + n], len(data), "x")]
    storage = model.root.variables["t"].storages[0]
    assert storage.chunks == (1, 1, 1, 31, 16)
    assert set(storage.offsets) <= set(offsets)
    for offset, size in zip(storage.offsets, storage.sizes, strict=True):
        assert data[offset : offset + 4] == b"GRIB" and data[offset + size - 4 : offset + size] == b"7777"
    assert storage.codecs == [{"id": "grib", "var": "t", "dtype": "float32"}]


@pytest.mark.parametrize(
    "packing",
    ["grid_simple", "grid_complex", "grid_complex_spatial_differencing", "grid_ieee", "grid_jpeg",
     "grid_png", "grid_ccsds"],
)  # fmt: skip
def test_every_supported_packing_reads_as_cfgrib_reads_it(tmp_path, packing):
    count = gs.points()
    values = gs.field(7, count)
    bits = 12 if packing == "grid_png" else 16  # the wheel's libpng writes no 16-bit grey image of this grid
    source = gs.write(
        tmp_path / "p.grib2", [gs.message(packingType=packing, bitsPerValue=bits, values=values)]
    )
    _, ours = manifest_dataset(tmp_path, [source])
    assert_same_as_cfgrib(ours, gs.cfgrib_dataset(source))


def test_missing_points_of_a_bitmap_are_nan_as_in_cfgrib(tmp_path):
    count = gs.points()
    values = gs.field(3, count)
    values[::7] = 9999.0  # ecCodes' default missing value: these points are left out by the bitmap
    source = gs.write(tmp_path / "b.grib2", [gs.message(bitmapPresent=1, values=values)])
    _, ours = manifest_dataset(tmp_path, [source])
    theirs = gs.cfgrib_dataset(source)
    assert np.isnan(theirs["t"].values).sum() == len(values[::7])
    assert_same_as_cfgrib(ours, theirs)


def test_a_lambert_grid_equals_cfgrib_and_has_its_grid_mapping(tmp_path):
    pyproj = pytest.importorskip("pyproj")
    source = gs.lambert(tmp_path / "hrrr.grib2", names=("t",))
    result, ours = manifest_dataset(tmp_path, [source])
    theirs = gs.cfgrib_dataset(source)
    assert_same_as_cfgrib(ours, theirs)
    assert ours["latitude"].dims == ("y", "x") and "/latitude" not in result.loaded  # a reference
    mapping = ours["spatial_ref"].attrs
    assert mapping["grid_mapping_name"] == "lambert_conformal_conic"
    crs = pyproj.CRS.from_wkt(mapping["crs_wkt"])
    to_lonlat = pyproj.Transformer.from_crs(crs, crs.geodetic_crs, always_xy=True)
    x, y = np.meshgrid(ours["x"].values, ours["y"].values)
    lon, lat = to_lonlat.transform(x, y)
    np.testing.assert_allclose(lat, theirs["latitude"].values, atol=1e-6)
    np.testing.assert_allclose(lon % 360, theirs["longitude"].values % 360, atol=1e-6)


def test_a_gaussian_grid_equals_cfgrib(tmp_path):
    count = gs.points("regular_gg_sfc_grib2")
    source = gs.write(tmp_path / "gg.grib2", [gs.message("regular_gg_sfc_grib2", values=gs.field(1, count))])
    _, ours = manifest_dataset(tmp_path, [source])
    assert_same_as_cfgrib(ours, gs.cfgrib_dataset(source))


def test_ensemble_members_and_accumulations_equal_cfgrib(tmp_path):
    count = gs.points("regular_ll_sfc_grib2")
    ensemble = {"productDefinitionTemplateNumber": 11, "shortName": "tp", "typeOfEnsembleForecast": 3,
                "numberOfForecastsInEnsemble": 3}  # fmt: skip
    found = []
    for number in (0, 1, 2):
        for end in (6, 12):
            values = gs.field(number * 100 + end, count, base=5)
            step = f"{end - 6}-{end}"
            found.append(
                gs.message("regular_ll_sfc_grib2", values, **ensemble, number=number, stepRange=step)
            )
    source = gs.write(tmp_path / "ens.grib2", found)
    _, ours = manifest_dataset(tmp_path, [source])
    theirs = gs.cfgrib_dataset(source)
    assert dict(theirs.sizes)["number"] == 3 and dict(theirs.sizes)["step"] == 2
    assert ours["tp"].attrs["GRIB_stepType"] == "accum"
    assert_same_as_cfgrib(ours, theirs)


def test_files_of_several_level_types_are_groups_each_equal_to_a_cfgrib_dataset(tmp_path):
    source = gs.surface_and_heights(tmp_path / "sh.grib2")
    refs = tmp_path / "refs.json"
    virtualize([str(source)], refs)
    groups = {"sp": "/surface", "t2m": "/heightAboveGround/level_2", "u10": "/heightAboveGround/level_10",
              "t": "/isobaricInhPa"}  # fmt: skip
    datasets = gs.cfgrib_datasets(source)
    assert sorted(v for d in datasets for v in d.data_vars) == ["sp", "t", "t2m", "u10", "v10"]
    for theirs in datasets:
        group = groups[sorted(theirs.data_vars)[0]]
        with xr.open_dataset(f"file://{refs}#mode=nczarr,manifest", engine="nczmap", group=group) as ours:
            assert_same_as_cfgrib(ours, theirs)


def test_a_field_missing_from_the_hypercube_reads_as_nan(tmp_path):
    source = gs.pressure_levels(tmp_path / "pl.grib2", steps=(0, 6))
    data = source.read_bytes()
    messages = grib_messages.walk(lambda o, n: data[o : o + n], len(data), "x")
    last = messages[-1]  # u at 850 hPa, step 6
    source.write_bytes(data[: last.offset])
    _, ours = manifest_dataset(tmp_path, [source])
    theirs = gs.cfgrib_dataset(source)
    assert np.isnan(theirs["u"].values[1, 0]).all()
    assert_same_as_cfgrib(ours, theirs)


def test_descriptions_kept_between_files_give_each_file_its_own_times(tmp_path):
    first = gs.pressure_levels(tmp_path / "a.grib2", steps=(3,), date=20240101)
    second = gs.pressure_levels(tmp_path / "b.grib2", steps=(9,), date=20240105)  # same parameters
    for source in (first, second):
        model = grib.parse(BytesFile(source.read_bytes()), parsed.ParseOptions()).root
        theirs = gs.cfgrib_dataset(source)
        assert model.variables["time"].storages[0].values()[0] == theirs["time"].values.astype(
            "M8[s]"
        ).astype(int)
        assert model.variables["step"].storages[0].values()[0] == theirs["step"].values / np.timedelta64(
            1, "h"
        )


# ------------------------------------------------------------------------------------------ refusals
def polar_stereographic() -> bytes:
    keys = {"gridDefinitionTemplateNumber": 20, "Nx": 10, "Ny": 8}
    return gs.message("GRIB2", values=np.arange(80.0), **keys)


def test_a_file_of_an_unsupported_grid_template_is_refused_by_name(tmp_path):
    source = gs.write(tmp_path / "ps.grib2", [polar_stereographic()])
    with pytest.raises(FormatError, match=r"grid definition template 3\.20 \(polar stereographic\)"):
        virtualize([str(source)], tmp_path / "refs.json")


def test_unsupported_messages_are_left_out_by_name_and_the_rest_kept(tmp_path):
    source = gs.write(tmp_path / "mixed.grib2", [gs.message(shortName="t"), polar_stereographic()])
    with pytest.warns(UserWarning, match=r"3\.20 \(polar stereographic\)"):
        result, ours = manifest_dataset(tmp_path, [source])
    assert [r.variable for r in result.refused] == ["/t (other messages)"]
    assert "(1 message)" in result.refused[0].reason
    assert "t" in ours.data_vars


@pytest.mark.parametrize(
    ("keys", "words"),
    [({"productDefinitionTemplateNumber": 5}, r"product definition template 4\.5 "),
     ({"packingType": "grid_simple_log_preprocessing"}, r"data representation template 5\.61 "),
     ({"scanningMode": 16}, "alternating row")],
)  # fmt: skip
def test_other_unsupported_templates_are_named(tmp_path, keys, words):
    data = gs.message(**keys)
    with pytest.raises(FormatError, match=words):
        grib.parse(BytesFile(data), parsed.ParseOptions())


def test_grib_edition_1_is_refused_by_name():
    data = gs.message("GRIB1")
    with pytest.raises(FormatError, match=r"GRIB edition 1 \(GRIB1\) is not supported"):
        grib.parse(BytesFile(data), parsed.ParseOptions())


def test_a_message_of_several_fields_is_refused_by_name():
    data = bytearray(gs.message())
    sections = grib_messages.walk(lambda o, n: bytes(data[o : o + n]), len(data), "x")[0].sections
    s4 = sections[4]
    start = data.index(s4)  # sections 4 to 7 again after section 7
    repeated = data[start:-4]
    data[-4:-4] = repeated
    data[8:16] = len(data).to_bytes(8, "big")
    with pytest.raises(FormatError, match="several fields"):
        grib.parse(BytesFile(bytes(data)), parsed.ParseOptions())


def test_padding_between_messages_is_skipped():
    one = gs.message(level=500)
    data = one + bytes(8) + gs.message(level=850) + bytes(100)
    model = grib.parse(BytesFile(data), parsed.ParseOptions())
    storage = model.root.variables["t"].storages[0]
    levels = np.frombuffer(storage.corners, dtype=np.int64).reshape(-1, 5)[:, 2]
    assert dict(zip(levels.tolist(), storage.offsets, strict=True)) == {0: len(one) + 8, 1: 0}  # 850 first


# ------------------------------------------------------------------------------------------ reads
def test_large_messages_are_hopped_over_reading_only_their_headers():
    count = gs.points("regular_gg_sfc_grib2")
    big = [gs.message("regular_gg_sfc_grib2", values=gs.field(i, count), bitsPerValue=24, level=i)
           for i in range(3)]  # fmt: skip
    data = b"".join(big) * 40  # 120 messages of 24 KiB, read 16 KiB at each
    source = BytesFile(data)
    grib_messages.walk(source.read, source.size, source.name)
    assert source.reads < 40 * 3 * 2
    assert len(big[0]) > grib_messages.HOP


def test_small_messages_of_a_remote_file_are_read_through_in_few_reads():
    data = gs.message() * 8000  # 8,000 messages of 1.6 KiB
    source = BytesFile(data)
    messages = grib_messages.walk(source.read, source.size, source.name, remote=True)
    assert len(messages) == 8000
    assert source.reads < 20


# ------------------------------------------------------------------------------------------ damage
@pytest.fixture(scope="module")
def valid_files():
    lam = {**gs.LAMBERT, "Nx": 4, "Ny": 3}
    return [
        gs.message() + gs.message(level=850),
        gs.message("GRIB2", values=np.arange(12.0), **lam),
        gs.message(bitmapPresent=1, values=np.where(np.arange(gs.points()) % 5, 1.0, 9999.0)),
    ]


def parse_anything(data: bytes) -> None:
    """Parse (and read the small values of) ``data``: only nczmap's errors may come out."""
    try:
        model = grib.parse(BytesFile(data), parsed.ParseOptions())
        for group in model.root.walk():
            for variable in group.variables.values():
                storage = variable.storages[0]
                if storage.values is not None:
                    storage.values()
    except NCZError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    choice=st.integers(0, 2),
    edits=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6),
    cut=st.none() | st.integers(0, 400),
    word=st.none() | st.tuples(st.integers(0, 60), st.sampled_from([0, 1, 5, 2**31, 2**32 - 1])),
)
def test_mutated_messages_raise_only_nczmap_errors(valid_files, choice, edits, cut, word):
    data = bytearray(valid_files[choice])
    for position, value in edits:
        if position < len(data):
            data[position] = value
    if word is not None:
        position, value = word
        data[4 * position : 4 * position + 4] = value.to_bytes(4, "big")
    if cut is not None:
        del data[cut:]
    parse_anything(bytes(data))


SECTIONS = st.builds(
    lambda number, length, body: length.to_bytes(4, "big") + bytes([number]) + body,
    st.integers(0, 9),
    st.integers(0, 80),
    st.binary(max_size=60),
)


@settings(max_examples=100, deadline=None)
@given(length=st.integers(0, 400), body=st.lists(SECTIONS, max_size=8).map(b"".join), end=st.booleans())
def test_random_sections_after_section_0_raise_only_nczmap_errors(length, body, end):
    data = b"GRIB\x00\x00\x00\x02" + length.to_bytes(8, "big") + body + (b"7777" if end else b"")
    parse_anything(data)


def test_eccodes_libraries_stay_out_of_the_global_scope_so_pyproj_exits_cleanly():
    """ecCodes' wheels load eckit's own PROJ (and SQLite, curl, OpenSSL) globally; a pyproj loaded after
    them used to crash the process at exit. Loaded by nczmap, they stay ecCodes' own."""
    import subprocess
    import sys

    script = (
        "import ctypes\n"
        "from nczmap.format.gribcodec import import_eccodes\n"
        "eccodes = import_eccodes()\n"
        "handle = eccodes.codes_grib_new_from_samples('regular_ll_pl_grib2')\n"
        "assert eccodes.codes_get(handle, 'numberOfValues') > 0\n"
        "assert not hasattr(ctypes.CDLL(None), 'proj_context_create')\n"
        "import xarray\n"
        "xarray.backends.list_engines()\n"
        "import pyproj\n"
        "print(pyproj.CRS(4326).name)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "WGS 84"
