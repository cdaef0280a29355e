"""CDL output identical to netcdf-c's ``ncdump`` (4.9 / 4.10 rules, nczarr-format.md §9).

Every rule here was taken from netcdf-c's ``ncdump/ncdump.c``, ``dumplib.c``, ``vardata.c`` and
``utils.c`` and checked against real ``ncdump`` runs: name escaping (``escaped_name``), attribute value
formats (``pr_att_valgs``: type suffixes, ``%#.7g``/``%#.15g`` plus trailing-zero trimming), the data
section (``vardata``/``print_rows``: 80-column wrapping with ``lput``, ``_`` for fill values, char rows
as strings, ``{``/``}`` around records of a non-leading unlimited dimension) and the ``-s`` virtual
attributes (``pr_att_specials``/``pr_att_hidden``).

netcdf-c behaviours reproduced on purpose, because ncdump prints them:

* an empty element of a ``string`` variable is a NULL pointer in NCZarr (``NCZ_fixed2char``), which
  is never equal to the default fill ``""``, so it prints ``NIL``; in a netCDF-4 (HDF5) file it is an empty
  string, ``_`` where it equals the fill value (the default ``""``), else ``""``: so print a netCDF-4 file
  and a manifest made of netCDF-4 files (``source_format``), as ncdump prints the file;
* ``-s`` on a scalar prints ``v:_ChunkSizes = `` with no values and no newline (the loop that would
  print them and the terminator has nothing to do);
* ``-v /v`` does not select a root-group variable (``nc_inq_gvarid`` compares ``"/"`` with ``""``);
* a dimension found in an ancestor group through a shadowing name is printed with the name of the
  group where the upward search stopped (``d(/g1/y)`` for the root's ``y`` seen from ``/g1/g2``).

Where ncdump versions differ, 4.10 is followed: a dimension of a group that is not an ancestor is
printed with that group's name (4.9 printed the root's, a bug in ``searchgroupdim``). For ``-s``,
``_Filter``/``_DeflateLevel``/``_Shuffle``/``_Fletcher32`` are what netcdf-c's bundled filter plugins
report; a codec without a plugin appears only in ``_Codecs`` (real ncdump 4.10 stops with an error
there). ``C_format`` attributes are honoured through Python's %-formatting (length modifiers dropped).

Data is read in slabs of whole chunks along the first dimension (or row pieces when one row is larger
than the slab budget), so memory stays bounded whatever the variable's size.
"""

from __future__ import annotations

import collections
import io
import itertools
import math
import sys
from collections.abc import Iterator, Sequence
from typing import BinaryIO, TextIO

from nczmap._lazy import numpy as np
from nczmap.cdl_text import (
    CONTINUATION,
    KEYWORDS,
    MAX_LINE_LEN,
    Formatted,
    ValueFormatter,
    attribute_text,
    encode_text,
    escaped_name,
    format_rows,
    is_cntrl,
    quote_char_data,
    wrapped,
)
from nczmap.errors import NCZError
from nczmap.format.jsonutil import netcdf_text
from nczmap.format.model import Attribute

SLAB_ELEMENTS = 1 << 18  # values read at once
# a variable of more values than this is formatted on other cores too (Python's float formatting, at
# ~170 ns a value, is what a full dump spends its time on); slabs formatted ahead, per worker
PARALLEL_VALUES = 1 << 22
AHEAD = 3
_UNSET = object()


# Codec id -> (HDF5 filter id, visible parameters) as netcdf-c's bundled plugins report them.
_DEFLATE, _SHUFFLE, _FLETCHER32 = 1, 2, 3
_BLOSC_CODES = {"blosclz": 0, "lz4": 1, "lz4hc": 2, "snappy": 3, "zlib": 4, "zstd": 5}


class NoSuchVariable(NCZError):
    """A ``-v`` name that matches no variable in any group (netcdf-c NC_ENOTVAR)."""

    nc_code = -49


