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
    "open_map",
    "parse_url",
]
