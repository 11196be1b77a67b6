"""What every daemon service shares: an agent's entry and the one way to count it.

An :class:`AgentEntry` is owned by the registry (which agents exist); its
count is written only through :class:`EntryCounter` under the entry's
``count_lock``, and its job state only by the runner under the runner's lock.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple, Protocol

from memd.compaction import journal_unfinished
from memd.core.config import AgentPolicy
from memd.core.jobs import IDLE_JOB, AgentJob, JobState
from memd.core.tokens import DEFAULT_MAX_PIECE_BYTES, JUNCTION_CUT_ENCODINGS
from memd.counting import CountKind, CountResult, TrackedCount, count_fd
from memd.errors import MemdError, describe_error
from memd.logs import debug_check, get_logger
from memd.workspace import AgentPaths, ArchiveStats, FolderFacts, check_memory_link, open_memory

if TYPE_CHECKING:
    from memd.metrics import Metrics

RUNNING = JobState.RUNNING
_LOGGER = "memd.daemon"
_log = get_logger(_LOGGER)
_debug = debug_check(_LOGGER)


class Counted(Enum):
    """What one count of an agent's MEMORY.md found (returned to the caller, who acts)."""

    COUNTED = "counted"
    MISSING = "missing"  # no MEMORY.md: counted as empty (its memory may have been erased)
    FAILED = "failed"  # unreadable or refused: the entry carries the error, retried later


class UnfinishedJournal(NamedTuple):
    """An agent's compaction journal found holding a job that none of this runner's
    jobs left (the runner takes it at its next decision and owes the drain: its
    finish job runs recovery's roll-forward, :mod:`memd.core.jobs`)."""

    # Why this daemon's own recovery of it failed (the agent added, or the daemon
    # started): retried after the backoff, the reason shown meanwhile. None: another
    # process's compaction (compact-now) left it, which may still be at work: a
    # finish is tried at once (a lock held reads as busy, a job done as nothing
    # left to do), so a compaction that ended well never reads as an error.
    recovery_error: str | None


class CountUpdate(NamedTuple):
    """One count made, as published on :attr:`EntryCounter.updates` (benchmarks read it)."""

    agent: str
    tokens: int
    size: int | None  # bytes counted (None: no MEMORY.md)
    at: float  # wall-clock time the count was made


class Tokenizer(Protocol):
    def count_bytes(self, data: bytes) -> int: ...

    def count_text(self, text: str) -> int: ...


@dataclass(slots=True, eq=False)
class AgentEntry:
    name: str
    paths: AgentPaths
    policy: AgentPolicy
    tracked: TrackedCount | None = None
    job: AgentJob = IDLE_JOB  # a value (frozen): one for every agent that starts idle
    count_error: str | None = None
    dirty: bool = True
    burst_started: float | None = None  # monotonic time of the first unhandled event
    may_need_recovery: bool = True
    # A count skipped while the agent's job ran (a MEMORY.md of another inode: the
    # job's new file, or one put there meanwhile), for the runner to count once the
    # job has ended (:meth:`EntryCounter.count_skipped`); written under count_lock.
    count_skipped: bool = False
    # The tokenizer ``tracked`` was made with (None: unknown); written with it, under
    # count_lock. A reload swaps the counter's tokenizer before it resets each
    # entry's count: a job takes the count only when the two still match.
    counted_with: Tokenizer | None = None
    # A journal left unfinished outside this runner's jobs (the registry's recovery
    # failed; a count found MEMORY.md replaced by another process while its journal
    # holds a job), for the runner to take at its next decision. Set by the registry
    # before the entry is registered, or by a count (under count_lock); taken by the
    # runner under its lock (the finish job it starts reads the journal afresh).
    unfinished_journal: UnfinishedJournal | None = None
    # archive/ as last surveyed (memd.daemon.archives); None until then.
    archives: ArchiveStats | None = None
    # The folder as listed at start-up (stored, so the next restart need not list it).
    folder: FolderFacts | None = None
    # When another process was first found holding the agent's lock, in the runner's
    # clock (None: not since the last compaction attempt that got the lock), and
    # whether that has been said as a warning; written under the runner's lock.
    busy_since: float | None = None
    busy_seen_at: float = 0.0  # the last busy retry (a long gap starts a new run of them)
    busy_warned: bool = False
    count_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def tokens(self) -> int:
        return 0 if self.tracked is None else self.tracked.tokens


