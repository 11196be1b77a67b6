from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import pytest
import structlog
from apscheduler.events import EVENT_JOB_MAX_INSTANCES

from memd.scheduler import JobScheduler


class Flags:
    """The owner's shared state (the lifecycle's: a second SIGINT sets force_exit)."""

    force_exit = False


@pytest.fixture
def scheduler() -> Iterator[JobScheduler]:
    s = JobScheduler(compaction_slots=2)
    with contextlib.ExitStack() as stack:
        s.start(stack, Flags(), threading.Event())
        yield s


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
    with contextlib.ExitStack() as stack:
        s.start(stack, Flags(), threading.Event())
        assert s.is_alive()
    assert not s.is_alive()  # stopped by the stack


def test_the_stacked_stop_waits_for_running_jobs() -> None:
    s = JobScheduler(compaction_slots=1)
    abort = threading.Event()
    finished = threading.Event()
    started = threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.3)
        finished.set()

    with contextlib.ExitStack() as stack:
        s.start(stack, Flags(), abort)
        s.submit("compact:x", slow)
        assert started.wait(5)
    assert finished.is_set()
    assert not abort.is_set()  # graceful: nothing was told to abort


def test_a_forced_stop_sets_abort_for_the_jobs_in_flight() -> None:
    s = JobScheduler(compaction_slots=1)
    flags = Flags()
    abort = threading.Event()
    started = threading.Event()
    saw_abort: list[bool] = []

    def in_flight() -> None:
        started.set()
        saw_abort.append(abort.wait(60))  # a slow LLM call that honours abort

    with contextlib.ExitStack() as stack:
        s.start(stack, flags, abort)
        s.submit("compact:x", in_flight)
        assert started.wait(5)
        flags.force_exit = True  # a second SIGINT, before the stop
    assert abort.is_set()
    assert _wait_for(lambda: saw_abort == [True])


def test_a_periodic_job_that_overruns_is_said_once_not_at_every_interval(
    scheduler: JobScheduler, caplog: pytest.LogCaptureFixture
) -> None:
    """A periodic run still going at its next time (``recall-gone`` waiting for a
    recall index locked by another process): APScheduler warned "skipped: maximum
    number of running instances reached" at every interval (every 0.5 s); now memd
    says it once per streak of overrunning runs."""
    caplog.set_level(logging.WARNING, logger="apscheduler")
    gate = threading.Event()
    runs: list[int] = []
    skips: list[str] = []
    scheduler._scheduler.add_listener(
        lambda event: skips.append(event.job_id), EVENT_JOB_MAX_INSTANCES
    )

    def blocked() -> None:
        runs.append(1)
        gate.wait(60)

    with structlog.testing.capture_logs() as logs:
        scheduler.every("recall-gone", 0.1, blocked, first_in_s=0)
        assert _wait_for(lambda: len(skips) >= 5)  # five intervals came while it ran
        gate.set()  # the index is free: runs end at once now
        ran = len(runs)
        assert _wait_for(lambda: len(runs) >= ran + 3)
        gate.clear()  # locked again: a second streak
        skipped = len(skips)
        assert _wait_for(lambda: len(skips) >= skipped + 5)
        gate.set()
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]
    said = [line for line in logs if line["event"].startswith("periodic job still running")]
    assert [line["job"] for line in said] == ["recall-gone", "recall-gone"]
