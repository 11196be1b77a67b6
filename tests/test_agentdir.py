"""Containment per agent (DESIGN.md §1), attacked by a real second uid.

Each attack is run by uid 65534 owning its agent folder, against memd running
as root: the folder swapped for a symlink during the drain and during the swap,
and symlinks into another agent's folder.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from support.memfiles import AgentWorkspace, entry_contents_everywhere, swarms_block
from support.other_uid import NOBODY, Attacker, can_switch_uid, reachable_tmp

from memd.agentdir import AgentDir
from memd.compaction import CompactionOptions, compact_agent
from memd.core.summary import SummaryResult
from memd.errors import CompactionAborted, WorkspaceError
from memd.workspace import AgentPaths, agent_paths

needs_root = pytest.mark.skipif(not can_switch_uid(), reason="needs root to run a second uid")

PRECIOUS = b"precious, owned by root\n"


class Fixed:
    model = "fixed"

    def summarize(self, request: object) -> SummaryResult:
        return SummaryResult(text="short summary", model="fixed")


def _chown_tree(path: Path, uid: int) -> None:
    os.chown(path, uid, uid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


def _evil_agent(base: Path) -> tuple[AgentWorkspace, AgentPaths, Path]:
    """agents/evil (uid 65534) whose MEMORY.md → sub/real.md; outside/real.md (root)."""
    for folder in (base / "ws", base / "outside"):
        folder.mkdir(mode=0o755)
    ws = AgentWorkspace(base / "ws")
    (ws.root / "agents").chmod(0o755)
    paths = ws.create_agent("evil", entries=4)
    sub = paths.dir / "sub"
    sub.mkdir()
    paths.memory.rename(sub / "real.md")
    paths.memory.symlink_to("sub/real.md")
    _chown_tree(paths.dir, NOBODY)
    paths.dir.chmod(0o755)
    outside = base / "outside" / "real.md"
    outside.write_bytes(PRECIOUS)
    outside.chmod(0o644)
    return ws, agent_paths(ws.root, "evil"), outside


def _late_entry(tag: str) -> str:
    return swarms_block("AI", f"late entry {tag}")


@needs_root
def test_folder_swapped_for_a_symlink_during_the_drain_writes_nothing_outside() -> None:
    with reachable_tmp("memd-a1-drain-") as base:
        _ws, paths, outside = _evil_agent(base)
        attacker = Attacker(base)
        try:
            attacker.must("open_append", key="old", path=str(paths.dir / "sub" / "real.md"))

            def attack() -> None:
                # The drain is polling the old inode (quiet period 3 s): swap
                # the folder under it, then write through the pre-swap fd.
                time.sleep(0.3)
                attacker.must("rename", src=str(paths.dir / "sub"), dst=str(paths.dir / "moved"))
                attacker.must("symlink", target=str(outside.parent), path=str(paths.dir / "sub"))
                attacker.must("write", key="old", data=_late_entry("drain"))

            thread = threading.Thread(target=attack)

            def checkpoint(name: str) -> None:
                if name == "replaced":
                    thread.start()

            options = CompactionOptions(lock_wait_s=5, drain_quiet_s=3, drain_max_s=10)
            compact_agent(paths, Fixed(), options, checkpoint=checkpoint)
            thread.join()
        finally:
            attacker.close()
        assert outside.read_bytes() == PRECIOUS
        moved = (paths.dir / "moved" / "real.md").read_bytes()
        assert moved.count(b"late entry drain") == 1


@needs_root
@pytest.mark.parametrize("at", ["drain-linked", "new-written", "journal-swapping"])
def test_folder_swapped_for_a_symlink_during_the_swap_replaces_nothing_outside(at: str) -> None:
    with reachable_tmp("memd-a1-swap-") as base:
        _ws, paths, outside = _evil_agent(base)
        before = entry_contents_everywhere(paths)
        attacker = Attacker(base)

        def checkpoint(name: str) -> None:
            if name == at:
                attacker.must("rename", src=str(paths.dir / "sub"), dst=str(paths.dir / "moved"))
                attacker.must("symlink", target=str(outside.parent), path=str(paths.dir / "sub"))

        error: CompactionAborted | None = None
        try:
            compact_agent(
                paths,
                Fixed(),
                CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05),
                checkpoint=checkpoint,
            )
        except CompactionAborted as exc:
            error = exc
        finally:
            attacker.close()
        assert outside.read_bytes() == PRECIOUS
        assert os.stat(outside).st_uid == 0
        assert error is None
        # The compaction went to the folder memd pinned (now "moved"): every
        # entry once, in the archive.
        archived = b"".join(p.read_bytes() for p in paths.archive_dir.iterdir())
        assert all(archived.count(text.encode()) == 1 for text in before)
        assert b"short summary" in (paths.dir / "moved" / "real.md").read_bytes()


def _victim(ws: AgentWorkspace) -> AgentPaths:
    victim = ws.create_agent("victim", entries=4)
    victim.archive_dir.mkdir(mode=0o700)
    (victim.archive_dir / "history_2026-01-01_00-00-00.md").write_text("victim archive")
    victim.dir.chmod(0o711)  # traversable, not listable: links can be aimed at it
    return victim


@needs_root
@pytest.mark.parametrize("link", ["MEMORY.md", "archive"])
def test_symlinks_into_another_agents_folder_are_refused(link: str) -> None:
    with reachable_tmp("memd-a1-cross-") as base:
        ws, evil, _outside = _evil_agent(base)
        victim = _victim(ws)
        victim_before = {p: p.read_bytes() for p in victim.dir.rglob("*") if p.is_file()}
        attacker = Attacker(base)
        try:
            if link == "MEMORY.md":
                attacker.must("unlink", path=str(evil.memory))
                attacker.must("symlink", target="../victim/MEMORY.md", path=str(evil.memory))
            else:
                attacker.must("symlink", target="../victim/archive", path=str(evil.archive_dir))
        finally:
            attacker.close()
        with pytest.raises(WorkspaceError, match="outside the agent's own folder"):
            agent_paths(ws.root, "evil")
        # A daemon holding paths from before the link: the transaction refuses too.
        with pytest.raises(CompactionAborted, match="outside the agent's own folder"):
            compact_agent(evil, Fixed(), CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05))
        assert {p: p.read_bytes() for p in victim.dir.rglob("*") if p.is_file()} == victim_before
        if link == "MEMORY.md":
            assert not (evil.dir / "archive").exists()  # nothing of the victim's archived


def test_links_others_made_to_a_real_agent_folder_do_not_stop_its_compaction(
    tmp_path: Path,
) -> None:
    # agents/ is writable by every agent: agents/evil -> victim (or -> victim/archive,
    # or -> ..) made the victim's own compactions fail ("resolves into another
    # agent's folder") until its breaker opened. The links are refused; the victim
    # is not.
    ws = AgentWorkspace(tmp_path / "ws")
    victim = _victim(ws)
    (ws.root / "agents" / "evil").symlink_to("victim")
    (ws.root / "agents" / "deep").symlink_to("victim/archive")
    (ws.root / "agents" / "whole").symlink_to("..")
    before = entry_contents_everywhere(victim)
    outcome = compact_agent(victim, Fixed(), CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05))
    assert outcome.archive is not None and outcome.archive.parent == victim.archive_dir
    assert entry_contents_everywhere(victim) == before
    for name in ("evil", "deep", "whole"):
        with pytest.raises(WorkspaceError):
            agent_paths(ws.root, name)


def test_agent_folder_symlinked_into_another_agents_folder_is_refused(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    victim = _victim(ws)
    before = victim.memory.read_bytes()
    (ws.root / "agents" / "evil").symlink_to("victim")
    (ws.root / "agents" / "deep").symlink_to(victim.dir / "archive")
    (ws.root / "agents" / "whole").symlink_to("..")
    (ws.root / "shared").mkdir()
    (ws.root / "agents" / "fine").symlink_to("../shared")
    for name, reason in [
        ("evil", "another agent's folder"),
        ("deep", "another agent's folder"),
        ("whole", "other agents"),
    ]:
        with pytest.raises(WorkspaceError, match=reason):
            agent_paths(ws.root, name)
        cached = AgentPaths(
            workspace=ws.root.resolve(),
            agent=name,
            dir=ws.root / "agents" / name,
            memory=ws.root / "agents" / name / "MEMORY.md",
            archive_dir=ws.root / "agents" / name / "archive",
            private_dir=ws.root / "agents" / name / ".memd",
        )
        with pytest.raises(CompactionAborted, match=reason):
            compact_agent(cached, Fixed(), CompactionOptions(lock_wait_s=5))
    assert victim.memory.read_bytes() == before
    assert not (victim.dir / ".memd").exists()
    # A folder symlinked elsewhere inside the workspace is fine (once the
    # folder-sized links above, which cover it, are gone).
    (ws.root / "agents" / "whole").unlink()
    assert agent_paths(ws.root, "fine").dir.is_dir()


def test_pinned_folder_refuses_a_planted_private_symlink(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha", entries=2)
    (tmp_path / "elsewhere").mkdir()
    paths.private_dir.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(WorkspaceError, match=".memd is not a real folder"):
        AgentDir.open(paths)
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.timeout(30)
def test_memory_swapped_for_a_fifo_during_the_llm_call_is_refused_and_the_lock_freed(
    tmp_path: Path,
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha", entries=4)
    before = paths.memory.read_bytes()

    class SwapsInAFifo:
        model = "swaps"

        def summarize(self, request: object) -> SummaryResult:
            paths.memory.rename(paths.dir / "kept.md")
            os.mkfifo(paths.memory)
            return SummaryResult(text="short summary", model="swaps")

    with pytest.raises(CompactionAborted, match="not a regular file"):
        compact_agent(paths, SwapsInAFifo(), CompactionOptions(lock_wait_s=1))
    assert (paths.dir / "kept.md").read_bytes() == before
    # The lock was released: another compactor gets it at once.
    from memd.fsutil import AgentLock

    AgentLock(paths.lock, "alpha").acquire(0)
