"""The TIFF / COG parser: every chunk's referenced bytes decode to what rasterio and tifffile read."""

from __future__ import annotations

import contextlib
import struct
import time

import numpy as np
import pytest
from test_tiff_codecs import hide_imagecodecs

from nczmap.errors import FormatError
from nczmap.format import tiffcodecs
from nczmap.integrations.virtualize import tiff
from nczmap.integrations.virtualize.parsed import NotVirtualizable, ParseOptions

rasterio = pytest.importorskip("rasterio")
tifffile = pytest.importorskip("tifffile")
pyproj = pytest.importorskip("pyproj")
from rasterio.transform import Affine, from_origin  # noqa: E402

HEIGHT, WIDTH = 75, 90


class _File:
    def __init__(self, path) -> None:
        self.name = str(path)
        with open(path, "rb") as handle:
            self.data = handle.read()
        self.size = len(self.data)

    def read(self, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]


class _Bytes(_File):
    def __init__(self, data: bytes, name: str = "mem.tif") -> None:
        self.name, self.data, self.size = name, data, len(data)


@pytest.fixture(params=["numcodecs", "nczmap"])
def backend(request, monkeypatch):
    """Decode through imagecodecs-numcodecs, or through nczmap's own codecs as if it were absent."""
    if request.param == "nczmap":
        hide_imagecodecs(monkeypatch)
    return request.param


def assemble(variable) -> np.ndarray:
    """The variable's values from its referenced chunks, decoded by its own CodecChain."""
    storage, layout = variable.storages[0], variable.layout
    fill = layout.fill if layout.fill is not None else 0
    out = np.full(storage.shape, fill, dtype=layout.dtype.storage)
    ndim, chunks = len(storage.shape), storage.chunks
    nbytes = int(np.prod(chunks)) * layout.dtype.itemsize
    for i in range(storage.chunk_count):
        corner = storage.corners[i * ndim : (i + 1) * ndim]
        assert storage.sizes[i] > 0 and storage.offsets[i] > 0
        raw = storage.read(storage.offsets[i], storage.sizes[i])
        data = layout.codecs.decode(raw, variable.key, limit=nbytes)
        chunk = np.frombuffer(data, dtype=layout.dtype.storage).reshape(chunks)
        region = tuple(slice(c, min(c + n, s)) for c, n, s in zip(corner, chunks, storage.shape, strict=True))
        out[region] = chunk[tuple(slice(0, r.stop - r.start) for r in region)]
    return out


def band_first(variable, values: np.ndarray) -> np.ndarray:
    names = [d.name.split("_overview_")[0] for d in variable.dims]  # overviews' dims: y_overview_1...
    if names == ["y", "x"]:
        return values[None]
    if names == ["y", "x", "band"]:
        return np.moveaxis(values, -1, 0)
    assert names == ["band", "y", "x"]
    return values


def write_raster(path, data: np.ndarray, crs="EPSG:32633", transform=None, nodata=None, **options):
    profile = {
        "driver": "GTiff",
        "width": data.shape[2],
        "height": data.shape[1],
        "count": data.shape[0],
        "dtype": data.dtype,
        "crs": crs,
        "transform": transform or from_origin(500000, 6000000, 30, 30),
        "nodata": nodata,
    }
    profile.update(options)
    with rasterio.open(path, "w", **profile) as dataset:
        dataset.write(data)
    return path


def sample(dtype: str, bands: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        base = np.add.outer(np.arange(HEIGHT), np.arange(WIDTH)) * 0.25
        return (base + rng.standard_normal((bands, HEIGHT, WIDTH))).astype(dtype)
    info = np.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 5000)
    smooth = np.add.outer(np.arange(HEIGHT), np.arange(WIDTH)) % 50
    noise = rng.integers(low, high, size=(bands, HEIGHT, WIDTH))
    return np.where(noise % 3 == 0, noise, smooth + max(low, 0)).astype(dtype)


