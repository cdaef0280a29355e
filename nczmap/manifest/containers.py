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
control characters, ``..;``, invalid UTF-8), and link-local or cloud metadata addresses (``169.254.0.0/16``,
``fe80::/10``, ``fd00:ec2::254``, ``metadata.google.internal``) in any spelling: no dataset lives there,
and an error message's suggested grant must never open them. A host *name* is not resolved, so one that
resolves to such an address is not caught here.
"""

from __future__ import annotations

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
METADATA_HOSTS = ("metadata.google.internal",)
METADATA_ADDRESSES = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
METADATA_ADDRESSES += (ipaddress.ip_network("fd00:ec2::254/128"),)
_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
_IPV4_PART = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")


@dataclass(frozen=True)
class Container:
    """A URL prefix references may be read under, and how to read there (``endpoint``, ``region``,
    ``profile`` for S3; ``headers``, a dict sent with every request, for HTTP)."""

    prefix: str
    options: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", normalize(self.prefix, None, directory=True))


def normalize(url: str, base: str | None, directory: bool = False) -> str:
    """The canonical spelling of ``url``: ``file:///real/path`` (links resolved), ``s3://bucket/key`` or
    ``http(s)://host[:port]/path``.

    A path without a scheme is local; relative ones are taken from ``base`` (the manifest's directory URL).
    ``directory`` keeps a trailing ``/`` (container prefixes). Raises AccessDenied for anything unusable.
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
            return normalize(base.rstrip("/") + "/" + text, None, directory)
        else:
            raise AccessDenied(f"reference {url!r} is relative, and no manifest location resolves it")
    scheme = scheme.lower()
    if scheme == "file":
        if not rest.startswith("/"):
            host, _, tail = rest.partition("/")
            if host.lower() != "localhost":
                raise AccessDenied(f"reference {url!r}: file URLs of other hosts cannot be read")
            rest = "/" + tail
        real = os.path.realpath(os.path.normpath(rest))
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


def _normalize_http(scheme: str, rest: str, url: str, directory: bool) -> str:
    """``scheme://host[:port]/path`` canonical (see the module notes); ``rest`` follows ``://``, raw."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F or c == "\\" for c in rest):
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
    host, port = _host_port(scheme, authority, url)
    try:
        decoded = unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        raise AccessDenied(f"reference {url!r}: its path is not UTF-8 once percent-decoded") from None
    parts: list[str] = []
    for part in decoded.split("/"):
        if any(ord(c) < 0x20 or ord(c) == 0x7F or c in "\\%" for c in part):
            raise AccessDenied(
                f"reference {url!r}: a path segment holds a backslash, control character or a '%' left "
                "after decoding, which servers may read as another path"
            )
        bare = unicodedata.normalize("NFKC", part.split(";", 1)[0])
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
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if host in METADATA_HOSTS or (address is not None and any(address in n for n in METADATA_ADDRESSES)):
        raise AccessDenied(
            f"reference {url!r}: {host} is a link-local (cloud metadata) address, never read under any "
            "scheme or grant"
        )
    return host, port


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
    best = None
    for container in containers:
        if url.startswith(container.prefix) and (best is None or len(container.prefix) > len(best.prefix)):
            best = container
    return best


def authorize(url: str, base: str | None, containers: Iterable[Container], key: str) -> tuple[str, Container]:
    """The normalised ``url`` and its container; AccessDenied naming the reference and the missing grant."""
    real = normalize(url, base)
    container = containing(real, containers)
    if container is None:
        grant = real.rsplit("/", 1)[0] + "/"
        raise AccessDenied(
            f"key {key!r} refers to {url!r} ({real}), which is outside every authorised container: "
            f"grant it with containers=[{grant!r}] (Python) or --allow {grant} (command line)"
        )
    return real, container


def as_containers(grants: object) -> list[Container]:
    """Containers from what a user passes: prefixes, Container objects, or ``{prefix: options}``."""
    if grants is None:
        return []
    if isinstance(grants, str | Container):
        grants = [grants]
    if isinstance(grants, Mapping):
        return [Container(prefix, dict(options or {})) for prefix, options in grants.items()]
    return [g if isinstance(g, Container) else Container(str(g)) for g in grants]
