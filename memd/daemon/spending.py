"""The workspace's model spending against ``[summarizer] max_calls_per_hour`` and
``max_usd_per_day``: the runner asks whether a cap holds a compaction back,
reserves the calls the hour still allows before it starts one (the allowance it
hands the compaction as a value) and settles the reservation to what the
compaction reports it used (requests, re-asks and retries included, and their
cost) when it ends; it hands a snapshot to each flush (``memd status``, the
metrics). The summarizer calls no one: what it spent comes back in the outcome
or on the error.

One guard per daemon (the daemon is the workspace's), with its own lock, a leaf:
nothing is called while it is held. Seeded at start from the ledger, so a
restart does not reset the caps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memd.core.config import SummarizerConfig
from memd.core.jobs import AgentJob
from memd.core.spending import DAY_S, Hold, SpendingCaps, SpendingWindow
from memd.errors import describe_error
from memd.logs import get_logger
from memd.summarizers import needs_litellm

if TYPE_CHECKING:
    from memd.metrics import Metrics
    from memd.state import SpendingRecord, StateStore

_log = get_logger("memd.daemon")


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a compaction may spend, taken from the window when it starts: ``calls``
    (None: no call cap) recorded at ``at`` until it is settled."""

    at: float
    calls: int | None


class SpendingGuard:
    def __init__(self, config: SummarizerConfig, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._clock = clock  # wall-clock (the ledger's times); tests pass a made-up one
        self._window = SpendingWindow()
        self._lock = threading.Lock()
        self._unpriced_warned = False
        self.metrics: Metrics | None = None

    def seed(self, store: StateStore | None) -> None:
        """What the ledger says was spent inside the caps' windows before this start."""
        if store is None:
            return
        now = self._clock()
        try:
            spent = store.spending_since(now - DAY_S)
        except Exception as exc:
            _log.warning("cannot read past spending from the ledger", error=describe_error(exc))
            return
        with self._lock:
            for at, calls, usd in spent:
                self._window.record(at, calls, usd)

    def reconfigure(self, config: SummarizerConfig) -> None:
        self._config = config

    def _caps(self) -> SpendingCaps:
        return SpendingCaps(self._config.max_calls_per_hour, self._config.max_usd_per_day)

    def reserve(self) -> Reservation:
        """Before a compaction with a remote model: the calls the hour still allows,
        recorded now (so compactions side by side never pass the cap together)
        until :meth:`settle` replaces them with what it used."""
        with self._lock:
            now = self._clock()
            left = self._window.calls_left(now, self._caps())
            if left:
                self._window.record(now, left)
        return Reservation(now, left)

    def settle(self, reservation: Reservation, calls: int | None, cost_usd: float | None) -> None:
        """After the compaction (success or failure): what it used replaces what it
        reserved. ``calls`` None: not known (a crash), the reservation stands;
        ``cost_usd`` None: litellm could not price its replies."""
        if calls is None:
            return
        with self._lock:
            if reservation.calls:
                self._window.unrecord(reservation.at, reservation.calls)
            if calls or cost_usd:
                self._window.record(self._clock(), calls, cost_usd)
        unpriced = calls > 0 and cost_usd is None and self._config.max_usd_per_day > 0
        if unpriced and not self._unpriced_warned:
            self._unpriced_warned = True
            _log.warning(
                "summarizer.max_usd_per_day: litellm reports no cost for this model's "
                "requests; the cap counts only what it can price",
                model=self._config.model,
            )

    def hold(self, job: AgentJob) -> Hold | None:
        """The cap that holds this agent's compaction back now, if any.

        Only a remote model spends: the builtin summarizer (configured, or standing
        in after ``fallback_after`` failures) is never held back.
        """
        caps = self._caps()
        if not caps.active or not self.spends(job):
            return None
        with self._lock:
            return self._window.hold(self._clock(), caps)

    def spends(self, job: AgentJob) -> bool:
        """Whether this agent's compaction would use a remote model (not the builtin
        summarizer, configured or standing in after ``fallback_after`` failures)."""
        if not needs_litellm(self._config):
            return False
        after = self._config.fallback_after
        return not (after and job.consecutive_failures >= after)

    def calls_left(self) -> int | None:
        with self._lock:
            return self._window.calls_left(self._clock(), self._caps())

    def snapshot(self) -> SpendingRecord:
        """What was spent against the caps and the hold now (the flusher stores it for
        ``memd status``; the metrics follow it)."""
        from memd.state import SpendingRecord

        now = self._clock()
        caps = self._caps()
        remote = needs_litellm(self._config)
        with self._lock:
            calls = self._window.calls_in_hour(now)
            usd = self._window.usd_in_day(now)
            hold = self._window.hold(now, caps) if remote else None
        if self.metrics is not None:
            self.metrics.set_spending(calls, usd, hold.key if hold is not None else None)
        return SpendingRecord(
            calls_last_hour=calls,
            usd_last_day=usd,
            held_reason=hold.reason if hold is not None else None,
            held_until=hold.until if hold is not None else None,
            ts=now,
        )


__all__ = ["Reservation", "SpendingGuard"]
