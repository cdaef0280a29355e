"""Reading a large kerchunk JSON manifest's common references straight into columns (issue 19 B8).

A JSON manifest of millions of references is millions of ``"array/i.j":["url",offset,length]`` members.
Parsed as JSON, each becomes a key, a list, a URL string and two ints (hundreds of bytes, seconds per
million) before being moved into columns. Here numpy finds them in the raw bytes instead:

1. the string delimiters are the quotes not escaped (an odd run of backslashes before a quote escapes it);
   paired in order they give every string of the document;
2. a **candidate** is a string (the key) followed by ``:[`` (``: [``), a string (the URL) and ``,offset,
   length]`` (a space allowed after each comma), both decimal JSON integers of at most 18 digits; key and
   URL printable ASCII without a backslash, of at most MAX_TEXT characters;
3. the document is then checked and parsed by ``json``, with every candidate replaced by ``"":[]`` (the
   key's quotes, the colon, the brackets: a string and a value where a string and a value were, so the
   text left is valid JSON exactly when the original is). The document must hold no ``""`` key of its own,
   and every ``""`` key of the parsed rest must be the marker of the references object itself: a candidate
   anywhere else (inside a metadata object, say) sends the whole manifest the ordinary way;
4. the candidates of every array with a usable ``.zarray`` become its table (chunk numbers from the key
   text, URL numbers from runs of equal URLs, offsets and lengths from the digits), in numpy.

Anything unusual (escapes in a candidate's key, keys with a leading ``/``, a chunk key that is no chunk of
its grid, a URL that does not expand, a key given twice in different forms) makes :func:`scan` return None
and the manifest is parsed whole as before: this is a fast path, never a second dialect.
"""

from __future__ import annotations

import math
import re

from nczmap._lazy import numpy as np
from nczmap.errors import FormatError
from nczmap.manifest.model import (
    MAX_CHUNKS,
    ArrayReferences,
    Page,
    checked_url,
    expand,
    flat_numbers,
    parsed_indices,
)

MIN_SIZE = 1 << 20  # smaller manifests are parsed whole: nothing to gain
BLOCK = 1 << 22  # elements of the 2-D windows gathered at once (a few tens of MB with their indices)
MAX_DIGITS = 18
# Longest key or URL text, and longest ``,offset,length`` tail, a candidate may have: the windows gathered
# below are as wide as the longest span, so one long span among a million would cost a million times its
# length. Longer members are no candidates: they stay in the text parsed the ordinary way.
MAX_TEXT = 512
MAX_TAIL = 2 * (MAX_DIGITS + 2)  # ", " digits ", " digits
QUOTE, BACKSLASH, COLON, COMMA, SPACE, OPEN, CLOSE = (ord(c) for c in '"\\:, []')
_EMPTY_KEY = re.compile(rb'""[ \t\n\r]*:')


class Scanned:
    """What :func:`scan` found: the document without its candidates, and the candidates' columns."""

    def __init__(self, document: object, candidates: _Candidates) -> None:
        self.document = document
        self.candidates = candidates


class _Candidates:
    """Per candidate: where its key's and URL's text lie in the data, its offset and length."""

    def __init__(self, data: np.ndarray, keys, key_ends, urls, url_ends, offsets, lengths, ends) -> None:
        self.data = data
        self.keys, self.key_ends = keys, key_ends  # first character, and the closing quote
        self.urls, self.url_ends = urls, url_ends
        self.offsets, self.lengths = offsets, lengths
        self.ends = ends  # the closing bracket

    def __len__(self) -> int:
        return len(self.keys)


def scan(data: bytes, parse) -> Scanned | None:
    """The candidates of ``data`` and the rest parsed by ``parse`` (its errors, and only its, raised), or
    None when ``data`` is better parsed whole."""
    if len(data) < MIN_SIZE or _EMPTY_KEY.search(data):
        return None
    raw = np.frombuffer(data, dtype=np.uint8)
    strings = _strings(raw)
    if strings is None:
        return None
    found = _candidates(raw, *strings)
    del strings
    if found is None or not len(found):
        return None
    rest = _without(raw, found)
    del raw
    document = parse(rest)
    return Scanned(document, found)