class _Output:
    """Byte output with ncdump's line-position bookkeeping (``lput``) for the data section."""

    def __init__(self, out: TextIO | BinaryIO, processes: bool = False) -> None:
        self._out = out
        self._processes = processes
        self._text = isinstance(out, io.TextIOBase) and not hasattr(out, "buffer")
        if isinstance(out, io.TextIOBase) and hasattr(out, "buffer"):
            out.flush()
            self._out = out.buffer
            self._text = False
        self._pending = bytearray()
        self.indent = 0  # group nesting indentation, in spaces
        self.linep = 0
        self._pool = None  # worker processes formatting large variables (made when one is met)
        self.workers = 0

    def formatting_pool(self):
        """Processes formatting rows of values (spawned: no thread of this process is copied); None
        unless ``processes`` was asked for and there are several cores."""
        if self._pool is None and self._processes:
            import os

            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            if cores < 2:
                return None
            from concurrent.futures import ProcessPoolExecutor
            from multiprocessing import get_context

            self.workers = min(cores, 4)
            self._pool = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"))
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def write(self, data: bytes) -> None:
        self._pending += data
        if len(self._pending) >= 1 << 16:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            data = bytes(self._pending)
            self._out.write(data.decode("utf-8", "surrogateescape") if self._text else data)
            self._pending.clear()

    def indented(self, data: bytes) -> None:
        self.write(b" " * self.indent + data)

    def lput_items(self, items: list[bytes], separator: bytes) -> None:
        """``lput(item + separator)`` for each (non-empty) item: the data section's hot loop.

        The loop only finds where lines wrap; the text is then joined a line at a time.
        """
        extra = len(separator)
        limit, fresh = MAX_LINE_LEN, len(CONTINUATION) + self.indent
        linep, wraps = self.linep, []
        for index, size in enumerate(map(len, items)):
            size += extra
            if size + linep > limit:
                wraps.append(index)
                linep = fresh
            linep += size
        bounds = itertools.pairwise([0, *wraps, len(items)])
        lines = [separator.join(items[a:b]) + separator if b > a else b"" for a, b in bounds]
        self.write((b"\n" + b" " * self.indent + CONTINUATION).join(lines))
        self.linep = linep

    def lput_row(self, row: bytes, separator: bytes) -> None:
        """:meth:`lput_items` for ``item + separator`` units already joined into ``row``, where no item
        contains ``separator`` (numbers): :func:`wrapped`."""
        if not row:
            return
        text, self.linep = wrapped(row, separator, self.linep, self.indent)
        self.write(text)

    def lput(self, data: bytes) -> None:
        if len(data) + self.linep > MAX_LINE_LEN and len(data) > 2:
            self.write(b"\n" + b" " * self.indent + CONTINUATION)
            self.linep = len(CONTINUATION) + self.indent
        self.write(data)
        if data.endswith(b"\n"):
            self.linep = self.indent
        else:
            self.linep += len(data)


# ============================================================================ the dump
def dump_cdl(
    dataset,
    out: TextIO | BinaryIO,
    *,
    header_only: bool = False,
    special: bool = False,
    name: str | None = None,
    variables: Sequence[str] | None = None,
    classic: bool = False,
    processes: bool = False,
) -> None:
    """Print ``dataset`` as CDL, exactly as netcdf-c's ``ncdump`` would print the same store.

    ``header_only`` is ``ncdump -h``, ``special`` is ``-s`` (virtual attributes such as ``_Storage``),
    ``name`` is ``-n`` (default: the URL's last path segment minus its extension) and ``variables`` is
    ``-v`` (data only for those variables; names may be ``g/v`` or ``/g/v``); ``classic`` prints what
    ncdump prints differently for a netCDF-3 file (text attributes broken after newlines).
    ``processes``: format the values of large variables in worker processes too (spawned, so a script
    using it must guard its main code with ``if __name__ == "__main__"``, as multiprocessing requires).
    Raises :class:`NoSuchVariable` before printing anything if a ``variables`` entry matches nothing.
    """
    wanted = [v for v in variables if v] if variables else []
    for wanted_name in wanted:
        if not any(_select(group, wanted_name) for group in dataset.walk()):
            raise NoSuchVariable(f"{wanted_name}: No such variable")
    output = _Output(out, processes)
    try:
        _Printer(dataset, output, header_only, special, wanted, classic).dump(
            name if name is not None else _dataset_name(dataset)
        )
    finally:  # like ncdump, what was printed before an error stays printed
        output.close()
        output.flush()
        if hasattr(out, "flush"):
            out.flush()


