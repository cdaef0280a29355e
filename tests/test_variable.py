"""Variable indexing: every selection form reads (and writes) what numpy would, across chunk edges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

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
        for bad in ((7, 0), (0, 0, 0), ([[1, 2]],), ([7],), ([True],), ([0.5],), (..., ...)):
            with pytest.raises(nczmap.errors.SelectionError, match="/v"):
                ds.variables["v"][bad]


def _orthogonal(values: np.ndarray, selection: tuple) -> np.ndarray:
    """numpy's reading of an outer (orthogonal) selection: each array index acts on its own dimension."""
    result = values
    for axis in reversed(range(len(selection))):
        result = result[(slice(None),) * axis + (selection[axis],)]
    return result


ARRAY_SELECTIONS = [
    ([3, 0, 4, 5], [4, 5, 6, 7]),  # a whole chunk placed apart in the output: once read into a copy
    ([6, 0, 3, 3], slice(None)),
    (np.array([1, 2, 5]), np.array([9, 0, 4, 4, -1])),
    (np.arange(7) % 2 == 0, [2, 3, 4, 5]),
    (slice(1, None, 2), np.array([], dtype=int)),
    (np.int64(4), [0, 8]),
]


POISON = -123456789  # what "uninitialised" output holds in these tests: every element must be written


def _poisoned(monkeypatch) -> None:
    """Reads allocate their output filled with POISON, not np.empty's reused memory (which may happen to
    hold the right values from an earlier read, and did hide a read into a copy of the output)."""
    from nczmap.format.variable import Variable

    monkeypatch.setattr(Variable, "_allocate", lambda self, shape: np.full(shape, POISON, dtype=self.dtype))


@pytest.mark.parametrize("selection", ARRAY_SELECTIONS, ids=repr)
def test_array_indices_read_orthogonally(stored, selection, monkeypatch):
    url, values = stored
    _poisoned(monkeypatch)
    with nczmap.open_dataset(url) as ds:
        got = ds.variables["v"][selection]
    assert np.array_equal(got, _orthogonal(values, selection))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-7, 6), max_size=9),
    st.lists(st.booleans(), min_size=10, max_size=10),
)
@example(rows=[1, 3, -6, -5, 4, -2, 6, -7, -7], columns=[False] + [True] * 9)
def test_any_array_index_reads_what_numpy_reads(tmp_path_factory, rows, columns):
    values = np.arange(7 * 10, dtype="<i4").reshape(7, 10)
    url = str(tmp_path_factory.mktemp("outer") / "v.file")
    with nczmap.create_dataset(url) as ds:
        ds.create_dimension("x", 7)
        ds.create_dimension("y", 10)
        ds.create_variable("v", ("x", "y"), "i4", chunks=(3, 4), data=values)
    selection = (np.array(rows, dtype=int), np.array(columns))
    with pytest.MonkeyPatch.context() as monkeypatch, nczmap.open_dataset(url) as ds:
        _poisoned(monkeypatch)
        assert np.array_equal(ds.variables["v"][selection], _orthogonal(values, selection))


def test_array_index_writes(stored):
    url, values = stored
    rows, columns = [5, 0, 2], [7, 1]
    expected = values.copy()
    expected[np.ix_(rows, columns)] = [[-1, -2], [-3, -4], [-5, -6]]
    with nczmap.open_dataset(url, "a") as ds:
        ds.variables["v"][rows, columns] = [[-1, -2], [-3, -4], [-5, -6]]
    with nczmap.open_dataset(url) as ds:
        assert np.array_equal(ds.variables["v"][...], expected)


def test_numpy_and_xarray_take_a_variable(stored):
    xr = pytest.importorskip("xarray")
    url, values = stored
    with nczmap.open_dataset(url) as ds:
        variable = ds.variables["v"]
        assert np.array_equal(np.asarray(variable), values)
        assert np.asarray(variable, dtype="f8").dtype == np.float64
        array = xr.DataArray(variable, dims=variable.dimensions)
    assert array.dims == ("x", "y")
    assert np.array_equal(array.values, values)