def _strings(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Where every string opens and closes (its quotes), or None if the quotes do not pair."""
    quotes = np.flatnonzero(raw == QUOTE)
    if len(quotes) and quotes[0] == 0:
        return None  # no JSON object starts with a string
    after_backslash = quotes[raw[quotes - 1] == BACKSLASH]
    if len(after_backslash) > 100_000:
        return None
    if len(after_backslash):  # escaped where the run of backslashes before it is odd
        quotes = quotes[~np.isin(quotes, after_backslash[_run_lengths(raw, after_backslash) % 2 == 1])]
    if len(quotes) % 2:
        return None
    return quotes[0::2], quotes[1::2]


def _run_lengths(raw: np.ndarray, quotes: np.ndarray) -> np.ndarray:
    """The length of the run of backslashes that ends just before each of ``quotes`` (each has one)."""
    slashes = np.flatnonzero(raw == BACKSLASH)
    firsts = np.flatnonzero(np.diff(slashes, prepend=-2) != 1)  # where each run begins among them
    run_start = np.repeat(slashes[firsts], np.diff(np.append(firsts, len(slashes))))
    return quotes - run_start[np.searchsorted(slashes, quotes - 1)]


def _candidates(raw: np.ndarray, opens: np.ndarray, closes: np.ndarray) -> _Candidates | None:
    """The members ``"key":["url",offset,length]`` among the strings."""
    if len(opens) < 2:
        return None
    size = len(raw)
    key_close, url_open = closes[:-1], opens[1:]
    gap = url_open - key_close - 1  # what lies between the key and the URL: ":[" or ": ["
    at = [raw[np.minimum(key_close + n, size - 1)] for n in (1, 2, 3)]
    compact = (gap == 2) & (at[0] == COLON) & (at[1] == OPEN)
    spaced = (gap == 3) & (at[0] == COLON) & (at[1] == SPACE) & (at[2] == OPEN)
    chosen = np.flatnonzero(compact | spaced)
    del compact, spaced, gap, at
    if not len(chosen):
        return None
    keys, key_ends = opens[chosen] + 1, closes[chosen]
    urls, url_ends = opens[chosen + 1] + 1, closes[chosen + 1]
    brackets = np.flatnonzero(raw == CLOSE)
    where = np.searchsorted(brackets, url_ends)
    ends = np.where(where < len(brackets), brackets[np.minimum(where, len(brackets) - 1)], size)
    following = np.append(opens, size)[chosen + 2]  # the next string: the bracket must come first
    # what a key or URL taken as it is may not hold: controls, non-ASCII, backslashes
    odd = np.flatnonzero(((raw - np.uint8(0x20)) >= np.uint8(0x5F)) | (raw == BACKSLASH))  # wraps below 0x20
    good = _no_odd(odd, keys, key_ends) & _no_odd(odd, urls, url_ends) & (key_ends > keys) & (urls < url_ends)
    good &= (ends < following) & (ends - url_ends >= 5) & (ends - url_ends <= MAX_TAIL + 1)
    good &= (key_ends - keys <= MAX_TEXT) & (url_ends - urls <= MAX_TEXT)
    del odd, brackets, where, following
    chosen = np.flatnonzero(good)
    if not len(chosen):
        return None
    keys, key_ends, urls, url_ends, ends = (
        keys[chosen],
        key_ends[chosen],
        urls[chosen],
        url_ends[chosen],
        ends[chosen],
    )
    numbers = _numbers(raw, url_ends, ends)
    if numbers is None:
        return None
    return _Candidates(raw, keys, key_ends, urls, url_ends, *numbers, ends)


_NUMERIC = np.zeros(256, dtype=bool)
_NUMERIC[list(b"0123456789,\n")] = True
_FIELDS = np.array([COMMA, COMMA, 10], dtype=np.uint8)


def _no_odd(odd: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether the text of each span is printable ASCII without a backslash."""
    return np.searchsorted(odd, starts) == np.searchsorted(odd, ends)


def _numbers(raw: np.ndarray, url_ends: np.ndarray, ends: np.ndarray):
    """The ``,offset,length`` between each URL's closing quote and its bracket, or None unless every one is
    two JSON integers (no sign, no leading zero, at most 18 digits; a space allowed after each comma)."""
    text = _gathered(raw, url_ends + 1, ends)
    if b" " in text:
        text = text.replace(b", ", b",")
    chars = np.frombuffer(text, dtype=np.uint8)
    if not _NUMERIC[chars].all():
        return None
    bounds = np.flatnonzero(~_DIGIT[chars])  # commas and newlines: each line ",offset,length"
    if len(bounds) != 3 * len(url_ends) or not (chars[bounds].reshape(-1, 3) == _FIELDS).all():
        return None
    fields = bounds.reshape(-1, 3)
    for first, stop in ((fields[:, 0] + 1, fields[:, 1]), (fields[:, 1] + 1, fields[:, 2])):
        digits = stop - first
        if digits.min() < 1 or digits.max() > MAX_DIGITS or ((chars[first] == 48) & (digits > 1)).any():
            return None
    if fields[0, 0] != 0:
        return None
    values = np.fromstring(text.replace(b",", b" ").decode("ascii"), dtype=np.int64, sep=" ")
    if len(values) != 2 * len(url_ends):
        return None
    return values[0::2].copy(), values[1::2].copy()


_DIGIT = np.zeros(256, dtype=bool)
_DIGIT[48:58] = True


def _without(raw: np.ndarray, found: _Candidates) -> bytes:
    """The data with every candidate ``"key":["url",o,l]`` made ``"":[]``."""
    kept = np.zeros(len(raw), dtype=np.int8)
    kept[0] = 1
    kept[found.keys] = -1  # from the key's first character...
    kept[found.ends] = 1  # ...to the closing bracket, kept (candidates never overlap)
    kept = np.cumsum(kept, out=kept).view(bool)
    colon = found.key_ends + 1
    kept[found.key_ends] = True  # the key's closing quote
    kept[colon] = True
    kept[found.urls - 2] = True  # the opening bracket (right before the URL's quote)
    kept[colon[raw[colon + 1] == SPACE] + 1] = True  # ": [" keeps its space: nothing else differs
    return raw[kept].tobytes()


# ------------------------------------------------------------------------------------------- tables
def marker_only_in(refs: dict, document: dict) -> bool:
    """Whether the ``""`` markers are members of ``refs`` only (nowhere else in the document; ``refs`` is
    the document itself in version 0)."""
    if "" not in refs or (refs is not document and "" in document):
        return False
    others = [value for key, value in refs.items() if key]
    if refs is not document:
        others.extend(value for value in document.values() if value is not refs)
    return not any(map(_holds_empty_key, others))


def _holds_empty_key(value: object) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if "" in item:
                return True
            stack.extend(v for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, dict | list))
    return False