TILED = {"tiled": True, "blockxsize": 32, "blockysize": 32}
CASES = {
    "tiled-deflate-pred2-i16-pixel": ("int16", 3, {**TILED, "compress": "deflate", "predictor": 2}),
    "tiled-deflate-pred2-u8-band": (
        "uint8",
        3,
        {**TILED, "compress": "deflate", "predictor": 2, "interleave": "band"},
    ),
    "strip-lzw-pred2-u16-partial": ("uint16", 1, {"compress": "lzw", "predictor": 2, "blockysize": 8}),
    "strip-lzw-i32": ("int32", 1, {"compress": "lzw", "blockysize": 10}),
    "strip-lzw-u32-big": ("uint32", 1, {"compress": "lzw", "blockysize": 10, "endianness": "big"}),
    "strip-deflate-pred2-i64": ("int64", 1, {"compress": "deflate", "predictor": 2, "blockysize": 16}),
    "strip-zstd-u64": ("uint64", 2, {"compress": "zstd", "blockysize": 16}),
    "tiled-zstd-pred3-f32-pixel": ("float32", 3, {**TILED, "compress": "zstd", "predictor": 3}),
    "tiled-zstd-pred3-f32-band-big": (
        "float32",
        3,
        {**TILED, "compress": "zstd", "predictor": 3, "interleave": "band", "endianness": "big"},
    ),
    "tiled-lzw-pred3-f64-pixel-big": (
        "float64",
        2,
        {**TILED, "compress": "lzw", "predictor": 3, "endianness": "big"},
    ),
    "strip-deflate-pred3-f64-partial": (
        "float64",
        1,
        {"compress": "deflate", "predictor": 3, "blockysize": 7},
    ),
    "strip-packbits-i8": ("int8", 1, {"compress": "packbits", "blockysize": 6}),
    "strip-packbits-i16-band-partial": (
        "int16",
        3,
        {"compress": "packbits", "blockysize": 7, "interleave": "band"},
    ),
    "strip-none-i16-pixel-partial": ("int16", 3, {"compress": "none", "blockysize": 7}),
    "tiled-none-u16-bigtiff": ("uint16", 1, {**TILED, "compress": "none", "bigtiff": "yes"}),
    "tiled-lzw-pred2-i16-bigtiff-big": (
        "int16",
        2,
        {**TILED, "compress": "lzw", "predictor": 2, "bigtiff": "yes", "endianness": "big"},
    ),
    "strip-pred2-u16-pixel-big-partial": (
        "uint16",
        3,
        {"compress": "deflate", "predictor": 2, "blockysize": 9, "endianness": "big"},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gtiff_decodes_like_rasterio(tmp_path, backend, case):
    dtype, bands, options = CASES[case]
    data = sample(dtype, bands, seed=len(case))
    path = write_raster(tmp_path / "image.tif", data, **options)
    parsed = tiff.parse(_File(path), ParseOptions())
    assert parsed.format == "tiff" and parsed.refused == []
    variable = parsed.root.variables["band_data"]
    values = band_first(variable, assemble(variable))
    with rasterio.open(path) as dataset:
        expected = dataset.read()
    assert values.dtype.newbyteorder("=") == expected.dtype.newbyteorder("=")
    np.testing.assert_array_equal(values, expected)
    np.testing.assert_array_equal(
        band_first(variable, tifffile.imread(path).reshape(variable.storages[0].shape)), expected
    )
    if "partial" in case:
        assert any(c["id"] == "nczmap.pad" for c in variable.layout.codecs.filters)
    if bands > 1:
        assert variable.attrs["grid_mapping"] == "spatial_ref"
        assert parsed.root.variables["band"].storages[0].values().tolist() == list(range(1, bands + 1))


def _xy_centres(transform, height: int, width: int):
    xs, _ = rasterio.transform.xy(transform, [0] * width, list(range(width)))
    _, ys = rasterio.transform.xy(transform, list(range(height)), [0] * height)
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


@pytest.mark.parametrize("crs", ["EPSG:32633", "EPSG:4326"])
def test_georeferencing(tmp_path, crs):
    transform = (
        from_origin(500000, 6000000, 30, 20) if crs != "EPSG:4326" else from_origin(10.5, 60.25, 0.01, 0.02)
    )
    path = write_raster(
        tmp_path / "geo.tif", sample("uint8", 1), crs=crs, transform=transform, compress="deflate"
    )
    root = tiff.parse(_File(path), ParseOptions()).root
    with rasterio.open(path) as dataset:
        xs, ys = _xy_centres(dataset.transform, dataset.height, dataset.width)
        wkt = dataset.crs.to_wkt()
    np.testing.assert_allclose(root.variables["x"].storages[0].values(), xs, rtol=0, atol=1e-9)
    np.testing.assert_allclose(root.variables["y"].storages[0].values(), ys, rtol=0, atol=1e-9)
    spatial_ref = root.variables["spatial_ref"]
    attrs = {name: spatial_ref.attrs[name] for name in spatial_ref.attrs}
    cf = {k: (v.item() if isinstance(v, np.ndarray) and v.size == 1 else v) for k, v in attrs.items()}
    expected = pyproj.CRS.from_user_input(wkt)
    assert pyproj.CRS.from_cf(cf) == expected
    assert pyproj.CRS.from_wkt(cf["spatial_ref"]) == expected
    assert spatial_ref.dims == () and spatial_ref.storages[0].values() == 0
    geographic = crs == "EPSG:4326"
    x_attrs = root.variables["x"].attrs
    assert x_attrs["standard_name"] == ("longitude" if geographic else "projection_x_coordinate")
    assert x_attrs["units"] == ("degrees_east" if geographic else "m")
    assert root.variables["y"].attrs["axis"] == "Y"
    assert root.variables["band_data"].attrs["grid_mapping"] == "spatial_ref"
    a, b, c, d, e, f = transform[:6]
    assert [float(v) for v in cf["GeoTransform"].split()] == [c, a, b, f, d, e]


def test_pixel_is_point_shifts_half_a_pixel(tmp_path):
    path = write_raster(tmp_path / "point.tif", sample("uint8", 1), compress="none")
    with rasterio.open(path, "r+") as dataset:
        dataset.update_tags(AREA_OR_POINT="Point")
    root = tiff.parse(_File(path), ParseOptions()).root
    with rasterio.open(path) as dataset:
        xs, ys = _xy_centres(dataset.transform, dataset.height, dataset.width)
    np.testing.assert_allclose(root.variables["x"].storages[0].values(), xs, atol=1e-9)
    np.testing.assert_allclose(root.variables["y"].storages[0].values(), ys, atol=1e-9)


def test_rotated_transform_has_no_xy(tmp_path):
    transform = Affine(30, 5, 500000, 4, -30, 6000000)
    path = write_raster(tmp_path / "rot.tif", sample("uint8", 1), transform=transform)
    root = tiff.parse(_File(path), ParseOptions()).root
    assert "x" not in root.variables and "y" not in root.variables
    geotransform = [float(v) for v in root.variables["spatial_ref"].attrs["GeoTransform"].split()]
    assert geotransform == [500000, 30, 5, 6000000, 4, -30]


def test_sparse_tiles_are_missing_chunks_and_nodata(tmp_path, backend):
    path = tmp_path / "sparse.tif"
    data = sample("int16", 1)
    profile = dict(
        driver="GTiff", width=WIDTH, height=HEIGHT, count=1, dtype="int16", crs="EPSG:32633",
        transform=from_origin(0, 0, 1, 1), nodata=-9999, sparse_ok=True, compress="deflate", **TILED,
    )  # fmt: skip
    with rasterio.open(path, "w", **profile) as dataset:
        window = rasterio.windows.Window(0, 0, 32, 32)
        dataset.write(data[:, :32, :32], window=window)
    variable = tiff.parse(_File(path), ParseOptions()).root.variables["band_data"]
    storage = variable.storages[0]
    assert 0 < storage.chunk_count < 9 and min(storage.sizes) > 0
    assert variable.layout.fill == -9999
    assert variable.attrs["_FillValue"] == -9999
    with rasterio.open(path) as dataset:
        np.testing.assert_array_equal(assemble(variable)[None], dataset.read())


def test_float_nodata_nan(tmp_path):
    path = write_raster(tmp_path / "nan.tif", sample("float32", 1), nodata=float("nan"))
    variable = tiff.parse(_File(path), ParseOptions()).root.variables["band_data"]
    assert np.isnan(variable.layout.fill) and np.isnan(variable.attrs["_FillValue"])


def test_cog_with_overviews_and_mask(tmp_path, backend):
    data = np.zeros((3, 300, 260), dtype=np.uint8) + sample("uint8", 3)[:, :1, :1]
    data += (np.add.outer(np.arange(300), np.arange(260)) % 200).astype(np.uint8)
    source = write_raster(tmp_path / "src.tif", data)
    path = tmp_path / "cog.tif"
    with rasterio.open(source) as src:
        profile = src.profile | {"driver": "COG", "blocksize": 128, "compress": "deflate", "predictor": 2}
        profile.pop("blockxsize", None), profile.pop("blockysize", None), profile.pop("tiled", None)
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(src.read())
            dst.write_mask(np.where(data[0] > 5, 255, 0).astype(np.uint8))
    parsed = tiff.parse(_File(path), ParseOptions())
    root = parsed.root
    with rasterio.open(path) as dataset:
        np.testing.assert_array_equal(
            band_first(root.variables["band_data"], assemble(root.variables["band_data"])), dataset.read()
        )
        overviews = dataset.overviews(1)
    assert overviews and sorted(root.groups) == [f"overview_{i + 1}" for i in range(len(overviews))]
    for level in range(len(overviews)):
        group = root.groups[f"overview_{level + 1}"]
        with rasterio.open(path, overview_level=level) as dataset:
            variable = group.variables["band_data"]
            np.testing.assert_array_equal(band_first(variable, assemble(variable)), dataset.read())
            xs, ys = _xy_centres(dataset.transform, dataset.height, dataset.width)
        x, y = (group.variables[f"{axis}_overview_{level + 1}"] for axis in "xy")
        assert [d.name for d in group.variables["band_data"].dims][-2:] != ["y", "x"]  # names of their own
        np.testing.assert_allclose(x.storages[0].values(), xs, atol=1e-6)
        np.testing.assert_allclose(y.storages[0].values(), ys, atol=1e-6)
    assert any(r.variable == "/mask" for r in parsed.refused)


def _band_metadata(path, scales, offsets, interleave):
    data = sample("int16", len(scales))
    write_raster(path, data, interleave=interleave, compress="deflate", **TILED)
    with rasterio.open(path, "r+") as dataset:
        dataset.scales = scales
        dataset.offsets = offsets
        dataset.units = ["K"] * len(scales)
        for i in range(len(scales)):
            dataset.set_band_description(i + 1, f"band number {i + 1}")
        dataset.update_tags(source="a test")
    return tiff.parse(_File(path), ParseOptions())


def test_uniform_scale_offset(tmp_path):
    parsed = _band_metadata(tmp_path / "s.tif", (0.5, 0.5), (10.0, 10.0), "pixel")
    variable = parsed.root.variables["band_data"]
    assert variable.attrs["scale_factor"] == 0.5
    assert variable.attrs["add_offset"] == 10.0
    assert variable.attrs["units"] == "K"
    assert variable.attrs["long_name"] == ["band number 1", "band number 2"]
    assert parsed.root.attrs["source"] == "a test"


def test_per_band_scale_planar_splits_variables(tmp_path):
    parsed = _band_metadata(tmp_path / "s.tif", (0.5, 2.0, 1.0), (0.0, 1.0, 0.0), "band")
    root = parsed.root
    assert "band_data" not in root.variables
    with rasterio.open(tmp_path / "s.tif") as dataset:
        expected = dataset.read()
    for i, (scale, offset) in enumerate([(0.5, 0.0), (2.0, 1.0), (1.0, 0.0)]):
        variable = root.variables[f"band_{i + 1}"]
        assert [d.name for d in variable.dims] == ["y", "x"]
        attrs = variable.attrs
        if i < 2:  # GDAL records no scale 1 / offset 0
            assert (attrs["scale_factor"], attrs["add_offset"]) == (scale, offset)
        else:
            assert "scale_factor" not in attrs and "add_offset" not in attrs
        assert attrs["long_name"] == f"band number {i + 1}"
        np.testing.assert_array_equal(assemble(variable), expected[i])


def test_per_band_scale_pixel_interleaved_is_not_collapsed(tmp_path):
    parsed = _band_metadata(tmp_path / "s.tif", (0.5, 2.0), (0.0, 1.0), "pixel")
    variable = parsed.root.variables["band_data"]
    assert "scale_factor" not in variable.attrs and "add_offset" not in variable.attrs
    assert variable.attrs["band_scale_factor"].tolist() == [0.5, 2.0]
    assert variable.attrs["band_add_offset"].tolist() == [0.0, 1.0]
    assert {r.attribute for r in parsed.refused} == {"scale_factor", "add_offset"}


# ------------------------------------------------------------------------------------------ tifffile
TIFFFILE_CASES = {
    "tiles-zlib-pred-i16": (
        "int16",
        (HEIGHT, WIDTH),
        {"tile": (32, 32), "compression": "zlib", "predictor": True},
    ),
    "tiles-lzw-planar-u16": (
        "uint16",
        (3, HEIGHT, WIDTH),
        {"tile": (32, 32), "compression": "lzw", "planarconfig": "separate", "photometric": "rgb"},
    ),
    "strips-big-f64-pred": (
        "float64",
        (HEIGHT, WIDTH),
        {"rowsperstrip": 10, "compression": "zlib", "predictor": True, "byteorder": ">"},
    ),
    "strips-packbits-contig-u8": (
        "uint8",
        (HEIGHT, WIDTH, 3),
        {"rowsperstrip": 16, "compression": "packbits", "photometric": "rgb"},
    ),
    "bigtiff-i64": ("int64", (HEIGHT, WIDTH), {"bigtiff": True, "tile": (16, 16)}),
    "tiles-zstd-f32": ("float32", (HEIGHT, WIDTH), {"tile": (32, 48), "compression": "zstd"}),
}


@pytest.mark.parametrize("case", list(TIFFFILE_CASES))
def test_tifffile_written(tmp_path, backend, case):
    dtype, shape, options = TIFFFILE_CASES[case]
    rng = np.random.default_rng(7)
    data = (
        (rng.standard_normal(shape) * 100).astype(dtype)
        if dtype[0] == "f"
        else rng.integers(0, 100, shape).astype(dtype)
    )
    path = tmp_path / "t.tif"
    tifffile.imwrite(path, data, **options)
    parsed = tiff.parse(_File(path), ParseOptions())
    variable = parsed.root.variables["band_data"]
    assert "x" not in parsed.root.variables  # no georeferencing
    np.testing.assert_array_equal(assemble(variable), data)


def test_multipage_refuses_later_pages(tmp_path):
    path = tmp_path / "pages.tif"
    with tifffile.TiffWriter(path) as writer:
        for value in range(3):
            writer.write(np.full((8, 8), value, np.uint8))
    parsed = tiff.parse(_File(path), ParseOptions())
    assert [r.variable for r in parsed.refused] == ["/image_2", "/image_3"]
    assert assemble(parsed.root.variables["band_data"]).tolist() == np.zeros((8, 8)).tolist()


def test_jpeg_is_refused(tmp_path):
    path = write_raster(tmp_path / "j.tif", sample("uint8", 3), compress="jpeg", **TILED)
    with pytest.raises(NotVirtualizable, match=r"j\.tif: its compression 7 \(JPEG\)"):
        tiff.parse(_File(path), ParseOptions())


def test_sniff():
    for magic in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        data = magic + bytes(12)
        assert tiff.sniff(lambda o, n, d=data: d[o : o + n], len(data))
    assert not tiff.sniff(lambda o, n: b"\x89HDF\r\n\x1a\n"[o : o + n], 8)
    assert not tiff.sniff(lambda o, n: b"II*"[o : o + n], 3)


# ------------------------------------------------------------------------------------ hostile files
def build_tiff(
    entries: list[tuple[int, int, list]], payload: bytes = b"", next_ifd: int = 0, order="<"
) -> bytes:
    """A classic TIFF: header, the payload at offset 8, then one IFD (values that do not fit after it)."""
    codes = {3: "H", 4: "I", 2: "s", 12: "d"}
    ifd_at = 8 + len(payload)
    extra_at = ifd_at + 2 + 12 * len(entries) + 4
    ifd, extra = bytearray(struct.pack(order + "H", len(entries))), bytearray()
    for tag, ftype, values in sorted(entries):
        raw = values if ftype == 2 else struct.pack(order + codes[ftype] * len(values), *values)
        count = len(values)
        if len(raw) <= 4:
            field = raw.ljust(4, b"\x00")
        else:
            field = struct.pack(order + "I", extra_at + len(extra))
            extra += raw
        ifd += struct.pack(order + "HHI", tag, ftype, count) + field
    ifd += struct.pack(order + "I", next_ifd)
    magic = b"II*\x00" if order == "<" else b"MM\x00*"
    return magic + struct.pack(order + "I", ifd_at) + payload + bytes(ifd) + bytes(extra)


def minimal(width=4, height=4, rows=2, replace: dict | None = None) -> list[tuple[int, int, list]]:
    replace = replace or {}
    strips = -(-height // rows)
    strips = strips if strips <= 1 << 16 else 0
    entries = {
        256: (4, [width]),
        257: (4, [height]),
        258: (3, [8]),
        259: (3, [1]),
        278: (4, [rows]),
        273: (4, [min(8 + i * rows * width, 0xFFFFFFFF) for i in range(strips)]),
        279: (4, [min(rows * width, 0xFFFFFFFF)] * strips),
    }
    entries.update(replace)
    return [(tag, ftype, values) for tag, (ftype, values) in entries.items() if values is not None]


def test_minimal_builder_works():
    data = build_tiff(minimal(), bytes(range(16)))
    variable = tiff.parse(_Bytes(data), ParseOptions()).root.variables["band_data"]
    assert assemble(variable).ravel().tolist() == list(range(16))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (build_tiff(minimal(), bytes(16), next_ifd=24), "loops"),
        (build_tiff(minimal(replace={273: (4, [8, 100000])}), bytes(16)), "past the end"),
        (build_tiff(minimal(replace={279: (4, [8, 3])}), bytes(16)), "uncompressed strip 1 has 3 bytes"),
        (build_tiff(minimal(replace={273: (4, [8]), 279: (4, [8])}), bytes(16)), "1 strip offsets for"),
        (build_tiff(minimal(width=1 << 30, height=1 << 30, rows=1 << 30), bytes(16)), "absurd"),
        (build_tiff(minimal(replace={256: (4, [0])}), bytes(16)), "0 x 4"),
        (build_tiff(minimal(replace={256: (4, None)})), "ImageWidth"),
        (b"II*\x00" + struct.pack("<I", 1 << 20), "past the end"),
        (b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 5000), "claims 5000 entries"),
        (b"II+\x00" + struct.pack("<HHQ", 4, 0, 16), "offset size 4"),
    ],
    ids=["loop", "offset-eof", "short-bytecount", "count-mismatch", "absurd-dims", "zero-width", "no-width",
         "ifd-eof", "entries-eof", "bigtiff-header"],
)  # fmt: skip
def test_hostile(data, message):
    with pytest.raises(FormatError, match=message) as info:
        tiff.parse(_Bytes(data, "evil.tif"), ParseOptions())
    assert "evil.tif" in str(info.value) or isinstance(info.value, NotVirtualizable)


