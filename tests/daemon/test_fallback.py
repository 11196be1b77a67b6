"""A remote model that keeps failing never lets an agent's memory outgrow its window."""

from __future__ import annotations

import contextlib
from pathlib import Path

from support.daemon_services import ScriptedCompaction, Services, build_services
from support.memfiles import AgentWorkspace

from memd.core.jobs import JobState


class DownModel:
    model = "openai/down"


def retry(s: Services, agent: str) -> None:
    """Wait out the backoff and run the retry."""
    job = s.job(agent)
    assert job.next_attempt_at is not None
    s.clock.now = job.next_attempt_at
    s.counter.tick(s.clock.now)  # the wake-up is due: counted, decided, queued
    assert len(s.scheduler.queued) == 1
    s.scheduler.run_queued()


def build(tmp_path: Path, fallback_after: int) -> Services:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha")
    extra = {"summarizer": {"fallback_after": fallback_after}, "daemon": {"breaker_failures": 9}}
    s = build_services(ws, ScriptedCompaction("fail", "fail"), extra, summarizer=DownModel())
    s.fill("alpha", 20)
    s.hint("alpha")
    s.settle()
    s.scheduler.run_queued()
    return s


def test_after_fallback_after_failures_the_builtin_summarizer_compacts(tmp_path: Path) -> None:
    s = build(tmp_path, fallback_after=2)
    retry(s, "alpha")
    assert s.job("alpha").consecutive_failures == 2
    retry(s, "alpha")
    assert s.compact.models == ["openai/down", "openai/down", "builtin"]
    job = s.job("alpha")
    assert job.state is JobState.IDLE and job.consecutive_failures == 0


def test_zero_never_falls_back(tmp_path: Path) -> None:
    s = build(tmp_path, fallback_after=0)
    retry(s, "alpha")
    retry(s, "alpha")
    assert s.compact.models == ["openai/down"] * 3


def test_the_fallback_is_in_the_ledger_and_in_status(tmp_path: Path) -> None:
    from memd.cli.status_query import collect_status
    from memd.settings import LoadedConfig
    from memd.state import StateStore

    s = build(tmp_path, fallback_after=2)
    assert s.flusher is not None
    store = StateStore.open(tmp_path / "state", s.ws.root)
    s.flusher.start(contextlib.ExitStack(), store)
    retry(s, "alpha")
    retry(s, "alpha")  # the third attempt: the builtin stands in
    assert s.compact.models == ["openai/down", "openai/down", "builtin"]
    ok, failed = store.history("alpha")
    assert ok.ok and ok.fallback and ok.model == "scripted"
    assert not failed.ok and not failed.fallback
    loaded = LoadedConfig(s.runner.config, None, s.ws.root, ())
    [row], _beat = collect_status(loaded, store, ["alpha"], strict=True)
    assert row.last_fallback and row.to_json()["last_compaction_fallback"] is True
    store.close()
