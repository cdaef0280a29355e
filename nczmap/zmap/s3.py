"""The ``s3`` driver: a dataset under a key prefix of an S3 bucket, through obstore.

Requests are few: ``read`` is one GET (a range GET with ``start``/``count``) and answers "no content" by
its 404, so reading metadata never needs a HEAD; ``search`` is one delimiter listing; sizes and
existence learnt from listings and reads are remembered. Writes are single atomic PUTs (multipart for large
objects). A writable open lists the dataset once, so objects-are-leaves is checked locally. Unlike netcdf-c
(bug 7) a missing bucket is an error, never created.
"""

from __future__ import annotations

import os
import threading

from nczmap.errors import AccessDenied, DatasetExists, DatasetNotFound, EmptyError, KeyNameError, StorageError
from nczmap.url import ParsedURL
from nczmap.zmap import byteranges
from nczmap.zmap.base import STORE_MARKERS, ByteRange, Latency, ZMap
from nczmap.zmap.index import KeyIndex
from nczmap.zmap.keys import ROOT, is_valid_key, normalize_prefix, sort_names

MAX_KEY_BYTES = 1024
MULTIPART_BYTES = 32 << 20  # larger objects go up in parts (still atomic: visible only when complete)
PART_BYTES = 8 << 20


class S3Map(ZMap):
    driver = "s3"
    latency = Latency.REMOTE

    def __init__(self, url: ParsedURL, mode: str) -> None:
        super().__init__(url, mode)
        self.bucket = url.bucket or ""
        self.root = url.path.strip("/")
        self._store = byteranges.s3_store(
            self.bucket, endpoint=url.endpoint, region=url.region, profile=url.profile
        )
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
        where = f"{action} {key!r} in {self.location}" if key else f"{action} {self.location}"
        error = byteranges.store_error(exc, where, self.bucket) or EmptyError(key, self.location)
        no_credentials = not byteranges.credentials_found(self.url.profile)
        if no_credentials and isinstance(error, AccessDenied | StorageError):  # the instance role refused
            profile = self.url.profile or os.environ.get("AWS_PROFILE") or "default"
            return AccessDenied(f"cannot {where}: {byteranges.NO_CREDENTIALS.format(profile=profile)}")
        return error

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

    def byte_ranges(self, prefix: str = ROOT) -> list[ByteRange]:
        """Every object below ``prefix`` from one listing (sizes and ETags included), in key order."""
        import obstore

        top = normalize_prefix(prefix)
        listed = self._object(top) + "/" if top != ROOT else (self.root + "/" if self.root else None)
        try:
            metas = [meta for batch in obstore.list(self._store, prefix=listed) for meta in batch]
        except Exception as exc:  # obstore raises builtins and its own classes
            raise self._error(exc, "list") from exc
        found = []
        for meta in sorted(metas, key=lambda meta: meta["path"]):
            key = self._key_of(meta["path"])
            if not is_valid_key(key):
                continue  # a name no key can spell is never listed (as search does)
            stamp = {"size": int(meta["size"]), **({"etag": meta["e_tag"]} if meta.get("e_tag") else {})}
            found.append(ByteRange(key, f"s3://{self.bucket}/{meta['path']}", 0, int(meta["size"]), stamp))
        return found

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
        try:
            size = byteranges.head_size(self._store, path)
        except Exception as exc:
            raise self._error(exc, "size", key) from exc
        self._sizes[key] = size
        return size

    def _read(self, key: str, start: int, count: int | None) -> bytes:
        path = self._object(key)
        if self._index is not None and key not in self._sizes:
            raise EmptyError(key, self.location)
        try:
            if count is None and not start:
                data, self._sizes[key] = byteranges.get_object(self._store, path)
                return data
            if count == 0 or (key in self._sizes and start >= self._sizes[key]):
                self._len(key)  # still "no content" for a missing key
                return b""
            length = count if count is not None else self._len(key) - start
            if length <= 0:
                return b""
            return byteranges.get_object_range(self._store, path, start, length)
        except EmptyError:
            raise
        except Exception as exc:
            if byteranges.starts_past_end(exc):
                self._len(key)
                return b""
            raise self._error(exc, "read", key) from exc

    def _write(self, key: str, data: memoryview) -> None:
        import obstore

        path = self._object(key)
        with self._lock:
            if self._index is not None:
                self._index.check_leaf(key, self._sizes, self.location)
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
