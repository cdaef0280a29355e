"""Saving a local kerchunk Parquet manifest: a new version built beside it, then swapped in whole.

The writer holds the manifest's lock (:mod:`nczmap.zmap.locking`) and the directory of the version it
loaded. A save:

1. builds the new version in a new sibling directory ``.nczmap-tmp-copy-<random>-<name>``: the record files
   the session changed are written (each whole, then fsync'd), every other record file of the loaded
   version is hard-linked into it unread (copied where the file system cannot link), ``.zmetadata`` is
   written last, and every directory of it is fsync'd;
2. swaps it with the manifest in one step, ``renameat2(RENAME_EXCHANGE)``; where the kernel or the file
   system cannot exchange names, the manifest is renamed aside (``.nczmap-tmp-old-...``) and the new one
   renamed in;
3. renames the version it replaced to ``.nczmap-tmp-retired-<random>-<name>`` and fsyncs the parent.

Crash safety: nothing of the manifest's own directory is ever written, so until the swap the name holds
the old version, whole; the swap is one rename, after which it holds the new version, complete and on disk
before it got the name. A writer killed before the swap leaves a ``copy`` sibling; killed after it, the
replaced version under the ``copy`` name; killed between the two renames of the fallback, no manifest and
an ``old`` sibling: the next writer of the manifest (:func:`locking.acquire` with ``clean``) puts an ``old``
version back where the manifest is missing, and removes every other sibling. Readers never see a mixture.

Readers that opened the replaced version hold its directory and go on reading it: it is kept (retired)
until the next writer removes it, its ``.zmetadata`` first, which tells such a reader that a record file
found missing was removed rather than never written (``ManifestMap._replaced``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import shutil
import stat

from nczmap.errors import NCZError, StorageError, from_os_error
from nczmap.manifest.model import Manifest
from nczmap.zmap import locking
from nczmap.zmap.base import STORE_MARKERS
from nczmap.zmap.beneath import Beneath
from nczmap.zmap.keys import TEMP_PREFIX

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# renameat2 answers these where the kernel (ENOSYS) or the file system (EINVAL) cannot exchange names
_CANNOT_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP}


def save_parquet(manifest: Manifest, real: str, previous: Beneath | None) -> None:
    """Save ``manifest`` as the Parquet manifest at ``real`` (its real path), keeping the record files it
    did not change from the directory ``previous`` it was loaded from (None: it was not loaded)."""
    from nczmap.manifest import kerchunk_parquet

    if os.path.lexists(real) and not os.path.isdir(real):
        raise StorageError(f"{real!r} is not a directory: a Parquet manifest is one")
    staging = locking.sibling_path(real, "copy")
    try:
        try:
            os.makedirs(os.path.dirname(real), exist_ok=True)
            os.mkdir(staging)
            if previous is not None:  # the new version's directory as permissive as the old one's
                os.chmod(staging, stat.S_IMODE(os.fstat(previous.fd).st_mode))
            building = _Staging(staging, previous)
            keep = building.keep if previous is not None else None
            kerchunk_parquet.dump(manifest, building.write, keep=keep)  # .zmetadata last
            building.sync()
        except BaseException:
            locking.remove_tree(staging)
            raise
        put_in_place(staging, real)
    except OSError as exc:
        if isinstance(exc, NCZError):
            raise
        raise from_os_error(exc, f"cannot save the manifest {real!r}") from exc


def put_in_place(staging: str, real: str) -> None:
    """Give the complete (synced) directory ``staging`` the name ``real`` in one step; the version it
    replaces is renamed to a ``retired`` sibling, for its readers, until the next writer. Should this
    fail, ``real`` is as it was and ``staging`` is removed."""
    replaced = None  # where the version replaced is, once the new one has the name
    try:
        if not os.path.lexists(real):
            os.rename(staging, real)
        elif _exchange(staging, real):
            replaced = staging
        else:
            aside = locking.sibling_path(real, "old")
            os.rename(real, aside)
            try:
                move_in(staging, real)  # killed here: the next lock holder renames ``aside`` back
            except BaseException:
                os.rename(aside, real)
                raise
            replaced = aside
    except BaseException:
        locking.remove_tree(staging)
        raise
    if replaced is not None:
        _retire(replaced, real)
    with contextlib.suppress(OSError):
        sync_directory(os.path.dirname(real))


def move_in(staging: str, real: str) -> None:
    """The fallback's second step: the new version takes the name the old one left."""
    os.rename(staging, real)


def _retire(path: str, real: str) -> None:
    """Keep the replaced version ``path`` as a ``retired`` sibling (left under its staging name if that
    fails: the next writer removes either)."""
    with contextlib.suppress(OSError):
        os.rename(path, locking.sibling_path(real, "retired"))


def _exchange(a: str, b: str) -> bool:
    """Exchange the names ``a`` and ``b`` atomically; False where this system cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _CANNOT_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), b)


@functools.cache
def _renameat2():
    """glibc's ``renameat2`` (Linux 3.15+), or None."""
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def sync_directory(path: str) -> None:
    """fsync a directory: the names made or renamed in it are on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replaceable(path: str) -> bool:
    """Whether a new Parquet manifest may replace what is at the local ``path``: nothing, or a directory
    that is empty or holds a Zarr store or reference set (``.zmetadata``, ``.zgroup``...), as creating a
    directory store may replace one (``nczmap.zmap.file.check_replaceable``)."""
    if not os.path.isdir(path):
        return not os.path.lexists(path)
    try:
        entries = [name for name in os.listdir(path) if not name.startswith(TEMP_PREFIX)]
    except OSError:
        return False
    return not entries or any(marker in entries for marker in STORE_MARKERS)


class _Staging:
    """The new version's directory being filled: files written whole and fsync'd, unchanged record files
    linked from the version loaded (``previous``)."""

    def __init__(self, path: str, previous: Beneath | None) -> None:
        self.path = path
        self.previous = previous
        self._made = {path}  # directories made here: fsync'd before the swap

    def write(self, name: str, data: bytes) -> None:
        target = self._place(name)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    def keep(self, name: str) -> None:
        """Put the loaded version's record file ``name`` in the new version as it is, unread: a hard link
        (to what is beneath the loaded directory, links inside it followed as a reader follows them), or
        where the file system cannot link, a copy."""
        assert self.previous is not None
        parts = name.split("/")
        target = self._place(name)
        held = self.previous.directory(parts[:-1], name)
        try:
            os.link(parts[-1], target, src_dir_fd=held.fd, follow_symlinks=False)
            return
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise StorageError(f"{name!r} of the manifest disappeared while it was being saved") from None
        finally:
            held.release()
        self._copy(parts, name, target)

    def _copy(self, parts: list[str], name: str, target: str) -> None:
        assert self.previous is not None
        source = self.previous.open_file(parts, name)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                with open(source, "rb", closefd=False) as reader, open(fd, "wb", closefd=False) as writer:
                    shutil.copyfileobj(reader, writer)
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            os.close(source)

    def _place(self, name: str) -> str:
        """The path of ``name`` in the new version, its directories made."""
        target = os.path.join(self.path, name)
        directory = os.path.dirname(target)
        if directory not in self._made:
            os.makedirs(directory, exist_ok=True)
            while directory not in self._made:
                self._made.add(directory)
                directory = os.path.dirname(directory)
        return target

    def sync(self) -> None:
        for directory in sorted(self._made, key=len, reverse=True):
            sync_directory(directory)
