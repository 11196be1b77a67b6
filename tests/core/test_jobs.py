from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memd.core.config import DaemonConfig
from memd.core.jobs import (
    NOT_COMPACTABLE,
    AgentJob,
    JobState,
    RetryPolicy,
    Wakes,
    cooldown_left,
    held_back,
    on_busy_elsewhere,
    on_count,
    on_drain_owed,
    on_failure,
    on_held,
    on_hold_moved,
    on_nothing_to_compact,
    on_started,
    on_success,
    restored_job,
    stored_state,
)
from memd.core.spending import DAY_S

POLICY = RetryPolicy(
    retry_base_s=5, retry_max_s=60, cooldown_s=30, breaker_failures=3, breaker_reset_s=600
)


def test_below_threshold_stays_idle_and_over_threshold_starts() -> None:
    job = AgentJob()
    d = on_count(job, 99, 100, True, 0)
    assert d.job.state is JobState.IDLE and not d.start
    d = on_count(job, 100, 100, True, 0)
    assert d.job.state is JobState.PENDING and d.start


def test_trigger_while_running_sets_rerun_and_runs_once_more() -> None:
    d = on_count(AgentJob(), 150, 100, True, 0)
    job = on_started(d.job)
    again = on_count(job, 160, 100, True, 1)
    assert not again.start and again.job.rerun_requested
    assert not on_count(again.job, 170, 100, True, 2).start  # still one job
    # the run ended well below low water, but late appends put it over again
    after = on_success(
        again.job,
        achieved_tokens=10,
        current_tokens=120,
        threshold_tokens=100,
        low_water_tokens=60,
        compress=True,
        policy=POLICY,
        now=3,
    )
    assert after.start and after.job.state is JobState.PENDING
    assert after.job.consecutive_failures == 0 and after.job.last_compaction_at == 3


def test_success_after_compression_was_turned_off_never_queues_again() -> None:
    job = on_started(on_count(AgentJob(), 150, 100, True, 0).job)
    # A reload set context_compression = false during the job; appends kept it over.
    d = on_success(
        job,
        achieved_tokens=10,
        current_tokens=120,
        threshold_tokens=100,
        low_water_tokens=60,
        compress=False,
        policy=POLICY,
        now=3,
    )
    assert d.job.state is JobState.DISABLED and not d.start


def test_success_below_low_water_goes_idle() -> None:
    job = on_started(on_count(AgentJob(), 150, 100, True, 0).job)
    d = on_success(
        job,
        achieved_tokens=20,
        current_tokens=20,
        threshold_tokens=100,
        low_water_tokens=60,
        compress=True,
        policy=POLICY,
        now=5,
    )
    assert d.job.state is JobState.IDLE and not d.start and d.wake_at is None


def test_hysteresis_cooldown_instead_of_retrigger() -> None:
    job = on_started(on_count(AgentJob(), 150, 100, True, 0).job)
    d = on_success(
        job,
        achieved_tokens=110,
        current_tokens=110,
        threshold_tokens=100,
        low_water_tokens=60,
        compress=True,
        policy=POLICY,
        now=10,
    )
    assert d.job.state is JobState.COOLDOWN and not d.start and d.wake_at == 40
    # counts during the cooldown do not start a job
    held = on_count(d.job, 200, 100, True, 39)
    assert not held.start and held.wake_at == 40
    # after it, a still-large file is tried again
    assert on_count(d.job, 200, 100, True, 40).start


def test_cooldown_left_is_told_only_for_a_cooldown_memd_compacts_after() -> None:
    """What the socket's status says an agent (memd_swarms) may wait for: the rest of
    a cooldown memd ends with a compaction; none for one after nothing to compact."""
    job = on_started(on_count(AgentJob(), 150, 100, True, 0).job)
    cooled = on_success(
        job,
        achieved_tokens=70,
        current_tokens=70,
        threshold_tokens=100,
        low_water_tokens=60,
        compress=True,
        policy=POLICY,
        now=10,
    ).job
    assert cooldown_left(cooled, 25) == 15 and cooldown_left(cooled, 41) == 0
    assert cooldown_left(on_busy_elsewhere(job, "compact-now", policy=POLICY, now=10).job, 12) == 3
    assert cooldown_left(on_held(job, "max_calls_per_hour", until=100).job, 40) == 60
    assert cooldown_left(on_nothing_to_compact(job, policy=POLICY, now=10).job, 20) is None
    assert cooldown_left(job, 20) is None and cooldown_left(AgentJob(), 20) is None


