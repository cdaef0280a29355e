"""zmap key syntax: ``'/' | ('/' segment)+`` with no ``.``/``..``/empty segments, no control characters
and no backslash (a path separator to Windows tools: a zip member ``a\\..\\x`` extracted there escapes).

Every driver goes through these functions, so no key can name anything outside the dataset root.
"""

from __future__ import annotations

import re

from nczmap.errors import KeyNameError

ROOT = "/"
# Drivers stage writes in files with this prefix; such names are never keys and never listed.
TEMP_PREFIX = ".nczmap-tmp-"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Anything that makes a key body (the key without its leading "/") illegal, in one search: an empty, "." or
# ".." segment, a reserved temporary name, a control character, a backslash or a lone surrogate (not UTF-8
# encodable).
_ILLEGAL_BODY = re.compile(
    r"(?:^|/)(?:\.{0,2}(?:/|$)|" + re.escape(TEMP_PREFIX) + r")|[\x00-\x1f\x7f\\\ud800-\udfff]"
)


def _check_segment(key: str, segment: str) -> None:
    if segment in ("", ".", ".."):
        raise KeyNameError(f"illegal key {key!r}: empty, '.' or '..' segment")
    if segment.startswith(TEMP_PREFIX):
        raise KeyNameError(f"illegal key {key!r}: names starting with {TEMP_PREFIX!r} are reserved")


def _check_text(key: object) -> str:
    if not isinstance(key, str):
        raise KeyNameError(f"a zmap key must be a str, not {type(key).__name__}: {key!r}")
    if _CONTROL.search(key):
        raise KeyNameError(f"illegal key {key!r}: NUL or control character")
    if "\\" in key:
        raise KeyNameError(f"illegal key {key!r}: backslash (a path separator on Windows)")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise KeyNameError(f"illegal key {key!r}: not encodable as UTF-8") from exc
    return key


def normalize_key(key: str) -> str:
    """Return the canonical form of an object key (leading ``/``, no trailing ``/``); ``/`` is the root."""
    if key in ("", ROOT):
        return ROOT
    if not isinstance(key, str):
        _check_text(key)
    body = key[1:] if key.startswith("/") else key
    if _ILLEGAL_BODY.search(body):
        _explain(key, body)
    return "/" + body


def _explain(key: str, body: str) -> None:
    """Raise the precise error for a key the fast check refused."""
    _check_text(key)
    for segment in body.split("/"):
        _check_segment(key, segment)
    raise KeyNameError(f"illegal key {key!r}")


def normalize_prefix(prefix: str) -> str:
    """Like :func:`normalize_key`, but a single trailing ``/`` is accepted (``/a/`` is ``/a``)."""
    _check_text(prefix)
    if len(prefix) > 1 and prefix.endswith("/"):
        prefix = prefix[:-1]
    return normalize_key(prefix)


def is_listable_name(name: str) -> bool:
    """True if a directory entry's name (never empty, never containing ``/``) can be used in a key."""
    return _ILLEGAL_BODY.search(name) is None


def is_valid_key(key: str) -> bool:
    try:
        normalize_key(key)
    except KeyNameError:
        return False
    return True


def join(prefix: str, name: str) -> str:
    return prefix + name if prefix == ROOT else f"{prefix}/{name}"


def parent_and_name(key: str) -> tuple[str, str]:
    head, _, name = key.rpartition("/")
    return (head or ROOT), name


def ancestors(key: str) -> list[str]:
    """Every proper ancestor of a normalised key, nearest first, ending with the root."""
    result = []
    while key != ROOT:
        key, _ = parent_and_name(key)
        result.append(key)
    return result


def sort_names(names) -> list[str]:
    """Bytewise ascending order of the UTF-8 names (code-point order is the same order)."""
    return sorted(names)
