"""Erase by pattern: real files, real compactions, a child process killed at every step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run
from support.memfiles import AgentWorkspace, append_entry, snapshot_tree

from memd.archive_crypto import generate_master_key, read_archive
from memd.audit import AuditLog, audit_path, read_audit
from memd.compaction import CompactionOptions, ProvidedSummary, compact_agent, recover_agent
from memd.core.memfile import parse
from memd.erasure import ERASE_CHECKPOINTS, EraseOptions, EraseRefused, erase_by_pattern
from memd.errors import CompactionAborted
from memd.fsutil import SlotJournal
from memd.recall.index import RecallIndex, recall_db_path
from memd.rewrite import StagingError
from memd.workspace import AgentPaths

CHILD = Path(__file__).parent / "support" / "erase_child.py"
PLANTED = "PLANTED-c0ffee-4111"
FAST = CompactionOptions(drain_quiet_s=0.05, drain_max_s=2.0, require_shrink=False)


def build_history(ws: AgentWorkspace, key_file: Path | None = None) -> AgentPaths:
    """Two compactions (two archives, a summary naming the secret) and live entries,
    the planted string in each place an erasure must reach."""
    paths = ws.create_agent("alpha", entries=2)
    append_entry(paths.memory, "Human", f"my card is {PLANTED}, remember it")
    options = CompactionOptions(
        drain_quiet_s=0.05, drain_max_s=2.0, require_shrink=False, key_file=key_file
    )
    compact_agent(
        paths,
        ProvidedSummary(f"The user gave a card ({PLANTED}).\nThe user likes tea."),
        options,
        manual=True,
    )
    append_entry(paths.memory, "AI", "noted, nothing secret here")
    append_entry(paths.memory, "Human", f"again: {PLANTED}")
    compact_agent(paths, ProvidedSummary("The user likes tea."), options, manual=True)
    append_entry(paths.memory, "Human", f"live turn with {PLANTED}")
    append_entry(paths.memory, "AI", "live turn kept")
    return paths


def files_of(paths: AgentPaths) -> dict[str, bytes]:
    """MEMORY.md and every archive (what an erasure may change), by name."""
    found = {"MEMORY.md": paths.memory.read_bytes()}
    for item in sorted(paths.archive_dir.iterdir()):
        found[item.name] = item.read_bytes()
    return found


def raw_texts(files: dict[str, bytes]) -> list[str]:
    texts = []
    for data in files.values():
        document = parse(data)
        texts += [e.text for e in document.entries if not document.is_summary_entry(e)]
    return texts


def test_erases_entries_summaries_and_archives_and_keeps_the_rest(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)
    before = files_of(paths)
    assert sum(data.count(PLANTED.encode()) for data in before.values()) >= 4
    kept_before = [t for t in raw_texts(before) if PLANTED not in t]
    old = os.stat(next(paths.archive_dir.iterdir()))
    os.utime(next(paths.archive_dir.iterdir()), ns=(old.st_atime_ns, 1_000_000_000))
    ages = {p.name: p.stat().st_mtime_ns for p in paths.archive_dir.iterdir()}
    outcome = erase_by_pattern(
        paths, re.compile(re.escape(PLANTED)), EraseOptions(drain_quiet_s=0.05)
    )
    after = files_of(paths)
    assert set(after) == set(before)  # same archives, same names
    # Same ages too: retention (by mtime) must not keep a rewritten archive longer.
    assert {p.name: p.stat().st_mtime_ns for p in paths.archive_dir.iterdir()} == ages
    for name, data in after.items():
        assert PLANTED.encode() not in data, name
        document = parse(data)
        assert document.header is not None and document.boundary == document.size
    # Every other raw entry is still there, exactly as often as before.
    assert sorted(raw_texts(after)) == sorted(kept_before)
    assert outcome.entries == 3 and outcome.memory and outcome.archives == 2
    assert outcome.summary_lines >= 1
    assert "The user likes tea." in after["MEMORY.md"].decode()
    # Nothing left behind in .memd/ but the lock and the journal (idle).
    assert sorted(p.name for p in paths.private_dir.iterdir()) == ["journal", "lock"]
    # A second run finds nothing.
    again = erase_by_pattern(paths, re.compile(re.escape(PLANTED)))
    assert again.removed == 0 and files_of(paths) == after


def test_late_appends_during_the_erase_are_kept(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)

    def append_at(name: str) -> None:
        if name == "memory-staged":  # after the snapshot, before the replace
            append_entry(paths.memory, "Human", "written while erasing")

    erase_by_pattern(
        paths,
        re.compile(re.escape(PLANTED)),
        EraseOptions(drain_quiet_s=0.05),
        checkpoint=append_at,
    )
    memory = paths.memory.read_text()
    assert "written while erasing" in memory and PLANTED not in memory
    assert memory.count("written while erasing") == 1


def run_child(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), str(root), "alpha", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("crash_at", ERASE_CHECKPOINTS)
def test_a_kill_at_any_step_leaves_old_or_new_content_never_half(
    tmp_path: Path, crash_at: str
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)
    before = files_of(paths)
    # What a clean run produces, on a copy.
    twin = AgentWorkspace(tmp_path / "twin")
    twin_paths = build_history(twin)
    erase_by_pattern(twin_paths, re.compile(re.escape(PLANTED)), EraseOptions(drain_quiet_s=0.05))
    expected_texts = sorted(raw_texts(files_of(twin_paths)))

    result = run_child(ws.root, re.escape(PLANTED), "--crash-at", crash_at)
    assert result.returncode == 137, result.stderr
    # What the crash left in .memd/ (journal, manifest, staged temps) holds neither the
    # pattern nor what it matched; only the old inode's own link (drain.md) does.
    for leftover in paths.private_dir.iterdir():
        if leftover.name != "drain.md":
            assert PLANTED.encode() not in leftover.read_bytes(), leftover.name
    journal = SlotJournal(paths.journal).read()
    if journal is not None and journal.get("phase") not in (None, "idle"):
        assert crash_at in ERASE_CHECKPOINTS[ERASE_CHECKPOINTS.index("journal-erasing") : -1]
        assert journal["version"] == 3 and journal["erase"] is True
    recover_agent(paths, quiet_s=0.05, max_s=2.0)
    after = files_of(paths)
    committed = ERASE_CHECKPOINTS.index(crash_at) >= ERASE_CHECKPOINTS.index("journal-erasing")
    if committed:
        assert all(PLANTED.encode() not in data for data in after.values())
        assert sorted(raw_texts(after)) == expected_texts
    else:
        assert after == before  # byte for byte
    assert sorted(p.name for p in paths.private_dir.iterdir()) == ["journal", "lock"]
    # And the next erase (or compaction) runs normally.
    erase_by_pattern(paths, re.compile(re.escape(PLANTED)))
    assert all(PLANTED.encode() not in data for data in files_of(paths).values())


def test_encrypted_archives_are_decrypted_rewritten_and_resealed_under_a_new_key(
    tmp_path: Path,
) -> None:
    key_file = tmp_path / "master.key"
    generate_master_key(key_file)
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws, key_file)
    names = sorted(p.name for p in paths.archive_dir.iterdir())
    assert names and all(n.endswith(".md.enc") for n in names)
    old_key = (paths.private_dir / "archive.key").read_bytes()
    old_blobs = {n: (paths.archive_dir / n).read_bytes() for n in names}
    from memd.archive_crypto import read_master_key

    master = read_master_key(key_file)
    # Without the key: refused, nothing changed.
    with pytest.raises(EraseRefused, match="encrypted"):
        erase_by_pattern(paths, re.compile(re.escape(PLANTED)))
    assert {n: (paths.archive_dir / n).read_bytes() for n in names} == old_blobs
    outcome = erase_by_pattern(
        paths, re.compile(re.escape(PLANTED)), EraseOptions(drain_quiet_s=0.05, key_file=key_file)
    )
    assert outcome.resealed == len(names)
    assert sorted(p.name for p in paths.archive_dir.iterdir()) == names
    for name in names:
        plain = read_archive(paths, name, master)
        assert PLANTED.encode() not in plain and b"Agent Memory" in plain
        assert PLANTED.encode() not in (paths.archive_dir / name).read_bytes()
    assert (paths.private_dir / "archive.key").read_bytes() != old_key  # the old key shredded
    # A surviving copy of an old archive no longer opens: its key is gone.
    stash = paths.archive_dir / names[0]
    stash.write_bytes(old_blobs[names[0]])
    with pytest.raises(Exception, match="data key|authentication"):
        read_archive(paths, names[0], master)


def test_cli_match_audits_counts_never_the_pattern_and_scrubs_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)
    state = tmp_path / "state"
    with RecallIndex.open(state, ws.root) as index:
        index.sync_agent(paths)
    index_file = recall_db_path(state, ws.root)
    assert PLANTED.encode() in index_file.read_bytes()
    args = ["-w", str(ws.root), "--state-dir", str(state)]
    code, out, err = run(capsys, "forget", "alpha", "--match", re.escape(PLANTED), *args)
    assert code == 2 and "--yes" in err  # asks first, touches nothing
    assert PLANTED.encode() in paths.memory.read_bytes()
    code, out, err = run(capsys, "forget", "alpha", "--match", re.escape(PLANTED), "--yes", *args)
    assert code == 0, err
    assert "erased 3 matching entries" in out
    raw = index_file.read_bytes()
    wal = Path(f"{index_file}-wal")
    raw += wal.read_bytes() if wal.exists() else b""
    assert PLANTED.encode() not in raw
    with RecallIndex.open(state, ws.root) as index:
        assert index.search("alpha", "noted")  # the rest is still searchable
    records = read_audit(audit_path(state, ws.root)).for_agent("alpha")
    erase = [r for r in records if r.event == "erase_match"]
    assert len(erase) == 1
    assert erase[0].fields["entries"] == 3 and erase[0].fields["archives"] == 2
    assert erase[0].fields["pattern_hash"]
    log = audit_path(state, ws.root).read_bytes()
    assert PLANTED.encode() not in log and b"c0ffee" not in log


def test_cli_match_file_keeps_the_pattern_off_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ps shows a command line to every user: the fact to erase comes from a file
    # (one final newline dropped), and is erased as --match's would be.
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)
    pattern = tmp_path / "pattern.txt"
    pattern.write_text(re.escape(PLANTED) + "\n", encoding="utf-8")
    args = ["-w", str(ws.root), "--state-dir", str(tmp_path / "state")]
    code, out, err = run(capsys, "forget", "alpha", "--match-file", str(pattern), "--yes", *args)
    assert code == 0, err
    assert "erased 3 matching entries" in out
    assert PLANTED.encode() not in paths.memory.read_bytes()


@pytest.mark.parametrize(
    ("content", "extra", "says"),
    [
        (b"\xff(", [], "is not UTF-8 text"),
        (b"\n", [], "the pattern file is empty"),
        (b"x", ["--match", "y"], "not both"),
        (None, [], "cannot read pattern file"),
    ],
)
def test_cli_bad_match_file_is_one_line_and_changes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes | None,
    extra: list[str],
    says: str,
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha", entries=2)
    pattern = tmp_path / "pattern.txt"
    if content is not None:
        pattern.write_bytes(content)
    before = snapshot_tree(ws.root)
    code, _, err = run(
        capsys, "forget", "alpha", "--match-file", str(pattern), *extra, "--yes", "-w", str(ws.root)
    )
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert snapshot_tree(ws.root) == before


@pytest.mark.parametrize("bad", ["(unclosed", "[z-a]", ".*"])
def test_cli_bad_pattern_is_one_line_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha", entries=2)
    before = paths.memory.read_bytes()
    code, out, err = run(
        capsys,
        "forget",
        "alpha",
        "--match",
        bad,
        "--yes",
        "-w",
        str(ws.root),
        "--state-dir",
        str(tmp_path / "s"),
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and repr(bad) in err
    assert paths.memory.read_bytes() == before
    assert not os.path.exists(paths.private_dir / "erase.manifest")


def test_a_manifest_from_a_newer_release_is_refused_clearly(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)
    result = run_child(ws.root, re.escape(PLANTED), "--crash-at", "journal-erasing")
    assert result.returncode == 137, result.stderr
    manifest = paths.private_dir / "erase.manifest"
    manifest.write_text(manifest.read_text().replace('"version": 1', '"version": 99'))
    before = files_of(paths)
    with pytest.raises(StagingError, match="format 99, newer"):
        recover_agent(paths)
    assert files_of(paths) == before


def test_archives_whose_key_is_shredded_are_left_as_they_are(tmp_path: Path) -> None:
    key_file = tmp_path / "master.key"
    generate_master_key(key_file)
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws, key_file)
    (paths.private_dir / "archive.key").unlink()  # nobody can open them any more
    sealed = {p.name: p.read_bytes() for p in paths.archive_dir.iterdir()}
    outcome = erase_by_pattern(
        paths, re.compile(re.escape(PLANTED)), EraseOptions(drain_quiet_s=0.05, key_file=key_file)
    )
    assert outcome.memory and outcome.archives == 0
    assert {p.name: p.read_bytes() for p in paths.archive_dir.iterdir()} == sealed
    assert PLANTED not in paths.memory.read_text()


@pytest.mark.parametrize("fail_at", ["archives-staged", "memory-staged", "archives-renamed"])
def test_an_error_before_the_commit_changes_nothing_after_it_is_finished_later(
    tmp_path: Path, fail_at: str
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)
    before = files_of(paths)

    def fail(name: str) -> None:
        if name == fail_at:
            raise OSError(28, "No space left on device")

    with pytest.raises(CompactionAborted) as info:
        erase_by_pattern(paths, re.compile(re.escape(PLANTED)), checkpoint=fail)
    committed = fail_at == "archives-renamed"
    assert ("committed" in str(info.value)) is committed
    assert "\n" not in str(info.value) and PLANTED not in str(info.value)
    if not committed:
        assert files_of(paths) == before
        assert sorted(p.name for p in paths.private_dir.iterdir()) == ["journal", "lock"]
        return
    recover_agent(paths, quiet_s=0.05)
    assert all(PLANTED.encode() not in data for data in files_of(paths).values())
    assert sorted(p.name for p in paths.private_dir.iterdir()) == ["journal", "lock"]


def test_cli_match_erases_from_a_torn_last_entry_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An agent killed mid-write leaves an unterminated last entry: it is text of
    # MEMORY.md all the same, and the pattern must not survive in it.
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha", entries=3)
    with paths.memory.open("ab") as torn:
        torn.write(f"### Human \u2014 2026-12-01T10:00:00\n\nmy card {PLANTED} and".encode())
    args = ["-w", str(ws.root), "--state-dir", str(tmp_path / "state")]
    code, _, err = run(capsys, "forget", "alpha", "--match", re.escape(PLANTED), "--yes", *args)
    assert code == 0, err
    assert PLANTED.encode() not in paths.memory.read_bytes()
    assert len(parse(paths.memory.read_bytes()).entries) == 3  # the whole entries stay


def test_forget_match_leaves_no_copy_in_a_moved_aside_recall_index(
    agent_ws: AgentWorkspace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("MEMD_STATE_DIR", str(state))
    workspace = str(agent_ws.root)
    paths = agent_ws.create_agent("delta")
    append_entry(paths.memory, "Human", "My card PIN is VIOLET-PIN-5521, never share it.")
    append_entry(paths.memory, "AI", "Understood, I will not repeat the PIN.")
    code, _out, err = run(capsys, "recall", "delta", "PIN", "--workspace", workspace)
    assert code == 0, err
    index = recall_db_path(state, agent_ws.root)
    # The index file gets damaged (a disk error, a crash on a bad fs): the next
    # open moves it aside as <index>.corrupt-<ts> and rebuilds an empty one.
    with index.open("r+b") as handle:
        handle.write(b"not an sqlite database!")
    code, _out, err = run(capsys, "recall", "delta", "PIN", "--workspace", workspace)
    assert code == 0, err
    copies = list(index.parent.glob(index.name + ".corrupt-*"))
    assert copies, "the damaged index was not moved aside"
    assert any(b"VIOLET-PIN-5521" in c.read_bytes() for c in copies)  # what it holds

    code, out, err = run(
        capsys, "forget", "delta", "--match", "VIOLET-PIN", "--yes", "--workspace", workspace
    )
    assert code == 0, err
    assert "erased 1 matching" in out
    left = [
        p.name for p in state.rglob("*") if p.is_file() and b"VIOLET-PIN-5521" in p.read_bytes()
    ]
    assert left == []


# -- r9data F2: a rewrite in place between staging and the replace ------------------


@pytest.mark.parametrize("at_point", ["memory-staged", "archives-renamed"])
def test_forget_match_loses_no_turn_of_a_rewrite_in_place_before_its_commit(
    tmp_path: Path, at_point: str
) -> None:
    from support.memfiles import entry_contents_everywhere, swarms_block, swarms_header

    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)
    rewritten = swarms_header("alpha") + swarms_block("Human", "REWRITTEN turn after a reset")

    def at(name: str) -> None:
        if name == at_point:
            with open(paths.memory, "r+", encoding="utf-8") as handle:  # same inode
                handle.truncate(0)
                handle.write(rewritten)

    with pytest.raises(CompactionAborted, match="rewritten in place"):
        erase_by_pattern(
            paths, re.compile(re.escape(PLANTED)), EraseOptions(drain_quiet_s=0.05), checkpoint=at
        )
    # MEMORY.md as the agent rewrote it (its turn there once); before the commit
    # nothing changed, after it the archives are erased all the same.
    assert paths.memory.read_text() == rewritten
    assert entry_contents_everywhere(paths)["REWRITTEN turn after a reset"] == 1
    archived = b"".join(p.read_bytes() for p in paths.archive_dir.iterdir())
    assert (PLANTED.encode() in archived) == (at_point == "memory-staged")
    assert sorted(p.name for p in paths.private_dir.iterdir()) == ["journal", "lock"]
    assert SlotJournal(paths.journal).read() == {"phase": "idle"}


def test_forget_match_drains_a_late_turn_only_at_the_end_of_an_agents_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from support.memfiles import entry_contents_everywhere, swarms_block

    import memd.compaction as compaction

    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)
    late_writer = os.open(paths.memory, os.O_WRONLY | os.O_APPEND)
    split = swarms_block("Human", "SPLIT turn written in two write() calls").encode()
    fresh: list[int] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:  # the agent ends its turn when the drain waits
        if fresh and len(fresh) == 1:
            os.write(fresh[0], split[20:])
            fresh.append(-1)
        real_sleep(seconds)

    monkeypatch.setattr(compaction.time, "sleep", sleep)

    def at(name: str) -> None:
        if name == "replaced":
            os.write(late_writer, swarms_block("AI", "LATE turn to the old inode").encode())
            fd = os.open(paths.memory, os.O_WRONLY | os.O_APPEND)
            os.write(fd, split[:20])
            fresh.append(fd)

    try:
        erase_by_pattern(
            paths, re.compile(re.escape(PLANTED)), EraseOptions(drain_quiet_s=0.05), checkpoint=at
        )
    finally:
        for fd in (*fresh[:1], late_writer):
            os.close(fd)
    assert len(fresh) == 2  # the drain waited for the agent's turn to end
    seen = entry_contents_everywhere(paths)
    assert seen["LATE turn to the old inode"] == 1
    assert seen["SPLIT turn written in two write() calls"] == 1


# -- r9data F3: one matching rule for raw turns and summary lines; --dry-run ---------


def test_forget_match_erases_a_line_anchored_pattern_from_raw_turns_too(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha", entries=3)
    append_entry(paths.memory, "Human", "Note this.\nhome address: 12 Elm Street\nThanks.")
    summary = "The user moved.\nhome address: 12 Elm Street\nTask: ship memd. " + "fact " * 20
    compact_agent(paths, ProvidedSummary(summary), FAST, manual=True)
    append_entry(paths.memory, "Human", "Again:\nhome address: 12 Elm Street\nbye")
    outcome = erase_by_pattern(
        paths, re.compile(r"^home address: .*$"), EraseOptions(drain_quiet_s=0.05)
    )
    assert outcome.summary_lines == 1  # the summary's line went (line by line)
    assert outcome.entries == 2  # and both raw turns holding the line (^…$ at their lines)
    left = [
        p.name
        for p in [paths.memory, *paths.archive_dir.iterdir()]
        if b"12 Elm Street" in p.read_bytes()
    ]
    assert left == []  # was ['MEMORY.md', 'history_….md']: the raw turns kept it


def test_cli_match_dry_run_says_what_would_go_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)
    state = tmp_path / "state"
    before = files_of(paths)
    private = sorted(p.name for p in paths.private_dir.iterdir())
    args = ["-w", str(ws.root), "--state-dir", str(state)]
    code, out, err = run(
        capsys, "forget", "alpha", "--match", re.escape(PLANTED), "--dry-run", *args
    )
    assert code == 0, err
    assert "would erase 3 matching entries" in out and "(dry run: nothing changed)" in out
    assert "would rewrite MEMORY.md and 2 archive(s)" in out
    assert files_of(paths) == before
    assert sorted(p.name for p in paths.private_dir.iterdir()) == private
    assert not audit_path(state, ws.root).exists()  # nothing done, nothing audited
    # The same counts as the erasure then makes.
    done = erase_by_pattern(paths, re.compile(re.escape(PLANTED)), EraseOptions(drain_quiet_s=0.05))
    assert (done.entries, done.archives, done.memory) == (3, 2, True)
    code, out, err = run(capsys, "forget", "alpha", "--dry-run", *args)
    assert code == 2 and "--dry-run goes with --match" in err and "Traceback" not in err


# -- an erasure's journal lost after its commit (both slots damaged) -------------------


@pytest.mark.parametrize("crash_at", ["journal-erasing", "archives-renamed", "replaced", "drained"])
def test_an_unreadable_journal_of_a_committed_erasure_finishes_the_archives_and_says_to_rerun(
    tmp_path: Path, crash_at: str
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)
    turns_before = {t for t in raw_texts(files_of(paths)) if PLANTED not in t}
    result = run_child(ws.root, re.escape(PLANTED), "--crash-at", crash_at)
    assert result.returncode == 137, result.stderr
    paths.journal.write_bytes(b"\0" * 8192)  # a power loss took both slots
    done = recover_agent(paths, quiet_s=0.05, max_s=2.0)
    assert done is not None and ".memd/journal was unreadable" in done
    assert "memd forget --match" in done  # what to do about what may be left
    after = files_of(paths)
    if crash_at in ("replaced", "drained"):
        # An erasure renames its archives in before it replaces MEMORY.md: only the
        # old MEMORY.md, kept whole as an archive, still holds the pattern.
        assert [data for data in after.values() if PLANTED.encode() in data] != []
        held = [n for n, data in after.items() if PLANTED.encode() in data]
        assert len(held) == 1 and held[0] != "MEMORY.md", held
    # Nothing lost: every turn that did not match is somewhere still.
    assert turns_before <= set(raw_texts(after))
    assert sorted(p.name for p in paths.private_dir.iterdir()) == ["journal", "lock"]
    # And running it again erases what the recovery had to keep.
    erase_by_pattern(paths, re.compile(re.escape(PLANTED)), EraseOptions(drain_quiet_s=0.05))
    assert all(PLANTED.encode() not in data for data in files_of(paths).values())


# -- an erasure a crash left committed, finished by recovery (s10upgrade C, D) --------

COMMITTED = ERASE_CHECKPOINTS[ERASE_CHECKPOINTS.index("journal-erasing") : -1]


def _recovered_erasures(state: Path, ws: AgentWorkspace) -> list[dict[str, object]]:
    records = read_audit(audit_path(state, ws.root)).for_agent("alpha")
    return [dict(r.fields) for r in records if r.event == "erase_match"]


@pytest.mark.parametrize("crash_at", COMMITTED)
def test_an_erasure_recovery_finishes_is_audited_as_recovered_and_called_an_erasure(
    tmp_path: Path, crash_at: str
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = build_history(ws)
    result = run_child(ws.root, re.escape(PLANTED), "--crash-at", crash_at)
    assert result.returncode == 137, result.stderr
    state = tmp_path / "state"
    audit = AuditLog(audit_path(state, ws.root), "daemon")
    done = recover_agent(paths, quiet_s=0.05, max_s=2.0, audit=audit)
    assert done is not None and done.startswith("finished an interrupted erasure"), done
    assert "compaction" not in done
    # The record a finished erasure writes, marked recovered: no counts recovery does
    # not know, never the pattern or what it matched.
    assert _recovered_erasures(state, ws) == [{"recovered": True}]
    log = audit_path(state, ws.root).read_bytes()
    assert PLANTED.encode() not in log and b"c0ffee" not in log
    assert all(PLANTED.encode() not in data for data in files_of(paths).values())
    # Recovered once: nothing left, nothing recorded again.
    assert recover_agent(paths, quiet_s=0.05, max_s=2.0, audit=audit) is None
    assert len(_recovered_erasures(state, ws)) == 1


@pytest.mark.parametrize("command", ["compact-now", "forget"])
def test_the_cli_audits_an_erasure_it_finishes_before_its_own_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    build_history(ws)
    result = run_child(ws.root, re.escape(PLANTED), "--crash-at", "archives-renamed")
    assert result.returncode == 137, result.stderr
    state = tmp_path / "state"
    args = ["-w", str(ws.root), "--state-dir", str(state)]
    if command == "compact-now":
        job = ["compact-now", "alpha", "--summary", "The user likes tea."]
    else:
        job = ["forget", "alpha", "--match", "no-such-text", "--yes"]
    code, _out, err = run(capsys, *job, *args)
    assert code == 0, err
    # Its own job's record (forget's) aside, one record of the recovered erasure.
    recorded = _recovered_erasures(state, ws)
    assert [r for r in recorded if r.get("recovered")] == [{"recovered": True}]