def test_backoff_is_exponential_and_capped_then_breaker_opens() -> None:
    assert [POLICY.backoff_delay(n) for n in (1, 2, 3, 4, 5)] == [5, 10, 20, 40, 60]
    job = on_started(on_count(AgentJob(), 150, 100, True, 0).job)
    d = on_failure(job, "boom", policy=POLICY, now=0)
    assert d.job.state is JobState.BACKOFF and d.wake_at == 5 and d.job.last_error == "boom"
    assert not on_count(d.job, 150, 100, True, 4).start
    d2 = on_failure(on_started(on_count(d.job, 150, 100, True, 5).job), "x", policy=POLICY, now=5)
    assert d2.job.state is JobState.BACKOFF and d2.wake_at == 15
    d3 = on_failure(
        on_started(on_count(d2.job, 150, 100, True, 15).job), "y", policy=POLICY, now=15
    )
    assert d3.job.state is JobState.BREAKER_OPEN and d3.wake_at == 615
    assert not on_count(d3.job, 150, 100, True, 600).start
    # half-open after the reset: one attempt; another failure reopens at once
    trial = on_count(d3.job, 150, 100, True, 615)
    assert trial.start
    reopened = on_failure(on_started(trial.job), "z", policy=POLICY, now=616)
    assert reopened.job.state is JobState.BREAKER_OPEN
    ok = on_success(
        on_started(on_count(reopened.job, 150, 100, True, 1300).job),
        achieved_tokens=1,
        current_tokens=1,
        threshold_tokens=100,
        low_water_tokens=60,
        compress=True,
        policy=POLICY,
        now=1301,
    )
    assert ok.job.state is JobState.IDLE and ok.job.consecutive_failures == 0


def test_compress_off_is_counted_never_compacted() -> None:
    d = on_count(AgentJob(), 10**9, 100, False, 0)
    assert d.job.state is JobState.DISABLED and not d.start


def test_nothing_to_compact_and_busy_elsewhere_wait_without_counting_failures() -> None:
    job = on_started(on_count(AgentJob(), 150, 100, True, 0).job)
    d = on_nothing_to_compact(job, policy=POLICY, now=0)
    assert d.job.state is JobState.COOLDOWN and d.wake_at == 30
    # Still over threshold and stuck: the operator must see why.
    assert d.job.last_error == NOT_COMPACTABLE
    b = on_busy_elsewhere(job, "agent 'a': another compaction holds its lock", policy=POLICY, now=0)
    assert b.job.state is JobState.COOLDOWN and b.job.consecutive_failures == 0
    assert b.wake_at == b.job.next_attempt_at == POLICY.retry_base_s


def test_busy_elsewhere_reads_as_a_wait_with_its_reason_never_as_an_error() -> None:
    # `memd status` shows the stored state: a backoff is stored as "error", which a
    # lock held by compact-now, forget or a second daemon is not.
    job = on_started(on_count(AgentJob(), 150, 100, True, 0).job)
    failed = on_failure(job, "HTTP 500", policy=POLICY, now=0).job
    again = on_started(on_count(failed, 150, 100, True, 100).job)
    busy = on_busy_elsewhere(
        again, "agent 'a': another compaction holds its lock", policy=POLICY, now=100
    ).job
    assert stored_state(busy) == "cooldown"
    assert busy.last_error == "busy: agent 'a': another compaction holds its lock"
    assert busy.consecutive_failures == 1  # neither counted nor forgiven
    assert not held_back(busy)  # not a spending cap's hold


def test_policy_from_config() -> None:
    p = RetryPolicy.from_config(DaemonConfig(retry_base_s=1, breaker_failures=2))
    assert p.retry_base_s == 1 and p.breaker_failures == 2


_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["count", "ok", "low", "fail", "nothing", "busy"]), st.integers(0, 300)
    ),
    max_size=80,
)


