"""Joins and appends proved on generated archives (see ``generated_archives``): 300 archives drawn with
the fixed seed of the ``ci`` profile, each built by nczmap (all at once, or appended in random groups, into
JSON, Parquet or Icechunk) and compared with xarray's joining of the same files with the netcdf4 engine;
an append with virtualizing every file at once; a refusal must be one the README states, name a file and
change nothing. ``bench/explore_archives.py`` runs any number with fresh randomness; what it finds is
added here as an ``@example``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from generated_archives import Archive, FileSpec, archives, check
from hypothesis import HealthCheck, example, given, settings

pytest.importorskip("icechunk")


def _files(*specs: tuple) -> list[FileSpec]:
    return [FileSpec(*spec) for spec in specs]


# Found by exploration, kept as fixed examples
SHARED_UNITS_APPENDED = Archive(  # round 5: 20 steps, 0-14 read as fill values
    _files(*[(1, "f8", "days", False, "standard", 0.01, "f4", True)] * 5), "1981-01-01", (1, 1), "none",
    "plain", 1, True, False, False, False, 1, splits=[2], output=".json",
)  # fmt: skip
BOUNDS_RETIMED = Archive(  # round 5: the first file's bounds read in the new unit
    _files(*[(1, "f8", "days", True, "standard", 0.01, "f4", True)] * 3), "2001-02-27", (1, 2), "bounds",
    "plain", 1, True, False, False, False, 2, output=".json",
)  # fmt: skip
LONGER_STRINGS_APPENDED = Archive(  # strings longer than the dataset's width appended
    _files((4, "i8", "minutes", False, "standard", 0.01, "f4", True),
           *[(5, "i8", "minutes", False, "standard", 0.01, "f4", True)] * 2),
    "1900-01-01 00:00:00", (2, 1), "bounds", "same", 1, True, False, True, True, 272, splits=[1, 2],
    output=".parq",
)  # fmt: skip
GROUP_INTO_ICECHUNK = Archive(  # a group's variable along the root's time appended into Icechunk
    _files(*[(2, "f4", "seconds", False, "noleap", 0.01, "f4", True)] * 3), "2001-03-01 06:00", (2, 1),
    "climatology", "same", 3, False, True, False, True, 1389, splits=[1], output=".icechunk",
)  # fmt: skip
PACKED_F4_INTO_ICECHUNK = Archive(  # float32 scale_factor kept float32 in Zarr v3
    _files(*[(3, "i2", "hours", False, "proleptic_gregorian", s, "f4", True) for s in (0.01, 0.02, 0.01)]),
    "2001-03-01 06:00", (1, 1), "climatology_units", "differ", 3, True, False, True, False, 65535,
    splits=[1, 2], output=".icechunk",
)  # fmt: skip

NEW_DIM_GROUP_INTO_ICECHUNK = Archive(  # a series stacked by date, a group's variable along the new time
    _files(*[(1, "i4", "days", False, "360_day", 0.01, "f4", True)] * 2), "1900-01-01 00:00:00", (6, 1),
    "bounds_units", "dtypes", 2, False, True, False, True, 30, splits=[1], output=".icechunk",
    join="new_dim", gaps=[2],
)  # fmt: skip

WIDER_TYPE_APPENDED = Archive(  # the last file's time and bounds int32 where the dataset's are int16
    _files(*[(1, "i2", "seconds", False, "standard", 0.01, "f4", True)] * 4,
           (1, "i4", "seconds", False, "standard", 0.01, "f4", True)),
    "1981-01-01", (1, 1), "bounds", "plain", 0, False, False, False, False, 0, splits=[1], output=".json",
)  # fmt: skip


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(archives())
@example(SHARED_UNITS_APPENDED)
@example(BOUNDS_RETIMED)
@example(LONGER_STRINGS_APPENDED)
@example(GROUP_INTO_ICECHUNK)
@example(PACKED_F4_INTO_ICECHUNK)
@example(NEW_DIM_GROUP_INTO_ICECHUNK)
@example(WIDER_TYPE_APPENDED)
def test_generated_archives_join_and_append_as_xarray_joins_their_files(archive):
    with tempfile.TemporaryDirectory() as folder:
        check(archive, Path(folder))
