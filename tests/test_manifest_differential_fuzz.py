"""Malformed manifests (issue 33 B): the JSON fast path (:mod:`nczmap.manifest.kerchunk_scan`) and the plain
parse give the same model or an nczmap error of the same class, on generated manifests of every shape the
format allows and many it does not (escapes in keys and URLs, numbers at and past int64, floats, booleans,
nulls, nested values, duplicate keys, templates, whitespace, version 0 and 1); Parquet record files with
out-of-range columns read as the plain reading of their rows says. No bare exception, no hang, no
allocation a manifest's numbers ask for."""

from __future__ import annotations

import base64
import contextlib
import json
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_hostile_input import time_limit
from test_hostile_manifests import manifest
from test_manifest_parquet import zarray
from test_manifest_scan import ZARRAY_1D, ZARRAY_2D, both, outcome

import nczmap
from nczmap.errors import FormatError
from nczmap.manifest import kerchunk_json, kerchunk_parquet, kerchunk_scan
from nczmap.manifest.model import Reference

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

EXAMPLE_SECONDS = 10  # one example's bound: a few milliseconds are expected, a hang is what this catches
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def reads(manifest, keys: list[str]) -> dict[str, object]:
    """What every way of asking a manifest gives (an entry, or the FormatError's text): key by key, all
    keys' columns at once, and the chunk columns of arrays ``a`` and ``g/b`` (by key where they are not in
    a table: which arrays are is the path's own business)."""
    found: dict[str, object] = {key: outcome(manifest, key) for key in keys}
    found["columns()"] = _entries_or_error(lambda: manifest.columns(keys))
    for array, shape in (("a", (10,)), ("g/b", (3, 3))):
        found[f"chunk_columns({array})"] = _chunk_entries(manifest, array, shape)
    return found


def _chunk_entries(manifest, array: str, shape: tuple[int, ...]) -> object:
    indices = np.array(list(np.ndindex(*shape)), dtype=np.int64).reshape(-1, len(shape))
    found = _entries_or_error(lambda: manifest.chunk_columns(array, indices, "."))
    if found is not None:
        return found
    names = [f"{array}/" + ".".join(map(str, index)) for index in indices.tolist()]
    return _entries_or_error(lambda: manifest.columns(names))


def _entries_or_error(call) -> object:
    try:
        gathered = call()
    except FormatError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if gathered is None else gathered.entries()


# ============================================================================================== JSON text
NUMBERS = [
    "0",
    "7",
    "-1",
    "-0",
    "01",  # no JSON (ujson reads it)
    "999999999999999999",  # 18 digits: the scanner's longest
    "1000000000000000000",
    str(2**63 - 1),
    str(2**63),
    str(2**64 - 1),
    str(2**64 + 5),
    str(2**70),
    str(-(2**63)),
    str(-(2**63) - 1),
    "1.5",
    "2.0",
    "1e3",
    "1E400",
    "-0.0",
    "true",
    "false",
    "null",
    "[0]",
    "[]",
    "{}",
    '"5"',
]
URLS = [
    "/d/a",
    "/d/b",
    "{{u}}",
    "{{ u }}/x",
    "{{missing}}",
    r"/d/\u00fc",
    r"/d/q\"uote",
    r"/d/back\\slash",
    r"\/d\/a",
    r"/d/\ud800",
    r"/d/nul\u0000",
    "",
]
SPACES = ["", " ", "\n", "\t", "\r\n  "]


def number_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(NUMBERS),
        st.integers(-(2**66), 2**66).map(str),
        st.integers(0, 99).map(str),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
    )