@given(_EVENTS)
def test_never_two_jobs_and_never_a_silent_drop(events: list[tuple[str, int]]) -> None:
    """Model a daemon: at most one job in flight; an over-threshold count while a
    job runs always leads to another start once the job ends healthily."""
    job = AgentJob()
    in_flight = False
    now = 0.0
    for kind, tokens in events:
        now += 7
        if kind == "count" or not in_flight:
            d = on_count(job, tokens, 100, True, now)
            if d.start:
                assert not in_flight
                in_flight = True
                job = on_started(d.job)
            else:
                job = d.job
            continue
        rerun = job.rerun_requested
        if kind in ("ok", "low"):
            achieved = 10 if kind == "ok" else 90
            d = on_success(
                job,
                achieved_tokens=achieved,
                current_tokens=tokens,
                threshold_tokens=100,
                low_water_tokens=60,
                compress=True,
                policy=POLICY,
                now=now,
            )
            if kind == "ok" and tokens >= 100:
                assert d.start  # the pending trigger is honoured
            if rerun and kind == "low" and tokens >= 100:
                assert d.wake_at is not None  # held, not dropped
        elif kind == "fail":
            d = on_failure(job, "e", policy=POLICY, now=now)
            assert d.wake_at is not None
        elif kind == "nothing":
            d = on_nothing_to_compact(job, policy=POLICY, now=now)
        else:
            d = on_busy_elsewhere(job, "busy", policy=POLICY, now=now)
        in_flight = d.start
        job = on_started(d.job) if d.start else d.job
        assert d.start or job.state not in (JobState.PENDING, JobState.RUNNING)


def test_dropping_under_threshold_clears_a_breaker_and_its_error() -> None:
    """compact-now (or forget) fixed what the daemon's attempts could not."""
    job = on_started(on_count(AgentJob(), 150, 100, True, 0).job)
    for now in range(3):
        job = on_failure(job, "HTTP 500", policy=POLICY, now=now).job
    assert job.state is JobState.BREAKER_OPEN
    healed = on_count(job, 40, 100, True, 10).job
    assert healed.state is JobState.IDLE
    assert (healed.last_error, healed.consecutive_failures, healed.next_attempt_at) == (
        None,
        0,
        None,
    )
    # And the next time it grows over threshold it is compacted at once.
    assert on_count(healed, 150, 100, True, 11).start


def test_one_spelling_of_the_stored_state() -> None:
    from memd.core.jobs import restored_job, stored_state

    # The stored values (state DB, `memd status --json`) stay as they were.
    assert stored_state(AgentJob(state=JobState.BACKOFF)) == "error"
    assert stored_state(AgentJob(state=JobState.BREAKER_OPEN)) == "breaker_open"
    assert stored_state(AgentJob(state=JobState.IDLE), count_failed=True) == "error"
    assert {stored_state(AgentJob(state=s)) for s in JobState} == {
        "idle",
        "pending",
        "running",
        "cooldown",
        "error",
        "breaker_open",
        "disabled",
    }
    history = {"consecutive_failures": 2, "last_error": "boom", "last_compaction_at": 5.0}
    held = restored_job("error", next_attempt_at=200.0, now=100.0, **history)
    assert held.state is JobState.BACKOFF and held.next_attempt_at == 200.0
    assert held.consecutive_failures == 2 and held.last_error == "boom"
    for stored, state in (("cooldown", JobState.COOLDOWN), ("breaker_open", JobState.BREAKER_OPEN)):
        assert restored_job(stored, next_attempt_at=200.0, now=100.0, **history).state is state
    expired = restored_job("breaker_open", next_attempt_at=50.0, now=100.0, **history)
    assert expired.state is JobState.IDLE and expired.consecutive_failures == 2
    assert (
        restored_job("running", next_attempt_at=200.0, now=100.0, **history).state is JobState.IDLE
    )


def test_appends_during_a_compaction_mean_again_after_the_minimum_interval() -> None:
    policy = RetryPolicy(cooldown_s=60, min_interval_s=2)
    job = on_started(on_count(AgentJob(), 150, 100, True, 0).job)
    # The compaction produced 20 tokens; writers added 130 meanwhile.
    after = on_success(
        job,
        achieved_tokens=20,
        current_tokens=150,
        threshold_tokens=100,
        low_water_tokens=60,
        compress=True,
        policy=policy,
        now=10,
    )
    assert after.job.state is JobState.IDLE and not after.start and after.wake_at == 12
    # Counts before the interval is up only schedule; after it, a compaction starts.
    early = on_count(after.job, 170, 100, True, 11, min_interval_s=2)
    assert not early.start and early.wake_at == 12 and early.job.state is JobState.IDLE
    due = on_count(after.job, 180, 100, True, 12, min_interval_s=2)
    assert due.start and due.job.state is JobState.PENDING


def test_count_at_once_only_when_the_appends_could_reach_the_threshold() -> None:
    from memd.core.jobs import appends_could_reach

    assert not appends_could_reach(99, 900, 1000)
    assert appends_could_reach(100, 900, 1000)
    assert not appends_could_reach(10_000, 1000, 1000)  # already over: a job is on its way


