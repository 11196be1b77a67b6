"""Spending caps hold compactions back (metric, status line, log line) and let them
resume when the window passes; a made-up clock throughout."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from support.daemon_services import ScriptedCompaction, Services, build_services
from support.memfiles import AgentWorkspace

from memd.core.jobs import AgentJob, JobState
from memd.core.spending import CALLS_KEY, HOUR_S, USD_KEY
from memd.daemon.spending import SpendingGuard
from memd.metrics import Metrics
from memd.workspace import AgentPaths


class MeteredModel:
    """A remote model as the runner sees it (what a compaction with it spent comes
    back in its outcome or on its error: ScriptedCompaction.spent)."""

    model = "openai/metered"


def build(
    tmp_path: Path, agents: tuple[str, ...] = ("alpha",), **caps: object
) -> tuple[Services, MeteredModel, Metrics]:
    ws = AgentWorkspace(tmp_path / "ws")
    for agent in agents:
        ws.create_agent(agent)
    model = MeteredModel()
    extra = {"summarizer": {"model": "openai/metered", **caps}}
    s = build_services(ws, ScriptedCompaction(), extra, summarizer=model)
    metrics = Metrics(process=False)
    s.runner.metrics = metrics
    return s, model, metrics


def compact_when_over(s: Services, agent: str = "alpha") -> None:
    s.fill(agent, 20)
    s.hint(agent)
    s.settle()
    s.scheduler.run_queued()


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_the_call_cap_holds_back_then_the_compaction_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s, _model, metrics = build(tmp_path, max_calls_per_hour=3)
    s.compact.spent = (3, None)
    compact_when_over(s)
    assert s.compact.calls == ["alpha"]
    # The cap left three calls: the compaction was told so.
    assert s.compact.options[0].max_calls == 3
    spent_at = s.clock.now

    s.compact.spent = None
    capsys.readouterr()
    compact_when_over(s)
    assert s.compact.calls == ["alpha"]  # held back: no second compaction
    job = s.job("alpha")
    assert job.state is JobState.COOLDOWN and job.next_attempt_at == spent_at + HOUR_S
    assert job.last_error is not None and CALLS_KEY in job.last_error
    assert "compaction held back by a spending cap" in capsys.readouterr().out
    assert sample(metrics, "memd_spending_cap_holds_total", cap=CALLS_KEY) == 1
    assert s.flusher is not None
    snapshot = s.runner.spending.snapshot()
    assert snapshot.calls_last_hour == 3 and snapshot.held_until == spent_at + HOUR_S
    assert sample(metrics, "memd_spending_cap_holding", cap=CALLS_KEY) == 1
    assert "compactions held back" in s.flusher.status_text(snapshot)

    # Not a second before the hour has passed (the counter sleeps until then) ...
    s.clock.now = spent_at + HOUR_S - 1
    assert s.counter.tick(s.clock.now) == spent_at + HOUR_S
    assert s.scheduler.queued == []
    # ... and at once when it has.
    s.clock.now = spent_at + HOUR_S
    s.counter.tick(s.clock.now)
    s.scheduler.run_queued()
    assert s.compact.calls == ["alpha", "alpha"]
    assert s.job("alpha").state is JobState.IDLE
    assert s.runner.spending.snapshot().held_reason is None
    assert sample(metrics, "memd_spending_cap_holding", cap=CALLS_KEY) == 0


def test_the_usd_cap_holds_for_a_day(tmp_path: Path) -> None:
    s, _model, metrics = build(tmp_path, max_usd_per_day=0.05)
    s.compact.spent = (2, 0.06)
    compact_when_over(s)
    spent_at = s.clock.now
    compact_when_over(s)
    assert s.compact.calls == ["alpha"]
    assert sample(metrics, "memd_spending_cap_holds_total", cap=USD_KEY) == 1
    assert s.job("alpha").next_attempt_at == spent_at + 24 * HOUR_S
    assert s.runner.spending.snapshot().usd_last_day == pytest.approx(0.06)


def test_the_builtin_summarizer_is_never_held_back(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha")
    s = build_services(ws, ScriptedCompaction(), {"summarizer": {"max_calls_per_hour": 1}})
    for _ in range(3):
        compact_when_over(s)
    assert s.compact.calls == ["alpha"] * 3


def test_a_restart_remembers_what_the_ledger_says_was_spent(tmp_path: Path) -> None:
    from memd.state import LedgerEntry, StateStore

    s, _model, _metrics = build(tmp_path, max_calls_per_hour=4)
    store = StateStore.open(tmp_path / "state", s.ws.root)
    row = LedgerEntry(
        "alpha", s.clock.now - 60, 1.0, "a.md", 900, 100, "openai/metered", 0.01, None,
        "daemon", calls=4,
    )  # fmt: skip
    store.record_compaction(row)
    assert s.flusher is not None
    s.flusher.start(contextlib.ExitStack(), store)
    # A restart: seeded from the ledger.
    s.runner.start(contextlib.ExitStack(), s.scheduler)  # type: ignore[arg-type]
    compact_when_over(s)
    assert s.compact.calls == []
    assert s.job("alpha").next_attempt_at == row.started_at + HOUR_S
    store.close()


def guard_of(now: list[float], **caps: object) -> SpendingGuard:
    from memd.settings import build_config

    remote = {"model": "openai/metered", **caps}
    config = build_config({"summarizer": remote}, {})[0].summarizer
    return SpendingGuard(config, lambda: now[0])


def test_the_guard_counts_calls_and_says_once_when_it_cannot_price_them() -> None:
    import structlog

    now = [1000.0]
    guard = guard_of(now, max_calls_per_hour=3, max_usd_per_day=1.0)
    assert guard.calls_left() == 3
    with structlog.testing.capture_logs() as logs:
        guard.settle(guard.reserve(), 1, None)
        guard.settle(guard.reserve(), 1, None)
        guard.settle(guard.reserve(), 1, 0.25)
    unpriced = [line for line in logs if "litellm reports no cost" in line["event"]]
    assert len(unpriced) == 1  # said once, not per request
    assert guard.calls_left() == 0
    hold = guard.hold(AgentJob())
    assert hold is not None and hold.key == CALLS_KEY and hold.until == 1000.0 + HOUR_S
    snapshot = guard.snapshot()
    assert (snapshot.calls_last_hour, snapshot.usd_last_day) == (3, pytest.approx(0.25))
    now[0] += HOUR_S
    assert guard.calls_left() == 3 and guard.hold(AgentJob()) is None


def test_a_reservation_holds_the_hour_until_it_is_settled_to_the_real_use() -> None:
    now = [1000.0]
    guard = guard_of(now, max_calls_per_hour=5)
    first = guard.reserve()
    assert first.calls == 5  # the calls the hour leaves: the compaction's allowance
    # A compaction starting beside it is allowed nothing and held back.
    assert guard.calls_left() == 0 and guard.hold(AgentJob()) is not None
    assert guard.reserve().calls == 0
    now[0] += 10
    guard.settle(first, 2, None)
    assert guard.calls_left() == 3 and guard.hold(AgentJob()) is None
    assert guard.snapshot().calls_last_hour == 2
    # Not known what a crashed compaction used: its reservation stands whole.
    crashed = guard.reserve()
    guard.settle(crashed, None, None)
    assert guard.calls_left() == 0


def test_what_a_compaction_used_is_charged_when_it_ends(tmp_path: Path) -> None:
    s, _model, _metrics = build(tmp_path, max_calls_per_hour=5, max_usd_per_day=1.0)
    s.compact.spent = (2, 0.25)
    compact_when_over(s)
    assert s.compact.options[0].max_calls == 5
    snapshot = s.runner.spending.snapshot()
    # Settled to the real use: red when the reservation (5) is left standing.
    assert (snapshot.calls_last_hour, snapshot.usd_last_day) == (2, pytest.approx(0.25))
    assert s.runner.spending.calls_left() == 3


def test_a_failed_compaction_is_charged_what_it_spent(tmp_path: Path) -> None:
    s, _model, _metrics = build(tmp_path, max_calls_per_hour=5, max_usd_per_day=1.0)
    s.compact.script = ["fail"]
    s.compact.spent = (4, 0.5)  # retries and re-asks before it failed
    compact_when_over(s)
    assert s.compact.calls == ["alpha"]
    snapshot = s.runner.spending.snapshot()
    assert (snapshot.calls_last_hour, snapshot.usd_last_day) == (4, pytest.approx(0.5))
    assert s.runner.spending.calls_left() == 1


def test_compactions_side_by_side_never_pass_the_call_cap_together(tmp_path: Path) -> None:
    s, _model, _metrics = build(tmp_path, ("alpha", "beta"), max_calls_per_hour=4)
    s.compact.spent = (4, None)
    for agent in ("alpha", "beta"):
        s.fill(agent, 20)
        s.hint(agent)
    s.settle()
    queued = s.scheduler.queued
    assert sorted(key for key, _task, _args in queued) == ["compact:alpha", "compact:beta"]
    beta_job = [job for job in queued if job[0] == "compact:beta"]
    s.scheduler.queued = [job for job in queued if job[0] == "compact:alpha"]

    def beta_starts_meanwhile(paths: AgentPaths) -> None:
        # alpha's compaction is running (what it spends not yet reported):
        # beta's job starts beside it.
        if paths.agent == "alpha":
            s.scheduler.queued = beta_job
            s.scheduler.run_queued()

    s.compact.during = beta_starts_meanwhile
    s.scheduler.run_queued()
    allowed = [options.max_calls for options in s.compact.options]
    # Red without the reservation: beta is allowed the same 4 calls (8 in the hour).
    assert s.compact.calls == ["alpha"], allowed
    job = s.job("beta")
    assert job.state is JobState.COOLDOWN
    assert job.last_error is not None and CALLS_KEY in job.last_error
    assert s.runner.spending.snapshot().calls_last_hour == 4


def test_an_agent_held_by_a_reservation_starts_once_it_is_settled_to_less(
    tmp_path: Path,
) -> None:
    s, _model, _metrics = build(tmp_path, ("alpha", "beta"), max_calls_per_hour=4)
    s.compact.spent = (1, None)  # alpha reserves 4 calls and uses 1
    for agent in ("alpha", "beta"):
        s.fill(agent, 20)
        s.hint(agent)
    s.settle()
    queued = s.scheduler.queued
    beta_job = [job for job in queued if job[0] == "compact:beta"]
    s.scheduler.queued = [job for job in queued if job[0] == "compact:alpha"]

    def beta_starts_meanwhile(paths: AgentPaths) -> None:
        if paths.agent == "alpha":
            s.scheduler.queued = beta_job
            s.scheduler.run_queued()
            assert s.job("beta").next_attempt_at == s.clock.now + HOUR_S  # alpha's 4

    s.compact.during = beta_starts_meanwhile
    s.scheduler.run_queued()
    assert s.compact.calls == ["alpha"]
    # Settled to 1 call: beta's hold ends now (red when it waits out the hour).
    assert s.job("beta").next_attempt_at == s.clock.now
    s.counter.tick(s.clock.now)
    s.scheduler.run_queued()
    assert s.compact.calls == ["alpha", "beta"]
    assert s.compact.options[1].max_calls == 3
    assert s.runner.spending.snapshot().calls_last_hour == 2
