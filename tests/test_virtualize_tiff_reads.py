"""What a TIFF parse reads: a Cloud-Optimized GeoTIFF and its twins in one request of at most 64 KiB.

A remote read costs a request whatever its size. :class:`RemoteLike` is a local file read as a remote
source is (the I/O layer's contract): its first read fetches at least 64 KiB from offset 0 in one request
and keeps them; a read inside them is free; any other read, and each range of ``read_ranges``, is one
request (counted strictly: the parser is given no credit for merging a remote source might do). Files
are written by GDAL (rasterio: the COG driver, and the GTiff driver editing a file in place) and by
tifffile; the parses through it equal those through a plain file object that only has ``read`` (the
parser's lazy path), and a twin's chunks equal its own full parse's. The last test serves a COG series
from a web server that counts requests (``tests/latency_server.py``).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from nczmap.integrations.virtualize import tiff
from nczmap.integrations.virtualize.parsed import ParseOptions
from nczmap.integrations.virtualize.sources import LocalFile
from nczmap.integrations.virtualize.tiff_ifds import Held, TiffReader, spans

rasterio = pytest.importorskip("rasterio")
tifffile = pytest.importorskip("tifffile")
pytest.importorskip("pyproj")
from rasterio.enums import Resampling  # noqa: E402
from rasterio.transform import from_origin  # noqa: E402

FIRST = 64 << 10
NODATA = -32768
FAST = {"compress": "DEFLATE", "level": 1}


class RemoteLike(LocalFile):
    """A local file read as a remote source: ``requests`` lists each request's ``(offset, length)``."""

    def __init__(self, path) -> None:
        super().__init__(os.path.realpath(path), str(path))
        self.requests: list[tuple[int, int]] = []
        self.held = 0  # the first block: [0, held)

    def _request(self, offset: int, length: int) -> None:
        if not self.requests and offset == 0:
            self.held = min(self.size, max(FIRST, length))
            self.requests.append((0, self.held))
        elif length and offset + length > self.held:
            self.requests.append((offset, length))

    def _bytes(self, offset: int, length: int) -> bytes:
        return LocalFile.read(self, offset, length)

    def read(self, offset: int, length: int) -> bytes:
        self._request(offset, length)
        return self._bytes(offset, length)

    def read_head(self, offset: int, length: int) -> bytes:
        length = max(0, min(length, self.size - offset))
        self._request(offset, length)
        return self._bytes(offset, length)

    def read_ranges(self, ranges):
        for offset, length in ranges:
            self._request(offset, length)
        return [self._bytes(offset, length) for offset, length in ranges]

    def cached(self, offset: int, length: int) -> bytes | None:
        if not self.requests or offset + length > self.held:
            return None
        return self._bytes(offset, min(length, self.size - offset))

    @property
    def fetched(self) -> int:
        return sum(length for _, length in self.requests)


class Plain:
    """A file object with ``read`` only: the parser reads each value when it needs it."""

    def __init__(self, path) -> None:
        self.name = os.path.realpath(path)
        self.data = Path(path).read_bytes()
        self.size = len(self.data)

    def read(self, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]


def parsed_through(path, cls=RemoteLike):
    file = cls(path)
    try:
        return tiff.parse(file, ParseOptions()), file
    finally:
        if isinstance(file, LocalFile):
            file.close()


def twin_through(path, fingerprint):
    file = RemoteLike(path)
    try:
        return tiff.parse_twin(file, fingerprint, ParseOptions()), file
    finally:
        file.close()


def storages(parsed) -> dict[str, tuple]:
    """Every chunked storage of a parse (a twin's, or a full parse's by variable key)."""
    if parsed.root is None:
        found = parsed.storages
    else:
        found = {v.key: v.storages[0] for g in parsed.root.walk() for v in g.variables.values()}
    return {
        key: (s.shape, s.chunks, s.codecs, list(s.corners), list(s.offsets), list(s.sizes))
        for key, s in found.items()
        if s.kind == "chunked"
    }


def model(parsed) -> list:
    """What a full parse made: groups, dimensions, variables, attributes, storages, refusals."""
    out: list = [sorted(map(str, parsed.refused)), storages(parsed)]
    for group in parsed.root.walk():
        out.append(sorted((d.name, d.size) for d in group.dimensions.values()))
        out.append(repr(sorted(group.attrs.items())))
        for _, variable in sorted(group.variables.items()):
            out.append((variable.key, [d.name for d in variable.dims], repr(variable.layout)))
            out.append(repr(sorted(variable.attrs.items())))
    return out


