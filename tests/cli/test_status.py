from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import run
from support.daemon_proc import DaemonProcess
from support.memfiles import AgentWorkspace, append_entry
from support.other_uid import reachable_tmp
from support.systemd_layout import MEMD

from memd.state import AgentRecord, FileKey, LedgerEntry, StateStore
from memd.tokenizer import TokenCounter

# The keys of schema 1 (never removed or renamed) ...
STATUS_KEYS_V1 = {
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
}
# ... and the ones added since (README: "status --json").
STATUS_KEYS = STATUS_KEYS_V1 | {
    "encrypted_archives",
    "recall",
    "last_compaction_fallback",
    "archive_bytes",
    "estimated",
    "state_db",
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


# ------------------------------------------------------------ fleet (issue 13)


def fleet_record(name: str, tokens: int, **changes: object) -> AgentRecord:
    fields: dict[str, object] = dict(
        agent=name,
        dev=1,
        ino=2,
        size=3,
        safe_offset=3,
        safe_tokens=3,
        tokens=tokens,
        threshold_tokens=1000,
        updated_at=time.time(),
        archives=1,
        archive_bytes=100,
        archive_mtime_ns=1,
        window_source="[trigger]",
    )
    fields.update(changes)
    return AgentRecord(**fields)  # type: ignore[arg-type]


FLEET = [
    fleet_record("calm", 100),
    fleet_record("full", 1500),
    fleet_record("fuller", 2500),
    fleet_record("broken", 10, state="breaker_open", last_error="summarizer: HTTP 500"),
    fleet_record("busy", 200, state="running"),
    fleet_record("guessed", 300, estimated=True),
    fleet_record("quiet", 50, archives=7, archive_bytes=7000, encrypted_archives=2),
]


def write_fleet(state_dir: Path, workspace: Path, records: list[AgentRecord]) -> None:
    now = time.time()
    with StateStore.open(state_dir, workspace) as store:
        store.upsert_agents(records)
        # "full"'s latest successful compaction used the builtin fallback.
        store.record_compaction(
            LedgerEntry(
                "full", now - 9, 1.0, "a.md", 9, 1, "builtin", None, None, "daemon", fallback=True
            )
        )
        store.write_heartbeat(os.getpid(), now - 60, True, "", len(records), now)


def test_live_fleet_is_read_from_the_state_db_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    """No agent folder exists: every figure must come from the DB (no resolve, no listing)."""
    workspace = tmp_path / "fleet"
    (workspace / "agents").mkdir(parents=True)
    write_fleet(state_dir, workspace, FLEET)
    code, out, err = run(
        capsys, "status", "-w", str(workspace), "--state-dir", str(state_dir), "--json"
    )
    assert code == 0, err
    rows = json.loads(out)
    assert [r["agent"] for r in rows] == sorted(r.agent for r in FLEET)  # --json: by name
    assert all(set(r) == STATUS_KEYS for r in rows)
    by_name = {r["agent"]: r for r in rows}
    assert by_name["quiet"]["archives"] == 7 and by_name["quiet"]["archive_bytes"] == 7000
    assert (by_name["quiet"]["encrypted_archives"], by_name["quiet"]["recall"]) == (2, "off")
    assert (by_name["calm"]["encrypted_archives"], by_name["calm"]["recall"]) == (0, "on")
    assert by_name["full"]["last_compaction_fallback"] is True
    assert by_name["calm"]["last_compaction_fallback"] is False
    assert by_name["guessed"]["estimated"] is True and by_name["calm"]["estimated"] is False
    assert by_name["fuller"]["percent_used"] == 250.0
    assert by_name["broken"]["last_error"] == "summarizer: HTTP 500"
    assert {r["source"] for r in rows} == {"daemon"}
    assert {r["daemon_pid"] for r in rows} == {os.getpid()}
    assert by_name["calm"]["window_source"] == "[trigger]"
    assert by_name["calm"]["last_compaction_at"] is None
    # one object per line: a consumer can read them as they come
    assert out.startswith("[\n{") and out.rstrip().endswith("}\n]")
    assert len(out.strip().splitlines()) == len(FLEET) + 2


def test_table_shows_attention_first_with_totals_and_paging(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    workspace = tmp_path / "fleet"
    (workspace / "agents").mkdir(parents=True)
    write_fleet(state_dir, workspace, FLEET)
    base = ["status", "-w", str(workspace), "--state-dir", str(state_dir)]

    def agents_listed(out: str) -> list[str]:
        names = {r.agent for r in FLEET}
        return [
            line.split()[0]
            for line in out.splitlines()
            if line.split()[:1][0:1] and line.split()[0] in names
        ]

    code, out, _ = run(capsys, *base, "--limit", "4")
    assert code == 0
    # failing, then over threshold (fullest first), then compacting, then estimated
    assert agents_listed(out) == ["broken", "fuller", "full", "busy"]
    assert "(builtin fallback)" in out
    assert "totals: 7 agents, 4,660 tokens, 2 over threshold, 1 failing, 1 compacting" in out
    assert "1 estimated, 13 archives (7.4 KiB)" in out
    assert "showing 4 of 7 agents, those needing attention first" in out
    assert f"live from daemon pid {os.getpid()}" in out and "(from --state-dir)" in out
    code, out, _ = run(capsys, *base, "--all", "--sort", "name")
    assert agents_listed(out) == sorted(r.agent for r in FLEET)
    assert "showing" not in out
    code, out, _ = run(capsys, *base, "--sort", "archives", "--limit", "1")
    assert agents_listed(out) == ["quiet"]
    assert "7 (2 enc)" in out and "recall off for 1 agent(s)" in out
    code, out, _ = run(capsys, *base, "--json", "--sort", "tokens", "--limit", "2")
    assert [r["agent"] for r in json.loads(out)] == ["fuller", "full"]
    code, out, err = run(capsys, *base, "--sort", "bogus")
    assert code == 2 and "bogus" in err


def test_rows_the_daemon_has_not_surveyed_yet_are_listed_here(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    """Right after an upgrade from schema 2 the archive figures are unknown (NULL)."""
    archive = ws.root / "agents" / "alpha" / "archive"
    archive.mkdir()
    (archive / "history_2026-01-01_10-00-00.md").write_text("x" * 123)
    write_fleet(
        state_dir,
        ws.root,
        [
            fleet_record("alpha", 10, archives=None, archive_bytes=None),
            fleet_record("beta", 10),
        ],
    )
    rows = status_json(capsys, ws, state_dir)
    assert isinstance(rows, list)
    assert (rows[0]["archives"], rows[0]["archive_bytes"]) == (1, 123)
    code, out, _ = run(capsys, "status", "-w", str(ws.root), "--state-dir", str(state_dir))
    assert code == 0 and "totals: 2 agents" in out


# ----------------------------------------------- the daemon's pointer (issue 8 D1)


@pytest.fixture
def elsewhere_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A HOME whose default state dir is not the daemon's (the usual cause of "offline")."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    return home


def test_status_and_health_find_the_daemon_through_its_pointer(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, elsewhere_home: Path
) -> None:
    from memd.pointer import write_pointer

    write_daemon_state(state_dir, ws, os.getpid(), time.time())
    base = ["-w", str(ws.root)]
    # Without the pointer: the default state dir, no daemon there.
    code, out, _ = run(capsys, "status", *base)
    assert code == 0 and "no daemon running" in out and "(from the default)" in out
    write_pointer(ws.root, state_dir, config=None)
    code, out, _ = run(capsys, "status", *base)
    assert code == 0 and f"live from daemon pid {os.getpid()}" in out
    assert f"(from the daemon's pointer {ws.root / '.memd-state'})" in out
    row = json.loads(run(capsys, "status", "alpha", "--json", *base)[1])
    assert row["source"] == "daemon" and row["state_db"].startswith(str(state_dir))
    code, out, _ = run(capsys, "health", *base)
    assert code == 0 and "healthy" in out and "the daemon's pointer" in out
    payload = json.loads(run(capsys, "health", "--json", *base)[1])
    assert payload["state_found_by"].startswith("the daemon's pointer")
    # --state-dir still wins (and says so).
    code, out, _ = run(capsys, "status", *base, "--state-dir", str(elsewhere_home / "s"))
    assert "no daemon running" in out and "(from --state-dir)" in out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the daemon as another uid")
def test_root_health_and_status_beside_a_daemon_of_memds_user_find_it(
    capsys: pytest.CaptureFixture[str], elsewhere_home: Path
) -> None:
    """`sudo memd health` / `sudo memd status` beside the service, as a root
    monitoring check runs them: the pointer is memd's, in memd's workspace that
    no one else writes. They said "no daemon has run" (exit 1) and "no daemon
    running", and made a second, empty state DB in root's home (review r7ops F4)."""
    with reachable_tmp("memd-status-root-") as base:
        workspace = AgentWorkspace(base / "srv-agents")
        workspace.create_agent("alice", entries=2)
        state = base / "var-lib-memd"
        state.mkdir(mode=0o700)
        for root, dirs, files in os.walk(base):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), MEMD, MEMD)
        with DaemonProcess(workspace.root, state, user=MEMD) as daemon:
            daemon.wait_ready(timeout=60)
            health = run(capsys, "health", "--workspace", str(workspace.root))
            status = run(capsys, "status", "--workspace", str(workspace.root))
            daemon.stop()
    assert health[0] == 0 and "healthy" in health[1], health
    assert "the daemon's pointer" in health[1]
    assert f"live from daemon pid {daemon.pid}" in status[1], status
    assert not (elsewhere_home / ".local").exists()  # no state DB of root's own


def test_an_untrusted_pointer_is_ignored_with_a_warning(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, elsewhere_home: Path
) -> None:
    from memd.pointer import write_pointer

    write_daemon_state(state_dir, ws, os.getpid(), time.time())
    write_pointer(ws.root, state_dir, config=None).chmod(0o666)
    code, out, err = run(capsys, "status", "-w", str(ws.root))
    assert code == 0 and "no daemon running" in out
    assert "memd: warning: ignoring" in err and "writable by group or others" in err


def test_the_daemons_config_and_settings_come_with_the_pointer(
    capsys: pytest.CaptureFixture[str],
    ws: AgentWorkspace,
    state_dir: Path,
    elsewhere_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memd.pointer import write_pointer

    config = tmp_path / "daemon.toml"
    config.write_text("[trigger]\ncontext_length = 10000\n")
    write_pointer(ws.root, state_dir, config=config)
    row = json.loads(run(capsys, "status", "alpha", "--json", "-w", str(ws.root))[1])
    assert row["threshold_tokens"] == 9000  # the daemon's config, not the defaults
    write_pointer(ws.root, state_dir, config=config, settings={"trigger": {"context_length": 4000}})
    row = json.loads(run(capsys, "status", "alpha", "--json", "-w", str(ws.root))[1])
    assert row["threshold_tokens"] == 3600  # settings over the config, as the daemon ran
    # A MEMD_* variable set for this command wins over the daemon's setting (the
    # daemon's environment's, review r7ops F1), and over its config file.
    monkeypatch.setenv("MEMD_TRIGGER_CONTEXT_LENGTH", "5000")
    row = json.loads(run(capsys, "status", "alpha", "--json", "-w", str(ws.root))[1])
    assert row["threshold_tokens"] == 4500
    monkeypatch.delenv("MEMD_TRIGGER_CONTEXT_LENGTH")
    # A config named here wins over the daemon's.
    mine = tmp_path / "mine.toml"
    mine.write_text("[trigger]\ncontext_length = 20000\n")
    args = ["status", "alpha", "--json", "-w", str(ws.root), "-c", str(mine)]
    row = json.loads(run(capsys, *args)[1])
    assert row["threshold_tokens"] == 18000


def test_without_a_daemon_a_giant_run_is_counted_by_estimate_and_says_so(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "memd.toml"
    config.write_text("[tokenizer]\nmax_piece_bytes = 65536\n")
    memory = ws.paths("beta").memory
    append_entry(memory, "Human", "z" * 300_000)  # one pre-token of 300 KB, no cut inside
    for _ in range(2):  # the estimate is not cached as if it were exact
        rows = status_json(capsys, ws, state_dir, "-c", str(config))
        assert isinstance(rows, list)
        alpha, beta = rows
        assert beta["estimated"] is True and beta["tokens"] >= exact(memory)
        assert alpha["estimated"] is False and alpha["tokens"] == exact(ws.paths("alpha").memory)
    with StateStore.open(state_dir, ws.root) as store:
        assert store.cached_count("beta", FileKey.of(memory.stat(), "cl100k_base")) is None


@pytest.mark.parametrize("as_json", [False, True])
def test_status_on_a_newer_memds_state_db_refuses_in_one_line_and_keeps_it(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, as_json: bool
) -> None:
    # An older memd's `status` beside a newer daemon (review 13b, R6): it moved the
    # DB aside as corrupt and the daemon carried on with an empty one.
    import sqlite3

    from memd.state import SCHEMA_VERSION, corrupt_copies, state_db_path

    with StateStore.open(state_dir, ws.root) as store:
        store.record_compaction(_ledger_entry("alpha"))
        path = store.path
        assert path is not None
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 2,))
    conn.commit()
    conn.close()
    before = path.read_bytes()
    args = ["status", "-w", str(ws.root), "--state-dir", str(state_dir)]
    code, out, err = run(capsys, *args, *(["--json"] if as_json else []))
    reason = (
        f"state DB {path} is schema {SCHEMA_VERSION + 2}, written by a newer memd;"
        f" this memd reads up to {SCHEMA_VERSION}"
    )
    assert code != 0 and err.splitlines() == [f"memd: error: {reason}"]
    # --json: the same reason on stdout, for a script that parses it.
    assert (json.loads(out) == {"error": reason, "exit_code": code}) if as_json else out == ""
    assert path.read_bytes() == before and corrupt_copies(path) == []
    assert path == state_db_path(state_dir, ws.root)


def _ledger_entry(agent: str) -> LedgerEntry:
    return LedgerEntry(agent, 1.0, 0.5, None, 100, 50, "builtin", None, None, "daemon")


def test_a_wrongly_typed_row_in_the_daemons_db_is_a_note_not_a_traceback(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    # SQLite keeps any type in any column (a damaged or hand-edited DB): the
    # table's `{tokens:,}` raised ValueError, a traceback out of `memd status`.
    import sqlite3

    now = time.time()
    write_daemon_state(state_dir, ws, os.getpid(), now)
    with StateStore.open(state_dir, ws.root) as store:
        store.upsert_agents([AgentRecord("beta", 1, 3, 3, 3, 3, 5, 1000, now)])
        path = store.path
        assert path is not None
    conn = sqlite3.connect(path)
    conn.execute("UPDATE agents SET tokens = 'abc' WHERE agent = 'beta'")
    conn.commit()
    conn.close()
    code, out, err = run(capsys, "status", "-w", str(ws.root), "--state-dir", str(state_dir))
    assert code == 0 and err == "", err
    assert f"live from daemon pid {os.getpid()}" in out
    assert "agent beta: not shown, its state DB row holds 'abc' in tokens, of the wrong type" in out
    assert "alpha" in out
    # Nor counted over its threshold in the totals (SQLite orders TEXT after numbers).
    assert "0 over threshold" in out, out


def _memd_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    return subprocess.run(
        [sys.executable, "-m", "memd", *args],
        env={**env, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_status_beside_a_daemon_shows_a_compact_now_compaction(tmp_path: Path) -> None:
    """review r8docs F2: beside a running daemon `memd status` reads the daemon's row,
    which knew only the daemon's own compactions: an agent `memd compact-now`
    compacted showed 'last compaction: never' while `memd history` had it. The
    ledger write sets the row's time, and the daemon's flushes never take it back."""
    ws = AgentWorkspace(tmp_path / "ws")
    memory = ws.create_agent("alpha").memory
    for index in range(40):
        words = " ".join(f"w{index}x{k}" for k in range(40))
        append_entry(memory, "Human" if index % 2 == 0 else "AI", f"Turn {index}. {words}")
    config = tmp_path / "memd.toml"
    config.write_text("[summarizer]\nkeep_recent_tokens = 0\n[daemon]\nstate_flush_s = 0.5\n")
    state = tmp_path / "state"
    args = ("-w", str(ws.root), "-c", str(config), "--state-dir", str(state))
    with DaemonProcess(ws.root, state, config=config) as daemon:
        daemon.wait_ready()
        done = _memd_cli("compact-now", "alpha", *args, home=tmp_path)
        assert done.returncode == 0 and "compacted" in done.stdout, done.stderr
        row: dict[str, object] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the daemon's flushes of the new file come and go
            shown = _memd_cli("status", "alpha", "--json", *args, home=tmp_path)
            row = json.loads(shown.stdout)
            if row["source"] == "daemon" and row["last_compaction_at"] is not None:
                break
            time.sleep(0.3)
        assert row["source"] == "daemon" and row["last_compaction_at"] is not None, row
        # A turn after the compaction: the daemon counts it and flushes its own row,
        # which knows no compaction of its own; the row must keep compact-now's.
        append_entry(memory, "Human", "one more turn after the compaction")
        expected = TokenCounter("cl100k_base").count_text(memory.read_text(encoding="utf-8"))
        again: dict[str, object] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and again.get("tokens") != expected:
            time.sleep(0.3)
            shown = _memd_cli("status", "alpha", "--json", *args, home=tmp_path)
            again = json.loads(shown.stdout)
        assert again["tokens"] == expected, again
        assert again["last_compaction_at"] == row["last_compaction_at"], again
        assert daemon.stop() == 0