def _dataset_name(dataset) -> str:
    return getattr(dataset, "display_name", "dataset")


def _select(group, wanted: str) -> list[str]:
    """Variables of ``group`` that ``nc_inq_gvarid`` matches with ``wanted``."""
    if "/" not in wanted:
        return [wanted] if wanted in group.variables else []
    var_group, _, rel_name = wanted.rpartition("/")
    path = group.path
    matches = path == var_group if wanted.startswith("/") else path.endswith(var_group)
    return [rel_name] if matches and rel_name in group.variables else []


class _Printer:
    def __init__(
        self, dataset, output: _Output, header_only: bool, special: bool, wanted: list[str], classic: bool
    ) -> None:
        self.dataset = dataset
        self.classic = classic
        self.out = output
        self.header_only = header_only
        self.special = special
        self.wanted = wanted

    def dump(self, name: str) -> None:
        self.out.write(b"netcdf " + escaped_name(name) + b" {\n")
        self.group(self.dataset)
        self.out.write(b"}\n")

    # ------------------------------------------------------------------ one group
    def group(self, group) -> None:
        out = self.out
        self.dimensions(group)
        if group.variables:
            out.indented(b"variables:\n")
        for variable in group.variables.values():
            self.declaration(group, variable)
        self.group_attributes(group)
        if not self.header_only:
            self.data(group)
        for child in group.groups.values():
            out.write(b"\n")
            out.indented(b"group: " + escaped_name(child.name) + b" {\n")
            out.indent += 2
            self.group(child)
            out.indented(b"} // group " + escaped_name(child.name) + b"\n")
            out.indent -= 2

    def dimensions(self, group) -> None:
        if not group.dimensions:
            return
        self.out.indented(b"dimensions:\n")
        for dim in group.dimensions.values():
            size = b"UNLIMITED ; // (%d currently)" % dim.size if dim.unlimited else b"%d ;" % dim.size
            self.out.indented(b"\t" + escaped_name(dim.name) + b" = " + size + b"\n")

    def declaration(self, group, variable) -> None:
        line = b"\t" + variable.nctype.name.encode() + b" " + escaped_name(variable.name)
        if variable.dims:
            line += b"(" + b", ".join(dimension_reference(group, dim) for dim in variable.dims) + b")"
        self.out.indented(line + b" ;\n")
        for attribute in variable.attrs.all_typed():
            self.attribute(variable.name, attribute)
        if self.special:
            for att_name, text in special_attributes(variable):
                self.out.indented(b"\t\t" + escaped_name(variable.name) + b":" + att_name.encode() + text)

    def group_attributes(self, group) -> None:
        attributes = group.attrs.all_typed()
        is_root = group.parent is None
        if attributes or self.special:
            kind = b"global" if is_root else b"group"
            self.out.write(b"\n")
            self.out.indented(b"// " + kind + b" attributes:\n")
        for attribute in attributes:
            self.attribute("", attribute)
        if is_root and self.special:
            for att_name, text in global_special_attributes(self.dataset):
                self.out.indented(b"\t\t:" + att_name.encode() + text)

    def attribute(self, var_name: str, attribute: Attribute) -> None:
        string = attribute.nctype.name == "string"
        line = b"\t\t" + (b"string " if string else b"") + escaped_name(var_name)
        if var_name in KEYWORDS:
            line += b" "
        line += (
            b":" + escaped_name(attribute.name) + b" = " + attribute_text(attribute, self.classic) + b" ;\n"
        )
        self.out.indented(line)

    # ------------------------------------------------------------------ data section
    def data(self, group) -> None:
        if not group.variables:
            return
        self.out.indented(b"data:\n")
        selected = None
        if self.wanted:
            selected = {name for wanted in self.wanted for name in _select(group, wanted)}
        for name, variable in group.variables.items():
            if selected is not None and name not in selected:
                continue
            if any(size == 0 for size in _extent(variable)):
                continue  # nothing written along an unlimited dimension yet
            _VariableData(self.out, variable).dump()