def spelled(text: str, escapes: list[bool]) -> str:
    """``text`` as JSON string content, the characters marked spelled ``\\uXXXX`` (``/`` as ``\\/``)."""
    out = []
    for char, escape in zip(text, escapes + [False] * len(text), strict=False):
        if char in '"\\':
            out.append("\\" + char)
        elif escape:
            out.append("\\/" if char == "/" else f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return "".join(out)


@st.composite
def key_text(draw) -> str:
    plain = draw(
        st.one_of(
            st.sampled_from(
                [f"a/{i}" for i in range(12)] + [f"g/b/{i}.{j}" for i in range(4) for j in range(4)]
            ),
            st.sampled_from(["a/x", "a/01", "/a/1", "b/0", "a/.zattrs", "a/0.0", "", "a/ 1", "\x7f"]),
        )
    )
    escapes = draw(st.lists(st.booleans(), max_size=len(plain))) if draw(st.integers(0, 4)) == 0 else []
    return '"' + spelled(plain, escapes) + '"'


@st.composite
def value_text(draw, odd_numbers: bool = True) -> str:
    """A value: mostly ``[url, offset, length]``, whose numbers are anything when ``odd_numbers`` (one
    number the scanner does not take sends the whole manifest the plain way), else in its range."""
    space = draw(st.sampled_from(SPACES))
    url = '"' + draw(st.sampled_from(URLS)) + '"'
    kind = draw(st.integers(0, 9))
    if kind <= 4:
        plain = st.integers(0, 10**18 - 1).map(str)
        numbers = [draw(number_text() if odd_numbers else plain) for _ in range(2)]
        return "[" + space + ("," + space).join([url, *numbers]) + space + "]"
    if kind == 5:
        return f"[{url}]"
    if kind == 6:  # other lengths, nesting
        items = draw(st.lists(st.one_of(st.just(url), number_text()), max_size=4))
        text = "[" + ",".join(items) + "]"
        return f"[{text}]" if draw(st.booleans()) else text
    if kind == 7:
        return draw(
            st.sampled_from(['"base64:AAAA"', '"base64:!!"', '"text"', '"\\ud800"', "{}", '{"x": [1]}'])
        )
    return draw(number_text())


@st.composite
def zarray_value(draw) -> str:
    """The ``.zarray`` of ``a``: mostly its usual one, sometimes with shape or chunks numbers gone wrong."""
    if draw(st.integers(0, 3)):
        return json.dumps(ZARRAY_1D)
    shape = draw(st.sampled_from(["40", "true", "0", str(2**62), str(2**63), "1.5", "null", "[40]", "-4"]))
    chunks = draw(st.sampled_from(["4", "true", "1", "0", "1.5", "null", str(2**70), "[4]", "false"]))
    text = ZARRAY_1D.replace('"shape": [40]', f'"shape": [{shape}]').replace(
        '"chunks": [4]', f'"chunks": [{chunks}]'
    )
    return json.dumps(text)


@st.composite
def manifest_text(draw) -> bytes:
    """A kerchunk JSON manifest written out member by member (duplicate and escaped keys kept)."""
    colon, comma = draw(st.sampled_from([":", ": ", " : ", ":\n"])), draw(st.sampled_from([",", ", ", ",\n"]))
    members = [('".zgroup"', '"{\\"zarr_format\\": 2}"'), ('"a/.zarray"', draw(zarray_value()))]
    members.append(('"g/b/.zarray"', json.dumps(ZARRAY_2D)))
    regular = draw(st.integers(0, 10))  # references as generators write them (the fast path's candidates)
    members += [(f'"a/{i}"', f'["/d/a", {32 * i}, 32]') for i in range(regular)]
    odd_numbers = draw(st.booleans())
    members += draw(st.lists(st.tuples(key_text(), value_text(odd_numbers)), max_size=12))
    members = draw(st.permutations(members))
    refs = "{" + comma.join(key + colon + value for key, value in members) + "}"
    version = draw(st.sampled_from([0, 1, 1, "2"]))
    if version == 0:
        document = refs
    else:
        templates = draw(st.sampled_from(['{"u": "/d/t"}', "{}", '{"u": 5}', '{"u": "/d/\\u00fc"}']))
        head = f'"version"{colon}{version}{comma}"templates"{colon}{templates}'
        document = "{" + head + comma + f'"refs"{colon}{refs}' + "}"
    outer = draw(st.sampled_from(SPACES))
    return (outer + document + outer).encode("utf-8", "surrogatepass")


@st.composite
def manifest_text_at_int64(draw) -> bytes:
    """A manifest whose one odd reference has numbers around 2**63 (the brief's examples, and more)."""
    offset = draw(st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64 + 5, 2**70, -1, -(2**63) - 1]))
    length = draw(st.sampled_from([1, 0, 2**62, 2**63 - 1, 2**63, 2**70, -1]))
    refs = {".zgroup": '{"zarr_format": 2}', "a/.zarray": ZARRAY_1D}
    refs.update({f"a/{i}": ["/d/a", 32 * i, 32] for i in range(10)})
    refs[draw(st.sampled_from(["a/3", "a/9", "b/0"]))] = ["/d/a", offset, length]
    return json.dumps({"version": 1, "refs": refs}).encode()


