"""nczmap: netcdf-c's NCZarr storage model (the zmap) in Python."""

from nczmap.errors import (
    AccessDenied,
    DatasetExists,
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

__version__ = "0.1.0"

__all__ = [
    "AccessDenied",
    "Dataset",
    "DatasetExists",
    "DatasetNotFound",
    "EmptyError",
    "FormatError",
    "KeyNameError",
    "ModeError",
    "NCZError",
    "ParsedURL",
    "ReadOnlyError",
    "StorageError",
    "URLError",
    "ZMap",
    "create_dataset",
    "open_dataset",
    "open_map",
    "parse_url",
]

_FORMAT_NAMES = ("Dataset", "create_dataset", "open_dataset")


def __getattr__(name: str):
    # The format layer needs numpy; importing it lazily keeps `nczmap search` and friends quick to start.
    if name in _FORMAT_NAMES:
        import nczmap.format

        return getattr(nczmap.format, name)
    raise AttributeError(f"module 'nczmap' has no attribute {name!r}")