def dimension_reference(group, dim) -> bytes:
    """How a variable in ``group`` names ``dim``: simple, or group-qualified when shadowed/unreachable."""
    duplicate = False
    search = group
    while search is not None:
        nearest = _nearest_dimension(search, dim.name)
        if nearest is dim:
            break
        if nearest is not None:
            duplicate = True
        search = search.parent
    if search is None:  # not visible from here: ncdump searches the whole tree
        search = _group_holding(group.root, dim)
        duplicate = True
    prefix = b""
    if duplicate:
        path = search.path
        prefix = escaped_name(path) + (b"/" if path != "/" else b"")
    return prefix + escaped_name(dim.name)


def _group_holding(root, dim):
    return next((g for g in root.walk() if any(d is dim for d in g.dimensions.values())), root)


def _nearest_dimension(group, name: str):
    """``nc_inq_dimid``: the dimension of that name in the group or its closest ancestor."""
    while group is not None:
        found = group.dimensions.get(name)
        if found is not None:
            return found
        group = group.parent
    return None


# ============================================================================ -s virtual attributes
def special_attributes(variable) -> list[tuple[str, bytes]]:
    """``pr_att_specials`` for an NCZarr variable: (name, text from `` = `` to the line end)."""
    layout = variable.layout
    chunks = ", ".join(str(c) for c in layout.chunks[: len(variable.dims)])
    items = [("_Storage", b' = "chunked" ;\n')]
    items.append(("_ChunkSizes", b" = " + chunks.encode() + (b" ;\n" if variable.dims else b"")))
    configs = layout.codecs.configs
    filters = [_hdf5_filter(config) for config in configs]
    ids = {f[0] for f in filters if f is not None}
    if _FLETCHER32 in ids:
        items.append(("_Fletcher32", b' = "true" ;\n'))
    if _SHUFFLE in ids:
        items.append(("_Shuffle", b' = "true" ;\n'))
    deflate = next((f for f in filters if f is not None and f[0] == _DEFLATE), None)
    if deflate is not None:
        items.append(("_DeflateLevel", b" = %d ;\n" % (deflate[1][0] if deflate[1] else -1)))
    other = [f for f in filters if f is not None and f[0] not in (_DEFLATE, _SHUFFLE, _FLETCHER32)]
    if other:
        text = "|".join(",".join(str(n) for n in (fid, *params)) for fid, params in other)
        items.append(("_Filter", b' = "' + text.encode() + b'" ;\n'))
    if configs:
        codecs = "[" + ",".join(netcdf_text(config) for config in configs) + "]"
        items.append(("_Codecs", b' = "' + _escaped_string(codecs) + b'" ;\n'))
    multi_byte = variable.nctype.numpy.itemsize > 1 and variable.nctype.name != "string"
    if multi_byte and layout.dtype.explicit_order:
        byteorder = layout.dtype.storage.byteorder
        order = {">": "big", "<": "little"}.get(byteorder, sys.byteorder)
        items.append(("_Endianness", b' = "' + order.encode() + b'" ;\n'))
    if variable.fill_value is None:
        items.append(("_NoFill", b' = "true" ;\n'))
    return items