def test_wakes_keep_the_latest_time_per_agent_and_hand_each_out_once() -> None:
    wakes = Wakes()
    assert wakes.next() is None and wakes.pop_due(0.0) == []
    wakes.set("a", 30.0)
    wakes.set("b", 20.0)
    wakes.set("a", 10.0)  # a later decision replaces the earlier time
    wakes.set("c", 25.0)
    wakes.set("c", 25.0)  # said again (every count during a hold): still one
    wakes.drop("b")  # forgotten: never due
    assert wakes.next() == 10.0
    assert wakes.pop_due(9.9) == []
    assert wakes.pop_due(10.0) == ["a"]  # due at its time, not before
    assert wakes.next() == 25.0  # a's replaced 30 is gone, b dropped
    assert wakes.pop_due(100.0) == ["c"]
    assert wakes.next() is None and wakes.pop_due(100.0) == []


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.one_of(st.none(), st.integers(0, 50))), max_size=30
    ),
    st.integers(0, 60),
)
def test_wakes_agree_with_a_plain_table(ops: list[tuple[str, int | None]], now: int) -> None:
    wakes, table = Wakes(), {}
    for name, when in ops:  # None: drop
        if when is None:
            wakes.drop(name)
            table.pop(name, None)
        else:
            wakes.set(name, float(when))
            table[name] = float(when)
    assert wakes.next() == (min(table.values()) if table else None)
    due = sorted(name for name, when in table.items() if when <= now)
    assert sorted(wakes.pop_due(float(now))) == due
    rest = [when for name, when in table.items() if name not in due]
    assert wakes.next() == (min(rest) if rest else None)


def test_a_hold_moved_sooner_stays_a_hold_and_starts_at_its_new_time() -> None:
    held = on_held(AgentJob(), "4 model calls in the last hour", until=3600.0).job
    assert held_back(held) and not held_back(AgentJob())
    assert not held_back(on_failure(AgentJob(), "boom", policy=POLICY, now=0).job)
    moved = on_hold_moved(held, until=10.0)
    assert moved.wake_at == 10.0 and held_back(moved.job)
    assert moved.job.next_attempt_at == 10.0 and moved.job.last_error == held.last_error
    assert not on_count(moved.job, 200, 100, True, 9.0).start
    assert on_count(moved.job, 200, 100, True, 10.0).start


def test_an_owed_drain_starts_at_its_time_whatever_the_count() -> None:
    from memd.core.jobs import drain_owed_error, on_drain_finished, on_drain_owed, restored_job

    running = on_started(on_count(AgentJob(consecutive_failures=1), 150, 100, True, 0).job)
    owed = on_drain_owed(running, drain_owed_error("EIO"), policy=POLICY, now=10, committed=True)
    job = owed.job
    assert job.state is JobState.BACKOFF and job.drain_owed and owed.wake_at == 15
    assert job.last_compaction_at == 10 and job.consecutive_failures == 1  # not a model failure
    # Under the threshold, compression off: not due yet, then started (the finish).
    assert on_count(job, 10, 100, False, 14) == type(owed)(job, wake_at=15)
    due = on_count(job, 10, 100, False, 15)
    assert due.start and due.job.state is JobState.PENDING and due.job.drain_owed
    # Failing again: backoff doubling, never the breaker.
    again = job
    for n, delay in ((2, 10), (3, 20), (4, 40), (5, 60), (6, 60)):
        again = on_drain_owed(on_started(again), "ENOSPC", policy=POLICY, now=100).job
        assert again.drain_attempts == n and again.next_attempt_at == 100 + delay
        assert again.state is JobState.BACKOFF
    # Another compactor holding the lock keeps it owed.
    busy = on_busy_elsewhere(on_started(again), "busy", policy=POLICY, now=200).job
    assert busy.drain_owed and on_count(busy, 10, 100, True, 205).start
    # ... and its marker (review 16c F1): status tells the late turns are missing,
    # a restart keeps the drain owed; retried after retry_base_s, not an attempt.
    assert busy.state is JobState.BACKOFF and stored_state(busy) == "error"
    assert busy.last_error == drain_owed_error("busy: busy")
    assert busy.next_attempt_at == 205 and busy.drain_attempts == again.drain_attempts
    assert restored_job(
        stored_state(busy),
        consecutive_failures=busy.consecutive_failures,
        last_error=busy.last_error,
        last_compaction_at=busy.last_compaction_at,
        next_attempt_at=busy.next_attempt_at,
        now=300,
    ).drain_owed
    # Done: as after a compaction; the count decides what next.
    done = on_drain_finished(
        on_started(busy),
        current_tokens=150,
        threshold_tokens=100,
        compress=True,
        policy=POLICY,
        now=300,
    )
    assert not done.job.drain_owed and done.job.drain_attempts == 0
    assert done.job.last_error is None and done.start  # over the threshold: compact


