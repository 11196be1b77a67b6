"""One agent scan and one way to build an agent's paths (with the daemon's fast path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.memfiles import AgentWorkspace

from memd.errors import UnknownAgent
from memd.workspace import agent_paths, agent_paths_scanned, list_agents, scan_agents


def test_scan_keeps_valid_folders_and_reports_the_rest(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    ws.create_agent("bob")
    agents = ws.root / "agents"
    os.symlink(agents / "alice", agents / "alias")
    (agents / "notes.txt").write_text("not an agent")
    (agents / "bad\\name").mkdir()
    (agents / ".git").mkdir()
    invalid: list[str] = []
    found = scan_agents(ws.root, lambda item: invalid.append(item.name))
    assert found == {"alice": False, "bob": False, "alias": True}
    assert sorted(invalid) == [".git", "bad\\name"]
    assert list_agents(ws.root) == ["alias", "alice", "bob"]
    assert scan_agents(tmp_path / "nowhere") == {}


def test_fast_paths_equal_the_checked_paths(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    root = ws.root.resolve()
    fast, has_private = agent_paths_scanned(ws.root, "alice", root=root, agents_dir_plain=True)
    assert fast == agent_paths(root, "alice") and not has_private
    (ws.root / "agents/alice/.memd").mkdir()
    assert agent_paths_scanned(ws.root, "alice", root=root, agents_dir_plain=True)[1]
    # A symlinked MEMORY.md takes the checked path (and is refused when it leaves).
    outside = tmp_path / "outside.md"
    outside.write_text("x")
    memory = ws.root / "agents/alice/MEMORY.md"
    memory.unlink()
    os.symlink(outside, memory)
    with pytest.raises(Exception, match="MEMORY.md"):
        agent_paths_scanned(ws.root, "alice", root=root, agents_dir_plain=True)
    with pytest.raises(UnknownAgent):
        agent_paths_scanned(ws.root, "ghost", root=root, is_link=False, agents_dir_plain=True)


def test_open_memory_opens_only_what_stays_in_the_agents_own_folder(tmp_path: Path) -> None:
    import errno

    from memd.errors import WorkspaceError
    from memd.workspace import open_memory

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    ws.create_agent("bob")
    paths = agent_paths(ws.root, "alice")
    memory = ws.root / "agents/alice/MEMORY.md"

    def read(fd: int) -> bytes:
        try:
            return os.read(fd, 1 << 20)
        finally:
            os.close(fd)

    assert read(open_memory(paths)) == memory.read_bytes()  # a plain file: opened as is
    # A link within the agent's own folder: its target is opened.
    (ws.root / "agents/alice/kept").mkdir()
    moved = ws.root / "agents/alice/kept/MEMORY.md"
    memory.rename(moved)
    os.symlink("kept/MEMORY.md", memory)
    assert read(open_memory(paths)) == moved.read_bytes()
    # Out of the folder (into another agent's, or out of the workspace): refused.
    for target in (ws.root / "agents/bob/MEMORY.md", tmp_path / "outside.md"):
        target.touch()
        memory.unlink()
        os.symlink(target, memory)
        with pytest.raises(WorkspaceError, match="resolves outside the agent's own folder"):
            open_memory(paths)
    memory.unlink()
    os.symlink("MEMORY.md", memory)  # a loop
    with pytest.raises(OSError) as caught:
        open_memory(paths)
    assert caught.value.errno == errno.ELOOP
    memory.unlink()
    with pytest.raises(FileNotFoundError):
        open_memory(paths)
    os.mkfifo(memory)  # never hangs the counting thread (non-blocking)
    os.close(open_memory(paths))