def assert_same_model(data: bytes, monkeypatch) -> None:
    """The fast path's and the plain parse's manifests of ``data`` are the same, or both refuse it."""
    fast, slow = both(data, monkeypatch)
    assert type(fast) is type(slow), (data, fast, slow)
    if isinstance(slow, FormatError):
        return
    keys = slow.sorted_keys()
    assert fast.sorted_keys() == keys, data
    assert fast.templates == slow.templates
    probes = [*keys, "a/3", "a/9", "a/11", "g/b/2.2"]
    assert reads(fast, probes) == reads(slow, probes), data


def json_example(data: bytes, monkeypatch) -> None:
    with time_limit(EXAMPLE_SECONDS), warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow and conversion warnings are errors too
        assert_same_model(data, monkeypatch)


@FUZZ
@given(data=manifest_text())
@example(data=json.dumps({"version": 1, "refs": {"a/.zarray": ZARRAY_1D, "a/3": ["/d", 2**63, 1]}}).encode())
@example(data=json.dumps({"a/.zarray": ZARRAY_1D, "a/3": ["/d", True, 1], "a/4": ["/d", 1, None]}).encode())
@example(
    data=b'{"a/.zarray": %s, "a/3": ["/d", 0, 1], "a\\/3": ["/d", 5, 1]}' % json.dumps(ZARRAY_1D).encode()
)
def test_generated_json_manifests_read_alike_by_both_paths(data, monkeypatch):
    json_example(data, monkeypatch)


@settings(FUZZ, max_examples=60)
@given(data=manifest_text_at_int64())
def test_references_at_and_past_int64_read_alike_by_both_paths(data, monkeypatch):
    json_example(data, monkeypatch)


def test_the_generated_manifests_take_the_fast_path_often(monkeypatch):
    """The differential is worth something only if the scanner takes part: a third or more of the generated
    manifests are scanned (the others have a member it declines), and some come through it whole."""
    monkeypatch.setattr(kerchunk_scan, "MIN_SIZE", 0)
    scanned = taken = 0
    samples = []

    @settings(FUZZ, max_examples=100)
    @given(data=manifest_text())
    def collect(data):
        samples.append(data)

    collect()
    for data in samples:
        try:
            found = kerchunk_scan.scan(data, json.loads)
        except ValueError:
            continue
        scanned += found is not None
        with contextlib.suppress(FormatError):
            document, found = kerchunk_json._parsed(data, "m.json")
            taken += found is not None and kerchunk_json._from_scan(document, found, "m.json") is not None
    assert scanned >= len(samples) // 3 and taken >= 10, (scanned, taken, len(samples))


# ============================================================================================ end to end
REFERENCE_CASES = {
    "offset 2**63": ["data.bin", 2**63, 16],
    "offset 2**64 + 5": ["data.bin", 2**64 + 5, 16],
    "length 2**70": ["data.bin", 0, 2**70],
    "negative offset": ["data.bin", -1, 16],
    "offset true": ["data.bin", True, 16],
    "length false": ["data.bin", 0, False],
    "float offset": ["data.bin", 1.5, 16],
    "integral float length": ["data.bin", 0, 16.0],
    "null offset": ["data.bin", None, 16],
    "nested offset": ["data.bin", [0], 16],
    "nested reference": [["data.bin", 0, 16]],
    "two numbers": ["data.bin", 0],
}


def scannable(url: str, fast: bool, monkeypatch) -> None:
    """Offer the manifest behind ``url`` (from :func:`manifest`) to the fast path (an array ``w`` of common
    references beside it, the size threshold lifted), or keep it from it. The scanner takes it when the bad
    value is no candidate member (nested, two numbers); a candidate whose numbers are not plain digits (a
    sign, a fraction, ``true``, 19 digits or more) sends the whole manifest the plain way."""
    monkeypatch.setattr(kerchunk_scan, "MIN_SIZE", 0 if fast else 1 << 62)
    path = url.removeprefix("file://").partition("#")[0]
    with open(path) as file:
        document = json.load(file)
    document["refs"]["w/.zarray"] = json.dumps(zarray([16], [1], dtype="|i1"))
    document["refs"].update({f"w/{i}": ["data.bin", i, 1] for i in range(16)})
    with open(path, "w") as file:
        json.dump(document, file)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("case", list(REFERENCE_CASES))
