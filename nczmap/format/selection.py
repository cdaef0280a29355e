"""Selections: numpy-style indices turned into per-chunk plans (which chunk, where its values go).

Shared by reading (``variable``) and writing (``writer``); pure functions of shapes and indices.
"""

from __future__ import annotations

import itertools
from typing import TypeAlias

from nczmap._lazy import numpy as np
from nczmap.errors import SelectionError


def normalize_selection(selection: object, shape: tuple[int, ...], where: str):
    """Per-dimension positions (ranges) and which dimensions an integer index removes."""
    items = list(selection) if isinstance(selection, tuple) else [selection]
    ellipses = [at for at, item in enumerate(items) if item is Ellipsis]
    if len(ellipses) > 1:
        raise SelectionError(f"{where}: only one '...' allowed")
    if ellipses:
        at = ellipses[0]
        items[at : at + 1] = [slice(None)] * (len(shape) - len(items) + 1)
    items += [slice(None)] * (len(shape) - len(items))
    if len(items) != len(shape):
        raise SelectionError(f"{where}: {len(items)} indices for {len(shape)} dimensions")
    indices, squeeze = [], []
    for item, size in zip(items, shape, strict=True):
        if isinstance(item, np.ndarray) and item.ndim == 0:
            item = item.item()
        if isinstance(item, slice):
            indices.append(range(*item.indices(size)))
            squeeze.append(False)
        elif isinstance(item, (int, np.integer)):
            position = int(item) + size if item < 0 else int(item)
            if not 0 <= position < size:
                raise SelectionError(f"{where}: index {item} out of range for size {size}")
            indices.append(range(position, position + 1))
            squeeze.append(True)
        elif isinstance(item, (list, np.ndarray)):
            indices.append(positions(item, size, where))
            squeeze.append(False)
        else:
            raise SelectionError(
                f"{where}: unsupported index {item!r} (integers, slices, 1-D integer or boolean arrays, ...)"
            )
    return indices, squeeze


def positions(item: list | np.ndarray, size: int, where: str) -> range | np.ndarray:
    """The positions a 1-D integer or boolean array selects along one dimension (outer indexing, as in
    netCDF4-python): a range when they are evenly spaced and ascending, so slices' fast paths apply."""
    array = np.asarray(item)
    if array.ndim != 1:
        raise SelectionError(f"{where}: index arrays must be one-dimensional, not shape {array.shape}")
    if array.dtype == bool:
        if len(array) != size:
            raise SelectionError(f"{where}: boolean index of length {len(array)} for a dimension of {size}")
        array = np.flatnonzero(array)
    if array.size == 0:
        return range(0)
    if array.dtype.kind not in "iu":
        raise SelectionError(f"{where}: index array of {array.dtype} (integers or booleans only)")
    array = np.where(array < 0, array + size, array).astype(np.int64)
    if array.min() < 0 or array.max() >= size:
        raise SelectionError(f"{where}: index array out of range for size {size}")
    if len(array) == 1:
        return range(int(array[0]), int(array[0]) + 1)
    step = int(array[1] - array[0])
    if step > 0 and np.array_equal(array, np.arange(array[0], array[0] + step * len(array), step)):
        return range(int(array[0]), int(array[-1]) + 1, step)
    return array


Selector: TypeAlias = "slice | np.ndarray"


def chunk_plan(indices: list[range], chunks: tuple[int, ...]):
    """For every chunk touched: (chunk index, (output selectors, in-chunk selectors)), one per dimension.

    Selectors are slices wherever the positions are contiguous, so whole-chunk copies are plain memcpy.
    """
    per_dim = [
        dimension_plan(ix, size) for ix, size in zip(indices, chunks or (1,) * len(indices), strict=False)
    ]
    for combo in itertools.product(*per_dim):
        yield tuple(c[0] for c in combo), (tuple(c[1] for c in combo), tuple(c[2] for c in combo))


def dimension_plan(ix: range | np.ndarray, size: int) -> list[tuple[int, Selector, Selector]]:
    if not len(ix):
        return []
    if (
        isinstance(ix, range) and ix.step == 1
    ):  # contiguous: chunk boundaries by arithmetic, no per-element arrays
        first, last = ix.start // size, (ix.stop - 1) // size
        plan = []
        for chunk_id in range(first, last + 1):
            low, high = max(ix.start, chunk_id * size), min(ix.stop, (chunk_id + 1) * size)
            plan.append(
                (
                    chunk_id,
                    slice(low - ix.start, high - ix.start),
                    slice(low - chunk_id * size, high - chunk_id * size),
                )
            )
        return plan
    ix = np.array(ix)
    chunk_ids = ix // size
    if len(ix) > 1 and np.all(np.diff(ix) > 0):  # ascending: runs of equal chunk ids, cut at the changes
        cuts = np.flatnonzero(np.diff(chunk_ids)) + 1
        runs = zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(ix)])), strict=True)
        groups = [np.arange(start, stop) for start, stop in runs]
    else:
        groups = [np.nonzero(chunk_ids == chunk_id)[0] for chunk_id in np.unique(chunk_ids)]
    plan = []
    for where in groups:
        chunk_id = int(chunk_ids[where[0]])
        plan.append((chunk_id, as_selector(where), as_selector(ix[where] - chunk_id * size)))
    return plan


def as_selector(positions: np.ndarray) -> Selector:
    """A slice for a run of consecutive positions, else the positions themselves."""
    first, count = int(positions[0]), len(positions)
    if int(positions[-1]) - first == count - 1 and (count < 3 or np.all(np.diff(positions) == 1)):
        return slice(first, first + count)
    return positions


def selector_length(selector: Selector) -> int:
    return selector.stop - selector.start if isinstance(selector, slice) else len(selector)


def as_index(selectors: tuple[Selector, ...]):
    """A numpy index for per-dimension selectors (plain slices when possible, else an open mesh)."""
    if all(isinstance(s, slice) for s in selectors):
        return selectors
    return np.ix_(*(np.arange(s.start, s.stop) if isinstance(s, slice) else s for s in selectors))
