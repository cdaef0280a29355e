"""Progress reports: a ``progress(done, total)`` callable, or tqdm bars for people watching.

Long operations (``copy``, ``virtualize``) take ``progress=``: a callable of ``(done, total)``, ``True`` for
a tqdm bar (``tqdm.auto``: a widget in a notebook, a text bar elsewhere), or ``None``/``False`` for none.
The ``nczmap`` command shows bars on a terminal only, unless told ``--progress`` or ``--quiet``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import IO

Progress = Callable[[int, int], None]
ProgressOption = Progress | bool | None


class TqdmProgress:
    """A tqdm bar fed by ``(done, total)`` calls: made at the first call (when the total is known) and
    closed when ``done`` reaches ``total`` or :meth:`close` is called."""

    def __init__(self, label: str, unit: str = "B", file: IO[str] | None = None, notebook: bool = False):
        self.label, self.unit, self.file, self.notebook = label, unit, file, notebook
        self._bar = None

    def __call__(self, done: int, total: int) -> None:
        bar = self._bar
        if bar is None:
            bar = self._bar = self._make(total)
        elif bar.total != total:
            bar.total = total
            bar.refresh()
        if done != bar.n:
            bar.update(done - bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self._bar is not None and not self._bar.disable:
            self._bar.close()

    def _make(self, total: int):
        if self.notebook:
            from tqdm.auto import tqdm
        else:
            from tqdm import tqdm
        in_bytes = self.unit == "B"
        stream = self.file if self.file is not None else sys.stderr
        width = _columns(stream)
        return tqdm(
            total=total,
            desc=self.label,
            unit=self.unit if in_bytes else f" {self.unit}",
            unit_scale=in_bytes,
            unit_divisor=1024 if in_bytes else 1000,
            file=stream,
            dynamic_ncols=width != 0,  # follows a resized terminal
            ncols=100 if width == 0 else None,
            nrows=24 if width == 0 else None,  # tqdm would take -1 rows, and draw nothing
            mininterval=0.1,
        )


def _columns(stream: IO[str]) -> int | None:
    """The terminal's width; 0 for a terminal that reports none (a bare pseudo-terminal, where tqdm would
    draw empty bars), None for no terminal."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return None


def progress_callback(option: ProgressOption, label: str, unit: str = "B") -> Progress | None:
    """What ``progress=`` means: the callable itself, a tqdm bar for ``True``, nothing for ``None`` or
    ``False``."""
    if option is None or option is False:
        return None
    if option is True:
        return TqdmProgress(label, unit, notebook=True)
    if callable(option):
        return option
    raise TypeError(f"progress must be True, False, None or a callable of (done, total), not {option!r}")


def command_progress(
    label: str, unit: str, shown: bool | None, stream: IO[str] | None = None
) -> TqdmProgress | None:
    """The command's bar on ``stream`` (standard error): ``shown`` True (--progress) or False (--quiet), or
    None for "when ``stream`` is a terminal" (never on a pipe or in a log)."""
    stream = stream if stream is not None else sys.stderr
    if shown is None:
        shown = stream.isatty()
    return TqdmProgress(label, unit, file=stream) if shown else None
