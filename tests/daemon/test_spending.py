"""Spending caps hold compactions back (metric, status line, log line) and let them
resume when the window passes; a made-up clock throughout."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest
from support.daemon_services import ScriptedCompaction, Services, build_services
from support.memfiles import AgentWorkspace

from memd.core.jobs import AgentJob, JobState
from memd.core.spending import CALLS_KEY, HOUR_S, USD_KEY
from memd.metrics import Metrics
from memd.workspace import AgentPaths


class MeteredModel:
    """A remote model as the runner sees it: it reports each request to the meter."""

    model = "openai/metered"

    def __init__(self) -> None:
        self.meter: Callable[[float | None], None] | None = None

    def attach_meter(self, meter: Callable[[float | None], None]) -> None:
        self.meter = meter

    def requests(self, count: int, usd: float | None = None) -> Callable[[AgentPaths], None]:
        def during(_paths: AgentPaths) -> None:
            assert self.meter is not None
            for _ in range(count):
                self.meter(usd)

        return during


def build(tmp_path: Path, **caps: object) -> tuple[Services, MeteredModel, Metrics]:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha")
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
    s, model, metrics = build(tmp_path, max_calls_per_hour=3)
    s.compact.during = model.requests(3)
    compact_when_over(s)
    assert s.compact.calls == ["alpha"]
    # The cap left three calls: the compaction was told so.
    assert s.compact.options[0].max_calls == 3
    spent_at = s.clock.now

    s.compact.during = None
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
    s, model, metrics = build(tmp_path, max_usd_per_day=0.05)
    s.compact.during = model.requests(2, usd=0.03)
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


def test_the_guard_counts_calls_and_says_once_when_it_cannot_price_them() -> None:
    import structlog

    from memd.daemon.spending import SpendingGuard
    from memd.settings import build_config

    remote = {"model": "openai/metered", "max_calls_per_hour": 3, "max_usd_per_day": 1.0}
    config = build_config({"summarizer": remote}, {})[0].summarizer
    now = [1000.0]
    guard = SpendingGuard(config, lambda: now[0])
    assert guard.calls_left() == 3
    with structlog.testing.capture_logs() as logs:
        guard.charge(None)
        guard.charge(None)
        guard.charge(0.25)
    unpriced = [line for line in logs if "litellm reports no cost" in line["event"]]
    assert len(unpriced) == 1  # said once, not per request
    assert guard.calls_left() == 0
    hold = guard.hold(AgentJob())
    assert hold is not None and hold.key == CALLS_KEY and hold.until == 1000.0 + HOUR_S
    snapshot = guard.snapshot()
    assert (snapshot.calls_last_hour, snapshot.usd_last_day) == (3, pytest.approx(0.25))
    now[0] += HOUR_S
    assert guard.calls_left() == 3 and guard.hold(AgentJob()) is None
