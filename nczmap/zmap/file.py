"""The ``file`` driver: a directory tree laid out exactly as netcdf-c's ``zmap_file.c`` lays it out.

Unlike netcdf-c: every write is atomic (temporary file in the same directory, then rename) so an overwrite
never leaves a stale tail (netcdf-c bug 1), creating over a directory that is not a Zarr store refuses
(bug 2), missing parent directories are created (bug 5), and deleting prunes directories left empty. One
writer at a time (:mod:`nczmap.zmap.locking`); the next writer removes the temporary files of one that died.

No key reaches outside the store, whatever happens to its paths meanwhile: the map holds the store's
directory open (:class:`~nczmap.zmap.beneath.Beneath`) and reaches every object and directory from that
descriptor: in one ``openat2(RESOLVE_BENEATH)`` call where Linux has it, else (and wherever a link is met)
a component at a time, never letting the kernel follow a link. Symbolic links in the store are followed
only while they stay beneath it; a key that leaves is ``AccessDenied``. Directory descriptors are cached,
so an object in a directory met before costs one ``openat`` even without ``openat2``. A store removed while
open reads as ``DatasetNotFound``; one replaced by another directory (``nczmap copy`` renames a new store
into place) is opened again when a key is missing from the old one.

Objects are regular files. A FIFO, socket or device in the store is no object (``exists`` is False, ``len``
and ``read`` raise ``EmptyError``, as for a directory), and is never opened in a way that could block. A key
longer than the file system's limits (``PC_PATH_MAX`` with the store's path, ``PC_NAME_MAX`` a name) names
no object and cannot be written (``KeyNameError``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from nczmap.errors import (
    AccessDenied,
    DatasetExists,
    DatasetNotFound,
    EmptyError,
    KeyConflictError,
    KeyNameError,
    NCZError,
    StorageError,
    from_os_error,
)
from nczmap.url import ParsedURL
from nczmap.zmap import byteranges
from nczmap.zmap.base import STORE_MARKERS, ByteRange, ZMap
from nczmap.zmap.beneath import Beneath, NotRegular
from nczmap.zmap.keys import ROOT, TEMP_PREFIX, is_listable_name, normalize_key, sort_names

if TYPE_CHECKING:
    from nczmap.zmap import locking
    from nczmap.zmap.beneath import _Held

_EMPTY_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ENXIO)  # ENXIO: opening a socket
_MISSING = (errno.ENOENT, errno.ENOTDIR)
_TEMPORARY = re.compile(re.escape(TEMP_PREFIX) + "[0-9a-f]{16}")  # what _replace writes before renaming
_CACHED_DIRECTORIES = 256
_OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Parts = Sequence[str]


class FileMap(ZMap):
    driver = "file"

    def __init__(self, url: ParsedURL, mode: str, *, lock: bool = True) -> None:
        """``lock=False`` skips the writer lock: only for a caller that holds the dataset's lock itself."""
        super().__init__(url, mode)
        self.root = url.path
        self._writer_lock: locking.WriterLock | None = None
        self._beneath: Beneath | None = None
        self._identity = (0, 0)  # st_dev, st_ino of the directory held
        self._retired: list[Beneath] = []  # held before the store was replaced; closed at close
        self._reopening = threading.Lock()
        self._path_max, self._name_max = _limits(self.root)
        self._root_bytes = len(os.fsencode(self.root))
        if lock and mode != "r":
            from nczmap.zmap import locking  # writers only (it imports shutil, bz2, lzma)
        try:
            if lock and mode in ("a", "w"):
                self._writer_lock = locking.acquire(self.root)  # before anything is created or emptied
            self._open_root()
            if lock and mode == "r+":
                self._writer_lock = locking.acquire(self.root)  # once the dataset is known to exist
            if self._writer_lock is not None and self._writer_lock.stale:
                _remove_temporaries(self._held().fd)
        except BaseException:
            self._release()
            raise

    def reopen_options(self) -> dict[str, object]:
        # A copy in another process (a dask worker) writes under the lock this map holds.
        return {} if self.readonly else {"lock": False}

    # ----------------------------------------------------------------- opening
    def _open_root(self) -> None:
        replace = False
        if self.mode == "w":
            replace = check_replaceable(self.root)
            if not replace:
                self._makedirs(self.root)
        else:
            kind = _path_kind(self.root)
            if kind == "missing":
                if self.mode != "a":
                    raise DatasetNotFound(f"no dataset at {self.root!r} (file driver)")
                self._makedirs(self.root)
            elif kind != "dir":
                raise StorageError(
                    f"{self.root!r} is not a directory: the file driver needs a "
                    "directory (use mode=zip for a zip archive, mode=manifest for a kerchunk manifest)"
                )
        self._hold_root()
        if replace:
            self._truncate()

    def _hold_root(self) -> None:
        try:
            beneath = Beneath(self.root, f"the store {self.root!r}", cache=_CACHED_DIRECTORIES)
        except OSError as exc:
            if exc.errno in _MISSING:
                raise DatasetNotFound(f"no dataset at {self.root!r} (file driver)") from None
            raise from_os_error(exc, f"cannot open dataset {self.root!r}") from exc
        info = os.fstat(beneath.fd)
        self._beneath, self._identity = beneath, (info.st_dev, info.st_ino)

    def _makedirs(self, path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except FileExistsError as exc:
            raise KeyConflictError(f"cannot create directory {path!r}: a file is in the way") from exc
        except OSError as exc:
            raise from_os_error(exc, f"cannot create directory {path!r}") from exc

    def _held(self) -> Beneath:
        if self._beneath is None:
            raise StorageError(f"{self.location} is closed")
        return self._beneath

    # ----------------------------------------------------------------- keys as paths
    def _parts(self, key: str) -> list[str] | None:
        """The key's path below the store; None when the file system cannot hold a name that long."""
        parts = key[1:].split("/")
        length = len(key) * 4  # UTF-8 bytes at most
        if length <= self._name_max and self._root_bytes + length < self._path_max:
            return parts
        if self._root_bytes + len(key.encode()) >= self._path_max:
            return None
        return parts if all(len(part.encode()) <= self._name_max for part in parts) else None

    def _too_long(self, key: str) -> KeyNameError:
        return KeyNameError(
            f"cannot write {key!r} in {self.root!r}: the key is longer than the file system allows "
            f"({self._path_max} bytes with the store's path, {self._name_max} a name)"
        )

    def _after_miss(self, directory: Parts) -> str:
        """Why something was missing: ``"gone"`` (the store was removed), ``"retry"`` (the store was
        replaced, or cached directories on the way removed: look again) or ``"absent"``."""
        held = self._held()
        try:
            info = os.stat(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return "gone"
        except OSError:
            return "absent"
        if (info.st_dev, info.st_ino) != self._identity:
            return self._reopen_root(held) if stat.S_ISDIR(info.st_mode) else "gone"
        return "retry" if held.forget_removed(directory) else "absent"

    def _reopen_root(self, old: Beneath) -> str:
        """Hold the directory the store's path names now (another program replaced the store)."""
        with self._reopening:
            if self._beneath is not old:
                return "retry"  # another thread did it
            try:
                self._hold_root()
            except NCZError:
                return "gone"
            # other threads may be walking from it: closed at close; its cached directories now (those
            # in use when their users release them), else each replacement would keep up to 256 open
            old.forget()
            self._retired.append(old)
        return "retry"

    # ----------------------------------------------------------------- reading
    def _open_object(self, key: str) -> int:
        """A descriptor of the object at ``key``: ``EmptyError`` unless it is a regular file."""
        parts = self._parts(key)
        if parts is None:
            raise self._read_error(key, OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG)))
        for attempt in (1, 2):
            try:
                return self._held().open_file(parts, key)
            except NotRegular:
                raise EmptyError(key, self.root) from None
            except AccessDenied:
                raise
            except OSError as exc:
                if exc.errno not in _MISSING:
                    raise self._read_error(key, exc) from None
                why = self._after_miss(parts[:-1])
                if why == "gone":
                    raise self._removed(key) from None
                if why == "absent" or attempt == 2:
                    raise EmptyError(key, self.root) from None
        raise AssertionError("unreachable")

    def _removed(self, key: str) -> DatasetNotFound:
        # else every chunk of a deleted store would read as fill values
        return DatasetNotFound(f"{self.root!r} was removed while open: cannot read {key!r}")

    def _read_error(self, key: str, exc: OSError) -> NCZError:
        if exc.errno in _EMPTY_ERRNOS:
            return EmptyError(key, self.root)
        return from_os_error(exc, f"cannot read {key!r} in {self.root!r}")

    def _stat(self, key: str) -> os.stat_result | None:
        parts = self._parts(key)
        if parts is None:
            return None
        for attempt in (1, 2):
            try:
                info = self._held().stat(parts, key)
            except NotRegular:
                return None
            except AccessDenied:
                raise
            except OSError as exc:
                if exc.errno not in _EMPTY_ERRNOS:
                    raise from_os_error(exc, f"cannot stat {key!r} in {self.root!r}") from exc
                info = None
            if info is not None:
                return info if stat.S_ISREG(info.st_mode) else None
            if attempt == 2 or self._after_miss(parts[:-1]) != "retry":
                return None
        return None

    def _exists(self, key: str) -> bool:
        return self._stat(key) is not None

    def _len(self, key: str) -> int:
        info = self._stat(key)
        if info is None:
            raise EmptyError(key, self.root)
        return info.st_size

    def _byte_range(self, key: str) -> ByteRange:
        from nczmap.manifest.containers import normalize

        info = self._stat(key)
        if info is None:
            raise EmptyError(key, self.root)
        url = normalize(os.path.join(self.root, key[1:]), None, links=False)
        return ByteRange(key, url, 0, info.st_size, {"size": info.st_size, "mtime": info.st_mtime_ns})

    def _read(self, key: str, start: int, count: int | None) -> bytes:
        fd = self._open_object(key)
        try:
            return byteranges.read_range(fd, start, count)
        except OSError as exc:
            raise self._read_error(key, exc) from None
        finally:
            os.close(fd)

    def read_objects(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Many small whole objects (metadata) read in one pass: key -> content. A key missing from the
        answer is for :meth:`read` to decide (absent, not a regular file, 64 KiB or more, behind a link,
        an illegal key, an error): nothing is refused here that ``read`` would return, and nothing is
        returned that it would refuse. Every object is opened beneath the store as ``read`` opens it."""
        self._check_open()
        wanted: list[str] = []
        paths: list[str] = []
        name_max, room = self._name_max, self._path_max - self._root_bytes
        for key in keys:
            try:
                normal = normalize_key(key)
            except KeyNameError:
                continue
            most = len(normal) * 4  # UTF-8 bytes at most: short keys need no closer look (_parts)
            if normal != ROOT and ((most <= name_max and most < room) or self._parts(normal) is not None):
                wanted.append(key)
                paths.append(normal[1:])
        contents = self._held().read_small_files(paths, byteranges.FIRST_READ_BYTES)
        return {key: data for key, data in zip(wanted, contents, strict=True) if data is not None}

    def _read_into(self, key: str, buffer: memoryview, start: int) -> int:
        fd = self._open_object(key)
        try:
            return byteranges.read_into(fd, buffer, start)
        except OSError as exc:
            raise self._read_error(key, exc) from None
        finally:
            os.close(fd)

    def _search(self, prefix: str) -> list[str]:
        parts = [] if prefix == ROOT else self._parts(prefix)
        if parts is None:
            return []
        for attempt in (1, 2):
            names = self._list(parts, prefix)
            if names or attempt == 2 or self._after_miss(parts) != "retry":
                return sort_names(names)
        return []

    def _list(self, parts: Parts, prefix: str) -> list[str]:
        try:
            fd = self._held().open_directory(parts, prefix)
        except AccessDenied:
            raise
        except OSError as exc:
            if exc.errno in _EMPTY_ERRNOS:
                return []
            raise from_os_error(exc, f"cannot list {prefix!r} in {self.root!r}") from exc
        try:
            with os.scandir(fd) as entries:
                return [entry.name for entry in entries if is_listable_name(entry.name)]
        except OSError as exc:
            if exc.errno in _EMPTY_ERRNOS:
                return []
            raise from_os_error(exc, f"cannot list {prefix!r} in {self.root!r}") from exc
        finally:
            os.close(fd)

    # ----------------------------------------------------------------- writing
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

    def _replace(self, key: str, fill: Callable[[int], None]) -> None:
        """Write ``key`` atomically: ``fill`` writes a temporary file beside it, which then replaces it."""
        parts = self._parts(key)
        if parts is None:
            raise self._too_long(key)
        for attempt in (1, 2):
            parent = self._parent_for_writing(parts, key)
            try:
                self._refuse_directory(parent.fd, parts, key)
                _replace_in(parent.fd, parts[-1], fill)
                return
            except FileNotFoundError:  # the directory was removed since it was cached
                if attempt == 2 or self._after_miss(parts[:-1]) != "retry":
                    raise StorageError(
                        f"cannot write {key!r} in {self.root!r}: its directory was removed"
                    ) from None
            except OSError as exc:
                if isinstance(exc, NCZError):
                    raise
                raise from_os_error(exc, f"cannot write {key!r} in {self.root!r}") from exc
            finally:
                parent.release()

    def _refuse_directory(self, parent: int, parts: Parts, key: str) -> None:
        """KeyConflictError if ``key`` is a directory (or a link to one in the store)."""
        try:
            mode = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                info = self._held().stat(parts, key)
                mode = info.st_mode if info is not None else 0
        except OSError:  # absent, or a link leading out (AccessDenied): replaced, never followed
            return
        if stat.S_ISDIR(mode):
            raise KeyConflictError(f"cannot write {key!r} in {self.root!r}: it is a directory")

    def _parent_for_writing(self, parts: Parts, key: str) -> _Held:
        """The key's directory, held; missing directories are made one at a time beneath the store."""
        directory = parts[:-1]
        missing = 0  # components at the end of ``directory`` that do not exist
        while True:
            try:
                held = self._held().directory(directory[: len(directory) - missing], key)
                break
            except FileNotFoundError:
                missing += 1
            except NotADirectoryError:  # an object in the way: found making them all from the top
                held, missing = self._held().directory((), key), len(directory)
                break
            except OSError as exc:
                raise self._write_error(key, exc) from None
        if missing:
            self._held().forget_removed(directory)
        for depth in range(len(directory) - missing + 1, len(directory) + 1):
            try:
                child = self._directory_made(held.fd, directory[:depth], key)
            finally:
                held.release()
            held = child
        return held

    def _directory_made(self, parent: int, directory: Parts, key: str) -> _Held:
        try:
            os.mkdir(directory[-1], dir_fd=parent)
        except FileExistsError:
            pass
        except OSError as exc:
            raise self._write_error(key, exc) from None
        try:
            return self._held().directory(directory, key)
        except NotADirectoryError:
            ancestor = "/" + "/".join(directory)
            raise KeyConflictError(
                f"cannot write {key!r} in {self.root!r}: {ancestor!r} is an object"
            ) from None
        except OSError as exc:
            raise self._write_error(key, exc) from None

    def _write_error(self, key: str, exc: OSError) -> NCZError:
        if isinstance(exc, NCZError):
            return exc
        return from_os_error(exc, f"cannot write {key!r} in {self.root!r}")

    # ----------------------------------------------------------------- deleting
    def _delete(self, key: str) -> None:
        parts = self._parts(key)
        if parts is None:
            return  # no such name can exist here
        try:
            parent = self._held().directory(parts[:-1], key)
        except AccessDenied:
            raise
        except OSError as exc:
            if exc.errno in _MISSING:
                return
            raise self._delete_error(key, exc) from None
        try:
            removed = self._remove(parent.fd, parts, key)
        finally:
            parent.release()
        if removed:
            self._prune(parts)

    def _remove(self, parent: int, parts: Parts, key: str) -> bool:
        """Remove the entry ``parts[-1]``: a link itself (never what it points at), a file or a tree."""
        name = parts[-1]
        mode = 0
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                _remove_tree(parent, name)
            else:
                os.unlink(name, dir_fd=parent)
        except OSError as exc:
            if exc.errno in _EMPTY_ERRNOS:
                return False
            raise self._delete_error(key, exc) from None
        finally:
            if stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
                self._held().forget(parts)  # it, or what the link led to, may be cached
        return True

    def _delete_error(self, key: str, exc: OSError) -> NCZError:
        return from_os_error(exc, f"cannot delete {key!r} in {self.root!r}")

    def _prune(self, parts: Parts) -> None:
        """Remove the directories above ``parts`` left empty, nearest first (never the root)."""
        removed = None
        for depth in range(len(parts) - 1, 0, -1):
            directory = parts[:depth]
            try:
                parent = self._held().directory(directory[:-1], "/" + "/".join(directory))
            except OSError:
                break
            try:
                os.rmdir(directory[-1], dir_fd=parent.fd)
            except OSError:
                break
            finally:
                parent.release()
            removed = directory
        if removed is not None:
            self._held().forget(removed)  # once, for all below it

    def _truncate(self) -> None:
        beneath = self._held()
        try:
            _empty_directory(beneath.fd)
        except OSError as exc:
            raise from_os_error(exc, f"cannot truncate {self.root!r}") from exc
        finally:
            beneath.forget()

    # ----------------------------------------------------------------- closing
    def _close(self, delete: bool) -> None:
        try:
            if delete and self._beneath is not None:
                try:
                    _empty_directory(self._beneath.fd)
                    os.rmdir(self.root)
                except OSError:
                    pass  # as much as could be removed
        finally:
            self._release()

    def _release(self) -> None:
        try:
            for beneath in [*self._retired, *([self._beneath] if self._beneath else [])]:
                beneath.close()
            self._retired, self._beneath = [], None
        finally:
            if self._writer_lock is not None:
                self._writer_lock.release()

    def abort(self) -> None:
        """Close; a dataset being created (mode ``w``) is removed, as netcdf-c's ``nc_abort`` does."""
        self.close(delete=self.mode == "w" and not self.closed)


def _limits(root: str) -> tuple[int, int]:
    """The file system's longest path and name (bytes) at ``root`` or the nearest existing parent."""
    path = os.path.abspath(root)
    while True:
        try:
            return os.pathconf(path, "PC_PATH_MAX"), os.pathconf(path, "PC_NAME_MAX")
        except (OSError, ValueError):
            if path == os.path.dirname(path):
                return 4096, 255
            path = os.path.dirname(path)


def _replace_in(directory: int, name: str, fill: Callable[[int], None]) -> None:
    """Write ``name`` in the held ``directory`` through a temporary file renamed over it."""
    temp = f"{TEMP_PREFIX}{os.urandom(8).hex()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666, dir_fd=directory)
    try:
        try:
            fill(fd)
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=directory)
        raise


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


