"""The shared chunk pool: every task runs once, errors come back, memory and nesting stay bounded."""

from __future__ import annotations

import threading
import time

import pytest

from nczmap.concurrency import WIDTH, _pool, run_all, run_each


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
    running, peak = 0, 0
    lock = threading.Lock()

    def task() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.01)
        with lock:
            running -= 1

    run_all([task] * 40, width=4)
    assert peak == 4


def test_run_each_reads_lazily_holding_at_most_width_tasks() -> None:
    taken, finished = 0, 0
    lock = threading.Lock()
    most_outstanding = 0

    def tasks():
        nonlocal taken, most_outstanding
        for _ in range(200):
            with lock:
                taken += 1
                most_outstanding = max(most_outstanding, taken - finished)
            yield task

    def task() -> None:
        nonlocal finished
        time.sleep(0.001)
        with lock:
            finished += 1

    list(run_each(tasks(), width=3))
    assert finished == 200
    assert most_outstanding <= 3


def test_first_error_is_raised_and_no_new_task_starts_after_it() -> None:
    started = 0
    lock = threading.Lock()

    def task(n: int) -> None:
        nonlocal started
        with lock:
            started += 1
        if n == 5:
            raise ValueError("chunk 5 is bad")
        time.sleep(0.005)

    with pytest.raises(ValueError, match="chunk 5 is bad"):
        run_all([lambda n=n: task(n) for n in range(1000)], width=4)
    assert started < 20


def test_abandoning_the_generator_stops_the_work() -> None:
    started = 0
    lock = threading.Lock()

    def task() -> None:
        nonlocal started
        with lock:
            started += 1
        time.sleep(0.002)

    iterator = run_each((task for _ in range(1000)), width=4)
    next(iterator)
    iterator.close()
    settled = started
    time.sleep(0.05)
    assert started == settled < 20


def test_nested_calls_from_every_pool_thread_do_not_deadlock() -> None:
    """Each outer task (filling the whole pool) runs an inner run_all, as a copy's region reads do."""
    inner_done = 0
    lock = threading.Lock()

    def inner() -> None:
        nonlocal inner_done
        with lock:
            inner_done += 1

    def outer() -> None:
        run_all([inner] * 10, width=WIDTH)

    futures = [_pool().submit(lambda: run_all([outer] * 3, width=WIDTH)) for _ in range(WIDTH)]
    for future in futures:
        future.result(timeout=30)
    assert inner_done == WIDTH * 3 * 10
