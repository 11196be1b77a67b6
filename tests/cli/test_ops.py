from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import run
from support.memfiles import AgentWorkspace

from memd.state import LedgerEntry, StateStore


@pytest.fixture
def ws(tmp_path: Path) -> AgentWorkspace:
    workspace = AgentWorkspace(tmp_path / "ws")
    workspace.create_agent("alpha", entries=2)
    return workspace


def common(ws: AgentWorkspace, state_dir: Path) -> list[str]:
    return ["-w", str(ws.root), "--state-dir", str(state_dir)]


def beat(
    ws: AgentWorkspace, state_dir: Path, *, pid: int, age: float, healthy: bool = True
) -> None:
    now = time.time()
    with StateStore.open(state_dir, ws.root) as store:
        store.write_heartbeat(
            pid=pid,
            started_at=now - 100,
            healthy=healthy,
            detail="" if healthy else "observer thread died",
            agents=1,
            ts=now - age,
        )


# ---------------------------------------------------------------------- health


def test_health_without_daemon(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    code, out, err = run(capsys, "health", *common(ws, state_dir))
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "no heartbeat" in err


def test_health_and_status_on_a_mistyped_workspace_say_so_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state_dir: Path
) -> None:
    """review r8docs F6: health on a workspace that does not exist left an empty state
    DB for it, and a file named as the workspace took two lines (a pointer warning)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    before = sorted(state_dir.iterdir())
    missing = tmp_path / "no-such-ws"
    code, out, err = run(capsys, "health", "-w", str(missing), "--state-dir", str(state_dir))
    assert code == 2 and out == "" and err == f"memd: error: workspace {missing} does not exist\n"
    assert sorted(state_dir.iterdir()) == before
    afile = tmp_path / "afile"
    afile.write_text("")
    for command in ("health", "status"):
        code, out, err = run(capsys, command, "-w", str(afile), "--state-dir", str(state_dir))
        assert code == 2 and err == f"memd: error: workspace {afile} is not a directory\n", err


def test_health_fresh_heartbeat(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    beat(ws, state_dir, pid=os.getpid(), age=1)
    code, out, err = run(capsys, "health", *common(ws, state_dir))
    assert code == 0, err
    assert f"daemon pid {os.getpid()}" in out
    code, out, _ = run(capsys, "health", "--json", *common(ws, state_dir))
    payload = json.loads(out)
    assert code == 0 and payload["healthy"] is True and payload["pid"] == os.getpid()
    assert payload["reason"] is None and payload["agents"] == 1


@pytest.mark.parametrize(
    ("age", "healthy", "dead", "reason"),
    [
        (3600, True, False, "stale"),
        (1, True, True, "is not running"),
        # s10upgrade E: a SIGKILLed daemon's heartbeat is stale too; that it is gone says more.
        (3600, True, True, "is not running (gone; its last heartbeat 1h"),
        (1, False, False, "observer thread died"),
    ],
)
def test_health_failures(
    capsys: pytest.CaptureFixture[str],
    ws: AgentWorkspace,
    state_dir: Path,
    age: float,
    healthy: bool,
    dead: bool,
    reason: str,
) -> None:
    pid = os.getpid()
    if dead:
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()
        pid = child.pid
    beat(ws, state_dir, pid=pid, age=age, healthy=healthy)
    code, _, err = run(capsys, "health", *common(ws, state_dir))
    assert code == 1 and reason in err and err.count("\n") == 1, err
    assert ("stale" in err) == (reason == "stale")
    code, out, _ = run(capsys, "health", "--json", *common(ws, state_dir))
    assert code == 1 and json.loads(out)["healthy"] is False


def test_health_max_age_follows_config(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    beat(ws, state_dir, pid=os.getpid(), age=20)
    assert run(capsys, "health", *common(ws, state_dir))[0] == 1  # default 3 × 5 s
    config = tmp_path / "memd.toml"
    config.write_text("[daemon]\nstate_flush_s = 10\n")
    assert run(capsys, "health", "-c", str(config), *common(ws, state_dir))[0] == 0
    assert (
        run(capsys, "health", "--max-age", "5", "-c", str(config), *common(ws, state_dir))[0] == 1
    )


def test_health_after_a_clean_stop_says_when_and_names_its_state_db(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    from memd.state import StateStore

    beat(ws, state_dir, pid=os.getpid(), age=5)
    with StateStore.open(state_dir, ws.root) as store:
        store.clear_heartbeat(os.getpid())  # what the daemon does when it stops
        db = store.path
    code, out, err = run(capsys, "health", *common(ws, state_dir))
    assert code == 1 and err.count("\n") == 1
    assert f"daemon pid {os.getpid()} stopped at " in err and str(db) in err
    assert "no daemon has run" not in err
    code, out, _ = run(capsys, "health", "--json", *common(ws, state_dir))
    payload = json.loads(out)
    assert payload["healthy"] is False and payload["stopped_at"] is not None
    assert payload["state_db"] == str(db)
    # status does not take the stopped daemon's figures as live ones.
    code, out, _ = run(capsys, "status", "--json", *common(ws, state_dir))
    assert all(row["source"] == "files" for row in json.loads(out))


def test_health_end_to_end(ws: AgentWorkspace, state_dir: Path) -> None:
    cmd = [sys.executable, "-m", "memd", "health", *common(ws, state_dir)]
    missing = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and missing.stderr.startswith("memd: error: ")
    # A heartbeat from a live process (this test) is healthy.
    beat(ws, state_dir, pid=os.getpid(), age=0)
    fresh = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert fresh.returncode == 0, fresh.stderr


# --------------------------------------------------------------------- history


def test_history_table_and_json(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    code, out, _ = run(capsys, "history", "alpha", *common(ws, state_dir))
    assert code == 0 and "no compactions recorded" in out
    with StateStore.open(state_dir, ws.root) as store:
        store.record_compaction(
            LedgerEntry(
                "alpha",
                1_700_000_000.0,
                3.5,
                str(ws.root / "agents/alpha/archive/history_2023-11-14_22-13-20.md"),
                150_000,
                2_000,
                "openai/gpt-4o-mini",
                0.0123,
                None,
                "daemon",
            )
        )
        store.record_compaction(
            LedgerEntry(
                "alpha", 1_700_000_500.0, 120.0, None, 160_000, None, "openai/gpt-4o-mini",
                None, "summarizer timed out after 120s", "compact-now",
            )
        )  # fmt: skip
    code, out, _ = run(capsys, "history", "alpha", *common(ws, state_dir))
    assert code == 0
    assert "history_2023-11-14_22-13-20.md" in out and "150,000 → 2,000" in out
    assert "summarizer timed out" in out and "$0.0123" in out
    assert out.index("timed out") < out.index("history_2023")  # newest first
    code, out, _ = run(capsys, "history", "alpha", "--json", *common(ws, state_dir))
    entries = json.loads(out)
    assert [e["ok"] for e in entries] == [False, True]
    assert entries[1]["started_at"] == "2023-11-14T22:13:20+00:00"
    assert entries[1]["tokens_after"] == 2000 and entries[0]["trigger"] == "compact-now"
    code, out, _ = run(capsys, "history", "alpha", "-n", "1", "--json", *common(ws, state_dir))
    assert len(json.loads(out)) == 1


def test_history_shows_what_a_compaction_produced_apart_from_appends(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    with StateStore.open(state_dir, ws.root) as store:
        store.record_compaction(
            LedgerEntry(
                "alpha", 1_700_000_000.0, 3.5, "history_x.md", 30_000, 1_619, "builtin", 0.0,
                None, "daemon", tokens_produced=555, tokens_appended=1_064, fallback=True,
                pinned=40, evicted=3, calls=1,
            )
        )  # fmt: skip
    code, out, _ = run(capsys, "history", "alpha", *common(ws, state_dir))
    assert code == 0
    # Not "30,000 → 1,619", which reads as if appends were the summary's size.
    assert "30,000 → 555 (+1,064 appended meanwhile)" in " ".join(out.split())
    assert "builtin (fallback)" in out and "40 (3 evicted)" in out
    code, out, _ = run(capsys, "history", "alpha", "--json", *common(ws, state_dir))
    [row] = json.loads(out)
    assert (row["tokens_produced"], row["tokens_appended"]) == (555, 1064)
    assert row["fallback"] is True and row["evicted"] == 3 and row["calls"] == 1


def test_history_unknown_agent(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    code, _, err = run(capsys, "history", "nobody", *common(ws, state_dir))
    assert code == 3 and "unknown agent 'nobody'" in err
    code, _, err = run(capsys, "history", "a/b", *common(ws, state_dir))
    assert code == 2 and "invalid agent name" in err


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["health", "--max-age", "nan"], "--max-age"),
        (["health", "--max-age", "-1"], "--max-age"),
        (["forget", "alpha", "--yes", "--wait", "-1"], "--wait"),
        (["forget", "alpha", "--yes", "--wait", "nan"], "--wait"),
        (["archive", "rekey", "--new-key", "/nonexistent", "--wait", "-1"], "--wait"),
    ],
)
def test_a_wait_or_age_out_of_range_is_a_usage_error_naming_the_option(
    capsys: pytest.CaptureFixture[str],
    ws: AgentWorkspace,
    state_dir: Path,
    args: list[str],
    option: str,
) -> None:
    """health --max-age nan said every heartbeat was stale ("limit nans"), and
    forget --wait -1 / nan erased as if no wait was given."""
    beat(ws, state_dir, pid=os.getpid(), age=0)
    before = ws.paths("alpha").memory.read_bytes()
    code, out, err = run(capsys, *args, *common(ws, state_dir))
    assert code == 2 and out == ""
    [line] = err.splitlines()
    assert line.startswith("memd: error: ") and option in line
    assert ws.paths("alpha").memory.read_bytes() == before


def test_numbers_past_what_sqlite_and_kill_take_are_never_a_traceback(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    """sqlite3's and os.kill's OverflowError went past every handler."""
    huge = "99999999999999999999999"
    with StateStore.open(state_dir, ws.root) as store:
        store.record_compaction(
            LedgerEntry(
                "alpha", 1_700_000_000.0, 3.5, None, 150_000, 2_000, "builtin", None, None,
                "daemon",
            )
        )  # fmt: skip
    code, out, err = run(capsys, "history", "alpha", "-n", huge, *common(ws, state_dir))
    assert (code, err) == (0, "") and "150,000 → 2,000" in out
    beat(ws, state_dir, pid=2**31, age=0)  # a heartbeat row holding a pid past pid_t
    code, _, err = run(capsys, "health", *common(ws, state_dir))
    assert code == 1 and "is not running" in err and err.count("\n") == 1
    for pid in (str(2**31), huge):
        code, _, err = run(capsys, "reload", "--pid", pid, *common(ws, state_dir))
        assert code == 1
        assert err.splitlines() == [
            f"memd: error: pid {pid} is not a running memd daemon (memd run)"
        ]


# ---------------------------------------------------------------- config check

GOOD = """\
workspace = "/srv/agents"

