"""Registry snapshots → the state DB (what ``memd status`` reads), the heartbeat
(what ``memd health`` reads) and systemd's ``STATUS=`` line.

Each flush also honours ``memd forget``'s tombstones (:mod:`memd.core.erasure`):
an erased agent's row is not written back (the state DB refuses it in the same
transaction), a tombstone is lifted once the agent has a MEMORY.md created after
it, and the agents erased or back since the last flush are returned to the
caller (the runner: their metrics and job past go). The flusher calls no one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from memd.core.erasure import FileStamp, revives
from memd.core.jobs import JobState
from memd.daemon.entries import AgentEntry, RunStats
from memd.daemon.registry import AgentRegistry
from memd.errors import describe_error
from memd.logs import get_logger
from memd.notify import SystemdNotifier
from memd.state import AgentRecord, SpendingRecord

if TYPE_CHECKING:
    from memd.state import StateStore

_log = get_logger("memd.daemon")

# New counts reach the state DB (what `memd status` reads) this soon after they
# are made, batched: at most one live flush per this long (the periodic flush,
# daemon.state_flush_s, writes the rest: job states, the heartbeat).
LIVE_FLUSH_S = 0.1
# At stop, what the state DB's writes may wait in all for another process's
# lock on it (a `sqlite3` shell in a transaction): the DB is a cache, the next
# start recounts what it lacks, and a stop is awaited by systemd, `docker stop`.
STOP_DB_WAIT_S = 1.0


class ErasureChange(NamedTuple):
    """An agent ``memd forget`` erased (``erased``), or that writes again (not ``erased``)."""

    agent: str
    erased: bool


class StateFlusher:
    def __init__(
        self,
        registry: AgentRegistry,
        stats: RunStats,
        notifier: SystemdNotifier,
        encoding: str,
        started_at: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store: StateStore | None = None
        # When flushes happen (batching live flushes); tests pass a made-up one.
        self._clock = clock
        self._registry = registry
        self._stats = stats
        self._notifier = notifier
        self._encoding = encoding
        # What the heartbeat says: handed in by the lifecycle's main loop, which
        # probes the service threads (not before start-up has started them all).
        self._healthy = False
        self._started_at = started_at
        self._lock = threading.Lock()
        self._last_flush = 0.0
        self._last_status = ""
        self._last_spending: SpendingRecord | None = None
        self._erased: set[str] = set()

    def start(self, stack: contextlib.ExitStack, store: StateStore | None) -> None:
        """Write to ``store`` (None: no state DB); its close is pushed on ``stack``."""
        self.store = store
        stack.callback(self.close)

    def reconfigure(self, encoding: str) -> None:
        self._encoding = encoding

    def set_healthy(self, healthy: bool) -> None:
        """The daemon's health as last probed: the next heartbeat writes it."""
        self._healthy = healthy

    def stopping(self) -> None:
        """The daemon stops: the writes left (final flush, heartbeat) wait at most
        STOP_DB_WAIT_S in all for a lock another process holds on the state DB."""
        if self.store is not None:
            self.store.limit_waits(STOP_DB_WAIT_S)

    def close(self) -> None:
        """After the final flush: the heartbeat goes, the DB closes."""
        store, self.store = self.store, None
        if store is None:
            return
        with contextlib.suppress(Exception):
            store.clear_heartbeat(os.getpid())
        with contextlib.suppress(Exception):
            store.close()

    def live_flush_due(self, now_monotonic: float) -> bool:
        return self.store is not None and now_monotonic - self._last_flush >= LIVE_FLUSH_S

    def next_live_flush(self) -> float | None:
        """When the next live flush may run (monotonic), or None without a store."""
        return None if self.store is None else self._last_flush + LIVE_FLUSH_S

    def flush(
        self,
        final: bool = False,
        *,
        live: bool = False,
        spending: SpendingRecord | None = None,
    ) -> list[ErasureChange]:
        """Write what changed, and ``spending`` (the runner's, against the caps) when
        given; returns the erasures that came or went since the last flush.
        ``live`` (new counts, up to ten times a second): the changed rows only;
        the heartbeat, spending and ``STATUS=`` line (a pass over every agent)
        wait for the periodic flush."""
        # Snapshot and write as one step: two flushes at once (the periodic job
        # and a compaction's) could otherwise write an older snapshot last.
        with self._lock:
            return self._flush_serialized(final, live, None if live else spending)

    def _flush_serialized(
        self, final: bool, live: bool, spending: SpendingRecord | None
    ) -> list[ErasureChange]:
        self._last_flush = self._clock()
        now = time.time()
        changes = self._honour_erasures()
        # Each entry's dirty flag is cleared before its fields are read: a change
        # made meanwhile (field first, then dirty) is in this snapshot or the next.
        dirty, removed = self._registry.take_changes()
        records = [
            AgentRecord.of(
                entry.name,
                entry.tracked,
                entry.job,
                threshold_tokens=entry.policy.threshold_tokens,
                count_error=entry.count_error,
                encoding=self._encoding,
                now=now,
                archives=entry.archives,
                window_source=entry.policy.window_source,
                reserved_tokens=entry.policy.reserved_tokens,
                estimated=entry.tracked is not None and entry.tracked.state.estimated,
                folder=entry.folder,
            )
            for entry in dirty
        ]
        status = "" if live else self.status_text(spending)
        if self.store is not None:
            try:
                if spending is not None and _newer_and_changed(spending, self._last_spending):
                    self.store.write_spending(spending)
                    self._last_spending = spending
                if records:
                    self.store.upsert_agents(records)
                for name in removed:
                    self.store.remove_agent(name)
                if not final and not live:
                    self.store.write_heartbeat(
                        os.getpid(),
                        self._started_at,
                        self._healthy,
                        status,
                        len(self._registry),
                        now,
                    )
            except Exception as exc:
                self._registry.give_back(dirty, removed)
                _log.warning("cannot write the state database", error=describe_error(exc))
        if not final and not live and status != self._last_status:
            self._last_status = status
            self._notifier.status(status)
        return changes

    def _honour_erasures(self) -> list[ErasureChange]:
        store = self.store
        if store is None:
            return []
        try:
            stones = store.tombstoned(self._registry.names())
            for name, stone in list(stones.items()):
                entry = self._registry.get(name)
                if entry is None or not revives(stone, _memory_stamp(entry)):
                    continue
                store.lift_tombstone(stone)
                del stones[name]
                entry.dirty = True
                _log.info("agent writes again after its erasure", agent=name)
        except Exception as exc:
            _log.warning("cannot read erasures from the state database", error=describe_error(exc))
            return []
        erased = set(stones)
        changes = [ErasureChange(name, True) for name in sorted(erased - self._erased)]
        changes += [ErasureChange(name, False) for name in sorted(self._erased - erased)]
        self._erased = erased
        for change in changes:
            if change.erased:
                _log.info(
                    "agent erased by memd forget; not tracked until it writes again",
                    agent=change.agent,
                )
        return changes

    def status_text(self, spending: SpendingRecord | None = None) -> str:
        entries = list(self._registry.agents().values())
        running = len(self._stats.running)  # the runner's: one read, no lock
        pending = sum(1 for e in entries if e.job.state is JobState.PENDING)
        errors = sum(
            1
            for e in entries
            if e.count_error is not None or e.job.state in (JobState.BACKOFF, JobState.BREAKER_OPEN)
        )
        text = (
            f"watching {len(entries)} agents; {running} compacting, {pending} queued; "
            f"{self._stats.compactions_ok} compacted, {self._stats.compactions_failed} failed; "
            f"{errors} in error"
        )
        if spending is not None and spending.held_reason is not None:
            text += f"; compactions held back ({spending.held_reason})"
        return text


def _newer_and_changed(new: SpendingRecord, old: SpendingRecord | None) -> bool:
    """Whether ``new`` says something ``old`` did not (its time aside). A snapshot
    older than the one written is stale: taken before the flush lock, it lost the race."""
    if old is None:
        return True
    if new.ts < old.ts:
        return False
    return (new.calls_last_hour, round(new.usd_last_day, 6), new.held_reason, new.held_until) != (
        old.calls_last_hour,
        round(old.usd_last_day, 6),
        old.held_reason,
        old.held_until,
    )


def _memory_stamp(entry: AgentEntry) -> FileStamp | None:
    try:
        result = os.stat(entry.paths.memory)
    except OSError:
        return None
    return FileStamp(result.st_dev, result.st_ino, result.st_ctime_ns)


__all__ = ["LIVE_FLUSH_S", "ErasureChange", "StateFlusher"]
