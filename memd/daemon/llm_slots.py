"""The global cap on summarizer calls in flight (``daemon.max_concurrent_llm``).

A compaction is mostly not an LLM call: the snapshot, the archive write and
swap, and above all the drain's quiet wait (about a second of waiting for late
writers) are file work. Those run on the compaction pool
(``daemon.max_concurrent_io`` jobs at once); only the summary itself takes one
of these slots, so a storm of compactions keeps every LLM slot busy while other
jobs snapshot, commit and drain side by side.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from memd.core.summary import Summarizer, SummaryRequest, SummaryResult
from memd.errors import SummaryNotStarted, SummarySettingsChanged


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

    @contextlib.contextmanager
    def held(self, agent: str) -> Iterator[None]:
        with self._cond:
            while self._free == 0 and not self._closed:
                self._cond.wait()
            if self._free == 0:
                # Stopping with every slot busy: waiting would hold the stop for
                # a whole LLM call. A job that finds a slot free goes on: it is
                # in flight (its snapshot taken), and SIGTERM lets it commit.
                raise SummaryNotStarted(
                    f"agent {agent!r}: shutting down; the summary had not started (nothing changed)"
                )
            self._free -= 1
        try:
            yield
        finally:
            with self._cond:
                self._free += 1
                self._cond.notify()

    def bound(
        self, summarizer: Summarizer, still_current: Callable[[], bool] | None = None
    ) -> Summarizer:
        """``summarizer`` whose every summary waits for a slot first. ``still_current``,
        asked once the slot is taken, says whether the settings the job was given
        (its summarizer, what it redacts) still hold."""
        return _SlotBound(summarizer, self, still_current)


class _SlotBound:
    def __init__(
        self,
        inner: Summarizer,
        slots: LlmSlots,
        still_current: Callable[[], bool] | None = None,
    ) -> None:
        self.inner = inner
        self._slots = slots
        self._still_current = still_current

    @property
    def model(self) -> str:
        return self.inner.model

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        with self._slots.held(request.agent):
            if self._still_current is not None and not self._still_current():
                # A storm can keep a job waiting here for minutes: a reload meanwhile
                # (say to a local model, for privacy) must reach it before its
                # transcript is sent anywhere. Not started, so nothing to undo.
                raise SummarySettingsChanged(
                    f"agent {request.agent!r}: the summarizer settings changed while the "
                    "summary waited for an LLM slot; queued again (nothing changed)"
                )
            return self.inner.summarize(request)


__all__ = ["LlmSlots"]