def write_cog(path: Path, size: int, seed: int, block: int = 512, **options) -> Path:
    """A daily field as the GHRSST COGs are: int16, zstd, predictor 2, overviews, nodata over much of it
    (land), values in a band of rows (the file's tile data lies well past its first 64 KiB)."""
    rng = np.random.default_rng(seed)
    data = np.full((1, size, size), NODATA, dtype="int16")
    rows = min(size, 512)
    data[0, :rows, :] = rng.integers(-2000, 3500, (rows, size), dtype="int16")
    profile = {
        "driver": "COG",
        "width": size,
        "height": size,
        "count": 1,
        "dtype": "int16",
        "crs": "EPSG:4326",
        "transform": from_origin(-180.0, 90.0, 360.0 / size, 180.0 / size),
        "nodata": NODATA,
        "compress": "ZSTD",
        "predictor": 2,
        "blocksize": block,
        "overview_resampling": "nearest",
        **options,
    }
    with rasterio.open(path, "w", **profile) as dataset:
        dataset.write(data)
    return path


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """GDAL COG series: size -> files (three of 256² in 128² tiles, three of 2048² and two of 10000² in
    512² tiles), and two of 10000² in 128² tiles, whose tile tables reach past the first 64 KiB (DEFLATE:
    GDAL takes seconds to compress 8,300 tiles with zstd; the layout is the same)."""
    folder = tmp_path_factory.mktemp("cogs")
    found = {}
    for size, count, block in ((256, 3, 128), (2048, 3, 512), (10000, 2, 512)):
        found[size] = [write_cog(folder / f"sst_{size}_{d}.tif", size, d, block) for d in range(count)]
    found["10000/128"] = [
        write_cog(folder / f"sst_10000t_{day}.tif", 10000, day, 128, **FAST) for day in range(2)
    ]
    return found


def metadata_end(path) -> tuple[int, int]:
    """(the first byte of tile data, the end of the last tile table) of a file, as tifffile reads them."""
    with tifffile.TiffFile(path) as handle:
        data = min(int(o) for page in handle.pages for o in page.dataoffsets if o)
        tables = max(
            tag.valueoffset + tag.valuebytecount
            for page in handle.pages
            for tag in page.tags.values()
            if tag.name in ("TileOffsets", "TileByteCounts")
        )
    return data, tables


# ------------------------------------------------------------------------------------ GDAL COGs
@pytest.mark.parametrize("size", [256, 2048, 10000])
def test_a_cog_and_its_twins_take_one_request_of_64_kib(series, size):
    first, *others = series[size]
    reader = TiffReader(Plain(first))
    assert reader.ifds_first, "GDAL's ghost area says LAYOUT=IFDS_BEFORE_DATA"
    assert reader.ghost["BLOCK_LEADER"] == "SIZE_AS_UINT4"
    parsed, file = parsed_through(first)
    assert file.requests == [(0, FIRST)], file.requests
    assert parsed.root.groups, "the COG has overviews"
    assert model(parsed) == model(tiff.parse(Plain(first), ParseOptions()))
    for other in others:
        twin, file = twin_through(other, parsed.fingerprint)
        assert twin is not None and twin.root is None
        assert len(file.requests) == 1 and file.fetched <= FIRST, file.requests
        own = tiff.parse(Plain(other), ParseOptions())
        assert storages(twin) == {k: v for k, v in storages(own).items() if k in twin.storages}
        assert storages(twin) != {k: v for k, v in storages(parsed).items() if k in twin.storages}


def test_tables_past_the_first_block_are_fetched_in_one_more_request(series):
    """10000² in 128² tiles: 8,300 tiles (image and overviews), 67 KB of tables, most past the first
    64 KiB. The IFDs' own offsets say how far they reach: one request fetches all that is missing; a twin
    reads its first file's metadata span in its one request."""
    first, second = series["10000/128"]
    data_start, tables_end = metadata_end(first)
    assert tables_end > FIRST and tables_end <= data_start  # the tables lie before the data
    parsed, file = parsed_through(first)
    assert file.requests == [(0, FIRST), (FIRST, tables_end - FIRST)], file.requests
    assert model(parsed) == model(tiff.parse(Plain(first), ParseOptions()))
    twin, file = twin_through(second, parsed.fingerprint)
    assert twin is not None
    assert file.requests == [(0, tables_end)], file.requests
    assert storages(twin) == storages(tiff.parse(Plain(second), ParseOptions()))


def test_a_file_unlike_the_first_is_parsed_from_the_bytes_its_twin_check_fetched(series, tmp_path):
    """A file of the series whose metadata differs (another nodata) is no twin; its full parse finds
    what the twin check's one request brought, and makes no other."""
    first = series["10000/128"][0]
    odd = write_cog(tmp_path / "odd.tif", 10000, 5, 128, **FAST, nodata=-9999)
    parsed, _ = parsed_through(first)
    file = RemoteLike(odd)
    try:
        assert tiff.parse_twin(file, parsed.fingerprint, ParseOptions()) is None
        full = tiff.parse(file, ParseOptions())
    finally:
        file.close()
    assert len(file.requests) == 1, file.requests
    assert model(full) == model(tiff.parse(Plain(odd), ParseOptions()))


