"""The ``manifest`` driver: a virtual dataset whose keys are inline bytes or references into other files.

Opened from the manifest's URL with the ``manifest`` mode word (``file:///d/refs.json#mode=nczarr,manifest``,
``s3://bucket/refs.json#mode=zarr,manifest``). Metadata objects and small chunks live in the manifest;
chunk keys refer to ``(url, offset, length)`` byte ranges of local files or S3 objects, read only under
authorised containers (``nczmap.manifest.containers``: the manifest's own directory by default, more with
``containers=``). A source whose recorded size, modification time or ETag changed is an error, as is one
shorter than a reference's end: never padded, never short.

Reads of many chunks (:meth:`ManifestMap.read_many_into`) group references by source, merge neighbours
closer than ``gap`` bytes, read each merged span with one positional read scattered straight into the
callers' buffers (local files) or one ranged request (S3), and run the spans concurrently.

Writes change the manifest (saved atomically at ``close``): metadata objects and small chunks are stored
inline, :meth:`ManifestMap.set_reference` adds references; chunk data too large to inline is refused with
a pointer to ``nczmap copy``, which materialises a virtual dataset into real storage.

One writer at a time: a local manifest opened for writing (``r+``, ``a``, ``w``) holds its writer lock
(:mod:`nczmap.zmap.locking`) from before it reads anything until it is closed or aborted, so what it saves
replaces the version it read. A JSON manifest is saved as a new file renamed over the old one; a Parquet
manifest as a new directory swapped with the old one (:mod:`nczmap.zmap.manifest_save`), whose unchanged
record files it shares. The version replaced stays beside the manifest until the next writer, for the
readers that still hold it. S3 manifests take no lock (S3 has none): one writer at a time is the user's
business there, a Parquet manifest on S3 is saved in place (changed record files, then ``.zmetadata``,
then stale records removed: not atomic), and appending to an S3 manifest is not supported.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Iterable, Sequence

from nczmap._lazy import numpy as np
from nczmap.checksum import crc32c
from nczmap.concurrency import run_all
from nczmap.errors import (
    DataError,
    DatasetExists,
    DatasetNotFound,
    DriverNotAvailable,
    EmptyError,
    FormatError,
    NCZError,
    StorageError,
    from_os_error,
)
from nczmap.manifest import kerchunk_json
from nczmap.manifest.containers import Container, as_containers, locate
from nczmap.manifest.model import WHOLE, ArrayReferences, Gathered, Manifest, Reference
from nczmap.url import ParsedURL
from nczmap.zmap import byteranges
from nczmap.zmap.base import ZMap
from nczmap.zmap.beneath import Beneath, NotRegular
from nczmap.zmap.index import KeyIndex
from nczmap.zmap.keys import ROOT, is_listable_name, normalize_key
from nczmap.zmap.manifest_columns import ChunkNames, ColumnSpan, KeyNames, Spans, Targets
from nczmap.zmap.manifest_grants import default_container
from nczmap.zmap.manifest_sources import (
    LocalSource,
    Source,
    bucket_store,
    open_remote_source,
    parse_mtime_tolerance,
    store_options,
    tolerate,
    verify_checksum,
)
from nczmap.zmap.manifest_tables import ChunkTableBuilder
from nczmap.zmap.osutil import remove_if_present
from nczmap.zmap.sidecar import Sidecar, remove_unreferenced

INLINE_LIMIT = 64 << 10  # chunk data up to this size is kept in the manifest itself
MAX_WHOLE_REFERENCE = 2 << 30  # a whole-object reference ([url]) to a larger object is refused
REMOTE_SPANS_IN_FLIGHT = 16  # merged spans of remote sources (S3, HTTP) requested at once
CHECKED_SPAN = 1 << 21  # the longest merged read when its references' checksums are compared
SPANS_PER_TASK = 256  # merged spans of a local source read by one task (scattered chunks: a span each)


def _need_pyarrow() -> None:
    """Parquet manifests are read and written through pyarrow (the ``virtual`` extra): without it, one line
    naming the extra when the map opens (not a bare ImportError at the first record read, or at the save
    after all the work). Only looked for here: importing it is left to the first record."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        raise DriverNotAvailable("Parquet manifests need pyarrow: pip install 'nczmap[virtual]'")


