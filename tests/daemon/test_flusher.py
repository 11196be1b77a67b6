"""The flusher writes registry snapshots and calls no one: the erasures it finds
are returned to its caller, the spending and the health it writes are handed to it."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from support.daemon_services import ScriptedCompaction, Services, build_services
from support.memfiles import AgentWorkspace

from memd.daemon.flusher import ErasureChange, StateFlusher
from memd.state import SpendingRecord, StateStore


def with_store(tmp_path: Path) -> tuple[Services, StateFlusher, StateStore]:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("ghost", entries=2)
    ws.create_agent("other", entries=2)
    s = build_services(ws, ScriptedCompaction())
    assert s.flusher is not None
    store = StateStore.open(tmp_path / "state", ws.root)
    s.flusher.start(contextlib.ExitStack(), store)
    return s, s.flusher, store


def forget(store: StateStore, s: Services, name: str) -> None:
    """What `memd forget` does to a running daemon's world: the files go, a tombstone stays."""
    memory = s.ws.root / "agents" / name / "MEMORY.md"
    memory.unlink()
    store.forget_agent(name, erased_at_ns=time.time_ns())


def test_a_flush_returns_the_erasures_that_came_and_went(tmp_path: Path) -> None:
    s, flusher, store = with_store(tmp_path)
    assert flusher.flush() == []
    assert store.get_agent("ghost") is not None
    forget(store, s, "ghost")
    assert flusher.flush() == [ErasureChange("ghost", True)]
    assert flusher.flush() == []  # said once
    assert store.get_agent("ghost") is None and store.get_agent("other") is not None
    # The agent writes again: a MEMORY.md made after the erasure lifts it.
    s.ws.create_agent("ghost", entries=1)
    assert flusher.flush(live=True) == [ErasureChange("ghost", False)]
    assert store.tombstoned(["ghost"]) == {}
    assert store.get_agent("ghost") is not None
    store.close()


def test_spending_is_written_when_handed_over_newer_and_changed(tmp_path: Path) -> None:
    _s, flusher, store = with_store(tmp_path)
    flusher.flush()
    assert store.read_spending() is None  # none handed over: none written
    first = SpendingRecord(3, 0.5, None, None, ts=100.0)
    flusher.flush(spending=first)
    assert store.read_spending() == first
    flusher.flush(live=True, spending=SpendingRecord(9, 0.9, None, None, ts=101.0))
    assert store.read_spending() == first  # live flushes leave spending to the periodic one
    # A snapshot taken before the one written, landing after it (two flushes racing).
    flusher.flush(spending=SpendingRecord(2, 0.25, None, None, ts=99.0))
    assert store.read_spending() == first
    newer = SpendingRecord(4, 0.75, "cap", 200.0, ts=101.0)
    flusher.flush(spending=newer)
    assert store.read_spending() == newer
    assert "compactions held back (cap)" in flusher.status_text(newer)
    store.close()


def test_the_heartbeat_says_the_health_handed_in_and_probes_nothing(tmp_path: Path) -> None:
    _s, flusher, store = with_store(tmp_path)

    def healthy() -> bool:
        heartbeat = store.read_heartbeat()
        assert heartbeat is not None
        return heartbeat.healthy

    flusher.flush()
    assert not healthy()  # nothing handed in yet (start-up not done): not healthy
    flusher.set_healthy(True)  # the lifecycle's probe, as a value
    flusher.flush()
    assert healthy()
    flusher.set_healthy(False)  # a service thread died
    flusher.flush(live=True)
    assert healthy()  # live flushes leave the heartbeat to the periodic one
    flusher.flush()
    assert not healthy()
    store.close()
