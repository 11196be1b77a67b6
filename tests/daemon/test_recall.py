"""The recall index as a stage: off without a state dir (what it is handed is
dropped), started (its re-sync of every agent once asked, after READY) and handed
archives and prunes otherwise, stopped by the exit stack."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

from support.memfiles import AgentWorkspace

from memd.core.config import MemdConfig
from memd.core.jobs import AgentJob, JobState
from memd.daemon.recall import RecallStage
from memd.daemon.registry import AgentRegistry
from memd.settings import build_config


def registry_of(ws: AgentWorkspace, config: MemdConfig) -> AgentRegistry:
    registry = AgentRegistry(
        ws.root, config, recover=lambda _paths, _key: None, context_length_of=None
    )
    registry.start(contextlib.ExitStack())
    entries = [e for name in sorted(registry.scan()) if (e := registry.make_entry(name))]
    registry.register(entries, set())
    return registry


def test_without_a_state_dir_recall_is_off_and_what_it_is_handed_is_dropped(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice", entries=2)
    config = MemdConfig()
    recall = RecallStage(None, ws.root, config, registry_of(ws, config))
    with contextlib.ExitStack() as stack:
        recall.start(stack)
        assert recall.service is None
        recall.index_archive(paths, paths.archive_dir / "history_x.md")
        recall.reconfigure(config)


def test_started_it_indexes_on_each_archive_and_follows_reloads(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice", entries=2)
    config = MemdConfig()
    recall = RecallStage(tmp_path / "state", ws.root, config, registry_of(ws, config))
    with contextlib.ExitStack() as stack:
        recall.start(stack)
        service = recall.service
        assert service is not None and service.server is not None
        socket_file = service.server.path
        assert socket_file.exists()  # serving
        assert not service.caught_up.is_set()  # the re-sync waits for READY ...
        recall.resync()
        assert service.caught_up.wait(30)  # ... then goes over every agent
        assert not service.index.encrypting
        encrypted = {"encrypt_archives": True, "key_file": str(tmp_path / "master.key")}
        recall.reconfigure(build_config({"privacy": encrypted}, {})[0])
        assert service.index.encrypting
        recall.index_archive(paths, paths.archive_dir / "history_x.md")  # no archive: logged
    assert not socket_file.exists()  # stopped with the stack


def test_the_resync_is_handed_the_agents_as_a_list_not_a_way_back_to_the_registry(
    tmp_path: Path,
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    for name in ("alice", "bob"):
        ws.create_agent(name, entries=1)
    config = MemdConfig()
    registry = registry_of(ws, config)
    recall = RecallStage(tmp_path / "state", ws.root, config, registry)
    handed: list[object] = []

    class Service:  # the started service, as far as the re-sync goes
        def start(self, agents: object) -> None:
            handed.append(agents)

    recall.service = Service()  # type: ignore[assignment]
    recall.resync()
    [agents] = handed
    assert isinstance(agents, list) and agents == registry.all_paths()
    assert sorted(paths.agent for paths in agents) == ["alice", "bob"]


def test_the_cooldown_told_on_the_socket_is_bounded_after_the_clock_went_back(
    tmp_path: Path,
) -> None:
    """``cooldown_left_s`` (memd_swarms waits on it): a cooldown set before the wall
    clock stepped back an hour is told as no longer than memd lets one last."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=2)
    config = build_config({"daemon": {"cooldown_s": 60, "retry_base_s": 5}}, {})[0]
    registry = registry_of(ws, config)
    entry = registry.get("alice")
    assert entry is not None
    entry.job = replace(AgentJob(), state=JobState.COOLDOWN, next_attempt_at=10_000.6)
    recall = RecallStage(None, ws.root, config, registry, clock=lambda: 10_000.0 - 3600)
    status = recall.status("alice")
    assert status is not None and status["cooldown_left_s"] == 60.0
    recall = RecallStage(None, ws.root, config, registry, clock=lambda: 10_000.0)
    status = recall.status("alice")
    assert status is not None and status["cooldown_left_s"] == 0.6