@dataclass(slots=True)
class ExitState:
    """The daemon's exit flags, one small object (uvicorn's ``ServerState``): the
    lifecycle owns it and its signal rule sets them; the services that must stop
    early (the start-up count) read them. Plain attributes: a signal handler
    takes no lock."""

    should_exit: bool = False  # stop: SIGTERM, or a first SIGINT
    force_exit: bool = False  # a second SIGINT: in-flight compactions abort


@dataclass(slots=True)
class RunStats:
    """The runner's figures (changed under the runner's lock), read by the flusher
    for ``STATUS=`` and the heartbeat (one read each, no lock)."""

    running: set[str] = field(default_factory=set)
    compactions_ok: int = 0
    compactions_failed: int = 0


class _CountFailed(MemdError):
    """A count that failed in a scan worker process (the reason travels as text)."""


def check_contained(entry: AgentEntry) -> None:
    check_memory_link(entry.paths)  # per agent: never into another agent's folder


def changed_on_disk(entry: AgentEntry) -> bool:
    """Whether a stat of MEMORY.md differs from what the entry last counted."""
    try:
        info = os.stat(entry.paths.memory_fspath())
    except FileNotFoundError:
        return entry.tracked is not None
    except OSError:
        return True
    tracked = entry.tracked
    if tracked is None:
        return True
    state = tracked.state
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != (
        state.dev,
        state.ino,
        state.size,
        tracked.mtime_ns,
    )


def _replaced_elsewhere(entry: AgentEntry, previous: TrackedCount, now: TrackedCount) -> None:
    """A count found MEMORY.md of another inode than the last, outside this runner's
    jobs (their file is counted ``after_job``): the agent rewrote it, or another
    process compacted it (compact-now, forget). A compaction that committed there
    but did not finish (the late turns still in ``.memd/drain.md``) left its
    journal holding the job: noted for the runner, which finishes it. Only here,
    on an inode change, is the journal read: an append keeps the inode and costs
    no syscall more."""
    if (previous.state.dev, previous.state.ino) == (now.state.dev, now.state.ino):
        return
    try:
        unfinished = journal_unfinished(entry.paths)
    except (OSError, MemdError) as exc:
        # Unreadable: nothing to tell. The agent's next compaction (or a restart)
        # runs recovery, which reports it.
        _log.debug(
            "cannot read the compaction journal", agent=entry.name, error=describe_error(exc)
        )
        return
    if unfinished:
        entry.unfinished_journal = UnfinishedJournal(None)