def test_a_bad_reference_is_a_format_error_naming_the_key_and_the_manifest(tmp_path, case, fast, monkeypatch):
    url = manifest(tmp_path, REFERENCE_CASES[case]).replace("mode=zarr", "mode=nczarr")
    scannable(url, fast, monkeypatch)
    culprits = r"refs\.json: manifest key 'v/0': .* is not a kerchunk reference"
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=culprits), nczmap.open_dataset(url) as ds:
            ds.variables["v"][:]
        with nczmap.open_map(url, "r") as zmap, pytest.raises(FormatError, match=culprits):
            zmap.read("/v/0")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    xr = pytest.importorskip("xarray")
    with pytest.raises(FormatError, match=culprits), xr.open_dataset(url, engine="nczmap") as ds:
        ds["v"].load()


ZARRAY_CASES = {
    "chunks [true]": {"chunks": [True]},
    "shape [true]": {"shape": [True]},
    "chunks [false]": {"chunks": [False]},
    "chunks [1.5]": {"chunks": [1.5]},
    "chunks [0]": {"chunks": [0]},
    "chunks [null]": {"chunks": [None]},
    "chunks [[16]]": {"chunks": [[16]]},
    "shape [2**64]": {"shape": [2**64]},
    "shape [-16]": {"shape": [-16]},
    "shape [16.0]": {"shape": [16.0]},
}


@pytest.mark.parametrize("case", list(ZARRAY_CASES))
def test_a_bad_zarray_skips_its_array_naming_it_and_the_manifest(tmp_path, case):
    """As every array that cannot be read: skipped with a warning naming it (its FormatError recorded in
    ``dataset.problems``), the rest of the dataset read."""
    url = manifest(tmp_path, ["data.bin", 0, 16]).replace("mode=zarr", "mode=nczarr")
    document = json.loads((tmp_path / "refs.json").read_text())
    document["refs"]["v/.zarray"] = json.dumps(
        {**json.loads(document["refs"]["v/.zarray"]), **ZARRAY_CASES[case]}
    )
    (tmp_path / "refs.json").write_text(json.dumps(document))
    warning = r"skipping array '/v' of .*refs\.json: array '/v': bad shape"
    with pytest.warns(UserWarning, match=warning), nczmap.open_dataset(url) as ds:
        assert "v" not in ds.variables
    xr = pytest.importorskip("xarray")
    with pytest.warns(UserWarning, match=warning), xr.open_dataset(url, engine="nczmap") as ds:
        assert "v" not in ds.variables


@pytest.mark.parametrize("length", [2**62, 2**63 - 1], ids=["2**62", "2**63-1"])
def test_a_huge_but_representable_length_is_refused_before_it_is_allocated(tmp_path, length):
    url = manifest(tmp_path, ["data.bin", 0, length]).replace("mode=zarr", "mode=nczarr")
    tracemalloc.start()
    try:
        with pytest.raises(nczmap.NCZError, match=r"data\.bin|'/v/0'"), nczmap.open_dataset(url) as ds:
            ds.variables["v"][:]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


# ============================================================================================== Parquet
RECORD_SIZE = 4
CHUNKS = 8  # array t: 8 chunks of 1, in two records
INT_KINDS = {"int64": pa.int64(), "uint64": pa.uint64(), "int32": pa.int32()}
OTHER_KINDS = {"float64": pa.float64(), "string": pa.string(), "null": pa.null()}


@st.composite
def record_rows(draw) -> list[tuple[object, object, object, object]]:
    """RECORD_SIZE rows of (path, offset, size, raw), offsets and sizes anything an Arrow column holds."""
    number = st.one_of(
        st.none(),
        st.integers(0, 99),
        st.sampled_from([0, -1, 2**31 - 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]),
    )
    path = st.one_of(st.none(), st.sampled_from(["/d/a", "/d/b", ""]))
    raw = st.one_of(st.none(), st.sampled_from([b"inline", b"base64:AAAA", b"base64:!!", b""]))
    return draw(st.lists(st.tuples(path, number, number, raw), min_size=RECORD_SIZE, max_size=RECORD_SIZE))


