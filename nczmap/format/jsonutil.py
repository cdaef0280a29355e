"""JSON as netcdf-c reads and writes it.

Reading is lenient where netcdf-c has written non-standard JSON (bare ``NaN``/``Infinity``, numbers such
as ``0.`` or ``+5``). Numbers keep the text they were written with (:class:`NumberText`), so a JSON value
shown as text (netcdf-c's "JSON convention" char attributes) is reproduced as netcdf-c prints it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

from nczmap.errors import FormatError


class FloatText(float):
    """A JSON float that remembers its source text."""

    text: str

    def __new__(cls, text: str) -> FloatText:
        try:
            number = float(text)
        except ValueError:
            number = _float_value(text)
        value = super().__new__(cls, number)
        value.text = text
        return value


class IntText(int):
    """A JSON integer that remembers its source text."""

    text: str

    def __new__(cls, text: str) -> IntText:
        value = super().__new__(
            cls, int(text, 0) if text.lower().startswith(("0x", "+0x", "-0x")) else int(text)
        )
        value.text = text
        return value


def special_float(text: str) -> float | None:
    """The value of netcdf-c's NaN/Infinity spellings (any case, optional sign, ``f`` suffix), else None."""
    lowered = text.strip().lower()
    body = lowered.lstrip("+-")
    if body in ("nan", "nanf"):
        return math.nan
    if body in ("infinity", "infinityf", "inf"):
        return -math.inf if lowered.startswith("-") else math.inf
    return None


def _float_value(text: str) -> float:
    special = special_float(text)
    return float(text) if special is None else special


# Integers need no source text: standard JSON integers print back exactly as Python prints them.
_DECODER = json.JSONDecoder(parse_float=FloatText, parse_constant=FloatText, strict=False)
_LOOSE_NUMBER = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)")
_BARE_WORD = re.compile(r"[A-Za-z0-9_$+\-.]+")


# Floats as plain ``float``: the C scanner makes them without calling back into Python, several times faster
# than :class:`FloatText`. For metadata read to build a model, where the source text of a float matters only
# in the rare value shown as JSON text: the reader parses such a document again with :func:`loads`.
_PLAIN_DECODER = json.JSONDecoder(strict=False)


def loads(text: str | bytes, where: str | Callable[[], str] = "") -> object:
    """Parse JSON text; strict JSON first, then netcdf-c's lenient grammar."""
    return _loads(text, where, _DECODER)


def loads_plain(text: str | bytes, where: str | Callable[[], str] = "") -> object:
    """:func:`loads`, but strict JSON floats (and ``NaN``/``Infinity``) come back as plain ``float``
    without their source text (:func:`holds_plain_float` tells whether a value has any)."""
    return _loads(text, where, _PLAIN_DECODER)


def holds_plain_float(value: object) -> bool:
    """Whether ``value`` holds a float whose source text was not kept (from :func:`loads_plain`)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if type(item) is float:
            return True
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _loads(text: str | bytes, where: str | Callable[[], str], decoder: json.JSONDecoder) -> object:
    if isinstance(text, bytes):
        # bytes that are not UTF-8 (a char attribute netcdf-c wrote from a Latin-1 file) kept as they are
        text = text.decode("utf-8", "surrogateescape")
    try:
        return decoder.decode(text)
    except (ValueError, RecursionError):
        pass
    try:
        parser = _LenientParser(text)
        value = parser.value()
        parser.end()
        return value
    except (ValueError, IndexError, RecursionError) as exc:
        place = where() if callable(where) else where
        raise FormatError(f"invalid JSON in {place or 'metadata'}: {exc}") from None


class _LenientParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def end(self) -> None:
        self.skip()
        if self.pos != len(self.text):
            raise ValueError(f"unexpected text at offset {self.pos}")

    def value(self) -> object:
        self.skip()
        char = self.text[self.pos]
        if char == "{":
            return self.obj()
        if char == "[":
            return self.array()
        if char == '"':
            return self.string()
        return self.word()

    def obj(self) -> dict:
        self.pos += 1
        result: dict = {}
        self.skip()
        if self.text[self.pos] == "}":
            self.pos += 1
            return result
        while True:
            self.skip()
            key = self.string() if self.text[self.pos] == '"' else str(self.word())
            self.skip()
            if self.text[self.pos] != ":":
                raise ValueError(f"expected ':' at offset {self.pos}")
            self.pos += 1
            result[key] = self.value()
            if self.separator("}"):
                return result

    def array(self) -> list:
        self.pos += 1
        result: list = []
        self.skip()
        if self.text[self.pos] == "]":
            self.pos += 1
            return result
        while True:
            result.append(self.value())
            if self.separator("]"):
                return result

    def separator(self, closer: str) -> bool:
        self.skip()
        char = self.text[self.pos]
        self.pos += 1
        if char == closer:
            return True
        if char != ",":
            raise ValueError(f"expected ',' or {closer!r} at offset {self.pos - 1}")
        return False

    def string(self) -> str:
        end = self.pos + 1
        while self.text[end] != '"':
            end += 2 if self.text[end] == "\\" else 1
        raw = self.text[self.pos : end + 1]
        self.pos = end + 1
        try:
            return json.loads(raw, strict=False)
        except ValueError:
            return raw[1:-1]  # netcdf-c writes control characters raw

    def word(self) -> object:
        match = _BARE_WORD.match(self.text, self.pos)
        if not match:
            raise ValueError(f"unexpected character {self.text[self.pos]!r} at offset {self.pos}")
        self.pos = match.end()
        word = match.group()
        lowered = word.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        if lowered == "null":
            return None
        if lowered.lstrip("+-") in ("nan", "nanf", "infinity", "infinityf", "inf"):
            return FloatText(word)
        if _LOOSE_NUMBER.fullmatch(word):
            is_int = not any(c in word for c in ".eE") or word.lower().lstrip("+-").startswith("0x")
            return IntText(word) if is_int else FloatText(word)
        return word  # netcdf-c accepts bare words as strings


def _escape(text: str) -> str:
    out = []
    for char in text:
        out.append(
            {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(
                char, char
            )
        )
    return "".join(out)


MAX_TEXT_DEPTH = 200  # JSON nested deeper is refused, whatever this Python's recursion limit allows


def netcdf_text(value: object) -> str:
    """Serialise a parsed value the way netcdf-c prints JSON text: ``{"k": v, ...}``, ``[a,b]``."""
    if _depth_exceeds(value, MAX_TEXT_DEPTH):
        raise FormatError(f"a JSON value is nested too deeply to be shown as text (over {MAX_TEXT_DEPTH})")
    return _text(value)


def _depth_exceeds(value: object, limit: int) -> bool:
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return False


def _text(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{_escape(str(k))}": {_text(v)}' for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + _escape(value) + '"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = getattr(value, "text", None)
    return text if text is not None else repr(value)
