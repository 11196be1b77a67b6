"""Archives encrypted at rest: format, keys, shredding, rotation, crash safety (issue 12 item 5)."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.memfiles import AgentWorkspace, append_entry, entry_contents_everywhere, raw_entries

from memd.agentdir import AgentDir
from memd.archive_crypto import (
    DATA_KEY_NAME,
    ArchiveKeyError,
    MasterKey,
    agent_data_key,
    destroy_data_key,
    generate_master_key,
    key_file_problem,
    open_archive,
    read_archive,
    read_data_key,
    read_master_key,
    rewrap_agent_key,
    seal_archive,
)
from memd.compaction import CHECKPOINTS, CompactionOptions, compact_agent, recover_agent
from memd.core.memfile import parse
from memd.core.summary import SummaryRequest, SummaryResult
from memd.errors import MemdError
from memd.workspace import AgentPaths, archives_of

CHILD = Path(__file__).parent / "support" / "compaction_child.py"
PLANTED = "kalomiren-7731 the launch code is sk-proj-PLANTEDsecretPLANTED"
SUMMARY = (
    "The user prefers tea. Task: ship memd. Decisions: keep every entry exactly once; "
    "write the archive first, then re-seed MEMORY.md. Open tasks: docs, crash tests, landing."
)


class Fixed:
    model = "test-fixed"

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(text=SUMMARY, model=self.model)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys" / "master.key"
    path.parent.mkdir()
    generate_master_key(path)
    return path


def options(key_file: Path | None) -> CompactionOptions:
    return CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, drain_max_s=2, key_file=key_file)


def planted_agent(ws: AgentWorkspace, name: str = "alpha") -> AgentPaths:
    paths = ws.create_agent(name, entries=4)
    append_entry(paths.memory, "Human", PLANTED)
    append_entry(paths.memory, "AI", f"{name} turn after the secret")
    return paths


def data_key_of(paths: AgentPaths, master: MasterKey) -> object:
    with AgentDir.open(paths, create_private=False) as pinned:
        return read_data_key(pinned.private_fd, paths.agent, master, "test")


# -- format and round trip ----------------------------------------------------------


def test_archive_is_ciphertext_on_disk_and_decrypts_to_the_snapshot(
    agent_ws: AgentWorkspace, key_file: Path
) -> None:
    paths = planted_agent(agent_ws)
    before = paths.memory.read_bytes()

    outcome = compact_agent(paths, Fixed(), options(key_file))

    assert outcome.archive.name.startswith("history_")
    assert outcome.archive.name.endswith(".md.enc")
    raw = outcome.archive.read_bytes()
    assert raw.startswith(b"memd-encrypted-archive v1\n")
    for needle in (PLANTED, "kalomiren", "launch code", "alpha turn"):
        assert needle.encode() not in raw
    master = read_master_key(key_file)
    assert read_archive(paths, outcome.archive.name, master) == before
    # The summary names the encrypted archive; MEMORY.md is re-seeded as usual.
    assert f"archive/{outcome.archive.name}" in paths.memory.read_text()
    # One data key, memd-only, wrapped: its raw bytes are nowhere in the file.
    key_path = paths.private_dir / DATA_KEY_NAME
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    record = json.loads(key_path.read_bytes())
    assert record["format"] == "memd-archive-data-key" and record["version"] == 1
    data_key = data_key_of(paths, master)
    assert data_key is not None
    assert base64.b64encode(data_key.key).decode() not in key_path.read_text()  # type: ignore[attr-defined]
    # Nothing but the lock, journal and data key stays in .memd/.
    assert sorted(p.name for p in paths.private_dir.iterdir()) == [
        DATA_KEY_NAME,
        "journal",
        "lock",
    ]


def test_plain_and_encrypted_archives_coexist(agent_ws: AgentWorkspace, key_file: Path) -> None:
    """Turning encryption on later: old plain archives stay, new ones are sealed."""
    paths = planted_agent(agent_ws)
    first = compact_agent(paths, Fixed(), options(None))
    append_entry(paths.memory, "Human", "alpha turn under encryption")
    second = compact_agent(paths, Fixed(), options(key_file))

    assert first.archive.name.endswith(".md")
    assert second.archive.name.endswith(".md.enc")
    assert [p.name for p in archives_of(paths)] == [first.archive.name, second.archive.name]
    seen = entry_contents_everywhere(paths, key_file)
    assert seen[PLANTED] == 1
    assert seen["alpha turn under encryption"] == 1
    # The provenance line of the second summary counts the plain one as earlier.
    assert f"archive/{second.archive.name} (+1 earlier)" in paths.memory.read_text()


def test_two_archives_in_one_second_get_distinct_sealed_names(
    agent_ws: AgentWorkspace, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memd.compaction as compaction

    monkeypatch.setattr(compaction, "_archive_stem", lambda: "history_2026-01-01_10-00-00")
    paths = planted_agent(agent_ws)
    names = []
    for turn in range(3):
        append_entry(paths.memory, "Human", f"alpha turn {turn}")
        names.append(compact_agent(paths, Fixed(), options(key_file)).archive.name)
    assert names == [
        "history_2026-01-01_10-00-00.md.enc",
        "history_2026-01-01_10-00-00_1.md.enc",
        "history_2026-01-01_10-00-00_2.md.enc",
    ]
    master = read_master_key(key_file)
    for name in names:
        assert parse(read_archive(paths, name, master)).boundary > 0


def test_tampering_renaming_and_moving_are_detected(ws: AgentWorkspace, key_file: Path) -> None:
    alpha, beta = planted_agent(ws, "alpha"), planted_agent(ws, "beta")
    archive = compact_agent(alpha, Fixed(), options(key_file)).archive
    compact_agent(beta, Fixed(), options(key_file))
    master = read_master_key(key_file)
    blob = archive.read_bytes()

    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x01
    archive.chmod(0o600)
    archive.write_bytes(bytes(flipped))
    with pytest.raises(ArchiveKeyError, match="failed authentication"):
        read_archive(alpha, archive.name, master)

    archive.write_bytes(blob)
    renamed = archive.with_name("history_2030-01-01_00-00-00.md.enc")
    renamed.write_bytes(blob)
    with pytest.raises(ArchiveKeyError, match="failed authentication"):
        read_archive(alpha, renamed.name, master)

    # Beta's folder, beta's data key: alpha's archive does not open there.
    (beta.archive_dir / archive.name).write_bytes(blob)
    with pytest.raises(ArchiveKeyError, match="encrypted with data key"):
        read_archive(beta, archive.name, master)
    # The untouched archive still reads.
    assert PLANTED.encode() in read_archive(alpha, archive.name, master)


def test_format_versions_newer_than_this_memd_are_refused_clearly(
    agent_ws: AgentWorkspace, key_file: Path, tmp_path: Path
) -> None:
    paths = planted_agent(agent_ws)
    archive = compact_agent(paths, Fixed(), options(key_file)).archive
    master = read_master_key(key_file)

    blob = archive.read_bytes()
    archive.chmod(0o600)
    archive.write_bytes(blob.replace(b"archive v1\n", b"archive v2\n", 1))
    with pytest.raises(ArchiveKeyError, match=r"format v2, newer than this memd reads \(v1\)"):
        read_archive(paths, archive.name, master)

    future_key = tmp_path / "future.key"
    future_key.write_text(key_file.read_text().replace("memd-master-key v1", "memd-master-key v9"))
    with pytest.raises(ArchiveKeyError, match="format v9, newer"):
        read_master_key(future_key)

    key_path = paths.private_dir / DATA_KEY_NAME
    record = json.loads(key_path.read_text())
    record["version"] = 3
    key_path.write_text(json.dumps(record))
    with pytest.raises(ArchiveKeyError, match="format v3, newer"):
        data_key_of(paths, master)


def test_an_archive_of_format_v1_written_by_hand_reads(agent_ws: AgentWorkspace) -> None:
    """The v1 layout, spelled out: what this release writes, later releases must read."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from memd.archive_crypto import DataKey

    data_key = DataKey(agent="alpha", key=bytes(range(32)))
    nonce = bytes(12)
    name = "history_2026-01-01_10-00-00.md.enc"
    header = b"memd-encrypted-archive v1\n" + bytes.fromhex(data_key.key_id) + nonce
    aad = header + b"\0alpha\0" + name.encode()
    blob = header + AESGCM(data_key.key).encrypt(nonce, b"hello archive", aad)
    assert open_archive(data_key, name, blob) == b"hello archive"
    assert open_archive(data_key, name, seal_archive(data_key, name, b"x")) == b"x"