[trigger]
threshold = 0.8

[summarizer]
model = "openai/gpt-4o-mini"
api_key = "sk-very-secret"

[agents."Research*"]
context_length = 50000
"""


def test_config_check_masks_secrets(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "memd.toml"
    config.write_text(GOOD)
    monkeypatch.setenv("MEMD_TRIGGER_DEBOUNCE_MS", "250")
    code, out, err = run(capsys, "config", "check", str(config))
    assert code == 0, err
    assert "sk-very-secret" not in out
    assert 'api_key = "********"' in out
    assert f"# valid: {config}" in out and "MEMD_TRIGGER_DEBOUNCE_MS" in out
    assert "threshold = 0.8" in out and "debounce_ms = 250" in out
    assert '[agents."Research*"]' in out and "context_length = 50000" in out
    code, out, _ = run(capsys, "config", "check", str(config), "--json")
    payload = json.loads(out)
    assert payload["config"]["summarizer"]["api_key"] == "********"
    assert payload["config"]["trigger"]["threshold"] == 0.8
    assert payload["source"] == str(config)
    assert "sk-very-secret" not in out


def test_config_check_output_is_valid_toml(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import tomllib

    config = tmp_path / "memd.toml"
    config.write_text(GOOD)
    _, out, _ = run(capsys, "config", "check", str(config))
    reparsed = tomllib.loads(out)
    assert reparsed["agents"]["Research*"]["context_length"] == 50000
    # Feeding the printed config back (with a real key) validates again.
    reparsed["summarizer"]["api_key"] = "sk-other"
    from memd.settings import build_config

    build_config(reparsed, {})


def test_config_check_defaults_when_no_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "config", "check", "--json")
    assert code == 0
    assert json.loads(out)["config"]["summarizer"]["api_key"] == ""


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[trigger]\nthreshold = 7\n", "trigger.threshold"),
        ("[summarizer]\nmodle = 'x'\n", "summarizer.modle"),
        ("[trigger\n", "invalid TOML"),
    ],
)
def test_config_check_broken_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, needle: str
) -> None:
    config = tmp_path / "broken.toml"
    config.write_text(text)
    code, out, err = run(capsys, "config", "check", str(config))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err and str(config) in err


def test_config_check_end_to_end(tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text('[summarizer]\napi_key = "sk-secret"\ntemperature = "hot"\n')
    result = subprocess.run(
        [sys.executable, "-m", "memd", "config", "check", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "summarizer.temperature" in result.stderr and str(config) in result.stderr
    assert "sk-secret" not in result.stderr + result.stdout


# ---------------------------------------------------------------------- doctor


def test_doctor_ok(capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path) -> None:
    code, out, err = run(capsys, "doctor", *common(ws, state_dir))
    assert code == 0, out + err
    for name in ("workspace", "file locks", "tokenizer", "summarizer"):
        assert f"ok   {name}" in out
    code, out, _ = run(capsys, "doctor", "--json", *common(ws, state_dir))
    payload = json.loads(out)
    assert code == 0 and payload["result"] in {"ok", "warn"}
    assert {"name", "status", "message", "fix"} <= set(payload["checks"][0])


def test_doctor_names_the_agents_a_crash_left_a_job_for(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path
) -> None:
    # s10upgrade G: an upgraded workspace held up to 13 such jobs, and doctor said nothing.
    child = Path(__file__).parents[1] / "support" / "compaction_child.py"
    for agent in ("beta", "gamma"):
        ws.create_agent(agent, entries=6)
        killed = subprocess.run(
            [sys.executable, str(child), str(ws.root), agent, "--crash-at", "archive-linked"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert killed.returncode == 137, killed.stderr
    code, out, err = run(capsys, "doctor", "--offline", *common(ws, state_dir))
    assert code == 0, out + err  # a warning: the daemon or compact-now finishes them
    said = " ".join(out.split())
    assert "warn journals: 2 agent(s) with an unfinished job in their journal" in said
    assert "beta, gamma" in said and "compact-now finishes it on the agent's next lock" in said
    assert run(capsys, "compact-now", "--all", "--summary", "Tea.", *common(ws, state_dir))[0] == 0
    code, out, _ = run(capsys, "doctor", "--offline", *common(ws, state_dir))
    assert "ok   journals: no agent has an unfinished compaction or erasure" in out


def test_doctor_warns_when_a_remote_summarizer_is_sent_unredacted_text(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "memd.toml"
    config.write_text('[summarizer]\nmodel = "openai/gpt-4o-mini"\n[privacy]\nredact = false\n')
    _code, out, _err = run(capsys, "doctor", "--offline", "-c", str(config), *common(ws, state_dir))
    assert "warn redaction: summarizer 'openai/gpt-4o-mini' is remote" in " ".join(out.split())


def test_doctor_fails_on_unreachable_summarizer(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    config = tmp_path / "memd.toml"
    config.write_text(
        f'[summarizer]\nmodel = "anthropic/claude-haiku-4-5"\napi_base = "http://127.0.0.1:{port}"\n'
    )
    code, out, err = run(capsys, "doctor", "-c", str(config), *common(ws, state_dir))
    assert code == 1
    assert "warn summarizer key" in out  # a custom api_base may need no key
    assert (
        f"fail summarizer endpoint: http://127.0.0.1:{port} (127.0.0.1:{port}) unreachable" in out
    )
    assert "fix: check the network" in out
    assert err.count("\n") == 1 and "summarizer endpoint" in err


def test_doctor_makes_a_real_minimal_request_unless_offline(
    capsys: pytest.CaptureFixture[str], ws: AgentWorkspace, state_dir: Path, tmp_path: Path
) -> None:
    from support.openai_server import OpenAITestServer

    with OpenAITestServer() as server:
        config = tmp_path / "memd.toml"
        config.write_text(
            f'[summarizer]\nmodel = "openai/test-model"\napi_base = "{server.api_base}"\n'
            'api_key = "sk-test"\ntimeout_s = 30\n'
        )
        code, out, err = run(capsys, "doctor", "-c", str(config), *common(ws, state_dir))
        assert code == 0, out + err
        assert "ok   summarizer request: openai/test-model answered a 1-token request" in out
        assert len(server.requests) == 1 and server.requests[0].body["max_tokens"] == 1
        # A server that connects but refuses the key: TCP alone said "reachable".
        server.script("http:401")
        code, out, _ = run(capsys, "doctor", "-c", str(config), *common(ws, state_dir))
        assert code == 1
        assert "fail summarizer request" in out and "authentication failed" in out
        code, out, _ = run(capsys, "doctor", "--offline", "-c", str(config), *common(ws, state_dir))
        assert code == 0 and "summarizer request" not in out
        assert len(server.requests) == 2


OVERSIZED = """\
[trigger]
context_length = 99999999999999999999999
max_tokens = -1

