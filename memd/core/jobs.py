"""The per-agent compaction job state machine (pure).

States::

    idle ──over threshold──▶ pending ──slot free──▶ running
      ▲                                        │
      │◀── success, ended below low water ─────┤
      │                                        ├─ success above low water ─▶ cooldown
      │                                        ├─ nothing to compact ──────▶ cooldown
      │                                        ├─ lock busy elsewhere ─────▶ cooldown, not a failure
      │                                        │    (drain owed: stays owed, backoff, retry_base_s)
      │   pending ── a spending cap holds ─────────────────────────────▶ cooldown until it passes
      │                                        ├─ failure n < breaker ─────▶ backoff (exponential)
      │                                        ├─ failure n ≥ breaker ─────▶ breaker_open
      │                                        └─ committed, drain unfinished ▶ backoff, drain owed
      └── cooldown / backoff / breaker_open expire: the next count re-evaluates

A compaction that committed but did not finish (the folder's fsync after the
swap failed, or moving the turns a late writer appended to the old file) owes
its drain: its next start, whatever the count (even under the threshold, even
with compression off), runs the journal's roll-forward instead of a compaction,
with its own exponential backoff (never the breaker: no model call is at stake,
and until it runs the agent's late turns are missing from its memory). A
restart keeps the drain owed (the restart's own recovery may have failed):
the first run after it finds nothing left to do, or finishes the drain. So
does a journal left unfinished outside the daemon's own jobs
(:func:`on_unfinished_journal`): the recovery of an agent added, or of every
agent at start-up, that failed; another process's compaction (compact-now)
that committed but did not finish.

``disabled`` is an agent with compression off: counted, never compacted.

A count that arrives while a job is pending or running sets ``rerun_requested``
instead of starting a second job; when the job ends, a still-over-threshold
count starts exactly one more (unless hysteresis put the agent in cooldown).
Hysteresis: a compaction that could not bring the file below the low-water
mark goes to cooldown instead of re-triggering at once, so an oversized
summary cannot loop.

Every function takes the current job and returns a :class:`Decision`: the new
job plus what the caller must do (start a compaction now, or wake this agent
up at ``wake_at`` to evaluate again). Times are floats from the caller's clock.

That clock is the wall clock (holds are stored and outlive a restart), and it
may be stepped. A hold with longer still to run than any memd sets in its state
(:meth:`RetryPolicy.longest_hold`) was set before the clock went back: it ends
that longest hold from now, and a last compaction recorded in the future counts
as one just now (:func:`clock_stepped_back`, at each count). A step forward
only ends holds early.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from memd.core.config import DaemonConfig
from memd.core.spending import DAY_S


class JobState(StrEnum):
    IDLE = "idle"
    PENDING = "pending"
    RUNNING = "running"
    COOLDOWN = "cooldown"
    BACKOFF = "backoff"
    BREAKER_OPEN = "breaker_open"
    DISABLED = "disabled"


# How a job state reads in the state DB and in ``memd status --json`` (kept as
# it is for compatibility): a backoff is an error being retried; "error" is also
# an agent whose file cannot be counted.
StoredJobState = Literal[
    "idle", "pending", "running", "cooldown", "breaker_open", "disabled", "error"
]
_STORED: dict[JobState, StoredJobState] = {
    JobState.IDLE: "idle",
    JobState.PENDING: "pending",
    JobState.RUNNING: "running",
    JobState.COOLDOWN: "cooldown",
    JobState.BACKOFF: "error",
    JobState.BREAKER_OPEN: "breaker_open",
    JobState.DISABLED: "disabled",
}
# Stored states whose hold survives a restart (until their next_attempt_at).
_HOLDS: dict[str, JobState] = {
    "cooldown": JobState.COOLDOWN,
    "breaker_open": JobState.BREAKER_OPEN,
    "error": JobState.BACKOFF,
}

# States whose hold ends at ``next_attempt_at``.
_WAITING = frozenset({JobState.COOLDOWN, JobState.BACKOFF, JobState.BREAKER_OPEN})
_BUSY = frozenset({JobState.PENDING, JobState.RUNNING})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    retry_base_s: float = 5.0
    retry_max_s: float = 600.0
    cooldown_s: float = 60.0
    # The least time between two compactions of one agent: appends made
    # during a compaction trigger the next one, no sooner than this.
    min_interval_s: float = 0.0
    breaker_failures: int = 5
    breaker_reset_s: float = 1800.0

    @classmethod
    def from_config(cls, daemon: DaemonConfig) -> RetryPolicy:
        return cls(
            retry_base_s=daemon.retry_base_s,
            retry_max_s=daemon.retry_max_s,
            cooldown_s=daemon.cooldown_s,
            min_interval_s=daemon.min_interval_s,
            breaker_failures=daemon.breaker_failures,
            breaker_reset_s=daemon.breaker_reset_s,
        )

    def longest_hold(self, job: AgentJob) -> float:
        """The longest hold memd sets in the job's state: a cooldown (or a busy
        wait, ``retry_base_s``; a spending cap's: up to a day), a backoff (up to
        ``retry_max_s``; an owed drain's busy wait), an open breaker."""
        if job.state is JobState.COOLDOWN:
            return DAY_S if held_back(job) else max(self.cooldown_s, self.retry_base_s)
        if job.state is JobState.BACKOFF:
            return max(self.retry_max_s, self.retry_base_s)
        if job.state is JobState.BREAKER_OPEN:
            return self.breaker_reset_s
        return max(self.cooldown_s, self.retry_base_s, self.retry_max_s, self.breaker_reset_s)

    def backoff_delay(self, failures: int) -> float:
        """Exponential: base, 2×base, 4×base, … capped at retry_max_s."""
        exponent = max(0, failures - 1)
        # Cap the exponent so huge failure counts do not overflow a float.
        return float(min(self.retry_max_s, self.retry_base_s * (2 ** min(exponent, 60))))


