"""Timing helpers shared by the ``bench_*.py`` scripts (not a benchmark itself).

A :class:`Case` wraps a *batch* function that performs ``n`` calls of one operation and returns the
elapsed seconds (measured with :func:`time.perf_counter` by the batch itself, so an asyncio batch can
time only the work done inside its coroutine). :func:`measure` calibrates each case's batch size to about
``target`` seconds, then runs ``rounds`` rounds that interleave all cases (side by side, so drift in
machine load hits every case alike) and keeps the per-call time of every round; the report uses the median.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

with contextlib.suppress(ImportError):
    # ecCodes loaded into its own scope before xarray's cfgrib backend loads it into the global one (a
    # crash at exit once pyproj is loaded: see nczmap.format.gribcodec.import_eccodes)
    from nczmap.format.gribcodec import import_eccodes

    import_eccodes()

Batch = Callable[[int], float]
MAX_BATCH = 100_000


@dataclass
class Case:
    """One measured operation: ``batch(n)`` runs it ``n`` times and returns the elapsed seconds."""

    name: str
    batch: Batch
    size: int | None = None  # how many names one call returns (shown in the table)
    calls: int = 1
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def best(self) -> float:
        return min(self.samples)


def sync_batch(function: Callable[[Any], object], argument: Any) -> Batch:
    """A batch calling ``function(argument)`` ``n`` times."""

    def run(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            function(argument)
        return time.perf_counter() - start

    return run


def async_batch(runner: asyncio.Runner, list_dir: Callable[[str], AsyncIterator[str]], prefix: str) -> Batch:
    """A batch draining the async generator ``list_dir(prefix)`` into a list ``n`` times.

    All ``n`` calls run inside one coroutine on ``runner``'s event loop (one loop for the whole
    benchmark), and the clock runs inside that coroutine: loop start-up and scheduling are not counted.
    """

    async def drain(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            [name async for name in list_dir(prefix)]
        return time.perf_counter() - start

    return lambda n: runner.run(drain(n))


def calibrate(case: Case, target: float) -> None:
    """Warm the case up with one call and size its batch to take about ``target`` seconds."""
    once = case.batch(1)
    case.calls = max(1, min(MAX_BATCH, int(target / max(once, 1e-9))))


def measure(cases: list[Case], rounds: int, target: float) -> None:
    """Fill every case's ``samples`` with ``rounds`` per-call times, the cases interleaved per round."""
    for case in cases:
        calibrate(case, target)
    for _ in range(rounds):
        for case in cases:
            case.samples.append(case.batch(case.calls) / case.calls)


def time_once(function: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``function`` (for one-off costs such as opening)."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def fmt_time(seconds: float) -> str:
    """``seconds`` in the unit that keeps 3-4 significant digits readable."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:8.2f} {unit:>2}"
    return f"{seconds / 1e-9:8.1f} ns"


def fmt_ratio(ratio: float) -> str:
    return f"{ratio:9.1f}×" if ratio >= 10 else f"{ratio:9.2f}×"


def print_cases(cases: list[Case]) -> None:
    """A table: operation, result size, calls per batch, median and best per-call time."""
    width = max(len(case.name) for case in cases)
    print(
        f"{'operation':<{width}}  {'names':>7}  {'calls/batch':>11}  {'median/call':>11}  {'best/call':>11}"
    )
    for case in cases:
        shown = "" if case.size is None else str(case.size)
        print(
            f"{case.name:<{width}}  {shown:>7}  {case.calls:>11}  {fmt_time(case.median):>11}  "
            f"{fmt_time(case.best):>11}"
        )


def array_meta(length: int) -> bytes:
    """A Zarr v2 ``.zarray`` for a 1-D array of ``length`` one-byte chunks."""
    meta = {
        "zarr_format": 2,
        "shape": [length],
        "chunks": [1],
        "dtype": "|u1",
        "compressor": None,
        "fill_value": 0,
        "order": "C",
        "filters": None,
    }
    return json.dumps(meta).encode()
