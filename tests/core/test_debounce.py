from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from memd.core.debounce import Debouncer


def test_trailing_quiet_period_releases_once() -> None:
    d: Debouncer[str] = Debouncer(quiet_s=0.5, max_wait_s=5)
    d.touch("a", 0.0)
    d.touch("a", 0.3)
    assert d.pop_due(0.7) == []  # last touch at 0.3, quiet until 0.8
    assert d.next_deadline() == 0.8
    assert d.pop_due(0.8) == ["a"]
    assert d.pop_due(10) == []
    assert len(d) == 0


def test_max_wait_bounds_a_continuous_burst() -> None:
    d: Debouncer[str] = Debouncer(quiet_s=0.5, max_wait_s=2)
    released = []
    for tick in range(100):
        t = tick / 10
        d.touch("a", t)
        released += [t for _ in d.pop_due(t)]
    # touches every 0.1 s never leave 0.5 s of quiet: only the ceiling fires
    assert len(released) >= 4
    gaps = [b - a for a, b in itertools.pairwise(released)]
    assert all(g <= 2.1 + 1e-6 for g in gaps)


def test_keys_are_independent_and_due_in_deadline_order() -> None:
    d: Debouncer[str] = Debouncer(quiet_s=1, max_wait_s=0)
    d.touch("b", 0.5)
    d.touch("a", 0.0)
    d.touch("c", 5.0)
    assert d.pop_due(1.6) == ["a", "b"]
    assert "c" in d
    d.cancel("c")
    assert d.next_deadline() is None


@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 0.4)), min_size=1, max_size=60),
    st.floats(0.01, 1),
    st.floats(0, 3),
)
def test_every_touched_key_is_released_within_its_bounds(
    events: list[tuple[str, float]], quiet: float, max_wait: float
) -> None:
    d: Debouncer[str] = Debouncer(quiet_s=quiet, max_wait_s=max_wait)
    now = 0.0
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for key, gap in events:
        now += gap
        for k in d.pop_due(now):
            # released no earlier than its deadline and no later than the bound
            bound = last[k] + quiet
            if max_wait > 0:
                bound = min(bound, first[k] + max_wait)
            assert bound <= now + 1e-9
            del first[k], last[k]
        d.touch(key, now)
        first.setdefault(key, now)
        last[key] = now
    deadline = d.next_deadline()
    assert deadline is not None
    released = d.pop_due(now + quiet + max_wait + 1)
    assert sorted(released) == sorted(first)
