"""Opening a dataset on a map that is already open: the one entry point of the format layer.

``open_dataset`` (URLs), the copy tool and the integrations all come through :func:`open_on`; it reads the
metadata (``reader``) and, for writable modes, attaches a ``DatasetWriter`` (imported only then, so reading
never pays for the write path).
"""

from __future__ import annotations

from nczmap.format.dataset import Dataset, FormatOptions
from nczmap.format.dialects import Dialect
from nczmap.zmap import ZMap

MODES = ("r", "r+", "a", "w")


def open_on(zmap: ZMap, mode: str = "r", options: FormatOptions | None = None) -> Dataset:
    """The dataset stored in ``zmap`` (opened with the same ``mode``).

    ``r`` reads; ``r+``/``a`` update, keeping the store's dialect (``a`` creates a missing dataset); ``w``
    creates, in the dialect ``options.netcdf_version`` names (pure Zarr with ``options.pure_zarr``).
    The map is not closed on failure: whoever opened it does that.
    """
    options = options or FormatOptions()
    if mode == "w" or (mode == "a" and not zmap.search("/")):
        return _new_dataset(zmap, options)
    from nczmap.format.reader import read_dataset

    dataset = read_dataset(zmap, options)
    if mode == "r" or zmap.readonly:
        _refuse_changes(dataset)
        return dataset
    from nczmap.format.writer import DatasetWriter

    consolidated = options.consolidated or dataset.consolidated
    dataset.writer = DatasetWriter(dataset, dataset.dialect, options.xarray, consolidated)
    dataset.writer.attach_all()
    return dataset


def _new_dataset(zmap: ZMap, options: FormatOptions) -> Dataset:
    from nczmap.format.writer import DatasetWriter

    if options.pure_zarr:
        dialect = Dialect.ZARR_V3 if options.zarr_format == 3 else Dialect.PURE_ZARR
    else:
        dialect = Dialect.for_version(options.netcdf_version)
    dataset = Dataset(zmap, dialect, options)
    dataset.writer = DatasetWriter(dataset, dialect, options.xarray, options.consolidated)
    dataset.writer.attach(dataset)
    dataset.writer.touch(dataset)
    return dataset


def _refuse_changes(dataset: Dataset) -> None:
    """Make attribute changes on a read-only dataset raise, instead of being silently dropped."""
    location = dataset.zmap.location
    for group in dataset.walk():
        group.attrs.read_only_in = location
        for variable in group.variables.values():
            variable.attrs.read_only_in = location
