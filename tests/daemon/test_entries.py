"""EntryCounter: one count of an agent's MEMORY.md, what it returns to its caller
and what it publishes (nothing is called back)."""

from __future__ import annotations

import queue
from pathlib import Path

from support.daemon_services import COUNTER
from support.memfiles import AgentWorkspace, append_entry

from memd.core.config import resolve_policy
from memd.daemon.entries import AgentEntry, Counted, CountUpdate, EntryCounter
from memd.settings import build_config


def make_entry(ws: AgentWorkspace, name: str) -> AgentEntry:
    config, _ = build_config({}, {})
    return AgentEntry(name, ws.paths(name), resolve_policy(config, name))


def test_each_count_returns_what_it_found_and_publishes_the_figure(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice", entries=2)
    updates: queue.SimpleQueue[CountUpdate] = queue.SimpleQueue()
    counter = EntryCounter(COUNTER, updates=updates)
    entry = make_entry(ws, "alice")

    assert counter.count_locked(entry) is Counted.COUNTED
    first = updates.get_nowait()
    size = paths.memory.stat().st_size
    assert first[:3] == ("alice", COUNTER.count_bytes(paths.memory.read_bytes()), size)
    append_entry(paths.memory, "AI", "one more turn")
    assert counter.count_locked(entry) is Counted.COUNTED
    second = updates.get_nowait()
    assert second.size == paths.memory.stat().st_size > size
    assert second.tokens == entry.tokens > first.tokens and second.at >= first.at

    # Gone: counted as empty, and said so to the caller (the runner judges an erasure).
    paths.memory.unlink()
    assert counter.count_locked(entry) is Counted.MISSING
    assert entry.tracked is None and entry.count_error is None
    gone = updates.get_nowait()
    assert gone[:3] == ("alice", 0, None)
    assert updates.empty()


def test_a_count_that_fails_is_returned_and_not_published(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alice", entries=1)
    paths.memory.unlink()
    paths.memory.mkdir()  # not a file: cannot be counted
    updates: queue.SimpleQueue[CountUpdate] = queue.SimpleQueue()
    entry = make_entry(ws, "alice")
    assert EntryCounter(COUNTER, updates=updates).count_locked(entry) is Counted.FAILED
    assert entry.count_error is not None and entry.tracked is None
    assert updates.empty()


def test_without_a_queue_nothing_is_published(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=1)
    counter = EntryCounter(COUNTER)
    assert counter.updates is None
    assert counter.count_locked(make_entry(ws, "alice")) is Counted.COUNTED
