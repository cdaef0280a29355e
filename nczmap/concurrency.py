"""A small shared thread pool for chunk I/O: storage latency overlaps, and numcodecs releases the GIL."""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing concurrent.futures and queue costs start-up time (logging, heapq...)
    from concurrent.futures import Future, ThreadPoolExecutor
    from queue import SimpleQueue

WIDTH = 8  # chunk operations in flight: bounds the memory held by chunks being read or written
# Local storage is bound by CPU (copies, page faults, codecs), not latency: more threads than cores only
# add switching.
LOCAL_WIDTH = max(2, min(WIDTH, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2))
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


def run_each(tasks: Iterable[Callable[[], object]], width: int = WIDTH) -> Iterator[None]:
    """Run the tasks, ``width`` at a time, yielding once each time one finishes (in any order).

    Workers take the next task as soon as they finish one, so no core waits for the caller to hand out
    work; ``tasks`` is read lazily, so only ``width`` are held at once. The calling thread works too,
    which also means a call from a pool thread cannot deadlock waiting for helpers that never start.
    After the first error no new task starts; it is raised once the running ones have ended.
    """
    from queue import SimpleQueue

    iterator = iter(tasks)
    lock = threading.Lock()
    stop = threading.Event()  # set on the first error, or when the caller is done with this generator
    errors: list[BaseException] = []
    finished: SimpleQueue[None] = SimpleQueue()

    def take() -> Callable[[], object] | None:
        with lock:
            return None if stop.is_set() else next(iterator, None)

    def fail(exc: BaseException) -> None:
        errors.append(exc)
        stop.set()

    def worker() -> None:
        while (task := take()) is not None:
            try:
                task()
            except BaseException as exc:  # handed back to the caller below
                fail(exc)
                return
            finished.put(None)

    helpers = [_pool().submit(worker) for _ in range(max(0, width - 1))]
    try:
        while (task := take()) is not None:
            task()
            yield
            while not finished.empty():
                yield finished.get()
    except BaseException as exc:
        fail(exc)
    finally:
        stop.set()
        for helper in helpers:
            if not helper.cancel():  # a helper still queued had nothing left to do
                helper.exception()
    if errors:
        raise errors[0]
    while not finished.empty():
        yield finished.get()


def run_all(tasks: list[Callable[[], object]], width: int = WIDTH) -> None:
    """Run every task, ``width`` at a time (inline when there is only one); results are dropped."""
    if len(tasks) == 1 or width <= 1:
        for task in tasks:
            task()
        return
    for _ in run_each(tasks, min(width, len(tasks))):
        pass
