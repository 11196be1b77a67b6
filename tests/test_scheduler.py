from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from memd.scheduler import JobScheduler


@pytest.fixture
def scheduler() -> Iterator[JobScheduler]:
    s = JobScheduler(compaction_slots=2)
    s.start()
    yield s
    s.shutdown(wait=True)


def _wait_for(predicate: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_concurrency_is_capped_and_no_queued_job_is_dropped(scheduler: JobScheduler) -> None:
    lock = threading.Lock()
    running = 0
    peak = 0
    done: list[int] = []

    def work(n: int) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        # Longer than APScheduler's default 1 s misfire grace: queued jobs
        # wait > 1 s for a slot and must still run.
        time.sleep(0.6)
        with lock:
            running -= 1
            done.append(n)

    for n in range(7):
        scheduler.submit("compact:agent", work, n)
    assert _wait_for(lambda: len(done) == 7, timeout=10)
    assert peak == 2
    assert sorted(done) == list(range(7))


def test_periodic_job_runs_repeatedly_and_can_be_replaced(scheduler: JobScheduler) -> None:
    ticks: list[str] = []
    scheduler.every("reconcile", 0.05, lambda: ticks.append("a"), first_in_s=0)
    assert _wait_for(lambda: ticks.count("a") >= 3)
    scheduler.every("reconcile", 0.05, lambda: ticks.append("b"))
    assert _wait_for(lambda: ticks.count("b") >= 2)
    # Replaced, not added: once "b" has run twice more, "a" never runs again.
    a_runs = ticks.count("a")
    runs = len(ticks)
    assert _wait_for(lambda: len(ticks) >= runs + 3)
    assert ticks.count("a") == a_runs


def test_liveness_follows_the_scheduler_thread() -> None:
    s = JobScheduler(compaction_slots=1)
    assert not s.is_alive()
    s.start()
    assert s.is_alive()
    s.shutdown(wait=True)
    assert not s.is_alive()


def test_shutdown_waits_for_running_jobs() -> None:
    s = JobScheduler(compaction_slots=1)
    s.start()
    finished = threading.Event()
    started = threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.3)
        finished.set()

    s.submit("compact:x", slow)
    assert started.wait(5)
    s.shutdown(wait=True)
    assert finished.is_set()
