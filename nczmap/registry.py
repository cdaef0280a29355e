"""The driver registry: one line per zmap driver, naming its mode word, its class and where it can live.

URL parsing reads it to know the driver words and which driver a URL selects; :func:`nczmap.open_map` reads
it to find the class. A driver is added by writing its module under ``nczmap/zmap/`` and one line here.
Classes are named by dotted path and imported on first use, so this table costs nothing at start-up and
sits below every layer that uses it.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

# Where a URL says a dataset lives: "local" (a path or file: URL) or "s3" (s3:, gs3: or an http(s) endpoint).
LOCAL, S3 = "local", "s3"


class DriverEntry(NamedTuple):
    """One storage driver: the ``#mode=`` word selecting it and the class implementing it."""

    name: str
    target: str  # "module:Class"
    locations: tuple[str, ...]  # the URL kinds it can open
    suffix: str | None = None  # a local path ending so selects it when the URL names no driver
    layered: bool = False  # its storage is an object at the location (a manifest), so the location's own
    #                        driver word (file, s3) may be given beside it

    def load(self) -> type:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


DRIVERS: dict[str, DriverEntry] = {
    entry.name: entry
    for entry in (
        DriverEntry("file", "nczmap.zmap.file:FileMap", (LOCAL,)),
        DriverEntry("zip", "nczmap.zmap.zip:ZipMap", (LOCAL,), suffix=".zip"),
        DriverEntry("s3", "nczmap.zmap.s3:S3Map", (S3,)),
        DriverEntry("manifest", "nczmap.zmap.manifest:ManifestMap", (LOCAL, S3), layered=True),
        DriverEntry("icechunk", "nczmap.zmap.icechunk:IcechunkMap", (LOCAL, S3)),
    )
}
# The driver of a location when the URL names none and no suffix matches.
DEFAULT_DRIVER = {LOCAL: "file", S3: "s3"}
