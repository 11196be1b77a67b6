"""Spending caps (pure): what the windows hold, when a cap holds, until when."""

from __future__ import annotations

from memd.core.spending import CALLS_KEY, DAY_S, HOUR_S, USD_KEY, SpendingCaps, SpendingWindow


def test_no_cap_never_holds() -> None:
    window = SpendingWindow()
    for at in range(100):
        window.record(float(at), 1, 1.0)
    assert window.hold(100.0, SpendingCaps()) is None
    assert window.calls_left(100.0, SpendingCaps()) is None


def test_the_call_cap_holds_until_the_oldest_calls_leave_the_hour() -> None:
    window = SpendingWindow()
    caps = SpendingCaps(calls_per_hour=3)
    window.record(100.0, 1)
    window.record(200.0, 2)
    assert window.calls_left(250.0, caps) == 0
    hold = window.hold(250.0, caps)
    assert hold is not None and hold.key == CALLS_KEY and "3 model calls" in hold.reason
    # The call at 100 s leaves the hour at 3700 s: then 2 < 3.
    assert hold.until == 100.0 + HOUR_S
    assert window.hold(hold.until, caps) is None
    assert window.calls_left(hold.until, caps) == 1
    # Just before, still held.
    assert window.hold(hold.until - 1, caps) is not None


def test_the_usd_cap_sums_a_day_and_unpriced_calls_cost_nothing() -> None:
    window = SpendingWindow()
    caps = SpendingCaps(usd_per_day=1.0)
    window.record(0.0, 1, 0.6)
    window.record(10.0, 1, None)  # litellm had no price
    assert window.hold(20.0, caps) is None
    window.record(30.0, 1, 0.5)
    hold = window.hold(40.0, caps)
    assert hold is not None and hold.key == USD_KEY and "$1.1000" in hold.reason
    assert hold.until == 0.0 + DAY_S
    assert window.usd_in_day(DAY_S + 1) == 0.5


def test_both_caps_hold_until_the_later_one_passes() -> None:
    window = SpendingWindow()
    caps = SpendingCaps(calls_per_hour=1, usd_per_day=0.5)
    window.record(0.0, 1, 1.0)
    hold = window.hold(10.0, caps)
    assert hold is not None and hold.key == USD_KEY and hold.until == DAY_S


def test_rows_restored_out_of_order_are_kept_in_time_order() -> None:
    window = SpendingWindow()
    caps = SpendingCaps(calls_per_hour=2)
    window.record(500.0, 1)
    window.record(100.0, 1)  # an older ledger row seen later
    hold = window.hold(600.0, caps)
    assert hold is not None and hold.until == 100.0 + HOUR_S