def test_tag_count_beyond_file():
    data = bytearray(build_tiff(minimal(), bytes(16)))
    ifd_at = 8 + 16
    # the StripOffsets entry (sorted: 256, 257, 258, 259, 273, ...) claims a billion values
    entry = ifd_at + 2 + 4 * 12
    struct.pack_into("<I", data, entry + 4, 1 << 30)
    with pytest.raises(FormatError, match=r"evil\.tif"):
        tiff.parse(_Bytes(bytes(data), "evil.tif"), ParseOptions())


def test_overlapping_ifds_are_bounded_in_entries_read():
    """IFDs may overlap: 6 bytes apart, each claiming 65535 entries and chaining to the next, a 1 MB file
    would make 65536 IFDs of 65535 entries (hours of parsing) were the entries read in all not bounded."""
    count, spacing, first = 65535, 6, 10
    pages = tiff.MAX_IFDS
    data = bytearray(first + spacing * (pages + 2 * count) + 16)
    data[:8] = b"II*\x00" + struct.pack("<I", first)
    for k in range(pages + 2 * count):
        at = first + spacing * k
        struct.pack_into("<H", data, at, count)  # IFD k's entry count
        reader = k - 2 * count  # the IFD whose next-IFD pointer lies here (just past its entries)
        following = first + spacing * (reader + 1) if 0 <= reader < pages - 1 else 0
        struct.pack_into("<I", data, at + 2, following)
    started = time.monotonic()
    with pytest.raises(FormatError, match="entries in all"):
        tiff.parse(_Bytes(bytes(data), "evil.tif"), ParseOptions())
    assert time.monotonic() - started < 30