def tables(
    found: _Candidates, grids: dict[str, tuple[int, ...]], templates: dict[str, str]
) -> dict[str, ArrayReferences] | None:
    """The candidates as tables of the arrays of ``grids``, or None unless every candidate belongs to one
    (as a chunk of its grid, its URL usable)."""
    owner = np.full(len(found), -1, dtype=np.int64)
    names = list(grids)
    for number, array in enumerate(names):
        owner[_of_array(found, array)] = number
    if (owner < 0).any():
        return None
    result = {}
    for number, array in enumerate(names):
        chosen = np.flatnonzero(owner == number)
        if len(chosen):
            table = _table(found, chosen, array, grids[array], templates)
            if table is None:
                return None
            result[array] = table
    return result


def _of_array(found: _Candidates, array: str) -> np.ndarray:
    """The candidates whose key is ``array/`` and a name without ``/``."""
    if not array.isascii():  # candidates' keys are ASCII
        return np.zeros(0, dtype=np.int64)
    raw, prefix = found.data, np.frombuffer(array.encode("ascii") + b"/", dtype=np.uint8)
    size = len(prefix)
    chosen = np.flatnonzero(found.key_ends - found.keys > size)
    for column, byte in enumerate(prefix.tolist()):
        chosen = chosen[raw[found.keys[chosen] + column] == byte]
    return chosen


