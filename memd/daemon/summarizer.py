"""The summarizer the daemon compacts with: built from the config when first needed
(again after a reload), told at shutdown to
stop retrying, and stood in for by the builtin summarizer for an agent whose
model kept failing.

It owns the summarizer and a lock of its own, a leaf: building one (which may
import litellm) is the only thing done under it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from memd.core.config import MemdConfig
from memd.core.summary import Summarizer
from memd.logs import get_logger
from memd.summarizers import BUILTIN_MODEL, BuiltinSummarizer

_log = get_logger("memd.daemon")

SummarizerFactory = Callable[[MemdConfig, Callable[[str], int]], Summarizer]


class SummarizerSource:
    def __init__(
        self,
        config: MemdConfig,
        factory: SummarizerFactory,
        count_text: Callable[[str], int],
    ) -> None:
        self._config = config
        self._factory = factory
        # The tokenizer's MEMORY.md is counted with (a reload hands the new one in).
        self._count_text = count_text
        self._summarizer: Summarizer | None = None
        # The ones a reload replaced: jobs in flight still use them, and shutdown
        # must stop their retries too. Weak: each goes with the last job holding it.
        self._superseded: weakref.WeakSet[Summarizer] = weakref.WeakSet()
        self._stopped = False
        self._generation = 0
        self._lock = threading.Lock()

    @property
    def generation(self) -> int:
        """Bumped by each reload that changes where summaries go or what they are
        sent (the [summarizer] and [privacy] settings): a job compares it with
        the value it started with before its transcript goes out."""
        return self._generation

    @property
    def model(self) -> str | None:
        """The configured summarizer's model, once built (the ledger names it)."""
        summarizer = self._summarizer
        return None if summarizer is None else summarizer.model

    def get(self) -> Summarizer:
        with self._lock:
            if self._summarizer is None:
                self._summarizer = self._factory(self._config, self._count_text)
                if self._stopped:
                    _stop_retries(self._summarizer)
            return self._summarizer

    def for_agent(self, agent: str, failures: int) -> tuple[Summarizer, bool]:
        """The configured summarizer, or the builtin one once a remote model kept failing
        (then with True: the ledger and ``memd status`` say the fallback was used).

        A model that is down (or keeps answering "ok") must not let an agent's
        memory outgrow its window: after ``summarizer.fallback_after``
        consecutive failures the agent is compacted offline; the next
        compaction tries the model again.
        """
        summarizer = self.get()
        after = self._config.summarizer.fallback_after
        model = getattr(summarizer, "model", BUILTIN_MODEL)
        if after and failures >= after and model != BUILTIN_MODEL:
            _log.warning(
                "summarizer failing; compacting with the builtin summarizer",
                agent=agent,
                model=model,
                failures=failures,
            )
            return BuiltinSummarizer(self._count_text), True
        return summarizer, False

    def stop(self) -> None:
        """Shutdown: in-flight summaries may finish (they commit), but none retries."""
        with self._lock:
            self._stopped = True
            for summarizer in (self._summarizer, *self._superseded):
                _stop_retries(summarizer)

    def reconfigure(
        self, config: MemdConfig, count_text: Callable[[str], int] | None = None
    ) -> None:
        """A reload; ``count_text``: the new tokenizer's, when it brought one."""
        with self._lock:
            if (config.summarizer, config.privacy) != (
                self._config.summarizer,
                self._config.privacy,
            ):
                self._generation += 1
            self._config = config
            if count_text is not None:
                self._count_text = count_text
            if self._summarizer is not None:
                self._superseded.add(self._summarizer)
            self._summarizer = None  # rebuilt when next needed, with the new settings


def _stop_retries(summarizer: Summarizer | None) -> None:
    # Retries could outlast systemd's TimeoutStopSec.
    stop = getattr(summarizer, "stop", None)
    if callable(stop):
        stop()


__all__ = ["SummarizerFactory", "SummarizerSource"]