# -- keys --------------------------------------------------------------------------------


def test_keygen_writes_0600_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "k"
    old_umask = os.umask(0)
    try:
        key = generate_master_key(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_master_key(path).key == key.key
    before = path.read_bytes()
    with pytest.raises(ArchiveKeyError, match="already exists; refusing to overwrite"):
        generate_master_key(path)
    assert path.read_bytes() == before
    assert base64.b64encode(key.key).decode() not in repr(key)
    assert key.key.hex() not in repr(key)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a memd master key"),
        (b"hello\n", "not a memd master key"),
        (b"memd-master-key v1\nAAAA\n", "damaged"),
        (b"memd-master-key vX\nAAAA\n", "unreadable format line"),
    ],
)
def test_bad_key_files_are_one_line_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.key"
    path.write_bytes(content)
    with pytest.raises(ArchiveKeyError, match=message) as info:
        read_master_key(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_key_file_fails_the_compaction_before_the_summarizer_and_changes_nothing(
    agent_ws: AgentWorkspace, tmp_path: Path
) -> None:
    paths = planted_agent(agent_ws)
    before = paths.memory.read_bytes()
    missing = tmp_path / "nope.key"
    Counting.calls = 0
    with pytest.raises(MemdError, match=f"key file {missing} .*does not exist"):
        compact_agent(paths, Counting(), options(missing))
    assert Counting.calls == 0
    assert paths.memory.read_bytes() == before
    assert not paths.archive_dir.exists()


class Counting(Fixed):
    calls = 0

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        Counting.calls += 1
        return super().summarize(request)


def test_a_data_key_under_another_master_key_is_refused_and_nothing_changes(
    agent_ws: AgentWorkspace, key_file: Path, tmp_path: Path
) -> None:
    paths = planted_agent(agent_ws)
    compact_agent(paths, Fixed(), options(key_file))
    other = tmp_path / "other.key"
    generate_master_key(other)
    Counting.calls = 0
    append_entry(paths.memory, "Human", "alpha turn later")
    before = paths.memory.read_bytes()
    archives = sorted(p.name for p in paths.archive_dir.iterdir())

    with pytest.raises(ArchiveKeyError, match="wrapped under master key id"):
        compact_agent(paths, Counting(), options(other))
    assert Counting.calls == 0
    assert paths.memory.read_bytes() == before
    assert sorted(p.name for p in paths.archive_dir.iterdir()) == archives


def test_a_data_key_nested_too_deeply_is_damaged_and_nothing_changes(
    agent_ws: AgentWorkspace, key_file: Path
) -> None:
    # json's decoder recurses per nesting level: a data key of "[" raised
    # RecursionError (compact-now printed a traceback).
    paths = planted_agent(agent_ws)
    compact_agent(paths, Fixed(), options(key_file))
    (paths.dir / ".memd" / DATA_KEY_NAME).write_bytes(b"[" * 200_000)
    Counting.calls = 0
    append_entry(paths.memory, "Human", "alpha turn later")
    before = paths.memory.read_bytes()
    with pytest.raises(ArchiveKeyError, match="^agent 'alpha': data key .* is damaged$"):
        compact_agent(paths, Counting(), options(key_file))
    assert Counting.calls == 0
    assert paths.memory.read_bytes() == before


# -- shredding and rotation -----------------------------------------------------------


def test_destroying_the_data_key_shreds_every_archive(
    agent_ws: AgentWorkspace, key_file: Path, tmp_path: Path
) -> None:
    paths = planted_agent(agent_ws)
    first = compact_agent(paths, Fixed(), options(key_file)).archive
    append_entry(paths.memory, "Human", "alpha turn two")
    second = compact_agent(paths, Fixed(), options(key_file)).archive
    copies = {p.name: p.read_bytes() for p in (first, second)}
    master = read_master_key(key_file)
    old_key = data_key_of(paths, master)

    with AgentDir.open(paths, create_private=False) as pinned:
        assert destroy_data_key(pinned.private_fd) is True
        assert destroy_data_key(pinned.private_fd) is False
    assert not (paths.private_dir / DATA_KEY_NAME).exists()
    with pytest.raises(ArchiveKeyError, match="no data key"):
        read_archive(paths, first.name, master)
    # A new key made later (the agent comes back) opens none of the old copies.
    with AgentDir.open(paths) as pinned:
        fresh = agent_data_key(pinned, master, create=True)
    assert fresh is not None and fresh != old_key
    for name, blob in copies.items():
        with pytest.raises(ArchiveKeyError, match="encrypted with data key"):
            open_archive(fresh, name, blob)


def test_rekey_keeps_archives_readable_with_the_new_key_only(
    ws: AgentWorkspace, key_file: Path, tmp_path: Path
) -> None:
    alpha, beta = planted_agent(ws, "alpha"), planted_agent(ws, "beta")
    ws.create_agent("gamma", entries=2)  # never compacted: no key, nothing to do
    archives = {
        paths: compact_agent(paths, Fixed(), options(key_file)).archive.name
        for paths in (alpha, beta)
    }
    old = read_master_key(key_file)
    new_path = tmp_path / "new.key"
    new = generate_master_key(new_path)

    with AgentDir.open(alpha) as pinned:
        assert rewrap_agent_key(pinned, old, new) == "rewrapped"
        # Re-runnable: a crash after this agent and a second run skip it.
        assert rewrap_agent_key(pinned, old, new) == "already"
    with AgentDir.open(beta) as pinned:
        assert rewrap_agent_key(pinned, old, new) == "rewrapped"

    for paths, name in archives.items():
        assert PLANTED.encode() in read_archive(paths, name, new)
        with pytest.raises(ArchiveKeyError, match="wrapped under master key id"):
            read_archive(paths, name, old)
    # New archives go on under the new key.
    append_entry(alpha.memory, "Human", "alpha turn after rekey")
    archive = compact_agent(alpha, Fixed(), options(new_path)).archive
    assert b"alpha turn after rekey" in read_archive(alpha, archive.name, new)


# -- crash safety -----------------------------------------------------------------------


def _plaintext_outside_memory(paths: AgentPaths) -> list[str]:
    """Files under archive/ and .memd/ that hold the planted text (MEMORY.md and its
    drain link, the same inode, are the live file and hold it by design)."""
    found = []
    live = paths.memory.stat().st_ino if paths.memory.exists() else None
    for folder in (paths.archive_dir, paths.private_dir):
        if not folder.exists():
            continue
        for path in folder.iterdir():
            if path.stat().st_ino == live or path.name == "drain.md":
                continue
            if b"kalomiren" in path.read_bytes():
                found.append(path.name)
    return found


@pytest.mark.parametrize("crash_at", [c for c in CHECKPOINTS if c != "locked"])
def test_crash_at_every_step_with_encryption_recovers(
    agent_ws: AgentWorkspace, key_file: Path, crash_at: str
) -> None:
    paths = planted_agent(agent_ws)
    expected = {e.text for e in raw_entries(paths.memory.read_bytes())}
    result = subprocess.run(
        [
            sys.executable,
            str(CHILD),
            str(agent_ws.root),
            "alpha",
            "--crash-at",
            crash_at,
            "--key-file",
            str(key_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 137, result.stderr
    # At the instant of the crash, no plaintext of the archive sits in a temp or archive.
    assert _plaintext_outside_memory(paths) == []
    recover_agent(paths)
    seen = entry_contents_everywhere(paths, key_file)
    assert {t for t in seen if t in expected} == expected
    assert all(seen[t] == 1 for t in expected)
    committed = crash_at in CHECKPOINTS[CHECKPOINTS.index("replaced") :]
    names = [p.name for p in archives_of(paths)]
    assert len(names) == (1 if committed else 0)
    assert all(name.endswith(".md.enc") for name in names)
    assert parse(paths.memory.read_bytes()).boundary == paths.memory.stat().st_size
    # A later compaction works normally after recovery, under the same data key.
    append_entry(paths.memory, "Human", "alpha turn after recovery")
    compact_agent(paths, Fixed(), options(key_file))
    seen = entry_contents_everywhere(paths, key_file)
    assert all(seen[t] == 1 for t in expected | {"alpha turn after recovery"})
    assert _plaintext_outside_memory(paths) == []


def test_recovery_after_an_external_replace_seals_the_old_file_once(
    agent_ws: AgentWorkspace, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MEMORY.md replaced while memd was down: the old inode becomes an encrypted
    archive (never a plain one), even when that recovery itself is interrupted."""
    import memd.compaction as compaction

    paths = planted_agent(agent_ws)
    expected = {e.text for e in raw_entries(paths.memory.read_bytes())}
    result = subprocess.run(
        [
            sys.executable,
            str(CHILD),
            str(agent_ws.root),
            "alpha",
            "--crash-at",
            "journal-swapping",
            "--key-file",
            str(key_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 137, result.stderr
    os.rename(paths.memory, paths.dir / "MEMORY.old")
    paths.memory.write_text("# fresh\n")
    os.unlink(paths.dir / "MEMORY.old")
    # Keep the job's own archive inode allocated, so the sealed archive recovery
    # makes cannot reuse its number (and be removed by it by chance).
    for index, archive in enumerate(paths.archive_dir.iterdir()):
        os.link(archive, paths.dir.parent.parent / f"pinned-inode-{index}")

    real_finish = compaction._finish

    def crash_once(*args: object) -> None:
        monkeypatch.setattr(compaction, "_finish", real_finish)
        raise OSError("power cut after the archive was linked")

    monkeypatch.setattr(compaction, "_finish", crash_once)
    with pytest.raises(OSError, match="power cut"):
        recover_agent(paths, key_file=key_file)
    assert "kept the old file" in (recover_agent(paths, key_file=key_file) or "")

    names = [p.name for p in archives_of(paths)]
    assert len(names) == 1 and names[0].endswith(".md.enc"), names
    seen = entry_contents_everywhere(paths, key_file)
    assert all(seen[text] == 1 for text in expected), seen
    assert _plaintext_outside_memory(paths) == []


# -- the daemon, end to end ------------------------------------------------------------


def test_the_daemon_seals_archives_and_keeps_no_index_of_them(
    ws: AgentWorkspace, key_file: Path, tmp_path: Path
) -> None:
    from support.daemon_proc import DaemonProcess

    from memd.recall.index import recall_db_path

    paths = ws.create_agent("alpha", entries=1)
    config = tmp_path / "memd.toml"
    config.write_text(
        "[trigger]\ncontext_length = 1000\nthreshold = 0.5\ndebounce_ms = 40\nmax_wait_ms = 200\n"
        "[watch]\nreconcile_s = 0.5\n[compaction]\ndrain_quiet_s = 0.05\n"
        "[daemon]\nstate_flush_s = 0.2\nretry_base_s = 0.2\n[summarizer]\nmax_tokens = 120\n"
        f'[privacy]\nencrypt_archives = true\nkey_file = "{key_file}"\n'
    )
    state = tmp_path / "state"
    append_entry(paths.memory, "Human", PLANTED)  # live, before any archive exists
    index = recall_db_path(state, ws.root)

    def index_holds_the_secret() -> bool:
        files = [Path(f"{index}{s}") for s in ("", "-wal", "-shm")]
        return any(b"kalomiren" in path.read_bytes() for path in files if path.exists())

    with DaemonProcess(ws.root, state, config=config) as daemon:
        daemon.wait_ready()
        assert key_file.name in daemon.wait_for("archives encrypted at rest")["detail"]
        daemon.wait_for("recall index ready", timeout=60)
        assert not index_holds_the_secret()  # the live file was not indexed either
        for n in range(20):
            append_entry(paths.memory, "AI", f"alpha turn {n}: " + "word " * 20)
        compacted = daemon.wait_for("compacted", lambda line: line.get("agent") == "alpha", 60)
    archive = Path(compacted["archive"])
    assert archive.name.endswith(".md.enc")
    assert b"kalomiren" not in archive.read_bytes()
    assert PLANTED.encode() in read_archive(paths, archive.name, read_master_key(key_file))
    assert not index_holds_the_secret()


def test_the_daemon_says_at_start_when_the_key_is_unusable(
    ws: AgentWorkspace, tmp_path: Path
) -> None:
    from support.daemon_proc import DaemonProcess

    ws.create_agent("alpha", entries=1)
    missing = tmp_path / "gone.key"
    config = tmp_path / "memd.toml"
    config.write_text(f'[privacy]\nencrypt_archives = true\nkey_file = "{missing}"\n')
    with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
        daemon.wait_ready()
        line = daemon.wait_for("archive key")
        assert line["level"] == "error" and "does not exist" in line["detail"]


def test_a_key_file_others_could_swap_is_a_problem_naming_the_file(tmp_path: Path) -> None:
    """Writable beyond its owner, owned by another user, or a symlink out of its folder:
    whoever controls the file can put in a key they hold (doctor and the daemon say so)."""
    key = tmp_path / "etc" / "archive.key"
    key.parent.mkdir()
    generate_master_key(key)
    me = os.geteuid()
    assert key_file_problem(key, euid=me) is None

    key.chmod(0o620)  # group-writable, not readable
    problem = key_file_problem(key, euid=me)
    assert problem is not None and f"key file {key} has mode 0620" in problem[0]
    assert problem[1] == f"chmod 600 {key}"
    key.chmod(0o600)

    # Owned by another user than memd's (root may own it).
    other = me + 4242
    if me == 0:  # memd runs as root: someone else's file
        os.chown(key, other, -1)
        owner, memd_uid = other, 0
    else:  # our file, memd running as another user
        owner, memd_uid = me, other
    assert key_file_problem(key, euid=memd_uid) == (
        f"key file {key} is owned by uid {owner}, not by memd's user (uid {memd_uid})",
        f"chown {memd_uid} {key} (memd's user), or root",
    )
    if me == 0:
        os.chown(key, 0, -1)
    assert key_file_problem(key, euid=me) is None

    # A symlink into another folder: the link's folder no longer says where the key is.
    elsewhere = tmp_path / "scratch" / "archive.key"
    elsewhere.parent.mkdir()
    key.rename(elsewhere)
    key.symlink_to(elsewhere)
    problem = key_file_problem(key, euid=me)
    assert problem is not None
    assert problem[0] == f"key file {key} is a symlink to {elsewhere}, outside its folder"
    assert str(elsewhere) in problem[1]
    assert read_master_key(key).key_id  # still readable: a problem is said, not refused

    # A link inside the folder is how secret mounts look (key -> ..data/key): fine.
    key.unlink()
    data = key.parent / "..data"
    data.mkdir()
    elsewhere.rename(data / "archive.key")
    key.symlink_to(Path("..data") / "archive.key")
    assert key_file_problem(key, euid=me) is None