def test_bigtiff_cog_and_masked_cog(tmp_path):
    big = [write_cog(tmp_path / f"big_{day}.tif", 2048, day, bigtiff="YES") for day in range(2)]
    parsed, file = parsed_through(big[0])
    assert file.requests == [(0, FIRST)]
    twin, file = twin_through(big[1], parsed.fingerprint)
    assert twin is not None and len(file.requests) == 1 and file.fetched <= FIRST

    data = np.random.default_rng(3).integers(0, 255, (3, 1200, 1100), dtype=np.uint8)
    path = tmp_path / "masked.tif"
    profile = {"driver": "COG", "width": 1100, "height": 1200, "count": 3, "dtype": "uint8"}
    profile |= {"crs": "EPSG:32633", "transform": from_origin(0, 1200, 1, 1), "blocksize": 256}
    with rasterio.open(path, "w", compress="deflate", predictor=2, **profile) as dataset:
        dataset.write(data)
        dataset.write_mask(np.where(data[0] > 5, 255, 0).astype(np.uint8))
    parsed, file = parsed_through(path)
    assert file.requests == [(0, FIRST)]
    assert any(r.variable == "/mask" for r in parsed.refused)
    assert model(parsed) == model(tiff.parse(Plain(path), ParseOptions()))


# ------------------------------------------------------------------------------ other TIFFs
def test_a_directory_rewritten_after_the_data_takes_a_request_a_hop(tmp_path):
    """GDAL's GTiff driver editing a file in place rewrites its IFD at the end of the file and appends
    overviews there: the first block, the rewritten IFD (with its tables and values after it), the
    overview IFDs (read together) — three requests, where one a tag was made before."""
    rng = np.random.default_rng(1)
    data = rng.integers(0, 3000, (2, 700, 600)).astype("int16")
    for options in (
        {"compress": "lzw", "blockysize": 8},
        {"tiled": True, "blockxsize": 64, "blockysize": 64},
    ):
        path = tmp_path / "edited.tif"
        profile = {"driver": "GTiff", "width": 600, "height": 700, "count": 2, "dtype": "int16"}
        profile |= {"crs": "EPSG:32633", "transform": from_origin(0, 700, 1, 1), **options}
        with rasterio.open(path, "w", **profile) as dataset:
            dataset.write(data)
        with rasterio.open(path, "r+") as dataset:
            dataset.update_tags(**{f"K{i}": "x" * 50 for i in range(40)})
            dataset.build_overviews([2, 4], Resampling.nearest)
        with tifffile.TiffFile(path) as handle:
            assert handle.pages[0].offset > FIRST  # the IFD lies after the data
        parsed, file = parsed_through(path)
        assert len(file.requests) <= 3, file.requests
        assert model(parsed) == model(tiff.parse(Plain(path), ParseOptions()))
        twin, file = twin_through(path, parsed.fingerprint)
        assert twin is not None and len(file.requests) <= 3, file.requests


def test_a_cog_edited_in_place_is_read_as_any_tiff(series, tmp_path):
    """GDAL marks a COG it edited in place (``KNOWN_INCOMPATIBLE_EDITION=YES``): its rewritten IFD lies
    after the data, and the parse follows the IFDs' offsets, not the ghost area's promise."""
    path = tmp_path / "edited_cog.tif"
    shutil.copyfile(series[2048][0], path)
    with rasterio.open(path, "r+", IGNORE_COG_LAYOUT_BREAK="YES") as dataset:
        dataset.update_tags(**{f"K{i}": "x" * 50 for i in range(40)})
    reader = TiffReader(Plain(path))
    assert reader.ghost["KNOWN_INCOMPATIBLE_EDITION"] == "YES" and not reader.ifds_first
    parsed, file = parsed_through(path)
    assert len(file.requests) <= 2, file.requests
    assert model(parsed) == model(tiff.parse(Plain(path), ParseOptions()))
    assert "K0" in parsed.root.attrs


def test_held_bytes_and_spans():
    data = bytes(range(256)) * 40
    held = Held()
    for offset, length in ((0, 100), (100, 50), (400, 100), (120, 300), (2000, 10)):
        held.add(offset, data[offset : offset + length])
    assert held.starts == sorted(held.starts) and held.total == 510
    assert held.get(90, 400) == data[90:490]  # across pieces that touch
    assert held.get(490, 20) is None and held.get(1999, 2) is None and held.get(2000, 10) == data[2000:2010]
    assert held.missing([(0, 600), (1990, 2020)]) == [(500, 600), (1990, 2000), (2010, 2020)]
    # neighbours merged across the smallest gaps while the bytes read for nothing stay below the wanted
    assert spans([(0, 8), (192, 900), (1100, 70000), (80000, 3000)]) == [(0, 83000)]
    far = spans([(0, 8), (100 << 20, 3000), ((100 << 20) + 10000, 500)])
    assert far == [(0, 8), (100 << 20, (100 << 20) + 10500)]
    pages = spans([(i * 60000, 200) for i in range(10)])
    assert len(pages) == 9  # one 60 KB gap fits 64 KiB: ten pages are not read whole


