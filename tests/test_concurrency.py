"""The shared chunk pool: every task runs once, errors come back, memory and nesting stay bounded."""

from __future__ import annotations

import threading
import time

import pytest

from nczmap.concurrency import WIDTH, _pool, run_all, run_each


class Tally:
    """A count shared by threads, with the highest value it reached."""

    def __init__(self) -> None:
        self.count = 0
        self.peak = 0
        self._lock = threading.Lock()

    def add(self, amount: int = 1) -> None:
        with self._lock:
            self.count += amount
            self.peak = max(self.peak, self.count)


def test_run_each_runs_every_task_once_and_yields_once_per_task() -> None:
    done: list[int] = []
    lock = threading.Lock()

    def task(n: int) -> None:
        with lock:
            done.append(n)

    yields = sum(1 for _ in run_each([lambda n=n: task(n) for n in range(500)], width=4))
    assert yields == 500
    assert sorted(done) == list(range(500))


def test_run_each_uses_several_threads_at_once() -> None:
    running = Tally()

    def task() -> None:
        running.add()
        time.sleep(0.01)
        running.add(-1)

    run_all([task] * 40, width=4)
    assert running.peak == 4


def test_run_each_reads_lazily_holding_at_most_width_tasks() -> None:
    outstanding, finished = Tally(), Tally()

    def task() -> None:
        time.sleep(0.001)
        outstanding.add(-1)
        finished.add()

    def tasks():
        for _ in range(200):
            outstanding.add()
            yield task

    list(run_each(tasks(), width=3))
    assert finished.count == 200
    assert outstanding.peak <= 3


def test_first_error_is_raised_and_no_new_task_starts_after_it() -> None:
    started = Tally()

    def task(n: int) -> None:
        started.add()
        if n == 5:
            raise ValueError("chunk 5 is bad")
        time.sleep(0.005)

    with pytest.raises(ValueError, match="chunk 5 is bad"):
        run_all([lambda n=n: task(n) for n in range(1000)], width=4)
    assert started.count < 20


def test_abandoning_the_generator_stops_the_work() -> None:
    started = Tally()

    def task() -> None:
        started.add()
        time.sleep(0.002)

    iterator = run_each((task for _ in range(1000)), width=4)
    next(iterator)
    iterator.close()
    settled = started.count
    time.sleep(0.05)
    assert started.count == settled < 20


def test_nested_calls_from_every_pool_thread_do_not_deadlock() -> None:
    """Each outer task (filling the whole pool) runs an inner run_all, as a copy's region reads do."""
    inner_done = Tally()

    def outer() -> None:
        run_all([inner_done.add] * 10, width=WIDTH)

    futures = [_pool().submit(lambda: run_all([outer] * 3, width=WIDTH)) for _ in range(WIDTH)]
    for future in futures:
        future.result(timeout=30)
    assert inner_done.count == WIDTH * 3 * 10
