"""One agent scan and one way to build an agent's paths (with the daemon's fast path)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from support.memfiles import AgentWorkspace
from support.other_uid import reachable_tmp
from support.systemd_layout import AGENTS_GID, MEMD

import memd.workspace
from memd.errors import UnknownAgent
from memd.workspace import (
    FolderFacts,
    agent_paths,
    agent_paths_scanned,
    list_agents,
    make_agents_folder,
    scan_agents,
)


def test_scan_keeps_valid_folders_and_reports_the_rest(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    ws.create_agent("bob")
    agents = ws.root / "agents"
    os.symlink(agents / "alice", agents / "alias")
    (agents / "notes.txt").write_text("not an agent")
    (agents / "bad\\name").mkdir()
    (agents / ".git").mkdir()
    os.symlink(agents / "bad\\name", agents / "bad\\link")  # not a folder of its own
    found, invalid = scan_agents(ws.root)
    assert found == {"alice": False, "bob": False, "alias": True}
    assert sorted(invalid) == [".git", "bad\\name"]
    assert list_agents(ws.root) == ["alias", "alice", "bob"]
    assert scan_agents(tmp_path / "nowhere") == ({}, [])


def test_fast_paths_equal_the_checked_paths(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    root = ws.root.resolve()
    fast = agent_paths_scanned(ws.root, "alice", root=root, agents_dir_plain=True)
    assert fast.paths == agent_paths(root, "alice") and not fast.has_private
    assert fast.has_descriptor is False
    (ws.root / "agents/alice/.memd").mkdir()
    assert agent_paths_scanned(ws.root, "alice", root=root, agents_dir_plain=True).has_private
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


def changed(folder: Path, change: Callable[[], None]) -> None:
    """Make ``change`` in ``folder`` and see its ctime move (a change within the
    clock tick of the last one leaves it: memd never keeps such facts, see
    ``_RACY_NS``, but here they were kept on purpose)."""
    before = os.stat(folder).st_ctime_ns
    change()
    nudge = folder / ".nudge"
    while os.stat(folder).st_ctime_ns == before:
        nudge.mkdir()
        nudge.rmdir()


def test_a_folder_unchanged_since_its_listing_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    folder = ws.root / "agents/alice"
    (folder / ".memd").mkdir()
    root = ws.root.resolve()
    monkeypatch.setattr(memd.workspace, "_RACY_NS", -(10**18))  # keep even fresh facts
    listed = agent_paths_scanned(ws.root, "alice", root=root, agents_dir_plain=True)
    facts = listed.folder
    assert facts is not None and facts.has_private and not facts.has_descriptor
    assert facts.ino == os.stat(folder).st_ino

    def no_listing(path: object) -> None:
        raise AssertionError(f"listed {path}")

    with monkeypatch.context() as patched:
        patched.setattr(memd.workspace.os, "scandir", no_listing)
        known = agent_paths_scanned(ws.root, "alice", root=root, agents_dir_plain=True, known=facts)
    assert known == listed  # same paths and entries, from one stat
    # Any change of the folder's entries moves its ctime: listed again. Here a
    # planted symlink, which the listing sees and the checked path refuses.
    outside = tmp_path / "outside"
    outside.mkdir()
    changed(folder, lambda: (folder / "archive").symlink_to(outside))
    with pytest.raises(Exception, match="archive"):
        agent_paths_scanned(ws.root, "alice", root=root, agents_dir_plain=True, known=facts)
    # Facts of another folder (same name, new inode) are not this one's.
    stale = FolderFacts(facts.ino + 1, os.stat(folder).st_ctime_ns, facts.entries)
    (folder / "archive").unlink()
    changed(folder, lambda: (folder / "memd-agent.json").write_text("{}"))
    fresh = agent_paths_scanned(ws.root, "alice", root=root, agents_dir_plain=True, known=stale)
    assert fresh.has_descriptor is True and fresh.folder != stale


def test_facts_of_a_folder_changed_a_moment_ago_are_not_kept(tmp_path: Path) -> None:
    """Its ctime may not move at a change within the same clock tick ("racy")."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    scanned = agent_paths_scanned(ws.root, "alice", root=ws.root.resolve(), agents_dir_plain=True)
    assert scanned.folder is None and scanned.has_descriptor is False


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


