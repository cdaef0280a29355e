"""The ``file`` driver: a directory tree laid out exactly as netcdf-c's ``zmap_file.c`` lays it out.

Unlike netcdf-c: every write is atomic (temporary file in the same directory, then rename) so an overwrite
never leaves a stale tail (netcdf-c bug 1), creating over a directory that is not a Zarr store refuses
(bug 2), missing parent directories are created (bug 5), and deleting prunes directories left empty. One
writer at a time (:mod:`nczmap.zmap.locking`); the next writer removes the temporary files of one that died.

No key reaches outside the store: symbolic links inside it are followed only while they stay inside the
store's real directory. Every operation checks the real path of the directory it works in (once per
directory and open map) and of an object that is itself a link. A key that leaves is ``AccessDenied``.

Objects are regular files. A FIFO, socket or device in the store is no object (``exists`` is False, ``len``
and ``read`` raise ``EmptyError``, as for a directory), and is never opened in a way that could block.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat

from nczmap.errors import (
    AccessDenied,
    DatasetExists,
    DatasetNotFound,
    EmptyError,
    KeyConflictError,
    StorageError,
    from_os_error,
)
from nczmap.url import ParsedURL
from nczmap.zmap import byteranges, locking
from nczmap.zmap.base import STORE_MARKERS, ZMap
from nczmap.zmap.keys import ROOT, TEMP_PREFIX, ancestors, is_listable_name, join, normalize_key, sort_names
from nczmap.zmap.osutil import remove_if_present

_EMPTY_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ENXIO)  # ENXIO: opening a socket
_TEMPORARY = re.compile(re.escape(TEMP_PREFIX) + "[0-9a-f]{16}")  # what _replace writes before renaming


class FileMap(ZMap):
    driver = "file"

    def __init__(self, url: ParsedURL, mode: str, *, lock: bool = True) -> None:
        """``lock=False`` skips the writer lock: only for a caller that holds the dataset's lock itself."""
        super().__init__(url, mode)
        self.root = url.path
        self._writer_lock: locking.WriterLock | None = None
        try:
            if lock and mode in ("a", "w"):
                self._writer_lock = locking.acquire(self.root)  # before anything is created or emptied
            self._open_root()
            if lock and mode == "r+":
                self._writer_lock = locking.acquire(self.root)  # once the dataset is known to exist
            if self._writer_lock is not None and self._writer_lock.stale:
                _remove_temporaries(self.root)
        except BaseException:
            if self._writer_lock is not None:
                self._writer_lock.release()
            raise
        self._real_root = os.path.realpath(self.root)
        self._directory_inside: dict[str, bool] = {}  # directory key -> really in the store (links only)
        self._scanned: set[str] = set()  # directory keys whose entries were checked for links

    def reopen_options(self) -> dict[str, object]:
        # A copy in another process (a dask worker) writes under the lock this map holds.
        return {} if self.readonly else {"lock": False}

    # ----------------------------------------------------------------- opening
    def _open_root(self) -> None:
        if self.mode == "w":
            if check_replaceable(self.root):
                self._truncate()
            else:
                self._makedirs(self.root)
            return
        kind = _path_kind(self.root)
        if kind == "missing":
            if self.mode != "a":
                raise DatasetNotFound(f"no dataset at {self.root!r} (file driver)")
            self._makedirs(self.root)
        elif kind != "dir":
            raise StorageError(
                f"{self.root!r} is not a directory: the file driver needs a "
                "directory (use mode=zip for a zip archive)"
            )

    def _makedirs(self, path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except FileExistsError as exc:
            raise KeyConflictError(f"cannot create directory {path!r}: a file is in the way") from exc
        except OSError as exc:
            raise from_os_error(exc, f"cannot create directory {path!r}") from exc

    # ----------------------------------------------------------------- primitives
    def _path(self, key: str) -> str:
        return self.root if key == ROOT else self.root + key

    # ----------------------------------------------------------------- staying inside the store
    def _is_inside(self, real: str) -> bool:
        root = self._real_root
        return real == root or real.startswith(root.rstrip("/") + "/")

    def _escapes(self, key: str) -> AccessDenied:
        return AccessDenied(
            f"key {key!r} of {self.root!r} leads outside the store through a symbolic link: not followed"
        )

    def _check_directory(self, directory: str, key: str) -> None:
        """Refuse to work in ``directory`` (a key) for ``key`` if the directory really lies outside."""
        if not self._directory_is_inside(directory):
            raise self._escapes(key)

    def _directory_is_inside(self, directory: str) -> bool:
        """Whether a directory key really lies in the store: learnt per parent from one scan of its
        entries (no syscall per directory), with a full resolution only where a link is met."""
        inside = self._directory_inside.get(directory)
        if inside is not None:
            return inside
        if directory == ROOT:
            return True  # the root itself (named by the user, a link or not)
        parent = directory.rpartition("/")[0] or ROOT
        if not self._directory_is_inside(parent):
            return False
        if parent not in self._scanned:
            self._scan_links(parent)
        # Not seen in the scan: absent then, so it will be a real directory made here (or never exist).
        return self._directory_inside.get(directory, True)

    def _scan_links(self, parent: str) -> None:
        self._scanned.add(parent)
        try:
            with os.scandir(self._path(parent)) as entries:
                for entry in entries:
                    if entry.is_symlink():
                        inside = self._is_inside(os.path.realpath(entry.path))
                        self._directory_inside[join(parent, entry.name)] = inside
        except OSError:
            pass  # not a directory (yet): nothing under it can be a link

    def _open_inside(self, key: str) -> int:
        """A descriptor for reading ``key``, refused if it leads out of the store through a link.

        Non-blocking, so that opening a FIFO returns at once: :meth:`_open_object` then refuses it."""
        self._check_directory(key.rpartition("/")[0] or ROOT, key)
        path = self._path(key)
        try:
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ELOOP:  # ELOOP: the object itself is a link; see where it goes
                raise
        if not self._is_inside(os.path.realpath(path)):
            raise self._escapes(key)
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def _open_object(self, key: str) -> int:
        """A descriptor of the object at ``key``: ``EmptyError`` unless it is a regular file."""
        try:
            fd = self._open_inside(key)
        except OSError as exc:
            raise self._read_error(key, exc) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory, FIFO or device: no object
            os.close(fd)
            raise EmptyError(key, self.root)
        return fd

    def _stat(self, key: str) -> os.stat_result | None:
        path = self._path(key)
        try:
            st = os.stat(path, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if not self._is_inside(os.path.realpath(path)):
                    raise self._escapes(key)
                st = os.stat(path)
        except OSError as exc:
            if isinstance(exc, AccessDenied):
                raise
            if exc.errno in _EMPTY_ERRNOS or exc.errno == errno.ENAMETOOLONG:
                return None
            raise from_os_error(exc, f"cannot stat {key!r} in {self.root!r}") from exc
        if not stat.S_ISREG(st.st_mode):
            return None
        self._check_directory(key.rpartition("/")[0] or ROOT, key)
        return st

    def _exists(self, key: str) -> bool:
        return self._stat(key) is not None

    def _len(self, key: str) -> int:
        st = self._stat(key)
        if st is None:
            raise EmptyError(key, self.root)
        return st.st_size

    def _read(self, key: str, start: int, count: int | None) -> bytes:
        fd = self._open_object(key)
        try:
            return byteranges.read_range(fd, start, count)
        except OSError as exc:
            raise self._read_error(key, exc) from None
        finally:
            os.close(fd)

    def _read_into(self, key: str, buffer: memoryview, start: int) -> int:
        fd = self._open_object(key)
        try:
            return byteranges.read_into(fd, buffer, start)
        except OSError as exc:
            raise self._read_error(key, exc) from None
        finally:
            os.close(fd)

    def _read_error(self, key: str, exc: OSError) -> Exception:
        if isinstance(exc, AccessDenied):  # ours already (a link leaving the store)
            return exc
        if exc.errno in _EMPTY_ERRNOS:
            if not os.path.isdir(self.root):  # else every chunk of a deleted store would read as fill values
                return DatasetNotFound(f"{self.root!r} was removed while open: cannot read {key!r}")
            return EmptyError(key, self.root)
        return from_os_error(exc, f"cannot read {key!r} in {self.root!r}")

    def _write(self, key: str, data: memoryview) -> None:
        def fill(fd: int) -> None:
            with os.fdopen(fd, "wb", closefd=False) as handle:
                handle.write(data)

        self._replace(key, fill)

    def copy_from(self, source: ZMap, source_key: str, key: str) -> bool:
        """Copy an object from another map; between two directory stores the kernel copies the bytes."""
        if not isinstance(source, FileMap):
            return super().copy_from(source, source_key, key)
        source_key, key = normalize_key(source_key), self._key(key, writing=True)
        try:
            reader = source._open_object(source_key)
        except EmptyError:
            return False
        try:
            size = os.fstat(reader).st_size
            self._replace(key, lambda fd: _kernel_copy(reader, fd, size))
        finally:
            os.close(reader)
        return True

    def _replace(self, key: str, fill) -> None:
        """Write ``key`` atomically: ``fill`` writes a temporary file beside it, which then replaces it."""
        path = self._path(key)
        directory = os.path.dirname(path)
        self._ensure_parent(key, directory)
        if os.path.isdir(path):
            raise KeyConflictError(f"cannot write {key!r} in {self.root!r}: it is a directory")
        temp = os.path.join(directory, f"{TEMP_PREFIX}{os.urandom(8).hex()}")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                fill(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
        except BaseException as exc:
            remove_if_present(temp)
            if isinstance(exc, OSError):
                raise from_os_error(exc, f"cannot write {key!r} in {self.root!r}") from exc
            raise

    def _ensure_parent(self, key: str, directory: str) -> None:
        """Make the key's directory, after checking that its existing ancestors really are in the store."""
        self._check_directory(key.rpartition("/")[0] or ROOT, key)
        if os.path.isdir(directory):
            return
        for ancestor in reversed(ancestors(key)):
            if os.path.isfile(self._path(ancestor)):
                raise KeyConflictError(f"cannot write {key!r} in {self.root!r}: {ancestor!r} is an object")
        self._makedirs(directory)

    def _search(self, prefix: str) -> list[str]:
        path = self._path(prefix)
        self._check_directory(prefix, prefix)
        try:
            with os.scandir(path) as entries:
                names = [entry.name for entry in entries if is_listable_name(entry.name)]
        except OSError as exc:
            if exc.errno in _EMPTY_ERRNOS or exc.errno == errno.ENAMETOOLONG:
                return []
            raise from_os_error(exc, f"cannot list {prefix!r} in {self.root!r}") from exc
        return sort_names(names)

    def _delete(self, key: str) -> None:
        path = self._path(key)
        self._check_directory(key.rpartition("/")[0] or ROOT, key)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno in _EMPTY_ERRNOS:
                return
            raise from_os_error(exc, f"cannot delete {key!r} in {self.root!r}") from exc
        self._prune(key)

    def _prune(self, key: str) -> None:
        for ancestor in ancestors(key):
            if ancestor == ROOT:
                return
            try:
                os.rmdir(self._path(ancestor))
            except OSError:
                return

    def _truncate(self) -> None:
        try:
            with os.scandir(self.root) as entries:
                for entry in list(entries):
                    _remove_entry(entry)
        except FileNotFoundError:
            self._makedirs(self.root)
        except OSError as exc:
            raise from_os_error(exc, f"cannot truncate {self.root!r}") from exc

    def _close(self, delete: bool) -> None:
        try:
            if delete:
                shutil.rmtree(self.root, ignore_errors=True)
        finally:
            if self._writer_lock is not None:
                self._writer_lock.release()

    def abort(self) -> None:
        """Close; a dataset being created (mode ``w``) is removed, as netcdf-c's ``nc_abort`` does."""
        self.close(delete=self.mode == "w" and not self.closed)


def _kernel_copy(reader: int, writer: int, size: int) -> None:
    done = 0
    while done < size:
        copied = os.copy_file_range(reader, writer, size - done, done, done)
        if not copied:
            raise OSError(errno.EIO, "source object shrank while being copied")
        done += copied


def check_replaceable(path: str) -> bool:
    """Whether a directory store exists at ``path`` that creating a dataset there may replace (False:
    nothing there); :class:`DatasetExists` if something is there that is no Zarr/NCZarr store."""
    kind = _path_kind(path)
    if kind == "missing":
        return False
    if kind != "dir":
        raise DatasetExists(f"refusing to create a dataset over the file {path!r}")
    entries = [name for name in os.listdir(path) if not name.startswith(TEMP_PREFIX)]
    if entries and not any(marker in entries for marker in STORE_MARKERS):
        raise DatasetExists(
            f"refusing to create a dataset in {path!r}: the directory is not empty and holds "
            "no Zarr/NCZarr store (no .zgroup, .zarray, .zattrs, .zmetadata, .nczarr, zarr.json)"
        )
    return True


def _path_kind(path: str) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        raise from_os_error(exc, f"cannot open dataset {path!r}") from exc
    return "dir" if stat.S_ISDIR(st.st_mode) else "file"


def _remove_temporaries(root: str) -> None:
    """Remove the temporary files of a writer that died in the store (``_replace`` makes them)."""
    for directory, subdirectories, files in os.walk(root):
        # a staging directory (a copy into a dataset nested here) is not ours to sweep
        subdirectories[:] = [name for name in subdirectories if not name.startswith(TEMP_PREFIX)]
        for name in files:
            if _TEMPORARY.fullmatch(name):
                remove_if_present(os.path.join(directory, name))


def _remove_entry(entry: os.DirEntry) -> None:
    if entry.is_dir(follow_symlinks=False):
        shutil.rmtree(entry.path)
    else:
        os.unlink(entry.path)