def test_a_restart_keeps_a_stored_owed_drain_owed_and_due_at_once() -> None:
    # Review 16a F2: the restart's recovery may have failed (the disk still full);
    # only a finish run can tell, so the drain stays owed, due now, its error shown.
    from memd.core.jobs import drain_owed_error, restored_job

    error = drain_owed_error("EIO")
    restored = restored_job(
        "error",
        consecutive_failures=0,
        last_error=error,
        last_compaction_at=5.0,
        next_attempt_at=1000.0,
        now=10.0,
    )
    assert restored == AgentJob(
        state=JobState.BACKOFF,
        drain_owed=True,
        next_attempt_at=10.0,
        last_error=error,
        last_compaction_at=5.0,
    )
    # Its first decision runs the finish, whatever the count says.
    decision = on_count(restored, 0, 1000, True, 10.0)
    assert decision.start and decision.job.drain_owed


def test_a_journal_left_unfinished_outside_the_daemons_jobs_owes_the_drain() -> None:
    # The daemon's own recovery failed (an agent added, a start-up): retried after
    # the backoff, the reason shown. Another process's compaction left it (it may
    # still be at work): tried at once, no error shown until a run says one.
    from memd.core.jobs import on_drain_owed, on_unfinished_journal

    failed = AgentJob(state=JobState.BACKOFF, consecutive_failures=1, last_error="model down")
    owed = on_unfinished_journal(failed, "ENOSPC", policy=POLICY, now=10.0)
    assert owed.drain_owed and owed.state is JobState.BACKOFF and owed.drain_attempts == 1
    assert owed.next_attempt_at == 15.0 and "ENOSPC" in (owed.last_error or "")
    assert owed.last_error and owed.last_error.startswith("late turns not yet in MEMORY.md")
    assert owed.consecutive_failures == 1  # the model's failures are kept, not added to
    assert on_count(owed, 0, 100, False, 14.0).wake_at == 15.0
    assert on_count(owed, 0, 100, False, 15.0).start  # even with compression off
    elsewhere = on_unfinished_journal(AgentJob(), None, policy=POLICY, now=10.0)
    assert elsewhere.drain_owed and elsewhere.last_error is None
    assert on_count(elsewhere, 0, 100, True, 10.0).start  # at once
    # Its finish meeting that process's lock (a compact-now still draining) is a
    # plain busy wait, never `error`: no run has said the late turns are missing.
    started = on_started(on_count(elsewhere, 0, 100, True, 10.0).job)
    busy = on_busy_elsewhere(started, "held", policy=POLICY, now=11.0).job
    assert busy.state is JobState.COOLDOWN and stored_state(busy) == "cooldown"
    assert busy.last_error == "busy: held" and busy.drain_owed
    assert on_count(busy, 0, 100, True, 16.0).start  # tried again after retry_base_s
    # A try that fails says so: from then on, the owed drain's shape.
    failed = on_drain_owed(on_started(busy), "ENOSPC", policy=POLICY, now=16.0).job
    assert not failed.drain_suspected
    again = on_busy_elsewhere(on_started(failed), "held", policy=POLICY, now=30.0).job
    assert stored_state(again) == "error"
    # A job of its own pending or running, or a drain already owed: left alone.
    for job in (AgentJob(state=JobState.RUNNING), owed):
        assert on_unfinished_journal(job, "EIO", policy=POLICY, now=20.0) is job