[daemon]
cooldown_s = inf
breaker_failures = 99999999999

[agents."x"]
context_length = 1000000000000
"""


def test_config_check_shows_every_error_and_bounds_integers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "memd.toml"
    config.write_text(OVERSIZED)
    keys = [
        "trigger.context_length",
        "trigger.max_tokens",
        "daemon.cooldown_s",
        "daemon.breaker_failures",
        "agents.x.context_length",
    ]
    code, out, err = run(capsys, "config", "check", str(config))
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == len(keys)
    for line, key in zip(lines, keys, strict=True):
        assert line.startswith("memd: error: invalid config") and f": {key}: " in line
    code, out, _ = run(capsys, "config", "check", str(config), "--json")
    assert code == 2
    payload = json.loads(out)
    assert payload["valid"] is False and len(payload["errors"]) == len(keys)
    assert all(key in error for key, error in zip(keys, payload["errors"], strict=True))
    # Any other command: one line, the first error, and where to see the rest.
    code, _, err = run(capsys, "status", "--config", str(config), "-w", str(tmp_path))
    assert code == 2 and err.count("\n") == 1
    assert "trigger.context_length" in err and "(+4 more: see memd config check)" in err


def test_config_check_on_a_mistyped_workspace_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """review16e: `memd config check --workspace /nonexistent` printed a valid config."""
    missing = tmp_path / "nonexistent"
    code, out, err = run(capsys, "config", "check", "--workspace", str(missing))
    assert (code, out) == (2, "")
    assert err == f"memd: error: workspace {missing} does not exist\n"
    # Without --workspace a config is still checked with no workspace at all.
    code, out, _err = run(capsys, "config", "check")
    assert code == 0 and out


def test_config_check_beside_a_daemon_checks_the_config_the_daemon_applies(
    tmp_path: Path,
) -> None:
    """review r8docs F5: beside a daemon started with --config (or MEMD_CONFIG in its
    environment), `memd config check -w WS` checked the default file ('(no file:
    defaults)': builtin, redact = true) while the daemon sent unredacted text to a
    remote model; doctor, status and history already took the daemon's file."""
    from support.daemon_proc import DaemonProcess

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha", entries=2)
    config = tmp_path / "daemon.toml"
    config.write_text(
        '[summarizer]\nmodel = "openai/gpt-4o-mini"\n[privacy]\nredact = false\n'
        "[daemon]\nstate_flush_s = 0.5\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    env.update(HOME=str(tmp_path / "home"), LITELLM_LOCAL_MODEL_COST_MAP="True")

    def config_check(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "memd", "config", "check", "-w", str(ws.root), *args]
        return subprocess.run(
            argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
        )

    with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
        daemon.wait_ready(timeout=60)
        checked = config_check()
        as_json = config_check("--json")
        own = tmp_path / "other.toml"
        own.write_text("[privacy]\nredact = true\n")
        named = config_check(str(own))  # a file named is the file checked
        assert daemon.stop() == 0
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"# valid: {config} (the running daemon's, named by its")
    assert 'model = "openai/gpt-4o-mini"' in checked.stdout and "redact = false" in checked.stdout
    payload = json.loads(as_json.stdout)
    assert payload["source"].startswith(str(config)), payload
    assert payload["config"]["privacy"]["redact"] is False
    assert named.stdout.startswith(f"# valid: {own}\n"), named.stdout