@dataclass(frozen=True, slots=True)
class AgentJob:
    state: JobState = JobState.IDLE
    rerun_requested: bool = False
    consecutive_failures: int = 0
    next_attempt_at: float | None = None
    last_error: str | None = None
    last_compaction_at: float | None = None
    # A committed compaction whose drain is owed (see the module docstring), and
    # how many times finishing it was tried. Stored as the job's last error
    # (:func:`drain_owed_error`): a restart keeps it owed (:func:`restored_job`).
    drain_owed: bool = False
    drain_attempts: int = 0
    # An owed drain only suspected: another process's journal found holding a job
    # (:func:`on_unfinished_journal`), no run has said the late turns are missing
    # (that process may be finishing it). Not stored: a restart's recovery decides.
    drain_suspected: bool = False


IDLE_JOB = AgentJob()


def stored_state(job: AgentJob, count_failed: bool = False) -> StoredJobState:
    """The job's state as stored (an agent whose file cannot be counted is in error)."""
    return "error" if count_failed else _STORED[job.state]


def restored_job(
    stored: str,
    *,
    consecutive_failures: int,
    last_error: str | None,
    last_compaction_at: float | None,
    next_attempt_at: float | None,
    now: float,
) -> AgentJob:
    """The job as a previous run stored it: its history, and a hold (cooldown,
    backoff, open breaker) that has not expired yet."""
    job = AgentJob(
        consecutive_failures=consecutive_failures,
        last_error=last_error,
        last_compaction_at=last_compaction_at,
    )
    if last_error is not None and last_error.startswith(_DRAIN_OWED):
        # Stored while a drain was owed. The restart's recovery ran first, but it
        # may have failed (the disk still full): only a finish run knows. So the
        # drain stays owed, due at once, its error kept (``memd status`` tells the
        # truth meanwhile): the first finish after READY finds an idle journal
        # when recovery did finish it ("nothing left to do", the error cleared),
        # or finishes it, or backs off and retries. Dropped here, the late turns
        # stayed out of MEMORY.md until the agent's next compaction.
        return replace(job, state=JobState.BACKOFF, drain_owed=True, next_attempt_at=now)
    hold = _HOLDS.get(stored)
    if hold is not None and next_attempt_at is not None and next_attempt_at > now:
        return replace(job, state=hold, next_attempt_at=next_attempt_at)
    return job


