"""Job decisions from the core state machine (:mod:`memd.core.jobs`) → the
scheduler; each compaction's outcome → the next decision, the ledger, metrics,
and (a committed one) the stages after the commit (:mod:`memd.daemon.committed`).

The runner owns the agents' job states (``AgentEntry.job``: only the runner
writes it, under the runner's own lock), who is compacting (``RunStats``) and
the abort event handed to every transaction; it asks the spending guard
(:mod:`~memd.daemon.spending`) and the summarizer source
(:mod:`~memd.daemon.summarizer`), each with its own state and lock. The transaction
never calls back, it re-checks the threshold itself and rolls back when a
forced exit sets the event.

Locks: the runner's lock serializes every job transition (decide, then apply,
as one step). It is never held while taking another service's lock (the
registry's, the flusher's, an entry's ``count_lock``; only leaf locks inside:
the spending guard's, the scheduler's, the metrics'); the other way
round, no service calls into the runner while holding its own lock (a count
and a flush return what they found, the caller acts after), so no two
services' locks are ever taken in both orders.
The flusher reads a job without this lock: an ``AgentJob`` is immutable and a
transition writes ``job`` before it sets ``dirty``, so a flush that clears
``dirty`` then reads ``job`` sees the new job or is followed by one that does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from memd.compaction import (
    CompactionOptions,
    CompactionOutcome,
    ThresholdCheck,
    archive_key_file,
    finished_an_erasure,
    record_recovered_erasure,
    recover_agent,
)
from memd.core.config import AgentPolicy, MemdConfig
from memd.core.jobs import (
    AgentJob,
    Decision,
    JobState,
    RetryPolicy,
    Wakes,
    drain_owed_error,
    held_back,
    not_compactable,
    on_busy_elsewhere,
    on_cancelled,
    on_count,
    on_drain_finished,
    on_drain_owed,
    on_failure,
    on_held,
    on_hold_moved,
    on_nothing_to_compact,
    on_started,
    on_success,
    on_unfinished_journal,
    restored_job,
)
from memd.core.spending import Hold
from memd.core.summary import Summarizer
from memd.daemon.committed import AfterCommit
from memd.daemon.entries import AgentEntry, Counted, EntryCounter, RunStats
from memd.daemon.flusher import StateFlusher
from memd.daemon.llm_slots import LlmSlots
from memd.daemon.registry import AgentRegistry
from memd.daemon.spending import Reservation, SpendingGuard
from memd.daemon.summarizer import SummarizerFactory, SummarizerSource
from memd.errors import (
    CommittedUnfinished,
    CompactionAborted,
    LockTimeout,
    MemdError,
    NothingToCompact,
    SummaryNotStarted,
    SummaryRequeued,
    SummarySettingsChanged,
    UnderThreshold,
    describe_error,
)
from memd.logs import get_logger
from memd.scheduler import JobScheduler
from memd.summarizers import BUILTIN_MODEL
from memd.workspace import AgentPaths

if TYPE_CHECKING:
    from memd.audit import AuditLog
    from memd.metrics import Metrics
    from memd.state import AgentRecord

_log = get_logger("memd.daemon")

# While the daemon compacts, another compactor (compact-now, a second daemon)
# holding the lock means "try again later", not "wait minutes holding a slot".
DAEMON_LOCK_WAIT_S = 1.0
# Another process holding an agent's lock this long is no longer a compaction
# running elsewhere but a stuck one (a `compact-now` whose model hangs, a second
# daemon wedged): said once as a warning naming the holder, since memd cannot
# compact that agent until it lets go.
BUSY_WARNING_AFTER_S = 30 * 60.0
# Busy retries of one holder come every retry_base_s plus the lock wait: a gap this
# long between two means the first holder let go and the next is a new one.
BUSY_EPISODE_GAP_S = 15 * 60.0


class CompactFn(Protocol):
    def __call__(
        self,
        paths: AgentPaths,
        summarizer: Summarizer,
        options: CompactionOptions,
        *,
        count_bytes: Callable[[bytes], int] | None = ...,
        abort: threading.Event | None = ...,
        threshold: ThresholdCheck | None = ...,
    ) -> CompactionOutcome: ...


class FinishFn(Protocol):
    """Recovery's roll-forward of the agent's journal (:func:`memd.compaction.recover_agent`):
    what a committed but unfinished compaction owes; LockTimeout when another
    compactor holds the lock (it finishes the job first, but may not have yet)."""

    def __call__(
        self,
        paths: AgentPaths,
        wait_s: float = ...,
        quiet_s: float = ...,
        max_s: float = ...,
        *,
        key_file: Path | None = ...,
        busy_raises: bool = ...,
    ) -> str | None: ...


class Runner:
    def __init__(
        self,
        config: MemdConfig,
        registry: AgentRegistry,
        counter: EntryCounter,
        flusher: StateFlusher,
        stats: RunStats,
        compact: CompactFn,
        summarizer_factory: SummarizerFactory,
        clock: Callable[[], float] = time.time,
        after_commit: AfterCommit | None = None,
        finish: FinishFn = recover_agent,
    ) -> None:
        self.config = config
        # A committed compaction's unfinished drain is finished by the recovery a
        # restart would run (never a second implementation of it).
        self._finish = finish
        # Wall-clock time for the job decisions (backoff, cooldown, wake-ups);
        # tests pass a made-up one.
        self._clock = clock
        self.retry_policy = RetryPolicy.from_config(config.daemon)
        self.abort = threading.Event()
        # Summaries in flight, daemon-wide; the rest of a job runs beside them
        # on the compaction pool (a restart applies a new size).
        self.llm_slots = LlmSlots(config.daemon.max_concurrent_llm)
        self._metrics: Metrics | None = None
        # The workspace's audit log (None without a state dir).
        self.audit: AuditLog | None = None
        # The next stage of a committed compaction (recall, archive figures,
        # retention's report), handed its outcome once the transaction returned.
        self._after_commit = after_commit
        # The workspace's redaction key (set at start-up; None: a per-process key).
        self.redaction_key: bytes | None = None
        self._registry = registry
        self._counter = counter
        self._flusher = flusher
        self._stats = stats
        self._compact = compact
        self._wakes = Wakes()
        self._scheduler: JobScheduler | None = None
        self._stopping = False
        # Job states, the running set and the config (see the
        # module docstring for the order with the other services' locks).
        self._lock = threading.RLock()
        # Model requests and their cost, for [summarizer] max_calls_per_hour and
        # max_usd_per_day (workspace-wide: this daemon is the workspace's).
        self.spending = SpendingGuard(config.summarizer, clock)
        # The summarizer in use (the builtin one standing in after repeated failures).
        self.summarizers = SummarizerSource(
            config,
            summarizer_factory,
            counter.tokenizer.count_text,
        )

    def start(self, stack: contextlib.ExitStack, scheduler: JobScheduler) -> None:
        """Submit to ``scheduler`` from here on; the stop is pushed on ``stack`` (it
        runs before the scheduler's, which waits for the jobs in flight)."""
        self._scheduler = scheduler
        self.spending.seed(self._flusher.store)
        stack.callback(self.stop)

    def stop(self) -> None:
        """No new jobs from here on (queued ones are cancelled when they start)."""
        with self._lock:
            self._stopping = True
        self.summarizers.stop()
        self.llm_slots.close()

    def reconfigure(
        self, config: MemdConfig, count_text: Callable[[str], int] | None = None
    ) -> None:
        """A reload; ``count_text``: the new tokenizer's, when it brought one."""
        with self._lock:
            self.config = config
            self.retry_policy = RetryPolicy.from_config(config.daemon)
        self.summarizers.reconfigure(config, count_text)
        self.spending.reconfigure(config.summarizer)

    @property
    def metrics(self) -> Metrics | None:
        return self._metrics

    @metrics.setter
    def metrics(self, metrics: Metrics | None) -> None:
        """Where outcomes (and the spending guard's figures) are published."""
        self._metrics = metrics
        self.spending.metrics = metrics

    # ------------------------------------------------------------------ decide

    def evaluate(self, entry: AgentEntry) -> None:
        """A count (or an expired hold) for the agent: decide and act."""
        self.evaluate_all((entry,))

    def evaluate_all(self, entries: Iterable[AgentEntry]) -> None:
        """:meth:`evaluate` each agent, under one lock (start-up: every agent)."""
        with self._lock:
            for entry in entries:
                if self._stopping:
                    return
                if entry.count_error is None and self._registry.is_current(entry):
                    self._apply(entry, self._decide(entry, entry.job))

    def _decide(self, entry: AgentEntry, job: AgentJob) -> Decision:
        now = self._clock()
        found = entry.unfinished_journal
        if found is not None and job.state not in (JobState.PENDING, JobState.RUNNING):
            # Taken once (a job of ours pending or running leaves it for after):
            # the finish this starts reads the journal afresh, so a note set again
            # meanwhile is served by it too.
            entry.unfinished_journal = None
            owed = on_unfinished_journal(
                job, found.recovery_error, policy=self.retry_policy, now=now
            )
            if owed is not job:
                if found.recovery_error is None:
                    _log.info(
                        "MEMORY.md replaced by another process's compaction, its journal "
                        "not done; finishing it from the journal",
                        agent=entry.name,
                    )
                else:
                    _log.warning(
                        "recovery failed; finishing the compaction from its journal later",
                        agent=entry.name,
                        error=found.recovery_error,
                        retry_at=owed.next_attempt_at,
                    )
                job = owed
        return on_count(
            job,
            entry.tokens,
            entry.policy.threshold_tokens,
            entry.policy.compress,
            now,
            min_interval_s=self.retry_policy.min_interval_s,
            policy=self.retry_policy,
        )

    def _apply(self, entry: AgentEntry, decision: Decision) -> None:
        # Most decisions keep the very job object (a quiet agent): no field-by-field compare.
        changed = decision.job is not entry.job and decision.job != entry.job
        entry.job = decision.job  # before dirty: see the module docstring
        if changed:
            entry.dirty = True
        scheduler = self._scheduler
        if scheduler is None or self._stopping:
            return
        if decision.start and decision.job.drain_owed:
            _log.info(
                "finishing a committed compaction from its journal",
                agent=entry.name,
                attempt=decision.job.drain_attempts,
            )
            scheduler.submit(f"finish:{entry.name}", self._finish_job, entry)
        elif decision.start:
            _log.info(
                "compaction queued",
                agent=entry.name,
                tokens=entry.tokens,
                threshold=entry.policy.threshold_tokens,
            )
            scheduler.submit(f"compact:{entry.name}", self._compaction_job, entry)
        if decision.wake_at is not None:
            self._wakes.set(entry.name, decision.wake_at)

    def take_wakes(self, now: float) -> list[str]:
        """The agents whose wake-up is due at ``now`` (wall clock), each handed out
        once: the counter counts them, then hands them back to :meth:`evaluate`."""
        with self._lock:
            return self._wakes.pop_due(now)

    def next_wake(self) -> float | None:
        """When the next wake-up is due (wall clock), or None."""
        with self._lock:
            return self._wakes.next()

    def forget(self, name: str) -> None:
        """The agent is gone: no wake-up, no metric."""
        with self._lock:
            self._wakes.drop(name)
        if self.metrics is not None:
            self.metrics.remove_agent(name)

    def flush(self, final: bool = False, *, live: bool = False) -> None:
        """Write the state DB (the flusher, with this runner's spending), then act on
        the erasures that flush found (the flusher returns them: it calls no one)."""
        spending = None if live else self.spending.snapshot()
        for change in self._flusher.flush(final, live=live, spending=spending):
            self._erasure_changed(change.agent, change.erased)

    def _erasure_changed(self, name: str, erased: bool) -> None:
        """``memd forget`` erased the agent (or it writes again): its metrics series go
        (and stay away while erased); its past job state goes with its memory."""
        entry = self._registry.get(name)
        if self.metrics is not None:
            if erased:
                self.metrics.erase_agent(name)
            else:
                self.metrics.restore_agent(name)
                if entry is not None:  # its new file was counted while erased
                    self.metrics.set_agent(name, entry.tokens, entry.policy.threshold_tokens)
        if not erased:
            return
        if entry is not None and self._after_commit is not None:
            # forget unlinked its MEMORY.md: with --poll the held fd is the old file,
            # whose size never moves; the watch stage has its path checked next pass.
            self._after_commit.replaced(entry.paths)
        with self._lock:
            self._wakes.drop(name)
            if entry is not None and entry.job.state not in (JobState.PENDING, JobState.RUNNING):
                entry.job = AgentJob()

    def reset_if_erased(self, entry: AgentEntry) -> None:
        # No MEMORY.md and no archive: the agent's memory was erased (`memd
        # forget`, or by hand). Its past (last compaction, failures, a breaker)
        # goes with it, or the next state flush would write it back.
        if entry.paths.archive_dir.exists():
            return
        with self._lock:
            if entry.job.state not in (JobState.PENDING, JobState.RUNNING) and (
                entry.job != AgentJob()
            ):
                entry.job = AgentJob()
                entry.dirty = True

    def cancel_pending(self) -> None:
        """Shutdown: queued jobs will not run."""
        entries = self._registry.agents().values()  # under the registry's lock, not ours
        with self._lock:
            for entry in entries:
                if entry.job.state is JobState.PENDING:
                    entry.job = on_cancelled(entry.job)
                    entry.dirty = True

    def restore(self, stored: Iterable[tuple[AgentEntry, AgentRecord]]) -> None:
        """Start-up: each agent's job state stored before the restart (a hold still
        holds; an owed drain stays owed, due at once), all under one lock and one
        reading of the clock (the runner's, as every job decision's)."""
        now = self._clock()
        with self._lock:
            for entry, record in stored:
                entry.job = restored_job(
                    record.state,
                    consecutive_failures=record.consecutive_failures,
                    last_error=record.last_error,
                    last_compaction_at=record.last_compaction_at,
                    next_attempt_at=record.next_attempt_at,
                    now=now,
                )

    def hold_expired(self, entry: AgentEntry, now: float) -> bool:
        """A cooldown, backoff or open breaker past its time (a lost wake-up)."""
        job = entry.job
        return (
            job.state in (JobState.COOLDOWN, JobState.BACKOFF, JobState.BREAKER_OPEN)
            and job.next_attempt_at is not None
            and job.next_attempt_at <= now
        )

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._stats.running)

    # ----------------------------------------------------------------- compact

    def _compaction_options(
        self, agent: str, policy: AgentPolicy, reservation: Reservation | None
    ) -> CompactionOptions:
        options = CompactionOptions.from_config(
            self.config, policy, agent=agent, redaction_key=self.redaction_key
        )
        return dataclasses.replace(
            options,
            lock_wait_s=min(options.lock_wait_s, DAEMON_LOCK_WAIT_S),
            # Never more calls than the hour's cap leaves (reserved for this
            # compaction): one that needs more covers the oldest turns (a
            # partial one) instead.
            max_calls=(
                reservation.calls if reservation is not None else self.spending.calls_left()
            ),
            audit=self.audit,  # an erasure a crash left, finished first
        )

    def _held(self, entry: AgentEntry, hold: Hold) -> None:
        """Under the runner's lock: the cap holds this compaction back until it passes."""
        _log.warning(
            "compaction held back by a spending cap",
            agent=entry.name,
            cap=hold.key,
            reason=hold.reason,
            until=hold.until,
        )
        if self.metrics is not None:
            self.metrics.record_hold(hold.key)
        self._apply(entry, on_held(entry.job, hold.reason, until=hold.until))

    def _holds_may_end(self) -> None:
        """A reservation was settled to less: agents held back meanwhile (by what it
        reserved) may start sooner than their hold said."""
        entries = self._registry.agents().values()  # under the registry's lock, not ours
        with self._lock:
            now = self._clock()
            for entry in entries:
                job = entry.job
                if not held_back(job) or job.next_attempt_at is None:
                    continue
                hold = self.spending.hold(job)
                until = now if hold is None else hold.until
                if until < job.next_attempt_at:
                    self._apply(entry, on_hold_moved(job, until=until))

    def _compaction_job(self, entry: AgentEntry) -> None:
        try:
            self._compact_one(entry)
        finally:
            # `memd status` and the ledger readers see the result at once,
            # not at the next periodic flush.
            if not self._stopping:
                self.flush()

    def _compact_one(self, entry: AgentEntry) -> None:
        name = entry.name
        # The job counts with the tokenizer in use now, from the entry's count only
        # when it was made with it (taken under the count lock, before ours: see
        # the module docstring); its count of the new file seeds the daemon's only
        # if no reload has changed the tokenizer by the time it ends.
        tokenizer, tracked = self._counter.job_count(entry)
        with self._lock:
            if self._stopping or not self._registry.is_current(entry):
                entry.job = on_cancelled(entry.job)
                entry.dirty = True
                return
            if not entry.policy.compress:
                # A reload set context_compression = false while the job was
                # queued (evaluate_all leaves a busy job alone): the agent is
                # watched and counted, never compacted.
                self._apply(entry, self._decide(entry, on_cancelled(entry.job)))
                return
            hold = self.spending.hold(entry.job)
            if hold is not None:
                self._held(entry, hold)
                return
            # Taken under this lock with the hold check: two compactions
            # starting side by side cannot both be allowed the hour's calls.
            reservation = self.spending.reserve() if self.spending.spends(entry.job) else None
            entry.job = on_started(entry.job)
            entry.dirty = True
            self._stats.running.add(name)
            tokens_before = entry.tokens
            failures = entry.job.consecutive_failures
            # The transaction re-checks this count under the agent's lock.
            threshold = ThresholdCheck(tracked, entry.policy.threshold_tokens)
        _log.info("compaction started", agent=name, tokens=tokens_before)
        started_wall = time.time()
        started = time.monotonic()
        outcome: CompactionOutcome | None = None
        error: BaseException | None = None
        fallback = False
        try:
            # Read before the summarizer and the options are resolved: a reload
            # from here on, while the job waits for an LLM slot, sends it back
            # to the queue instead of out with the old model or redaction.
            generation = self.summarizers.generation
            summarizer, fallback = self.summarizers.for_agent(name, failures)
            # The slot is waited for here, before the transaction takes the agent's
            # lock: compact-now, forget and retention on this agent are not kept
            # waiting behind a job that is itself only waiting.
            with self.llm_slots.reserved(
                name, summarizer, lambda: self.summarizers.generation == generation
            ) as bound:
                outcome = self._compact(
                    entry.paths,
                    bound,
                    self._compaction_options(name, entry.policy, reservation),
                    count_bytes=tokenizer.count_bytes,
                    abort=self.abort,
                    threshold=threshold,
                )
        except Exception as exc:
            error = exc
            if self._after_commit is not None:
                # A failure may come past the commit point (the drain's): the file
                # may be a new one all the same.
                self._after_commit.replaced(entry.paths)
        else:
            # Handed forward, not called back: the transaction returned (the
            # agent's lock is let go) with what it archived and pruned.
            if self._after_commit is not None:
                self._after_commit.committed(entry.paths, outcome)
        finally:
            with self._lock:
                self._stats.running.discard(name)
            if reservation is not None:
                # The builtin summarizer standing in spent nothing.
                calls, usd = (0, None) if fallback else _spent(outcome, error)
                self.spending.settle(reservation, calls, usd)
                if calls is not None and calls < (reservation.calls or 0):
                    self._holds_may_end()
        duration = time.monotonic() - started
        # The file was replaced (or not): count it again before deciding, on from
        # the job's count of the file it wrote (the kept turns are not tokenized again),
        # when that count is in the encoding counted with now.
        try:
            self._counter.count_locked(
                entry,
                after_job=True,
                seed=None if outcome is None else outcome.counted,
                seed_tokenizer=tokenizer,
            )
        except Exception:  # the job's outcome must still be applied below
            _log.exception("recount after compaction failed", agent=name)
        if error is None:
            assert outcome is not None
            self._succeeded(entry, outcome, started_wall, duration, fallback)
        else:
            self._failed(entry, error, started_wall, duration, fallback)
        self._count_skipped(entry)

    def _finish_job(self, entry: AgentEntry) -> None:
        try:
            self._finish_one(entry)
        finally:
            if not self._stopping:
                self.flush()

    def _finish_one(self, entry: AgentEntry) -> None:
        """Run the journal's roll-forward for a compaction that committed but did not
        finish: the turns a late writer appended to the old file reach MEMORY.md
        now, not at the agent's next compaction or the daemon's next start."""
        name = entry.name
        with self._lock:
            if self._stopping or not self._registry.is_current(entry):
                entry.job = on_cancelled(entry.job)
                entry.dirty = True
                return
            entry.job = on_started(entry.job)
            entry.dirty = True
            self._stats.running.add(name)
            compaction = self.config.compaction
            key_file = archive_key_file(self.config)
        done: str | None = None
        error: Exception | None = None
        try:
            done = self._finish(
                entry.paths,
                wait_s=DAEMON_LOCK_WAIT_S,
                quiet_s=compaction.drain_quiet_s,
                max_s=compaction.drain_max_s,
                key_file=key_file,
                busy_raises=True,
            )
        except Exception as exc:
            error = exc
        finally:
            with self._lock:
                self._stats.running.discard(name)
        if finished_an_erasure(done) and self.audit is not None:
            record_recovered_erasure(self.audit, name)
        try:
            self._counter.count_locked(entry, after_job=True)
        except Exception:  # the outcome must still be applied below
            _log.exception("recount after finishing the drain failed", agent=name)
        now = self._clock()
        with self._lock:
            if error is None:
                self._lock_was_taken(entry)
                # Nothing left to do is the usual outcome of the first run after a
                # restart (its recovery finished the drain) or of a `memd` command
                # that ran it first: not worth a warning.
                (_log.warning if done else _log.info)(
                    "finished a committed compaction from its journal",
                    agent=name,
                    action=done or "nothing left to do",
                    attempts=entry.job.drain_attempts,
                )
                decision = on_drain_finished(
                    entry.job,
                    current_tokens=entry.tokens,
                    threshold_tokens=entry.policy.threshold_tokens,
                    compress=entry.policy.compress,
                    policy=self.retry_policy,
                    now=now,
                )
            elif isinstance(error, LockTimeout):
                # Whoever holds the lock finishes the job first; the drain stays
                # owed (its marker kept in the error: status and a restart see
                # it) until this runner sees it done.
                self._busy_elsewhere(entry, error, now)
                decision = on_busy_elsewhere(
                    entry.job, describe_error(error), policy=self.retry_policy, now=now
                )
            else:
                decision = on_drain_owed(
                    entry.job,
                    drain_owed_error(describe_error(error)),
                    policy=self.retry_policy,
                    now=now,
                )
                _log.warning(
                    "finishing a committed compaction failed; retrying",
                    agent=name,
                    error=describe_error(error),
                    attempts=decision.job.drain_attempts,
                    retry_at=decision.wake_at,
                )
            self._apply(entry, decision)
        self._count_skipped(entry)

    def _count_skipped(self, entry: AgentEntry) -> None:
        """The job has left RUNNING: a change the counting thread skipped meanwhile
        (a MEMORY.md replaced after the count above: no event will come for it
        again, and with --poll no rescan stats it) is counted now and decided on."""
        try:
            counted = self._counter.count_skipped(entry)
        except Exception:
            _log.exception("count after compaction failed", agent=entry.name)
            return
        if counted is Counted.MISSING:
            self.reset_if_erased(entry)
        if counted is not None:
            self.evaluate(entry)

    def _succeeded(
        self,
        entry: AgentEntry,
        outcome: CompactionOutcome,
        started_wall: float,
        duration: float,
        fallback: bool = False,
    ) -> None:
        name = entry.name
        policy = self.retry_policy
        with self._lock:  # compaction threads end side by side: no increment lost
            self._stats.compactions_ok += 1
            self._lock_was_taken(entry)
        # Judge what the compaction produced, not appends made meanwhile.
        achieved = outcome.tokens_produced
        _log.info(
            "compacted",
            agent=name,
            tokens_before=outcome.tokens_before,
            tokens_after=outcome.tokens_after,
            tokens_produced=achieved,
            tokens_appended=outcome.tokens_appended,
            archive=str(outcome.archive),
            model=outcome.model,
            fallback=fallback,
            pinned=outcome.pinned,
            evicted=outcome.evicted,
            cost_usd=outcome.cost_usd,
            seconds=round(duration, 3),
            # Counts only: how many secrets the summarizer was not sent, and
            # how many its reply held (an echo, a local model's copy).
            redacted=outcome.redacted,
            reply_redacted=outcome.reply_redacted,
        )
        self._ledger(entry, started_wall, duration, outcome, None, fallback)
        self._audit(name, outcome)
        if outcome.prune_error:
            _log.warning("retention after compaction failed", agent=name, error=outcome.prune_error)
        if self.metrics is not None:
            self.metrics.record_compaction(
                name, "ok", llm_seconds=outcome.llm_duration_s, cost_usd=outcome.cost_usd
            )
            if fallback:
                self.metrics.fallbacks.labels(agent=name).inc()
        with self._lock:
            decision = on_success(
                entry.job,
                achieved_tokens=achieved,
                current_tokens=entry.tokens,
                threshold_tokens=entry.policy.threshold_tokens,
                low_water_tokens=entry.policy.low_water_tokens,
                compress=entry.policy.compress,
                policy=policy,
                now=self._clock(),
            )
            if decision.job.state is JobState.COOLDOWN:
                _log.warning(
                    "compaction ended above the low-water mark; cooling down",
                    agent=name,
                    tokens_produced=achieved,
                    low_water=entry.policy.low_water_tokens,
                    cooldown_s=policy.cooldown_s,
                )
            self._apply(entry, decision)

    @staticmethod
    def _busy_elsewhere(entry: AgentEntry, error: LockTimeout, now: float) -> None:
        """Another process held the agent's lock (under the runner's lock): retried
        quietly, until it has been held for :data:`BUSY_WARNING_AFTER_S`."""
        if entry.busy_since is None or now - entry.busy_seen_at > BUSY_EPISODE_GAP_S:
            entry.busy_since, entry.busy_warned = now, False
        entry.busy_seen_at = now
        held_for = now - entry.busy_since
        if held_for >= BUSY_WARNING_AFTER_S and not entry.busy_warned:
            entry.busy_warned = True
            _log.warning(
                "another process has held the agent's lock for a long time; memd cannot "
                "compact this agent until it lets go (if that process is stuck, stop it)",
                agent=entry.name,
                held_for_min=round(held_for / 60),
                lock=describe_error(error),
            )
        else:
            _log.info(
                "agent is being compacted by another process; retrying later",
                agent=entry.name,
                lock=describe_error(error),
            )

    @staticmethod
    def _lock_was_taken(entry: AgentEntry) -> None:
        if entry.busy_since is not None:
            if entry.busy_warned:
                _log.info("the agent's lock was let go; compacting it again", agent=entry.name)
            entry.busy_since = None
            entry.busy_warned = False

    def _failed(
        self,
        entry: AgentEntry,
        error: BaseException,
        started_wall: float,
        duration: float,
        fallback: bool = False,
    ) -> None:
        name = entry.name
        policy = self.retry_policy
        now = self._clock()
        if not isinstance(error, LockTimeout):
            # Any other outcome ends a run of busy retries: the holder let go (this
            # job may have stopped before taking the lock: under threshold, requeued).
            with self._lock:
                self._lock_was_taken(entry)
        if isinstance(error, SummaryRequeued):
            if isinstance(error, SummarySettingsChanged):
                _log.info("summarizer settings changed while waiting; queued again", agent=name)
            else:
                _log.info("queued again", agent=name, reason=describe_error(error))
            with self._lock:
                self._apply(entry, self._decide(entry, on_cancelled(entry.job)))
            return
        if isinstance(error, SummaryNotStarted):
            with self._lock:
                entry.job = on_cancelled(entry.job)
                entry.dirty = True
            return
        if isinstance(error, UnderThreshold):
            _log.info("already under threshold; skipped", agent=name, tokens=entry.tokens)
            with self._lock:
                self._apply(entry, self._decide(entry, on_cancelled(entry.job)))
            return
        if isinstance(error, NothingToCompact):
            said = not_compactable(error.reason)
            if entry.job.last_error != said:  # say it once, not every cooldown
                _log.warning(
                    "over threshold but nothing to compact; cooling down",
                    agent=name,
                    tokens=entry.tokens,
                    detail=said,
                )
            if self.metrics is not None:
                self.metrics.record_compaction(name, "nothing")
            with self._lock:
                self._apply(
                    entry,
                    on_nothing_to_compact(entry.job, policy=policy, now=now, reason=error.reason),
                )
            return
        if isinstance(error, LockTimeout):
            with self._lock:
                self._busy_elsewhere(entry, error, now)
                self._apply(entry, on_busy_elsewhere(entry.job, str(error), policy=policy, now=now))
            return
        if isinstance(error, CompactionAborted) and self.abort.is_set():
            # A forced exit (a second SIGINT) rolled the job back: the operator
            # stopped it, the model did not fail. Counted as a failure, a few
            # forced stops would trip fallback_after and then the breaker.
            _log.info("compaction rolled back: shutdown forced", agent=name)
            if self.metrics is not None:
                self.metrics.record_compaction(name, "aborted")
            with self._lock:
                entry.job = on_cancelled(entry.job)
                entry.dirty = True
            return
        reason = describe_error(error)
        with self._lock:
            self._stats.compactions_failed += 1
        if isinstance(error, CommittedUnfinished):
            self._committed_unfinished(entry, reason, started_wall, duration, fallback, now)
            return
        if not isinstance(error, (MemdError, OSError)):
            _log.error(
                "compaction crashed",
                agent=name,
                error=reason,
                exc_info=(type(error), error, error.__traceback__),
            )
        self._ledger(entry, started_wall, duration, None, reason, fallback)
        if self.metrics is not None:
            aborted = isinstance(error, CompactionAborted)
            self.metrics.record_compaction(name, "aborted" if aborted else "error")
        with self._lock:
            decision = on_failure(entry.job, reason, policy=policy, now=now)
            _log.warning(
                "compaction failed",
                agent=name,
                error=reason,
                failures=decision.job.consecutive_failures,
                state=str(decision.job.state),
                retry_at=decision.wake_at,
            )
            self._apply(entry, decision)

    def _committed_unfinished(
        self,
        entry: AgentEntry,
        reason: str,
        started_wall: float,
        duration: float,
        fallback: bool,
        now: float,
    ) -> None:
        """The compaction committed, then a step after the swap failed: reported as a
        failed job (ledger, metrics), and its drain owed: the runner finishes it
        from the journal soon, with backoff, instead of leaving the late turns out
        of MEMORY.md until the agent's next compaction or a restart."""
        name = entry.name
        self._ledger(entry, started_wall, duration, None, reason, fallback)
        if self.metrics is not None:
            self.metrics.record_compaction(name, "aborted")
        with self._lock:
            decision = on_drain_owed(
                entry.job,
                drain_owed_error(reason),
                policy=self.retry_policy,
                now=now,
                committed=True,
            )
            _log.warning(
                "compaction committed but did not finish; finishing it from its journal",
                agent=name,
                error=reason,
                retry_at=decision.wake_at,
            )
            self._apply(entry, decision)

    def _audit(self, name: str, outcome: CompactionOutcome) -> None:
        if self.audit is None:
            return
        from memd.audit import record_compaction

        try:
            record_compaction(
                self.audit,
                name,
                outcome,
                trigger="threshold",
                api_base=self.config.summarizer.api_base,
                local_hosts=self.config.privacy.local_hosts,
            )
        except Exception as exc:  # the compaction is committed whatever happens here
            _log.warning("cannot write the audit log", agent=name, error=describe_error(exc))

    def _ledger(
        self,
        entry: AgentEntry,
        started_at: float,
        duration: float,
        outcome: CompactionOutcome | None,
        error: str | None,
        fallback: bool = False,
    ) -> None:
        store = self._flusher.store
        if store is None:
            return
        from memd.state import LedgerEntry

        record = LedgerEntry.of(
            entry.name,
            "daemon",
            started_at=started_at,
            duration_s=duration,
            outcome=outcome,
            error=error,
            model=BUILTIN_MODEL if fallback else self.summarizers.model,
            fallback=fallback,
        )
        try:
            store.record_compaction(record)
        except Exception as exc:
            _log.warning("cannot write the ledger", agent=entry.name, error=describe_error(exc))


def _spent(
    outcome: CompactionOutcome | None, error: BaseException | None
) -> tuple[int | None, float | None]:
    """What a compaction spent on its model: (requests, USD; None: unpriced), from
    its outcome or the error it failed with (memd's errors carry it; any other
    is a crash: not known, None)."""
    if outcome is not None:
        return outcome.calls, outcome.cost_usd
    if isinstance(error, MemdError):
        return error.model_calls or 0, error.model_cost_usd or 0.0
    return None, None


__all__ = ["DAEMON_LOCK_WAIT_S", "CompactFn", "FinishFn", "Runner", "SummarizerFactory"]
