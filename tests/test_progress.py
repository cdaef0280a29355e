"""Progress reports: tqdm bars on a terminal (and on request), none on a pipe or with --quiet, callables
for programs, and a bar cut short by an error still ending its line."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import netCDF4
import numpy as np
import pytest

import nczmap
from nczmap.integrations.copy import copy
from nczmap.progress import TqdmProgress, command_progress

TIMEOUT = 120
FILES = 3
CHUNKS = 40  # chunks of the referenced variable, in each file (2 rows of 20)
REFERENCES = FILES * CHUNKS


@pytest.fixture
def sources(tmp_path: Path) -> list[Path]:
    paths = []
    for index in range(FILES):
        path = tmp_path / f"part{index}.nc"
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("time", None)
            ds.createDimension("x", 20 * 50)
            time = ds.createVariable("time", "f8", ("time",))
            time.units = "days since 2000-01-01"
            time[:] = np.arange(2) + 2 * index
            values = ds.createVariable("v", "f4", ("time", "x"), chunksizes=(1, 50))
            values[:] = np.arange(2 * 20 * 50, dtype="f4").reshape(2, -1) + index
        paths.append(path)
    return paths


def command(*args: str | Path, terminal: bool = False, columns: int = 100, rows: int = 24) -> tuple[int, str]:
    """Run ``nczmap``; its standard error a pseudo-terminal when ``terminal`` (what a person sees), else a
    pipe (a script or a log). The exit status and what it wrote to standard error."""
    argv = [sys.executable, "-m", "nczmap", *map(str, args)]
    if not terminal:
        done = subprocess.run(argv, capture_output=True, timeout=TIMEOUT, check=False)
        return done.returncode, done.stderr.decode()
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    try:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=follower)
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        return process.wait(TIMEOUT), b"".join(chunks).decode().replace("\r\n", "\n")
    finally:
        os.close(leader)


def test_bars_on_a_terminal(sources, tmp_path):
    status, shown = command("virtualize", *sources, tmp_path / "refs.json", "--concat", "time", terminal=True)
    assert status == 0, shown
    assert "reading sources: 100%" in shown and f"{FILES}/{FILES}" in shown
    assert "virtualizing: 100%" in shown and f"{REFERENCES}/{REFERENCES}" in shown


def test_a_terminal_without_a_width_still_gets_bars(sources, tmp_path):
    status, shown = command("copy", sources[0], tmp_path / "c.zip", terminal=True, columns=0, rows=0)
    assert status == 0, shown
    assert "copying: 100%" in shown


def test_quiet_on_a_terminal_shows_no_bar(sources, tmp_path):
    status, shown = command(
        "virtualize", *sources, tmp_path / "refs.json", "--concat", "time", "--quiet", terminal=True
    )
    assert status == 0 and shown == "", shown


def test_no_bar_on_a_pipe_unless_asked(sources, tmp_path):
    status, shown = command("virtualize", *sources, tmp_path / "a.json", "--concat", "time")
    assert status == 0 and shown == "", shown
    status, shown = command("virtualize", *sources, tmp_path / "b.json", "--concat", "time", "--progress")
    assert status == 0, shown
    assert "reading sources: 100%" in shown and "virtualizing: 100%" in shown


def test_copy_bar_counts_bytes(sources, tmp_path):
    status, shown = command("copy", sources[0], tmp_path / "copy.zip", "--progress")
    assert status == 0, shown
    assert "copying: 100%" in shown and "B/s" in shown
    status, shown = command("copy", sources[0], tmp_path / "quiet.zip", "-q", terminal=True)
    assert status == 0 and shown == "", shown


def test_progress_and_quiet_exclude_each_other(sources, tmp_path):
    status, shown = command("copy", sources[0], tmp_path / "c.zip", "--progress", "--quiet")
    assert status == 2 and "not allowed with argument" in shown


def test_bar_cut_short_by_an_error_ends_its_line(sources, tmp_path):
    with netCDF4.Dataset(sources[1], "a") as ds:
        ds["time"].units = "hours since 1970-01-01 00:00:00 +05:00"  # refused: an offset zone is not joined
    with netCDF4.Dataset(sources[2], "w") as ds:  # a file with another structure: the join fails
        ds.createDimension("time", 1)
        ds.createVariable("time", "f8", ("time",))[:] = 99
    status, shown = command("virtualize", *sources, tmp_path / "refs.json", "--concat", "time", "--progress")
    assert status == 1
    error = next(line for line in shown.splitlines() if "nczmap: error" in line)
    assert error.startswith("nczmap: error"), shown  # not glued to the end of a bar
    assert not (tmp_path / "refs.json").exists()


def test_library_progress_true_draws_tqdm_bars(sources, tmp_path, capsys):
    result = nczmap.virtualize(sources, tmp_path / "refs.json", concat="time", progress=True)
    assert result.references == REFERENCES
    shown = capsys.readouterr().err
    assert "reading sources: 100%" in shown and "virtualizing: 100%" in shown


def test_library_callables_see_every_step_to_the_total(sources, tmp_path):
    described: list[tuple[int, int]] = []
    read: list[tuple[int, int]] = []
    nczmap.virtualize(
        sources,
        tmp_path / "refs.json",
        concat="time",
        progress=lambda done, total: described.append((done, total)),
        reading=lambda done, total: read.append((done, total)),
    )
    assert read[-1] == (FILES, FILES) and [done for done, _ in read] == sorted(done for done, _ in read)
    assert described[-1] == (REFERENCES,) * 2
    assert [done for done, _ in described] == sorted(done for done, _ in described)


def test_library_copy_accepts_a_callable(sources, tmp_path):
    seen: list[tuple[int, int]] = []
    copy(str(sources[0]), str(tmp_path / "c.zip"), progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1] > 0


@pytest.mark.parametrize("option", [3, "yes", 1.0])
def test_a_progress_that_is_neither_flag_nor_callable_is_refused_before_work(sources, tmp_path, option):
    with pytest.raises(TypeError, match="progress must be True, False, None or a callable"):
        nczmap.virtualize(sources, tmp_path / "refs.json", concat="time", progress=option)
    assert not (tmp_path / "refs.json").exists()


def test_command_progress_follows_the_stream(tmp_path):
    with open(tmp_path / "log", "w") as log:
        assert command_progress("x", "files", None, log) is None  # a file is no terminal
        assert isinstance(command_progress("x", "files", True, log), TqdmProgress)
        assert command_progress("x", "files", False, log) is None


def test_a_growing_total_is_followed(tmp_path):
    with open(tmp_path / "log", "w+") as log:
        bar = TqdmProgress("growing", "files", file=log)
        bar(1, 2)
        bar(2, 4)  # the total changes as more is found
        bar(4, 4)
        log.seek(0)
        assert "4/4" in log.read()
