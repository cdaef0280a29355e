"""TIFF's predictors and compressions as numcodecs codecs, in numpy, for readers without imagecodecs.

The references nczmap writes for TIFF sources name the codec ids tifffile and kerchunk write
(``imagecodecs_delta``, ``imagecodecs_floatpred``, ``imagecodecs_lzw``, ``imagecodecs_packbits``), so any
reader with imagecodecs-numcodecs decodes them. These classes decode (and encode) the same bytes the same
way; they are deliberately not registered in numcodecs' registry under those ids (they belong to
imagecodecs): :class:`~nczmap.format.codecs.CodecChain` takes them only when numcodecs does not know the id.

``nczmap.pad`` is nczmap's own: a stripped TIFF's last strip holds only the rows left over, fewer than a
chunk's; it pads (or cuts) the decompressed bytes to the chunk's size before a predictor filter runs. It is
registered through the ``numcodecs.codecs`` entry point, so zarr-python finds it by its id.
"""

from __future__ import annotations

import numpy as np
from numcodecs.abc import Codec

from nczmap.errors import FormatError

_CLEAR, _EOI = 256, 257


def _unsigned(dtype: np.dtype) -> np.dtype:
    """The native unsigned integer dtype of the same size: predictors work on bit patterns."""
    return np.dtype(f"u{dtype.itemsize}")


def _as_array(buf, shape, dtype) -> np.ndarray:
    if dtype is None:
        return np.frombuffer(memoryview(buf).cast("B"), dtype="u1")
    array = np.frombuffer(buf, dtype=dtype) if not isinstance(buf, np.ndarray) else buf
    if array.dtype != dtype:
        array = np.frombuffer(np.ascontiguousarray(array).tobytes(), dtype=dtype)
    return array.reshape(shape) if shape is not None else array


def _strided_cumsum(values: np.ndarray, axis: int, dist: int) -> np.ndarray:
    """Running sums along ``axis`` of every ``dist``-th element (wrapping in the integer dtype)."""
    moved = np.moveaxis(values, axis, -1)
    length = moved.shape[-1]
    if dist == 1:
        return np.moveaxis(np.cumsum(moved, axis=-1, dtype=moved.dtype), -1, axis)
    padded = -length % dist
    wide = np.concatenate([moved, np.zeros((*moved.shape[:-1], padded), moved.dtype)], axis=-1)
    summed = np.cumsum(wide.reshape((*moved.shape[:-1], -1, dist)), axis=-2, dtype=moved.dtype)
    return np.moveaxis(summed.reshape(wide.shape)[..., :length], -1, axis)


def _strided_diff(values: np.ndarray, axis: int, dist: int) -> np.ndarray:
    moved = np.moveaxis(values, axis, -1)
    out = moved.copy()
    out[..., dist:] = moved[..., dist:] - moved[..., :-dist]
    return np.moveaxis(out, -1, axis)


class Delta(Codec):
    """TIFF predictor 2: differences of neighbours along ``axis``, on the values' bit patterns."""

    codec_id = "imagecodecs_delta"

    def __init__(self, *, shape=None, dtype=None, axis: int = -1, dist: int = 1) -> None:
        self.shape = None if shape is None else tuple(int(n) for n in shape)
        self.dtype = None if dtype is None else np.dtype(dtype).str
        self.axis = int(axis)
        self.dist = int(dist)
        if self.dist < 1:
            raise ValueError(f"imagecodecs_delta: dist {dist} is not positive")

    def _run(self, buf, step) -> np.ndarray:
        array = _as_array(buf, self.shape, None if self.dtype is None else np.dtype(self.dtype))
        native = array.astype(array.dtype.newbyteorder("=")) if not array.dtype.isnative else array
        bits = native.view(_unsigned(native.dtype)) if native.dtype.kind in "iuf" else native
        result = step(bits, self.axis, self.dist).view(native.dtype)
        return result.astype(array.dtype) if result.dtype != array.dtype else result

    def encode(self, buf):
        return self._run(buf, _strided_diff).tobytes()

    def decode(self, buf, out=None):
        return _to_out(self._run(buf, _strided_cumsum), out)


