"""The services built from the config: linked one way, nothing started or opened by
building; what a start opened closed by the exit stack."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.daemon_services import COUNTER, Clock, FakeScheduler, ScriptedCompaction
from support.memfiles import AgentWorkspace, append_entry

from memd.core.jobs import JobState
from memd.daemon.counter import HintKind
from memd.daemon.entries import AgentEntry, ExitState
from memd.daemon.wiring import Parts, Services, open_store
from memd.notify import SystemdNotifier
from memd.settings import build_config
from memd.state import AgentRecord
from memd.workspace import AgentPaths


@contextlib.contextmanager
def built(
    ws: AgentWorkspace, state_dir: Path | None, parts: Parts | None = None, **data: Any
) -> Iterator[Services]:
    config, _ = build_config({"trigger": {"context_length": 1000}, **data}, {})
    if parts is None:
        parts = Parts(compact=ScriptedCompaction(), tokenizer_factory=lambda _encoding: COUNTER)  # type: ignore[arg-type]
    with contextlib.ExitStack() as stack:
        s = Services(
            config,
            ws.root,
            state_dir,
            parts,
            SystemdNotifier({}),
            started_at=0.0,
            exiting=ExitState(),
        )
        # What the lifecycle starts first (before the start-up count).
        s.registry.start(stack)
        s.flusher.start(stack, open_store(state_dir, ws.root))
        yield s


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice", entries=4)
    ws.create_agent("bob", entries=2)
    return ws


def test_building_starts_no_thread_and_opens_nothing(tmp_path: Path) -> None:
    # A workspace without agents/ and a state dir that does not exist yet: building
    # creates neither (the registry's start makes agents/, the flusher's the DB).
    root = tmp_path / "ws"
    root.mkdir()
    state_dir = tmp_path / "state"
    config, _ = build_config({}, {})
    parts = Parts(tokenizer_factory=lambda _encoding: COUNTER)
    threads = set(threading.enumerate())
    s = Services(
        config, root, state_dir, parts, SystemdNotifier({}), started_at=0.0, exiting=ExitState()
    )
    assert set(threading.enumerate()) == threads
    assert os.listdir(root) == [] and not state_dir.exists()
    assert s.flusher.store is None and s.runner.redaction_key is None
    assert s.scheduler is None and s.watches is None and not s.healthy()
    assert s.recall.service is None and s.metrics.server is None  # started later
    with contextlib.ExitStack() as stack:
        s.registry.start(stack)
        assert (root / "agents").is_dir()
        s.flusher.start(stack, open_store(state_dir, root))
        assert s.flusher.store is not None
    assert s.flusher.store is None  # closed with the stack


def test_load_agents_registers_and_counts_every_agent(ws: AgentWorkspace, tmp_path: Path) -> None:
    with built(ws, tmp_path / "state") as s:
        entries, later, watched = s.load_agents()
        assert not watched  # no watches handed in
        assert [entry.name for entry in entries] == ["alice", "bob"] and later == []
        assert set(s.registry.agents()) == {"alice", "bob"}
        for entry in entries:
            assert entry.tokens == COUNTER.count_bytes(entry.paths.memory.read_bytes()) > 0
        s.flusher.flush()
    # The next start reuses the stored counts (no recount of unchanged files).
    with built(ws, tmp_path / "state") as again:
        entries, _, _ = again.load_agents()
        assert all(not entry.dirty for entry in entries)


def test_a_write_after_the_stat_that_reuses_a_stored_count_is_reported(
    ws: AgentWorkspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watches are added before the stat that decides a stored count still
    # holds, so a write just after that stat (the file unchanged at the stat) is
    # queued by the kernel and reported once the watcher's thread runs.
    with built(ws, tmp_path / "state") as s:
        s.load_agents()
        s.flusher.flush()
    with built(ws, tmp_path / "state") as s, contextlib.ExitStack() as stack:
        restore = s.counter.restore
        reused: list[str] = []

        def restore_then_write(entry: AgentEntry, record: AgentRecord) -> bool:
            kept = restore(entry, record)
            if kept and entry.name == "alice":
                reused.append(entry.name)
                append_entry(entry.paths.memory, "Human", "written after the stat")
            return kept

        monkeypatch.setattr(s.counter, "restore", restore_then_write)
        watches = s.new_watches(poll=False)
        _entries, _later, watched = s.load_agents((watches, stack))
        assert watched and reused == ["alice"]
        watches.start(stack)
        hints: list[tuple[HintKind, str | None]] = []
        deadline = time.monotonic() + 10
        while (HintKind.MEMORY, "alice") not in hints and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                hint = s.counter.inbox.get(timeout=0.1)
                hints.append((hint.kind, hint.name))
        assert (HintKind.MEMORY, "alice") in hints


DESCRIPTOR = {
    "format": "memd-agent",
    "version": 1,
    "agent": "alice",
    "model": "gpt-4o-mini",
    "context_length": 3000,
    "reserved": {"unit": "text", "text": "alpha beta"},
}


def next_hint(s: Services, wanted: tuple[HintKind, str]) -> list[tuple[HintKind, str | None]]:
    """The hints on the counter's queue until ``wanted`` (or 10 s)."""
    hints: list[tuple[HintKind, str | None]] = []
    deadline = time.monotonic() + 10
    while wanted not in hints and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            hint = s.counter.inbox.get(timeout=0.1)
            hints.append((hint.kind, hint.name))
    return hints


