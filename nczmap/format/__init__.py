"""The format layer: NCZarr / Zarr metadata and data through a zmap (never touching files directly)."""

from __future__ import annotations

from nczmap.format.dataset import Dataset
from nczmap.format.model import Attribute, Attributes, Dimension, Group
from nczmap.format.variable import Variable

__all__ = [
    "Attribute",
    "Attributes",
    "Dataset",
    "Dimension",
    "Group",
    "Variable",
    "create_dataset",
    "open_dataset",
]


def open_dataset(url, mode: str = "r", netcdf_version: str | None = None) -> Dataset:
    """Open an NCZarr, pure Zarr or xarray-convention dataset; the dialect is detected from the store.

    ``mode``: ``r`` read-only, ``r+``/``a`` update (``a`` creates a missing dataset, in the dialect of
    ``netcdf_version``), ``w`` create. Updates keep the store's dialect.
    """
    from nczmap.format.reader import read_dataset
    from nczmap.url import ParsedURL, parse_url
    from nczmap.zmap import open_map

    parsed = url if isinstance(url, ParsedURL) else parse_url(url)
    zmap = open_map(parsed, mode)
    try:
        if mode == "w" or (mode == "a" and not zmap.search("/")):
            return _new_dataset(zmap, parsed, netcdf_version)
        dataset = read_dataset(zmap, parsed)
        if mode != "r":
            from nczmap.format.writer import DatasetWriter

            consolidated = parsed.consolidated or dataset.consolidated
            dataset.writer = DatasetWriter(dataset, dataset.dialect, parsed.xarray, consolidated)
            dataset.writer.attach_all()
        return dataset
    except BaseException:
        zmap.abort()
        raise


def create_dataset(url, netcdf_version: str | None = None) -> Dataset:
    """Create (or empty and recreate) a dataset readable by the named netcdf-c release (default 4.9.3+).

    The URL's ``mode=zarr``/``xarray`` writes pure Zarr; ``noxarray`` omits ``_ARRAY_DIMENSIONS``;
    ``consolidated`` keeps ``/.zmetadata`` up to date.
    """
    return open_dataset(url, "w", netcdf_version)


def _new_dataset(zmap, parsed, netcdf_version: str | None) -> Dataset:
    from nczmap.format.encode import dialect_for_version
    from nczmap.format.writer import DatasetWriter

    dialect = "PZ" if parsed.zarr else dialect_for_version(netcdf_version)
    dataset = Dataset(zmap, parsed, dialect)
    dataset.writer = DatasetWriter(dataset, dialect, parsed.xarray, parsed.consolidated)
    dataset.writer.attach(dataset)
    dataset.writer.touch(dataset)
    return dataset