class FloatPred(Codec):
    """TIFF predictor 3: each row's values split into byte planes, most significant first, then the
    row's bytes differenced with a stride of one pixel (all its samples)."""

    codec_id = "imagecodecs_floatpred"

    def __init__(self, *, shape, dtype, axis: int = -1, dist: int = 1) -> None:
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype).str
        self.axis = int(axis)
        self.dist = int(dist)
        if self.dist < 1:
            raise ValueError(f"imagecodecs_floatpred: dist {dist} is not positive")

    def _geometry(self) -> tuple[int, int, int]:
        """(rows, samples per row, byte stride): a row is everything from ``axis`` on, C order."""
        axis = self.axis % len(self.shape)
        rows = int(np.prod(self.shape[:axis], dtype=np.int64))
        per_row = int(np.prod(self.shape[axis:], dtype=np.int64))
        stride = int(np.prod(self.shape[axis + 1 :], dtype=np.int64)) * self.dist
        return rows, per_row, stride

    def encode(self, buf):
        dtype = np.dtype(self.dtype)
        rows, per_row, stride = self._geometry()
        big = _as_array(buf, self.shape, dtype).astype(dtype.newbyteorder(">"))
        planes = big.reshape(rows, per_row).view("u1").reshape(rows, per_row, dtype.itemsize)
        shuffled = np.ascontiguousarray(planes.transpose(0, 2, 1)).reshape(rows, -1)
        return _strided_diff(shuffled, -1, stride).tobytes()

    def decode(self, buf, out=None):
        dtype = np.dtype(self.dtype)
        rows, per_row, stride = self._geometry()
        raw = np.frombuffer(memoryview(buf).cast("B"), dtype="u1")
        if raw.size != rows * per_row * dtype.itemsize:
            raise ValueError(f"imagecodecs_floatpred: {raw.size} bytes do not fill shape {self.shape}")
        summed = _strided_cumsum(raw.reshape(rows, -1), -1, stride)
        planes = summed.reshape(rows, dtype.itemsize, per_row).transpose(0, 2, 1)
        values = np.ascontiguousarray(planes).view(dtype.newbyteorder(">")).reshape(self.shape)
        return _to_out(values.astype(dtype), out)


class _ByteCodec(Codec):
    """A compression of bytes: ``_encode(data)`` and ``_decode(data, limit)`` on the bytes of the buffer."""

    @staticmethod
    def _encode(data: bytes) -> bytes:
        raise NotImplementedError

    @staticmethod
    def _decode(data: bytes, limit: int | None = None) -> bytes:
        raise NotImplementedError

    def encode(self, buf):
        return self._encode(bytes(memoryview(buf).cast("B")))

    def decode(self, buf, out=None):
        return _to_out(self._decode(bytes(memoryview(buf).cast("B"))), out)

    def decode_limited(self, buf, limit: int) -> bytes:
        """Decode, failing (FormatError) as soon as the output passes ``limit`` bytes."""
        return self._decode(bytes(memoryview(buf).cast("B")), limit)


class Lzw(_ByteCodec):
    """TIFF LZW (MSB-first codes, 9 to 12 bits, early change), and libtiff's old-style LSB-first LZW."""

    codec_id = "imagecodecs_lzw"

    @staticmethod
    def _encode(data: bytes) -> bytes:
        return lzw_encode(data)

    @staticmethod
    def _decode(data: bytes, limit: int | None = None) -> bytes:
        return lzw_decode(data, limit)


class PackBits(_ByteCodec):
    """TIFF PackBits run-length coding of bytes."""

    codec_id = "imagecodecs_packbits"

    @staticmethod
    def _encode(data: bytes) -> bytes:
        return packbits_encode(data)

    @staticmethod
    def _decode(data: bytes, limit: int | None = None) -> bytes:
        return packbits_decode(data, limit)


class Pad(Codec):
    """nczmap's padding filter: decoding makes the bytes exactly ``nbytes`` long (zeros appended or the
    excess cut); encoding passes them through. A TIFF's last strip is short of a whole chunk."""

    codec_id = "nczmap.pad"

    def __init__(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)
        if self.nbytes < 0:
            raise ValueError(f"nczmap.pad: nbytes {nbytes} is negative")

    def encode(self, buf):
        return bytes(memoryview(buf).cast("B"))

    def decode(self, buf, out=None):
        data = bytes(memoryview(buf).cast("B"))
        if len(data) < self.nbytes:
            data += bytes(self.nbytes - len(data))
        return _to_out(data[: self.nbytes], out)


CODECS: dict[str, type[Codec]] = {c.codec_id: c for c in (Delta, FloatPred, Lzw, PackBits, Pad)}


def get_codec(config: dict) -> Codec:
    """One of these codecs from a numcodecs config (KeyError: not one of them)."""
    config = dict(config)
    cls = CODECS[config.pop("id")]
    return cls(**config)


def _to_out(values, out):
    if out is None:
        return values
    from numcodecs.compat import ndarray_copy

    return ndarray_copy(values if isinstance(values, np.ndarray) else np.frombuffer(values, "u1"), out)


