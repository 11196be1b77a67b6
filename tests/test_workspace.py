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
