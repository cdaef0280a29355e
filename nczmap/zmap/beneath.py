"""Opening paths beneath a directory, so that what is checked is what is opened.

A check of a path followed by an open of the same path can be beaten by a race: between the two, another
process swaps a directory for a symbolic link to somewhere else. :class:`Beneath` never opens a path
string: it holds a descriptor of its directory and opens every component of a relative path from the
descriptor of the one before it (``openat`` with ``O_NOFOLLOW``), so the kernel never follows a link on
its own. A link met on the way is read (``readlinkat``) and followed here, only while it stays beneath
the directory: a relative target continues from where the link is (``..`` may not climb above the
directory), an absolute one must name the directory (its real path or the spelling it was opened by).
Anything else is :class:`~nczmap.errors.AccessDenied`. A link swapped back and forth while it is read is
tried again, a bounded number of times, then refused.

Objects are regular files: a FIFO, socket, device or directory at the end of a path is never read (it is
opened non-blocking, so a FIFO cannot hang the open, and refused after ``fstat``).

Directory descriptors along the way may be cached (``cache``): caching a descriptor keeps the decision
that was made about *that directory*, not about a path, so a later swap of the path cannot redirect it.
A cached directory found gone is dropped and the path walked again.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Sequence

from nczmap.errors import AccessDenied, StorageError

MAX_LINKS = 40  # as the kernel's own limit on links followed in one path
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_DIRECTORY = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
GONE = (errno.ENOENT, errno.ENOTDIR)


class NotRegular(StorageError):
    """The path names something that is not a regular file (a directory, FIFO, socket or device)."""


class Beneath:
    """A directory held open; paths relative to it are opened without ever leaving it.

    ``path`` is opened as the user named it (links in it are the user's choice); ``what`` names the
    directory in errors ("the store '/d/x.file'", "the container file:///data/"). ``cache`` keeps up to
    that many directory descriptors of paths walked before.
    """

    def __init__(self, path: str, what: str, cache: int = 0, aliases: Sequence[str] = ()) -> None:
        self.path = os.path.normpath(path)
        self.aliases = tuple(os.path.normpath(a) for a in aliases)  # other spellings of the directory
        self.what = what
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.real = os.path.realpath(self.path)
        self._cache_size = cache
        self._cache: OrderedDict[tuple[str, ...], _Held] = OrderedDict()
        self._lock = _LOCK  # one lock for the cache and every held descriptor's count of users

    # ----------------------------------------------------------------- public
    def open_file(self, parts: Sequence[str], shown: str) -> int:
        """A descriptor of the regular file at ``parts`` (``shown`` names it in errors).

        FileNotFoundError when it does not exist; :class:`NotRegular` when it is no regular file;
        AccessDenied when the path leaves the directory."""
        parent, name = self.parent(parts, shown)
        try:
            fd = self._open_last(parent.fd, name, parts, shown)
        finally:
            parent.release()
        try:
            info = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise NotRegular(f"{shown!r} in {self.what} is {kind}: only regular files are read")
        return fd

    def stat(self, parts: Sequence[str], shown: str) -> os.stat_result | None:
        """What ``parts`` is (links beneath the directory followed); None if it does not exist."""
        try:
            parent, name = self.parent(parts, shown)
        except OSError as exc:
            if exc.errno in GONE:
                return None
            raise
        try:
            info = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                fd = self._open_last(parent.fd, name, parts, shown)
                try:
                    info = os.fstat(fd)
                finally:
                    os.close(fd)
            return info
        except OSError as exc:
            if exc.errno in GONE:
                return None
            raise
        finally:
            parent.release()

    def parent(self, parts: Sequence[str], shown: str) -> tuple[_Held, str]:
        """The held directory holding ``parts[-1]`` and that last name (release it when done)."""
        if not parts:
            raise NotRegular(f"{shown!r} names {self.what} itself, not a file in it")
        directory = tuple(parts[:-1])
        return self.directory(directory, shown), parts[-1]

    def directory(self, parts: Sequence[str], shown: str) -> _Held:
        """The directory at ``parts``, held (``release()`` it); FileNotFoundError if absent."""
        key = tuple(parts)
        if not key:
            return _Held(self.fd, owned=False)
        with self._lock:
            held = self._cache.get(key)
            if held is not None:
                self._cache.move_to_end(key)
                held.users += 1
                return held
        fd = self._walk(list(key), shown, final_directory=True)
        held = _Held(fd, owned=True)
        if not self._cache_size:
            held.users = 1
            return held
        with self._lock:
            if key in self._cache:  # another thread walked it too: use one, close the other
                os.close(fd)
                held = self._cache[key]
            else:
                self._cache[key] = held
                held.cached = True
                self._evict()
            held.users += 1
        return held

    def forget(self, parts: Sequence[str] = ()) -> None:
        """Drop cached directories at and under ``parts`` (all of them for ``()``): they changed."""
        prefix = tuple(parts)
        with self._lock:
            for key in [k for k in self._cache if k[: len(prefix)] == prefix]:
                self._cache.pop(key).uncache()

    def close(self) -> None:
        self.forget()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # ----------------------------------------------------------------- walking
    def _evict(self) -> None:
        while len(self._cache) > self._cache_size:
            _, held = self._cache.popitem(last=False)
            held.uncache()

    def _open_last(self, parent: int, name: str, parts: Sequence[str], shown: str) -> int:
        try:
            return os.open(name, _OPEN_FILE, dir_fd=parent)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
        return self._walk(list(parts), shown, final_directory=False)  # a link: resolve it beneath

    def _walk(self, parts: list[str], shown: str, final_directory: bool) -> int:
        """Open ``parts`` component by component from the directory's descriptor."""
        stack = [self.fd]
        pending = list(reversed(parts))
        links = 0
        try:
            while pending:
                name = pending.pop()
                if name in ("", "."):
                    continue
                if name == "..":
                    if len(stack) == 1:
                        raise self._escape(shown)
                    os.close(stack.pop())
                    continue
                last = not pending
                flags = _OPEN_DIRECTORY if (final_directory or not last) else _OPEN_FILE
                try:
                    fd = os.open(name, flags, dir_fd=stack[-1])
                except OSError as exc:
                    # a link: ELOOP, or ENOTDIR where a directory was asked for (Linux says so then)
                    wanted_directory = exc.errno == errno.ENOTDIR and flags & os.O_DIRECTORY
                    if exc.errno != errno.ELOOP and not wanted_directory:
                        raise
                    links += 1
                    if links > MAX_LINKS:
                        raise AccessDenied(
                            f"{shown!r} in {self.what}: too many symbolic links (a loop, or links being "
                            "swapped while read): not followed"
                        ) from None
                    target = self._readlink(name, stack[-1])
                    if target is None:
                        if exc.errno == errno.ENOTDIR and not _is_directory(name, stack[-1]):
                            raise  # a file where a directory should be
                        pending.append(name)  # no longer a link (swapped back): try the name again
                        continue
                    if target.startswith("/"):
                        for fd in stack[1:]:
                            os.close(fd)
                        del stack[1:]
                        target = self._inside(target, shown)
                    pending.extend(reversed(target.split("/")))
                    continue
                if last:
                    return fd
                stack.append(fd)
            # the path ended on ".." or "." (or was empty): the directory reached is the answer
            if not final_directory:
                raise NotRegular(f"{shown!r} in {self.what} names a directory: only regular files are read")
            top = stack.pop() if len(stack) > 1 else os.dup(self.fd)
            return top
        finally:
            for fd in stack[1:]:
                os.close(fd)

    def _readlink(self, name: str, parent: int) -> str | None:
        try:
            return os.readlink(name, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return None  # swapped back to a real file or directory since the open
            raise

    def _inside(self, target: str, shown: str) -> str:
        """An absolute link target as a path relative to the directory; AccessDenied if it leaves."""
        target = os.path.normpath(target)
        for root in (self.real, self.path, *self.aliases):
            if target == root:
                return "."
            if target.startswith(root.rstrip("/") + "/"):
                return target[len(root.rstrip("/")) + 1 :]
        raise self._escape(shown)

    def _escape(self, shown: str) -> AccessDenied:
        return AccessDenied(
            f"{shown!r} leads outside {self.what} through a symbolic link or '..': not followed"
        )


def _is_directory(name: str, parent: int) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


class _Held:
    """A directory descriptor in use; a cached one is closed only when nobody uses it any more."""

    __slots__ = ("cached", "fd", "owned", "users")

    def __init__(self, fd: int, owned: bool) -> None:
        self.fd = fd
        self.owned = owned
        self.users = 0
        self.cached = False

    def release(self) -> None:
        if not self.owned:
            return
        with _LOCK:
            self.users -= 1
            if self.users or self.cached:
                return
        self._close()

    def uncache(self) -> None:
        """Called with the lock held, when the cache lets go of it."""
        self.cached = False
        if not self.users:
            self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_LOCK = threading.RLock()
