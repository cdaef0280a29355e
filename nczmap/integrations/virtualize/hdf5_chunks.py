"""An HDF5 dataset's chunk index read as numpy columns, without a Python object a chunk.

h5py's ``chunk_iter`` calls Python back once a chunk: two million chunks cost seconds before anything is
written. Here the index is read from the file's bytes as HDF5 lays it out, a node at a time, each node's
records decoded by one ``numpy.frombuffer``:

- the version-1 B-tree of chunks (node type 1) of a layout message of version 3 (what netCDF-C, h5py and
  HDF5's default ``libver`` write) or 4;
- the single chunk, implicit index and fixed array (paged or not) of a layout message of version 4 (or 5,
  HDF5 2.0's), what HDF5 writes with ``libver="latest"`` for datasets of fixed size.

Anything else (extensible arrays and version-2 B-trees of datasets with unlimited dimensions written with
``libver="latest"``, layout messages of versions 1–2, 2- to 7-byte addresses, bytes that do not read as
described) gives None, and the caller asks h5py (``chunk_iter``). Nothing here trusts the file: every node
has its signature, type and level checked, every address lies inside the file, and the nodes visited are
bounded, so a damaged or hostile file gives None (h5py then says what is wrong), never a loop.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Read = Callable[[int, int], bytes]

LAYOUT = 0x0008  # the data layout message
CONTINUATION = 0x0010  # the object header continuation message
MAX_HEADER_BLOCKS = 64  # object header continuation blocks followed
MAX_LEVELS = 32  # levels of one B-tree
DEFAULT_ISTORE_K = 32  # HDF5's K of chunk B-trees (2K entries a node)
MAX_NODES = 1 << 22  # B-tree nodes visited in all (a 2K-entry node each: far beyond any real index)


@dataclass
class FileFacts:
    """What reading a file's structures needs: where its addresses start (the user block), how many
    bytes an address and a length take, the chunk B-trees' K, the file's size."""

    base: int
    address_size: int
    length_size: int
    istore_k: int
    size: int


@dataclass
class ChunkColumns:
    """Every allocated chunk: its first element along each axis, byte offset (in the file), stored size
    and filter mask."""

    corners: np.ndarray  # (n, rank) int64
    offsets: np.ndarray  # int64
    sizes: np.ndarray  # int64
    masks: np.ndarray  # uint32


class _Unreadable(Exception):
    """The bytes are not what this reader knows: h5py is asked instead."""


def file_facts(h5file, read: Read, size: int) -> FileFacts:
    """The facts of an open h5py file (its creation property list, and its superblock's K for chunk
    B-trees when it is of version 1: HDF5's default, 32, otherwise; a larger K in a superblock extension
    shows as a node with more entries than that, and h5py is asked)."""
    plist = h5file.id.get_create_plist()
    address_size, length_size = plist.get_sizes()
    base = plist.get_userblock()
    istore_k = DEFAULT_ISTORE_K
    superblock = read(base, 26) if base + 26 <= size else b""
    if len(superblock) == 26 and superblock[8] == 1:
        istore_k = struct.unpack_from("<H", superblock, 24)[0] or DEFAULT_ISTORE_K
    return FileFacts(base, address_size, length_size, istore_k, size)


def chunk_columns(
    read: Read,
    facts: FileFacts,
    header: int,
    shape: tuple[int, ...],
    chunk_bytes: int,
    maxshape: tuple[int | None, ...] | None = None,
) -> ChunkColumns | None:
    """The chunk index of the dataset whose object header is at ``header`` (``shape`` its extent,
    ``maxshape`` its largest, None for unlimited axes; ``chunk_bytes`` an unfiltered chunk's size), or
    None if this reader does not know its form."""
    if facts.address_size != 8 or facts.length_size not in (4, 8):
        return None
    reader = _Reader(read, facts)
    largest = tuple(n if m is None else m for n, m in zip(shape, maxshape or shape, strict=True))
    try:
        layout = reader.layout_message(header)
        columns = reader.index(layout, shape, largest, chunk_bytes)
    except (_Unreadable, struct.error, ValueError, IndexError, MemoryError):
        return None
    if columns is not None:
        columns.offsets += facts.base  # chunk addresses are relative to the base address
    return columns


class _Reader:
    def __init__(self, read: Read, facts: FileFacts) -> None:
        self._read, self.facts = read, facts
        self.undefined = (1 << 64) - 1

    def read(self, address: int, length: int) -> bytes:
        """``length`` bytes at file address ``address`` (relative to the base address)."""
        start = self.facts.base + address
        if address < 0 or length < 0 or start + length > self.facts.size:
            raise _Unreadable(f"{length} bytes at {address} lie outside the file")
        data = self._read(start, length)
        if len(data) != length:
            raise _Unreadable(f"{length} bytes at {address}: {len(data)} read")
        return data

    # ------------------------------------------------------------------ object headers
    def layout_message(self, header: int) -> bytes:
        """The body of the data layout message of the object header at ``header``."""
        first = self.read(header, min(16, self.facts.size - self.facts.base - header))
        if first[:4] == b"OHDR":
            return self._layout_v2(header)
        if first[0] == 1:
            return self._layout_v1(header, first)
        raise _Unreadable("an object header of an unknown version")

    def _layout_v1(self, header: int, first: bytes) -> bytes:
        def messages(block: bytes):
            at = 0
            while at + 8 <= len(block):
                kind, body = struct.unpack_from("<HH", block, at)
                yield kind, block[at + 8 : at + 8 + body]
                at += 8 + body

        return self._layout_in((header + 16, struct.unpack_from("<I", first, 8)[0]), messages)

    def _layout_v2(self, header: int) -> bytes:
        flags = self.read(header, 6)[5]
        at = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
        width = 1 << (flags & 0x03)
        size = int.from_bytes(self.read(header + at, width), "little")
        ordered = 2 if flags & 0x04 else 0

        def messages(block: bytes):
            at = 0
            if block[:4] == b"OCHK":  # a continuation block: its signature, and its checksum at the end
                at, block = 4, block[:-4]
            while at + 4 + ordered <= len(block):
                kind, body = block[at], struct.unpack_from("<H", block, at + 1)[0]
                yield kind, block[at + 4 + ordered : at + 4 + ordered + body]
                at += 4 + ordered + body

        return self._layout_in((header + at + width, size), messages)

    def _layout_in(self, first: tuple[int, int], messages) -> bytes:
        """The layout message's body among the header blocks from ``first`` on (continuations followed,
        at most MAX_HEADER_BLOCKS), ``messages(block)`` giving each block's ``(type, body)``."""
        blocks = [first]
        for _ in range(MAX_HEADER_BLOCKS):
            if not blocks:
                break
            for kind, data in messages(self.read(*blocks.pop(0))):
                if kind == LAYOUT:
                    return data
                if kind == CONTINUATION:
                    blocks.append(struct.unpack_from("<QQ" if self.facts.length_size == 8 else "<QI", data))
        raise _Unreadable("no layout message")

    # ------------------------------------------------------------------ chunk indexes
    def index(
        self, layout: bytes, shape: tuple[int, ...], largest: tuple[int, ...], chunk_bytes: int
    ) -> ChunkColumns | None:
        version, kind = layout[0], layout[1]
        if kind != 2:
            raise _Unreadable("not a chunked layout")
        rank = len(shape)
        if version == 3:
            dimensionality = layout[2]
            if dimensionality != rank + 1:
                raise _Unreadable("a layout of another rank")
            root = struct.unpack_from("<Q", layout, 3)[0]
            chunks = struct.unpack_from(f"<{rank}I", layout, 11)
            return self.btree_v1(root, rank, _grid(largest, chunks))
        if version not in (4, 5):  # 5: HDF5 2.0's, laid out as 4 here
            return None
        flags, dimensionality, width = layout[2], layout[3], layout[4]
        if dimensionality != rank + 1 or not 1 <= width <= 8:
            raise _Unreadable("a layout of another rank")
        at = 5 + dimensionality * width
        chunks = [int.from_bytes(layout[5 + i * width : 5 + (i + 1) * width], "little") for i in range(rank)]
        index_type = layout[at]
        at += 1
        if index_type == 1:  # one chunk, the whole dataset
            filtered = flags & 0x02
            size, mask = chunk_bytes, 0
            if filtered:
                size = int.from_bytes(layout[at : at + self.facts.length_size], "little")
                mask = struct.unpack_from("<I", layout, at + self.facts.length_size)[0]
                at += self.facts.length_size + 4
            address = struct.unpack_from("<Q", layout, at)[0]
            if address == self.undefined:
                return _columns(np.zeros((0, rank), np.int64), [], [], [])
            return _columns(np.zeros((1, rank), np.int64), [address], [size], [mask])
        grid, whole = _grid(shape, chunks), _grid(largest, chunks)
        if index_type == 2:  # implicit: every chunk of the largest grid allocated, in C order, at once
            address = struct.unpack_from("<Q", layout, at)[0]
            if address == self.undefined:
                return _columns(np.zeros((0, rank), np.int64), [], [], [])
            count = math.prod(grid)
            indices = np.unravel_index(np.arange(count, dtype=np.int64), grid) if rank else ()
            numbers = np.ravel_multi_index(indices, whole) if rank else np.zeros(count, np.int64)
            offsets = address + numbers.astype(np.int64) * chunk_bytes
            corners = _corners(np.arange(count, dtype=np.int64), grid, chunks)
            return _columns(corners, offsets, np.full(count, chunk_bytes), np.zeros(count))
        if index_type == 3:  # a fixed array, over the largest grid
            address = struct.unpack_from("<Q", layout, at + 1)[0]
            return self.fixed_array(address, whole, chunks, chunk_bytes)
        return None  # an extensible array or a version-2 B-tree: h5py's chunk_iter

    def btree_v1(self, root: int, rank: int, grid: tuple[int, ...]) -> ChunkColumns:
        """Every chunk under the version-1 B-tree node at ``root``, level by level; no node read twice,
        and no more chunks than a few times ``grid`` holds (more than a dataset shrunk could keep)."""
        if root == self.undefined:
            return _columns(np.zeros((0, rank), np.int64), [], [], [])
        dimensions = rank + 1
        record = np.dtype(
            [("size", "<u4"), ("mask", "<u4"), ("offset", "<u8", (dimensions,)), ("child", "<u8")]
        )
        key = 8 + 8 * dimensions
        twice_k = 2 * self.facts.istore_k
        node_size = 24 + twice_k * record.itemsize + key
        level_nodes, level, visited = [root], None, {root}
        leaves: list[bytes] = []
        most = 4 * math.prod(grid) + 4096
        held = 0
        for _ in range(MAX_LEVELS):
            children: list[bytes] = []
            for address in level_nodes:
                if len(visited) > MAX_NODES:
                    raise _Unreadable("too many B-tree nodes")
                node = self.read(address, node_size)
                if node[:4] != b"TREE" or node[4] != 1:
                    raise _Unreadable("not a B-tree node of chunks")
                node_level, used = node[5], struct.unpack_from("<H", node, 6)[0]
                if used > twice_k or (level is not None and node_level != level):
                    raise _Unreadable("a B-tree node out of place")
                level = node_level
                (leaves if node_level == 0 else children).append(node[24 : 24 + used * record.itemsize])
                held += used if node_level == 0 else 0
                if held > most:
                    raise _Unreadable("more chunks than the dataset could hold")
            if level == 0:
                break
            if not children:
                raise _Unreadable("an internal B-tree node without children")
            level_nodes = np.frombuffer(b"".join(children), dtype=record)["child"].tolist()
            if len(set(level_nodes)) != len(level_nodes) or visited.intersection(level_nodes):
                raise _Unreadable("a B-tree node reached twice")
            visited.update(level_nodes)
            level -= 1
        else:
            raise _Unreadable("a B-tree too deep")
        entries = np.frombuffer(b"".join(leaves), dtype=record)
        corners = entries["offset"][:, :rank].astype(np.int64)
        return _columns(corners, entries["child"], entries["size"], entries["mask"])

    def fixed_array(
        self, header: int, grid: tuple[int, ...], chunks: list[int], chunk_bytes: int
    ) -> ChunkColumns:
        """Every chunk of the fixed array whose header is at ``header`` (elements in C order)."""
        rank = len(grid)
        if header == self.undefined:  # no chunk written yet: the array is made with the first
            return _columns(np.zeros((0, rank), np.int64), [], [], [])
        head = self.read(header, 12 + self.facts.length_size + 8)
        if head[:4] != b"FAHD":
            raise _Unreadable("not a fixed array header")
        client, entry_size, page_bits = head[5], head[6], head[7]
        count = int.from_bytes(head[8 : 8 + self.facts.length_size], "little")
        block = struct.unpack_from("<Q", head, 8 + self.facts.length_size)[0]
        if count != math.prod(grid):
            raise _Unreadable("a fixed array of another size")
        if block == self.undefined:
            return _columns(np.zeros((0, rank), np.int64), [], [], [])
        if client == 0:
            if entry_size != 8:
                raise _Unreadable("an unfiltered fixed array entry of another size")
            element = np.dtype([("address", "<u8")])
        elif client == 1:
            width = entry_size - 12
            if not 1 <= width <= 8:
                raise _Unreadable("a filtered fixed array entry of another size")
            element = np.dtype([("address", "<u8"), ("size", f"V{width}"), ("mask", "<u4")])
        else:
            raise _Unreadable("a fixed array of another client")
        prefix = 14  # signature, version, client, header address
        page = 1 << page_bits
        if count <= page:
            data = self.read(block, prefix + count * entry_size)
            if data[:4] != b"FADB":
                raise _Unreadable("not a fixed array data block")
            elements = np.frombuffer(data, dtype=element, count=count, offset=prefix)
        else:
            pages = -(-count // page)
            bitmap = (pages + 7) // 8
            start = block + prefix + bitmap + 4  # the pages follow the block's prefix and checksum
            head = self.read(block, prefix + bitmap)
            if head[:4] != b"FADB":
                raise _Unreadable("not a fixed array data block")
            initialised = np.unpackbits(np.frombuffer(head, np.uint8, bitmap, prefix))  # MSB first
            parts = []
            for number in range(pages):
                rows = min(page, count - number * page)
                if not initialised[number]:  # never written: its chunks are all unallocated
                    unwritten = np.zeros(rows, dtype=element)
                    unwritten["address"] = self.undefined
                    parts.append(unwritten)
                    continue
                data = self.read(start + number * (page * entry_size + 4), rows * entry_size)
                parts.append(np.frombuffer(data, dtype=element, count=rows))
            elements = np.concatenate(parts)
        addresses = elements["address"]
        held = np.flatnonzero(addresses != self.undefined)
        if client == 0:
            sizes = np.full(len(held), chunk_bytes, dtype=np.int64)
            masks = np.zeros(len(held), dtype=np.uint32)
        else:
            raw = np.frombuffer(elements["size"][held].tobytes(), dtype=np.uint8).reshape(len(held), -1)
            sizes = (raw.astype(np.int64) << (8 * np.arange(raw.shape[1], dtype=np.int64))).sum(axis=1)
            masks = elements["mask"][held]
        corners = _corners(held.astype(np.int64), grid, chunks)
        return _columns(corners, addresses[held], sizes, masks)


def _grid(shape: tuple[int, ...], chunks) -> tuple[int, ...]:
    return tuple(-(-n // c) if c else 0 for n, c in zip(shape, chunks, strict=True))


def _corners(flats: np.ndarray, grid: tuple[int, ...], chunks: list[int]) -> np.ndarray:
    """The first element of each chunk numbered ``flats`` in C order of ``grid``."""
    if not grid:
        return np.zeros((len(flats), 0), dtype=np.int64)
    indices = np.stack(np.unravel_index(flats, grid), axis=1) if len(flats) else np.zeros((0, len(grid)))
    return indices.astype(np.int64) * np.asarray(chunks, dtype=np.int64)


def _columns(corners, offsets, sizes, masks) -> ChunkColumns:
    offsets = np.asarray(offsets, dtype=np.uint64)
    if len(offsets) and int(offsets.max()) > (1 << 62):
        raise _Unreadable("a chunk address beyond any file")
    return ChunkColumns(
        np.asarray(corners, dtype=np.int64),
        offsets.astype(np.int64),
        np.asarray(sizes, dtype=np.int64),
        np.asarray(masks, dtype=np.uint32),
    )