def global_special_attributes(dataset) -> list[tuple[str, bytes]]:
    """``pr_att_hidden`` and ``pr_att_global_format`` for an NCZarr root group."""
    items = []
    provenance = getattr(dataset, "provenance", None)
    if provenance:
        items.append(("_NCProperties", b' = "' + encode_text(provenance) + b'" ;\n'))
    dialect = getattr(dataset, "dialect", None)
    superblock = dialect.superblock_version if dialect is not None else 0
    items.append(("_SuperblockVersion", b" = %d ;\n" % superblock))
    items.append(("_IsNetcdf4", b" = 1 ;\n"))
    items.append(("_Format", b' = "netCDF-4" ;\n'))
    return items


def _hdf5_filter(config: dict) -> tuple[int, list[int]] | None:
    """The HDF5 filter id and visible parameters netcdf-c's plugins give a Zarr codec (None: no plugin)."""
    codec = config.get("id")
    if codec == "zlib":
        return _DEFLATE, [int(config.get("level", 0))]
    if codec == "shuffle":
        return _SHUFFLE, []
    if codec == "fletcher32":
        return _FLETCHER32, []
    if codec == "bz2":
        return 307, [int(config.get("level", 0))]
    if codec == "zstd":
        return 32015, [int(config.get("level", 0))]
    if codec == "szip":
        return 4, [int(config.get("mask", 0)), int(config.get("pixels-per-block", 0))]
    if codec == "blosc":
        code = _BLOSC_CODES.get(config.get("cname", "lz4"), 1)
        blocksize, clevel = int(config.get("blocksize", 1)), int(config.get("clevel", 9))
        return 32001, [0, 0, 0, blocksize, clevel, int(config.get("shuffle", 0)), code]
    return None


def _escaped_string(text: str) -> bytes:
    """utils.c ``escaped_string``: control characters as ``\\%xx``, ``"`` as ``\\"``."""
    out = bytearray()
    for byte in encode_text(text):
        if is_cntrl(byte):
            out += b"\\%%%.2x" % byte
        elif byte == 0x22:
            out += b'\\"'
        else:
            out.append(byte)
    return bytes(out)


