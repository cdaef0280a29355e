"""The format layer: NCZarr / Zarr metadata and data through a zmap (never touching files directly).

Modules, bottom to top: ``types``, ``jsonutil``, ``codecs``, ``dialects`` (leaves); ``model`` (groups,
dimensions, attributes); ``selection``, ``variable`` (arrays and the read path); ``dataset``; ``reader``
and ``metadata`` (JSON objects per dialect); ``writer`` (the write path); ``opening`` (:func:`open_on`).
Submodules import each other directly, never through this package.
"""

from __future__ import annotations

from nczmap.format.dataset import Dataset, FormatOptions
from nczmap.format.dialects import Dialect
from nczmap.format.model import Attribute, Attributes, Dimension, Group
from nczmap.format.opening import open_on
from nczmap.format.variable import Variable

__all__ = [
    "Attribute",
    "Attributes",
    "Dataset",
    "Dialect",
    "Dimension",
    "FormatOptions",
    "Group",
    "Variable",
    "open_on",
]
