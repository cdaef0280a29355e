"""The zmap layer: netcdf-c's storage contract (``base``), its drivers (one module each), byte ranges."""

from __future__ import annotations

from nczmap.errors import DriverNotAvailable, ModeError, ReadOnlyError
from nczmap.registry import DRIVERS
from nczmap.url import ParsedURL, parse_url
from nczmap.zmap.base import MODES, Latency, ZMap
from nczmap.zmap.memory import MemoryMap

__all__ = ["MODES", "Latency", "MemoryMap", "ZMap", "driver_class", "open_map"]


def driver_class(name: str) -> type[ZMap]:
    """The class of the registered driver ``name`` (nczmap.registry)."""
    entry = DRIVERS.get(name)
    if entry is None:
        raise DriverNotAvailable(f"no zmap driver is registered as {name!r}; known: {', '.join(DRIVERS)}")
    return entry.load()


def open_map(url: str | ParsedURL, mode: str = "r", **options: object) -> ZMap:
    """Open the storage named by ``url``.

    ``mode``: ``"r"`` read-only; ``"r+"`` update an existing dataset; ``"a"`` update, creating it if
    missing; ``"w"`` create, emptying an existing Zarr/NCZarr store (anything else is refused).
    ``options`` go to the driver (for example ``containers=`` for manifests).
    """
    if mode not in MODES:
        raise ModeError(f"open mode {mode!r} for {url!r} is not one of {', '.join(MODES)}")
    parsed = url if isinstance(url, ParsedURL) else parse_url(url)
    cls = driver_class(parsed.driver)
    if mode != "r" and not cls.writable:
        raise ReadOnlyError(
            f"the {parsed.driver} driver is read-only: open {parsed.original!r} with mode 'r', not {mode!r}"
        )
    return cls(parsed, mode, **options)