# ============================================================================ one variable's data
class _VariableData:
    """``vardata``/``print_rows`` for one variable."""

    def __init__(self, out: _Output, variable) -> None:
        self.out = out
        self.variable = variable
        self.shape = _extent(variable)
        self.rank = len(self.shape)
        c_format = _c_format_attribute(variable)
        self.as_text = variable.nctype.name == "char" and c_format in (None, "%s", "")
        self.format = ValueFormatter(
            variable.nctype.name,
            fill_value_for_cdl(variable),
            c_format,
            empty_is_null=source_format(variable.group.root) != "netcdf4",
        )
        self.unlimited = [dim.unlimited for dim in variable.dims]

    def dump(self) -> None:
        out = self.out
        name = encode_text(self.variable.name)
        out.write(b"\n")
        out.indented(b" " + escaped_name(self.variable.name))
        if self.rank <= 1:
            out.write(b" = ")
            out.linep = len(name) + 4 + out.indent
        else:
            out.write(b" =\n  ")
            out.linep = 2 + out.indent
        pool = self.out.formatting_pool() if self._parallel() else None
        if pool is None:
            for index, pieces in self._rows():
                self._row(index, pieces)
        else:
            for index, pieces, text in self._formatted_rows(pool):
                self._row(index, pieces, text)

    def _parallel(self) -> bool:
        """Whether rows are formatted in other processes: many values of a number type printed by the
        plain format, read in slabs of whole rows."""
        shape = self.shape
        return (
            self.rank >= 2
            and not self.as_text
            and self.format.nctype not in ("char", "string")
            and self.format.c_format is None
            and math.prod(shape) >= PARALLEL_VALUES
            and math.prod(shape[1:]) <= SLAB_ELEMENTS
        )

    def _formatted_rows(self, pool) -> Iterator[tuple[tuple[int, ...], Iterator[np.ndarray], bytes | None]]:
        """``_rows`` with each row's text (:meth:`ValueFormatter.joined`) made by ``pool``, a few slabs
        ahead of the one printed."""
        shape, row_len = self.shape, self.shape[-1]
        slabs = self._slabs()
        pending = collections.deque()

        def submit() -> None:
            for start, slab in itertools.islice(slabs, 1):
                rows = slab.reshape(-1, row_len)
                task = (
                    format_rows,
                    self.format.nctype,
                    self.format.fill,
                    rows,
                    self._row_start(),
                    self.out.indent,
                )
                pending.append((start, slab, pool.submit(*task)))

        for _ in range(AHEAD * self.out.workers):
            submit()
        while pending:
            start, slab, future = pending.popleft()
            submit()
            texts = future.result()
            rows = slab.reshape(-1, row_len)
            for offset, index in enumerate(np.ndindex(slab.shape[0], *shape[1:-1])):
                yield (start + index[0], *index[1:]), iter([rows[offset]]), texts[offset]

    # ---------------------------------------------------------------- reading
    def _rows(self) -> Iterator[tuple[tuple[int, ...], Iterator[np.ndarray]]]:
        """(row index without the last dimension, pieces of that row) in C order, bounded memory."""
        variable, shape = self.variable, self.shape
        if self.rank == 0:
            yield (), iter([np.asarray(variable[...]).reshape(1)])
            return
        if self.rank == 1:
            yield (), self._pieces(())
            return
        row_len = shape[-1]
        inner = math.prod(shape[1:])
        if inner > SLAB_ELEMENTS:
            for index in np.ndindex(*shape[:-1]):
                yield index, self._pieces(index)
            return
        for start, slab in self._slabs():
            rows = slab.reshape(-1, row_len)
            for offset, index in enumerate(np.ndindex(slab.shape[0], *shape[1:-1])):
                yield (start + index[0], *index[1:]), iter([rows[offset]])

    def _slabs(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first index along the first dimension, values) of slabs of whole rows, chunk-aligned."""
        shape = self.shape
        step = self._slab_rows(math.prod(shape[1:]))
        for start in range(0, shape[0], step):
            yield (
                start,
                self._read((slice(start, min(start + step, shape[0])), *(slice(0, n) for n in shape[1:]))),
            )

    def _slab_rows(self, inner: int) -> int:
        return _aligned_step(max(1, SLAB_ELEMENTS // inner), self.variable.chunks[0])

    def _pieces(self, index: tuple[int, ...]) -> Iterator[np.ndarray]:
        length = self.shape[-1]
        step = _aligned_step(SLAB_ELEMENTS, self.variable.chunks[-1])
        for start in range(0, length, step):
            stop = min(start + step, length)
            yield self._read((*(slice(i, i + 1) for i in index), slice(start, stop))).reshape(-1)

    def _read(self, region: tuple[slice, ...]) -> np.ndarray:
        """The values of a region of the dimensions' extent; beyond the array's own shape (an unlimited
        dimension that grew through another variable) they are the fill value, as netcdf-c returns."""
        stored = tuple(self.variable.shape)
        clipped = tuple(slice(min(r.start, n), min(r.stop, n)) for r, n in zip(region, stored, strict=True))
        values = np.asarray(self.variable[clipped])
        wanted = tuple(r.stop - r.start for r in region)
        if values.shape == wanted:
            return values
        padded = np.full(wanted, _missing_value(self.variable), dtype=values.dtype)
        padded[tuple(slice(0, n) for n in values.shape)] = values
        return padded

    # ---------------------------------------------------------------- printing
    def _row_start(self) -> int:
        """The line position every row of a variable of rank 2 or more starts at (after ``"  "``)."""
        return 2 + self.out.indent

    def _row(self, index: tuple[int, ...], pieces: Iterator[np.ndarray], done: object = _UNSET) -> None:
        """One row; ``done`` is what :func:`format_rows` made of it, if it was given to a worker."""
        out = self.out
        opens, closes = self._record_marks(index)
        for _ in range(opens):
            out.lput(b"{")
        if isinstance(done, Formatted) and out.linep == self._row_start():  # formatted from here
            out.write(done.lines)
            out.linep = done.linep
            last = done.last
        elif self.as_text:
            raw = b"".join(np.asarray(piece, dtype="S1").tobytes() for piece in pieces)
            out.write(quote_char_data(raw))  # printed directly: the line position is not advanced
            last = b""
        else:
            values = [piece.reshape(-1) for piece in pieces]
            row = self.format.joined(np.concatenate(values) if len(values) > 1 else values[0], b", ")
            if row is not None:  # the common case: one formatting call, one regex match per line
                head, _, last = row.rpartition(b", ")
                out.lput_row(head + b", " if head else b"", b", ")
            else:
                texts = [text for piece in values for text in self.format(piece)]
                if self.format.nctype == "string":  # quoted text may hold the separator itself
                    out.lput_items(texts[:-1], b", ")
                else:
                    out.lput_row(b"".join(text + b", " for text in texts[:-1]), b", ")
                last = texts[-1]
        out.lput(last + b"}" * closes)
        if all(i == size - 1 for i, size in zip(index, self.shape, strict=False)):
            out.lput(b" ;")
            out.lput(b"\n")
        else:
            out.lput(b",\n")
            out.lput(b"  ")

    def _record_marks(self, index: tuple[int, ...]) -> tuple[int, int]:
        """How many ``{`` open before and ``}`` close after this row (non-leading unlimited dimensions)."""
        opens = closes = 0
        for level in range(1, self.rank):
            if not self.unlimited[level]:
                continue
            below = range(level, self.rank - 1)
            opens += all(index[i] == 0 for i in below)
            closes += all(index[i] == self.shape[i] - 1 for i in below)
        return opens, closes


def _extent(variable) -> tuple[int, ...]:
    """What ncdump prints: the current lengths of the variable's dimensions (``nc_inq_dimlen``)."""
    if not variable.dims:
        return ()
    return tuple(max(dim.size, n) for dim, n in zip(variable.dims, variable.shape, strict=True))


