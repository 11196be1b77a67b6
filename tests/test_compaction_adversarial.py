"""Adversarial cases for the transaction: partial drains, planted symlinks, outside interference."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.memfiles import entry_contents_everywhere

import memd.compaction as c
from memd.compaction import CompactionOptions, compact_agent, recover_agent
from memd.core.summary import SummaryResult
from memd.errors import CompactionAborted

FAST = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, drain_max_s=2)
LATE = "### AI \u2014 2026-01-01T00:00:00\n\nalpha turn late " + "x" * 200 + "\n\n---\n\n"


class Fixed:
    model = "fixed"

    def summarize(self, request):
        return SummaryResult(
            text="Goals: ship memd. Decisions: the user prefers tea and short answers; compaction keeps every entry exactly once. Open tasks: write the docs, run the crash tests, land the branch.",
            model="fixed",
        )


def everything(paths) -> bytes:
    out = b""
    if paths.archive_dir.exists():
        for p in sorted(paths.archive_dir.glob("history_*.md")):
            out += p.read_bytes()
    return out + paths.memory.read_bytes()


# 1. Partial drain append (ENOSPC / short write) is re-appended whole on recovery.
def test_partial_drain_append_is_finished_not_doubled_on_recovery(agent_ws, monkeypatch):
    paths = agent_ws.create_agent("alpha", entries=3)
    handle = []

    def checkpoint(name):
        if name == "journal-swapping":
            handle.append(
                open(paths.memory, "a", encoding="utf-8")
            )  # writer opened before the swap
        if name == "replaced":
            handle[0].write(LATE)
            handle[0].close()

    def enospc_after_half(fd, data):
        os.write(fd, data[: len(data) // 2])  # the kernel took half, then the disk filled
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(c, "_append", enospc_after_half)
    with pytest.raises(CompactionAborted):
        compact_agent(paths, Fixed(), FAST, checkpoint=checkpoint)
    monkeypatch.undo()
    assert recover_agent(paths) is not None
    data = paths.memory.read_bytes()
    # The late entry's header must be in MEMORY.md exactly once, and the entry intact.
    assert data.count("### AI \u2014 2026-01-01T00:00:00".encode()) == 1, data[-700:]
    assert entry_contents_everywhere(paths)["alpha turn late " + "x" * 200] == 1


# 2. Recovery decides "was the pending chunk appended?" by substring search of the
#    whole new file: identical bytes already present => chunk dropped (loss).
def test_pending_chunk_is_resolved_past_its_journaled_offset(agent_ws, tmp_path):
    paths = agent_ws.create_agent("alpha", entries=3)
    script = f"""
import os
import memd.compaction as c
from memd.core.summary import SummaryResult
from memd.workspace import agent_paths
from pathlib import Path
paths = agent_paths(Path({str(agent_ws.root)!r}), "alpha")
h = []
def crash_before_append(target, data):
    os._exit(137)  # journaled as pending, not appended
c._append = crash_before_append
def checkpoint(name):
    if name == "journal-swapping":
        h.append(open(paths.memory, "a", encoding="utf-8"))
        # a new-file writer (opened after the swap) writes a trailing newline too
    if name == "replaced":
        with open(paths.memory, "a") as f: f.write("\\n")
        h[0].write("\\n")   # late writer's last byte(s) to the old inode
        h[0].close()
class S:
    model = "x"
    def summarize(self, request): return SummaryResult(text="Goals: ship memd. Decisions: the user prefers tea and short answers; compaction keeps every entry exactly once. Open tasks: write the docs, run the crash tests, land the branch.", model="x")
c.compact_agent(paths, S(), c.CompactionOptions(drain_quiet_s=0.05), checkpoint=checkpoint)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 137, r.stderr
    before = paths.memory.read_bytes()
    recover_agent(paths, quiet_s=0.05)
    after = paths.memory.read_bytes()
    # the old inode's byte past copied_to was never appended: recovery must append it
    assert len(after) == len(before) + 1


