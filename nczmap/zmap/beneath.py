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

Where Linux has ``openat2`` (5.6 and later), a file is first opened in one call with ``RESOLVE_BENEATH``,
the kernel refusing any step out of the directory; a path it refuses for that (a link, ``..``) or that
raced a rename is then walked as above, which decides.

Objects are regular files: a FIFO, socket, device or directory at the end of a path is never read (it is
opened non-blocking, so a FIFO cannot hang the open, and refused after ``fstat``).

Directory descriptors along the way may be cached (``cache``): caching a descriptor keeps the decision
that was made about *that directory*, not about a path, so a later swap of the path cannot redirect it.
A directory not in the cache is walked from its nearest cached ancestor, one ``openat`` a component.
A cached directory found removed (:meth:`Beneath.forget_removed`) is dropped and the path walked again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence

from nczmap.errors import AccessDenied, StorageError

MAX_LINKS = 40  # as the kernel's own limit on links followed in one path
_HELD_LEVELS = 32  # directories a walk keeps open on its way down; those above are opened again for '..'
_ANCESTORS_LOOKED_UP = 16  # how far above a directory missing from the cache a cached one is looked for
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_DIRECTORY = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_OPEN_PATH = os.O_PATH | os.O_CLOEXEC  # to stat what a path names, links beneath followed
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
        fd = _open_beneath(self.fd, parts)
        if fd is None:
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

    def read_small_files(self, paths: Sequence[str], limit: int) -> list[bytes | None]:
        """The whole content of each regular file at ``paths`` (``/``-joined components, none ``.``,
        ``..`` or empty) shorter than ``limit`` bytes, each opened in one ``openat2(RESOLVE_BENEATH)``
        call; None where that does not settle it (no ``openat2``, a link on the way, absent, no regular
        file, ``limit`` bytes or more, an error): :meth:`open_file` decides those. For many small
        objects at once (metadata), with as little as possible done per file: open, fstat, read, close."""
        global _openat2
        if _openat2 is None:
            _openat2 = _find_openat2()
        if not _openat2:
            return [None] * len(paths)
        syscall, number, hows = _openat2
        how, size = hows.get(_OPEN_FILE) or _open_how(hows, _OPEN_FILE)
        directory, fstat, pread, close, regular = self.fd, os.fstat, os.pread, os.close, stat.S_ISREG
        found: list[bytes | None] = []
        for path in paths:
            fd = syscall(number, directory, path.encode(), how, size)
            if fd < 0:
                found.append(None)
                continue
            try:
                data = pread(fd, limit, 0) if regular(fstat(fd).st_mode) else None
            except OSError:
                data = None
            finally:
                close(fd)
            found.append(data if data is not None and len(data) < limit else None)
        return found

    def stat(self, parts: Sequence[str], shown: str) -> os.stat_result | None:
        """What ``parts`` is (links beneath the directory followed); None if it does not exist."""
        if len(parts) > 1 and tuple(parts[:-1]) not in self._cache:
            try:
                fd = _open_beneath(self.fd, parts, _OPEN_PATH)
            except OSError as exc:
                if exc.errno in GONE:
                    return None
                raise
            if fd is not None:
                try:
                    return os.fstat(fd)
                finally:
                    os.close(fd)
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

    def open_directory(self, parts: Sequence[str], shown: str) -> int:
        """A new descriptor of the directory at ``parts`` (close it), with its own position for listing
        it; FileNotFoundError if absent, NotADirectoryError if it is no directory."""
        with self._lock:
            held = self._cache.get(tuple(parts))
            if held is not None:
                held.users += 1
        if held is not None:
            try:
                return os.open(".", _OPEN_DIRECTORY, dir_fd=held.fd)
            finally:
                held.release()
        with contextlib.suppress(NotADirectoryError):  # also what O_NOFOLLOW says of a link: walk it
            fd = _open_beneath(self.fd, parts, _OPEN_DIRECTORY)
            if fd is not None:
                return fd
        walked = self._walk(list(parts), shown, final_directory=True)  # may share the held one's position
        try:
            return os.open(".", _OPEN_DIRECTORY, dir_fd=walked)
        finally:
            os.close(walked)

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
        fd = self._walk_directory(key, shown)
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

    def forget_removed(self, parts: Sequence[str]) -> bool:
        """Drop the cached directories at and above ``parts`` that were removed since they were cached
        (another program deleted them; a path walked again finds what is there now). True if any was."""
        key = tuple(parts)
        with self._lock:
            cached = [(key[:depth], self._cache.get(key[:depth])) for depth in range(1, len(key) + 1)]
            removed = [prefix for prefix, held in cached if held is not None and _removed(held.fd)]
        for prefix in removed:
            self.forget(prefix)
        return bool(removed)

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

    def _walk_directory(self, key: tuple[str, ...], shown: str) -> int:
        """Open the directory ``key`` from its nearest cached ancestor (from the top if none is cached)."""
        depth, base = self._cached_ancestor(key)
        if base is None:
            return self._walk(list(key), shown, final_directory=True)
        try:
            return self._walk(list(key[depth:]), shown, final_directory=True, start=base.fd)
        except _Climbed:  # a link's target climbs above the ancestor or starts at the top: walk it all
            return self._walk(list(key), shown, final_directory=True)
        finally:
            base.release()

    def _cached_ancestor(self, key: tuple[str, ...]) -> tuple[int, _Held | None]:
        with self._lock:
            for depth in range(len(key) - 1, max(len(key) - 1 - _ANCESTORS_LOOKED_UP, 0), -1):
                held = self._cache.get(key[:depth])
                if held is not None:
                    held.users += 1
                    return depth, held
        return 0, None

    def _open_last(self, parent: int, name: str, parts: Sequence[str], shown: str) -> int:
        try:
            return os.open(name, _OPEN_FILE, dir_fd=parent)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
        return self._walk(list(parts), shown, final_directory=False)  # a link: resolve it beneath

    def _walk(self, parts: list[str], shown: str, final_directory: bool, start: int | None = None) -> int:
        """Open ``parts`` component by component from the directory's descriptor (or from ``start``, a
        directory beneath it, borrowed: :class:`_Climbed` if a link's target leaves ``start``)."""
        stack = [self.fd if start is None else start]
        names: list[str] = []  # names[i] leads from stack[i] to stack[i + 1]
        pending = list(reversed(parts))
        links = 0
        try:
            while pending:
                name = pending.pop()
                if name in ("", "."):
                    continue
                if name == "..":
                    if len(stack) == 1:
                        raise self._escape(shown) if start is None else _Climbed()
                    os.close(stack.pop())
                    names.pop()
                    if stack[-1] < 0:  # closed on the way down: open it again
                        stack[-1] = self._walk(names[: len(stack) - 1], shown, True, start)
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
                        if start is not None:
                            raise _Climbed() from None
                        _close_all(stack[1:])
                        del stack[1:], names[:]
                        target = self._inside(target, shown)
                    pending.extend(reversed(target.split("/")))
                    continue
                if last:
                    return fd
                stack.append(fd)
                names.append(name)
                deep = len(stack) - 1 - _HELD_LEVELS
                if deep >= 1 and stack[deep] >= 0:  # a very deep path: a bounded number of descriptors open
                    os.close(stack[deep])
                    stack[deep] = -1
            # the path ended on ".." or "." (or was empty): the directory reached is the answer
            if not final_directory:
                raise NotRegular(f"{shown!r} in {self.what} names a directory: only regular files are read")
            top = stack.pop() if len(stack) > 1 else os.dup(stack[0])
            return top
        finally:
            _close_all(stack[1:])

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


