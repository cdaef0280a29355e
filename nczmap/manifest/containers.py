"""Which sources a manifest may reach: references are followed only under containers the user authorised.

A manifest is untrusted input (a downloaded ``refs.json`` may point at ``/home/user/.ssh/id_rsa``). A
:class:`Container` is a URL prefix (``file:///data/``, ``s3://bucket/path/``) with the options needed to
read under it (S3 endpoint, region, profile). Every reference is normalised first (percent-decoding,
``.``/``..``/empty segments, and for local files every symbolic link), then matched on whole path
segments, so no spelling escapes a container. By default only the manifest's own directory (or bucket
prefix) is a container; anything else needs an explicit grant.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from nczmap.errors import AccessDenied

SCHEMES = ("file", "s3")


@dataclass(frozen=True)
class Container:
    """A URL prefix references may be read under, and how to read there (``endpoint``, ``region``,
    ``profile`` for S3)."""

    prefix: str
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", normalize(self.prefix, None, directory=True))


def normalize(url: str, base: str | None, directory: bool = False) -> str:
    """The canonical spelling of ``url``: ``file:///real/path`` (links resolved) or ``s3://bucket/key``.

    A path without a scheme is local; relative ones are taken from ``base`` (the manifest's directory URL).
    ``directory`` keeps a trailing ``/`` (container prefixes). Raises AccessDenied for anything unusable.
    """
    text = unquote(url.strip())
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
    raise AccessDenied(f"reference {url!r}: scheme {scheme!r} cannot be read (use file or s3)")


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
