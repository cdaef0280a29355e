"""Variables: Zarr array metadata read as netCDF, and chunked numpy-style reading through the zmap."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from nczmap._lazy import numpy as np
from nczmap.concurrency import run_all
from nczmap.errors import EmptyError, FormatError, SelectionError
from nczmap.format.codecs import CodecChain
from nczmap.format.model import Attributes, Dimension, Group
from nczmap.format.types import CHAR, STRING, NCType, ParsedDtype


class PendingFill:
    """A fill value as stored (JSON), made a numpy scalar of the variable's type when first used."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make


@dataclass
class ArrayLayout:
    """How an array is stored: chunking, byte layout, codecs, fill value for missing chunks."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: ParsedDtype
    fill: object  # the fill value, or a PendingFill until first used (ncdump -h never needs it)
    codecs: CodecChain
    separator: str = "."
    order: str = "C"
    scalar: bool = False

    @property
    def fill_value(self) -> object:
        """None: no fill (missing chunks read as zeros)."""
        if isinstance(self.fill, PendingFill):
            self.fill = self.fill.make()
        return self.fill


class Variable:
    def __init__(self, group: Group, name: str, dimensions: Sequence[Dimension], layout: ArrayLayout) -> None:
        self.group = group
        self.name = name
        self.dims = tuple(dimensions)
        self.layout = layout
        self.attrs = Attributes()

    # ----------------------------------------------------------------- metadata
    @property
    def key(self) -> str:
        return self.group.path.rstrip("/") + "/" + self.name

    @property
    def path(self) -> str:
        return self.key

    @property
    def dimensions(self) -> tuple[str, ...]:
        return tuple(dim.name for dim in self.dims)

    @property
    def nctype(self) -> NCType:
        return self.layout.dtype.nctype

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype values come back as (native byte order; char: ``S1``; string: object)."""
        return self.nctype.numpy

    @property
    def shape(self) -> tuple[int, ...]:
        return () if self.layout.scalar else self.layout.shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def chunks(self) -> tuple[int, ...]:
        return self.layout.chunks

    @property
    def fill_value(self) -> object:
        return self.layout.fill_value

    def __repr__(self) -> str:
        return f"<Variable {self.key!r} {self.nctype.name}{self.dimensions} shape={self.shape}>"

    # ----------------------------------------------------------------- data
    def __getitem__(self, selection: object) -> np.ndarray:
        return self.read(selection)

    def __setitem__(self, selection: object, values: object) -> None:
        write_selection(self, selection, values)

    def read(self, selection: object = Ellipsis) -> np.ndarray:
        """Values selected with integers, slices (any step) and ``...``, as a numpy array."""
        indices, squeeze = _normalize_selection(selection, self.shape, self.key)
        if self.layout.scalar:
            indices = [range(1)]
        shape = tuple(len(ix) for ix in indices)
        out = self._allocate(shape)
        if out.size:
            plan = list(_chunk_plan(indices, self.layout.chunks))
            run_all(
                [lambda c=c, o=o, i=i: self._read_into(out, c, _index(o), i) for c, (o, i) in plan],
                self.group.root.zmap.io_width,
            )
        if self.layout.scalar:
            return out.reshape(())
        return out[tuple(0 if s else slice(None) for s in squeeze)] if any(squeeze) else out

    def _allocate(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised output array (every element is then read or filled)."""
        if self.nctype.is_text:
            return self._empty(shape)
        return np.empty(shape, dtype=self.dtype)

    def _read_into(self, out: np.ndarray, chunk_index: tuple[int, ...], out_index, in_ix) -> None:
        """Place one chunk's selected values in ``out``: straight from storage into ``out`` when the chunk is
        raw, native-order and wanted whole in a contiguous block; else decode and copy; fill if missing."""
        key = self.chunk_key(chunk_index)
        target = out[out_index]
        if self._direct(in_ix) and isinstance(out_index, tuple) and target.flags.c_contiguous:
            try:
                got = self.group.root.zmap.read_into(key, memoryview(target).cast("B"))
            except EmptyError:
                got = None
            if got is None:
                out[out_index] = self._fill_scalar()
            elif got != target.nbytes:
                raise FormatError(f"chunk {key!r} holds {got} bytes, expected {target.nbytes}")
            return
        chunk = self._read_chunk(chunk_index)
        out[out_index] = self._fill_scalar() if chunk is None else chunk[_index(in_ix)]

    def _direct(self, in_ix) -> bool:
        layout = self.layout
        return (
            not layout.codecs.configs
            and layout.order == "C"
            and not self.nctype.is_text
            and layout.dtype.storage == self.dtype
            and all(
                isinstance(s, slice) and s.start == 0 and s.stop == c
                for s, c in zip(in_ix, layout.chunks, strict=False)
            )
        )

    def _fill_scalar(self) -> object:
        fill = self.layout.fill_value
        if fill is None:
            return "" if self.nctype is STRING else (b"\x00" if self.nctype is CHAR else 0)
        return fill

    def _empty(self, shape: tuple[int, ...]) -> np.ndarray:
        fill = self.layout.fill_value
        if self.nctype is STRING:
            return np.full(shape, "" if fill is None else fill, dtype=object)
        if self.nctype is CHAR:
            return np.full(shape, b"\x00" if fill is None else fill, dtype="S1")
        return np.full(shape, 0 if fill is None else fill, dtype=self.dtype)

    def region_is_empty(self, region: tuple[slice, ...]) -> bool:
        """True when no chunk overlapping ``region`` is stored (it reads as fill values)."""
        indices, _ = _normalize_selection(region, self.shape, self.key)
        zmap = self.group.root.zmap
        return not any(zmap.exists(self.chunk_key(index)) for index, _ in _chunk_plan(indices, self.chunks))

    def chunk_key(self, chunk_index: Sequence[int]) -> str:
        name = self.layout.separator.join(str(i) for i in chunk_index) if chunk_index else "0"
        return f"{self.key}/{name}"

    def _read_chunk(self, chunk_index: tuple[int, ...]) -> np.ndarray | None:
        key = self.chunk_key(chunk_index)
        zmap = self.group.root.zmap
        try:
            raw = zmap.read(key)
        except EmptyError:
            return None
        return self.decode_chunk(raw, key)

    def decode_chunk(self, raw: bytes, key: str) -> np.ndarray:
        storage = self.layout.dtype.storage
        data = self.layout.codecs.decode(raw, key)
        count = math.prod(self.layout.chunks) if self.layout.chunks else 1
        size = memoryview(data).nbytes
        if storage.kind == "U" and size == count:
            storage = np.dtype("S1")  # netcdf-c 4.8/4.9.0 "<U1" char data is one byte per character
        if size != count * storage.itemsize:
            raise FormatError(f"chunk {key!r} holds {size} bytes, expected {count * storage.itemsize}")
        values = np.frombuffer(data, dtype=storage).reshape(
            self.layout.chunks or (1,), order=self.layout.order
        )
        return self._to_user(values)

    def _to_user(self, values: np.ndarray) -> np.ndarray:
        if self.nctype is STRING:
            return (
                np.vectorize(_decode_string, otypes=[object])(values)
                if values.size
                else values.astype(object)
            )
        if self.nctype is CHAR:
            return values.astype("S1") if values.dtype.kind == "U" else values
        return values


def _decode_string(raw: bytes) -> str:
    return raw.split(b"\x00", 1)[0].decode("utf-8", "replace")


def _normalize_selection(selection: object, shape: tuple[int, ...], where: str):
    """Per-dimension positions (ranges) and which dimensions an integer index removes."""
    items = list(selection) if isinstance(selection, tuple) else [selection]
    if items.count(Ellipsis) > 1:
        raise SelectionError(f"{where}: only one '...' allowed")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (len(shape) - len(items) + 1)
    items += [slice(None)] * (len(shape) - len(items))
    if len(items) != len(shape):
        raise SelectionError(f"{where}: {len(items)} indices for {len(shape)} dimensions")
    indices, squeeze = [], []
    for item, size in zip(items, shape, strict=True):
        if isinstance(item, slice):
            indices.append(range(*item.indices(size)))
            squeeze.append(False)
        elif isinstance(item, (int, np.integer)):
            position = int(item) + size if item < 0 else int(item)
            if not 0 <= position < size:
                raise SelectionError(f"{where}: index {item} out of range for size {size}")
            indices.append(range(position, position + 1))
            squeeze.append(True)
        else:
            raise SelectionError(f"{where}: unsupported index {item!r} (use integers, slices and ...)")
    return indices, squeeze


Selector: TypeAlias = "slice | np.ndarray"


def _chunk_plan(indices: list[range], chunks: tuple[int, ...]):
    """For every chunk touched: (chunk index, (output selectors, in-chunk selectors)), one per dimension.

    Selectors are slices wherever the positions are contiguous, so whole-chunk copies are plain memcpy.
    """
    per_dim = [
        _dimension_plan(ix, size) for ix, size in zip(indices, chunks or (1,) * len(indices), strict=False)
    ]
    for combo in itertools.product(*per_dim):
        yield tuple(c[0] for c in combo), (tuple(c[1] for c in combo), tuple(c[2] for c in combo))


def _dimension_plan(ix: range, size: int) -> list[tuple[int, Selector, Selector]]:
    if not len(ix):
        return []
    if ix.step == 1:  # contiguous: chunk boundaries by arithmetic, no per-element arrays
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
        plan.append((chunk_id, _as_selector(where), _as_selector(ix[where] - chunk_id * size)))
    return plan


def _as_selector(positions: np.ndarray) -> Selector:
    """A slice for a run of consecutive positions, else the positions themselves."""
    first, count = int(positions[0]), len(positions)
    if int(positions[-1]) - first == count - 1 and (count < 3 or np.all(np.diff(positions) == 1)):
        return slice(first, first + count)
    return positions


def _selector_length(selector: Selector) -> int:
    return selector.stop - selector.start if isinstance(selector, slice) else len(selector)


def _index(selectors: tuple[Selector, ...]):
    """A numpy index for per-dimension selectors (plain slices when possible, else an open mesh)."""
    if all(isinstance(s, slice) for s in selectors):
        return selectors
    return np.ix_(*(np.arange(s.start, s.stop) if isinstance(s, slice) else s for s in selectors))


def write_selection(variable: Variable, selection: object, values: object) -> None:
    """Store ``values`` at ``selection``; chunks only partly covered are read, modified and rewritten."""
    from nczmap.format.writer import writer_of

    writer = writer_of(variable.group)
    _grow_unlimited(variable, selection, values, writer)
    layout = variable.layout
    indices, squeeze = _normalize_selection(selection, variable.shape, variable.key)
    if layout.scalar:
        indices, squeeze = [range(1)], [True]
    kept = tuple(len(ix) for ix, sq in zip(indices, squeeze, strict=True) if not sq)
    data = _user_values(variable, values, kept).reshape(tuple(len(ix) for ix in indices))
    chunk_shape = layout.chunks or (1,)
    for chunk_index, (out_ix, in_ix) in _chunk_plan(indices, layout.chunks):
        index = () if layout.scalar else chunk_index
        whole = all(_selector_length(ix) == size for ix, size in zip(in_ix, chunk_shape, strict=True))
        existing = None if whole else variable._read_chunk(index)
        chunk = variable._empty(chunk_shape) if existing is None else existing.copy()
        chunk[_index(in_ix)] = data[_index(out_ix)]
        key = variable.chunk_key(index)
        variable.group.root.zmap.write(key, layout.codecs.encode(_storage_bytes(variable, chunk), key))


def _grow_unlimited(variable: Variable, selection: object, values: object, writer) -> None:
    """Lengthen unlimited dimensions that the selection (or an open-ended slice's values) reaches past."""
    items = list(selection) if isinstance(selection, tuple) else [selection]
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (len(variable.dims) - len(items) + 1)
    if len(items) != len(variable.dims):
        return
    value_shape = np.shape(values)
    axes = [i for i, item in enumerate(items) if not isinstance(item, (int, np.integer))]
    for position, (item, dim) in enumerate(zip(items, variable.dims, strict=True)):
        if dim.unlimited:
            needed = _needed_length(item, position, axes, value_shape)
            if needed is not None and needed > dim.size:
                dim.size = needed
                writer.touch_dimension_users(dim)


def _needed_length(item: object, position: int, axes: list[int], value_shape: tuple[int, ...]) -> int | None:
    if isinstance(item, (int, np.integer)):
        return int(item) + 1 if item >= 0 else None
    if not isinstance(item, slice) or item.step not in (None, 1):
        return None
    if item.stop is not None:
        return int(item.stop) if item.stop >= 0 else None
    if len(value_shape) == len(axes):  # an open-ended slice takes its length from the values
        return (item.start or 0) + value_shape[axes.index(position)]
    return None


def _user_values(variable: Variable, values: object, shape: tuple[int, ...]) -> np.ndarray:
    nctype = variable.nctype
    try:
        if nctype is CHAR:
            array = _char_array(values, shape)
        elif nctype is STRING:
            array = np.asarray(values, dtype=object)
        else:
            array = np.asarray(values)
            if array.dtype.kind in "iub" and nctype.is_integer:
                info = np.iinfo(nctype.numpy)
                if array.size and (array.min() < info.min or array.max() > info.max):
                    raise FormatError(f"values out of range for {nctype.name} variable {variable.key!r}")
            array = array.astype(nctype.numpy)
        return np.broadcast_to(array, shape)
    except (ValueError, TypeError) as exc:
        raise FormatError(
            f"cannot write {type(values).__name__} into {variable.key!r} of shape {shape}: {exc}"
        ) from exc


def _char_array(values: object, shape: tuple[int, ...]) -> np.ndarray:
    if isinstance(values, (str, bytes)) or (
        isinstance(values, list) and values and isinstance(values[0], str)
    ):
        rows = [values] if isinstance(values, (str, bytes)) else values
        width = shape[-1] if shape else 1
        encoded = [(r.encode() if isinstance(r, str) else r)[:width].ljust(width, b"\x00") for r in rows]
        return (
            np.frombuffer(b"".join(encoded), dtype="S1")
            .reshape(-1, width)
            .reshape(shape if math.prod(shape) == len(encoded) * width else (-1, width))
        )
    return np.asarray(values, dtype="S1")


def _storage_bytes(variable: Variable, chunk: np.ndarray) -> bytes:
    storage = variable.layout.dtype.storage
    order = variable.layout.order
    if variable.nctype is STRING:
        encoded = [("" if v is None else str(v)).encode() for v in chunk.ravel(order=order)]
        too_long = max((len(e) for e in encoded), default=0)
        if too_long > storage.itemsize:
            raise FormatError(
                f"a string of {too_long} bytes does not fit {variable.key!r} "
                f"(maximum {storage.itemsize}; set maxstrlen or _nczarr_maxstrlen)"
            )
        return np.array(encoded, dtype=storage).tobytes()
    return np.ascontiguousarray(chunk.astype(storage, copy=False)).tobytes(order=order)