# Why a file holds nothing to compact though its bytes are there: said the
# same way by the daemon (NOT_COMPACTABLE) and by compact-now.
def unparsable_tail(size: int | None = None) -> str:
    """The bytes after the last complete entry do not parse (``size`` of them)."""
    what = "the bytes" if size is None else f"the {size:,} bytes"
    return (
        f"{what} after the last complete entry cannot be parsed "
        "(they are kept verbatim; fix or remove them)"
    )


_OVER_THRESHOLD = "over its threshold with "
NOT_COMPACTABLE = f"{_OVER_THRESHOLD}nothing to compact: {unparsable_tail()}"


def not_compactable(reason: str | None) -> str:
    """The job's error while its file is over the threshold with nothing to
    compact: ``reason`` as compact-now says it ("nothing to compact (no raw
    entries since the last summary)": a summary block alone over the threshold,
    an older build's or under a lowered one), :data:`NOT_COMPACTABLE` when not
    known."""
    return NOT_COMPACTABLE if reason is None else f"{_OVER_THRESHOLD}{reason}"


def is_not_compactable(error: str | None) -> bool:
    """Whether a job's error is :func:`not_compactable`'s (whatever its reason)."""
    return error is not None and error.startswith(f"{_OVER_THRESHOLD}nothing to compact")


@dataclass(frozen=True, slots=True)
class Decision:
    job: AgentJob
    start: bool = False  # submit a compaction now (job is already PENDING)
    wake_at: float | None = None  # evaluate this agent again at that time


def on_count(
    job: AgentJob,
    tokens: int,
    threshold_tokens: int,
    compress: bool,
    now: float,
    *,
    min_interval_s: float = 0.0,
    policy: RetryPolicy | None = None,
) -> Decision:
    """A fresh token count for the agent arrived: decide whether to compact.

    Over threshold again within ``min_interval_s`` of the last compaction
    (writers outpacing it): the next one starts when the interval is up.
    With ``policy``, a hold longer from ``now`` than any it sets (the wall
    clock went back) is cut to that, a last compaction in the future taken as
    ``now`` (:func:`clock_stepped_back`).
    """
    if job.state in _BUSY:
        if tokens >= threshold_tokens and compress and not job.rerun_requested:
            return Decision(replace(job, rerun_requested=True))
        return Decision(job)
    if policy is not None:
        job = clock_stepped_back(job, now, policy)
    if job.drain_owed:
        # The late turns come first: whatever the count says, finish the drain.
        if job.next_attempt_at is not None and now < job.next_attempt_at:
            return Decision(job, wake_at=job.next_attempt_at)
        return Decision(replace(job, state=JobState.PENDING, rerun_requested=False), start=True)
    if not compress:
        return Decision(replace(job, state=JobState.DISABLED, rerun_requested=False))
    over = tokens >= threshold_tokens
    if not over:
        # Under threshold there is nothing to retry: whatever failed before (a
        # breaker, a backoff) was overcome, e.g. by `memd compact-now` or
        # `memd forget`, so the agent is healthy again.
        if (
            job.state is JobState.IDLE
            and job.next_attempt_at is None
            and job.consecutive_failures == 0
            and job.last_error is None
            and not job.rerun_requested
        ):
            return Decision(job)  # already so: every count of a quiet agent, no new job
        return Decision(
            replace(
                job,
                state=JobState.IDLE,
                next_attempt_at=None,
                consecutive_failures=0,
                last_error=None,
                rerun_requested=False,
            )
        )
    if job.state in _WAITING and job.next_attempt_at is not None and now < job.next_attempt_at:
        return Decision(job, wake_at=job.next_attempt_at)
    if job.last_compaction_at is not None and now < job.last_compaction_at + min_interval_s:
        return Decision(job, wake_at=job.last_compaction_at + min_interval_s)
    return Decision(replace(job, state=JobState.PENDING, rerun_requested=False), start=True)


def clock_stepped_back(job: AgentJob, now: float, policy: RetryPolicy) -> AgentJob:
    """The job with its times made sane after the wall clock went back: a hold
    ending later after ``now`` than the longest the policy sets in its state
    (:meth:`RetryPolicy.longest_hold`) ends that long after it, a last
    compaction after ``now`` is taken as ``now``. Stored so: a hold cut again at
    every count would never end. The job itself when nothing is off (every
    count on a steady clock)."""
    until = job.next_attempt_at
    if until is not None and until - now > (longest := policy.longest_hold(job)):
        job = replace(job, next_attempt_at=now + longest)
    if job.last_compaction_at is not None and job.last_compaction_at > now:
        job = replace(job, last_compaction_at=now)
    return job


