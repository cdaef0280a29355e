"""kerchunk's JSON reference format, version 0 and 1 (kerchunk ``docs/source/spec.rst``).

Version 0 is a flat ``{key: value}`` object; version 1 is ``{"version": 1, "templates": {...},
"refs": {...}}``. A value is text (``base64:`` for binary), a JSON object (metadata), ``[url]`` (a whole
object) or ``[url, offset, length]``. ``gen`` entries (jinja-generated references) are refused.

A JSON manifest is parsed whole (JSON cannot be read in parts): its cost grows with the references it holds,
where a Parquet manifest's grows with the chunks read. After parsing, the references of every array with a
``.zarray`` (``.``-separated chunk keys, a grid of fewer than 2**62 chunks) are moved into compact columns
(:class:`~nczmap.manifest.model.ArrayReferences`: a URL number, offset and length per chunk, about 20
bytes) and the parsed objects are let go; every other value (metadata, inline data, anything malformed,
whose error then comes when its key is read, as before) stays as parsed and is resolved on first use.

nczmap writes version 1, which other readers read unchanged; the source-validation data it needs (size and
modification time or ETag per source) goes in a top-level ``"nczmap"`` object that they ignore.
"""

from __future__ import annotations

import base64
import json
import math
import re
from itertools import compress, repeat
from operator import getitem, itemgetter, not_

from nczmap._lazy import numpy as np
from nczmap.errors import FormatError
from nczmap.manifest import kerchunk_scan
from nczmap.manifest.model import (
    MAX_CHUNKS,
    MAX_OFFSET,
    WHOLE,
    ArrayReferences,
    Manifest,
    Page,
    Reference,
    checked_url,
    chunk_grid,
    chunk_numbers,
    expand,
    extension_of,
    flat_numbers,
    parsed_indices,
    read_extension,
)

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
    document, scanned = _parsed(data, where)
    if scanned is not None:
        manifest = _from_scan(document, scanned, where)
        if manifest is not None:
            return manifest
        document = _parsed(data, where, scan=False)[0]  # something unusual: the ordinary way
    return _from_document(document, where)


def _parsed(data: bytes, where: str, scan: bool = True):
    """The document (its common references taken out as columns by :mod:`.kerchunk_scan` when it is
    large), and what the scan found (None: parsed whole)."""

    def parse(text: bytes) -> object:
        try:
            return _parser()(text)
        except (ValueError, RecursionError) as exc:
            raise FormatError(f"{where} is not kerchunk JSON: {exc}") from None

    scanned = kerchunk_scan.scan(data, parse) if scan else None
    return (scanned.document, scanned) if scanned is not None else (parse(data), None)


def _from_scan(document: object, scanned: kerchunk_scan.Scanned, where: str) -> Manifest | None:
    """The manifest of a scanned document, or None unless every reference taken out is a chunk of an
    array of the references object."""
    if not isinstance(document, dict):
        return None
    refs = document.get("refs") if document.get("version") is not None else document
    if not isinstance(refs, dict) or not kerchunk_scan.marker_only_in(refs, document):
        return None
    del refs[""]
    manifest = _from_document(document, where, tabulate=False)
    grids = _grids(manifest.entries)
    tables = kerchunk_scan.tables(scanned.candidates, grids, manifest.templates)
    if tables is None or _shadowed(manifest.entries, tables):
        return None
    manifest.arrays.update(tables)
    return manifest


def _shadowed(entries: dict[str, object], tables: dict[str, ArrayReferences]) -> bool:
    """Whether a key left in ``entries`` names a chunk a table holds too (a key given twice, differently
    spelled or valued: which one JSON meant is the ordinary parse's to say)."""
    for key in entries:
        array, _, name = key.rpartition("/")
        table = tables.get(array)
        if table is not None and (flat := table.position(name)) is not None and table.get(flat) is not None:
            return True
    return False


