"""Dataset URLs: ``file:``, ``s3:``, ``gs3:``, ``http(s):`` URLs and bare local paths.

:func:`parse_url` turns a user string into a :class:`ParsedURL` naming the storage driver, the
dataset location and the normalised ``#mode=`` words.  It follows the *documented* netcdf-c
semantics (spec §2), not netcdf-c's bugs: a bare ``#zarr`` means pure Zarr, mode words are
case-insensitive, a URL without a format word defaults to ``nczarr`` (auto-detect) and a
virtual-host S3 URL loses exactly its bucket label.

Every failure is an :class:`~nczmap.errors.URLError` (or its subclass
:class:`~nczmap.errors.ModeError`) whose message quotes the URL -- with any password replaced by
``***`` -- and the offending part.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import quote, unquote

from nczmap.errors import ModeError, URLError
from nczmap.registry import DEFAULT_DRIVER, DRIVERS, LOCAL, S3

__all__ = [
    "FORMAT_WORDS",
    "GOOGLE_ENDPOINT",
    "UNSUPPORTED_MODE_WORDS",
    "Fragment",
    "ParsedURL",
    "known_mode_words",
    "parse_url",
]

FORMAT_WORDS = ("nczarr", "zarr", "xarray", "noxarray")
OTHER_MODE_WORDS = ("gs3", "consolidated", "v2", "v3")
UNSUPPORTED_MODE_WORDS = ("bytes", "dap2", "dap4", "zoh")
GOOGLE_ENDPOINT = "https://storage.googleapis.com"

_IMPLIES = {"xarray": "zarr", "zarr": "nczarr", "noxarray": "nczarr"}
# Drivers whose storage holds one format only: the mode words they imply (an Icechunk repository is Zarr v3)
_DRIVER_FORMATS = {"icechunk": ("zarr", "v3")}


def known_mode_words() -> tuple[str, ...]:
    """Every ``#mode=`` word nczmap understands: formats, the registered drivers, and the rest."""
    return (*FORMAT_WORDS, *DRIVERS, *OTHER_MODE_WORDS)


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HOST = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_PORT = re.compile(r"[0-9]{1,5}")
_AWS_BUCKET = re.compile(r"[a-z0-9.-]{3,63}")
_CUSTOM_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,255}")
_GOOGLE_BUCKET = re.compile(r"[a-z0-9._-]{3,222}")
_AWS_REGION = re.compile(r"[a-z0-9_-]+")
# RFC 3986 pchar minus the unreserved characters quote() keeps anyway.
_PATH_SAFE = "/!$&'()*+,;=:@"
_AWS_FORMS = (
    "s3://<bucket>/<key>, https://<bucket>.s3[.<region>].amazonaws.com/<key>, "
    "https://s3[.<region>].amazonaws.com/<bucket>/<key> (also s3-<region> and s3.dualstack.<region>)"
)


