"""The fast path for large JSON manifests (issue 19 B8): references found in the raw bytes by numpy must give
exactly the manifest the ordinary parse gives, and invalid JSON must still be refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nczmap.errors import FormatError
from nczmap.manifest import kerchunk_json, kerchunk_scan

ZARRAY_1D = json.dumps(
    {
        "zarr_format": 2,
        "shape": [40],
        "chunks": [4],
        "dtype": "<f8",
        "compressor": None,
        "filters": None,
        "fill_value": None,
        "order": "C",
    }
)
ZARRAY_2D = json.dumps(
    {
        "zarr_format": 2,
        "shape": [6, 9],
        "chunks": [2, 3],
        "dtype": "<i4",
        "compressor": None,
        "filters": None,
        "fill_value": 0,
        "order": "C",
    }
)


def refs_1d(url: str = "/data/a.bin", count: int = 10) -> dict:
    refs = {".zgroup": '{"zarr_format": 2}', "a/.zarray": ZARRAY_1D}
    refs.update({f"a/{i}": [url, 32 * i, 32] for i in range(count)})
    return refs


def refs_2d() -> dict:
    refs = {"g/b/.zarray": ZARRAY_2D, "g/.zgroup": '{"zarr_format": 2}'}
    refs.update(
        {f"g/b/{i}.{j}": [f"/data/b{i % 2}.bin", 100 * i + j, 24] for i in range(3) for j in range(3)}
    )
    return refs


def both(data: bytes, monkeypatch) -> tuple[object, object]:
    """(fast path result, ordinary result): a Manifest or the FormatError raised."""
    results = []
    for fast in (True, False):
        with monkeypatch.context() as patch:
            patch.setattr(kerchunk_scan, "MIN_SIZE", 0 if fast else 1 << 62)
            patch.setattr(kerchunk_scan, "BLOCK", 7)  # many blocks even for a few references
            try:
                results.append(kerchunk_json.load(data, "m.json"))
            except FormatError as exc:
                results.append(exc)
    return results[0], results[1]


def assert_same(data: bytes, monkeypatch, scanned: bool | None = None) -> None:
    fast, slow = both(data, monkeypatch)
    assert type(fast) is type(slow), (fast, slow)
    if isinstance(slow, FormatError):
        return
    keys = slow.sorted_keys()
    assert fast.sorted_keys() == keys
    for key in [*keys, "a/39", "a/x", "g/b/2.2"]:
        assert outcome(fast, key) == outcome(slow, key), key
    assert fast.templates == slow.templates and fast.sources == slow.sources
    assert fast.checksums == slow.checksums
    if scanned is not None:
        assert (kerchunk_scan.scan(data, json.loads) is not None) == scanned


def outcome(manifest, key: str) -> object:
    try:
        return manifest.get(key)
    except FormatError as exc:
        return str(exc)


def compact(document: dict) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "document",
    [
        {"version": 1, "refs": refs_1d()},
        {"version": 1, "refs": {**refs_1d(), **refs_2d()}},
        refs_1d(),  # version 0
        {"version": 1, "templates": {"u": "/data/t"}, "refs": refs_1d("{{u}}/a.bin")},
        {
            "version": 1,
            "refs": refs_1d(),
            "nczmap": {"sources": {"/data/a.bin": {"size": 320}}, "crc32c": {"a/0": 5}},
        },
        {"version": 1, "refs": {**refs_1d(), "a/3": "base64:AAAA", "a/4": ["/data/w.bin"]}},
        {"version": 1, "refs": {**refs_1d(), "a/.zattrs": {"x": ["s", 1, 2], "_ARRAY_DIMENSIONS": ["x"]}}},
        {"version": 1, "refs": {**refs_1d(), "a/99": ["/data/a.bin", 0, 1], "a/01": ["/data/a.bin", 0, 1]}},
        {"version": 1, "refs": {**refs_1d(), "other/0": ["/data/a.bin", 0, 1]}},
        {"version": 1, "refs": {**refs_1d(), "/a/5": ["/data/z.bin", 0, 1]}},
        {"version": 1, "refs": refs_1d("/data/ünïcode.bin")},
        {"version": 1, "refs": refs_1d('/data/q"uote.bin')},
        {"version": 1, "refs": refs_1d("/data/bad\x00.bin")},
        {"version": 1, "refs": {**refs_1d(), "a/2": ["/data/a.bin", 1.5, 2]}},
        {"version": 1, "refs": {**refs_1d(), "a/2": ["/data/a.bin", -1, 2]}},
        {"version": 1, "refs": {**refs_1d(), "a/2": ["/data/a.bin", 2**70, 2]}},
        {"version": 1, "refs": {**refs_1d(), "a\\/2": ["/data/a.bin", 0, 2]}},
        {"version": 1, "refs": refs_1d(), "extra": {"k": ["/data/a.bin", 0, 1]}},
        {"version": 1, "refs": {**refs_1d(), "": ["/data/a.bin", 0, 1]}},
        {"version": 2, "refs": refs_1d()},
        {"version": 1, "refs": refs_1d("{{missing}}/a.bin")},
        {"version": 1, "refs": {**refs_1d(), "j": "\\" * 3 + '"' + "\\", 'k"\\': ['\\"u', 0, 1]}},
    ],
)
def test_the_fast_path_gives_what_the_ordinary_parse_gives(document, monkeypatch):
    assert_same(compact(document), monkeypatch)
    assert_same(json.dumps(document).encode(), monkeypatch)  # ", " and ": " separators
    assert_same(json.dumps(document, ensure_ascii=False).encode(), monkeypatch)


def test_common_references_are_scanned_not_parsed(monkeypatch):
    monkeypatch.setattr(kerchunk_scan, "MIN_SIZE", 0)
    data = compact({"version": 1, "refs": {**refs_1d(), **refs_2d()}})
    scanned = kerchunk_scan.scan(data, json.loads)
    assert scanned is not None and len(scanned.candidates) == 10 + 9
    assert scanned.document["refs"] == {
        "": [],
        ".zgroup": '{"zarr_format": 2}',
        "a/.zarray": ZARRAY_1D,
        "g/b/.zarray": ZARRAY_2D,
        "g/.zgroup": '{"zarr_format": 2}',
    }
    manifest = kerchunk_json.load(data, "m.json")
    assert set(manifest.arrays) == {"a", "g/b"} and "a/3" not in manifest.entries


def test_a_key_given_twice_keeps_the_last_as_json_does(monkeypatch):
    text = compact({"version": 1, "refs": refs_1d()}).decode()
    text = text.replace('"a/0":["/data/a.bin",0,32]', '"a/0":["/data/a.bin",0,32],"a/0":["/data/b.bin",7,8]')
    fast, slow = both(text.encode(), monkeypatch)
    assert fast.get("a/0") == slow.get("a/0") == ("/data/b.bin", 7, 8)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace(",32]", ",32],", 1),  # a trailing comma
        lambda t: t.replace(",32,32]", ",032,32]", 1),  # a leading zero (ujson lets it pass)
        lambda t: t.replace(",32,32]", ",32,+32]", 1),
        lambda t: t[:-1],  # cut short
        lambda t: t + "x",
        lambda t: t.replace('"a/1"', '"a/1', 1),  # an unpaired quote
        lambda t: t.replace('"a/1":', '"a/1"', 1),  # no colon
        lambda t: t.replace("/data/a.bin", "/data/\ta.bin", 1),  # a raw control character (ujson: passes)
        lambda t: t.replace('"a/2"', '"a/\\x"', 1),  # a bad escape
        lambda t: t.replace('"a/2":[', '"a/2":[[', 1),
        lambda t: t.replace('"refs":{', '"refs":{{', 1),
        lambda t: t.replace(',"a/3"', ' "a/3"', 1),  # no comma between members
    ],
)
def test_invalid_json_is_still_refused(change, monkeypatch):
    text = change(compact({"version": 1, "refs": refs_1d()}).decode())
    with pytest.raises(ValueError):
        json.loads(text)
    assert_same(text.encode(), monkeypatch)  # refused, or let pass by ujson both ways (a leading zero...)


def test_invalid_utf8_in_a_url_is_refused(monkeypatch):
    data = compact({"version": 1, "refs": refs_1d()}).replace(b"/data/a.bin", b"/data/\xff.bin", 1)
    fast, slow = both(data, monkeypatch)
    assert isinstance(slow, FormatError) and isinstance(fast, FormatError)


def test_long_members_are_no_candidates(monkeypatch):
    """A window is as wide as the longest span gathered: a single long key, URL or ``,offset,length`` tail
    (a list of a million numbers, say) would make every candidate's window that wide. They are left to the
    ordinary parse instead."""
    monkeypatch.setattr(kerchunk_scan, "MIN_SIZE", 0)
    refs = {
        **refs_1d(),
        "a/5": ["/data/" + "l" * kerchunk_scan.MAX_TEXT + ".bin", 0, 1],
        "z" * (kerchunk_scan.MAX_TEXT + 1): ["/data/a.bin", 0, 1],
        "long": ["/data/a.bin", *range(1000)],
    }
    data = compact({"version": 1, "refs": refs})
    scanned = kerchunk_scan.scan(data, json.loads)
    assert scanned is not None and len(scanned.candidates) == 9  # a/0..a/9 but a/5
    assert_same(data, monkeypatch)


_ALPHABET = '"\\:,[]{} 0123456789a/.-+eu\t\n\x00\xff'


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    refs=st.dictionaries(
        st.sampled_from([f"a/{i}" for i in range(12)] + ["a/x", "/a/1", "b/0", "a\\/1", ""]),
        st.one_of(
            st.tuples(st.sampled_from(["/d/a", "/d/b", "{{u}}", 'q"'])).map(list),
            st.tuples(
                st.sampled_from(["/d/a", "/d/b", "{{u}}", "ü"]),
                st.integers(-1, 2**64),
                st.integers(0, 99),
            ).map(list),
            st.text(max_size=5),
        ),
        max_size=12,
    ),
    separators=st.sampled_from([(",", ":"), (", ", ": "), (",", ": "), (", ", ":")]),
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 3), st.sampled_from(_ALPHABET)), max_size=3
    ),
)
def test_the_fast_path_agrees_with_the_ordinary_parse_on_generated_manifests(
    refs, separators, edits, monkeypatch
):
    """Generated manifests, some of them then corrupted at a few places (a character inserted, replaced or
    removed): the fast path gives what the ordinary parse gives, errors included. Independent of how
    either path works: the oracle is the ordinary path (itself checked against json.loads below)."""
    document = {"version": 1, "templates": {"u": "/d/t"}, "refs": {**refs_1d(), **refs}}
    text = json.dumps(document, separators=separators, ensure_ascii=False)
    for at, how, char in edits:
        at %= len(text) + 1
        if how == 0:
            text = text[:at] + char + text[at:]
        elif how == 1:
            text = text[:at] + char + text[at + 1 :]
        elif how == 2:
            text = text[:at] + text[at + 1 :]
    data = text.encode("utf-8", "surrogatepass")
    fast, slow = both(data, monkeypatch)
    try:
        json.loads(data)
    except ValueError:
        valid = False
    else:
        valid = True
    if valid:
        assert not isinstance(fast, FormatError) or isinstance(slow, FormatError)
    assert type(fast) is type(slow), (data, fast, slow)
    if not isinstance(slow, FormatError):
        assert fast.sorted_keys() == slow.sorted_keys()
        for key in [*slow.sorted_keys(), "a/11", "a/x"]:
            assert outcome(fast, key) == outcome(slow, key), (data, key)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='\\"a', min_size=1, max_size=40))
def test_quotes_escaped_by_odd_runs_of_backslashes_are_not_delimiters(text):
    """The string delimiters are the quotes after an even run of backslashes (none included), as a JSON
    scanner reading left to right finds them."""
    data = ("{" + text).encode()
    delimiters, escaped = [], False
    for at, char in enumerate(data.decode()):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            delimiters.append(at)
    found = kerchunk_scan._strings(np.frombuffer(data, dtype=np.uint8))
    if len(delimiters) % 2:
        assert found is None
    else:
        assert found is not None
        assert sorted([*found[0].tolist(), *found[1].tolist()]) == delimiters
