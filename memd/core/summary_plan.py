"""Summary budgets and the degenerate-reply rule (pure): values in, values out.

One budget equation, checked per agent: the header, the summary, the pinned
facts and the recent turns kept verbatim must fit under the low-water mark, or a
compaction could never end below it.  Defaults are shares of the agent's
threshold, so a 1M-token agent gets a summary worth its size and a 16k-token
agent one that still leaves room.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

SUMMARY_SHARE: Final = 0.2  # of the agent's threshold
PINNED_SHARE: Final = 0.3
RECENT_SHARE: Final = 0.1  # newest whole turns kept verbatim after the summary
HEADER_ALLOWANCE: Final = 64  # header + summary preamble, in tokens
MIN_SUMMARY_TOKENS: Final = 256
# ``[summarizer] keep_recent_tokens``: -1 derives it from the threshold, 0 is off.
RECENT_DERIVED: Final = -1
# A reply shorter than this share of what it summarizes cannot be a summary of
# it ("ok", "Done.", a refusal); below DEGENERATE_FLOOR tokens it never is,
# unless the input itself is tiny.
DEGENERATE_SHARE: Final = 0.005
DEGENERATE_FLOOR: Final = 32


class BudgetError(ValueError):
    """The configured budgets cannot fit under the low-water mark."""


@dataclass(frozen=True, slots=True)
class SummaryBudgets:
    summary_tokens: int
    pinned_tokens: int
    recent_tokens: int = 0  # newest whole turns kept verbatim (0: none)

    @property
    def total(self) -> int:
        return HEADER_ALLOWANCE + self.summary_tokens + self.pinned_tokens + self.recent_tokens


def summary_budgets(
    threshold_tokens: int,
    low_water_tokens: int,
    *,
    summary_tokens: int = 0,
    pinned_tokens: int = 0,
    recent_tokens: int = 0,
) -> SummaryBudgets:
    """The summary, pinned-facts and recent-turns budgets for one agent.

    The budget equation: header + summary + pinned + recent <= the low-water mark.
    ``summary_tokens``/``pinned_tokens`` of 0 and ``recent_tokens`` of
    :data:`RECENT_DERIVED` are shares of the threshold; ``recent_tokens`` of 0 keeps
    no turn verbatim.  Values set explicitly must fit on their own (else
    :class:`BudgetError` naming them); derived ones shrink in proportion into what
    the explicit ones leave.
    """
    explicit: dict[str, int] = {}
    derived: dict[str, int] = {}
    if summary_tokens:
        explicit["summarizer.summary_tokens"] = summary_tokens
    else:
        derived["summary"] = max(MIN_SUMMARY_TOKENS, int(threshold_tokens * SUMMARY_SHARE))
    if pinned_tokens:
        explicit["summarizer.pinned_tokens"] = pinned_tokens
    else:
        derived["pinned"] = int(threshold_tokens * PINNED_SHARE)
    if recent_tokens == RECENT_DERIVED:
        derived["recent"] = int(threshold_tokens * RECENT_SHARE)
    elif recent_tokens > 0:
        explicit["summarizer.keep_recent_tokens"] = recent_tokens
    fixed = HEADER_ALLOWANCE + sum(explicit.values())
    if explicit and fixed > low_water_tokens:
        named = " + ".join(f"{key} ({value})" for key, value in explicit.items())
        raise BudgetError(
            f"{named} + {HEADER_ALLOWANCE} for the header exceed the low-water mark "
            f"({low_water_tokens} tokens = trigger.low_water x the threshold)"
        )
    room = max(len(derived), low_water_tokens - fixed)
    wanted = sum(derived.values())
    if wanted > room:
        # Derived budgets on a tiny agent (or beside big explicit ones): shrink
        # them in proportion into the room left.
        scale = room / wanted
        derived = {key: max(1, int(value * scale)) for key, value in derived.items()}
    return SummaryBudgets(
        summary_tokens=explicit.get("summarizer.summary_tokens", derived.get("summary", 0)),
        pinned_tokens=explicit.get("summarizer.pinned_tokens", derived.get("pinned", 0)),
        recent_tokens=explicit.get("summarizer.keep_recent_tokens", derived.get("recent", 0)),
    )


def degenerate_floor(input_tokens: int, reply_budget: int | None = None) -> int:
    """The fewest tokens a summary of ``input_tokens`` tokens may have.

    With ``reply_budget`` (what the summary may hold), the floor never asks for
    more than a quarter of it: 0.5 % of a 10 MB transcript (~12,500 tokens) is
    more than a 4,000-token summary may be, so every reply would be refused and
    the memory would never be compacted again.
    """
    # A short input may have a short summary: the floor only binds from 512 tokens.
    floor = min(DEGENERATE_FLOOR, input_tokens // 16)
    floor = max(floor, math.ceil(input_tokens * DEGENERATE_SHARE))
    if reply_budget is not None:
        floor = min(floor, max(DEGENERATE_FLOOR, reply_budget // 4))
    return floor


def is_degenerate(reply_tokens: int, input_tokens: int, reply_budget: int | None = None) -> bool:
    return reply_tokens < degenerate_floor(input_tokens, reply_budget)
