"""Pausing Python's cyclic garbage collector while a large, acyclic-garbage workload runs."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off inside the block (and on again after it, if it was on before).

    Building a dataset's model or parsing hundreds of sources makes many small objects that live on, or die
    by reference counting; each full collection the allocations trigger walks every object of the process
    (hundreds of thousands once xarray and its peers are imported) and finds nothing. Garbage in cycles
    made meanwhile is collected after the block."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
