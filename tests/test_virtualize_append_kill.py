"""Appends killed with SIGKILL at random moments leave the old dataset or the new one, whole and readable.

A child process appends one day to a copy of an archive (JSON, Parquet, Icechunk) and is killed at a
random moment of its append (after its imports: it says when it starts). The copy must then read as the
archive before the append or as the one made of every file at once (compared value by value with
``virtualize`` of all the files), and the next append must succeed (or find the day already there).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from test_virtualize_append import url_of, values, write_day

from nczmap import FormatError

xr = pytest.importorskip("xarray")

from nczmap.integrations.virtualize import VirtualizeWarning, virtualize  # noqa: E402

CHILD = """
import sys, warnings
warnings.simplefilter("ignore")
from nczmap.integrations.virtualize import virtualize
print("ready", flush=True)
virtualize([sys.argv[2]], sys.argv[1], append=True)
print("done", flush=True)
"""
RUNS = 8


def quiet(*args, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VirtualizeWarning)
        return virtualize(*args, **options)


def copy_of(destination: Path, target: Path) -> Path:
    if destination.is_dir():
        shutil.copytree(destination, target, symlinks=True)
    else:
        shutil.copy2(destination, target)
    for chunks in destination.parent.glob(destination.name + ".*.chunks"):
        shutil.copy2(chunks, target.parent / (target.name + chunks.name[len(destination.name) :]))
    return target


def same(a: xr.Dataset, b: xr.Dataset) -> bool:
    try:
        xr.testing.assert_identical(a, b)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("suffix", [".json", ".parq", ".icechunk"])
def test_an_append_killed_at_any_moment_leaves_the_old_or_the_new_dataset(tmp_path, suffix):
    days = [write_day(tmp_path / f"sst_{day:03d}.nc", day) for day in range(4)]
    archive = tmp_path / f"archive{suffix}"
    quiet(days[:3], url_of(archive), concat="time")
    whole = tmp_path / f"whole{suffix}"
    quiet(days, url_of(whole), concat="time")
    old, new = values(archive), values(whole)
    assert not same(old, new)
    rng = random.Random(1234)
    seen = {"old": 0, "new": 0}
    for run in range(RUNS):
        target = copy_of(archive, tmp_path / f"run{run}{suffix}")
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, url_of(target), str(days[3])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
        )  # fmt: skip
        assert child.stdout.readline().strip() == b"ready"
        started = time.monotonic()
        time.sleep(rng.uniform(0, 0.25))
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=60)
        assert time.monotonic() - started < 30
        state = values(target)
        if same(state, old):
            seen["old"] += 1
        else:
            assert same(state, new), f"run {run}: neither the old nor the new dataset"
            seen["new"] += 1
        try:  # the next writer finishes the job, whatever the dead one left
            quiet([days[3]], url_of(target), append=True)
        except FormatError as exc:
            assert "already in" in str(exc) or "not after" in str(exc)
        assert same(values(target), new)
        staged = [p.name for p in tmp_path.iterdir() if ".nczmap-tmp" in p.name and f"run{run}" in p.name]
        # what a dead writer staged is gone; a Parquet save keeps the version before it for open readers
        assert all("-retired-" in name for name in staged) and len(staged) <= 1, staged
    assert seen["old"] + seen["new"] == RUNS