class Fragment(Mapping[str, str]):
    """Read-only, hashable, ordered mapping of lower-case fragment keys to their values.

    Lookups lower-case the key, so ``fragment["AWS.PROFILE"]`` finds ``aws.profile``.  The first
    occurrence of a key wins.
    """

    __slots__ = ("_items",)

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        items: dict[str, str] = {}
        for key, value in pairs:
            items.setdefault(key.lower(), value)
        self._items = items

    def __getitem__(self, key: str) -> str:
        return self._items[key.lower() if isinstance(key, str) else key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"Fragment({self._items!r})"


@dataclass(frozen=True)
class _Location:
    """Where the dataset lives, before mode words are applied."""

    kind: str  # LOCAL or S3 (nczmap.registry)
    scheme: str
    path: str
    host: str | None = None
    port: int | None = None
    bucket: str | None = None
    region: str | None = None
    endpoint: str | None = None


@dataclass(frozen=True)
class ParsedURL:
    """A parsed dataset URL.

    ``original`` is the string given, except that a password in it is replaced by ``***``;
    credentials are never kept.  ``fragment`` is a :class:`Fragment` (hashable, so the whole
    object is); its ``mode`` entry is ``",".join(modes)`` and mode words given as bare keys
    (``#zarr``) appear only in ``modes``.
    """

    original: str
    scheme: str
    driver: str
    path: str
    host: str | None = None
    port: int | None = None
    bucket: str | None = None
    region: str | None = None
    endpoint: str | None = None
    modes: tuple[str, ...] = ()
    fragment: Fragment = field(default_factory=Fragment)

    @property
    def zarr(self) -> bool:
        """Pure Zarr requested: no NCZarr metadata is written or trusted."""
        return "zarr" in self.modes or "xarray" in self.modes

    @property
    def nczarr(self) -> bool:
        return not self.zarr

    @property
    def xarray(self) -> bool:
        """The ``_ARRAY_DIMENSIONS`` convention is on (the default)."""
        return "noxarray" not in self.modes

    @property
    def consolidated(self) -> bool:
        return "consolidated" in self.modes

    @property
    def zarr_format(self) -> int:
        """3 when the URL asks for Zarr v3 (``mode=zarr,v3``): new datasets are written as Zarr v3."""
        return 3 if "v3" in self.modes else 2

    @property
    def profile(self) -> str | None:
        return self.fragment.get("aws.profile") or None

    @property
    def on_s3(self) -> bool:
        """The dataset (or, for a layered driver, its manifest) is in an S3 bucket."""
        return self.bucket is not None

    @property
    def dataset_name(self) -> str:
        """Last path segment minus its last extension (the bucket name, as is, for a bucket root)."""
        if self.on_s3:
            if not self.path:
                return self.bucket or ""
            name = self.path.rsplit("/", 1)[-1]
        else:
            name = os.path.basename(self.path)
        return posixpath.splitext(name)[0]

    @property
    def location(self) -> str:
        if not self.on_s3:
            return self.path
        return f"s3://{self.bucket}/{self.path}" if self.path else f"s3://{self.bucket}"

    def geturl(self) -> str:
        """The canonical URL; ``parse_url(p.geturl())`` describes the same dataset as ``p``."""
        return f"{self._base_url()}#{self._fragment_text()}"

    def with_modes(self, *words: str) -> ParsedURL:
        """A copy with mode words added (each may be a comma list), inferred and validated again."""
        extra: list[str] = []
        for word in words:
            if not isinstance(word, str):
                raise ModeError(f"mode word {word!r} is not a string (adding to {self.original!r})")
            extra.extend(word.split(","))
        modes = _resolve_modes([*self.modes, *extra], self._location(), self.original)
        others = [(key, value) for key, value in self.fragment.items() if key != "mode"]
        return _make(self.original, self._location(), modes, others)

    def _location(self) -> _Location:
        kind = S3 if self.on_s3 else LOCAL
        return _Location(
            kind, self.scheme, self.path, self.host, self.port, self.bucket, self.region, self.endpoint
        )

    def _base_url(self) -> str:
        if not self.on_s3:
            return "file://" + quote(self.path, safe=_PATH_SAFE, errors="surrogateescape")
        tail = quote(self.bucket or "", safe="")
        if self.path:
            tail += "/" + quote(self.path, safe=_PATH_SAFE)
        if self.endpoint:
            return f"{self.endpoint}/{tail}"
        # A region that cannot be a host label (possible via aws.region) stays in the fragment only.
        if self.region and _AWS_REGION.fullmatch(self.region) and self.region != "dualstack":
            return f"https://s3.{self.region}.amazonaws.com/{tail}"
        return f"s3://{tail}"

    def _fragment_text(self) -> str:
        parts = ["mode=" + ",".join(self.modes)]
        parts += [
            key if not value else f"{key}={value}" for key, value in self.fragment.items() if key != "mode"
        ]
        return "&".join(parts)


def parse_url(url: str | os.PathLike[str]) -> ParsedURL:
    """Parse a dataset URL or local path; raise URLError/ModeError for anything unusable.

    A string without a ``scheme:`` prefix is a local path (its ``#fragment`` is still parsed); an
    ``os.PathLike`` is always taken literally as a local path, ``#`` included.
    """
    if isinstance(url, os.PathLike):
        text = _fspath(url)
        _check_text(text, text)
        return _assemble(text, _local_location(text, text), [])
    if not isinstance(url, str):
        raise URLError(f"a dataset URL must be a string or os.PathLike, not {type(url).__name__}")
    text = url.strip()
    shown = _redact(text)
    _check_text(text, shown)
    pairs, rest = _split_prefix(text, shown)
    rest, _, fragment = rest.partition("#")
    pairs += _parse_pairs(fragment, shown)
    return _assemble(shown, _locate(rest, shown), pairs)


def _fspath(url: os.PathLike[str]) -> str:
    try:
        return os.fsdecode(url)
    except (TypeError, ValueError) as exc:
        raise URLError(f"cannot use {url!r} as a path: {exc}") from exc


def _check_text(text: str, shown: str) -> None:
    if not text:
        raise URLError("empty dataset URL")
    bad = _CONTROL.search(text)
    if bad:
        raise URLError(f"control character {bad.group()!r} in {shown!r}")
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise URLError(f"{shown!r} contains characters that cannot name anything: {exc.reason}") from exc


def _redact(text: str) -> str:
    """Replace the password of a ``scheme://user:password@host`` URL with ``***``."""
    start = text.find("://")
    if start < 0:
        return text
    start += 3
    end = min((i for i in (text.find(c, start) for c in "/?#") if i >= 0), default=len(text))
    at = text.rfind("@", start, end)
    colon = text.find(":", start, at) if at >= 0 else -1
    return text if colon < 0 else f"{text[: colon + 1]}***{text[at:]}"


def _split_prefix(text: str, shown: str) -> tuple[list[tuple[str, str]], str]:
    """Split DAP-style ``[k=v][k2]`` prefix parameters off the front of the URL."""
    pairs: list[tuple[str, str]] = []
    while text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise URLError(f"unterminated '[' prefix parameter in {shown!r}")
        pairs += _parse_pairs(text[1:end], shown)
        text = text[end + 1 :].lstrip()
    return pairs, text


def _parse_pairs(text: str, shown: str) -> list[tuple[str, str]]:
    """``key``, ``key=`` or ``key=value`` items separated by '&'; blanks around keys/values dropped."""
    pairs = []
    for item in text.split("&"):
        if not item.strip():
            continue
        key, _, value = (part.strip() for part in item.partition("="))
        if not key:
            raise URLError(f"fragment parameter {item!r} has no key in {shown!r}")
        pairs.append((key.lower(), value))
    return pairs


def _locate(text: str, shown: str) -> _Location:
    match = _SCHEME.match(text)
    if match is None:
        return _local_location(text, shown)
    scheme = match.group(1).lower()
    body = text[match.end() :]
    if scheme == "file":
        return _file_location(body, shown)
    if scheme in ("s3", "gs3"):
        return _bucket_scheme_location(scheme, body, shown)
    if scheme in ("http", "https"):
        return _http_location(scheme, body, shown)
    raise URLError(f"unsupported URL scheme {scheme!r} in {shown!r} (use file, s3, gs3, http or https)")


def _local_location(path: str, shown: str) -> _Location:
    if not path:
        raise URLError(f"missing path in {shown!r}")
    try:
        path = os.path.abspath(path)
    except OSError as exc:  # the current directory may have been removed
        raise URLError(f"cannot make the path of {shown!r} absolute: {exc}") from exc
    # normpath keeps a leading "//" (POSIX leaves it implementation-defined); Linux treats it as "/".
    return _Location(LOCAL, "file", "/" + os.path.normpath(path).lstrip("/"))


def _file_location(body: str, shown: str) -> _Location:
    body = body.partition("?")[0]
    raw = body
    if body.startswith("//"):
        host, slash, rest = body[2:].partition("/")
        if host.lower() not in ("", "localhost"):
            raise URLError(f"file URL path must be absolute, got relative {body[2:]!r} in {shown!r}")
        raw = slash + rest
    if not raw:
        raise URLError(f"missing path in file URL {shown!r}")
    if not raw.startswith("/"):
        raise URLError(f"file URL path must be absolute, got {raw!r} in {shown!r}")
    path = unquote(raw, errors="surrogateescape")
    bad = _CONTROL.search(path)
    if bad:
        raise URLError(f"control character {bad.group()!r} in the path of {shown!r}")
    return _local_location(path, shown)


def _bucket_scheme_location(scheme: str, body: str, shown: str) -> _Location:
    if not body.startswith("//"):
        raise URLError(f"expected {scheme}://<bucket>/<key>, got {shown!r}")
    bucket, _, key = body[2:].partition("?")[0].partition("/")
    if not bucket:
        raise URLError(f"missing bucket in {shown!r}")
    endpoint = GOOGLE_ENDPOINT if scheme == "gs3" else None
    _check_bucket(bucket, _GOOGLE_BUCKET if endpoint else _AWS_BUCKET, shown)
    return _Location(S3, scheme, _s3_key(key.split("/"), shown), bucket=bucket, endpoint=endpoint)


def _http_location(scheme: str, body: str, shown: str) -> _Location:
    if not body.startswith("//"):
        raise URLError(f"expected {scheme}://<host>/..., got {shown!r}")
    authority, _, raw_path = body[2:].partition("?")[0].partition("/")
    host, port = _split_authority(authority, shown)
    server = _Location(S3, scheme, "", host, port)
    segments = raw_path.split("/")
    labels = [] if host.startswith("[") else host.split(".")
    if host == "storage.googleapis.com":
        return _path_style(
            replace(server, endpoint=_endpoint(scheme, host, port)), segments, _GOOGLE_BUCKET, shown
        )
    if labels[-2:] == ["amazonaws", "com"]:
        return _aws_location(server, labels, segments, shown)
    if len(labels) >= 4 and labels[1] == "s3" and labels[0] != "s3":
        # <bucket>.s3.<region>.<domain...>: drop exactly the bucket label (netcdf-c bug 7 skips 9 chars).
        endpoint = _endpoint(scheme, ".".join(labels[1:]), port)
        server = replace(server, endpoint=endpoint, region=_custom_region(labels[1:]))
        return _virtual_host(server, labels[0], None, segments, shown)
    server = replace(server, endpoint=_endpoint(scheme, host, port), region=_custom_region(labels))
    return _path_style(server, segments, None, shown)


def _custom_region(labels: list[str]) -> str | None:
    """Region of a non-AWS ``s3.<region>.<domain>`` host; needs a 2+ label domain to be unambiguous."""
    return labels[1] if len(labels) >= 4 and labels[0] == "s3" else None


def _endpoint(scheme: str, host: str, port: int | None) -> str:
    return f"{scheme}://{host}" if port is None else f"{scheme}://{host}:{port}"


def _split_authority(authority: str, shown: str) -> tuple[str, int | None]:
    """Host (lower-case, IPv6 kept in brackets) and port; user:password is checked and dropped."""
    userinfo, at, hostport = authority.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        if not (user and colon and password):
            raise URLError(f"credentials must be given as user:password in {shown!r}")
    if not hostport:
        raise URLError(f"missing host in {shown!r}")
    if hostport.startswith("["):
        host, port_text = _split_ipv6(hostport, shown)
    else:
        host, colon, port_text = hostport.partition(":")
        if not (host.isascii() and _HOST.fullmatch(host.lower())):
            raise URLError(f"invalid host {host!r} in {shown!r}")
        port_text = port_text if colon else None
    return host.lower(), _port(port_text, shown)


def _split_ipv6(hostport: str, shown: str) -> tuple[str, str | None]:
    end = hostport.find("]")
    after = hostport[end + 1 :]
    if end < 0 or (after and not after.startswith(":")):
        raise URLError(f"malformed IPv6 host {hostport!r} in {shown!r}")
    try:
        ipaddress.IPv6Address(hostport[1:end])
    except ValueError as exc:
        raise URLError(f"invalid IPv6 address {hostport[: end + 1]!r} in {shown!r}") from exc
    return hostport[: end + 1], (after[1:] if after else None)


def _port(text: str | None, shown: str) -> int | None:
    if text is None:
        return None
    if not _PORT.fullmatch(text) or not 0 < int(text) < 65536:
        raise URLError(f"bad port {text!r} in {shown!r} (must be a number 1-65535)")
    return int(text)


def _aws_location(server: _Location, labels: list[str], segments: list[str], shown: str) -> _Location:
    bucket, region = _aws_host(labels, server.host or "", shown)
    server = replace(server, region=region)
    if bucket is None:
        return _path_style(server, segments, _AWS_BUCKET, shown)
    return _virtual_host(server, bucket, _AWS_BUCKET, segments, shown)


def _aws_host(labels: list[str], host: str, shown: str) -> tuple[str | None, str | None]:
    """(virtual-host bucket or None, region or None) for an ``*.amazonaws.com`` host."""
    n, first = len(labels), labels[0]
    if n == 3 and first == "s3":
        return None, None
    if n == 3 and first.startswith("s3-") and len(first) > 3:
        return None, _legacy_region(first)
    if n == 4 and first == "s3" and labels[1] != "dualstack":
        return None, labels[1]
    if n == 4 and labels[1] == "s3":
        return first, None
    if n == 4 and labels[1].startswith("s3-") and len(labels[1]) > 3:
        return first, _legacy_region(labels[1])
    if n == 5 and first == "s3" and labels[1] == "dualstack":
        return None, labels[2]
    if n == 5 and labels[1] == "s3" and labels[2] != "dualstack":
        return first, labels[2]
    if n == 6 and labels[1] == "s3" and labels[2] == "dualstack":
        return first, labels[3]
    raise URLError(f"unrecognised Amazon S3 host {host!r} in {shown!r}; accepted forms: {_AWS_FORMS}")


def _legacy_region(label: str) -> str:
    region = label[3:]
    return "us-east-1" if region == "external-1" else region


def _virtual_host(
    server: _Location, bucket: str, rule: re.Pattern[str] | None, segments: list[str], shown: str
) -> _Location:
    """``<bucket>.<host>/<key>``: the bucket came from the host."""
    _check_bucket(bucket, rule, shown)
    return replace(server, bucket=bucket, path=_s3_key(segments, shown))


def _path_style(
    server: _Location, segments: list[str], rule: re.Pattern[str] | None, shown: str
) -> _Location:
    """``<host>/<bucket>/<key>``: the bucket is the first non-empty path segment."""
    segments = [s for s in segments if s]
    if not segments:
        raise URLError(f"missing bucket in {shown!r}")
    bucket = _decode(segments[0], shown)
    if "/" in bucket:
        raise URLError(f"bucket name {bucket!r} contains '/' in {shown!r}")
    _check_bucket(bucket, rule, shown)
    return replace(server, bucket=bucket, path=_s3_key(segments[1:], shown))


def _check_bucket(bucket: str, rule: re.Pattern[str] | None, shown: str) -> None:
    """``rule`` is None for custom endpoints: they may allow names AWS forbids (capitals, underscores,
    longer names), but never what cannot go in a request path (blanks, '<', '%', ...)."""
    if bucket in (".", "..") or not (rule or _CUSTOM_BUCKET).fullmatch(bucket):
        raise URLError(f"invalid bucket name {bucket!r} in {shown!r}")


def _decode(segment: str, shown: str) -> str:
    try:
        text = unquote(segment, errors="strict")
        text.encode("utf-8")
    except UnicodeError as exc:
        raise URLError(f"{segment!r} in {shown!r} is not valid UTF-8 once percent-decoded") from exc
    bad = _CONTROL.search(text)
    if bad:
        raise URLError(f"control character {bad.group()!r} in {segment!r} of {shown!r}")
    return text


def _s3_key(segments: list[str], shown: str) -> str:
    """Root key: decoded segments re-joined with '/', empty ones dropped, no '.' or '..'."""
    decoded = "/".join(_decode(s, shown) for s in segments if s)
    parts = [p for p in decoded.split("/") if p]
    for part in parts:
        if part in (".", ".."):
            raise URLError(f"{part!r} segment in the S3 key of {shown!r}")
    return "/".join(parts)


def _assemble(shown: str, location: _Location, pairs: list[tuple[str, str]]) -> ParsedURL:
    words: list[str] = []
    others: list[tuple[str, str]] = []
    for key, value in pairs:
        if key == "mode":
            words.extend(value.split(","))
        elif not value and (key in known_mode_words() or key in UNSUPPORTED_MODE_WORDS):
            words.append(key)  # documented meaning of a bare mode word (netcdf-c bug 8 aside)
        else:
            others.append((key, value))
    return _make(shown, location, _resolve_modes(words, location, shown), others)


def _make(
    original: str, location: _Location, modes: tuple[str, ...], others: list[tuple[str, str]]
) -> ParsedURL:
    fragment = Fragment([("mode", ",".join(modes)), *others])
    region = location.region
    if location.kind == S3 and region is None:
        region = fragment.get("aws.region") or None
    drivers = [word for word in modes if word in DRIVERS]
    driver = next((word for word in drivers if DRIVERS[word].layered), drivers[0])  # "file,manifest"
    return ParsedURL(
        original=original,
        scheme=location.scheme,
        driver=driver,
        path=location.path,
        host=location.host,
        port=location.port,
        bucket=location.bucket,
        region=region,
        endpoint=location.endpoint,
        modes=modes,
        fragment=fragment,
    )


def _resolve_modes(words: list[str], location: _Location, shown: str) -> tuple[str, ...]:
    modes = _normalise_words(words, shown)
    _add_driver_formats(modes, shown)
    if "xarray" in modes and "noxarray" in modes:
        raise ModeError(f"contradictory modes 'xarray' and 'noxarray' in {shown!r}")
    if "v2" in modes and "v3" in modes:
        raise ModeError(f"contradictory modes 'v2' and 'v3' in {shown!r}")
    if "v3" in modes and "zarr" not in modes and "xarray" not in modes:
        raise ModeError(
            f"mode 'v3' is not supported without mode=zarr or mode=xarray (in {shown!r}): Zarr v3 is "
            "written only as pure Zarr, since no netcdf-c release reads NCZarr in Zarr v3"
        )
    for word in modes:  # the list grows while we walk it: breadth-first inference
        implied = _IMPLIES.get(word)
        if implied and implied not in modes:
            modes.append(implied)
    if not any(word in FORMAT_WORDS for word in modes):
        modes.append("nczarr")
    driver = _driver(modes, location, shown)
    if driver not in modes:
        modes.append(driver)
    return tuple(modes)


def _add_driver_formats(modes: list[str], shown: str) -> None:
    """Add the format words a driver implies (``icechunk``: ``zarr,v3``); refuse the contrary ones."""
    for driver, implied in _DRIVER_FORMATS.items():
        if driver not in modes:
            continue
        contrary = [word for word in ("v2",) if word in modes]
        if contrary:
            raise ModeError(
                f"mode {contrary[0]!r} cannot be used with {driver!r} in {shown!r}: {driver} stores hold "
                f"pure Zarr v3 ({','.join(implied)})"
            )
        modes.extend(word for word in implied if word not in modes)


def _normalise_words(words: Iterable[str], shown: str) -> list[str]:
    modes: list[str] = []
    for raw in words:
        word = raw.strip().lower()
        if not word:
            continue
        if word in UNSUPPORTED_MODE_WORDS:
            raise ModeError(f"mode {word!r} is not supported by nczmap (in {shown!r})")
        if word not in known_mode_words():
            known = ", ".join(known_mode_words())
            raise ModeError(f"unknown mode {word!r} in {shown!r}; known modes: {known}")
        word = "s3" if word == "gs3" else word
        if word not in modes:
            modes.append(word)
    return modes


def _driver(modes: list[str], location: _Location, shown: str) -> str:
    """The registered driver the mode words and the location select (nczmap.registry)."""
    chosen = [word for word in modes if word in DRIVERS]
    layered = [word for word in chosen if DRIVERS[word].layered]
    if layered and len(chosen) == 2 and DEFAULT_DRIVER[location.kind] in chosen:
        chosen = layered  # "manifest,s3": a manifest stored in S3
    if len(chosen) > 1:
        raise ModeError(f"conflicting storage drivers {chosen[0]!r} and {chosen[1]!r} in mode of {shown!r}")
    if chosen:
        if location.kind not in DRIVERS[chosen[0]].locations:
            local = location.kind == LOCAL
            where = "a local file path or file: URL" if local else f"a {location.scheme}: URL"
            raise ModeError(f"mode {chosen[0]!r} cannot be used with {where} ({shown!r})")
        return chosen[0]
    if location.kind == LOCAL:
        for entry in DRIVERS.values():
            if entry.suffix and LOCAL in entry.locations and location.path.lower().endswith(entry.suffix):
                return entry.name
    return DEFAULT_DRIVER[location.kind]
