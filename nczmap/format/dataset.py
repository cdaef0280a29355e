"""The Dataset: the root group bound to its storage."""

from __future__ import annotations

from nczmap.format.model import Group
from nczmap.url import ParsedURL
from nczmap.zmap import ZMap


class Dataset(Group):
    """An NCZarr / Zarr dataset: the root group plus the map it lives in.

    ``dialect`` is what the store holds: ``D0`` (netcdf-c 4.8.0), ``D1`` (4.8.1-4.9.0), ``D2`` (4.9.1-4.9.2),
    ``D3`` (4.9.3+) or ``PZ`` (pure Zarr). ``problems`` lists arrays that could not be read, with why.
    """

    def __init__(self, zmap: ZMap, url: ParsedURL | None, dialect: str) -> None:
        super().__init__("/", None)
        self.zmap = zmap
        self.url = url
        self.dialect = dialect
        self.problems: list[tuple[str, str]] = []
        self.provenance: str | None = None  # the _NCProperties text, shown by ncdump -s
        self.consolidated = False
        self.writer = None  # a DatasetWriter when the dataset is writable

    @property
    def writable(self) -> bool:
        return self.writer is not None

    def flush(self) -> None:
        """Write every changed metadata object (data is written as it is assigned)."""
        if self.writer is not None:
            self.writer.flush()

    @property
    def name_for_cdl(self) -> str:
        return self.url.dataset_name if self.url is not None else "dataset"

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
