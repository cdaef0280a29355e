"""The ``s3`` driver: a dataset under a key prefix of an S3 bucket, through obstore.

Requests are few: ``read`` is one GET (a range GET with ``start``/``count``) and answers "no content" by
its 404, so reading metadata never needs a HEAD; ``search`` is one delimiter listing; sizes and
existence learnt from listings and reads are remembered. Writes are single atomic PUTs (multipart for large
objects). A writable open lists the dataset once, so objects-are-leaves is checked locally. Unlike netcdf-c
(bug 7) a missing bucket is an error, never created.
"""

from __future__ import annotations

import configparser
import os
import re
import threading
from datetime import timedelta

from nczmap.concurrency import WIDTH
from nczmap.errors import (
    AccessDenied,
    DatasetExists,
    DatasetNotFound,
    DriverNotAvailable,
    EmptyError,
    KeyNameError,
    StorageError,
)
from nczmap.url import ParsedURL
from nczmap.zmap.base import STORE_MARKERS, ZMap
from nczmap.zmap.index import KeyIndex
from nczmap.zmap.keys import ROOT, sort_names
from nczmap.zmap.memory import check_leaf

MAX_KEY_BYTES = 1024
MULTIPART_BYTES = 32 << 20  # larger objects go up in parts (still atomic: visible only when complete)
PART_BYTES = 8 << 20
ANONYMOUS_PROFILES = ("no", "none", "anonymous")
CLIENT_OPTIONS = {"timeout": "15s", "connect_timeout": "5s"}  # with the retry limit: no hang past ~20 s
RETRIES = {"max_retries": 2, "retry_timeout": timedelta(seconds=10)}


class S3Map(ZMap):
    driver = "s3"
    io_width = WIDTH  # round trips: overlap their latency

    def __init__(self, url: ParsedURL, mode: str) -> None:
        super().__init__(url, mode)
        self.bucket = url.bucket or ""
        self.root = url.path.strip("/")
        self._store = _make_store(url)
        self._sizes: dict[str, int] = {}  # key -> size, for objects known to exist
        self._lock = threading.Lock()
        self._index: KeyIndex | None = None  # every key, for writable maps
        if mode != "r":
            self._open_writable()

    # ----------------------------------------------------------------- naming and errors
    def _object(self, key: str) -> str:
        """The S3 object key of a zmap key (refused before any request when S3 could not hold it)."""
        path = key[1:] if not self.root else self.root + key
        if len(path.encode()) > MAX_KEY_BYTES:
            raise KeyNameError(
                f"key {key!r} of {self.location} makes an S3 key of {len(path.encode())} "
                f"bytes; S3 allows {MAX_KEY_BYTES}"
            )
        return path

    def _key_of(self, path: str) -> str:
        return "/" + (path[len(self.root) + 1 :] if self.root else path)

    def _error(self, exc: Exception, action: str, key: str = "") -> Exception:
        import obstore.exceptions as errors

        where = f"{action} {key!r} in {self.location}" if key else f"{action} {self.location}"
        text = str(exc)
        code = _s3_code(text)
        if code == "NoSuchBucket":
            return DatasetNotFound(f"cannot {where}: bucket {self.bucket!r} does not exist")
        if isinstance(exc, FileNotFoundError):
            return EmptyError(key, self.location)
        denied = code in _DENIED_CODES or "403 Forbidden" in text
        if denied or isinstance(exc, (errors.PermissionDeniedError, errors.UnauthenticatedError)):
            return AccessDenied(f"cannot {where}: access denied ({code or _first_line(text)})")
        return StorageError(f"cannot {where}: {_first_line(text)}" + (f" ({code})" if code else ""))

    # ----------------------------------------------------------------- opening
    def _open_writable(self) -> None:
        objects = self._list_all(self.root + "/" if self.root else None, "open")
        self._index = KeyIndex()
        for path, size in objects:
            key = self._key_of(path)
            self._sizes[key] = size
            self._index.add(key)
        if self.mode == "r+" and not objects:
            raise DatasetNotFound(f"no dataset at {self.location}")
        if self.mode == "w" and objects:
            if not any(
                marker in self._index.children(ROOT) and f"/{marker}" in self._sizes
                for marker in STORE_MARKERS
            ):
                raise DatasetExists(
                    f"refusing to create a dataset at {self.location}: objects are there "
                    "and none is a Zarr/NCZarr root (.zgroup, .zarray, .zattrs, ...)"
                )
            self._truncate()

    def _list_all(self, prefix: str | None, action: str) -> list[tuple[str, int]]:
        import obstore

        try:
            return [
                (meta["path"], meta["size"])
                for batch in obstore.list(self._store, prefix=prefix)
                for meta in batch
            ]
        except Exception as exc:  # obstore raises builtins and its own classes
            raise self._error(exc, action) from exc

    # ----------------------------------------------------------------- primitives
    def _exists(self, key: str) -> bool:
        self._object(key)
        if key in self._sizes:
            return True
        if self._index is not None:
            return False
        try:
            self._len(key)
        except EmptyError:
            return False
        return True

    def _len(self, key: str) -> int:
        size = self._sizes.get(key)
        if size is not None:
            return size
        path = self._object(key)
        if self._index is not None:
            raise EmptyError(key, self.location)
        import obstore

        try:
            size = obstore.head(self._store, path)["size"]
        except Exception as exc:
            raise self._error(exc, "size", key) from exc
        self._sizes[key] = size
        return size

    def _read(self, key: str, start: int, count: int | None) -> bytes:
        import obstore

        path = self._object(key)
        if self._index is not None and key not in self._sizes:
            raise EmptyError(key, self.location)
        try:
            if count is None and not start:
                result = obstore.get(self._store, path)
                self._sizes[key] = result.meta["size"]
                return bytes(result.bytes())
            if count == 0 or (key in self._sizes and start >= self._sizes[key]):
                self._len(key)  # still "no content" for a missing key
                return b""
            length = count if count is not None else self._len(key) - start
            return bytes(obstore.get_range(self._store, path, start=start, length=length))
        except EmptyError:
            raise
        except Exception as exc:
            if _starts_past_end(str(exc)):
                self._len(key)
                return b""
            raise self._error(exc, "read", key) from exc

    def _write(self, key: str, data: memoryview) -> None:
        import obstore

        path = self._object(key)
        with self._lock:
            if self._index is not None:
                check_leaf(self._index, self._sizes, key, self.location)
        try:
            obstore.put(
                self._store, path, data, use_multipart=len(data) > MULTIPART_BYTES, chunk_size=PART_BYTES
            )
        except Exception as exc:
            raise self._error(exc, "write", key) from exc
        with self._lock:
            self._sizes[key] = len(data)
            if self._index is not None:
                self._index.add(key)

    def _search(self, prefix: str) -> list[str]:
        import obstore

        base = self._object(prefix) if prefix != ROOT else ""
        listing_prefix = (base + "/") if base else (self.root + "/" if self.root else None)
        try:
            result = obstore.list_with_delimiter(self._store, prefix=listing_prefix)
        except Exception as exc:
            raise self._error(exc, "list", prefix) from exc
        skip = len(listing_prefix or "")
        names = {p[skip:].rstrip("/").split("/", 1)[0] for p in result["common_prefixes"]}
        for meta in result["objects"]:
            name = meta["path"][skip:]
            if name and "/" not in name:
                names.add(name)
                self._sizes[self._key_of(meta["path"])] = meta["size"]
        names.discard("")
        return sort_names(names)

    def _delete(self, key: str) -> None:
        path = self._object(key)
        doomed = [p for p, _ in self._list_all(path + "/", "delete")]
        if key in self._sizes or self._index is None:
            doomed.append(path)
        self._delete_paths(doomed, key)
        with self._lock:
            for p in doomed:
                self._sizes.pop(self._key_of(p), None)
            if self._index is not None:
                self._index.remove(key, self._sizes.__contains__)

    def _delete_paths(self, paths: list[str], key: str) -> None:
        import obstore

        try:
            for start in range(0, len(paths), 1000):
                obstore.delete(self._store, paths[start : start + 1000])
        except Exception as exc:
            raise self._error(exc, "delete", key) from exc

    def _truncate(self) -> None:
        paths = [p for p, _ in self._list_all(self.root + "/" if self.root else None, "truncate")]
        self._delete_paths(paths, ROOT)
        self._sizes.clear()
        if self._index is not None:
            self._index = KeyIndex()

    def _close(self, delete: bool) -> None:
        if delete:
            self._truncate()


