"""One writer at a time for local datasets (directory stores and zip archives): an advisory writer lock.

A map opened for writing (modes ``r+``, ``a``, ``w``) and ``nczmap copy`` into a local destination hold an
exclusive ``flock`` on a lock file beside the dataset, ``<parent>/.nczmap-tmp-lock-<name>`` (the reserved
prefix: never a key, never listed). It sits beside the dataset, not inside it, because the lock must exist
before the dataset does (creation, a copy staged elsewhere) and outlive it being replaced by rename (zip
commits, a copy moved into place) or deleted. The file holds ``pid host time`` of the holder for the error
message, and the holder unlinks it on release; a writer that dies leaves it behind, and whoever takes the
lock next finds the old text there (:attr:`WriterLock.stale`) and cleans up what the dead writer staged.
Readers (mode ``r``) never take it. ``flock`` belongs to an open file description, so a second writable
map in the same process is locked out too. A busy lock is retried until ``NCZMAP_LOCK_TIMEOUT`` seconds
(default 5) have passed, then :class:`~nczmap.errors.DatasetLocked` names the dataset and the holder.

What a holder stages beside the dataset has a reserved name of one of :data:`_SIBLING_KINDS` (see
:func:`sibling_path`). Only a lock holder makes or removes them, so whoever holds the lock may remove any it
finds: :func:`acquire` does when the previous holder died, and on every acquisition with ``clean=True``
(a Parquet manifest's writer leaves the version it replaced beside it, for the readers still holding it,
until the next writer comes).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time

from nczmap.errors import DatasetLocked, NCZError, from_os_error
from nczmap.zmap.keys import TEMP_PREFIX

TIMEOUT_VARIABLE = "NCZMAP_LOCK_TIMEOUT"
DEFAULT_TIMEOUT = 5.0
_POLL = 0.05
_RECORD_WAIT = 0.5  # how long a refused writer waits for a new holder to record who it is
_NAME_MAX = 200  # bytes of a dataset name kept in reserved names (255 at most in all)
# Staged siblings of a dataset named N, made only by the holder of N's lock: a copy or a new version being
# built ("copy"), the previous dataset moved aside while the new one is moved in ("old": put back if the
# dataset is missing), a file being committed ("commit"), a replaced version kept for the readers that hold
# it until the next writer ("retired": never put back).
_SIBLING_KINDS = ("copy", "old", "commit", "retired")
# A staged directory's file removed before anything else in it: a Parquet manifest's .zmetadata, whose
# absence tells a reader still holding the directory that the version it reads is being removed (so that a
# record file found missing is not taken for a record of missing chunks).
_REMOVED_FIRST = ".zmetadata"


def lock_timeout() -> float:
    """Seconds a writer waits for a busy lock: ``NCZMAP_LOCK_TIMEOUT``, or 5."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise NCZError(f"{TIMEOUT_VARIABLE}={text!r} is not a number of seconds (0 or more)")
    return value


def _short(name: str) -> str:
    """``name``, or its hash when a reserved name built on it would be too long for a file name."""
    if len(os.fsencode(name)) <= _NAME_MAX:
        return name
    import hashlib  # imported here: every reader imports this module, few names are this long

    return hashlib.sha256(os.fsencode(name)).hexdigest()


def lock_path(dataset: str) -> str:
    """Where the lock file of the local dataset ``dataset`` lives."""
    parent, name = os.path.split(os.path.realpath(dataset))
    return os.path.join(parent, f"{TEMP_PREFIX}lock-{_short(name)}")


def sibling_path(dataset: str, kind: str) -> str:
    """A new staging path of ``kind`` (``copy``, ``old``, ``commit``, ``retired``) beside ``dataset`` (a real
    path), of the form ``.nczmap-tmp-<kind>-<16 hex digits>-<name>``: what :func:`acquire` cleans up."""
    if kind not in _SIBLING_KINDS:
        raise ValueError(f"unknown staging kind {kind!r}")
    parent, name = os.path.split(dataset)
    return os.path.join(parent, f"{TEMP_PREFIX}{kind}-{os.urandom(8).hex()}-{_short(name)}")


class WriterLock:
    """The writer lock of one dataset, held from :func:`acquire` until :meth:`release`."""

    def __init__(self, dataset: str, path: str, fd: int, stale: bool) -> None:
        self.dataset = dataset  # the dataset's real path (symbolic links resolved)
        self.path = path
        self.stale = stale  # the previous holder died holding it: its staged files may be lying about
        self._fd: int | None = fd
        self._pid = os.getpid()

    def release(self) -> None:
        """Give the lock up; unlinking first, while still holding it, keeps waiters from locking a ghost."""
        if self._fd is None:
            return
        if os.getpid() == self._pid:  # a forked child's copy must not unlink the parent's lock file
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        os.close(self._fd)
        self._fd = None

    def __del__(self) -> None:  # a map dropped without close must not keep its dataset locked
        self.release()

    def __repr__(self) -> str:
        return f"<WriterLock {self.dataset!r} ({'held' if self._fd is not None else 'released'})>"


