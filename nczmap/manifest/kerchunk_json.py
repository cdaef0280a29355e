"""kerchunk's JSON reference format, version 0 and 1 (kerchunk ``docs/source/spec.rst``).

Version 0 is a flat ``{key: value}`` object; version 1 is ``{"version": 1, "templates": {...},
"refs": {...}}``. A value is text (``base64:`` for binary), a JSON object (metadata), ``[url]`` (a whole
object) or ``[url, offset, length]``. ``gen`` entries (jinja-generated references) are refused. Loading
keeps values as parsed and resolves each on first use, so a million references load as fast as the JSON
parses.

nczmap writes version 1, which other readers read unchanged; the source-validation data it needs (size and
modification time or ETag per source) goes in a top-level ``"nczmap"`` object that they ignore.
"""

from __future__ import annotations

import base64
import json

from nczmap.errors import FormatError
from nczmap.manifest.model import WHOLE, Manifest, Reference, checked_sources

EXTENSION = "nczmap"  # top-level key of nczmap's additions (ignored by kerchunk and fsspec)


def _parser():
    """ujson where it is installed (kerchunk brings it; a third faster on a million references)."""
    try:
        import ujson

        return ujson.loads
    except ImportError:
        return json.loads


def load(data: bytes, where: str) -> Manifest:
    """The manifest in kerchunk JSON ``data`` (``where`` names it in errors)."""
    try:
        document = _parser()(data)
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{where} is not kerchunk JSON: {exc}") from None
    if not isinstance(document, dict):
        kind = type(document).__name__
        raise FormatError(f"{where}: kerchunk references must be a JSON object, not {kind}")
    version = document.get("version")
    if version is None:
        manifest = Manifest()
        manifest.entries = _checked_refs(document, where)
        return manifest
    if version != 1:
        raise FormatError(f"{where}: kerchunk reference version {version!r} is not 0 or 1")
    if document.get("gen"):
        raise FormatError(
            f"{where}: 'gen' (generated references) is not supported; expand them first, for example "
            "with kerchunk, and write the references out"
        )
    templates = document.get("templates") or {}
    if not isinstance(templates, dict) or not all(isinstance(v, str) for v in templates.values()):
        raise FormatError(f"{where}: 'templates' must be an object of strings")
    manifest = Manifest(templates)
    manifest.entries = _checked_refs(document.get("refs") or {}, where)
    extension = document.get(EXTENSION)
    if isinstance(extension, dict) and "sources" in extension:
        manifest.sources.update(checked_sources(extension["sources"], where))
    return manifest


def _checked_refs(refs: object, where: str) -> dict[str, object]:
    """The references as loaded (a million of them are not copied), keys without a leading ``/``."""
    if not isinstance(refs, dict):
        raise FormatError(f"{where}: 'refs' must be a JSON object")
    if any(key.startswith("/") for key in refs):
        return {key.lstrip("/"): value for key, value in refs.items()}
    return refs


def dump(manifest: Manifest) -> bytes:
    """Version 1 JSON of ``manifest``: metadata as text, binary inline data as ``base64:``."""
    refs: dict[str, object] = {}
    for key, entry in manifest.references():
        if isinstance(entry, Reference):
            refs[key] = [entry.url] if entry.length == WHOLE else [entry.url, entry.offset, entry.length]
        else:
            refs[key] = _inline_value(entry)
    document: dict[str, object] = {"version": 1, "refs": refs}
    if manifest.sources:
        document[EXTENSION] = {"sources": manifest.sources}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _inline_value(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")
    return "base64:" + base64.b64encode(data).decode("ascii") if text.startswith("base64:") else text
