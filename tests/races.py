"""A directory swapped for a symbolic link, as fast as the kernel allows: the race escapes are tested with.

``renameat2(RENAME_EXCHANGE)`` exchanges two names atomically, so at any instant the name is either the
directory or the link, and a reader that checks a path and then opens it may see each at a different time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

RENAME_EXCHANGE = 2
AT_FDCWD = -100


def swapper(directory: str, link: str, seconds: float) -> None:
    """Exchange ``directory`` and ``link`` (a symlink to the outside) atomically, as fast as possible."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    a, b = directory.encode(), link.encode()
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)


def can_exchange(tmp_path) -> bool:
    """Whether this kernel and libc exchange names (two scratch directories in ``tmp_path`` tell)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if not hasattr(libc, "renameat2"):
        return False
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    x, y = (str(tmp_path / name).encode() for name in "xy")
    return libc.renameat2(AT_FDCWD, x, AT_FDCWD, y, RENAME_EXCHANGE) == 0
