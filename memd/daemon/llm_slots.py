"""The global cap on summarizer calls in flight (``daemon.max_concurrent_llm``).

A compaction is mostly not an LLM call: the snapshot, the archive write and
swap, and above all the drain's quiet wait (about a second of waiting for late
writers) are file work. Those run on the compaction pool
(``daemon.max_concurrent_io`` jobs at once); only the summary itself holds one
of these slots, so a storm of compactions keeps every LLM slot busy while other
jobs commit and drain side by side.

A job waits for its slot *before* the transaction takes the agent's lock
(:meth:`LlmSlots.reserved`): in a storm that wait can last minutes, and the
lock held through it would make ``compact-now --wait``, ``forget`` and retention
on that agent time out behind a job that is doing nothing. The slot goes back
as soon as the summary returns (the commit and the drain run without it). Only
a transaction that starts over (MEMORY.md rewritten during its summary) waits
for its next slot under the lock: at most ``compaction.max_restarts`` times.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from memd.core.summary import Summarizer, SummaryRequest, SummaryResult
from memd.errors import SummaryNotStarted, SummarySettingsChanged

StillCurrent = Callable[[], bool]


class LlmSlots:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._free = slots
        self._closed = False
        self._cond = threading.Condition()

    def close(self) -> None:
        """Shutdown: summaries in flight finish; jobs waiting for a busy slot do
        not start (a job that finds a slot free still runs: it is in flight)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _take(self, agent: str) -> None:
        with self._cond:
            while self._free == 0 and not self._closed:
                self._cond.wait()
            if self._free == 0:
                # Stopping with every slot busy: waiting would hold the stop for
                # a whole LLM call. A job that finds a slot free goes on: it is
                # in flight, and SIGTERM lets it commit.
                raise SummaryNotStarted(
                    f"agent {agent!r}: shutting down; the summary had not started (nothing changed)"
                )
            self._free -= 1

    def _give_back(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify()

    @contextlib.contextmanager
    def reserved(
        self, agent: str, summarizer: Summarizer, still_current: StillCurrent | None = None
    ) -> Iterator[Summarizer]:
        """Wait for a slot now, before the caller takes the agent's lock; yield
        ``summarizer`` bound to it, for one compaction transaction.

        The first summary spends the reserved slot and gives it back when it
        returns; a second one (the transaction starting over because MEMORY.md
        was rewritten meanwhile) waits for a slot, holding the agent's lock, as
        every summary did before the reservation. ``still_current`` says whether
        the settings the job was given (its summarizer, what it redacts) still
        hold: asked once the slot is taken, and again before each summary.
        """
        self._take(agent)
        bound = _SlotBound(summarizer, self, agent, still_current)
        try:
            # A storm can keep a job waiting here for minutes: a reload meanwhile
            # (say to a local model, for privacy) must reach it before its
            # transcript is sent anywhere, or its lock taken.
            bound.check_current()
            yield bound
        finally:
            bound.give_back_reserved()


class _SlotBound:
    """A summarizer holding the slot reserved for its transaction (see
    :meth:`LlmSlots.reserved`). One job's, used from that job's thread only."""

    def __init__(
        self,
        inner: Summarizer,
        slots: LlmSlots,
        agent: str,
        still_current: StillCurrent | None,
    ) -> None:
        self.inner = inner
        self._slots = slots
        self._agent = agent
        self._still_current = still_current
        self._reserved = True  # the slot taken before the lock, not yet spent

    @property
    def model(self) -> str:
        return self.inner.model

    def check_current(self) -> None:
        if self._still_current is not None and not self._still_current():
            raise SummarySettingsChanged(
                f"agent {self._agent!r}: the summarizer settings changed while the "
                "summary waited for an LLM slot; queued again (nothing changed)"
            )

    def give_back_reserved(self) -> None:
        """The transaction ended without spending the reserved slot (under threshold
        once locked, nothing to compact, a busy lock, a failure before its summary)."""
        if self._reserved:
            self._reserved = False
            self._slots._give_back()

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        if self._reserved:
            self._reserved = False  # spent: given back below, when this summary ends
        else:
            # The transaction started over (MEMORY.md rewritten during its last
            # summary): wait for a slot under the lock. Giving up and queueing the
            # job again instead started a fresh transaction, its restart count at
            # 0: in a storm (the freed slot always taken by a waiting job) a file
            # rewritten during every summary was summarized again forever, a
            # model call each round, never ``max_restarts``, never a failure. This
            # path is rare, the wait bounded by the summaries in flight; a stop
            # meanwhile raises SummaryNotStarted (no slot taken, nothing committed).
            self._slots._take(self._agent)
        try:
            self.check_current()
            return self.inner.summarize(request)
        finally:
            self._slots._give_back()


__all__ = ["LlmSlots"]
