"""Datasets from URLs: the URL picks the driver (``open_map``) and the format options (``open_on``)."""

from __future__ import annotations

import os

from nczmap.format import Dataset, FormatOptions, open_on
from nczmap.url import ParsedURL, parse_url
from nczmap.zmap import open_map


def format_options(
    url: ParsedURL, netcdf_version: str | None = None, keep_filters: bool = False
) -> FormatOptions:
    """The format half of a URL's mode words."""
    return FormatOptions(
        pure_zarr=url.zarr,
        xarray=url.xarray,
        consolidated=url.consolidated,
        netcdf_version=netcdf_version,
        keep_filters=keep_filters,
        name=url.dataset_name,
        zarr_format=url.zarr_format,
    )


def open_dataset(
    url: str | os.PathLike[str] | ParsedURL,
    mode: str = "r",
    netcdf_version: str | None = None,
    *,
    keep_filters: bool = False,
    **map_options: object,
) -> Dataset:
    """Open an NCZarr, pure Zarr or xarray-convention dataset; the dialect is detected from the store.

    ``mode``: ``r`` read-only, ``r+``/``a`` update (``a`` creates a missing dataset, in the dialect of
    ``netcdf_version``), ``w`` create. Updates keep the store's dialect. ``keep_filters`` keeps compression
    for releases that cannot decode it as distributed (4.9.0 and earlier). ``map_options`` go to the
    driver (``containers=`` for manifests).
    """
    parsed = url if isinstance(url, ParsedURL) else parse_url(url)
    zmap = open_map(parsed, mode, **map_options)
    try:
        return open_on(zmap, mode, format_options(parsed, netcdf_version, keep_filters))
    except BaseException:
        zmap.abort()
        raise


def create_dataset(
    url: str | os.PathLike[str] | ParsedURL, netcdf_version: str | None = None, *, keep_filters: bool = False
) -> Dataset:
    """Create (or empty and recreate) a dataset readable by the named netcdf-c release (default 4.9.3+).

    The URL's ``mode=zarr``/``xarray`` writes pure Zarr; ``noxarray`` omits ``_ARRAY_DIMENSIONS``;
    ``consolidated`` keeps ``/.zmetadata`` up to date.
    """
    return open_dataset(url, "w", netcdf_version, keep_filters=keep_filters)
