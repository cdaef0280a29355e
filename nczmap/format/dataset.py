"""The Dataset: the root group bound to its storage, and the options it was opened with."""

from __future__ import annotations

from dataclasses import dataclass

from nczmap.errors import ModeError
from nczmap.format.dialects import Dialect
from nczmap.format.model import Group
from nczmap.zmap import ZMap


@dataclass(frozen=True)
class FormatOptions:
    """How to read and write a dataset: the format half of a URL's ``#mode=`` words, or given directly."""

    pure_zarr: bool = False  # mode=zarr/xarray: NCZarr metadata is neither trusted nor written
    xarray: bool = True  # the _ARRAY_DIMENSIONS convention (mode=noxarray turns it off)
    consolidated: bool = False  # /.zmetadata must be there, and is kept up to date
    netcdf_version: str | None = None  # the netcdf-c release that must read a new dataset
    keep_filters: bool = False  # keep compression even where that release, as distributed, cannot decode it
    name: str = "dataset"  # the dataset name ncdump prints
    zarr_format: int = 2  # 3: a new pure-Zarr dataset is written as Zarr v3 (mode=zarr,v3)

    def __post_init__(self) -> None:
        if self.zarr_format not in (2, 3):
            raise ModeError(f"zarr_format {self.zarr_format!r} is neither 2 nor 3")
        if self.zarr_format == 3 and not self.pure_zarr:
            raise ModeError(
                "Zarr v3 is written only as pure Zarr (mode=zarr,v3): no netcdf-c release reads it"
            )


class Dataset(Group):
    """An NCZarr / Zarr dataset: the root group plus the map it lives in.

    ``dialect`` is what the store holds (a :class:`Dialect`: its value names the first netcdf-c release
    writing it, ``.releases`` all of them). ``problems`` lists arrays that could not be read, with why.
    """

    def __init__(self, zmap: ZMap, dialect: Dialect, options: FormatOptions | None = None) -> None:
        super().__init__("/", None)
        self.zmap = zmap
        self.options = options or FormatOptions()
        self.dialect = dialect
        self.problems: list[tuple[str, str]] = []
        self.notes: list[tuple[str, str]] = []  # (key, how it is read differently from its declaration)
        self.provenance: str | None = None  # the _NCProperties text, shown by ncdump -s
        self.consolidated = False
        self.writer = None  # a DatasetWriter when the dataset is writable (see Group.editor)

    @property
    def writable(self) -> bool:
        return self.writer is not None

    @property
    def display_name(self) -> str:
        return self.options.name

    def flush(self) -> None:
        """Write every changed metadata object (data is written as it is assigned)."""
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.zmap.closed:
            return
        try:
            self.flush()
        except BaseException:
            self.zmap.abort()
            raise
        self.zmap.close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.zmap.abort()