# 3. Recovery's "MEMORY.md replaced by another program" branch archives the
#    WHOLE old inode although this job's archive (bytes 0..N) is already linked.
def test_recovery_after_external_replace_archives_each_byte_once(agent_ws):
    paths = agent_ws.create_agent("alpha", entries=3)
    child = Path(__file__).parent / "support" / "compaction_child.py"
    r = subprocess.run(
        [sys.executable, str(child), str(agent_ws.root), "alpha", "--crash-at", "journal-swapping"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 137, r.stderr
    # While memd is down, another program (e.g. an operator / Swarms) moves the old
    # file away and starts a new one.
    os.rename(paths.memory, paths.dir / "MEMORY.old")
    paths.memory.write_text("# fresh\n")
    os.unlink(paths.dir / "MEMORY.old")
    recover_agent(paths)
    counts = entry_contents_everywhere(paths)
    assert counts and max(counts.values()) == 1, counts


# 4. .memd/journal (and .memd/lock) are opened following symlinks: a symlink
#    planted in .memd/ makes memd overwrite a file outside the workspace.
def test_planted_journal_symlink_is_refused(agent_ws, tmp_path):
    paths = agent_ws.create_agent("alpha", entries=3)
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    original = b"precious data\n" * 1000
    victim.write_bytes(original)
    paths.private_dir.mkdir(mode=0o700)
    os.symlink(victim, paths.journal)
    with pytest.raises(CompactionAborted):
        compact_agent(paths, Fixed(), FAST)
    assert victim.read_bytes() == original


# 5. MEMORY.md turned into a symlink after agent_paths() checked it (daemon caches
#    AgentPaths; compact-now waits up to lock_wait_s): compaction re-resolves it with
#    no containment check and replaces a file outside the workspace.
def test_memory_symlink_made_after_the_check_is_refused(agent_ws, tmp_path):
    paths = agent_ws.create_agent("alpha", entries=3)
    outside = tmp_path / "outside.md"
    outside.write_bytes(paths.memory.read_bytes())
    paths.memory.unlink()
    paths.memory.symlink_to(outside)
    before = outside.read_bytes()
    with pytest.raises(CompactionAborted):
        compact_agent(paths, Fixed(), FAST)
    assert outside.read_bytes() == before


# 6. Failure must change nothing, incl. the archive dir: a rolled-back compaction
#    chmods an existing archive dir to 0700 (and keeps a newly created one).
def test_failed_compaction_leaves_the_archive_dir_alone(agent_ws, monkeypatch):
    paths = agent_ws.create_agent("alpha", entries=3)
    paths.archive_dir.mkdir()
    os.chmod(paths.archive_dir, 0o755)

    def boom(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(c, "create_file_at", boom)
    with pytest.raises(CompactionAborted):
        compact_agent(paths, Fixed(), FAST)
    assert stat.S_IMODE(paths.archive_dir.stat().st_mode) == 0o755


# 10. An interruption right after the swap (review 14d, F1): the job is committed,
# never rolled back. `memd compact-now` has no SIGINT handler: a Ctrl-C landing
# while os.replace runs is raised as it returns, before `committed` is set (as is
# an error from the folder's fsync just after it). Rolled back, the job deleted
# the archive and the old file's last link while MEMORY.md was already the new
# file (header + summary): every summarized turn was gone.
@pytest.mark.parametrize(
    "interrupt",
    [KeyboardInterrupt(), OSError(errno.EIO, os.strerror(errno.EIO))],
    ids=["ctrl-c", "eio-on-dir-fsync"],
)
def test_an_interruption_right_after_the_replace_never_deletes_the_archive(
    agent_ws, monkeypatch, interrupt
):
    expected, seen, error = _interrupted_right_after_the_swap(agent_ws, monkeypatch, interrupt)
    if isinstance(interrupt, OSError):
        assert "committed" in error and "rolled back" not in error
    assert set(seen) == expected, f"lost {len(expected - set(seen))} of {len(expected)} turns"
    assert all(n == 1 for n in seen.values())


def _interrupted_right_after_the_swap(agent_ws, monkeypatch, interrupt, agent_rewrite=None):
    """Compact alpha (4 turns) with ``interrupt`` raised as the swap's os.replace
    returns (after ``agent_rewrite(paths)``, an agent's own replace, when given),
    then recover; returns the turns before, each turn's count everywhere after,
    and the job's error message."""
    from support.memfiles import raw_entries

    paths = agent_ws.create_agent("alpha", entries=4)
    expected = {e.text for e in raw_entries(paths.memory.read_bytes())}
    real_replace = os.replace

    def replace_then_interrupted(src, dst, **kwargs):
        real_replace(src, dst, **kwargs)
        if dst == "MEMORY.md":
            if agent_rewrite is not None:
                agent_rewrite(paths, real_replace)
            raise interrupt

    monkeypatch.setattr(c.os, "replace", replace_then_interrupted)
    with pytest.raises((KeyboardInterrupt, CompactionAborted)) as raised:
        compact_agent(paths, Fixed(), FAST)
    monkeypatch.undo()
    recover_agent(paths)
    seen = {
        text: n
        for text, n in entry_contents_everywhere(paths).items()
        if text.startswith("alpha turn")
    }
    return expected, seen, str(raised.value)


# 11. Recovery keeps the old file as an archive with an archive's mode (review 14d,
# F3): memd is killed after the swap and, while it is down, the agent starts a
# new MEMORY.md. The old inode's content becomes the archive: it was hard-linked,
# so the archive was the agent's own old MEMORY.md, with its mode (group-writable
# here, as the README asks when memd runs under another uid) and any writer still
# holding it open appending to an archive.
def test_the_old_file_kept_as_an_archive_by_recovery_gets_an_archives_mode(agent_ws):
    from support.memfiles import swarms_header

    child = Path(__file__).parent / "support" / "compaction_child.py"
    paths = agent_ws.create_agent("alpha", entries=4)
    os.chmod(paths.memory, 0o664)
    old = paths.memory.read_bytes()
    result = subprocess.run(
        [sys.executable, str(child), str(agent_ws.root), "alpha", "--crash-at", "replaced"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 137, result.stderr
    old_ino = os.stat(paths.dir / ".memd" / "drain.md").st_ino
    # Made beside it, then renamed over it: a new inode, never the freed one.
    fresh = paths.dir / "MEMORY.md.new"
    fresh.write_text(swarms_header("alpha"), encoding="utf-8")
    os.replace(fresh, paths.memory)
    assert "kept the old file as an archive" in (recover_agent(paths) or "")
    archives = sorted(paths.archive_dir.glob("history_*.md"))
    assert [archive.read_bytes() for archive in archives] == [old]
    for archive in archives:
        mode = stat.S_IMODE(archive.stat().st_mode)
        assert mode & 0o022 == 0, f"{archive.name} is {oct(mode)}"
        assert archive.stat().st_ino != old_ino


NEW_TURN = "### AI \u2014 2026-01-01T00:00:00\n\nalpha turn after " + "y" * 50 + "\n\n---\n\n"


# 12. (review 15a, F1) The swap happened, then the agent (an atomic-rename writer: read, append,
# write a temp, rename) replaced MEMORY.md, then the folder's fsync failed (or a
# Ctrl-C landed). MEMORY.md is neither the old nor the new inode: _swapped() says
# False and the in-process rollback deletes the archive and the drain link (the
# old inode's last link), although the agent's file holds only the summary: every
# summarized turn is lost. Recovery, for the same inodes, keeps the old file.
@pytest.mark.parametrize(
    "interrupt",
    [KeyboardInterrupt(), OSError(errno.EIO, os.strerror(errno.EIO))],
    ids=["ctrl-c", "eio-on-dir-fsync"],
)
def test_agent_replacing_memory_right_after_the_swap_loses_no_turn(
    agent_ws, monkeypatch, interrupt
):
    def agent_rewrites(paths, replace):
        # The agent: reads what it sees (the new file), appends, renames over.
        mine = paths.dir / "MEMORY.md.agent-tmp"
        mine.write_bytes(paths.memory.read_bytes() + NEW_TURN.encode())
        replace(mine, paths.memory)

    expected, seen, _error = _interrupted_right_after_the_swap(
        agent_ws, monkeypatch, interrupt, agent_rewrites
    )
    assert expected <= set(seen), f"lost {len(expected - set(seen))} of {len(expected)} turns"


class _Stopped(Exception):
    """Raised at a checkpoint: the process stops there (as a crash would, in-process)."""


def _old_file_left_to_recovery(agent_ws, entries, size):
    """Compact alpha and stop right after the swap (committed, drain link in place),
    then let the agent put a fresh MEMORY.md of its own there: recovery must keep
    the whole old file as an archive. Returns the paths and the old file's bytes."""
    from support.memfiles import swarms_header

    paths = agent_ws.create_agent("alpha", entries=entries, size=size)
    old = paths.memory.read_bytes()

    def stop_after_the_swap(name):
        if name == "replaced":
            raise _Stopped

    with pytest.raises(_Stopped):
        compact_agent(paths, Fixed(), FAST, checkpoint=stop_after_the_swap)
    fresh = paths.dir / "MEMORY.md.agent-tmp"
    fresh.write_text(swarms_header("alpha"), encoding="utf-8")
    os.replace(fresh, paths.memory)
    return paths, old


# 13. Recovery's copy of the old file (kept as an archive) is streamed: it read the
# whole file, then wrote it, holding it twice in memory; a large file then failed
# recovery (MemoryError) or took the daemon's memory. A copy that fails part-way
# (ENOSPC) and a retry keep each byte exactly once.
def test_recovery_copies_the_old_file_in_bounded_memory(agent_ws):
    import tracemalloc

    paths, old = _old_file_left_to_recovery(agent_ws, entries=100, size=5000)
    assert len(old) > 5 << 20
    tracemalloc.start()
    try:
        assert "kept the old file as an archive" in (recover_agent(paths) or "")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [a.read_bytes() for a in paths.archive_dir.glob("history_*.md")] == [old]
    assert peak < 3 << 20, f"recovery held {peak / 2**20:.1f} MiB for a {len(old) >> 20} MiB file"


def test_a_recovery_copy_that_fails_part_way_is_retried_whole(agent_ws, monkeypatch):
    from memd import fsutil

    paths, old = _old_file_left_to_recovery(agent_ws, entries=60, size=5000)
    assert len(old) > 3 << 20
    real_write_all = fsutil.write_all
    budget = [len(old) // 2]  # the disk fills half-way through the copy

    def disk_fills(fd, data):
        if len(data) < 4096:  # the journal's slots
            return real_write_all(fd, data)
        if len(data) > budget[0]:
            os.write(fd, bytes(data[: budget[0]]))
            budget[0] = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        budget[0] -= len(data)
        return real_write_all(fd, data)

    monkeypatch.setattr(fsutil, "write_all", disk_fills)
    with pytest.raises(OSError, match="No space left"):
        recover_agent(paths)
    monkeypatch.undo()
    assert "kept the old file as an archive" in (recover_agent(paths) or "")
    archives = sorted(paths.archive_dir.glob("history_*.md"))
    assert [a.read_bytes() for a in archives] == [old]
    assert sorted(p.name for p in paths.private_dir.iterdir()) == ["journal", "lock"]


# 14. ENOSPC part-way through a drain append: the drain appends a late turn to the
# new MEMORY.md, which agents append to as well. Half the turn landed, the disk was
# full for the rest; the half stayed at the end of MEMORY.md, the agent's next turn
# was appended right after it (inside the late turn), and recovery appended the
# rest after the agent's: two turns garbled into one. Now one write per piece, and
# a piece that landed only in part is cut off again when no agent appended since.
def _drain_append_cut_short(agent_ws, monkeypatch, agent_appends_meanwhile):
    """Compact alpha with a late writer (one turn, LATE, to the old file after the
    swap); the drain's write of LATE lands half, and the disk is full for the rest
    until the job has failed. ``agent_appends_meanwhile``: the agent appends
    NEW_TURN to MEMORY.md right after that half write. Returns the paths and the
    job's error message."""
    paths = agent_ws.create_agent("alpha", entries=3)
    late = LATE.encode()
    handle = []

    def checkpoint(name):
        if name == "journal-swapping":
            handle.append(open(paths.memory, "a", encoding="utf-8"))  # opened before the swap
        if name == "replaced":
            handle[0].write(LATE)
            handle[0].close()

    real_write = os.write
    full_fd = []

    def disk_fills(fd, data):
        if fd in full_fd:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if bytes(data) != late:
            return real_write(fd, data)
        landed = real_write(fd, bytes(data)[: len(data) // 2])
        full_fd.append(fd)
        if agent_appends_meanwhile:
            with open(paths.memory, "a", encoding="utf-8") as agent:
                agent.write(NEW_TURN)
        return landed

    monkeypatch.setattr(c.os, "write", disk_fills)
    with pytest.raises(CompactionAborted) as raised:
        compact_agent(paths, Fixed(), FAST, checkpoint=checkpoint)
    monkeypatch.undo()
    return paths, str(raised.value)


def test_a_drain_append_cut_short_is_undone_and_retried_whole(agent_ws, monkeypatch):
    paths, error = _drain_append_cut_short(agent_ws, monkeypatch, agent_appends_meanwhile=False)
    assert "committed" in error and "short write" in error and "undone" in error, error
    # MEMORY.md ends at a turn boundary: the agent's next turn is a turn of its own.
    assert paths.memory.read_bytes().endswith(b"\n\n---\n\n")
    with open(paths.memory, "a", encoding="utf-8") as agent:
        agent.write(NEW_TURN)
    assert recover_agent(paths, quiet_s=0.05) is not None
    data = paths.memory.read_bytes()
    assert data.endswith((NEW_TURN + LATE).encode()), data[-400:]
    counts = entry_contents_everywhere(paths)
    assert counts["alpha turn late " + "x" * 200] == 1
    assert counts["alpha turn after " + "y" * 50] == 1
    assert all(n == 1 for n in counts.values()), counts


def test_a_drain_append_cut_short_with_an_agent_append_after_it_is_kept_and_said(
    agent_ws, monkeypatch
):
    paths, error = _drain_append_cut_short(agent_ws, monkeypatch, agent_appends_meanwhile=True)
    # Cutting the half turn would cut the agent's turn after it: kept, and said.
    assert "split" in error and "no byte lost or doubled" in error, error
    half = len(LATE.encode()) // 2
    assert recover_agent(paths, quiet_s=0.05) is not None
    data = paths.memory.read_bytes()
    # Every byte once: the half, the agent's turn, the rest (never the half twice).
    assert data.endswith(LATE.encode()[:half] + NEW_TURN.encode() + LATE.encode()[half:])
    assert data.count(LATE.encode()[:half]) == 1
