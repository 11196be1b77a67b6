"""The services built from the config: linked one way, nothing started, what was
opened closed by the exit stack."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemon_services import COUNTER, ScriptedCompaction
from support.memfiles import AgentWorkspace

from memd.core.jobs import JobState
from memd.daemon.wiring import Parts, Services
from memd.notify import SystemdNotifier
from memd.settings import build_config


@contextlib.contextmanager
def built(ws: AgentWorkspace, state_dir: Path | None) -> Iterator[Services]:
    config, _ = build_config({"trigger": {"context_length": 1000}}, {})
    parts = Parts(compact=ScriptedCompaction(), tokenizer_factory=lambda _encoding: COUNTER)  # type: ignore[arg-type]
    with contextlib.ExitStack() as stack:
        yield Services(
            stack,
            config,
            ws.root,
            state_dir,
            parts,
            SystemdNotifier({}),
            started_at=0.0,
            config_of=lambda: config,
            should_stop=lambda: False,
        )


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=4)
    ws.create_agent("bob", entries=2)
    return ws


def test_building_starts_no_thread_and_the_stack_closes_the_store(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    threads = set(threading.enumerate())
    with built(ws, tmp_path / "state") as s:
        assert set(threading.enumerate()) == threads
        assert s.flusher.store is not None
        assert s.scheduler is None and s.watches is None and not s.healthy()
        assert s.recall.service is None and s.metrics.server is None  # started later
    assert s.flusher.store is None  # closed with the stack


def test_load_agents_registers_and_counts_every_agent(ws: AgentWorkspace, tmp_path: Path) -> None:
    with built(ws, tmp_path / "state") as s:
        entries, later = s.load_agents()
        assert [entry.name for entry in entries] == ["alice", "bob"] and later == []
        assert set(s.registry.agents()) == {"alice", "bob"}
        for entry in entries:
            assert entry.tokens == COUNTER.count_bytes(entry.paths.memory.read_bytes()) > 0
        s.flusher.flush()
    # The next start reuses the stored counts (no recount of unchanged files).
    with built(ws, tmp_path / "state") as again:
        entries, _ = again.load_agents()
        assert all(not entry.dirty for entry in entries)


def test_a_committed_archive_is_surveyed(ws: AgentWorkspace) -> None:
    with built(ws, None) as s:
        [alice, _bob] = s.load_agents()[0]
        assert alice.archives is None
        alice.paths.archive_dir.mkdir()
        (alice.paths.archive_dir / "history_20261202T000000.md").write_text("old turns\n")
        assert s.runner.on_archived is not None
        s.runner.on_archived(alice.paths, alice.paths.archive_dir / "history_20261202T000000.md")
        assert alice.archives is not None and alice.archives.count == 1


def test_the_final_flush_cancels_queued_jobs(ws: AgentWorkspace, tmp_path: Path) -> None:
    with built(ws, tmp_path / "state") as s:
        [alice, _bob] = s.load_agents()[0]
        for _ in range(20):
            with alice.paths.memory.open("a") as memory:
                memory.write("# Human\n" + "word " * 40 + "\n")
        assert s.entry_counter.count_locked(alice)
        s.runner.evaluate(alice)  # no scheduler yet: decided, never submitted
        assert alice.job.state is JobState.PENDING
        s.final_flush()
        assert alice.job.state is not JobState.PENDING
        assert s.flusher.store is not None
        [row] = [row for row in s.flusher.store.agents() if row.agent == "alice"]
        assert row.state != "pending"
