"""nczmap's numpy TIFF codecs against imagecodecs' own encoders and decoders."""

from __future__ import annotations

import numpy as np
import pytest

from nczmap.errors import FormatError
from nczmap.format import tiffcodecs
from nczmap.format.codecs import CodecChain

imagecodecs = pytest.importorskip("imagecodecs")

INT_DTYPES = ["|i1", "|u1", "<i2", ">i2", "<u2", "<i4", ">u4", "<i8", ">i8", "<u8"]
FLOAT_DTYPES = ["<f2", ">f2", "<f4", ">f4", "<f8", ">f8"]
SHAPES = [((5, 7), -1), ((1, 6, 9), -1), ((4, 5, 3), -2), ((3, 4, 1), -2)]


def _random(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 1000).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype.newbyteorder("="), endpoint=True).astype(
        dtype
    )


@pytest.mark.parametrize("dtype", INT_DTYPES + FLOAT_DTYPES)
@pytest.mark.parametrize(("shape", "axis"), SHAPES)
def test_delta_matches_imagecodecs(dtype, shape, axis):
    values = _random(dtype, shape)
    codec = tiffcodecs.Delta(shape=shape, dtype=dtype, axis=axis)
    encoded = imagecodecs.delta_encode(values, axis=axis).tobytes()
    assert codec.encode(values) == encoded
    decoded = codec.decode(encoded)
    assert decoded.dtype == np.dtype(dtype)
    assert decoded.tobytes() == values.tobytes()


def test_delta_with_distance_round_trips():
    values = _random("<u2", (4, 11))
    codec = tiffcodecs.Delta(shape=(4, 11), dtype="<u2", axis=-1, dist=3)
    encoded = codec.encode(values)
    assert np.array_equal(codec.decode(encoded), values)
    assert np.array_equal(np.frombuffer(encoded, "<u2").reshape(4, 11)[:, :3], values[:, :3])


def test_delta_without_shape_works_on_bytes():
    data = bytes(range(10)) * 3
    codec = tiffcodecs.Delta()
    assert bytes(codec.decode(codec.encode(data))) == data
    assert codec.encode(data) == imagecodecs.delta_encode(data)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize(("shape", "axis"), SHAPES)
def test_floatpred_matches_imagecodecs(dtype, shape, axis):
    values = _random(dtype, shape, seed=2)
    codec = tiffcodecs.FloatPred(shape=shape, dtype=dtype, axis=axis)
    encoded = imagecodecs.floatpred_encode(values, axis=axis).tobytes()
    assert codec.encode(values) == encoded
    decoded = codec.decode(encoded)
    assert decoded.dtype == np.dtype(dtype)
    assert np.array_equal(decoded, values, equal_nan=True)
    reference = imagecodecs.floatpred_decode(np.frombuffer(encoded, dtype).reshape(shape), axis=axis)
    assert decoded.tobytes() == np.asarray(reference, dtype=dtype).tobytes()


def test_floatpred_refuses_wrong_size():
    with pytest.raises(ValueError, match="do not fill"):
        tiffcodecs.FloatPred(shape=(2, 2), dtype="<f4").decode(bytes(15))


def _lzw_samples():
    rng = np.random.default_rng(3)
    yield b""
    yield b"x"
    yield b"ab" * 5000
    yield bytes(70000)  # long runs: codes up to 12 bits and clear codes
    yield bytes(rng.integers(0, 4, 60000, dtype=np.uint8))
    yield bytes(rng.integers(0, 256, 30000, dtype=np.uint8))  # table fills, clears often
    image = np.add.outer(np.arange(200), np.arange(300)) % 251
    yield image.astype(np.uint8).tobytes()


@pytest.mark.parametrize("data", list(_lzw_samples()), ids=lambda d: f"{len(d)}")
def test_lzw_matches_imagecodecs(data):
    assert tiffcodecs.lzw_decode(imagecodecs.lzw_encode(data)) == data
    ours = tiffcodecs.lzw_encode(data)
    assert imagecodecs.lzw_decode(ours) == data
    assert tiffcodecs.lzw_decode(ours) == data
    codec = tiffcodecs.Lzw()
    assert bytes(codec.decode(imagecodecs.lzw_encode(data))) == data