def column(values: list, kind) -> object:
    """An Arrow column of ``kind`` holding ``values``, or None if they do not fit it (no such file)."""
    if pa.types.is_null(kind):
        return pa.nulls(len(values))
    if pa.types.is_string(kind):
        return pa.array([None if v is None else str(v) for v in values], kind)
    if pa.types.is_floating(kind):
        return pa.array([None if v is None else float(v) for v in values], kind)
    try:
        return pa.array(values, kind)
    except (pa.ArrowInvalid, OverflowError):
        return None


def record_file(rows: list, kind) -> bytes | None:
    paths, offsets, sizes, raws = map(list, zip(*rows, strict=True))
    offset, size = column(offsets, kind), column(sizes, kind)
    if offset is None or size is None:
        return None
    table = pa.table(
        {
            "path": pa.array(paths, pa.string()),
            "offset": offset,
            "size": size,
            "raw": pa.array(raws, pa.binary()),
        }
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def plain_record(rows: list, kind) -> list[object] | str:
    """What each row is by the plain reading of kerchunk's Parquet layout (an entry or None), or the
    reason the whole record is refused: offset and size integers (a null column is allowed), a reference
    needs both, each from 0 to 2**63 - 1; ``offset == size == 0`` is the whole object; ``raw`` first."""
    if not (pa.types.is_integer(kind) or pa.types.is_null(kind)):
        return "offset and size are no integers"
    if pa.types.is_null(kind):  # columns of nulls whatever the rows drew
        rows = [(path, None, None, raw) for path, _, _, raw in rows]
    if any(v is not None and v >= 2**63 for row in rows for v in row[1:3]):
        return "beyond int64"
    entries: list[object] = []
    for path, offset, size, raw in rows:
        if raw is not None:
            if raw.startswith(b"base64:"):
                try:
                    raw = base64.b64decode(raw[7:], validate=True)
                except ValueError:
                    return "bad base64"
            entries.append(raw)
        elif path is None:
            entries.append(None)
        elif offset is None or size is None or offset < 0 or size < 0:
            return "no offset or size"
        else:
            entries.append(Reference(path) if offset == size == 0 else Reference(path, offset, size))
    return entries


@settings(FUZZ, max_examples=150)
@given(
    records=st.lists(record_rows(), min_size=2, max_size=2),
    kind=st.sampled_from([*INT_KINDS.values(), *OTHER_KINDS.values()]),
)
def test_parquet_records_read_as_their_rows_say(records, kind):
    """Record files with out-of-range, negative, null or wrongly typed offsets and sizes: a record reads
    as the plain reading of its rows, or is a FormatError naming it; the rest of the manifest unaffected."""
    files = {".zmetadata": json.dumps({"metadata": {"t/.zarray": zarray([CHUNKS], [1])}, "record_size": 4})}
    expected: dict[str, object] = {}
    for number, rows in enumerate(records):
        data = record_file(rows, kind)
        plain = plain_record(rows, kind) if data is not None else [None] * RECORD_SIZE
        if data is not None:
            files[f"t/refs.{number}.parq"] = data
        for row in range(RECORD_SIZE):
            key = f"t/{number * RECORD_SIZE + row}"
            expected[key] = f"refused: {plain}" if isinstance(plain, str) else plain[row]
    with time_limit(EXAMPLE_SECONDS), warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = kerchunk_parquet.load(_reader(files), "mem://refs.parq", _lister(files))
        for key, wanted in expected.items():
            got = outcome(loaded, key)
            if isinstance(wanted, str):
                number = int(key[2:]) // RECORD_SIZE
                assert isinstance(got, str) and f"mem://refs.parq/t/refs.{number}.parq" in got, (key, got)
            else:
                assert got == wanted, (key, wanted, got)
        together = _entries_or_error(lambda: loaded.columns(list(expected)))
        if any(isinstance(wanted, str) for wanted in expected.values()):
            assert isinstance(together, str) and together.startswith("FormatError"), together
        else:
            assert together == list(expected.values())


def _reader(files: dict[str, object]):
    def read(name: str) -> bytes | None:
        data = files.get(name)
        return data.encode() if isinstance(data, str) else data

    return read


def _lister(files: dict[str, object]):
    def listdir(array: str) -> list[str]:
        return [name.rpartition("/")[2] for name in files if name.startswith(array + "/")]

    return listdir