@pytest.mark.parametrize("restart", [False, True])
def test_a_descriptor_written_after_the_pass_read_the_folder_is_reported(
    ws: AgentWorkspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restart: bool
) -> None:
    # Every agent folder is watched before anything in it is read (its listing or
    # stat, memd-agent.json, MEMORY.md's stat): a descriptor written just after the
    # pass looked at the folder is queued by the kernel and reported once the
    # watcher's thread runs (it was missed until it changed again). With
    # ``restart`` the folder is stat'ed (its facts stored by the first run).
    if restart:
        with built(ws, tmp_path / "state") as s:
            s.load_agents()
            s.flusher.flush()
    with built(ws, tmp_path / "state") as s, contextlib.ExitStack() as stack:
        make_entry = s.registry.make_entry

        def make_then_write(name: str, *args: Any) -> AgentEntry | None:
            entry = make_entry(name, *args)
            if name == "alice":
                (ws.root / "agents/alice/memd-agent.json").write_text(json.dumps(DESCRIPTOR))
            return entry

        monkeypatch.setattr(s.registry, "make_entry", make_then_write)
        watches = s.new_watches(poll=False)
        entries, _later, watched = s.load_agents((watches, stack))
        assert watched
        assert entries[0].name == "alice" and entries[0].policy.window_source == "[trigger]"
        watches.start(stack)
        assert (HintKind.DESCRIPTOR, "alice") in next_hint(s, (HintKind.DESCRIPTOR, "alice"))


