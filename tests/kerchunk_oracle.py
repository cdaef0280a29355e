"""kerchunk's own HDF5 scanner as a test oracle, run so that it cannot deadlock."""

from __future__ import annotations

import gc


def kerchunk_hdf_references(*args, **kwargs) -> dict:
    """``kerchunk.hdf.SingleHdf5ToZarr(*args, **kwargs).translate()`` with the cyclic collector off.

    kerchunk calls zarr's event-loop thread while h5py holds its global lock; a collection on that thread
    that frees an h5py object then waits for the lock forever (seen as a hang under zarr 3.1 and h5py 3.16).
    """
    from kerchunk import hdf

    collecting = gc.isenabled()
    gc.disable()
    try:
        return hdf.SingleHdf5ToZarr(*args, **kwargs).translate()
    finally:
        if collecting:
            gc.enable()