def test_strip_tables_past_the_first_block_are_read_in_one_request(tmp_path):
    """20,000 one-row strips: 160 KB of strip offsets and byte counts after the IFD, fetched together."""
    data = (np.arange(20000 * 24, dtype=np.int32).reshape(1, 20000, 24) % 5000).astype(np.int16)
    path = tmp_path / "strips.tif"
    profile = {"driver": "GTiff", "width": 24, "height": 20000, "count": 1, "dtype": "int16"}
    profile |= {"crs": "EPSG:32633", "transform": from_origin(0, 20000, 1, 1), "blockysize": 1}
    with rasterio.open(path, "w", compress="deflate", **profile) as dataset:
        dataset.write(data)
    parsed, file = parsed_through(path)
    assert len(file.requests) == 2 and file.requests[0] == (0, FIRST), file.requests
    assert model(parsed) == model(tiff.parse(Plain(path), ParseOptions()))


@pytest.mark.parametrize("layout", ["strips", "tiles", "pages"])
def test_tifffile_written(tmp_path, layout):
    rng = np.random.default_rng(2)
    data = rng.integers(0, 30000, (3, 400, 300)).astype("int16")
    path = tmp_path / f"{layout}.tif"
    if layout == "strips":
        tifffile.imwrite(path, data[0], compression="zlib", rowsperstrip=4)
    elif layout == "tiles":
        tifffile.imwrite(
            path, data, compression="zlib", tile=(64, 64), planarconfig="separate", photometric="minisblack"
        )
    else:
        with tifffile.TiffWriter(path) as writer:
            for plane in data:
                writer.write(plane, compression="zlib", rowsperstrip=16, photometric="minisblack")
    parsed, file = parsed_through(path)
    if layout != "pages":
        assert file.requests == [(0, FIRST)], file.requests
    else:  # each page's IFD lies before its data: one request a page
        assert len(file.requests) <= len(data), file.requests
    assert model(parsed) == model(tiff.parse(Plain(path), ParseOptions()))


# -------------------------------------------------------------------------- over HTTP, counted
def test_a_cog_series_over_http_is_parsed_in_one_get_of_64_kib_a_file(series, tmp_path, monkeypatch):
    """Served by a web server that counts what it is asked (no HEAD is made, one GET a file), the series
    makes the manifest its local files make."""
    import latency_server

    from nczmap.integrations.virtualize import PARSERS, parallel, virtualize
    from nczmap.integrations.virtualize.sources import source_files

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "*")
    folder = tmp_path / "served"
    folder.mkdir()
    days = [f"2020010{day + 1}" for day in range(3)]
    for day, path in zip(days, series[2048], strict=True):
        shutil.copyfile(path, folder / f"sst_{day}.tif")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        virtualize(sorted(map(str, folder.glob("*.tif"))), tmp_path / "local.json", new_dim="time=%Y%m%d")
        with latency_server.serving(folder, latency=0.005) as server:
            urls = [f"{server.url}/sst_{day}.tif" for day in days]
            files = source_files(urls)
            try:
                parsed = parallel.parse_all(files, ParseOptions(), PARSERS)
                stats = server.stats()
                assert [p.root is None for p in parsed] == [False, True, True]
                for item in parsed:
                    item.close()
            finally:
                for file in files:
                    file.close()
            virtualize(urls, tmp_path / "remote.json", new_dim="time=%Y%m%d")
    assert stats["counts"] == {"GET": len(days)}, stats["counts"]
    assert all(sent <= FIRST for sent in stats["bytes_per_file"].values()), stats["bytes_per_file"]
    local = json.loads((tmp_path / "local.json").read_text())["refs"]
    remote = json.loads((tmp_path / "remote.json").read_text())["refs"]
    assert local.keys() == remote.keys()
    for key, value in local.items():
        if isinstance(value, list):  # [url, offset, size]: the same bytes, named by their URL
            assert remote[key][1:] == value[1:] and remote[key][0].endswith(Path(value[0]).name)
        elif isinstance(remote[key], list):  # a tiny chunk, kept locally, referenced remotely (no request)
            url, offset, length = remote[key]
            raw = (folder / url.rsplit("/", 1)[1]).read_bytes()[offset : offset + length]
            held = base64.b64decode(value[7:]) if value.startswith("base64:") else value.encode("utf-8")
            assert raw == held, key
        else:
            assert remote[key] == value
