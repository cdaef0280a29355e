"""Which sources a manifest may reach: references are followed only under containers the user authorised.

A manifest is untrusted input (a downloaded ``refs.json`` may point at ``/home/user/.ssh/id_rsa``). A
:class:`Container` is a URL prefix (``file:///data/``, ``s3://bucket/path/``, ``https://host/archive/``)
with the options needed to read under it (S3 endpoint, region, profile; HTTP ``headers``). Every reference
is normalised first (percent-decoding, ``.``/``..``/empty segments, and for local files every symbolic
link), then matched on whole path segments, so no spelling escapes a container. By default only the
manifest's own directory (or bucket prefix) is a container; anything else needs an explicit grant.

HTTP(S) URLs are made canonical the way the request is then sent (the reader requests exactly the
canonical URL, so what was matched is what is fetched): scheme and host in lower case, no default port
(80, 443), IPv4 hosts in dotted decimal whatever their spelling (``0x7f.1`` is ``127.0.0.1``, as URL
parsers read it), IPv6 hosts compressed, a trailing dot of a host dropped, the path percent-decoded
(``%2F`` is a ``/``, ``%2e%2e`` a ``..``), dot and empty segments resolved, then re-encoded one way. Refused
outright, granted or not: a user name or password in the URL (credentials never come from a manifest), a
query string or fragment (no stable identity, and the usual carrier of signed credentials and open
redirects), a non-ASCII host (write it in punycode), segments that could be read differently by
a server (a ``\\``, a ``%`` left after decoding, which a double-decoding server would decode again,
control characters, ``..;``, invalid UTF-8), and link-local or cloud metadata hosts (:data:`METADATA_HOSTS`,
:data:`METADATA_ADDRESSES`) in any spelling, including IPv6 addresses that embed such an IPv4 address
(IPv4-mapped, IPv4-compatible, NAT64, 6to4): no dataset lives there, and an error message's suggested grant
must never open them. A host *name* is not resolved, so one that resolves to such an address is not caught
here. The HTTP reader (``nczmap.zmap.http``) follows no redirect, so a granted server cannot point there.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, unquote_to_bytes

from nczmap.errors import AccessDenied

SCHEMES = ("file", "s3", "http", "https")
HTTP_PORTS = {"http": 80, "https": 443}
PATH_SAFE = "!$&'()*+,;=:@"  # RFC 3986 sub-delims, ":" and "@": kept as they are in a canonical path
# Cloud metadata services (they hand out the machine's credentials) and link-local addresses: refused under
# every grant. The one list of them; IPv6 addresses are also compared as the IPv4 address they embed.
METADATA_HOSTS = (
    "metadata.google.internal",  # Google Cloud
    "metadata.goog",  # Google Cloud, the same server
    "metadata",  # Google Cloud, through the resolver's search domain
)
METADATA_ADDRESSES = tuple(
    ipaddress.ip_network(network)
    for network in (
        "169.254.0.0/16",  # IPv4 link-local: 169.254.169.254 (AWS, Azure, Google, Oracle, OpenStack...)
        "fe80::/10",  # IPv6 link-local
        "fd00:ec2::254/128",  # AWS over IPv6
        "100.100.100.200/32",  # Alibaba Cloud
        "168.63.129.16/32",  # Azure's platform endpoint (WireServer)
    )
)
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # ::a.b.c.d (deprecated, still routed by some stacks)
NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the IPv4 address in the last 32 bits
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: any RFC 6052 prefix length within it
_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
_IPV4_PART = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")


@dataclass(frozen=True)
class Container:
    """A URL prefix references may be read under, and how to read there (``endpoint``, ``region``,
    ``profile`` for S3; ``headers``, a dict sent with every request, for HTTP)."""

    prefix: str
    options: Mapping[str, object] = field(default_factory=dict)
    # a local prefix as it was spelled (``.``/``..`` resolved, links not): references spelled through the
    # same links match it too
    spelling: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_options(self.prefix, self.options)
        spelling = normalize(self.prefix, None, directory=True, links=False)
        object.__setattr__(self, "prefix", normalize(self.prefix, None, directory=True))
        object.__setattr__(self, "spelling", spelling)

    def relative(self, url: str) -> str | None:
        """The part of a normalised ``url`` below this container (None when it is not below it)."""
        for prefix in (self.prefix, self.spelling):
            if url.startswith(prefix):
                return url[len(prefix) :]
        return None


OPTIONS = ("endpoint", "region", "profile", "headers")  # what a grant may say of how to read there


def _check_options(prefix: object, options: object) -> None:
    """AccessDenied naming the grant unless its options are ``endpoint``/``region``/``profile`` text and
    ``headers`` a dict of text (checked when granted, not at the first read)."""
    if not isinstance(options, Mapping):
        kind = type(options).__name__
        raise AccessDenied(f"the options of the grant {prefix!r} must be a dict, not {kind}")
    for name, value in options.items():
        if name not in OPTIONS:
            raise AccessDenied(f"the grant {prefix!r} has option {name!r}: a grant's options are {OPTIONS}")
        if name == "headers":
            valid = isinstance(value, Mapping) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            )
        else:
            valid = isinstance(value, str) or value is None
        if not valid:
            what = "a dict of text" if name == "headers" else "text"
            raise AccessDenied(f"the grant {prefix!r}: option {name} must be {what}, not {value!r}")


def normalize(url: str, base: str | None, directory: bool = False, links: bool = True) -> str:
    """The canonical spelling of ``url``: ``file:///real/path`` (links resolved), ``s3://bucket/key`` or
    ``http(s)://host[:port]/path``.

    A path without a scheme is local; relative ones are taken from ``base`` (the manifest's directory URL).
    ``directory`` keeps a trailing ``/`` (container prefixes); ``links=False`` leaves symbolic links of a
    local path unresolved (``.`` and ``..`` are still resolved, as text). Raises AccessDenied for anything
    unusable.
    """
    raw = url.strip()
    raw_scheme, raw_sep, raw_rest = raw.partition("://")
    if raw_sep and raw_scheme.lower() in HTTP_PORTS:
        return _normalize_http(raw_scheme.lower(), raw_rest, url, directory)  # split before decoding
    if re.match(r"(?i)https?:", raw):
        raise AccessDenied(f"reference {url!r} is not a well-formed http(s) URL (scheme://host/path)")
    text = unquote(raw)
    scheme, sep, rest = text.partition("://")
    if not sep:
        if text.startswith("file:"):
            scheme, rest = "file", text[5:]
        elif text.startswith("/"):
            scheme, rest = "file", text
        elif base is not None:
            return normalize(base.rstrip("/") + "/" + text, None, directory, links)
        else:
            raise AccessDenied(f"reference {url!r} is relative, and no manifest location resolves it")
    scheme = scheme.lower()
    if scheme == "file":
        if not rest.startswith("/"):
            host, _, tail = rest.partition("/")
            if host.lower() != "localhost":
                raise AccessDenied(f"reference {url!r}: file URLs of other hosts cannot be read")
            rest = "/" + tail
        if "\x00" in rest:
            raise AccessDenied(f"reference {url!r} holds a NUL character")
        path = os.path.normpath("/" + rest.lstrip("/"))
        real = os.path.realpath(path) if links else path
        return "file://" + real.rstrip("/") + ("/" if directory else "")
    if scheme == "s3":
        bucket, _, key = rest.partition("/")
        if not bucket or bucket in (".", ".."):
            raise AccessDenied(f"reference {url!r} names no S3 bucket")
        parts: list[str] = []
        for part in key.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    raise AccessDenied(f"reference {url!r} climbs out of its bucket")
                parts.pop()
            else:
                parts.append(part)
        tail = "/".join(parts)
        return f"s3://{bucket}/{tail}" + ("/" if directory and tail else "")
    if scheme in HTTP_PORTS:
        raise AccessDenied(f"reference {url!r}: a percent-encoded {scheme!r} scheme is not read")
    raise AccessDenied(f"reference {url!r}: scheme {scheme!r} cannot be read (use file, s3, http or https)")


_CONTROL_OR_BACKSLASH = re.compile(r"[\x00-\x1f\x7f\\]")
_UNSAFE_SEGMENT = re.compile(r"[\x00-\x1f\x7f\\%]")


@functools.lru_cache(maxsize=1 << 14)  # a collection's URLs are normalized at each step they pass through
def _normalize_http(scheme: str, rest: str, url: str, directory: bool) -> str:
    """``scheme://host[:port]/path`` canonical (see the module notes); ``rest`` follows ``://``, raw."""
    if _CONTROL_OR_BACKSLASH.search(rest):
        raise AccessDenied(f"reference {url!r} holds a backslash or control character")
    if "?" in rest or "#" in rest:
        raise AccessDenied(
            f"reference {url!r} has a query string or fragment: http(s) references must name a file by "
            "its path alone (no signed URLs or parameters in a manifest)"
        )
    authority, _, path = rest.partition("/")
    if "@" in authority:
        raise AccessDenied(
            f"reference {url!r} carries a user name or password: credentials never come from a manifest "
            "(give them as container options)"
        )
    host, port = _checked_authority(scheme, authority, url)
    try:
        decoded = unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        raise AccessDenied(f"reference {url!r}: its path is not UTF-8 once percent-decoded") from None
    parts: list[str] = []
    for part in decoded.split("/"):
        if _UNSAFE_SEGMENT.search(part):
            raise AccessDenied(
                f"reference {url!r}: a path segment holds a backslash, control character or a '%' left "
                "after decoding, which servers may read as another path"
            )
        bare = part.split(";", 1)[0]
        if not bare.isascii():
            bare = unicodedata.normalize("NFKC", bare)
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise AccessDenied(f"reference {url!r} climbs above the root of {scheme}://{host}")
            parts.pop()
        elif bare in (".", ".."):
            raise AccessDenied(f"reference {url!r}: segment {part!r} is a dot segment to some servers")
        else:
            parts.append(quote(part, safe=PATH_SAFE))
    tail = "/".join(parts)
    netloc = host if port == HTTP_PORTS[scheme] else f"{host}:{port}"
    return f"{scheme}://{netloc}/{tail}" + ("/" if directory and tail else "")


_AUTHORITIES: dict[tuple[str, str], tuple[str, int]] = {}  # (scheme, authority) checked and allowed


def _checked_authority(scheme: str, authority: str, url: str) -> tuple[str, int]:
    """:func:`_host_port`, decided once per authority (thousands of references name one server); only an
    allowed authority is kept, so a refusal always names the reference it is about."""
    found = _AUTHORITIES.get((scheme, authority))
    if found is None:
        found = _host_port(scheme, authority, url)
        if len(_AUTHORITIES) < 4096:
            _AUTHORITIES[(scheme, authority)] = found
    return found


def _host_port(scheme: str, authority: str, url: str) -> tuple[str, int]:
    """The canonical host and the port of an http(s) authority; AccessDenied for metadata addresses."""
    if authority.startswith("["):
        inner, bracket, after = authority[1:].partition("]")
        if not bracket or (after and not after.startswith(":")) or "%" in inner:
            raise AccessDenied(f"reference {url!r} has a malformed IPv6 host")
        port_text = after[1:] if after else ""
        try:
            address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.IPv6Address(inner)
        except ValueError:
            raise AccessDenied(f"reference {url!r} has a malformed IPv6 host") from None
        host = f"[{address.compressed}]"
    else:
        name, _, port_text = authority.partition(":")
        name = unquote(name).lower()
        name = name[:-1] if name.endswith(".") else name
        if not name.isascii():
            raise AccessDenied(f"reference {url!r}: write its host in ASCII (punycode, xn--...)")
        if not _HOST_NAME.fullmatch(name):
            raise AccessDenied(f"reference {url!r} has no valid host name")
        address = _ipv4(name, url)
        host = str(address) if address is not None else name
    if not port_text:
        port = HTTP_PORTS[scheme]
    elif port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536:
        port = int(port_text)
    else:
        raise AccessDenied(f"reference {url!r} has a bad port {port_text!r}")
    metadata = _metadata(host, address)
    if metadata is not None:
        shown = host if metadata == host else f"{host} ({metadata})"
        raise AccessDenied(
            f"reference {url!r}: {shown} is a link-local or cloud metadata address, never read under any "
            "scheme or grant"
        )
    return host, port


def _metadata(host: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> str | None:
    """The metadata host or address ``host`` is or stands for; None for an ordinary host."""
    if host in METADATA_HOSTS:
        return host
    candidates = [] if address is None else [address]
    if isinstance(address, ipaddress.IPv6Address):
        candidates += _embedded_ipv4(address)
    for candidate in candidates:
        if any(candidate in network for network in METADATA_ADDRESSES):
            return host if candidate is address else str(candidate)
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address stands for: IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible
    ``::a.b.c.d`` (not ``::`` or ``::1``), NAT64 ``64:ff9b::a.b.c.d`` (under ``64:ff9b:1::/48`` every
    position RFC 6052 allows) and 6to4 ``2002:aabb:ccdd::``."""
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address.sixtofour is not None:
        return [address.sixtofour]
    last = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in NAT64_WELL_KNOWN or (address in IPV4_COMPATIBLE and int(address) > 1):
        return [last]
    if address in NAT64_LOCAL:
        octets = address.packed  # RFC 6052 skips bits 64-71 (always zero)
        positions = [(octets[bits // 8 : 8] + octets[9:])[:4] for bits in (48, 56, 64)]
        return [*map(ipaddress.IPv4Address, positions), last]
    return []


def _ipv4(name: str, url: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host spells, as URL parsers read it (``2130706433``, ``0x7f.1``, ``0177.0.0.1``);
    None for a host name. A name whose last label is a number is an address or an error."""
    labels = name.split(".")
    if not _IPV4_PART.fullmatch(labels[-1]):
        return None
    numbers = []
    for label in labels:
        if not _IPV4_PART.fullmatch(label) or len(labels) > 4:
            raise AccessDenied(f"reference {url!r} has a malformed IPv4 host")
        if label[:2].lower() == "0x":
            numbers.append(int(label[2:] or "0", 16))
        elif len(label) > 1 and label.startswith("0"):
            try:
                numbers.append(int(label, 8))
            except ValueError:
                raise AccessDenied(f"reference {url!r} has a malformed IPv4 host") from None
        else:
            numbers.append(int(label))
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        raise AccessDenied(f"reference {url!r} has an IPv4 host out of range")
    value = numbers[-1] + sum(n << (8 * (3 - i)) for i, n in enumerate(numbers[:-1]))
    return ipaddress.IPv4Address(value)


def containing(url: str, containers: Iterable[Container]) -> Container | None:
    """The container holding the normalised ``url`` (the longest prefix), if any."""
    found = _containing(url, containers)
    return found[0] if found else None


def _containing(url: str, containers: Iterable[Container]) -> tuple[Container, str] | None:
    best: tuple[Container, str] | None = None
    for container in containers:
        relative = container.relative(url)
        if relative is not None and (best is None or len(relative) < len(best[1])):
            best = container, relative
    return best


def locate(
    url: str, base: str | None, containers: Iterable[Container], key: str
) -> tuple[str, Container, str]:
    """Where a reference points: its canonical URL, its container and the path below the container.

    A local path is matched as spelled (``.``/``..`` resolved as text) and, failing that, with its links
    resolved; either way the reader opens the relative part from the container's directory, never the
    path itself (:class:`nczmap.zmap.beneath.Beneath`), so a link swapped in later cannot lead out.
    AccessDenied names the reference and the grant it would need.
    """
    spelled = normalize(url, base, links=False)
    found = _containing(spelled, containers)
    if found is None and spelled.startswith("file://"):
        spelled = normalize(url, base)
        found = _containing(spelled, containers)
    if found is None:
        grant = spelled.rsplit("/", 1)[0] + "/"
        raise AccessDenied(
            f"key {key!r} refers to {url!r} ({spelled}), which is outside every authorised container: "
            f"grant it with containers=[{grant!r}] (Python) or --allow {grant} (command line)"
        )
    container, relative = found
    return container.prefix + relative, container, relative


def authorize(url: str, base: str | None, containers: Iterable[Container], key: str) -> tuple[str, Container]:
    """The canonical ``url`` and its container; AccessDenied naming the reference and the missing grant."""
    canonical, container, _ = locate(url, base, containers, key)
    return canonical, container


def as_containers(grants: object) -> list[Container]:
    """Containers from what a user passes: a prefix, a Container, ``{prefix: options}``, or a list of any
    of these (``["/data/archive/", {"s3://bucket/nc/": {"endpoint": "http://127.0.0.1:9000"}}]``)."""
    if grants is None:
        return []
    if isinstance(grants, str | Container | os.PathLike):
        grants = [grants]
    if isinstance(grants, Mapping):
        return [_granted(prefix, options) for prefix, options in grants.items()]
    found: list[Container] = []
    for grant in grants:  # type: ignore[union-attr]
        if isinstance(grant, Container):
            found.append(grant)
        elif isinstance(grant, Mapping):
            found.extend(_granted(prefix, options) for prefix, options in grant.items())
        elif isinstance(grant, str | os.PathLike):
            found.append(Container(os.fspath(grant)))
        else:
            raise AccessDenied(
                f"cannot grant {grant!r}: a grant is a prefix (str), a Container or {{prefix: options}}"
            )
    return found


def _granted(prefix: object, options: object) -> Container:
    if not isinstance(prefix, str | os.PathLike):
        raise AccessDenied(f"cannot grant {prefix!r}: a container prefix is a str")
    return Container(os.fspath(prefix), options if options is not None else {})
