"""The format layer: NCZarr / Zarr metadata and data through a zmap (never touching files directly)."""

from __future__ import annotations

from nczmap.format.dataset import Dataset
from nczmap.format.model import Attribute, Attributes, Dimension, Group
from nczmap.format.variable import Variable

__all__ = ["Attribute", "Attributes", "Dataset", "Dimension", "Group", "Variable", "open_dataset"]


def open_dataset(url, mode: str = "r") -> Dataset:
    """Open an NCZarr, pure Zarr or xarray-convention dataset; the dialect is detected from the store."""
    from nczmap.format.reader import read_dataset
    from nczmap.url import ParsedURL, parse_url
    from nczmap.zmap import open_map

    parsed = url if isinstance(url, ParsedURL) else parse_url(url)
    zmap = open_map(parsed, mode)
    try:
        return read_dataset(zmap, parsed)
    except BaseException:
        zmap.close()
        raise