def test_a_symlinked_agent_folder_is_watched_once_checked_and_its_descriptor_read_again(
    ws: AgentWorkspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A symlinked folder is not watched before the pass checks it: its descriptor,
    # read before its watch, is read again once it is watched.
    target = ws.root / "shared" / "carol"
    target.mkdir(parents=True)
    (target / "MEMORY.md").write_text((ws.root / "agents/bob/MEMORY.md").read_text())
    (ws.root / "agents/carol").symlink_to(target)
    with built(ws, tmp_path / "state") as s, contextlib.ExitStack() as stack:
        make_entry = s.registry.make_entry

        def make_then_write(name: str, *args: Any) -> AgentEntry | None:
            entry = make_entry(name, *args)
            if name == "carol":
                assert entry is not None and entry.policy.window_source == "[trigger]"
                (target / "memd-agent.json").write_text(json.dumps(DESCRIPTOR | {"agent": name}))
            return entry

        monkeypatch.setattr(s.registry, "make_entry", make_then_write)
        watches = s.new_watches(poll=False)
        entries, _later, watched = s.load_agents((watches, stack))
        assert watched and [entry.name for entry in entries] == ["alice", "bob", "carol"]
        assert entries[2].policy.window_source == "memd-agent.json"
        assert "carol" in watches.watcher.watched()


def lock_is_free(paths: AgentPaths) -> bool:
    fd = os.open(paths.lock, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the only fd that holds the lock lets it go
    return True


@pytest.mark.parametrize(
    ("config_poll", "flag", "polled"),
    [(False, None, False), (True, None, True), (False, True, True), (True, False, False)],
)
def test_the_counter_knows_when_the_watcher_polls(
    ws: AgentWorkspace, tmp_path: Path, config_poll: bool, flag: bool | None, polled: bool
) -> None:
    # The reconcile leaves the MEMORY.md stats to the poller; the command line wins.
    with built(ws, tmp_path / "state", watch={"poll": config_poll}) as s:
        s.new_watches(flag)
        assert s.counter.files_polled is polled


def test_a_committed_compaction_is_handed_on_once_the_agents_lock_is_free(
    ws: AgentWorkspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real transaction calls no one back: it returns what it archived and
    # pruned, and the runner hands that to the stages after the commit. By then
    # the agent's lock is free (a forget or prune waiting for it is not held up by
    # indexing); the new archive is indexed, the agent's figures surveyed, the
    # pruned archive logged and dropped from recall.
    state = tmp_path / "state"
    alice = ws.root / "agents" / "alice"
    old = alice / "archive" / "history_2026-01-01_00-00-00.md"
    old.parent.mkdir()
    old.write_text("### Human — 2026-01-01T00:00:00\n\nthe ombrellino turn\n\n---\n\n")
    for n in range(20):
        append_entry(alice / "MEMORY.md", "Human", f"turn {n}: the tamarillo " + "word " * 40)
    parts = Parts(tokenizer_factory=lambda _encoding: COUNTER)  # the real compaction
    with (
        built(ws, state, parts, retention={"max_archives": 1}) as s,
        contextlib.ExitStack() as stack,
    ):
        s.recall.start(stack)
        service = s.recall.service
        assert service is not None
        [entry, _bob] = s.load_agents()[0]
        service.index.sync_agent(entry.paths)
        assert service.index.search("alice", "ombrellino")
        free_when_handed: list[bool] = []
        survey = s.archives.archived

        def surveyed(paths: AgentPaths) -> None:
            free_when_handed.append(lock_is_free(paths))
            survey(paths)

        monkeypatch.setattr(s.archives, "archived", surveyed)
        scheduler = FakeScheduler(Clock())
        s.runner.start(contextlib.ExitStack(), scheduler)  # type: ignore[arg-type]
        s.runner.evaluate(entry)
        assert scheduler.run_queued() == 1
        assert s.stats.compactions_ok == 1
        # Surveyed twice: for the new archive, then after the prune.
        assert free_when_handed == [True, True]
        (archive,) = entry.paths.archive_dir.iterdir()
        assert archive != old and entry.archives is not None and entry.archives.count == 1
        assert service.index.search("alice", "tamarillo")[0].source == archive.name
        assert service.index.search("alice", "ombrellino") == []


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


def test_a_stored_row_with_a_wrongly_typed_value_is_not_restored_and_goes(tmp_path: Path) -> None:
    # Review 13b, R3: the restore never meets it; the row of an agent gone while
    # memd was down would otherwise stay (no stored agent of that name to remove).
    import sqlite3

    from memd.daemon.wiring import stored_records

    store = open_store(tmp_path / "state", tmp_path)
    assert store is not None and store.path is not None
    store.upsert_agents([AgentRecord(name, 1, 2, 40, 30, 8, 10, 100, 1.0) for name in "abc"])
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE agents SET tokens = 'ten' WHERE agent = 'b'")
    conn.commit()
    conn.close()
    assert sorted(stored_records(store)) == ["a", "c"]
    store.close()
    conn = sqlite3.connect(store.path)
    assert conn.execute("SELECT agent FROM agents ORDER BY agent").fetchall() == [("a",), ("c",)]
    conn.close()
