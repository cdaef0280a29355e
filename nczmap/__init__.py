"""nczmap: netcdf-c's NCZarr storage model (the zmap) in Python."""

from nczmap._version import __version__
from nczmap.errors import (
    AccessDenied,
    DatasetExists,
    DatasetLocked,
    DatasetNotFound,
    EmptyError,
    FormatError,
    KeyNameError,
    ModeError,
    NCZError,
    ReadOnlyError,
    StorageError,
    URLError,
)
from nczmap.url import ParsedURL, parse_url
from nczmap.zmap import ZMap, open_map

__all__ = [
    "AccessDenied",
    "Dataset",
    "DatasetExists",
    "DatasetLocked",
    "DatasetNotFound",
    "Dialect",
    "EmptyError",
    "FormatError",
    "KeyNameError",
    "ModeError",
    "NCZError",
    "ParsedURL",
    "ReadOnlyError",
    "StorageError",
    "URLError",
    "VirtualizeResult",
    "VirtualizeWarning",
    "ZMap",
    "ZarrStore",
    "__version__",
    "create_dataset",
    "open_dataset",
    "open_map",
    "parse_url",
    "to_nczarr",
    "virtualize",
]

# Loaded on first use, so that `nczmap search` and other zmap-only work start quickly.
_LAZY = {
    "Dataset": "nczmap.format",
    "Dialect": "nczmap.format",
    "create_dataset": "nczmap.api",
    "open_dataset": "nczmap.api",
    "ZarrStore": "nczmap.integrations.zarr_store",  # imports zarr
    "to_nczarr": "nczmap.integrations.xarray_writer",
    "virtualize": "nczmap.integrations.virtualize",
    "VirtualizeResult": "nczmap.integrations.virtualize",
    "VirtualizeWarning": "nczmap.integrations.virtualize",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nczmap' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