def test_lzw_old_style_lsb_first():
    """libtiff's pre-5.0 LZW: codes packed LSB-first, no early change (a first byte 0, then odd)."""
    data = b"TOBEORNOTTOBEORTOBEORNOT" * 40

    def old_encode(text: bytes) -> bytes:
        table = {bytes((i,)): i for i in range(256)}
        codes, width, current, out, bits, count = [], 9, b"", bytearray(), 0, 0
        codes.append((256, 9))
        for byte in text:
            candidate = current + bytes((byte,))
            if candidate in table:
                current = candidate
                continue
            codes.append((table[current], width))
            table[candidate] = len(table) + 2
            if len(table) + 2 >= (1 << width) and width < 12:
                width += 1
            current = bytes((byte,))
        codes.append((table[current], width))
        codes.append((257, width))
        for code, size in codes:
            bits |= code << count
            count += size
            while count >= 8:
                out.append(bits & 0xFF)
                bits >>= 8
                count -= 8
        if count:
            out.append(bits & 0xFF)
        return bytes(out)

    encoded = old_encode(data)
    assert encoded[0] == 0 and encoded[1] & 1
    assert tiffcodecs.lzw_decode(encoded) == data
    assert imagecodecs.lzw_decode(encoded) == data


def test_lzw_corrupt_and_bounded():
    with pytest.raises(FormatError, match="corrupt LZW"):
        tiffcodecs.lzw_decode(bytes([0x96, 0x00, 0x00]))  # first code 300
    bomb = imagecodecs.lzw_encode(bytes(1 << 20))
    with pytest.raises(FormatError, match="more than"):
        tiffcodecs.Lzw().decode_limited(bomb, 1000)


def _packbits_samples():
    rng = np.random.default_rng(4)
    yield b""
    yield b"a"
    yield b"aaaaaaaaaab" * 100
    yield bytes(300)
    yield bytes(rng.integers(0, 3, 20000, dtype=np.uint8))
    yield bytes(rng.integers(0, 256, 5000, dtype=np.uint8))


@pytest.mark.parametrize("data", list(_packbits_samples()), ids=lambda d: f"{len(d)}")
def test_packbits_matches_imagecodecs(data):
    assert tiffcodecs.packbits_decode(imagecodecs.packbits_encode(data)) == data
    assert imagecodecs.packbits_decode(tiffcodecs.packbits_encode(data)) == data
    assert bytes(tiffcodecs.PackBits().decode(imagecodecs.packbits_encode(data))) == data


def test_packbits_bounded():
    with pytest.raises(FormatError, match="more than"):
        tiffcodecs.PackBits().decode_limited(bytes([0x81, 0]) * 100, 1000)


def test_pad_pads_and_cuts():
    pad = tiffcodecs.Pad(nbytes=6)
    assert bytes(pad.decode(b"abc")) == b"abc\x00\x00\x00"
    assert bytes(pad.decode(b"abcdefgh")) == b"abcdef"
    assert pad.encode(b"abc") == b"abc"
    assert pad.get_config() == {"id": "nczmap.pad", "nbytes": 6}


def test_not_registered_in_numcodecs():
    import numcodecs.registry

    for codec_id, cls in tiffcodecs.CODECS.items():
        if codec_id.startswith("nczmap."):
            continue  # nczmap's own ids are registered (the numcodecs.codecs entry point): ours to take
        registered = numcodecs.registry.codec_registry.get(codec_id)
        assert registered is not cls


def hide_imagecodecs(monkeypatch) -> None:
    """numcodecs as if imagecodecs-numcodecs (and nczmap's entry point) were not installed."""
    import numcodecs

    real = numcodecs.get_codec

    def without_imagecodecs(config):
        if config["id"].startswith(("imagecodecs_", "nczmap.")):
            raise ValueError(f"codec not available: {config['id']!r}")
        return real(config)

    monkeypatch.setattr(numcodecs, "get_codec", without_imagecodecs)


def test_codec_chain_falls_back(monkeypatch):
    hide_imagecodecs(monkeypatch)
    values = _random("<i2", (4, 6, 3))
    delta = {"id": "imagecodecs_delta", "axis": -2, "dist": 1, "shape": [4, 6, 3], "dtype": "<i2"}
    encoded = imagecodecs.lzw_encode(imagecodecs.delta_encode(values, axis=-2).tobytes())
    chain = CodecChain([delta], {"id": "imagecodecs_lzw"}, 2)
    decoded = chain.decode(encoded, "v/0.0.0", limit=values.nbytes)
    assert np.frombuffer(decoded, "<i2").tobytes() == values.tobytes()
    assert isinstance(chain._codecs[0], tiffcodecs.Delta)
    with pytest.raises(FormatError, match="more than"):
        CodecChain([], {"id": "imagecodecs_lzw"}, 1).decode(imagecodecs.lzw_encode(bytes(1 << 20)), "k", 100)
    with pytest.raises(FormatError, match="unsupported codec"):
        CodecChain([], {"id": "imagecodecs_nosuch"}, 1).decode(b"", "k")