def appends_could_reach(appended_bytes: int, tokens: int, threshold_tokens: int) -> bool:
    """Whether bytes appended since the last count may have crossed the threshold.

    A token is at least one byte, so ``appended_bytes`` bytes add at most about
    that many tokens: below the remaining room they cannot cross it, and the
    count may wait for the debounce; at or past it, count at once (a writer that
    never pauses would otherwise be counted only at the debounce ceiling).
    """
    return tokens < threshold_tokens and appended_bytes >= threshold_tokens - tokens


def on_started(job: AgentJob) -> AgentJob:
    return replace(job, state=JobState.RUNNING)


def on_cancelled(job: AgentJob) -> AgentJob:
    """A pending job was dropped before it ran (shutdown): nothing happened."""
    return replace(job, state=JobState.IDLE, rerun_requested=False)


def on_success(
    job: AgentJob,
    *,
    achieved_tokens: int | None,
    current_tokens: int,
    threshold_tokens: int,
    low_water_tokens: int,
    compress: bool,
    policy: RetryPolicy,
    now: float,
) -> Decision:
    """The compaction committed. ``achieved_tokens`` is what it produced from its
    snapshot, ``current_tokens`` the count now (appends made meanwhile included);
    ``compress`` the agent's policy now (a reload may have turned it off meanwhile).

    Cooldown only when the compaction itself could not get below the low-water
    mark; appends made meanwhile mean "compact again", after ``min_interval_s``.
    """
    done = replace(
        job,
        consecutive_failures=0,
        last_error=None,
        last_compaction_at=now,
        rerun_requested=False,
    )
    achieved = current_tokens if achieved_tokens is None else achieved_tokens
    if achieved > low_water_tokens:
        until = now + policy.cooldown_s
        cooled = replace(done, state=JobState.COOLDOWN, next_attempt_at=until)
        return Decision(cooled, wake_at=until if current_tokens >= threshold_tokens else None)
    idle = replace(done, state=JobState.IDLE, next_attempt_at=None)
    return _settled(idle, current_tokens, threshold_tokens, compress, policy, now)


def _settled(
    job: AgentJob,
    current_tokens: int,
    threshold_tokens: int,
    compress: bool,
    policy: RetryPolicy,
    now: float,
) -> Decision:
    """A job back at rest after its work: the count now decides what comes next,
    with the policy's interval and clock-step bounds."""
    return on_count(
        job,
        current_tokens,
        threshold_tokens,
        compress,
        now,
        min_interval_s=policy.min_interval_s,
        policy=policy,
    )


def on_nothing_to_compact(
    job: AgentJob, *, policy: RetryPolicy, now: float, reason: str | None = None
) -> Decision:
    """Over threshold but no raw entries since the last summary: wait, don't loop.

    Still an error for the operator: the file is over its threshold and memd
    cannot shrink it; ``reason`` says why (:func:`not_compactable`): bytes after
    the last entry that do not parse, a summary block alone over the threshold.
    """
    until = now + policy.cooldown_s
    return Decision(
        replace(
            job,
            state=JobState.COOLDOWN,
            next_attempt_at=until,
            rerun_requested=False,
            last_error=not_compactable(reason),
        ),
        wake_at=until,
    )


