"""The audit log file: 0600, append-only, one write per record, never interleaved."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from memd.audit import (
    AuditLog,
    audit_path,
    read_audit,
    read_audit_from,
    record_compaction,
    summarizer_is_remote,
)
from memd.compaction import CompactionOutcome
from memd.core.audit import AuditEvent
from memd.state import state_db_path


def test_log_sits_beside_the_state_db_and_is_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = AuditLog.for_workspace(state, tmp_path / "ws", "cli")
    assert log.path == audit_path(state, tmp_path / "ws")
    assert log.path.name == state_db_path(state, tmp_path / "ws").stem + ".audit.jsonl"
    old_umask = os.umask(0)
    try:
        assert log.record(AuditEvent.PRUNE, "alpha", archives=1, bytes=10, trigger="cli")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(log.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    contents = read_audit(log.path)
    (record,) = contents.records
    assert record.event == "prune" and record.agent == "alpha" and record.actor == "cli"
    assert record.pid == os.getpid() and record.uid == os.getuid()


def test_appends_never_rewrite(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "a.audit.jsonl", "daemon", clock=lambda: 1000.0)
    log.record(AuditEvent.ERASURE, "alpha", files=3)
    first = log.path.read_bytes() if log.path else b""
    log.record(AuditEvent.ERASURE, "beta", files=1)
    assert log.path is not None
    assert log.path.read_bytes().startswith(first)
    assert [r.agent for r in read_audit(log.path).records] == ["alpha", "beta"]


def test_reading_from_an_offset_takes_whole_lines_only(tmp_path: Path) -> None:
    # `memd reload` follows the log for the daemon's answer: a line still being
    # written is read next time, whole; a log shorter than the offset from its start.
    log = AuditLog(tmp_path / "a.audit.jsonl", "daemon", clock=lambda: 1000.0)
    assert log.path is not None
    assert read_audit_from(log.path, 0) == (read_audit(log.path), 0)  # none yet
    log.record(AuditEvent.CONFIG_RELOAD, ok=True, started_ns=5)
    offset = log.path.stat().st_size
    log.record(AuditEvent.CONFIG_RELOAD, ok=False, errors=1, started_ns=7)
    whole = log.path.read_bytes()
    with log.path.open("ab") as handle:
        handle.write(b'{"v":1,"ts":"2026-')  # torn: a writer mid-line
    contents, after = read_audit_from(log.path, offset)
    assert [r.fields["started_ns"] for r in contents.records] == [7]
    assert after == len(whole) and contents.unreadable == 0
    assert read_audit_from(log.path, after)[0].records == ()
    log.path.write_bytes(whole[:offset])  # replaced by a shorter one
    contents, after = read_audit_from(log.path, len(whole))
    assert [r.fields["started_ns"] for r in contents.records] == [5] and after == offset


def test_loosened_mode_is_tightened_on_append(tmp_path: Path) -> None:
    path = tmp_path / "a.audit.jsonl"
    path.write_bytes(b"")
    path.chmod(0o644)
    AuditLog(path, "cli").record(AuditEvent.CONFIG_RELOAD, ok=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_symlinked_log_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    path = tmp_path / "a.audit.jsonl"
    path.symlink_to(target)
    assert not AuditLog(path, "cli").record(AuditEvent.CONFIG_RELOAD, ok=True)
    assert target.read_bytes() == b""


def test_no_state_dir_means_no_log_but_still_validates() -> None:
    log = AuditLog(None, "daemon")
    assert not log.record(AuditEvent.PRUNE, "alpha", archives=1)
    with pytest.raises(ValueError):
        log.record(AuditEvent.PRUNE, "alpha", pattern="secret")


def test_missing_log_reads_empty(tmp_path: Path) -> None:
    assert read_audit(tmp_path / "none.audit.jsonl").records == ()


def test_keyed_hash_is_stable_keyed_and_private(tmp_path: Path) -> None:
    one = AuditLog(tmp_path / "one" / "w.audit.jsonl", "cli")
    two = AuditLog(tmp_path / "two" / "w.audit.jsonl", "cli")
    digest = one.keyed_hash("password=.*")
    assert digest == one.keyed_hash("password=.*") != one.keyed_hash("other")
    assert digest != two.keyed_hash("password=.*")  # another workspace, another key
    assert len(digest) == 16 and "password" not in digest
    assert one.path is not None
    key = one.path.with_name("w.audit.key")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert one.record(AuditEvent.ERASE_MATCH, "alpha", entries=2, pattern_hash=digest)
    assert b"password" not in one.path.read_bytes()


def _append_many(path: str, worker: int, count: int) -> None:
    log = AuditLog(Path(path), "cli")
    # Long records (≈3.5 KB each) make a torn or interleaved write likely if
    # appends were not single O_APPEND writes.
    names = [f"history_{worker}_{n:04d}_" + "x" * 40 + ".md" for n in range(60)]
    for n in range(count):
        log.record(AuditEvent.PRUNE, f"agent{worker}", archives=n, names=names)


def test_concurrent_appenders_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "w.audit.jsonl"
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_append_many, args=(str(path), w, 60)) for w in range(4)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(120)
        assert process.exitcode == 0
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    assert lines.pop() == b""
    assert len(lines) == 4 * 60
    for line in lines:
        json.loads(line)  # every line whole
    contents = read_audit(path)
    assert contents.unreadable == 0
    for worker in range(4):
        seen = [r.fields["archives"] for r in contents.for_agent(f"agent{worker}")]
        assert seen == list(range(60))  # each appender's records in its own order


@pytest.mark.parametrize(
    ("model", "api_base", "remote"),
    [
        ("builtin", "", False),
        ("provided", "", False),
        ("ollama/llama3.1", "", False),
        ("ollama/llama3.1", "http://10.0.0.5:11434", True),
        ("openai/gpt-4o-mini", "", True),
        ("openai/gpt-4o-mini", "http://127.0.0.1:8000/v1", False),
        ("openai/x", "http://localhost:8000", False),
        ("openai/x", "http://[::1]:8000", False),
        ("openai/x", "unix:///run/llm.sock", False),
        ("openai/x", "https://api.example.com/v1", True),
    ],
)
def test_remote_summarizer(model: str, api_base: str, remote: bool) -> None:
    assert summarizer_is_remote(model, api_base) is remote


def test_compaction_record_has_figures_not_content(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "w.audit.jsonl", "daemon")
    outcome = CompactionOutcome(
        archive=tmp_path / "history_2026-12-02_04-00-00.md",
        tokens_before=9000,
        tokens_after=800,
        model="openai/gpt-4o-mini",
        tokens_produced=700,
        cost_usd=None,
        duration_s=1.0,
        llm_duration_s=0.5,
        redacted=3,
        reply_redacted=1,
    )
    assert record_compaction(log, "alpha", outcome, trigger="threshold", api_base="")
    assert log.path is not None
    (record,) = read_audit(log.path).records
    assert record.fields == {
        "trigger": "threshold",
        "model": "openai/gpt-4o-mini",
        "remote": True,
        "redactions": 3,
        "reply_redactions": 1,
        "tokens_before": 9000,
        "tokens_after": 800,
        "archive": "history_2026-12-02_04-00-00.md",
        "calls": 1,
        "partial": False,
    }


def test_local_hosts_count_as_local() -> None:
    assert summarizer_is_remote("openai/x", "http://10.1.2.3:8000")
    assert not summarizer_is_remote("openai/x", "http://10.1.2.3:8000", ("10.0.0.0/8",))


def test_a_log_moved_aside_is_followed_by_a_new_one(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "w.audit.jsonl", "daemon")
    log.record(AuditEvent.PRUNE, "alpha", archives=1)
    assert log.path is not None
    log.path.rename(tmp_path / "w.audit.jsonl.1")
    log.record(AuditEvent.PRUNE, "alpha", archives=2)
    assert [r.fields["archives"] for r in read_audit(log.path).records] == [2]
    assert stat.S_IMODE(log.path.stat().st_mode) == 0o600


def test_audit_with_a_state_dir_that_is_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    """``memd audit`` against a state dir it cannot read (a file here; a
    non-root operator and memd's 0700 state dir): one line, no traceback, with
    and without --json (review 14e, F7)."""
    agent = tmp_path / "ws" / "agents" / "alpha"
    agent.mkdir(parents=True)
    (agent / "MEMORY.md").write_text("### user — 2026-01-01T00:00:01\n\nhello\n\n---\n\n")
    not_a_dir = tmp_path / "state-file"
    not_a_dir.write_text("x")
    for extra in ([], ["--json"]):
        args = ["audit", "--workspace", str(tmp_path / "ws"), "--state-dir", str(not_a_dir)]
        proc = subprocess.run(
            [sys.executable, "-m", "memd", *args, *extra],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode != 0
        errors = [line for line in proc.stderr.splitlines() if line.startswith("memd: error:")]
        assert len(errors) == 1, proc.stderr
        if extra:  # --json: the same reason as a JSON object on stdout (README "Commands")
            answer = json.loads(proc.stdout)
            assert answer == {"error": errors[0].removeprefix("memd: error: "), "exit_code": 2}
            assert proc.returncode == 2
        else:
            assert proc.stdout == ""