def _from_document(document: object, where: str, tabulate: bool = True) -> Manifest:
    if not isinstance(document, dict):
        kind = type(document).__name__
        raise FormatError(f"{where}: kerchunk references must be a JSON object, not {kind}")
    version = document.get("version")
    if version is None:
        manifest = Manifest()
        manifest.where = where
        manifest.entries = _checked_refs(document, where)
        if tabulate:
            _tabulate(manifest)
        return manifest
    if version != 1:
        raise FormatError(f"{where}: kerchunk reference version {version!r} is not 0 or 1")
    if document.get("gen"):
        raise FormatError(
            f"{where}: 'gen' (generated references) is not supported; expand them first, for example "
            "with kerchunk, and write the references out"
        )
    extension = document.get(EXTENSION)
    templates = document.get("templates") or {}
    if not isinstance(templates, dict) or not all(isinstance(v, str) for v in templates.values()):
        raise FormatError(f"{where}: 'templates' must be an object of strings")
    manifest = Manifest(templates)
    manifest.where = where
    manifest.entries = _checked_refs(document.get("refs") or {}, where)
    del document  # the parsed references are let go as they are tabulated
    if tabulate:
        _tabulate(manifest)
    read_extension(manifest, extension, where)
    return manifest


def _tabulate(manifest: Manifest) -> None:
    """Move the references of every array with a usable ``.zarray`` into its table, in place. The passes
    over every key are ``map``/``compress`` of C functions: a few per million keys cost tenths of a second."""
    entries = manifest.entries
    grids = _grids(entries)
    if not grids:
        return
    heads = list(map(itemgetter(0), map(str.rpartition, entries, repeat("/"))))
    loose = list(compress(entries, map(not_, map(grids.__contains__, heads))))
    for array, grid in grids.items():
        if len(grids) == 1:
            keys = list(compress(entries, map(grids.__contains__, heads)))
        else:
            keys = list(compress(entries, map(array.__eq__, heads)))
        table, kept = _table(entries, array, keys, grid, manifest.templates)
        loose.extend(kept)
        if table is not None:
            manifest.arrays[array] = table
    manifest.entries = {key: entries[key] for key in loose}  # a new dict: the old one's table is let go


def _grids(entries: dict[str, object]) -> dict[str, tuple[int, ...]]:
    """The chunk grid of every array with a usable ``.zarray`` (fewer than MAX_CHUNKS chunks)."""
    grids = {}
    for key in compress(entries, map(str.endswith, entries, repeat("/.zarray"))):
        grid = _grid(entries[key])
        if grid is not None and math.prod(grid) < MAX_CHUNKS:
            grids[key[: -len("/.zarray")]] = grid
    return grids


def _grid(zarray: object) -> tuple[int, ...] | None:
    """The chunk grid of a ``.zarray`` value (text or object), None unless :func:`chunk_grid` makes one
    (such an array's keys stay as they are)."""
    if isinstance(zarray, str):
        try:
            zarray = json.loads(zarray)
        except (ValueError, RecursionError):
            return None
    try:
        return chunk_grid(zarray)
    except ValueError:
        return None


def _table(
    entries: dict[str, object], array: str, keys: list[str], grid: tuple[int, ...], templates: dict[str, str]
) -> tuple[ArrayReferences | None, list[str]]:
    """The table of ``array``'s references among ``keys`` (all ``array/...``), and the keys left loose."""
    start = len(array) + 1
    digit = list(map(str.isdigit, map(getitem, keys, repeat(slice(start, start + 1)))))  # not .zarray...
    loose = list(compress(keys, map(not_, digit)))
    if loose:
        keys = list(compress(keys, digit))
    flats = chunk_numbers_of_keys(keys, start, grid)
    found = (flats >= 0).tolist()
    if not all(found):
        loose.extend(compress(keys, map(not_, found)))
        keys, flats = list(compress(keys, found)), flats[flats >= 0]
    urls, codes, offsets, lengths, good = _columns(list(map(entries.__getitem__, keys)), templates, array)
    if not good.any():
        return None, loose + keys
    if not good.all():
        loose.extend(compress(keys, map(not_, good.tolist())))
    order = np.argsort(flats[good])
    rows = flats[good][order]
    page = Page.build(0, rows, codes[good][order], offsets[good][order], lengths[good][order], urls)
    table = ArrayReferences(grid)
    table.hold(0, page)
    return table, loose