def on_busy_elsewhere(job: AgentJob, reason: str, *, policy: RetryPolicy, now: float) -> Decision:
    """Another process (compact-now, forget, prune, a second daemon) held the agent's
    lock: try again after ``retry_base_s``. Not a failure: no backoff, no breaker,
    and it reads as a wait with its reason (a cooldown, as a spending hold does),
    never as the ``error`` a backoff is stored as; the failures so far are kept.

    With a drain owed, the job keeps its owed shape (backoff, the marker in its
    error, the attempts so far, none counted): a restart finds the drain owed
    only through the stored marker (:func:`restored_job`), and ``memd status``
    must keep saying the late turns are missing. A "busy" that replaced it hid
    them from the operator and lost the drain at a restart whose recovery failed.
    A drain only suspected (another process's journal found holding a job,
    :func:`on_unfinished_journal`, no run has said the late turns are missing)
    stays owed but reads as the plain busy wait: that process is at work (a
    compact-now draining), usually finishing the job itself; were it to leave
    it unfinished, the next try (or a restart's recovery) finds so.
    """
    until = now + policy.retry_base_s
    if job.drain_owed and not job.drain_suspected:
        return Decision(
            replace(
                job,
                state=JobState.BACKOFF,
                next_attempt_at=until,
                last_error=drain_owed_error(f"{_BUSY_ELSEWHERE}{reason}"),
                rerun_requested=False,
            ),
            wake_at=until,
        )
    return Decision(
        replace(
            job,
            state=JobState.COOLDOWN,
            next_attempt_at=until,
            last_error=f"{_BUSY_ELSEWHERE}{reason}",
            rerun_requested=False,
        ),
        wake_at=until,
    )


_BUSY_ELSEWHERE = "busy: "


def on_held(job: AgentJob, reason: str, *, until: float) -> Decision:
    """A spending cap holds the compaction back until ``until`` (not a failure: no
    backoff, no breaker); the next count after that time starts it."""
    return Decision(
        replace(
            job,
            state=JobState.COOLDOWN,
            next_attempt_at=until,
            last_error=f"{_HELD_BACK}{reason}",
            rerun_requested=False,
        ),
        wake_at=until,
    )


_HELD_BACK = "held back: "


def cooldown_left(job: AgentJob, now: float, policy: RetryPolicy | None = None) -> float | None:
    """How long the job's cooldown still lasts, when memd compacts the file again
    as it ends (a count over the threshold then starts one): after a compaction
    that ended above the low-water mark, while another process holds the lock,
    while a spending cap holds it back. None otherwise: no cooldown, or one after
    nothing to compact (the next try finds nothing either). With ``policy``,
    never more than the hold is cut to at the next count (the wall clock went
    back, :func:`clock_stepped_back`)."""
    if job.state is not JobState.COOLDOWN or job.next_attempt_at is None:
        return None
    if is_not_compactable(job.last_error):
        return None
    until = job.next_attempt_at
    if policy is not None:
        until = min(until, now + policy.longest_hold(job))
    return max(0.0, until - now)


def held_back(job: AgentJob) -> bool:
    """Whether a spending cap holds this job back (:func:`on_held`)."""
    return job.state is JobState.COOLDOWN and (job.last_error or "").startswith(_HELD_BACK)


def on_hold_moved(job: AgentJob, *, until: float) -> Decision:
    """A spending cap's hold ends sooner than it said (a compaction running beside
    it was settled to fewer calls than it reserved): the same hold, to ``until``."""
    return Decision(replace(job, next_attempt_at=until), wake_at=until)


def on_failure(job: AgentJob, error: str, *, policy: RetryPolicy, now: float) -> Decision:
    failures = job.consecutive_failures + 1
    if failures >= policy.breaker_failures:
        state = JobState.BREAKER_OPEN
        until = now + policy.breaker_reset_s
    else:
        state = JobState.BACKOFF
        until = now + policy.backoff_delay(failures)
    failed = replace(
        job,
        state=state,
        consecutive_failures=failures,
        next_attempt_at=until,
        last_error=error,
        rerun_requested=False,
    )
    return Decision(failed, wake_at=until)


_DRAIN_OWED = "late turns not yet in MEMORY.md"


def drain_owed_error(reason: str) -> str:
    """The job's last error while its drain is owed (``memd status`` shows it)."""
    return f"{_DRAIN_OWED} (memd is finishing the compaction from its journal): {reason}"


def on_drain_owed(
    job: AgentJob, error: str, *, policy: RetryPolicy, now: float, committed: bool = False
) -> Decision:
    """A compaction committed but did not finish (``committed``: it just did), or
    finishing it failed again: the drain is tried again after an exponential
    backoff (``retry_base_s`` doubling up to ``retry_max_s``, never the breaker).
    The compaction did commit: it counts as one (``last_compaction_at``), not as a
    model failure (no fallback summarizer, no breaker)."""
    attempts = 1 if committed else job.drain_attempts + 1
    until = now + policy.backoff_delay(attempts)
    owed = replace(
        job,
        state=JobState.BACKOFF,
        drain_owed=True,
        drain_suspected=False,
        drain_attempts=attempts,
        next_attempt_at=until,
        last_error=error,
        last_compaction_at=now if committed else job.last_compaction_at,
        rerun_requested=False,
    )
    return Decision(owed, wake_at=until)


