"""The zmap layer: netcdf-c's storage contract and its drivers, one module each."""

from __future__ import annotations

from nczmap.errors import DriverNotAvailable, ModeError
from nczmap.url import ParsedURL, parse_url
from nczmap.zmap.base import MODES, ZMap
from nczmap.zmap.memory import MemoryMap

__all__ = ["MODES", "MemoryMap", "ZMap", "open_map"]


def open_map(url: str | ParsedURL, mode: str = "r") -> ZMap:
    """Open the storage named by ``url``.

    ``mode``: ``"r"`` read-only; ``"r+"`` update an existing dataset; ``"a"`` update, creating it if
    missing; ``"w"`` create, emptying an existing Zarr/NCZarr store (anything else is refused).
    """
    if mode not in MODES:
        raise ModeError(f"open mode {mode!r} for {url!r} is not one of {', '.join(MODES)}")
    parsed = url if isinstance(url, ParsedURL) else parse_url(url)
    if parsed.driver == "file":
        from nczmap.zmap.file import FileMap

        return FileMap(parsed, mode)
    if parsed.driver == "zip":
        from nczmap.zmap.zip import ZipMap

        return ZipMap(parsed, mode)
    if parsed.driver == "s3":
        from nczmap.zmap.s3 import S3Map

        return S3Map(parsed, mode)
    raise DriverNotAvailable(f"the {parsed.driver!r} driver is not available for {parsed.original!r}")
