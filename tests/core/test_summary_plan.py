"""The degenerate-reply floor (core/summary_plan.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memd.core.summary_plan import DEGENERATE_FLOOR, degenerate_floor, is_degenerate


def test_ok_is_refused_for_any_real_input() -> None:
    assert is_degenerate(1, 30_000)
    assert is_degenerate(1, 30_000, reply_budget=4_000)
    assert degenerate_floor(30_000) == 150


def test_a_short_input_may_have_a_short_summary() -> None:
    assert degenerate_floor(100) == 6
    assert not is_degenerate(10, 100)


def test_a_huge_input_never_asks_for_more_than_the_summary_may_hold() -> None:
    # 10 MB of transcript is ~2.5 M tokens: 0.5 % of it is 12,500 tokens, more
    # than a 4,000-token summary: without the budget every reply is refused.
    assert degenerate_floor(2_500_000) == 12_500
    assert degenerate_floor(2_500_000, reply_budget=4_000) == 1_000
    assert not is_degenerate(3_900, 2_500_000, reply_budget=4_000)
    assert is_degenerate(3_900, 2_500_000)


@given(st.integers(0, 10**8), st.integers(1, 10**6))
def test_the_floor_fits_the_budget_and_never_drops_below_the_fixed_floor_for_real_inputs(
    input_tokens: int, budget: int
) -> None:
    floor = degenerate_floor(input_tokens, reply_budget=budget)
    assert floor <= degenerate_floor(input_tokens)
    assert floor <= max(DEGENERATE_FLOOR, budget // 4)
    if input_tokens >= 16 * DEGENERATE_FLOOR:
        assert floor >= DEGENERATE_FLOOR  # "ok" (1-2 tokens) is always refused