class EntryCounter:
    """Counts one agent's MEMORY.md into its entry (the counter's and the runner's
    one way to do it); publishes the figure to metrics and, when given a queue,
    each count made on ``updates`` (nobody is called back: a reader drains it)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        updates: queue.SimpleQueue[CountUpdate] | None = None,
        max_piece_bytes: int = DEFAULT_MAX_PIECE_BYTES,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_piece_bytes = max_piece_bytes
        self.metrics: Metrics | None = None
        self.updates = updates

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        # Whether the encoding lets an old tail settle without being tokenized
        # again (:func:`memd.core.tokens.is_junction_cut`): decided once, not per count.
        self.junction_cut = getattr(tokenizer, "encoding_name", None) in JUNCTION_CUT_ENCODINGS

    def count_locked(
        self,
        entry: AgentEntry,
        *,
        after_job: bool = False,
        seed: TrackedCount | None = None,
        seed_tokenizer: Tokenizer | None = None,
    ) -> Counted:
        """:meth:`count` under the entry's count lock.

        While the agent's compaction runs, a MEMORY.md of another inode than the
        entry's count is the job's new file (or one the agent put there, which
        ends the job): it is left to the runner's count when the job has ended
        (``after_job``), which counts on from the job's own count of the file it
        wrote (``seed``) instead of tokenizing the whole new file. The seed is
        used only when it was made with the tokenizer in use now
        (``seed_tokenizer``, the one the job was given): after a reload that
        changed the encoding the new file is counted from scratch, never a count in
        one encoding extended in another. A count skipped while the job ran is
        left flagged (:attr:`AgentEntry.count_skipped`) for :meth:`count_skipped`.
        """
        with entry.count_lock:
            return self.count(entry, after_job=after_job, seed=seed, seed_tokenizer=seed_tokenizer)

    def job_count(self, entry: AgentEntry) -> tuple[Tokenizer, TrackedCount | None]:
        """What a compaction starts from: the tokenizer in use now and the entry's count
        when it was made with that tokenizer (None otherwise: a reload changed the
        encoding and has not reset this entry's count yet; the job counts afresh)."""
        with entry.count_lock:
            tokenizer = self.tokenizer
            return tokenizer, entry.tracked if entry.counted_with is tokenizer else None

    def count_skipped(self, entry: AgentEntry) -> Counted | None:
        """The count the counting thread skipped while the agent's job ran, made now
        (the runner calls it once the job has left RUNNING: a file replaced after
        the runner's own count would otherwise wait for the next event); None when
        none was skipped since the last count."""
        with entry.count_lock:
            if not entry.count_skipped:
                return None
            return self.count(entry)

    def count(
        self,
        entry: AgentEntry,
        precounted: CountResult | None = None,
        *,
        after_job: bool = False,
        seed: TrackedCount | None = None,
        seed_tokenizer: Tokenizer | None = None,
    ) -> Counted:
        """Update the entry's count; ``FAILED`` (logged once) when the file cannot be
        counted, ``MISSING`` when it is gone (the caller tells the runner).

        The caller holds ``entry.count_lock``.
        """
        tokenizer = self.tokenizer  # one tokenizer for the whole count (a reload swaps it)
        if seed_tokenizer is not tokenizer:
            seed = None  # made in another encoding (or by no known tokenizer)
        entry.count_skipped = False  # this count sees the file as it is now (or skips again)
        started = entry.burst_started
        entry.burst_started = None
        before = entry.tokens
        previous_count = entry.tracked
        counted = Counted.COUNTED
        try:
            if precounted is not None:
                tracked, kind, failure = precounted
                if failure is not None:
                    raise _CountFailed(failure)
            else:
                fd = open_memory(entry.paths)  # contained: checked as it is opened
                try:
                    previous = entry.tracked
                    if previous is not None and not after_job and entry.job.state is RUNNING:
                        info = os.fstat(fd)
                        if (info.st_dev, info.st_ino) != (previous.state.dev, previous.state.ino):
                            # The job's new file: counted when it has ended (the
                            # runner's count, or count_skipped after it).
                            entry.count_skipped = True
                            return counted
                    if seed is not None and (
                        previous is None
                        or (previous.state.dev, previous.state.ino)
                        != (seed.state.dev, seed.state.ino)
                    ):
                        previous = seed
                    tracked, kind = count_fd(
                        fd,
                        entry.paths.memory,
                        previous,
                        tokenizer.count_bytes,
                        max_piece_bytes=self.max_piece_bytes,
                        junction_cut=self.junction_cut,
                    )
                finally:
                    os.close(fd)
                if seed is not None and previous is seed:
                    kind = CountKind.RECOUNTED  # a new file for the entry, whatever the count
        except FileNotFoundError:
            tracked, kind = None, CountKind.RECOUNTED
            counted = Counted.MISSING
        except (OSError, MemdError, ValueError) as exc:
            reason = describe_error(exc)
            if entry.count_error != reason:
                _log.warning("cannot count MEMORY.md; will retry", agent=entry.name, error=reason)
            entry.count_error = reason
            entry.tracked = None
            entry.dirty = True
            return Counted.FAILED
        if not after_job and tracked is not None and previous_count is not None:
            _replaced_elsewhere(entry, previous_count, tracked)
        if entry.count_error is not None:
            _log.info("MEMORY.md readable again", agent=entry.name)
        entry.count_error = None
        entry.tracked = tracked
        entry.counted_with = tokenizer
        if kind is not CountKind.UNCHANGED or entry.tokens != before:
            entry.dirty = True
        if (kind is CountKind.RECOUNTED or entry.tokens != before) and _debug():
            _log.debug("counted", agent=entry.name, tokens=entry.tokens, kind=str(kind))
        if self.metrics is not None:
            self.metrics.set_agent(entry.name, entry.tokens, entry.policy.threshold_tokens)
            if started is not None:
                self.metrics.set_watcher_lag(time.monotonic() - started)
        if self.updates is not None:
            size = None if tracked is None else tracked.size
            self.updates.put(CountUpdate(entry.name, entry.tokens, size, time.time()))
        return counted


__all__ = [
    "AgentEntry",
    "CountUpdate",
    "Counted",
    "EntryCounter",
    "RunStats",
    "Tokenizer",
    "UnfinishedJournal",
    "changed_on_disk",
    "check_contained",
]