_DENIED_CODES = (
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
)
_CODE = re.compile(r"<Code>([^<]+)</Code>")


def _starts_past_end(text: str) -> bool:
    """True for S3's answer to a range that starts past the object's end (416 / InvalidRange)."""
    return _s3_code(text) == "InvalidRange" or "416 Range Not Satisfiable" in text


def _s3_code(text: str) -> str | None:
    """The S3 error code (``NoSuchBucket``, ``SlowDown``...) in an error's response body, if shown."""
    match = _CODE.search(text)
    return match.group(1) if match else None


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"


def _make_store(url: ParsedURL):
    try:
        from obstore.store import S3Store
    except ImportError as exc:
        raise DriverNotAvailable(f"{url.original!r} needs obstore: pip install obstore") from exc
    config: dict = {"region": _region(url)}
    client = dict(CLIENT_OPTIONS)
    if url.endpoint:
        config["endpoint"] = url.endpoint
        config["virtual_hosted_style_request"] = False
        client["allow_http"] = url.endpoint.startswith("http://")
    profile = url.profile or os.environ.get("AWS_PROFILE")
    if profile and profile.lower() in ANONYMOUS_PROFILES:
        config["skip_signature"] = True
    elif not os.environ.get("AWS_ACCESS_KEY_ID"):
        config.update(_profile_credentials(profile or "default"))
    return S3Store(url.bucket, config=config, client_options=client, retry_config=RETRIES)


def _region(url: ParsedURL) -> str:
    profile = url.profile or os.environ.get("AWS_PROFILE") or "default"
    return (
        url.region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or _profile_settings(profile).get("region")
        or "us-east-1"
    )


def _profile_settings(profile: str) -> dict[str, str]:
    """The named profile's settings from ``~/.aws/config`` and ``~/.aws/credentials`` (as netcdf-c reads)."""
    home = os.path.expanduser("~")
    files = (
        (os.environ.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"), f"profile {profile}"),
        (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"), profile),
    )
    settings: dict[str, str] = {}
    for path, section in files:
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError):
            continue
        for name in (section, profile):
            if parser.has_section(name):
                settings.update(parser[name])
    return settings


def _profile_credentials(profile: str) -> dict[str, str]:
    settings = _profile_settings(profile)
    names = {
        "aws_access_key_id": "access_key_id",
        "aws_secret_access_key": "secret_access_key",
        "aws_session_token": "session_token",
    }
    return {ours: settings[theirs] for theirs, ours in names.items() if settings.get(theirs)}