def _missing_value(variable) -> object:
    fill = variable.fill_value
    if fill is not None:
        return fill
    return {"char": b"", "string": ""}.get(variable.nctype.name, 0)


def _aligned_step(limit: int, chunk: int) -> int:
    """The largest whole number of chunks within ``limit`` (``limit`` itself when one chunk is larger)."""
    return limit - limit % chunk if chunk <= limit else limit


def source_format(dataset) -> str | None:
    """The format of the file a dataset was read from (``netcdf4``, ``netcdf3``, ``tiff``: a file, or a
    manifest made of such files), or None for a store: ncdump prints a few things differently for them."""
    found = getattr(dataset, "source_format", None)
    if found is None:
        manifest = getattr(getattr(dataset, "zmap", None), "manifest", None)
        found = getattr(manifest, "source_format", None)
    return found


def fill_value_for_cdl(variable) -> object:
    """The value ncdump prints as ``_`` (``get_fill_info``): a ``_FillValue`` attribute of the variable's
    type and length 1, else the type's default fill, none for byte/ubyte."""
    nctype = variable.nctype
    attribute = variable.attrs.typed("_FillValue") if "_FillValue" in variable.attrs else None
    if attribute is not None and attribute.nctype.name == nctype.name and len(attribute.value) == 1:
        return attribute.value[0] if nctype.name != "char" else encode_text(attribute.value)
    if nctype.name in ("byte", "ubyte"):
        return None
    if nctype.name == "string":
        return ""
    return nctype.fill


def _c_format_attribute(variable) -> str | None:
    """A ``C_format`` char attribute of length 1..99 replaces the default value format."""
    if "C_format" not in variable.attrs:
        return None
    attribute = variable.attrs.typed("C_format")
    if attribute.nctype.name != "char" or not 0 < len(encode_text(attribute.value)) < 100:
        return None
    return attribute.value.split("\x00", 1)[0]