def on_unfinished_journal(
    job: AgentJob, recovery_error: str | None, *, policy: RetryPolicy, now: float
) -> AgentJob:
    """The agent's journal holds a job none of the daemon's own left: the drain is
    owed (the caller decides on the job returned, :func:`on_count`, which starts
    the finish when it is due).

    ``recovery_error``: the daemon's own recovery of it just failed (an agent
    added, a start-up): tried again after the backoff, the reason shown
    meanwhile. None: another process's compaction left it, and may still be at
    work (compact-now draining, or retrying): tried at once, and no error shown
    until a run says one (a lock held reads as busy, :func:`on_busy_elsewhere`;
    a job since finished as nothing left to do). Not stored as owed: a restart
    in between runs recovery, whose failure owes the drain again. A job pending
    or running, or a drain already owed, is left as it is (its own run reads the
    journal)."""
    if job.state in _BUSY or job.drain_owed:
        return job
    if recovery_error is not None:
        return on_drain_owed(job, drain_owed_error(recovery_error), policy=policy, now=now).job
    return replace(
        job,
        state=JobState.BACKOFF,
        drain_owed=True,
        drain_suspected=True,
        drain_attempts=0,
        next_attempt_at=now,
        rerun_requested=False,
    )


def on_drain_finished(
    job: AgentJob,
    *,
    current_tokens: int,
    threshold_tokens: int,
    compress: bool,
    policy: RetryPolicy,
    now: float,
) -> Decision:
    """The owed drain is done (the late turns are in MEMORY.md): the job is as after
    a compaction, and the count now (the late turns included) decides what next."""
    done = replace(
        job,
        state=JobState.IDLE,
        drain_owed=False,
        drain_suspected=False,
        drain_attempts=0,
        next_attempt_at=None,
        last_error=None,
        rerun_requested=False,
    )
    return _settled(done, current_tokens, threshold_tokens, compress, policy, now)


class Wakes:
    """When each agent is evaluated again (a :class:`Decision`'s ``wake_at``): one
    time per agent, the latest decision's. Not thread-safe: the runner guards it
    with its lock; the counter takes the due ones at its tick and sleeps until the
    next, so a wake-up needs no scheduler job and no hint.

    Times are the wall clock's: when ``now`` is earlier than a ``now`` seen
    before (the clock went back), every wake-up set is due, to be decided again
    on the clock as it now reads (:func:`clock_stepped_back`); kept, they came
    the step's length late."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []  # with stale times, skipped when met
        self._seen = -math.inf  # the latest ``now`` taken

    def set(self, name: str, when: float) -> None:
        if self._at.get(name) == when:
            return  # every count during a hold says the same time again
        self._at[name] = when
        heapq.heappush(self._heap, (when, name))

    def drop(self, name: str) -> None:
        self._at.pop(name, None)

    def pop_due(self, now: float) -> list[str]:
        due: list[str] = []
        stepped_back = now < self._seen
        self._seen = now
        if stepped_back:
            due = sorted(self._at)
            self._at.clear()
            self._heap.clear()
            return due
        while self._heap and self._heap[0][0] <= now:
            when, name = heapq.heappop(self._heap)
            if self._at.get(name) == when:
                del self._at[name]
                due.append(name)
        return due

    def next(self) -> float | None:
        heap = self._heap
        while heap and self._at.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None


__all__ = [
    "IDLE_JOB",
    "AgentJob",
    "Decision",
    "JobState",
    "RetryPolicy",
    "StoredJobState",
    "Wakes",
    "clock_stepped_back",
    "drain_owed_error",
    "held_back",
    "is_not_compactable",
    "not_compactable",
    "on_busy_elsewhere",
    "on_cancelled",
    "on_count",
    "on_drain_finished",
    "on_drain_owed",
    "on_failure",
    "on_held",
    "on_hold_moved",
    "on_nothing_to_compact",
    "on_started",
    "on_success",
    "on_unfinished_journal",
    "restored_job",
    "stored_state",
]
