"""GDAL's multidimensional API (the Zarr driver's own reading of arrays, groups and kerchunk references),
through the libgdal that rasterio's wheel bundles, called with ctypes: rasterio exposes only the 2-D
raster view, which cannot read 0-D or 1-D arrays (a grid mapping, a time coordinate) whole.

``read_all(name)`` opens ``name`` (``ZARR:"/path/refs.json"``, a store directory, ``/vsizip/...``) with
``GDAL_OF_MULTIDIM_RASTER`` and returns every array of its root group as float64 numpy arrays (text
arrays are left out), by name.
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

_GDAL_OF_MULTIDIM_RASTER = 0x10
_GDAL_OF_VERBOSE_ERROR = 0x40
_GDT_FLOAT64 = 7
_GEDTC_NUMERIC = 0


def _library() -> ctypes.CDLL:
    import rasterio  # loads its libgdal and registers the drivers

    folder = os.path.join(os.path.dirname(os.path.dirname(rasterio.__file__)), "rasterio.libs")
    found = glob.glob(os.path.join(folder, "libgdal-*.so*"))
    if not found:
        raise RuntimeError(f"no libgdal in {folder}")
    gdal = ctypes.CDLL(found[0])
    p, size, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
    signatures = {
        "GDALAllRegister": (None, []),
        "GDALOpenEx": (p, [ctypes.c_char_p, ctypes.c_uint, p, p, p]),
        "GDALClose": (None, [p]),
        "GDALDatasetGetRootGroup": (p, [p]),
        "GDALGroupRelease": (None, [p]),
        "GDALGroupGetMDArrayNames": (ctypes.POINTER(ctypes.c_char_p), [p, p]),
        "GDALGroupOpenMDArray": (p, [p, ctypes.c_char_p, p]),
        "GDALMDArrayRelease": (None, [p]),
        "GDALMDArrayGetDimensions": (ctypes.POINTER(p), [p, ctypes.POINTER(size)]),
        "GDALReleaseDimensions": (None, [ctypes.POINTER(p), size]),
        "GDALDimensionGetSize": (u64, [p]),
        "GDALMDArrayGetDataType": (p, [p]),
        "GDALExtendedDataTypeGetClass": (ctypes.c_int, [p]),
        "GDALExtendedDataTypeRelease": (None, [p]),
        "GDALExtendedDataTypeCreate": (p, [ctypes.c_int]),
        "GDALMDArrayRead": (
            ctypes.c_int,
            [p, ctypes.POINTER(u64), ctypes.POINTER(size), p, p, p, p, p, size],
        ),
        "CSLDestroy": (None, [p]),
        "CPLGetLastErrorMsg": (ctypes.c_char_p, []),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(gdal, name)
        function.restype, function.argtypes = restype, argtypes
    gdal.GDALAllRegister()
    return gdal


def _names(gdal, group) -> list[str]:
    listed = gdal.GDALGroupGetMDArrayNames(group, None)
    names, index = [], 0
    while listed and listed[index] is not None:
        names.append(listed[index].decode())
        index += 1
    gdal.CSLDestroy(ctypes.cast(listed, ctypes.c_void_p))
    return names


def _read(gdal, array, float64) -> np.ndarray | None:
    kind = gdal.GDALMDArrayGetDataType(array)
    numeric = gdal.GDALExtendedDataTypeGetClass(kind) == _GEDTC_NUMERIC
    gdal.GDALExtendedDataTypeRelease(kind)
    if not numeric:
        return None
    count = ctypes.c_size_t()
    dims = gdal.GDALMDArrayGetDimensions(array, ctypes.byref(count))
    shape = tuple(int(gdal.GDALDimensionGetSize(dims[i])) for i in range(count.value))
    gdal.GDALReleaseDimensions(dims, count)
    out = np.empty(shape, dtype=np.float64)
    starts = (ctypes.c_uint64 * max(1, len(shape)))(*([0] * len(shape)))
    counts = (ctypes.c_size_t * max(1, len(shape)))(*shape)
    buffer = out.ctypes.data_as(ctypes.c_void_p)
    if not gdal.GDALMDArrayRead(array, starts, counts, None, None, float64, buffer, buffer, out.nbytes):
        raise RuntimeError(f"GDALMDArrayRead failed: {gdal.CPLGetLastErrorMsg().decode(errors='replace')}")
    return out


def read_all(name: str) -> dict[str, np.ndarray]:
    """Every numeric array of the root group of ``name`` as GDAL's multidimensional API reads it."""
    gdal = _library()
    flags = _GDAL_OF_MULTIDIM_RASTER | _GDAL_OF_VERBOSE_ERROR
    dataset = gdal.GDALOpenEx(name.encode(), flags, None, None, None)
    if not dataset:
        raise RuntimeError(f"GDAL cannot open {name}: {gdal.CPLGetLastErrorMsg().decode(errors='replace')}")
    group = gdal.GDALDatasetGetRootGroup(dataset)
    float64 = gdal.GDALExtendedDataTypeCreate(_GDT_FLOAT64)
    found = {}
    try:
        for array_name in _names(gdal, group):
            array = gdal.GDALGroupOpenMDArray(group, array_name.encode(), None)
            if not array:
                message = gdal.CPLGetLastErrorMsg().decode(errors="replace")
                raise RuntimeError(f"GDAL cannot open the array {array_name} of {name}: {message}")
            try:
                values = _read(gdal, array, float64)
            finally:
                gdal.GDALMDArrayRelease(array)
            if values is not None:
                found[array_name] = values
    finally:
        gdal.GDALExtendedDataTypeRelease(float64)
        gdal.GDALGroupRelease(group)
        gdal.GDALClose(dataset)
    return found
