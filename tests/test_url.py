"""Tests for nczmap.url: dataset URL parsing, mode inference, S3 forms and canonical URLs."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nczmap.errors import ModeError, URLError
from nczmap.url import Fragment, ParsedURL, known_mode_words, parse_url


def _same_dataset(p: ParsedURL, q: ParsedURL) -> None:
    fields = ("driver", "path", "bucket", "modes", "endpoint", "region")
    assert {f: getattr(q, f) for f in fields} == {f: getattr(p, f) for f in fields}
    assert q.fragment == p.fragment


def _assert_round_trip(p: ParsedURL) -> None:
    q = parse_url(p.geturl())
    _same_dataset(p, q)
    assert q.geturl() == p.geturl()


# ---------------------------------------------------------------- local paths and file URLs


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("file:///data/x/ds.file", "/data/x/ds.file"),
        ("file:/data/x", "/data/x"),
        ("file://localhost/data/x", "/data/x"),
        ("file://LOCALHOST/data/x", "/data/x"),
        ("FILE:///data/x", "/data/x"),
        ("File:/data/x", "/data/x"),
        ("file:///data/x/", "/data/x"),
        ("file:///data//x/./y/../z", "/data/x/z"),
        ("file:////data/x", "/data/x"),
        ("file:///data/a%20b/c%23d", "/data/a b/c#d"),
        ("file:///data/caf%C3%A9", "/data/café"),
        ("file:///data/x?query=1", "/data/x"),
        ("file:///data/x?q#mode=zarr", "/data/x"),
        ("  file:///data/x \t\n", "/data/x"),
        ("file:///", "/"),
        ("/abs/path", "/abs/path"),
        ("//abs/path/", "/abs/path"),
        ("/data/x:y", "/data/x:y"),
    ],
)
def test_file_url_forms(text: str, path: str) -> None:
    p = parse_url(text)
    assert (p.scheme, p.driver, p.path) == ("file", "file", path)
    assert (p.host, p.port, p.bucket, p.region, p.endpoint) == (None, None, None, None, None)


def test_file_url_undecodable_byte_is_kept_as_surrogate_escape() -> None:
    p = parse_url("file:///data/%FF")
    assert p.path == "/data/\udcff"
    assert os.fsencode(p.path) == b"/data/\xff"
    _assert_round_trip(p)


@pytest.mark.parametrize(
    ("text", "relative"),
    [
        ("data/x", "data/x"),
        ("./data/../x.file", "x.file"),
        ("x", "x"),
        ("C:/x", "C:/x"),
        ("a?b", "a?b"),
    ],
)
def test_bare_relative_path_is_made_absolute(
    text: str, relative: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    p = parse_url(text)
    assert p.scheme == "file"
    assert p.path == os.path.normpath(os.path.join(str(tmp_path), relative))


def test_bare_path_fragment_is_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    p = parse_url("data/x.zip#mode=zarr")
    assert p.path == str(tmp_path / "data" / "x.zip")
    assert p.driver == "zip"
    assert p.modes == ("zarr", "nczarr", "zip")


def test_pathlike_is_a_literal_path(tmp_path: Path) -> None:
    p = parse_url(tmp_path / "odd#name.zip")
    assert p.path == str(tmp_path / "odd#name.zip")
    assert (p.driver, p.modes) == ("zip", ("nczarr", "zip"))
    assert p.original == str(tmp_path / "odd#name.zip")
    _assert_round_trip(p)


def test_bytes_pathlike_is_decoded(tmp_path: Path) -> None:
    class BytesPath:
        def __fspath__(self) -> bytes:
            return os.fsencode(tmp_path / "x")

    assert parse_url(BytesPath()).path == str(tmp_path / "x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("file://relative/x", "must be absolute"),
        ("file://host/data/x", "must be absolute"),
        ("file://x", "must be absolute"),
        ("file:relative/x", "must be absolute"),
        ("file:D:/x", "must be absolute"),
        ("file:%2Ftmp", "must be absolute"),
        ("file://", "missing path"),
        ("file:", "missing path"),
        ("file://localhost", "missing path"),
        ("file:?x", "missing path"),
        ("file:///data/a%00b", "control character"),
        ("#mode=zarr", "missing path"),
        ("[mode=zarr]", "missing path"),
    ],
)
def test_bad_file_urls(text: str, message: str) -> None:
    with pytest.raises(URLError, match=message) as info:
        parse_url(text)
    assert repr(text.strip()) in str(info.value)


# ---------------------------------------------------------------- input validation


@pytest.mark.parametrize("value", [None, 42, 3.5, b"/data/x", bytearray(b"x"), ["/data/x"], object()])
def test_non_string_input_is_url_error(value: object) -> None:
    with pytest.raises(URLError, match=r"string or os\.PathLike"):
        parse_url(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "   ", "\t\n"])
def test_empty_input(text: str) -> None:
    with pytest.raises(URLError, match="empty"):
        parse_url(text)


@pytest.mark.parametrize(
    "text",
    ["/data/a\x00b", "file:///data/\x01", "s3://bucket/a\x7fb", "/data/x#mode=zarr\x1b", "/data/a\nb"],
)
def test_control_characters_rejected(text: str) -> None:
    with pytest.raises(URLError, match="control character"):
        parse_url(text)


def test_lone_surrogate_rejected() -> None:
    with pytest.raises(URLError, match="cannot name anything"):
        parse_url("/data/\ud800")


def test_broken_pathlike_is_url_error() -> None:
    class Broken:
        def __fspath__(self) -> int:
            return 3

    with pytest.raises(URLError):
        parse_url(Broken())  # type: ignore[arg-type]


@pytest.mark.parametrize("scheme", ["ftp", "dap4", "dods", "HTTPX", "zip", "ab", "my.file", "c+d"])
def test_unsupported_scheme(scheme: str) -> None:
    with pytest.raises(URLError, match=re.escape(f"unsupported URL scheme '{scheme.lower()}'")):
        parse_url(f"{scheme}://host/x")


# ---------------------------------------------------------------- fragment grammar


def test_fragment_keys_lower_cased_first_wins_no_decoding() -> None:
    p = parse_url("/data/x#LOG&Show=fetch&show=other&&AWS.Profile=Me&k=a%20b&x=1=2")
    assert dict(p.fragment) == {
        "mode": "nczarr,file",
        "log": "",
        "show": "fetch",
        "aws.profile": "Me",
        "k": "a%20b",
        "x": "1=2",
    }
    assert p.profile == "Me"
    assert p.fragment["AWS.PROFILE"] == "Me"
    assert "SHOW" in p.fragment


def test_fragment_is_read_only_and_hashable() -> None:
    p = parse_url("/data/x#log")
    assert isinstance(p.fragment, Fragment)
    with pytest.raises(TypeError):
        p.fragment["log"] = "x"  # type: ignore[index]
    assert hash(p) == hash(parse_url("/data/x#log"))
    assert p == parse_url("/data/x#log")
    assert Fragment([("a", "1"), ("b", "2")]) == Fragment([("b", "2"), ("a", "1")])
    assert hash(Fragment([("a", "1"), ("b", "2")])) == hash(Fragment([("b", "2"), ("a", "1")]))


def test_fragment_pair_without_key() -> None:
    with pytest.raises(URLError, match="no key"):
        parse_url("/data/x#=value")


def test_mode_values_merge() -> None:
    assert parse_url("/data/x#mode=nczarr&mode=file").modes == parse_url("/data/x#mode=nczarr,file").modes
    assert parse_url("/data/x#mode=zarr,,ZARR, consolidated &mode=").modes == (
        "zarr",
        "consolidated",
        "nczarr",
        "file",
    )


# ---------------------------------------------------------------- modes and inference


# Observed-rewrite table of spec §2.5, with the documented meaning rather than netcdf-c's bugs.
@pytest.mark.parametrize(
    ("fragment", "modes", "zarr", "xarray", "consolidated"),
    [
        ("mode=nczarr,file", ("nczarr", "file"), False, True, False),
        ("zarr", ("zarr", "nczarr", "file"), True, True, False),
        ("xarray", ("xarray", "zarr", "nczarr", "file"), True, True, False),
        ("noxarray", ("noxarray", "nczarr", "file"), False, False, False),
        ("mode=zarr", ("zarr", "nczarr", "file"), True, True, False),
        ("mode=xarray", ("xarray", "zarr", "nczarr", "file"), True, True, False),
        ("mode=noxarray", ("noxarray", "nczarr", "file"), False, False, False),
        ("mode=nczarr&mode=file", ("nczarr", "file"), False, True, False),
        ("mode=consolidated,nczarr,file", ("consolidated", "nczarr", "file"), False, True, True),
        ("mode=nczarr,file&log&show=fetch", ("nczarr", "file"), False, True, False),
        ("zarr&mode=file", ("zarr", "file", "nczarr"), True, True, False),
        ("mode=nczarr,zarr", ("nczarr", "zarr", "file"), True, True, False),
        ("mode=zarr,noxarray", ("zarr", "noxarray", "nczarr", "file"), True, False, False),
        ("nczarr", ("nczarr", "file"), False, True, False),
        ("zarr=", ("zarr", "nczarr", "file"), True, True, False),
        ("consolidated", ("consolidated", "nczarr", "file"), False, True, True),
        ("mode=v2", ("v2", "nczarr", "file"), False, True, False),
        ("", ("nczarr", "file"), False, True, False),
        ("mode=file", ("file", "nczarr"), False, True, False),
        ("mode=NCZarr,FILE", ("nczarr", "file"), False, True, False),
        ("MODE=XArray", ("xarray", "zarr", "nczarr", "file"), True, True, False),
        ("ZARR", ("zarr", "nczarr", "file"), True, True, False),
    ],
)
def test_mode_inference(
    fragment: str, modes: tuple[str, ...], zarr: bool, xarray: bool, consolidated: bool
) -> None:
    p = parse_url(f"file:///data/ds.file#{fragment}")
    assert p.modes == modes
    assert (p.zarr, p.nczarr, p.xarray, p.consolidated) == (zarr, not zarr, xarray, consolidated)
    assert p.fragment["mode"] == ",".join(modes)


def test_bare_mode_words_leave_the_fragment() -> None:
    p = parse_url("/data/x#zarr&log&consolidated&zarr=yes")
    assert p.modes == ("zarr", "consolidated", "nczarr", "file")
    assert dict(p.fragment) == {"mode": "zarr,consolidated,nczarr,file", "log": "", "zarr": "yes"}


def test_xarray_noxarray_contradiction() -> None:
    with pytest.raises(ModeError, match="'xarray' and 'noxarray'"):
        parse_url("/data/x#mode=xarray&noxarray")


@pytest.mark.parametrize("word", ["v3", "bytes", "dap2", "dap4", "zoh", "V3", "DAP4"])
@pytest.mark.parametrize("form", ["mode={}", "{}", "mode=nczarr,{}"])
def test_unsupported_mode_words(word: str, form: str) -> None:
    with pytest.raises(ModeError, match=f"mode '{word.lower()}' is not supported"):
        parse_url("/data/x#" + form.format(word))


@pytest.mark.parametrize("word", ["bogus", "nczar", "s4", "zarr3", "xarray!"])
def test_unknown_mode_word(word: str) -> None:
    with pytest.raises(ModeError, match=f"unknown mode '{word}'.*known modes: nczarr, zarr") as info:
        parse_url(f"/data/x#mode=nczarr,{word}")
    assert all(known in str(info.value) for known in known_mode_words())


def test_unknown_bare_key_is_only_a_fragment_key() -> None:
    assert dict(parse_url("/data/x#bogus").fragment) == {"mode": "nczarr,file", "bogus": ""}


# ---------------------------------------------------------------- drivers


@pytest.mark.parametrize(
    ("text", "driver", "modes"),
    [
        ("/data/x", "file", ("nczarr", "file")),
        ("/data/x.zip", "zip", ("nczarr", "zip")),
        ("/data/X.ZIP", "zip", ("nczarr", "zip")),
        ("/data/x.zip/", "zip", ("nczarr", "zip")),
        ("/data/x.zipper", "file", ("nczarr", "file")),
        ("file:///data/x.zip", "zip", ("nczarr", "zip")),
        ("file:///data/x.zip#mode=file", "file", ("file", "nczarr")),
        ("file:///data/x.file#mode=zip", "zip", ("zip", "nczarr")),
        ("file:///data/x#zip", "zip", ("zip", "nczarr")),
        ("file:///data/x#file&file", "file", ("file", "nczarr")),
        ("s3://bucket/x", "s3", ("nczarr", "s3")),
        ("s3://bucket/x#s3", "s3", ("s3", "nczarr")),
        ("s3://bucket/x#mode=gs3", "s3", ("s3", "nczarr")),
        ("s3://bucket/x#mode=s3,gs3", "s3", ("s3", "nczarr")),
        ("gs3://bucket/x", "s3", ("nczarr", "s3")),
        ("https://minio:9000/bucket/x", "s3", ("nczarr", "s3")),
        ("http://example.org/bucket/x.zip", "s3", ("nczarr", "s3")),
    ],
)
def test_driver_inference(text: str, driver: str, modes: tuple[str, ...]) -> None:
    p = parse_url(text)
    assert (p.driver, p.modes) == (driver, modes)


@pytest.mark.parametrize(
    ("text", "first", "second"),
    [
        ("file:///x#mode=file,zip", "file", "zip"),
        ("file:///x#mode=nczarr,zip&mode=file", "zip", "file"),
        ("/data/x#zip&s3", "zip", "s3"),
        ("s3://bucket/x#mode=s3,file", "s3", "file"),
    ],
)
def test_conflicting_drivers(text: str, first: str, second: str) -> None:
    expected = f"conflicting storage drivers {first!r} and {second!r} in mode of {text!r}"
    with pytest.raises(ModeError, match=re.escape(expected)):
        parse_url(text)


def test_conflicting_driver_message_exact() -> None:
    with pytest.raises(ModeError) as info:
        parse_url("file:///x#mode=file,zip")
    assert (
        str(info.value) == "conflicting storage drivers 'file' and 'zip' in mode of 'file:///x#mode=file,zip'"
    )


@pytest.mark.parametrize(
    ("text", "word", "scheme"),
    [
        ("s3://bucket/x#mode=file", "file", "s3:"),
        ("s3://bucket/x#zip", "zip", "s3:"),
        ("https://minio:9000/bucket/x#mode=zip", "zip", "https:"),
        ("gs3://bucket/x#file", "file", "gs3:"),
        ("file:///data/x#mode=s3", "s3", "file:"),
        ("/data/x#gs3", "s3", "file:"),
    ],
)
def test_driver_contradicts_scheme(text: str, word: str, scheme: str) -> None:
    with pytest.raises(ModeError, match=f"mode '{word}' cannot be used with a .*{scheme}") as info:
        parse_url(text)
    assert repr(text) in str(info.value)


# ---------------------------------------------------------------- prefix parameters


def test_prefix_parameters_come_before_the_fragment() -> None:
    p = parse_url("[mode=zarr][LOG][show=fetch]file:///data/x#mode=consolidated&show=other")
    assert p.modes == ("zarr", "consolidated", "nczarr", "file")
    assert list(p.fragment.items()) == [
        ("mode", "zarr,consolidated,nczarr,file"),
        ("log", ""),
        ("show", "fetch"),
    ]
    assert p.original == "[mode=zarr][LOG][show=fetch]file:///data/x#mode=consolidated&show=other"


def test_prefix_parameters_on_s3_and_bare_paths() -> None:
    assert parse_url("[xarray]s3://bucket/k").modes == ("xarray", "zarr", "nczarr", "s3")
    p = parse_url("[mode=zip] /data/x")
    assert (p.path, p.driver) == ("/data/x", "zip")
    assert parse_url("[]/data/x").modes == ("nczarr", "file")


def test_unterminated_prefix() -> None:
    with pytest.raises(URLError, match=r"unterminated '\['"):
        parse_url("[mode=zarr file:///data/x")


def test_prefix_mode_errors_still_raise() -> None:
    with pytest.raises(ModeError, match="'file' and 'zip'"):
        parse_url("[mode=file]file:///data/x#zip")


# ---------------------------------------------------------------- S3 forms


S3_CASES = [
    # text, bucket, path, region, endpoint, host, port
    ("s3://bucket/key/a", "bucket", "key/a", None, None, None, None),
    ("S3://bucket//a//b/", "bucket", "a/b", None, None, None, None),
    ("s3://bucket", "bucket", "", None, None, None, None),
    ("s3://bucket/", "bucket", "", None, None, None, None),
    ("s3://bucket/a%20b/c%2Fd", "bucket", "a b/c/d", None, None, None, None),
    ("s3://bucket/k?versionId=3", "bucket", "k", None, None, None, None),
    ("s3://my.bucket-01/k", "my.bucket-01", "k", None, None, None, None),
    ("s3://bucket/k#aws.region=eu-west-1", "bucket", "k", "eu-west-1", None, None, None),
    ("s3://bucket/k#AWS.REGION=eu-west-1", "bucket", "k", "eu-west-1", None, None, None),
    ("s3://bucket/k#aws.region=", "bucket", "k", None, None, None, None),
    # virtual host, with and without region
    (
        "https://bucket.s3.us-west-2.amazonaws.com/a/b",
        "bucket",
        "a/b",
        "us-west-2",
        None,
        "bucket.s3.us-west-2.amazonaws.com",
        None,
    ),
    ("https://bucket.s3.amazonaws.com/a", "bucket", "a", None, None, "bucket.s3.amazonaws.com", None),
    ("https://bucket.s3.amazonaws.com", "bucket", "", None, None, "bucket.s3.amazonaws.com", None),
    (
        "https://bucket.s3.amazonaws.com/a#aws.region=ap-south-1",
        "bucket",
        "a",
        "ap-south-1",
        None,
        "bucket.s3.amazonaws.com",
        None,
    ),
    # the host region wins over aws.region
    (
        "https://bucket.s3.us-west-2.amazonaws.com/a#aws.region=eu-west-1",
        "bucket",
        "a",
        "us-west-2",
        None,
        "bucket.s3.us-west-2.amazonaws.com",
        None,
    ),
    # path style
    (
        "https://s3.us-west-2.amazonaws.com/bucket/a/b",
        "bucket",
        "a/b",
        "us-west-2",
        None,
        "s3.us-west-2.amazonaws.com",
        None,
    ),
    ("https://s3.amazonaws.com/bucket/a", "bucket", "a", None, None, "s3.amazonaws.com", None),
    ("http://s3.amazonaws.com/bucket", "bucket", "", None, None, "s3.amazonaws.com", None),
    ("HTTPS://Bucket.S3.US-WEST-2.AMAZONAWS.COM/Key", "bucket", "Key", "us-west-2", None, None, None),
    # legacy and dual-stack
    ("https://s3-us-west-2.amazonaws.com/bucket/a", "bucket", "a", "us-west-2", None, None, None),
    ("https://s3-external-1.amazonaws.com/bucket/a", "bucket", "a", "us-east-1", None, None, None),
    ("https://bucket.s3-eu-west-1.amazonaws.com/a", "bucket", "a", "eu-west-1", None, None, None),
    ("https://s3.dualstack.us-east-2.amazonaws.com/bucket/a", "bucket", "a", "us-east-2", None, None, None),
    ("https://bucket.s3.dualstack.us-east-2.amazonaws.com/a", "bucket", "a", "us-east-2", None, None, None),
    # non-AWS virtual host: exactly the bucket label is removed (netcdf-c bug 7 skipped 9 chars)
    (
        "https://data.s3.us-east-005.backblazeb2.com/a/b",
        "data",
        "a/b",
        "us-east-005",
        "https://s3.us-east-005.backblazeb2.com",
        "data.s3.us-east-005.backblazeb2.com",
        None,
    ),
    (
        "https://a-much-longer-bucket.s3.eu-1.example.org:8443/k",
        "a-much-longer-bucket",
        "k",
        "eu-1",
        "https://s3.eu-1.example.org:8443",
        "a-much-longer-bucket.s3.eu-1.example.org",
        8443,
    ),
    ("https://bk.s3.example.com/k", "bk", "k", None, "https://s3.example.com", "bk.s3.example.com", None),
    # non-AWS path style, custom endpoints
    (
        "https://s3.us-east-005.backblazeb2.com/bucket/x",
        "bucket",
        "x",
        "us-east-005",
        "https://s3.us-east-005.backblazeb2.com",
        None,
        None,
    ),
    (
        "http://127.0.0.1:9000/bucket/a/b",
        "bucket",
        "a/b",
        None,
        "http://127.0.0.1:9000",
        "127.0.0.1",
        9000,
    ),
    ("http://localhost:9000/bucket", "bucket", "", None, "http://localhost:9000", "localhost", 9000),
    ("http://LocalHost:9000/bucket/", "bucket", "", None, "http://localhost:9000", "localhost", 9000),
    ("http://[::1]:9000/bucket/k", "bucket", "k", None, "http://[::1]:9000", "[::1]", 9000),
    ("https://[2001:DB8::1]/bucket/k", "bucket", "k", None, "https://[2001:db8::1]", "[2001:db8::1]", None),
    ("https://minio.example.org/Bucket_1/x", "Bucket_1", "x", None, "https://minio.example.org", None, None),
    ("https://ceph.lan/bk/x#aws.region=default", "bk", "x", "default", "https://ceph.lan", "ceph.lan", None),
    ("https://minio.lan/b_k/x%20y", "b_k", "x y", None, "https://minio.lan", None, None),
    # Google
    (
        "https://storage.googleapis.com/bucket/a",
        "bucket",
        "a",
        None,
        "https://storage.googleapis.com",
        "storage.googleapis.com",
        None,
    ),
    ("gs3://bucket/a/b", "bucket", "a/b", None, "https://storage.googleapis.com", None, None),
    ("GS3://my_bucket", "my_bucket", "", None, "https://storage.googleapis.com", None, None),
]


@pytest.mark.parametrize("case", S3_CASES, ids=[case[0] for case in S3_CASES])
def test_s3_forms(case: tuple[str, str, str, str | None, str | None, str | None, int | None]) -> None:
    text, bucket, path, region, endpoint, host, port = case
    p = parse_url(text)
    assert p.driver == "s3"
    assert (p.bucket, p.path, p.region, p.endpoint) == (bucket, path, region, endpoint)
    if host is not None:
        assert p.host == host
    assert p.port == port
    assert p.location == (f"s3://{bucket}/{path}" if path else f"s3://{bucket}")
    _assert_round_trip(p)


def test_s3_scheme_fields() -> None:
    p = parse_url("s3://bucket/k")
    assert (p.scheme, p.host) == ("s3", None)
    g = parse_url("gs3://bucket/k")
    assert (g.scheme, g.host) == ("gs3", None)
    h = parse_url("HTTPS://Minio:9000/b/k")
    assert (h.scheme, h.host, h.port) == ("https", "minio", 9000)


def test_credentials_are_dropped_and_redacted() -> None:
    p = parse_url("http://user:s3cr3t@minio:9000/bucket/k")
    assert (p.host, p.port, p.endpoint, p.bucket) == ("minio", 9000, "http://minio:9000", "bucket")
    assert "s3cr3t" not in repr(p)
    assert "s3cr3t" not in p.geturl()
    assert p.original == "http://user:***@minio:9000/bucket/k"


def test_password_redacted_in_errors() -> None:
    with pytest.raises(URLError) as info:
        parse_url("http://user:s3cr3t@minio:9000/bucket/k#mode=file")
    assert "s3cr3t" not in str(info.value)
    assert "user:***@minio" in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s3://", "missing bucket"),
        ("s3:///key", "missing bucket"),
        ("gs3://", "missing bucket"),
        ("https://s3.us-east-1.amazonaws.com/", "missing bucket"),
        ("https://s3.amazonaws.com", "missing bucket"),
        ("https://minio:9000/", "missing bucket"),
        ("http://localhost//", "missing bucket"),
        ("https://a.b.c.d.e.f.amazonaws.com/x", "unrecognised Amazon S3 host .*accepted forms"),
        ("https://amazonaws.com/bucket/x", "unrecognised Amazon S3 host"),
        ("https://www.amazonaws.com/bucket/x", "unrecognised Amazon S3 host"),
        ("https://my.bucket.s3.amazonaws.com/x", "unrecognised Amazon S3 host"),
        ("https://s3.dualstack.amazonaws.com/bucket/x", "unrecognised Amazon S3 host"),
        ("s3://ab/x", "invalid bucket name 'ab'"),
        ("s3://Bucket/x", "invalid bucket name 'Bucket'"),
        ("s3://bucket_x/x", "invalid bucket name 'bucket_x'"),
        ("s3://bucket:9000/x", "invalid bucket name 'bucket:9000'"),
        ("s3://" + "b" * 64, "invalid bucket name"),
        ("https://s3.amazonaws.com/Bucket/x", "invalid bucket name 'Bucket'"),
        ("https://ab.s3.amazonaws.com/x", "invalid bucket name 'ab'"),
        ("https://storage.googleapis.com/Bad/x", "invalid bucket name 'Bad'"),
        ("https://minio/../x", "invalid bucket name '..'"),
        ("https://minio/b/../x", "'..' segment"),
        ("s3://bucket/./x", "'.' segment"),
        ("s3://bucket/a%2F..%2Fb", "'..' segment"),
        ("s3://bucket/%FF", "not valid UTF-8"),
        ("s3://bucket/a%00", "control character"),
        ("https://minio%2Fx/b", "invalid host"),
        ("https://host:abc/b", "bad port 'abc'"),
        ("https://host:/b", "bad port ''"),
        ("https://host:99999/b", "bad port '99999'"),
        ("https://host:0/b", "bad port '0'"),
        ("https://host:9000:1/b", "bad port '9000:1'"),
        ("https://host:\u0661\u0662/b", "bad port"),
        ("https://host:" + "9" * 5000 + "/b", "bad port"),
        ("https://[::1/b", "malformed IPv6"),
        ("https://[::1]x/b", "malformed IPv6"),
        ("https://[zz::1]/b", "invalid IPv6 address"),
        ("https://[]/b", "invalid IPv6 address"),
        ("https:///bucket/x", "missing host"),
        ("https://user@host/b", "user:password"),
        ("https://:pw@host/b", "user:password"),
        ("https://user:@host/b", "user:password"),
        ("https://h\u00f6st/b", "invalid host"),
        ("https://a..b/b", "invalid host"),
        ("s3:bucket/key", "expected s3://"),
        ("gs3:/bucket", "expected gs3://"),
        ("https:host/b", "expected https://"),
    ],
)
def test_bad_s3_urls(text: str, message: str) -> None:
    with pytest.raises(URLError, match=message):
        parse_url(text)


# ---------------------------------------------------------------- geturl


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("/data/x", "file:///data/x#mode=nczarr,file"),
        ("file://localhost/data/x.zip?q#zarr", "file:///data/x.zip#mode=zarr,nczarr,zip"),
        ("/data/a b#c/d%e?f", "file:///data/a%20b#c/d%e?f"),
        ("file:///data/a%20b%23c%3Fd%25e", "file:///data/a%20b%23c%3Fd%25e#mode=nczarr,file"),
        (
            "file:///data/x#mode=nczarr,file&log&show=fetch&show=x&k=",
            "file:///data/x#mode=nczarr,file&log&show=fetch&k",
        ),
        ("s3://bucket/a/b#noxarray", "s3://bucket/a/b#mode=noxarray,nczarr,s3"),
        ("s3://bucket", "s3://bucket#mode=nczarr,s3"),
        (
            "s3://bucket/k#aws.region=eu-west-1&aws.profile=no",
            "https://s3.eu-west-1.amazonaws.com/bucket/k#mode=nczarr,s3&aws.region=eu-west-1&aws.profile=no",
        ),
        ("s3://bucket/k#aws.region=Not A/Region", "s3://bucket/k#mode=nczarr,s3&aws.region=Not A/Region"),
        ("https://bucket.s3.amazonaws.com/k", "s3://bucket/k#mode=nczarr,s3"),
        (
            "https://bucket.s3.us-west-2.amazonaws.com/k",
            "https://s3.us-west-2.amazonaws.com/bucket/k#mode=nczarr,s3",
        ),
        ("https://data.s3.r1.example.org/k", "https://s3.r1.example.org/data/k#mode=nczarr,s3"),
        ("http://127.0.0.1:9000/bucket/k?x=1#zarr", "http://127.0.0.1:9000/bucket/k#mode=zarr,nczarr,s3"),
        ("gs3://bucket/k", "https://storage.googleapis.com/bucket/k#mode=nczarr,s3"),
        ("http://minio/b_k/a%23b%20c", "http://minio/b_k/a%23b%20c#mode=nczarr,s3"),
    ],
)
def test_geturl(text: str, url: str) -> None:
    p = parse_url(text)
    if "/data/a b#" in text:  # a bare path: everything after '#' is fragment
        assert p.path == "/data/a b"
        assert p.geturl() == "file:///data/a%20b#mode=nczarr,file&c/d%e?f"
    else:
        assert p.geturl() == url
    _assert_round_trip(p)


@pytest.mark.parametrize(
    "text",
    [case[0] for case in S3_CASES]
    + [
        "/data/x",
        "/data/x.zip#mode=xarray,consolidated&log",
        "file:///data/x#mode=noxarray,v2&aws.profile=no",
        "[mode=zarr][log]file:///data/x#show=fetch",
        "file:///data/%E2%82%AC/x%3Ay",
        "file:///data/x#k=v#w&a#b=c",
    ],
)
def test_geturl_round_trip(text: str) -> None:
    _assert_round_trip(parse_url(text))


# ---------------------------------------------------------------- with_modes


def test_with_modes_adds_and_infers() -> None:
    p = parse_url("file:///data/x#log")
    q = p.with_modes("zarr")
    assert q.modes == ("nczarr", "file", "zarr")
    assert q.zarr
    assert q.fragment["mode"] == "nczarr,file,zarr"
    assert q.fragment["log"] == ""
    assert q.original == p.original
    assert p.modes == ("nczarr", "file")  # unchanged
    assert p.with_modes("XARRAY").modes == ("nczarr", "file", "xarray", "zarr")
    assert p.with_modes("consolidated,v2", "nczarr").modes == ("nczarr", "file", "consolidated", "v2")
    assert p.with_modes() == p


def test_with_modes_validates() -> None:
    p = parse_url("/data/x.zip")
    with pytest.raises(ModeError, match="'zip' and 'file'"):
        p.with_modes("file")
    with pytest.raises(ModeError, match="'xarray' and 'noxarray'"):
        p.with_modes("xarray").with_modes("noxarray")
    with pytest.raises(ModeError, match="unknown mode 'bogus'"):
        p.with_modes("bogus")
    with pytest.raises(ModeError, match="not supported"):
        p.with_modes("v3")
    with pytest.raises(ModeError, match="'s3' and 'zip'"):
        parse_url("s3://bucket/k").with_modes("zip")
    with pytest.raises(ModeError, match="'file' and 's3'"):
        parse_url("/data/x").with_modes("s3")
    with pytest.raises(ModeError, match="not a string"):
        p.with_modes(3)  # type: ignore[arg-type]


def test_with_modes_keeps_location() -> None:
    p = parse_url("https://ceph.lan:7480/bk/x#aws.region=default&aws.profile=p")
    q = p.with_modes("consolidated")
    assert (q.bucket, q.path, q.endpoint, q.region, q.host, q.port, q.profile) == (
        "bk",
        "x",
        "https://ceph.lan:7480",
        "default",
        "ceph.lan",
        7480,
        "p",
    )
    assert q.consolidated
    _assert_round_trip(q)


# ---------------------------------------------------------------- properties


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("/x/ref_byte.zarr.zip", "ref_byte.zarr"),
        ("/x/tmp.zip", "tmp"),
        ("/x/ds.file", "ds"),
        ("/x/ds", "ds"),
        ("/x/.hidden", ".hidden"),
        ("/x/ds.file/", "ds"),
        ("s3://bucket/a/b/ds.zarr", "ds"),
        ("s3://bucket/a", "a"),
        ("s3://my.bucket", "my.bucket"),
        ("https://minio/bk/", "bk"),
    ],
)
def test_dataset_name(text: str, name: str) -> None:
    assert parse_url(text).dataset_name == name


def test_location_and_profile() -> None:
    assert parse_url("/data/x.zip").location == "/data/x.zip"
    assert parse_url("https://minio:9000/bk/a/b").location == "s3://bk/a/b"
    assert parse_url("s3://bucket#AWS.PROFILE=no").profile == "no"
    assert parse_url("s3://bucket#aws.profile").profile is None
    assert parse_url("s3://bucket").profile is None


def test_region_only_for_s3() -> None:
    assert parse_url("/data/x#aws.region=eu-west-1").region is None


# ---------------------------------------------------------------- property-based


def _parse_or_url_error(text: str) -> None:
    try:
        p = parse_url(text)
    except URLError:
        return
    assert isinstance(p, ParsedURL)
    _assert_round_trip(p)


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_arbitrary_text_parses_or_raises_url_error(text: str) -> None:
    _parse_or_url_error(text)


_CHARS = "abAB09-_:/#&=,.%[]@? "
_piece = st.text(alphabet=_CHARS, max_size=8)
_scheme = st.sampled_from(
    [
        "",
        "/",
        "file:",
        "file:/",
        "file://",
        "file:///",
        "FILE://localhost/",
        "s3://",
        "S3:",
        "gs3://",
        "http://",
        "https://",
        "HTTPS://",
        "ftp://",
        "dap4://",
        "[mode=zarr]",
        "[log][mode=s3]https://",
        "[",
    ]
)
_host = (
    st.sampled_from(
        [
            "",
            "bucket",
            "my-bucket",
            "bkt.s3.amazonaws.com",
            "s3.amazonaws.com",
            "s3.us-west-2.amazonaws.com",
            "bkt.s3.eu-west-1.amazonaws.com",
            "bkt.s3.dualstack.eu-west-1.amazonaws.com",
            "s3-us-west-1.amazonaws.com",
            "localhost:9000",
            "127.0.0.1:9000",
            "[::1]:9000",
            "[::1",
            "u:p@minio:9000",
            "u@minio",
            "storage.googleapis.com",
            "data.s3.r1.example.com",
            "s3.r1.example.com",
            "host:abc",
            "@",
            ":",
        ]
    )
    | _piece
)
_path = st.lists(
    st.sampled_from(["bucket", "k", "x.zip", "..", ".", "", "a%20b", "%FF", "%2F"]) | _piece, max_size=4
)
_pair = (
    st.sampled_from(
        [
            "mode=",
            "mode=zarr,file",
            "mode=NCZarr,FILE",
            "mode=file,zip",
            "mode=s3",
            "mode=bogus",
            "zarr",
            "xarray",
            "noxarray",
            "consolidated",
            "zip",
            "s3",
            "gs3",
            "v2",
            "v3",
            "log",
            "show=fetch",
            "aws.region=us-east-2",
            "aws.region=X Y",
            "aws.profile=no",
            "=x",
            "",
        ]
    )
    | _piece
)


@settings(max_examples=500, deadline=None)
@given(_scheme, _host, _path, st.lists(_pair, max_size=4), st.sampled_from(["", "?q=1", "#", "?"]))
def test_grammar_built_urls_parse_or_raise_url_error(
    scheme: str, host: str, path: list[str], pairs: list[str], query: str
) -> None:
    text = scheme + host + "/" + "/".join(path) + query
    if pairs:
        text += "#" + "&".join(pairs)
    _parse_or_url_error(text)


_segment = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/"),
    min_size=1,
    max_size=8,
)
_format_words = st.sampled_from(
    [(), ("nczarr",), ("zarr",), ("xarray",), ("noxarray",), ("zarr", "noxarray")]
)
_driver_words = st.sampled_from([(), ("file",), ("zip",)])
_extra_words = st.lists(st.sampled_from(["consolidated", "v2"]), unique=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(_segment, min_size=1, max_size=5), _format_words, _driver_words, _extra_words, st.randoms())
def test_file_urls_round_trip(
    segments: list[str], formats: tuple[str, ...], drivers: tuple[str, ...], extras: list[str], rnd: object
) -> None:
    words = [*formats, *drivers, *extras]
    rnd.shuffle(words)  # type: ignore[attr-defined]
    path = "/" + "/".join(segments)
    p = parse_url("file://" + quote(path, errors="surrogateescape") + "#mode=" + ",".join(words))
    assert p.path == "/" + os.path.normpath(path).lstrip("/")
    assert set(words) <= set(p.modes)
    assert p.driver in ("file", "zip")
    _assert_round_trip(p)


@pytest.mark.parametrize("bucket", ["my bucket", "a<b", "a%3Cb", "a%20b", "x" * 256])
def test_custom_endpoint_bucket_names_that_cannot_be_requested_are_refused(bucket: str) -> None:
    with pytest.raises(URLError, match="invalid bucket name"):
        parse_url(f"http://127.0.0.1:9000/{bucket}/key#mode=nczarr,s3")


@pytest.mark.parametrize("bucket", ["My_Bucket", "b", "a.b-c_d"])
def test_custom_endpoint_bucket_names_aws_forbids_but_servers_allow(bucket: str) -> None:
    assert parse_url(f"http://127.0.0.1:9000/{bucket}/key#mode=nczarr,s3").bucket == bucket


LAYERED = ["mode=nczarr,file,manifest", "mode=manifest,file", "mode=zarr,manifest"]


@pytest.mark.parametrize("fragment", LAYERED)
def test_a_layered_driver_is_chosen_beside_its_locations_own_word(fragment: str) -> None:
    assert parse_url(f"file:///data/refs.json#{fragment}").driver == "manifest"
    assert parse_url("/data/refs.json#mode=nczarr").with_modes("manifest").driver == "manifest"
