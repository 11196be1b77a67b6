"""Summary budgets and the degenerate-reply rule (pure): values in, values out.

One budget equation, checked per agent: the header, the summary and the pinned
facts must fit under the low-water mark, or a compaction could never end below
it.  Defaults are shares of the agent's threshold, so a 1M-token agent gets a
summary worth its size and a 16k-token agent one that still leaves room.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

SUMMARY_SHARE: Final = 0.2  # of the agent's threshold
PINNED_SHARE: Final = 0.3
HEADER_ALLOWANCE: Final = 64  # header + summary preamble, in tokens
MIN_SUMMARY_TOKENS: Final = 256
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


def summary_budgets(
    threshold_tokens: int,
    low_water_tokens: int,
    *,
    summary_tokens: int = 0,
    pinned_tokens: int = 0,
) -> SummaryBudgets:
    """The summary and pinned budgets for one agent (0 = derive from the threshold)."""
    summary = summary_tokens or max(MIN_SUMMARY_TOKENS, int(threshold_tokens * SUMMARY_SHARE))
    pinned = pinned_tokens or int(threshold_tokens * PINNED_SHARE)
    if summary_tokens or pinned_tokens:
        total = HEADER_ALLOWANCE + summary + pinned
        if total > low_water_tokens:
            raise BudgetError(
                f"summarizer.summary_tokens ({summary}) + summarizer.pinned_tokens ({pinned}) "
                f"+ {HEADER_ALLOWANCE} for the header exceed the low-water mark "
                f"({low_water_tokens} tokens = trigger.low_water x the threshold)"
            )
    elif HEADER_ALLOWANCE + summary + pinned > low_water_tokens:
        # Derived budgets on a tiny agent: shrink both in proportion.
        room = max(2, low_water_tokens - HEADER_ALLOWANCE)
        scale = room / (summary + pinned)
        summary, pinned = max(1, int(summary * scale)), max(1, int(pinned * scale))
    return SummaryBudgets(summary_tokens=summary, pinned_tokens=pinned)


def degenerate_floor(input_tokens: int) -> int:
    """The fewest tokens a summary of ``input_tokens`` tokens may have."""
    # A short input may have a short summary: the floor only binds from 512 tokens.
    floor = min(DEGENERATE_FLOOR, input_tokens // 16)
    return max(floor, math.ceil(input_tokens * DEGENERATE_SHARE))


def is_degenerate(reply_tokens: int, input_tokens: int) -> bool:
    return reply_tokens < degenerate_floor(input_tokens)
