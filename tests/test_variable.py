"""Variable indexing: every selection form reads (and writes) what numpy would, across chunk edges."""

from __future__ import annotations

import numpy as np
import pytest

import nczmap

SELECTIONS = [
    (...,),
    (slice(None), slice(None)),
    (slice(1, 6), slice(2, 9)),
    (slice(None, None, 2), slice(1, None, 3)),
    (slice(None, None, -1), slice(7, 1, -2)),
    (3, slice(None)),
    (-1, -2),
    (slice(5, 5), slice(None)),
    (Ellipsis, 4),
]


@pytest.fixture
def stored(tmp_path):
    values = np.arange(7 * 10, dtype="<i4").reshape(7, 10)
    url = str(tmp_path / "v.file")
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", 7)
        ds.create_dimension("y", 10)
        ds.create_variable("v", ("x", "y"), "i4", chunks=(3, 4), data=values)
    return url, values


@pytest.mark.parametrize("selection", SELECTIONS, ids=repr)
def test_reads_match_numpy(stored, selection):
    url, values = stored
    with nczmap.open_dataset(url) as ds:
        assert np.array_equal(ds.variables["v"][selection], values[selection])


@pytest.mark.parametrize("selection", SELECTIONS, ids=repr)
def test_writes_match_numpy(stored, selection):
    url, values = stored
    expected = values.copy()
    replacement = -np.arange(expected[selection].size, dtype="<i4").reshape(expected[selection].shape) - 1
    expected[selection] = replacement
    with nczmap.open_dataset(url, "a") as ds:
        ds.variables["v"][selection] = replacement
    with nczmap.open_dataset(url) as ds:
        assert np.array_equal(ds.variables["v"][...], expected)


def test_bad_indices_are_index_errors(stored):
    url, _ = stored
    with nczmap.open_dataset(url) as ds:
        for bad in ((7, 0), (0, 0, 0), ([1, 2],), (..., ...)):
            with pytest.raises(nczmap.errors.SelectionError, match="/v"):
                ds.variables["v"][bad]