# ----------------------------------------------------------------------------------------------- LZW
def lzw_decode(data: bytes, limit: int | None = None) -> bytes:
    """Decode TIFF LZW; ``limit`` bounds the output (FormatError beyond it)."""
    if len(data) >= 2 and data[0] == 0 and data[1] & 1:
        return _lzw_decode_old(data, limit)
    table: list[bytes] = [bytes((i,)) for i in range(256)] + [b"", b""]
    append, out = table.append, []
    emit = out.append
    budget = (1 << 62) if limit is None else limit
    width, mask, size = 9, 511, 512 - 1  # size: the table length that widens codes (early change)
    buffer = count = pos = 0
    end = len(data)
    previous = b""
    while True:
        if count < width:
            if pos + 1 < end:  # two bytes at once: at most 12 + 7 bits are ever pending
                buffer = ((buffer << 16) | (data[pos] << 8) | data[pos + 1]) & 0xFFFFFFF
                pos += 2
                count += 16
            elif pos < end:
                buffer = ((buffer << 8) | data[pos]) & 0xFFFFFFF
                pos += 1
                count += 8
                if count < width:
                    break
            else:
                break
        count -= width
        code = (buffer >> count) & mask
        if code < 256 or code > 257:
            known = len(table)
            if code < known:
                entry = table[code]
                if previous and known < 4096:
                    append(previous + entry[:1])
            elif code == known and previous:
                entry = previous + previous[:1]
                append(entry)
            else:
                raise FormatError(f"corrupt LZW data: code {code} with {known} table entries")
            emit(entry)
            budget -= len(entry)
            if budget < 0:
                raise FormatError(f"LZW data decodes to more than {limit} bytes")
            previous = entry
            if len(table) >= size and width < 12:
                width += 1
                mask = (1 << width) - 1
                size = mask
        elif code == _CLEAR:
            del table[258:]
            width, mask, size = 9, 511, 511
            previous = b""
        else:
            break
    return b"".join(out)


def _lzw_decode_old(data: bytes, limit: int | None) -> bytes:
    """libtiff's pre-5.0 LZW: codes packed LSB-first, the width changing one code later."""
    table: list[bytes] = [bytes((i,)) for i in range(256)] + [b"", b""]
    out: list[bytes] = []
    produced = 0
    width = 9
    buffer = count = pos = 0
    previous = b""
    while True:
        while count < width:
            if pos >= len(data):
                return b"".join(out)
            buffer |= data[pos] << count
            pos += 1
            count += 8
        code = buffer & ((1 << width) - 1)
        buffer >>= width
        count -= width
        if code == _CLEAR:
            del table[258:]
            width, previous = 9, b""
            continue
        if code == _EOI:
            break
        if code < len(table):
            entry = table[code]
            if previous and len(table) < 4096:
                table.append(previous + entry[:1])
        elif code == len(table) and previous:
            entry = previous + previous[:1]
            table.append(entry)
        else:
            raise FormatError(f"corrupt LZW data: code {code} with {len(table)} table entries")
        out.append(entry)
        produced += len(entry)
        if limit is not None and produced > limit:
            raise FormatError(f"LZW data decodes to more than {limit} bytes")
        previous = entry
        if len(table) >= (1 << width) and width < 12:
            width += 1
    return b"".join(out)


def lzw_encode(data: bytes) -> bytes:
    """TIFF LZW (new style, MSB-first, early change), starting with a clear code."""
    writer = _BitWriter()
    writer.write(_CLEAR, 9)
    table: dict[bytes, int] = {bytes((i,)): i for i in range(256)}
    next_code, width = 258, 9
    current = b""
    for byte in data:
        candidate = current + bytes((byte,))
        if candidate in table:
            current = candidate
            continue
        writer.write(table[current], width)
        table[candidate] = next_code
        next_code += 1
        if next_code > (1 << width) - 1 and width < 12:
            width += 1
        if next_code >= 4094:
            writer.write(_CLEAR, width)
            table = {bytes((i,)): i for i in range(256)}
            next_code, width = 258, 9
        current = bytes((byte,))
    if current:
        writer.write(table[current], width)
        next_code += 1
        if next_code > (1 << width) - 1 and width < 12:
            width += 1
    writer.write(_EOI, width)
    return writer.finish()


class _BitWriter:
    def __init__(self) -> None:
        self.out = bytearray()
        self.buffer = 0
        self.count = 0

    def write(self, code: int, width: int) -> None:
        self.buffer = (self.buffer << width) | code
        self.count += width
        while self.count >= 8:
            self.count -= 8
            self.out.append((self.buffer >> self.count) & 0xFF)
        self.buffer &= (1 << self.count) - 1

    def finish(self) -> bytes:
        if self.count:
            self.out.append((self.buffer << (8 - self.count)) & 0xFF)
        return bytes(self.out)


# ------------------------------------------------------------------------------------------ PackBits
def packbits_decode(data: bytes, limit: int | None = None) -> bytes:
    out = bytearray()
    pos, size = 0, len(data)
    while pos < size:
        header = data[pos]
        pos += 1
        if header < 128:
            out += data[pos : pos + header + 1]
            pos += header + 1
        elif header > 128:
            if pos >= size:
                break
            out += data[pos : pos + 1] * (257 - header)
            pos += 1
        if limit is not None and len(out) > limit:
            raise FormatError(f"PackBits data decodes to more than {limit} bytes")
    return bytes(out)


def packbits_encode(data: bytes) -> bytes:
    out = bytearray()
    pos, size = 0, len(data)
    while pos < size:
        run = 1
        while pos + run < size and run < 128 and data[pos + run] == data[pos]:
            run += 1
        if run > 1:
            out += bytes((257 - run, data[pos]))
            pos += run
            continue
        start = pos
        while pos < size and pos - start < 128:
            if pos + 1 < size and data[pos + 1] == data[pos]:
                break
            pos += 1
        pos = max(pos, start + 1)
        out.append(pos - start - 1)
        out += data[start:pos]
    return bytes(out)