# ----------------------------------------------------------------- openat2(RESOLVE_BENEATH)
_SYS_OPENAT2 = 437  # the same number on every Linux architecture that has it (numbered after 424)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_PLAIN = {"", ".", ".."}
# errors after which the walk decides: a link (ELOOP: the last component, which O_NOFOLLOW refuses),
# leaving the directory (EXDEV: also an absolute link staying inside, which the walk allows), a rename
# racing the resolution (EAGAIN)
_WALK_INSTEAD = (errno.ELOOP, errno.EXDEV, errno.EAGAIN)
_openat2: tuple | None = None  # (syscall, its number, {flags: open_how}) once looked up; () if none


def _open_beneath(directory: int, parts: Sequence[str], flags: int = _OPEN_FILE) -> int | None:
    """``parts`` opened with ``flags`` in one ``openat2`` call, the kernel keeping it beneath
    ``directory``; None when the walk must decide (a link on the way, no ``openat2``). Other errors
    (FileNotFoundError...) are raised."""
    global _openat2
    if _openat2 is None:
        _openat2 = _find_openat2()
    if not _openat2 or not parts or not _PLAIN.isdisjoint(parts):
        return None
    syscall, number, hows = _openat2
    how, size = hows.get(flags) or _open_how(hows, flags)
    fd = syscall(number, directory, "/".join(parts).encode(), how, size)
    if fd >= 0:
        return fd
    import ctypes  # imported already by _find_openat2

    code = ctypes.get_errno()
    if code in _WALK_INSTEAD:
        return None
    if code in (errno.ENOSYS, errno.EPERM):  # an old kernel, or a sandbox forbidding the call
        _openat2 = ()
        return None
    raise OSError(code, os.strerror(code))


def _find_openat2() -> tuple:
    if sys.platform != "linux":
        return ()
    import ctypes  # only here: importing it costs a few milliseconds, and only openat2 needs it

    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return ()
    syscall.restype = ctypes.c_long
    # no argtypes: the arguments are passed as ctypes values built once (converting them costs a third
    # of the call); the descriptor goes as a C int, which is what the kernel takes
    return syscall, ctypes.c_long(_SYS_OPENAT2), {}


def _open_how(hows: dict, flags: int) -> tuple:
    import ctypes

    how = (ctypes.c_uint64 * 3)(flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)  # struct open_how
    hows[flags] = (ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    return hows[flags]


class _Climbed(Exception):
    """A walk from a cached directory met ``..`` above it or an absolute link: walk from the top."""


def _close_all(descriptors: list[int]) -> None:
    for fd in descriptors:
        if fd >= 0:
            os.close(fd)


def _removed(fd: int) -> bool:
    try:
        return os.fstat(fd).st_nlink == 0  # a removed directory has no links left
    except OSError:
        return True


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