def chunk_numbers_of_keys(keys: list[str], start: int, grid: tuple[int, ...]) -> np.ndarray:
    """:func:`~nczmap.manifest.model.chunk_numbers` of ``key[start:]`` for keys sharing their first
    ``start`` characters (an array's path and ``/``), without making a string per name."""
    if not keys:
        return np.zeros(0, dtype=np.int64)
    prefix = keys[0][:start]
    if "\n" not in prefix:
        text = "\n".join(keys)[start:].replace("\n" + prefix, "\n")
        values = parsed_indices(text, len(keys), max(len(grid), 1), ".")
        if values is not None:
            return flat_numbers(values, grid)
    return chunk_numbers([key[start:] for key in keys], grid)


def _columns(values: list, templates: dict[str, str], array: str):
    """URLs (expanded and checked), and per value its URL number, offset, length and whether it is a
    reference (``[url, offset, length]`` or ``[url]``) that goes into the table."""
    count = len(values)
    columns = _fast_columns(values) if count else None
    if columns is None:  # mixed values: one at a time
        columns = _slow_columns(values)
    urls, offsets, lengths, good = columns
    unique = list(dict.fromkeys(urls))
    numbers = {url: at for at, url in enumerate(unique)}
    codes = np.fromiter(map(numbers.__getitem__, urls), dtype=np.int64, count=count)
    usable = np.ones(len(unique) + 1, dtype=bool)
    usable[-1] = False  # the number of a value that is no reference
    expanded = []
    for at, url in enumerate(unique):
        try:
            expanded.append(checked_url(expand(url, templates, array), array))
        except FormatError:  # left as parsed: reading the key gives the error
            expanded.append("")
            usable[at] = False
    good &= usable[np.where(good, codes, -1)]
    return expanded, codes, offsets, lengths, good


def _fast_columns(values: list):
    """The columns when every value is ``[text, int, int]`` (what references of one array usually are),
    from C loops; None otherwise."""
    if set(map(type, values)) != {list}:
        return None
    try:
        urls, offsets, lengths = zip(*values, strict=True)
    except ValueError:  # lists of other lengths
        return None
    if set(map(type, urls)) != {str} or set(map(type, offsets)) != {int} or set(map(type, lengths)) != {int}:
        return None
    try:
        offsets, lengths = np.array(offsets, dtype=np.int64), np.array(lengths, dtype=np.int64)
    except OverflowError:
        return None
    return list(urls), offsets, lengths, (offsets >= 0) & (lengths >= 0)


def _slow_columns(values: list):
    count = len(values)
    urls = [""] * count
    offsets = np.zeros(count, dtype=np.int64)
    lengths = np.zeros(count, dtype=np.int64)
    good = np.zeros(count, dtype=bool)
    for at, value in enumerate(values):
        if type(value) is not list or not value or type(value[0]) is not str:
            continue
        if len(value) == 1:
            urls[at], lengths[at], good[at] = value[0], WHOLE, True
        elif len(value) == 3 and _is_range(value[1], value[2]):
            urls[at], offsets[at], lengths[at], good[at] = value[0], value[1], value[2], True
    return urls, offsets, lengths, good


def _is_range(offset: object, length: object) -> bool:
    return (
        type(offset) is int
        and type(length) is int
        and 0 <= offset <= MAX_OFFSET
        and 0 <= length <= MAX_OFFSET
    )


def _checked_refs(refs: object, where: str) -> dict[str, object]:
    """The references as loaded (a million of them are not copied), keys without a leading ``/``."""
    if not isinstance(refs, dict):
        raise FormatError(f"{where}: 'refs' must be a JSON object")
    if any(map(str.startswith, refs, repeat("/"))):
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
    extension = extension_of(manifest)
    if extension:
        document[EXTENSION] = extension
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # not text; \t \n \r are JSON's whitespace


def _inline_value(data: bytes) -> str:
    """Inline bytes as text when they are printable UTF-8 text (metadata), else ``base64:``: GDAL's
    reference parser (and kerchunk's) cuts a JSON string at its first NUL, so raw chunk bytes that happen
    to be UTF-8 (small integers: a series' ``time``) must not be written as text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")
    if text.startswith("base64:") or _CONTROL.search(text):
        return "base64:" + base64.b64encode(data).decode("ascii")
    return text
