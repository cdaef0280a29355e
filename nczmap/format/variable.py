"""Variables: Zarr array metadata read as netCDF, and chunked numpy-style reading through the zmap."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nczmap._lazy import numpy as np
from nczmap.concurrency import run_all
from nczmap.errors import EmptyError, FormatError, SelectionError
from nczmap.format.codecs import CodecChain
from nczmap.format.model import Attributes, Dimension, Group
from nczmap.format.selection import as_index, chunk_plan, normalize_selection
from nczmap.format.types import CHAR, STRING, NCType, ParsedDtype


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


MEMORY_BYTES = _memory_bytes()
MAX_SOURCE_BYTES = 1 << 50  # 1 PiB: a file claiming more for one variable is damaged (a flipped high bit)
_UNREAD = object()  # a chunk whose stored bytes were not read in a batch: read_chunk reads them


class PendingFill:
    """A fill value as stored (JSON), made a numpy scalar of the variable's type when first used."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make


def check_plausible(shape: Sequence[int], itemsize: int, where: str) -> None:
    """FormatError naming ``where`` if a variable of a source file claims more bytes than a file holds:
    its values could be neither printed nor copied in any time (netcdf-c would try for ever)."""
    nbytes = math.prod(shape) * max(1, itemsize)
    if nbytes > MAX_SOURCE_BYTES:
        raise FormatError(
            f"{where}: its shape {tuple(shape)} claims {nbytes} bytes, more than any file holds (a damaged "
            "dimension or dataspace)"
        )


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
    key_prefix: str = ""  # Zarr v3 default chunk keys: "c" (c/0/0; a scalar's chunk is c)
    transpose: tuple[int, ...] | None = None  # Zarr v3 transpose other than C or F order
    shards: object = None  # a Zarr v3 zarr3.ShardLayout: chunks are inner chunks of stored shards
    vlen: bool = False  # Zarr v3 vlen-utf8 strings
    zarr3: dict | None = None  # the zarr.json this array was read from (Zarr v3)

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
        return tuple([dim.name for dim in self.dims])

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
    def __array__(self, dtype: object = None, copy: bool | None = None) -> np.ndarray:
        """All values, so that ``np.asarray(variable)`` and ``xr.DataArray(variable)`` work."""
        values = self.read()
        return values if dtype is None else values.astype(dtype, copy=False)

    def __getitem__(self, selection: object) -> np.ndarray:
        return self.read(selection)

    def __setitem__(self, selection: object, values: object) -> None:
        self.group.editor().write_selection(self, selection, values)

    def read(self, selection: object = Ellipsis) -> np.ndarray:
        """Values selected with integers, slices (any step), ``...`` and 1-D integer or boolean arrays (each
        selecting along its own dimension, as netCDF4-python does), as a numpy array."""
        indices, squeeze = normalize_selection(selection, self.shape, self.key)
        if self.layout.scalar:
            indices = [range(1)]
        shape = tuple(len(ix) for ix in indices)
        self._check_fits(shape)
        out = self._allocate(shape)
        if out.size:
            rest, rows = out, self._whole_rows(indices)
            if rows:  # whole chunks stacked along the first dimension: keys and places by arithmetic
                self._read_rows(out, indices, rows)
                done = rows * self.layout.chunks[0]
                indices = [range(indices[0].start + done, indices[0].stop), *indices[1:]]
                rest = out[done:]
            if rest.size:
                self._read_plan(rest, chunk_plan(indices, self.layout.chunks))
        if self.layout.scalar:
            return out.reshape(())
        return out[tuple(0 if s else slice(None) for s in squeeze)] if any(squeeze) else out

    def _check_fits(self, shape: tuple[int, ...]) -> None:
        """Refuse a selection (or a chunk) larger than this machine's memory before allocating it."""
        values = math.prod(shape)
        chunk = math.prod(self.layout.chunks or (1,))
        itemsize = max(self.layout.dtype.itemsize, self.dtype.itemsize)
        if max(values, chunk) * itemsize > MEMORY_BYTES:
            what = f"the selection {shape}" if values >= chunk else f"a chunk {self.layout.chunks}"
            raise SelectionError(
                f"{self.key!r}: {what} needs {max(values, chunk) * itemsize / 2**30:.1f} GiB, more than "
                f"this machine's {MEMORY_BYTES / 2**30:.1f} GiB of memory: read it in smaller pieces"
            )

    def _allocate(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised output array (every element is then read or filled)."""
        if self.nctype.is_text:
            return self.filled(shape)
        return np.empty(shape, dtype=self.dtype)

    def _read_plan(self, out: np.ndarray, plan) -> None:
        """Fill ``out``: chunks that are raw, native-order and wanted whole in a contiguous block go from
        storage straight into ``out``, all in one batch (which a driver may coalesce); the others are
        decoded and copied, a few at a time; missing chunks become fill values."""
        zmap = self.group.root.zmap
        direct: list[tuple[str, object, np.ndarray]] = []
        decoded = []
        for chunk_index, (out_ix, in_ix) in plan:
            out_index = as_index(out_ix)
            # only a view of ``out`` can be read into: an index array (a selection repeating or reordering
            # along a dimension) makes a copy, which would be filled and dropped
            basic = isinstance(out_index, tuple) and all(isinstance(i, slice | int) for i in out_index)
            target = out[out_index] if basic else None
            if basic and self._direct(in_ix) and target.flags.c_contiguous:
                direct.append((self.chunk_key(chunk_index), out_index, target))
            else:
                decoded.append((chunk_index, out_index, in_ix))
        raws = self._raw_chunks([c for c, _, _ in decoded]) if len(decoded) > 1 else None
        decoded = [
            lambda c=c, o=o, i=i, n=n: self._decode_into(out, c, o, i, _UNREAD if raws is None else raws[n])
            for n, (c, o, i) in enumerate(decoded)
        ]
        if direct:
            got = zmap.read_many_into([(key, memoryview(target).cast("B")) for key, _, target in direct])
            for (key, out_index, target), count in zip(direct, got, strict=True):
                if count is None:
                    out[out_index] = self.fill_scalar()
                elif count != target.nbytes:
                    raise FormatError(f"chunk {key!r} holds {count} bytes, expected {target.nbytes}")
        run_all(decoded, zmap.io_width)

    def _raw(self) -> bool:
        """Chunks hold the values exactly as numpy lays them out: no codecs, C order, native dtype."""
        layout = self.layout
        return (
            not layout.codecs.configs
            and layout.order == "C"
            and layout.transpose is None
            and layout.shards is None
            and not self.nctype.is_text
            and layout.dtype.chunk == self.dtype
        )

    def _whole_rows(self, indices: list[range]) -> int:
        """How many whole chunks, from the start of the selection along the first dimension, cover full
        (single-chunk) extents of every other dimension: such chunks are contiguous blocks of the output.
        0 when the selection does not have that shape."""
        chunks = self.layout.chunks
        if (
            self.layout.scalar
            or not chunks
            or not self._raw()
            or not all(isinstance(ix, range) for ix in indices)
        ):
            return 0
        first = indices[0]
        if first.step != 1 or first.start % chunks[0]:
            return 0
        for ix, size in zip(indices[1:], chunks[1:], strict=True):
            if ix.step != 1 or ix.start % size or len(ix) != size:
                return 0
        return len(first) // chunks[0]

    def _read_rows(self, out: np.ndarray, indices: list[range], rows: int) -> None:
        chunks = self.layout.chunks
        first = indices[0].start // chunks[0]
        others = [ix.start // size for ix, size in zip(indices[1:], chunks[1:], strict=True)]
        whole = memoryview(out).cast("B")
        step = whole.nbytes // len(out) * chunks[0]  # bytes of one chunk's block in the output
        blocks = whole[: rows * step]
        counts = self._rows_in_columns(first, rows, others, blocks, step)
        if counts is None:
            requests = [
                (self._row_key(first + row, others), blocks[row * step : (row + 1) * step])
                for row in range(rows)
            ]
            got = self.group.root.zmap.read_many_into(requests)
            counts = np.array([-1 if count is None else count for count in got], dtype=np.int64)
        out[: rows * chunks[0]].reshape(rows, chunks[0], *out.shape[1:])[counts < 0] = self.fill_scalar()
        wrong = np.flatnonzero((counts >= 0) & (counts != step))
        if len(wrong):
            row = int(wrong[0])
            key = self._row_key(first + row, others)
            raise FormatError(f"chunk {key!r} holds {int(counts[row])} bytes, expected {step}")

    def _rows_in_columns(
        self, first: int, rows: int, others: list[int], blocks: memoryview, step: int
    ) -> np.ndarray | None:
        """The byte counts of chunks ``first...first + rows - 1`` (along the first dimension; ``others``
        along the rest) read into ``blocks`` by a driver that reads chunks by index, without an object
        per chunk (a manifest's table of references); None where there is none (read them by key)."""
        read_chunks = getattr(self.group.root.zmap, "read_chunks_into", None)
        layout = self.layout
        if read_chunks is None or (layout.key_prefix and layout.separator != "/"):
            return None
        grid_index = np.empty((rows, 1 + len(others)), dtype=np.int64)
        grid_index[:, 0] = np.arange(first, first + rows)
        grid_index[:, 1:] = others
        array = self.key + ("/" + layout.key_prefix if layout.key_prefix else "")
        return read_chunks(array, grid_index, layout.separator, blocks, step)

    def _row_key(self, row: int, others: list[int]) -> str:
        """The key of the chunk at ``row`` along the first dimension, ``others`` along the rest."""
        sep = self.layout.separator
        prefix = self.key + "/" + (self.layout.key_prefix + sep if self.layout.key_prefix else "")
        return prefix + sep.join(map(str, [row, *others]))

    def _raw_chunks(self, indices: list[tuple[int, ...]]) -> list | None:
        """The stored bytes of these chunks read in one batch, where the storage does that with fewer
        requests (a manifest's remote references, merged into spans: ``read_many``); else None."""
        read_many = getattr(self.group.root.zmap, "read_many", None)
        if read_many is None or self.layout.shards is not None:
            return None
        return read_many([self.chunk_key(index) for index in indices], self._stored_limit())

    def _decode_into(
        self, out: np.ndarray, chunk_index: tuple[int, ...], out_index, in_ix, raw: object = _UNREAD
    ) -> None:
        if raw is _UNREAD:
            chunk = self.read_chunk(chunk_index)
        elif raw is None:
            chunk = None
        else:
            key = self.chunk_key(chunk_index)
            if isinstance(raw, int):
                raise FormatError(f"chunk {key!r} holds more bytes than any encoding of its values takes")
            chunk = self.decode_chunk(raw, key)
        out[out_index] = self.fill_scalar() if chunk is None else chunk[as_index(in_ix)]

    def _direct(self, in_ix) -> bool:
        return self._raw() and all(
            isinstance(s, slice) and s.start == 0 and s.stop == c
            for s, c in zip(in_ix, self.layout.chunks, strict=False)
        )

    def fill_scalar(self) -> object:
        fill = self.layout.fill_value
        if fill is None:
            return "" if self.nctype is STRING else (b"\x00" if self.nctype is CHAR else 0)
        return fill

    def filled(self, shape: tuple[int, ...]) -> np.ndarray:
        fill = self.layout.fill_value
        if self.nctype is STRING:
            return np.full(shape, "" if fill is None else fill, dtype=object)
        if self.nctype is CHAR:
            return np.full(shape, b"\x00" if fill is None else fill, dtype="S1")
        return np.full(shape, 0 if fill is None else fill, dtype=self.dtype)

    def region_is_empty(self, region: tuple[slice, ...]) -> bool:
        """True when no chunk overlapping ``region`` is stored (it reads as fill values)."""
        indices, _ = normalize_selection(region, self.shape, self.key)
        zmap = self.group.root.zmap
        return not any(zmap.exists(self.chunk_key(index)) for index, _ in chunk_plan(indices, self.chunks))

    def chunk_key(self, chunk_index: Sequence[int]) -> str:
        """The key of a chunk (of a sharded array: of the shard holding that inner chunk)."""
        layout = self.layout
        if layout.shards is not None and not layout.scalar:
            chunk_index = layout.shards.shard_of(tuple(chunk_index))
        if layout.key_prefix:  # Zarr v3 default encoding: c/0/0, a scalar's chunk is c
            parts = [] if layout.scalar else [str(i) for i in chunk_index]
            return f"{self.key}/{layout.separator.join([layout.key_prefix, *parts])}"
        name = layout.separator.join(str(i) for i in chunk_index) if chunk_index else "0"
        return f"{self.key}/{name}"

    def read_chunk(self, chunk_index: tuple[int, ...]) -> np.ndarray | None:
        key = self.chunk_key(chunk_index)
        zmap = self.group.root.zmap
        try:
            if self.layout.shards is not None:
                raw = self.layout.shards.read(zmap, key, tuple(chunk_index) or (0,))
            else:
                limit = self._stored_limit()
                raw = zmap.read(key, 0, limit + 1)  # one byte more than allowed: tells "too long" apart
                if raw is not None and len(raw) > limit:
                    raise FormatError(f"chunk {key!r} holds more bytes than any encoding of its values takes")
        except EmptyError:
            return None
        return None if raw is None else self.decode_chunk(raw, key)

    def _stored_limit(self) -> int:
        """The most bytes a stored chunk may hold: its values twice over and a MiB (codecs add little, but
        a hostile whole-file reference could name gigabytes)."""
        if self.layout.vlen:
            return MEMORY_BYTES // 8
        count = math.prod(self.layout.chunks) if self.layout.chunks else 1
        return 2 * count * self.layout.dtype.chunk.itemsize + (1 << 20)

    def decode_chunk(self, raw: bytes, key: str) -> np.ndarray:
        storage = self.layout.dtype.chunk  # the bytes' own order (netcdf-c 4.8.0-4.9.2: host order, bug 18)
        count = math.prod(self.layout.chunks) if self.layout.chunks else 1
        if self.layout.vlen:  # Zarr v3 vlen-utf8: any length, bounded only by this machine's memory
            from nczmap.format.zarr3_vlen import decode_vlen_utf8

            data = self.layout.codecs.decode(raw, key, limit=MEMORY_BYTES // 8)
            return decode_vlen_utf8(data, count, key).reshape(self.layout.chunks or (1,))
        data = self.layout.codecs.decode(raw, key, limit=count * storage.itemsize)
        size = memoryview(data).nbytes
        if storage.kind == "U" and size == count:
            storage = np.dtype("S1")  # netcdf-c 4.8/4.9.0 "<U1" char data is one byte per character
        if size != count * storage.itemsize:
            raise FormatError(f"chunk {key!r} holds {size} bytes, expected {count * storage.itemsize}")
        values = np.frombuffer(data, dtype=storage)
        chunks, transpose = self.layout.chunks or (1,), self.layout.transpose
        if transpose is not None:  # Zarr v3 transpose: the stored array has the axes in that order
            values = values.reshape([chunks[axis] for axis in transpose]).transpose(np.argsort(transpose))
        else:
            values = values.reshape(chunks, order=self.layout.order)
        if values.dtype.kind == "U" and self.nctype is STRING:  # Zarr v3 fixed_length_utf32
            return values.astype(object)
        return self._to_user(values)

    def _to_user(self, values: np.ndarray) -> np.ndarray:
        if self.nctype is STRING:
            return (
                np.vectorize(_decode_string, otypes=[object])(values)
                if values.size
                else values.astype(object)
            )
        if self.nctype is CHAR and values.dtype.kind == "U":  # one character per value: it must be a byte
            codes = values.view(values.dtype.str[0] + "u4")  # "<U1" -> "<u4"
            if codes.size and int(codes.max()) > 0xFF:
                raise FormatError(
                    f"char data of {self.key!r} holds code point {int(codes.max())}, which is no netCDF char"
                )
            return codes.astype("u1").view("S1")
        return values


def _decode_string(raw: bytes) -> str:
    return raw.split(b"\x00", 1)[0].decode("utf-8", "replace")
