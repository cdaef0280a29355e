"""Small filesystem helpers shared by the local drivers."""

from __future__ import annotations

import contextlib
import os


def remove_if_present(path: str) -> None:
    """Unlink ``path``; a file that is already gone is not an error (clean-up paths use this)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
