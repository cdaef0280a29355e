"""Modules imported on first use, so metadata-only work (``nczmap ncdump -h``) never pays their start-up.

``from nczmap._lazy import numpy as np`` reads like the usual import; the first ``np.<name>`` imports
numpy and every name is then kept on the proxy, so later look-ups are plain attribute reads.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    def __init__(self, name: str) -> None:
        self._lazy_name = name

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(importlib.import_module(self._lazy_name), attribute)
        setattr(self, attribute, value)
        return value


numpy: Any = LazyModule("numpy")