def _table(found: _Candidates, chosen: np.ndarray, array: str, grid: tuple[int, ...], templates: dict):
    if math.prod(grid) >= MAX_CHUNKS:
        return None
    start = found.keys[chosen] + len(array) + 1
    text = _gathered(found.data, start, found.key_ends[chosen])[:-1].decode("ascii")
    values = parsed_indices(text, len(chosen), max(len(grid), 1), ".")
    if values is None:
        return None
    flats = flat_numbers(values, grid)
    if (flats < 0).any():
        return None
    codes, urls = _url_numbers(found, chosen, templates, array)
    if codes is None:
        return None
    order = np.argsort(flats, kind="stable")
    flats = flats[order]
    last = np.append(flats[1:] != flats[:-1], True)  # a key given twice: the last one, as JSON says
    order = order[last]
    table = ArrayReferences(grid)
    offsets, lengths = found.offsets[chosen][order], found.lengths[chosen][order]
    table.hold(0, Page.build(0, flats[last], codes[order], offsets, lengths, urls))
    return table


def _gathered(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> bytes:
    """The texts ``raw[start:end]`` each followed by a newline, joined (in blocks of fixed-width windows)."""
    lengths = ends - starts
    width = int(lengths.max()) + 1 if len(lengths) else 1
    columns = np.arange(width, dtype=np.int64)
    rows = max(1, BLOCK // width)
    parts = []
    for first in range(0, len(starts), rows):
        part = slice(first, first + rows)
        window = _windows(raw, starts[part], width)
        window[columns == lengths[part, None]] = 10
        parts.append(window[columns <= lengths[part, None]].tobytes())
    return b"".join(parts)


def _url_numbers(found: _Candidates, chosen: np.ndarray, templates: dict, array: str):
    """Per candidate the number of its URL in the list returned (runs of equal URLs found in numpy, each
    run's URL decoded once), or (None, None) if a URL does not expand to a usable one."""
    starts, ends = found.urls[chosen], found.url_ends[chosen]
    same = _same_as_previous(found.data, starts, ends)
    runs = np.flatnonzero(~same)
    numbers: dict[bytes, int] = {}
    run_codes = np.empty(len(runs), dtype=np.int64)
    raw = found.data
    for at, row in enumerate(runs.tolist()):
        text = raw[starts[row] : ends[row]].tobytes()
        run_codes[at] = numbers.setdefault(text, len(numbers))
    urls = []
    for text in numbers:
        try:
            urls.append(checked_url(expand(text.decode("ascii"), templates, array), array))
        except FormatError:
            return None, None
    codes = np.repeat(run_codes, np.diff(np.append(runs, len(chosen))))
    return codes, urls


def _same_as_previous(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each span's text equals the one before it (the first: False)."""
    count = len(starts)
    same = np.zeros(count, dtype=bool)
    if count < 2:
        return same
    lengths = ends - starts
    same[1:] = lengths[1:] == lengths[:-1]
    width = int(lengths.max())
    columns = np.arange(width, dtype=np.int64)
    rows = max(1, BLOCK // max(width, 1))
    for first in range(1, count, rows):
        part = slice(first, min(count, first + rows))
        previous = slice(first - 1, min(count, first + rows) - 1)
        here = _windows(raw, starts[part], width)
        there = _windows(raw, starts[previous], width)
        within = columns < lengths[part, None]
        same[part] &= ((here == there) | ~within).all(axis=1)
    return same


def _windows(raw: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """``raw[start : start + width]`` for each of ``starts``, as the rows of a new array (past the end of
    ``raw``, its last byte again). Rows are copied from a sliding view, without an index per byte."""
    if len(starts) and int(starts.max()) + width <= len(raw):
        return np.lib.stride_tricks.sliding_window_view(raw, width)[starts]
    columns = np.arange(width, dtype=np.int64)
    return raw[np.minimum(starts[:, None] + columns, len(raw) - 1)]