# ----------------------------------------------------------------- trees, without recursion or links
def _entries(directory: int) -> tuple[list[str], list[str]]:
    """The subdirectories (real ones, not links) and the other entries of an open directory."""
    directories: list[str] = []
    others: list[str] = []
    # a descriptor of its own: one shared with other threads shares the position in the listing
    own = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=directory)
    try:
        with os.scandir(own) as entries:
            for entry in entries:
                try:
                    is_directory = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_directory = False
                (directories if is_directory else others).append(entry.name)
    finally:
        os.close(own)
    return directories, others


def _open_subdirectory(parent: int, name: str) -> int | None:
    """A descriptor of the real directory ``name``; None if it is gone or no longer a directory."""
    try:
        return os.open(name, _OPEN_DIRECTORY, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def _walk_tree(
    top: int, visit: Callable[[int], list[str]], leave: Callable[[int, str], None] | None = None
) -> None:
    """Depth first through the open directory ``top`` and the real directories below it (links are never
    followed): ``visit(fd)`` handles a directory's entries and returns the subdirectories to enter, and
    ``leave(parent, name)`` runs once a subdirectory is done (or found no longer a directory). No
    recursion (``shutil.rmtree`` and ``os.fwalk`` recurse once per level); one descriptor a level."""
    stack: list[tuple[int, str, int, list[str]]] = [(-1, "", top, [])]
    try:
        stack[0][3].extend(visit(top))
        while stack:
            up, name, fd, left = stack[-1]
            if not left:
                stack.pop()
                if fd != top:
                    os.close(fd)
                    if leave is not None:
                        leave(up, name)
                continue
            child = left.pop()
            opened = _open_subdirectory(fd, child)
            if opened is None:
                if leave is not None:
                    leave(fd, child)
                continue
            stack.append((fd, child, opened, []))
            stack[-1][3].extend(visit(opened))
    finally:
        for _, _, fd, _ in stack:
            if fd != top:
                os.close(fd)


def _unlink_present(directory: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=directory)


def _remove_entry(directory: int, name: str) -> None:
    """Remove the empty directory, link or file ``name``."""
    try:
        os.rmdir(name, dir_fd=directory)
    except FileNotFoundError:
        pass
    except NotADirectoryError:  # a link (removed itself, never what it points at) or a file
        _unlink_present(directory, name)


def _clear_files(directory: int) -> list[str]:
    """Unlink every entry of ``directory`` but its subdirectories, which are returned."""
    directories, others = _entries(directory)
    for name in others:
        _unlink_present(directory, name)
    return directories


def _empty_directory(directory: int) -> None:
    _walk_tree(directory, _clear_files, _remove_entry)


def _remove_tree(parent: int, name: str) -> None:
    """``rm -r name`` in the open directory ``parent``, never following a link."""
    top = _open_subdirectory(parent, name)
    if top is not None:
        try:
            _empty_directory(top)
        finally:
            os.close(top)
    _remove_entry(parent, name)


def _remove_temporaries(root: int) -> None:
    """Remove the temporary files of a writer that died in the store (``_replace`` makes them)."""

    def visit(directory: int) -> list[str]:
        directories, others = _entries(directory)
        for name in others:
            if _TEMPORARY.fullmatch(name):
                _unlink_present(directory, name)
        # a staging directory (a copy into a dataset nested here) is not ours to sweep
        return [name for name in directories if not name.startswith(TEMP_PREFIX)]

    _walk_tree(root, visit)
