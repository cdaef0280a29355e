"""The ``grib`` codec: one GRIB2 message decoded by ecCodes into its field (or its grid's latitudes or
longitudes), as cfgrib reads it.

The references nczmap writes for GRIB sources name kerchunk's codec id and configuration (``{"id": "grib",
"var": name, "dtype": "float32"}``), so a reader with kerchunk installed (fsspec and zarr-python) decodes
them without nczmap. nczmap reads them with this class whether or not kerchunk is installed: its missing
points are NaN as cfgrib makes them (ecCodes' missing value set to float32's largest first), where
kerchunk's compares with ecCodes' default 9999, so a real 9999 there reads as NaN.

Only decoding: a message is never written. ecCodes is the decoder (its wheels bundle the library); calls
into it are serialised, as kerchunk and cfgrib serialise theirs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading

import numpy as np
from numcodecs.abc import Codec

from nczmap.errors import DriverNotAvailable, FormatError

MISSING = float(np.finfo(np.float32).max)  # cfgrib's missing value indicator
GRID_KEYS = {"latitude": "latitudes", "longitude": "longitudes"}
_LOCK = threading.RLock()


def import_eccodes():
    """The ``eccodes`` module, its libraries loaded into its own scope.

    ecCodes' Python package loads its wheels' libraries through findlibs with ``RTLD_GLOBAL``: eckit's
    bundled PROJ, SQLite, curl and OpenSSL then answer for those names in every library loaded after them
    (pyproj's PROJ calls eckit's), and the process crashes at exit (a double free). Loaded here, they are
    loaded ``RTLD_LOCAL``: libeccodes still finds them (as its dependencies, by soname), nothing else does.
    A process that imported ecCodes before (cfgrib's xarray backend does) keeps what it did."""
    with _LOCK:
        try:
            if "gribapi.bindings" not in sys.modules:
                with _loaded_locally():
                    import eccodes
            import eccodes
        except ImportError as exc:  # one line naming the extra, not "cannot read X as grib: ModuleNot..."
            raise DriverNotAvailable("GRIB2 messages need ecCodes: pip install 'nczmap[virtual]'") from exc

    return eccodes


@contextlib.contextmanager
def _loaded_locally():
    try:
        import findlibs
    except ImportError:  # an ecCodes that does not load through findlibs: nothing to change
        yield
        return
    loading = getattr(findlibs, "_load_globally", None)
    if loading is None:
        yield
        return
    findlibs._load_globally = lambda path: ctypes.CDLL(path, mode=os.RTLD_LOCAL)
    try:
        yield
    finally:
        findlibs._load_globally = loading


def data_points(message) -> int | None:
    """The number of grid points section 3 of a GRIB2 ``message`` announces (None if it is not found)."""
    raw = memoryview(message).cast("B")
    if len(raw) < 16 or bytes(raw[:4]) != b"GRIB" or raw[7] != 2:
        return None
    position = 16
    while position + 5 <= len(raw):
        length = int.from_bytes(raw[position : position + 4], "big")
        if raw[position + 4] == 3 and length >= 10 and position + 10 <= len(raw):
            return int.from_bytes(raw[position + 6 : position + 10], "big")
        if length < 5:
            return None
        position += length
    return None


class Grib(Codec):
    """A GRIB2 message -> its values (``var`` any name but ``latitude``/``longitude``) as ``dtype``
    (float32 by default; float64 for latitudes and longitudes), missing points NaN."""

    codec_id = "grib"

    def __init__(self, var: str = "values", dtype: str | None = None) -> None:
        self.var = str(var)
        default = "float64" if self.var in GRID_KEYS else "float32"
        self.dtype = np.dtype(dtype or default).name
        if np.dtype(self.dtype).kind != "f":
            raise ValueError(f"grib: dtype {dtype!r} is not a floating-point type")

    def get_config(self) -> dict:
        return {"id": self.codec_id, "var": self.var, "dtype": self.dtype}

    def encode(self, buf):
        raise NotImplementedError("grib: a GRIB message is decoded, never written")

    def decode(self, buf, out=None):
        values = self._decode(bytes(memoryview(buf).cast("B")))
        if out is not None:
            np.copyto(np.asarray(out).reshape(values.shape), values)
            return out
        return values

    def decode_limited(self, buf, limit: int) -> np.ndarray:
        """Refused before ecCodes allocates it when the message's grid would decode beyond ``limit``."""
        points = data_points(buf)
        if points is not None and points * np.dtype(self.dtype).itemsize > limit:
            raise FormatError(f"its GRIB grid of {points} points decodes beyond the chunk's {limit} bytes")
        return self.decode(buf)

    def _decode(self, message: bytes) -> np.ndarray:
        eccodes = import_eccodes()
        with _LOCK:
            try:
                handle = eccodes.codes_new_from_message(message)
            except eccodes.GribInternalError as exc:
                raise FormatError(f"ecCodes cannot read the GRIB message: {exc}") from None
            try:
                if self.var in GRID_KEYS:
                    return eccodes.codes_get_array(handle, GRID_KEYS[self.var]).astype(self.dtype)
                eccodes.codes_set(handle, "missingValue", MISSING)
                values = eccodes.codes_get_values(handle)
            except eccodes.GribInternalError as exc:
                raise FormatError(f"ecCodes cannot decode the GRIB message: {exc}") from None
            finally:
                eccodes.codes_release(handle)
        values[values == MISSING] = np.nan
        return values.astype(self.dtype)
