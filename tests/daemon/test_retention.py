"""The daemon's retention service, with a scripted prune: who is pruned, how, when it stops."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from support.memfiles import AgentWorkspace

from memd.audit import AuditLog, read_audit
from memd.core.config import MemdConfig
from memd.core.retention import ArchiveInfo, PrunePlan, RetentionLimits
from memd.daemon.archives import ArchiveSurvey
from memd.daemon.recall import RecallStage
from memd.daemon.registry import AgentRegistry
from memd.daemon.retention import RetentionService
from memd.errors import CompactionAborted, LockTimeout
from memd.retention import PruneResult
from memd.settings import build_config
from memd.workspace import AgentPaths, agent_paths


def service(
    tmp_path: Path, agents: list[str], data: dict[str, Any]
) -> tuple[RetentionService, DroppedRows]:
    ws = AgentWorkspace(tmp_path / "ws")
    for name in agents:
        ws.create_agent(name)
    config: MemdConfig = build_config(data, {})[0]
    registry = AgentRegistry(
        ws.root, config, recover=lambda _paths, _key: None, context_length_of=None
    )
    registry.start(contextlib.ExitStack())
    entries = [e for name in sorted(registry.scan()) if (e := registry.make_entry(name))]
    registry.register(entries, set())
    audit = AuditLog(tmp_path / "w.audit.jsonl", "daemon")
    recall = DroppedRows(None, ws.root, config, registry)
    return RetentionService(registry, ArchiveSurvey(registry), recall, audit, config), recall


class DroppedRows(RecallStage):
    """The recall stage, recording which agents' pruned rows it was handed."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.dropped: list[str] = []

    def drop_pruned(self, paths: AgentPaths, result: PruneResult) -> None:
        self.dropped.append(paths.agent)


class ScriptedPrune:
    def __init__(self, **raises: BaseException) -> None:
        self.raises = raises
        self.calls: list[tuple[str, RetentionLimits, dict[str, Any]]] = []

    def __call__(self, paths: AgentPaths, limits: RetentionLimits, **kw: Any) -> PruneResult:
        self.calls.append((paths.agent, limits, kw))
        if paths.agent in self.raises:
            raise self.raises[paths.agent]
        gone = ArchiveInfo("history_x.md", 9, 0.0)
        plan = PrunePlan(delete=(gone,), keep=(), reasons={gone.name: ("max_archives",)})
        return PruneResult(paths.agent, limits, plan, deleted=(gone.name,), deleted_bytes=9)


def test_daily_prunes_agents_with_limits_under_a_short_lock_wait(tmp_path: Path) -> None:
    svc, recall = service(
        tmp_path,
        ["keep-all", "scratch-1", "scratch-2", "busy", "broken"],
        {"agents": {"scratch-*": {"max_age_days": 2}, "b*": {"max_archives": 3}}},
    )
    prune = ScriptedPrune(
        busy=LockTimeout("agent 'busy': busy"), broken=CompactionAborted("agent 'broken': bad")
    )
    assert svc.daily(prune) == 2  # the busy and broken ones are skipped, not fatal
    called = {agent: (limits, kw) for agent, limits, kw in prune.calls}
    assert set(called) == {"scratch-1", "scratch-2", "busy", "broken"}  # not keep-all
    assert called["scratch-1"][0] == RetentionLimits(max_age_days=2)
    assert called["busy"][1]["lock_wait_s"] == 1.0
    # What was pruned is handed on after the prune returned: recall drops its rows.
    assert recall.dropped == ["scratch-1", "scratch-2"]
    records = read_audit(tmp_path / "w.audit.jsonl").records
    assert [(r.agent, r.fields["trigger"]) for r in records] == [
        ("scratch-1", "daily"),
        ("scratch-2", "daily"),
    ]


def test_a_stopped_service_prunes_no_further_agent(tmp_path: Path) -> None:
    svc, _recall = service(tmp_path, ["a", "b"], {"retention": {"max_archives": 1}})
    prune = ScriptedPrune()
    svc.stop()
    assert svc.daily(prune) == 0 and prune.calls == []


def test_a_compactions_prune_leaves_the_audit_to_the_compaction_record(tmp_path: Path) -> None:
    svc, recall = service(tmp_path, ["a"], {})
    prune = ScriptedPrune()
    paths = agent_paths(tmp_path / "ws", "a")
    svc.pruned(paths, prune(paths, RetentionLimits(1)), "compaction", audit=False)
    svc.pruned(paths, prune(paths, RetentionLimits(1)), "x")
    assert recall.dropped == ["a", "a"]
    assert [r.fields["trigger"] for r in read_audit(tmp_path / "w.audit.jsonl").records] == ["x"]
