"""Per-key debouncing with a trailing quiet period and a maximum wait (pure).

A key becomes due when it has been quiet for ``quiet_s`` since its last touch,
or when ``max_wait_s`` has passed since the first touch of the current burst,
whichever comes first. The maximum wait is what keeps an agent that appends
continuously from starving its own counting and compaction.

Times are plain floats from the caller's clock (``time.monotonic()`` in the
daemon, made-up numbers in tests); nothing here reads a clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class _Burst:
    first: float
    last: float


class Debouncer(Generic[K]):
    """Collects touches per key and releases each key once per burst."""

    def __init__(self, quiet_s: float, max_wait_s: float) -> None:
        if quiet_s < 0 or max_wait_s < 0:
            raise ValueError("debounce periods must be >= 0")
        self.quiet_s = quiet_s
        # A max wait shorter than the quiet period would make the quiet period
        # meaningless; 0 means "no ceiling".
        self.max_wait_s = max_wait_s
        self._bursts: dict[K, _Burst] = {}
        # Heap of (deadline, tiebreak, key). Deadlines only move later on a
        # touch, so stale heap entries are detected and skipped lazily.
        self._heap: list[tuple[float, int, K]] = []
        self._tiebreak = itertools.count()

    def __len__(self) -> int:
        return len(self._bursts)

    def __contains__(self, key: object) -> bool:
        return key in self._bursts

    def keys(self) -> list[K]:
        """Keys waiting to become due."""
        return list(self._bursts)

    def _deadline(self, burst: _Burst) -> float:
        trailing = burst.last + self.quiet_s
        if self.max_wait_s > 0:
            return min(trailing, burst.first + self.max_wait_s)
        return trailing

    def touch(self, key: K, now: float) -> float:
        """Record an event for ``key``; returns the key's new deadline."""
        burst = self._bursts.get(key)
        if burst is None:
            burst = _Burst(first=now, last=now)
            self._bursts[key] = burst
        else:
            burst.last = max(burst.last, now)
        deadline = self._deadline(burst)
        heapq.heappush(self._heap, (deadline, next(self._tiebreak), key))
        return deadline

    def cancel(self, key: K) -> None:
        self._bursts.pop(key, None)

    def _prune(self) -> None:
        while self._heap:
            deadline, _, key = self._heap[0]
            burst = self._bursts.get(key)
            if burst is not None and self._deadline(burst) == deadline:
                return
            heapq.heappop(self._heap)

    def next_deadline(self) -> float | None:
        """The earliest time at which some key becomes due, if any is waiting."""
        self._prune()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[K]:
        """Keys whose deadline is at or before ``now``, each once, earliest first."""
        due: list[K] = []
        while True:
            self._prune()
            if not self._heap or self._heap[0][0] > now:
                return due
            _, _, key = heapq.heappop(self._heap)
            del self._bursts[key]
            due.append(key)


__all__ = ["Debouncer"]