def test_many_tiles_of_a_huge_image_refused_before_reading():
    entries = minimal(
        width=1 << 31,
        height=1 << 31,
        replace={322: (3, [16]), 323: (3, [16]), 278: (4, None), 273: (4, None), 279: (4, None)},
    )
    entries += [(324, 4, [8]), (325, 4, [16])]
    with pytest.raises(FormatError, match="tile offsets for an image of"):
        tiff.parse(_Bytes(build_tiff(entries, bytes(16)), "evil.tif"), ParseOptions())


def test_fuzzed_ifds_fail_cleanly():
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    seed = build_tiff(minimal(replace={339: (3, [1]), 277: (3, [1])}), bytes(range(16)))

    @hypothesis.settings(max_examples=200, deadline=None, database=None)
    @hypothesis.given(st.lists(st.tuples(st.integers(0, len(seed) - 1), st.integers(0, 255)), max_size=6),
                      st.integers(0, len(seed)))  # fmt: skip
    def run(changes, cut):
        data = bytearray(seed)
        for position, value in changes:
            data[position] = value
        with contextlib.suppress(FormatError):
            tiff.parse(_Bytes(bytes(data[: max(cut, 8)]), "fuzz.tif"), ParseOptions())

    run()


def test_pad_is_registered_for_zarr():
    assert tiffcodecs.get_codec({"id": "nczmap.pad", "nbytes": 4}).nbytes == 4