_MAKE_AS = """
import json, os, stat, sys
from pathlib import Path
from memd.workspace import make_agents_folder
uid, *groups = (int(n) for n in sys.argv[2].split(","))
os.setgroups(groups)
os.setgid(uid)
os.setuid(uid)
os.umask(0o022)  # a container's default
problem = make_agents_folder(Path(sys.argv[1]))
info = os.stat(Path(sys.argv[1]) / "agents")
print(json.dumps([problem, stat.S_IMODE(info.st_mode), info.st_gid]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")
@pytest.mark.parametrize(
    ("workspace_gid", "memd_groups", "made"),
    [
        (AGENTS_GID, (AGENTS_GID,), (None, 0o1770, AGENTS_GID)),  # the agents' group
        (MEMD, (), (None, 0o755, MEMD)),  # memd's own group: memd and agents share a uid
        (AGENTS_GID, (), ("not a member", 0o755, MEMD)),  # said, and left as it was
    ],
    ids=["agents-group", "memds-own-group", "not-a-member"],
)
def test_agents_folder_is_made_for_the_workspaces_group(
    workspace_gid: int, memd_groups: tuple[int, ...], made: tuple[str | None, int, int]
) -> None:
    """Review r7ops F3: the sidecar's agents, each under its own uid, make their
    folders in agents/, which memd makes when the volume is new: as the tmpfiles
    snippet makes it under systemd (sticky, the agents' group, 1770; not setgid,
    so each folder keeps its agent's group)."""
    with reachable_tmp("memd-agents-folder-") as base:
        workspace = base / "workspace"
        workspace.mkdir()
        os.chown(workspace, MEMD, workspace_gid)
        ids = ",".join(str(n) for n in (MEMD, *memd_groups))
        result = subprocess.run(
            [sys.executable, "-c", _MAKE_AS, str(workspace), ids],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        problem, mode, gid = json.loads(result.stdout)
        assert (mode, gid) == made[1:]
        if made[0] is None:
            assert problem is None
        else:
            assert made[0] in problem and f"gid {AGENTS_GID}" in problem
        # Made once: an existing agents/ is never changed.
        os.chmod(workspace / "agents", 0o750)
        subprocess.run([sys.executable, "-c", _MAKE_AS, str(workspace), ids], check=True)
        assert stat.S_IMODE((workspace / "agents").stat().st_mode) == 0o750


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")
def test_agents_folder_memd_makes_under_umask_000_lets_no_uid_take_anothers_folder() -> None:
    """Review r9leak F3: in a workspace of memd's own group, agents/ was a bare
    mkdir, 0777 and not sticky under umask 000: bob renamed alice's folder away,
    put a 0777 one with a 0666 MEMORY.md in its place, and read what she appended."""
    from support.two_agents import ALICE, BOB, run_as, shared_root

    with shared_root() as root:
        ws_root = root / "ws"
        ws_root.mkdir(mode=0o755)
        ws_root.chmod(0o755)  # root:root, memd's (root's) own group: the plain-folder case
        previous = os.umask(0)
        try:
            assert make_agents_folder(ws_root) is None
        finally:
            os.umask(previous)
        agents = ws_root / "agents"
        assert stat.S_IMODE(agents.stat().st_mode) == 0o755
        # memd's own agents (its uid) make their folders; alice's is handed to her.
        (agents / "alice").mkdir(mode=0o700)
        (agents / "alice" / "MEMORY.md").touch(mode=0o600)
        for path in (agents / "alice", agents / "alice" / "MEMORY.md"):
            os.chown(path, ALICE, ALICE)
        run_as(
            BOB,
            "/bin/sh",
            "-c",
            f'mv "{agents}/alice" "{agents}/.gone" && mkdir -m 777 "{agents}/alice"'
            f' && : > "{agents}/alice/MEMORY.md" && chmod 666 "{agents}/alice/MEMORY.md"',
            umask=0,
        )
        run_as(
            ALICE,
            "/bin/sh",
            "-c",
            f'printf "alice: my card is 4111 1111 1111 1111\\n" >> "{agents}/alice/MEMORY.md"',
        )
        read = run_as(BOB, "/bin/cat", f"{agents}/alice/MEMORY.md")
    assert "4111" not in read.stdout