def test_a_hold_set_before_the_wall_clock_went_back_lasts_no_longer_than_memd_sets() -> None:
    """Holds are wall-clock times (stored, they outlive a restart): after a step
    back of an hour, a cooldown of 30 s was an hour and 30 s away, and the agent
    over its threshold waited it out. Each hold now ends within the longest
    memd sets in its state, said once (a count later does not push it on)."""
    t = 10_000.0
    back = t - 3600  # the clock stepped back an hour
    cooled = replace(AgentJob(), state=JobState.COOLDOWN, next_attempt_at=t + 0.6)
    held = on_count(cooled, 200, 100, True, back, policy=POLICY)
    assert not held.start and held.wake_at == back + POLICY.cooldown_s
    assert held.job.next_attempt_at == back + POLICY.cooldown_s  # stored so
    later = on_count(held.job, 200, 100, True, back + 10, policy=POLICY)
    assert later.wake_at == back + POLICY.cooldown_s  # not cut again from the later count
    assert on_count(held.job, 200, 100, True, back + POLICY.cooldown_s, policy=POLICY).start
    # A backoff within retry_max_s, an open breaker within breaker_reset_s.
    failed = on_failure(AgentJob(), "boom", policy=POLICY, now=t).job
    assert on_count(failed, 200, 100, True, t - 30, policy=POLICY).wake_at == t + 5  # kept
    assert on_count(failed, 200, 100, True, back, policy=POLICY).wake_at == back + 60
    broken = replace(failed, state=JobState.BREAKER_OPEN, next_attempt_at=t + 600)
    assert on_count(broken, 200, 100, True, back, policy=POLICY).wake_at == back + 600
    # An owed drain's backoff too (it starts whatever the count).
    owed = on_drain_owed(AgentJob(), "disk full", policy=POLICY, now=t, committed=True).job
    assert on_count(owed, 10, 100, True, back, policy=POLICY).wake_at == back + POLICY.retry_max_s
    # A spending cap holds up to a day: a hold within it is kept, one past it cut.
    spent = on_held(AgentJob(), "4 model calls in the last hour", until=t + 3000).job
    assert on_count(spent, 200, 100, True, back, policy=POLICY).wake_at == t + 3000
    far = on_count(spent, 200, 100, True, t - 2 * DAY_S, policy=POLICY)
    assert far.wake_at == t - DAY_S and held_back(far.job)
    # A hold within its length is never touched (a steady clock: the same job).
    steady = on_count(cooled, 200, 100, True, t, policy=POLICY)
    assert steady.job is cooled and steady.wake_at == t + 0.6


def test_a_compaction_recorded_after_now_counts_as_one_just_now() -> None:
    """The least interval between compactions runs from the last one: recorded an
    hour ahead of a clock stepped back, it held the agent for that hour."""
    policy = replace(POLICY, min_interval_s=2.0)
    t = 10_000.0
    done = replace(AgentJob(), last_compaction_at=t)
    d = on_count(done, 200, 100, True, t - 3600, min_interval_s=2.0, policy=policy)
    assert not d.start and d.wake_at == t - 3600 + 2.0 and d.job.last_compaction_at == t - 3600
    assert on_count(d.job, 200, 100, True, t - 3600 + 2.0, min_interval_s=2.0, policy=policy).start


def test_a_restart_after_the_clock_went_back_cuts_the_stored_hold_at_the_first_count() -> None:
    t = 10_000.0
    job = restored_job(
        "breaker_open",
        consecutive_failures=3,
        last_error="boom",
        last_compaction_at=t,
        next_attempt_at=t + 600,
        now=t - 7200,
    )
    assert job.state is JobState.BREAKER_OPEN  # a hold still holds
    d = on_count(job, 200, 100, True, t - 7200, policy=POLICY)
    assert d.wake_at == t - 7200 + POLICY.breaker_reset_s


def test_the_cooldown_an_agent_is_told_is_no_longer_than_memd_lets_it_last() -> None:
    """``cooldown_left_s`` on the socket (memd_swarms waits on it): bounded the same
    way, before any count cut the hold."""
    t = 10_000.0
    cooled = replace(AgentJob(), state=JobState.COOLDOWN, next_attempt_at=t + 0.6)
    assert cooldown_left(cooled, t - 3600) == pytest.approx(3600.6)  # no policy: as stored
    assert cooldown_left(cooled, t - 3600, POLICY) == POLICY.cooldown_s
    assert cooldown_left(cooled, t, POLICY) == pytest.approx(0.6)


def test_every_wake_up_is_due_when_the_clock_goes_back() -> None:
    """Wake-ups are wall-clock times: set before a step back of an hour, they came
    an hour late; now every one is due at once, to be decided again."""
    wakes = Wakes()
    wakes.set("a", 1030.0)
    wakes.set("b", 1005.0)
    assert wakes.pop_due(1000.0) == []
    assert sorted(wakes.pop_due(1000.0 - 3600)) == ["a", "b"]
    assert wakes.next() is None
    wakes.set("a", 1000.0 - 3600 + 30)
    assert wakes.pop_due(1000.0 - 3600 + 1) == []  # on from the new reading
    assert wakes.pop_due(1000.0 - 3600 + 30) == ["a"]