def acquire(dataset: str, timeout: float | None = None, *, clean: bool = False) -> WriterLock:
    """Take the writer lock of the local dataset at ``dataset`` (which need not exist yet).

    Waits up to ``timeout`` seconds (default :func:`lock_timeout`) for another writer to finish, then raises
    :class:`DatasetLocked`. Staging files beside the dataset left by a dead holder are removed, and with
    ``clean`` those any earlier holder left (a version it replaced, kept for its readers).
    """
    real = os.path.realpath(dataset)
    path = lock_path(real)
    parent = os.path.dirname(path)
    wait = lock_timeout() if timeout is None else timeout
    deadline = time.monotonic() + wait
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise from_os_error(exc, f"cannot create the directory of {dataset!r}") from exc
    fd = _open(path, dataset)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise _locked(dataset, path, _holder(fd), wait) from None
                time.sleep(_POLL)
                continue
            if _names(path, fd):
                break
            # The holder we waited for unlinked the file on release: lock the one now at the path.
            os.close(fd)
            fd = -1
            fd = _open(path, dataset)
        previous = _contents(fd)
        _record(fd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    lock = WriterLock(real, path, fd, stale=bool(previous.strip()))
    if lock.stale or clean:
        try:
            _clean_siblings(real)
        except BaseException:
            lock.release()
            raise
    return lock


def _open(path: str, dataset: str) -> int:
    try:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except PermissionError:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # another user's lock file: flock still works
    except OSError as exc:
        raise from_os_error(exc, f"cannot create the lock file {path!r} of {dataset!r}") from exc


def _names(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino)


def _contents(fd: int) -> str:
    try:
        return os.pread(fd, 512, 0).decode("utf-8", "replace")
    except OSError:
        return ""


def _record(fd: int) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with contextlib.suppress(OSError):  # only the error message of a refused writer needs this
        record = f"{os.getpid()} {os.uname().nodename} {stamp}\n".encode()
        os.pwrite(fd, record, 0)  # then trimmed: a reader never finds the file empty in between
        os.ftruncate(fd, len(record))


def _holder(fd: int) -> str:
    """Who holds the lock, from what it recorded. A holder that has just taken the lock may not have
    recorded itself yet: its record is waited for a moment before the refusal names nobody."""
    deadline = time.monotonic() + _RECORD_WAIT
    fields = _contents(fd).split()
    while (len(fields) < 3 or not fields[0].isdigit()) and time.monotonic() < deadline:
        time.sleep(_POLL / 4)
        fields = _contents(fd).split()
    if len(fields) < 3 or not fields[0].isdigit():
        return "another writer"
    pid, host, since = fields[:3]
    if int(pid) == os.getpid() and host == os.uname().nodename:
        return f"another map open for writing in this process (pid {pid}) since {since}"
    return f"process {pid} on host {host} since {since}"


def _locked(dataset: str, path: str, holder: str, wait: float) -> DatasetLocked:
    return DatasetLocked(
        f"{dataset!r} is open for writing by {holder}: one writer at a time (waited {wait:g} s; "
        f"{TIMEOUT_VARIABLE} sets how long to wait; lock file {path!r})"
    )


def _clean_siblings(real: str) -> None:
    """Remove what a dead holder staged beside the dataset; a dataset it had moved aside is put back."""
    parent, name = os.path.split(real)
    pattern = re.compile(
        re.escape(TEMP_PREFIX) + "(" + "|".join(_SIBLING_KINDS) + ")-[0-9a-f]{16}-" + re.escape(_short(name))
    )
    with os.scandir(parent) as entries:
        found = [
            (match.group(1), entry.path) for entry in entries if (match := pattern.fullmatch(entry.name))
        ]
    for kind, path in sorted(found, key=lambda item: item[0] != "old"):
        if kind == "old" and not os.path.lexists(real):
            os.rename(path, real)  # the writer died between moving the old dataset aside and the new one in
        elif os.path.isdir(path) and not os.path.islink(path):
            remove_tree(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def remove_tree(path: str) -> None:
    """Remove the staged directory ``path``, its ``.zmetadata`` first (see :data:`_REMOVED_FIRST`)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
        os.unlink(os.path.join(path, _REMOVED_FIRST))
    shutil.rmtree(path, ignore_errors=True)