class ManifestMap(ZMap):
    driver = "manifest"

    def __init__(
        self,
        url: ParsedURL,
        mode: str,
        containers: object = None,
        gap: int | None = None,
        mtime_tolerance: float | None = None,
        lock: bool = True,
    ) -> None:
        """``lock=False`` skips the writer lock: only for a caller that holds the manifest's lock itself."""
        super().__init__(url, mode)
        # Relative references resolve against the manifest's directory, the container granted by default
        # (unless it is a home directory or an ancestor of one: see default_container).
        if url.on_s3:
            self._base = f"s3://{url.bucket}/{url.path.rpartition('/')[0]}/"
        else:
            self._base = "file://" + os.path.dirname(url.path) + "/"
        granted = as_containers(containers)
        self.containers = [default_container(self._base, store_options(url), granted), *granted]
        tolerance = parse_mtime_tolerance(url, mtime_tolerance)
        self.gap = gap
        self._sources: dict[str, Source] = {}
        self._resolved: dict[str, tuple[str, Container, str]] = {}  # reference URL -> where it points
        self._directories: dict[str, Beneath] = {}  # container prefix -> its directory, held open
        self._manifest_directory: Beneath | None = None  # a Parquet manifest's directory
        self._sidecar: Sidecar | None = None  # where large chunk data goes, if kept beside
        self._inline_arrays: set[str] = set()  # arrays whose chunks stay in the manifest, however large
        self._lock = threading.Lock()
        self._dirty = mode == "w"
        self._index: KeyIndex | None = None
        self._store = None  # the obstore store holding an S3 manifest
        self._writer_lock = None
        try:
            if lock and mode != "r" and not url.on_s3:
                self._writer_lock = _writer_lock(url.path, mode)  # before anything is read
            self.manifest = self._load()
        except BaseException:
            if self._manifest_directory is not None:
                self._manifest_directory.close()
            if self._writer_lock is not None:
                self._writer_lock.release()
            raise
        if tolerance:
            tolerate(self.manifest.sources, tolerance)
        self._options = {"containers": containers, "gap": gap, "mtime_tolerance": mtime_tolerance}

    def reopen_options(self) -> dict[str, object]:
        return dict(self._options)

    def reopen_recipe(self) -> tuple | None:
        if not self.readonly:
            # Each process would save its own version of the manifest at close: all but one would be lost.
            raise StorageError(
                f"{self.location} is a manifest open for writing: it cannot be shared with other processes "
                "(each would save its own version of it); write it from one process"
            )
        return super().reopen_recipe()

    # ----------------------------------------------------------------- the manifest itself
    def _load(self) -> Manifest:
        if self.parquet:
            _need_pyarrow()
        if self.mode == "w":
            self._check_replaceable()
            return Manifest()
        try:
            if self.parquet:
                from nczmap.manifest import kerchunk_parquet

                replaced = None if self.url.on_s3 else self._replaced
                return kerchunk_parquet.load(self._read_file, self.location, self._list_directory, replaced)
            data = self._read_file(None)
            if data is None:
                raise DatasetNotFound(f"no manifest at {self.location}")
            return kerchunk_json.load(data, self.location)
        except DatasetNotFound:
            if self.mode == "a":
                self._check_replaceable()
                return Manifest()
            raise

    def _check_replaceable(self) -> None:
        """Refuse to create a Parquet manifest over a local directory holding something else: the save
        replaces the whole directory (and the next writer removes what it replaced)."""
        if self.url.on_s3 or not self.parquet:
            return
        from nczmap.zmap.manifest_save import replaceable

        path = self.url.path
        if not replaceable(path):
            raise DatasetExists(
                f"refusing to create a Parquet manifest over {path!r}: it is not an empty directory, nor "
                "one holding a reference set or Zarr store (.zmetadata, .zgroup, .zarray...)"
            )

    def _replaced(self) -> bool:
        """Whether the Parquet manifest directory this map reads was removed, or is being removed, since it
        was opened (a later writer saved a new version, and the writer after it removed this one). Its
        ``.zmetadata`` is removed first (``locking.remove_tree``), so a record file found absent while
        ``.zmetadata`` is still there was absent in the version read: a record of missing chunks."""
        directory = self._manifest_directory
        if directory is None:
            return False
        try:
            if os.fstat(directory.fd).st_nlink == 0:
                return True
            os.stat(".zmetadata", dir_fd=directory.fd, follow_symlinks=False)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return False

    @property
    def parquet(self) -> bool:
        """kerchunk's Parquet form: a directory (``.zmetadata`` and ``<array>/refs.<n>.parq``)."""
        path = self.url.path
        return path.endswith((".parq", ".parquet")) or (not self.url.on_s3 and os.path.isdir(path))

    def _read_file(self, name: str | None) -> bytes | None:
        """The manifest (``name`` None) or a file of a Parquet manifest's directory; None if absent."""
        url = self.url
        path = url.path if name is None else f"{url.path.rstrip('/')}/{name}"
        if url.on_s3:
            try:
                return byteranges.get_object(self._manifest_store(), path)[0]
            except Exception as exc:
                error = byteranges.store_error(
                    exc, f"read {path!r} of the manifest {self.location}", url.bucket
                )
                if error is None:
                    return None
                raise error from exc
        try:
            fd = self._open_manifest_file(name, path)
        except FileNotFoundError:
            return None
        except NotRegular:
            raise FormatError(f"{path!r} is not a regular file: a manifest is read only from one") from None
        except OSError as exc:
            if isinstance(exc, NCZError):
                raise
            raise from_os_error(exc, f"cannot read the manifest {path!r}") from exc
        try:
            return byteranges.read_range(fd, 0, os.fstat(fd).st_size)  # no more than it holds
        except OSError as exc:
            raise from_os_error(exc, f"cannot read the manifest {path!r}") from exc
        finally:
            os.close(fd)

    def _open_manifest_file(self, name: str | None, path: str) -> int:
        """The manifest file (named by the user: opened as named), or a file of a Parquet manifest's
        directory, opened beneath it (a link out of it, to ``/dev/zero`` say, is refused)."""
        if name is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise NotRegular(path)
            return fd
        if self._manifest_directory is None:
            directory = self.url.path.rstrip("/")
            self._manifest_directory = Beneath(directory, f"the manifest {directory!r}")
        return self._manifest_directory.open_file(name.split("/"), name)

    def _write_file(self, name: str | None, data: bytes) -> None:
        """Replace the manifest (``name`` None) or one file of a Parquet manifest on S3, atomically each (a
        local file through a temporary sibling that the next writer removes if this one dies)."""
        url = self.url
        path = url.path if name is None else f"{url.path.rstrip('/')}/{name}"
        if url.on_s3:
            import obstore

            try:
                obstore.put(self._manifest_store(), path, data)
            except Exception as exc:
                error = byteranges.store_error(exc, f"write the manifest {self.location}", url.bucket)
                raise error or StorageError(f"cannot write the manifest {self.location}") from exc
            return
        from nczmap.zmap import locking
        from nczmap.zmap.manifest_save import sync_directory

        real = os.path.realpath(path)
        temp = locking.sibling_path(real, "commit")
        try:
            os.makedirs(os.path.dirname(real), exist_ok=True)
            with open(temp, "xb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, real)
            sync_directory(os.path.dirname(real))
        except OSError as exc:
            remove_if_present(temp)
            raise from_os_error(exc, f"cannot write the manifest {path!r}") from exc

    def _list_directory(self, name: str) -> list[str] | None:
        """The names in directory ``name`` of a Parquet manifest ([] if there is none): which record files
        exist, for listing chunks and for removing stale records at a save."""
        url = self.url
        path = f"{url.path.rstrip('/')}/{name}"
        if url.on_s3:
            import obstore

            prefix = path.strip("/") + "/"
            try:
                batches = obstore.list(self._manifest_store(), prefix=prefix)
                return [item["path"][len(prefix) :] for batch in batches for item in batch]
            except Exception as exc:
                error = byteranges.store_error(
                    exc, f"list {prefix!r} of the manifest {self.location}", url.bucket
                )
                raise error or StorageError(
                    f"cannot list {prefix!r} of the manifest {self.location}"
                ) from exc
        try:
            if self._manifest_directory is None:
                return os.listdir(path)
            # the directory read from: after a save swapped in a new version, this map still reads its own
            fd = self._manifest_directory.open_directory(name.split("/"), name)
            try:
                return os.listdir(fd)
            finally:
                os.close(fd)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            if isinstance(exc, NCZError):
                raise
            raise from_os_error(exc, f"cannot list {path!r} of the manifest") from exc

    def _remove_file(self, name: str) -> None:
        """Remove one file of a Parquet manifest's directory on S3 (a record no longer holding anything)."""
        import obstore

        url = self.url
        path = f"{url.path.rstrip('/')}/{name}"
        try:
            obstore.delete(self._manifest_store(), path.strip("/"))
        except Exception as exc:
            what = f"remove {path!r} of the manifest {self.location}"
            error = byteranges.store_error(exc, what, url.bucket)
            if error is not None:
                raise error from exc

    def _manifest_store(self):
        if self._store is None:
            self._store = bucket_store(self.url.bucket, store_options(self.url))
        return self._store

    def _save(self) -> None:
        if self.parquet and not self.url.on_s3:
            from nczmap.zmap.manifest_save import save_parquet

            save_parquet(self.manifest, os.path.realpath(self.url.path), self._manifest_directory)
        elif self.parquet:
            from nczmap.manifest import kerchunk_parquet

            # in place: the records this session did not change stay as they are
            written = kerchunk_parquet.dump(self.manifest, self._write_file, keep=lambda name: None)
            for array, records in written.items():  # records left from an earlier save would be read
                for name in self._list_directory(array) or ():
                    match = kerchunk_parquet.RECORD_FILE.fullmatch(name)
                    if match and int(match.group(1)) not in records:
                        self._remove_file(f"{array}/{name}")
        else:
            self._write_file(None, kerchunk_json.dump(self.manifest))

    # ----------------------------------------------------------------- primitives
    def _entry(self, key: str):
        entry = self.manifest.get(key[1:])
        if entry is None:
            raise EmptyError(key, self.location)
        return entry

    def _exists(self, key: str) -> bool:
        return self.manifest.get(key[1:]) is not None

    def _len(self, key: str) -> int:
        entry = self._entry(key)
        if isinstance(entry, bytes):
            return len(entry)
        return entry.length if entry.length != WHOLE else self._length(entry, self._source(key, entry), key)

    def _read(self, key: str, start: int, count: int | None) -> bytes:
        entry = self._entry(key)
        if isinstance(entry, bytes):
            return entry[start:] if count is None else entry[start : start + count]
        source = self._source(key, entry)
        length = self._length(entry, source, key)
        wanted = max(0, length - start) if count is None else max(0, min(count, length - start))
        expected = self.manifest.checksums.get(key[1:]) if self.manifest.checksums else None
        if expected is not None and wanted:  # the whole reference is read to check it
            data = source.read(entry.offset, length)
            verify_checksum(key, data, expected, source.name)
            return data[start : start + wanted]
        return source.read(entry.offset + start, wanted) if wanted else b""

    def _read_into(self, key: str, buffer: memoryview, start: int) -> int:
        data = self._read(key, start, len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _search(self, prefix: str) -> list[str]:
        return [
            n for n in self.manifest.children("" if prefix == ROOT else prefix[1:]) if is_listable_name(n)
        ]

    def _write(self, key: str, data: memoryview) -> None:
        array, _, name = key.rpartition("/")
        large = len(data) > INLINE_LIMIT and not name.startswith(".") and array not in self._inline_arrays
        if large and self._sidecar is not None:
            self._set(key, Reference(self._sidecar.url, self._sidecar.append(data), len(data)))
            return
        if large:
            raise DataError(
                f"cannot write {len(data)} bytes to {key!r} of the manifest {self.location}: chunks over "
                f"{INLINE_LIMIT} bytes cannot be inlined; use set_reference() for data in another file, or "
                "`nczmap copy` to turn the virtual dataset into a real one"
            )
        self._set(key, bytes(data))

    def _set(self, key: str, entry) -> None:
        with self._lock:
            self._key_index().check_leaf(key, _Holding(self.manifest), self.location)
            self.manifest.set(key[1:], entry)
            self._index.add(key)
            self._dirty = True

    def _key_index(self) -> KeyIndex:
        """Every key, as a tree (built at the first change: reading never needs it)."""
        if self._index is None:
            self._index = KeyIndex()
            for name in self.manifest.loose_keys():
                self._index.add("/" + name)
            for array in self.manifest.directories():  # its chunks are leaves: the directory is enough
                self._index.add_directory("/" + array)
        return self._index

    def _delete(self, key: str) -> None:
        with self._lock:
            self._key_index().remove(key, _Holding(self.manifest).__contains__)
            self.manifest.delete_under(key[1:])
            self._dirty = True

    def _truncate(self) -> None:
        with self._lock:
            self.manifest = Manifest()
            self._index = KeyIndex()
            self._dirty = True

    def _close(self, delete: bool) -> None:
        try:
            for source in self._sources.values():
                source.close()
            if delete:
                if not self.url.on_s3:
                    remove_if_present(self.url.path)
            elif self._dirty:
                if self._sidecar is not None and (recorded := self._sidecar.commit()) is not None:
                    self.manifest.sources[self._sidecar.url] = recorded
                self._save()  # reads changed records from, and links the others out of, the directory held
                if self._sidecar is not None:  # only now: the saved manifest no longer names them
                    remove_unreferenced(self.url.path, self.manifest.sources)
        finally:
            self._sources.clear()
            try:
                if self._sidecar is not None:
                    self._sidecar.discard()
                for directory in [*self._directories.values(), self._manifest_directory]:
                    if directory is not None:
                        directory.close()
                self._directories.clear()
                self._manifest_directory = None
            finally:
                if self._writer_lock is not None:
                    self._writer_lock.release()

    def abort(self) -> None:
        self._dirty = False
        self.close()

    # ----------------------------------------------------------------- references
    def keep_large_chunks_beside(self) -> None:
        """Store chunk data too large to inline in a file beside the manifest (:mod:`.sidecar`), which
        the manifest refers to, instead of refusing it. Local manifests only."""
        if self.url.on_s3:
            raise DataError(f"{self.location}: large chunks are kept beside local manifests only")
        if self._sidecar is None:
            self._sidecar = Sidecar(self.url.path)

    def keep_inline(self, array: str) -> None:
        """Keep the chunks of ``array`` in the manifest whatever their size: a small array written again
        whole by every append (a joined coordinate), whose old chunks must not outlive it in chunk files."""
        self._inline_arrays.add(self._key(array, writing=True))

    def set_reference(self, key: str, url: str, offset: int = 0, length: int = WHOLE) -> None:
        """Make ``key`` refer to ``length`` bytes at ``offset`` of ``url`` (WHOLE: the whole object).

        The URL must lie in an authorised container (AccessDenied otherwise), so a manifest never records
        a reference its writer could not read; it is stored in its normalised, absolute form
        (``file:///real/path``, ``s3://bucket/key``), which kerchunk and fsspec read as it is.
        """
        key = self._key(key, writing=True)
        if key == ROOT:
            raise DataError(f"cannot set a reference at the root of {self.location}")
        if offset < 0 or (length < 0 and length != WHOLE) or (length == WHOLE and offset):
            raise DataError(
                f"reference for {key!r}: bad range offset={offset} length={length} (a whole object "
                "starts at 0; give a length with an offset)"
            )
        real, _, _ = self._resolve(url, key)
        self._set(key, Reference(real, offset, length))  # absolute: other readers resolve nothing

    def set_references(self, url: str, references: Iterable[tuple[str, int, int]]) -> int:
        """:meth:`set_reference` of many ``(key, offset, length)`` into one ``url``, with the same checks:
        the URL authorised once, the key tree checked once per directory. Returns how many were set."""
        real: str | None = None
        checked: set[str] = set()
        count = 0
        with self._lock:
            index = self._key_index()
            holding = _Holding(self.manifest)
            for key, offset, length in references:
                key = self._key(key, writing=True)
                if key == ROOT or offset < 0 or length < 0:
                    raise DataError(
                        f"reference for {key!r}: bad key or range offset={offset} length={length}"
                    )
                if real is None:
                    real, _, _ = self._resolve(url, key)
                parent = key.rpartition("/")[0]
                if parent not in checked or index.contains(key):
                    index.check_leaf(key, holding, self.location)
                    checked.add(parent)
                self.manifest.set(key[1:], Reference(real, offset, length))
                index.add(key)
                count += 1
            self._dirty = self._dirty or count > 0
        return count

    def set_chunk_references(
        self,
        array: str,
        names: Sequence[str],
        urls: str | Sequence[str],
        offsets: Sequence[int],
        lengths: Sequence[int],
    ) -> int:
        """:meth:`set_references` of chunks of one array: ``array/names[i]`` refers to ``lengths[i]`` bytes
        at ``offsets[i]`` of ``urls[i]`` (or of ``urls``, one URL for all). The array's key is checked
        once, not each chunk's (a name is one key segment: no ``/``, not ``.`` or ``..``), and each URL
        once. Returns how many were set."""
        if not names:
            return 0
        array = self._key(array, writing=True)
        count = len(names)
        urls = [urls] * count if isinstance(urls, str) else list(urls)
        if array == ROOT or any(not n or "/" in n or n in (".", "..") for n in names):
            raise DataError(f"bad chunk names under {array!r} in {self.location}")
        offsets, lengths = [int(o) for o in offsets], [int(n) for n in lengths]
        if not len(urls) == len(offsets) == len(lengths) == count or min(offsets) < 0 or min(lengths) < 0:
            raise DataError(f"references for {array!r}: bad ranges (negative, or not one per chunk)")
        with self._lock:
            real = {url: self._resolve(url, f"{array}/{names[0]}")[0] for url in set(urls)}
            index = self._key_index()
            holding = _Holding(self.manifest)
            index.check_leaf(f"{array}/{names[0]}", holding, self.location)  # the ancestors: once
            for name in index.present(array, names):
                index.check_leaf(f"{array}/{name}", holding, self.location)
            prefix = array[1:] + "/"
            self.manifest.set_many(
                [prefix + name for name in names],
                list(map(Reference, [real[url] for url in urls], offsets, lengths)),
            )
            index.add_children(array, names)
            self._dirty = True
        return count

    def chunk_table(self, array: str, grid: tuple[int, ...]) -> ChunkTableBuilder | None:
        """A builder of an array's chunk references as columns (:class:`ChunkTableBuilder`): nothing made
        a chunk, pages built as the columns come, then merged into the array's table if it has one (an
        append: its grid grown along the first dimension at most). None when the chunks must be set by
        name (a table of another grid or separator, or checksums recorded)."""
        array = self._key(array, writing=True)
        grid = tuple(grid)
        if array == ROOT or not grid:
            raise DataError(f"no chunk table for {array!r} in {self.location}: not an array of a grid")
        with self._lock:
            if self.manifest.checksums:
                return None
            held = self.manifest.arrays.get(array[1:])
            if held is not None and (
                held.separator != "." or len(held.grid) != len(grid) or held.grid[1:] != grid[1:]
            ):
                return None
            if held is None:
                self._key_index().check_leaf(f"{array}/0", _Holding(self.manifest), self.location)
        base = None if held is None else (held if held.grid == grid else held.regridded(grid))
        page_size = None if base is None else base.page_size
        if base is None and self.parquet:
            from nczmap.manifest.kerchunk_parquet import RECORD_SIZE

            page_size = self.manifest.record_size or RECORD_SIZE
        return ChunkTableBuilder(self, array, grid, page_size, base)

    def _install_table(self, array: str, table: ArrayReferences, replacing: ArrayReferences | None) -> None:
        """``table`` as the chunks of ``array`` (in place of ``replacing``, the table it was built over): a
        chunk a loose key holds too is refused."""
        with self._lock:
            current = self.manifest.arrays.get(array[1:])
            if current is not None and (replacing is None or current._token != replacing._token):
                raise DataError(f"the chunks of {array!r} in {self.location} were set meanwhile")
            loose = self.manifest._loose_chunks(array[1:], table)  # small chunks kept inline
            if len(loose) and any(entry is not None for entry in table.columns(loose).entries()):
                raise DataError(f"references for {array!r}: a chunk also held inline")
            self.manifest.arrays[array[1:]] = table
            self.manifest.forget_order()
            self._key_index().add_directory(array)
            self._dirty = True

    def copy_from(self, source: ZMap, source_key: str, key: str) -> bool:
        """Copying from another manifest copies the reference, never the bytes it points at (the
        destination must be allowed to reach them); everything else is copied as data."""
        if isinstance(source, ManifestMap):
            reference = source.reference(source_key)
            if reference is not None:
                real, _, _ = source._resolve(reference.url, normalize_key(source_key))
                self.set_reference(key, real, reference.offset, reference.length)
                return True
        return super().copy_from(source, source_key, key)

    def source_reference(self, key: str) -> tuple[str, int, int, dict | None] | None:
        """What ``key`` refers to, as another store records a reference: the source's canonical URL (in
        an authorised container), offset, length, and what this manifest recorded of the source (size
        and modification time, or ETag; None if nothing). None for inline data, no content, and the
        manifest's own chunk files (data kept beside it, which is copied as data)."""
        key = normalize_key(key)
        entry = self.manifest.get(key[1:])
        if not isinstance(entry, Reference):
            return None
        real, _, _ = self._resolve(entry.url, key)
        if self._own_chunk_file(real):
            return None
        length = entry.length
        if length == WHOLE:
            length = self._length(entry, self._source(key, entry), key)
        return real, entry.offset, length, self.manifest.sources.get(real)

    def _own_chunk_file(self, real: str) -> bool:
        """Whether ``real`` is a chunk file this manifest keeps beside it (:mod:`.sidecar`)."""
        if self.url.on_s3 or not real.startswith("file://"):
            return False
        base = "file://" + os.path.realpath(self.url.path.rstrip("/")) + "."
        return real.startswith(base) and re.fullmatch(r"[0-9a-f]+\.chunks", real[len(base) :]) is not None

    def reference(self, key: str) -> Reference | None:
        """The reference ``key`` holds (None for inline data or nothing)."""
        entry = self.manifest.get(normalize_key(key)[1:])
        return entry if isinstance(entry, Reference) else None

    def _resolve(self, url: str, key: str) -> tuple[str, Container, str]:
        """The canonical URL, its container and the path below it (AccessDenied outside every container).

        Kept per URL: it is a decision about text only. Local sources are opened from the container's
        directory descriptor each time (:meth:`_open_local`), so no decision about the file system is kept.
        """
        resolved = self._resolved.get(url)
        if resolved is None:
            resolved = self._resolved[url] = locate(url, self._base, self.containers, key)
        return resolved

    def _source(self, key: str, reference: Reference) -> Source:
        real, container, relative = self._resolve(reference.url, key)
        with self._lock:
            if self._sidecar is not None and real == self._sidecar.url and self._sidecar.fd >= 0:
                # written in this session, not yet in place: the file being written (which holds the
                # previous one's bytes too), whose size grows with every append
                pending = "pending:" + real
                source = self._sources.get(pending)
                if source is None:
                    source = self._sources[pending] = LocalSource(real[7:], os.dup(self._sidecar.fd), None)
                source.size = self._sidecar.size
                return source
            source = self._sources.get(real)
            if source is None:
                recorded = self.manifest.sources
                info = recorded.get(reference.url) or recorded.get(real)
                if real.startswith("file://"):
                    source = LocalSource(real[len("file://") :], self._open_local(container, relative), info)
                else:
                    source = open_remote_source(real, container, info)
                self._sources[real] = source
        return source

    def _open_local(self, container: Container, relative: str) -> int:
        """A descriptor of the regular file ``relative`` below the local ``container``, opened beneath
        the container's directory (links followed only while they stay inside it)."""
        shown = container.prefix + relative
        directory = self._directories.get(container.prefix)
        try:
            if directory is None:
                path = container.prefix[len("file://") :]
                aliases = [container.spelling[len("file://") :]]
                what = f"the container {container.prefix}"
                directory = self._directories[container.prefix] = Beneath(path, what, aliases=aliases)
            return directory.open_file(relative.split("/"), relative)
        except FileNotFoundError:
            raise StorageError(f"the source {shown!r} of a reference does not exist") from None
        except NotRegular as exc:
            raise StorageError(f"the source {shown!r} of a reference cannot be read: {exc}") from None
        except OSError as exc:
            if isinstance(exc, NCZError):
                raise
            raise from_os_error(exc, f"cannot open the source {shown!r}") from exc

    def _length(self, reference: Reference, source: Source, key: str | None = None) -> int:
        """The bytes ``reference`` names; a whole-object reference to more than MAX_WHOLE_REFERENCE bytes
        is refused (no chunk is that large, and reading it would take that much memory)."""
        if reference.length == WHOLE and reference.offset <= source.size:
            length = source.size - reference.offset
            if length > MAX_WHOLE_REFERENCE:
                held = f"key {key!r} refers" if key else "a reference refers"
                raise StorageError(
                    f"{held} to the whole of {source.name} ({length} bytes), more than the "
                    f"{MAX_WHOLE_REFERENCE} bytes a whole-object reference may name: a chunk that large is "
                    "no chunk (refer to a byte range [url, offset, length] instead)"
                )
            return length
        end = reference.offset + max(reference.length, 0)
        if end > source.size:
            raise StorageError(
                f"{source.name} holds {source.size} bytes, but a reference needs bytes up to "
                f"{end}: the source was truncated or replaced"
            )
        return reference.length

    # ----------------------------------------------------------------- coalesced reads
    def read_many_into(self, requests: Sequence[tuple[str, memoryview]]) -> list[int | None]:
        """Fill each buffer with its key's object (None where a key has no content), references read
        together: per source, neighbouring ranges merged, the merged spans run concurrently. The count
        returned is the object's whole size, so a reference longer than its buffer shows as a chunk of
        the wrong size to the caller, never as a silently shortened one."""
        keys = [self._key(key) for key, _ in requests]
        columns = self.manifest.columns([key[1:] for key in keys])
        counts = self._read_columns(columns, Targets.separate([buffer for _, buffer in requests]), keys)
        return [None if count < 0 else count for count in counts.tolist()]

    def read_chunks_into(
        self, array: str, indices: np.ndarray, separator: str, buffer: memoryview, size: int
    ) -> np.ndarray | None:
        """:meth:`read_many_into` of the chunks of ``array`` at ``indices`` (a row of chunk indices each:
        key ``array/i.j`` with ``separator``), chunk ``n`` into ``buffer[n * size : (n + 1) * size]``,
        without an object per chunk: the byte counts (-1: no content) as an array. None (nothing read)
        unless the array's references are held in a table of that rank and separator."""
        array = self._key(array)
        indices = np.asarray(indices, dtype=np.int64)
        columns = self.manifest.chunk_columns(array[1:], indices, separator)
        if columns is None:
            return None
        return self._read_columns(
            columns, Targets.strided(buffer, len(indices), size), ChunkNames(array, indices, separator)
        )

    def _read_columns(self, columns: Gathered, targets: Targets, names: KeyNames) -> np.ndarray:
        """Fill the targets with what the keys of ``columns`` hold (``names[n]``: the key of the ``n``-th,
        for errors and checksums); the byte counts, -1 for no content."""
        counts = np.full(len(columns), -1, dtype=np.int64)
        for at, data in columns.inline.items():
            view = targets.view(at, min(len(data), int(targets.room[at])))
            view[:] = data[: len(view)]
            counts[at] = len(data)
        local, remote = [], []
        for source, positions in self._by_source(columns, names):
            offsets = columns.offsets[positions]
            counts[positions] = whole = self._lengths(
                source, offsets, columns.lengths[positions], positions, names
            )
            spans = self._spans(source, offsets, np.minimum(whole, targets.room[positions]), positions)
            per_task = 1 if source.remote else SPANS_PER_TASK
            (remote if source.remote else local).extend(
                lambda s=source, p=spans, first=first, last=first + per_task: self._fill(
                    s, p, first, last, targets, names, counts
                )
                for first in range(0, spans.count, per_task)
            )
        if remote:  # requests mostly wait: many in flight, on threads of their own
            byteranges.run_concurrently(remote, REMOTE_SPANS_IN_FLIGHT)
        run_all(local, self.io_width)
        return counts

    def _by_source(self, columns: Gathered, names: KeyNames) -> list[tuple[Source, np.ndarray]]:
        """The references of ``columns`` by source (opened in the order they are first named): the
        positions of each source's."""
        references = np.flatnonzero(columns.where >= 0)
        if not len(references):
            return []
        numbers = columns.where[references]
        if (numbers == numbers[0]).all():  # one URL, as often
            groups = [references]
        else:
            order = np.argsort(numbers, kind="stable")
            starts = np.unique(numbers[order], return_index=True)[1]
            groups = sorted(np.split(references[order], starts[1:]), key=lambda group: int(group[0]))
        found: dict[int, tuple[Source, list[np.ndarray]]] = {}
        for positions in groups:
            url = columns.urls[int(columns.where[positions[0]])]
            source = self._source(names[int(positions[0])], Reference(url))
            found.setdefault(id(source), (source, []))[1].append(positions)
        return [(source, np.concatenate(parts)) for source, parts in found.values()]

    def _lengths(
        self,
        source: Source,
        offsets: np.ndarray,
        lengths: np.ndarray,
        positions: np.ndarray,
        names: KeyNames,
    ) -> np.ndarray:
        """:meth:`_length` of each reference into ``source`` (its error for the first that has one)."""
        entire = lengths == WHOLE
        whole = np.where(entire, source.size - offsets, lengths)
        bad = np.where(entire, (whole > MAX_WHOLE_REFERENCE) | (whole < 0), offsets > source.size - lengths)
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            self._length(
                Reference(source.name, int(offsets[at]), int(lengths[at])), source, names[int(positions[at])]
            )
        return whole

    def _spans(
        self, source: Source, offsets: np.ndarray, lengths: np.ndarray, positions: np.ndarray
    ) -> Spans:
        gap = self.gap if self.gap is not None else source.gap
        longest = min(source.max_span, CHECKED_SPAN) if self.manifest.checksums else source.max_span
        return Spans.merged(offsets, lengths, positions, gap, longest)  # checked: each hashed while hot

    def _fill(
        self,
        source: Source,
        spans: Spans,
        first: int,
        last: int,
        targets: Targets,
        names: KeyNames,
        counts: np.ndarray,
    ) -> None:
        """Read spans ``first...last - 1`` into the targets; then, in the same worker (one span's hashing
        overlaps another's reading), compare the checksums recorded for their references."""
        checksums = self.manifest.checksums
        for number in range(first, min(last, spans.count)):
            span = spans.span(number)
            source.fill_columns(span, targets)
            if checksums:
                self._check(source, span, targets, names, counts)

    def _check(
        self, source: Source, span: ColumnSpan, targets: Targets, names: KeyNames, counts: np.ndarray
    ) -> None:
        """Compare the checksums recorded for the whole references of ``span`` (one longer than its buffer
        is the caller's error already). No copy, and the hashing releases the GIL."""
        checksums = self.manifest.checksums
        for length, at in zip(span.lengths.tolist(), span.positions.tolist(), strict=True):
            key = names[at]
            expected = checksums.get(key[1:])
            if expected is not None and length == counts[at]:
                view = targets.view(at, length)
                if crc32c(view) != expected:
                    verify_checksum(key, bytes(view), expected, source.name)

    def read_many(self, keys: Sequence[str], limit: int) -> list[bytes | int | None] | None:
        """Whole objects of ``keys`` read together, when that saves requests: None (read them one by one)
        unless some are references into remote sources (S3, HTTP), whose neighbours are then merged into
        spans as :meth:`read_many_into` merges them (a COG's compressed tiles lie end to end: one GET for
        a row of them instead of one each). Each item is the object's bytes, None without content, or its
        length (unread) when it is longer than ``limit`` bytes. The format layer's batch read of chunks
        that are decoded (compressed) before use; raw chunks go to :meth:`read_many_into` directly."""
        if all(container.prefix.startswith("file://") for container in self.containers):
            return None  # every reference is local (others are refused): one positional read each is cheap
        normalized = [self._key(key) for key in keys]
        entries = self.manifest.get_many([key[1:] for key in normalized])
        if not any(
            isinstance(e, Reference) and not self._resolve(e.url, k)[0].startswith("file:")
            for k, e in zip(normalized, entries, strict=True)
        ):
            return None
        found: list[bytes | int | None] = [None] * len(keys)
        requests, places = [], []
        for index, (key, entry) in enumerate(zip(normalized, entries, strict=True)):
            if entry is None:
                continue
            if isinstance(entry, bytes):
                found[index] = entry if len(entry) <= limit else len(entry)
                continue
            length = self._length(entry, self._source(key, entry), key)
            if length > limit:
                found[index] = length
                continue
            buffer = bytearray(length)
            requests.append((key, memoryview(buffer)))
            places.append((index, buffer))
        for (index, buffer), count in zip(places, self.read_many_into(requests), strict=True):
            found[index] = None if count is None else bytes(buffer)
        return found


def _writer_lock(path: str, mode: str):
    """The writer lock of the local manifest at ``path``, removing what earlier writers left beside it
    (versions they replaced, kept for readers; what a killed one staged, putting back a manifest it had
    moved aside); none for ``r+`` in a directory that does not exist (it fails to load, creating nothing)."""
    if mode == "r+" and not os.path.isdir(os.path.dirname(os.path.realpath(path))):
        return None
    from nczmap.zmap import locking  # writers only

    return locking.acquire(path, clean=True)


class _Holding:
    """``key in _Holding(manifest)``: the key (with its ``/``) holds something."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.manifest.get(key[1:]) is not None
