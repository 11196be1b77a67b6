from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import run
from support.memfiles import AgentWorkspace, append_entry

from memd.state import AgentRecord, FileKey, LedgerEntry, StateStore
from memd.tokenizer import TokenCounter

STATUS_KEYS = {
    "agent",
    "tokens",
    "threshold_tokens",
    "percent_used",
    "archives",
    "last_compaction_at",
    "last_error",
    "state",
    "source",
    "daemon_pid",
    "window_source",
    "reserved_tokens",
    "encrypted_archives",
    "recall",
    "last_compaction_fallback",
}


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    workspace = AgentWorkspace(tmp_path / "ws")
    workspace.create_agent("alpha", entries=6)
    workspace.create_agent("beta", entries=2)
    return workspace


def status_json(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, *extra: str
) -> object:
    code, out, err = run(
        capsys, "status", "-w", str(ws.root), "--state-dir", str(state_dir), "--json", *extra
    )
    assert code == 0, err
    return json.loads(out)


def exact(path: Path) -> int:
    return TokenCounter("cl100k_base").count_bytes(path.read_bytes())


def test_counts_files_when_no_daemon(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    (ws.root / "agents" / "alpha" / "archive").mkdir()
    for name in ("history_2026-01-01_10-00-00.md", "history_2026-01-01_10-00-00_1.md"):
        (ws.root / "agents" / "alpha" / "archive" / name).write_text("old")
    rows = status_json(capsys, ws, state_dir)
    assert isinstance(rows, list) and [r["agent"] for r in rows] == ["alpha", "beta"]
    alpha, beta = rows
    assert set(alpha) == STATUS_KEYS
    assert alpha["tokens"] == exact(ws.paths("alpha").memory) > 100
    assert beta["tokens"] == exact(ws.paths("beta").memory)
    assert alpha["threshold_tokens"] == 180_000  # 0.9 × 200k defaults
    assert alpha["percent_used"] == round(100 * alpha["tokens"] / 180_000, 1)
    assert (alpha["archives"], beta["archives"]) == (2, 0)
    assert alpha["source"] == "files" and alpha["daemon_pid"] is None
    assert alpha["state"] == "offline"
    # last compaction falls back to the newest archive's mtime
    assert alpha["last_compaction_at"] is not None and beta["last_compaction_at"] is None


def test_single_agent_object_and_table(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    one = status_json(capsys, ws, state_dir, "beta")
    assert isinstance(one, dict) and one["agent"] == "beta"
    code, out, _ = run(capsys, "status", "-w", str(ws.root), "--state-dir", str(state_dir))
    assert code == 0
    assert "alpha" in out and "beta" in out and "180,000" in out
    assert "no daemon running" in out


def test_policy_overrides(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "memd.toml"
    config.write_text(
        '[trigger]\ncontext_length = 10000\n\n[agents."be*"]\nthreshold = 0.5\n'
        "context_compression = false\n"
    )
    rows = status_json(capsys, ws, state_dir, "-c", str(config))
    assert isinstance(rows, list)
    by_name = {r["agent"]: r for r in rows}
    assert by_name["alpha"]["threshold_tokens"] == 9000
    assert by_name["beta"]["threshold_tokens"] == 5000
    assert by_name["beta"]["state"] == "disabled"


def test_counts_are_cached_by_file_version(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    status_json(capsys, ws, state_dir)
    memory = ws.paths("alpha").memory
    key = FileKey.of(memory.stat(), "cl100k_base")
    with StateStore.open(state_dir, ws.root) as store:
        assert store.cached_count("alpha", key) == exact(memory)
        # Plant a wrong count for the current version: status must trust the cache...
        store.save_counts([("alpha", key, 424242)])
    rows = status_json(capsys, ws, state_dir, "alpha")
    assert isinstance(rows, dict) and rows["tokens"] == 424242
    # ...and drop it as soon as the file changes.
    append_entry(memory, "Human", "one more turn")
    rows = status_json(capsys, ws, state_dir, "alpha")
    assert isinstance(rows, dict) and rows["tokens"] == exact(memory)


def test_last_compaction_and_error_from_ledger(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    with StateStore.open(state_dir, ws.root) as store:
        store.record_compaction(
            LedgerEntry(
                "alpha", 1_700_000_000.0, 2.0, "a.md", 9, 1, "builtin", None, None, "daemon"
            )
        )
        store.record_compaction(
            LedgerEntry(
                "alpha",
                1_700_000_100.0,
                1.0,
                None,
                9,
                None,
                "x",
                None,
                "LLM timeout",
                "compact-now",
            )
        )
    row = status_json(capsys, ws, state_dir, "alpha")
    assert isinstance(row, dict)
    assert row["last_compaction_at"] == "2023-11-14T22:13:22+00:00"  # started + duration
    assert row["last_error"] == "LLM timeout"


def write_daemon_state(state_dir: Path, ws: AgentWorkspace, pid: int, ts: float) -> None:
    with StateStore.open(state_dir, ws.root) as store:
        store.write_heartbeat(pid=pid, started_at=ts - 60, healthy=True, detail="", agents=2, ts=ts)
        store.upsert_agents(
            [
                AgentRecord(
                    "alpha",
                    1,
                    2,
                    3,
                    3,
                    3,
                    tokens=777,
                    threshold_tokens=1000,
                    updated_at=ts,
                    state="breaker_open",
                    last_error="summarizer: 500",
                    last_compaction_at=ts - 30,
                    consecutive_failures=5,
                )
            ]
        )


def test_live_figures_from_daemon(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    write_daemon_state(state_dir, ws, os.getpid(), time.time())
    rows = status_json(capsys, ws, state_dir)
    assert isinstance(rows, list)
    alpha, beta = rows
    assert (alpha["tokens"], alpha["threshold_tokens"], alpha["percent_used"]) == (777, 1000, 77.7)
    assert (alpha["state"], alpha["last_error"]) == ("breaker_open", "summarizer: 500")
    assert alpha["source"] == "daemon" and alpha["daemon_pid"] == os.getpid()
    # An agent the daemon has not flushed yet is counted from its file.
    assert beta["source"] == "files" and beta["tokens"] == exact(ws.paths("beta").memory)
    code, out, _ = run(capsys, "status", "-w", str(ws.root), "--state-dir", str(state_dir))
    assert code == 0 and f"live from daemon pid {os.getpid()}" in out


def test_stale_or_dead_daemon_is_ignored(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    write_daemon_state(state_dir, ws, os.getpid(), time.time() - 3600)
    row = status_json(capsys, ws, state_dir, "alpha")
    assert isinstance(row, dict) and row["source"] == "files"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_daemon_state(state_dir, ws, dead.pid, time.time())
    row = status_json(capsys, ws, state_dir, "alpha")
    assert isinstance(row, dict) and row["source"] == "files"
    assert row["tokens"] == exact(ws.paths("alpha").memory)


def test_bad_agent_in_listing_does_not_hide_others(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.md"
    outside.write_text("secret")
    evil = ws.root / "agents" / "evil"
    evil.mkdir()
    (evil / "MEMORY.md").symlink_to(outside)
    rows = status_json(capsys, ws, state_dir)
    assert isinstance(rows, list)
    by_name = {r["agent"]: r for r in rows}
    assert by_name["evil"]["state"] == "error"
    assert "resolves outside the agent's own folder" in by_name["evil"]["last_error"]
    assert by_name["alpha"]["tokens"] > 0
    code, _, err = run(capsys, "status", "evil", "-w", str(ws.root), "--state-dir", str(state_dir))
    assert code == 2 and "resolves outside the agent's own folder" in err


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["status", "nobody"], 3, "unknown agent 'nobody'"),
        (["status", "../etc"], 2, "invalid agent name"),
        (["status", "-w", "/nonexistent/ws"], 2, "does not exist"),
    ],
)
def test_errors_are_one_line_end_to_end(
    ws: AgentWorkspace, state_dir: Path, args: list[str], code: int, message: str
) -> None:
    if "-w" not in args:
        args = [*args, "-w", str(ws.root)]
    result = subprocess.run(
        [sys.executable, "-m", "memd", *args, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == code
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr


def test_status_does_not_import_litellm(ws: AgentWorkspace, state_dir: Path) -> None:
    script = (
        "import sys\n"
        "from memd.cli.app import main\n"
        "try:\n"
        f"    main(['status', '--json', '-w', {str(ws.root)!r}, '--state-dir', {str(state_dir)!r}])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print('LITELLM', 'litellm' in sys.modules, file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "LITELLM False" in result.stderr


def test_status_shows_where_each_agents_window_came_from(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    descriptor = {
        "format": "memd-agent",
        "version": 1,
        "agent": "alpha",
        "model": "gpt-4o-mini",
        "context_length": 10000,
        "reserved": {"unit": "text", "text": "You are alpha. " * 20},
    }
    (ws.root / "agents" / "alpha" / "memd-agent.json").write_text(json.dumps(descriptor))
    reserved = TokenCounter("cl100k_base").count_text("You are alpha. " * 20)
    rows = status_json(capsys, ws, state_dir)
    assert isinstance(rows, list)
    alpha, beta = rows
    assert alpha["window_source"] == "memd-agent.json"
    assert alpha["reserved_tokens"] == reserved
    assert alpha["threshold_tokens"] == 9000 - reserved
    assert beta["window_source"] == "default"
    assert beta["threshold_tokens"] == 180_000
    code, out, _ = run(capsys, "status", "-w", str(ws.root), "--state-dir", str(state_dir))
    assert code == 0 and "memd-agent.json" in out


def test_a_spending_cap_holding_compactions_back_is_a_status_line(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    from memd.state import SpendingRecord

    now = time.time()
    write_daemon_state(state_dir, ws, os.getpid(), now)
    config = tmp_path / "caps.toml"
    config.write_text("[summarizer]\nmax_calls_per_hour = 40\n")
    common = ["-w", str(ws.root), "--state-dir", str(state_dir), "-c", str(config)]
    with StateStore.open(state_dir, ws.root) as store:
        store.write_spending(SpendingRecord(12, 0.25, None, None, now))
    code, out, _ = run(capsys, "status", *common)
    flat = " ".join(out.split())
    assert code == 0 and "summarizer spending: 12 model calls in the last hour (cap 40)" in flat
    assert "held back" not in flat
    reason = "40 model calls in the last hour reached summarizer.max_calls_per_hour (40)"
    with StateStore.open(state_dir, ws.root) as store:
        store.write_spending(SpendingRecord(40, 0.25, reason, now + 600, now))
    code, out, _ = run(capsys, "status", *common)
    flat = " ".join(out.split())
    assert "compactions held back until" in flat and "summarizer.max_calls_per_hour (40)" in flat
    # Without a running daemon nothing spends: no line from a stale record.
    write_daemon_state(state_dir, ws, os.getpid(), now - 3600)
    code, out, _ = run(capsys, "status", *common)
    assert "summarizer spending" not in out
