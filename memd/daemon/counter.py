"""Hints in, counts out: the watcher's hints arrive on a queue, are debounced, and
each due agent is counted and handed to the runner.

The counter reads its queue and drives nothing upstream: an ``agents`` hint
makes the registry rescan (the watch service, :mod:`memd.daemon.watches`,
follows the published agent set; the counter never touches the watcher).

One step is :meth:`CountService.tick` (celery beat's shape): take the queued
hints and the runner's due wake-ups (a backoff, a cooldown... over: the runner
keeps their times, the counter asks; nothing is put back on this queue), count
what is due at ``now``, return when the next thing is due. The
service thread only sleeps until then or until a hint arrives, so tests drive
``tick`` with a made-up clock and a scripted compaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

from memd.core.config import TriggerConfig
from memd.core.debounce import Debouncer
from memd.core.jobs import JobState, appends_could_reach
from memd.core.plan import FileFacts, StoredCountTrust, stored_count_trust
from memd.counting import CountJob, count_many, fitting_marks, pool_workers, worker_count
from memd.daemon.entries import (
    AgentEntry,
    Counted,
    EntryCounter,
    ExitState,
    Tokenizer,
    changed_on_disk,
    check_contained,
)
from memd.daemon.flusher import StateFlusher
from memd.daemon.registry import AgentRegistry
from memd.daemon.runner import Runner
from memd.errors import MemdError
from memd.logs import get_logger

if TYPE_CHECKING:
    from memd.state import AgentRecord

_log = get_logger("memd.daemon")

# The longest the service thread sleeps without a hint (it re-checks stopping).
_MAX_WAIT_S = 1.0
# A count runs this long after its debounce deadline, so the counts due within it
# run in one tick instead of one wake-up each (each a cold start for the tokenizer
# and the Python around it). Late by at most this, never early; a live flush or a
# runner's wake-up waits for no slack. Bounded by the event -> count target
# (debounce + 50 ms, of which the inotify reader's batching takes 20 ms): 25 ms
# put its p99 at 546 ms of 550.
_COALESCE_S = 0.01
# An agent's memd-agent.json is re-read at most once in this long (its changes
# meanwhile are read together at its end). A descriptor may hold 1 MiB of reserved
# text to count: an agent rewriting it in a loop kept this thread re-reading it,
# hint after hint, and no other agent was counted (nor compacted) while it went on.
WINDOW_REREAD_S = 1.0


class HintKind(StrEnum):
    MEMORY = "memory"  # the agent's MEMORY.md changed: count after the debounce
    DESCRIPTOR = "descriptor"  # its memd-agent.json changed: re-read the window, count
    AGENTS = "agents"  # something changed in agents/: reconcile the agent set
    COUNT_NOW = "count_now"  # count the agent at once (a wake-up, a new agent)
    RECONCILE = "reconcile"  # the periodic sweep is due: rescan agents, stat MEMORY.md files
    WAKE = "wake"  # nothing to do: wake the service thread (shutdown)


_FILE_HINTS = frozenset((HintKind.MEMORY, HintKind.DESCRIPTOR))


class Hint(NamedTuple):
    kind: HintKind
    name: str | None
    at: float  # monotonic time the hint was given


class HintSink:
    """The put side of the counter's queue: each watcher event (and each count the
    watch service asks for, the periodic reconcile's tick) becomes a hint on it."""

    def __init__(
        self, inbox: queue.SimpleQueue[Hint], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._inbox = inbox
        self._clock = clock

    @property
    def inbox(self) -> queue.SimpleQueue[Hint]:
        return self._inbox

    def agents_changed(self, name: str | None) -> None:
        self._inbox.put(Hint(HintKind.AGENTS, name, self._clock()))

    def memory_changed(self, agent: str) -> None:
        self._inbox.put(Hint(HintKind.MEMORY, agent, self._clock()))

    def descriptor_changed(self, agent: str) -> None:
        self._inbox.put(Hint(HintKind.DESCRIPTOR, agent, self._clock()))

    def count_now(self, agent: str) -> None:
        self._inbox.put(Hint(HintKind.COUNT_NOW, agent, self._clock()))

    def reconcile_due(self) -> None:
        """The periodic job's tick: the sweep itself runs on the count thread."""
        self._inbox.put(Hint(HintKind.RECONCILE, None, self._clock()))


def _appends_could_reach(entry: AgentEntry) -> bool:
    # One stat per event: cheap next to the count it may save from waiting.
    if entry.tracked is None:
        return False
    try:
        size = os.stat(entry.paths.memory_fspath()).st_size
    except OSError:
        return False
    return appends_could_reach(
        size - entry.tracked.size, entry.tokens, entry.policy.threshold_tokens
    )


# A MEMORY.md this large takes seconds to count from scratch (about 5 MB/s per
# core): it is counted after READY, so one agent never holds the fleet's
# readiness back, and later in the background (one at a time), so it never
# holds every other agent's counts on the count thread.
SLOW_COUNT_BYTES = 16 << 20


def _memory_stat(entry: AgentEntry) -> os.stat_result | None:
    """MEMORY.md's stat, for judging whether counting it is slow; None when the
    count would fail at once (gone, unreadable, or a symlink out of the agent's
    folder, which the count refuses rather than follows: a refused link to a
    large file is no slow count, only a fast failure)."""
    path = entry.paths.memory_fspath()
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            check_contained(entry)  # the count's own check (a realpath; links are rare)
            info = os.stat(path)
    except (OSError, MemdError):
        return None
    return info


def _slow_to_count(entry: AgentEntry) -> bool:
    info = _memory_stat(entry)
    return info is not None and info.st_size > SLOW_COUNT_BYTES


def _slow_recount(entry: AgentEntry) -> bool:
    """Whether counting ``entry`` now would tokenize a file above
    :data:`SLOW_COUNT_BYTES` from scratch, judged from a stat against what the
    entry last counted (the count itself decides the same way: no count, another
    inode, or a file shorter than counted). An append to a large file counted
    before is a few KB of work and stays on the count thread; a rewrite in place
    that keeps the inode and grows shows only to the count (its window digest).
    A large file whose count failed (EACCES, EIO) is retried in the background
    too, at the reconcile: readable again, its count from scratch must not hold
    every other agent's (the background count asks for no count after a failure,
    so the retry waits for the reconcile, as every failed count's)."""
    info = _memory_stat(entry)
    if info is None:
        return False  # the count reports it (gone, refused), at once
    if info.st_size <= SLOW_COUNT_BYTES:
        return False
    tracked = entry.tracked
    if tracked is None:
        return True
    state = tracked.state
    if (state.dev, state.ino) != (info.st_dev, info.st_ino):
        # While the agent's job runs, another inode is the job's new file: the
        # count skips it (the runner counts it from the job's own count).
        return entry.job.state is not JobState.RUNNING
    return info.st_size < state.size


def _new_debouncer(trigger: TriggerConfig) -> Debouncer[str]:
    return Debouncer(trigger.debounce_ms / 1000, trigger.max_wait_ms / 1000)


class CountService:
    def __init__(
        self,
        trigger: TriggerConfig,
        encoding: str,
        registry: AgentRegistry,
        counter: EntryCounter,
        runner: Runner,
        flusher: StateFlusher,
        *,
        pool_allowed: bool,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        exiting: ExitState | None = None,
    ) -> None:
        # ``clock`` stamps the hints (debouncing), ``wall_clock`` is the runner's
        # (its wake-up times): tests pass made-up ones and call tick() themselves.
        self.sink = HintSink(queue.SimpleQueue(), clock)
        self._wall_clock = wall_clock
        self.inbox = self.sink.inbox
        self.encoding = encoding
        self._registry = registry
        self._counter = counter
        self._runner = runner
        self._flusher = flusher
        self._pool_allowed = pool_allowed
        # The daemon's exit flags (SIGTERM during the start-up count), read here.
        self._exiting = ExitState() if exiting is None else exiting
        self._debouncer: Debouncer[str] = _new_debouncer(trigger)
        self._count_now: set[str] = set()
        # Agents whose memd-agent.json changed, re-read by the tick (not while hints
        # are taken), and until when (monotonic) each was last re-read is held.
        self._windows_due: set[str] = set()
        self._window_held: dict[str, float] = {}
        self._rescan = False
        self._reconcile_due = False
        # The reconcile due stats every MEMORY.md even when files_polled: agents/
        # was replaced (the poller's held files are the old tree's) or an event
        # queue overflowed.
        self._reconcile_files = False
        self._flush_pending = False  # counts changed since the last live flush
        self._count_due: float | None = None  # the next debounce deadline, as of the last tick
        self._state_lock = threading.Lock()  # debouncer, count_now, rescan, reconcile_due
        self._thread: threading.Thread | None = None
        self._stopping = False
        # Agents counted from scratch in the background, one at a time: large
        # files after READY (count_later) and large recounts found due in a tick.
        # Queued or being counted; the tick leaves them alone meanwhile.
        self._counting_later: set[str] = set()
        self._later_queue: deque[tuple[AgentEntry, str]] = deque()
        self._later: threading.Thread | None = None  # running while the queue is worked
        # Set by the wiring when the watcher polls (``--poll``, ``[watch] poll``):
        # the poller checks every MEMORY.md each poll interval (its size, or its
        # path) and stats each path within ``memd.poller.VERIFY_S``, so the
        # reconcile's own stat of each one every ``reconcile_s`` would only repeat it.
        self.files_polled = False

    # ---------------------------------------------------------------- service

    def start(self, stack: contextlib.ExitStack) -> None:
        """Start the count thread; its stop is pushed on ``stack``."""
        self._thread = threading.Thread(target=self._loop, name="memd-count", daemon=True)
        self._thread.start()
        stack.callback(self.stop)

    def stop(self, timeout: float = 10) -> None:
        """Stop the count thread and the background count of large files (it stops
        between two files), each joined within ``timeout`` seconds in all."""
        self._stopping = True
        self.inbox.put(Hint(HintKind.WAKE, None, time.monotonic()))
        deadline = time.monotonic() + timeout
        for thread in (self._thread, self._later):
            if thread is not None:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def tokenizer(self) -> Tokenizer:
        return self._counter.tokenizer

    def request_count(self, agent: str) -> None:
        """Count ``agent`` at once (a wake-up, a new or re-watched agent)."""
        self.sink.count_now(agent)

    def _loop(self) -> None:
        while not self._stopping:
            try:
                due = self.tick(time.monotonic())
                self.gather(due, time.monotonic, self.slack(due))
            except Exception:
                _log.exception("counting loop error")
                time.sleep(0.5)

    def slack(self, due: float | None) -> float:
        """How late the next tick may run: :data:`_COALESCE_S` when ``due`` (from
        :meth:`tick`) is a debounce deadline, so the counts due just after it run in
        the same tick; none for a live flush or a runner's wake-up."""
        return _COALESCE_S if due is not None and due == self._count_due else 0.0

    def gather(self, due: float | None, clock: Callable[[], float], slack: float = 0.0) -> None:
        """Take hints off the queue until ``due`` (the next tick's time, from
        :meth:`tick`) or until one needs a tick sooner; returns when the next tick
        should run. A write only moves the agent's debounce deadline: the thread
        takes it and sleeps on (no tick per inotify batch), so the counts due
        together run in one tick. Sleeps at most ``_MAX_WAIT_S`` (re-checks
        stopping, and a wake-up a compaction set meanwhile)."""
        now = clock()
        wake = now + _MAX_WAIT_S if due is None else min(due + slack, now + _MAX_WAIT_S)
        while not self._stopping:
            timeout = wake - clock()
            if timeout <= 0:
                return
            try:
                hint = self.inbox.get(timeout=timeout)
            except queue.Empty:
                return
            needed = self._take(hint)
            # A debounce deadline takes the slack; a hint wanting a tick now does not.
            wake = min(wake, needed + (_COALESCE_S if needed > hint.at else 0.0))

    def _take(self, hint: Hint) -> float:
        """Record ``hint``; returns when it needs a tick (its debounce deadline, or
        its own time: at once)."""
        with self._state_lock:
            if hint.kind is HintKind.AGENTS and hint.name is None:
                # Anything may have changed unseen (an inotify queue overflow,
                # agents/ itself replaced): the whole reconcile, files included
                # (with --poll too: what the poller holds may be the old tree's).
                self._reconcile_due = self._reconcile_files = True
            elif hint.kind is HintKind.AGENTS:
                self._rescan = True
            elif hint.kind is HintKind.RECONCILE:
                self._reconcile_due = True
            elif hint.kind is HintKind.COUNT_NOW and hint.name is not None:
                self._count_now.add(hint.name)
            elif hint.kind is HintKind.DESCRIPTOR and hint.name is not None:
                # Read by the next tick (only then: a stat per append, of a file
                # most agents lack, was a tenth of the per-append cost), once its
                # hold is over: never here, where the hints behind it wait.
                self._windows_due.add(hint.name)
                return max(hint.at, self._window_held.get(hint.name, hint.at))
            elif hint.kind in _FILE_HINTS and hint.name is not None:
                return self._file_changed(hint.name, hint.at)
        return hint.at

    def _file_changed(self, name: str, at: float) -> float:
        """The agent's MEMORY.md (or window) changed at ``at``: count it now when
        appends could reach its threshold, else after the debounce (under the
        state lock); returns when that count is due."""
        entry = self._registry.get(name)
        if entry is not None and _appends_could_reach(entry):
            # A writer that never pauses would otherwise be counted
            # only at the debounce ceiling, thousands of tokens late.
            self._count_now.add(name)
            return at
        if entry is not None and entry.burst_started is None:
            entry.burst_started = at
        return self._debouncer.touch(name, at)

    def _refresh_windows(self, now: float) -> float | None:
        """Re-read the windows of the agents whose memd-agent.json changed, each at
        most once per :data:`WINDOW_REREAD_S`, then count them as a MEMORY.md change
        would; returns when the next held one is due (None: none waits)."""
        with self._state_lock:
            if not self._windows_due:
                return None
            for name in [name for name, until in self._window_held.items() if until <= now]:
                del self._window_held[name]
            ready = [name for name in self._windows_due if name not in self._window_held]
            self._windows_due.difference_update(ready)
        for name in ready:
            if self._stopping:
                break
            self._registry.refresh_window(name)
            with self._state_lock:
                self._window_held[name] = now + WINDOW_REREAD_S
                self._file_changed(name, now)
        with self._state_lock:
            held = [self._window_held[name] for name in self._windows_due]
        return min(held) if held else None

    def tick(self, now: float) -> float | None:
        """Take the queued hints and the runner's due wake-ups, count every agent due
        at ``now`` (monotonic) and hand each to the runner; returns when the next
        debounced count, live flush or wake-up is due."""
        while True:
            try:
                self._take(self.inbox.get_nowait())
            except queue.Empty:
                break
        window_at = self._refresh_windows(now)
        # A wake-up is counted first, then decided, like a hint asking for a count now.
        wall = self._wall_clock()
        woken = self._runner.take_wakes(wall)
        with self._state_lock:
            self._count_now.update(woken)
            due = self._debouncer.pop_due(now)
            if self._count_now:
                due.extend(self._count_now - set(due))
                self._count_now.clear()
            if self._counting_later:
                # Counted in the background, then requested again: not here meanwhile.
                due = [name for name in due if name not in self._counting_later]
            rescan, self._rescan = self._rescan, False
            reconcile, self._reconcile_due = self._reconcile_due, False
            files, self._reconcile_files = self._reconcile_files, False
        if reconcile and not self._stopping:
            # On this thread, like every other count: never beside a tick.
            self._reconcile(files)
        elif rescan:
            self.reconcile_agents()
        counted: list[AgentEntry] = []
        for name in due:
            if self._stopping:
                return None
            entry = self._registry.get(name)
            if entry is None:
                continue
            try:
                if _slow_recount(entry):
                    # Seconds of tokenizing: every other agent's count would wait.
                    self._count_in_background([entry], "recounted in the background")
                    continue
                counted.append(entry)
                if self._count(entry):
                    self._runner.evaluate(entry)
            except Exception:  # one agent's surprise must not drop the rest of `due`
                _log.exception("counting failed", agent=name)
        if any(entry.dirty for entry in counted):
            self._flush_pending = True
        flush_at = self._live_flush(now)
        with self._state_lock:
            deadline = self._debouncer.next_deadline()
        self._count_due = deadline
        # Read after this tick's decisions (they may have set one); a wake-up set by a
        # compaction meanwhile is seen at the next tick, at most _MAX_WAIT_S later.
        wake = self._runner.next_wake()
        wake_at = None if wake is None else now + max(0.0, wake - wall)
        due_times = [t for t in (deadline, flush_at, wake_at, window_at) if t is not None]
        return min(due_times) if due_times else None

    def _count(self, entry: AgentEntry) -> bool:
        """Count ``entry``; False when it could not be counted. A MEMORY.md found
        gone is the runner's to judge (an erased memory takes its job's past along)."""
        counted = self._counter.count_locked(entry)
        if counted is Counted.MISSING:
            self._runner.reset_if_erased(entry)
        return counted is not Counted.FAILED

    def _live_flush(self, now: float) -> float | None:
        """Flush on change, batched: counts reach the state DB within
        ``LIVE_FLUSH_S`` of being made. Returns when the pending flush is due
        (monotonic), or None when nothing waits."""
        if not self._flush_pending:
            return None
        if self._flusher.live_flush_due(now):
            self._flush_pending = False
            self._runner.flush(live=True)
            return None
        return self._flusher.next_live_flush()

    # -------------------------------------------------------------- reconcile

    def _reconcile(self, files: bool = False) -> None:
        """The source of truth (a ``reconcile`` hint, put by the periodic job): rescan
        agents and stat every MEMORY.md (not when :attr:`files_polled`: the poller
        does every second; unless ``files``, after an unnamed ``agents`` hint);
        agents whose count failed are counted again and a hold past its time is
        decided either way."""
        try:
            self._sweep(files)
        except Exception:
            _log.exception("reconcile failed")

    def _sweep(self, files: bool) -> None:
        self.reconcile_agents()
        now = time.time()
        stat_each = files or not self.files_polled
        for entry in self._registry.agents().values():
            if entry.count_error is not None or (stat_each and changed_on_disk(entry)):
                self.request_count(entry.name)
            elif self._runner.hold_expired(entry, now):
                self._runner.evaluate(entry)  # safety net for a lost wake-up

    def reconcile_agents(self) -> None:
        """The registry rescans (and publishes the agent set for the watches); new
        agents are counted at once, gone ones forgotten."""
        added, removed = self._registry.reconcile()
        for name in added:
            self.request_count(name)
        for name in removed:
            with self._state_lock:
                self._debouncer.cancel(name)
                self._count_now.discard(name)
            self._runner.forget(name)

    def recount_changed(self, entries: list[AgentEntry]) -> None:
        """Start-up, once the watches are live: anything written during the scan
        shows in a stat (size, inode, mtime) and is counted now, incrementally."""
        for entry in entries:
            if entry.count_error is None and changed_on_disk(entry):
                self._count(entry)

    # ----------------------------------------------------------------- reload

    def reconfigure(
        self,
        trigger: TriggerConfig,
        encoding: str,
        tokenizer: Tokenizer | None,
        max_piece_bytes: int | None = None,
    ) -> None:
        """New debounce settings (pending agents are counted at once); with a new
        ``tokenizer`` every agent is recounted with it."""
        self.encoding = encoding
        with self._state_lock:
            pending = self._debouncer.keys()
            self._debouncer = _new_debouncer(trigger)
            self._count_now.update(pending)
        if tokenizer is not None:
            self._counter.tokenizer = tokenizer
            if max_piece_bytes is not None:
                self._counter.max_piece_bytes = max_piece_bytes
            for entry in self._registry.agents().values():
                # Under the count lock: a count still running with the old
                # encoding finishes first, then its result is dropped.
                with entry.count_lock:
                    entry.tracked = None
                self.request_count(entry.name)
        self.inbox.put(Hint(HintKind.WAKE, None, time.monotonic()))

    # ----------------------------------------------------------- start-up count

    def restore(self, entry: AgentEntry, record: AgentRecord) -> bool:
        """Reuse a stored count when the file is the same inode and size (the job
        state is the runner's: :meth:`initial_count` has it restored)."""
        try:
            info = os.stat(entry.paths.memory_fspath())
        except OSError:
            return False
        trust = stored_count_trust(
            FileFacts(record.dev, record.ino, record.size, record.mtime_ns),
            FileFacts(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns),
            tokens=record.tokens,
            safe_tokens=record.safe_tokens,
            stored_encoding=record.encoding,
            encoding=self.encoding,
            has_window_digest=record.window_digest is not None,
        )
        if trust is StoredCountTrust.RECOUNT:
            return False
        tracked = record.to_tracked(info.st_size)
        if tracked.marks:
            # Only marks that fit the count (a damaged row's are dropped, quietly).
            marks = fitting_marks(tracked.marks, tracked.state)
            if marks != tracked.marks:
                tracked = dataclasses.replace(tracked, marks=marks)
        entry.tracked = tracked
        entry.counted_with = self._counter.tokenizer  # the stored count's encoding, checked
        if trust is StoredCountTrust.EXTEND:
            return False  # grew while we were down: count just the new bytes
        # Nothing to write back, unless the folder was listed anew (its facts change)
        # or the agent's policy changed while we were down (a new context_length or
        # memd-agent.json): `memd status` shows the stored threshold.
        policy = entry.policy
        entry.dirty = (entry.folder or (0, 0, 0)) != (
            record.folder_ino,
            record.folder_ctime_ns,
            record.folder_entries,
        ) or (
            policy.threshold_tokens,
            policy.window_source,
            policy.reserved_tokens,
        ) != (record.threshold_tokens, record.window_source, record.reserved_tokens)
        return True

    def initial_count(
        self, entries: list[AgentEntry], records: Mapping[str, AgentRecord]
    ) -> list[AgentEntry]:
        """Count (or restore) every agent before READY, except the files too large to
        count in a moment: those are returned, for :meth:`count_later` after READY."""
        to_count: list[AgentEntry] = []
        later: list[AgentEntry] = []
        stored = [(entry, records[entry.name]) for entry in entries if entry.name in records]
        self._runner.restore(stored)
        for entry in entries:
            record = records.get(entry.name)
            if record is not None and self.restore(entry, record):
                continue
            (later if _slow_to_count(entry) else to_count).append(entry)
        if later:
            _log.info("counting after READY", agents=[entry.name for entry in later])
        if not to_count:
            return later
        started = time.monotonic()
        workers = worker_count(len(to_count))
        mode = "serial"
        done = 0
        pool_workers = self._pool_workers(to_count)
        if pool_workers > 1:
            mode = "processes"
            done = self._count_in_processes(to_count, pool_workers)
        elif workers > 1:
            # tiktoken releases the GIL for part of its work: threads help some.
            mode = "threads"
            with ThreadPoolExecutor(workers, thread_name_prefix="memd-scan") as pool:
                done = len(list(pool.map(self._count, to_count)))
        else:
            for entry in to_count:
                if self._exiting.should_exit:
                    break
                self._count(entry)
                done += 1
        _log.info(
            "initial count",
            counted=done,
            reused=len(entries) - len(to_count),
            mode=mode,
            seconds=round(time.monotonic() - started, 3),
            # SIGTERM arrived: the rest was not counted (the daemon stops).
            stopped=done < len(to_count),
        )
        return later

    def count_later(self, entries: list[AgentEntry]) -> None:
        """Count large files in the background once the daemon is READY (readiness
        never waits on one agent); the counting loop leaves them alone meanwhile,
        then counts what was appended during it and hands them to the runner."""
        self._count_in_background(entries, "counted after READY")

    def _count_in_background(self, entries: Iterable[AgentEntry], done: str) -> None:
        """Queue ``entries`` for the background count (one thread, one file at a time,
        started when there is work; an agent already queued is not queued twice).
        Each is logged ``done`` once counted, then asked for a count on the count
        thread: what was appended meanwhile, and the runner's decision."""
        with self._state_lock:
            fresh = [entry for entry in entries if entry.name not in self._counting_later]
            if not fresh:
                return
            self._counting_later.update(entry.name for entry in fresh)
            self._later_queue.extend((entry, done) for entry in fresh)
            if self._later is not None:
                return  # the running thread takes them (it ends only on an empty queue)
            self._later = thread = threading.Thread(
                target=self._count_queued, name="memd-count-large", daemon=True
            )
        thread.start()

    def _count_queued(self) -> None:
        while True:
            with self._state_lock:
                if not self._later_queue:
                    self._later = None
                    return
                entry, done = self._later_queue.popleft()
            # Not counted here (stopping, or the agent replaced while queued: a
            # same-name agent is counted on the count thread): asked for below.
            counted = True
            try:
                if not self._stopping and self._registry.is_current(entry):
                    counted = self._count(entry)
                    if counted:
                        tracked = entry.tracked
                        _log.info(
                            done,
                            agent=entry.name,
                            tokens=entry.tokens,
                            estimated=tracked is not None and tracked.state.estimated,
                        )
            except Exception:
                counted = False
                _log.exception("counting failed", agent=entry.name)
            finally:
                with self._state_lock:
                    self._counting_later.discard(entry.name)
            if counted:
                # What was appended meanwhile, and the runner's decision. A failed
                # count is not asked for again here: its error is recorded (and
                # logged) and the periodic reconcile retries it, as every failed
                # count; asked for at once, it failed again at once, forever.
                self.request_count(entry.name)

    def _pool_workers(self, entries: list[AgentEntry]) -> int:
        """Forked workers for a large cold scan (1: count here), and only with the
        real tokenizer (a test's counter may not survive a fork)."""
        if not self._pool_allowed:
            return 1
        return pool_workers([str(entry.paths.memory) for entry in entries])

    def _count_in_processes(self, entries: list[AgentEntry], workers: int) -> int:
        """Count ``entries`` in forked workers; returns how many were counted."""
        jobs: list[CountJob] = []
        counted: list[AgentEntry] = []
        for entry in entries:
            try:
                check_contained(entry)
            except MemdError:
                self._count(entry)  # records the refusal
                continue
            jobs.append(CountJob(str(entry.paths.memory), entry.tracked))
            counted.append(entry)
        results = count_many(
            jobs,
            self._counter.tokenizer.count_bytes,
            max_piece_bytes=self._counter.max_piece_bytes,
            workers=workers,
            # The daemon's flags: this runs before start(), self._stopping is unset.
            stop=self._exiting,
        )
        done = len(entries) - len(counted)  # the refused ones, counted above
        for index, result in results:
            entry = counted[index]
            with entry.count_lock:
                self._counter.count(entry, result)
            done += 1
        return done


__all__ = ["CountService", "Hint", "HintKind", "HintSink"]
