"""A small shared thread pool for chunk I/O: storage latency overlaps, and numcodecs releases the GIL."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing concurrent.futures costs start-up time (it loads logging)
    from concurrent.futures import Future, ThreadPoolExecutor

WIDTH = 8  # chunk operations in flight: bounds the memory held by chunks being read or written
_executor: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        from concurrent.futures import ThreadPoolExecutor

        _executor = ThreadPoolExecutor(WIDTH, thread_name_prefix="nczmap-io")
    return _executor


def run_bounded(tasks: Iterable[Callable[[], object]], width: int = WIDTH) -> Iterator[object]:
    """Run the tasks, at most ``width`` at a time, yielding their results in order as they finish.

    Tasks are taken from ``tasks`` lazily, so an iterator of millions of chunks holds only ``width`` at
    once. The first error is raised after the tasks already started have ended.
    """
    pending: deque[Future] = deque()
    iterator = iter(tasks)
    try:
        for task in iterator:
            pending.append(_pool().submit(task))
            if len(pending) >= width:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        for future in pending:
            if not future.cancelled():
                future.exception()


def run_all(tasks: list[Callable[[], object]]) -> None:
    """Run every task (inline when there is only one)."""
    if len(tasks) == 1:
        tasks[0]()
        return
    for _ in run_bounded(tasks):
        pass
