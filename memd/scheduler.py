"""The scheduler adapter: the only module that imports APScheduler (3.x).

One ``BackgroundScheduler`` runs everything timed: the periodic jobs
(reconcile, state flush) on a small default pool, compactions on a pool of
``daemon.max_concurrent_io`` workers (a job holds one of the daemon's LLM slots
for its summary only, waited for before the agent's lock:
:mod:`memd.daemon.llm_slots`). Per-agent wake-ups
(end of a backoff or cooldown) are not jobs here: the runner keeps their times
and the counter's tick takes them (:mod:`memd.daemon.counter`).

APScheduler 3's traps (DESIGN.md §5) are defused here: ``misfire_grace_time``
is None for every job (a late run is still a run, never silently dropped),
one-shot jobs get unique ids so a ``max_instances`` skip cannot eat them, and
who-runs-when per agent is decided by the daemon's own job state machine
(:mod:`memd.core.jobs`), not by APScheduler.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    JobEvent,
)
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from memd.logs import get_logger

_log = get_logger("memd.daemon")

COMPACTION_EXECUTOR = "compaction"
DEFAULT_EXECUTOR = "default"
# How often a graceful stop looks at the force flag while it waits.
_FORCE_POLL_S = 0.2
# Forced: how long the jobs in flight get to reach a checkpoint and roll back.
_FORCED_GRACE_S = 2.0

Task = Callable[..., Any]


class _QuietSkips(logging.Filter):
    """APScheduler's "Execution of job … skipped: maximum number of running instances
    reached" is a warning at every interval while a periodic job overruns (every
    0.5 s while ``recall-gone`` waited for a recall index locked elsewhere): memd
    says it once per overrun instead (:meth:`JobScheduler._on_event`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith('Execution of job "%s" skipped')


# APScheduler's scheduler logger, memd's own child of it (its level is the
# "apscheduler" logger's, memd.logs), with the skips quieted.
_SCHEDULER_LOGGER = logging.getLogger("apscheduler.scheduler.memd")
_SCHEDULER_LOGGER.addFilter(_QuietSkips())


class ExitFlags(Protocol):
    """The owner's shared state, read (never written) by the scheduler's stop."""

    @property
    def force_exit(self) -> bool: ...


class JobScheduler:
    def __init__(self, *, compaction_slots: int, periodic_workers: int = 2) -> None:
        self._scheduler = BackgroundScheduler(
            executors={
                # Thread names (memd-periodic_0, memd-compact_0, ...) show in
                # top -H and /proc/PID/task/*/comm (memd/threads.py).
                DEFAULT_EXECUTOR: ThreadPoolExecutor(
                    max_workers=periodic_workers,
                    pool_kwargs={"thread_name_prefix": "memd-periodic"},
                ),
                COMPACTION_EXECUTOR: ThreadPoolExecutor(
                    max_workers=compaction_slots, pool_kwargs={"thread_name_prefix": "memd-compact"}
                ),
            },
            job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 1},
            timezone=UTC,
            logger=_SCHEDULER_LOGGER,
        )
        self._ids = itertools.count()
        self._lock = threading.Lock()
        # Periodic jobs whose run overran their interval: said once per streak
        # (a run that ended without overrunning ends it), under _lock.
        self._overran_now: set[str] = set()
        self._overran_said: set[str] = set()
        self._scheduler.add_listener(
            self._on_event, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_EXECUTED | EVENT_JOB_ERROR
        )

    def _on_event(self, event: JobEvent) -> None:
        """A periodic job's run is still going at its next time: said once while its
        runs keep overrunning (its next time is skipped, as APScheduler's quieted
        warning said at every interval); a run that did not overrun ends that."""
        name = event.job_id
        with self._lock:
            if event.code == EVENT_JOB_MAX_INSTANCES:
                self._overran_now.add(name)
                if name in self._overran_said:
                    return
                self._overran_said.add(name)
            else:
                if name not in self._overran_now:
                    self._overran_said.discard(name)
                self._overran_now.discard(name)
                return
        _log.info("periodic job still running at its next time; that run is skipped", job=name)

    def start(self, stack: contextlib.ExitStack, flags: ExitFlags, abort: threading.Event) -> None:
        """Start; the stop pushed on ``stack`` is graceful (the jobs in flight run to
        the end) until ``flags.force_exit``: then ``abort`` is set (the jobs watch
        it) and the stop waits for them only a moment."""
        self._scheduler.start()
        stack.callback(self._stop, flags, abort)

    def _stop(self, flags: ExitFlags, abort: threading.Event) -> None:
        # The caller's thread (the main one) keeps watching for a forced exit.
        waiter = threading.Thread(target=self.shutdown, kwargs={"wait": True}, daemon=True)
        waiter.start()
        while waiter.is_alive() and not flags.force_exit:
            waiter.join(timeout=_FORCE_POLL_S)
        if flags.force_exit:
            abort.set()
        if flags.force_exit and waiter.is_alive():
            _log.warning("forced exit; in-flight compactions abort before their commit")
            waiter.join(timeout=_FORCED_GRACE_S)

    def shutdown(self, wait: bool = True) -> None:
        """Stop; with ``wait`` the jobs already handed to a pool run to the end."""
        if not self._scheduler.running:
            return
        # APScheduler 3 marks itself stopped before taking its job-store lock,
        # so a shutdown racing the scheduler thread's removal of a one-shot
        # job raises JobLookupError in that thread. Pause, then wait for the
        # lock (the in-progress pass to end), then stop.
        self._scheduler.pause()
        lock = getattr(self._scheduler, "_jobstores_lock", None)
        if lock is not None:
            with lock:
                pass
        self._scheduler.shutdown(wait=wait)

    def is_alive(self) -> bool:
        thread = getattr(self._scheduler, "_thread", None)
        return bool(self._scheduler.running) and thread is not None and thread.is_alive()

    def every(
        self, name: str, interval_s: float, task: Task, *, first_in_s: float | None = None
    ) -> None:
        """Run ``task`` every ``interval_s`` seconds; re-adding ``name`` replaces it.

        Overlapping or missed runs coalesce into one (a periodic job that is
        late simply runs once, then keeps its interval).
        """
        delay = interval_s if first_in_s is None else first_in_s
        self._scheduler.add_job(
            task,
            "interval",
            seconds=interval_s,
            id=name,
            name=name,
            replace_existing=True,
            next_run_time=datetime.now(UTC) + timedelta(seconds=delay),
            executor=DEFAULT_EXECUTOR,
        )

    def submit(self, name: str, task: Task, *args: Any) -> str:
        """Run ``task(*args)`` now on the compaction pool (queued when all slots are busy)."""
        with self._lock:
            job_id = f"{name}#{next(self._ids)}"
        self._scheduler.add_job(
            task,
            "date",
            run_date=datetime.now(UTC),
            args=args,
            id=job_id,
            name=name,
            executor=COMPACTION_EXECUTOR,
            # Unique ids make this moot, but a one-shot job must never be skipped.
            max_instances=1_000_000,
        )
        return job_id


__all__ = ["COMPACTION_EXECUTOR", "DEFAULT_EXECUTOR", "JobScheduler"]
