"""The daemon's re-sync of every agent at start: after a restart with unchanged
files it is a stat pass against the identities the index stored (no file is
read), and its end says what it cost."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import structlog
from support.memfiles import AgentWorkspace, append_entry

import memd.recall.index as index_module
from memd.recall.service import RecallService
from memd.retention import PruneResult
from memd.workspace import AgentPaths


def resync(state_dir: Path, ws: AgentWorkspace, agents: list[AgentPaths]) -> dict[str, object]:
    """One daemon start's re-sync (a new service on the same index); its "ready" line."""
    service = RecallService.open(state_dir, ws.root)
    assert service is not None
    try:
        with structlog.testing.capture_logs() as logs:
            service.start(agents)
            assert service.caught_up.wait(60)
    finally:
        service.stop()
    [ready] = [line for line in logs if line["event"] == "recall index ready"]
    return ready


def test_a_restart_with_unchanged_files_reads_none_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    agents = [ws.create_agent(f"agent{n}", entries=3) for n in range(5)]
    archived = agents[0]
    archived.archive_dir.mkdir()
    (archived.archive_dir / "history_2026-01-01_00-00-00.md").write_text(
        "### Human — 2026-01-01T00:00:00\n\nthe heliotrope key\n\n---\n\n"
    )
    reads: list[int] = []
    real = index_module.read_to_end
    monkeypatch.setattr(index_module, "read_to_end", lambda fd: reads.append(fd) or real(fd))
    state_dir = tmp_path / "state"

    first = resync(state_dir, ws, agents)  # an empty index: every file is read once
    assert len(reads) == 6 and first["files_indexed"] == 6 and first["agents"] == 5
    assert first["agents_repaired"] == 1  # the archive no index held

    reads.clear()
    again = resync(state_dir, ws, agents)  # the restart: nothing changed
    assert reads == [] and again["files_indexed"] == 0 and again["agents_repaired"] == 0
    assert {"seconds", "cpu_s"} <= again.keys()

    append_entry(agents[3].memory, "AI", "one more turn")
    reads.clear()
    after_append = resync(state_dir, ws, agents)  # only the changed file is read
    assert len(reads) == 1 and after_append["files_indexed"] == 1


def test_the_daemons_prune_deletes_the_index_copies_moved_aside_as_corrupt(
    tmp_path: Path,
) -> None:
    # Review 14f, F6: a copy of a damaged index keeps the text of archives retention
    # deletes later; it is derived data, so it goes (with its -wal and -shm).
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha", entries=2)
    service = RecallService.open(tmp_path / "state", ws.root)
    assert service is not None and service.index.path is not None
    index_path = service.index.path
    copy = index_path.with_name(f"{index_path.name}.corrupt-20260101-000000")
    for name in (copy, Path(f"{copy}-wal"), Path(f"{copy}-shm")):
        name.write_bytes(b"the zanthorp ledger")
    try:
        service.drop_pruned(paths, cast(PruneResult, SimpleNamespace(deleted=("h.md",))))
    finally:
        service.stop()
    assert not list(index_path.parent.glob(f"{index_path.name}.corrupt-*"))
    assert index_path.exists()


class ScriptedIndex:
    """An index whose sync raises what the script says for an agent (none: a
    report of nothing changed)."""

    def __init__(self, raises: dict[str, BaseException]) -> None:
        self.raises = raises
        self.synced: list[str] = []

    def sync_agent(self, paths: AgentPaths, **_kwargs: object) -> SimpleNamespace:
        self.synced.append(paths.agent)
        if paths.agent in self.raises:
            raise self.raises[paths.agent]
        # carol lost an archive: her rows are dropped, the file scrubbed after the pass.
        removed = ["history_x.md"] if paths.agent == "carol" else []
        return SimpleNamespace(indexed=[], removed=removed, sealed=False, entries=0)

    def scrub(self) -> None:
        raise RuntimeError("the heliotrope key")

    def close(self) -> None:
        pass


def test_an_unexpected_error_costs_its_agent_its_sync_never_the_others(tmp_path: Path) -> None:
    """The re-sync caught only memd's errors and OSError: any other exception (a name
    the index could not encode) ended the thread for good, every agent after it
    left unsynced and ``caught_up`` never set. Now one line names the agent and
    the error's class (never its message: it may quote the memory's text)."""
    ws = AgentWorkspace(tmp_path / "ws")
    agents = [ws.create_agent(name, entries=1) for name in ("alice", "bob", "carol")]
    secret = "the heliotrope key"
    index = ScriptedIndex(
        {
            "alice": UnicodeEncodeError("utf-8", secret, 0, 1, "surrogates not allowed"),
            "bob": KeyError(secret),
        }
    )
    service = RecallService(cast(index_module.RecallIndex, index))
    try:
        with structlog.testing.capture_logs() as logs:
            service.start(agents)
            assert service.caught_up.wait(60)
    finally:
        service.stop()
    assert index.synced == ["alice", "bob", "carol"]
    failed = [line for line in logs if line["event"] == "recall sync failed"]
    assert [(line["agent"], line["error"]) for line in failed] == [
        ("alice", "UnicodeEncodeError"),
        ("bob", "KeyError"),
    ]
    [unscrubbed] = [line for line in logs if line["event"] == "recall index not scrubbed"]
    assert unscrubbed["agents"] == ["carol"] and unscrubbed["error"] == "RuntimeError"
    assert secret not in repr(logs)
    [ready] = [line for line in logs if line["event"] == "recall index ready"]
    assert ready["agents"] == 3


class LockedIndex:
    """An index locked by another process for ``locked`` reads, then free."""

    def __init__(self, locked: int) -> None:
        self.locked = locked

    def agents(self) -> list[str]:
        if self.locked > 0:
            self.locked -= 1
            raise index_module.RecallIndexError("recall index: database is locked")
        return []

    def close(self) -> None:
        pass


def test_removed_agents_rows_not_erased_is_said_once_while_the_index_stays_locked(
    tmp_path: Path,
) -> None:
    """``recall-gone`` runs every reconcile_s: an index locked by another process
    for minutes was a warning at every run. Now once, and once that it is usable
    again."""
    ws = AgentWorkspace(tmp_path / "ws")
    service = RecallService(cast(index_module.RecallIndex, LockedIndex(locked=5)))
    with structlog.testing.capture_logs() as logs:
        for _ in range(7):
            service.drop_gone(ws.root, [])
    events = [(line["event"], line["log_level"]) for line in logs]
    assert events.count(("removed agents' recall rows not erased yet", "warning")) == 1
    assert events.count(("removed agents' recall rows not erased yet", "debug")) == 4
    assert events[-1] == ("recall index usable again: removed agents' rows checked", "info")
