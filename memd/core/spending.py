"""Spending caps on the summarizer (pure): what a workspace spent in the caps' windows,
and whether that holds compactions back, and until when.

``[summarizer] max_calls_per_hour`` counts model requests (retries included) in
the last hour; ``max_usd_per_day`` adds up the cost litellm reports for them in
the last 24 hours (a request litellm cannot price counts as a call only). A cap
of 0 is off.  Both are checked before a compaction starts: a compaction already
running may finish (so the USD cap can be passed by one compaction's cost), and
one that starts reserves the calls the hour has left (recorded at its start, so
a compaction starting beside it is held back) and is settled to what it used
when it ends.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

HOUR_S: Final = 3600.0
DAY_S: Final = 86_400.0

CALLS_KEY: Final = "summarizer.max_calls_per_hour"
USD_KEY: Final = "summarizer.max_usd_per_day"


@dataclass(frozen=True, slots=True)
class SpendingCaps:
    calls_per_hour: int = 0  # 0 = no cap
    usd_per_day: float = 0.0  # 0 = no cap

    @property
    def active(self) -> bool:
        return self.calls_per_hour > 0 or self.usd_per_day > 0


@dataclass(frozen=True, slots=True)
class Hold:
    """A cap that holds compactions back: which one (its config key), why, until when."""

    key: str
    reason: str
    until: float


@dataclass(frozen=True, slots=True)
class _Spend:
    at: float
    calls: int
    usd: float


class SpendingWindow:
    """What was spent in the last day, oldest first (values in, values out: the
    caller passes every time; nothing here reads a clock)."""

    def __init__(self) -> None:
        self._spent: deque[_Spend] = deque()

    def record(self, at: float, calls: int = 1, usd: float | None = None) -> None:
        spend = _Spend(at, max(0, calls), max(0.0, usd or 0.0))
        if self._spent and at < self._spent[-1].at:
            # Out of order (a restored ledger row, a clock step): keep the order.
            ordered = sorted([*self._spent, spend], key=lambda s: s.at)
            self._spent = deque(ordered)
        else:
            self._spent.append(spend)

    def unrecord(self, at: float, calls: int, usd: float | None = None) -> None:
        """Take back what :meth:`record` recorded with these values (a reservation
        settled to the real use); nothing when it has aged out already."""
        spend = _Spend(at, max(0, calls), max(0.0, usd or 0.0))
        with contextlib.suppress(ValueError):
            self._spent.remove(spend)

    def _forget_before(self, now: float) -> None:
        while self._spent and self._spent[0].at <= now - DAY_S:
            self._spent.popleft()

    def calls_in_hour(self, now: float) -> int:
        self._forget_before(now)
        return sum(s.calls for s in self._spent if s.at > now - HOUR_S)

    def usd_in_day(self, now: float) -> float:
        self._forget_before(now)
        return sum(s.usd for s in self._spent)

    def calls_left(self, now: float, caps: SpendingCaps) -> int | None:
        """Model calls the hour still allows (None: no call cap)."""
        if caps.calls_per_hour <= 0:
            return None
        return max(0, caps.calls_per_hour - self.calls_in_hour(now))

    def hold(self, now: float, caps: SpendingCaps) -> Hold | None:
        """The cap that holds a compaction back at ``now``, if any (the later one
        when both do: compactions resume only when both allow)."""
        holds: list[Hold] = []
        if caps.calls_per_hour > 0:
            used = self.calls_in_hour(now)
            if used >= caps.calls_per_hour:
                until = self._until(now, HOUR_S, caps.calls_per_hour, lambda s: s.calls)
                holds.append(
                    Hold(
                        CALLS_KEY,
                        f"{used} model calls in the last hour reached {CALLS_KEY} "
                        f"({caps.calls_per_hour})",
                        until,
                    )
                )
        if caps.usd_per_day > 0:
            spent = self.usd_in_day(now)
            if spent >= caps.usd_per_day:
                until = self._until(now, DAY_S, caps.usd_per_day, lambda s: s.usd)
                holds.append(
                    Hold(
                        USD_KEY,
                        f"${spent:.4f} spent in the last 24 hours reached {USD_KEY} "
                        f"(${caps.usd_per_day:g})",
                        until,
                    )
                )
        return max(holds, key=lambda h: h.until) if holds else None

    def _until(
        self, now: float, span: float, cap: float, amount: Callable[[_Spend], float]
    ) -> float:
        """When enough of the window's oldest spending has aged out to be under ``cap``."""
        inside = [s for s in self._spent if s.at > now - span]
        total = sum(amount(s) for s in inside)
        for spend in inside:
            total -= amount(spend)
            if total < cap:
                return spend.at + span
        return now + span  # unreachable with a positive cap; a safe bound anyway


__all__ = [
    "CALLS_KEY",
    "DAY_S",
    "HOUR_S",
    "USD_KEY",
    "Hold",
    "SpendingCaps",
    "SpendingWindow",
]
